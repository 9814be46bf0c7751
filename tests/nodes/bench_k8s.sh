#!/usr/bin/env bash
# `make bench-k8s`: what running on Kubernetes costs Cirrus, on the real nodes of this
# machine (tests/nodes/README.md). The same layout, two regions x 2 stages x 2 peers of the
# tiny model with q8 outer steps, runs twice, back to back on the same cores:
#   1. `cirrus-trainer local --regions 2`: every role a process on this machine;
#   2. a SwarmJob, the operator installed with `helm install`, every role a pod.
# It reports
#   - end-to-end tokens/s of the job (both regions' clients: tokens / their training
#     seconds, summed) against local's, as a ratio (goal: within 10%);
#   - time from `kubectl apply` to the first training step (its end, estimated from the
#     clients' first progress line, at step 10, less 9 steps at the run's mean step time;
#     the lines' times are the kubelet's log timestamps);
#   - time from a peer pod's deletion to its replacement serving ("serving layers" in the
#     new pod's log) and to the client admitting it ("joined"), in a third run.
# The WAN is not shaped: the question is what the orchestration costs, not the link.
# Needs root and tests/nodes/install.sh + image.sh. Exits non-zero if a run fails or a figure
# cannot be read; the figures themselves are reported, not judged (BENCHMARKS.md).
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib.sh
source "$here/lib.sh"
need_root "make bench-k8s"
BIN=${CIRRUS_TRAINER:-$REPO_DIR/build/bin/cirrus-trainer}
STEPS=${BENCH_STEPS:-200}
SYNC_EVERY=${BENCH_SYNC_EVERY:-50}
PEERS=2
NS=cirrus-bench
work=$(mktemp -d)
say() { printf '[bench-k8s] %s\n' "$*"; }
die() { say "ERROR: $*"; exit 1; }
trap '"$here/nodes.sh" down >"$work/down.log" 2>&1 || say "nodes.sh down: $(tail -3 "$work/down.log")"; rm -rf "$work"' EXIT
export CIRRUS_CORPUS=${CIRRUS_CORPUS:-$REPO_DIR/build/data/kjv.txt}

# Seconds (with fractions) since the epoch of an RFC 3339 time.
epoch() { date -d "$1" +%s.%N; }
# tokens/s of one "done: N steps, ..., T tokens in S.Ss" line, summed over the lines given.
sum_rates() { sed -n 's/^done: .* \([0-9]*\) tokens in \([0-9.]*\)s$/\1 \2/p' | awk '{ r += $1 / $2; n++ } END { if (n) printf "%.1f %d\n", r, n }'; }

say "1/4 local: cirrus-trainer local --regions 2 --stages 2 --peers $PEERS, $STEPS steps"
"$BIN" local --model tiny --stages 2 --peers "$PEERS" --regions 2 --sync-every "$SYNC_EVERY" \
    --codec q8 --steps "$STEPS" >"$work/local.log" 2>&1 || die "local: $(tail -3 "$work/local.log")"
read -r local_tps local_n < <(sum_rates <"$work/local.log")
[[ "${local_n:-0}" == 2 ]] || die "local: expected 2 'done' lines: $(tail -3 "$work/local.log")"
say "    local: ${local_tps} tokens/s (both regions)"

say "2/4 the control plane, two real nodes, the operator from the Helm chart"
"$here/nodes.sh" up >"$work/up.log" 2>&1 || die "nodes.sh up: $(tail -5 "$work/up.log")"
eval "$("$here/nodes.sh" env)"
install_operator_chart "$work/helm.log" || die "helm install: $(tail -5 "$work/helm.log")"
kubectl create namespace "$NS" >/dev/null

sj() { kubectl -n "$NS" get sj "$1" -o jsonpath="$2" 2>/dev/null; }
wait_phase() { # NAME PHASE TIMEOUT
    local until=$((SECONDS + $3)) p
    while p=$(sj "$1" '{.status.phase}'); [[ "$p" != "$2" ]]; do
        [[ "$p" == Failed ]] && die "$1 failed: $(sj "$1" '{.status.conditions}')"
        ((SECONDS < until)) || die "$1 not $2 within $3 s (phase '$p')"
        sleep 1
    done
}
client_logs() { # NAME: both clients' logs, with the kubelet's timestamps
    local r
    for r in r1 r2; do kubectl -n "$NS" logs --timestamps "$1-$r-c0" 2>/dev/null; done
}

say "3/4 the SwarmJob: the same layout, $STEPS steps"
t_apply=$(date +%s.%N)
swarmjob_yaml bench "$PEERS" "$STEPS" "$SYNC_EVERY" | kubectl -n "$NS" apply -f - >/dev/null ||
    die "kubectl apply failed"
wait_phase bench Succeeded 1200
client_logs bench >"$work/k8s.log"
read -r k8s_tps k8s_n < <(cut -d' ' -f2- "$work/k8s.log" | sum_rates)
[[ "${k8s_n:-0}" == 2 ]] || die "the clients' logs lack their 'done' lines"
# The first step: the earliest "step 10/" line less 9 mean steps (tokens / rate / 10 steps).
first=$(awk '$2 == "step" && $3 ~ /^10\// { print $1 }' "$work/k8s.log" | sort | head -1)
[[ -n "$first" ]] || die "no 'step 10/' line in the clients' logs"
# The mean step: the first client's training seconds over the steps ("... tokens in S.Ss").
step_s=$(awk -v steps="$STEPS" '$2 == "done:" { s = $NF; sub(/s$/, "", s); printf "%.4f", s / steps; exit }' "$work/k8s.log")
to_first=$(awk -v a="$t_apply" -v f="$(epoch "$first")" -v s="$step_s" 'BEGIN { printf "%.1f", f - 9 * s - a }')
ratio=$(awk -v k="$k8s_tps" -v l="$local_tps" 'BEGIN { printf "%.3f", k / l }')
say "    SwarmJob: ${k8s_tps} tokens/s (both regions): ${ratio}x local's"
say "    kubectl apply -> first training step: ${to_first} s (mean step ${step_s} s)"
kubectl -n "$NS" delete sj bench --wait=true >/dev/null

say "4/4 a preemption: a peer pod deleted, its replacement serving and admitted"
swarmjob_yaml preempt "$PEERS" 100000 "$SYNC_EVERY" | kubectl -n "$NS" apply -f - >/dev/null ||
    die "kubectl apply failed"
ready_all() { [[ "$(sj preempt '{.status.readyPeers}')" == "$((PEERS * 4))/$((PEERS * 4))" ]]; }
until=$((SECONDS + 300))
until ready_all && [[ "$(sj preempt '{.status.step}')" -ge 20 ]] 2>/dev/null; do
    ((SECONDS < until)) || die "the preemption job never reached step 20 with every peer ready"
    sleep 1
done
victim=preempt-r1-s1-0
old_uid=$(kubectl -n "$NS" get pod "$victim" -o jsonpath='{.metadata.uid}')
t_delete=$(date +%s.%N)
kubectl -n "$NS" delete pod "$victim" --wait=false >/dev/null
serving="" joined=""
until=$((SECONDS + 180))
while [[ -z "$serving" || -z "$joined" ]]; do
    ((SECONDS < until)) || die "no replacement of $victim serving and joined within 180 s"
    sleep 1
    uid=$(kubectl -n "$NS" get pod "$victim" -o jsonpath='{.metadata.uid}' 2>/dev/null)
    [[ -n "$uid" && "$uid" != "$old_uid" ]] || continue
    [[ -n "$serving" ]] || serving=$(kubectl -n "$NS" logs --timestamps "$victim" 2>/dev/null |
        awk '/serving layers/ { print $1; exit }')
    ip=$(kubectl -n "$NS" get pod "$victim" -o jsonpath='{.status.podIP}')
    [[ -n "$serving" && -n "$ip" ]] && joined=$(kubectl -n "$NS" logs --timestamps preempt-r1-c0 |
        awk -v ip="$ip:" 'index($0, "peer " ip) && /joined/ { print $1; exit }')
done
to_serving=$(awk -v a="$t_delete" -v b="$(epoch "$serving")" 'BEGIN { printf "%.1f", b - a }')
to_joined=$(awk -v a="$t_delete" -v b="$(epoch "$joined")" 'BEGIN { printf "%.1f", b - a }')
say "    pod deleted -> replacement serving: ${to_serving} s; -> admitted by the client: ${to_joined} s"
kubectl -n "$NS" delete sj preempt --wait=false >/dev/null

cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)
say "summary ($(nproc) x ${cpu}, $(date +%F)):"
printf '  layout: 2 regions x 2 stages x %d peers, tiny model, %d steps, q8 outer step every %d\n' \
    "$PEERS" "$STEPS" "$SYNC_EVERY"
printf '  tokens/s: local %s, SwarmJob %s, ratio %s (goal >= 0.90)\n' "$local_tps" "$k8s_tps" "$ratio"
printf '  kubectl apply -> first step: %s s\n' "$to_first"
printf '  preemption -> replacement serving: %s s, -> admitted: %s s\n' "$to_serving" "$to_joined"
