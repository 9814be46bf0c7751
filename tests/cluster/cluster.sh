#!/usr/bin/env bash
# A real Kubernetes control plane on 127.0.0.1 for the operator tests:
# etcd + kube-apiserver + kube-controller-manager + kube-scheduler + kwok (fake kubelets).
#
#   cluster.sh up     start it (binaries from install.sh), create fake nodes, wait until Ready
#   cluster.sh down   stop everything that `up` started (also after a failed `up`), remove state
#   cluster.sh env    print export lines (KUBECONFIG, PATH, ...) for a running cluster
#   cluster.sh status show which components are running
#   cluster.sh restart-apiserver
#                     stop kube-apiserver and start it again with the same flags (what an
#                     upgrade or a crash looks like to clients), wait until it is ready
#   cluster.sh fake-node NAME REGION POOL
#                     print the manifest of one more kwok node like `up` makes
#
# State (certificates, kubeconfigs, etcd data, logs, PIDs) lives in CLUSTER_STATE_DIR
# (default: <repo>/build/cluster). Ports are free random ones unless set with
# CLUSTER_ETCD_PORT, CLUSTER_ETCD_PEER_PORT, CLUSTER_API_PORT, CLUSTER_KCM_PORT,
# CLUSTER_SCHED_PORT, CLUSTER_KWOK_PORT; CLUSTER_SERVICE_CIDR the Services' addresses (default
# 10.0.0.0/24). CLUSTER_NODES_PER_POOL (default 1) fake nodes are
# created for each region (r1, r2) and pool (on-demand, spot); 0 makes none (tests/nodes/
# adds real ones). CLUSTER_API_ADDRESS (default 127.0.0.1) is the address kube-apiserver
# binds and advertises: one that pods can reach gives the `kubernetes` Service endpoints.
set -euo pipefail
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

STATE=${CLUSTER_STATE_DIR:-$CLUSTER_DIR/../../build/cluster}
mkdir -p "$(dirname "$STATE")"
STATE="$(cd "$(dirname "$STATE")" && pwd)/$(basename "$STATE")"
MARKER="$STATE/.cirrus-cluster"
PKI="$STATE/pki"
LOGS="$STATE/logs"
PIDS="$STATE/pids"
KUBECTL="$K8S_BIN/kubectl"
ADMIN_KUBECONFIG="$STATE/kubeconfig"

REGIONS=(r1 r2)
POOLS=(on-demand spot)
NODES_PER_POOL=${CLUSTER_NODES_PER_POOL:-1}
# 254 Service addresses by default; CLUSTER_SERVICE_CIDR widens it (bench-operator's 1,000
# jobs have 2,000 gateway Services). It must start at 10.0.0.0 (the certificate names
# SERVICE_IP) and must not overlap the real nodes' pod network (tests/nodes: 10.89.0.0/16).
SERVICE_CIDR=${CLUSTER_SERVICE_CIDR:-10.0.0.0/24}
SERVICE_IP=10.0.0.1 # first address of SERVICE_CIDR: the `kubernetes` Service
START_TIMEOUT=${CLUSTER_START_TIMEOUT:-90}
API_ADDRESS=${CLUSTER_API_ADDRESS:-127.0.0.1}
# Kubernetes's gang scheduling (alpha in this release: the PodGroup API, pods' spec.
# schedulingGroup, the scheduler's GangScheduling plugin, the controller-manager's PodGroup
# protection), which a SwarmJob's spec.gangScheduling uses (tests/operator/gang_test.sh).
FEATURE_GATES=GenericWorkload=true,GangScheduling=true

# ---- helpers -------------------------------------------------------------------------------

port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

USED_PORTS=" "
# Ports are taken below the kernel's ephemeral range: a port inside it can be grabbed by an
# outgoing connection of a component started earlier (the apiserver's to etcd, say) before
# the component it was meant for binds it ("address already in use").
EPHEMERAL_LOW=$(cut -f1 /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)
[[ "$EPHEMERAL_LOW" =~ ^[0-9]+$ ]] && ((EPHEMERAL_LOW > 12000)) || EPHEMERAL_LOW=32768
free_port() { # prints a free port in 10000..ephemeral-1 not handed out before
    local p i
    for ((i = 0; i < 200; i++)); do
        p=$((10000 + (RANDOM * 32768 + RANDOM) % (EPHEMERAL_LOW - 10000)))
        [[ "$USED_PORTS" == *" $p "* ]] && continue
        port_in_use "$p" && continue
        echo "$p"
        return 0
    done
    die "no free port found"
}

pick_port() { # VAR: use $VAR if set (and free), else a random free port
    local var=$1 p=${!1:-}
    if [[ -n "$p" ]]; then
        port_in_use "$p" && die "port $p ($var) is already in use"
    else
        p=$(free_port)
    fi
    USED_PORTS+="$p "
    printf -v "$var" '%s' "$p"
    echo "$var=$p" >>"$STATE/ports"
}

# Start a component in its own session, stdout/stderr to logs/<name>.log, PID to pids/<name>.
start() {
    local name=$1; shift
    local exe="$K8S_BIN/$1"; shift
    setsid "$exe" "$@" </dev/null >"$LOGS/$name.log" 2>&1 &
    local pid=$! i
    echo "$pid $exe" >"$PIDS/$name"
    disown "$pid" # not a job of this shell: no "Killed" notices when `down` stops it
    # Until it has exec'd the binary the child is still a shell, and alive() would take a
    # component that is starting for one that exited (seen on a loaded machine as "etcd
    # exited while waiting for etcd" with an empty log): wait for the exec.
    for ((i = 0; i < 400; i++)); do
        [[ "$(readlink "/proc/$pid/exe" 2>/dev/null)" == "$exe" || ! -d /proc/$pid ]] && return 0
        sleep 0.025
    done
}

# PID of a component started by `up`, if it is still that process.
pid_of() {
    local f="$PIDS/$1" pid exe
    [[ -f "$f" ]] || return 1
    read -r pid exe <"$f"
    [[ -n "$pid" && -d "/proc/$pid" ]] || return 1
    [[ "$(readlink "/proc/$pid/exe" 2>/dev/null)" == "$exe" ]] || return 1
    echo "$pid"
}

alive() { pid_of "$1" >/dev/null; }

COMPONENTS=(etcd kube-apiserver kube-controller-manager kube-scheduler kwok)

# stop SIGNAL NAME...: signal the named components, wait up to 10s for them, then SIGKILL.
stop() {
    local sig=$1 name pid i stopped=()
    shift
    for name in "$@"; do
        if pid=$(pid_of "$name"); then
            kill "-$sig" "$pid" 2>/dev/null || true
            stopped+=("$name:$pid")
        fi
    done
    for entry in "${stopped[@]}"; do
        pid=${entry#*:}
        for ((i = 0; i < 100; i++)); do [[ -d /proc/$pid ]] || break; sleep 0.1; done
        if [[ -d /proc/$pid ]]; then
            log "${entry%%:*} ($pid) did not stop in 10s; killing it"
            kill -KILL "$pid" 2>/dev/null || true
        fi
    done
}

stop_all() {
    # etcd last: kube-apiserver's graceful shutdown can hang once etcd is gone. etcd's data is
    # thrown away, so it need not shut down cleanly.
    stop TERM kwok kube-scheduler kube-controller-manager kube-apiserver
    stop KILL etcd
    rm -rf "$PIDS"
}

k() { "$KUBECTL" --kubeconfig "$ADMIN_KUBECONFIG" "$@"; }

# wait_for DESCRIPTION TIMEOUT_S COMPONENT-THAT-MUST-STAY-ALIVE COMMAND...
wait_for() {
    local what=$1 timeout=$2 comp=$3; shift 3
    local deadline=$((SECONDS + timeout))
    until "$@" >/dev/null 2>&1; do
        if [[ -n "$comp" ]] && ! alive "$comp"; then
            die "$comp exited while waiting for $what (see $LOGS/$comp.log)"
        fi
        ((SECONDS < deadline)) || die "timed out after ${timeout}s waiting for $what"
        sleep 0.25
    done
}

# ---- certificates (openssl) ----------------------------------------------------------------


gen_pki() {
    mkdir -p "$PKI"
    gen_key "$PKI/ca.key"
    openssl req -x509 -new -key "$PKI/ca.key" -subj "/CN=cirrus-test-ca" -days 365 -sha256 \
        -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
        -out "$PKI/ca.crt" 2>/dev/null
    local server_ext="basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=IP:127.0.0.1,IP:$API_ADDRESS,DNS:localhost,IP:$SERVICE_IP,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
    local client_ext="basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=clientAuth"
    sign serving "/CN=kube-apiserver" "$server_ext" # also serves the KCM/scheduler health ports
    sign admin "/O=system:masters/CN=cirrus-admin" "$client_ext"
    # What kube-apiserver shows kubelets (logs, exec): a client of the cluster CA.
    sign apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" "$client_ext"
    sign kube-controller-manager "/CN=system:kube-controller-manager" "$client_ext"
    sign kube-scheduler "/CN=system:kube-scheduler" "$client_ext"
    # Service-account token signing key pair.
    gen_key "$PKI/sa.key"
    openssl pkey -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub" 2>/dev/null
    chmod 600 "$PKI"/*.key
}

# ---- fake nodes ----------------------------------------------------------------------------

# fake_node NAME REGION POOL: one kwok node's manifest (32 CPUs, 110 pods) in REGION's zone
# REGION-a and pool POOL (also `cluster.sh fake-node`, for tests that add a node).
fake_node() {
    cat <<EOF
---
apiVersion: v1
kind: Node
metadata:
  name: $1
  annotations:
    node.alpha.kubernetes.io/ttl: "0"
  labels:
    kubernetes.io/hostname: $1
    kubernetes.io/os: linux
    kubernetes.io/arch: amd64
    type: kwok
    kwok.x-k8s.io/node: fake
    topology.kubernetes.io/region: $2
    topology.kubernetes.io/zone: $2-a
    cirrus.dev/pool: $3
spec: {}
status:
  capacity: &capacity
    cpu: "32"
    memory: 256Gi
    pods: "110"
    ephemeral-storage: 1Ti
    nvidia.com/gpu: "8"
  allocatable: *capacity
  nodeInfo:
    architecture: amd64
    operatingSystem: linux
    kubeletVersion: fake
EOF
}

node_manifests() {
    local r p i
    for r in "${REGIONS[@]}"; do
        for p in "${POOLS[@]}"; do
            for ((i = 0; i < NODES_PER_POOL; i++)); do fake_node "cirrus-$r-$p-$i" "$r" "$p"; done
        done
    done
}

nodes_ready() {
    local out
    out=$(k get nodes -l kwok.x-k8s.io/node=fake \
        -o jsonpath='{range .items[*]}{.metadata.name} {.status.conditions[?(@.type=="Ready")].status} {.spec.taints[*].key}{"\n"}{end}')
    [[ $(grep -c . <<<"$out") -eq $((${#REGIONS[@]} * ${#POOLS[@]} * NODES_PER_POOL)) ]] || return 1
    # Ready, and the node lifecycle controller has lifted its not-ready taint.
    ! grep -qvE '^[^ ]+ True *$' <<<"$out"
}

# ---- commands ------------------------------------------------------------------------------

cmd_down() {
    if [[ ! -e "$STATE" ]]; then
        log "down: nothing at $STATE"
        return 0
    fi
    [[ -e "$MARKER" ]] || die "$STATE was not made by cluster.sh up; not removing it"
    stop_all
    rm -rf "$STATE"
    log "down: stopped and removed $STATE"
}

cmd_status() {
    local name pid rc=0
    for name in "${COMPONENTS[@]}"; do
        if pid=$(pid_of "$name"); then echo "$name: running (pid $pid)"; else echo "$name: not running"; rc=1; fi
    done
    return $rc
}

cmd_env() {
    if [[ ! -f "$STATE/ports" ]] || ! alive kube-apiserver; then
        die "no cluster running at $STATE (run: cluster.sh up)"
    fi
    # shellcheck disable=SC1091
    source "$STATE/ports"
    cat <<EOF
export KUBECONFIG='$ADMIN_KUBECONFIG'
export PATH='$K8S_BIN':"\$PATH"
export CIRRUS_CLUSTER_STATE='$STATE'
export CIRRUS_K8S_BIN='$K8S_BIN'
export CIRRUS_K8S_VERSION='$K8S_VERSION'
export CIRRUS_APISERVER='https://$API_ADDRESS:$CLUSTER_API_PORT'
export CIRRUS_CA_FILE='$PKI/ca.crt'
EOF
}

UP_OK=0
on_up_exit() {
    ((UP_OK)) && return 0
    log "up failed; stopping what was started. Last lines of the component logs:"
    local f
    for f in "$LOGS"/*.log; do
        [[ -s "$f" ]] || continue
        printf -- '----- %s\n' "$(basename "$f")" >&2
        tail -n 15 "$f" >&2
    done
    stop_all
    rm -rf "$STATE/etcd"
    log "logs kept in $LOGS; 'cluster.sh down' removes them"
}

cmd_up() {
    local b
    for b in "${K8S_BINARIES[@]}"; do
        [[ -x "$K8S_BIN/$b" ]] || die "$K8S_BIN/$b is missing: run tests/cluster/install.sh first"
    done
    [[ -s "$KWOK_STAGES" ]] || die "$KWOK_STAGES is missing: run tests/cluster/install.sh first"
    command -v openssl >/dev/null || die "openssl is needed: apt-get install openssl (as root)"

    if [[ -e "$STATE" ]]; then
        [[ -e "$MARKER" ]] || die "$STATE exists and was not made by cluster.sh; remove it or set CLUSTER_STATE_DIR"
        if cmd_status >/dev/null; then
            log "up: already running at $STATE"
            return 0
        fi
        log "up: removing the leftovers of an earlier run"
        cmd_down
    fi

    trap on_up_exit EXIT
    trap 'exit 130' INT TERM
    local t0=$SECONDS
    mkdir -p "$STATE" "$LOGS" "$PIDS"
    touch "$MARKER"
    : >"$STATE/ports"
    pick_port CLUSTER_ETCD_PORT
    pick_port CLUSTER_ETCD_PEER_PORT
    pick_port CLUSTER_API_PORT
    pick_port CLUSTER_KCM_PORT
    pick_port CLUSTER_SCHED_PORT
    pick_port CLUSTER_KWOK_PORT

    log "up: Kubernetes $K8S_VERSION in $STATE (apiserver https://$API_ADDRESS:$CLUSTER_API_PORT)"
    gen_pki
    write_kubeconfig "$ADMIN_KUBECONFIG" admin cirrus-admin
    write_kubeconfig "$STATE/kube-controller-manager.kubeconfig" kube-controller-manager system:kube-controller-manager
    write_kubeconfig "$STATE/kube-scheduler.kubeconfig" kube-scheduler system:kube-scheduler

    local etcd_url="http://127.0.0.1:$CLUSTER_ETCD_PORT" peer_url="http://127.0.0.1:$CLUSTER_ETCD_PEER_PORT"
    log "up: starting etcd (127.0.0.1:$CLUSTER_ETCD_PORT)"
    start etcd etcd --name cirrus --data-dir "$STATE/etcd" --unsafe-no-fsync \
        --listen-client-urls "$etcd_url" --advertise-client-urls "$etcd_url" \
        --listen-peer-urls "$peer_url" --initial-advertise-peer-urls "$peer_url" \
        --initial-cluster "cirrus=$peer_url" --initial-cluster-state new \
        --log-level warn
    wait_for "etcd" 30 etcd port_in_use "$CLUSTER_ETCD_PORT"

    log "up: starting kube-apiserver ($API_ADDRESS:$CLUSTER_API_PORT)"
    # The `kubernetes` Service gets endpoints only when pods can reach the advertised address.
    local reconciler=lease
    [[ "$API_ADDRESS" == 127.* ]] && reconciler=none
    start kube-apiserver kube-apiserver \
        --etcd-servers "$etcd_url" \
        --bind-address "$API_ADDRESS" --advertise-address "$API_ADDRESS" --secure-port "$CLUSTER_API_PORT" \
        --cert-dir "$PKI" --tls-cert-file "$PKI/serving.crt" --tls-private-key-file "$PKI/serving.key" \
        --client-ca-file "$PKI/ca.crt" \
        --authorization-mode Node,RBAC \
        --service-account-issuer https://kubernetes.default.svc.cluster.local \
        --service-account-key-file "$PKI/sa.pub" \
        --service-account-signing-key-file "$PKI/sa.key" \
        --service-cluster-ip-range "$SERVICE_CIDR" \
        --allow-privileged=true \
        --endpoint-reconciler-type "$reconciler" \
        --kubelet-client-certificate "$PKI/apiserver-kubelet-client.crt" \
        --kubelet-client-key "$PKI/apiserver-kubelet-client.key" \
        --kubelet-preferred-address-types InternalIP,Hostname \
        --feature-gates "$FEATURE_GATES" --runtime-config scheduling.k8s.io/v1alpha2=true \
        --profiling=false
    wait_for "kube-apiserver /readyz" "$START_TIMEOUT" kube-apiserver k get --raw /readyz

    log "up: starting kube-controller-manager, kube-scheduler, kwok"
    start kube-controller-manager kube-controller-manager \
        --kubeconfig "$STATE/kube-controller-manager.kubeconfig" \
        --bind-address 127.0.0.1 --secure-port "$CLUSTER_KCM_PORT" \
        --tls-cert-file "$PKI/serving.crt" --tls-private-key-file "$PKI/serving.key" \
        --leader-elect=false \
        --controllers "${CLUSTER_KCM_CONTROLLERS:-*}" \
        --use-service-account-credentials=true \
        --service-account-private-key-file "$PKI/sa.key" \
        --root-ca-file "$PKI/ca.crt" \
        --cluster-signing-cert-file "$PKI/ca.crt" --cluster-signing-key-file "$PKI/ca.key" \
        --service-cluster-ip-range "$SERVICE_CIDR" \
        --feature-gates "$FEATURE_GATES" \
        --profiling=false
    start kube-scheduler kube-scheduler \
        --kubeconfig "$STATE/kube-scheduler.kubeconfig" \
        --bind-address 127.0.0.1 --secure-port "$CLUSTER_SCHED_PORT" \
        --tls-cert-file "$PKI/serving.crt" --tls-private-key-file "$PKI/serving.key" \
        --leader-elect=false \
        --feature-gates "$FEATURE_GATES" \
        --profiling=false
    # kwok plays the kubelet for every node labelled kwok.x-k8s.io/node=fake (tests can remove
    # the label to make a node stop heart-beating, e.g. to simulate a lost spot node).
    # kwok's pod-delete stage deletes by name, with no uid precondition (a real kubelet sends
    # the pod's uid), and it also fires on a deletion with grace period 0, which the API server
    # completes by itself: that late delete then lands on a replacement made under the same
    # name meanwhile (the operator's in-place re-creation), seen as one more preemption. Play it
    # only for deletions that wait for a kubelet (grace period > 0).
    awk '/^  name: / { del = ($2 == "pod-delete") }
         { print }
         del && /operator: .Exists./ {
             print "    - key: '"'"'.metadata.deletionGracePeriodSeconds > 0'"'"'"
             print "      operator: '"'"'In'"'"'"
             print "      values:"
             print "      - '"'"'true'"'"'"
             del = 0
         }' "$KWOK_STAGES" >"$STATE/kwok-stages.yaml"
    start kwok kwok \
        --kubeconfig "$ADMIN_KUBECONFIG" \
        --config "$STATE/kwok-stages.yaml" \
        --manage-nodes-with-label-selector kwok.x-k8s.io/node=fake \
        --node-lease-duration-seconds 40 \
        --server-address "127.0.0.1:$CLUSTER_KWOK_PORT" \
        --node-ip 127.0.0.1 \
        --cidr 10.244.0.1/16

    log "up: creating $((${#REGIONS[@]} * ${#POOLS[@]} * NODES_PER_POOL)) fake nodes (regions ${REGIONS[*]}; pools ${POOLS[*]})"
    ((NODES_PER_POOL == 0)) || node_manifests | k apply -f - >/dev/null

    log "up: waiting for the controller-manager, the scheduler and Ready nodes"
    local comp port
    for comp in kube-controller-manager:$CLUSTER_KCM_PORT kube-scheduler:$CLUSTER_SCHED_PORT; do
        port=${comp#*:}; comp=${comp%%:*}
        wait_for "$comp /healthz" "$START_TIMEOUT" "$comp" k --server "https://127.0.0.1:$port" get --raw /healthz
    done
    wait_for "the default ServiceAccount" "$START_TIMEOUT" kube-controller-manager k -n default get serviceaccount default
    ((NODES_PER_POOL == 0)) || wait_for "Ready nodes" "$START_TIMEOUT" kwok nodes_ready
    alive kwok || die "kwok exited (see $LOGS/kwok.log)"

    UP_OK=1
    log "up: ready in $((SECONDS - t0))s; KUBECONFIG=$ADMIN_KUBECONFIG (eval \"\$(tests/cluster/cluster.sh env)\")"
}

cmd_restart_apiserver() {
    local pid args
    pid=$(pid_of kube-apiserver) || die "kube-apiserver is not running"
    mapfile -d '' args <"/proc/$pid/cmdline"
    log "restart-apiserver: stopping kube-apiserver ($pid)"
    stop TERM kube-apiserver
    start kube-apiserver kube-apiserver "${args[@]:1}"
    wait_for "kube-apiserver /readyz" "$START_TIMEOUT" kube-apiserver k get --raw /readyz
    log "restart-apiserver: ready again"
}

case "${1:-}" in
up) cmd_up ;;
restart-apiserver) cmd_restart_apiserver ;;
fake-node) fake_node "${2:?NAME}" "${3:?REGION}" "${4:?POOL}" ;;
down) cmd_down ;;
env) cmd_env ;;
status) cmd_status ;;
*)
    echo "usage: $0 up|down|env|status|restart-apiserver|fake-node NAME REGION POOL" >&2
    exit 2
    ;;
esac
