# Set-up shared by the operator's end-to-end tests (sourced, not run).
#
# operator_install_and_kubeconfig OUT: applies manifests/ (CRD, RBAC, the operator's
# ServiceAccount), waits until the CRD is Established, removes a Lease an earlier run's
# standby may hold, and writes to OUT a kubeconfig that authenticates as the operator's
# ServiceAccount (a TokenRequest token), so its RBAC is really exercised. On failure it
# prints the step that failed and returns 1. Needs CIRRUS_APISERVER and CIRRUS_CA_FILE
# (tests/cluster/cluster.sh env) and kubectl on PATH.
operator_install_and_kubeconfig() {
    local out=$1 root token
    root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
    kubectl apply -f "$root/manifests/" >/dev/null 2>&1 || { echo "kubectl apply -f manifests/"; return 1; }
    kubectl wait --for condition=Established --timeout=30s crd/swarmjobs.cirrus.dev >/dev/null 2>&1 ||
        { echo "CRD not Established"; return 1; }
    kubectl -n cirrus-system delete lease cirrus-operator --ignore-not-found >/dev/null 2>&1
    token=$(kubectl -n cirrus-system create token cirrus-operator --duration=1h) ||
        { echo "TokenRequest"; return 1; }
    cat >"$out" <<KUBECONFIG
apiVersion: v1
kind: Config
clusters:
- name: test
  cluster: {server: "$CIRRUS_APISERVER", certificate-authority: "$CIRRUS_CA_FILE"}
users:
- name: cirrus-operator
  user: {token: "$token"}
contexts:
- name: test
  context: {cluster: test, user: cirrus-operator}
current-context: test
KUBECONFIG
}

# check_valgrind_clean WORKDIR: under OPERATOR_VALGRIND=1, one check that the valgrind logs
# WORKDIR/valgrind.* are empty (no invalid access, no leak). Uses the test's ok/not_ok.
check_valgrind_clean() {
    [[ "${OPERATOR_VALGRIND:-0}" == 1 ]] || return 0
    if cat "$1"/valgrind.* 2>/dev/null | grep -q .; then
        not_ok "valgrind reported: $(cat "$1"/valgrind.* | head -30)"
    else
        ok "valgrind: no invalid accesses, no leaks"
    fi
}
