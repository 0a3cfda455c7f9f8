// ---- Integer-digit arithmetic (the `*_idot` assemblies; docs/int-arith.md) ----
// Opt-in: `STRATA_ARITH=int`, or `strata bench --synthetic matvec --arith int`.
//
// x is split once per mat-vec (xq_split), per (vector, task): E = limb_exp of the task's largest
// |x| (|x| < 2^E), x_int = round(x * 2^(22-E)) (|x_int| <= 2^22) and its three signed base-256
// digits d0, d1, d2 (x_int = 65536 d2 + 256 d1 + d0; d0, d1 in [-128, 127], |d2| <= 64), packed
// four to a word in the task's value order (task_x's two 16-value segments). A task's weights are
// integer codes (the type's task_wi: 4 signed bytes a word) with an integer factor per segment
// (ka, kb), an offset every code carries (the type's IDOT_OFFSET) and a float scale s. For each
// digit l, I_l = ka (Σa c d_l - off Σa d_l) + kb (Σb c d_l - off Σb d_l) is an exact i32
// (dot4I8Packed), whatever order adds it; the task's value is
// v = ((f32(I2) 65536 + f32(I1) 256) + f32(I0)) 2^(E-22) and a row folds fma(v, s, acc) over its
// tasks as rows_dot folds its task values (lane l: tasks l, l+S, ... in order, then subgroupAdd).
// A task whose x is not finite has E = XQ_NONFINITE and gives NaN.
//
// XQ holds each vector's words at x_base + w * tasks + t (lanes read consecutive words): w = 8l + j
// is word j of digit l (j < 4: segment a), w = 24 the exponent.

const IDOT: bool = true;
@group(0) @binding(19) var<storage, read_write> XQ: array<u32>;
const XQ_WORDS: u32 = 25u;
const XQ_NONFINITE: i32 = 1000;
const XQ_WG: u32 = 64u;

// The three digits of 4 values of a task of exponent e, each packed into a word.
fn xq_digits(v: vec4<f32>, e: i32) -> vec3<u32> {
    let xi = vec4<i32>(round(v * pow2(22 - e)));
    let d0 = ((xi + vec4<i32>(128)) & vec4<i32>(255)) - vec4<i32>(128);
    let r1 = (xi - d0) >> vec4<u32>(8u);
    let d1 = ((r1 + vec4<i32>(128)) & vec4<i32>(255)) - vec4<i32>(128);
    let d2 = (r1 - d1) >> vec4<u32>(8u);
    return vec3<u32>(pack4xI8(d0), pack4xI8(d1), pack4xI8(d2));
}

// Store word `w` of task `t` (of `tasks`) at `base`: into the workgroup's XQL (LOCAL) or XQ.
fn xq_store(local: bool, base: u32, w: u32, t: u32, tasks: u32, v: u32) {
    if (local) {
        XQL[base + w * tasks + t] = v;
    } else {
        XQ[base + w * tasks + t] = v;
    }
}

fn xq_put(local: bool, base: u32, t: u32, tasks: u32, j: u32, d: vec3<u32>) {
    xq_store(local, base, j, t, tasks, d.x);
    xq_store(local, base, 8u + j, t, tasks, d.y);
    xq_store(local, base, 16u + j, t, tasks, d.z);
}

// Split task t of the vector at x offset `xb` (floats, X_MODE applied) into the words at `base`.
fn xq_split_task(local: bool, xb: u32, base: u32, t: u32, tasks: u32) {
    let xo = task_x(t);
    var a = load_seg(xb + xo.x);
    var b = load_seg(xb + xo.y);
    if (X_MODE == 3u) {
        // The matvec_norm_idot assemblies: the input norm of the tile's vector (norm_prologue
        // ran first), as the f32 rows apply it.
        a = norm_seg(a, xo.x, 0u);
        b = norm_seg(b, xo.y, 0u);
    }
    let m4 = max(max(max(abs(a.v0), abs(a.v1)), max(abs(a.v2), abs(a.v3))),
                 max(max(abs(b.v0), abs(b.v1)), max(abs(b.v2), abs(b.v3))));
    let m = max(max(m4.x, m4.y), max(m4.z, m4.w));
    // Non-finite (or a NaN that max dropped): the sum of all values is not finite either.
    let all = (a.v0 + a.v1 + a.v2 + a.v3) + (b.v0 + b.v1 + b.v2 + b.v3);
    let total = (all.x + all.y) + (all.z + all.w);
    let finite = m <= 3.4028235e38 && total - total == 0.0;
    var e = limb_exp(m);
    if (!finite) {
        e = 0;
    }
    xq_put(local, base, t, tasks, 0u, xq_digits(a.v0, e));
    xq_put(local, base, t, tasks, 1u, xq_digits(a.v1, e));
    xq_put(local, base, t, tasks, 2u, xq_digits(a.v2, e));
    xq_put(local, base, t, tasks, 3u, xq_digits(a.v3, e));
    xq_put(local, base, t, tasks, 4u, xq_digits(b.v0, e));
    xq_put(local, base, t, tasks, 5u, xq_digits(b.v1, e));
    xq_put(local, base, t, tasks, 6u, xq_digits(b.v2, e));
    xq_put(local, base, t, tasks, 7u, xq_digits(b.v3, e));
    xq_store(local, base, 24u, t, tasks, bitcast<u32>(select(XQ_NONFINITE, e, finite)));
}

// One invocation per (task, vector): x (after the X_MODE transform) split into XQ, vector v's words
// from v * XQ_WORDS * tasks.
@compute @workgroup_size(XQ_WG)
fn xq_split(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let tasks = (p.k / QK) * TASKS_PER_BLOCK;
    let t = wg.x * XQ_WG + lid.x;
    let v = wg.y + wg.z * 65535u;
    if (t >= tasks || v >= p.items) {
        return;
    }
    xq_split_task(false, p.x_offset + v * p.x_stride, v * XQ_WORDS * tasks, t, tasks);
}

// Decode without a split dispatch (IDOT_LOCAL, one vector per workgroup, or a few for the expert
// combine): the workgroup splits its vector at x offset `xb` into XQL from word `base` itself,
// its invocations taking tasks in turn; the entry point then waits at a barrier. XQL_WORDS is set
// per pipeline (1 where nothing is staged).
override IDOT_LOCAL: bool = false;
override XQL_WORDS: u32 = 1u;
var<workgroup> XQL: array<u32, XQL_WORDS>;

fn xq_stage(xb: u32, base: u32, lid: u32) {
    let tasks = (p.k / QK) * TASKS_PER_BLOCK;
    for (var t = lid; t < tasks; t += WG) {
        xq_split_task(true, xb, base, t, tasks);
    }
}

// Where slot s's digits start in XQL (IDOT_LOCAL), else `xb`.
fn slot_x(xb: u32, s: u32) -> u32 {
    if (IDOT_LOCAL) {
        return s * XQ_WORDS * (p.k / QK) * TASKS_PER_BLOCK;
    }
    return xb;
}

fn xq_word(at: u32) -> u32 {
    if (IDOT_LOCAL) {
        return XQL[at];
    }
    return XQ[at];
}

// One task's x digits: digit l of segment a in a<l>, of segment b in b<l>; with IDOT_OFFSET, each
// segment's digit sums.
struct XTask {
    a0: vec4<u32>,
    a1: vec4<u32>,
    a2: vec4<u32>,
    b0: vec4<u32>,
    b1: vec4<u32>,
    b2: vec4<u32>,
    sa: vec3<i32>,
    sb: vec3<i32>,
    e: i32,
}

fn xq_vec4(at: u32, tasks: u32) -> vec4<u32> {
    return vec4<u32>(xq_word(at), xq_word(at + tasks), xq_word(at + 2u * tasks),
                     xq_word(at + 3u * tasks));
}

fn dot_seg(c: vec4<u32>, d: vec4<u32>) -> i32 {
    return ((dot4I8Packed(c.x, d.x) + dot4I8Packed(c.y, d.y)) + dot4I8Packed(c.z, d.z))
        + dot4I8Packed(c.w, d.w);
}

fn xq_task(x_base: u32, t: u32, tasks: u32) -> XTask {
    let at = x_base + t;
    var x = XTask(xq_vec4(at, tasks), xq_vec4(at + 8u * tasks, tasks),
                  xq_vec4(at + 16u * tasks, tasks), xq_vec4(at + 4u * tasks, tasks),
                  xq_vec4(at + 12u * tasks, tasks), xq_vec4(at + 20u * tasks, tasks),
                  vec3<i32>(0), vec3<i32>(0), bitcast<i32>(xq_word(at + 24u * tasks)));
    if (IDOT_OFFSET != 0) {
        let ones = vec4<u32>(0x01010101u);
        x.sa = vec3<i32>(dot_seg(ones, x.a0), dot_seg(ones, x.a1), dot_seg(ones, x.a2));
        x.sb = vec3<i32>(dot_seg(ones, x.b0), dot_seg(ones, x.b1), dot_seg(ones, x.b2));
    }
    return x;
}

fn digit_sum(w: TaskI, da: vec4<u32>, db: vec4<u32>, sa: i32, sb: i32) -> i32 {
    var ia = dot_seg(w.a, da);
    var ib = dot_seg(w.b, db);
    if (IDOT_OFFSET != 0) {
        ia -= IDOT_OFFSET * sa;
        ib -= IDOT_OFFSET * sb;
    }
    return w.ka * ia + w.kb * ib;
}

// The task's value before its scale (the header's v).
fn task_value_i(w: TaskI, x: XTask) -> f32 {
    let i0 = digit_sum(w, x.a0, x.b0, x.sa.x, x.sb.x);
    let i1 = digit_sum(w, x.a1, x.b1, x.sa.y, x.sb.y);
    let i2 = digit_sum(w, x.a2, x.b2, x.sa.z, x.sb.z);
    let s = (f32(i2) * 65536.0 + f32(i1) * 256.0) + f32(i0);
    if (x.e == XQ_NONFINITE) {
        return bitcast<f32>(0x7fc00000u);
    }
    return s * pow2(x.e - 22);
}

struct XTile {
    x0: XTask,
    x1: XTask,
    x2: XTask,
    x3: XTask,
}

fn xq_tile(x_base: u32, t: u32, tasks: u32) -> XTile {
    let x0 = xq_task(x_base, t, tasks);
    var x = XTile(x0, x0, x0, x0);
    if (ITEMS > 1u) {
        x.x1 = xq_task(x_base + XS.y, t, tasks);
    }
    if (ITEMS > 2u) {
        x.x2 = xq_task(x_base + XS.z, t, tasks);
    }
    if (ITEMS > 3u) {
        x.x3 = xq_task(x_base + XS.w, t, tasks);
    }
    return x;
}

fn row_task_i(row: u32, t: u32, x: XTile, acc: vec4<f32>) -> vec4<f32> {
    let w = task_wi(row * p.row_bytes, row_d(row), t);
    var a = acc;
    a.x = fma(task_value_i(w, x.x0), w.s, a.x);
    if (ITEMS > 1u) {
        a.y = fma(task_value_i(w, x.x1), w.s, a.y);
    }
    if (ITEMS > 2u) {
        a.z = fma(task_value_i(w, x.x2), w.s, a.z);
    }
    if (ITEMS > 3u) {
        a.w = fma(task_value_i(w, x.x3), w.s, a.w);
    }
    return a;
}

// rows_dot in this arithmetic (rows_dot's arguments; x_base indexes XQ).
fn rows_dot_idot(row0: u32, row_step: u32, n_rows: u32, x_base: u32, n_items: u32, lane: u32,
                 sg_size: u32) -> Acc {
    var a0 = vec4<f32>(0.0);
    var a1 = vec4<f32>(0.0);
    var a2 = vec4<f32>(0.0);
    var a3 = vec4<f32>(0.0);
    let last = n_rows - 1u;
    let tasks = (p.k / QK) * TASKS_PER_BLOCK;
    for (var t = lane; t < tasks; t += sg_size) {
        let x = xq_tile(x_base, t, tasks);
        a0 = row_task_i(row0, t, x, a0);
        if (ROWS > 1u) {
            a1 = row_task_i(row_at(row0, row_step, min(1u, last)), t, x, a1);
        }
        if (ROWS > 2u) {
            a2 = row_task_i(row_at(row0, row_step, min(2u, last)), t, x, a2);
        }
        if (ROWS > 3u) {
            a3 = row_task_i(row_at(row0, row_step, min(3u, last)), t, x, a3);
        }
    }
    return Acc(reduce_items(a0, n_items), reduce_items(a1, n_items), reduce_items(a2, n_items),
               reduce_items(a3, n_items));
}
