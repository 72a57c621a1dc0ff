#!/usr/bin/env bash
# One bounded GPU call (< 10 minutes): where a quantized decode step's time goes, and whether
# the generic fused one-row products or the quantized-weight kernel (codegen/triton/
# quant_mv.py) should take each scheme's products. llama-1b in bf16 at batch 1: the bf16
# artifact, then int8 and int4 each both ways (gpu_decode_profile.py --generic, --kernel-int8;
# int8's default is the generic products, int4's the kernel), each the
# step's time, its kernels and the longest ones; the lines printed are the summary.
#
#   scripts/gpu_quant_ab.sh OUT        # on the GPU machine, from the repository root
#
# Settings: MODEL (llama-1b), RUN_S (seconds a run, 110), RUNS ("bf16 int8 int8:kernel
# int4 int4:generic": SCHEME[:generic|:kernel] words, bf16 for none).
set -uo pipefail
OUT=${1:?usage: scripts/gpu_quant_ab.sh OUT}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src:$PWD${PYTHONPATH:+:$PYTHONPATH}
nvidia-smi --query-gpu=name --format=csv | tail -n 1
for run in ${RUNS:-bf16 int8 int8:kernel int4 int4:generic}; do
    scheme=${run%%:*}
    args=(--model "${MODEL:-llama-1b}" --systems aotc --steps 10 --cache 512)
    [[ $scheme != bf16 ]] && args+=(--quantize "$scheme")
    [[ $run == *:generic ]] && args+=(--generic "$scheme")
    [[ $run == int8:kernel ]] && args+=(--kernel-int8)
    timeout -k 10 "${RUN_S:-110}" python3 scripts/gpu_decode_profile.py "${args[@]}" \
        > "$OUT/${run/:/-}.txt" 2>&1
    echo "== $run rc=$?: $(grep -m1 '^== aotc' "$OUT/${run/:/-}.txt")"
done
exit 0
