#!/usr/bin/env bash
# runPolicy.ttlSecondsAfterFinished against the real control plane (run by run.sh with
# KUBECONFIG set and kubectl on PATH). The operator runs as its own ServiceAccount (the RBAC
# in manifests/ really applies), watching only this test's namespace:
#   * a job whose clients all finished (Succeeded) with ttlSecondsAfterFinished 15 is deleted
#     by the operator about 15 s after its completionTime, and its children with it; the
#     operator's log has no refusal (403) for it;
#   * a job that Failed (activeDeadlineSeconds 1) with ttlSecondsAfterFinished 2: deleted too;
#   * a finished job with ttlSecondsAfterFinished 3600 is kept, and so is one without a TTL;
#   * successPolicy, two regions: All (the default) is not Succeeded while region r2's
#     client trains, and is once it finished too; Any is Succeeded as soon as region r1's
#     client finished, says so in its Succeeded condition, and stops region r2's pods while
#     keeping r1's finished client.
# Last line: "runpolicy: N passed, N failed"; exits non-zero if anything failed.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
# shellcheck source=tests/operator/lib.sh
source "$root/tests/operator/lib.sh"
focused_test_begin runpolicy cirrus-runpolicy-test
test_operator_start "$work" "$NS" || fail_fast "operator not leading: $(tail -3 "$work/operator.log")"

# The client's program ended with exit 0: what the kubelet reports then. REGION: r1 unless
# given.
client_done() {
    kn patch pod "$1-${2:-r1}-c0" --subresource=status --type=merge -p '{"status":{"phase":"Succeeded","containerStatuses":[{"name":"trainer","image":"cirrus:latest","imageID":"","ready":false,"restartCount":0,"state":{"terminated":{"exitCode":0,"reason":"Completed"}}}]}}' >/dev/null
}
phase() { kn get sj "$1" -o jsonpath='{.status.phase}' 2>/dev/null; }
job_gone() { ! kn get sj "$1" >/dev/null 2>&1; }
children_gone() { [[ -z "$(kn get pods,svc,secret -l "cirrus.dev/job=$1" -o name 2>/dev/null)" ]]; }

one_region_job done-ttl '{ttlSecondsAfterFinished: 15}'
one_region_job done-keep '{ttlSecondsAfterFinished: 3600}'
one_region_job done-no-ttl '{}'
one_region_job late-ttl '{activeDeadlineSeconds: 1, ttlSecondsAfterFinished: 2}'
# two_region_job NAME SUCCESS_POLICY: regions r1 and r2, one peer and one client each.
two_region_job() {
    job_apply "$1" <<EOF
  regions: [{name: r1, peers: {replicas: 1, min: 1}, clients: 1}, {name: r2, peers: {replicas: 1, min: 1}, clients: 1}]
  successPolicy: $2
EOF
}
two_region_job_running() {
    [[ $(kn get pods -l "cirrus.dev/job=$1" --field-selector status.phase=Running -o name | wc -l) == 6 ]]
}
two_region_job sp-all '{}'
two_region_job sp-any '{operator: Any}'
for j in done-ttl done-keep done-no-ttl; do
    poll_until 60 one_region_job_running $j || fail_fast "$j: pods not running"
    client_done $j
done
for j in sp-all sp-any; do
    poll_until 60 two_region_job_running $j || fail_fast "$j: pods not running"
    client_done $j r1
done
# Its phase and completionTime read together. (With 15 s to live, not 2: the other jobs'
# clients are finished first, which on a loaded machine outlasted 2 s.)
ttl_done() {
    local got
    got=$(kn get sj done-ttl -o jsonpath='{.status.phase} {.status.completionTime}' 2>/dev/null)
    [[ "$got" == "Succeeded "?* ]] && echo "${got#Succeeded }" >"$work/done-ttl.completed"
}
check "done-ttl: Succeeded once its client finished" poll_until 30 ttl_done
completed=$(cat "$work/done-ttl.completed" 2>/dev/null)
if poll_until 40 job_gone done-ttl; then
    # completionTime has whole seconds: the deletion comes 15 to 16 s after it, plus polling.
    age=$(($(date -u +%s) - $(date -u -d "$completed" +%s)))
    if ((age >= 15 && age <= 19)); then ok "done-ttl: deleted by the operator ${age} s after its completionTime (ttlSecondsAfterFinished 15)"; else not_ok "done-ttl: deleted ${age} s after its completionTime '$completed' (want 15..19)"; fi
else
    not_ok "done-ttl: not deleted 40 s after it Succeeded (ttlSecondsAfterFinished 15)"
fi
check "done-ttl: its children garbage-collected" poll_until 60 children_gone done-ttl
check "late-ttl: Failed (activeDeadlineSeconds 1), then deleted after its TTL" poll_until 40 job_gone late-ttl
check_not "no request refused (403) in the operator's log" grep -q "403\|forbidden" "$work/operator.log"
check "done-keep (ttl 3600): Succeeded" job_phase_is done-keep Succeeded
check "done-keep: kept" kn get sj done-keep
check "done-no-ttl: Succeeded and kept" job_phase_is done-no-ttl Succeeded

check "sp-any (successPolicy Any): Succeeded once region r1's client finished" \
    poll_until 30 job_phase_is sp-any Succeeded
expect_eq "sp-any: its Succeeded condition names the region" \
    "every client of region r1 finished its steps (successPolicy Any)" \
    "$(kn get sj sp-any -o jsonpath='{.status.conditions[?(@.type=="Succeeded")].message}')"
r2_pods_gone() { [[ -z "$(kn get pods -l cirrus.dev/job=sp-any,cirrus.dev/region=r2 -o name 2>/dev/null)" ]]; }
check "sp-any: region r2's pods (gateway, peer, client still training) stopped" poll_until 30 r2_pods_gone
expect_eq "sp-any: region r1's finished client kept" Succeeded \
    "$(kn get pod sp-any-r1-c0 -o jsonpath='{.status.phase}' 2>/dev/null)"
# All: region r2 still trains. Its r1 client finished seconds ago, at the time sp-any's did,
# which the operator has since judged and acted on: with 3 s more, so has it sp-all's.
sleep 3
expect_eq "sp-all (successPolicy All): not Succeeded while region r2's client trains" "" \
    "$(phase sp-all | grep Succeeded)"
client_done sp-all r2
check "sp-all: Succeeded once region r2's client finished too" poll_until 30 job_phase_is sp-all Succeeded
expect_eq "sp-all: its Succeeded condition" "every client finished its steps" \
    "$(kn get sj sp-all -o jsonpath='{.status.conditions[?(@.type=="Succeeded")].message}')"

test_operator_stop
rc=$?
expect_eq "operator exits 0 on SIGTERM" 0 "$rc"
finish
