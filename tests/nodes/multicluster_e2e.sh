#!/usr/bin/env bash
# One SwarmJob across two Kubernetes clusters, on real nodes: the home cluster (node cirrus-r1,
# region r1) in this machine's network namespace and the member cluster east (its own control
# plane, node cirrus-r2, region r2, its own kube-proxy and CoreDNS) in a network namespace of
# its own, joined only by a veth pair (nodes.sh NODES_CLUSTERS=2), each region's bridge shaped
# to WAN_MBIT. The operator is installed in each cluster with `helm install` (east's with the
# chart's memberAccess, for the home's ServiceAccount); the home gets east's kubeconfig the way
# helm/cirrus/values.yaml tells a platform team to make it (a token of that ServiceAccount);
# the job is applied at home with r2 in cluster east and NodePort gateway Services. Checks:
#   - the copy in east runs r2's pods on east's node, the home r1's on its own, none elsewhere;
#     every pod in a containerd container, admitted under the `restricted` Pod Security
#     Standard in both clusters
#   - the job Succeeds at home; both regions' clients end with the same global parameters
#     (their digest) and a validation loss within 3% of the same layout run by
#     `cirrus-trainer local` here
#   - the home status lists both regions, r2 as cluster east and reachable, with its outer
#     step and WAN bytes; the copy's status.home shows the whole job
#   - the gateways' WAN traffic crossed the clusters' link: the veth pair carried at least
#     the bytes east's gateway counted
#   - `nodes.sh down` leaves the machine as it found it
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
NS=cirrus-mc
JOB=span
WAN_LINK=cirrus-wan # nodes.sh's end of the veth pair to east
T0=$SECONDS
work=$(mktemp -d)
ref_pid=

machine_snapshot >"$work/before"
finish() {
    local rc=$?
    trap - EXIT
    # The reference's `local` (its stages die with it), then the subshell that runs it.
    [[ -n "$ref_pid" ]] && { pkill -TERM -P "$ref_pid"; kill "$ref_pid"; } 2>/dev/null
    if ((fail)) && [[ -n "${KUBECONFIG:-}" ]]; then
        echo "--- state at failure: home"
        kubectl get sj,pods -A -o wide 2>&1 | head -30
        kubectl -n cirrus-system logs -l app.kubernetes.io/component=operator --prefix --tail 30 2>&1
        echo "--- state at failure: east"
        mk get sj,pods -A -o wide 2>&1 | head -30
        mk -n cirrus-system logs -l app.kubernetes.io/component=operator --prefix --tail 30 2>&1
    fi
    nodes_test_end "$work" "two-cluster end-to-end: $((SECONDS - T0)) s" "e2e (two clusters, real nodes)"
    exit $((fail || rc))
}
trap finish EXIT

[[ -x "$BIN" ]] || { not_ok "$BIN is missing (make all)"; exit 1; }
# The reference meanwhile: the clusters' start is mostly waiting.
local_reference "$BIN" "$STEPS" "$SYNC_EVERY" "$work/local.log" >"$work/ref" &
ref_pid=$!
echo "[mc] bringing up two clusters (home: cirrus-r1; east, in its own network namespace: cirrus-r2)"
NODES_CLUSTERS=2 "$NODES" up || { not_ok "nodes.sh up (NODES_CLUSTERS=2)"; exit 1; }
eval "$("$NODES" env)"
EAST_KUBECONFIG=$(sed -n "s/^export KUBECONFIG='\(.*\)'$/\1/p" <<<"$("$NODES" env east)")
EAST_API=$(sed -n "s/^export CIRRUS_APISERVER='\(.*\)'$/\1/p" <<<"$("$NODES" env east)")
EAST_CA=$(sed -n "s/^export CIRRUS_CA_FILE='\(.*\)'$/\1/p" <<<"$("$NODES" env east)")
mk() { kubectl --kubeconfig "$EAST_KUBECONFIG" "$@"; }
[[ -s "$EAST_KUBECONFIG" && -n "$EAST_API" && -s "$EAST_CA" ]] || { not_ok "nodes.sh env east: no kubeconfig, API server or CA"; exit 1; }
expect_eq "home's nodes" cirrus-r1 "$(kubectl get nodes -o jsonpath='{.items[*].metadata.name}')"
expect_eq "east's nodes" cirrus-r2 "$(mk get nodes -o jsonpath='{.items[*].metadata.name}')"
"$NODES" shape "$WAN_MBIT" || not_ok "nodes.sh shape $WAN_MBIT"

for c in home east; do
    k=kubectl
    [[ $c == east ]] && k=mk
    $k create namespace "$NS" >/dev/null &&
        $k label namespace "$NS" pod-security.kubernetes.io/enforce=restricted \
            pod-security.kubernetes.io/warn=restricted >/dev/null ||
        { not_ok "$c: namespace $NS enforcing restricted"; exit 1; }
done

# ---- the operators, from the Helm chart -------------------------------------------------------
echo "[mc] helm install in both clusters (east's with memberAccess for the home's ServiceAccount)"
if install_operator_chart "$work/helm-home.log"; then
    ok "home: helm install, the operator Deployment is available"
else
    not_ok "home: helm install: $(tail -5 "$work/helm-home.log")"
    exit 1
fi
if KUBECONFIG=$EAST_KUBECONFIG install_operator_chart "$work/helm-east.log" \
    --set operator.clusterName=east --set memberAccess.create=true --set-string memberAccess.namespace="$NS"; then
    ok "east: helm install (memberAccess), the operator Deployment is available"
else
    not_ok "east: helm install: $(tail -5 "$work/helm-east.log")"
    exit 1
fi

# East's kubeconfig for the home operator, as helm/cirrus/values.yaml tells a platform team to
# make it: east's API server and CA, a token of the chart's ServiceAccount cirrus-operator-home.
sa=cirrus-operator-home
kc=$work/east.kubeconfig
token=$(mk -n cirrus-system create token "$sa" --duration=1h) || { not_ok "east: a token for $sa"; exit 1; }
kubectl --kubeconfig "$kc" config set-cluster east --server="$EAST_API" --certificate-authority="$EAST_CA" --embed-certs >/dev/null &&
    kubectl --kubeconfig "$kc" config set-credentials home --token="$token" >/dev/null &&
    kubectl --kubeconfig "$kc" config set-context east --cluster=east --user=home >/dev/null &&
    kubectl --kubeconfig "$kc" config use-context east >/dev/null || not_ok "writing east's kubeconfig"
kubectl -n "$NS" create secret generic east-kubeconfig --from-file=kubeconfig="$kc" >/dev/null ||
    not_ok "home: Secret east-kubeconfig"
check "east: $sa may create swarmjobs in $NS (and nothing else there: not list pods)" \
    bash -c "kubectl --kubeconfig '$kc' -n '$NS' auth can-i create swarmjobs.cirrus.dev && ! kubectl --kubeconfig '$kc' -n '$NS' auth can-i list pods"

# ---- the job -------------------------------------------------------------------------------------
sj() { kubectl -n "$NS" get sj "$JOB" -o jsonpath="$1" 2>/dev/null; }  # at home
msj() { mk -n "$NS" get sj "$JOB" -o jsonpath="$1" 2>/dev/null; }     # its copy in east
val_loss_of() { # KUBECTL REGION: the region's client's "done: ..., val loss X, ..." line
    $1 -n "$NS" logs -l "cirrus.dev/job=$JOB,cirrus.dev/region=$2,cirrus.dev/role=client" --tail=-1 2>/dev/null |
        sed -n 's/^done: .*val loss \([0-9.]*\),.*/\1/p' | tail -1
}
digest_of() { # KUBECTL REGION: the global parameters' digest on its client's last progress line
    $1 -n "$NS" logs -l "cirrus.dev/job=$JOB,cirrus.dev/region=$2,cirrus.dev/role=client" --tail=-1 2>/dev/null |
        sed -nE "s|^step +$STEPS/$STEPS .*digest ([0-9a-f]+).*|\1|p" | tail -1
}
# Every pod of the job in this cluster on its node, in a containerd container, and only pods
# of the regions this cluster runs (polled: a pod may be seconds from its container).
misplaced() { # KUBECTL REGION: the job's pods there that are not REGION's, on its node, running
    $1 -n "$NS" get pods -l "cirrus.dev/job=$JOB" -o json | jq -r --arg r "$2" '.items[] |
        select(.metadata.labels["cirrus.dev/region"] != $r or (.spec.nodeName // "") != "cirrus-" + $r
            or ((.status.containerStatuses // [])[0].containerID // "" | startswith("containerd://") | not))
        | .metadata.name'
}
placed_well() { # KUBECTL REGION
    (($($1 -n "$NS" get pods -l "cirrus.dev/job=$JOB" -o name | wc -l) >= 4)) && [[ -z "$(misplaced "$1" "$2")" ]]
}
check_placement() { # KUBECTL CLUSTER REGION
    if poll_until 30 placed_well "$1" "$3"; then
        ok "$2: the job's $($1 -n "$NS" get pods -l "cirrus.dev/job=$JOB" -o name | wc -l) pods are region $3's, on node cirrus-$3, in containerd containers"
    else
        not_ok "$2: pods not region $3's or not running on cirrus-$3: $(misplaced "$1" "$3" | paste -sd' ')"
    fi
}
# The veth pair's bytes both ways (0 if it is gone).
link_bytes() {
    local rx tx
    rx=$(cat "/sys/class/net/$WAN_LINK/statistics/rx_bytes" 2>/dev/null) || rx=0
    tx=$(cat "/sys/class/net/$WAN_LINK/statistics/tx_bytes" 2>/dev/null) || tx=0
    echo $((rx + tx))
}
# Once an outer step is taken: each gateway reaches the other's region at that cluster's
# node address and its WAN Service's nodePort (the other cluster's Service names do not
# resolve here), and its link's measured rate is under the shaped rate (the WAN is real).
check_gateways() {
    local r k other want args rate ip
    for r in r1 r2; do
        k=kubectl other=r2 want=
        [[ $r == r2 ]] && k=mk other=r1
        local ko=kubectl
        [[ $other == r2 ]] && ko=mk
        want="$($ko get node "cirrus-$other" -o jsonpath='{.status.addresses[?(@.type=="InternalIP")].address}'):$($ko -n "$NS" get svc "$JOB-$other-wan" -o jsonpath='{.spec.ports[?(@.name=="wan")].nodePort}')"
        args=$($k -n "$NS" get pods -l "cirrus.dev/job=$JOB,cirrus.dev/role=gateway" -o jsonpath='{.items[0].spec.containers[0].args[*]}')
        if [[ "$want" == *:[0-9]* && " $args " == *"$other=$want"* ]]; then
            ok "$r's gateway reaches $other at its cluster's node port $want"
        else
            not_ok "$r's gateway args name no '$other=$want': $args"
        fi
        ip=$($k -n "$NS" get pods -l "cirrus.dev/job=$JOB,cirrus.dev/role=gateway" -o jsonpath='{.items[0].status.podIP}')
        rate=$(curl -sf "http://$ip:$GATEWAY_HTTP_PORT/status" | jq -r '[.outer.links[].rate_mbit_s] | max // 0')
        if awk -v r="${rate:-0}" -v m="$WAN_MBIT" 'BEGIN { exit !(r > 0 && r <= m * 1.15) }'; then
            ok "$r's gateway measured its link at $rate Mbit/s (shaped to $WAN_MBIT)"
        else
            not_ok "$r's gateway measured its link at '${rate}' Mbit/s: not within (0, $WAN_MBIT Mbit/s + 15%]"
        fi
    done
}

echo "[mc] job $JOB at home: r1 at home, r2 in cluster east, ${STEPS} steps, outer step every ${SYNC_EVERY} over ${WAN_MBIT} Mbit/s"
out=$(swarmjob_yaml "$JOB" 1 "$STEPS" "$SYNC_EVERY" 1 east-kubeconfig | kubectl -n "$NS" apply -f - 2>&1) ||
    { not_ok "the job was refused: $out"; exit 1; }
wan0=$(link_bytes)
deadline=$((SECONDS + TIMEOUT)) placed=0 linked=0 started=$SECONDS
until [[ "$(sj '{.status.phase}')" == Succeeded ]]; do
    if [[ "$(sj '{.status.phase}')" == Failed ]] || ((SECONDS > deadline)); then
        not_ok "$JOB did not succeed within ${TIMEOUT}s: phase '$(sj '{.status.phase}')', step $(sj '{.status.step}')"
        exit 1
    fi
    # Placement once every pod of both regions runs (they go when the job succeeds).
    if ((!placed)) && [[ "$(sj '{.status.readyPeers}')" == 4/4 ]]; then
        check_placement kubectl home r1
        check_placement mk east r2
        placed=1
    fi
    outer=$(sj '{.status.outerStep}')
    if ((!linked && ${outer:-0} >= 1)); then
        check_gateways
        linked=1
    fi
    sleep 2
done
ok "$JOB Succeeded at home in $((SECONDS - started)) s (step $(sj '{.status.step}'), outer step $(sj '{.status.outerStep}'))"
((placed)) || not_ok "the job's peers were never all ready at once: placement not checked"
((linked)) || not_ok "no outer step was seen while the job ran: the gateways' links not checked"

wait "$ref_pid"
ref=$(cat "$work/ref") ref_pid=
[[ -n "$ref" ]] && ok "local reference: validation loss $ref" || not_ok "no validation loss in the local run: $(tail -3 "$work/local.log")"
for r in r1 r2; do
    k=kubectl
    [[ $r == r2 ]] && k=mk
    v=$(val_loss_of $k $r)
    if within "$v" "$ref" 3; then
        ok "region $r: validation loss $v within 3% of local's $ref"
    else
        not_ok "region $r: validation loss '$v' not within 3% of local's $ref"
    fi
done
d1=$(digest_of kubectl r1) d2=$(digest_of mk r2)
if [[ -n "$d1" && "$d1" == "$d2" ]]; then
    ok "both clusters' regions end with one model (digest $d1)"
else
    not_ok "the regions' final digests differ: r1 (home) '$d1', r2 (east) '$d2'"
fi

# The home status: both regions, r2 in east and reachable, with its figures.
r2=$(kubectl -n "$NS" get sj "$JOB" -o json | jq -c '(.status.regions // [])[] | select(.name == "r2")')
expect_eq "home status: r2's cluster, reachable" "east true" "$(jq -r '"\(.cluster) \(.clusterReachable)"' <<<"$r2")"
r2_outer=$(jq -r '.outerStep // 0' <<<"$r2") r2_wan=$(jq -r '.wanBytes // 0' <<<"$r2")
if ((r2_outer >= 1 && r2_wan > 0)); then
    ok "home status: r2 (east) at outer step $r2_outer, $r2_wan WAN bytes"
else
    not_ok "home status: r2's outer step '$r2_outer', WAN bytes '$r2_wan'"
fi
expect_eq "east: the copy's status.home lists the whole job's regions" "r1 r2" \
    "$(mk -n "$NS" get sj "$JOB" -o json | jq -r '[(.status.home.regions // [])[].name] | sort | join(" ")')"
# Everything between the clusters crosses the veth pair: at least east's gateway's WAN bytes.
wan1=$(link_bytes)
if ((r2_wan > 0 && wan1 - wan0 >= r2_wan)); then
    ok "the clusters' link carried $((wan1 - wan0)) bytes while the job ran, >= east's gateway's $r2_wan"
else
    not_ok "the clusters' link carried $((wan1 - wan0)) bytes, east's gateway counted $r2_wan"
fi
# Refusals, in the clusters' Events and in the operators' logs (a refused pod create is
# logged, and named in a condition, not in an Event).
if kubectl -n "$NS" get events -o json >"$work/ev-home.json" && mk -n "$NS" get events -o json >"$work/ev-east.json"; then
    events=$(jq -sr '[.[].items[] | select(.message | test("violate|forbidden"; "i"))] | length' "$work/ev-home.json" "$work/ev-east.json")
    expect_eq "admission refusals or PodSecurity violations in $NS's Events (both clusters)" 0 "$events"
else
    not_ok "the Events of $NS could not be read in both clusters"
fi
refused=$( (kubectl -n cirrus-system logs -l app.kubernetes.io/component=operator --tail=-1; mk -n cirrus-system logs -l app.kubernetes.io/component=operator --tail=-1) 2>&1 |
    grep -ciE 'forbidden|violates PodSecurity')
expect_eq "refusals (forbidden, PodSecurity) in both operators' logs" 0 "${refused:-0}"
