// Indexed sparse attention (model-spec 2.7).
//   rope:       partial NeoX rotation of `heads` vectors per row, angles from a host table
//               (cos, sin per position and pair; GPU sin/cos of large angles is not accurate).
//   qsa_score:  per (block, group of 16 query tokens): the complete blocks' scores, where a token
//               has more blocks than the budget (the group's keys staged once in workgroup memory);
//   qsa_select: per query token: keep the top `budget` of those scores (lowest block id wins
//               ties; a radix select, see select_top), written ascending; with nb <= budget every
//               block is kept.
//   qsa_attend: per (head, key chunk, token): partial softmax over one chunk of allowed keys;
//   qsa_merge:  per (head, token): the chunks merged in order, times the sigmoid output gate.
//   kv_pack:    `--kv f16`: a chunk's keys or values (f32, normed and rotated) rounded into the
//               f16 cache, two per word in a flat array over the tokens (KV_MODE 1 reads them);
//   kv_pack_q8: `--kv q8_0`: the same in blocks of 32 as ggml's q8_0 (KV_MODE 2).
//   kv_store:   a batch member's keys, values and raw index keys (f32) from its columns of the
//               batch's stage buffers into its caches at its positions (bits moved).
// The chunk's tokens are columns first .. first + tokens of the buffers that hold a row per
// token (the queries, index queries and the attention output; a batch member starts past column
// 0); the scores, selections and partials are the sequence's own, from row 0.

struct Params {
    tokens: u32,
    pos0: u32,
    heads: u32,
    head_stride: u32,
    row_stride: u32,
    off: u32,
    half: u32,
    pos_step: u32,
    n_kv: u32,
    hd: u32,
    ratio: u32,
    budget: u32,
    idim: u32,
    max_blocks: u32,
    dense: u32,
    scale: f32,
    // The chunk buffers' column of the first token (kv_pack, kv_pack_q8: the stage's first
    // value).
    first: u32,
}

var<immediate> p: Params;

@group(0) @binding(0) var<storage, read_write> Y: array<f32>;
@group(0) @binding(1) var<storage, read> ROPE: array<f32>;

@compute @workgroup_size(64)
fn rope(@builtin(global_invocation_id) id: vec3<u32>) {
    let i = id.x;
    let h = id.y;
    let t = id.z;
    if (i >= p.half || h >= p.heads || t >= p.tokens) {
        return;
    }
    let pos = p.pos0 + t * p.pos_step;
    let c = ROPE[(pos * p.half + i) * 2u];
    let s = ROPE[(pos * p.half + i) * 2u + 1u];
    let base = p.off + t * p.row_stride + h * p.head_stride;
    let a = Y[base + i];
    let b = Y[base + p.half + i];
    Y[base + i] = a * c - b * s;
    Y[base + p.half + i] = b * c + a * s;
}

@group(0) @binding(2) var<storage, read> IQ: array<f32>;       // [T, heads*idim] normed, rotated
@group(0) @binding(3) var<storage, read> BK: array<f32>;       // [blocks, idim] block keys
@group(0) @binding(4) var<storage, read_write> SC: array<f32>; // [T, 2*max_blocks]: scores (half used)
@group(0) @binding(5) var<storage, read_write> SEL: array<u32>; // [T, budget + 1]: count, ids

const WG: u32 = 64u;

// Tokens per qsa_score workgroup: each staged block key serves all of them.
const SCORE_TOKENS: u32 = 16u;
// Largest indexer head dim whose keys are staged in workgroup memory (wider ones are read from
// the buffer: the same arithmetic, only slower). A key takes idim + 1 floats there, so that the
// lanes, each reading its own key at the same dim, hit distinct banks.
const SCORE_MAX_DIM: u32 = 128u;
var<workgroup> KEYS: array<f32, 8256>; // WG * (SCORE_MAX_DIM + 1)

// Dim i of the key of this invocation's block (staged at `at`, or block b's row of BK).
fn staged_key(staged: bool, at: u32, b: u32, i: u32) -> f32 {
    if (staged) {
        return KEYS[at + i];
    }
    return BK[b * p.idim + i];
}

// The scores of block b for tokens t0 .. t0 + 3 (indices past the chunk read its last token):
// for each, the sum over the indexer heads (in order) of max(q_h . k_b, 0), times the scale, each
// dot a chain of fma over the dims in order. The same arithmetic for every token and block,
// whichever tile, slot or chunk computes it: prefill and decode give the same bits.
fn block_scores4(t0: u32, b: u32, staged: bool, at: u32) -> vec4<f32> {
    let last = p.tokens - 1u;
    let row = p.heads * p.idim;
    let q = (vec4<u32>(p.first) + min(vec4<u32>(t0) + vec4<u32>(0u, 1u, 2u, 3u), vec4<u32>(last)))
        * row;
    var total = vec4<f32>(0.0);
    for (var h = 0u; h < p.heads; h++) {
        let qh = q + vec4<u32>(h * p.idim);
        var d = vec4<f32>(0.0);
        for (var i = 0u; i < p.idim; i++) {
            let k = staged_key(staged, at, b, i);
            d = vec4<f32>(fma(IQ[qh.x + i], k, d.x), fma(IQ[qh.y + i], k, d.y),
                          fma(IQ[qh.z + i], k, d.z), fma(IQ[qh.w + i], k, d.w));
        }
        total += max(d, vec4<f32>(0.0));
    }
    return total * p.scale;
}

// Grid (block groups of WG, token groups of SCORE_TOKENS): the scores of every block of the
// tokens that have more blocks than the budget, one invocation per block, into SC for
// qsa_select. The group's block keys are staged once (coalesced) and serve every token of the
// group; a decode step at depth 32K scores 8,192 blocks over 128 workgroups.
@compute @workgroup_size(WG)
fn qsa_score(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let t0 = wg.y * SCORE_TOKENS;
    let t_end = min(t0 + SCORE_TOKENS, p.tokens);
    let b0 = wg.x * WG;
    // Blocks of the group's last token: the most any of its tokens has (uniform).
    let most = (p.pos0 + t_end) / p.ratio;
    if (t0 >= p.tokens || most <= p.budget || b0 >= most) {
        return;
    }
    let staged = p.idim <= SCORE_MAX_DIM;
    let stride = p.idim + 1u;
    if (staged) {
        let n = min(WG, most - b0) * p.idim;
        for (var j = lid.x; j < n; j += WG) {
            KEYS[(j / p.idim) * stride + j % p.idim] = BK[b0 * p.idim + j];
        }
    }
    workgroupBarrier();
    let b = b0 + lid.x;
    let at = lid.x * stride;
    for (var g = t0; g < t_end; g += 4u) {
        let s = block_scores4(g, b, staged, at);
        for (var j = 0u; j < 4u; j++) {
            let t = g + j;
            let nb = (p.pos0 + t + 1u) / p.ratio;
            if (t < t_end && nb > p.budget && b < nb) {
                SC[t * 2u * p.max_blocks + b] = s[j];
            }
        }
    }
}

// One workgroup per token: its selected blocks from the scores qsa_score left in SC (all of its
// blocks when they are within the budget). SEL_WG invocations: a decode step has one token, so
// one workgroup does all of its selection (65,536 blocks at 262K tokens).
const SEL_WG: u32 = 256u;

@compute @workgroup_size(SEL_WG)
fn qsa_select(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
              @builtin(subgroup_invocation_id) lane: u32, @builtin(subgroup_size) sg_size: u32,
              @builtin(subgroup_id) sg_id: u32, @builtin(num_subgroups) n_sg: u32) {
    let t = wg.x;
    let pos = p.pos0 + t;
    let nb = (pos + 1u) / p.ratio;
    let sel = t * (p.budget + 1u);
    let sc = t * 2u * p.max_blocks;
    if (nb <= p.budget) {
        if (lid.x == 0u) {
            SEL[sel] = nb;
        }
        for (var b = lid.x; b < nb; b += SEL_WG) {
            SEL[sel + 1u + b] = b;
        }
        return;
    }
    select_top(sc, sel, nb, SelLane(lid.x, lane, sg_size, sg_id, n_sg));
}

// The budget blocks of highest score (lowest id first among equal scores), ascending, into
// SEL[sel + 1 ..], their count into SEL[sel]: block b is kept when fewer than `budget` blocks
// beat it (a higher score, or the same score and a lower id). Found in O(nb) per pass rather than
// by ranking every pair: a radix select of the budget-th largest score over its order-preserving
// 32-bit key (4 passes of 8 bits, integer counts), then the blocks above it and the first of the
// blocks equal to it, in id order (prefix sums over the invocations' contiguous ranges). Integer
// work only on the scores: the same choice as the pairwise rule, whatever the timing, the
// workgroup size or the subgroup size.
var<workgroup> HIST: array<atomic<u32>, 256>;
var<workgroup> PICK: array<u32, 2>;
// Per-subgroup totals of a scan (at least 4 lanes per subgroup).
var<workgroup> SG_TOTALS: array<u32, 64>;

struct SelLane {
    lid: u32,
    lane: u32,
    sg_size: u32,
    sg_id: u32,
    n_sg: u32,
}

// A key that orders as the float does (-0 and +0 equal).
fn order_key(v: f32) -> u32 {
    var k = bitcast<u32>(v);
    if (v == 0.0) {
        k = 0u;
    }
    if ((k & 0x80000000u) != 0u) {
        return ~k;
    }
    return k | 0x80000000u;
}

// (exclusive prefix sum of `mine` over the invocations in order, total): subgroup scans, then the
// subgroups' totals in subgroup order. Integer sums, so exact. Called by every invocation (it
// holds barriers).
fn scan_before(l: SelLane, mine: u32) -> vec2<u32> {
    let incl = subgroupInclusiveAdd(mine);
    if (l.lane == l.sg_size - 1u) {
        SG_TOTALS[l.sg_id] = incl;
    }
    workgroupBarrier();
    var before = 0u;
    var total = 0u;
    for (var g = 0u; g < l.n_sg; g++) {
        let c = SG_TOTALS[g];
        if (g < l.sg_id) {
            before += c;
        }
        total += c;
    }
    workgroupBarrier();
    return vec2<u32>(before + incl - mine, total);
}

// Count the keys of blocks lid, lid + SEL_WG, ... whose bits above `shift + 8` equal `prefix`
// (all of them in round 0) into HIST by their next 8 bits. A subgroup whose live lanes all fall
// in one bin adds once (the top bits of the scores are mostly equal, and per-lane atomics on one
// bin serialise).
fn histogram(sc: u32, nb: u32, l: SelLane, shift: u32, prefix: u32, first_round: bool) {
    for (var base = 0u; base < nb; base += SEL_WG) {
        let b = base + l.lid;
        var bin = 256u;
        if (b < nb) {
            let k = order_key(SC[sc + b]);
            let high = select(k >> (shift + 8u), 0u, first_round);
            if (high == prefix) {
                bin = (k >> shift) & 0xffu;
            }
        }
        // Every lane is live here (the loop and the returns before it are uniform).
        let lead = subgroupBroadcastFirst(bin);
        if (subgroupAll(bin == lead)) {
            let n = subgroupAdd(1u);
            if (l.lane == 0u && lead < 256u) {
                atomicAdd(&HIST[lead], n);
            }
        } else if (bin < 256u) {
            atomicAdd(&HIST[bin], 1u);
        }
    }
}

fn select_top(sc: u32, sel: u32, nb: u32, l: SelLane) {
    // The budget-th largest key, 8 bits at a time from the top; `need`: how many of the blocks
    // equal to the bits fixed so far are still to be taken.
    var prefix = 0u;
    var need = p.budget;
    for (var round = 0u; round < 4u; round++) {
        let shift = 24u - 8u * round;
        atomicStore(&HIST[l.lid], 0u);
        workgroupBarrier();
        histogram(sc, nb, l, shift, prefix, round == 0u);
        workgroupBarrier();
        // Invocation i holds bin 255 - i: the keys above its bin are the scan before it. The bin
        // where the count reaches `need` is the digit (bin 0 when the counts never reach it).
        let d = 255u - l.lid;
        let c = atomicLoad(&HIST[d]);
        let above = scan_before(l, c);
        let reached = above.x + c >= need;
        if ((above.x < need && reached) || (d == 0u && above.y < need)) {
            PICK[0] = d;
            PICK[1] = need - above.x;
        }
        workgroupBarrier();
        prefix = (prefix << 8u) | PICK[0];
        need = PICK[1];
        workgroupBarrier();
    }
    // Blocks above the threshold key, and the first `need` equal to it, in id order: each
    // invocation takes a contiguous range of ids.
    let per = (nb + SEL_WG - 1u) / SEL_WG;
    let first = min(nb, l.lid * per);
    let end = min(nb, first + per);
    var ties = 0u;
    for (var b = first; b < end; b++) {
        ties += u32(order_key(SC[sc + b]) == prefix);
    }
    let ties_before = scan_before(l, ties).x;
    var tie = ties_before;
    var taken = 0u;
    for (var b = first; b < end; b++) {
        let k = order_key(SC[sc + b]);
        if (k > prefix || (k == prefix && tie < need)) {
            taken++;
        }
        tie += u32(k == prefix);
    }
    let place = scan_before(l, taken);
    tie = ties_before;
    var n = place.x;
    for (var b = first; b < end; b++) {
        let k = order_key(SC[sc + b]);
        if (k > prefix || (k == prefix && tie < need)) {
            SEL[sel + 1u + n] = b;
            n++;
        }
        tie += u32(k == prefix);
    }
    if (l.lid == 0u) {
        SEL[sel] = place.y;
    }
}

@group(0) @binding(6) var<storage, read> Q: array<f32>;   // [T, heads * 2 * hd] (query, gate per head)
// The caches, [ctx, n_kv * hd] as a flat array of values, by KV_MODE: 0 f32 values as their
// bits; 1 two f16 per word; 2 q8_0, 9 words per 32 values (8 of signed bytes, value j in byte
// j % 4 of word j / 4, then the f16 scale).
@group(0) @binding(7) var<storage, read> KC: array<u32>;
@group(0) @binding(8) var<storage, read> VC: array<u32>;
override KV_MODE: u32 = 0u;
// Query heads per workgroup of qsa_attend_group (below; declared here, before any array sized by
// an override expression, for naga 30's override processing).
override GROUP: u32 = 1u;

fn q8_at(word: u32, scale: u32, i: u32) -> f32 {
    let q = bitcast<i32>(word << (24u - 8u * (i & 3u))) >> 24u;
    return f32(q) * unpack2x16float(scale).x;
}

fn key_at(i: u32) -> f32 {
    switch KV_MODE {
        case 1u: {
            return unpack2x16float(KC[i >> 1u])[i & 1u];
        }
        case 2u: {
            let b = (i >> 5u) * 9u;
            return q8_at(KC[b + ((i & 31u) >> 2u)], KC[b + 8u], i);
        }
        default: {
            return bitcast<f32>(KC[i]);
        }
    }
}

fn value_at(i: u32) -> f32 {
    switch KV_MODE {
        case 1u: {
            return unpack2x16float(VC[i >> 1u])[i & 1u];
        }
        case 2u: {
            let b = (i >> 5u) * 9u;
            return q8_at(VC[b + ((i & 31u) >> 2u)], VC[b + 8u], i);
        }
        default: {
            return bitcast<f32>(VC[i]);
        }
    }
}

fn q4(at: u32) -> vec4<f32> {
    return vec4<f32>(Q[at], Q[at + 1u], Q[at + 2u], Q[at + 3u]);
}

fn kc4(at: u32) -> vec4<f32> {
    return vec4<f32>(key_at(at), key_at(at + 1u), key_at(at + 2u), key_at(at + 3u));
}
@group(0) @binding(9) var<storage, read> SELR: array<u32>;
@group(0) @binding(10) var<storage, read_write> OUT: array<f32>; // [T, heads * hd]
// Per (token, head, key chunk): max, sum of exps, then hd weighted value sums (see qsa_attend).
@group(0) @binding(11) var<storage, read_write> PART: array<f32>;

// Attention is split over chunks of ATT_CHUNK allowed keys (chunk c holds keys
// c*ATT_CHUNK .. in ascending position order), one workgroup each, then merged in chunk order.
// Chunks depend only on the key index, never on how many queries a dispatch holds, so prefill and
// decode compute every query with the same arithmetic:
//   part:  s_j = (q . k_j) * scale (four fma chains over dims i mod 4, then (0+1)+(2+3));
//          m = max s_j (exact in any order); e_j = exp(s_j - m); l = fixed-shape tree sum of e_j;
//          acc_i = sum_j e_j v_j,i (four chains over keys j mod 4, then (0+1)+(2+3))
//   merge: M = max m_c; L = sum_c l_c exp(m_c - M) in chunk order;
//          out_i = (sum_c acc_c,i exp(m_c - M)) / L * sigmoid(gate_i), in chunk order
const ATT_CHUNK: u32 = 256u;
const ATT_WG: u32 = 256u;
var<workgroup> wts: array<f32, ATT_CHUNK>;
var<workgroup> kpos: array<u32, ATT_CHUNK>;
var<workgroup> att_red: array<f32, ATT_WG>;
// Key tiles of qsa_attend: KT_DIMS dims of each of the chunk's keys, rows padded to KT_STRIDE
// vec4 so that neighbouring invocations' rows start in different banks.
// KT_DIMS is 16 or 32 (the launcher's choice from the workgroup memory the device has: 32 needs
// 37 KiB): the dot products take the dims in the same order whatever the tile, so the same bits;
// larger tiles take half the rounds of loads and barriers.
override KT_DIMS: u32 = 16u;
override KT_STRIDE: u32 = KT_DIMS / 4u + 1u;
var<workgroup> KT: array<vec4<f32>, ATT_CHUNK * KT_STRIDE>;

fn key_position(t: u32, j: u32, pos: u32) -> u32 {
    if (p.dense != 0u) {
        return j;
    }
    let sel = t * (p.budget + 1u);
    let count = SELR[sel];
    let nb = (pos + 1u) / p.ratio;
    if (j < count * p.ratio) {
        return SELR[sel + 1u + j / p.ratio] * p.ratio + j % p.ratio;
    }
    return nb * p.ratio + (j - count * p.ratio);
}

fn allowed_keys(t: u32, pos: u32) -> u32 {
    if (p.dense != 0u) {
        return pos + 1u;
    }
    let nb = (pos + 1u) / p.ratio;
    return SELR[t * (p.budget + 1u)] * p.ratio + (pos + 1u - nb * p.ratio);
}

// Tree reduction of att_red over ATT_WG (a fixed shape: the same bits every time).
fn tree_max(v: f32, lid: u32) -> f32 {
    att_red[lid] = v;
    workgroupBarrier();
    for (var st = ATT_WG / 2u; st > 0u; st >>= 1u) {
        if (lid < st) {
            att_red[lid] = max(att_red[lid], att_red[lid + st]);
        }
        workgroupBarrier();
    }
    let r = att_red[0];
    workgroupBarrier();
    return r;
}

fn tree_sum(v: f32, lid: u32) -> f32 {
    att_red[lid] = v;
    workgroupBarrier();
    for (var st = ATT_WG / 2u; st > 0u; st >>= 1u) {
        if (lid < st) {
            att_red[lid] = att_red[lid] + att_red[lid + st];
        }
        workgroupBarrier();
    }
    let r = att_red[0];
    workgroupBarrier();
    return r;
}

// Grid (heads, chunks, tokens). p.max_blocks = chunks per (token, head) in PART.
@compute @workgroup_size(ATT_WG)
fn qsa_attend(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let h = wg.x;
    let c = wg.y;
    let t = wg.z;
    let pos = p.pos0 + t;
    let n_keys = allowed_keys(t, pos);
    let j0 = c * ATT_CHUNK;
    if (j0 >= n_keys) {
        return;
    }
    let nk = min(ATT_CHUNK, n_keys - j0);
    let kvh = h / (p.heads / p.n_kv);
    let kv_width = p.n_kv * p.hd;
    let q0 = (p.first + t) * p.heads * 2u * p.hd + h * 2u * p.hd;
    if (lid.x < nk) {
        kpos[lid.x] = key_position(t, j0 + lid.x, pos);
    }
    workgroupBarrier();
    // Scores: invocation j dots its key with the query as four fma chains over dims i, i+1, i+2,
    // i+3 (in dim order), summed in a fixed order. The keys come through workgroup memory in
    // tiles of KT_DIMS dims, each key's dims loaded by neighbouring invocations (whole cache
    // lines) rather than one key row per invocation.
    let kbase = kvh * p.hd;
    let hd4 = p.hd & ~3u;
    var d = vec4<f32>(0.0);
    for (var i0 = 0u; i0 < hd4; i0 += KT_DIMS) {
        let quads = min(KT_DIMS, hd4 - i0) / 4u;
        for (var r = 0u; r < KT_DIMS / 4u; r++) {
            let slot = r * ATT_WG + lid.x;
            let key = slot / (KT_DIMS / 4u);
            let quad = slot % (KT_DIMS / 4u);
            var v = vec4<f32>(0.0);
            if (key < nk && quad < quads) {
                v = kc4(kpos[key] * kv_width + kbase + i0 + 4u * quad);
            }
            KT[key * KT_STRIDE + quad] = v;
        }
        workgroupBarrier();
        if (lid.x < nk) {
            for (var q = 0u; q < quads; q++) {
                d = fma(q4(q0 + i0 + 4u * q), KT[lid.x * KT_STRIDE + q], d);
            }
        }
        workgroupBarrier();
    }
    var s = -3.0e38;
    if (lid.x < nk) {
        let k0 = kpos[lid.x] * kv_width + kbase;
        for (var i = hd4; i < p.hd; i++) {
            d.x = fma(Q[q0 + i], key_at(k0 + i), d.x);
        }
        s = ((d.x + d.y) + (d.z + d.w)) * p.scale;
    }
    let m = tree_max(s, lid.x);
    var e = 0.0;
    if (lid.x < nk) {
        e = exp(s - m);
        wts[lid.x] = e;
    }
    let l = tree_sum(e, lid.x);
    let out = ((t * p.heads + h) * p.max_blocks + c) * (p.hd + 2u);
    if (lid.x == 0u) {
        PART[out] = m;
        PART[out + 1u] = l;
    }
    for (var i = lid.x; i < p.hd; i += ATT_WG) {
        // Keys j, j+1, j+2, j+3 into four chains, summed in a fixed order.
        var acc = vec4<f32>(0.0);
        let v0 = kvh * p.hd + i;
        let nk4 = nk & ~3u;
        var j = 0u;
        // As above: sixteen (then eight, four) steps' loads first, then the fmas in step order.
        for (; j + 64u <= nk4; j += 64u) {
            let u0 = vals4(j, kv_width, v0);
            let u1 = vals4(j + 4u, kv_width, v0);
            let u2 = vals4(j + 8u, kv_width, v0);
            let u3 = vals4(j + 12u, kv_width, v0);
            let u4 = vals4(j + 16u, kv_width, v0);
            let u5 = vals4(j + 20u, kv_width, v0);
            let u6 = vals4(j + 24u, kv_width, v0);
            let u7 = vals4(j + 28u, kv_width, v0);
            let u8 = vals4(j + 32u, kv_width, v0);
            let u9 = vals4(j + 36u, kv_width, v0);
            let u10 = vals4(j + 40u, kv_width, v0);
            let u11 = vals4(j + 44u, kv_width, v0);
            let u12 = vals4(j + 48u, kv_width, v0);
            let u13 = vals4(j + 52u, kv_width, v0);
            let u14 = vals4(j + 56u, kv_width, v0);
            let u15 = vals4(j + 60u, kv_width, v0);
            acc = fma(wts4(j), u0, acc);
            acc = fma(wts4(j + 4u), u1, acc);
            acc = fma(wts4(j + 8u), u2, acc);
            acc = fma(wts4(j + 12u), u3, acc);
            acc = fma(wts4(j + 16u), u4, acc);
            acc = fma(wts4(j + 20u), u5, acc);
            acc = fma(wts4(j + 24u), u6, acc);
            acc = fma(wts4(j + 28u), u7, acc);
            acc = fma(wts4(j + 32u), u8, acc);
            acc = fma(wts4(j + 36u), u9, acc);
            acc = fma(wts4(j + 40u), u10, acc);
            acc = fma(wts4(j + 44u), u11, acc);
            acc = fma(wts4(j + 48u), u12, acc);
            acc = fma(wts4(j + 52u), u13, acc);
            acc = fma(wts4(j + 56u), u14, acc);
            acc = fma(wts4(j + 60u), u15, acc);
        }
        for (; j + 32u <= nk4; j += 32u) {
            let u0 = vals4(j, kv_width, v0);
            let u1 = vals4(j + 4u, kv_width, v0);
            let u2 = vals4(j + 8u, kv_width, v0);
            let u3 = vals4(j + 12u, kv_width, v0);
            let u4 = vals4(j + 16u, kv_width, v0);
            let u5 = vals4(j + 20u, kv_width, v0);
            let u6 = vals4(j + 24u, kv_width, v0);
            let u7 = vals4(j + 28u, kv_width, v0);
            acc = fma(wts4(j), u0, acc);
            acc = fma(wts4(j + 4u), u1, acc);
            acc = fma(wts4(j + 8u), u2, acc);
            acc = fma(wts4(j + 12u), u3, acc);
            acc = fma(wts4(j + 16u), u4, acc);
            acc = fma(wts4(j + 20u), u5, acc);
            acc = fma(wts4(j + 24u), u6, acc);
            acc = fma(wts4(j + 28u), u7, acc);
        }
        for (; j + 16u <= nk4; j += 16u) {
            let u0 = vals4(j, kv_width, v0);
            let u1 = vals4(j + 4u, kv_width, v0);
            let u2 = vals4(j + 8u, kv_width, v0);
            let u3 = vals4(j + 12u, kv_width, v0);
            acc = fma(wts4(j), u0, acc);
            acc = fma(wts4(j + 4u), u1, acc);
            acc = fma(wts4(j + 8u), u2, acc);
            acc = fma(wts4(j + 12u), u3, acc);
        }
        for (; j < nk4; j += 4u) {
            acc = fma(wts4(j), vals4(j, kv_width, v0), acc);
        }
        for (var j = nk4; j < nk; j++) {
            acc.x = fma(wts[j], value_at(kpos[j] * kv_width + v0), acc.x);
        }
        PART[out + 2u + i] = (acc.x + acc.y) + (acc.z + acc.w);
    }
}

// Values at offset v0 of keys j .. j + 3 of the chunk (rows kv_width apart), and their weights.
fn vals4(j: u32, kv_width: u32, v0: u32) -> vec4<f32> {
    return vec4<f32>(value_at(kpos[j] * kv_width + v0), value_at(kpos[j + 1u] * kv_width + v0),
                     value_at(kpos[j + 2u] * kv_width + v0), value_at(kpos[j + 3u] * kv_width + v0));
}

fn wts4(j: u32) -> vec4<f32> {
    return vec4<f32>(wts[j], wts[j + 1u], wts[j + 2u], wts[j + 3u]);
}

// qsa_attend_group: qsa_attend for GROUP query heads of one kv head per workgroup (the
// launcher's choice for prefill chunks, a divisor of the heads per kv head): each key tile and
// each value load serves all of them, while every head keeps qsa_attend's arithmetic (its own fma
// chains in the same order, its own fixed-shape trees), so the same bits. Decode steps take at
// most 4 heads per workgroup (the launcher's QSA_DECODE_GROUP: the heads spread over more
// workgroups); GROUP 1 is qsa_attend.
const MAX_GROUP: u32 = 16u;
// wts_g[g * ATT_CHUNK + j]: head g's weight of key j; att_red_g[g * ATT_WG + l]: head g's trees.
// (Arrays sized by override expressions come after every named override: naga 30 processes the
// overrides in declaration order and panics on an unnamed one before a named one.)
var<workgroup> wts_g: array<f32, ATT_CHUNK * GROUP>;
var<workgroup> att_red_g: array<f32, ATT_WG * GROUP>;

// One fixed-shape binary tree per head of the group over its att_red slots (pairs l, l + st for
// st = ATT_WG / 2, ..., 1: every head's tree has this shape whatever the group), max or sum,
// sharing the barriers. The values are stored before the call; results are left in slot 0.
fn group_trees(lid: u32, is_max: bool) {
    workgroupBarrier();
    for (var st = ATT_WG / 2u; st > 0u; st >>= 1u) {
        if (lid < st) {
            for (var g = 0u; g < GROUP; g++) {
                let a = att_red_g[g * ATT_WG + lid];
                let b = att_red_g[g * ATT_WG + lid + st];
                att_red_g[g * ATT_WG + lid] = select(a + b, max(a, b), is_max);
            }
        }
        workgroupBarrier();
    }
}

// Where head h0 + g's partials for chunk c of token t start in PART.
fn part_at(t: u32, h: u32, c: u32) -> u32 {
    return ((t * p.heads + h) * p.max_blocks + c) * (p.hd + 2u);
}

// Grid (heads / GROUP, chunks, tokens). p.max_blocks = chunks per (token, head) in PART.
@compute @workgroup_size(ATT_WG)
fn qsa_attend_group(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let h0 = wg.x * GROUP;
    let c = wg.y;
    let t = wg.z;
    let pos = p.pos0 + t;
    let n_keys = allowed_keys(t, pos);
    let j0 = c * ATT_CHUNK;
    if (j0 >= n_keys) {
        return;
    }
    let nk = min(ATT_CHUNK, n_keys - j0);
    let kvh = h0 / (p.heads / p.n_kv);
    let kv_width = p.n_kv * p.hd;
    // Head h0 + g's query starts at q0 + g * qg.
    let q0 = (p.first + t) * p.heads * 2u * p.hd + h0 * 2u * p.hd;
    let qg = 2u * p.hd;
    if (lid.x < nk) {
        kpos[lid.x] = key_position(t, j0 + lid.x, pos);
    }
    workgroupBarrier();
    // Scores: invocation j dots its key with each query as four fma chains over dims i, i+1, i+2,
    // i+3 (in dim order), summed in a fixed order. The keys come through workgroup memory in
    // tiles of KT_DIMS dims, each key's dims loaded by neighbouring invocations (whole cache
    // lines) rather than one key row per invocation.
    let kbase = kvh * p.hd;
    let hd4 = p.hd & ~3u;
    var d: array<vec4<f32>, MAX_GROUP>;
    for (var g = 0u; g < GROUP; g++) {
        d[g] = vec4<f32>(0.0);
    }
    for (var i0 = 0u; i0 < hd4; i0 += KT_DIMS) {
        let quads = min(KT_DIMS, hd4 - i0) / 4u;
        for (var r = 0u; r < KT_DIMS / 4u; r++) {
            let slot = r * ATT_WG + lid.x;
            let key = slot / (KT_DIMS / 4u);
            let quad = slot % (KT_DIMS / 4u);
            var v = vec4<f32>(0.0);
            if (key < nk && quad < quads) {
                v = kc4(kpos[key] * kv_width + kbase + i0 + 4u * quad);
            }
            KT[key * KT_STRIDE + quad] = v;
        }
        workgroupBarrier();
        if (lid.x < nk) {
            for (var q = 0u; q < quads; q++) {
                let k = KT[lid.x * KT_STRIDE + q];
                for (var g = 0u; g < GROUP; g++) {
                    d[g] = fma(q4(q0 + g * qg + i0 + 4u * q), k, d[g]);
                }
            }
        }
        workgroupBarrier();
    }
    var s: array<f32, MAX_GROUP>;
    for (var g = 0u; g < GROUP; g++) {
        var dg = d[g];
        var sg = -3.0e38;
        if (lid.x < nk) {
            let k0 = kpos[lid.x] * kv_width + kbase;
            for (var i = hd4; i < p.hd; i++) {
                dg.x = fma(Q[q0 + g * qg + i], key_at(k0 + i), dg.x);
            }
            sg = ((dg.x + dg.y) + (dg.z + dg.w)) * p.scale;
        }
        s[g] = sg;
        att_red_g[g * ATT_WG + lid.x] = sg;
    }
    group_trees(lid.x, true);
    var m: array<f32, MAX_GROUP>;
    for (var g = 0u; g < GROUP; g++) {
        m[g] = att_red_g[g * ATT_WG];
    }
    workgroupBarrier();
    for (var g = 0u; g < GROUP; g++) {
        var e = 0.0;
        if (lid.x < nk) {
            e = exp(s[g] - m[g]);
            wts_g[g * ATT_CHUNK + lid.x] = e;
        }
        att_red_g[g * ATT_WG + lid.x] = e;
    }
    group_trees(lid.x, false);
    if (lid.x == 0u) {
        for (var g = 0u; g < GROUP; g++) {
            let out = part_at(t, h0 + g, c);
            PART[out] = m[g];
            PART[out + 1u] = att_red_g[g * ATT_WG];
        }
    }
    for (var i = lid.x; i < p.hd; i += ATT_WG) {
        // Keys j, j+1, j+2, j+3 into four chains per head, summed in a fixed order.
        var acc: array<vec4<f32>, MAX_GROUP>;
        for (var g = 0u; g < GROUP; g++) {
            acc[g] = vec4<f32>(0.0);
        }
        let v0 = kvh * p.hd + i;
        let nk4 = nk & ~3u;
        var j = 0u;
        // Four steps' loads first, then each head's fmas in step order.
        for (; j + 16u <= nk4; j += 16u) {
            let u0 = vals4(j, kv_width, v0);
            let u1 = vals4(j + 4u, kv_width, v0);
            let u2 = vals4(j + 8u, kv_width, v0);
            let u3 = vals4(j + 12u, kv_width, v0);
            for (var g = 0u; g < GROUP; g++) {
                var a = acc[g];
                a = fma(wts4g(g, j), u0, a);
                a = fma(wts4g(g, j + 4u), u1, a);
                a = fma(wts4g(g, j + 8u), u2, a);
                a = fma(wts4g(g, j + 12u), u3, a);
                acc[g] = a;
            }
        }
        for (; j < nk4; j += 4u) {
            let u = vals4(j, kv_width, v0);
            for (var g = 0u; g < GROUP; g++) {
                acc[g] = fma(wts4g(g, j), u, acc[g]);
            }
        }
        for (var g = 0u; g < GROUP; g++) {
            var a = acc[g];
            for (var jt = nk4; jt < nk; jt++) {
                a.x = fma(wts_g[g * ATT_CHUNK + jt], value_at(kpos[jt] * kv_width + v0), a.x);
            }
            PART[part_at(t, h0 + g, c) + 2u + i] = (a.x + a.y) + (a.z + a.w);
        }
    }
}

// Head g's weights of keys j .. j + 3.
fn wts4g(g: u32, j: u32) -> vec4<f32> {
    let b = g * ATT_CHUNK + j;
    return vec4<f32>(wts_g[b], wts_g[b + 1u], wts_g[b + 2u], wts_g[b + 3u]);
}

// Grid (heads, tokens): merge the chunks of qsa_attend in chunk order, apply the output gate.
@compute @workgroup_size(ATT_WG)
fn qsa_merge(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let h = wg.x;
    let t = wg.y;
    let pos = p.pos0 + t;
    let chunks = (allowed_keys(t, pos) + ATT_CHUNK - 1u) / ATT_CHUNK;
    let base = (t * p.heads + h) * p.max_blocks * (p.hd + 2u);
    var mx = -3.0e38;
    for (var c = 0u; c < chunks; c++) {
        mx = max(mx, PART[base + c * (p.hd + 2u)]);
    }
    var total = 0.0;
    for (var c = 0u; c < chunks; c++) {
        let o = base + c * (p.hd + 2u);
        total = fma(PART[o + 1u], exp(PART[o] - mx), total);
    }
    let q0 = (p.first + t) * p.heads * 2u * p.hd + h * 2u * p.hd;
    for (var i = lid.x; i < p.hd; i += ATT_WG) {
        var acc = 0.0;
        for (var c = 0u; c < chunks; c++) {
            let o = base + c * (p.hd + 2u);
            acc = fma(PART[o + 2u + i], exp(PART[o] - mx), acc);
        }
        let gate = 1.0 / (1.0 + exp(-Q[q0 + p.hd + i]));
        OUT[(p.first + t) * p.heads * p.hd + h * p.hd + i] = acc / total * gate;
    }
}

// `--kv f16`: elements p.off .. p.off + p.row_stride of the flat f16 cache KVP from KVS (f32, in
// order from value p.first), one invocation per word: a word's half before p.off keeps its value
// (the token before the chunk), a half past the chunk is 0 until its token comes. Each value is
// rounded once, the same whatever the chunk.
@group(0) @binding(12) var<storage, read> KVS: array<f32>;
@group(0) @binding(13) var<storage, read_write> KVP: array<u32>;

@compute @workgroup_size(64)
fn kv_pack(@builtin(global_invocation_id) id: vec3<u32>) {
    let first = p.off;
    let end = p.off + p.row_stride;
    let w = first / 2u + id.x;
    if (2u * w >= end) {
        return;
    }
    let old = unpack2x16float(KVP[w]);
    var v = vec2<f32>(0.0);
    if (2u * w < first) {
        v.x = old.x;
    } else {
        v.x = KVS[p.first + 2u * w - first];
    }
    if (2u * w + 1u < end) {
        v.y = KVS[p.first + 2u * w + 1u - first];
    }
    KVP[w] = pack2x16float(v);
}

// `--kv q8_0`: blocks p.off / 32 .. of the cache from KVS (p.row_stride values from value p.first,
// whole blocks), one
// invocation per block: d = amax / 127, the values times 1 / d rounded to integers (ties to
// even), d stored as f16; the arithmetic of the CPU reference's KvType::store_row.
@compute @workgroup_size(64)
fn kv_pack_q8(@builtin(global_invocation_id) id: vec3<u32>) {
    if (32u * id.x >= p.row_stride) {
        return;
    }
    let src = p.first + 32u * id.x;
    var amax = 0.0;
    for (var j = 0u; j < 32u; j++) {
        amax = max(amax, abs(KVS[src + j]));
    }
    let d = amax / 127.0;
    var inv = 0.0;
    if (d != 0.0) {
        inv = 1.0 / d;
    }
    let out = (p.off / 32u + id.x) * 9u;
    for (var w = 0u; w < 8u; w++) {
        var word = 0u;
        for (var b = 0u; b < 4u; b++) {
            let q = i32(round(KVS[src + 4u * w + b] * inv));
            word |= (bitcast<u32>(q) & 0xffu) << (8u * b);
        }
        KVP[out + w] = word;
    }
    KVP[out + 8u] = pack2x16float(vec2<f32>(d, 0.0));
}

// A batch member's new rows into its f32 caches: grid (values / 64, tokens, sets); set 0 the keys
// (KS to KD), 1 the values (VS to VD), 2 the raw index keys (IS to ID); p.row_stride values per
// key or value row, p.idim per index key row. Token t's row is column p.first + t of a stage and
// position p.pos0 + t of a cache. Words are copied as they are (no float arithmetic).
@group(0) @binding(14) var<storage, read> KS: array<u32>;
@group(0) @binding(15) var<storage, read> VS: array<u32>;
@group(0) @binding(16) var<storage, read> IS: array<u32>;
@group(0) @binding(17) var<storage, read_write> KD: array<u32>;
@group(0) @binding(18) var<storage, read_write> VD: array<u32>;
@group(0) @binding(19) var<storage, read_write> ID: array<u32>;

@compute @workgroup_size(64)
fn kv_store(@builtin(global_invocation_id) id: vec3<u32>) {
    let i = id.x;
    let t = id.y;
    let which = id.z;
    let width = select(p.row_stride, p.idim, which == 2u);
    if (i >= width || t >= p.tokens) {
        return;
    }
    let src = (p.first + t) * width + i;
    let dst = (p.pos0 + t) * width + i;
    switch which {
        case 0u: {
            KD[dst] = KS[src];
        }
        case 1u: {
            VD[dst] = VS[src];
        }
        default: {
            ID[dst] = IS[src];
        }
    }
}
