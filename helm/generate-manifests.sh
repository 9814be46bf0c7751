#!/usr/bin/env bash
# The chart in helm/cirrus is the one source of the operator's Kubernetes objects; the plain
# manifests in manifests/ are rendered from it with the chart's defaults (release "cirrus",
# namespace cirrus-system, created by the manifests):
#   helm/generate-manifests.sh          rewrite manifests/*.yaml
#   helm/generate-manifests.sh --check  exit 1 (showing a diff) if they are out of date
# helm comes from $HELM, else tests/operator/helm_install.sh (pinned, cached).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
check=0
[[ "${1:-}" == "--check" ]] && check=1
HELM=${HELM:-$("$root/tests/operator/helm_install.sh")}

# manifest file -> chart template
files=(00-crd.yaml:crd.yaml 10-namespace.yaml:namespace.yaml 20-rbac.yaml:rbac.yaml 30-operator.yaml:operator.yaml
    40-pdb.yaml:pdb.yaml 50-metrics-service.yaml:metrics-service.yaml)

render() { # template -> the rendered objects, under a header instead of helm's "# Source:" lines
    printf '%s\n' "# Generated from helm/cirrus/templates/$1 by helm/generate-manifests.sh: edit the chart," \
        "# not this file. Apply with: kubectl apply -f manifests/"
    "$HELM" template cirrus "$root/helm/cirrus" --namespace cirrus-system --set namespace.create=true \
        --show-only "templates/$1" | grep -v '^# Source: '
}

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
status=0
for f in "${files[@]}"; do
    render "${f#*:}" >"$out/${f%%:*}"
    if ((check)); then
        if ! diff -u "$root/manifests/${f%%:*}" "$out/${f%%:*}"; then
            status=1
        fi
    else
        cp "$out/${f%%:*}" "$root/manifests/${f%%:*}"
    fi
done
if ((check && status)); then
    echo "manifests/ is out of date with helm/cirrus: run helm/generate-manifests.sh" >&2
fi
exit "$status"
