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
#   nodes.sh env [east]
#                   export lines for a running set (KUBECONFIG, PATH, ...): the home cluster's,
#                   or with `east` the second cluster's (NODES_CLUSTERS=2)
#
# NODES_CLUSTERS=2 (at `up`): two clusters, as users run one per cloud region. The home
# cluster (control plane, node cirrus-r1) stays in this machine's network namespace; cluster
# "east" (a control plane of its own, node cirrus-r2, its own kube-proxy and CoreDNS) lives in
# a network namespace of its own, joined to this one by a veth pair only ($WAN_HOST_IP here,
# $EAST_IP there, which is also east's API server, kubelet and DNS address); each cluster's
# Services and iptables rules are its own. Pods of either reach the other's node addresses
# (NodePort Services) and pods through this machine's routes, as over a WAN.
#
# Root is required. Global changes, recorded in $STATE/saved before they are made and undone
# by `down` (also after a failed `up`): the address $HOST_IP on lo; the sysctls the kubelet,
# kube-proxy and the bridges change; iptables and ip6tables rules (saved and restored whole);
# the bridges; cgroups under /<node name>; mounts under $STATE; /run/containerd, /var/lib/cni,
# /etc/cni and /var/lib/kubelet when they did not exist before; with NODES_CLUSTERS=2 also
# the veth pair $WAN_LINK and the route to east's pods through it (east's namespace, with its
# bridge and iptables rules, goes with its last process).
#
# The regions' bridges are joined through the host (east's also through the veth pair);
# `nodes.sh shape MBIT` limits what is routed into each region's bridge (tc tbf), which is the
# WAN the gateways see; traffic inside a region is bridged and not limited. `nodes.sh shape
# off` removes it.
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
CLUSTERS=${NODES_CLUSTERS:-1} # 1: both regions' nodes in one cluster; 2: r2 in cluster east
# The veth pair to cluster east (NODES_CLUSTERS=2): this machine's end and east's, in
# $POD_NET (whose being free `up` checks) but outside every region's pod subnet.
WAN_NET=10.89.254.0/30 WAN_HOST_IP=10.89.254.1 EAST_IP=10.89.254.2 WAN_LINK=cirrus-wan
START_TIMEOUT=${NODES_START_TIMEOUT:-120}
GLOBAL_DIRS=(/run/containerd /var/lib/cni /etc/cni /var/lib/kubelet /var/log/containers /var/log/pods)

kc() { local c=$1; shift; "$K8S_BIN/kubectl" --kubeconfig "$(cluster_dir "$c")/kubeconfig" "$@"; } # CLUSTER ARGS...
region_index() { echo "${1#r}"; }
# The layout: which cluster runs a region, where a cluster's state is, its address.
clusters() { [[ $CLUSTERS == 2 ]] && echo home east || echo home; }
cluster_of() { [[ $CLUSTERS == 2 && $1 == r2 ]] && echo east || echo home; }
regions_of() { local r; for r in "${REGIONS[@]}"; do [[ $(cluster_of "$r") != "$1" ]] || echo "$r"; done; }
first_region_of() { local r; for r in $(regions_of "$1"); do echo "$r"; return 0; done; }
cluster_dir() { [[ $1 == east ]] && echo "$STATE/cluster-east" || echo "$CLUSTER_STATE"; }
cluster_ip() { [[ $1 == east ]] && echo "$EAST_IP" || echo "$HOST_IP"; }
node_ip() { cluster_ip "$(cluster_of "$1")"; }
cluster_slot() { [[ $1 == east ]] && echo 1 || echo 0; } # offsets its services' local ports
api_port() { # CLUSTER: its API server's port (from cluster.sh's ports file)
    local p
    p=$(sed -n 's/^CLUSTER_API_PORT=//p' "$(cluster_dir "$1")/ports" 2>/dev/null)
    [[ -n "$p" ]] || ndie "no API server port for cluster $1 in $(cluster_dir "$1")/ports"
    echo "$p"
}
# in_cluster CLUSTER COMMAND...: run COMMAND in that cluster's network namespace. East's is
# held by a process of its own (netns-east: a sleep) rather than a name under /run/netns, so that
# nothing global is mounted for it and it goes when its last process does.
in_cluster() {
    local c=$1; shift
    if [[ $c == east ]]; then
        nsenter -t "$(pid_of netns-east)" -n -- "$@"
    else
        "$@"
    fi
}
node_name() { echo "cirrus-$1"; }
bridge_of() { echo "cirrus-$1"; }
subnet_of() { echo "10.89.$(region_index "$1").0/24"; }

# ---- processes -----------------------------------------------------------------------------

start() { # NAME COMMAND...: run in its own session, log and pid in the state dir
    local name=$1; shift
    setsid "$@" >"$LOGS/$name.log" 2>&1 </dev/null &
    echo $! >"$PIDS/$name"
}
start_in() { # CLUSTER NAME COMMAND...: start, in that cluster's network namespace
    local c=$1 name=$2; shift 2
    if [[ $c == east ]]; then
        start "$name" nsenter -t "$(pid_of netns-east)" -n -- "$@"
    else
        start "$name" "$@"
    fi
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
    local r=$1 dir=$STATE/$1 i ip cdir
    i=$(region_index "$r") ip=$(node_ip "$r") cdir=$(cluster_dir "$(cluster_of "$r")")
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
address: $ip
port: $((10250 + i * 10))
healthzBindAddress: 127.0.0.1
healthzPort: $((10248 + i * 10))
readOnlyPort: 0
authentication:
  anonymous: { enabled: false }
  webhook: { enabled: false }
  x509: { clientCAFile: $cdir/pki/ca.crt }
authorization: { mode: AlwaysAllow }
clusterDomain: cluster.local
clusterDNS: [$ip]
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
    echo "nameserver $ip" >"$dir/resolv.conf"
}

node_certs() { # REGION: the node's client certificate (system:node:NAME) and serving certificate
    local r=$1 dir=$STATE/$1 name c ip pki
    name=$(node_name "$r") c=$(cluster_of "$r") ip=$(node_ip "$r")
    pki=$(cluster_dir "$c")/pki
    mkdir -p "$dir/pki"
    cp "$pki/ca.crt" "$dir/pki/ca.crt"
    local client_ext="basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=clientAuth"
    local serving_ext="basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=IP:$ip,DNS:$name"
    # sign() writes into $PKI with the CA found there: the node's cluster's.
    PKI=$pki sign "node-$r" "/O=system:nodes/CN=system:node:$name" "$client_ext"
    PKI=$pki sign "node-$r-serving" "/CN=$name" "$serving_ext"
    mv "$pki/node-$r.crt" "$pki/node-$r.key" "$dir/pki/"
    mv "$pki/node-$r-serving.crt" "$dir/pki/serving.crt"
    mv "$pki/node-$r-serving.key" "$dir/pki/serving.key"
    PKI=$dir/pki API_ADDRESS=$ip CLUSTER_API_PORT=$(api_port "$c") \
        write_kubeconfig "$dir/kubelet.kubeconfig" "node-$r" "system:node:$name"
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
    local r=$1 dir=$STATE/$1 name c
    name=$(node_name "$r") c=$(cluster_of "$r")
    mkdir -p "$dir" "$RUN/$r"
    node_certs "$r"
    write_containerd_config "$r"
    write_cni_config "$r"
    write_kubelet_config "$r"
    make_cgroups "$name"
    # The bridge now, not at the first pod (CNI takes an existing one), so that `shape` has it.
    in_cluster "$c" ip link add name "$(bridge_of "$r")" type bridge
    in_cluster "$c" ip link set "$(bridge_of "$r")" up
    start_in "$c" "containerd-$r" containerd --config "$dir/containerd.toml"
    wait_for "containerd of $name" 30 "containerd-$r" ctr --address "$RUN/$r/containerd.sock" version
    local img
    for img in pause cirrus; do
        ctr --address "$RUN/$r/containerd.sock" -n k8s.io images import --no-unpack \
            "$IMAGES_HOME/$img.oci.tar" >/dev/null || ndie "importing $img into $name failed"
    done
    start_in "$c" "kubelet-$r" "$K8S_BIN/kubelet" --config "$dir/kubelet.yaml" \
        --kubeconfig "$dir/kubelet.kubeconfig" --root-dir "$dir/kubelet" --cert-dir "$dir/pki" \
        --hostname-override "$name" --node-ip "$(node_ip "$r")" \
        --node-labels "topology.kubernetes.io/region=$r,topology.kubernetes.io/zone=$r-a,cirrus.dev/pool=spot" \
        --v 1
}

# ---- Services: kube-proxy and CoreDNS ------------------------------------------------------

start_services() { # CLUSTER: its kube-proxy and CoreDNS, in its network namespace
    local c=$1 dir ip n
    dir=$(cluster_dir "$c") ip=$(cluster_ip "$c")
    n=$(cluster_slot "$c")
    local client_ext="basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=clientAuth"
    # The default RBAC binds system:node-proxier to the user system:kube-proxy.
    PKI=$dir/pki sign kube-proxy "/CN=system:kube-proxy" "$client_ext"
    PKI=$dir/pki API_ADDRESS=$ip CLUSTER_API_PORT=$(api_port "$c") \
        write_kubeconfig "$STATE/kube-proxy-$c.kubeconfig" kube-proxy system:kube-proxy
    local first
    first=$(first_region_of "$c")
    cat >"$STATE/kube-proxy-$c.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: { kubeconfig: $STATE/kube-proxy-$c.kubeconfig }
mode: iptables
clusterCIDR: $POD_NET
hostnameOverride: $(node_name "$first")
bindAddress: $ip
healthzBindAddress: 127.0.0.1:$((10256 + 1000 + n))
metricsBindAddress: 127.0.0.1:$((10249 + 1000 + n))
# 0: leave the machine's conntrack table size alone.
conntrack: { maxPerCore: 0, min: 0 }
EOF
    # One kube-proxy serves a cluster's nodes: they share a network namespace.
    start_in "$c" "kube-proxy-$c" "$K8S_BIN/kube-proxy" --config "$STATE/kube-proxy-$c.yaml"

    cat >"$STATE/Corefile-$c" <<EOF
.:53 {
    bind $ip
    ready 127.0.0.1:$((18181 + n))
    errors
    loadbalance
    cache 5
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        kubeconfig $dir/kubeconfig
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }
}
EOF
    start_in "$c" "coredns-$c" "$K8S_BIN/coredns" -conf "$STATE/Corefile-$c"
}

nodes_ready() { # CLUSTER: each of its nodes Ready
    local out
    out=$(kc "$1" get nodes -o jsonpath='{range .items[*]}{.metadata.name} {.status.conditions[?(@.type=="Ready")].status} {.spec.taints[*].key}{"\n"}{end}')
    [[ $(grep -c ' True *$' <<<"$out") -eq $(regions_of "$1" | wc -l) ]]
}

# CoreDNS's ready plugin answers 200 once the kubernetes plugin has synced with the API.
dns_ready() { # CLUSTER
    in_cluster "$1" curl -sf -o /dev/null "http://127.0.0.1:$((18181 + $(cluster_slot "$1")))/ready"
}

# East's network namespace and the veth pair that is its only link to this machine (and so
# to the home cluster): a route to its pod subnet here, a default route back there.
make_east_netns() {
    # A sleep named cirrus-east-netns (the tests look for one left over).
    start netns-east unshare --net bash -c 'exec -a cirrus-east-netns sleep infinity'
    local pid= i
    for ((i = 0; i < 50; i++)); do
        pid=$(pid_of netns-east) && [[ "$(readlink "/proc/$pid/ns/net")" != "$(readlink /proc/self/ns/net)" ]] && break
        pid=
        sleep 0.1
    done
    [[ -n "$pid" ]] || ndie "no network namespace for cluster east (unshare --net)"
    in_cluster east ip link set lo up
    ip link add "$WAN_LINK" type veth peer name wan netns "$pid"
    ip addr add "$WAN_HOST_IP/30" dev "$WAN_LINK"
    ip link set "$WAN_LINK" up
    in_cluster east ip addr add "$EAST_IP/30" dev wan
    in_cluster east ip link set wan up
    in_cluster east ip route add default via "$WAN_HOST_IP"
    in_cluster east sysctl -q -w net.ipv4.ip_forward=1
    # Here too (saved in SYSCTLS): what comes in over the veth pair is routed to r1's bridge.
    sysctl -q -w net.ipv4.ip_forward=1
    local r
    for r in $(regions_of east); do ip route add "$(subnet_of "$r")" via "$EAST_IP"; done
}

# ---- commands ------------------------------------------------------------------------------

cmd_up() {
    need_root "nodes.sh up"
    [[ "$CLUSTERS" == 1 || "$CLUSTERS" == 2 ]] || ndie "NODES_CLUSTERS must be 1 or 2, not '$CLUSTERS'"
    [[ -d /sys/fs/cgroup/cpu || -f /sys/fs/cgroup/cgroup.controllers ]] || ndie "no cgroup support found under /sys/fs/cgroup"
    [[ -s "$IMAGES_HOME/cirrus.oci.tar" && -s "$IMAGES_HOME/pause.oci.tar" ]] || ndie "no images in $IMAGES_HOME (run tests/nodes/image.sh)"
    [[ -x "$K8S_BIN/kubelet" && -x "$K8S_BIN/coredns" ]] || ndie "kubelet or coredns missing (run tests/nodes/install.sh)"
    if [[ -e "$MARKER" ]]; then
        nlog "up: removing the leftovers of an earlier run"
        (cmd_down)
    fi
    ip -4 -o addr show | grep -q " inet ${POD_NET%.*.*}\." &&
        ndie "this machine already uses addresses in $POD_NET"
    local t0=$SECONDS
    mkdir -p "$STATE" "$LOGS" "$PIDS" "$RUN"
    touch "$MARKER"
    echo "$CLUSTERS" >"$STATE/clusters"
    trap 'rc=$?; if ((rc)); then nlog "up failed; tearing down"; tail_logs; cmd_down; fi' EXIT
    save_host
    ip addr add "$HOST_IP/32" dev lo
    echo "$HOST_IP" >"$SAVED/lo-address"

    CLUSTER_STATE_DIR=$CLUSTER_STATE CLUSTER_NODES_PER_POOL=0 CLUSTER_API_ADDRESS=$HOST_IP \
        "$NODES_DIR/../cluster/cluster.sh" up
    if ((CLUSTERS == 2)); then
        nlog "up: cluster east in a network namespace of its own, joined by $WAN_LINK ($WAN_HOST_IP <-> $EAST_IP)"
        make_east_netns
        in_cluster east env CLUSTER_STATE_DIR="$(cluster_dir east)" CLUSTER_NODES_PER_POOL=0 \
            CLUSTER_API_ADDRESS="$EAST_IP" "$NODES_DIR/../cluster/cluster.sh" up
    fi

    local r c
    for r in "${REGIONS[@]}"; do
        nlog "up: node $(node_name "$r") (region $r, cluster $(cluster_of "$r"), pods $(subnet_of "$r") on bridge $(bridge_of "$r"))"
        start_node "$r"
    done
    for c in $(clusters); do
        nlog "up: kube-proxy and CoreDNS of cluster $c ($(cluster_ip "$c"):53)"
        start_services "$c"
    done
    for c in $(clusters); do
        wait_for "Ready nodes (cluster $c)" "$START_TIMEOUT" "kubelet-$(first_region_of "$c")" nodes_ready "$c"
        wait_for "CoreDNS (cluster $c)" 30 "coredns-$c" dns_ready "$c"
    done
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
    [[ -s "$STATE/clusters" ]] && CLUSTERS=$(cat "$STATE/clusters")
    local r c
    for c in $(clusters); do
        [[ -s "$(cluster_dir "$c")/kubeconfig" ]] && kc "$c" get --raw /readyz >/dev/null 2>&1 || continue
        nlog "down: deleting the pods of cluster $c through its API (their networks are torn down by CNI)"
        kc "$c" delete pods --all-namespaces --all --wait=false --grace-period=5 >/dev/null 2>&1 || true
        local deadline=$((SECONDS + 30))
        while ((SECONDS < deadline)) && [[ -n "$(kc "$c" get pods -A -o name 2>/dev/null)" ]]; do sleep 0.5; done
    done
    # (coredns and kube-proxy: their names in a state directory of an older nodes.sh)
    stop coredns kube-proxy
    for c in home east; do stop "coredns-$c" "kube-proxy-$c"; done
    for r in "${REGIONS[@]}"; do stop "kubelet-$r"; done
    # Containers the API could not delete (a failed run), then the shims, which outlive
    # containerd.
    for r in "${REGIONS[@]}"; do
        kill_cgroup_procs "$(node_name "$r")"
        pkill -KILL -f "containerd-shim-runc-v2 .*-address $RUN/$r/containerd.sock" 2>/dev/null || true
        stop "containerd-$r"
    done
    for c in home east; do
        [[ -d "$(cluster_dir "$c")" ]] || continue
        CLUSTER_STATE_DIR=$(cluster_dir "$c") "$NODES_DIR/../cluster/cluster.sh" down || true
    done
    # East's namespace goes with its last process, and with it its end of the veth pair, its
    # bridge and its iptables rules; the other end goes with its peer.
    stop netns-east
    ip link del "$WAN_LINK" 2>/dev/null || true
    unmount_under "$STATE"
    unmount_under "$RUN"
    for r in "${REGIONS[@]}"; do
        ip link del "$(bridge_of "$r")" 2>/dev/null || true
        remove_cgroups "$(node_name "$r")"
    done
    [[ -s "$SAVED/lo-address" ]] && { ip addr del "$(cat "$SAVED/lo-address")/32" dev lo 2>/dev/null || true; }
    # The kubelets link container logs into /var/log/containers whatever podLogsDir says.
    find /var/log/containers -maxdepth 1 -type l -lname "$STATE/*" -delete 2>/dev/null || true
    restore_host
    rm -rf "$RUN" "$STATE"
    nlog "down: stopped, machine state restored, $STATE removed"
}

cmd_env() { # [CLUSTER]
    local c=${1:-home}
    [[ -s "$STATE/clusters" ]] && CLUSTERS=$(cat "$STATE/clusters")
    [[ $c == home || ($c == east && $CLUSTERS == 2) ]] || ndie "no cluster '$c' here (clusters: $(clusters))"
    [[ -s "$(cluster_dir "$c")/kubeconfig" ]] || ndie "no nodes running at $STATE (run: nodes.sh up)"
    CLUSTER_STATE_DIR=$(cluster_dir "$c") CLUSTER_API_ADDRESS=$(cluster_ip "$c") "$NODES_DIR/../cluster/cluster.sh" env
    echo "export CIRRUS_NODES_STATE='$STATE'"
}

cmd_shape() { # MBIT|off: limit what enters each region's bridge from outside the region
    need_root "nodes.sh shape"
    [[ -s "$STATE/clusters" ]] && CLUSTERS=$(cat "$STATE/clusters")
    local r c
    for r in "${REGIONS[@]}"; do
        c=$(cluster_of "$r")
        in_cluster "$c" tc qdisc del dev "$(bridge_of "$r")" root 2>/dev/null || true
        [[ "$1" == off ]] && continue
        # The bridge device's egress carries only what its node's network namespace routes
        # into the region: the other region's packets (and the node's own: DNS answers,
        # probes, API replies). Pod-to-pod traffic inside the region, Services included, is
        # bridged and not shaped.
        in_cluster "$c" tc qdisc add dev "$(bridge_of "$r")" root tbf rate "${1}mbit" burst 32kb latency 400ms
    done
    if [[ "$1" == off ]]; then nlog "shape: off"; else nlog "shape: ${1} Mbit/s into each region"; fi
}

case "${1:-}" in
up) cmd_up ;;
down) cmd_down ;;
env) cmd_env "${2:-}" ;;
shape) [[ -n "${2:-}" ]] || ndie "usage: nodes.sh shape MBIT|off"; cmd_shape "$2" ;;
*)
    echo "usage: $0 up|down|env [east]|shape MBIT|off" >&2
    exit 2
    ;;
esac
