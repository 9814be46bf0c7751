#!/usr/bin/env bash
# Line coverage of one harness's target files: runs the coverage build of the harness over
# its checked-in corpus (and the cache of `make fuzz`, when there is one) and prints
# llvm-cov's report for those files.
# Usage: coverage.sh NAME COVDIR SEEDS CACHE LLVM_PROFDATA LLVM_COV TARGET_FILE...
set -euo pipefail
name=$1 covdir=$2 seeds=$3 cache=$4 profdata=$5 cov=$6
shift 6
dirs=("$seeds/$name")
[ -d "$cache/$name" ] && dirs+=("$cache/$name")
mkdir -p "$covdir/prof"
raw=$covdir/prof/$name.profraw prof=$covdir/prof/$name.profdata
rm -f "$raw"
LLVM_PROFILE_FILE=$raw "$covdir/bin/fuzz_$name" -runs=0 -timeout=5 "${dirs[@]}" >"$covdir/prof/$name.log" 2>&1 ||
    { echo "cirrus: fuzz_$name failed on its corpus (see $covdir/prof/$name.log)" >&2; exit 1; }
"$profdata" merge -sparse "$raw" -o "$prof"
inputs=$(find "${dirs[@]}" -type f | wc -l)
echo "cirrus: fuzz_$name: line coverage over $inputs corpus inputs"
"$cov" report "$covdir/bin/fuzz_$name" -instr-profile="$prof" "$@" | sed 's/^/  /'
