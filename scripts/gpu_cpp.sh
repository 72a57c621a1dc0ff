#!/usr/bin/env bash
# The C++ runtime on a GPU (< 10 minutes): builds aotc's C++ runner against the machine's torch,
# runs the GPU tests of the C++ runner on CUDA plans and of the C++ front end on CUDA artifacts,
# then times decoding through each runtime, the per-call cost of both runners on a GPU, and a
# few suite points with the C++ runner (aotc:cpp, the default where installed) against the
# Python runner (aotc:python) in the same run.
#
#   COMMIT=<sha> scripts/gpu_cpp.sh OUT
#
# Settings: TEST_S (seconds for the tests; 0 skips them), TESTS (the test files), DECODE_S
# (seconds for scripts/gpu_cpp_decode.py, decoding through each runtime; 0, the default, skips
# it), OVERHEAD_S, BENCH_S (0 skips), MODELS (suite models for the benchmark, default mlp,gpt2),
# SYSTEMS (default eager,aotc:python,aotc:cpp), DTYPE (default bf16). Run from the repository root.
set -uo pipefail
OUT=${1:?usage: scripts/gpu_cpp.sh OUT}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.used,clocks.sm,clocks.mem --format=csv | tail -n 1
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"
# the runner builds against this torch (16 cores: about a minute), in place; aotc imported from
# this tree through a folder that links it as `aotc` (the GPU host's pip leaves no import hook)
mkdir -p /tmp/aotc-root && ln -sfn "$PWD/src/aotc" /tmp/aotc-root/aotc
export PYTHONPATH=/tmp/aotc-root${PYTHONPATH:+:$PYTHONPATH}
mkdir -p /tmp/aotc-root/bin   # the `aotc` console script the tests run, with this python
printf '#!/bin/sh\nexec %s -m aotc.cli.main "$@"\n' "$(command -v python3)" > /tmp/aotc-root/bin/aotc
chmod +x /tmp/aotc-root/bin/aotc && export PATH=/tmp/aotc-root/bin:$PATH
( time python3 setup.py -q build_ext --inplace ) > "$OUT/build.txt" 2>&1
echo "build rc=$?"; tail -n 5 "$OUT/build.txt"
grep -qa _ZN2at4cuda9CUDAGraph6replayEv src/aotc/runtime/cpp/lib/libaotc_runtime.so \
    && echo "C++ front end: CUDA graphs built" || echo "C++ front end: built without CUDA graphs"
python3 -c "from aotc.runtime.cpp_runner import runner_status as s; print('runner:', s()[1] or 'cpp')"
if [[ ${TEST_S:-240} != 0 ]]; then
    timeout -k 5 "${TEST_S:-240}" python3 -m pytest -q -m gpu -p no:cacheprovider \
        ${TESTS:-tests/test_cpp_runner_triton.py tests/test_cpp_cuda.py tests/test_triton_e2e.py} \
        > "$OUT/tests.txt" 2>&1
    echo "tests rc=$?"; tail -n 15 "$OUT/tests.txt"
fi
if [[ ${DECODE_S:-0} != 0 ]]; then
    timeout -k 5 "$DECODE_S" python3 scripts/gpu_cpp_decode.py --model "${DECODE_MODEL:-llama-1b}" \
        --out "$OUT/decode" > "$OUT/decode.log" 2>&1
    echo "decode rc=$?"; tail -n 8 "$OUT/decode.log"
fi
if [[ ${OVERHEAD_S:-120} != 0 ]]; then
    timeout -k 5 "${OVERHEAD_S:-120}" python3 -m benchmarks.overhead --device cuda \
        --out "$OUT/overhead" > "$OUT/overhead.log" 2>&1
    echo "overhead rc=$?"; tail -n 12 "$OUT/overhead.log"
fi
[[ ${BENCH_S:-200} == 0 ]] && exit 0
timeout -k 10 $((${BENCH_S:-200} + 60)) python3 -m benchmarks.run --device cuda --suite full \
    --dtype "${DTYPE:-bf16}" --models "${MODELS:-mlp,gpt2}" --budget-s "${BENCH_S:-200}" \
    --systems "${SYSTEMS:-eager,aotc:python,aotc:cpp}" --out "$OUT/bench" > "$OUT/bench.log" 2>&1
echo "bench rc=$?"
tail -n 30 "$OUT/bench/results.md" 2>/dev/null || tail -n 30 "$OUT/bench.log"
