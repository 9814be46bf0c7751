# shellcheck shell=bash
# What the operator's end-to-end tests share (sourced, not run): the checks and their tally,
# and the set-up.
#
# ---- checks ----------------------------------------------------------------------------------
# Each check prints one line, "  ok   WHAT" or "  FAIL WHAT", and counts it in $pass or $fail:
#   ok WHAT / not_ok WHAT              a check decided by the caller
#   check WHAT COMMAND...              ok if COMMAND succeeds (its output hidden)
#   check_not WHAT COMMAND...          ok if COMMAND fails
#   expect_eq WHAT EXPECTED ACTUAL     ok if equal (the line shows both when not)
#   checks_summary NAME                prints "NAME: N passed, N failed"; status 1 if any
#                                      failed, so a test ends with `checks_summary NAME; exit`
pass=0
fail=0
ok() { pass=$((pass + 1)); printf '  ok   %s\n' "$*"; }
not_ok() { fail=$((fail + 1)); printf '  FAIL %s\n' "$*"; }
check() {
    local what=$1; shift
    if "$@" >/dev/null 2>&1; then ok "$what"; else not_ok "$what"; fi
}
check_not() {
    local what=$1; shift
    if "$@" >/dev/null 2>&1; then not_ok "$what"; else ok "$what"; fi
}
expect_eq() {
    if [[ "$2" == "$3" ]]; then ok "$1 = $2"; else not_ok "$1: expected '$2', got '$3'"; fi
}
checks_summary() {
    echo "$1: $pass passed, $fail failed"
    ((fail == 0))
}

# ---- set-up ----------------------------------------------------------------------------------
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
# WORKDIR/valgrind.* are empty (no invalid access, no leak).
check_valgrind_clean() {
    [[ "${OPERATOR_VALGRIND:-0}" == 1 ]] || return 0
    if cat "$1"/valgrind.* 2>/dev/null | grep -q .; then
        not_ok "valgrind reported: $(cat "$1"/valgrind.* | head -30)"
    else
        ok "valgrind: no invalid accesses, no leaks"
    fi
}

# ---- one operator for a focused test ---------------------------------------------------------
# poll_until TIMEOUT_S COMMAND...       every 100 ms until COMMAND succeeds; 1 after TIMEOUT_S
# test_operator_start WORK NAMESPACE [FLAG...]
#                                       runs the operator ($CIRRUS_OPERATOR, else
#                                       build/bin/cirrus-operator) as its ServiceAccount
#                                       (WORK/kubeconfig from operator_install_and_kubeconfig),
#                                       leader-elected, watching NAMESPACE only ("": every
#                                       namespace), with any
#                                       further FLAGs, its log in WORK/operator.log; sets
#                                       op_pid (so call it outside $(...)); returns 1 unless
#                                       it leads within 60 s; under OPERATOR_VALGRIND=1
#                                       in valgrind (its logs WORK/valgrind.*:
#                                       check_valgrind_clean WORK)
# test_operator_stop                    SIGTERM; returns the operator's exit status
poll_until() {
    local deadline=$(($(date +%s) + $1)); shift
    until "$@" >/dev/null 2>&1; do
        (($(date +%s) < deadline)) || return 1
        sleep 0.1
    done
}
op_pid=
test_operator_start() {
    local bin=${CIRRUS_OPERATOR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/build/bin/cirrus-operator}
    [[ -x "$bin" ]] || { echo "$bin is missing (make all)" >"$1/operator.log"; return 1; }
    local -a vg=()
    [[ "${OPERATOR_VALGRIND:-0}" == 1 ]] &&
        vg=(valgrind --quiet --leak-check=full --show-leak-kinds=definite,indirect
            --errors-for-leak-kinds=definite,indirect --error-exitcode=99
            --log-file="$1/valgrind.%p")
    "${vg[@]}" "$bin" --kubeconfig "$1/kubeconfig" ${2:+--namespace "$2"} --leader-elect \
        --lease-namespace cirrus-system --metrics-port 0 "${@:3}" >>"$1/operator.log" 2>&1 &
    op_pid=$!
    poll_until 60 grep -q "acquired the lease" "$1/operator.log"
}
test_operator_stop() {
    [[ -n "$op_pid" ]] || return 0
    kill -TERM "$op_pid" 2>/dev/null
    local rc=0
    wait "$op_pid" || rc=$?
    op_pid=
    return $rc
}

# focused_test_begin NAME NAMESPACE_PREFIX: what a focused test (created_test.sh,
# runpolicy_test.sh, podsecurity_test.sh) starts with: NS (PREFIX-PID), work (a temporary
# folder), kn (kubectl in NS), an EXIT trap that kills the operator (and the fault proxy,
# faultproxy_start's) and deletes NS and work,
# finish (the operator log's last 40 lines on failure, then the "NAME: N passed" summary and
# exit), fail_fast; then the operator installed (work/kubeconfig) and NS created. The test
# starts its operator itself (test_operator_start), after anything NS must have first.
focused_test_begin() {
    FOCUSED_NAME=$1
    NS=$2-$$
    work=$(mktemp -d)
    kn() { kubectl -n "$NS" "$@"; }
    proxy_pid=
    focused_cleanup() {
        [[ -n "$op_pid" ]] && kill -KILL "$op_pid" 2>/dev/null
        [[ -n "$proxy_pid" ]] && kill -TERM "$proxy_pid" 2>/dev/null
        kubectl delete namespace "$NS" --ignore-not-found --wait=false >/dev/null 2>&1
        rm -rf "$work"
    }
    trap focused_cleanup EXIT
    finish() {
        if ((fail)); then
            echo "--- operator log (last 40 lines)"
            tail -40 "$work/operator.log"
        fi
        checks_summary "$FOCUSED_NAME"
        exit
    }
    fail_fast() { not_ok "$*"; finish; }
    local why
    why=$(operator_install_and_kubeconfig "$work/kubeconfig") || fail_fast "$why"
    kubectl create namespace "$NS" >/dev/null || fail_fast "namespace $NS"
}

# faultproxy_start ARGS...: faultproxy.py (with ARGS) before the real API server, for the
# operator in $work/op: the proxy's self-signed certificate, its port in $work/proxy.port, its
# log in $work/proxy.log, and $work/op/kubeconfig (the test's, its ServiceAccount's token,
# with the proxy as server and its certificate as the authority). Sets proxy_pid, which
# focused_test_begin's EXIT trap kills; fails the test at once if the proxy does not start.
faultproxy_start() {
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1 \
        -keyout "$work/proxy.key" -out "$work/proxy.crt" -subj /CN=cirrus-fault-proxy \
        -addext subjectAltName=IP:127.0.0.1 >/dev/null 2>&1 || fail_fast "openssl: the proxy's certificate"
    python3 "$(dirname "${BASH_SOURCE[0]}")/faultproxy.py" --upstream "$CIRRUS_APISERVER" \
        --upstream-ca "$CIRRUS_CA_FILE" --cert "$work/proxy.crt" --key "$work/proxy.key" \
        --port-file "$work/proxy.port" "$@" >"$work/proxy.out" 2>"$work/proxy.log" &
    proxy_pid=$!
    poll_until 10 test -s "$work/proxy.port" || fail_fast "the proxy did not start: $(tail -3 "$work/proxy.log")"
    mkdir -p "$work/op"
    sed -e "s#server: \"$CIRRUS_APISERVER\"#server: \"https://127.0.0.1:$(cat "$work/proxy.port")\"#" \
        -e "s#certificate-authority: \"$CIRRUS_CA_FILE\"#certificate-authority: \"$work/proxy.crt\"#" \
        "$work/kubeconfig" >"$work/op/kubeconfig"
    grep -q "127.0.0.1:$(cat "$work/proxy.port")" "$work/op/kubeconfig" || fail_fast "the operator's kubeconfig names the proxy"
    ln -s op/operator.log "$work/operator.log" # where finish() looks
}

# ---- small jobs in NS, for the focused tests (kn as focused_test_begin defines it) ----------
# one_region_job NAME RUNPOLICY: applies a one-region job (a gateway, one peer, one client)
# with that runPolicy (a YAML flow mapping).
one_region_job() {
    job_apply "$1" <<EOF
  regions: [{name: r1, peers: {replicas: 1, min: 1}, clients: 1}]
  runPolicy: $2
EOF
}
# job_apply NAME: applies SwarmJob NAME (image cirrus:latest) in NS, the rest of its spec,
# indented two spaces, on stdin.
job_apply() {
    { printf 'apiVersion: cirrus.dev/v1alpha1\nkind: SwarmJob\nmetadata: {name: %s}\nspec:\n  image: cirrus:latest\n' "$1"
      cat; } | kn apply -f - >/dev/null
}
# one_region_job_running NAME: its three pods are Running.
one_region_job_running() {
    [[ $(kn get pods -l "cirrus.dev/job=$1" --field-selector status.phase=Running -o name | wc -l) == 3 ]]
}
# job_phase_is NAME PHASE
job_phase_is() { [[ "$(kn get sj "$1" -o jsonpath='{.status.phase}' 2>/dev/null)" == "$2" ]]; }
