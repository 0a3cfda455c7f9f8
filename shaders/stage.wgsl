// Expert staging (the pinned tier's decode steps): the routed experts of a step that have no VRAM
// copy are copied from their tensor in host memory into a small VRAM stage, one unit per routed
// item, and the expert kernels then read them there. A subgroup's loads cover whole consecutive
// words, so the bus carries full line requests; the expert kernels reading host memory in place
// fetch a few scattered words per lane and reach about 60 % of the link (issue 10). Bytes only:
// the kernels read the same bytes from the stage, so the same bits.
//
// stage_units: item i with expert e = IDS[i] in [unit_first, unit_first + units) (this part of the
// source tensor) copies `words` words from SRC[src_base + (e - unit_first) * src_stride] to
// DST[dst_base + i * dst_stride]. Items of other parts and NO_EXPERT ids copy nothing. One
// dispatch per byte range of a unit (a split layout's bodies, then its scale plane).

struct Params {
    items: u32,
    unit_first: u32,
    units: u32,
    src_base: u32,
    src_stride: u32,
    dst_base: u32,
    dst_stride: u32,
    words: u32,
}

var<immediate> p: Params;

@group(0) @binding(0) var<storage, read> SRC: array<u32>;
@group(0) @binding(1) var<storage, read_write> DST: array<u32>;
@group(0) @binding(2) var<storage, read> IDS: array<u32>;

const STAGE_WG: u32 = 256u;
// Words per invocation: all of them loaded before any is stored, so each invocation keeps
// PER requests in flight over the bus.
const PER: u32 = 8u;

struct Words {
    w0: u32,
    w1: u32,
    w2: u32,
    w3: u32,
    w4: u32,
    w5: u32,
    w6: u32,
    w7: u32,
}

fn load(src: u32, w: u32) -> u32 {
    if (w < p.words) {
        return SRC[src + w];
    }
    return 0u;
}

fn store(dst: u32, w: u32, v: u32) {
    if (w < p.words) {
        DST[dst + w] = v;
    }
}

@compute @workgroup_size(STAGE_WG)
fn stage_units(@builtin(workgroup_id) wg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    let item = wg.y;
    if (item >= p.items) {
        return;
    }
    let e = IDS[item];
    if (e < p.unit_first || e - p.unit_first >= p.units) {
        return;
    }
    let src = p.src_base + (e - p.unit_first) * p.src_stride;
    let dst = p.dst_base + item * p.dst_stride;
    let first = wg.x * STAGE_WG * PER + lid;
    let s = STAGE_WG;
    let v = Words(load(src, first), load(src, first + s), load(src, first + 2u * s),
                  load(src, first + 3u * s), load(src, first + 4u * s),
                  load(src, first + 5u * s), load(src, first + 6u * s),
                  load(src, first + 7u * s));
    store(dst, first, v.w0);
    store(dst, first + s, v.w1);
    store(dst, first + 2u * s, v.w2);
    store(dst, first + 3u * s, v.w3);
    store(dst, first + 4u * s, v.w4);
    store(dst, first + 5u * s, v.w5);
    store(dst, first + 6u * s, v.w6);
    store(dst, first + 7u * s, v.w7);
}
