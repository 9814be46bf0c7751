#!/usr/bin/env bash
# Runs libFuzzer harnesses, FUZZ_JOBS (default 2) at a time, and prints a summary: per
# harness its result, executions, executions/s and new inputs. Exits non-zero when any
# harness found a crash, a leak, undefined behaviour, a broken invariant or an input that
# takes longer than 1 s (each leaves its input in ARTIFACTS/<name>/).
# Usage: run.sh replay|fuzz BINDIR SEEDS CORPUS ARTIFACTS SECONDS NAME...
#   replay: run every input in SEEDS/<name> once (the checked-in corpus: regressions);
#   fuzz:   fuzz for SECONDS starting from SEEDS/<name> and CORPUS/<name>, writing new
#           inputs to CORPUS/<name> only (SEEDS is read, never written).
# Dictionaries: tests/fuzz/<name>.dict when present.
set -uo pipefail
mode=$1 bindir=$2 seeds=$3 corpus=$4 artifacts=$5 seconds=$6
shift 6
here=$(cd "$(dirname "$0")" && pwd)
jobs=${FUZZ_JOBS:-2}
logs=$artifacts/logs
mkdir -p "$logs"
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

one() {
    local name=$1 bin=$bindir/fuzz_$1 log=$logs/$1.$mode.log
    local art=$artifacts/$1/
    mkdir -p "$art" "$seeds/$1"
    local common=(-timeout=1 -rss_limit_mb=2048 -malloc_limit_mb=1024 -print_final_stats=1
                  -artifact_prefix="$art")
    [ -f "$here/$1.dict" ] && common+=(-dict="$here/$1.dict")
    if [ "$mode" = replay ]; then
        "$bin" "${common[@]}" -runs=0 "$seeds/$1" >"$log" 2>&1
    else
        mkdir -p "$corpus/$1"
        "$bin" "${common[@]}" -max_total_time="$seconds" "$corpus/$1" "$seeds/$1" >"$log" 2>&1
    fi
}

running=0 failed=0
declare -A pids
for name in "$@"; do
    if [ "$running" -ge "$jobs" ]; then wait -n; running=$((running - 1)); fi
    one "$name" &
    pids[$name]=$!
    running=$((running + 1))
done

echo "cirrus: fuzz $mode summary (${seconds}s each in fuzz mode; logs in $logs)"
for name in "$@"; do
    wait "${pids[$name]}"
    rc=$?
    log=$logs/$name.$mode.log
    val() { grep -m1 "^stat::$1:" "$log" | awk '{print $2}'; }
    runs=$(val number_of_executed_units) eps=$(val average_exec_per_sec) new=$(val new_units_added)
    if [ "$rc" -eq 0 ]; then
        printf '  ok   %-10s %10s execs %8s execs/s %5s new inputs\n' "$name" "${runs:-?}" "${eps:-?}" "${new:-0}"
    else
        failed=1
        printf '  FAIL %-10s exit %d; input saved under %s\n' "$name" "$rc" "$artifacts/$name/"
        grep -E 'ERROR: (AddressSanitizer|LeakSanitizer|libFuzzer)|runtime error|fuzz invariant|SUMMARY' "$log" \
            | head -n 6 | sed 's/^/         /'
    fi
done
exit "$failed"
