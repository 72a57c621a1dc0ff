#!/usr/bin/env bash
# Same-process A/B of decode steps (scripts/gpu_ab_steps.py): each tree under .ab/ (git
# worktrees made on the developer's machine and carried to the GPU host) and this tree export
# the model with their own code, then this tree's runtime loads every artifact and times them
# in alternation.
#
#   git worktree add .ab/base <commit>          # on the developer's machine; carry `.ab`
#   scripts/gpu_ab_steps.sh OUT [--model llama-1b] [--rounds 15]
#
# OUT gets export_<name>.txt per tree and steps.txt. Settings: AB_EXPORT_S (seconds for each
# export, default 120).
set -uo pipefail
OUT=${1:?usage: scripts/gpu_ab_steps.sh OUT [arguments]}
shift
MODEL=llama-1b
[[ ${1:-} == --model ]] && MODEL=$2 && shift 2
mkdir -p "$OUT" /tmp/aotc-ab-art
export PYTHONUNBUFFERED=1
SCRIPT="$PWD/scripts/gpu_ab_steps.py"
arts=()
build() {   # tree name: export with the tree's own aotc importable
    local tree=$1 name=$2 root="/tmp/aotc-ab-$2"
    local pkg="$tree/src/aotc"; [[ -d $pkg ]] || pkg=$tree   # trees before the src/ layout
    mkdir -p "$root" && ln -sfn "$pkg" "$root/aotc"
    (cd "$tree" && PYTHONPATH="$root:$tree" timeout -k 5 "${AB_EXPORT_S:-120}" python3 "$SCRIPT" \
        export "/tmp/aotc-ab-art/$name.aotc" --model "$MODEL" > "$OUT/export_$name.txt" 2>&1)
    echo "$name export rc=$? $(tail -n 1 "$OUT/export_$name.txt")"
    arts+=("/tmp/aotc-ab-art/$name.aotc")
}
for tree in .ab/*/; do
    [[ -d $tree ]] && build "$PWD/${tree%/}" "$(basename "$tree")"
done
build "$PWD" head
mkdir -p /tmp/aotc-ab-head && ln -sfn "$PWD/src/aotc" /tmp/aotc-ab-head/aotc
PYTHONPATH="/tmp/aotc-ab-head:$PWD" python3 "$SCRIPT" time "${arts[@]}" "$@" > "$OUT/steps.txt" 2>&1
echo "time rc=$?"
cat "$OUT/steps.txt" | grep -v Warn | tail -n 12
