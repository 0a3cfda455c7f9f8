// Dequantizing matrix-vector product, y[item][row] = W[row] . x[item], for one part of a weight
// tensor (parts are whole rows, see src/gpu/buffers.rs). Assembled with quant/common.wgsl and one
// quant/<type>.wgsl that supplies `dequant_chunk`.
//
// Reduction order (fixed, and the same for every batch size, so prefill == decode bit for bit):
// lane l of a subgroup takes the 32-value chunks l, l+S, l+2S, ... of its row in order, sums each
// chunk sequentially with fma, adds the chunk sums in order, then `subgroupAdd` combines the lanes.
// Each (row, item) is computed by exactly this code whatever the number of items.

struct Params {
    rows: u32,          // rows per matrix in this part (per expert in expert mode)
    k: u32,             // columns (multiple of 32)
    row_bytes: u32,
    items: u32,         // x vectors (tokens, or token x slot in expert mode)
    x_stride: u32,      // floats between x vectors
    x_offset: u32,
    y_stride: u32,      // floats between y vectors
    y_offset: u32,      // where row 0 of this part lands inside a y vector
    slots: u32,         // expert mode: ids per token; item = token * slots + slot
    x_per_item: u32,    // expert mode: 1 = x indexed by item, 0 = by token
    expert_first: u32,  // expert mode: first expert stored in this part
    expert_count: u32,  // expert mode: experts stored in this part
}

var<immediate> p: Params;

@group(0) @binding(0) var<storage, read> W: array<u32>;
// x vectors start on 16-byte boundaries (checked by the launcher), so they are read as vec4.
@group(0) @binding(1) var<storage, read> X: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> Y: array<f32>;
@group(0) @binding(3) var<storage, read> IDS: array<u32>;

const WG: u32 = 64u;
// Rows handled by one workgroup; its subgroups share them grid-stride, so any subgroup size works.
const ROWS_PER_WG: u32 = 8u;

// Sequential fma over the 32 values of the current chunk, in index order, against x[xb..xb+32].
fn chunk_dot(xb: u32) -> f32 {
    let v0 = xb >> 2u;
    var s = 0.0;
    for (var k = 0u; k < 8u; k++) {
        let x = X[v0 + k];
        s = fma(wq[4u * k], x.x, s);
        s = fma(wq[4u * k + 1u], x.y, s);
        s = fma(wq[4u * k + 2u], x.z, s);
        s = fma(wq[4u * k + 3u], x.w, s);
    }
    return s;
}

fn row_dot(row_byte: u32, x_base: u32, lane: u32, sg_size: u32) -> f32 {
    let chunks = p.k / 32u;
    let chunks_per_block = QK / 32u;
    var acc = 0.0;
    for (var c = lane; c < chunks; c += sg_size) {
        dequant_chunk(row_byte + (c / chunks_per_block) * BLOCK_BYTES, c % chunks_per_block);
        acc += chunk_dot(x_base + c * 32u);
    }
    return subgroupAdd(acc);
}

// Up to TILE x vectors share each dequantized chunk (prefill reads every weight once per tile, not
// once per token). Each vector still gets exactly the per-item sequence of `row_dot`: its own
// chunk sums, added in chunk order, then one subgroupAdd - so its bits do not depend on the tile
// it lands in or on how many vectors the dispatch has.
const TILE: u32 = 4u;

fn row_dot_tile(row_byte: u32, first_item: u32, n_items: u32, lane: u32, sg_size: u32) -> vec4<f32> {
    let chunks = p.k / 32u;
    let chunks_per_block = QK / 32u;
    var acc = vec4<f32>(0.0);
    for (var c = lane; c < chunks; c += sg_size) {
        dequant_chunk(row_byte + (c / chunks_per_block) * BLOCK_BYTES, c % chunks_per_block);
        for (var i = 0u; i < TILE; i++) {
            if (i < n_items) {
                acc[i] += chunk_dot(p.x_offset + (first_item + i) * p.x_stride + c * 32u);
            }
        }
    }
    return vec4<f32>(subgroupAdd(acc.x), subgroupAdd(acc.y), subgroupAdd(acc.z), subgroupAdd(acc.w));
}

@compute @workgroup_size(WG)
fn matvec(@builtin(workgroup_id) wg: vec3<u32>,
          @builtin(subgroup_id) sg_id: u32,
          @builtin(num_subgroups) n_sg: u32,
          @builtin(subgroup_invocation_id) lane: u32,
          @builtin(subgroup_size) sg_size: u32) {
    let first_item = (wg.y + wg.z * 65535u) * TILE;
    if (first_item >= p.items) {
        return;
    }
    let n_items = min(TILE, p.items - first_item);
    for (var r = sg_id; r < ROWS_PER_WG; r += n_sg) {
        let row = wg.x * ROWS_PER_WG + r;
        if (row >= p.rows) {
            break;
        }
        let v = row_dot_tile(row * p.row_bytes, first_item, n_items, lane, sg_size);
        if (lane == 0u) {
            for (var i = 0u; i < n_items; i++) {
                Y[(first_item + i) * p.y_stride + p.y_offset + row] = v[i];
            }
        }
    }
}

@compute @workgroup_size(WG)
fn matvec_expert(@builtin(workgroup_id) wg: vec3<u32>,
                 @builtin(subgroup_id) sg_id: u32,
                 @builtin(num_subgroups) n_sg: u32,
                 @builtin(subgroup_invocation_id) lane: u32,
                 @builtin(subgroup_size) sg_size: u32) {
    let item = wg.y + wg.z * 65535u;
    if (item >= p.items) {
        return;
    }
    let expert = IDS[item];
    if (expert < p.expert_first || expert >= p.expert_first + p.expert_count) {
        return;
    }
    var x_index = item;
    if (p.x_per_item == 0u) {
        x_index = item / p.slots;
    }
    let x_base = p.x_offset + x_index * p.x_stride;
    let first_row = (expert - p.expert_first) * p.rows;
    for (var r = sg_id; r < ROWS_PER_WG; r += n_sg) {
        let row = wg.x * ROWS_PER_WG + r;
        if (row >= p.rows) {
            break;
        }
        let v = row_dot((first_row + row) * p.row_bytes, x_base, lane, sg_size);
        if (lane == 0u) {
            Y[item * p.y_stride + p.y_offset + row] = v;
        }
    }
}

// Row gather with dequantization (embedding lookup, and the dequant test): for item i, row IDS[i]
// (global row id; rows outside this part are skipped) is written `reps` times, `rep_stride` apart.
// Reuses the Params fields: rows = rows in this part, y_offset = first global row of this part,
// x_stride = reps, x_offset = rep_stride.
@compute @workgroup_size(WG)
fn get_rows(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let item = wg.y + wg.z * 65535u;
    if (item >= p.items) {
        return;
    }
    let global_row = IDS[item];
    if (global_row < p.y_offset || global_row >= p.y_offset + p.rows) {
        return;
    }
    let row_byte = (global_row - p.y_offset) * p.row_bytes;
    let chunks_per_block = QK / 32u;
    let c = wg.x * WG + lid.x;
    if (c >= p.k / 32u) {
        return;
    }
    dequant_chunk(row_byte + (c / chunks_per_block) * BLOCK_BYTES, c % chunks_per_block);
    for (var rep = 0u; rep < p.x_stride; rep++) {
        let base = item * p.y_stride + rep * p.x_offset + c * 32u;
        for (var j = 0u; j < 32u; j++) {
            Y[base + j] = wq[j];
        }
    }
}
