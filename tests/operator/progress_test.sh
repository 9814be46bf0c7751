#!/usr/bin/env bash
# Training progress in the SwarmJob status, end to end (run by run.sh with KUBECONFIG set and
# kubectl on PATH): the operator (build/bin/cirrus-operator, as its ServiceAccount, leader)
# reads the region gateways' GET /status and writes step, loss and tokensPerSecond.
#   * job `good` has one region; its gateway is a real region run on this machine,
#     `cirrus-trainer local --job <good's uid> --status-port 7480`, which the operator reaches
#     at good-r1-gw.NS.svc:7480 through --resolve ...:127.0.0.1: within 30 s .status.step > 0,
#     .status.loss > 0, .status.tokensPerSecond > 0, the same per region, `kubectl get sj`
#     shows the step; the step advances, with at most about one status write per
#     --progress-period-s (1 s here); readyPeersPerStage is the gateway's count of live peers
#     (1: local's one peer) while it answers, though the job's two peer pods are Ready (kwok),
#     and the pods' count (2) once its answer is stale;
#   * job `wrong`'s gateway host is pinned to the same address, which answers with another
#     job's id (good's uid; a stale or wrong endpoint): ignored, its status has no step, the
#     log says why and /metrics counts it, and its ProgressCurrent condition is False
#     (GatewayUnreachable: no answer, another job's /status);
#   * ProgressCurrent of `good`: Unknown (NoAnswerYet) in its first Running status, True once
#     its gateway answers, with regions[0].progressTime the time of the last answer; the
#     region's process (its gateway) killed: False (GatewayUnreachable, naming r1 and its last
#     answer) no sooner than 3 s and within 15 s (3 periods of 1 s + 3 s; 30 s under
#     valgrind), the status write that says so keeping step, loss, tokensPerSecond and
#     progressTime as they were, and they stay; a region started again: True within 20 s;
#   * the operator exits 0 on SIGTERM.
# Skipped (exit 0, with a message) when port 7480 is taken: --resolve maps a host name to an
# address, not to another port, so the local gateway must listen on the gateway's own port.
# The corpus: $CIRRUS_CORPUS, else build/data/kjv.txt, else a small generated text.
# OPERATOR_VALGRIND=1 runs the operator under valgrind (CIRRUS_OPERATOR: a binary it can run)
# and fails on any invalid access or leak. Last line: "progress: N passed, N failed".
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
# shellcheck source=tests/operator/lib.sh
source "$root/tests/operator/lib.sh"
bin=${CIRRUS_OPERATOR:-$root/build/bin/cirrus-operator}
trainer=${CIRRUS_TRAINER:-$root/build/bin/cirrus-trainer}
NS=cirrus-progress-test-$$
GW_PORT=7480 # ROLE_PORT_HTTP (common/role_args.h): the port of the gateway Service's /status
work=$(mktemp -d)
kn() { kubectl -n "$NS" "$@"; }
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }'; }
wait_until() { # TIMEOUT_S COMMAND...: poll every 100 ms
    local deadline=$(($(date +%s) + $1)); shift
    until "$@" >/dev/null 2>&1; do
        (($(date +%s) < deadline)) || return 1
        sleep 0.1
    done
}
port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
positive() { awk -v v="$1" 'BEGIN { exit !(v ~ /^[0-9.eE+-]+$/ && v + 0 > 0) }'; }

op_pid= local_pid= hist_pid=
op_log=$work/operator.log
start_operator() {
    local -a cmd=("$bin" --kubeconfig "$work/kubeconfig" --namespace "$NS" --leader-elect
        --lease-namespace cirrus-system --metrics-port 0 --progress-period-s 1
        --resolve "good-r1-gw.$NS.svc:$GW_PORT:127.0.0.1"
        --resolve="wrong-r1-gw.$NS.svc:$GW_PORT:127.0.0.1")
    if [[ "${OPERATOR_VALGRIND:-0}" == 1 ]]; then
        cmd=(valgrind --quiet --leak-check=full --show-leak-kinds=definite,indirect --errors-for-leak-kinds=definite,indirect --error-exitcode=99 --log-file="$work/valgrind.%p" "${cmd[@]}")
    fi
    "${cmd[@]}" >>"$op_log" 2>&1 &
    op_pid=$!
}
stop_pid() { # VAR SIGNAL: signal the process in $VAR, wait for it; returns its exit status
    local pid=${!1}
    [[ -n "$pid" ]] || return 0
    kill "-$2" "$pid" 2>/dev/null
    local rc=0
    wait "$pid" 2>/dev/null || rc=$? # (no "Killed" notice from the shell)
    printf -v "$1" '%s' ""
    return $rc
}
cleanup() {
    # `local` takes its stage peer down with it (they die with their parent).
    [[ -n "$local_pid" ]] && stop_pid local_pid TERM
    [[ -n "$hist_pid" ]] && stop_pid hist_pid TERM
    [[ -n "$op_pid" ]] && kill -KILL "$op_pid" 2>/dev/null
    kubectl delete namespace "$NS" --ignore-not-found --wait=false >/dev/null 2>&1
    rm -rf "$work"
}
trap cleanup EXIT
finish() {
    if ((fail)); then
        echo "--- operator log (last 40 lines)"
        tail -40 "$op_log"
        echo "--- local region log (last 20 lines)"
        tail -20 "$work/local.log" 2>/dev/null
        echo "--- good's status writes (resourceVersion phase step loss tokens/s progressTime ProgressCurrent)"
        tail -30 "$work/history.txt" 2>/dev/null
        echo "--- jobs"
        kn get sj -o wide 2>&1
    fi
    checks_summary progress
    exit
}
fail_fast() { not_ok "$*"; finish; }

if port_in_use "$GW_PORT"; then
    echo "progress: skipped: port $GW_PORT on 127.0.0.1 is in use, and the local region's gateway must listen there"
    checks_summary progress
    exit 0
fi
[[ -x "$bin" ]] || fail_fast "$bin is missing (make all)"
[[ -x "$trainer" ]] || fail_fast "$trainer is missing (make all)"
corpus=${CIRRUS_CORPUS:-$root/build/data/kjv.txt}
[[ "$corpus" == /* ]] || corpus=$PWD/$corpus
if [[ ! -s "$corpus" ]]; then
    corpus=$work/corpus.txt
    for ((i = 0; i < 3000; i++)); do
        echo "In the beginning the operator read the status of every gateway, and it was good."
    done >"$corpus"
fi

why=$(operator_install_and_kubeconfig "$work/kubeconfig") || fail_fast "$why"
kubectl create namespace "$NS" >/dev/null || fail_fast "namespace $NS"
start_operator
wait_until 60 grep -q "caches synced" "$op_log" || fail_fast "operator did not sync its caches"
wait_until 30 grep -q "acquired the lease" "$op_log" || fail_fast "operator did not acquire the lease"
check "operator reads the gateways every 1 s, with --resolve" grep -q "reading the gateways' /status every 1 s (with --resolve)" "$op_log"

for job in good wrong; do
    cat <<EOF | kn apply -f - >/dev/null || fail_fast "apply job $job"
apiVersion: cirrus.dev/v1alpha1
kind: SwarmJob
metadata: {name: $job}
spec:
  image: cirrus:latest
  pipeline: {stages: 1}
  model: {preset: tiny, layers: 2}
  regions: [{name: r1, peers: {replicas: 2, min: 1}, clients: 1}]
EOF
    if [[ $job == good ]]; then
        # Every status write of good, one line each, for the checks of what a write held.
        # (";" between fields: kubectl aligns tab-separated output with spaces.)
        kn get sj good -w -o jsonpath='{.metadata.resourceVersion};{.status.phase};{.status.step};{.status.loss};{.status.tokensPerSecond};{.status.regions[0].progressTime};{.status.conditions[?(@.type=="ProgressCurrent")].status} {.status.conditions[?(@.type=="ProgressCurrent")].reason}{"\n"}' \
            >"$work/history.txt" 2>/dev/null &
        hist_pid=$!
    fi
done
running() { [[ "$(kn get sj "$1" -o jsonpath='{.status.phase} {.status.regions[0].gatewayReady}')" == "Running true" ]]; }
wait_until 60 running good || fail_fast "job good not Running with its gateway ready"
wait_until 60 running wrong || fail_fast "job wrong not Running with its gateway ready"
ok "jobs good and wrong Running, gateways ready (kwok)"
uid=$(kn get sj good -o jsonpath='{.metadata.uid}')
wrong_uid=$(kn get sj wrong -o jsonpath='{.metadata.uid}')
[[ -n "$uid" && -n "$wrong_uid" ]] || fail_fast "no metadata.uid"
expect_eq "no step before any gateway answers" "" "$(kn get sj good -o jsonpath='{.status.step}')"
# ProgressCurrent: "STATUS REASON|MESSAGE" of a job.
pcond() {
    kn get sj "$1" -o jsonpath='{.status.conditions[?(@.type=="ProgressCurrent")].status} {.status.conditions[?(@.type=="ProgressCurrent")].reason}|{.status.conditions[?(@.type=="ProgressCurrent")].message}'
}
pcond_is() { [[ "$(pcond "$1")" == "$2" ]]; }
# Its first Running status was written when its gateway had just become ready and been
# registered: nothing read from it yet, and 6 s to go before that counts as stale.
# The watch's stream may deliver that write a moment after a GET has seen it.
history_has_running() { awk -F';' '$2 == "Running" { found = 1 } END { exit !found }' "$work/history.txt"; }
wait_until 10 history_has_running
first_running=$(awk -F';' '$2 == "Running" { print $7; exit }' "$work/history.txt")
expect_eq "good: ProgressCurrent in its first Running status" "Unknown NoAnswerYet" "$first_running"
if [[ "$first_running" != "Unknown NoAnswerYet" ]]; then
    echo "--- good's status writes so far (resourceVersion;phase;step;loss;tokens/s;progressTime;ProgressCurrent)"
    head -n 12 "$work/history.txt"
fi

# ---- a real region as good's gateway ---------------------------------------------------------
CIRRUS_CORPUS=$corpus "$trainer" local --job "$uid" --stages 1 --peers 1 --layers 2 --width 32 \
    --heads 2 --context 16 --batch 2 --steps 1000000 --log-every 1000000 --status-port "$GW_PORT" \
    >"$work/local.log" 2>&1 &
local_pid=$!
ours() { curl -fsS "http://127.0.0.1:$GW_PORT/status" | jq -e --arg u "$uid" '.job_id == $u'; }
wait_until 20 ours || fail_fast "cirrus-trainer local did not serve /status on :$GW_PORT as job $uid"
ok "cirrus-trainer local --job <good's uid> serves /status on 127.0.0.1:$GW_PORT"

figures() { kn get sj "$1" -o jsonpath='{.status.step} {.status.loss} {.status.tokensPerSecond}'; }
all_positive() { local s l t; read -r s l t <<<"$(figures good)"; positive "$s" && positive "$l" && positive "$t"; }
t0=$(now)
if wait_until 30 all_positive; then
    ok "good: step, loss, tokensPerSecond all > 0 $(elapsed "$t0") s after the region started: $(figures good)"
else
    not_ok "good: status figures not all > 0 within 30 s: '$(figures good)'"
fi
read -r step loss tps rstep rloss rtps <<<"$(kn get sj good -o jsonpath='{.status.step} {.status.loss} {.status.tokensPerSecond} {.status.regions[0].step} {.status.regions[0].loss} {.status.regions[0].tokensPerSecond}')"
check "region r1's step, loss, tokensPerSecond > 0 ($rstep $rloss $rtps)" \
    bash -c "$(declare -f positive); positive '$rstep' && positive '$rloss' && positive '$rtps'"
# One region: the job's figures are the region's (min, mean and sum of one).
expect_eq "job figures = its one region's" "$rstep $rloss $rtps" "$step $loss $tps"
check "step is an integer" grep -Eq '^[1-9][0-9]*$' <<<"$step"
row=$(kn get sj good --no-headers)
check "kubectl get sj shows the step: $row" grep -Eq '^good +Running +1/1 +1/2 +[1-9][0-9]* ' <<<"$row"
wide=$(kn get sj good --no-headers -o wide)
check "kubectl get sj -o wide shows loss and tokens/s: $wide" \
    grep -Eq '^good +Running +1/1 +1/2 +[1-9][0-9]* +[0-9.e+-]+ +[0-9.e+-]+ ' <<<"$wide"
# Two peer pods are Ready (kwok), but the region's gateway counts one live peer (local's one):
# its count is the truth while it answers (rebalancing moves peers off their pods' stage
# labels); the other job, whose gateway's answer is not trusted, counts its pods.
per_stage() { kn get sj "$1" -o jsonpath='{.status.regions[0].readyPeersPerStage}'; }
expect_eq "good: readyPeersPerStage, the gateway's live peers" "[1]" "$(per_stage good)"
expect_eq "wrong: readyPeersPerStage, its Ready pods by their stage label" "[2]" "$(per_stage wrong)"
advanced() { (($(kn get sj good -o jsonpath='{.status.step}') > step)); }
check "the step advances" wait_until 10 advanced
answering="True GatewaysAnswering|every region's gateway answered within the last 6 s"
check "good: ProgressCurrent True once its gateway answers" wait_until 10 pcond_is good "$answering"
ptime=$(kn get sj good -o jsonpath='{.status.regions[0].progressTime}')
age=$(($(date +%s) - $(date -u -d "$ptime" +%s 2>/dev/null || echo 0)))
if [[ "$ptime" =~ ^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z$ ]] && ((age >= 0 && age <= 5)); then
    ok "good: regions[0].progressTime $ptime, $age s ago (read every 1 s)"
else
    not_ok "good: regions[0].progressTime '$ptime' is not an RFC 3339 time of the last few seconds"
fi

# Status writes: at most about one per period (1 s) while the figures change every read.
kn get sj good -w --watch-only -o jsonpath='{.metadata.resourceVersion} {.status.step}{"\n"}' >"$work/watch.txt" 2>/dev/null &
watch_pid=$!
sleep 6
kill "$watch_pid" 2>/dev/null
wait "$watch_pid" 2>/dev/null
writes=$(grep -c . "$work/watch.txt")
if ((writes >= 3 && writes <= 8)); then
    ok "$writes status writes in 6 s with --progress-period-s 1"
else
    not_ok "$writes status writes in 6 s with --progress-period-s 1 (wanted 3..8): $(tr '\n' ';' <"$work/watch.txt")"
fi

# ---- a gateway that answers for another job ------------------------------------------------
expect_eq "wrong: its gateway answers as job good: no step, loss or tokensPerSecond" "  " "$(figures wrong)"
expect_eq "wrong: nor per region" "" "$(kn get sj wrong -o jsonpath='{.status.regions[0].step}')"
expect_eq "wrong: nor a progressTime" "" "$(kn get sj wrong -o jsonpath='{.status.regions[0].progressTime}')"
wrong_cond="False GatewayUnreachable|no valid /status for over 6 s from region r1 (no answer; another job's /status)"
wait_until 10 pcond_is wrong "$wrong_cond"
expect_eq "wrong: ProgressCurrent" "$wrong_cond" "$(pcond wrong)"
check "the operator log names the wrong job id" \
    grep -q "wrong-r1-gw.$NS.svc:$GW_PORT/status: /status is job $uid's, not $wrong_uid's (a stale or wrong endpoint): ignored" "$op_log"
port=$(sed -n 's/.*metrics on :\([0-9]*\).*/\1/p' "$op_log" | tail -1)
metrics=$(curl -fsS "http://127.0.0.1:$port/metrics")
check "/metrics counts the other job's answers" \
    grep -Eq '^cirrus_operator_progress_scrapes_total\{result="wrong_job"\} [1-9]' <<<"$metrics"
check "/metrics counts good answers" \
    grep -Eq '^cirrus_operator_progress_scrapes_total\{result="ok"\} [1-9]' <<<"$metrics"

# ---- the region's gateway killed: the last figures stay, marked stale -------------------------
lost() { grep -c "good-r1-gw.$NS.svc:$GW_PORT/status: .*the status keeps the last figures" "$op_log"; }
n_lost=$(lost) # once already: the operator read it before the region was started
n_hist=$(wc -l <"$work/history.txt")
t_kill=$(date +%s)
t0=$(now)
stop_pid local_pid KILL # the gateway (the coordinator in `local`); its stage peer follows
gone() { (($(lost) > n_lost)); }
check "the operator notices the region is gone" wait_until 10 gone
stale_status() { [[ "$(pcond good)" == "False GatewayUnreachable|"* ]]; }
limit=15
[[ "${OPERATOR_VALGRIND:-0}" == 1 ]] && limit=30
if wait_until "$limit" stale_status; then
    took=$(elapsed "$t0")
    if awk -v t="$took" 'BEGIN { exit !(t >= 3) }'; then
        ok "good: ProgressCurrent False $took s after its gateway was killed (3 periods of 1 s + 3 s; limit $limit s)"
    else
        not_ok "good: ProgressCurrent False only $took s after its gateway was killed: sooner than 3 missed reads"
    fi
else
    not_ok "good: ProgressCurrent not False within $limit s of its gateway killed: $(pcond good)"
fi
read -r step loss tps ptime <<<"$(kn get sj good -o jsonpath='{.status.step} {.status.loss} {.status.tokensPerSecond} {.status.regions[0].progressTime}')"
expect_eq "good: ProgressCurrent names the region, its last answer and why" \
    "False GatewayUnreachable|no valid /status for over 6 s from region r1 (last answer $ptime; unreachable)" "$(pcond good)"
if (($(date -u -d "$ptime" +%s 2>/dev/null || echo 0) <= t_kill)); then
    ok "good: progressTime $ptime is from before the kill ($(date -u -d "@$t_kill" +%FT%TZ))"
else
    not_ok "good: progressTime $ptime is after the kill ($(date -u -d "@$t_kill" +%FT%TZ))"
fi
check "good: step, loss, tokensPerSecond kept ($step $loss $tps)" \
    bash -c "$(declare -f positive); positive '$step' && positive '$loss' && positive '$tps'"
expect_eq "good: readyPeersPerStage by its pods again once the gateway's answer is stale" "[2]" "$(per_stage good)"
# The write that turned the condition False changed nothing else: the same figures and
# progressTime as the write before it.
transition=$(awk -F';' -v from="$n_hist" '
    NR > from && $7 ~ /^False/ { print prev "|" $3 " " $4 " " $5 " " $6; exit }
    { prev = $3 " " $4 " " $5 " " $6 }' "$work/history.txt")
expect_eq "good: the write to False kept step, loss, tokensPerSecond, progressTime" \
    "$step $loss $tps $ptime|$step $loss $tps $ptime" "$transition"
sleep 2
expect_eq "and they stay" "$step $loss $tps $ptime" \
    "$(kn get sj good -o jsonpath='{.status.step} {.status.loss} {.status.tokensPerSecond} {.status.regions[0].progressTime}')"

# ---- a gateway answering again: True -------------------------------------------------------------
CIRRUS_CORPUS=$corpus "$trainer" local --job "$uid" --stages 1 --peers 1 --layers 2 --width 32 \
    --heads 2 --context 16 --batch 2 --steps 1000000 --log-every 1000000 --status-port "$GW_PORT" \
    >"$work/local2.log" 2>&1 &
local_pid=$!
t0=$(now)
if wait_until 20 pcond_is good "$answering"; then
    ok "good: ProgressCurrent True again $(elapsed "$t0") s after a region was started again"
else
    not_ok "good: ProgressCurrent not True within 20 s of a region started again: $(pcond good)"
fi
ptime2=$(kn get sj good -o jsonpath='{.status.regions[0].progressTime}')
if [[ "$ptime2" > "$ptime" ]]; then
    ok "good: progressTime moved on: $ptime2"
else
    not_ok "good: progressTime '$ptime2' not after '$ptime'"
fi
stop_pid local_pid TERM

# ---- clean shutdown --------------------------------------------------------------------------
stop_pid op_pid TERM
rc=$?
expect_eq "operator exits 0 on SIGTERM" 0 "$rc"
check_valgrind_clean "$work"
finish
