#!/usr/bin/env bash
# make bench-operator: the operator at scale on kwok nodes (issue 13's benchmark). Brings up a
# control plane of its own (build/bench-cluster, fake nodes enough for the largest run), runs
# the operator from build/bin as its ServiceAccount (leader-elected, every namespace), and for
# each job count in BENCH_JOBS (default "100 1000") runs bench-operator (bench_operator.c) in
# a fresh namespace with a freshly started operator: apply -> every pod, one-at-a-time
# replacement p50/p99, MASS simultaneous preemptions, CPU, peak RSS, API requests per
# reconcile, leadership. Prints the machine's CPU and each run's report; the figures go to
# docs/BENCHMARKS.md. Goals (issue 13): RSS < 20 MB, replacement p99 < 1 s, 100 simultaneous
# preemptions replaced in < 10 s, no leadership loss.
# Usage: bench_operator.sh BENCH_OPERATOR_BINARY
set -uo pipefail
root=$(cd "$(dirname "$0")/../../.." && pwd)
tool=${1:?usage: bench_operator.sh BENCH_OPERATOR_BINARY}
# shellcheck source=tests/operator/lib.sh
source "$root/tests/operator/lib.sh"
jobs_list=${BENCH_JOBS:-100 1000}
largest=0
for n in $jobs_list; do ((n > largest)) && largest=$n; done
# 20 pods a job, half per region; each region has 2 pools of nodes with 110 pods each.
export CLUSTER_NODES_PER_POOL=$(((largest * 10 + 2 * 110 - 1) / (2 * 110) + 1))
export CLUSTER_STATE_DIR=$root/build/bench-cluster
# Two gateway Services a job: more than the default /24 holds.
export CLUSTER_SERVICE_CIDR=10.0.0.0/20
cluster=$root/tests/cluster/cluster.sh
work=$(mktemp -d)
cleanup() {
    [[ -n "$op_pid" ]] && kill -KILL "$op_pid" 2>/dev/null
    "$cluster" down >/dev/null 2>&1
    rm -rf "$work"
}
trap cleanup EXIT
cpuinfo() { grep -m1 "^$1" /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'; }
echo "bench-operator: $(cpuinfo 'model name') (family $(cpuinfo 'cpu family') model $(cpuinfo 'model\s')), $(nproc) CPUs, $(date -u +%Y-%m-%d)"
echo "bench-operator: control plane with $((4 * CLUSTER_NODES_PER_POOL)) kwok nodes (jobs: $jobs_list)"
"$cluster" down >/dev/null 2>&1
"$cluster" up || { echo "bench-operator: the control plane did not come up" >&2; exit 1; }
eval "$("$cluster" env)"
why=$(operator_install_and_kubeconfig "$work/kubeconfig") || { echo "bench-operator: $why" >&2; exit 1; }
# manifests/ also made the operator's Deployment, whose pods kwok only pretends to run: gone,
# so the one operator is this process.
kubectl -n cirrus-system scale deployment cirrus-operator --replicas 0 >/dev/null
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
status=0
for n in $jobs_list; do
    ns=bench-$n
    kubectl create namespace "$ns" >/dev/null || { status=1; continue; }
    : >"$work/operator.log"
    if ! test_operator_start "$work" "" --metrics-port "$port"; then
        echo "bench-operator: the operator did not lead: $(tail -3 "$work/operator.log")" >&2
        status=1
        break
    fi
    echo "bench-operator: $n jobs in namespace $ns"
    "$tool" --namespace "$ns" --jobs "$n" --operator-pid "$op_pid" \
        --metrics-url "http://127.0.0.1:$port/metrics" --samples 100 --mass $((n < 100 ? n : 100)) \
        --timeout-s $((900 + 2 * n)) || status=1
    if grep -q "not leading any more" "$work/operator.log"; then
        echo "bench-operator: the operator lost its lease during the run:"
        grep "not leading any more" "$work/operator.log" | head -3
        status=1
    fi
    test_operator_stop
    kubectl delete namespace "$ns" --wait=true --timeout=600s >/dev/null 2>&1 ||
        echo "bench-operator: namespace $ns not gone in 600 s" >&2
done
exit "$status"
