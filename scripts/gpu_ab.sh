#!/usr/bin/env bash
# Same-run A/B of decode steps on a GPU: scripts/gpu_decode_profile.py (aotc alone) for each
# tree under .ab/ (git worktrees of other commits, or patched copies, made on the developer's
# machine and carried to the GPU host), then for this tree, one after the other in one call.
#
#   git worktree add .ab/base <commit>          # on the developer's machine; carry `.ab`
#   scripts/gpu_ab.sh OUT [extra profile arguments...]
#
# OUT gets profile_<name>.txt per tree and profile_head.txt; the first line of each is the
# step's clean time. Settings: AB_S, the seconds each profile may take (default 140).
set -uo pipefail
OUT=${1:?usage: scripts/gpu_ab.sh OUT [profile arguments]}
shift
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
profile() {   # tree name: run the tree's own profile script with its own aotc importable
    local tree=$1 name=$2 root="/tmp/aotc-ab-$2"
    shift 2
    local pkg="$tree/src/aotc"; [[ -d $pkg ]] || pkg=$tree   # trees before the src/ layout
    mkdir -p "$root" && ln -sfn "$pkg" "$root/aotc"
    (cd "$tree" && PYTHONPATH="$root:$tree" timeout -k 5 "${AB_S:-140}" python3 \
        scripts/gpu_decode_profile.py --systems aotc "$@" > "$OUT/profile_$name.txt" 2>&1)
    echo "$name rc=$? $(grep -m1 '^== ' "$OUT/profile_$name.txt")"
}
for tree in .ab/*/; do
    [[ -d $tree ]] && profile "$PWD/${tree%/}" "$(basename "$tree")" "$@"
done
profile "$PWD" head "$@"
