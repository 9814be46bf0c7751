#!/usr/bin/env bash
# Cirrus on real nodes, end to end: the image built from the Dockerfile, the operator installed
# with `helm install` and running in a pod, a two-region SwarmJob in a namespace that enforces
# the `restricted` Pod Security Standard, the regions' pods on their own kubelets, the gateways
# syncing over a link shaped to WAN_MBIT between the regions. Then the same job again while
# peer pods are deleted and a region's node is drained (spot reclaims). Checks:
#   - the operator pod and every job pod run on real nodes (containerd container IDs), each job
#     pod on a node of its region; the namespace's restricted policy admitted them all
#   - the job Succeeds, both regions' clients end with the same global parameters (digest);
#     each region's client validation loss is within 3% of the same layout
#     run by `cirrus-trainer local` on this machine; region r2 of the calm job runs two
#     clients sharing each step (client 0 takes its outer steps)
#   - the WAN bytes in the job's status equal the sum of the gateways' own counters
#   - under preemption: the job Succeeds, the deletions and evictions are counted as
#     preemptions (not failures), the loss stays within 3% of the calm run; the region whose
#     stage lost every peer restored it, the region whose node was drained came back and
#     joined the job
#   - a job whose image no node holds: PodsStarted False with the kubelet's reason
#   - `nodes.sh down` leaves the machine as it found it (sysctls, iptables, links, mounts)
# Needs root and tests/nodes/install.sh + image.sh. Exits non-zero if any check fails.
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib.sh
source "$here/lib.sh"
# shellcheck source=../operator/lib.sh
source "$here/../operator/lib.sh"
need_root "the real-node tests"

NODES=$here/nodes.sh
BIN=${CIRRUS_TRAINER:-$REPO_DIR/build/bin/cirrus-trainer}
NS=cirrus-e2e
T0=$SECONDS
work=$(mktemp -d)

machine_snapshot >"$work/before"
finish() {
    local rc=$?
    trap - EXIT
    if ((fail)) && [[ -n "${KUBECONFIG:-}" ]]; then
        echo "--- state at failure"
        kubectl get sj,pods -A -o wide 2>&1 | head -40
        kubectl -n cirrus-system logs -l app.kubernetes.io/component=operator --prefix --tail 30 2>&1
    fi
    nodes_test_end "$work" "real-node end-to-end: $((SECONDS - T0)) s" "e2e (real nodes)"
    exit $((fail || rc))
}
trap finish EXIT

[[ -x "$BIN" ]] || { not_ok "$BIN is missing (make all)"; exit 1; }
echo "[e2e] bringing up the control plane and two real nodes"
"$NODES" up || { not_ok "nodes.sh up"; exit 1; }
eval "$("$NODES" env)"
"$NODES" shape "$WAN_MBIT" || not_ok "nodes.sh shape $WAN_MBIT"

# ---- the operator, from the Helm chart ------------------------------------------------------
echo "[e2e] helm install: the operator in a pod on a real node"
if install_operator_chart "$work/helm.log"; then
    ok "helm install: the operator Deployment is available"
else
    not_ok "helm install: $(tail -5 "$work/helm.log")"
    exit 1
fi
# The chart runs two replicas; the one holding the Lease (its holder is the pod's name) leads.
leader_pod() { kubectl -n cirrus-system get lease cirrus-operator -o jsonpath='{.spec.holderIdentity}' 2>/dev/null; }
leader_running() { [[ -n "$(leader_pod)" ]] && kubectl -n cirrus-system get pod "$(leader_pod)" >/dev/null 2>&1; }
expect_eq "operator replicas ready" 2 "$(kubectl -n cirrus-system get deployment cirrus-operator -o jsonpath='{.status.readyReplicas}')"
if poll_until 60 leader_running; then
    op_pod=$(leader_pod)
    ok "an operator replica in its pod leads ($op_pod: its Lease, through the kubernetes Service)"
    check "the operator runs in a containerd container on a real node" \
        bash -c "kubectl -n cirrus-system get pod $op_pod -o jsonpath='{.status.containerStatuses[0].containerID}' | grep -q '^containerd://'"
else
    not_ok "no operator replica acquired the Lease: $(kubectl -n cirrus-system logs deploy/cirrus-operator --tail 5 2>&1)"
fi

kubectl create namespace "$NS" >/dev/null
kubectl label namespace "$NS" pod-security.kubernetes.io/enforce=restricted \
    pod-security.kubernetes.io/warn=restricted >/dev/null

# ---- a two-region job -----------------------------------------------------------------------
sj() { kubectl -n "$NS" get sj "$1" -o jsonpath="$2" 2>/dev/null; }
phase_is() { [[ "$(sj "$1" '{.status.phase}')" == "$2" ]]; }
val_loss() { # POD: the client's "done: ..., val loss X, ..." line
    kubectl -n "$NS" logs "$1" 2>/dev/null | sed -n 's/^done: .*val loss \([0-9.]*\),.*/\1/p' | tail -1
}
# The sum of the gateways' bytes sent + received, from their own /status (pod IPs are
# routable from this machine), and the job's status; equal once no sync is in flight.
gateways_bytes() {
    local total=0 ip b
    for ip in $(kubectl -n "$NS" get pods -l cirrus.dev/role=gateway -o jsonpath='{.items[*].status.podIP}'); do
        b=$(curl -sf "http://$ip:$GATEWAY_HTTP_PORT/status" | jq -e ".outer.wan_bytes_sent + .outer.wan_bytes_received") || return 1
        total=$((total + b))
    done
    echo "$total"
}

echo "[e2e] the reference: cirrus-trainer local with the same layout on this machine"
ref=$(local_reference "$BIN" "$STEPS" "$SYNC_EVERY" "$work/local.log")
[[ -n "$ref" ]] && ok "local reference: validation loss $ref" || not_ok "no validation loss in the local run's output"

# run_job NAME PEERS CHAOS: applies the job (PEERS per stage), waits for Succeeded (CHAOS=1:
# meanwhile reclaims, as spot reclaims do, whenever every peer is ready and the job has
# begun training: every peer of one stage of a region, then the operator's node, each as soon
# as the job is whole again (5 s on), then one random peer each 15 s; a fast machine trains
# the whole job in under 40 s); sets deleted (how many) and checks placement.
deleted=0 reclaims=0 drained=0 drained_region= swarm_region=
operator_node() { kubectl -n cirrus-system get pod "$(leader_pod)" -o jsonpath='{.spec.nodeName}'; }
# drain_node JOB: a zone reclaimed: every pod of the node the leading operator runs on evicted
# (kubectl drain, the Eviction API; the leader among them: the standby takes over once it
# hands over), then the node back at once (uncordon), as a replacement node would be. Sets
# drained (pods of JOB) and drained_region.
drain_node() {
    local node n op
    op=$(leader_pod)
    node=$(kubectl -n cirrus-system get pod "$op" -o jsonpath='{.spec.nodeName}')
    # Its log to the end (the evicted pod's log goes with it): what it counted before handing over.
    kubectl -n cirrus-system logs -f "$op" >"$work/operator-drained.log" 2>&1 &
    drained_region=${node#cirrus-}
    n=$(kubectl -n "$NS" get pods -l "cirrus.dev/job=$1" --field-selector "spec.nodeName=$node" -o name | wc -l)
    echo "[e2e] draining $node (the operator's node): $n pods of $1 (step $(sj "$1" '{.status.step}'))"
    if kubectl drain "$node" --ignore-daemonsets --delete-emptydir-data --force --timeout=120s >"$work/drain.log" 2>&1; then
        deleted=$((deleted + n)) drained=$n
    else
        not_ok "kubectl drain $node: $(tail -2 "$work/drain.log")"
    fi
    kubectl uncordon "$node" >/dev/null 2>&1 || not_ok "kubectl uncordon $node"
}
run_job() {
    local name=$1 peers=$2 chaos=$3 r2_clients=${4:-1} outer deadline=$((SECONDS + TIMEOUT)) next=$SECONDS p placed=0
    local all=$((peers * 4))/$((peers * 4))
    deleted=0 reclaims=0
    swarmjob_yaml "$name" "$peers" "$STEPS" "$SYNC_EVERY" "$r2_clients" | kubectl -n "$NS" apply -f - >"$work/apply.log" 2>&1 ||
        { not_ok "apply $name: $(cat "$work/apply.log")"; return 1; }
    grep -qi warning "$work/apply.log" && not_ok "apply $name warned: $(cat "$work/apply.log")"
    until phase_is "$name" Succeeded; do
        if phase_is "$name" Failed || ((SECONDS > deadline)); then
            not_ok "$name did not succeed within ${TIMEOUT}s: phase '$(sj "$name" '{.status.phase}')', step $(sj "$name" '{.status.step}')"
            return 1
        fi
        # Placement while the pods exist (peers and gateways go when the job succeeds).
        if ((!placed)) && [[ "$(sj "$name" '{.status.readyPeers}')" == "$all" ]]; then
            check_placement "$name"
            placed=1
        fi
        # Not in the last 20 steps: the status's step is up to a progress period (10 s) old,
        # and a pod deleted once the clients are done is no preemption of a running job (the
        # operator removes the peers then itself). A peer lost in the final evaluation is
        # tested in tests/unit/test_swarm.c.
        step_now=$(sj "$name" '{.status.step}')
        if ((chaos && SECONDS >= next && ${step_now:-0} >= 1 && ${step_now:-0} + 20 < STEPS)) &&
            [[ "$(sj "$name" '{.status.readyPeers}')" == "$all" ]]; then
            # The first reclaim takes a stage's whole swarm in a region (its state goes with
            # it: the region restores it from the global parameters), the second the node the
            # operator runs on (every pod of that region, and the operator: the region comes
            # back from nothing and joins the job; the operator accounts for the pods going
            # before it hands over), later ones one peer. The drain waits for the job's first
            # outer step: a region drained before it comes back to a job no further than
            # itself (the first round still ahead of both), with nothing to join.
            if ((reclaims == 1)); then
                outer=$(sj "$name" '{.status.outerStep}')
                ((${outer:-0} >= 1)) || { sleep 2; continue; }
                reclaims=2
                drain_node "$name"
                next=$((SECONDS + 5))
                continue
            fi
            reclaims=$((reclaims + 1))
            local sel="cirrus.dev/job=$name,cirrus.dev/role=peer" pods
            if ((reclaims == 1)); then # the region the operator is not in: its client lives on
                [[ "$(operator_node)" == cirrus-r2 ]] && swarm_region=r1 || swarm_region=r2
                sel+=",cirrus.dev/region=$swarm_region,cirrus.dev/stage=1"
            fi
            pods=$(kubectl -n "$NS" get pods -l "$sel" --field-selector status.phase=Running -o name)
            ((reclaims > 1)) && pods=$(shuf -n 1 <<<"$pods")
            # One request list for all of them: a stage's peers deleted one kubectl call
            # apart (seconds on a loaded machine) let the first one's replacement take the
            # state from the second before it went, and the stage was never wholly lost.
            # shellcheck disable=SC2086 # one pod name per word
            if [[ -n "$pods" ]] && kubectl -n "$NS" delete $pods --wait=false >/dev/null 2>&1; then
                deleted=$((deleted + $(wc -w <<<"$pods")))
                echo "[e2e] preempted" $pods "(step $(sj "$name" '{.status.step}'))"
            fi
            ((reclaims == 1)) && next=$((SECONDS + 5)) || next=$((SECONDS + 15))
        fi
        outer=$(sj "$name" '{.status.outerStep}')
        if ((!chaos)) && [[ -z "${bytes_checked:-}" ]] && ((${outer:-0} >= 1)); then
            check_wan_bytes "$name" && bytes_checked=1
        fi
        sleep 2
    done
    ok "$name Succeeded in $((SECONDS - deadline + TIMEOUT)) s (step $(sj "$name" '{.status.step}'), outer step $(sj "$name" '{.status.outerStep}'))"
}

# Once an outer step has been taken: each region's wanBytes in the job's status must be a
# value its gateway's counters (bytes sent + received) really had: the operator reads each
# gateway every 10 s, and rounds move the counters meanwhile, so the test samples them every
# second and looks the status's figure up among what it saw (a fast machine syncs every few
# seconds: the sum of both rarely stood still long enough to equal the status's).
check_wan_bytes() {
    local name=$1 i r ip b s n all
    local -A seen=()
    for ((i = 0; i < 40; i++)); do
        while read -r r ip; do
            [[ -n "$ip" ]] || continue
            b=$(curl -sf "http://$ip:$GATEWAY_HTTP_PORT/status" | jq -e ".outer.wan_bytes_sent + .outer.wan_bytes_received") &&
                seen[$r]+=" $b "
        done < <(kubectl -n "$NS" get pods -l cirrus.dev/role=gateway -o jsonpath='{range .items[*]}{.metadata.labels.cirrus\.dev/region} {.status.podIP}{"\n"}{end}')
        all=1 n=0
        while read -r r s; do
            [[ -n "$r" ]] || continue
            n=$((n + 1))
            [[ -n "$s" && "$s" -gt 0 && "${seen[$r]:-}" == *" $s "* ]] || all=0
        done < <(sj "$name" '{range .status.regions[*]}{.name} {.wanBytes}{"\n"}{end}')
        if ((all && n == 2)); then
            ok "each region's wanBytes in the job's status ($(sj "$name" '{.status.regions[*].wanBytes}')) is its gateway's bytes sent + received"
            check_link_rates
            return 0
        fi
        sleep 1
    done
    not_ok "the job's status wanBytes per region '$(sj "$name" '{.status.regions[*].wanBytes}')' never matched what the gateways' counters showed (r1:${seen[r1]:-none}; r2:${seen[r2]:-none})"
    return 0
}

# The gateways' measured link rates: below the shaped rate (so the WAN is real), above zero.
check_link_rates() {
    local ip rates r
    for ip in $(kubectl -n "$NS" get pods -l cirrus.dev/role=gateway -o jsonpath='{.items[*].status.podIP}'); do
        rates+=" $(curl -sf "http://$ip:$GATEWAY_HTTP_PORT/status" | jq -r '.outer.links[].rate_mbit_s')"
    done
    for r in $rates; do
        awk -v r="$r" -v m="$WAN_MBIT" 'BEGIN { exit !(r > 0 && r <= m * 1.15) }' || {
            not_ok "a gateway link measured ${r} Mbit/s: not within (0, ${WAN_MBIT} Mbit/s + 15%]"
            return
        }
    done
    [[ -n "${rates// /}" ]] && ok "the gateways' links measured${rates} Mbit/s (shaped to ${WAN_MBIT})" ||
        not_ok "no link rates in the gateways' /status"
}

check_placement() { # NAME: every pod of the job on a real node of its own region
    local bad
    bad=$(kubectl -n "$NS" get pods -l "cirrus.dev/job=$1" -o json | jq -r '.items[] |
        select((.spec.nodeName // "") != "cirrus-" + .metadata.labels["cirrus.dev/region"]
            or ((.status.containerStatuses // [])[0].containerID // "containerd://" | startswith("containerd://") | not))
        | .metadata.name')
    expect_eq "$1: pods not on a real node of their region" "(none)" "${bad:-(none)}"
}

check_losses() { # NAME REFERENCE WHAT
    local r c v
    for r in r1 r2; do
        c=$(kubectl -n "$NS" get pods -l "cirrus.dev/job=$1,cirrus.dev/region=$r,cirrus.dev/role=client,cirrus.dev/index=0" -o jsonpath='{.items[0].metadata.name}')
        v=$(val_loss "$c")
        if within "$v" "$2" 3; then
            ok "$1 region $r: validation loss $v within 3% of $3 $2"
        else
            not_ok "$1 region $r: validation loss '$v' not within 3% of $3 $2"
        fi
    done
}
# check_one_model NAME: both regions' clients ended with the same global parameters (the
# digest on their last progress line, "step STEPS/STEPS | ... digest X").
check_one_model() {
    local r c d digests=
    for r in r1 r2; do
        c=$(kubectl -n "$NS" get pods -l "cirrus.dev/job=$1,cirrus.dev/region=$r,cirrus.dev/role=client,cirrus.dev/index=0" -o jsonpath='{.items[0].metadata.name}')
        d=$(kubectl -n "$NS" logs "$c" 2>/dev/null | sed -nE "s|^step +$STEPS/$STEPS .*digest ([0-9a-f]+).*|\1|p" | tail -1)
        digests+="${d:-none} "
    done
    read -r d1 d2 <<<"$digests"
    if [[ "$d1" != none && "$d1" == "$d2" ]]; then
        ok "$1: both regions end with one model (digest $d1)"
    else
        not_ok "$1: the regions' final digests differ: r1 $d1, r2 $d2"
    fi
}

echo "[e2e] job calm: two regions (r2 with 2 clients sharing each step), ${STEPS} steps, outer step every ${SYNC_EVERY} over ${WAN_MBIT} Mbit/s"
run_job calm 1 0 2
[[ -n "${bytes_checked:-}" ]] || not_ok "no outer step was seen while the calm job ran: wanBytes never checked"
check_losses calm "$ref" "local's"
check_one_model calm
calm_loss=$(val_loss "$(kubectl -n "$NS" get pods -l cirrus.dev/job=calm,cirrus.dev/region=r1,cirrus.dev/role=client -o jsonpath='{.items[0].metadata.name}')")
events=$(kubectl -n "$NS" get events -o json | jq -r '[.items[] | select(.message | test("violate|forbidden"; "i"))] | length')
expect_eq "admission refusals or PodSecurity violations in $NS" 0 "$events"

echo "[e2e] job chaos: the same with 2 peers per stage; both peers of a region's stage 1 deleted, the operator's node (the other region's) drained, then a random peer pod every ~15 s"
run_job chaos 2 1
check_losses chaos "${calm_loss:-0}" "the calm run's"
check_one_model chaos
pre=$(sj chaos '{.status.regions[*].preemptions}' | tr ' ' '+')
failures=$(sj chaos '{.status.regions[*].failures}' | tr ' ' '+')
if ((deleted >= 1)) && (( ${pre:-0} >= deleted )); then
    ok "chaos: $deleted deletions counted as $((pre)) preemptions"
else
    not_ok "chaos: $deleted peer pods deleted, status preemptions '$pre'"
    echo "--- the drained operator's last lines"
    tail -n 25 "$work/operator-drained.log"
fi
expect_eq "chaos: failures counted" 0 "$((${failures:-0}))"
joined=$(kubectl -n "$NS" logs -l "cirrus.dev/job=chaos,cirrus.dev/region=${drained_region:-none},cirrus.dev/role=client" --tail=-1 2>/dev/null |
    sed -nE 's/.*the region joins it at inner step ([0-9]+) .*/\1/p' | head -1)
if ((drained > 0)) && [[ -n "$joined" ]]; then
    ok "chaos: the operator's node (region $drained_region) drained ($drained job pods evicted); the region came back from nothing and joined the job at inner step $joined"
else
    not_ok "chaos: region '$drained_region' drained '$drained' job pods; its new client joined the job at '${joined:-never}'"
fi
restored=$(kubectl -n "$NS" logs -l "cirrus.dev/job=chaos,cirrus.dev/region=${swarm_region:-none},cirrus.dev/role=client" --tail=-1 2>/dev/null |
    grep -c 'the region is restored at inner step')
if ((${restored:-0} >= 1)); then
    ok "chaos: region $swarm_region lost stage 1's whole swarm and restored it from the global parameters"
else
    not_ok "chaos: region '$swarm_region''s client never restored its lost stage (a stage's every peer deleted)"
fi

# A job whose image the nodes do not hold (pull policy Never): the kubelet's reason reaches
# the status as the PodsStarted condition, instead of pods Pending without a word.
echo "[e2e] job noimage: an image no node holds"
swarmjob_yaml noimage 1 10 5 | sed 's/image: cirrus:latest/image: cirrus:absent/' |
    kubectl -n "$NS" apply -f - >/dev/null 2>&1 || not_ok "apply noimage"
stuck() { [[ "$(sj noimage '{.status.conditions[?(@.type=="PodsStarted")].status} {.status.conditions[?(@.type=="PodsStarted")].reason}')" == "False ErrImageNeverPull" ]]; }
if poll_until 60 stuck; then
    ok "noimage: PodsStarted False, ErrImageNeverPull: $(sj noimage '{.status.conditions[?(@.type=="PodsStarted")].message}')"
else
    not_ok "noimage: PodsStarted is '$(sj noimage '{.status.conditions[?(@.type=="PodsStarted")]}')'"
fi
kubectl -n "$NS" delete sj noimage --wait=false >/dev/null 2>&1
