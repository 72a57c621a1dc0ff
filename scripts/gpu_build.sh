# Sourced by the GPU drivers (gpu_checks.sh, gpu_suite.sh) with $OUT set: puts this tree's aotc
# on PYTHONPATH and an `aotc` command on PATH, and builds the C++ runner against the machine's
# torch (incremental: a second driver in the same call finds it built), logging to
# $OUT/build.txt and printing which runner loads.
mkdir -p /tmp/aotc-root/bin && ln -sfn "$PWD/src/aotc" /tmp/aotc-root/aotc
export PYTHONPATH=/tmp/aotc-root:$PWD${PYTHONPATH:+:$PYTHONPATH}
printf '#!/bin/sh\nexec %s -m aotc.cli.main "$@"\n' "$(command -v python3)" > /tmp/aotc-root/bin/aotc
chmod +x /tmp/aotc-root/bin/aotc && export PATH=/tmp/aotc-root/bin:$PATH
( time python3 setup.py -q build_ext --inplace ) > "$OUT/build.txt" 2>&1
echo "build rc=$? $(python3 -c 'from aotc.runtime.cpp_runner import runner_status as s; print("runner:", s()[1] or "cpp")')"
