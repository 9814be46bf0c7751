#!/usr/bin/env bash
# Pods the operator made while its pod watch was down, deleted before its cache ever showed
# them (run by run.sh with KUBECONFIG set and kubectl on PATH; kwok nodes). The operator talks
# to the API server through faultproxy.py, which answers every pod watch with 500 while a file
# exists (LISTs pass: the cache is synced, then frozen). No event can ever say such a pod went:
# a re-list only reports deletions of pods it had cached. The operator must find out by asking
# again (controller.c, UNSEEN_RECHECK_MS): within 30 s, with the pod watch still down,
#   * every pod of the job exists again under its name, with a new uid;
#   * the job's status counts each deleted pod as a preemption, no failure;
# and once the watch is back, the job stays converged. (A fault run, faults_test.sh seed 12,
# once ended with a job never reconciled again: this sequence, found by reading the code.)
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
# shellcheck source=tests/operator/lib.sh
source "$root/tests/operator/lib.sh"
focused_test_begin unseen cirrus-unseen-test

touch "$work/refuse" # the pod watch is down from the start
faultproxy_start --calm --refuse-watches-of /pods --refuse-while "$work/refuse"
test_operator_start "$work/op" "$NS" || fail_fast "operator not leading through the proxy: $(tail -3 "$work/op/operator.log")"

one_region_job un '{}'
check "the job's 3 pods made and Running (the operator's cache never saw them)" poll_until 60 one_region_job_running un
check "the pod watch is refused" grep -q "refused watch .*/pods" "$work/proxy.log"
uids_before=$(kn get pods -l cirrus.dev/job=un -o jsonpath='{range .items[*]}{.metadata.uid}{"\n"}{end}' | sort)
t0=$(date +%s)
kn delete pods -l cirrus.dev/job=un --wait=true --timeout=60s >/dev/null 2>&1 || not_ok "deleting the pods"
back() { # every pod there again, Running, none with an old uid
    local now
    one_region_job_running un || return 1
    now=$(kn get pods -l cirrus.dev/job=un -o jsonpath='{range .items[*]}{.metadata.uid}{"\n"}{end}' | sort)
    [[ -z "$(comm -12 <(echo "$uids_before") <(echo "$now"))" ]]
}
counted() { [[ "$(kn get sj un -o jsonpath='{.status.regions[0].preemptions}/{.status.regions[0].failures}')" == "3/0" ]]; }
if poll_until 30 back; then
    ok "the pods deleted unseen are made again within 30 s ($(($(date +%s) - t0)) s), the pod watch still down"
else not_ok "the pods deleted unseen are made again within 30 s, the pod watch still down"; fi
check "and counted: 3 preemptions, no failure" poll_until 30 counted
check "the pod watch was down throughout" test -e "$work/refuse"
rm -f "$work/refuse"
sleep 3
settled() { one_region_job_running un && counted; }
check "with the watch back, still 3 Running pods and 3/0" settled
check "operator still running" kill -0 "$op_pid"
finish
