#!/usr/bin/env bash
# Installs the binaries the cluster, operator and real-node tests need into a cache outside
# the repository, keyed by the Kubernetes version:
#
#   ${CIRRUS_CACHE:-$HOME/.cache/cirrus}/k8s-<version>/bin/
#       kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet kube-proxy
#       etcd    Debian etcd-server if new enough, else built (the etcd server module that the
#               pinned Kubernetes release itself requires)
#       kwok    the simulated nodes of the scale and operator tests
#       helm    the chart's tests and `helm install`
#       coredns the real nodes' cluster DNS (k8s/coredns: the plugins a test cluster uses)
#   ${CIRRUS_CACHE:-$HOME/.cache/cirrus}/k8s-<version>/kwok-stages.yaml
#       kwok's default node/pod lifecycle stages, from the same kwok module version
#
# All built by one `go build` in the k8s/ wrapper module, where every version is pinned: the
# libraries they share are compiled once (a cold build of kwok, helm and CoreDNS each in its
# own module compiled k8s.io/api, client-go and gRPC again, at other versions).
#
# Idempotent: binaries already in the cache are skipped. Needs Go (see k8s/go.mod for the
# minimum) and network access to the Go module proxy on the first run.
#
# Environment: CIRRUS_CACHE (cache root), CIRRUS_NICE (nice level of the builds, default 0),
# CIRRUS_BUILD_ETCD=1 (always build etcd, ignore the Debian package).
set -euo pipefail
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

NICE=(nice -n "${CIRRUS_NICE:-0}")
export CGO_ENABLED=0 GOFLAGS="-trimpath -buildvcs=false"

install_lock "k8s-$K8S_VERSION"
command -v go >/dev/null || die "go is not installed (need the version in $K8S_MOD_DIR/go.mod or newer)"
mkdir -p "$K8S_BIN"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/cirrus-install.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

have() { [[ -x "$K8S_BIN/$1" ]]; }
now() { date +%s; }

log "Kubernetes $K8S_VERSION, etcd $ETCD_VERSION, kwok $KWOK_VERSION, helm $HELM_VERSION, CoreDNS $COREDNS_VERSION -> $K8S_BIN"

# ---- etcd from Debian, when its version is new enough --------------------------------------
# The package is only downloaded and unpacked into the cache (no root, no etcd system service).
etcd_from_debian() {
    [[ "${CIRRUS_BUILD_ETCD:-0}" == 1 ]] && return 1
    command -v apt-cache >/dev/null && command -v dpkg >/dev/null || return 1
    local cand
    cand=$(apt-cache policy etcd-server 2>/dev/null | awk '/Candidate:/ { print $2 }')
    if [[ -z "$cand" || "$cand" == "(none)" ]]; then
        log "etcd: no Debian etcd-server package known to apt (package lists may need 'apt-get update', as root); building etcd $ETCD_VERSION"
        return 1
    fi
    if ! dpkg --compare-versions "$cand" ge "$ETCD_DEBIAN_MIN"; then
        log "etcd: Debian etcd-server $cand is older than $ETCD_DEBIAN_MIN; building etcd $ETCD_VERSION"
        return 1
    fi
    log "etcd: using Debian etcd-server $cand"
    (cd "$WORK" && apt-get download etcd-server >/dev/null) || { log "etcd: apt-get download failed; building instead"; return 1; }
    dpkg-deb -x "$WORK"/etcd-server_*.deb "$WORK/etcd-deb"
    install -m 0755 "$WORK/etcd-deb/usr/bin/etcd" "$K8S_BIN/etcd"
}

# ---- everything else from the wrapper module, in one build ----------------------------------
declare -A PKG=(
    [kube-apiserver]=k8s.io/kubernetes/cmd/kube-apiserver
    [kube-controller-manager]=k8s.io/kubernetes/cmd/kube-controller-manager
    [kube-scheduler]=k8s.io/kubernetes/cmd/kube-scheduler
    [kubectl]=k8s.io/kubernetes/cmd/kubectl
    [kubelet]=k8s.io/kubernetes/cmd/kubelet
    [kube-proxy]=k8s.io/kubernetes/cmd/kube-proxy
    [etcd]=go.etcd.io/etcd/server/v3
    [kwok]=sigs.k8s.io/kwok/cmd/kwok
    [helm]=helm.sh/helm/v3/cmd/helm
    [coredns]=cirrus.test/cluster/k8s/coredns
)
todo=()
for b in "${K8S_BINARIES[@]}"; do
    if have "$b"; then
        log "$b: present, skipping"
    elif [[ "$b" == etcd ]] && etcd_from_debian; then
        :
    else
        todo+=("$b")
    fi
done

if ((${#todo[@]})); then
    # Version stamps as the Kubernetes release build sets them (hack/lib/version.sh), and as
    # helm's Makefile sets its own: its version, and the Kubernetes version it assumes without
    # a cluster to ask (helm template, lint): the client-go it is built with, the release's.
    minor=${K8S_VERSION#v1.}; minor=${minor%%.*}
    build_date=$(cd "$K8S_MOD_DIR" && go list -m -f '{{if .Time}}{{.Time.UTC.Format "2006-01-02T15:04:05Z"}}{{end}}' k8s.io/kubernetes 2>/dev/null) || build_date=""
    ldflags="-s -w"
    for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
        ldflags+=" -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean"
        [[ -n "$build_date" ]] && ldflags+=" -X $p.buildDate=$build_date"
    done
    ldflags+=" -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
    for p in pkg/lint/rules pkg/chartutil; do
        ldflags+=" -X helm.sh/helm/v3/$p.k8sVersionMajor=1 -X helm.sh/helm/v3/$p.k8sVersionMinor=$minor"
    done
    pkgs=(); for b in "${todo[@]}"; do pkgs+=("${PKG[$b]}"); done

    t0=$(now)
    log "downloading Go modules for: ${todo[*]}"
    (cd "$K8S_MOD_DIR" && go list -deps "${pkgs[@]}" >/dev/null)
    t1=$(now)
    log "modules ready in $((t1 - t0))s; building ${todo[*]} (this takes a while on a cold Go build cache)"
    (cd "$K8S_MOD_DIR" && "${NICE[@]}" "${GO_BUILD_ENV[@]}" go build -tags notest,grpcnotrace -ldflags "$ldflags" -o "$WORK/out/" "${pkgs[@]}")
    [[ -e "$WORK/out/server" ]] && mv "$WORK/out/server" "$WORK/out/etcd" # go.etcd.io/etcd/server/v3
    for b in "${todo[@]}"; do
        [[ -x "$WORK/out/$b" ]] || die "build produced no $b"
        mv "$WORK/out/$b" "$K8S_BIN/$b"
    done
    log "built ${todo[*]} in $(($(now) - t1))s"
fi

# kwok only simulates what its Stage objects describe; the binary has none built in. Use the
# defaults of kwokctl: node-fast, node heartbeat with leases, pod-fast.
if [[ -s "$KWOK_STAGES" ]]; then
    log "kwok stages: present, skipping"
else
    kwok_src=$(cd "$K8S_MOD_DIR" && go list -m -f '{{.Dir}}' sigs.k8s.io/kwok)
    [[ -d "$kwok_src/kustomize/stage" ]] || die "cannot find the kwok $KWOK_VERSION sources in the Go module cache"
    for f in node/fast/node-initialize node/heartbeat-with-lease/node-heartbeat-with-lease \
        pod/fast/pod-ready pod/fast/pod-complete pod/fast/pod-delete; do
        printf -- '---\n# sigs.k8s.io/kwok@%s kustomize/stage/%s.yaml\n' "$KWOK_VERSION" "$f"
        cat "$kwok_src/kustomize/stage/$f.yaml"
    done >"$WORK/kwok-stages.yaml"
    mv "$WORK/kwok-stages.yaml" "$KWOK_STAGES"
    log "kwok stages: written to $KWOK_STAGES"
fi

# ---- check ---------------------------------------------------------------------------------
got=$("$K8S_BIN/kube-apiserver" --version 2>&1 | awk '{ print $2 }')
[[ "$got" == "$K8S_VERSION" ]] || die "kube-apiserver reports '$got', expected $K8S_VERSION"
log "ready: ${K8S_BINARIES[*]} ($(du -sh "$K8S_BIN" | cut -f1))"
