#!/usr/bin/env bash
# cirrus-operator against the real control plane (run by run.sh with KUBECONFIG set and
# kubectl on PATH). The operator runs as its own ServiceAccount (a token bound by the RBAC in
# manifests/), with leader election, from build/bin/cirrus-operator:
#   * the sample SwarmJob: every pod, Service and the Secret created with owners, labels,
#     placement and arguments; the certificates verify against the job CA and name their
#     region; status, conditions, printer columns, events and /metrics filled;
#   * a deleted peer pod is replaced in place within 2 s, the other pods untouched, counted as
#     a preemption; a pod whose program fails (exit 1) counts as a failure, one ended with
#     the DisruptionTarget condition (proof, runPolicy.podFailurePolicy's default rule) as a
#     preemption; past runPolicy.backoffLimit the job is Failed, and so it is once
#     runPolicy.activeDeadlineSeconds has passed (failurepolicy_test.sh tests the rules);
#   * a deleted node's pods come back on another node of the same region within 20 s;
#   * the operator killed (SIGKILL) mid-reconcile and restarted converges with no duplicate
#     and no needlessly replaced pod; a pod deleted while the operator is frozen and
#     kube-apiserver restarts (so its watches resume into 410 Gone): it re-lists, replaces
#     the pod, and goes on;
#   * the job deleted: every child garbage-collected.
# OPERATOR_VALGRIND=1 instead runs the operator under valgrind through the sample, a
# replacement (its time limit relaxed to 30 s) and a clean shutdown, and fails on any invalid
# access or leak; CIRRUS_OPERATOR names a binary valgrind can run (no -march=native). Last line: "operator: N passed, N failed"; exits non-zero if anything failed.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
# shellcheck source=tests/operator/lib.sh
source "$root/tests/operator/lib.sh"
here=$root/tests/operator
bin=${CIRRUS_OPERATOR:-$root/build/bin/cirrus-operator}
sample=$root/manifests/samples/swarmjob.yaml
cluster=$root/tests/cluster/cluster.sh
# Its own namespace each run: an earlier run's may still be terminating.
NS=cirrus-op-test-$$
JOB=tiny-bible
work=$(mktemp -d)
k() { kubectl "$@"; }
kn() { kubectl -n "$NS" "$@"; }
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }'; }
# wait_until TIMEOUT_S COMMAND...: poll every 50 ms
wait_until() {
    local deadline=$(($(date +%s) + $1)); shift
    until "$@" >/dev/null 2>&1; do
        (($(date +%s) < deadline)) || return 1
        sleep 0.05
    done
}
op_pid=
op_log=$work/operator.log
start_operator() {
    local -a cmd=("$bin" --kubeconfig "$work/kubeconfig" --leader-elect --lease-namespace cirrus-system --metrics-port 0)
    if [[ "${OPERATOR_VALGRIND:-0}" == 1 ]]; then
        cmd=(valgrind --quiet --leak-check=full --show-leak-kinds=definite,indirect --errors-for-leak-kinds=definite,indirect --error-exitcode=99 --log-file="$work/valgrind.%p" "${cmd[@]}")
    fi
    "${cmd[@]}" >>"$op_log" 2>&1 &
    op_pid=$!
}
stop_operator() { # SIGNAL; returns the operator's exit status
    [[ -n "$op_pid" ]] || return 0
    kill "-$1" "$op_pid" 2>/dev/null
    local rc=0
    wait "$op_pid" || rc=$?
    op_pid=
    return $rc
}
cleanup() {
    [[ -n "$op_pid" ]] && kill -KILL "$op_pid" 2>/dev/null
    k delete namespace "$NS" --ignore-not-found --wait=false >/dev/null 2>&1
    k delete node cirrus-r1-spot-extra --ignore-not-found >/dev/null 2>&1
    # Give back the node the node-loss test deleted: later tests (and runs) expect it.
    [[ -s "$work/node.json" ]] && k apply -f "$work/node.json" >/dev/null 2>&1
    rm -rf "$work"
}
trap cleanup EXIT
finish() {
    if ((fail)); then
        echo "--- operator log (last 60 lines)"
        tail -60 "$op_log"
        echo "--- pods"
        kn get pods -o wide --no-headers 2>&1 | head -60
    fi
    checks_summary operator
    exit
}
fail_fast() { not_ok "$*"; finish; }

[[ -x "$bin" ]] || fail_fast "$bin is missing (make all)"
why=$(operator_install_and_kubeconfig "$work/kubeconfig") || fail_fast "$why"
k create namespace "$NS" >/dev/null || fail_fast "namespace $NS"
start_operator
wait_until 60 grep -q "caches synced" "$op_log" || fail_fast "operator did not sync its caches"
wait_until 30 grep -q "acquired the lease" "$op_log" || fail_fast "operator did not acquire the lease"
ok "operator started as its ServiceAccount, acquired the lease, synced"

# ---- the sample ------------------------------------------------------------------------------
kn apply -f "$sample" >/dev/null || fail_fast "apply the sample"
all_running() { [[ $(kn get pods -l cirrus.dev/job=$JOB --field-selector status.phase=Running -o name | wc -l) == 12 ]]; }
t0=$(now)
if wait_until 60 all_running; then ok "12 pods running $(elapsed "$t0") s after apply"; else not_ok "pods not all running"; fi
phase_is() { [[ $(kn get sj $JOB -o jsonpath='{.status.phase}') == "$1" ]]; }
wait_until 30 phase_is Running
expect_eq "phase" Running "$(kn get sj $JOB -o jsonpath='{.status.phase}')"
uid=$(kn get sj $JOB -o jsonpath='{.metadata.uid}')
expect_eq "pods: gateway, 2 stages x 2 peers, client per region" \
    "tiny-bible-r1-c0 tiny-bible-r1-gw tiny-bible-r1-s0-0 tiny-bible-r1-s0-1 tiny-bible-r1-s1-0 tiny-bible-r1-s1-1 tiny-bible-r2-c0 tiny-bible-r2-gw tiny-bible-r2-s0-0 tiny-bible-r2-s0-1 tiny-bible-r2-s1-0 tiny-bible-r2-s1-1" \
    "$(kn get pods -l cirrus.dev/job=$JOB -o jsonpath='{.items[*].metadata.name}')"
expect_eq "every pod owned by the job (controller, blockOwnerDeletion)" "12" \
    "$(kn get pods -l cirrus.dev/job=$JOB -o json | jq "[.items[] | select(.metadata.ownerReferences[0] | .uid == \"$uid\" and .controller and .blockOwnerDeletion and .kind == \"SwarmJob\")] | length")"
expect_eq "labels of a peer" "tiny-bible r1 peer 1" \
    "$(kn get pod tiny-bible-r1-s1-0 -o jsonpath='{.metadata.labels.cirrus\.dev/job} {.metadata.labels.cirrus\.dev/region} {.metadata.labels.cirrus\.dev/role} {.metadata.labels.cirrus\.dev/stage}')"
expect_eq "r1's pods on r1's spot nodes" "cirrus-r1-spot-0" \
    "$(kn get pods -l cirrus.dev/region=r1 -o jsonpath='{.items[*].spec.nodeName}' | tr ' ' '\n' | sort -u | tr '\n' ' ' | sed 's/ $//')"
expect_eq "r2's pods on r2's spot nodes" "cirrus-r2-spot-0" \
    "$(kn get pods -l cirrus.dev/region=r2 -o jsonpath='{.items[*].spec.nodeSelector.cirrus\.dev/pool}' | tr ' ' '\n' | sort -u | sed 's/spot/cirrus-r2-spot-0/')"
expect_eq "placement: region label and the spot toleration" "r1 cirrus.dev/spot" \
    "$(kn get pod tiny-bible-r1-s0-0 -o jsonpath='{.spec.nodeSelector.topology\.kubernetes\.io/region} {.spec.tolerations[?(@.key=="cirrus.dev/spot")].key}')"
args=$(kn get pod tiny-bible-r1-s1-0 -o jsonpath='{.spec.containers[0].args[*]}')
check "stage 1 peer serves layers 2:4 and registers with its region's gateway" \
    grep -q -- "--serve 2:4 .*--coordinator tiny-bible-r1-gw.$NS.svc:7400" <<<"$args"
check "pods run cirrus-trainer with the job's uid as job id" grep -q -- "--job $uid" <<<"$args"
expect_eq "gateway Services" "tiny-bible-r1-gw tiny-bible-r2-gw" \
    "$(kn get svc -l cirrus.dev/job=$JOB -o jsonpath='{.items[*].metadata.name}')"
# Two regions: the gateways take outer steps together over their WAN port.
gw_args=$(kn get pod tiny-bible-r2-gw -o jsonpath='{.spec.containers[0].args[*]}')
check "r2's gateway: outer steps every 100, every region's gateway Service on the WAN port, the job's certificates" \
    grep -q -- "--model tiny --sync-every 100 --region r2 --regions r1=tiny-bible-r1-gw.$NS.svc:7443,r2=tiny-bible-r2-gw.$NS.svc:7443 --wan-listen 0.0.0.0:7443 --tls-dir /etc/cirrus/tls --codec q8 --fragments 1 --outer-lr 0.7 --outer-momentum 0.9" <<<"$gw_args"
expect_eq "r2's gateway Service ports" "coord:7400:coord http:7480:http wan:7443:wan" \
    "$(kn get svc tiny-bible-r2-gw -o jsonpath='{range .spec.ports[*]}{.name}:{.port}:{.targetPort} {end}' | sed 's/ $//')"
expect_eq "r2's gateway container ports" "coord:7400 http:7480 wan:7443" \
    "$(kn get pod tiny-bible-r2-gw -o jsonpath='{range .spec.containers[0].ports[*]}{.name}:{.containerPort} {end}' | sed 's/ $//')"
check "r1's client takes the outer steps (--sync-every 100)" \
    grep -q -- "--sync-every 100" <<<"$(kn get pod tiny-bible-r1-c0 -o jsonpath='{.spec.containers[0].args[*]}')"
# Certificates: the job CA signs each region's gateway certificate, which names its Service.
for f in ca.crt r1.crt r1.key r2.crt; do
    kn get secret $JOB-pki -o jsonpath="{.data.${f//./\\.}}" | base64 -d >"$work/$f"
done
check "r1's certificate verifies against the job CA" openssl verify -CAfile "$work/ca.crt" "$work/r1.crt"
check "r1's certificate is valid for tiny-bible-r1-gw.$NS.svc" \
    openssl verify -CAfile "$work/ca.crt" -verify_hostname "tiny-bible-r1-gw.$NS.svc" "$work/r1.crt"
check_not "r1's certificate is not valid for r2's gateway" \
    openssl verify -CAfile "$work/ca.crt" -verify_hostname "tiny-bible-r2-gw.$NS.svc" "$work/r1.crt"
check "r1's key matches its certificate" \
    bash -c "[[ \$(openssl x509 -noout -pubkey -in '$work/r1.crt') == \$(openssl pkey -pubout -in '$work/r1.key') ]]"
expect_eq "status.readyPeers / readyRegions" "8/8 2/2" \
    "$(kn get sj $JOB -o jsonpath='{.status.readyPeers} {.status.readyRegions}')"
expect_eq "conditions Created, Running" "True True" \
    "$(kn get sj $JOB -o jsonpath='{.status.conditions[?(@.type=="Created")].status} {.status.conditions[?(@.type=="Running")].status}')"
expect_eq "observedGeneration" "$(kn get sj $JOB -o jsonpath='{.metadata.generation}')" \
    "$(kn get sj $JOB -o jsonpath='{.status.observedGeneration}')"
check "kubectl get sj prints phase, regions, ready peers" \
    bash -c "kubectl -n $NS get sj $JOB --no-headers | grep -Eq '^tiny-bible +Running +2/2 +8/8 '"
check "events record the transitions" bash -c "kubectl -n $NS get events --field-selector involvedObject.name=$JOB,reason=Running -o name | grep -q ."
port=$(sed -n 's/.*metrics on :\([0-9]*\).*/\1/p' "$op_log" | tail -1)
# A reconcile that made pods not yet in the cache requeues; one with nothing left to do is a
# success: under valgrind the cache can lag the first several, so wait for one.
reconciled() {
    curl -fsS "http://127.0.0.1:$port/metrics" |
        grep -Eq '^controller_runtime_reconcile_total\{controller="swarmjob",result="success"\} [1-9]'
}
check "/metrics: successful reconciles counted" poll_until 60 reconciled
metrics=$(curl -fsS "http://127.0.0.1:$port/metrics")
check "/metrics: leader_election_master_status 1" grep -q '^leader_election_master_status{name="cirrus-operator"} 1$' <<<"$metrics"
check "/readyz answers 200" curl -fsS "http://127.0.0.1:$port/readyz"
# The whole page through the Prometheus project's own parser, plus promtool's rules (one HELP
# and TYPE a family, counters named _total, no series twice).
if out=$(/usr/bin/python3 "$root/tests/lib/metrics_check.py" "http://127.0.0.1:$port/metrics" \
    controller_runtime_reconcile_total leader_election_master_status workqueue_depth 2>&1); then
    ok "/metrics is valid Prometheus text: ${out#*: }"
else not_ok "/metrics is valid Prometheus text"; echo "$out" | head -10; fi

# ---- in-place replacement --------------------------------------------------------------------
uids() { kn get pods -l cirrus.dev/job=$JOB -o jsonpath='{range .items[*]}{.metadata.name}={.metadata.uid}{"\n"}{end}' | sort; }
before=$(uids)
victim=tiny-bible-r1-s0-1
old=$(kn get pod $victim -o jsonpath='{.metadata.uid}')
replaced() { local u; u=$(kn get pod $victim -o jsonpath='{.metadata.uid}') && [[ -n "$u" && "$u" != "$old" ]]; }
t0=$(now)
kn delete pod $victim --wait=false >/dev/null
limit=2
[[ "${OPERATOR_VALGRIND:-0}" == 1 ]] && limit=30
if wait_until $limit replaced; then ok "deleted peer pod replaced in $(elapsed "$t0") s (limit $limit s)"; else not_ok "deleted peer pod not replaced within $limit s"; fi
after=$(uids)
expect_eq "the other 11 pods untouched" "11" "$(comm -12 <(echo "$before") <(echo "$after") | wc -l)"
counts() { kn get sj $JOB -o jsonpath='{.status.regions[?(@.name=="r1")].preemptions} {.status.regions[?(@.name=="r1")].failures}'; }
counts_are() { [[ "$(counts)" == "$1" ]]; }
wait_until 10 counts_are "1 0"
expect_eq "r1 preemptions, failures" "1 0" "$(counts)"
if [[ "${OPERATOR_VALGRIND:-0}" != 1 ]]; then

# A pod's program failing (exit 1) is a failure; one preempted (the DisruptionTarget
# condition Kubernetes sets, then SIGKILL: 137) a preemption.
end_pod() { # POD EXIT_CODE: what the kubelet reports when the container exits so
    kn patch pod "$1" --subresource=status --type=merge -p "{\"status\":{\"phase\":\"Failed\",\"containerStatuses\":[{\"name\":\"trainer\",\"image\":\"cirrus:latest\",\"imageID\":\"\",\"ready\":false,\"restartCount\":0,\"state\":{\"terminated\":{\"exitCode\":$2,\"reason\":\"Error\"}}}]}}" >/dev/null
}
preempt_pod() { # POD: preempted by the scheduler, as the kubelet reports it
    kn patch pod "$1" --subresource=status --type=merge -p "{\"status\":{\"phase\":\"Failed\",\"conditions\":[{\"type\":\"DisruptionTarget\",\"status\":\"True\",\"reason\":\"PreemptionByScheduler\"}],\"containerStatuses\":[{\"name\":\"trainer\",\"image\":\"cirrus:latest\",\"imageID\":\"\",\"ready\":false,\"restartCount\":0,\"state\":{\"terminated\":{\"exitCode\":137,\"reason\":\"Error\"}}}]}}" >/dev/null
}
old=$(kn get pod tiny-bible-r1-s1-0 -o jsonpath='{.metadata.uid}')
victim=tiny-bible-r1-s1-0
end_pod $victim 1
wait_until 10 counts_are "1 1"
expect_eq "exit 1: r1 preemptions, failures" "1 1" "$(counts)"
check "failed pod replaced in place" wait_until 10 replaced
old=$(kn get pod tiny-bible-r1-s1-1 -o jsonpath='{.metadata.uid}')
victim=tiny-bible-r1-s1-1
preempt_pod $victim
wait_until 10 counts_are "2 1"
expect_eq "DisruptionTarget: r1 preemptions, failures" "2 1" "$(counts)"
check "preempted pod replaced in place" wait_until 10 replaced
wait_until 30 all_running

# ---- node loss ---------------------------------------------------------------------------------
# A second spot node in r1, then r1's first one disappears (a reclaimed spot VM): the operator
# sees the node go, force-deletes its pods and re-creates them, which the scheduler puts on
# the node that is left; well before pod GC would have removed them (40 s).
k get node cirrus-r1-spot-0 -o json |
    jq '{apiVersion, kind, metadata: {name: .metadata.name, labels: .metadata.labels, annotations: .metadata.annotations}, spec: {}, status: {capacity: .status.capacity, allocatable: .status.allocatable}}' >"$work/node.json"
jq '{apiVersion, kind, metadata: {name: "cirrus-r1-spot-extra", labels: (.metadata.labels + {"kubernetes.io/hostname": "cirrus-r1-spot-extra"}), annotations: .metadata.annotations}, spec: {}, status: {capacity: .status.capacity, allocatable: .status.allocatable}}' "$work/node.json" |
    k apply -f - >/dev/null
node_ready() { [[ $(k get node cirrus-r1-spot-extra -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}') == True ]]; }
wait_until 60 node_ready || not_ok "extra node not Ready"
r2_before=$(kn get pods -l cirrus.dev/region=r2 -o jsonpath='{.items[*].metadata.uid}')
t0=$(now)
k delete node cirrus-r1-spot-0 >/dev/null
moved() { [[ "$(kn get pods -l cirrus.dev/region=r1 --field-selector status.phase=Running -o jsonpath='{.items[*].spec.nodeName}' | tr ' ' '\n' | sort | uniq -c | awk '{print $1, $2}')" == "6 cirrus-r1-spot-extra" ]]; }
if wait_until 20 moved; then ok "r1's 6 pods running on the other r1 node $(elapsed "$t0") s after its node was deleted"; else not_ok "r1's pods did not move: $(kn get pods -l cirrus.dev/region=r1 -o wide --no-headers | awk '{print $1, $3, $7}' | tr '\n' ';')"; fi
expect_eq "r2's pods untouched by r1's node loss" "$r2_before" "$(kn get pods -l cirrus.dev/region=r2 -o jsonpath='{.items[*].metadata.uid}')"

# ---- operator killed mid-reconcile, restarted --------------------------------------------------
wait_until 30 all_running
before=$(uids)
counts_before=$(counts)
cat >"$work/second.yaml" <<EOF
apiVersion: cirrus.dev/v1alpha1
kind: SwarmJob
metadata: {name: second}
spec:
  image: cirrus:latest
  pipeline: {stages: 4}
  model: {preset: tiny, layers: 8}
  regions:
    - name: r2
      peers: {replicas: 8, min: 1}
      clients: 2
EOF
kn apply -f "$work/second.yaml" >/dev/null
# Kill it as soon as it has started creating the second job's pods.
some_created() { [[ $(kn get pods -l cirrus.dev/job=second -o name | wc -l) -ge 1 ]]; }
wait_until 20 some_created
stop_operator KILL
n_mid=$(kn get pods -l cirrus.dev/job=second -o name | wc -l)
start_operator
second_done() { [[ $(kn get pods -l cirrus.dev/job=second --field-selector status.phase=Running -o name | wc -l) == 35 ]]; }
# The restarted operator waits for the killed one's lease to expire (15 s) first.
if wait_until 90 second_done; then ok "restarted operator finished the second job (killed with $n_mid of its 35 pods made)"; else not_ok "second job not converged: $(kn get pods -l cirrus.dev/job=second --no-headers | wc -l) pods"; fi
expect_eq "second job: pods (4 stages x 8 peers + gateway + 2 clients), no duplicates" "35" "$(kn get pods -l cirrus.dev/job=second -o name | wc -l)"
check_not "second job (one region, two clients): its gateway takes no outer steps" \
    grep -q -- "--sync-every" <<<"$(kn get pod second-r2-gw -o jsonpath='{.spec.containers[0].args[*]}') $(kn get pod second-r2-c1 -o jsonpath='{.spec.containers[0].args[*]}')"
expect_eq "second job: gateway Service without a wan port" "coord http" \
    "$(kn get svc second-r2-gw -o jsonpath='{.spec.ports[*].name}')"
expect_eq "first job's pods not replaced across the restart" "$before" "$(uids)"
expect_eq "counters survive the restart (from the status)" "$counts_before" "$(counts)"

# ---- watch history lost (forced 410) while kube-apiserver restarts ----------------------------
# The operator is frozen while a pod is deleted and the API server restarts: the deletion
# reaches no watch (those connections die with the server), and the restarted server's watch
# cache begins after it, so resuming each watch from its last resourceVersion gets 410 Gone.
# Only the re-list can tell the operator the pod is gone.
relists() { grep -c "/api/v1/pods: resourceVersion [0-9]* expired, re-listing" "$op_log"; }
n_relist=$(relists)
kill -STOP "$op_pid"
victim=tiny-bible-r2-s1-0
old=$(kn get pod $victim -o jsonpath='{.metadata.uid}')
kn delete pod $victim --wait=true >/dev/null
"$cluster" restart-apiserver >/dev/null 2>&1 || not_ok "restart-apiserver"
kill -CONT "$op_pid"
t0=$(now)
if wait_until 60 replaced; then ok "pod deleted while the operator was frozen and the API server restarted: replaced $(elapsed "$t0") s after it woke"; else not_ok "pod deleted while frozen, across the API server restart, not replaced"; fi
relisted() { (($(relists) > n_relist)); }
check "the pod cache re-listed after its watch got 410" wait_until 20 relisted
victim=tiny-bible-r2-s0-0
old=$(kn get pod $victim -o jsonpath='{.metadata.uid}')
kn delete pod $victim --wait=false >/dev/null
if wait_until 10 replaced; then ok "after the API server restart the operator keeps replacing pods"; else not_ok "no replacement after the API server restart"; fi

# ---- deletion ---------------------------------------------------------
kn delete sj $JOB --wait=false >/dev/null
gone() { [[ -z "$(kn get pods,svc,secret -l cirrus.dev/job=$JOB -o name 2>/dev/null)" ]]; }
if wait_until 60 gone; then ok "job deleted: pods, Services and Secret garbage-collected"; else not_ok "children left after deleting the job: $(kn get pods,svc,secret -l cirrus.dev/job=$JOB -o name | tr '\n' ' ')"; fi
sleep 3
check "and nothing made again for the deleted job" gone

# ---- backoffLimit --------------------------------------------------------------------------------
cat >"$work/fragile.yaml" <<EOF
apiVersion: cirrus.dev/v1alpha1
kind: SwarmJob
metadata: {name: fragile}
spec:
  image: cirrus:latest
  regions: [{name: r1, peers: {replicas: 1, min: 1}, clients: 1}]
  runPolicy: {backoffLimit: 1}
EOF
kn apply -f "$work/fragile.yaml" >/dev/null
fragile_up() { [[ $(kn get pods -l cirrus.dev/job=fragile --field-selector status.phase=Running -o name | wc -l) == 2 ]]; }
wait_until 30 fragile_up
preempt_pod fragile-r1-s0-0   # preemptions never count
preempt_pod fragile-r1-gw
sleep 1
wait_until 30 fragile_up
fphase() { kn get sj fragile -o jsonpath='{.status.phase}'; }
expect_eq "two preemptions with backoffLimit 1: still" "Running" "$(fphase)"
end_pod fragile-r1-s0-0 1
wait_until 30 fragile_up
expect_eq "one failure: within backoffLimit 1" "Running" "$(fphase)"
end_pod fragile-r1-s0-0 2
fphase_failed() { [[ "$(fphase)" == Failed ]]; }
check "second failure: phase Failed" wait_until 30 fphase_failed
no_running() { [[ -z "$(kn get pods -l cirrus.dev/job=fragile --field-selector status.phase=Running -o name)" ]]; }
check "failed job's pods stopped" wait_until 30 no_running
expect_eq "Failed condition reason" "BackoffLimitExceeded" \
    "$(kn get sj fragile -o jsonpath='{.status.conditions[?(@.type=="Failed")].reason}')"


# ---- activeDeadlineSeconds ---------------------------------------------------------------------
cat >"$work/brief.yaml" <<EOF
apiVersion: cirrus.dev/v1alpha1
kind: SwarmJob
metadata: {name: brief}
spec:
  image: cirrus:latest
  regions: [{name: r2, peers: {replicas: 1, min: 1}, clients: 1}]
  runPolicy: {activeDeadlineSeconds: 3}
EOF
kn apply -f "$work/brief.yaml" >/dev/null
brief_failed() { [[ "$(kn get sj brief -o jsonpath='{.status.phase} {.status.conditions[?(@.type=="Failed")].reason}')" == "Failed DeadlineExceeded" ]]; }
t0=$(now)
if wait_until 30 brief_failed; then ok "activeDeadlineSeconds 3: Failed (DeadlineExceeded) $(elapsed "$t0") s after apply"; else not_ok "activeDeadlineSeconds not enforced: $(kn get sj brief -o jsonpath='{.status.phase}')"; fi
brief_stopped() { [[ -z "$(kn get pods -l cirrus.dev/job=brief --field-selector status.phase=Running -o name)" ]]; }
check "the deadline-exceeded job's pods stopped" wait_until 30 brief_stopped
fi # not under valgrind

# ---- clean shutdown ---------------------------------------------------------------------------
stop_operator TERM
rc=$?
expect_eq "operator exits 0 on SIGTERM" 0 "$rc"
check_valgrind_clean "$work"
finish
