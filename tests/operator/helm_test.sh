#!/usr/bin/env bash
# The helm chart in helm/cirrus (run by run.sh with KUBECONFIG set and kubectl on PATH):
#   * helm (pinned, built once into the cache by helm_install.sh) lints and renders the chart,
#     with the defaults and with options switched;
#   * the plain manifests in manifests/ are what the chart renders (helm/generate-manifests.sh);
#   * values.schema.json refuses wrong values before anything renders;
#   * helm install into the test cluster (own release and namespace) rolls the operator out
#     (2 replicas, a PodDisruptionBudget, the metrics Service), upgrade changes it (1 replica,
#     another tag, rights in its own namespace only), uninstall removes it and keeps the CRD.
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

expect_eq "helm version" "$(awk '$1 == "helm.sh/helm/v3" { print $2 }' "$here/../cluster/k8s/go.mod")" \
    "$(h version --template '{{.Version}}')"
run "helm lint --strict" h lint --strict "$chart"
run "helm lint with crd.install=false, leaderElect=false, namespace.create=true" \
    h lint --strict "$chart" --set crd.install=false --set operator.leaderElect=false --set namespace.create=true
if out=$(h template cirrus "$chart" --namespace cirrus-system 2>&1); then
    kinds=$(sed -n 's/^kind: //p' <<<"$out" | sort | tr '\n' ' ')
    expect_eq "helm template kinds" "ClusterRole ClusterRoleBinding CustomResourceDefinition Deployment PodDisruptionBudget Role RoleBinding Service ServiceAccount " "$kinds"
    app_version=$(sed -n 's/^appVersion: "\(.*\)"$/\1/p' "$chart/Chart.yaml")
    check "default image tag: the chart's appVersion ($app_version)" grep -qF "image: \"cirrus:$app_version\"" <<<"$out"
    check "2 replicas, spread over nodes where possible" grep -q "topologyKey: kubernetes.io/hostname" <<<"$out"
else
    not_ok "helm template: $out"
fi
out=$(h template cirrus "$chart" --set operator.replicas=1 --set metrics.service.enabled=false 2>&1)
if [[ $? -eq 0 && "$out" != *PodDisruptionBudget* && "$out" != *podAntiAffinity* && "$out" != *"kind: Service"$'\n'* ]]; then
    ok "helm template with 1 replica and no metrics Service: no PodDisruptionBudget, no anti-affinity, no Service"
else
    not_ok "helm template with 1 replica: $out"
fi
out=$(h template cirrus "$chart" --set metrics.serviceMonitor.enabled=true --set 'metrics.serviceMonitor.labels.release=prom' 2>&1)
if [[ $? -eq 0 && "$out" == *"kind: ServiceMonitor"* && "$out" == *"release: prom"* && "$out" == *"port: metrics"* ]]; then
    ok "helm template with a ServiceMonitor (its labels, the metrics port)"
else
    not_ok "helm template with a ServiceMonitor: $out"
fi
check_not "a ServiceMonitor without the metrics Service is refused" \
    h template cirrus "$chart" --set metrics.serviceMonitor.enabled=true --set metrics.service.enabled=false
out=$(h template cirrus "$chart" --namespace ops --set operator.watchNamespace=team-a 2>&1)
rc=$?
rbac=$(awk '/^kind: ClusterRole$/,/^---/' <<<"$out")
if [[ $rc -eq 0 && "$out" == *"--namespace=team-a"* && "$out" == *"namespace: team-a"* &&
    "$rbac" != *swarmjobs* && "$rbac" == *nodes* ]]; then
    ok "helm template with watchNamespace: --namespace, a Role in team-a, the ClusterRole only reads Nodes"
else
    not_ok "helm template with watchNamespace: $out"
fi
# values.schema.json: wrong types, values and unknown keys are refused before rendering.
for bad in operator.replicas=0 operator.image.pullPolicy=Sometimes operator.replica=2 \
    operator.watchNamespace=Team_A metrics.serviceMonitor.interval=often; do
    if out=$(h template cirrus "$chart" --set "$bad" 2>&1); then
        not_ok "values schema: --set $bad accepted"
    else
        check "values schema: --set $bad refused" grep -q "values don't meet the specifications of the schema" <<<"$out"
    fi
done
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
expect_eq "operator Deployment ready replicas" 2 \
    "$(kubectl -n "$NS" get deployment "$REL-operator" -o jsonpath='{.status.readyReplicas}')"
expect_eq "PodDisruptionBudget: one replica may go at a time" 1 \
    "$(kubectl -n "$NS" get pdb "$REL-operator" -o jsonpath='{.spec.maxUnavailable}')"
expect_eq "metrics Service port" "metrics 8080" \
    "$(kubectl -n "$NS" get service "$REL-operator-metrics" -o jsonpath='{.spec.ports[0].name} {.spec.ports[0].port}')"
expect_eq "CRD owned by the release" "$REL" \
    "$(kubectl get crd swarmjobs.cirrus.dev -o jsonpath='{.metadata.annotations.meta\.helm\.sh/release-name}')"
run "ClusterRoleBinding binds the release's ServiceAccount" \
    kubectl auth can-i list swarmjobs.cirrus.dev -A --as="system:serviceaccount:$NS:$REL-operator"
run "the release's leader-election Role works" \
    kubectl auth can-i update leases.coordination.k8s.io/cirrus-operator -n "$NS" --as="system:serviceaccount:$NS:$REL-operator"
run "a SwarmJob is accepted with the chart's CRD" kubectl apply -n "$NS" -f "$root/manifests/samples/swarmjob.yaml"

run "helm upgrade (1 replica, another image tag, watching the release's namespace only)" \
    h upgrade "$REL" "$chart" -n "$NS" --reuse-values --set operator.replicas=1 --set operator.image.tag=v2 \
    --set operator.watchNamespace="$NS" --wait --timeout 60s
expect_eq "after upgrade: ready replicas, image" "1 cirrus:v2" \
    "$(kubectl -n "$NS" get deployment "$REL-operator" -o jsonpath='{.status.readyReplicas} {.spec.template.spec.containers[0].image}')"
check_not "after upgrade: no PodDisruptionBudget for 1 replica" kubectl -n "$NS" get pdb "$REL-operator"
sa="system:serviceaccount:$NS:$REL-operator"
run "watchNamespace: the operator may list SwarmJobs in $NS" kubectl auth can-i list swarmjobs.cirrus.dev -n "$NS" --as="$sa"
check_not "watchNamespace: not in another namespace" kubectl auth can-i list swarmjobs.cirrus.dev -n default --as="$sa"
check_not "watchNamespace: not its pods elsewhere" kubectl auth can-i create pods -n default --as="$sa"
run "watchNamespace: still reads Nodes" kubectl auth can-i watch nodes --as="$sa"

run "helm uninstall" h uninstall "$REL" -n "$NS" --wait --timeout 60s
if kubectl get clusterrole "$REL-operator" >/dev/null 2>&1; then
    not_ok "uninstall left the ClusterRole"
else
    ok "uninstall removed the ClusterRole"
fi
run "uninstall kept the CRD (helm.sh/resource-policy: keep) and the SwarmJobs" \
    kubectl get sj -n "$NS" tiny-bible

finish
