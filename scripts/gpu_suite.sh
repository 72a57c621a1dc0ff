#!/usr/bin/env bash
# Issue 49's benchmark set in one bounded call on the lent GPU (under 10 minutes): 20 inference
# points (benchmarks/models.py's `gpu-set`: GPT-2 small with its tied LM head at 16x128,
# ConvNeXt-T and ViT-S/16 at 32, BERT, a LLaMA-style decoder, T5, ViT-B/16, ResNet-50,
# MobileNetV3, EfficientNet-B0; batch 1 and a throughput batch each), 4 training steps and
# decode (a Qwen2-0.5B-shape thin decoder at batch 1, a LLaMA-3-1B shape at batch 1 and 8),
# each system in one process, bf16, medians after warm-up; then benchmarks.gpu_set writes
# OUT/results.json (commit, device, command of every part), results.md and results.png: aotc
# against torch.compile(mode="reduce-overhead"), geomean, points below 1.0x flagged.
#
#   AOTC_COMMIT=<sha> scripts/gpu_suite.sh OUT          # on the GPU machine
#   scripts/gpu_suite.sh OUT --tiny                     # on a CPU: tiny shapes, fp32, end to end
#
# aotc's inference artifacts are exported ahead, several at once, by benchmarks.prebuild
# (cross-compiled on the host's CPU cores, at a lower priority, while the other systems are
# measured; the harness waits for each). Settings: MODELS (a subset of the set), JOBS
# (parallel exports), INFER_S, TRAIN_S, DECODE_S (seconds for each part; 0 skips it),
# TRAIN_MODELS, DECODE (MODEL:BATCHES words). Run from the repository root. The defaults fit
# one 10-minute call, cutting what does not fit (points past a budget are recorded as
# skipped); for every point, three calls whose folders are merged afterwards (a decode point
# printed nothing within 95 s on an H100 at 5925895, its export and torch.compile's warm-up
# included: give each 240):
#   TRAIN_S=0 DECODE_S=0 INFER_S=540 scripts/gpu_suite.sh OUT
#   INFER_S=0 TRAIN_S=300 DECODE_S=0 scripts/gpu_suite.sh OUT2
#   INFER_S=0 TRAIN_S=0 DECODE_S=240 scripts/gpu_suite.sh OUT3
#   cp -r OUT2/training OUT3/decode-* OUT/ && python -m benchmarks.gpu_set OUT
set -uo pipefail
OUT=${1:?usage: scripts/gpu_suite.sh OUT [--tiny]}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src:$PWD${PYTHONPATH:+:$PYTHONPATH}
if [[ ${2:-} == --tiny ]]; then
    DEVICE=cpu DTYPE=fp32 SUITE=gpu-set-tiny SIZE=small TARGET=cpu
    SYSTEMS=eager,torch.compile,aotc JOBS=${JOBS:-1}
    DECODE=${DECODE:-"qwen-tiny:1 llama3-tiny:1,8"}
    TIMING="--warmup 1 --min-reps 3 --max-reps 5 --timing-s 0.2"
    GEN_ARGS="--steps 8 --repeats 2 --prompts 16 --threads 2"
else
    nvidia-smi --query-gpu=name,memory.used,clocks.sm,clocks.mem --format=csv | tail -n 1
    source "$(dirname "$0")/gpu_build.sh"   # the C++ runner, as aotc's users run it
    DEVICE=cuda DTYPE=bf16 SUITE=gpu-set SIZE=full
    TARGET=cuda:sm_$(python3 -c "import torch; print(''.join(map(str, torch.cuda.get_device_capability())))")
    SYSTEMS=eager,torch.compile:reduce-overhead,aotc JOBS=${JOBS:-4}
    DECODE=${DECODE:-"qwen-0.5b:1 llama3-1b:1,8"}
    TIMING="--warmup 5 --min-reps 10 --timing-s 1.0"
    GEN_ARGS="--steps 64 --repeats 3 --prompts 128"
fi
TRAIN_MODELS=${TRAIN_MODELS:-transformer_block,gpt2,bert,vit_s16}
ONLY=${MODELS:+--models $MODELS}
python3 -c "import torch; print('torch', torch.__version__)"

source "$(dirname "$0")/gpu_part.sh"   # part NAME SECONDS COMMAND...
PREBUILD=
if [[ ${INFER_S:-300} != 0 ]]; then   # stopped with its worker processes below
    nice -n 10 python3 -m benchmarks.prebuild --suite "$SUITE" $ONLY --dtype "$DTYPE" \
        --target "$TARGET" --jobs "$JOBS" --out "$OUT/prebuilt" > "$OUT/prebuild.log" 2>&1 &
    PREBUILD=$!
fi
part inference "${INFER_S:-300}" python3 -m benchmarks.run --device "$DEVICE" --suite "$SUITE" \
    $ONLY --dtype "$DTYPE" --systems "$SYSTEMS" --prebuilt "$OUT/prebuilt" $TIMING \
    --budget-s $(( ${INFER_S:-300} - 30 )) --out "$OUT/inference"
if [[ -n $PREBUILD ]]; then
    pkill -P "$PREBUILD" 2> /dev/null; kill "$PREBUILD" 2> /dev/null; wait "$PREBUILD" 2> /dev/null
    tail -n 3 "$OUT/prebuild.log"
fi
part training "${TRAIN_S:-110}" python3 -m benchmarks.training --device "$DEVICE" \
    --dtype "$DTYPE" --size "$SIZE" --models "$TRAIN_MODELS" --systems "$SYSTEMS" $TIMING \
    --out "$OUT/training"
for job in $DECODE; do   # MODEL:BATCHES, one process each
    part "decode-${job%%:*}" "${DECODE_S:-75}" python3 -m benchmarks.generate \
        --device "$DEVICE" --dtype "$DTYPE" --models "${job%%:*}" --batches "${job#*:}" \
        $GEN_ARGS --out "$OUT/decode-${job%%:*}"
done
python3 -m benchmarks.gpu_set "$OUT"
exit 0
