// Dequantizing matrix-vector product, y[item][row] = W[row] . x[item], for one part of a weight
// tensor (parts are whole rows, see src/gpu/buffers.rs). Assembled with quant/common.wgsl and one
// quant/<type>.wgsl that supplies `dequant_chunk`, and one row body, quant/rowdot_*.wgsl.
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
    rows_per_wg: u32,   // rows per workgroup (even; the launcher sizes it to the subgroup count)
}

var<immediate> p: Params;

@group(0) @binding(0) var<storage, read> W: array<u32>;
// x vectors start on 16-byte boundaries (checked by the launcher), so they are read as vec4.
@group(0) @binding(1) var<storage, read> X: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> Y: array<f32>;
@group(0) @binding(3) var<storage, read> IDS: array<u32>;

// 256 invocations: 8 subgroups on NVIDIA (32 lanes), 4 on AMD (64), 32 on lavapipe (8). A workgroup
// owns `p.rows_per_wg` rows (2 per subgroup of the adapter's reported size), handed out in pairs
// grid-stride over its subgroups, so any actual subgroup size still computes every row. Each
// subgroup computes ROWS_PER_SG rows at once (x read once per chunk for both, two independent
// dequant chains in flight) instead of walking rows one after the other (that serial latency made
// small mat-vecs cost tens of microseconds). A row's bits do not depend on the row it is paired with.
const WG: u32 = 256u;
const ROWS_PER_SG: u32 = 2u;

// Up to TILE x vectors share each dequantized chunk (prefill reads every weight once per tile, not
// once per token). Each (row, vector) still gets exactly one sequence whatever the tile or the
// number of vectors: lane l takes chunks l, l+S, ... in order, sums each chunk sequentially with
// fma, adds the chunk sums in order, then one subgroupAdd - so its bits do not depend on the tile
// it lands in, on how many vectors the dispatch has, or on the row it is paired with.
const TILE: u32 = 4u;

// One scalar subgroupAdd per vector actually present (a decode step reduces 1 value per row, not
// 4); every vector's sum goes through the same scalar reduction whatever the tile holds.
fn reduce_items(acc: vec4<f32>, n_items: u32) -> vec4<f32> {
    var r = vec4<f32>(0.0);
    r.x = subgroupAdd(acc.x);
    if (n_items > 1u) {
        r.y = subgroupAdd(acc.y);
    }
    if (n_items > 2u) {
        r.z = subgroupAdd(acc.z);
    }
    if (n_items > 3u) {
        r.w = subgroupAdd(acc.w);
    }
    return r;
}

struct RowPair {
    a: vec4<f32>,
    b: vec4<f32>,
}

// `row_pair_dot(row_a, row_b, has_b, x_base, n_items, lane, sg_size) -> RowPair` comes from
// quant/rowdot_group.wgsl (types with a register `dq8`: lanes along the row) or
// quant/rowdot_chunk.wgsl (the others: a lane per 32-value chunk), chosen in src/gpu/shaders.rs.

fn store_items(row: u32, first_item: u32, n_items: u32, v: vec4<f32>) {
    let base = first_item * p.y_stride + p.y_offset + row;
    Y[base] = v.x;
    if (n_items > 1u) {
        Y[base + p.y_stride] = v.y;
    }
    if (n_items > 2u) {
        Y[base + 2u * p.y_stride] = v.z;
    }
    if (n_items > 3u) {
        Y[base + 3u * p.y_stride] = v.w;
    }
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
    let x_base = p.x_offset + first_item * p.x_stride;
    for (var r = sg_id * ROWS_PER_SG; r < p.rows_per_wg; r += n_sg * ROWS_PER_SG) {
        let row = wg.x * p.rows_per_wg + r;
        if (row >= p.rows) {
            break;
        }
        let has_b = ROWS_PER_SG > 1u && row + 1u < p.rows;
        let v = row_pair_dot(row * p.row_bytes, (row + 1u) * p.row_bytes, has_b, x_base, n_items,
                             lane, sg_size);
        if (lane == 0u) {
            store_items(row, first_item, n_items, v.a);
            if (has_b) {
                store_items(row + 1u, first_item, n_items, v.b);
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
    for (var r = sg_id * ROWS_PER_SG; r < p.rows_per_wg; r += n_sg * ROWS_PER_SG) {
        let row = wg.x * p.rows_per_wg + r;
        if (row >= p.rows) {
            break;
        }
        let has_b = ROWS_PER_SG > 1u && row + 1u < p.rows;
        let v = row_pair_dot((first_row + row) * p.row_bytes, (first_row + row + 1u) * p.row_bytes,
                             has_b, x_base, 1u, lane, sg_size);
        if (lane == 0u) {
            Y[item * p.y_stride + p.y_offset + row] = v.a.x;
            if (has_b) {
                Y[item * p.y_stride + p.y_offset + row + 1u] = v.b.x;
            }
        }
    }
}

// Row gather with dequantization (embedding lookup, and the dequant test): for item i, row IDS[i]
// (global row id; rows outside this part are skipped) is written `reps` times, `rep_stride` apart.
// Reuses the Params fields: rows = rows in this part, y_offset = first global row of this part,
// x_stride = reps, x_offset = rep_stride.
const GET_ROWS_WG: u32 = 64u;

@compute @workgroup_size(GET_ROWS_WG)
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
    let c = wg.x * GET_ROWS_WG + lid.x;
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
