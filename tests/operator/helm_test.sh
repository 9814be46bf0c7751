#!/usr/bin/env bash
# The helm chart in helm/cirrus (run by run.sh with KUBECONFIG set and kubectl on PATH):
#   * helm (pinned, built once into the cache by helm_install.sh) lints and renders the chart,
#     with the defaults and with options switched;
#   * the plain manifests in manifests/ are what the chart renders (helm/generate-manifests.sh);
#   * helm install into the test cluster (own release and namespace) rolls the operator out,
#     upgrade changes it, uninstall removes it and keeps the CRD.
# The SwarmJob CRD is cluster-wide: when it already exists (from kubectl apply -f manifests/)
# the release takes it over (--take-ownership); afterwards Helm's ownership marks are removed
# and manifests/00-crd.yaml is applied again, so the cluster is left as it was found.
# Last line: "helm: N passed, N failed"; exits non-zero if anything failed.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
# shellcheck source=tests/operator/lib.sh
source "$here/lib.sh"
chart=$root/helm/cirrus
REL=cirrus-helm-test
NS=cirrus-helm-test
finish() { checks_summary helm; exit; }
run() { # DESCRIPTION COMMAND...: ok if it succeeds, else FAIL with its output
    local what=$1 out; shift
    if out=$("$@" 2>&1); then ok "$what"; else not_ok "$what: $(tail -5 <<<"$out")"; fi
}

if ! HELM=$("$here/helm_install.sh"); then
    not_ok "installing helm (tests/operator/helm_install.sh)"
    finish
fi
export HELM
# helm's own state (repositories, cache) stays out of the user's home.
helm_home=$(mktemp -d)
export HELM_CACHE_HOME=$helm_home/cache HELM_CONFIG_HOME=$helm_home/config HELM_DATA_HOME=$helm_home/data
h() { "$HELM" "$@"; }

crd_existed=0
kubectl get crd swarmjobs.cirrus.dev >/dev/null 2>&1 && crd_existed=1
# shellcheck disable=SC2317  # called by the EXIT trap
cleanup() {
    h uninstall "$REL" -n "$NS" --wait --timeout 60s >/dev/null 2>&1
    kubectl delete namespace "$NS" --ignore-not-found --wait=false >/dev/null 2>&1
    if ((crd_existed)); then
        # Back to the CRD as kubectl apply -f manifests/ made it, without Helm's marks.
        kubectl annotate crd swarmjobs.cirrus.dev meta.helm.sh/release-name- meta.helm.sh/release-namespace- >/dev/null 2>&1
        kubectl label crd swarmjobs.cirrus.dev app.kubernetes.io/managed-by- >/dev/null 2>&1
        kubectl apply -f "$root/manifests/00-crd.yaml" >/dev/null 2>&1
    else
        kubectl delete crd swarmjobs.cirrus.dev --ignore-not-found >/dev/null 2>&1
    fi
    rm -rf "$helm_home"
}
trap cleanup EXIT

# ---- lint and render -------------------------------------------------------------------------

# shellcheck disable=SC2016  # a literal ${ in the pattern
expect_eq "helm version" "$(sed -n 's/^HELM_VERSION=\${HELM_VERSION:-\(.*\)}$/\1/p' "$here/helm_install.sh")" \
    "$(h version --template '{{.Version}}')"
run "helm lint --strict" h lint --strict "$chart"
run "helm lint with crd.install=false, leaderElect=false, namespace.create=true" \
    h lint --strict "$chart" --set crd.install=false --set operator.leaderElect=false --set namespace.create=true
if out=$(h template cirrus "$chart" --namespace cirrus-system 2>&1); then
    kinds=$(sed -n 's/^kind: //p' <<<"$out" | sort | tr '\n' ' ')
    expect_eq "helm template kinds" "ClusterRole ClusterRoleBinding CustomResourceDefinition Deployment Role RoleBinding ServiceAccount " "$kinds"
else
    not_ok "helm template: $out"
fi
out=$(h template x "$chart" --namespace ops --set crd.install=false --set operator.leaderElect=false \
    --set operator.image.repository=example/cirrus --set operator.image.tag=v9 --set fullnameOverride=op 2>&1)
if [[ $? -eq 0 && "$out" != *CustomResourceDefinition* && "$out" != *"kind: Role"$'\n'* &&
    "$out" == *'image: "example/cirrus:v9"'* && "$out" == *"name: op"$'\n'* && "$out" != *--leader-elect* ]]; then
    ok "helm template with options: no CRD, no leader election Role, image and name set"
else
    not_ok "helm template with options: $out"
fi
run "manifests/ is up to date with the chart (helm/generate-manifests.sh --check)" \
    "$root/helm/generate-manifests.sh" --check
# shellcheck disable=SC2016  # expanded by the inner shell
run "helm template output passes a server-side dry run" \
    bash -c '"$HELM" template "$1" "$2" --namespace default | kubectl apply --dry-run=server -f -' _ "$REL" "$chart"

# ---- install, upgrade, uninstall ---------------------------------------------------------------

if ! out=$(h install "$REL" "$chart" -n "$NS" --create-namespace --take-ownership --wait --timeout 60s 2>&1); then
    not_ok "helm install: $out"
    finish
fi
ok "helm install $REL (namespace $NS, taking over an existing CRD: $crd_existed)"
if [[ "$out" == *"kubectl -n $NS rollout status deployment/$REL-operator"* ]]; then
    ok "NOTES.txt printed"
else
    not_ok "NOTES.txt: $out"
fi
expect_eq "release status" deployed "$(h status "$REL" -n "$NS" -o json 2>/dev/null | sed -n 's/.*"status":"\([a-z-]*\)".*/\1/p' | head -1)"
expect_eq "operator Deployment ready replicas" 1 \
    "$(kubectl -n "$NS" get deployment "$REL-operator" -o jsonpath='{.status.readyReplicas}')"
expect_eq "CRD owned by the release" "$REL" \
    "$(kubectl get crd swarmjobs.cirrus.dev -o jsonpath='{.metadata.annotations.meta\.helm\.sh/release-name}')"
run "ClusterRoleBinding binds the release's ServiceAccount" \
    kubectl auth can-i list swarmjobs.cirrus.dev -A --as="system:serviceaccount:$NS:$REL-operator"
run "the release's leader-election Role works" \
    kubectl auth can-i update leases.coordination.k8s.io/cirrus-operator -n "$NS" --as="system:serviceaccount:$NS:$REL-operator"
run "a SwarmJob is accepted with the chart's CRD" kubectl apply -n "$NS" -f "$root/manifests/samples/swarmjob.yaml"

run "helm upgrade (2 replicas, another image tag)" \
    h upgrade "$REL" "$chart" -n "$NS" --reuse-values --set operator.replicas=2 --set operator.image.tag=v2 --wait --timeout 60s
expect_eq "after upgrade: ready replicas, image" "2 cirrus:v2" \
    "$(kubectl -n "$NS" get deployment "$REL-operator" -o jsonpath='{.status.readyReplicas} {.spec.template.spec.containers[0].image}')"

run "helm uninstall" h uninstall "$REL" -n "$NS" --wait --timeout 60s
if kubectl get clusterrole "$REL-operator" >/dev/null 2>&1; then
    not_ok "uninstall left the ClusterRole"
else
    ok "uninstall removed the ClusterRole"
fi
run "uninstall kept the CRD (helm.sh/resource-policy: keep) and the SwarmJobs" \
    kubectl get sj -n "$NS" tiny-bible

finish
