#!/usr/bin/env bash
# Several GPU jobs in one bounded device session: one queue of jobs per GPU, run side by side.
#
#   scripts/gpu_queues.sh OUT QUEUE_FILE [QUEUE_FILE ...]
#
# QUEUE_FILE k runs on GPU k-1 (CUDA_VISIBLE_DEVICES), its jobs one after another. A job is one
# line `NAME LIMIT_S COMMAND...`: COMMAND runs with bash from the repository root under a
# timeout of LIMIT_S seconds, with $JOB set to OUT/NAME (a folder for its files) and its output
# in OUT/NAME.txt; a job that fails or times out is reported and the queue goes on. At the end
# the last lines of every log are printed and OUT is packed into OUT.tgz (the device tool
# returns few files). Lines starting with # are skipped. The repository is made importable as
# `aotc` through a symlink; it need not be installed.
set -uo pipefail
OUT=${1:?usage: scripts/gpu_queues.sh OUT QUEUE_FILE [QUEUE_FILE ...]}
shift
mkdir -p "$OUT" /tmp/aotc-root
ln -sfn "$PWD/src/aotc" /tmp/aotc-root/aotc
export PYTHONPATH=/tmp/aotc-root:$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1

queue() {   # queue GPU FILE
    local gpu=$1 name limit cmd t0 rc
    while read -r name limit cmd; do
        [[ -z $name || $name == \#* ]] && continue
        mkdir -p "$OUT/$name"
        t0=$SECONDS
        CUDA_VISIBLE_DEVICES=$gpu JOB="$OUT/$name" timeout -k 10 "$limit" bash -c "$cmd" < /dev/null \
            > "$OUT/$name.txt" 2>&1
        rc=$?
        echo "gpu$gpu $name rc=$rc $((SECONDS - t0))s" | tee -a "$OUT/jobs.txt"
    done < "$2"
}

gpu=0
for file in "$@"; do
    queue "$gpu" "$file" &
    gpu=$((gpu + 1))
done
wait
for log in "$OUT"/*.txt; do
    echo "== $log"; tail -n 25 "$log"
done
tar -czf "$OUT.tgz" -C "$(dirname "$OUT")" "$(basename "$OUT")"
