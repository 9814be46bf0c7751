# shellcheck shell=bash disable=SC2034  # variables are used by the scripts that source this
# Shared settings of the real-node scripts (install.sh, image.sh, nodes.sh, the tests).
# Source it; do not run it. Builds on the control plane's settings (../cluster/lib.sh).

NODES_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=../cluster/lib.sh
source "$NODES_DIR/../cluster/lib.sh"
REPO_DIR=$(cd "$NODES_DIR/../.." && pwd)

# Debian packages the real nodes need: the container runtime, the CNI plugins, the image
# builder (buildah; there is no Docker engine) and the base image's bootstrapper.
NODES_DEB_PKGS=(containerd runc containernetworking-plugins buildah mmdebstrap iptables conntrack)
CNI_BIN_DIR=/usr/lib/cni

# Changed by the kubelet (overcommit, panic), kube-proxy (route_localnet, conntrack) and CNI
# (forwarding); written back by `down`.
SYSCTLS=(vm.overcommit_memory vm.panic_on_oom kernel.panic kernel.panic_on_oops
    kernel.keys.root_maxkeys kernel.keys.root_maxbytes net.ipv4.ip_forward
    net.ipv4.conf.all.forwarding net.ipv4.conf.all.route_localnet
    net.bridge.bridge-nf-call-iptables net.bridge.bridge-nf-call-ip6tables
    net.netfilter.nf_conntrack_max net.netfilter.nf_conntrack_tcp_timeout_established
    net.netfilter.nf_conntrack_tcp_timeout_close_wait)

NODES_HOME=$CIRRUS_CACHE/nodes

# Images. buildah keeps its storage (layers, the build cache) in the cache, not in /var/lib.
IMAGES_HOME=$NODES_HOME/images
BUILDAH_ROOT=$NODES_HOME/containers
BUILDAH_RUNROOT=/run/cirrus-buildah
BASE_IMAGE=docker.io/library/debian:12-slim # what the Dockerfile starts FROM
PAUSE_IMAGE=registry.k8s.io/pause:3.10      # the pod sandbox image named in containerd's config
CIRRUS_IMAGE=${CIRRUS_IMAGE:-docker.io/library/cirrus:latest}

# The end-to-end tests' job: steps, outer step period, the regions' link (Mbit/s), how long
# a job may take (s).
STEPS=${E2E_STEPS:-250}
SYNC_EVERY=${E2E_SYNC_EVERY:-40}
WAN_MBIT=${E2E_WAN_MBIT:-20}
TIMEOUT=${E2E_TIMEOUT:-600}

# The gateway's /status port (ROLE_PORT_HTTP), read from the header the operator builds with.
GATEWAY_HTTP_PORT=$(awk '$1 == "#define" && $2 == "ROLE_PORT_HTTP" { print $3 }' "$REPO_DIR/common/role_args.h")

nlog() { printf '[nodes] %s\n' "$*" >&2; }
ndie() { printf '[nodes] ERROR: %s\n' "$*" >&2; exit 1; }
need_root() { [[ $(id -u) == 0 ]] || ndie "$1 needs root (containers, network namespaces, iptables): run as root"; }

bah() { buildah --root "$BUILDAH_ROOT" --runroot "$BUILDAH_RUNROOT" --storage-driver overlay "$@"; }

# The operator from the Helm chart, in pods on the nodes, with the image the nodes hold (no
# registry; image.sh tags it latest, the chart's default tag is its appVersion), in the
# cluster of $KUBECONFIG, with more `helm install` arguments if given. Its output goes to
# LOG; non-zero if it is not available in 180 s.
install_operator_chart() { # LOG [HELM-ARGS...]
    local helm
    helm=$("$NODES_DIR/../operator/helm_install.sh") || return 1
    "$helm" install cirrus "$REPO_DIR/helm/cirrus" -n cirrus-system --create-namespace \
        --set operator.image.tag=latest --set operator.image.pullPolicy=Never "${@:2}" \
        --wait --timeout 180s >"$1" 2>&1
}

# A two-region SwarmJob (r1, r2) of the tiny model in 2 stages, as the tests and benchmarks
# run it on the two nodes: q8 outer steps, CPU requests in proportion to the work (a pod
# without requests crawls under load).
# With EAST-KUBECONFIG-SECRET, region r2 runs in the member cluster east (nodes.sh
# NODES_CLUSTERS=2), reached with the kubeconfig in that Secret, and the gateways are
# reached from outside their clusters through NodePort Services.
swarmjob_yaml() { # NAME PEERS-PER-STAGE STEPS SYNC-EVERY [CLIENTS-OF-R2 (default 1)] [EAST-KUBECONFIG-SECRET]
    local east=${6:-}
    cat <<EOF
apiVersion: cirrus.dev/v1alpha1
kind: SwarmJob
metadata: {name: $1}
spec:
  image: cirrus:latest
  imagePullPolicy: Never
  model: {preset: tiny}
  pipeline: {stages: 2}
  steps: $3
  gateway: {syncEvery: $4, codec: q8$([[ -n "$east" ]] && echo ", serviceType: NodePort")}
  runPolicy: {backoffLimit: 2}
$([[ -n "$east" ]] && echo "  clusters: [{name: east, kubeconfigSecret: {name: $east}}]")
  regions:
$(for r in r1 r2; do cat <<REGION
    - name: $r$([[ -n "$east" && $r == r2 ]] && printf '\n      cluster: east')
      peers: {replicas: $2, min: 1}
      clients: $([[ $r == r2 ]] && echo "${5:-1}" || echo 1)
      resources:
        peer: {requests: {cpu: 300m, memory: 128Mi}}
        client: {requests: {cpu: 300m, memory: 128Mi}}
        gateway: {requests: {cpu: 100m, memory: 64Mi}}
REGION
done)
EOF
}

within() { # A B PERCENT: |A - B| <= PERCENT% of B
    awk -v a="$1" -v b="$2" -v p="$3" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a != "" && b > 0 && d <= b * p / 100) }'
}

# What `down` must give back: every sysctl it may change, the iptables rules and the global
# directories exactly; and no link, address or mount left that was not there before (ones
# that vanish meanwhile, e.g. an older run's stale veth, are not this run's doing).
GLOBAL_DIRS_CHECKED=(/run/containerd /var/lib/cni /etc/cni /var/lib/kubelet /var/log/pods)
machine_snapshot() {
    local s d
    for s in "${SYSCTLS[@]}"; do printf 'sysctl %s=%s\n' "$s" "$(sysctl -n "$s" 2>/dev/null)"; done
    iptables-save | grep -v '^#' | sed 's/\[[0-9]*:[0-9]*\]//; s/^/iptables /'
    ip -o link show | awk -F': ' '{ print "link", $2 }' | sort
    ip -o addr show | awk '{ print "addr", $2, $4 }' | sort
    ip -4 route show | sed 's/^/route /' | sort
    awk '{ print "mount", $2 }' /proc/self/mounts | sort
    for d in "${GLOBAL_DIRS_CHECKED[@]}"; do [[ ! -e "$d" ]] || echo "dir $d"; done
    # Processes left running from the nodes' state or sockets (containerd, kubelets, the
    # control planes, shims), and cluster east's namespace holder.
    pgrep -f -- "${NODES_STATE_DIR:-$REPO_DIR/build/nodes}/|/run/cirrus-nodes/|^cirrus-east-netns " |
        grep -vx "$$" | sed 's/^/process /' | sort
}
# Lines of diff BEFORE AFTER that are a leftover or a loss.
machine_changes() {
    diff "$1" "$2" | grep -E '^> |^< (sysctl|iptables|dir) '
}

# The reference for a job's loss: the same layout run by `cirrus-trainer local` on this
# machine (BIN STEPS SYNC-EVERY LOG); prints its validation loss, nothing if it failed.
local_reference() {
    CIRRUS_CORPUS=${CIRRUS_CORPUS:-$REPO_DIR/build/data/kjv.txt} "$1" local --model tiny --stages 2 --peers 1 \
        --regions 2 --sync-every "$3" --codec q8 --steps "$2" >"$4" 2>&1 || return 0
    sed -n 's/^done: .*val loss \([0-9.]*\),.*/\1/p' "$4" | tail -1
}

# The end of a real-node test (its EXIT trap, after its own report of a failure): nodes.sh
# down unless E2E_KEEP=1, the machine compared with WORK/before (machine_snapshot), WORK
# removed, the time and the summary (ok/not_ok counts of ../operator/lib.sh).
nodes_test_end() { # WORK TIME-LINE SUMMARY-NAME
    local work=$1
    if [[ "${E2E_KEEP:-0}" == 1 ]]; then
        echo "E2E_KEEP=1: the nodes stay up (tests/nodes/nodes.sh down removes them)"
    else
        "$NODES_DIR/nodes.sh" down >"$work/down.log" 2>&1 || not_ok "nodes.sh down: $(tail -3 "$work/down.log")"
        machine_snapshot >"$work/after"
        if machine_changes "$work/before" "$work/after" >"$work/diff"; then
            not_ok "nodes.sh down left the machine changed: $(head -20 "$work/diff")"
        else
            ok "nodes.sh down restored sysctls, iptables, links, addresses, mounts, directories"
        fi
    fi
    rm -rf "$work"
    echo "$2"
    checks_summary "$3"
}
