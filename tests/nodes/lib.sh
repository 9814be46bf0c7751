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

# The gateway's /status port (ROLE_PORT_HTTP), read from the header the operator builds with.
GATEWAY_HTTP_PORT=$(awk '$1 == "#define" && $2 == "ROLE_PORT_HTTP" { print $3 }' "$REPO_DIR/common/role_args.h")

nlog() { printf '[nodes] %s\n' "$*" >&2; }
ndie() { printf '[nodes] ERROR: %s\n' "$*" >&2; exit 1; }
need_root() { [[ $(id -u) == 0 ]] || ndie "$1 needs root (containers, network namespaces, iptables): run as root"; }

bah() { buildah --root "$BUILDAH_ROOT" --runroot "$BUILDAH_RUNROOT" --storage-driver overlay "$@"; }

# The operator from the Helm chart, in pods on the nodes, with the image the nodes hold (no
# registry; image.sh tags it latest, the chart's default tag is its appVersion). Its output goes to LOG; non-zero if it is not available in 180 s.
install_operator_chart() { # LOG
    local helm
    helm=$("$NODES_DIR/../operator/helm_install.sh") || return 1
    "$helm" install cirrus "$REPO_DIR/helm/cirrus" -n cirrus-system --create-namespace \
        --set operator.image.tag=latest --set operator.image.pullPolicy=Never \
        --wait --timeout 180s >"$1" 2>&1
}

# A two-region SwarmJob (r1, r2) of the tiny model in 2 stages, as the tests and benchmarks
# run it on the two nodes: q8 outer steps, CPU requests in proportion to the work (a pod
# without requests crawls under load).
swarmjob_yaml() { # NAME PEERS-PER-STAGE STEPS SYNC-EVERY [CLIENTS-OF-R2 (default 1)]
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
  gateway: {syncEvery: $4, codec: q8}
  runPolicy: {backoffLimit: 2}
  regions:
$(for r in r1 r2; do cat <<REGION
    - name: $r
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
