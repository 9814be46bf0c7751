# shellcheck shell=bash disable=SC2034  # variables are used by the scripts that source this
# Shared settings for install.sh, cluster.sh and smoke_test.sh. Source it; do not run it.
#
# The versions of Kubernetes, etcd, kwok, helm and CoreDNS come from k8s/go.mod (the single
# place they are pinned: one module builds them all).

CLUSTER_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
K8S_MOD_DIR="$CLUSTER_DIR/k8s"

# Oldest Debian etcd-server accepted instead of building etcd (kube-apiserver needs etcd 3.5.13+
# for consistent reads from its watch cache; the release itself is tested against 3.6).
ETCD_DEBIAN_MIN=3.5.13

gomod_version() { # module path -> required version in k8s/go.mod
    awk -v m="$1" '{ sub(/^require[ \t]+/, "") } $1 == m && $2 ~ /^v/ { print $2; exit }' "$K8S_MOD_DIR/go.mod"
}
K8S_VERSION=$(gomod_version k8s.io/kubernetes)
ETCD_VERSION=$(gomod_version go.etcd.io/etcd/server/v3)
KWOK_VERSION=$(gomod_version sigs.k8s.io/kwok)
HELM_VERSION=$(gomod_version helm.sh/helm/v3)
COREDNS_VERSION=$(gomod_version github.com/coredns/coredns)
if [[ -z "$K8S_VERSION" || -z "$ETCD_VERSION" || -z "$KWOK_VERSION" || -z "$HELM_VERSION" ||
    -z "$COREDNS_VERSION" ]]; then
    echo "cannot read the pinned versions from $K8S_MOD_DIR/go.mod" >&2
    exit 1
fi

CIRRUS_CACHE=${CIRRUS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/cirrus}
K8S_HOME=${K8S_HOME:-$CIRRUS_CACHE/k8s-$K8S_VERSION}
K8S_BIN=$K8S_HOME/bin
# kwok's default node and pod lifecycle stages (as kwokctl uses them), taken from the kwok module.
KWOK_STAGES=$K8S_HOME/kwok-stages.yaml
K8S_BINARIES=(kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet kube-proxy etcd kwok helm coredns)

# Put before `go build` / `go install`: the compiler collects garbage a quarter as often, for
# a little more memory (a cold build of kwok: 320 s of CPU instead of 372 s, peak 1.05 GB
# instead of 0.96 GB). Only the builds: the programs built, run later, keep Go's default.
GO_BUILD_ENV=(env "GOGC=${CIRRUS_BUILD_GOGC:-400}")

log() { printf '[cluster] %s\n' "$*" >&2; }
die() { printf '[cluster] ERROR: %s\n' "$*" >&2; exit 1; }

# install_lock NAME: hold $CIRRUS_CACHE/NAME.lock until the calling script exits, waiting
# (and saying so) while another install holds it: `make test` starts the builds in the
# background and its suites ask for them again while they may still be running.
install_lock() {
    mkdir -p "$CIRRUS_CACHE"
    exec {_install_lock_fd}>"$CIRRUS_CACHE/$1.lock"
    if ! flock -n "$_install_lock_fd"; then
        log "$1: another install is running; waiting for it"
        flock "$_install_lock_fd"
    fi
}

# ---- certificates (openssl), in the directory $PKI of the script that sources this ----------

b64() { base64 -w0 <"$1"; }

gen_key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }

# sign NAME SUBJECT EXTENSIONS: key + CSR, certificate signed by the test CA
sign() {
    local name=$1 subj=$2 ext=$3
    gen_key "$PKI/$name.key"
    openssl req -new -key "$PKI/$name.key" -subj "$subj" -out "$PKI/$name.csr" 2>/dev/null
    printf '%s\n' "$ext" >"$PKI/$name.ext"
    openssl x509 -req -in "$PKI/$name.csr" -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" -CAcreateserial \
        -days 365 -sha256 -extfile "$PKI/$name.ext" -out "$PKI/$name.crt" 2>/dev/null
    rm -f "$PKI/$name.csr" "$PKI/$name.ext"
}

# kubeconfig FILE CERT-NAME USER (server https://$API_ADDRESS:$CLUSTER_API_PORT)
write_kubeconfig() {
    cat >"$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: cirrus-test
  cluster:
    server: https://$API_ADDRESS:$CLUSTER_API_PORT
    certificate-authority-data: $(b64 "$PKI/ca.crt")
users:
- name: $3
  user:
    client-certificate-data: $(b64 "$PKI/$2.crt")
    client-key-data: $(b64 "$PKI/$2.key")
contexts:
- name: cirrus-test
  context:
    cluster: cirrus-test
    user: $3
current-context: cirrus-test
EOF
    chmod 600 "$1"
}
