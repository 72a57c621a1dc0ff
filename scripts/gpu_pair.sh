#!/usr/bin/env bash
# Two benchmark parts at once on a host with two GPUs (one part per GPU), in < 10 minutes:
#
#   scripts/gpu_pair.sh OUT DTYPE MODELS_GPU0 MODELS_GPU1 [BUDGET_S]
#
# Each part is `python -m benchmarks.run --device cuda --suite full` over its models with the
# GPU systems (eager, torch.compile, reduce-overhead, aotc), starting no new point after
# BUDGET_S seconds; results go to OUT/gpu0 and OUT/gpu1, then all of OUT into OUT.tgz (the
# device tool returns few files). `benchmarks.report` merges parts afterwards. MODELS_GPU1 may
# be `-` to leave the second GPU to other work (TRAIN=1 runs the training-step benchmark there,
# with TRAIN_ARGS, stopped after TRAIN_LIMIT_S). AFTER0, a shell command, runs on GPU 0 once its part is done (its output in
# OUT/after0.txt).
set -uo pipefail
OUT=${1:?usage: scripts/gpu_pair.sh OUT DTYPE MODELS_GPU0 MODELS_GPU1 [BUDGET_S]}
DTYPE=${2:?dtype}; M0=${3:?models for GPU 0}; M1=${4:?models for GPU 1}; BUDGET_S=${5:-420}
mkdir -p "$OUT" /tmp/aotc-root
ln -sfn "$PWD/src/aotc" /tmp/aotc-root/aotc
export PYTHONPATH=/tmp/aotc-root${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
part() {   # part GPU MODELS
    local gpu=$1 models=$2 dir="$OUT/gpu$1"
    mkdir -p "$dir"
    CUDA_VISIBLE_DEVICES=$gpu timeout -k 10 $((BUDGET_S + 130)) python3 -m benchmarks.run \
        --device cuda --suite full --dtype "$DTYPE" --models "$models" --budget-s "$BUDGET_S" \
        --systems eager,torch.compile,torch.compile:reduce-overhead,aotc ${BENCH_ARGS:-} \
        --out "$dir" > "$dir/log.txt" 2>&1
    echo "gpu$gpu bench rc=$?"
}
( part 0 "$M0"
  if [[ -n ${AFTER0:-} ]]; then
      CUDA_VISIBLE_DEVICES=0 bash -c "$AFTER0" > "$OUT/after0.txt" 2>&1; echo "after0 rc=$?"
  fi ) &
if [[ $M1 != - ]]; then
    part 1 "$M1" &
elif [[ -n ${TRAIN:-} ]]; then
    ( mkdir -p "$OUT/train"
      CUDA_VISIBLE_DEVICES=1 timeout -k 10 ${TRAIN_LIMIT_S:-$((BUDGET_S + 130))} \
          python3 -m benchmarks.training \
          --device cuda ${TRAIN_ARGS:-} --out "$OUT/train" > "$OUT/train/log.txt" 2>&1
      echo "train rc=$?" ) &
fi
wait
for f in "$OUT"/*/results.md; do echo "== $f"; sed -n '/## Speedup/,/^spread/p' "$f"; done
for f in "$OUT"/*/log.txt; do echo "== $f"; grep -iE "error|fail|Traceback" "$f" | head -20; done
[[ -f $OUT/train/results.md ]] && sed -n '/## Summary/,/## Saved/p' "$OUT/train/results.md"
[[ -f $OUT/after0.txt ]] && tail -n 60 "$OUT/after0.txt"
tar czf "$OUT.tgz" -C "$(dirname "$OUT")" "$(basename "$OUT")"
