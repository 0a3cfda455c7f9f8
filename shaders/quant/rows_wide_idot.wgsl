// rows_wide in the integer-digit arithmetic (the `matvec_wide_idot` assemblies; quant/rows_idot.wgsl):
// each task's codes decoded once per row and shared by the tile's vectors, whose digits the lanes
// read from XQ (XQ0 .. XQ3 hold their word offsets). Vector v of row r folds, on lane l, the tasks
// l, l + S, ... as rows_dot_idot does, then one scalar subgroupAdd: a decode step's bits.

// acc (a vec4 over the rows) with one task of each row against the vector at word offset `first`.
fn tok_values_i(acc: vec4<f32>, w0: TaskI, w1: TaskI, w2: TaskI, w3: TaskI, first: u32, t: u32,
                tasks: u32) -> vec4<f32> {
    let x = xq_task(first, t, tasks);
    var a = acc;
    a.x = fma(task_value_i(w0, x), w0.s, a.x);
    if (ROWS > 1u) {
        a.y = fma(task_value_i(w1, x), w1.s, a.y);
    }
    if (ROWS > 2u) {
        a.z = fma(task_value_i(w2, x), w2.s, a.z);
    }
    if (ROWS > 3u) {
        a.w = fma(task_value_i(w3, x), w3.s, a.w);
    }
    return a;
}

fn quad_add_i(acc: Quad, w0: TaskI, w1: TaskI, w2: TaskI, w3: TaskI, b: vec4<u32>, t: u32,
              tasks: u32) -> Quad {
    return Quad(tok_values_i(acc.v0, w0, w1, w2, w3, b.x, t, tasks),
                tok_values_i(acc.v1, w0, w1, w2, w3, b.y, t, tasks),
                tok_values_i(acc.v2, w0, w1, w2, w3, b.z, t, tasks),
                tok_values_i(acc.v3, w0, w1, w2, w3, b.w, t, tasks));
}

fn rows_wide_idot(row0: u32, row_step: u32, n_rows: u32, nq: u32, lane: u32,
                  sg_size: u32) -> Wide {
    var acc = Wide(zero_quad(), zero_quad(), zero_quad(), zero_quad());
    let last = n_rows - 1u;
    let r1 = row0 + min(1u, last) * row_step;
    let r2 = row0 + min(2u, last) * row_step;
    let r3 = row0 + min(3u, last) * row_step;
    let tasks = (p.k / QK) * TASKS_PER_BLOCK;
    for (var t = lane; t < tasks; t += sg_size) {
        let w0 = task_wi(row0 * p.row_bytes, row_d(row0), t);
        let w1 = task_wi(r1 * p.row_bytes, row_d(r1), t);
        let w2 = task_wi(r2 * p.row_bytes, row_d(r2), t);
        let w3 = task_wi(r3 * p.row_bytes, row_d(r3), t);
        acc.q0 = quad_add_i(acc.q0, w0, w1, w2, w3, XQ0, t, tasks);
        if (QUADS > 1u && nq > 1u) {
            acc.q1 = quad_add_i(acc.q1, w0, w1, w2, w3, XQ1, t, tasks);
        }
        if (QUADS > 2u && nq > 2u) {
            acc.q2 = quad_add_i(acc.q2, w0, w1, w2, w3, XQ2, t, tasks);
        }
        if (QUADS > 3u && nq > 3u) {
            acc.q3 = quad_add_i(acc.q3, w0, w1, w2, w3, XQ3, t, tasks);
        }
    }
    return reduce_wide(acc, nq);
}
