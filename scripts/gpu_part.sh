# Sourced by the GPU drivers (gpu_checks.sh, gpu_suite.sh): `part NAME SECONDS COMMAND...` runs
# one bounded step with its log at $OUT/NAME.log, then prints its exit status and the log's
# last $TAIL lines (12 unless set); SECONDS 0 skips the step.
part() {
    local name=$1 secs=$2
    shift 2
    [[ $secs == 0 ]] && return 0
    timeout -k 10 "$secs" "$@" > "$OUT/$name.log" 2>&1
    echo "== $name rc=$?"; tail -n "${TAIL:-12}" "$OUT/$name.log"
}
