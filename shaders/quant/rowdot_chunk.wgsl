// Mat-vec row body for types without a register `dq8`: lane l of a subgroup takes the 32-value
// chunks l, l+S, l+2S, ... of its row in order, sums each chunk sequentially with fma, adds the
// chunk sums in order, then `subgroupAdd` combines the lanes. Each (row, vector) is computed by
// exactly this code whatever the tile, the number of vectors or the paired row.

// Sequential fma over the 32 values of chunk `a` (.x) and chunk `b` (.y), in index order, against
// x[xb..xb+32]: each x value is loaded once for both rows, and each row's sum is exactly the
// single-row sequence. The chunks are values in registers (`Chunk`, quant/common.wgsl), not a
// dynamically indexed private array, which NVIDIA drivers place in slow local memory.
fn chunk_dot_pair(a: Chunk, b: Chunk, xb: u32) -> vec2<f32> {
    let v0 = xb >> 2u;
    var s = vec2<f32>(0.0);
    s = dot4_pair(a.v0, b.v0, load_x4(v0), s);
    s = dot4_pair(a.v1, b.v1, load_x4(v0 + 1u), s);
    s = dot4_pair(a.v2, b.v2, load_x4(v0 + 2u), s);
    s = dot4_pair(a.v3, b.v3, load_x4(v0 + 3u), s);
    s = dot4_pair(a.v4, b.v4, load_x4(v0 + 4u), s);
    s = dot4_pair(a.v5, b.v5, load_x4(v0 + 5u), s);
    s = dot4_pair(a.v6, b.v6, load_x4(v0 + 6u), s);
    s = dot4_pair(a.v7, b.v7, load_x4(v0 + 7u), s);
    return s;
}

// Four sequential fma steps per row (components in order x, y, z, w).
fn dot4_pair(wa: vec4<f32>, wb: vec4<f32>, x: vec4<f32>, acc: vec2<f32>) -> vec2<f32> {
    var a = acc.x;
    var b = acc.y;
    a = fma(wa.x, x.x, a);
    a = fma(wa.y, x.y, a);
    a = fma(wa.z, x.z, a);
    a = fma(wa.w, x.w, a);
    b = fma(wb.x, x.x, b);
    b = fma(wb.y, x.y, b);
    b = fma(wb.z, x.z, b);
    b = fma(wb.w, x.w, b);
    return vec2<f32>(a, b);
}

// Rows starting at bytes `row_a` and `row_b` against the vectors at `x_base`, `x_base + XS.y`,
// ... (`n_items` of them, components past it stay 0). `has_b` false: row b is not read and its
// sums are meaningless (the caller does not store them).
fn row_pair_dot(row_a: u32, row_b: u32, has_b: bool, x_base: u32, n_items: u32, lane: u32,
                sg_size: u32) -> RowPair {
    let chunks = p.k / 32u;
    let chunks_per_block = QK / 32u;
    var acc_a = vec4<f32>(0.0);
    var acc_b = vec4<f32>(0.0);
    for (var c = lane; c < chunks; c += sg_size) {
        let block_offset = (c / chunks_per_block) * BLOCK_BYTES;
        let sub = c % chunks_per_block;
        let xb = x_base + c * 32u;
        let chunk_a = dq_chunk(row_a + block_offset, sub);
        // Without a second row, row a is read again (cached) rather than branching around it.
        let chunk_b = dq_chunk(select(row_a, row_b, has_b) + block_offset, sub);
        let s0 = chunk_dot_pair(chunk_a, chunk_b, xb);
        acc_a.x += s0.x;
        acc_b.x += s0.y;
        if (ITEMS > 1u) {
            let s1 = chunk_dot_pair(chunk_a, chunk_b, xb + XS.y);
            acc_a.y += s1.x;
            acc_b.y += s1.y;
        }
        if (ITEMS > 2u) {
            let s2 = chunk_dot_pair(chunk_a, chunk_b, xb + XS.z);
            acc_a.z += s2.x;
            acc_b.z += s2.y;
        }
        if (ITEMS > 3u) {
            let s3 = chunk_dot_pair(chunk_a, chunk_b, xb + XS.w);
            acc_a.w += s3.x;
            acc_b.w += s3.y;
        }
    }
    return RowPair(reduce_items(acc_a, n_items), reduce_items(acc_b, n_items));
}
