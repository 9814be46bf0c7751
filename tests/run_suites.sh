#!/usr/bin/env bash
# Runs the test suites (make targets) one after another, each to the end even when an
# earlier one failed, keeping every suite's output in LOGDIR/<target>.log. Ends with a
# summary: each suite's result and time, and for a failed one the lines that name its
# failures, so the end of a long run says what broke. Exits non-zero if any suite failed.
# Usage: run_suites.sh LOGDIR MAKE TARGET...
set -uo pipefail
logdir=$1 make=$2
shift 2
mkdir -p "$logdir"
results=() failed=0
for target in "$@"; do
    start=$SECONDS
    "$make" --no-print-directory "$target" 2>&1 | tee "$logdir/$target.log"
    rc=${PIPESTATUS[0]}
    took=$((SECONDS - start))
    if [ "$rc" -eq 0 ]; then
        results+=("ok   $target (${took} s)")
    else
        results+=("FAIL $target (${took} s, exit $rc; full output in $logdir/$target.log)")
        failed=1
    fi
done
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
