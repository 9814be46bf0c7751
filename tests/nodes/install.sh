#!/usr/bin/env bash
# Installs what the real nodes need, idempotently:
#   Debian packages   containerd, runc, the CNI plugins, buildah, mmdebstrap, iptables, conntrack
#   Go programs       the control plane, kubelet, kube-proxy and CoreDNS, with the rest the
#                     tests build (tests/cluster/install.sh)
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
