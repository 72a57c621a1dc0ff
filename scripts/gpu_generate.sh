#!/usr/bin/env bash
# One bounded GPU run (< 10 minutes): correctness checks of CUDA artifacts (scripts/gpu_check.py
# on a few models), then the generation benchmark (benchmarks/generate.py) in bf16.
#
#   COMMIT=<sha> scripts/gpu_generate.sh OUT
#
# Settings: CHECK_MODELS, CHECK_S (seconds for the checks; 0 skips them), FAMILY_S (seconds
# for scripts/gpu_generate_check.py over FAMILIES; 0, the default, skips it), GEN_MODELS,
# GEN_BATCHES, GEN_PROMPTS, GEN_S (0 skips the benchmark). Run from the repository root; the repository need not be
# installed (it is made importable as `aotc` through a symlink).
set -uo pipefail
OUT=${1:?usage: scripts/gpu_generate.sh OUT}
mkdir -p "$OUT" /tmp/aotc-root
ln -sfn "$PWD/src/aotc" /tmp/aotc-root/aotc
export PYTHONPATH=/tmp/aotc-root${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.used,clocks.sm,clocks.mem --format=csv | tail -n 1
python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)"
if [[ ${CHECK_S:-200} != 0 ]]; then
    timeout -k 5 "${CHECK_S:-200}" python3 scripts/gpu_check.py \
        --models "${CHECK_MODELS:-mlp,transformer,gpt2}" --dtypes fp32,bf16 > "$OUT/check.txt" 2>&1
    echo "check rc=$?"; tail -n 25 "$OUT/check.txt"
fi
if [[ ${FAMILY_S:-0} != 0 ]]; then   # bf16 greedy tokens against transformers' generate
    timeout -k 5 "$FAMILY_S" python3 scripts/gpu_generate_check.py \
        --families "${FAMILIES:-sample,llama,qwen2,mistral,gpt2}" > "$OUT/families.txt" 2>&1
    echo "families rc=$?"; grep -v Warning "$OUT/families.txt" | tail -n 8
fi
[[ ${GEN_S:-330} == 0 ]] && exit 0
timeout -k 5 "${GEN_S:-330}" python3 -m benchmarks.generate --device cuda --dtype bf16 \
    --models "${GEN_MODELS:-llama-1b}" --batches "${GEN_BATCHES:-1}" \
    --prompts "${GEN_PROMPTS:-128,1024}" --steps 128 --repeats 3 --commit "${COMMIT:-}" \
    --out "$OUT/generate" > "$OUT/generate.log" 2>&1
echo "generate rc=$?"
tail -n 30 "$OUT/generate.log"
