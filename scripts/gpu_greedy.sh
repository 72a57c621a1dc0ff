#!/usr/bin/env bash
# One bounded GPU run of the fused greedy step's checks and A/Bs, and export's GPU memory
# before and after (scripts/gpu_greedy.py). The tree under .ab/base (a git worktree of the
# commit before, carried to the GPU host) exports with its own code for the memory comparison.
#
#   scripts/gpu_greedy.sh OUT
#
# Settings: TESTS (pytest files run first), AB_MODELS (model:batch pairs; "" skips),
# SAMPLED_MODELS (the same for sampled steps), ROUNDS.
set -uo pipefail
OUT=${1:?usage: scripts/gpu_greedy.sh OUT}
mkdir -p "$OUT" /tmp/aotc-root /tmp/aotc-base
ln -sfn "$PWD/src/aotc" /tmp/aotc-root/aotc
mkdir -p /tmp/aotc-root/bin   # the `aotc` console script some tests run, with this python
printf '#!/bin/sh\nexec %s -m aotc.cli.main "$@"\n' "$(command -v python3)" > /tmp/aotc-root/bin/aotc
chmod +x /tmp/aotc-root/bin/aotc && export PATH=/tmp/aotc-root/bin:$PATH
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.used,clocks.sm,clocks.mem --format=csv | tail -n 1
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"
PYTHONPATH=/tmp/aotc-root:$PWD/tests timeout -k 5 240 python3 -m pytest -q -p no:cacheprovider \
    ${TESTS:-tests/test_greedy_graph.py tests/test_cuda_graph.py} \
    > "$OUT/tests.txt" 2>&1
echo "tests rc=$?"; tail -n 3 "$OUT/tests.txt"
for mb in ${AB_MODELS-llama-1b:1 gpt2:1}; do
    PYTHONPATH=/tmp/aotc-root timeout -k 5 200 python3 scripts/gpu_greedy.py ab \
        --model "${mb%%:*}" --batch "${mb##*:}" --rounds "${ROUNDS:-10}" \
        > "$OUT/ab-${mb%%:*}-b${mb##*:}.txt" 2>&1
    echo "ab $mb rc=$?"; tail -n 1 "$OUT/ab-${mb%%:*}-b${mb##*:}.txt"
done
for mb in ${SAMPLED_MODELS:-}; do   # sampled steps: flags read each step against folded
    PYTHONPATH=/tmp/aotc-root timeout -k 5 200 python3 scripts/gpu_greedy.py sampled \
        --model "${mb%%:*}" --batch "${mb##*:}" --rounds "${ROUNDS:-10}" \
        > "$OUT/sampled-${mb%%:*}-b${mb##*:}.txt" 2>&1
    echo "sampled $mb rc=$?"; tail -n 1 "$OUT/sampled-${mb%%:*}-b${mb##*:}.txt"
done
if [[ -d .ab/base ]]; then
    ln -sfn "$PWD/.ab/base" /tmp/aotc-base/aotc
    for tree in base head; do
        root=/tmp/aotc-root; [[ $tree == base ]] && root=/tmp/aotc-base
        PYTHONPATH=$root timeout -k 5 150 python3 scripts/gpu_greedy.py export-memory \
            --model llama-1b > "$OUT/export-memory-$tree.txt" 2>&1
        echo "export-memory $tree rc=$?"; tail -n 1 "$OUT/export-memory-$tree.txt"
    done
fi
