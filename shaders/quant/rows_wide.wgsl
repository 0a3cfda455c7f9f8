// Wide prefill tiles for the split row bodies (the `matvec_wide:<type>` assemblies: matvec.wgsl,
// quant/rows_split.wgsl, then this file). A lane decodes each task of each of its ROWS rows once
// per tile of up to 16 vectors (ITEMS = 4 * quads), where rows_dot does so once per TILE = 4; each
// vector's x segments are loaded once per task and shared by the rows.
//
// Same bits as rows_dot: vector v of row r takes, on lane l, the tasks l, l + S, ... in order, each
// task's value `task_dot` of the same codes and x segments (called as rows_dot calls it: shader
// compilers rewrite its arithmetic where they see both scales are one value, so the expression
// must reach them in the same form), added to the lane's sum; then one scalar `subgroupAdd` per
// (row, vector). Nothing depends on the other vectors of the tile, so tiles of any width, padded
// or not, give every (row, vector) the bits of a decode step.
// The x transform is applied beforehand (prepare_x), so X_MODE is 0 here. The dense entries split
// long rows over KSPLIT subgroups as matvec.wgsl's dense entries do (wide_split_sum).

// Quads of the pipeline's tiles (ITEMS / 4).
override QUADS: u32 = ITEMS / 4u;

// 1: x was rearranged by `permute_x` (below) into task order, so that the lanes of a subgroup,
// each on its own task, load consecutive vec4s: segment s of task t, vec4 j, of the vector at x
// offset `first` is at vec4 first / 4 + (4 s + j) * TASKS + t. The same values reach the same
// task_dot: only where they are read from changes.
override XPERM: u32 = 0u;

// Tasks per row.
fn row_tasks() -> u32 {
    return (p.k / QK) * TASKS_PER_BLOCK;
}

// Segment `s` (0 or 1, at x offset `first + at` in the vector's own order) of task `t`.
fn tile_seg(first: u32, at: u32, t: u32, s: u32) -> Seg {
    if (XPERM == 0u) {
        return load_seg(first + at);
    }
    let n = row_tasks();
    let i = (first >> 2u) + 4u * s * n + t;
    return Seg(load_x4(i), load_x4(i + n), load_x4(i + 2u * n), load_x4(i + 3u * n));
}

// x offsets (in floats) of the tile's vectors, four per quad; set by the entry point.
var<private> XQ0: vec4<u32>;
var<private> XQ1: vec4<u32>;
var<private> XQ2: vec4<u32>;
var<private> XQ3: vec4<u32>;

// The task values of up to 4 rows' decoded tasks (components; w1..w3 unused past ROWS) against
// the vector at x offset `first`.
fn tok_values(w0: Task, w1: Task, w2: Task, w3: Task, first: u32, xo: vec2<u32>,
              t: u32) -> vec4<f32> {
    let xa = tile_seg(first, xo.x, t, 0u);
    let xb = tile_seg(first, xo.y, t, 1u);
    var v = vec4<f32>(task_dot(w0, xa, xb), 0.0, 0.0, 0.0);
    if (ROWS > 1u) {
        v.y = task_dot(w1, xa, xb);
    }
    if (ROWS > 2u) {
        v.z = task_dot(w2, xa, xb);
    }
    if (ROWS > 3u) {
        v.w = task_dot(w3, xa, xb);
    }
    return v;
}

// Four vectors' sums, each a vec4 over the rows.
struct Quad {
    v0: vec4<f32>,
    v1: vec4<f32>,
    v2: vec4<f32>,
    v3: vec4<f32>,
}

fn zero_quad() -> Quad {
    return Quad(vec4<f32>(0.0), vec4<f32>(0.0), vec4<f32>(0.0), vec4<f32>(0.0));
}

// `acc` plus one task of every row for the 4 vectors at x offsets `b`.
fn quad_add(acc: Quad, w0: Task, w1: Task, w2: Task, w3: Task, b: vec4<u32>,
            xo: vec2<u32>, t: u32) -> Quad {
    return Quad(acc.v0 + tok_values(w0, w1, w2, w3, b.x, xo, t),
                acc.v1 + tok_values(w0, w1, w2, w3, b.y, xo, t),
                acc.v2 + tok_values(w0, w1, w2, w3, b.z, xo, t),
                acc.v3 + tok_values(w0, w1, w2, w3, b.w, xo, t));
}

// The tile's sums: quad q holds vectors 4q .. 4q + 3, each a vec4 over the rows.
struct Wide {
    q0: Quad,
    q1: Quad,
    q2: Quad,
    q3: Quad,
}

fn reduce4(v: vec4<f32>) -> vec4<f32> {
    return vec4<f32>(subgroupAdd(v.x), subgroupAdd(v.y), subgroupAdd(v.z), subgroupAdd(v.w));
}

// One scalar subgroupAdd per (row, vector) present.
fn reduce_quad(q: Quad) -> Quad {
    if (ROWS == 1u) {
        return Quad(vec4<f32>(subgroupAdd(q.v0.x), 0.0, 0.0, 0.0),
                    vec4<f32>(subgroupAdd(q.v1.x), 0.0, 0.0, 0.0),
                    vec4<f32>(subgroupAdd(q.v2.x), 0.0, 0.0, 0.0),
                    vec4<f32>(subgroupAdd(q.v3.x), 0.0, 0.0, 0.0));
    }
    return Quad(reduce4(q.v0), reduce4(q.v1), reduce4(q.v2), reduce4(q.v3));
}

// Rows row0 + r * row_step (r < n_rows <= ROWS; rows past n_rows repeat the last, never stored)
// against the first `nq` quads of the tile (a uniform count: the last tile of an expert's items
// may hold fewer), reduced over the subgroup.
fn rows_wide(row0: u32, row_step: u32, n_rows: u32, nq: u32, lane: u32, sg_size: u32) -> Wide {
    if (LIMB) {
        return rows_wide_limb(row0, row_step, n_rows, nq, lane, sg_size);
    }
    if (IDOT) {
        return rows_wide_idot(row0, row_step, n_rows, nq, lane, sg_size);
    }
    return reduce_wide(rows_wide_sums(row0, row_step, n_rows, nq, lane, sg_size), nq);
}

// The lane's sums of rows_wide before the reduction: tasks lane, lane + stride, ... of each row
// and vector, in order.
fn rows_wide_sums(row0: u32, row_step: u32, n_rows: u32, nq: u32, lane: u32,
                  stride: u32) -> Wide {
    var acc = Wide(zero_quad(), zero_quad(), zero_quad(), zero_quad());
    let last = n_rows - 1u;
    let r1 = row0 + min(1u, last) * row_step;
    let r2 = row0 + min(2u, last) * row_step;
    let r3 = row0 + min(3u, last) * row_step;
    let tasks = (p.k / QK) * TASKS_PER_BLOCK;
    for (var t = lane; t < tasks; t += stride) {
        let xo = task_x(t);
        // Decoded once each (rows past ROWS are dead code).
        let w0 = task_w(row0 * p.row_bytes, row_d(row0), t);
        let w1 = task_w(r1 * p.row_bytes, row_d(r1), t);
        let w2 = task_w(r2 * p.row_bytes, row_d(r2), t);
        let w3 = task_w(r3 * p.row_bytes, row_d(r3), t);
        acc.q0 = quad_add(acc.q0, w0, w1, w2, w3, XQ0, xo, t);
        if (QUADS > 1u && nq > 1u) {
            acc.q1 = quad_add(acc.q1, w0, w1, w2, w3, XQ1, xo, t);
        }
        if (QUADS > 2u && nq > 2u) {
            acc.q2 = quad_add(acc.q2, w0, w1, w2, w3, XQ2, xo, t);
        }
        if (QUADS > 3u && nq > 3u) {
            acc.q3 = quad_add(acc.q3, w0, w1, w2, w3, XQ3, xo, t);
        }
    }
    return acc;
}

// ---- Short rows packed (PACK) ----
// A row of T tasks with 2T <= S leaves lanes T.. of its subgroup idle: rows_wide's lane l < T
// computes task l alone and the rest hold zeros. With PACK = P > 1 (set by the launcher where
// P * T <= S), P row groups share a subgroup: group g on lanes gT .. gT + T - 1, lane gT + l
// computing task l of its rows, the one task canonical lane l computes, with the same arithmetic.
// Before group g's reduction a shuffle brings its sums to lanes 0 .. T - 1 with zeros above: the
// values rows_wide's reduction sees, lane by lane, so every (row, vector) keeps its bits.
override PACK: u32 = 1u;

// Row groups per subgroup: PACK where the row's tasks fit PACK times in this subgroup, else 1.
fn wide_pack(sg_size: u32) -> u32 {
    if (PACK > 1u && !LIMB && !IDOT && KSPLIT == 1u && PACK * row_tasks() <= sg_size) {
        return PACK;
    }
    return 1u;
}

// The lane's group (0 .. pack - 1; pack for lanes past the last group) and its task lane.
fn pack_group(lane: u32, pack: u32) -> u32 {
    if (pack == 1u) {
        return 0u;
    }
    return min(lane / row_tasks(), pack);
}

// The sums of the lane's group (pack_group), from rows row0 + r * row_step: one task per lane.
// Unpacked (pack 1), rows_wide's reduced sums.
fn rows_wide_packed(row0: u32, row_step: u32, n_rows: u32, nq: u32, lane: u32,
                    sg_size: u32, pack: u32) -> Wide {
    if (pack == 1u) {
        return rows_wide(row0, row_step, n_rows, nq, lane, sg_size);
    }
    let t = row_tasks();
    let g = pack_group(lane, pack);
    // Lanes past the last group start past the last task: no work, zero sums.
    let first = select(t, lane - g * t, g < pack);
    return rows_wide_sums(row0, row_step, n_rows, nq, first, sg_size);
}

fn pack_quad(q: Quad, src: u32, keep: bool) -> Quad {
    let z = vec4<f32>(0.0);
    return Quad(select(z, subgroupShuffle(q.v0, src), keep),
                select(z, subgroupShuffle(q.v1, src), keep),
                select(z, subgroupShuffle(q.v2, src), keep),
                select(z, subgroupShuffle(q.v3, src), keep));
}

// Group g's sums reduced over the subgroup, as rows_wide reduces a lone group's (called by every
// lane: it shuffles). Unpacked, the sums are already reduced.
fn wide_group(acc: Wide, g: u32, nq: u32, lane: u32, sg_size: u32, pack: u32) -> Wide {
    if (pack == 1u) {
        return acc;
    }
    let t = row_tasks();
    let keep = lane < t;
    let src = min(g * t + lane, sg_size - 1u);
    var a = acc;
    a.q0 = pack_quad(acc.q0, src, keep);
    if (QUADS > 1u && nq > 1u) {
        a.q1 = pack_quad(acc.q1, src, keep);
    }
    if (QUADS > 2u && nq > 2u) {
        a.q2 = pack_quad(acc.q2, src, keep);
    }
    if (QUADS > 3u && nq > 3u) {
        a.q3 = pack_quad(acc.q3, src, keep);
    }
    return reduce_wide(a, nq);
}

// The tile's sums reduced over the subgroup: reduce_quad of each of the first `nq` quads.
fn reduce_wide(acc: Wide, nq: u32) -> Wide {
    var r = acc;
    r.q0 = reduce_quad(acc.q0);
    if (QUADS > 1u && nq > 1u) {
        r.q1 = reduce_quad(acc.q1);
    }
    if (QUADS > 2u && nq > 2u) {
        r.q2 = reduce_quad(acc.q2);
    }
    if (QUADS > 3u && nq > 3u) {
        r.q3 = reduce_quad(acc.q3);
    }
    return r;
}

// rows_wide in limb arithmetic (quant/rows_split.wgsl's LIMB): each round of sg_size tasks is
// computed side by side (lane l: task base + l) and folded in task order on every lane, as
// rows_dot_limb folds it, so every (row, vector) has the bits of a decode step. Needs KSPLIT 1.
fn tok_values_limb(w0: Task, w1: Task, w2: Task, w3: Task, first: u32,
                   xo: vec2<u32>, t: u32) -> vec4<f32> {
    let xa = limbs(tile_seg(first, xo.x, t, 0u));
    let xb = limbs(tile_seg(first, xo.y, t, 1u));
    var v = vec4<f32>(task_dot_limb(w0, xa, xb), 0.0, 0.0, 0.0);
    if (ROWS > 1u) {
        v.y = task_dot_limb(w1, xa, xb);
    }
    if (ROWS > 2u) {
        v.z = task_dot_limb(w2, xa, xb);
    }
    if (ROWS > 3u) {
        v.w = task_dot_limb(w3, xa, xb);
    }
    return v;
}

fn quad_limb(w0: Task, w1: Task, w2: Task, w3: Task, b: vec4<u32>, xo: vec2<u32>,
             t: u32) -> Quad {
    return Quad(tok_values_limb(w0, w1, w2, w3, b.x, xo, t),
                tok_values_limb(w0, w1, w2, w3, b.y, xo, t),
                tok_values_limb(w0, w1, w2, w3, b.z, xo, t),
                tok_values_limb(w0, w1, w2, w3, b.w, xo, t));
}

fn fold_quad(acc: Quad, v: Quad, l: u32) -> Quad {
    return Quad(acc.v0 + subgroupShuffle(v.v0, l), acc.v1 + subgroupShuffle(v.v1, l),
                acc.v2 + subgroupShuffle(v.v2, l), acc.v3 + subgroupShuffle(v.v3, l));
}

fn rows_wide_limb(row0: u32, row_step: u32, n_rows: u32, nq: u32, lane: u32,
                  sg_size: u32) -> Wide {
    var acc = Wide(zero_quad(), zero_quad(), zero_quad(), zero_quad());
    let last = n_rows - 1u;
    let r1 = row0 + min(1u, last) * row_step;
    let r2 = row0 + min(2u, last) * row_step;
    let r3 = row0 + min(3u, last) * row_step;
    let tasks = (p.k / QK) * TASKS_PER_BLOCK;
    for (var base = 0u; base < tasks; base += sg_size) {
        let t = min(base + lane, tasks - 1u);
        let xo = task_x(t);
        let w0 = task_w(row0 * p.row_bytes, row_d(row0), t);
        let w1 = task_w(r1 * p.row_bytes, row_d(r1), t);
        let w2 = task_w(r2 * p.row_bytes, row_d(r2), t);
        let w3 = task_w(r3 * p.row_bytes, row_d(r3), t);
        let n = min(sg_size, tasks - base);
        // One quad's values at a time, folded before the next is computed (fewer live registers).
        let v0 = quad_limb(w0, w1, w2, w3, XQ0, xo, t);
        for (var l = 0u; l < n; l++) {
            acc.q0 = fold_quad(acc.q0, v0, l);
        }
        if (QUADS > 1u && nq > 1u) {
            let v1 = quad_limb(w0, w1, w2, w3, XQ1, xo, t);
            for (var l = 0u; l < n; l++) {
                acc.q1 = fold_quad(acc.q1, v1, l);
            }
        }
        if (QUADS > 2u && nq > 2u) {
            let v2 = quad_limb(w0, w1, w2, w3, XQ2, xo, t);
            for (var l = 0u; l < n; l++) {
                acc.q2 = fold_quad(acc.q2, v2, l);
            }
        }
        if (QUADS > 3u && nq > 3u) {
            let v3 = quad_limb(w0, w1, w2, w3, XQ3, xo, t);
            for (var l = 0u; l < n; l++) {
                acc.q3 = fold_quad(acc.q3, v3, l);
            }
        }
    }
    return acc;
}

// Vector v (< 16) of `a`: a vec4 over the rows (selects: a dynamically indexed array would live
// in local memory).
fn wide_vector(a: Wide, v: u32) -> vec4<f32> {
    let q = v / 4u;
    let i = v % 4u;
    let v0 = select(select(a.q0.v0, a.q1.v0, q == 1u), select(a.q2.v0, a.q3.v0, q == 3u), q >= 2u);
    let v1 = select(select(a.q0.v1, a.q1.v1, q == 1u), select(a.q2.v1, a.q3.v1, q == 3u), q >= 2u);
    let v2 = select(select(a.q0.v2, a.q1.v2, q == 1u), select(a.q2.v2, a.q3.v2, q == 3u), q >= 2u);
    let v3 = select(select(a.q0.v3, a.q1.v3, q == 1u), select(a.q2.v3, a.q3.v3, q == 3u), q >= 2u);
    return select(select(v0, v1, i == 1u), select(v2, v3, i == 3u), i >= 2u);
}

// Row j, vector v of `a`.
fn wide_value(a: Wide, j: u32, v: u32) -> f32 {
    return comp(wide_vector(a, v), j);
}

// A subgroup's Wide, 16 vec4 per subgroup (up to 64 subgroups), for the K split.
var<workgroup> WPART: array<vec4<f32>, 1024>;

fn wide_store_part(at: u32, a: Wide) {
    WPART[at] = a.q0.v0;
    WPART[at + 1u] = a.q0.v1;
    WPART[at + 2u] = a.q0.v2;
    WPART[at + 3u] = a.q0.v3;
    WPART[at + 4u] = a.q1.v0;
    WPART[at + 5u] = a.q1.v1;
    WPART[at + 6u] = a.q1.v2;
    WPART[at + 7u] = a.q1.v3;
    WPART[at + 8u] = a.q2.v0;
    WPART[at + 9u] = a.q2.v1;
    WPART[at + 10u] = a.q2.v2;
    WPART[at + 11u] = a.q2.v3;
    WPART[at + 12u] = a.q3.v0;
    WPART[at + 13u] = a.q3.v1;
    WPART[at + 14u] = a.q3.v2;
    WPART[at + 15u] = a.q3.v3;
}

fn wide_load_part(at: u32) -> Wide {
    return Wide(Quad(WPART[at], WPART[at + 1u], WPART[at + 2u], WPART[at + 3u]),
                Quad(WPART[at + 4u], WPART[at + 5u], WPART[at + 6u], WPART[at + 7u]),
                Quad(WPART[at + 8u], WPART[at + 9u], WPART[at + 10u], WPART[at + 11u]),
                Quad(WPART[at + 12u], WPART[at + 13u], WPART[at + 14u], WPART[at + 15u]));
}

fn wide_add_part(a: Wide, at: u32) -> Wide {
    return Wide(Quad(a.q0.v0 + WPART[at], a.q0.v1 + WPART[at + 1u], a.q0.v2 + WPART[at + 2u],
                     a.q0.v3 + WPART[at + 3u]),
                Quad(a.q1.v0 + WPART[at + 4u], a.q1.v1 + WPART[at + 5u],
                     a.q1.v2 + WPART[at + 6u], a.q1.v3 + WPART[at + 7u]),
                Quad(a.q2.v0 + WPART[at + 8u], a.q2.v1 + WPART[at + 9u],
                     a.q2.v2 + WPART[at + 10u], a.q2.v3 + WPART[at + 11u]),
                Quad(a.q3.v0 + WPART[at + 12u], a.q3.v1 + WPART[at + 13u],
                     a.q3.v2 + WPART[at + 14u], a.q3.v3 + WPART[at + 15u]));
}

// matvec.wgsl's split_sum for wide tiles: the parts of a row group's KSPLIT subgroups added in
// part order, q = 0, 1, ... (every (row, vector) as split_sum adds it). Called by every invocation
// of the workgroup (it holds barriers).
fn wide_split_sum(acc: Wide, sg_id: u32, lane: u32) -> Wide {
    if (KSPLIT == 1u) {
        return acc;
    }
    workgroupBarrier();
    if (lane == 0u) {
        wide_store_part(16u * sg_id, acc);
    }
    workgroupBarrier();
    let first = 16u * (sg_id - sg_id % KSPLIT);
    var r = wide_load_part(first);
    for (var q = 1u; q < KSPLIT; q++) {
        r = wide_add_part(r, first + 16u * q);
    }
    return r;
}

// The dense wide entries' row groups: at step g0, this subgroup runs groups base .. base + pack
// (base = g0 + (sg_id / KSPLIT) * pack; pack > 1 only for short rows, wide_pack), the lane its own
// group's tasks: its part of the group's rows over the whole tile (zeros when it has no rows),
// reduced unless packed.
fn wide_dense_sums(wg_x: u32, base: u32, sg_id: u32, lane: u32, sg_size: u32,
                   pack: u32) -> Wide {
    let grp = group_at(wg_x, base + pack_group(lane, pack));
    if (!grp.live || wide_pairs(sg_size)) {
        return Wide(zero_quad(), zero_quad(), zero_quad(), zero_quad());
    }
    if (pack > 1u) {
        return rows_wide_packed(grp.row0, 1u, grp.n_rows, QUADS, lane, sg_size, pack);
    }
    let q = sg_id % KSPLIT;
    return rows_wide(grp.row0, 1u, grp.n_rows, QUADS, q * sg_size + lane, KSPLIT * sg_size);
}

// Group j (of base .. base + pack) over the whole row: reduced from the packed sums, or summed over
// the K split, as matvec.wgsl's dense_rows. Called by every invocation of the workgroup once per
// group step (it holds barriers and shuffles).
fn wide_dense_group(sums: Wide, wg_x: u32, base: u32, j: u32, sg_id: u32, lane: u32,
                    sg_size: u32, pack: u32) -> Wide {
    if (wide_pairs(sg_size)) {
        let a = live_or_first(group_at(wg_x, base));
        let b = live_or_first(group_at(wg_x, base + 1u));
        let slot = sg_id * (sg_size / 2u);
        if (j == 0u) {
            return reduce_wide(pair_first(a.row0, a.n_rows, b.row0, b.n_rows, QUADS, lane,
                                          sg_size, slot), QUADS);
        }
        return reduce_wide(pair_second(b.row0, b.n_rows, QUADS, lane, sg_size, slot), QUADS);
    }
    if (pack > 1u) {
        return wide_group(sums, j, QUADS, lane, sg_size, pack);
    }
    return wide_split_sum(sums, sg_id, lane);
}

// Dense tiles: workgroup (row groups, tile of ITEMS vectors x_stride apart, all present).
// matvec_wide stores rows as matvec does; matvec_seg_wide as matvec_seg does with Y0_MODE 0 or 2.
// The tile's first vector, its x offsets set; u32::MAX past the vectors.
fn wide_tile(wg: vec3<u32>) -> u32 {
    let first_item = p.item0 + (wg.y + wg.z * 65535u) * ITEMS;
    if (first_item + ITEMS > p.items) {
        return 0xffffffffu;
    }
    let base = p.x_offset + first_item * p.x_stride;
    XQ0 = vec4<u32>(base) + vec4<u32>(0u, 1u, 2u, 3u) * p.x_stride;
    XQ1 = XQ0 + vec4<u32>(4u * p.x_stride);
    XQ2 = XQ1 + vec4<u32>(4u * p.x_stride);
    XQ3 = XQ2 + vec4<u32>(4u * p.x_stride);
    return first_item;
}

@compute @workgroup_size(WG)
fn matvec_wide(@builtin(workgroup_id) wg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32,
               @builtin(subgroup_id) sg_id: u32,
               @builtin(num_subgroups) n_sg: u32,
               @builtin(subgroup_invocation_id) lane: u32,
               @builtin(subgroup_size) sg_size: u32) {
    prologue(lid);
    workgroupBarrier();
    let first_item = wide_tile(wg);
    if (first_item == 0xffffffffu) {
        return;
    }
    let pack = dense_step(sg_size);
    for (var g0 = 0u; g0 < p.rows_per_wg; g0 += (n_sg / KSPLIT) * pack) {
        let base = g0 + (sg_id / KSPLIT) * pack;
        let sums = wide_dense_sums(wg.x, base, sg_id, lane, sg_size, pack);
        for (var gj = 0u; gj < pack; gj++) {
            let grp = group_at(wg.x, base + gj);
            let acc = wide_dense_group(sums, wg.x, base, gj, sg_id, lane, sg_size, pack);
            if (!grp.live || sg_id % KSPLIT != 0u) {
                continue;
            }
            // Lane v stores vectors v, v + S, ... of every row of the group.
            for (var v = lane; v < ITEMS; v += sg_size) {
                let at = (first_item + v) * p.y_stride + p.y_offset + grp.row0;
                for (var j = 0u; j < ROWS; j++) {
                    if (j < grp.n_rows) {
                        Y[at + j] = wide_value(acc, j, v);
                    }
                }
            }
        }
    }
}

@compute @workgroup_size(WG)
fn matvec_seg_wide(@builtin(workgroup_id) wg: vec3<u32>,
                   @builtin(local_invocation_index) lid: u32,
                   @builtin(subgroup_id) sg_id: u32,
                   @builtin(num_subgroups) n_sg: u32,
                   @builtin(subgroup_invocation_id) lane: u32,
                   @builtin(subgroup_size) sg_size: u32) {
    prologue(lid);
    workgroupBarrier();
    let first_item = wide_tile(wg);
    if (first_item == 0xffffffffu) {
        return;
    }
    let pack = dense_step(sg_size);
    for (var g0 = 0u; g0 < p.rows_per_wg; g0 += (n_sg / KSPLIT) * pack) {
        let base = g0 + (sg_id / KSPLIT) * pack;
        let sums = wide_dense_sums(wg.x, base, sg_id, lane, sg_size, pack);
        for (var gj = 0u; gj < pack; gj++) {
            let grp = group_at(wg.x, base + gj);
            let acc = wide_dense_group(sums, wg.x, base, gj, sg_id, lane, sg_size, pack);
            if (!grp.live || sg_id % KSPLIT != 0u) {
                continue;
            }
            for (var v = lane; v < ITEMS; v += sg_size) {
                for (var j = 0u; j < ROWS; j++) {
                    if (j < grp.n_rows) {
                        wide_seg_put(first_item + v, grp.row0 + j, wide_value(acc, j, v));
                    }
                }
            }
        }
    }
}

// Row `row` (part-relative) of vector `item` into its segment, as matvec_seg stores it.
fn wide_seg_put(item: u32, row: u32, v: f32) {
    let seg = seg_of(p.row_base + row);
    var value = v;
    if (Y0_MODE == 2u && seg.buf == 0u) {
        value = silu4(vec4<f32>(v) * p.x_scale).x;
    }
    put(seg.buf, item * seg.stride + seg.at, value);
}

// matvec_group in wide tiles: an expert's items ITEMS at a time, the last tile's missing items
// skipped by whole quads and padded inside a quad by repeating the last item (never stored).
@compute @workgroup_size(WG)
fn matvec_group_wide(@builtin(workgroup_id) wg: vec3<u32>,
                     @builtin(local_invocation_index) lid: u32,
                     @builtin(subgroup_id) sg_id: u32,
                     @builtin(num_subgroups) n_sg: u32,
                     @builtin(subgroup_invocation_id) lane: u32,
                     @builtin(subgroup_size) sg_size: u32) {
    prologue(lid);
    workgroupBarrier();
    let local_expert = wg.y;
    if (local_expert >= p.expert_count) {
        return;
    }
    let expert = p.expert_first + local_expert;
    let count = IDS[expert];
    let list = p.group_base + expert * p.group_cap;
    let first_row = local_expert * p.rows;
    if (wide_rounds(sg_size)) {
        group_wide_rounds(wg.x, first_row, count, list, sg_id, n_sg, lane, sg_size);
        return;
    }
    if (wide_pairs(sg_size)) {
        group_wide_pairs(wg.x, first_row, count, list, sg_id, n_sg, lane, sg_size);
        return;
    }
    for (var r = sg_id * ROWS; r < p.rows_per_wg * ROWS; r += n_sg * ROWS) {
        let row = wg.x * p.rows_per_wg * ROWS + r;
        if (row >= p.rows) {
            break;
        }
        let n_rows = min(ROWS, p.rows - row);
        for (var j = 0u; j < count; j += ITEMS) {
            let at = list + j;
            let nq = group_tile(list, count, j);
            let acc = rows_wide(first_row + row, 1u, n_rows, nq, lane, sg_size);
            group_store(acc, row, j, count, at, lane, sg_size);
        }
    }
}

// ---- Rows of q S + S/2 tasks in pairs (PAIRS) ----
// A row of T = q S + S/2 tasks (q >= 1: the 2,560-value rows, 80 tasks on 32 lanes) takes q + 1
// rounds of a subgroup with half the lanes idle in the last. Two row groups a, b take 2q + 1
// rounds instead of 2q + 2: a's rounds as rows_wide's, except that lanes S/2.. of its last round
// compute b's tasks 0 .. S/2 (stashed in workgroup memory); b's task S/2 + r S + l is computed on
// lane l of round q + 1 + r and shuffled to lane (l + S/2) % S, the lane whose sum takes it in the
// decode order. Every lane adds its tasks' values in the decode order, so the reduction sees the
// same values lane by lane and every (row, vector) keeps decode's bits. Set by the launcher where
// the device has subgroup barriers; the default arithmetic, no K split.
override PAIRS: bool = false;

fn wide_pairs(sg_size: u32) -> bool {
    let t = row_tasks();
    return PAIRS && !LIMB && !IDOT && KSPLIT == 1u && WG <= STASH_WG && t > sg_size
        && t % sg_size == sg_size / 2u;
}

// Row groups a dense wide entry's subgroup takes per step: 2 in pairs, else wide_pack's.
fn dense_step(sg_size: u32) -> u32 {
    if (wide_pairs(sg_size)) {
        return 2u;
    }
    return wide_pack(sg_size);
}

// `g` if it has rows, else the first row group (computed, never stored).
fn live_or_first(g: Group) -> Group {
    if (g.live) {
        return g;
    }
    return Group(0u, 1u, false);
}

// One task's values of rows row0 .. row0 + n_rows (the last repeated up to ROWS) against the
// tile's first nq quads (zeros past them), as rows_wide_sums computes them.
fn task_wide(row0: u32, n_rows: u32, nq: u32, t: u32) -> Wide {
    let last = n_rows - 1u;
    let r1 = row0 + min(1u, last);
    let r2 = row0 + min(2u, last);
    let r3 = row0 + min(3u, last);
    let xo = task_x(t);
    let w0 = task_w(row0 * p.row_bytes, row_d(row0), t);
    let w1 = task_w(r1 * p.row_bytes, row_d(r1), t);
    let w2 = task_w(r2 * p.row_bytes, row_d(r2), t);
    let w3 = task_w(r3 * p.row_bytes, row_d(r3), t);
    let z = zero_quad();
    var v = Wide(quad_add(z, w0, w1, w2, w3, XQ0, xo, t), z, z, z);
    if (QUADS > 1u && nq > 1u) {
        v.q1 = quad_add(z, w0, w1, w2, w3, XQ1, xo, t);
    }
    if (QUADS > 2u && nq > 2u) {
        v.q2 = quad_add(z, w0, w1, w2, w3, XQ2, xo, t);
    }
    if (QUADS > 3u && nq > 3u) {
        v.q3 = quad_add(z, w0, w1, w2, w3, XQ3, xo, t);
    }
    return v;
}

fn quad_plus(a: Quad, b: Quad) -> Quad {
    return Quad(a.v0 + b.v0, a.v1 + b.v1, a.v2 + b.v2, a.v3 + b.v3);
}

// a + b over the first nq quads (a's others unchanged).
fn wide_plus(a: Wide, b: Wide, nq: u32) -> Wide {
    var r = a;
    r.q0 = quad_plus(a.q0, b.q0);
    if (QUADS > 1u && nq > 1u) {
        r.q1 = quad_plus(a.q1, b.q1);
    }
    if (QUADS > 2u && nq > 2u) {
        r.q2 = quad_plus(a.q2, b.q2);
    }
    if (QUADS > 3u && nq > 3u) {
        r.q3 = quad_plus(a.q3, b.q3);
    }
    return r;
}

// Group a's sums (lane l: its tasks l, l + S, ... in order, unreduced), its last round shared
// with b's first S/2 tasks, which lanes S/2.. stash at `slot` (sg_id * S / 2).
fn pair_first(a0: u32, a_rows: u32, b0: u32, b_rows: u32, nq: u32, lane: u32, sg_size: u32,
              slot: u32) -> Wide {
    let half = sg_size / 2u;
    let q = row_tasks() / sg_size;
    var acc = Wide(zero_quad(), zero_quad(), zero_quad(), zero_quad());
    for (var r = 0u; r < q; r++) {
        acc = wide_plus(acc, task_wide(a0, a_rows, nq, r * sg_size + lane), nq);
    }
    let in_a = lane < half;
    let v = task_wide(select(b0, a0, in_a), select(b_rows, a_rows, in_a), nq,
                      select(lane - half, q * sg_size + lane, in_a));
    // The stash is free: every lane has read the last pair's.
    subgroupBarrier();
    if (in_a) {
        acc = wide_plus(acc, v, nq);
    } else {
        STASH[slot + lane - half] = v;
    }
    return acc;
}

// Group b's sums after pair_first (lane l: its tasks l, l + S, ... in order, unreduced).
fn pair_second(b0: u32, b_rows: u32, nq: u32, lane: u32, sg_size: u32, slot: u32) -> Wide {
    let half = sg_size / 2u;
    let q = row_tasks() / sg_size;
    subgroupBarrier();
    let z = Wide(zero_quad(), zero_quad(), zero_quad(), zero_quad());
    var acc = z;
    if (lane < half) {
        acc = wide_plus(z, STASH[slot + lane], nq);
    }
    let src = (lane + half) % sg_size;
    for (var r = 0u; r < q; r++) {
        let v = task_wide(b0, b_rows, nq, half + r * sg_size + lane);
        acc = wide_plus(acc, shuffle_wide(v, src), nq);
    }
    return acc;
}

// ---- Rows of more than half and at most two thirds of a subgroup's tasks (ROUNDS) ----
// A row of T tasks, S/2 < T <= 2S/3 (the expert down's 640-value rows: 20 tasks on 32 lanes),
// leaves S - T lanes idle when a lane takes whole tasks. Three row groups a, b, c take two rounds
// instead of three (3T of 2S slots): in round 0 lane l < T computes task l of a and lane T + l
// task l of b; in round 1 lane l < 2T - S computes task S - T + l of b and lane 2T - S + l task l
// of c. Each lane computes one task of one group per round, with rows_wide's arithmetic; before a
// group's reduction its task l's sums are brought to lane l (b's first S - T through workgroup
// memory, the rest by shuffles) with zeros on lanes T.., the values rows_wide's reduction sees
// lane by lane, so every (row, vector) keeps decode's bits. Set by the launcher where the device
// has subgroup barriers; the default arithmetic only.
override ROUNDS: bool = false;

// Round 0's sums of group b (ROUNDS: lane T + l's at slot sg_id * S / 2 + l, S - T < S / 2 a
// subgroup; PAIRS: lane S/2 + l's): half a slot per invocation of workgroups of up to STASH_WG
// invocations (a fixed size: naga 30 cannot size this array by an override expression here).
// Only the `matvec_wide_stash` assembly (the pipelines that set ROUNDS or PAIRS) holds 128; the
// others keep one slot, so that their tiles do not give up 16 KiB of workgroup memory (and the L1
// cache it is carved from) to a stash they never use; wide_rounds and wide_pairs are false there.
const STASH_WG: u32 = 2u;
var<workgroup> STASH: array<Wide, STASH_WG / 2u>;

fn wide_rounds(sg_size: u32) -> bool {
    let t = row_tasks();
    return ROUNDS && !LIMB && !IDOT && WG <= STASH_WG && 2u * t > sg_size
        && 3u * t <= 2u * sg_size;
}

// One task (`task`; none past the row's tasks) of the group at `row` (rows past the end repeat
// the last row group of the workgroup: computed, never stored) against the tile.
fn round_sums(first_row: u32, row: u32, last_start: u32, nq: u32, task: u32,
              sg_size: u32) -> Wide {
    let r = min(row, last_start);
    return rows_wide_sums(first_row + r, 1u, min(ROWS, p.rows - r), nq, task, sg_size);
}

fn keep_wide(a: Wide, keep: bool) -> Wide {
    let z = zero_quad();
    return Wide(select_quad(z, a.q0, keep), select_quad(z, a.q1, keep), select_quad(z, a.q2, keep),
                select_quad(z, a.q3, keep));
}

fn select_quad(f: Quad, t: Quad, c: bool) -> Quad {
    return Quad(select(f.v0, t.v0, c), select(f.v1, t.v1, c), select(f.v2, t.v2, c),
                select(f.v3, t.v3, c));
}

fn shuffle_wide(a: Wide, src: u32) -> Wide {
    return Wide(shuffle_quad(a.q0, src), shuffle_quad(a.q1, src), shuffle_quad(a.q2, src),
                shuffle_quad(a.q3, src));
}

fn shuffle_quad(q: Quad, src: u32) -> Quad {
    return Quad(subgroupShuffle(q.v0, src), subgroupShuffle(q.v1, src),
                subgroupShuffle(q.v2, src), subgroupShuffle(q.v3, src));
}

// matvec_group_wide in rounds: each subgroup takes row groups three at a time.
fn group_wide_rounds(wg_x: u32, first_row: u32, count: u32, list: u32, sg_id: u32, n_sg: u32,
                     lane: u32, sg_size: u32) {
    let t = row_tasks();
    let spill = sg_size - t;
    let wg_first = wg_x * p.rows_per_wg * ROWS;
    let wg_end = min(wg_first + p.rows_per_wg * ROWS, p.rows);
    if (wg_first >= wg_end) {
        return;
    }
    let last_start = wg_first + ((wg_end - 1u - wg_first) / ROWS) * ROWS;
    let slot = sg_id * (sg_size / 2u);
    for (var r = sg_id * 3u * ROWS; wg_first + r < wg_end; r += n_sg * 3u * ROWS) {
        let row_a = wg_first + r;
        let row_b = row_a + ROWS;
        let row_c = row_b + ROWS;
        for (var j = 0u; j < count; j += ITEMS) {
            let at = list + j;
            let nq = group_tile(list, count, j);
            // Round 0: a on lanes 0..T, b's first tasks on lanes T..S.
            let in_a = lane < t;
            let acc0 = round_sums(first_row, select(row_b, row_a, in_a), last_start, nq,
                                  select(lane - t, lane, in_a), sg_size);
            // The stash is free: every lane of the subgroup has read the last tile's.
            subgroupBarrier();
            if (!in_a) {
                STASH[slot + lane - t] = acc0;
            }
            group_store(reduce_wide(keep_wide(acc0, in_a), nq), row_a, j, count, at, lane, sg_size);
            // Round 1: b's last tasks on lanes 0..2T-S, c on lanes 2T-S..3T-S.
            let in_b = lane < t - spill;
            let in_c = !in_b && lane < 2u * t - spill;
            let task1 = select(select(t, lane - (t - spill), in_c), spill + lane, in_b);
            let acc1 = round_sums(first_row, select(row_c, row_b, in_b), last_start, nq, task1,
                                  sg_size);
            subgroupBarrier();
            // b: tasks 0..S-T from the stash, S-T..T from round 1's lanes 0..2T-S.
            let stashed = STASH[slot + min(lane, spill - 1u)];
            let from1 = shuffle_wide(acc1, select(0u, lane - spill, lane >= spill));
            var b = keep_wide(from1, lane >= spill && lane < t);
            if (lane < spill) {
                b = stashed;
            }
            if (row_b < wg_end) {
                group_store(reduce_wide(b, nq), row_b, j, count, at, lane, sg_size);
            }
            // c: task l from round 1's lane 2T - S + l.
            let c = keep_wide(shuffle_wide(acc1, min(lane + t - spill, sg_size - 1u)), lane < t);
            if (row_c < wg_end) {
                group_store(reduce_wide(c, nq), row_c, j, count, at, lane, sg_size);
            }
        }
    }
}

// matvec_group_wide in pairs (PAIRS): each subgroup takes row groups two at a time.
fn group_wide_pairs(wg_x: u32, first_row: u32, count: u32, list: u32, sg_id: u32, n_sg: u32,
                    lane: u32, sg_size: u32) {
    let wg_first = wg_x * p.rows_per_wg * ROWS;
    let wg_end = min(wg_first + p.rows_per_wg * ROWS, p.rows);
    let slot = sg_id * (sg_size / 2u);
    for (var r = sg_id * 2u * ROWS; wg_first + r < wg_end; r += n_sg * 2u * ROWS) {
        let row_a = wg_first + r;
        // b past this workgroup's rows: a's rows again (computed, never stored).
        let b_live = row_a + ROWS < wg_end;
        let row_b = select(row_a, row_a + ROWS, b_live);
        let n_a = min(ROWS, p.rows - row_a);
        let n_b = min(ROWS, p.rows - row_b);
        for (var j = 0u; j < count; j += ITEMS) {
            let at = list + j;
            let nq = group_tile(list, count, j);
            let a = pair_first(first_row + row_a, n_a, first_row + row_b, n_b, nq, lane, sg_size,
                               slot);
            group_store(reduce_wide(a, nq), row_a, j, count, at, lane, sg_size);
            let b = pair_second(first_row + row_b, n_b, nq, lane, sg_size, slot);
            if (b_live) {
                group_store(reduce_wide(b, nq), row_b, j, count, at, lane, sg_size);
            }
        }
    }
}

// A row group's reduced sums over the tile of items from list position `at` (item j of the
// expert's `count`), stored as matvec_group_wide stores them.
fn group_store(acc: Wide, row: u32, j: u32, count: u32, at: u32, lane: u32, sg_size: u32) {
    let n_rows = min(ROWS, p.rows - row);
    for (var v = lane; v < ITEMS && j + v < count; v += sg_size) {
        let item = IDS[at + v];
        for (var jr = 0u; jr < ROWS; jr++) {
            if (jr < n_rows) {
                Y[item * p.y_stride + p.y_offset + row + jr] = wide_value(acc, jr, v);
            }
        }
    }
}

// Sets the x offsets of the tile of an expert's items j .. j + ITEMS (listed from IDS[list]; the
// last tile padded with its last item) and returns its quads present.
fn group_tile(list: u32, count: u32, j: u32) -> u32 {
    let last = list + count - 1u;
    let at = list + j;
    XQ0 = group_quad(at, last);
    XQ1 = group_quad(at + 4u, last);
    XQ2 = group_quad(at + 8u, last);
    XQ3 = group_quad(at + 12u, last);
    return min(QUADS, (count - j + 3u) / 4u);
}

// The x offsets of the 4 items listed from IDS[at] (past `last`, the last one again).
fn group_quad(at: u32, last: u32) -> vec4<u32> {
    return vec4<u32>(item_x(IDS[min(at, last)]), item_x(IDS[min(at + 1u, last)]),
                     item_x(IDS[min(at + 2u, last)]), item_x(IDS[min(at + 3u, last)]));
}

// matvec_mix in wide tiles: subgroup per value i (its hc gate rows i, i + h, ..., ROWS = hc); lane
// v mixes vector v with the same arithmetic as matvec_mix.
@compute @workgroup_size(WG)
fn matvec_mix_wide(@builtin(workgroup_id) wg: vec3<u32>,
                   @builtin(local_invocation_index) lid: u32,
                   @builtin(subgroup_id) sg_id: u32,
                   @builtin(num_subgroups) n_sg: u32,
                   @builtin(subgroup_invocation_id) lane: u32,
                   @builtin(subgroup_size) sg_size: u32) {
    prologue(lid);
    workgroupBarrier();
    let first_item = wide_tile(wg);
    if (first_item == 0xffffffffu) {
        return;
    }
    // Values r0 + sg_id * pack + g, one row group each (short rows packed: wide_pack).
    let pack = wide_pack(sg_size);
    let first_i = wg.x * p.rows_per_wg;
    let end_i = min(first_i + p.rows_per_wg, p.h);
    for (var r0 = sg_id * pack; first_i + r0 < end_i; r0 += n_sg * pack) {
        // The lane's own group's value (clamped: a group past the end computes, never stores).
        let own = min(first_i + r0 + pack_group(lane, pack), end_i - 1u);
        let sums = rows_wide_packed(own, p.h, p.hc, QUADS, lane, sg_size, pack);
        for (var g = 0u; g < pack; g++) {
            let i = first_i + r0 + g;
            // Uniform: every lane reduces group g, then stores it if it exists.
            let acc = wide_group(sums, g, QUADS, lane, sg_size, pack);
            if (i >= end_i) {
                break;
            }
            mix_store(acc, first_item, i, lane, sg_size);
        }
    }
}

// Value i's gates of the tile's vectors mixed into the output as matvec_mix does (lane v: vectors
// v, v + S, ...).
fn mix_store(acc: Wide, first_item: u32, i: u32, lane: u32, sg_size: u32) {
    let wide = p.h * p.hc;
    for (var v = lane; v < ITEMS; v += sg_size) {
        let item = first_item + v;
        let gates = wide_vector(acc, v);
        var mix = 0.0;
        for (var s = 0u; s < p.hc; s++) {
            mix += sigmoid(comp(gates, s)) * AUX[item * wide + s * p.h + i];
        }
        Y[item * p.y_stride + p.y_offset + i] = mix * (1.0 / f32(p.hc));
    }
}

// matvec_combine in wide tiles: each (vector, stream, row) added into the wide residual as
// matvec_combine adds it.
@compute @workgroup_size(WG)
fn matvec_combine_wide(@builtin(workgroup_id) wg: vec3<u32>,
                       @builtin(local_invocation_index) lid: u32,
                       @builtin(subgroup_id) sg_id: u32,
                       @builtin(num_subgroups) n_sg: u32,
                       @builtin(subgroup_invocation_id) lane: u32,
                       @builtin(subgroup_size) sg_size: u32) {
    prologue(lid);
    workgroupBarrier();
    let first_item = wide_tile(wg);
    if (first_item == 0xffffffffu) {
        return;
    }
    let pack = dense_step(sg_size);
    for (var g0 = 0u; g0 < p.rows_per_wg; g0 += (n_sg / KSPLIT) * pack) {
        let base = g0 + (sg_id / KSPLIT) * pack;
        let sums = wide_dense_sums(wg.x, base, sg_id, lane, sg_size, pack);
        for (var gj = 0u; gj < pack; gj++) {
            let grp = group_at(wg.x, base + gj);
            let acc = wide_dense_group(sums, wg.x, base, gj, sg_id, lane, sg_size, pack);
            if (!grp.live || sg_id % KSPLIT != 0u) {
                continue;
            }
            // Lane q adds the (vector, stream, row) triples q, q + S, ...: each add reads and writes
            // Y, so the lanes take them side by side rather than each a vector's chain of them.
            let wide = p.h * p.hc;
            let per_item = p.hc * ROWS;
            for (var q = lane; q < ITEMS * per_item; q += sg_size) {
                let v = q / per_item;
                let s = (q % per_item) / ROWS;
                let j = q % ROWS;
                if (j < grp.n_rows) {
                    let item = first_item + v;
                    let alpha = 2.0 * sigmoid(AUX[item * p.hc + s] * (1.0 / f32(p.hc)));
                    let at = item * wide + s * p.h + p.row_base + grp.row0 + j;
                    Y[at] += alpha * wide_value(acc, j, v);
                }
            }
        }
    }
}

// matvec_moe_combine in wide tiles: lane q finishes the (row, vector) pairs q, q + S, ... as
// matvec_moe_combine does.
@compute @workgroup_size(WG)
fn matvec_moe_combine_wide(@builtin(workgroup_id) wg: vec3<u32>,
                           @builtin(local_invocation_index) lid: u32,
                           @builtin(subgroup_id) sg_id: u32,
                           @builtin(num_subgroups) n_sg: u32,
                           @builtin(subgroup_invocation_id) lane: u32,
                           @builtin(subgroup_size) sg_size: u32) {
    prologue(lid);
    workgroupBarrier();
    let first_item = wide_tile(wg);
    if (first_item == 0xffffffffu) {
        return;
    }
    let pack = dense_step(sg_size);
    for (var g0 = 0u; g0 < p.rows_per_wg; g0 += (n_sg / KSPLIT) * pack) {
        let base = g0 + (sg_id / KSPLIT) * pack;
        let sums = wide_dense_sums(wg.x, base, sg_id, lane, sg_size, pack);
        for (var gj = 0u; gj < pack; gj++) {
            let grp = group_at(wg.x, base + gj);
            let acc = wide_dense_group(sums, wg.x, base, gj, sg_id, lane, sg_size, pack);
            if (!grp.live || sg_id % KSPLIT != 0u) {
                continue;
            }
            let wide = p.h * p.hc;
            for (var q = lane; q < ROWS * ITEMS; q += sg_size) {
                let j = q / ITEMS;
                let v = q % ITEMS;
                if (j < grp.n_rows) {
                    let tok = first_item + v;
                    let gate = 1.0 / (1.0 + exp(-SGATE[tok]));
                    let i = p.row_base + grp.row0 + j;
                    var m = 0.0;
                    for (var slot = 0u; slot < p.slots; slot++) {
                        let item = tok * p.slots + slot;
                        m += RWTS[item] * ROUTED[item * p.h + i];
                    }
                    m += gate * wide_value(acc, j, v);
                    for (var s = 0u; s < p.hc; s++) {
                        let alpha = 2.0 * (1.0 / (1.0 + exp(-(AUX[tok * p.hc + s] * (1.0 / f32(p.hc))))));
                        Y[tok * wide + s * p.h + i] += alpha * m;
                    }
                }
            }
        }
    }
}

// x in task order for XPERM tiles: `items` vectors of k values from x_offset, x_stride apart,
// written to XW from y_offset, y_stride apart; vec4 q of a vector takes vec4 j of segment s of
// task t, with 4 s + j = q / TASKS and t = q % TASKS (tile_seg's order). A copy: no arithmetic.
@compute @workgroup_size(64)
fn permute_x(@builtin(global_invocation_id) gid: vec3<u32>,
             @builtin(workgroup_id) wg: vec3<u32>) {
    let q = gid.x;
    let item = wg.y + wg.z * 65535u;
    let n = row_tasks();
    if (q >= 8u * n || item >= p.items) {
        return;
    }
    let t = q % n;
    let sj = q / n;
    let xo = task_x(t);
    let at = select(xo.x, xo.y, sj >= 4u);
    let src = (p.x_offset + item * p.x_stride) >> 2u;
    XW[((p.y_offset + item * p.y_stride) >> 2u) + q] = X[src + (at >> 2u) + sj % 4u];
}
