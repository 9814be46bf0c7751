#!/usr/bin/env bash
# A SwarmJob whose regions span two Kubernetes clusters (docs/ARCHITECTURE.md, "Regions in
# several clusters"), against two real control planes on this machine (run by run.sh with
# KUBECONFIG set and kubectl on PATH): the suite's cluster is the home; a second one, the
# member "east", is brought up here (CLUSTER_STATE_DIR=build/cluster-member, reused if an
# aborted run left it running) and torn down at the end, also on failure
# (MULTICLUSTER_KEEP_MEMBER=1 keeps it, for running this test again and again). Both have kwok
# nodes in regions r1 and r2. One operator per cluster, each as its own ServiceAccount,
# watching only this test's namespace: the home one with --cluster-name home, the member one
# plainly. The home operator reaches the member with a kubeconfig from a Secret: a token of
# the chart's memberAccess ServiceAccount (helm/cirrus rendered with memberAccess.create=true,
# a Role in the namespace), or the member's admin credentials without helm. The job, applied
# at home: region r1 at home, r2 in cluster east, NodePort gateway Services.
#   * the member cluster gets a copy of the job (same name and namespace) that names its home
#     (cluster and uid), has no spec.clusters, no TTL or deadline, and sees r1 as a region of
#     cluster "home" at the home gateway's endpoint;
#   * no private key crosses clusters: the member's operator makes r2's gateway key in its
#     own job Secret with a certificate request, shown in the copy's status; the home signs it
#     (r2.crt in both Secrets, naming cirrus://<home uid>/r2, under the home's CA) and keeps
#     the CA key in its Secret; the member's Secret has r2's key, request and certificate and
#     the CA's certificate only, the home's no r2 key, the copy no key at all;
#   * r1's pods run at home only, r2's in the member only; both gateways run with the home
#     job's uid and list each other at their endpoints: "<node address of the region in its
#     cluster>:<the wan port's nodePort>", as kubectl sees them there;
#   * status: the copy's r2 has an endpoint; the home's lists r1 and r2 (cluster east,
#     reachable, its ready peers those of the copy); condition ClustersReachable True;
#   * spec changes at home (suspend, peersPerStage) reach the copy within 20 s; the copy
#     deleted by hand is made again, with a new Secret and key, which the home signs again;
#   * the member unreachable (its kubeconfig's server a dead port): ClustersReachable False,
#     MemberUnreachable, naming east, r2 kept as unreachable, the job not Failed; restored:
#     True again;
#   * a job whose kubeconfig Secret lacks its key: a condition False names the Secret, and
#     the operator goes on;
#   * the home job deleted: the copy and the member's Secret go, and so does the home job
#     (its finalizer cirrus.dev/member-copies removed by the operator);
#   * neither operator is refused anything (403), and both exit 0 on SIGTERM.
# About 40 s, and 15 s more to bring the member up and down. Last line: "multicluster: N
# passed, N failed"; exits non-zero if anything failed.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
# shellcheck source=tests/operator/lib.sh
source "$root/tests/operator/lib.sh"
cluster=$root/tests/cluster/cluster.sh
member_state=$root/build/cluster-member
JOB=mc
FINALIZER=cirrus.dev/member-copies
stage() { printf -- '-- %s\n' "$*"; }

stage "home cluster: manifests/, this test's namespace"
focused_test_begin multicluster cirrus-mc-test
mkdir -p "$work/member"
home_pid= member_pid=
# mk/mkn: kubectl in the member cluster (mkn: in NS); kn (focused_test_begin's): at home.
mk() { kubectl --kubeconfig "$member_state/kubeconfig" "$@"; }
mkn() { mk -n "$NS" "$@"; }
# Jobs still holding a finalizer would keep their namespace terminating once the operators
# are gone: take them off first.
strip_finalizers() { # KUBECTL...
    local j
    for j in $("$@" -n "$NS" get sj -o name 2>/dev/null); do
        "$@" -n "$NS" patch "$j" --type merge -p '{"metadata":{"finalizers":null}}' >/dev/null 2>&1
    done
}
multicluster_cleanup() {
    local pid
    for pid in $home_pid $member_pid; do
        { kill -KILL "$pid" && wait "$pid"; } 2>/dev/null
    done
    op_pid=
    strip_finalizers kubectl
    if [[ "${MULTICLUSTER_KEEP_MEMBER:-0}" == 1 ]]; then
        strip_finalizers mk
        mk delete namespace "$NS" --ignore-not-found --wait=false >/dev/null 2>&1
    else
        CLUSTER_STATE_DIR=$member_state "$cluster" down >/dev/null 2>&1
    fi
    focused_cleanup
}
trap multicluster_cleanup EXIT
finish() {
    if ((fail)); then
        echo "--- home operator log (last 40 lines)"
        tail -40 "$work/operator.log" 2>/dev/null
        echo "--- member operator log (last 40 lines)"
        tail -40 "$work/member/operator.log" 2>/dev/null
    fi
    checks_summary multicluster
    exit
}

stage "member cluster east: up at $member_state"
t0=$SECONDS
CLUSTER_STATE_DIR=$member_state "$cluster" up >"$work/member/up.log" 2>&1 ||
    fail_fast "the member cluster did not come up: $(tail -5 "$work/member/up.log")"
member_env=$(CLUSTER_STATE_DIR=$member_state "$cluster" env) || fail_fast "cluster.sh env (member)"
member_api=$(sed -n "s/^export CIRRUS_APISERVER='\(.*\)'$/\1/p" <<<"$member_env")
member_ca=$(sed -n "s/^export CIRRUS_CA_FILE='\(.*\)'$/\1/p" <<<"$member_env")
[[ -n "$member_api" && -s "$member_ca" && "$member_api" != "$CIRRUS_APISERVER" ]] ||
    fail_fast "the member's API server and CA ($member_api, $member_ca)"
echo "   member API server $member_api (home $CIRRUS_APISERVER), up in $((SECONDS - t0)) s"
why=$(KUBECONFIG=$member_state/kubeconfig CIRRUS_APISERVER=$member_api CIRRUS_CA_FILE=$member_ca \
    operator_install_and_kubeconfig "$work/member/kubeconfig") || fail_fast "member: $why"
mk create namespace "$NS" >/dev/null || fail_fast "member: namespace $NS"

stage "the home operator's access to east: Secret east-kubeconfig"
# member_kubeconfig SERVER: a kubeconfig for the member with inline credentials: a token of the
# chart's memberAccess ServiceAccount cirrus-operator-home (helm/cirrus member-access.yaml,
# rendered with memberAccess.create=true, memberAccess.namespace=NS: a Role in NS with only
# what a home operator does in a member), else, without helm or that template, the member's
# admin credentials.
access=admin
sa=cirrus-operator-home
if HELM=$("$root/tests/operator/helm_install.sh" 2>"$work/member/helm.log") &&
    "$HELM" template cirrus "$root/helm/cirrus" --namespace cirrus-system \
        --set memberAccess.create=true --set-string memberAccess.namespace="$NS" \
        --show-only templates/member-access.yaml >"$work/member/member-access.yaml" 2>>"$work/member/helm.log" &&
    grep -q "name: $sa" "$work/member/member-access.yaml"; then
    mk apply -f "$work/member/member-access.yaml" >/dev/null || fail_fast "member: apply the chart's member-access.yaml"
    check "member: $sa may create swarmjobs in $NS" \
        mk auth can-i create swarmjobs.cirrus.dev -n "$NS" --as "system:serviceaccount:cirrus-system:$sa"
    check_not "member: $sa may not list pods in $NS" \
        mk auth can-i list pods -n "$NS" --as "system:serviceaccount:cirrus-system:$sa"
    token=$(mk -n cirrus-system create token "$sa" --duration=1h) || fail_fast "member: a token for $sa"
    access="ServiceAccount cirrus-system/$sa (the chart's memberAccess, a Role in $NS)"
fi
member_kubeconfig() {
    if [[ "$access" == admin ]]; then
        mk config view --raw --flatten --minify | sed "s#server: .*#server: $1#"
    else
        cat <<KUBECONFIG
apiVersion: v1
kind: Config
clusters:
- name: east
  cluster: {server: "$1", certificate-authority-data: "$(base64 -w0 "$member_ca")"}
users:
- name: cirrus-home
  user: {token: "$token"}
contexts:
- name: east
  context: {cluster: east, user: cirrus-home}
current-context: east
KUBECONFIG
    fi
}
echo "   credentials: $access$([[ "$access" == admin ]] && echo " (no helm or no member-access.yaml: $(tail -1 "$work/member/helm.log"))")"
# kubeconfig_secret NAME KEY SERVER: (re)writes Secret NAME at home, KEY holding a kubeconfig
# for the member at SERVER.
kubeconfig_secret() {
    member_kubeconfig "$3" >"$work/$1.kubeconfig"
    kn create secret generic "$1" --from-file="$2=$work/$1.kubeconfig" --dry-run=client -o yaml |
        kn apply -f - >/dev/null 2>&1
}
kubeconfig_secret east-kubeconfig kubeconfig "$member_api" || fail_fast "Secret east-kubeconfig"
check "the Secret's kubeconfig reaches the member and may create swarmjobs in $NS" \
    kubectl --kubeconfig "$work/east-kubeconfig.kubeconfig" -n "$NS" auth can-i create swarmjobs.cirrus.dev

stage "operators: member (plain), home (--cluster-name home)"
test_operator_start "$work/member" "$NS"
rc=$? member_pid=$op_pid op_pid=
((rc == 0)) || fail_fast "member operator not leading: $(tail -3 "$work/member/operator.log")"
# The home operator, which does all that is new here, under valgrind when the suite has a
# valgrind build (make test-operator): a use after free in its member code was found so.
home_vg=0
[[ -n "${CIRRUS_OPERATOR_VALGRIND:-}" ]] && command -v valgrind >/dev/null && home_vg=1
if ((home_vg)); then
    OPERATOR_VALGRIND=1 CIRRUS_OPERATOR=$CIRRUS_OPERATOR_VALGRIND test_operator_start "$work" "$NS" --cluster-name home
else
    test_operator_start "$work" "$NS" --cluster-name home
fi
rc=$? home_pid=$op_pid op_pid=
((rc == 0)) || fail_fast "home operator (--cluster-name home) not leading: $(tail -3 "$work/operator.log")"

# ---- helpers ---------------------------------------------------------------------------------
hjson() { kn get sj "$JOB" -o json 2>/dev/null; }  # the home job
cjson() { mkn get sj "$JOB" -o json 2>/dev/null; } # its copy in the member
# spec_region / status_region JSON_CMD REGION JQ: JQ applied to region REGION of the spec /
# status of the job that JSON_CMD prints
spec_region() { "$1" | jq -r --arg r "$2" ".spec.regions[] | select(.name == \$r) | $3"; }
status_region() { "$1" | jq -r --arg r "$2" "(.status.regions // [])[] | select(.name == \$r) | $3"; }
# A region's endpoint (host:port): spec.regions[].endpoint, status.regions[].endpoint.
EP='(.endpoint // "")'
cond() { # JSON_CMD TYPE: "STATUS REASON MESSAGE" of condition TYPE
    "$1" | jq -r --arg t "$2" '(.status.conditions // [])[] | select(.type == $t) | "\(.status) \(.reason // "") \(.message // "")"'
}
# A region's endpoint is "<address of a node of the region>:<nodePort of its WAN Service's
# port wan>" as that cluster's kubectl sees them (any node of the region: every kwok node here
# has the one address 127.0.0.1).
node_addresses() { # KUBECTL... REGION: each node of REGION's ExternalIP, else InternalIP
    local region=${*: -1}
    "${@:1:$#-1}" get nodes -l "topology.kubernetes.io/region=$region" -o json |
        jq -r '.items[] | .status.addresses as $a |
               (([$a[] | select(.type == "ExternalIP") | .address] + [$a[] | select(.type == "InternalIP") | .address])[0] // empty)' |
        sort -u
}
wan_node_port() { # KUBECTL... REGION
    local region=${*: -1}
    "${@:1:$#-1}" -n "$NS" get svc "$JOB-$region-wan" -o jsonpath='{.spec.ports[?(@.name=="wan")].nodePort}' 2>/dev/null
}
# endpoint_ok ENDPOINT KUBECTL... REGION: ENDPOINT is a node address of REGION there and the
# wan port's nodePort there
endpoint_ok() {
    local ep=$1; shift
    local port host
    port=$(wan_node_port "$@")
    host=${ep%:*}
    [[ -n "$port" && "${ep##*:}" == "$port" ]] && grep -qxF -- "$host" <<<"$(node_addresses "$@")"
}
endpoint_want() { # KUBECTL... REGION: what endpoint_ok takes, for messages
    echo "{$(node_addresses "$@" | paste -sd,)}:$(wan_node_port "$@")"
}
pod_names() { "$@" -n "$NS" get pods -l "cirrus.dev/job=$JOB" -o jsonpath='{.items[*].metadata.name}' 2>/dev/null | tr ' ' '\n' | sort | paste -sd' '; }
running() { "$@" -n "$NS" get pods -l "cirrus.dev/job=$JOB" --field-selector status.phase=Running -o name 2>/dev/null | wc -l; }
args_of() { "$@" -o jsonpath='{.spec.containers[0].args[*]}' 2>/dev/null; }
arg() { # FLAG ARGS...: the value after FLAG
    local flag=$1 prev=; shift
    for a in "$@"; do
        [[ "$prev" == "$flag" ]] && { echo "$a"; return; }
        prev=$a
    done
}
regions_entry() { tr , '\n' <<<"$1" | sed -n "s/^$2=//p"; } # LIST REGION

# ---- the job ---------------------------------------------------------------------------------
# east's garbage collector learns of the SwarmJob kind from discovery, up to 30 s after the
# CRD is installed; pods and a Secret owned by a copy made before that were seen to outlive
# the copy by minutes (the collector's checks of their unknown owner kind back off
# exponentially). A real member has the CRD long before a job: wait until a ConfigMap owned by
# a SwarmJob that does not exist is collected within 3 s, each probe a new ConfigMap.
gc_probe=0
gc_knows_swarmjobs() {
    gc_probe=$((gc_probe + 1))
    mk apply -f - >/dev/null 2>&1 <<EOF || return 1
apiVersion: v1
kind: ConfigMap
metadata:
  name: gc-probe-$gc_probe
  namespace: $NS
  ownerReferences: [{apiVersion: cirrus.dev/v1alpha1, kind: SwarmJob, name: gc-probe, uid: 00000000-0000-0000-0000-$(printf %012d "$gc_probe")}]
EOF
    local i
    for i in 1 2 3 4 5 6; do
        mkn get configmap "gc-probe-$gc_probe" >/dev/null 2>&1 || return 0
        sleep 0.5
    done
    mkn delete configmap "gc-probe-$gc_probe" --wait=false >/dev/null 2>&1
    return 1
}
t=$SECONDS
poll_until 90 gc_knows_swarmjobs || fail_fast "east's garbage collector does not collect what a missing SwarmJob owns"
echo "   east's garbage collector knows the SwarmJob kind $((SECONDS - t)) s on"

stage "apply job $JOB at home: r1 at home, r2 in cluster east, NodePort gateways"
job_yaml() { # NAME SECRET
    cat <<EOF
apiVersion: cirrus.dev/v1alpha1
kind: SwarmJob
metadata: {name: $1}
spec:
  image: cirrus:latest
  clusters: [{name: east, kubeconfigSecret: {name: $2}}]
  gateway: {serviceType: NodePort}
  runPolicy: {ttlSecondsAfterFinished: 3600, activeDeadlineSeconds: 3600}
  regions:
    - {name: r1, peers: {replicas: 1, min: 1, max: 2}, clients: 1}
    - {name: r2, cluster: east, peers: {replicas: 1, min: 1, max: 2}, clients: 1}
EOF
}
out=$(job_yaml "$JOB" east-kubeconfig | kn apply -f - 2>&1) || fail_fast "the job was refused: $out"
ok "the job (regions[].cluster, spec.clusters, gateway.serviceType NodePort) is accepted"
uid=$(kn get sj "$JOB" -o jsonpath='{.metadata.uid}')
echo "   home uid $uid"

# ---- 1. the copy -----------------------------------------------------------------------------
stage "1. the copy in east"
copy_exists() { mkn get sj "$JOB"; }
if poll_until 30 copy_exists; then ok "a SwarmJob $NS/$JOB appeared in east"; else fail_fast "no copy of the job in east after 30 s"; fi
check "the home job holds the finalizer $FINALIZER" \
    bash -c "kubectl -n '$NS' get sj '$JOB' -o jsonpath='{.metadata.finalizers}' | grep -qF '$FINALIZER'"
expect_eq "copy: spec.home.cluster" home "$(cjson | jq -r '.spec.home.cluster // ""')"
expect_eq "copy: spec.home.uid (the home job's uid)" "$uid" "$(cjson | jq -r '.spec.home.uid // ""')"
expect_eq "copy: no spec.clusters" null "$(cjson | jq -c '.spec.clusters')"
expect_eq "copy: regions, in order" "r1 r2" "$(cjson | jq -r '[.spec.regions[].name] | join(" ")')"
expect_eq "copy: r2 (its own) names no cluster" "" "$(spec_region cjson r2 '.cluster // ""')"
expect_eq "copy: r1 in cluster home" home "$(spec_region cjson r1 '.cluster // ""')"
expect_eq "copy: no TTL or deadline (the home job's lifetime rules)" "null null" \
    "$(cjson | jq -c '.spec.runPolicy.ttlSecondsAfterFinished, .spec.runPolicy.activeDeadlineSeconds' | paste -sd' ')"
copy_r1_ep() { spec_region cjson r1 "$EP"; }
copy_r1_ep_ok() { endpoint_ok "$(copy_r1_ep)" kubectl r1; }
if poll_until 30 copy_r1_ep_ok; then
    ok "copy: r1's endpoint $(copy_r1_ep) = a home r1 node's address : home r1 gateway's wan nodePort"
else
    not_ok "copy: r1's endpoint '$(copy_r1_ep)', want $(endpoint_want kubectl r1) (copy's r1: $(spec_region cjson r1 . | jq -c .))"
fi

# ---- 2. the job's PKI across the clusters ----------------------------------------------------
stage "2. the job Secrets: r2's key made in east, its certificate signed at home"
member_secret_has_r2() { [[ -n "$(mkn get secret "$JOB-pki" -o jsonpath='{.data.r2\.crt}' 2>/dev/null)" ]]; }
check "east: Secret $JOB-pki with r2.crt" poll_until 40 member_secret_has_r2
keys() { "$@" -n "$NS" get secret "$JOB-pki" -o json 2>/dev/null | jq -r '.data // {} | keys | join(" ")'; }
expect_eq "east: the Secret's keys (r2's key, request and certificate; the CA's certificate)" \
    "ca.crt r2.crt r2.csr r2.key" "$(keys mk)"
home_keys=$(keys kubectl)
expect_eq "home: the Secret's keys (the CA's key kept for east's requests; no r2 key)" \
    "ca.crt ca.key r1.crt r1.key r2.crt" "$home_keys"
check_not "the copy carries no private key" grep -q 'PRIVATE KEY' <<<"$(cjson)"
requests_answered() { [[ "$(cjson | jq -c '.status.certificateRequests // {}')" == "{}" ]]; }
check "the copy's status.certificateRequests emptied once answered" poll_until 20 requests_answered
# check_member_pki: east's r2 key, certificate and the home's CA agree (the key never left).
check_member_pki() {
    mk -n "$NS" get secret "$JOB-pki" -o jsonpath='{.data.ca\.crt}' 2>/dev/null | base64 -d >"$work/member-ca.crt"
    mk -n "$NS" get secret "$JOB-pki" -o jsonpath='{.data.r2\.crt}' 2>/dev/null | base64 -d >"$work/r2.crt"
    mk -n "$NS" get secret "$JOB-pki" -o jsonpath='{.data.r2\.key}' 2>/dev/null | base64 -d >"$work/r2.key"
    kn get secret "$JOB-pki" -o jsonpath='{.data.ca\.crt}' 2>/dev/null | base64 -d >"$work/home-ca.crt"
    kn get secret "$JOB-pki" -o jsonpath='{.data.r2\.crt}' 2>/dev/null | base64 -d >"$work/home-r2.crt"
    check "east's ca.crt is the home's" bash -c "test -s '$work/home-ca.crt' && cmp -s '$work/home-ca.crt' '$work/member-ca.crt'"
    check "east's r2.crt is the one the home signed" cmp -s "$work/home-r2.crt" "$work/r2.crt"
    check "east's r2.crt verifies against the home's CA" openssl verify -CAfile "$work/home-ca.crt" "$work/r2.crt"
    check "east's r2.crt names cirrus://$uid/r2" \
        bash -c "openssl x509 -noout -ext subjectAltName -in '$work/r2.crt' | grep -qF 'URI:cirrus://$uid/r2'"
    check "east's r2.key matches r2.crt" \
        bash -c "[[ -s '$work/r2.key' && \$(openssl x509 -noout -pubkey -in '$work/r2.crt') == \$(openssl pkey -pubout -in '$work/r2.key') ]]"
}
check_member_pki
# Events, the operators' word for it: east's made the key and request, the home signed it.
reasons() { "$@" -n "$NS" get events -o jsonpath='{range .items[*]}{.reason} {end}' 2>/dev/null; }
east_requested() { grep -qw CertificatesRequested <<<"$(reasons mk)"; }
home_issued() { grep -qw CertificateIssued <<<"$(reasons kubectl)"; }
check "east: Event CertificatesRequested" poll_until 10 east_requested
check "home: Event CertificateIssued" poll_until 10 home_issued
first_key=$(openssl pkey -pubout -in "$work/r2.key" 2>/dev/null)

# ---- 3. pods, Services, gateways -------------------------------------------------------------
stage "3. pods and gateways in both clusters"
both_running() { [[ $(running kubectl) == 3 && $(running mk) == 3 ]]; }
check "3 pods Running at home and 3 in east" poll_until 60 both_running
expect_eq "home: r1's pods only" "$JOB-r1-c0 $JOB-r1-gw $JOB-r1-s0-0" "$(pod_names kubectl)"
expect_eq "east: r2's pods only" "$JOB-r2-c0 $JOB-r2-gw $JOB-r2-s0-0" "$(pod_names mk)"
svcs() { "$@" -n "$NS" get svc -l "cirrus.dev/job=$JOB" -o jsonpath='{range .items[*]}{.metadata.name}:{.spec.type} {end}' 2>/dev/null | sed 's/ $//'; }
expect_eq "home: r1's gateway Service inside the cluster, its WAN port alone a NodePort" "$JOB-r1-gw:ClusterIP $JOB-r1-wan:NodePort" "$(svcs kubectl)"
expect_eq "east: r2's, the same" "$JOB-r2-gw:ClusterIP $JOB-r2-wan:NodePort" "$(svcs mk)"
wan_ports() { local r=$1; shift; "$@" -n "$NS" get svc "$JOB-$r-wan" -o jsonpath='{.spec.ports[*].name}' 2>/dev/null; }
expect_eq "home: the WAN Service's only port" "wan" "$(wan_ports r1 kubectl)"
mapfile -t hargs < <(args_of kn get pod "$JOB-r1-gw" | tr ' ' '\n')
mapfile -t margs < <(args_of mkn get pod "$JOB-r2-gw" | tr ' ' '\n')
expect_eq "home gateway: --job the home uid" "$uid" "$(arg --job "${hargs[@]}")"
expect_eq "east gateway: --job the home uid" "$uid" "$(arg --job "${margs[@]}")"
for p in "$JOB-r2-s0-0" "$JOB-r2-c0"; do
    expect_eq "east $p: --job the home uid" "$uid" "$(arg --job $(args_of mkn get pod "$p"))"
done
expect_eq "home gateway: --region" r1 "$(arg --region "${hargs[@]}")"
expect_eq "east gateway: --region" r2 "$(arg --region "${margs[@]}")"
hreg=$(arg --regions "${hargs[@]}")
mreg=$(arg --regions "${margs[@]}")
echo "   home gateway --regions $hreg"
echo "   east gateway --regions $mreg"
expect_eq "home gateway: --regions lists r1, r2 in order" "r1 r2" "$(tr , '\n' <<<"$hreg" | cut -d= -f1 | paste -sd' ')"
expect_eq "east gateway: --regions lists r1, r2 in order" "r1 r2" "$(tr , '\n' <<<"$mreg" | cut -d= -f1 | paste -sd' ')"
expect_eq "home gateway: r1 at its Service" "$JOB-r1-gw.$NS.svc:7443" "$(regions_entry "$hreg" r1)"
expect_eq "east gateway: r2 at its Service" "$JOB-r2-gw.$NS.svc:7443" "$(regions_entry "$mreg" r2)"
r2ep=$(regions_entry "$hreg" r2)
if endpoint_ok "$r2ep" mk r2; then ok "home gateway: r2 at east's endpoint $r2ep"; else not_ok "home gateway: r2 at '$r2ep', want $(endpoint_want mk r2)"; fi
r1ep=$(regions_entry "$mreg" r1)
if endpoint_ok "$r1ep" kubectl r1; then ok "east gateway: r1 at the home's endpoint $r1ep"; else not_ok "east gateway: r1 at '$r1ep', want $(endpoint_want kubectl r1)"; fi
expect_eq "east gateway's r1 endpoint = the copy's r1 endpoint" "$(copy_r1_ep)" "$r1ep"

# ---- 4. status -------------------------------------------------------------------------------
stage "4. status in both clusters"
copy_r2_ep() { status_region cjson r2 "$EP"; }
copy_r2_ep_ok() { endpoint_ok "$(copy_r2_ep)" mk r2; }
if poll_until 30 copy_r2_ep_ok; then ok "copy status: r2's endpoint $(copy_r2_ep)"; else not_ok "copy status: r2's endpoint '$(copy_r2_ep)', want $(endpoint_want mk r2)"; fi
expect_eq "copy status: r2's endpoint = the one home's gateway uses" "$r2ep" "$(copy_r2_ep)"
ready_mirrored() {
    local c h
    c=$(status_region cjson r2 '.readyPeersPerStage // [] | tostring')
    h=$(status_region hjson r2 '.readyPeersPerStage // [] | tostring')
    [[ "$c" == "[1]" && "$h" == "$c" ]]
}
check "home status: r2's readyPeersPerStage mirrors the copy's ([1])" poll_until 30 ready_mirrored
if ! ready_mirrored; then
    echo "   copy r2: $(status_region cjson r2 . | jq -c .)"
    echo "   home r2: $(status_region hjson r2 . | jq -c .)"
fi
expect_eq "home status: regions" "r1 r2" "$(hjson | jq -r '[(.status.regions // [])[].name] | sort | join(" ")')"
expect_eq "home status: r1's readyPeersPerStage" "[1]" "$(status_region hjson r1 '.readyPeersPerStage // [] | tostring')"
expect_eq "home status: r2's cluster" east "$(status_region hjson r2 '.cluster // ""')"
expect_eq "home status: r2's clusterReachable" true "$(status_region hjson r2 '.clusterReachable')"
cond_is() { [[ "$(cond hjson "$1" | cut -d' ' -f1)" == "$2" ]]; } # TYPE STATUS
check "home condition ClustersReachable True" poll_until 20 cond_is ClustersReachable True
# Each cluster's status shows the whole job: the copy's status.home is the home's view.
whole_in_copy() {
    [[ "$(cjson | jq -r '[(.status.home.regions // [])[].name] | sort | join(" ")')" == "r1 r2" &&
       "$(cjson | jq -r '.status.home.phase // ""')" == "$(hjson | jq -r '.status.phase // ""')" &&
       "$(cjson | jq -r '.status.home.readyRegions // ""')" == "2/2" ]]
}
if poll_until 30 whole_in_copy; then ok "copy status.home: the whole job (both regions, the home's phase, 2/2 regions ready)"; else not_ok "copy status.home: $(cjson | jq -c '.status.home')"; fi
expect_eq "copy status: its own regions only" "r2" "$(cjson | jq -r '[(.status.regions // [])[].name] | join(" ")')"
echo "   info: home readyRegions '$(hjson | jq -r '.status.readyRegions // ""')', readyPeers '$(hjson | jq -r '.status.readyPeers // ""')', phase '$(hjson | jq -r '.status.phase // ""')'; copy's phase '$(cjson | jq -r '.status.phase // ""')'"

# ---- 5. spec changes reach the copy ----------------------------------------------------------
stage "5. spec changes at home reach the copy"
copy_spec_is() { [[ "$(cjson | jq -c "$1")" == "$2" ]]; } # JQ JSON
propagated() { # WHAT JQ JSON: polls the copy for 20 s, saying how long it took
    local t=$SECONDS
    if poll_until 20 copy_spec_is "$2" "$3"; then ok "$1 reached the copy in $((SECONDS - t)) s"; else not_ok "$1: the copy's $2 is $(cjson | jq -c "$2") after 20 s, want $3"; fi
}
member_pods_are() { [[ $(pod_names mk | wc -w) == "$1" ]]; }
home_pods_are() { [[ $(pod_names kubectl | wc -w) == "$1" ]]; }
kn patch sj "$JOB" --type merge -p '{"spec":{"suspend":true}}' >/dev/null
propagated "suspend true" .spec.suspend true
check "east: r2's pods stopped (suspended)" poll_until 30 member_pods_are 0
check "home: r1's pods stopped (suspended)" poll_until 30 home_pods_are 0
kn patch sj "$JOB" --type merge -p '{"spec":{"suspend":false}}' >/dev/null
propagated "suspend false" .spec.suspend false
check "east: r2's 3 pods back, home: r1's 3 back" poll_until 60 both_running
kn patch sj "$JOB" --type merge -p '{"spec":{"peersPerStage":2}}' >/dev/null
propagated "peersPerStage 2" .spec.peersPerStage 2
check "east: r2 has 2 peers" poll_until 30 mkn get pod "$JOB-r2-s0-1"
check "home: r1 has 2 peers" poll_until 30 kn get pod "$JOB-r1-s0-1"
# Someone deletes the copy in east: its pods and Secret go with it (the copy owns them); the
# home makes the copy again, east's operator a new Secret with a new key, and the home signs
# its request, so r2's gateway can start again.
old_copy_uid=$(cjson | jq -r .metadata.uid)
mkn delete sj "$JOB" --wait=true --timeout=30s >/dev/null 2>&1
copy_again() { local u; u=$(cjson | jq -r '.metadata.uid // ""'); [[ -n "$u" && "$u" != "$old_copy_uid" ]]; }
check "east: the copy deleted by hand is made again by the home" poll_until 30 copy_again
# The old copy's Secret lingers until east's garbage collector removes it (the delete above
# waited for the copy, not for what it owned); east's operator makes the new one after that.
secret_owner() { mkn get secret "$JOB-pki" -o jsonpath='{.metadata.ownerReferences[0].uid}' 2>/dev/null; }
secret_of_new_copy() { [[ "$(secret_owner)" == "$(cjson | jq -r .metadata.uid)" ]]; }
if poll_until 30 secret_of_new_copy; then ok "east: its Secret $JOB-pki again, owned by the new copy"; else not_ok "east: the Secret $JOB-pki is owned by '$(secret_owner)', not the new copy $(cjson | jq -r .metadata.uid)"; fi
check "east: the new Secret's r2.crt" poll_until 40 member_secret_has_r2
check_member_pki
check_not "east: r2's key is a new one" test "$first_key" == "$(openssl pkey -pubout -in "$work/r2.key" 2>/dev/null)"
check "east: r2's gateway made again" poll_until 30 mkn get pod "$JOB-r2-gw"

# ---- 6. the member unreachable ---------------------------------------------------------------
stage "6. east unreachable (its kubeconfig's server a dead port), then restored"
dead=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
kubeconfig_secret east-kubeconfig kubeconfig "https://127.0.0.1:$dead" || not_ok "rewrite Secret east-kubeconfig"
cond_unreachable() { cond_is ClustersReachable False; }
t=$SECONDS
if poll_until 30 cond_unreachable; then ok "home condition ClustersReachable False $((SECONDS - t)) s after"; else not_ok "ClustersReachable still '$(cond hjson ClustersReachable)' 30 s after"; fi
c=$(cond hjson ClustersReachable)
expect_eq "ClustersReachable's reason" MemberUnreachable "$(cut -d' ' -f2 <<<"$c")"
check "ClustersReachable's message names east ($(cut -d' ' -f3- <<<"$c"))" grep -qw east <<<"$(cut -d' ' -f3- <<<"$c")"
r2_unreachable() { [[ "$(status_region hjson r2 '.clusterReachable')" == false ]]; }
check "home status: r2 kept, clusterReachable false" poll_until 10 r2_unreachable
expect_eq "home status: r2's cluster still east" east "$(status_region hjson r2 '.cluster // ""')"
check_not "home job not Failed while east is unreachable" job_phase_is "$JOB" Failed
kubeconfig_secret east-kubeconfig kubeconfig "$member_api" || not_ok "restore Secret east-kubeconfig"
t=$SECONDS
if poll_until 30 cond_is ClustersReachable True; then ok "restored: ClustersReachable True $((SECONDS - t)) s after"; else not_ok "restored: ClustersReachable '$(cond hjson ClustersReachable)' 30 s after"; fi
r2_reachable() { [[ "$(status_region hjson r2 '.clusterReachable')" == true ]]; }
check "restored: r2 clusterReachable true" poll_until 10 r2_reachable

# ---- 7. a kubeconfig Secret without its key -------------------------------------------------
stage "7. job ${JOB}bad: its kubeconfig Secret lacks the key kubeconfig"
kubeconfig_secret bad-kubeconfig config "$member_api" || not_ok "Secret bad-kubeconfig"
out=$(job_yaml "${JOB}bad" bad-kubeconfig | kn apply -f - 2>&1) || not_ok "${JOB}bad refused: $out"
bad_cond() { # the first condition False whose message names the Secret
    kn get sj "${JOB}bad" -o json 2>/dev/null |
        jq -r '(.status.conditions // [])[] | select(.status == "False" and ((.message // "") | test("bad-kubeconfig"))) | "\(.type) \(.reason // "") \(.message)"' | head -1
}
has_bad_cond() { [[ -n "$(bad_cond)" ]]; }
if poll_until 30 has_bad_cond; then
    ok "${JOB}bad: condition False naming the Secret: $(bad_cond)"
    # The key's name, apart from the Secret's (bad-kubeconfig).
    check "${JOB}bad: the condition names the missing key kubeconfig" grep -qP '(?<!bad-)kubeconfig' <<<"$(bad_cond | cut -d' ' -f3-)"
    expect_eq "${JOB}bad: its reason (the Secret is at fault, not the member)" MemberConfigInvalid "$(bad_cond | cut -d' ' -f2)"
else
    not_ok "${JOB}bad: no condition False naming bad-kubeconfig after 30 s: $(kn get sj "${JOB}bad" -o json | jq -c '.status.conditions')"
fi
check "${JOB}bad: no copy in east" bash -c "! kubectl --kubeconfig '$member_state/kubeconfig' -n '$NS' get sj '${JOB}bad'"
check "home operator still running" kill -0 "$home_pid"
check "the good job still reachable: ClustersReachable True" cond_is ClustersReachable True

# ---- 8. deleting the home job ----------------------------------------------------------------
stage "8. delete the home job (its kubeconfig Secret deleted first, as a namespace's deletion may)"
kn delete secret east-kubeconfig >/dev/null
kn delete sj "$JOB" --wait=false >/dev/null
copy_gone() { ! mkn get sj "$JOB"; }
member_secret_gone() { ! mkn get secret "$JOB-pki"; }
home_gone() { ! kn get sj "$JOB"; }
t=$SECONDS
check "east: the copy deleted" poll_until 30 copy_gone
check "east: its Secret $JOB-pki deleted" poll_until 30 member_secret_gone
check "east: r2's pods deleted" poll_until 30 member_pods_are 0
if poll_until 30 home_gone; then ok "home: the job gone $((SECONDS - t)) s after (its finalizer removed)"; else not_ok "home: the job still there, finalizers $(kn get sj "$JOB" -o jsonpath='{.metadata.finalizers}')"; fi

# ---- the end ---------------------------------------------------------------------------------
stage "the operators' logs; SIGTERM"
check_not "home operator: no request refused (403)" grep -qwiE "403|forbidden" "$work/operator.log"
check_not "member operator: no request refused (403)" grep -qwiE "403|forbidden" "$work/member/operator.log"
op_pid=$member_pid; member_pid=
test_operator_stop
expect_eq "member operator exits 0 on SIGTERM" 0 "$?"
op_pid=$home_pid; home_pid=
test_operator_stop
expect_eq "home operator exits 0 on SIGTERM" 0 "$?"
((home_vg)) && OPERATOR_VALGRIND=1 check_valgrind_clean "$work"
check "home operator: one connection per member (made once, not at every poll)" \
    test "$(grep -c "member cluster east at" "$work/operator.log")" -le 3
finish
