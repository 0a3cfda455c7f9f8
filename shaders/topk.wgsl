// The first K tokens of a logits row in sampling order (logit descending by `total_cmp`, then id
// ascending: src/sampler/select.rs `order_key`), for sampling on the host from K candidates
// instead of the whole row. Keys are unique (the id is part of them), so the list is the same
// whatever sorting network finds it.
//
// A list is LIST = 2K + 1 words: K (id, key) pairs in order, then the smallest id of a non-finite
// value seen (0xffffffff when none). `key` is the high word of `order_key`: !monotone(bits),
// smaller first. Pairs past the row's end are (0xffffffff, 0xffffffff), which sort last.
// Several rows at once: workgroup row y (workgroup_id.y) works on its own row and lists; a pass
// with W workgroups per row writes row y's lists at OUT[y * W ..].
//   topk_slices: workgroup w of row y sorts values w*SLICE .. (w+1)*SLICE of logits row ROWS[y]
//                (row y itself when p.indexed is 0; rows are p.n values apart in X) with a bitonic
//                sort in workgroup memory, and writes their list to OUT[y * W + w].
//   topk_merge:  workgroup g of row y merges that row's lists g*p.per_wg .. of IN (p.n of them
//                per row, from IN[y * p.n]) into OUT[y * W + g], a round of ROUND lists at a
//                time beside the running first K.

struct Params {
    n: u32,       // topk_slices: values in a row; topk_merge: lists per row in IN
    per_wg: u32,  // topk_merge: lists each workgroup merges
    indexed: u32, // topk_slices: rows named by ROWS (else row y is logits row y)
    pad: u32,
}

var<immediate> p: Params;

@group(0) @binding(0) var<storage, read> X: array<f32>;
@group(0) @binding(1) var<storage, read> IN: array<u32>;
@group(0) @binding(2) var<storage, read_write> OUT: array<u32>;
@group(0) @binding(3) var<storage, read> ROWS: array<u32>;

const WG: u32 = 256u;
const SLICE: u32 = 1024u;
const K: u32 = 64u;
const LIST: u32 = 2u * K + 1u;
// Lists loaded per merge round beside the running K.
const ROUND: u32 = (SLICE - K) / K;
const NONE: u32 = 0xffffffffu;

var<workgroup> KEY: array<u32, SLICE>;
var<workgroup> ID: array<u32, SLICE>;
var<workgroup> BAD: atomic<u32>;

fn is_finite(v: f32) -> bool {
    return (bitcast<u32>(v) & 0x7f800000u) != 0x7f800000u;
}

// The high word of order_key: the bits mapped so that unsigned order follows total_cmp, inverted.
fn order_hi(v: f32) -> u32 {
    let bits = bitcast<u32>(v);
    if ((bits & 0x80000000u) != 0u) {
        return bits;
    }
    return ~(bits | 0x80000000u);
}

fn before(a: u32, b: u32) -> bool {
    return KEY[a] < KEY[b] || (KEY[a] == KEY[b] && ID[a] < ID[b]);
}

// Bitonic sort of KEY/ID ascending (every invocation calls it; it holds barriers).
fn sort_all(lid: u32) {
    for (var k = 2u; k <= SLICE; k <<= 1u) {
        for (var j = k >> 1u; j > 0u; j >>= 1u) {
            for (var q = lid; q < SLICE / 2u; q += WG) {
                let i = ((q & ~(j - 1u)) << 1u) | (q & (j - 1u));
                let l = i + j;
                let up = (i & k) == 0u;
                if (select(before(i, l), before(l, i), up)) {
                    let key = KEY[i];
                    let id = ID[i];
                    KEY[i] = KEY[l];
                    ID[i] = ID[l];
                    KEY[l] = key;
                    ID[l] = id;
                }
            }
            workgroupBarrier();
        }
    }
}

// The first K entries and the bad id as list `at` of OUT.
fn write_list(at: u32, lid: u32) {
    let base = at * LIST;
    for (var r = lid; r < K; r += WG) {
        OUT[base + 2u * r] = ID[r];
        OUT[base + 2u * r + 1u] = KEY[r];
    }
    if (lid == 0u) {
        OUT[base + 2u * K] = atomicLoad(&BAD);
    }
}

@compute @workgroup_size(WG)
fn topk_slices(@builtin(workgroup_id) wg: vec3<u32>,
               @builtin(num_workgroups) groups: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    if (lid == 0u) {
        atomicStore(&BAD, NONE);
    }
    var row = wg.y;
    if (p.indexed != 0u) {
        row = ROWS[wg.y];
    }
    workgroupBarrier();
    for (var r = lid; r < SLICE; r += WG) {
        let i = wg.x * SLICE + r;
        var key = NONE;
        var id = NONE;
        if (i < p.n) {
            let v = X[row * p.n + i];
            if (!is_finite(v)) {
                atomicMin(&BAD, i);
            }
            key = order_hi(v);
            id = i;
        }
        KEY[r] = key;
        ID[r] = id;
    }
    workgroupBarrier();
    sort_all(lid);
    write_list(wg.y * groups.x + wg.x, lid);
}

@compute @workgroup_size(WG)
fn topk_merge(@builtin(workgroup_id) wg: vec3<u32>,
              @builtin(num_workgroups) groups: vec3<u32>,
              @builtin(local_invocation_index) lid: u32) {
    // This row's lists in IN.
    let lists = wg.y * p.n;
    if (lid == 0u) {
        atomicStore(&BAD, NONE);
    }
    for (var r = lid; r < K; r += WG) {
        KEY[r] = NONE;
        ID[r] = NONE;
    }
    let first = wg.x * p.per_wg;
    let end = min(first + p.per_wg, p.n);
    for (var l0 = first; l0 < end; l0 += ROUND) {
        workgroupBarrier();
        for (var r = lid; r < SLICE - K; r += WG) {
            let list = l0 + r / K;
            var key = NONE;
            var id = NONE;
            if (list < end && list < l0 + ROUND) {
                let at = (lists + list) * LIST + 2u * (r % K);
                id = IN[at];
                key = IN[at + 1u];
            }
            KEY[K + r] = key;
            ID[K + r] = id;
        }
        if (lid < ROUND && l0 + lid < end) {
            atomicMin(&BAD, IN[(lists + l0 + lid) * LIST + 2u * K]);
        }
        workgroupBarrier();
        sort_all(lid);
    }
    workgroupBarrier();
    write_list(wg.y * groups.x + wg.x, lid);
}
