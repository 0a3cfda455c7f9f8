#!/usr/bin/env bash
# One device call: the same bench with two binaries on one card, alternately (new, old, new), so a
# change's effect can be told from the ~1.5 % that decode moves between processes. Expects, carried:
# .gl (Vulkan loader debs), .devbin/strata.gz (the tree under test), .devbin/base.gz (the tree
# before it), .devdata/tiny and .devdata/tools (see scripts/h200_bench.sh). Writes under $OUT:
#   bits.txt   the tiny IQ3_S p300 logits md5 over prefill chunks 1 and 300, both binaries (equal
#              unless the change is meant to change the arithmetic);
#   ab.txt     `bench --model F.gguf $ARGS` (default `--prefill 512 --decode 64`) three times on
#              the 48-layer file (LAYERS, SKEW), each run's decode lines and kernel tables;
#              then, with EXTRA="A=1;A=2 B=3", the new binary once more under each ;-separated
#              set of environment settings.
set -uo pipefail
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
ARGS="${ARGS:---prefill 512 --decode 64}"
LAYERS="${LAYERS:-48}"
SKEW="${SKEW:-0}"
export VK_DRIVER_FILES="${VK_DRIVER_FILES:-/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json}"
for f in .gl/*.deb; do dpkg -x "$f" /; done
ldconfig
for b in strata base; do
    gunzip -c ".devbin/$b.gz" > "/tmp/$b" && chmod +x "/tmp/$b"
done
date
ids=$(python3 -c "import json;print(','.join(map(str,json.load(open('.devdata/tiny/prompts.json'))['p300'])))")
for b in strata base; do
    for chunk in 1 300; do
        "/tmp/$b" logits --model .devdata/tiny/tiny-IQ3_S.gguf --ids "$ids" --all --backend gpu \
            --prefill-chunk "$chunk" --out /tmp/l.npy >/dev/null 2>&1
        echo "$b: tiny p300, chunk $chunk: $(md5sum < /tmp/l.npy | cut -c1-32)"
    done
done | tee "$OUT/bits.txt"
python3 .devdata/tools/make_synthetic_full.py /tmp/f.gguf --layers "$LAYERS" --router-skew "$SKEW" \
    >/dev/null 2>&1
for b in strata base strata; do
    echo "== $b: bench --model F.gguf $ARGS"
    # shellcheck disable=SC2086
    "/tmp/$b" bench --model /tmp/f.gguf $ARGS --json "$OUT/$b.json" 2>&1 \
        | grep -E -A12 "^prefill chunk|^decode step|tok/s|on the GPU|streaming read" | grep -v WARN
    date
done | tee "$OUT/ab.txt"
IFS=';' read -ra sets <<< "${EXTRA:-}"
for set in "${sets[@]}"; do
    echo "== strata under $set: bench --model F.gguf $ARGS"
    # shellcheck disable=SC2086
    env $set /tmp/strata bench --model /tmp/f.gguf $ARGS 2>&1 \
        | grep -E -A12 "^prefill chunk|^decode step|tok/s|on the GPU|streaming read" | grep -v WARN
    date
done | tee -a "$OUT/ab.txt"
