// Mat-vec row body for types with a register dequantizer `dq8(block_byte, group) -> Group8` (the
// values [8*group, 8*group+8) of the block). Lanes are laid along the row: lane l takes the 8-value
// groups l, l+S, l+2S, ... in order, so neighbouring lanes read neighbouring weight and x words,
// and fmas each value into its running sum in index order; then `subgroupAdd` combines the lanes.
// That sequence is the same for every (row, vector) whatever the tile, the number of vectors or
// the paired row, so prefill and decode agree bit for bit.

// Sequential fma of the 8 values of `w` against x[4*xv .. 4*xv+8], starting from `acc`.
fn dot8(w: Group8, xv: u32, acc: f32) -> f32 {
    let x0 = load_x4(xv);
    let x1 = load_x4(xv + 1u);
    var a = acc;
    a = fma(w.lo.x, x0.x, a);
    a = fma(w.lo.y, x0.y, a);
    a = fma(w.lo.z, x0.z, a);
    a = fma(w.lo.w, x0.w, a);
    a = fma(w.hi.x, x1.x, a);
    a = fma(w.hi.y, x1.y, a);
    a = fma(w.hi.z, x1.z, a);
    a = fma(w.hi.w, x1.w, a);
    return a;
}

fn row_pair_dot(row_a: u32, row_b: u32, has_b: bool, x_base: u32, n_items: u32, lane: u32,
                sg_size: u32) -> RowPair {
    let groups = p.k / 8u;
    let groups_per_block = QK / 8u;
    // Without a second row, row a is read again (cached) rather than branching around it.
    let row_b_read = select(row_a, row_b, has_b);
    var acc_a = vec4<f32>(0.0);
    var acc_b = vec4<f32>(0.0);
    for (var g = lane; g < groups; g += sg_size) {
        let block_offset = (g / groups_per_block) * BLOCK_BYTES;
        let group = g % groups_per_block;
        let wa = dq8(row_a + block_offset, group);
        let wb = dq8(row_b_read + block_offset, group);
        let xb = x_base + g * 8u;
        acc_a.x = dot8(wa, xb >> 2u, acc_a.x);
        acc_b.x = dot8(wb, xb >> 2u, acc_b.x);
        if (ITEMS > 1u) {
            let xv = (xb + XS.y) >> 2u;
            acc_a.y = dot8(wa, xv, acc_a.y);
            acc_b.y = dot8(wb, xv, acc_b.y);
        }
        if (ITEMS > 2u) {
            let xv = (xb + XS.z) >> 2u;
            acc_a.z = dot8(wa, xv, acc_a.z);
            acc_b.z = dot8(wb, xv, acc_b.z);
        }
        if (ITEMS > 3u) {
            let xv = (xb + XS.w) >> 2u;
            acc_a.w = dot8(wa, xv, acc_a.w);
            acc_b.w = dot8(wb, xv, acc_b.w);
        }
    }
    return RowPair(reduce_items(acc_a, n_items), reduce_items(acc_b, n_items));
}
