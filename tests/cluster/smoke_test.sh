#!/usr/bin/env bash
# Smoke test of the test cluster: brings it up with cluster.sh (or reuses one that is already
# running in the same state dir), checks that the control plane really works, tears down what
# it started. Exits non-zero if any check fails.
#
#   - the apiserver reports the pinned version
#   - nodes of both regions are Ready
#   - a bare Pod with a nodeSelector for region r2 is scheduled onto an r2 node and Running
#   - an object owned by a ConfigMap is garbage-collected when the ConfigMap is deleted
#   - a ServiceAccount token with a Role allowing only `get pods` can get a pod but is
#     Forbidden to list secrets (RBAC is enforced)
set -uo pipefail
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

CLUSTER="$CLUSTER_DIR/cluster.sh"
NS=cirrus-smoke-$$
TIMEOUT=60
PASSED=0
FAILED=0
STARTED=0
T0=$SECONDS

pass() { PASSED=$((PASSED + 1)); echo "PASS: $*"; }
fail() { FAILED=$((FAILED + 1)); echo "FAIL: $*"; }

finish() {
    local rc=$?
    trap - EXIT
    if ((STARTED)); then
        if ((FAILED || rc)) && [[ -n "${CIRRUS_CLUSTER_STATE:-}" && -d "$CIRRUS_CLUSTER_STATE/logs" ]]; then
            rm -rf "$CIRRUS_CLUSTER_STATE.logs"
            cp -r "$CIRRUS_CLUSTER_STATE/logs" "$CIRRUS_CLUSTER_STATE.logs"
            echo "smoke test: component logs copied to $CIRRUS_CLUSTER_STATE.logs"
        fi
        "$CLUSTER" down || fail "cluster.sh down"
    elif [[ -n "${KUBECONFIG:-}" ]]; then
        kubectl delete namespace "$NS" --wait=false >/dev/null 2>&1 || true
    fi
    echo "smoke test: $PASSED passed, $FAILED failed ($((SECONDS - T0))s)"
    ((FAILED == 0 && rc == 0)) || exit 1
    exit 0
}
trap finish EXIT
trap 'exit 130' INT TERM

# poll TIMEOUT COMMAND...: retry until the command succeeds
poll() {
    local deadline=$((SECONDS + $1)); shift
    until "$@" >/dev/null 2>&1; do
        ((SECONDS < deadline)) || return 1
        sleep 0.25
    done
}

# ---- bring-up ------------------------------------------------------------------------------
if "$CLUSTER" status >/dev/null 2>&1; then
    echo "smoke test: reusing the running cluster"
else
    STARTED=1
    if ! "$CLUSTER" up; then
        fail "cluster.sh up"
        exit 1
    fi
fi
env_lines=$("$CLUSTER" env) || { fail "cluster.sh env"; exit 1; }
eval "$env_lines"
kubectl create namespace "$NS" >/dev/null || { fail "create namespace $NS"; exit 1; }

# ---- 1. version ----------------------------------------------------------------------------
got=$(kubectl get --raw /version | sed -n 's/.*"gitVersion": *"\([^"]*\)".*/\1/p')
if [[ "$got" == "$K8S_VERSION" ]]; then
    pass "apiserver version is $got"
else
    fail "apiserver version is '$got', expected $K8S_VERSION"
fi

# ---- 2. nodes of both regions Ready --------------------------------------------------------
for r in r1 r2; do
    st=$(kubectl get nodes -l "topology.kubernetes.io/region=$r" \
        -o jsonpath='{range .items[*]}{.metadata.labels.cirrus\.dev/pool}={.status.conditions[?(@.type=="Ready")].status} {end}')
    if [[ -n "$st" && "$st" != *"=False"* && "$st" != *"= "* && "$st" == *"spot=True"* ]]; then
        pass "region $r nodes Ready: $st"
    else
        fail "region $r nodes not all Ready (or no spot node): '$st'"
    fi
done

# ---- 3. scheduling + kwok: a Pod pinned to region r2 runs on an r2 node --------------------
kubectl -n "$NS" apply -f - >/dev/null <<'EOF'
apiVersion: v1
kind: Pod
metadata:
  name: smoke
spec:
  nodeSelector:
    topology.kubernetes.io/region: r2
  automountServiceAccountToken: false
  containers:
  - name: main
    image: registry.invalid/cirrus/fake:latest
    resources:
      requests: {cpu: 100m, memory: 64Mi}
EOF
if kubectl -n "$NS" wait pod/smoke --for=jsonpath='{.status.phase}'=Running --timeout=${TIMEOUT}s >/dev/null; then
    node=$(kubectl -n "$NS" get pod smoke -o jsonpath='{.spec.nodeName}')
    region=$(kubectl get node "$node" -o jsonpath='{.metadata.labels.topology\.kubernetes\.io/region}')
    if [[ "$region" == r2 ]]; then
        pass "pod scheduled onto $node (region $region) and Running"
    else
        fail "pod scheduled onto $node in region '$region', expected r2"
    fi
else
    fail "pod did not reach Running: $(kubectl -n "$NS" get pod smoke -o jsonpath='{.status}' 2>&1)"
fi

# ---- 4. garbage collection (kube-controller-manager) ---------------------------------------
kubectl -n "$NS" create configmap gc-owner --from-literal=a=b >/dev/null
uid=$(kubectl -n "$NS" get configmap gc-owner -o jsonpath='{.metadata.uid}')
child_gone() { ! kubectl -n "$NS" get secret gc-child >/dev/null 2>&1; }
if [[ -n "$uid" ]] && kubectl -n "$NS" apply -f - >/dev/null <<EOF && ! child_gone; then
apiVersion: v1
kind: Secret
metadata:
  name: gc-child
  ownerReferences:
  - {apiVersion: v1, kind: ConfigMap, name: gc-owner, uid: "$uid"}
stringData:
  owner: gc-owner
EOF
    kubectl -n "$NS" delete configmap gc-owner >/dev/null
    if poll "$TIMEOUT" child_gone; then
        pass "object owned by a deleted ConfigMap was garbage-collected"
    else
        fail "object owned by a deleted ConfigMap still exists after ${TIMEOUT}s"
    fi
else
    fail "could not set up the garbage-collection check"
fi

# ---- 5. RBAC with a ServiceAccount token ---------------------------------------------------
kubectl -n "$NS" create serviceaccount reader >/dev/null
kubectl -n "$NS" create role pod-getter --verb=get --resource=pods >/dev/null
kubectl -n "$NS" create rolebinding reader-pod-getter --role=pod-getter --serviceaccount="$NS:reader" >/dev/null
token=$(kubectl -n "$NS" create token reader --duration=10m)
as_reader() {
    kubectl --kubeconfig=/dev/null --server="$CIRRUS_APISERVER" --certificate-authority="$CIRRUS_CA_FILE" \
        --token="$token" "$@"
}
who=$(as_reader auth whoami -o jsonpath='{.status.userInfo.username}' 2>&1)
if [[ "$who" == "system:serviceaccount:$NS:reader" ]]; then
    pass "token authenticates as $who"
else
    fail "token authenticates as '$who'"
fi
# Role bindings can take a moment to reach the authorizer's cache.
if poll 10 as_reader -n "$NS" get pod smoke; then
    pass "token can get pods"
else
    fail "token cannot get pods: $(as_reader -n "$NS" get pod smoke 2>&1)"
fi
out=$(as_reader -n "$NS" get secrets 2>&1)
rc=$?
if ((rc != 0)) && [[ "$out" == *Forbidden* || "$out" == *forbidden* ]]; then
    pass "token is Forbidden to list secrets"
else
    fail "listing secrets with the token: rc=$rc: $out"
fi
