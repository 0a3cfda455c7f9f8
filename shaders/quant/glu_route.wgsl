// matvec_expert_glu routing its own token (the `matvec_route` assemblies, after route.wgsl): the
// first subgroup of every workgroup routes the token of its item from the router's logits
// (route_token, the arithmetic of moe.wgsl's moe_router, so the same choices and weights), and
// the first workgroup of each token stores them for the kernels after it (the routed down
// projection reads the ids and weights). A decode step then has no router dispatch between the
// router's mat-vec and the experts. p.route_n = the router's experts; the gate|up tensor is one
// part (the launcher checks).
@group(0) @binding(16) var<storage, read> ROUTE_LOGITS: array<f32>;
@group(0) @binding(17) var<storage, read_write> ROUTE_IDS: array<u32>;
@group(0) @binding(18) var<storage, read_write> ROUTE_W: array<f32>;

fn route_logit(i: u32) -> f32 {
    return ROUTE_LOGITS[i];
}

// The item of this workgroup and its expert's first row (see expert_item); holds a barrier, so
// every invocation calls it.
fn glu_item(wg: vec3<u32>, sg_id: u32, lane: u32, sg_size: u32) -> ExpertItem {
    let item = wg.y + wg.z * 65535u;
    let live_item = item < p.items;
    let t = item / p.slots;
    if (live_item && sg_id == 0u) {
        route_token(t * p.route_n, p.route_n, p.slots, lane, sg_size);
        if (wg.x == 0u && item % p.slots == 0u && lane == 0u) {
            for (var slot = 0u; slot < p.slots; slot++) {
                ROUTE_IDS[t * p.slots + slot] = RT_ID[slot];
                ROUTE_W[t * p.slots + slot] = RT_W[slot];
            }
        }
    }
    workgroupBarrier();
    if (!live_item) {
        return ExpertItem(item, 0u, false);
    }
    let expert = RT_ID[item % p.slots];
    let live = expert >= p.expert_first && expert < p.expert_first + p.expert_count;
    return ExpertItem(item, (expert - p.expert_first) * p.rows, live);
}
