#!/usr/bin/env bash
# Tuning variants on the lent GPU machine, after scripts/h200_bench.sh wrote /tmp/f.gguf: the model
# bench once per variant of VARIANTS="name:ENV=1 ENV2=2;name2:ENV=0" (each a set of environment
# settings; an empty set is the defaults), with ARGS (default "--prefill 512 --decode 64"). Prints
# each variant's decode rate and top decode kernels; writes $OUT/variants.json: per variant the
# decode rates, the decode step's kernels and its timeline (every dispatch in order).
set -uo pipefail
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT" /tmp/variants
S=./.devbin/strata
IFS=';' read -ra sets <<< "${VARIANTS:-base:}"
for set in "${sets[@]}"; do
    name="${set%%:*}"
    envs="${set#*:}"
    echo "== variant $name: $envs"
    env $envs "$S" bench --model /tmp/f.gguf ${ARGS:---prefill 512 --decode 64} \
        --json "/tmp/variants/$name.json" 2>&1 >/dev/null | grep -E -A8 "tok/s|decode step" \
        | grep -v "^prefill chunk" | head -14
done
python3 - "$OUT/variants.json" /tmp/variants/*.json <<'PY'
import json, os, sys
out = {}
for path in sys.argv[2:]:
    d = json.load(open(path))
    keep = {k: d.get(k) for k in ("decode_tokens_per_second", "decode_median_ms_per_token",
                                  "decode_sampled_top_tokens_per_second", "prefill")}
    keep["decode_step_kernels"] = d.get("decode_step_kernels")
    out[os.path.basename(path)[:-5]] = keep
json.dump(out, open(sys.argv[1], "w"))
PY
