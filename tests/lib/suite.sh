# shellcheck shell=bash disable=SC2034  # tmp, pids, pass, fail are the sourcing script's
# What the shell test suites share; source it at the top of one. A temporary directory
# ($tmp), removed at exit with every process the script started and listed in pids; ok NAME
# and bad NAME print a result line and count it (pass, fail). The script ends with its own
# summary line and `[ "$fail" -eq 0 ]`.
tmp=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done; wait 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
pass=0 fail=0
ok() { echo "ok   $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1"; fail=$((fail + 1)); }
