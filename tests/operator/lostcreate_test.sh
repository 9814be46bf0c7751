#!/usr/bin/env bash
# A pod whose create answer the operator never got, deleted before the operator looked again
# (run by run.sh with KUBECONFIG set and kubectl on PATH; kwok nodes). The operator talks to
# the API server through faultproxy.py, calm but for one answer: the first pod create is
# made by the API server and its answer held past the operator's 30 s timeout, so the
# operator remembers that pod as "perhaps made", its uid unknown. Meanwhile the test deletes
# that pod. The pod watch was up throughout: it showed the pod come and go. Then
#   * the job's status counts that deletion as a preemption (1/0), no failure;
#   * every pod of the job runs again, the deleted one under its name with a new uid.
# (A fault run, faults_test.sh FAULTS_SEED=387118728, counted 13 for 14: a create answered
# late, its pod deleted while the answer was held, was taken for one never made.)
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
# shellcheck source=tests/operator/lib.sh
source "$root/tests/operator/lib.sh"
focused_test_begin lostcreate cirrus-lostcreate-test

faultproxy_start --calm --delay-first '^PATCH /api/v1/namespaces/[^/]+/pods/[^/?]+[?]'
test_operator_start "$work/op" "$NS" || fail_fast "operator not leading through the proxy: $(tail -3 "$work/op/operator.log")"

one_region_job lc '{}'
held_pod() { sed -n 's#.*fault delayed: PATCH /api/v1/namespaces/[^/]*/pods/\([^/?]*\)?.*#\1#p' "$work/proxy.log" | head -1; }
some_held() { [[ -n "$(held_pod)" ]]; }
poll_until 30 some_held || fail_fast "no pod create was held: $(tail -3 "$work/proxy.log")"
pod=$(held_pod)
pod_running() { [[ "$(kn get pod "$pod" -o jsonpath='{.status.phase}' 2>/dev/null)" == Running ]]; }
check "pod $pod made and Running while its create answer is held" poll_until 20 pod_running
uid=$(kn get pod "$pod" -o jsonpath='{.metadata.uid}')
t0=$(date +%s)
gave_up() { grep -q "pods/$pod?.*timed out" "$work/op/operator.log"; }
if kn delete pod "$pod" --wait=false >/dev/null 2>&1 && ! gave_up; then
    ok "deleted $pod (uid $uid) while its create answer was still held"
else not_ok "deleting $pod while its create answer was still held"; fi
check "the operator gave up on that create (its loop waited out the timeout)" poll_until 40 gave_up
back() { one_region_job_running lc && [[ -n "$(kn get pod "$pod" -o jsonpath='{.metadata.uid}' 2>/dev/null)" &&
    "$(kn get pod "$pod" -o jsonpath='{.metadata.uid}')" != "$uid" ]]; }
counted() { [[ "$(kn get sj lc -o jsonpath='{.status.regions[0].preemptions}/{.status.regions[0].failures}')" == "1/0" ]]; }
check "the job's 3 pods Running again, $pod under a new uid" poll_until 60 back
if poll_until 30 counted; then ok "its deletion counted: 1 preemption, no failure ($(($(date +%s) - t0)) s after it)"
else not_ok "its deletion counted: expected 1/0, got $(kn get sj lc -o jsonpath='{.status.regions[0].preemptions}/{.status.regions[0].failures}')"; fi
sleep 3
check "and no more: still 1/0" counted
check "operator still running" kill -0 "$op_pid"
finish
