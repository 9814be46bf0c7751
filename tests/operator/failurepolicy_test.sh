#!/usr/bin/env bash
# runPolicy.podFailurePolicy against the real control plane (run by run.sh with KUBECONFIG set
# and kubectl on PATH; issue 13, defect 2: a crash by signal counted as a preemption, so a
# crash loop ran forever). kwok runs no containers: a pod's end is what its status says, set
# here through the API as a kubelet would. The operator runs as its own ServiceAccount,
# watching only this test's namespace:
#   * a job without a podFailurePolicy reads back with the CRD's default rules (visible);
#   * with the defaults, a crash loop ends: a stage peer that exits 139 (SIGSEGV), 134
#     (SIGABRT) and then with no exit code at all counts three failures, and with
#     backoffLimit 2 the job is Failed (BackoffLimitExceeded) and its pods stopped;
#   * with the defaults, only proof is a preemption: exit 143 with the DisruptionTarget
#     condition, and the reason Evicted without an exit code, count as preemptions and
#     never toward backoffLimit;
#   * a FailJob rule (exit 132, SIGILL: the image's instructions are not the node's CPU's)
#     fails the job at once: Failed, reason PodFailurePolicy, naming the pod and the rule;
#     an Ignore rule of the user's (exit 42 In) replaces without counting a failure;
#   * the CRD refuses malformed rules with the Job API's messages: two matchers in a rule,
#     0 with operator In, an unknown action, a containerName that is not the pods' one.
# Last line: "failurepolicy: N passed, N failed"; exits non-zero if anything failed.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
# shellcheck source=tests/operator/lib.sh
source "$root/tests/operator/lib.sh"
focused_test_begin failurepolicy cirrus-failpolicy-test
test_operator_start "$work" "$NS" || fail_fast "operator not leading: $(tail -3 "$work/operator.log")"

uid() { kn get pod "$1" -o jsonpath='{.metadata.uid}' 2>/dev/null; }
running_anew() { # POD OLD_UID: a replacement of POD (another uid) is Running
    local u
    u=$(uid "$1")
    [[ -n "$u" && "$u" != "$2" && "$(kn get pod "$1" -o jsonpath='{.status.phase}')" == Running ]]
}
# end POD EXIT REASON CONDITION: the pod's end as the kubelet reports it: phase Failed, the
# trainer container terminated with EXIT ("-" for no container record), status.reason REASON
# and a True condition of type CONDITION ("-" for none of either).
end() {
    local cs='[]' extra=''
    [[ "$2" != - ]] && cs="[{\"name\":\"trainer\",\"image\":\"cirrus:latest\",\"imageID\":\"\",\"ready\":false,\"restartCount\":0,\"state\":{\"terminated\":{\"exitCode\":$2,\"reason\":\"Error\"}}}]"
    [[ "$3" != - ]] && extra+=",\"reason\":\"$3\""
    [[ "$4" != - ]] && extra+=",\"conditions\":[{\"type\":\"$4\",\"status\":\"True\",\"reason\":\"PreemptionByScheduler\"}]"
    kn patch pod "$1" --subresource=status --type=merge -p "{\"status\":{\"phase\":\"Failed\",\"containerStatuses\":$cs$extra}}" >/dev/null
}
# end_and_replaced POD EXIT REASON CONDITION: end it, then wait for its replacement to run.
end_and_replaced() {
    local u
    u=$(uid "$1")
    end "$@"
    poll_until 30 running_anew "$1" "$u"
}
counts() { kn get sj "$1" -o jsonpath='{.status.regions[0].preemptions} {.status.regions[0].failures}'; }
counts_are() { [[ "$(counts "$1")" == "$2" ]]; }
failed_cond() { kn get sj "$1" -o jsonpath='{.status.conditions[?(@.type=="Failed")].reason}|{.status.conditions[?(@.type=="Failed")].message}'; }

one_region_job crash '{backoffLimit: 2}'
one_region_job proof '{backoffLimit: 0}'
one_region_job sigill '{podFailurePolicy: {rules: [
    {action: FailJob, onExitCodes: {containerName: trainer, operator: In, values: [132]}},
    {action: Ignore, onExitCodes: {operator: In, values: [42]}},
    {action: Ignore, onPodConditions: [{type: DisruptionTarget}]}]}}'
for j in crash proof sigill; do poll_until 60 one_region_job_running $j || fail_fast "$j: pods not running"; done

# ---- the defaults, visible --------------------------------------------------------------------
expect_eq "defaults: rule 0 Ignores the DisruptionTarget condition (status True)" "Ignore DisruptionTarget True" \
    "$(kn get sj crash -o jsonpath='{.spec.runPolicy.podFailurePolicy.rules[0].action} {.spec.runPolicy.podFailurePolicy.rules[0].onPodConditions[0].type} {.spec.runPolicy.podFailurePolicy.rules[0].onPodConditions[0].status}')"
expect_eq "defaults: rule 1 Ignores the nodes' reasons" "Ignore Evicted" \
    "$(kn get sj crash -o jsonpath='{.spec.runPolicy.podFailurePolicy.rules[1].action} {.spec.runPolicy.podFailurePolicy.rules[1].onPodReasons[0]}')"
expect_eq "a user's rules replace the defaults; a pattern's status defaults to True" "FailJob Ignore Ignore True" \
    "$(kn get sj sigill -o jsonpath='{.spec.runPolicy.podFailurePolicy.rules[*].action} {.spec.runPolicy.podFailurePolicy.rules[2].onPodConditions[0].status}')"

# ---- a crash loop ends at backoffLimit --------------------------------------------------------
end_and_replaced crash-r1-s0-0 139 - - || not_ok "crash: exit 139 not replaced"
check "exit 139 (SIGSEGV) counts as a failure, not a preemption" poll_until 10 counts_are crash "0 1"
end_and_replaced crash-r1-s0-0 134 - - || not_ok "crash: exit 134 not replaced"
check "exit 134 (SIGABRT) counts as a failure" poll_until 10 counts_are crash "0 2"
check "two failures, backoffLimit 2: still Running" job_phase_is crash Running
end crash-r1-s0-0 - - -
check "no exit code at all counts as a failure too" poll_until 10 counts_are crash "0 3"
check "the third failure (backoffLimit 2): the crash loop ends, the job Failed" poll_until 20 job_phase_is crash Failed
expect_eq "crash: Failed reason" "BackoffLimitExceeded" "$(failed_cond crash | cut -d'|' -f1)"
no_running() { [[ -z "$(kn get pods -l cirrus.dev/job=crash --field-selector status.phase=Running -o name)" ]]; }
check "crash: its running pods stopped" poll_until 30 no_running

# ---- only proof is a preemption ---------------------------------------------------------------
end_and_replaced proof-r1-s0-0 143 - DisruptionTarget || not_ok "proof: preempted pod not replaced"
check "exit 143 with DisruptionTarget True: a preemption" poll_until 10 counts_are proof "1 0"
end_and_replaced proof-r1-gw - Evicted - || not_ok "proof: evicted gateway not replaced"
check "reason Evicted, no exit code: a preemption" poll_until 10 counts_are proof "2 0"
check "two preemptions with backoffLimit 0: still Running" job_phase_is proof Running
preempted_events() { kn get events --field-selector involvedObject.name=proof,reason=PodPreempted -o jsonpath='{.items[*].message}'; }
check "a PodPreempted Event names the rule that decided" poll_until 10 eval '[[ "$(preempted_events)" == *"runPolicy.podFailurePolicy.rules[0]: Ignore"* ]]'

# ---- the user's rules: Ignore, FailJob --------------------------------------------------------
end_and_replaced sigill-r1-s0-0 42 - - || not_ok "sigill: exit 42 not replaced"
check "exit 42 matched the user's Ignore rule: a preemption" poll_until 10 counts_are sigill "1 0"
end sigill-r1-c0 132 - -
check "exit 132 matched FailJob: the job Failed at once (backoffLimit 6)" poll_until 20 job_phase_is sigill Failed
cond=$(failed_cond sigill)
expect_eq "sigill: Failed reason" "PodFailurePolicy" "${cond%%|*}"
if [[ "$cond" == *"pod sigill-r1-c0 failed (exit 132): runPolicy.podFailurePolicy.rules[0]: FailJob"* ]]; then
    ok "sigill: the Failed message names the pod, its exit and the rule"
else
    not_ok "sigill: Failed message: '$cond'"
fi
expect_eq "sigill: the FailJob pod counted as a failure" "1 1" "$(counts sigill)"
# The verdict outlives the operator that made it (a new leader reads it from the status).
test_operator_stop
test_operator_start "$work" "$NS" || not_ok "operator not leading again"
sleep 3
expect_eq "after an operator restart: still PodFailurePolicy" "PodFailurePolicy" "$(failed_cond sigill | cut -d'|' -f1)"

# ---- the CRD refuses malformed rules ----------------------------------------------------------
refuse() { # WHAT MESSAGE_FRAGMENT RULES
    local out
    if out=$(kn apply --dry-run=server -f - 2>&1 <<EOF
apiVersion: cirrus.dev/v1alpha1
kind: SwarmJob
metadata: {name: bad}
spec:
  image: cirrus:latest
  regions: [{name: r1, clients: 1}]
  runPolicy: {podFailurePolicy: {rules: [$3]}}
EOF
    ); then
        not_ok "$1: accepted"
    elif [[ "$out" == *"$2"* ]]; then
        ok "$1: refused ($2)"
    else
        not_ok "$1: refused, but not saying '$2': $out"
    fi
}
refuse "two matchers in one rule" "exactly one of onExitCodes, onPodConditions, onPodReasons" \
    '{action: Ignore, onPodReasons: [Evicted], onExitCodes: {operator: In, values: [1]}}'
refuse "no matcher" "exactly one of onExitCodes, onPodConditions, onPodReasons" '{action: Count}'
refuse "0 with operator In" "value 0 cannot be used with operator In" \
    '{action: Count, onExitCodes: {operator: In, values: [0, 1]}}'
refuse "an unknown action" 'Unsupported value: "Retry"' '{action: Retry, onPodReasons: [Evicted]}'
refuse "another container's name" 'Unsupported value: "sidecar"' \
    '{action: Count, onExitCodes: {containerName: sidecar, operator: In, values: [1]}}'
refuse "a duplicate exit code" "Duplicate value" '{action: Count, onExitCodes: {operator: NotIn, values: [1, 1]}}'
refuse "an exit code over 255" "should be less than or equal to 255" '{action: Count, onExitCodes: {operator: In, values: [256]}}'

test_operator_stop
rc=$?
expect_eq "operator exits 0 on SIGTERM" 0 "$rc"
finish
