#!/usr/bin/env bash
# A SwarmJob's pods in a namespace that enforces the `restricted` Pod Security Standard
# (label pod-security.kubernetes.io/enforce=restricted; the API server's PodSecurity
# admission refuses any pod that does not meet it), against the real control plane (run by
# run.sh with KUBECONFIG set and kubectl on PATH). The operator runs as its own
# ServiceAccount, watching only this test's namespace:
#   * the sample SwarmJob's 12 pods are admitted and run, with no PodSecurity warning;
#   * each runs as non-root with RuntimeDefault seccomp, no privilege escalation, no
#     capabilities, and without the namespace's ServiceAccount token mounted;
#   * a pod the operator builds passes a server-side dry run in the restricted namespace
#     (the admission's own verdict, whatever the operator's log says).
# Last line: "podsecurity: N passed, N failed"; exits non-zero if anything failed.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
# shellcheck source=tests/operator/lib.sh
source "$root/tests/operator/lib.sh"
JOB=tiny-bible
focused_test_begin podsecurity cirrus-pss-test
kubectl label namespace "$NS" pod-security.kubernetes.io/enforce=restricted \
    pod-security.kubernetes.io/enforce-version=latest >/dev/null || fail_fast "label $NS"
# The label is enforced: a plain pod (root allowed, no seccomp) is refused.
check_not "the namespace refuses a pod that is not restricted" \
    kn run plain --image=cirrus:latest --restart=Never --dry-run=server
test_operator_start "$work" "$NS" || fail_fast "operator not leading: $(tail -3 "$work/operator.log")"

kn apply -f "$root/manifests/samples/swarmjob.yaml" >/dev/null || fail_fast "apply the sample"
all_running() { [[ $(kn get pods -l cirrus.dev/job=$JOB --field-selector status.phase=Running -o name | wc -l) == 12 ]]; }
if poll_until 60 all_running; then
    ok "the sample's 12 pods admitted and running under enforce=restricted"
else
    not_ok "$(kn get pods -l cirrus.dev/job=$JOB -o name | wc -l) of 12 pods made; refused: $(grep -o 'violates PodSecurity.\{0,160\}' "$work/operator.log" | head -1)"
fi
check_not "no PodSecurity refusal in the operator's log" grep -q "violates PodSecurity" "$work/operator.log"
pods=$(kn get pods -l cirrus.dev/job=$JOB -o json)
each() { # JQ-PREDICATE on every pod: how many pods satisfy it
    jq "[.items[] | select($1)] | length" <<<"$pods"
}
expect_eq "pods that run as non-root with RuntimeDefault seccomp" 12 \
    "$(each '.spec.securityContext.runAsNonRoot == true and .spec.securityContext.seccompProfile.type == "RuntimeDefault"')"
expect_eq "pods whose container forbids privilege escalation and drops ALL capabilities" 12 \
    "$(each '.spec.containers | all(.securityContext.allowPrivilegeEscalation == false and .securityContext.capabilities.drop == ["ALL"])')"
expect_eq "pods without a ServiceAccount token" 12 \
    "$(each '.spec.automountServiceAccountToken == false and ([.spec.volumes[]?.projected.sources[]?.serviceAccountToken] | length) == 0')"
# The admission's verdict on one of them, created afresh under another name.
kn get pod "$JOB-r1-s0-0" -o json |
    jq '{apiVersion, kind, metadata: {name: "pss-probe", labels: {probe: "1"}}, spec: (.spec | del(.nodeName))}' >"$work/probe.json"
check "a pod as the operator builds it passes a server-side dry run" kn create --dry-run=server -f "$work/probe.json"

test_operator_stop
rc=$?
expect_eq "operator exits 0 on SIGTERM" 0 "$rc"
finish
