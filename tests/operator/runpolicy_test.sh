#!/usr/bin/env bash
# runPolicy.ttlSecondsAfterFinished against the real control plane (run by run.sh with
# KUBECONFIG set and kubectl on PATH). The operator runs as its own ServiceAccount (the RBAC
# in manifests/ really applies), watching only this test's namespace:
#   * a job whose clients all finished (Succeeded) with ttlSecondsAfterFinished 2 is deleted
#     by the operator about 2 s after its completionTime, and its children with it; the
#     operator's log has no refusal (403) for it;
#   * a job that Failed (activeDeadlineSeconds 1) with ttlSecondsAfterFinished 2: deleted too;
#   * a finished job with ttlSecondsAfterFinished 3600 is kept, and so is one without a TTL.
# Last line: "runpolicy: N passed, N failed"; exits non-zero if anything failed.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
# shellcheck source=tests/operator/lib.sh
source "$root/tests/operator/lib.sh"
focused_test_begin runpolicy cirrus-runpolicy-test
test_operator_start "$work" "$NS" || fail_fast "operator not leading: $(tail -3 "$work/operator.log")"

# The client's program ended with exit 0: what the kubelet reports then.
client_done() {
    kn patch pod "$1-r1-c0" --subresource=status --type=merge -p '{"status":{"phase":"Succeeded","containerStatuses":[{"name":"trainer","image":"cirrus:latest","imageID":"","ready":false,"restartCount":0,"state":{"terminated":{"exitCode":0,"reason":"Completed"}}}]}}' >/dev/null
}
phase() { kn get sj "$1" -o jsonpath='{.status.phase}' 2>/dev/null; }
job_gone() { ! kn get sj "$1" >/dev/null 2>&1; }
children_gone() { [[ -z "$(kn get pods,svc,secret -l "cirrus.dev/job=$1" -o name 2>/dev/null)" ]]; }

one_region_job done-ttl '{ttlSecondsAfterFinished: 2}'
one_region_job done-keep '{ttlSecondsAfterFinished: 3600}'
one_region_job done-no-ttl '{}'
one_region_job late-ttl '{activeDeadlineSeconds: 1, ttlSecondsAfterFinished: 2}'
for j in done-ttl done-keep done-no-ttl; do
    poll_until 60 one_region_job_running $j || fail_fast "$j: pods not running"
    client_done $j
done
check "done-ttl: Succeeded once its client finished" poll_until 30 job_phase_is done-ttl Succeeded
completed=$(kn get sj done-ttl -o jsonpath='{.status.completionTime}')
if poll_until 20 job_gone done-ttl; then
    # completionTime has whole seconds: the deletion comes 2 to 3 s after it, plus polling.
    age=$(($(date -u +%s) - $(date -u -d "$completed" +%s)))
    if ((age >= 2 && age <= 6)); then ok "done-ttl: deleted by the operator ${age} s after its completionTime (ttlSecondsAfterFinished 2)"; else not_ok "done-ttl: deleted ${age} s after its completionTime '$completed' (want 2..6)"; fi
else
    not_ok "done-ttl: not deleted 20 s after it Succeeded (ttlSecondsAfterFinished 2)"
fi
check "done-ttl: its children garbage-collected" poll_until 60 children_gone done-ttl
check "late-ttl: Failed (activeDeadlineSeconds 1), then deleted after its TTL" poll_until 40 job_gone late-ttl
check_not "no request refused (403) in the operator's log" grep -q "403\|forbidden" "$work/operator.log"
check "done-keep (ttl 3600): Succeeded" job_phase_is done-keep Succeeded
check "done-keep: kept" kn get sj done-keep
check "done-no-ttl: Succeeded and kept" job_phase_is done-no-ttl Succeeded

test_operator_stop
rc=$?
expect_eq "operator exits 0 on SIGTERM" 0 "$rc"
finish
