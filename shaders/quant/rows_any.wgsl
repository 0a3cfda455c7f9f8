// Row body for unquantized rows of any length (F32, F16, BF16 rows that are not whole 32-value
// chunks, or inputs not on 16-byte boundaries), used by shaders/matvec.wgsl. The type file
// supplies `wval(row_byte, i)`, value i of the row starting at byte `row_byte`.
//
// Reduction order (fixed): lane l takes values l, l+S, l+2S, ... of its row in order, one fma
// each, then `subgroupAdd` combines the lanes; the same for every vector, tile and paired row.

fn silu1(v: f32) -> f32 {
    return v / (1.0 + exp(-v));
}

// x[i] after the x transform (the same arithmetic as load_x4, one component at a time).
fn load_x1(i: u32) -> f32 {
    let v = X[i >> 2u][i & 3u];
    switch X_MODE {
        case 1u: {
            let j = i + p.x_half;
            return silu1(v) * X[j >> 2u][j & 3u];
        }
        case 2u: {
            return silu1(v * p.x_scale);
        }
        default: {
            return v;
        }
    }
}

// Value i of row `row` against the tile's vectors, fma'd into `acc` (components past ITEMS stay).
fn row_fma(row: u32, i: u32, x: vec4<f32>, acc: vec4<f32>) -> vec4<f32> {
    let w = wval(row * p.row_bytes, i);
    var a = acc;
    a.x = fma(w, x.x, a.x);
    if (ITEMS > 1u) {
        a.y = fma(w, x.y, a.y);
    }
    if (ITEMS > 2u) {
        a.z = fma(w, x.z, a.z);
    }
    if (ITEMS > 3u) {
        a.w = fma(w, x.w, a.w);
    }
    return a;
}

fn rows_dot(row0: u32, row_step: u32, n_rows: u32, x_base: u32, n_items: u32, lane: u32,
            sg_size: u32) -> Acc {
    var a0 = vec4<f32>(0.0);
    var a1 = vec4<f32>(0.0);
    var a2 = vec4<f32>(0.0);
    var a3 = vec4<f32>(0.0);
    let last = n_rows - 1u;
    for (var i = lane; i < p.k; i += sg_size) {
        var x = vec4<f32>(load_x1(x_base + i), 0.0, 0.0, 0.0);
        if (ITEMS > 1u) {
            x.y = load_x1(x_base + XS.y + i);
        }
        if (ITEMS > 2u) {
            x.z = load_x1(x_base + XS.z + i);
        }
        if (ITEMS > 3u) {
            x.w = load_x1(x_base + XS.w + i);
        }
        a0 = row_fma(row0, i, x, a0);
        if (ROWS > 1u) {
            a1 = row_fma(row_at(row0, row_step, min(1u, last)), i, x, a1);
        }
        if (ROWS > 2u) {
            a2 = row_fma(row_at(row0, row_step, min(2u, last)), i, x, a2);
        }
        if (ROWS > 3u) {
            a3 = row_fma(row_at(row0, row_step, min(3u, last)), i, x, a3);
        }
    }
    return Acc(reduce_items(a0, ITEMS), reduce_items(a1, ITEMS), reduce_items(a2, ITEMS),
               reduce_items(a3, ITEMS));
}

// Row gather (embedding lookup, dequant test) for rows of any length: one invocation per 32
// consecutive values. Params as in quant/rows_block.wgsl's get_rows.
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
    let c = wg.x * GET_ROWS_WG + lid.x;
    for (var j = 32u * c; j < min(p.k, 32u * c + 32u); j++) {
        let v = wval(row_byte, j);
        for (var rep = 0u; rep < p.x_stride; rep++) {
            Y[item * p.y_stride + rep * p.x_offset + j] = v;
        }
    }
}
