#!/usr/bin/env bash
# Installs what the real nodes need, idempotently:
#   Debian packages   containerd, runc, the CNI plugins, buildah, mmdebstrap, iptables, conntrack
#   Kubernetes        the control plane plus kubelet and kube-proxy (tests/cluster/install.sh)
#   CoreDNS           the cluster DNS, built from coredns/ into ${CIRRUS_CACHE}/nodes/bin
# Needs root for the packages; Go and the module proxy for the builds (first run only).
set -euo pipefail
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

install_lock nodes
missing=()
for p in "${NODES_DEB_PKGS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || missing+=("$p")
done
if ((${#missing[@]})); then
    [[ $(id -u) == 0 ]] || ndie "installing Debian packages needs root; run as root or: sudo apt-get install ${missing[*]}"
    nlog "installing Debian packages: ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -o DPkg::Lock::Timeout=600 "${missing[@]}" >/dev/null
else
    nlog "Debian packages present"
fi
# Debian starts a containerd service when the package is installed; the nodes run their own.
if command -v systemctl >/dev/null && systemctl is-active --quiet containerd 2>/dev/null; then
    nlog "note: a system containerd is running; the nodes do not use it"
fi

"$NODES_DIR/../cluster/install.sh"

if [[ -x "$NODES_BIN/coredns-$COREDNS_VERSION" ]]; then
    nlog "coredns $COREDNS_VERSION: present"
else
    t0=$SECONDS
    nlog "coredns $COREDNS_VERSION: building (slim: the plugins a test cluster uses)"
    mkdir -p "$NODES_BIN"
    (cd "$COREDNS_MOD_DIR" && CGO_ENABLED=0 "${GO_BUILD_ENV[@]}" go build -trimpath -buildvcs=false -ldflags "-s -w" \
        -o "$NODES_BIN/coredns-$COREDNS_VERSION.tmp" .)
    mv "$NODES_BIN/coredns-$COREDNS_VERSION.tmp" "$NODES_BIN/coredns-$COREDNS_VERSION"
    nlog "coredns: built in $((SECONDS - t0))s"
fi
