#!/usr/bin/env bash
# One bounded GPU call (< 10 minutes) for a decode-kernel change: the GPU tests of the decode
# graph, the fused greedy step and PDL, then a same-process A/B of every tree under .ab/ against
# this one (scripts/gpu_ab_steps.sh).
#
#   git worktree add .ab/base <commit>      # on the developer's machine; carry `.ab`
#   scripts/gpu_session_prologue.sh OUT
#
# Settings: TESTS (pytest files; "" skips), AB_MODEL, ROUNDS, AB_S (the A/B's seconds), AB_ARGS
# (more arguments of `gpu_ab_steps.py time`: --greedy, --vocab N).
set -uo pipefail
OUT=${1:?usage: scripts/gpu_session_prologue.sh OUT}
mkdir -p "$OUT" /tmp/aotc-root/bin
ln -sfn "$PWD/src/aotc" /tmp/aotc-root/aotc
printf '#!/bin/sh\nexec %s -m aotc.cli.main "$@"\n' "$(command -v python3)" > /tmp/aotc-root/bin/aotc
chmod +x /tmp/aotc-root/bin/aotc && export PATH=/tmp/aotc-root/bin:$PATH
nvidia-smi --query-gpu=name,memory.used,clocks.sm,clocks.mem --format=csv | tail -n 1
TESTS=${TESTS-tests/test_greedy_graph.py tests/test_cuda_graph.py tests/test_pdl.py}
if [[ -n $TESTS ]]; then
    PYTHONPATH=/tmp/aotc-root:$PWD/tests timeout -k 5 200 python3 -m pytest -q \
        -p no:cacheprovider $TESTS > "$OUT/tests.txt" 2>&1
    echo "tests rc=$?"; tail -n 3 "$OUT/tests.txt"
fi
AB_EXPORT_S=100 timeout -k 5 "${AB_S:-380}" bash scripts/gpu_ab_steps.sh "$OUT/ab" \
    --model "${AB_MODEL:-llama-1b}" --rounds "${ROUNDS:-12}" ${AB_ARGS:-}
