// Row body for weights in GGUF block layout, used by shaders/matvec.wgsl: rows are computed in
// pairs by `row_pair_dot` from quant/rowdot_group.wgsl (types with a register `dq8`: lanes along
// the row) or quant/rowdot_chunk.wgsl (the others: a lane per 32-value chunk), chosen in
// src/gpu/shaders.rs. Each (row, vector) has one reduction order whatever its pair, the tile or
// the number of vectors: the body's lane order, then one `subgroupAdd`.

struct RowPair {
    a: vec4<f32>,
    b: vec4<f32>,
}

// Rows row_at(row0, row_step, r) (part-relative; r < n_rows <= ROWS), two at a time (rows past n_rows
// are not read; their results are zero and never stored).
fn rows_dot(row0: u32, row_step: u32, n_rows: u32, x_base: u32, n_items: u32, lane: u32,
            sg_size: u32) -> Acc {
    let zero = vec4<f32>(0.0);
    let a = row0 * p.row_bytes;
    let b = row_at(row0, row_step, 1u) * p.row_bytes;
    let v01 = row_pair_dot(a, b, n_rows > 1u, x_base, n_items, lane, sg_size);
    var v23 = RowPair(zero, zero);
    if (ROWS > 2u && n_rows > 2u) {
        let c = row_at(row0, row_step, 2u) * p.row_bytes;
        let d = row_at(row0, row_step, 3u) * p.row_bytes;
        v23 = row_pair_dot(c, d, n_rows > 3u, x_base, n_items, lane, sg_size);
    }
    return Acc(v01.a, v01.b, v23.a, v23.b);
}

// Row gather with dequantization (embedding lookup, and the dequant test): for item i, row IDS[i]
// (global row id; rows outside this part are skipped) is written `reps` times, `rep_stride` apart.
// Reuses the Params fields: rows = rows in this part, y_offset = first global row of this part,
// x_stride = reps, x_offset = rep_stride.
const GET_ROWS_WG: u32 = 64u;

@compute @workgroup_size(GET_ROWS_WG)
fn get_rows(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    prologue(lid.x);
    workgroupBarrier();
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
