#!/usr/bin/env bash
# The benchmark suite on a GPU machine: the full-size suite on CUDA, in fp32 and in bf16, split
# into parts that each stop within 10 minutes, then merged into one report per dtype.
#
#   benchmarks/gpu.sh OUT                 every part of fp32 and bf16 (parallel over the visible
#                                         GPUs, one part per GPU at a time), then merge
#   benchmarks/gpu.sh OUT fp32 3/14       one part only: a single command of < 10 minutes
#   benchmarks/gpu.sh OUT merge           merge the parts already under OUT
#
# Writes OUT/{fp32,bf16}/part-K-of-N/results.{json,md} and the merged
# OUT/{fp32,bf16}/results.{json,md,png}. Run from the repository root (where `import aotc` and
# `import benchmarks` work).
#
# Settings (environment):
#   PARTS=14           parts per dtype (models are dealt round-robin over the parts; 14 = one
#                      model, i.e. two points, per part: about 3-6 minutes each on an H200)
#   BUDGET_S=400       a part starts no new point after this many seconds (those are recorded
#                      as skipped: rerun them with more PARTS or with MODELS=...)
#   PART_LIMIT_S=570   hard limit per part; a part stopped here keeps the points it finished
#   SUITE=full         full | small | smoke
#   SYSTEMS=           comma-separated subset (default: eager, torch.compile, reduce-overhead,
#                      aotinductor, aotc)
#   MODELS=            comma-separated subset of the registry (benchmarks/models.py)
#   GPUS=              how many GPUs to use at once (default: all visible). Parts sharing a host
#                      share its CPUs: GPUS=1 gives the quietest timings.
set -uo pipefail

OUT=${1:?usage: benchmarks/gpu.sh OUT [fp32|bf16 K/N | merge]}
PARTS=${PARTS:-14}
BUDGET_S=${BUDGET_S:-400}
PART_LIMIT_S=${PART_LIMIT_S:-570}
SUITE=${SUITE:-full}
PY=${PYTHON:-python}

run_part() {   # run_part DTYPE K/N [GPU]
    local dtype=$1 part=$2 gpu=${3:-}
    local dir="$OUT/$dtype/part-${part/\//-of-}"
    local extra=()
    [[ -n ${SYSTEMS:-} ]] && extra+=(--systems "$SYSTEMS")
    [[ -n ${MODELS:-} ]] && extra+=(--models "$MODELS")
    mkdir -p "$dir"
    echo "== $dtype part $part${gpu:+ on GPU $gpu} -> $dir"
    ( [[ -n $gpu ]] && export CUDA_VISIBLE_DEVICES=$gpu
      timeout -k 15 "$PART_LIMIT_S" "$PY" -m benchmarks.run --device cuda --suite "$SUITE" \
          --dtype "$dtype" --part "$part" --budget-s "$BUDGET_S" --out "$dir" "${extra[@]}" \
          > "$dir/log.txt" 2>&1 )
    local rc=$?
    [[ $rc -eq 124 || $rc -eq 137 ]] && echo "!! $dtype part $part hit the ${PART_LIMIT_S}s limit"
    tail -n 3 "$dir/log.txt"
    return 0
}

merge() {
    for dtype in fp32 bf16; do
        local parts=("$OUT/$dtype"/part-*)
        [[ -e ${parts[0]} ]] || continue
        "$PY" -m benchmarks.report "$OUT/$dtype" "${parts[@]}"
    done
}

visible_gpus() {   # the GPU ids to hand out, one per concurrent part
    local ids
    if [[ -n ${CUDA_VISIBLE_DEVICES:-} ]]; then
        IFS=, read -ra ids <<< "$CUDA_VISIBLE_DEVICES"
    else
        local n
        n=$("$PY" -c "import torch; print(torch.cuda.device_count())")
        ids=(); for ((i = 0; i < n; i++)); do ids+=("$i"); done
    fi
    echo "${ids[@]:0:${GPUS:-${#ids[@]}}}"
}

if [[ ${2:-} == merge ]]; then
    merge
    exit 0
fi
if [[ $# -ge 3 ]]; then
    run_part "$2" "$3"
    exit 0
fi

read -ra gpus <<< "$(visible_gpus)"
[[ ${#gpus[@]} -gt 0 ]] || { echo "no CUDA GPU visible" >&2; exit 2; }
jobs=()
for dtype in fp32 bf16; do
    for ((k = 1; k <= PARTS; k++)); do jobs+=("$dtype $k/$PARTS"); done
done
echo "${#jobs[@]} parts on ${#gpus[@]} GPU(s): ${gpus[*]}; each part at most ${PART_LIMIT_S}s"
for ((g = 0; g < ${#gpus[@]}; g++)); do
    (   # one queue per GPU: jobs g, g + G, g + 2G, ...
        for ((j = g; j < ${#jobs[@]}; j += ${#gpus[@]})); do
            read -r dtype part <<< "${jobs[$j]}"
            run_part "$dtype" "$part" "${gpus[$g]}"
        done
    ) &
done
wait
merge
