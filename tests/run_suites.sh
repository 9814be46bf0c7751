#!/usr/bin/env bash
# Runs the test suites (make targets) one after another, each to the end even when an
# earlier one failed, keeping every suite's output in LOGDIR/<target>.log. Ends with a
# summary: each suite's result and time, and for a failed one the lines that name its
# failures, so the end of a long run says what broke. Exits non-zero if any suite failed.
# A group TARGET+TARGET... runs its suites at the same time. &TARGET starts TARGET in the
# background at its place and lets the next groups start at once; it is waited for (and its
# result recorded) at the end: for builds that later suites would otherwise wait on.
# Usage: run_suites.sh LOGDIR MAKE TARGET|TARGET+TARGET...|&TARGET...
set -uo pipefail
logdir=$1 make=$2
shift 2
mkdir -p "$logdir"
results=() failed=0 bg_targets=() bg_pids=()
record() { # TARGET RC SECONDS
    if [ "$2" -eq 0 ]; then
        results+=("ok   $1 ($3 s)")
    else
        results+=("FAIL $1 ($3 s, exit $2; full output in $logdir/$1.log)")
        failed=1
    fi
}
collect() { # TARGET PID: wait for a background or side-by-side suite, print and record it
    wait "$2"
    cat "$logdir/$1.log"
    record "$1" "$(cat "$logdir/$1.rc")" "$(cat "$logdir/$1.secs")"
    rm -f "$logdir/$1.rc" "$logdir/$1.secs"
}
for group in "$@"; do
    start=$SECONDS
    if [[ "$group" == '&'* ]]; then
        target=${group#&}
        echo "cirrus: $target runs in the background (its output follows at the end)"
        ( "$make" --no-print-directory "$target" >"$logdir/$target.log" 2>&1
          echo $? >"$logdir/$target.rc"; echo $((SECONDS - start)) >"$logdir/$target.secs" ) &
        bg_targets+=("$target") bg_pids+=($!)
        continue
    fi
    if [[ "$group" != *+* ]]; then
        "$make" --no-print-directory "$group" 2>&1 | tee "$logdir/$group.log"
        record "$group" "${PIPESTATUS[0]}" $((SECONDS - start))
        continue
    fi
    # A+B: suites that mostly wait (on a shaped link, on fuzzing's fixed time, on pods) run side
    # by side; each one's output is printed whole when it ends.
    IFS=+ read -ra targets <<<"$group"
    pids=()
    for target in "${targets[@]}"; do
        echo "cirrus: $target runs beside ${group//+/, } (its output follows when it ends)"
        ( "$make" --no-print-directory "$target" >"$logdir/$target.log" 2>&1
          echo $? >"$logdir/$target.rc"; echo $((SECONDS - start)) >"$logdir/$target.secs" ) &
        pids+=($!)
    done
    for i in "${!targets[@]}"; do collect "${targets[$i]}" "${pids[$i]}"; done
done
for i in "${!bg_targets[@]}"; do collect "${bg_targets[$i]}" "${bg_pids[$i]}"; done
echo
echo "cirrus: test summary"
for r in "${results[@]}"; do
    echo "  $r"
    case $r in
    FAIL*)
        target=${r#FAIL }
        target=${target%% *}
        grep -E '^ *(FAIL|not ok)|Segmentation fault|AddressSanitizer|runtime error|Assertion|Error [0-9]' \
            "$logdir/$target.log" | grep -v '^make' | head -n 20 | sed 's/^ */      /'
        ;;
    esac
done
exit "$failed"
