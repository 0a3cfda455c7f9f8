// Dequantizing matrix-vector products, y[item][row] = W[row] . x[item], for one part of a weight
// tensor (parts are whole rows, see src/gpu/buffers.rs). Assembled (src/gpu/shaders.rs) with
// quant/common.wgsl, one quant/<type>.wgsl and the row body of the type's layout:
// quant/rows_split.wgsl for the split layouts (src/gpu/layout.rs), quant/rows_block.wgsl for GGUF
// blocks. A row body supplies `rows_dot(row0, row_step, n_rows, x_base, n_items, lane, sg_size)`:
// rows row_at(row0, row_step, r) (r < ROWS) against up to TILE vectors, reduced over the subgroup, and
// `get_rows`. Every row's bits depend only on the row, the vector and the device's subgroup size,
// never on the number of vectors, the tile or the rows computed beside it, so prefill == decode.
//
// A type may keep a codebook in workgroup memory: its `prologue(lid)` fills it, and every entry
// point calls it first, followed by a barrier (an empty prologue is added for the other types).
//
// What this file adds around the row body, each the same arithmetic whatever the batch:
//   x transforms  (X_MODE) 0: x; 1: silu(x[i]) * x[i + x_half] (SwiGLU of a gate|up vector);
//                 2: silu(x[i] * x_scale); 3: the grouped RMS norm of x (quant/x_norm.wgsl, the
//                 matvec_norm assemblies, matvec_seg only)
//   entry points  matvec: y rows; matvec_seg: rows split over three outputs (concatenated
//                 weights); matvec_mix: the hyper-connection mix of the rows (i + s*h) as in
//                 hc.wgsl's hc_mix_out; matvec_combine: y added into the wide residual as in
//                 hc.wgsl's hc_combine; matvec_moe_combine: the shared expert's down rows
//                 finishing the MoE block as moe.wgsl's moe_combine_hc; matvec_expert: one
//                 expert per item (ids from the router);
//                 matvec_group: the items of each expert in tiles (prefill, grouped by moe_group).
// The dense entry points may split a row over several subgroups (KSPLIT, below).
// Prefill's wide tiles (up to 16 vectors per decoded weight) are quant/rows_wide.wgsl's entry
// points, assembled after this file for the split layouts (`matvec_wide:<type>`).
// A tile's vectors start at x_base + XS.x, .y, .z, .w (XS.x = 0): evenly spaced for the dense
// entries, gathered for matvec_group. The row bodies read them through XS only.

struct Params {
    rows: u32,          // rows per matrix in this part (per expert in expert mode)
    k: u32,             // columns
    row_bytes: u32,     // bytes between rows (block bodies in a split layout)
    items: u32,         // x vectors (tokens, or token x slot in expert mode)
    x_stride: u32,      // floats between x vectors
    x_offset: u32,
    y_stride: u32,      // floats between y vectors
    y_offset: u32,      // where row 0 of this part lands inside a y vector
    slots: u32,         // expert mode: ids per token; item = token * slots + slot
    x_per_item: u32,    // expert mode: 1 = x indexed by item, 0 = by token
    expert_first: u32,  // expert mode: first expert stored in this part
    expert_count: u32,  // expert mode: experts stored in this part
    rows_per_wg: u32,   // row groups per workgroup (ROWS rows each)
    d_base: u32,        // split layouts: byte offset of the part's scale plane
    x_mode: u32,
    x_half: u32,        // x_mode 1: floats from a gate to its up value
    x_scale: f32,       // x_mode 2; matvec_seg's Y0_MODE 2
    row_base: u32,      // global row of this part's row 0 (matvec_seg)
    seg1: u32,          // matvec_seg: first global row of output 1 (and of output 2)
    seg2: u32,
    y1_offset: u32,
    y1_stride: u32,
    y2_offset: u32,
    y2_stride: u32,
    hc: u32,            // matvec_mix / matvec_combine: streams
    h: u32,             // matvec_mix / matvec_combine: stream width
    item0: u32,         // first vector of this dispatch (tiles of ITEMS vectors follow)
    group_base: u32,    // matvec_group: where the item lists start in IDS (after the counts)
    group_cap: u32,     // matvec_group: room per expert's list
    norm_eps: f32,      // X_MODE 3 (quant/x_norm.wgsl): the norm's epsilon
    norm_period: u32,   // X_MODE 3: values of the norm weight (AUX), index i % period
}

var<immediate> p: Params;

@group(0) @binding(0) var<storage, read> W: array<u32>;
// x vectors start on 16-byte boundaries (checked by the launcher), so they are read as vec4.
@group(0) @binding(1) var<storage, read> X: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> Y: array<f32>;
@group(0) @binding(3) var<storage, read> IDS: array<u32>;
@group(0) @binding(6) var<storage, read_write> Y1: array<f32>;
@group(0) @binding(7) var<storage, read_write> Y2: array<f32>;
// matvec_mix: the normed streams the gates multiply; matvec_combine: the injection logits.
@group(0) @binding(8) var<storage, read> AUX: array<f32>;

// Invocations per workgroup (chosen by the launcher; 128 unless tuned).
override WG: u32 = 128u;
// Up to TILE x vectors share each dequantized weight (prefill reads every weight once per tile).
const TILE: u32 = 4u;
// Rows per subgroup (1..4), chosen per matrix by the launcher.
override ROWS: u32 = 2u;
// Vectors per tile in this dispatch (1..TILE): every tile of a dispatch is full, the launcher
// sends a remainder as a dispatch of its own. A constant, like X_MODE, so the row body has no
// branches and the compiler can issue all of a task's loads at once.
override ITEMS: u32 = 1u;
override X_MODE: u32 = 0u;
// matvec_seg: 2 stores silu(v * x_scale) (xform4's mode 2, per component) in output 0 instead of
// v, what xform_in_place would leave there; 0 stores v. (The seg's own x is plain, so x_scale is
// free for it.) 3 (matvec_conv assemblies, one vector): each row of output 0 is a GDN conv input
// and its channel's conv output is stored instead (quant/seg_conv.wgsl's seg0_store).
override Y0_MODE: u32 = 0u;
// Split K (1, 2 or 4; the dense entry points): the KSPLIT subgroups KSPLIT*g + q of a workgroup
// share row group g, subgroup q taking lanes q*S .. q*S + S of a row body run KSPLIT*S lanes wide
// (its lane order over the wider row, one `subgroupAdd` per subgroup), then the parts are added in
// order q = 0, 1, .... Rows with long inputs then take a few loop steps, not tens. The launcher
// picks KSPLIT from the weight's shape alone (never from the number of vectors), so prefill and
// decode agree bit for bit; it also keeps KSPLIT at most the workgroup's subgroup count.
override KSPLIT: u32 = 1u;
var<workgroup> KPART: array<vec4<f32>, 256>; // 4 rows for each of up to 64 subgroups

// Offsets of the tile's vectors from the first one's (see the header).
var<private> XS: vec4<u32>;

// Row r of a row body's group: row0 + r * row_step, or with PAIRED (matvec_expert_glu's gate|up
// rows) the pairs row0 + r / 2 + (r % 2) * row_step: gate j, up j, gate j + 1, up j + 1. (The same
// rows for r < 2.)
override PAIRED: bool = false;

fn row_at(row0: u32, row_step: u32, r: u32) -> u32 {
    if (PAIRED) {
        return row0 + (r >> 1u) + (r & 1u) * row_step;
    }
    return row0 + r * row_step;
}

fn silu4(v: vec4<f32>) -> vec4<f32> {
    return v / (vec4<f32>(1.0) + exp(-v));
}

// The x transform of 4 values `v` (and, for SwiGLU, their up values `u`). The one place its
// arithmetic is written: load_x4 applies it on load, xform_in_place ahead of a prefill mat-vec.
fn xform4(v: vec4<f32>, u: vec4<f32>) -> vec4<f32> {
    switch X_MODE {
        case 1u: {
            return silu4(v) * u;
        }
        case 2u: {
            return silu4(v * p.x_scale);
        }
        default: {
            return v;
        }
    }
}

// x[4i .. 4i+4] after the x transform.
fn load_x4(i: u32) -> vec4<f32> {
    if (X_MODE == 1u) {
        return xform4(X[i], X[i + (p.x_half >> 2u)]);
    }
    return xform4(X[i], vec4<f32>(0.0));
}

// Results of up to 4 rows (r0..r3) for TILE vectors (components). Named fields and select-based
// access below: a dynamically indexed array would live in slow local memory.
struct Acc {
    r0: vec4<f32>,
    r1: vec4<f32>,
    r2: vec4<f32>,
    r3: vec4<f32>,
}

fn acc_row(a: Acc, j: u32) -> vec4<f32> {
    return select(select(a.r0, a.r1, j == 1u), select(a.r2, a.r3, j == 3u), j >= 2u);
}

fn comp(v: vec4<f32>, i: u32) -> f32 {
    return select(select(v.x, v.y, i == 1u), select(v.z, v.w, i == 3u), i >= 2u);
}

// One scalar subgroupAdd per vector actually present (a decode step reduces 1 value per row, not
// 4); every vector's sum goes through the same scalar reduction whatever the tile holds.
fn reduce_items(acc: vec4<f32>, n_items: u32) -> vec4<f32> {
    var r = vec4<f32>(0.0);
    r.x = subgroupAdd(acc.x);
    if (ITEMS > 1u) {
        r.y = subgroupAdd(acc.y);
    }
    if (ITEMS > 2u) {
        r.z = subgroupAdd(acc.z);
    }
    if (ITEMS > 3u) {
        r.w = subgroupAdd(acc.w);
    }
    return r;
}

fn zero_acc() -> Acc {
    return Acc(vec4<f32>(0.0), vec4<f32>(0.0), vec4<f32>(0.0), vec4<f32>(0.0));
}

// The row group's results over the whole row: this subgroup's part plus its partners', in part
// order (KSPLIT > 1), on every lane of each of them. Called by every invocation of the workgroup
// once per row-group step (it holds barriers).
fn split_sum(acc: Acc, sg_id: u32, lane: u32) -> Acc {
    if (KSPLIT == 1u) {
        return acc;
    }
    workgroupBarrier();
    if (lane == 0u) {
        KPART[4u * sg_id] = acc.r0;
        KPART[4u * sg_id + 1u] = acc.r1;
        KPART[4u * sg_id + 2u] = acc.r2;
        KPART[4u * sg_id + 3u] = acc.r3;
    }
    workgroupBarrier();
    let first = 4u * (sg_id - sg_id % KSPLIT);
    var r = Acc(KPART[first], KPART[first + 1u], KPART[first + 2u], KPART[first + 3u]);
    for (var q = 1u; q < KSPLIT; q++) {
        let at = first + 4u * q;
        r.r0 += KPART[at];
        r.r1 += KPART[at + 1u];
        r.r2 += KPART[at + 2u];
        r.r3 += KPART[at + 3u];
    }
    return r;
}

// Row group g's place in the dense entry points' loop (see KSPLIT).
struct Group {
    row0: u32,
    n_rows: u32,
    live: bool,
}

fn group_at(wg_x: u32, g: u32) -> Group {
    let row0 = (wg_x * p.rows_per_wg + g) * ROWS;
    let live = g < p.rows_per_wg && row0 < p.rows;
    var n_rows = 1u;
    if (live) {
        n_rows = min(ROWS, p.rows - row0);
    }
    return Group(row0, n_rows, live);
}

// This subgroup's part of row group `grp` (zeros when it has no rows), summed over the split.
fn dense_rows(grp: Group, x_base: u32, sg_id: u32, lane: u32, sg_size: u32) -> Acc {
    var acc = zero_acc();
    if (grp.live) {
        let q = sg_id % KSPLIT;
        acc = rows_dot(grp.row0, 1u, grp.n_rows, x_base, ITEMS, q * sg_size + lane,
                       KSPLIT * sg_size);
    }
    return split_sum(acc, sg_id, lane);
}

struct Tile {
    first_item: u32,
    n_items: u32,
    x_base: u32,
}

fn tile_of(wg: vec3<u32>) -> Tile {
    let first_item = p.item0 + (wg.y + wg.z * 65535u) * ITEMS;
    var n_items = ITEMS;
    if (first_item + ITEMS > p.items) {
        n_items = 0u;
    }
    XS = vec4<u32>(0u, 1u, 2u, 3u) * p.x_stride;
    return Tile(first_item, n_items, p.x_offset + first_item * p.x_stride);
}

fn put(buf: u32, index: u32, v: f32) {
    switch buf {
        case 1u: {
            Y1[index] = v;
        }
        case 2u: {
            Y2[index] = v;
        }
        default: {
            Y[index] = v;
        }
    }
}

@compute @workgroup_size(WG)
fn matvec(@builtin(workgroup_id) wg: vec3<u32>,
          @builtin(local_invocation_index) lid: u32,
          @builtin(subgroup_id) sg_id: u32,
          @builtin(num_subgroups) n_sg: u32,
          @builtin(subgroup_invocation_id) lane: u32,
          @builtin(subgroup_size) sg_size: u32) {
    prologue(lid);
    workgroupBarrier();
    let tile = tile_of(wg);
    if (tile.n_items == 0u) {
        return;
    }
    let xb = stage_x(tile.x_base, lid);
    for (var g0 = 0u; g0 < p.rows_per_wg; g0 += n_sg / KSPLIT) {
        let grp = group_at(wg.x, g0 + sg_id / KSPLIT);
        let acc = dense_rows(grp, xb, sg_id, lane, sg_size);
        let store = grp.live && sg_id % KSPLIT == 0u;
        let row0 = grp.row0;
        let n_rows = grp.n_rows;
        if (store && lane == 0u) {
            for (var j = 0u; j < ROWS; j++) {
                for (var i = 0u; i < TILE; i++) {
                    if (j < n_rows && i < ITEMS) {
                        Y[(tile.first_item + i) * p.y_stride + p.y_offset + row0 + j] = comp(acc_row(acc, j), i);
                    }
                }
            }
        }
    }
}

// Where row g (part-relative plus row_base) of a segmented store goes: its buffer (0, 1 or 2),
// that buffer's vector stride and the row's offset in it.
struct SegAt {
    buf: u32,
    stride: u32,
    at: u32,
}

fn seg_of(g: u32) -> SegAt {
    if (g >= p.seg2) {
        return SegAt(2u, p.y2_stride, p.y2_offset + g - p.seg2);
    }
    if (g >= p.seg1) {
        return SegAt(1u, p.y1_stride, p.y1_offset + g - p.seg1);
    }
    return SegAt(0u, p.y_stride, p.y_offset + g);
}

@compute @workgroup_size(WG)
fn matvec_seg(@builtin(workgroup_id) wg: vec3<u32>,
              @builtin(num_workgroups) n_wg: vec3<u32>,
              @builtin(local_invocation_index) lid: u32,
              @builtin(subgroup_id) sg_id: u32,
              @builtin(num_subgroups) n_sg: u32,
              @builtin(subgroup_invocation_id) lane: u32,
              @builtin(subgroup_size) sg_size: u32) {
    prologue(lid);
    workgroupBarrier();
    let tile = tile_of(wg);
    if (tile.n_items == 0u) {
        return;
    }
    if (X_MODE == 3u) {
        norm_prologue(tile, wg.x, n_wg.x, lid, lane, sg_id, n_sg);
    }
    let xb = stage_x(tile.x_base, lid);
    for (var g0 = 0u; g0 < p.rows_per_wg; g0 += n_sg / KSPLIT) {
        let grp = group_at(wg.x, g0 + sg_id / KSPLIT);
        let acc = dense_rows(grp, xb, sg_id, lane, sg_size);
        let store = grp.live && sg_id % KSPLIT == 0u;
        let row0 = grp.row0;
        let n_rows = grp.n_rows;
        // Lane j stores row j (every lane holds the reduced rows; the same arithmetic whichever
        // lane runs it), so the rows' stores, and decode's conv of each channel (its history read
        // then shifted), run side by side rather than one after another on lane 0.
        for (var j = lane; store && j < ROWS; j += sg_size) {
            let g = p.row_base + row0 + j;
            let seg = seg_of(g);
            let buf = seg.buf;
            var v = acc_row(acc, j);
            if (Y0_MODE == 2u && buf == 0u) {
                v = silu4(v * p.x_scale);
            }
            if (Y0_MODE == 3u && buf == 0u && j < n_rows) {
                v.x = seg0_store(g, v.x);
            }
            for (var i = 0u; i < TILE; i++) {
                if (j < n_rows && i < ITEMS) {
                    put(buf, (tile.first_item + i) * seg.stride + seg.at, comp(v, i));
                }
            }
        }
    }
}

fn sigmoid(v: f32) -> f32 {
    return 1.0 / (1.0 + exp(-v));
}

// Rows i, i + h, ..., i + (hc-1) h are the gates of value i in each stream: lane 0 mixes them
// with the normed streams (AUX) into Y[item * y_stride + y_offset + i].
@compute @workgroup_size(WG)
fn matvec_mix(@builtin(workgroup_id) wg: vec3<u32>,
              @builtin(local_invocation_index) lid: u32,
              @builtin(subgroup_id) sg_id: u32,
              @builtin(num_subgroups) n_sg: u32,
              @builtin(subgroup_invocation_id) lane: u32,
              @builtin(subgroup_size) sg_size: u32) {
    prologue(lid);
    workgroupBarrier();
    let tile = tile_of(wg);
    if (tile.n_items == 0u) {
        return;
    }
    let xb = stage_x(tile.x_base, lid);
    for (var r = sg_id; r < p.rows_per_wg; r += n_sg) {
        let i = wg.x * p.rows_per_wg + r;
        if (i >= p.h) {
            break;
        }
        let acc = rows_dot(i, p.h, p.hc, xb, ITEMS, lane, sg_size);
        if (lane == 0u) {
            let wide = p.h * p.hc;
            for (var t = 0u; t < TILE; t++) {
                if (t < ITEMS) {
                    let item = tile.first_item + t;
                    var mix = 0.0;
                    for (var s = 0u; s < p.hc; s++) {
                        mix += sigmoid(comp(acc_row(acc, s), t)) * AUX[item * wide + s * p.h + i];
                    }
                    Y[item * p.y_stride + p.y_offset + i] = mix * (1.0 / f32(p.hc));
                }
            }
        }
    }
}

// y rows added into the wide residual Y (hc streams of h), stream s scaled by
// 2 sigmoid(AUX[item * hc + s] / hc).
@compute @workgroup_size(WG)
fn matvec_combine(@builtin(workgroup_id) wg: vec3<u32>,
                  @builtin(local_invocation_index) lid: u32,
                  @builtin(subgroup_id) sg_id: u32,
                  @builtin(num_subgroups) n_sg: u32,
                  @builtin(subgroup_invocation_id) lane: u32,
                  @builtin(subgroup_size) sg_size: u32) {
    prologue(lid);
    workgroupBarrier();
    let tile = tile_of(wg);
    if (tile.n_items == 0u) {
        return;
    }
    let xb = stage_x(tile.x_base, lid);
    for (var g0 = 0u; g0 < p.rows_per_wg; g0 += n_sg / KSPLIT) {
        let grp = group_at(wg.x, g0 + sg_id / KSPLIT);
        let acc = dense_rows(grp, xb, sg_id, lane, sg_size);
        let store = grp.live && sg_id % KSPLIT == 0u;
        let row0 = grp.row0;
        let n_rows = grp.n_rows;
        // Lane q adds the (vector, stream, row) triples q, q + S, ... (every lane holds the
        // reduced rows; the same arithmetic whichever lane runs it): each add reads and writes Y,
        // so on one lane they would run one memory latency after another.
        let wide = p.h * p.hc;
        let per_item = p.hc * ROWS;
        for (var q = lane; store && q < TILE * per_item; q += sg_size) {
            let t = q / per_item;
            let s = (q % per_item) / ROWS;
            let j = q % ROWS;
            if (t < ITEMS && j < n_rows) {
                let item = tile.first_item + t;
                let alpha = 2.0 * sigmoid(AUX[item * p.hc + s] * (1.0 / f32(p.hc)));
                let at = item * wide + s * p.h + p.row_base + row0 + j;
                Y[at] += alpha * comp(acc_row(acc, j), t);
            }
        }
    }
}

// matvec_moe_combine: the routed experts' outputs, their routing weights and the shared expert's
// gate logit per token.
@group(0) @binding(10) var<storage, read> ROUTED: array<f32>;
@group(0) @binding(11) var<storage, read> RWTS: array<f32>;
@group(0) @binding(12) var<storage, read> SGATE: array<f32>;

// The rows are the shared expert's down projection (row_base + row = value i of the MoE output):
// the lanes finish the MoE block as moe.wgsl's moe_combine_hc does, with the same arithmetic in
// the same order (routed slots in order, then the gated shared value), and adds it into the wide
// residual Y stream by stream.
@compute @workgroup_size(WG)
fn matvec_moe_combine(@builtin(workgroup_id) wg: vec3<u32>,
                      @builtin(local_invocation_index) lid: u32,
                      @builtin(subgroup_id) sg_id: u32,
                      @builtin(num_subgroups) n_sg: u32,
                      @builtin(subgroup_invocation_id) lane: u32,
                      @builtin(subgroup_size) sg_size: u32) {
    prologue(lid);
    workgroupBarrier();
    let tile = tile_of(wg);
    if (tile.n_items == 0u) {
        return;
    }
    let xb = stage_x(tile.x_base, lid);
    for (var g0 = 0u; g0 < p.rows_per_wg; g0 += n_sg / KSPLIT) {
        let grp = group_at(wg.x, g0 + sg_id / KSPLIT);
        let acc = dense_rows(grp, xb, sg_id, lane, sg_size);
        let store = grp.live && sg_id % KSPLIT == 0u;
        let row0 = grp.row0;
        let n_rows = grp.n_rows;
        // Every lane holds the reduced rows: lane q finishes the (row, vector) pairs q, q + S, ...
        // (the same arithmetic whichever lane does it), so a prefill tile's 16 pairs run side by
        // side rather than in series on one lane.
        let wide = p.h * p.hc;
        for (var q = lane; store && q < ROWS * TILE; q += sg_size) {
            let j = q / TILE;
            let t = q % TILE;
            if (j < n_rows && t < ITEMS) {
                let tok = tile.first_item + t;
                let gate = 1.0 / (1.0 + exp(-SGATE[tok]));
                let i = p.row_base + row0 + j;
                var m = 0.0;
                for (var slot = 0u; slot < p.slots; slot++) {
                    let item = tok * p.slots + slot;
                    m += RWTS[item] * ROUTED[item * p.h + i];
                }
                m += gate * comp(acc_row(acc, j), t);
                for (var s = 0u; s < p.hc; s++) {
                    let alpha = 2.0 * (1.0 / (1.0 + exp(-(AUX[tok * p.hc + s] * (1.0 / f32(p.hc))))));
                    Y[tok * wide + s * p.h + i] += alpha * m;
                }
            }
        }
    }
}

// Routed experts' down rows of one token (matvec_expert_combine), ROWS per slot: [slot * ROWS + j].
var<workgroup> SLOT_ROWS: array<f32, 256>;

// The routed experts' down projections finishing the MoE block (decode and short chunks, experts
// resident in one part): workgroup (row block of ROWS rows, token). Each subgroup computes the
// block's rows of the experts of slots sg_id, sg_id + n_sg, ... (rows_dot, each item's x = its
// SwiGLU output, x_per_item), then invocation j < ROWS finishes row j exactly as
// matvec_moe_combine does: the slots' weighted rows in slot order, then the gated shared expert's
// row, here read from ROUTED (the shared down rows of each token, computed beforehand by a plain
// mat-vec with the same row body, so the same bits), added into every stream of Y.
@compute @workgroup_size(WG)
fn matvec_expert_combine(@builtin(workgroup_id) wg: vec3<u32>,
                         @builtin(local_invocation_index) lid: u32,
                         @builtin(subgroup_id) sg_id: u32,
                         @builtin(num_subgroups) n_sg: u32,
                         @builtin(subgroup_invocation_id) lane: u32,
                         @builtin(subgroup_size) sg_size: u32) {
    prologue(lid);
    let tok = wg.y + wg.z * 65535u;
    let row0 = wg.x * ROWS;
    let live = tok * p.slots < p.items && row0 < p.rows;
    // The first slot's expert is read while the prologue's loads are in flight.
    var first_id = 0u;
    if (live && sg_id < p.slots) {
        first_id = IDS[tok * p.slots + sg_id];
    }
    workgroupBarrier();
    if (!live) {
        return;
    }
    let n_rows = min(ROWS, p.rows - row0);
    XS = vec4<u32>(0u);
    stage_slots(tok, lid);
    for (var s = sg_id; s < p.slots; s += n_sg) {
        let item = tok * p.slots + s;
        var id = first_id;
        if (s != sg_id) {
            id = IDS[item];
        }
        let unit = min(id - p.expert_first, p.expert_count - 1u);
        let acc = rows_dot(unit * p.rows + row0, 1u, n_rows, slot_x(item_x(item), s), 1u, lane, sg_size);
        if (lane == 0u) {
            for (var j = 0u; j < ROWS; j++) {
                SLOT_ROWS[s * ROWS + j] = acc_row(acc, j).x;
            }
        }
    }
    workgroupBarrier();
    // Invocation q finishes row q % n_rows into stream q / n_rows (each row's sum computed alike
    // by each of its streams' invocations: the same bits), so the streams' read-modify-writes of
    // Y run side by side.
    let wide = p.h * p.hc;
    for (var q = lid; q < n_rows * p.hc; q += WG) {
        let r = q % n_rows;
        let s = q / n_rows;
        let i = row0 + r;
        let gate = 1.0 / (1.0 + exp(-SGATE[tok]));
        var m = 0.0;
        for (var slot = 0u; slot < p.slots; slot++) {
            m += RWTS[tok * p.slots + slot] * SLOT_ROWS[slot * ROWS + r];
        }
        m += gate * ROUTED[tok * p.h + i];
        let alpha = 2.0 * (1.0 / (1.0 + exp(-(AUX[tok * p.hc + s] * (1.0 / f32(p.hc))))));
        Y[tok * wide + s * p.h + i] += alpha * m;
    }
}

// The item of an expert-mode workgroup (grid y, then z beyond 65535) and the first row of its
// expert in this part; not live past the items or when the expert is stored in another part.
struct ExpertItem {
    item: u32,
    first_row: u32,
    live: bool,
}

fn expert_item(wg: vec3<u32>) -> ExpertItem {
    let item = wg.y + wg.z * 65535u;
    if (item >= p.items) {
        return ExpertItem(item, 0u, false);
    }
    let expert = IDS[item];
    let live = expert >= p.expert_first && expert < p.expert_first + p.expert_count;
    return ExpertItem(item, (expert - p.expert_first) * p.rows, live);
}

@compute @workgroup_size(WG)
fn matvec_expert(@builtin(workgroup_id) wg: vec3<u32>,
                 @builtin(local_invocation_index) lid: u32,
                 @builtin(subgroup_id) sg_id: u32,
                 @builtin(num_subgroups) n_sg: u32,
                 @builtin(subgroup_invocation_id) lane: u32,
                 @builtin(subgroup_size) sg_size: u32) {
    prologue(lid);
    // The item's expert is read while the prologue's loads are in flight.
    let it = expert_item(wg);
    workgroupBarrier();
    if (!it.live) {
        return;
    }
    let item = it.item;
    let x_base = stage_x(item_x(item), lid);
    XS = vec4<u32>(0u);
    let first_row = it.first_row;
    for (var r = sg_id * ROWS; r < p.rows_per_wg * ROWS; r += n_sg * ROWS) {
        let row = wg.x * p.rows_per_wg * ROWS + r;
        if (row >= p.rows) {
            break;
        }
        let n_rows = min(ROWS, p.rows - row);
        let acc = rows_dot(first_row + row, 1u, n_rows, x_base, 1u, lane, sg_size);
        if (lane == 0u) {
            for (var j = 0u; j < ROWS; j++) {
                if (j < n_rows) {
                    Y[item * p.y_stride + p.y_offset + row + j] = acc_row(acc, j).x;
                }
            }
        }
    }
}

// matvec_expert for a fused gate|up weight (rows 0 .. h gate, h .. 2h up, per expert; p.h = h):
// each subgroup computes ROWS / 2 pairs of gate row j and up row j together (PAIRED rows, row step
// h) and stores silu(gate) * up at row j of the item's output, as xform_in_place's SwiGLU writes over the gate
// half (the same silu4 arithmetic per component), so the down projection reads it plainly.
@compute @workgroup_size(WG)
fn matvec_expert_glu(@builtin(workgroup_id) wg: vec3<u32>,
                     @builtin(local_invocation_index) lid: u32,
                     @builtin(subgroup_id) sg_id: u32,
                     @builtin(num_subgroups) n_sg: u32,
                     @builtin(subgroup_invocation_id) lane: u32,
                     @builtin(subgroup_size) sg_size: u32) {
    prologue(lid);
    // The item's expert is read while the prologue's loads are in flight.
    let it = expert_item(wg);
    workgroupBarrier();
    if (!it.live) {
        return;
    }
    let item = it.item;
    let x_base = stage_x(item_x(item), lid);
    XS = vec4<u32>(0u);
    let first_row = it.first_row;
    let pairs = ROWS / 2u;
    for (var r = sg_id * pairs; r < p.rows_per_wg * pairs; r += n_sg * pairs) {
        let j = wg.x * p.rows_per_wg * pairs + r;
        if (j >= p.h) {
            break;
        }
        let n_pairs = min(pairs, p.h - j);
        let acc = rows_dot(first_row + j, p.h, 2u * n_pairs, x_base, 1u, lane, sg_size);
        if (lane == 0u) {
            let y = item * p.y_stride + p.y_offset + j;
            Y[y] = (silu4(vec4<f32>(acc.r0.x)) * vec4<f32>(acc.r1.x)).x;
            if (n_pairs > 1u) {
                Y[y + 1u] = (silu4(vec4<f32>(acc.r2.x)) * vec4<f32>(acc.r3.x)).x;
            }
        }
    }
}

// IDOT_LOCAL (quant/rows_idot.wgsl): the workgroup's vector at x offset `xb` split into its
// XQL, and the offset its rows then read from; `xb` itself otherwise. Called in uniform control
// flow (it holds a barrier).
fn stage_x(xb: u32, lid: u32) -> u32 {
    if (IDOT_LOCAL) {
        xq_stage(xb, 0u, lid);
        workgroupBarrier();
        return 0u;
    }
    return xb;
}

// stage_x for the expert combine: the token's slots' vectors, slot s's digits from
// slot_x(_, s).
fn stage_slots(tok: u32, lid: u32) {
    if (IDOT_LOCAL) {
        for (var s = 0u; s < p.slots; s++) {
            xq_stage(item_x(tok * p.slots + s), slot_x(0u, s), lid);
        }
        workgroupBarrier();
    }
}

// The x vector of expert item `item`.
fn item_x(item: u32) -> u32 {
    var x_index = item;
    if (p.x_per_item == 0u) {
        x_index = item / p.slots;
    }
    return p.x_offset + x_index * p.x_stride;
}

// Prefill with the items grouped by expert (moe.wgsl's moe_group: IDS[e] items for expert e, in
// ascending order from IDS[group_base + e * group_cap]). Workgroup (x: row block, y: expert of
// this part); each subgroup runs its rows over the expert's items in tiles of ITEMS, the last tile
// padded by repeating its last item (computed, never stored). Each (item, row) is the same
// rows_dot arithmetic as matvec_expert's, so grouping never changes a bit.
@compute @workgroup_size(WG)
fn matvec_group(@builtin(workgroup_id) wg: vec3<u32>,
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
    for (var r = sg_id * ROWS; r < p.rows_per_wg * ROWS; r += n_sg * ROWS) {
        let row = wg.x * p.rows_per_wg * ROWS + r;
        if (row >= p.rows) {
            break;
        }
        let n_rows = min(ROWS, p.rows - row);
        for (var j = 0u; j < count; j += ITEMS) {
            let last = count - 1u;
            let items = vec4<u32>(IDS[list + j], IDS[list + min(j + 1u, last)],
                                  IDS[list + min(j + 2u, last)], IDS[list + min(j + 3u, last)]);
            let xb = vec4<u32>(item_x(items.x), item_x(items.y), item_x(items.z), item_x(items.w));
            XS = xb - vec4<u32>(xb.x);
            let acc = rows_dot(first_row + row, 1u, n_rows, xb.x, ITEMS, lane, sg_size);
            if (lane == 0u) {
                for (var jr = 0u; jr < ROWS; jr++) {
                    for (var i = 0u; i < TILE; i++) {
                        if (jr < n_rows && i < ITEMS && j + i < count) {
                            let item = comp_u(items, i);
                            Y[item * p.y_stride + p.y_offset + row + jr] = comp(acc_row(acc, jr), i);
                        }
                    }
                }
            }
        }
    }
}

fn comp_u(v: vec4<u32>, i: u32) -> u32 {
    return select(select(v.x, v.y, i == 1u), select(v.z, v.w, i == 3u), i >= 2u);
}

// The x transform applied once, in place, to `items` vectors of `k` values (k / 4 vec4 each) from
// x_offset, x_stride apart (a SwiGLU writes its result over the gate half). Prefill runs it before
// a plain mat-vec instead of transforming every x load of every row group; xform4 is the same
// arithmetic either way, so the mat-vec sees the same bits.
@group(0) @binding(9) var<storage, read_write> XW: array<vec4<f32>>;

@compute @workgroup_size(64)
fn xform_in_place(@builtin(global_invocation_id) gid: vec3<u32>,
                  @builtin(workgroup_id) wg: vec3<u32>) {
    let i = gid.x;
    let item = wg.y + wg.z * 65535u;
    if (i >= (p.k >> 2u) || item >= p.items) {
        return;
    }
    let at = ((p.x_offset + item * p.x_stride) >> 2u) + i;
    var u = vec4<f32>(0.0);
    if (X_MODE == 1u) {
        u = XW[at + (p.x_half >> 2u)];
    }
    XW[at] = xform4(XW[at], u);
}
