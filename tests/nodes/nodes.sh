#!/usr/bin/env bash
# Real Kubernetes nodes on this machine, in a control plane of their own:
#
#   nodes.sh up     the control plane (tests/cluster/cluster.sh, no fake nodes, kube-apiserver
#                   on $HOST_IP so that pods reach it), then per region (r1, r2) a node made of
#                   its own containerd (+ runc) and a kubelet, with a CNI bridge and pod subnet
#                   of its own, the images from image.sh imported; kube-proxy (iptables) and
#                   CoreDNS for Services; waits until the nodes are Ready and DNS answers
#   nodes.sh down   delete the pods through the API (so that CNI tears their networks down),
#                   stop everything, and undo every change to the machine (see below)
#   nodes.sh env    export lines for a running set (KUBECONFIG, PATH, ...)
#
# Root is required. Global changes, recorded in $STATE/saved before they are made and undone
# by `down` (also after a failed `up`): the address $HOST_IP on lo; the sysctls the kubelet,
# kube-proxy and the bridges change; iptables and ip6tables rules (saved and restored whole);
# the bridges; cgroups under /<node name>; mounts under $STATE; /run/containerd, /var/lib/cni,
# /etc/cni and /var/lib/kubelet when they did not exist before.
#
# The regions' bridges are joined through the host; `nodes.sh shape MBIT` limits what the host
# routes into each region's bridge (tc tbf), which is the WAN the gateways see; traffic inside
# a region is bridged and not limited. `nodes.sh shape off` removes it.
set -euo pipefail
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

STATE=${NODES_STATE_DIR:-$REPO_DIR/build/nodes}
mkdir -p "$(dirname "$STATE")"
STATE="$(cd "$(dirname "$STATE")" && pwd)/$(basename "$STATE")"
MARKER=$STATE/.cirrus-nodes
SAVED=$STATE/saved
LOGS=$STATE/logs
PIDS=$STATE/pids
# Sockets and runtime state: a short path (unix socket names are limited to 108 bytes).
RUN=/run/cirrus-nodes/$(printf '%s' "$STATE" | md5sum | cut -c1-8)
CLUSTER_STATE=$STATE/cluster

HOST_IP=10.89.0.1 # on lo: kube-apiserver, the kubelets, CoreDNS
POD_NET=10.89.0.0/16                # region rN's pods: 10.89.N.0/24 on bridge cirrus-rN
REGIONS=(r1 r2)
START_TIMEOUT=${NODES_START_TIMEOUT:-120}
GLOBAL_DIRS=(/run/containerd /var/lib/cni /etc/cni /var/lib/kubelet /var/log/containers /var/log/pods)

k() { "$K8S_BIN/kubectl" --kubeconfig "$CLUSTER_STATE/kubeconfig" "$@"; }
region_index() { echo "${1#r}"; }
node_name() { echo "cirrus-$1"; }
bridge_of() { echo "cirrus-$1"; }
subnet_of() { echo "10.89.$(region_index "$1").0/24"; }

# ---- processes -----------------------------------------------------------------------------

start() { # NAME COMMAND...: run in its own session, log and pid in the state dir
    local name=$1; shift
    setsid "$@" >"$LOGS/$name.log" 2>&1 </dev/null &
    echo $! >"$PIDS/$name"
}
pid_of() { [[ -s "$PIDS/$1" ]] && kill -0 "$(cat "$PIDS/$1")" 2>/dev/null && cat "$PIDS/$1"; }
alive() { pid_of "$1" >/dev/null; }
stop() { # NAME...: TERM the session, KILL after 10 s
    local name pid i
    for name in "$@"; do
        pid=$(pid_of "$name") || continue
        kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
        for ((i = 0; i < 100; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -KILL -- "-$pid" 2>/dev/null || true
        rm -f "$PIDS/$name"
    done
}
wait_for() { # DESCRIPTION TIMEOUT COMPONENT COMMAND...
    local what=$1 timeout=$2 comp=$3; shift 3
    local deadline=$((SECONDS + timeout))
    until "$@" >/dev/null 2>&1; do
        [[ -z "$comp" ]] || alive "$comp" || ndie "$comp exited while waiting for $what (see $LOGS/$comp.log)"
        ((SECONDS < deadline)) || ndie "timed out after ${timeout}s waiting for $what"
        sleep 0.5
    done
}

# ---- saving and restoring the machine's state ----------------------------------------------

save_host() {
    mkdir -p "$SAVED"
    local s
    for s in "${SYSCTLS[@]}"; do
        sysctl -n "$s" >/dev/null 2>&1 && printf '%s=%s\n' "$s" "$(sysctl -n "$s")"
    done >"$SAVED/sysctl"
    iptables-save >"$SAVED/iptables"
    ip6tables-save >"$SAVED/ip6tables" 2>/dev/null || : >"$SAVED/ip6tables"
    local d
    for d in "${GLOBAL_DIRS[@]}"; do [[ -e "$d" ]] || echo "$d"; done >"$SAVED/new-dirs"
}

restore_host() {
    [[ -d "$SAVED" ]] || return 0
    local line
    while IFS= read -r line; do
        sysctl -q -w "$line" >/dev/null 2>&1 || nlog "down: could not restore sysctl $line"
    done <"$SAVED/sysctl"
    # Every rule and chain goes (iptables-restore keeps chains of tables it was not given),
    # then the saved ones come back.
    local t
    for t in filter nat mangle raw; do
        iptables -t "$t" -F 2>/dev/null && iptables -t "$t" -X 2>/dev/null
        ip6tables -t "$t" -F 2>/dev/null && ip6tables -t "$t" -X 2>/dev/null
    done
    iptables-restore <"$SAVED/iptables" || nlog "down: iptables-restore failed"
    [[ -s "$SAVED/ip6tables" ]] && { ip6tables-restore <"$SAVED/ip6tables" || nlog "down: ip6tables-restore failed"; }
    while IFS= read -r line; do
        [[ -n "$line" ]] && rm -rf "$line"
    done <"$SAVED/new-dirs"
}

unmount_under() { # unmount everything mounted under DIR, deepest first
    local m
    awk -v d="$1/" 'index($2, d) == 1 { print $2 }' /proc/self/mounts | sort -r | while read -r m; do
        umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
    done
}

kill_cgroup_procs() { # ROOT: SIGKILL every process left in the node's cgroups (its containers)
    local root=$1
    find /sys/fs/cgroup/*/"$root" /sys/fs/cgroup/"$root" -name cgroup.procs -exec cat {} + 2>/dev/null |
        sort -u | xargs -r kill -KILL 2>/dev/null || true
}

remove_cgroups() { # remove the node's cgroup trees (children first), in every hierarchy
    local root=$1 h
    for h in /sys/fs/cgroup/*/ /sys/fs/cgroup/; do
        [[ -d "$h$root" ]] || continue
        find "$h$root" -depth -type d -exec rmdir {} \; 2>/dev/null || true
    done
}

# ---- a node: containerd + kubelet ----------------------------------------------------------

write_containerd_config() { # REGION
    local r=$1 dir=$STATE/$1
    cat >"$dir/containerd.toml" <<EOF
version = 2
root = "$dir/containerd"
state = "$RUN/$r/containerd"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.internal.v1.opt", "io.containerd.tracing.processor.v1.otlp"]
[grpc]
  address = "$RUN/$r/containerd.sock"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  # runc cannot write oom_score_adj here (root without CAP_SYS_RESOURCE): sandboxes would fail
  # with "can't get final child's PID from pipe".
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "$CNI_BIN_DIR"
    conf_dir = "$dir/cni"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "$(command -v runc)"
        Root = "$RUN/$r/runc"
        SystemdCgroup = false
EOF
}

write_cni_config() { # REGION: a bridge per node; no masquerading (pods see each other's IPs)
    local r=$1 dir=$STATE/$1
    mkdir -p "$dir/cni" "$dir/ipam"
    cat >"$dir/cni/10-cirrus.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "cirrus-$r",
  "plugins": [
    {
      "type": "bridge", "bridge": "$(bridge_of "$r")", "isGateway": true, "ipMasq": false,
      "hairpinMode": true,
      "ipam": { "type": "host-local", "ranges": [[{ "subnet": "$(subnet_of "$r")" }]],
                "routes": [{ "dst": "0.0.0.0/0" }], "dataDir": "$dir/ipam" }
    },
    { "type": "portmap", "capabilities": { "portMappings": true } }
  ]
}
EOF
}

write_kubelet_config() { # REGION
    local r=$1 dir=$STATE/$1 i
    i=$(region_index "$r")
    cat >"$dir/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# This machine has cgroup v1 (hybrid); Kubernetes 1.36 refuses it unless told otherwise.
failCgroupV1: false
failSwapOn: false
cgroupDriver: cgroupfs
cgroupRoot: /$(node_name "$r")
cgroupsPerQOS: true
containerRuntimeEndpoint: unix://$RUN/$r/containerd.sock
address: $HOST_IP
port: $((10250 + i * 10))
healthzBindAddress: 127.0.0.1
healthzPort: $((10248 + i * 10))
readOnlyPort: 0
authentication:
  anonymous: { enabled: false }
  webhook: { enabled: false }
  x509: { clientCAFile: $CLUSTER_STATE/pki/ca.crt }
authorization: { mode: AlwaysAllow }
clusterDomain: cluster.local
clusterDNS: [$HOST_IP]
resolvConf: $dir/resolv.conf
tlsCertFile: $dir/pki/serving.crt
tlsPrivateKeyFile: $dir/pki/serving.key
# Images come from image.sh, not a registry: never garbage-collect them, never evict for disk.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: { memory.available: "100Mi", nodefs.available: "1%", imagefs.available: "1%" }
maxPods: 40
# Each node's container logs in its own tree: a kubelet removes the logs of pods it does not
# know from a shared /var/log/pods, i.e. the other node's.
podLogsDir: $dir/pod-logs
serializeImagePulls: false
EOF
    # Pods resolve only cluster names; no upstream resolver.
    echo "nameserver $HOST_IP" >"$dir/resolv.conf"
}

node_certs() { # REGION: the node's client certificate (system:node:NAME) and serving certificate
    local r=$1 dir=$STATE/$1 name
    name=$(node_name "$r")
    mkdir -p "$dir/pki"
    cp "$CLUSTER_STATE/pki/ca.crt" "$dir/pki/ca.crt"
    local client_ext="basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=clientAuth"
    local serving_ext="basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=IP:$HOST_IP,DNS:$name"
    # sign() writes into $PKI with the CA found there: the cluster's.
    PKI=$CLUSTER_STATE/pki sign "node-$r" "/O=system:nodes/CN=system:node:$name" "$client_ext"
    PKI=$CLUSTER_STATE/pki sign "node-$r-serving" "/CN=$name" "$serving_ext"
    mv "$CLUSTER_STATE/pki/node-$r.crt" "$CLUSTER_STATE/pki/node-$r.key" "$dir/pki/"
    mv "$CLUSTER_STATE/pki/node-$r-serving.crt" "$dir/pki/serving.crt"
    mv "$CLUSTER_STATE/pki/node-$r-serving.key" "$dir/pki/serving.key"
    PKI=$dir/pki write_kubeconfig "$dir/kubelet.kubeconfig" "node-$r" "system:node:$name"
}

make_cgroups() { # ROOT: the kubelet wants its cgroup root to exist in every hierarchy
    local root=$1 h
    for h in /sys/fs/cgroup/*/; do
        [[ -d "$h" && ! -e "$h/cgroup.procs" ]] && continue
        mkdir -p "$h$root"
        # A new cpuset group has no CPUs or memory nodes until given its parent's.
        if [[ -e "$h$root/cpuset.cpus" ]]; then
            cat "$h/cpuset.cpus" >"$h$root/cpuset.cpus"
            cat "$h/cpuset.mems" >"$h$root/cpuset.mems"
        fi
    done
}

start_node() { # REGION
    local r=$1 dir=$STATE/$1 name
    name=$(node_name "$r")
    mkdir -p "$dir" "$RUN/$r"
    node_certs "$r"
    write_containerd_config "$r"
    write_cni_config "$r"
    write_kubelet_config "$r"
    make_cgroups "$name"
    # The bridge now, not at the first pod (CNI takes an existing one), so that `shape` has it.
    ip link add name "$(bridge_of "$r")" type bridge
    ip link set "$(bridge_of "$r")" up
    start "containerd-$r" containerd --config "$dir/containerd.toml"
    wait_for "containerd of $name" 30 "containerd-$r" ctr --address "$RUN/$r/containerd.sock" version
    local img
    for img in pause cirrus; do
        ctr --address "$RUN/$r/containerd.sock" -n k8s.io images import --no-unpack \
            "$IMAGES_HOME/$img.oci.tar" >/dev/null || ndie "importing $img into $name failed"
    done
    start "kubelet-$r" "$K8S_BIN/kubelet" --config "$dir/kubelet.yaml" \
        --kubeconfig "$dir/kubelet.kubeconfig" --root-dir "$dir/kubelet" --cert-dir "$dir/pki" \
        --hostname-override "$name" --node-ip "$HOST_IP" \
        --node-labels "topology.kubernetes.io/region=$r,topology.kubernetes.io/zone=$r-a,cirrus.dev/pool=spot" \
        --v 1
}

# ---- Services: kube-proxy and CoreDNS ------------------------------------------------------

start_services() {
    local pki=$CLUSTER_STATE/pki
    local client_ext="basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=clientAuth"
    # The default RBAC binds system:node-proxier to the user system:kube-proxy.
    PKI=$pki sign kube-proxy "/CN=system:kube-proxy" "$client_ext"
    PKI=$pki write_kubeconfig "$STATE/kube-proxy.kubeconfig" kube-proxy system:kube-proxy
    cat >"$STATE/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: { kubeconfig: $STATE/kube-proxy.kubeconfig }
mode: iptables
clusterCIDR: $POD_NET
hostnameOverride: $(node_name "${REGIONS[0]}")
bindAddress: $HOST_IP
healthzBindAddress: 127.0.0.1:$((10256 + 1000))
metricsBindAddress: 127.0.0.1:$((10249 + 1000))
# 0: leave the machine's conntrack table size alone.
conntrack: { maxPerCore: 0, min: 0 }
EOF
    # One kube-proxy serves both nodes: they share this machine's network namespace.
    start kube-proxy "$K8S_BIN/kube-proxy" --config "$STATE/kube-proxy.yaml"

    cat >"$STATE/Corefile" <<EOF
.:53 {
    bind $HOST_IP
    ready 127.0.0.1:18181
    errors
    loadbalance
    cache 5
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        kubeconfig $CLUSTER_STATE/kubeconfig
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }
}
EOF
    start coredns "$K8S_BIN/coredns" -conf "$STATE/Corefile"
}

nodes_ready() {
    local out
    out=$(k get nodes -o jsonpath='{range .items[*]}{.metadata.name} {.status.conditions[?(@.type=="Ready")].status} {.spec.taints[*].key}{"\n"}{end}')
    [[ $(grep -c ' True *$' <<<"$out") -eq ${#REGIONS[@]} ]]
}

# CoreDNS's ready plugin answers 200 once the kubernetes plugin has synced with the API.
dns_ready() { curl -sf -o /dev/null "http://127.0.0.1:18181/ready"; }

# ---- commands ------------------------------------------------------------------------------

cmd_up() {
    need_root "nodes.sh up"
    [[ -d /sys/fs/cgroup/cpu || -f /sys/fs/cgroup/cgroup.controllers ]] || ndie "no cgroup support found under /sys/fs/cgroup"
    [[ -s "$IMAGES_HOME/cirrus.oci.tar" && -s "$IMAGES_HOME/pause.oci.tar" ]] || ndie "no images in $IMAGES_HOME (run tests/nodes/image.sh)"
    [[ -x "$K8S_BIN/kubelet" && -x "$K8S_BIN/coredns" ]] || ndie "kubelet or coredns missing (run tests/nodes/install.sh)"
    if [[ -e "$MARKER" ]]; then
        nlog "up: removing the leftovers of an earlier run"
        cmd_down
    fi
    ip -4 -o addr show | grep -q " inet ${POD_NET%.*.*}\." &&
        ndie "this machine already uses addresses in $POD_NET"
    local t0=$SECONDS
    mkdir -p "$STATE" "$LOGS" "$PIDS" "$RUN"
    touch "$MARKER"
    trap 'rc=$?; if ((rc)); then nlog "up failed; tearing down"; tail_logs; cmd_down; fi' EXIT
    save_host
    ip addr add "$HOST_IP/32" dev lo
    echo "$HOST_IP" >"$SAVED/lo-address"

    CLUSTER_STATE_DIR=$CLUSTER_STATE CLUSTER_NODES_PER_POOL=0 CLUSTER_API_ADDRESS=$HOST_IP \
        "$NODES_DIR/../cluster/cluster.sh" up
    # For write_kubeconfig (tests/cluster/lib.sh): the API server's address and port.
    API_ADDRESS=$HOST_IP
    # shellcheck disable=SC1091
    source "$CLUSTER_STATE/ports"

    local r
    for r in "${REGIONS[@]}"; do
        nlog "up: node $(node_name "$r") (region $r, pods $(subnet_of "$r") on bridge $(bridge_of "$r"))"
        start_node "$r"
    done
    nlog "up: kube-proxy and CoreDNS ($HOST_IP:53)"
    start_services
    wait_for "Ready nodes" "$START_TIMEOUT" "kubelet-r1" nodes_ready
    wait_for "CoreDNS" 30 coredns dns_ready
    trap - EXIT
    nlog "up: ready in $((SECONDS - t0))s; eval \"\$(tests/nodes/nodes.sh env)\""
}

tail_logs() {
    local f
    for f in "$LOGS"/*.log; do
        [[ -s "$f" ]] || continue
        echo "---- ${f##*/} (last lines)"
        tail -n 15 "$f"
    done >&2
}

cmd_down() {
    [[ -e "$STATE" ]] || { nlog "down: nothing at $STATE"; return 0; }
    [[ -e "$MARKER" ]] || ndie "$STATE was not made by nodes.sh up; not removing it"
    need_root "nodes.sh down"
    local r
    if [[ -s "$CLUSTER_STATE/kubeconfig" ]] && k get --raw /readyz >/dev/null 2>&1; then
        nlog "down: deleting pods through the API (their networks are torn down by CNI)"
        k delete pods --all-namespaces --all --wait=false --grace-period=5 >/dev/null 2>&1 || true
        local deadline=$((SECONDS + 30))
        while ((SECONDS < deadline)) && [[ -n "$(k get pods -A -o name 2>/dev/null)" ]]; do sleep 0.5; done
    fi
    stop coredns kube-proxy
    for r in "${REGIONS[@]}"; do stop "kubelet-$r"; done
    # Containers the API could not delete (a failed run), then the shims, which outlive
    # containerd.
    for r in "${REGIONS[@]}"; do
        kill_cgroup_procs "$(node_name "$r")"
        pkill -KILL -f "containerd-shim-runc-v2 .*-address $RUN/$r/containerd.sock" 2>/dev/null || true
        stop "containerd-$r"
    done
    if [[ -d "$CLUSTER_STATE" ]]; then
        CLUSTER_STATE_DIR=$CLUSTER_STATE "$NODES_DIR/../cluster/cluster.sh" down || true
    fi
    unmount_under "$STATE"
    unmount_under "$RUN"
    for r in "${REGIONS[@]}"; do
        ip link del "$(bridge_of "$r")" 2>/dev/null || true
        remove_cgroups "$(node_name "$r")"
    done
    [[ -s "$SAVED/lo-address" ]] && ip addr del "$(cat "$SAVED/lo-address")/32" dev lo 2>/dev/null
    # The kubelets link container logs into /var/log/containers whatever podLogsDir says.
    find /var/log/containers -maxdepth 1 -type l -lname "$STATE/*" -delete 2>/dev/null || true
    restore_host
    rm -rf "$RUN" "$STATE"
    nlog "down: stopped, machine state restored, $STATE removed"
}

cmd_env() {
    [[ -s "$CLUSTER_STATE/kubeconfig" ]] || ndie "no nodes running at $STATE (run: nodes.sh up)"
    CLUSTER_STATE_DIR=$CLUSTER_STATE "$NODES_DIR/../cluster/cluster.sh" env
    echo "export CIRRUS_NODES_STATE='$STATE'"
}

cmd_shape() { # MBIT|off: limit what enters each region's bridge from outside the region
    need_root "nodes.sh shape"
    local r
    for r in "${REGIONS[@]}"; do
        tc qdisc del dev "$(bridge_of "$r")" root 2>/dev/null || true
        [[ "$1" == off ]] && continue
        # The bridge device's egress carries only what the host routes into the region: the
        # other region's packets (and the host's own: DNS answers, probes, API replies).
        # Pod-to-pod traffic inside the region, Services included, is bridged and not shaped.
        tc qdisc add dev "$(bridge_of "$r")" root tbf rate "${1}mbit" burst 32kb latency 400ms
    done
    if [[ "$1" == off ]]; then nlog "shape: off"; else nlog "shape: ${1} Mbit/s into each region"; fi
}

case "${1:-}" in
up) cmd_up ;;
down) cmd_down ;;
env) cmd_env ;;
shape) [[ -n "${2:-}" ]] || ndie "usage: nodes.sh shape MBIT|off"; cmd_shape "$2" ;;
*)
    echo "usage: $0 up|down|env|shape MBIT|off" >&2
    exit 2
    ;;
esac
