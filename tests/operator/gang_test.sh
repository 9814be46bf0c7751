#!/usr/bin/env bash
# spec.gangScheduling against the real control plane: kube-scheduler with its GangScheduling
# plugin (tests/cluster/cluster.sh turns the feature gates on) and kwok nodes of 32 CPUs, two
# in region r1 (run by run.sh with KUBECONFIG set and kubectl on PATH). The operator runs as
# its ServiceAccount (the RBAC in manifests/ really applies). One region r1: 2 stages of
# peers.replicas 3, peers.min 2, each peer asking for 20 CPUs (one fits a node); one client.
#   * the operator makes PodGroup gang-r1, owned by the job, with gang minCount 6 (the
#     gateway, 2 stages x peers.min 2, the client), and every pod of the region names it;
#   * only 2 peers fit r1's two nodes, fewer than the 4 the gang needs: none of the region's
#     pods is bound, not even the gateway and the client, which would fit anywhere;
#   * two nodes added to r1: the gang stands, and the gateway, the client and 4 peers are
#     bound together; the 2 peers past peers.min stay Pending for want of room (a gang is the
#     minimum, not the maximum);
#   * peers.min 1: the PodGroup's policy is immutable and it stays while a pod names it:
#     it is deleted (a PodGroupResized Event says so) and waits for the region's pods; the
#     job suspended (every pod gone, and with them the old PodGroup) and resumed, it is
#     made again with minCount 4 (the gateway, 2 x 1 peers, the client);
#   * a job without gangScheduling makes no PodGroup and its pods name none.
# Last line: "gang: N passed, N failed"; exits non-zero if anything failed.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
# shellcheck source=tests/operator/lib.sh
source "$root/tests/operator/lib.sh"
focused_test_begin gang cirrus-gang-test
extra_nodes=(cirrus-r1-gang-$$-0 cirrus-r1-gang-$$-1)
gang_cleanup() {
    kubectl delete node "${extra_nodes[@]}" --ignore-not-found --wait=false >/dev/null 2>&1
    focused_cleanup
}
trap gang_cleanup EXIT
test_operator_start "$work" "$NS" || fail_fast "operator not leading: $(tail -3 "$work/operator.log")"

# gang_job NAME GANG: the region above; GANG true or false.
gang_job() {
    job_apply "$1" <<EOF
  gangScheduling: $2
  pipeline: {stages: 2}
  regions:
    - name: r1
      peers: {replicas: 3, min: 2}
      clients: 1
      resources: {peer: {requests: {cpu: "20"}}}
EOF
}
pods_of() { kn get pods -l "cirrus.dev/job=$1" -o name 2>/dev/null | wc -l; }
all_made() { [[ "$(pods_of "$1")" -eq 8 ]]; }
# bound JOB [ROLE]: how many of its pods (of that role) have a node.
bound() {
    kn get pods -l "cirrus.dev/job=$1${2:+,cirrus.dev/role=$2}" \
        -o jsonpath='{range .items[*]}{.spec.nodeName}{"\n"}{end}' 2>/dev/null | grep -c .
}
min_count() { kn get podgroup "$1" -o jsonpath='{.spec.schedulingPolicy.gang.minCount}' 2>/dev/null; }

gang_job gang true
check "PodGroup gang-r1 made" poll_until 30 kn get podgroup gang-r1
expect_eq "gang-r1: gang minCount (gateway + 2 stages x peers.min 2 + client)" 6 "$(min_count gang-r1)"
expect_eq "gang-r1: owned by the job" "SwarmJob gang" \
    "$(kn get podgroup gang-r1 -o jsonpath='{.metadata.ownerReferences[0].kind} {.metadata.ownerReferences[0].name}')"
poll_until 30 all_made gang || fail_fast "the job's 8 pods were not made: $(pods_of gang)"
expect_eq "every pod of the region names the PodGroup" "gang-r1 x8" \
    "$(kn get pods -l cirrus.dev/job=gang -o jsonpath='{range .items[*]}{.spec.schedulingGroup.podGroupName}{"\n"}{end}' | sort | uniq -c | awk '{print $2 " x" $1}')"
# The scheduler has had every pod for a while: the two peers that fit and the gateway and
# client wait at its Permit stage for the rest of the gang, unbound.
sleep 8
expect_eq "only 2 of the 4 peers the gang needs fit: no pod bound" 0 "$(bound gang)"

for n in "${extra_nodes[@]}"; do
    "$root/tests/cluster/cluster.sh" fake-node "$n" r1 spot | kubectl apply -f - >/dev/null
done
six_bound() { [[ "$(bound gang)" == 6 ]]; }
check "two nodes more: the gang stands (6 pods bound)" poll_until 60 six_bound
expect_eq "bound: the gateway, the client and 4 peers" "1 1 4" \
    "$(bound gang gateway) $(bound gang client) $(bound gang peer)"
sleep 3
expect_eq "the 2 peers past peers.min still wait for room (the gang is the minimum)" 6 "$(bound gang)"

kn patch sj gang --type=json -p '[{"op":"replace","path":"/spec/regions/0/peers/min","value":1}]' >/dev/null
resized() { kn get events --field-selector reason=PodGroupResized -o name | grep -q .; }
check "peers.min 1: a PodGroupResized Event" poll_until 30 resized
expect_eq "... the old PodGroup waits for the pods that name it" "6 deleting" \
    "$(min_count gang-r1) $(kn get podgroup gang-r1 -o jsonpath='{.metadata.deletionTimestamp}' | sed 's/.\+/deleting/')"
kn patch sj gang --type=merge -p '{"spec":{"suspend":true}}' >/dev/null
group_gone() { ! kn get podgroup gang-r1 >/dev/null 2>&1; }
check "suspended: the pods and with them the old PodGroup gone" poll_until 60 group_gone
kn patch sj gang --type=merge -p '{"spec":{"suspend":false}}' >/dev/null
min4() { [[ "$(min_count gang-r1)" == 4 ]]; }
check "resumed: the PodGroup made again with minCount 4" poll_until 30 min4
check "... and the region bound again (6 pods)" poll_until 60 six_bound

gang_job plain false
poll_until 30 all_made plain || fail_fast "job plain's pods were not made: $(pods_of plain) of 8"
expect_eq "without gangScheduling: no PodGroup" "" "$(kn get podgroup plain-r1 -o name 2>/dev/null)"
expect_eq "... and its pods name none" "" \
    "$(kn get pods -l cirrus.dev/job=plain -o jsonpath='{.items[*].spec.schedulingGroup}')"

test_operator_stop
rc=$?
expect_eq "operator exits 0 on SIGTERM" 0 "$rc"
finish
