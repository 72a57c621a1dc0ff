#!/usr/bin/env bash
# One bounded GPU run of the loading benchmark (benchmarks/loading.py): export, verified and
# unverified loads, load plus first call, and the machine's own limits, for large models in bf16.
#
#   COMMIT=<sha> scripts/gpu_loading.sh OUT
#
# Settings: LOAD_MODELS (default llama-1b,llama-7b), LOAD_STEPS (default export,load; the
# machine's limits are measured after them), LOAD_REPS (loads per variant, default 3), LOAD_S
# (seconds in all, default 400), STEP_S (per step, default 300). Run from the repository root;
# the repository need not be installed.
set -uo pipefail
OUT=${1:?usage: scripts/gpu_loading.sh OUT}
mkdir -p "$OUT" /tmp/aotc-root
ln -sfn "$PWD/src/aotc" /tmp/aotc-root/aotc
export PYTHONPATH=/tmp/aotc-root:$PWD${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1
df -h /tmp | tail -n 1
timeout -k 5 "${LOAD_S:-400}" python3 -m benchmarks.loading --device cuda \
    --models "${LOAD_MODELS:-llama-1b,llama-7b}" --steps "${LOAD_STEPS:-export,load}" \
    --reps "${LOAD_REPS:-3}" --step-timeout "${STEP_S:-300}" --commit "${COMMIT:-}" \
    --work /tmp/aotc-loading --out "$OUT/loading" > "$OUT/loading.log" 2>&1
echo "loading rc=$?"
tail -n 40 "$OUT/loading.log"
rm -rf /tmp/aotc-loading
