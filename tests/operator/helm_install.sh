#!/usr/bin/env bash
# Prints the path of a helm binary of the pinned version: one on PATH if it is that version,
# else the one in the test cluster's cache (${CIRRUS_CACHE}/helm-<version>/bin), built there
# first if missing. helm is a plain Go module without replace directives, so
# `go install module@version` builds it (needs Go and the module proxy, once).
#   HELM_VERSION  override the pinned version (then set HELM_K8S_MINOR to match it)
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=../cluster/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../cluster/lib.sh"

HELM_VERSION=${HELM_VERSION:-v3.22.0}
# The Kubernetes minor version helm assumes when it has no cluster to ask (helm template, lint):
# helm's release builds set it from the k8s.io/client-go it requires (v0.37 for helm v3.22.0);
# without it a `go install` build says v1.20.
HELM_K8S_MINOR=${HELM_K8S_MINOR:-37}
HELM_HOME=$CIRRUS_CACHE/helm-$HELM_VERSION
HELM_BIN=$HELM_HOME/bin/helm

is_pinned() { [[ -x "$1" ]] && [[ "$("$1" version --template '{{.Version}}' 2>/dev/null)" == "$HELM_VERSION" ]]; }

if p=$(command -v helm 2>/dev/null) && is_pinned "$p"; then
    echo "$p"
    exit 0
fi
install_lock "helm-$HELM_VERSION" # `make test` may be building it in the background
if ! is_pinned "$HELM_BIN"; then
    command -v go >/dev/null || { echo "helm_install: Go is needed to build helm $HELM_VERSION" >&2; exit 1; }
    echo "helm_install: building helm $HELM_VERSION (go install) into $HELM_HOME/bin" >&2
    mkdir -p "$HELM_HOME/bin"
    start=$SECONDS
    # The linker flags of helm's own Makefile: its version and the default Kubernetes version.
    ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
    for pkg in pkg/lint/rules pkg/chartutil; do
        ldflags+=" -X helm.sh/helm/v3/$pkg.k8sVersionMajor=1 -X helm.sh/helm/v3/$pkg.k8sVersionMinor=$HELM_K8S_MINOR"
    done
    GOBIN="$HELM_HOME/bin" CGO_ENABLED=0 "${GO_BUILD_ENV[@]}" go install -trimpath -ldflags "$ldflags" \
        "helm.sh/helm/v3/cmd/helm@$HELM_VERSION" >&2
    is_pinned "$HELM_BIN" || { echo "helm_install: $HELM_BIN is not helm $HELM_VERSION" >&2; exit 1; }
    echo "helm_install: built helm $HELM_VERSION in $((SECONDS - start))s" >&2
fi
echo "$HELM_BIN"
