#!/usr/bin/env bash
# One bounded GPU session (< 10 minutes), as run on the H200 for the results in
# benchmarks/results/h200-*: correctness checks of the GPU backend, then a benchmark part.
#
#   scripts/gpu_session.sh OUT DTYPE MODELS [BUDGET_S]
#
# OUT gets check.txt (scripts/gpu_check.py, when DTYPE is fp32 or CHECK=1) and bench/ (benchmarks.run on
# cuda with the given models, suite `full`, all systems but AOTInductor, whose per-model build
# time does not fit a 10-minute part). Run from the repository root; the repository does not
# need to be installed (it is made importable as `aotc` through a symlink).
set -uo pipefail
OUT=${1:?usage: scripts/gpu_session.sh OUT DTYPE MODELS [BUDGET_S]}
DTYPE=${2:?dtype}
MODELS=${3:?models}
BUDGET_S=${4:-360}
mkdir -p "$OUT" /tmp/aotc-root
ln -sfn "$PWD/src/aotc" /tmp/aotc-root/aotc
export PYTHONPATH=/tmp/aotc-root${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1
CHECK=${CHECK:-$([[ $DTYPE == fp32 ]] && echo 1)}   # the correctness checks: fp32 parts by default
if [[ -n $CHECK && -f scripts/gpu_check.py && -z ${SKIP_CHECK:-} ]]; then
    prebuilt=(.devcarry/prebuilt/*.aotc)   # cubins cross-compiled on the CPU-only machine
    [[ -e ${prebuilt[0]} ]] || prebuilt=()
    timeout -k 5 ${CHECK_S:-240} python3 scripts/gpu_check.py ${prebuilt:+--prebuilt "${prebuilt[@]}"} \
        > "$OUT/check.txt" 2>&1
    echo "gpu_check rc=$?"; tail -n 30 "$OUT/check.txt"
fi
timeout -k 10 $((BUDGET_S + 120)) python3 -m benchmarks.run --device cuda --suite full \
    --dtype "$DTYPE" --models "$MODELS" --budget-s "$BUDGET_S" \
    --systems eager,torch.compile,torch.compile:reduce-overhead,aotc --out "$OUT/bench" \
    > "$OUT/bench.log" 2>&1
echo "bench rc=$?"
tail -n 40 "$OUT/bench/results.md" 2>/dev/null || tail -n 30 "$OUT/bench.log"
