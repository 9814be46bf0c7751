#!/usr/bin/env bash
# The SwarmJob's scale subresource against the real control plane (run by run.sh with
# KUBECONFIG set and kubectl on PATH; the pods run on kwok nodes). The operator runs as its
# own ServiceAccount, watching only this test's namespace, on a two-region job of 2 stages:
#   * `kubectl scale --replicas 3` sets spec.peersPerStage: every stage of both regions gets a
#     third peer, the gateways are not replaced, and the scale subresource reports 3 replicas
#     and the peer pods' selector;
#   * a scale beyond a region's peers.max is refused by the API server, naming the rule;
#   * scaled down to 1, each stage keeps its peer 0 and the others are deleted, not counted
#     as preemptions;
#   * a HorizontalPodAutoscaler (the controller-manager's, through the scale subresource)
#     with minReplicas 2 brings the job back to 2 peers per stage.
# Last line: "scale: N passed, N failed"; exits non-zero if anything failed.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
# shellcheck source=tests/operator/lib.sh
source "$root/tests/operator/lib.sh"
focused_test_begin scale cirrus-scale-test
test_operator_start "$work" "$NS" || fail_fast "operator not leading: $(tail -3 "$work/operator.log")"

kn apply -f - >/dev/null <<EOF || fail_fast "the job was refused"
apiVersion: cirrus.dev/v1alpha1
kind: SwarmJob
metadata: {name: sc}
spec:
  image: cirrus:latest
  pipeline: {stages: 2}
  peersPerStage: 2
  regions:
    - {name: r1, peers: {replicas: 1, min: 1, max: 4}, clients: 1}
    - {name: r2, peers: {replicas: 1, min: 1}, clients: 1}
EOF
peers() { kn get pods -l cirrus.dev/job=sc,cirrus.dev/role=peer -o name 2>/dev/null | wc -l; }
peers_are() { [[ $(peers) == "$1" ]]; }
scale_status() { kn get sj sc --subresource=scale -o jsonpath='{.spec.replicas} {.status.replicas} {.status.selector}' 2>/dev/null; }
scale_status_is() { [[ "$(scale_status)" == "$1" ]]; }
uid_of() { kn get pod "$1" -o jsonpath='{.metadata.uid}' 2>/dev/null; }

check "peersPerStage 2 over both regions' replicas 1: 8 peer pods" poll_until 60 peers_are 8
check "scale subresource: spec 2, status 2, the peer selector" \
    poll_until 30 scale_status_is "2 2 cirrus.dev/job=sc,cirrus.dev/role=peer"
gw1=$(uid_of sc-r1-gw) gw2=$(uid_of sc-r2-gw) p0=$(uid_of sc-r2-s1-0)

# ---- kubectl scale up -------------------------------------------------------------------------
check "kubectl scale --replicas 3" kn scale sj sc --replicas 3
check "12 peer pods (3 per stage, both regions)" poll_until 60 peers_are 12
check "the new ones are the third of each stage" kn get pod sc-r1-s0-2 sc-r1-s1-2 sc-r2-s0-2 sc-r2-s1-2
check "scale status 3 once they exist" poll_until 30 scale_status_is "3 3 cirrus.dev/job=sc,cirrus.dev/role=peer"
expect_eq "gateways and existing peers not replaced" "$gw1 $gw2 $p0" \
    "$(uid_of sc-r1-gw) $(uid_of sc-r2-gw) $(uid_of sc-r2-s1-0)"

# ---- beyond a region's max: refused -------------------------------------------------------------
if out=$(kn scale sj sc --replicas 5 2>&1); then
    not_ok "scale to 5 over r1's peers.max 4 was accepted"
else
    check "scale to 5 refused, naming the bound" grep -q "peersPerStage must lie within every region's peers.min..peers.max" <<<"$out"
fi

# ---- scale down ---------------------------------------------------------------------------------
check "kubectl scale --replicas 1" kn scale sj sc --replicas 1
check "4 peer pods left" poll_until 60 peers_are 4
check "each stage keeps its peer 0" kn get pod sc-r1-s0-0 sc-r1-s1-0 sc-r2-s0-0 sc-r2-s1-0
check "scale status 1" poll_until 30 scale_status_is "1 1 cirrus.dev/job=sc,cirrus.dev/role=peer"
expect_eq "scaled-down peers are not preemptions" "0 0" \
    "$(kn get sj sc -o jsonpath='{.status.regions[0].preemptions} {.status.regions[1].preemptions}')"

# ---- a HorizontalPodAutoscaler drives it --------------------------------------------------------
# With no metrics server the autoscaler cannot measure utilisation, but below minReplicas it
# scales up without measuring: it reads and writes the job's scale subresource like any other.
kn apply -f - >/dev/null <<EOF || fail_fast "the HorizontalPodAutoscaler was refused"
apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata: {name: sc}
spec:
  scaleTargetRef: {apiVersion: cirrus.dev/v1alpha1, kind: SwarmJob, name: sc}
  minReplicas: 2
  maxReplicas: 4
  metrics:
    - type: Resource
      resource: {name: cpu, target: {type: Utilization, averageUtilization: 80}}
EOF
hpa_set() { [[ "$(kn get sj sc -o jsonpath='{.spec.peersPerStage}')" == 2 ]]; }
hpa_current() { [[ "$(kn get hpa sc -o jsonpath='{.status.currentReplicas}')" == 2 ]]; }
# The autoscaler's sync period is 15 s.
check "the autoscaler set peersPerStage to its minReplicas 2" poll_until 90 hpa_set
check "8 peer pods again" poll_until 60 peers_are 8
check "the autoscaler reads the job's scale (status.currentReplicas 2)" poll_until 60 hpa_current

test_operator_stop
rc=$?
expect_eq "operator exits 0 on SIGTERM" 0 "$rc"
finish
