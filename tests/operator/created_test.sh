#!/usr/bin/env bash
# What the cluster refuses shows in the SwarmJob's Created condition, with the reason and the
# API server's (or the operator's) own words, against the real control plane (run by run.sh
# with KUBECONFIG set and kubectl on PATH). The operator runs as its own ServiceAccount,
# watching only this test's namespace:
#   * a spec that passes the CRD's rules but makes a pod name over 63 characters (a 35-letter
#     job name, a 24-letter region): Created False, InvalidSpec, naming the pod and the limit;
#   * pods refused by admission (a ResourceQuota of 0 pods: 403 Forbidden, exceeded quota):
#     Created False, PodCreateFailed, with the API server's message; once the quota is gone
#     the pods are made and Created turns True (ObjectsCreated).
# Last line: "created: N passed, N failed"; exits non-zero if anything failed.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
# shellcheck source=tests/operator/lib.sh
source "$root/tests/operator/lib.sh"
focused_test_begin created cirrus-created-test
test_operator_start "$work" "$NS" || fail_fast "operator not leading: $(tail -3 "$work/operator.log")"

job() { # NAME REGION
    kn apply -f - >/dev/null <<EOF
apiVersion: cirrus.dev/v1alpha1
kind: SwarmJob
metadata: {name: $1}
spec:
  image: cirrus:latest
  pipeline: {stages: 2}
  regions: [{name: $2, peers: {replicas: 1, min: 1}, clients: 1}]
EOF
}
created() { # JOB: "STATUS REASON|MESSAGE" of its Created condition
    kn get sj "$1" -o jsonpath='{.status.conditions[?(@.type=="Created")].status} {.status.conditions[?(@.type=="Created")].reason}|{.status.conditions[?(@.type=="Created")].message}' 2>/dev/null
}
created_is() { [[ "$(created "$1")" == "$2 $3|"* ]]; }

# ---- a pod name over 63 characters -------------------------------------------------------------
long=abcdefghij-abcdefghij-abcdefghij-ab  # 35: the CRD's limit for metadata.name
region=region-abcdefghij-abcdef           # 24: the CRD's limit for a region's name
job "$long" "$region" || fail_fast "the CRD refused the long names (it should admit them)"
if poll_until 20 created_is "$long" False InvalidSpec; then
    ok "long names: Created False (InvalidSpec)"
else
    not_ok "long names: Created is '$(created "$long")', want False InvalidSpec"
fi
msg=$(created "$long")
check "the message names the pod and the 63-character limit" \
    grep -q "object name '$long-$region-s[0-9]-[0-9]' is 65 characters, more than 63" <<<"$msg"
expect_eq "no pod made for it" 0 "$(kn get pods -l "cirrus.dev/job=$long" -o name | wc -l)"

# ---- pods refused by admission -------------------------------------------------------------------
kn create quota no-pods --hard=pods=0 >/dev/null || fail_fast "create the quota"
quota_ready() { [[ "$(kn get quota no-pods -o jsonpath='{.status.hard.pods}')" == 0 ]]; }
poll_until 30 quota_ready || fail_fast "the quota's status was not filled in"
job quota r1
if poll_until 20 created_is quota False PodCreateFailed; then
    ok "quota: Created False (PodCreateFailed)"
else
    not_ok "quota: Created is '$(created quota)', want False PodCreateFailed"
fi
check "with the API server's message (exceeded quota)" grep -q "forbidden: exceeded quota: no-pods" <<<"$(created quota)"
kn delete quota no-pods >/dev/null
made() { [[ $(kn get pods -l cirrus.dev/job=quota -o name | wc -l) == 4 ]]; }
# The refused creates are retried with backoff: a few seconds.
check "quota removed: the 4 pods made" poll_until 60 made
if poll_until 20 created_is quota True ObjectsCreated; then
    ok "then Created True (ObjectsCreated)"
else
    not_ok "after the quota: Created is '$(created quota)', want True ObjectsCreated"
fi

test_operator_stop
rc=$?
expect_eq "operator exits 0 on SIGTERM" 0 "$rc"
finish
