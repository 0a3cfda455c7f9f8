//! How much device memory the adapter says is free, for the default VRAM budget.
//!
//! Vulkan: `VK_EXT_memory_budget` (wgpu-hal enables it wherever the driver offers it): the largest
//! device-local heap's budget minus what this process already uses of it. DX12 (DXGI) and Metal
//! (`recommendedMaxWorkingSetSize`) are not queried yet: there the answer is `None`, and the
//! caller says so.

use super::GpuContext;

/// Bytes of device-local memory this process may still allocate, when the adapter reports it.
pub fn free_device_memory(ctx: &GpuContext) -> Option<u64> {
    vulkan_heap(&ctx.device)
        .map(|(budget, usage)| budget.saturating_sub(usage))
        .filter(|&free| free > 0)
}

/// Bytes of device-local memory this process uses now (the driver's figure for the heap that
/// [`free_device_memory`] reads), when the adapter reports it.
pub fn used_device_memory(ctx: &GpuContext) -> Option<u64> {
    vulkan_heap(&ctx.device).map(|(_, usage)| usage)
}

/// The (budget, this process's usage) of the device-local heap with the most room left.
#[cfg(not(target_vendor = "apple"))]
fn vulkan_heap(device: &wgpu::Device) -> Option<(u64, u64)> {
    use ash::vk;
    // SAFETY: the hal device is only read (its handles are used for one query that creates or
    // destroys nothing), and it outlives this call.
    unsafe {
        let hal = device.as_hal::<wgpu::hal::api::Vulkan>()?;
        let budget_ext = c"VK_EXT_memory_budget";
        if !hal.enabled_device_extensions().contains(&budget_ext) {
            return None;
        }
        let instance = hal.shared_instance().raw_instance();
        let mut budget = vk::PhysicalDeviceMemoryBudgetPropertiesEXT::default();
        let mut props = vk::PhysicalDeviceMemoryProperties2::default().push_next(&mut budget);
        instance.get_physical_device_memory_properties2(hal.raw_physical_device(), &mut props);
        let mem = props.memory_properties;
        let heaps = (mem.memory_heap_count as usize).min(vk::MAX_MEMORY_HEAPS);
        (0..heaps)
            .filter(|&i| {
                mem.memory_heaps[i]
                    .flags
                    .contains(vk::MemoryHeapFlags::DEVICE_LOCAL)
            })
            .map(|i| (budget.heap_budget[i], budget.heap_usage[i]))
            .max_by_key(|&(b, u)| b.saturating_sub(u))
    }
}

#[cfg(target_vendor = "apple")]
fn vulkan_heap(_device: &wgpu::Device) -> Option<(u64, u64)> {
    None
}
