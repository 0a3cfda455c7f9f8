// X_MODE 3, the input normed on load (the `matvec_norm:<type>` assemblies, split row bodies, entry
// matvec_seg; src/gpu/matvec.rs `InputNorm`): the mat-vec reads the grouped RMS norm of X, the
// norm that ops::rmsnorm computes (model-spec 2.4's grouped-centred norm of the hyper-connection
// mix), without a dispatch of its own. Each vector is p.hc groups of p.h values; value i is
// (x[i] * inv[group]) * AUX[i % p.norm_period], inv = 1 / sqrt(mean of the group's squares + eps).
//
// Every workgroup computes the inverse norms of its tile's vectors (an L2-resident read of X);
// the workgroups of a tile's grid row also store a slice each of its normed vectors into Y2
// (offset p.y2_offset, stride p.y2_stride), which later kernels read (the hyper-connection mix). The stored values and
// the values the rows multiply are the same expression, `norm4`, so the rows equal a plain
// mat-vec over the stored vectors bit for bit. Sum order (fixed): invocation l adds the squares
// of vec4 l, l + WG, ... of the vector in order (components x, y, z, w), each into its group's
// sum; `subgroupAdd` combines each subgroup; the subgroups' sums are added in subgroup order.

// The norm weight (AUX's buffer, bound again) read 4 values at a time.
@group(0) @binding(15) var<storage, read> AUX4: array<vec4<f32>>;

// The group of value `i` of a vector whose groups are `n` values long: i / n for the at most 4
// groups of a vector, by comparisons (an integer division costs tens of instructions per value).
fn group_of(i: u32, n: u32) -> u32 {
    return u32(i >= n) + u32(i >= 2u * n) + u32(i >= 3u * n);
}

// Where value `i` (a multiple of 4) of a vector finds its norm weight: i % p.norm_period, without
// the division where the period covers the whole vector (the hyper-connection norms).
fn weight_at(i: u32) -> u32 {
    if (i < p.norm_period) {
        return i;
    }
    return i % p.norm_period;
}

// Group sums of each tile vector per subgroup: [vector * 64 + subgroup] (at most 64 subgroups).
var<workgroup> NORM_PART: array<vec4<f32>, 256>;
// 1 / rms of each tile vector's groups (component = group).
var<workgroup> NORM_INV: array<vec4<f32>, 4>;

// acc with x's squares added into component g (the other components unchanged).
fn add_sq(acc: vec4<f32>, x: vec4<f32>, g: u32) -> vec4<f32> {
    let s = fma(x.w, x.w, fma(x.z, x.z, fma(x.y, x.y, fma(x.x, x.x, comp(acc, g)))));
    return select(acc, vec4<f32>(s), vec4<bool>(g == 0u, g == 1u, g == 2u, g == 3u));
}

// This invocation's group sums of the vector starting at vec4 `xb4`. Eight, then four loads are
// issued together, so the vector costs a few memory latencies.
fn norm_sums(xb4: u32, lid: u32) -> vec4<f32> {
    let n4 = p.h / 4u;
    let k4 = n4 * p.hc;
    var acc = vec4<f32>(0.0);
    var v = lid;
    for (; v + 7u * WG < k4; v += 8u * WG) {
        let a = X[xb4 + v];
        let b = X[xb4 + v + WG];
        let c = X[xb4 + v + 2u * WG];
        let d = X[xb4 + v + 3u * WG];
        let e = X[xb4 + v + 4u * WG];
        let f = X[xb4 + v + 5u * WG];
        let g = X[xb4 + v + 6u * WG];
        let h = X[xb4 + v + 7u * WG];
        acc = add_sq(acc, a, group_of(v, n4));
        acc = add_sq(acc, b, group_of(v + WG, n4));
        acc = add_sq(acc, c, group_of(v + 2u * WG, n4));
        acc = add_sq(acc, d, group_of(v + 3u * WG, n4));
        acc = add_sq(acc, e, group_of(v + 4u * WG, n4));
        acc = add_sq(acc, f, group_of(v + 5u * WG, n4));
        acc = add_sq(acc, g, group_of(v + 6u * WG, n4));
        acc = add_sq(acc, h, group_of(v + 7u * WG, n4));
    }
    for (; v + 3u * WG < k4; v += 4u * WG) {
        let a = X[xb4 + v];
        let b = X[xb4 + v + WG];
        let c = X[xb4 + v + 2u * WG];
        let d = X[xb4 + v + 3u * WG];
        acc = add_sq(acc, a, group_of(v, n4));
        acc = add_sq(acc, b, group_of(v + WG, n4));
        acc = add_sq(acc, c, group_of(v + 2u * WG, n4));
        acc = add_sq(acc, d, group_of(v + 3u * WG, n4));
    }
    for (; v < k4; v += WG) {
        acc = add_sq(acc, X[xb4 + v], group_of(v, n4));
    }
    return acc;
}

// x[4w' ..] normed: (x * inv) * weight, the weight from value `w` of AUX.
fn norm4(x: vec4<f32>, inv: f32, w: u32) -> vec4<f32> {
    return x * inv * AUX4[w >> 2u];
}

// The tile's inverse norms into NORM_INV, and this workgroup's slice (of the grid row's n_wg) of
// its normed vectors into Y2. Called by every invocation of the workgroup (it holds barriers).
fn norm_prologue(tile: Tile, wg_x: u32, n_wg: u32, lid: u32, lane: u32, sg_id: u32, n_sg: u32) {
    for (var j = 0u; j < ITEMS; j++) {
        let s = subgroupAdd(norm_sums((tile.x_base + XS[j]) >> 2u, lid));
        if (lane == 0u) {
            NORM_PART[j * 64u + sg_id] = s;
        }
    }
    workgroupBarrier();
    if (lid < ITEMS) {
        var total = NORM_PART[lid * 64u];
        for (var q = 1u; q < n_sg; q++) {
            total += NORM_PART[lid * 64u + q];
        }
        NORM_INV[lid] = vec4<f32>(1.0) / sqrt(total / f32(p.h) + vec4<f32>(p.norm_eps));
    }
    workgroupBarrier();
    // The grid's n_wg columns store the normed vectors in slices, a few vec4 per invocation: a
    // long loop in one workgroup would hold the whole dispatch for its memory latencies.
    let n4 = p.h / 4u;
    let k4 = n4 * p.hc;
    let slice = (k4 + n_wg - 1u) / n_wg;
    let end = min(k4, (wg_x + 1u) * slice);
    for (var j = 0u; j < ITEMS; j++) {
        let xb4 = (tile.x_base + XS[j]) >> 2u;
        let out = (tile.first_item + j) * p.y2_stride + p.y2_offset;
        for (var v = wg_x * slice + lid; v < end; v += WG) {
            let y = norm4(X[xb4 + v], comp(NORM_INV[j], group_of(v, n4)), weight_at(4u * v));
            Y2[out + 4u * v] = y.x;
            Y2[out + 4u * v + 1u] = y.y;
            Y2[out + 4u * v + 2u] = y.z;
            Y2[out + 4u * v + 3u] = y.w;
        }
    }
}

// A 16-value segment of tile vector j from row position `pos` (a multiple of 16; groups and the
// weight period are multiples of 16, so a segment lies in one group and one weight run), normed.
fn norm_seg(s: Seg, pos: u32, j: u32) -> Seg {
    let inv = comp(NORM_INV[j], group_of(pos, p.h));
    let w = weight_at(pos);
    return Seg(norm4(s.v0, inv, w), norm4(s.v1, inv, w + 4u), norm4(s.v2, inv, w + 8u),
               norm4(s.v3, inv, w + 12u));
}
