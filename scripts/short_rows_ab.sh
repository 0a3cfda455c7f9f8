#!/usr/bin/env bash
# One device call (see scripts/h200_bench.sh for what it expects to be carried: .gl, .devbin/strata.gz,
# .devdata/tiny, .devdata/tools): do the wide tiles' short-row schedules (STRATA_PACK, STRATA_ROUNDS,
# STRATA_PAIRS; README "Prefill") give decode's bits on this GPU, and are they faster?
#   1. tiny IQ3_S p300 logits md5 over chunks 1, 7, 300 with all three on (pairs are opt-in), and 300
#      with them off: all four equal;
#   2. a 4-layer file of the real widths, a 1,500-token prompt, last-position logits md5 with the
#      schedules on and off (rounds on the 640-value rows, pairs on the 2,560-value rows): equal;
#   3. the 48-layer bench (`--prefill 512 --decode 64`) with the defaults (pack and rounds), with
#      pairs as well, and with all three off, each with its prefill kernel table
#      (matvec_mix_wide, matvec_group_wide IQ4_NL, matvec_seg_wide, matvec_group_wide IQ3_S);
#   4. `bench --synthetic matvec` for F32, Q8_0, Q6_K, IQ4_NL, IQ3_S (chained and `indep us`).
# QUICK=1 runs 1, 2 and 4 only.
# Writes under $OUT.
set -uo pipefail
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
[[ -x .devbin/strata ]] || { gunzip -c .devbin/strata.gz > .devbin/strata && chmod +x .devbin/strata; }
export VK_DRIVER_FILES="${VK_DRIVER_FILES:-/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json}"
for f in .gl/*.deb; do dpkg -x "$f" /; done
ldconfig
S=./.devbin/strata
OFF="STRATA_PACK=0 STRATA_ROUNDS=0 STRATA_PAIRS=0"
ON="STRATA_PAIRS=1"
date
ids=$(python3 -c "import json;print(','.join(map(str,json.load(open('.devdata/tiny/prompts.json'))['p300'])))")
for run in 1 7 300 off; do
    chunk=${run/off/300}
    sets=$ON
    [[ $run == off ]] && sets=$OFF
    env $sets "$S" logits --model .devdata/tiny/tiny-IQ3_S.gguf --ids "$ids" --all --backend gpu \
        --prefill-chunk "$chunk" --out /tmp/l.npy >/dev/null 2>&1
    echo "tiny p300, chunk $chunk ${sets:-schedules on}: $(md5sum < /tmp/l.npy | cut -c1-32)"
done | tee "$OUT/determinism.txt"
python3 .devdata/tools/make_synthetic_full.py /tmp/s4.gguf --layers 4 >/dev/null 2>&1
ids=$(python3 -c "print(','.join(str((i * 7919) % 200000 + 1) for i in range(1500)))")
for sets in "$ON" "$OFF"; do
    env $sets "$S" logits --model /tmp/s4.gguf --ids "$ids" --backend gpu --out /tmp/s.npy \
        >/dev/null 2>>"$OUT/s4.err"
    echo "4 layers of the real widths, 1,500 tokens, ${sets:-schedules on}: $(md5sum < /tmp/s.npy | cut -c1-32)"
done | tee -a "$OUT/determinism.txt"
rm -f /tmp/s4.gguf
date
# QUICK=1: the bits and the mat-vec table only (no 48-layer file).
if [[ "${QUICK:-0}" == 1 ]]; then
    "$S" bench --synthetic matvec --quant F32,Q8_0,Q6_K,IQ4_NL,IQ3_S --json "$OUT/matvec.json" 2>&1 \
        >/dev/null | tee "$OUT/matvec.txt"
    exit 0
fi
python3 .devdata/tools/make_synthetic_full.py /tmp/f.gguf --layers 48 >/dev/null 2>&1
for sets in "" "$ON" "$OFF"; do
    echo "== ${sets:-defaults (pack and rounds)}"
    env $sets "$S" bench --model /tmp/f.gguf --prefill 512 --decode 64 2>&1 \
        | grep -E -A12 "^prefill chunk|^decode step|tok/s|streaming read" | grep -v WARN
done | tee "$OUT/model.txt"
# An older binary for comparison on the same card, if carried (e.g. the tree before the schedules).
if [[ -f .devbin/base.gz ]]; then
    gunzip -c .devbin/base.gz > /tmp/base && chmod +x /tmp/base
    echo "== .devbin/base.gz"
    /tmp/base bench --model /tmp/f.gguf --prefill 512 --decode 64 2>&1 \
        | grep -E -A12 "^prefill chunk|^decode step|tok/s" | grep -v WARN | tee -a "$OUT/model.txt"
fi
date
"$S" bench --synthetic matvec --quant F32,Q8_0,Q6_K,IQ4_NL,IQ3_S --json "$OUT/matvec.json" 2>&1 \
    >/dev/null | tee "$OUT/matvec.txt"
date
