#!/usr/bin/env bash
# One bounded GPU call (< 10 minutes) for the checks that need a GPU after a round of features:
# builds aotc's C++ runner against the machine's torch, runs the GPU tests named in TESTS, then
# the ViT-S/16 bf16 training point (export cross-compiled on the host's CPU, a step timed against
# eager, torch.compile and reduce-overhead, gradients checked), the quantized-decode benchmark
# and the serving benchmark, each where its script exists and each under its own time limit.
#
#   scripts/gpu_checks.sh OUT
#
# Results record their commit: export AOTC_COMMIT=<sha> (the copy on a lent machine may carry
# a stale .git).
# Settings: TESTS (pytest files, run with -m gpu; "" skips), TEST_S, TRAIN_S, QUANT_S, SERVE_S
# (seconds for each part; 0 skips it), QUANT_ARGS, SERVE_ARGS (more arguments). Run from the
# repository root; every part writes under OUT and prints its last lines. QUANT_ARGS defaults
# to llama-1b in bf16, batches 1 and 8, prefill 128 and 1024, int8/int4/fp8 against bf16 and
# torchao; the 7B shape alone, in a call of its own:
#   TRAIN_S=0 SERVE_S=0 QUANT_S=560 QUANT_ARGS="--dtype bf16 --models llama-7b --batches 1,8 \
#     --prompts 128,1024 --schemes int8,int4,fp8" scripts/gpu_checks.sh OUT
set -uo pipefail
OUT=${1:?usage: scripts/gpu_checks.sh OUT}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.used,clocks.sm,clocks.mem --format=csv | tail -n 1
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
source "$(dirname "$0")/gpu_build.sh"   # PYTHONPATH, PATH, the C++ runner

source "$(dirname "$0")/gpu_part.sh"   # part NAME SECONDS COMMAND...
[[ -n ${TESTS-} ]] && part tests "${TEST_S:-150}" python3 -m pytest -q -m gpu -p no:cacheprovider $TESTS
part training "${TRAIN_S:-300}" python3 -m benchmarks.training --device cuda --dtype bf16 \
    --size full --models vit_s16 --out "$OUT/training"
[[ -f benchmarks/quant.py ]] && part quant "${QUANT_S:-200}" python3 -m benchmarks.quant \
    --device cuda --out "$OUT/quant" ${QUANT_ARGS:---dtype bf16 --models llama-1b --batches 1,8 \
    --prompts 128,1024 --schemes int8,int4,fp8}
[[ -f scripts/gpu_serve.py ]] && part serve "${SERVE_S:-240}" python3 scripts/gpu_serve.py \
    "$OUT/serve" ${SERVE_ARGS:-}
exit 0
