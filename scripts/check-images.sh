#!/usr/bin/env bash
# check-images.sh — does `ext4kit get` read every fixture image exactly?
#
# Builds the workspace in release mode, generates the fixture matrix
# (ext4kit-fixtures: the source tree plus one image per mke2fs layout, and
# kernel.img when running as root), then for every image runs
#     ext4kit get IMAGE / DEST
#     ext4kit-treecmp SRC DEST --ignore-lost-found [flags for that image]
# and prints a PASS/FAIL table. Exits 0 only if every image passes.
#
# Usage: scripts/check-images.sh [--small] [--reuse] [--keep] [OUTDIR]
#   --small   2,000-entry big directory and no 5 GiB sparse file (fast)
#   --reuse   keep OUTDIR's fixtures if built by this version with the same
#             options (the full matrix takes minutes: mke2fs -d is slow on
#             a 50,000-entry directory)
#   --keep    keep the extracted trees of passing images too
#   OUTDIR    where fixtures and extractions go
#             (default: target/fixtures, or target/fixtures-small)
set -uo pipefail

usage() { sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; }

small=""
reuse=""
keep=0
outdir=""
for arg in "$@"; do
    case "$arg" in
        --small) small="--small" ;;
        --reuse) reuse="--reuse" ;;
        --keep) keep=1 ;;
        -h|--help) usage; exit 0 ;;
        -*) echo "check-images.sh: unknown option $arg" >&2; usage >&2; exit 2 ;;
        *)
            if [[ -n "$outdir" ]]; then echo "check-images.sh: one OUTDIR only" >&2; exit 2; fi
            outdir="$arg" ;;
    esac
done

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
target="${CARGO_TARGET_DIR:-$root/target}"
if [[ -z "$outdir" ]]; then
    outdir="$target/fixtures${small:+-small}"
fi
mkdir -p "$outdir" && outdir="$(cd "$outdir" && pwd)"

echo "== building the workspace (release)"
if ! (cd "$root" && cargo build --release --workspace); then
    echo "check-images.sh: workspace build failed; building the test kit alone so fixtures still get made" >&2
    (cd "$root" && cargo build --release -p ext4kit-testkit) || exit 2
fi
ext4kit="$target/release/ext4kit"
treecmp="$target/release/ext4kit-treecmp"
fixtures="$target/release/ext4kit-fixtures"

echo "== generating fixtures in $outdir"
"$fixtures" "$outdir" $small $reuse || { echo "check-images.sh: fixture generation failed" >&2; exit 2; }

extra_flags=()
if [[ $(id -u) -ne 0 ]]; then
    echo "NOTE: not root: ext4kit get cannot restore owners; comparing without them (--no-owners)"
    extra_flags+=(--no-owners)
fi

# Make trees with read-only directories deletable.
rm_tree() { [[ -e "$1" ]] || return 0; chmod -R u+rwx "$1" 2>/dev/null; rm -rf "$1"; }

extract="$outdir/extract"
mkdir -p "$extract"
results=()
failed=0
total=0
while IFS=$'\t' read -r name img mountable flags desc; do
    [[ -z "$name" ]] && continue
    total=$((total + 1))
    dest="$extract/$name"
    log="$extract/$name.log"
    rm_tree "$dest"
    verdict=PASS
    detail=""
    start=$(date +%s%N)
    if [[ ! -x "$ext4kit" ]]; then
        verdict=FAIL
        detail="no $ext4kit binary (did the cli crate build?)"
    elif ! "$ext4kit" get "$outdir/$img" / "$dest" >"$log" 2>&1; then
        verdict=FAIL
        detail="ext4kit get failed: $(grep -v '^\s*$' "$log" | tail -n 1)"
    else
        # shellcheck disable=SC2086 # flags are several words on purpose
        if "$treecmp" "$outdir/src" "$dest" $flags "${extra_flags[@]}" >>"$log" 2>&1; then
            detail="$(tail -n 1 "$log")"
        else
            verdict=FAIL
            detail="$(tail -n 1 "$log"), first: $(grep -m1 '^/' "$log")"
        fi
    fi
    ms=$((($(date +%s%N) - start) / 1000000))
    secs="$((ms / 1000)).$(((ms % 1000) / 100))"
    [[ "$verdict" == FAIL ]] && failed=$((failed + 1))
    if [[ "$verdict" == PASS && $keep -eq 0 ]]; then rm_tree "$dest"; fi
    results+=("$(printf '%-24s %-7s %7ss  %s' "$name" "$verdict" "$secs" "$detail")")
    echo "${results[-1]}"
done <"$outdir/fixtures.tsv"

echo
echo "== results ($outdir; logs in $extract/NAME.log)"
printf '%-24s %-7s %8s  %s\n' image verdict time detail
printf '%s\n' "${results[@]}"
echo
echo "$((total - failed)) passed, $failed failed"
[[ $failed -eq 0 ]]
