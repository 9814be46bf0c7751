#!/usr/bin/env bash
# Prints the path of a helm binary of the pinned version (tests/cluster/k8s/go.mod): one on
# PATH if it is that version, else the one tests/cluster/install.sh builds into the test
# cluster's cache with the other Go programs (building it first if missing: needs Go and the
# module proxy, once).
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=../cluster/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../cluster/lib.sh"

HELM_BIN=$K8S_BIN/helm

is_pinned() { [[ -x "$1" ]] && [[ "$("$1" version --template '{{.Version}}' 2>/dev/null)" == "$HELM_VERSION" ]]; }

if p=$(command -v helm 2>/dev/null) && is_pinned "$p"; then
    echo "$p"
    exit 0
fi
if ! is_pinned "$HELM_BIN"; then
    rm -f "$HELM_BIN" # another version: built again
    "$CLUSTER_DIR/install.sh" >&2
    is_pinned "$HELM_BIN" || { echo "helm_install: $HELM_BIN is not helm $HELM_VERSION" >&2; exit 1; }
fi
echo "$HELM_BIN"
