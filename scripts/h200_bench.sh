#!/usr/bin/env bash
# One device run on the lent GPU machine (see ../shared/docs/gpu-notes.md): correctness first
# (oracle and determinism), then the mat-vec roofline and the 48-layer synthetic model bench.
# Expects, carried from the development machine: .gl (Vulkan loader and glvnd debs, see the device
# tool's README; set VK_DRIVER_FILES to the NVIDIA ICD), .devbin/strata (release
# build), .devdata/tiny (oracle fixture subset) and .devdata/tools (oracle_check.py, the synthetic
# model writer). Writes logs and JSON under $OUT.
#   STAGES="oracle matvec model" (default all; "tiers" and "long" are extra), LAYERS=48, SKEW=0,
#   EXTRA_BENCH="...".
#   STAGES=tiers: the 12 GB card (issue 10) on a file of router skew TIER_SKEW (default 0.2):
#   `--vram-budget ${TIER_BUDGET:-12GiB}` with the default `--experts auto` (pinned), twice: the
#   first run writes the routing it saw to an expert profile, the second starts from it; with
#   STAGE_AB=1 a third run repeats the second under STRATA_STAGE=0 (misses read in place instead
#   of through the decode stage, same binary).
#   STAGES=long: `bench --long` with LONG_TOKENS (default 262144) and LONG_KV (default f32): the
#   prompt prefilled once, decode at its depth, the VRAM in use (issue 12).
#   SWEEP="A=1 B=2;A=2" (with the model stage): the model bench again under each ;-separated set
#   of environment settings (tuning overrides such as STRATA_PREFILL_ROWS), with SWEEP_ARGS
#   (default "--prefill 512 --decode 16"). EXTRA_CMD: a command run last (e.g. another bench).
#   MSWEEP="A=1;A=2": the mat-vec bench (MATVEC_TYPES, MATVEC_SHAPES) under each set of settings.
#   The SM and memory clocks are sampled every 200 ms while the stages run (clocks.txt).
set -uo pipefail
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
STAGES="${STAGES:-oracle matvec model}"
LAYERS="${LAYERS:-48}"
SKEW="${SKEW:-0}"
# The oracle fixture (a copy of ../shared/oracle/qwen4exp-tiny, or a subset: ORACLE_TYPES).
FIXTURE="${FIXTURE:-.devdata/tiny}"
for f in .gl/*.deb; do dpkg -x "$f" /; done
ldconfig
S=./.devbin/strata
export PYTHONUNBUFFERED=1
"$S" inspect --gpus 2>&1 | head -5
if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,utilization.gpu \
        --format=csv -lms 200 > "$OUT/clocks.txt" 2>&1 &
fi

if [[ " $STAGES " == *" oracle "* ]]; then
    echo "== oracle (GPU, tolerance 1e-3)"
    python3 .devdata/tools/oracle_check.py --strata "$S" --fixture "$FIXTURE" \
        --types "${ORACLE_TYPES:-F16,Q6_K,IQ3_S}" --backend gpu --tol 1e-3 2>&1 | tail -4 \
        | tee "$OUT/oracle.txt"
    echo "== determinism: p300 logits over prefill chunk sizes, two processes each"
    ids=$(python3 -c "import json;print(','.join(map(str,json.load(open('$FIXTURE/prompts.json'))['p300'])))")
    for chunk in 1 7 64 300; do
        for run in 1 2; do
            "$S" logits --model "$FIXTURE/tiny-IQ3_S.gguf" --ids "$ids" --all --backend gpu \
                --prefill-chunk "$chunk" --out "/tmp/l.$chunk.$run.npy" >/dev/null 2>&1
            md5sum "/tmp/l.$chunk.$run.npy" | cut -c1-32
        done
    done | sort | uniq -c | tee "$OUT/determinism.txt"
fi

if [[ " $STAGES " == *" matvec "* ]]; then
    echo "== mat-vec roofline"
    "$S" bench --synthetic matvec --quant "${MATVEC_TYPES:-F32,Q8_0,Q6_K,IQ4_NL,IQ3_S}" \
        --json "$OUT/matvec.json" 2>&1 >/dev/null | tee "$OUT/matvec.txt"
fi

if [[ " $STAGES " == *" model "* ]]; then
    echo "== synthetic model: $LAYERS layers, router skew $SKEW"
    python3 .devdata/tools/make_synthetic_full.py /tmp/f.gguf --layers "$LAYERS" \
        --router-skew "$SKEW" >/dev/null 2>&1 || { echo "synthetic model failed"; exit 1; }
    "$S" bench --model /tmp/f.gguf --prefill "${PREFILL:-512,4096}" --decode "${DECODE:-64}" \
        ${EXTRA_BENCH:-} --json "$OUT/model.json" 2>&1 >/dev/null | tee "$OUT/model.txt"
fi

if [[ " $STAGES " == *" tiers "* ]]; then
    echo "== tiers: budget ${TIER_BUDGET:-12GiB}, router skew ${TIER_SKEW:-0.2}"
    if [[ ! -f /tmp/f.gguf || "${TIER_SKEW:-0.2}" != "$SKEW" || " $STAGES " != *" model "* ]]; then
        python3 .devdata/tools/make_synthetic_full.py /tmp/f.gguf --layers "$LAYERS" \
            --router-skew "${TIER_SKEW:-0.2}" >/dev/null 2>&1 || { echo "synthetic model failed"; exit 1; }
    fi
    rm -f /tmp/profile.txt
    for run in 1 2; do
        echo "-- run $run (profile: $([[ -f /tmp/profile.txt ]] && echo loaded || echo written at exit))"
        "$S" bench --model /tmp/f.gguf --vram-budget "${TIER_BUDGET:-12GiB}" --prefill "${TIER_PREFILL:-512}" \
            --decode "${TIER_DECODE:-64}" --expert-profile /tmp/profile.txt \
            --json "$OUT/tiers$run.json" 2>&1 >/dev/null | grep -v "^  " | tee "$OUT/tiers$run.txt"
    done
    if [[ "${STAGE_AB:-0}" == 1 ]]; then
        echo "-- run 2 again, misses read in place (STRATA_STAGE=0)"
        STRATA_STAGE=0 "$S" bench --model /tmp/f.gguf --vram-budget "${TIER_BUDGET:-12GiB}" \
            --prefill "${TIER_PREFILL:-512}" --decode "${TIER_DECODE:-64}" \
            --expert-profile /tmp/profile.txt 2>&1 >/dev/null | grep -v "^  " \
            | tee "$OUT/tiers-inplace.txt"
    fi
fi

if [[ " $STAGES " == *" long "* ]]; then
    # Issue 12's long-context figure: one prompt of LONG_TOKENS prefilled once, then decode at
    # that depth (262,144 tokens: about 530 s on the H200, so alone in its call).
    echo "== long context: ${LONG_TOKENS:-262144} tokens, KV ${LONG_KV:-f32}"
    if [[ ! -f /tmp/f.gguf ]]; then
        python3 .devdata/tools/make_synthetic_full.py /tmp/f.gguf --layers "$LAYERS" \
            --router-skew "$SKEW" >/dev/null 2>&1 || { echo "synthetic model failed"; exit 1; }
    fi
    "$S" bench --model /tmp/f.gguf --long --prefill "${LONG_TOKENS:-262144}" --decode 32 \
        --kv "${LONG_KV:-f32}" --json "$OUT/long.json" 2>&1 >/dev/null | tee "$OUT/long.txt"
fi

if [[ -n "${SWEEP:-}" && " $STAGES " == *" model "* ]]; then
    IFS=';' read -ra sets <<< "$SWEEP"
    for set in "${sets[@]}"; do
        echo "== sweep: $set" | tee -a "$OUT/sweep.txt"
        env $set "$S" bench --model /tmp/f.gguf ${SWEEP_ARGS:---prefill 512 --decode 16} 2>&1 >/dev/null \
            | grep -E -A7 "tok/s|prefill chunk|decode step" | tee -a "$OUT/sweep.txt"
    done
fi

if [[ -n "${MSWEEP:-}" ]]; then
    IFS=';' read -ra sets <<< "$MSWEEP"
    for set in "${sets[@]}"; do
        echo "== matvec sweep: $set" | tee -a "$OUT/msweep.txt"
        env $set "$S" bench --synthetic matvec --quant "${MATVEC_TYPES:-Q6_K,Q8_0}" \
            ${MATVEC_SHAPES:+--shapes "$MATVEC_SHAPES"} 2>&1 >/dev/null | tail -n +3 \
            | tee -a "$OUT/msweep.txt"
    done
fi

if [[ -n "${EXTRA_CMD:-}" ]]; then
    echo "== extra: $EXTRA_CMD" | tee -a "$OUT/extra.txt"
    eval "$EXTRA_CMD" 2>&1 | tee -a "$OUT/extra.txt"
fi
