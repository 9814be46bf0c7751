#!/usr/bin/env bash
# spec.managedBy against the real control plane (run by run.sh with KUBECONFIG set and kubectl
# on PATH), the operator running as its own ServiceAccount, watching only this namespace:
#   * a job managed by another controller (kueue.x-k8s.io/multikueue) gets no Secret, Service
#     or Pod and no status from Cirrus, while a job beside it applied after it does (so the
#     operator did look);
#   * managedBy "cirrus.dev/swarmjob-controller" is the operator's own: that job runs;
#   * managedBy is immutable: changed, added or removed, the API server refuses the update.
# Last line: "managedby: N passed, N failed"; exits non-zero if anything failed.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
# shellcheck source=tests/operator/lib.sh
source "$root/tests/operator/lib.sh"
focused_test_begin managedby cirrus-managedby-test
test_operator_start "$work" "$NS" || fail_fast "operator not leading: $(tail -3 "$work/operator.log")"

job() { # NAME [MANAGED_BY]
    kn apply -f - >/dev/null <<EOF
apiVersion: cirrus.dev/v1alpha1
kind: SwarmJob
metadata: {name: $1}
spec:
  image: cirrus:latest
  ${2:+managedBy: $2}
  regions: [{name: r1, peers: {replicas: 1, min: 1}, clients: 1}]
EOF
}
children() { kn get pods,services,secrets -l "cirrus.dev/job=$1" -o name 2>/dev/null | wc -l; }

check "a job managed by kueue.x-k8s.io/multikueue is accepted" job elsewhere kueue.x-k8s.io/multikueue
check "a job managed by cirrus.dev/swarmjob-controller is accepted" job ours cirrus.dev/swarmjob-controller
check "a job without managedBy is accepted" job plain
check "ours: its 3 pods run" poll_until 60 one_region_job_running ours
check "plain: its 3 pods run" poll_until 60 one_region_job_running plain
expect_eq "elsewhere: nothing made for it" 0 "$(children elsewhere)"
expect_eq "elsewhere: no status written" "" "$(kn get sj elsewhere -o jsonpath='{.status}')"

refused() { # WHAT PATCH: the API server refuses the merge patch, saying managedBy is immutable
    local out
    if out=$(kn patch sj "$2" --type merge -p "$3" 2>&1); then
        not_ok "$1: accepted"
    else
        check "$1: refused (managedBy is immutable)" grep -q "managedBy is immutable" <<<"$out"
    fi
}
refused "changing managedBy" elsewhere '{"spec":{"managedBy":"cirrus.dev/swarmjob-controller"}}'
refused "removing managedBy" elsewhere '{"spec":{"managedBy":null}}'
refused "adding managedBy" plain '{"spec":{"managedBy":"kueue.x-k8s.io/multikueue"}}'
if out=$(job bad "not a domain path" 2>&1); then
    not_ok "managedBy 'not a domain path' accepted"
else
    ok "managedBy 'not a domain path' refused by the schema"
fi
expect_eq "elsewhere: still nothing made" 0 "$(children elsewhere)"

test_operator_stop
rc=$?
expect_eq "operator exits 0 on SIGTERM" 0 "$rc"
finish
