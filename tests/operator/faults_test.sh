#!/usr/bin/env bash
# The operator against a misbehaving API server (run by run.sh with KUBECONFIG set and kubectl
# on PATH; the pods run on kwok nodes). The operator talks to the real kube-apiserver only
# through faultproxy.py, which injects at random (seeded) 429s with Retry-After, 500s, 409s
# on writes, answers held past the operator's 30 s timeout, truncated JSON, watches cut in
# the middle of an event and watches ended by an in-stream 410 Gone. Meanwhile three
# SwarmJobs run and the test deletes their pods (preemptions) directly through the real API
# server, for FAULTS_CHAOS_S seconds (default 80). Then the proxy is told to behave, and:
#   * the operator never exited and its log shows no crash;
#   * at no sample (about one a second, throughout) did two live pods hold the same role
#     slot of a job (job, region, role, stage, index), nor a pod bear another slot's name;
#   * within FAULTS_CONVERGE_S (default 120) every job has all its pods Running and its
#     status counts exactly the pods the test deleted as preemptions, no failures;
#   * the Lease is held by the operator, which leads, and every time it stopped leading
#     it won the lease back (no other holder ever appears); it lost it only after its own
#     lease requests failed, never because the loop was held up;
#   * every kind of fault was injected at least once (the proxy's own counts), so a proxy
#     that silently stopped injecting fails the test.
# FAULTS_SEED picks the proxy's and the deletions' random choices (printed; default random).
# FAULTS_LOG_DIR, if set, keeps the operator's and the proxy's logs, the samples and the
# deletions there.
# `make chaos-operator` runs the same longer (FAULTS_CHAOS_S from CHAOS_MINUTES).
# Last line: "faults: N passed, N failed"; exits non-zero if anything failed.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
# shellcheck source=tests/operator/lib.sh
source "$root/tests/operator/lib.sh"
chaos_s=${FAULTS_CHAOS_S:-80}
converge_s=${FAULTS_CONVERGE_S:-120}
seed=${FAULTS_SEED:-$((RANDOM * 32768 + RANDOM))}
echo "faults: seed $seed, ${chaos_s} s of faults (FAULTS_SEED=$seed reproduces the random choices)"
RANDOM=$seed
focused_test_begin faults cirrus-faults-test
proxy_pid= sampler_pid=
faults_cleanup() {
    [[ -n "$sampler_pid" ]] && kill "$sampler_pid" 2>/dev/null
    [[ -n "$proxy_pid" ]] && kill -TERM "$proxy_pid" 2>/dev/null
    if [[ -n "${FAULTS_LOG_DIR:-}" ]]; then
        mkdir -p "$FAULTS_LOG_DIR" && cp "$work/op/operator.log" "$work/proxy.log" "$work/samples" \
            "$work/deletions" "$work/faults.json" "$FAULTS_LOG_DIR/" 2>/dev/null
    fi
    focused_cleanup
}
trap faults_cleanup EXIT

# ---- the proxy and the operator behind it ------------------------------------------------------
# One answer held past the timeout at most: each parks the operator's loop for 30 s (but not
# the elector, which has a client and a thread of its own).
faultproxy_start --seed "$seed" --report "$work/faults.json" \
    --max-delays "${FAULTS_MAX_DELAYS:-1}" --rate-delay 0.03 --rate-cut 0.4 --rate-gone 0.4
t_start=$(date +%s)
test_operator_start "$work/op" "$NS" || fail_fast "operator not leading through the proxy: $(tail -3 "$work/op/operator.log")"
identity=$(sed -n 's/.*electing as \([^:]*\): watching.*/\1/p' "$work/op/operator.log" | head -1)

# ---- three jobs: 17 pods ------------------------------------------------------------------------
kn apply -f - >/dev/null <<EOF || fail_fast "the jobs were refused"
apiVersion: cirrus.dev/v1alpha1
kind: SwarmJob
metadata: {name: fa}
spec:
  image: cirrus:latest
  pipeline: {stages: 2}
  regions: [{name: r1, peers: {replicas: 2, min: 1}, clients: 1}]
---
apiVersion: cirrus.dev/v1alpha1
kind: SwarmJob
metadata: {name: fb}
spec:
  image: cirrus:latest
  regions:
    - {name: r1, peers: {replicas: 1, min: 1}, clients: 1}
    - {name: r2, peers: {replicas: 1, min: 1}, clients: 1}
---
apiVersion: cirrus.dev/v1alpha1
kind: SwarmJob
metadata: {name: fc}
spec:
  image: cirrus:latest
  regions: [{name: r2, peers: {replicas: 2, min: 1}, clients: 2}]
EOF
declare -A want_pods=([fa]=6 [fb]=6 [fc]=5)
declare -A regions=([fa]="r1" [fb]="r1 r2" [fc]="r2")

# ---- the sampler: duplicates and strays, about once a second -----------------------------------
# A live pod (not terminating, not ended) per (job, region, role, stage, index), named as the
# operator names that slot (JOB-REGION-gw, JOB-REGION-sSTAGE-INDEX, JOB-REGION-cINDEX).
sample_jq='[.items[] | select(.metadata.deletionTimestamp == null and .status.phase != "Failed" and .status.phase != "Succeeded")
  | .metadata.labels as $l
  | {name: .metadata.name,
     slot: ($l["cirrus.dev/job"] + "/" + $l["cirrus.dev/region"] + "/" + $l["cirrus.dev/role"] + "/" + ($l["cirrus.dev/stage"] // "-") + "/" + ($l["cirrus.dev/index"] // "-")),
     want: ($l["cirrus.dev/job"] + "-" + $l["cirrus.dev/region"] + "-" +
            (if $l["cirrus.dev/role"] == "gateway" then "gw"
             elif $l["cirrus.dev/role"] == "peer" then "s" + $l["cirrus.dev/stage"] + "-" + $l["cirrus.dev/index"]
             else "c" + $l["cirrus.dev/index"] end))}]
  | (group_by(.slot) | map(select(length > 1) | "duplicate " + (map(.name) | join(",")))) +
    map(select(.name != .want) | "stray " + .name + " in slot " + .slot)
  | if length == 0 then "ok" else join("; ") end'
(
    while :; do
        if out=$(kubectl -n "$NS" get pods -o json 2>/dev/null | jq -r "$sample_jq" 2>/dev/null) && [[ -n "$out" ]]; then
            echo "$(date +%s) $out"
        fi
        sleep 0.7
    done
) >"$work/samples" &
sampler_pid=$!

# ---- preemptions through the real API server, while the proxy misbehaves -----------------------
declare -A deleted=()  # "job/region" -> pods the test deleted
declare -A gone_uid=() # uids deleted, never picked again
n_deleted=0
running_pods() { # "name uid job region" of Running pods not being deleted
    kn get pods -o json 2>/dev/null | jq -r '.items[] | select(.metadata.deletionTimestamp == null and .status.phase == "Running")
        | "\(.metadata.name) \(.metadata.uid) \(.metadata.labels["cirrus.dev/job"]) \(.metadata.labels["cirrus.dev/region"])"'
}
all_pods_up() { # every job's pods exist and run, none terminating
    local j n
    for j in fa fb fc; do
        n=$(kn get pods -l "cirrus.dev/job=$j" -o json 2>/dev/null |
            jq '[.items[] | select(.metadata.deletionTimestamp == null and .status.phase == "Running")] | length')
        [[ "$n" == "${want_pods[$j]}" ]] || return 1
    done
    [[ $(kn get pods -o name 2>/dev/null | wc -l) == 17 ]]
}
check "all 17 pods running under faults" poll_until 90 all_pods_up
# Faults for chaos_s seconds, and on (60 s at most) until the proxy has injected every kind.
all_kinds_injected() {
    jq -e '[.faults[]] | all(. >= 1)' "$work/faults.json" >/dev/null 2>&1
}
end=$(($(date +%s) + chaos_s))
while (($(date +%s) < end)) || { ! all_kinds_injected && (($(date +%s) < end + 60)); }; do
    mapfile -t pods < <(running_pods)
    # One pod, or now and then two at once (a node's worth of preemptions).
    for ((k = 0; k < 1 + (RANDOM % 4 == 0); k++)); do
        ((${#pods[@]})) || break
        read -r name uid job region <<<"${pods[RANDOM % ${#pods[@]}]}"
        [[ -n "${gone_uid[$uid]:-}" ]] && continue
        if kn delete pod "$name" --wait=false >/dev/null 2>&1; then
            gone_uid[$uid]=1
            echo "$(date +%s.%N) $name $uid" >>"$work/deletions"
            deleted[$job/$region]=$((${deleted[$job/$region]:-0} + 1))
            n_deleted=$((n_deleted + 1))
        fi
    done
    sleep "$((1 + RANDOM % 3))"
done
kill -USR1 "$proxy_pid" # behave from now on
t_calm=$(date +%s)
echo "faults: $n_deleted pods deleted in $((t_calm - t_start)) s; the proxy behaves from now on"
((n_deleted >= chaos_s / 5)) && ok "$n_deleted pods deleted (preempted) while faults were injected" ||
    not_ok "only $n_deleted pods deleted in ${chaos_s} s"

# ---- converged once the API server behaves ------------------------------------------------------
counts_of() { # JOB: "r1=P/F r2=P/F" from its status
    kn get sj "$1" -o jsonpath='{range .status.regions[*]}{.name}={.preemptions}/{.failures} {end}' 2>/dev/null | sed 's/ $//'
}
want_counts() {
    local r out=
    for r in ${regions[$1]}; do out+="$r=${deleted[$1/$r]:-0}/0 "; done
    echo "${out% }"
}
counts_right() { local j; for j in fa fb fc; do [[ "$(counts_of $j)" == "$(want_counts $j)" ]] || return 1; done; }
# The phase too: it follows the pods' readiness, which the operator hears of after the pods
# run, so it may turn Running a reconcile after the counts are right.
phases_running() {
    local j
    for j in fa fb fc; do [[ "$(kn get sj "$j" -o jsonpath='{.status.phase}')" == Running ]] || return 1; done
}
converged() { all_pods_up && counts_right && phases_running; }
if poll_until "$converge_s" converged; then
    ok "converged $(($(date +%s) - t_calm)) s after the proxy began to behave (limit $converge_s s)"
else
    not_ok "not converged within $converge_s s of the proxy behaving"
    echo "--- pods"
    kn get pods -o wide --no-headers 2>&1 | head -30
    echo "--- statuses"
    kn get sj -o jsonpath='{range .items[*]}{.metadata.name}: {.status}{"\n"}{end}' 2>&1 | cut -c1-400
fi
for j in fa fb fc; do
    expect_eq "$j: pods running" "${want_pods[$j]}" \
        "$(kn get pods -l "cirrus.dev/job=$j" --field-selector status.phase=Running -o name | wc -l)"
    expect_eq "$j: status preemptions/failures = the pods deleted" "$(want_counts $j)" "$(counts_of $j)"
    expect_eq "$j: phase" Running "$(kn get sj "$j" -o jsonpath='{.status.phase}')"
done
sleep 2 # one more sample after convergence
kill "$sampler_pid" 2>/dev/null
wait "$sampler_pid" 2>/dev/null
sampler_pid=
n_samples=$(wc -l <"$work/samples")
bad=$(grep -v ' ok$' "$work/samples" | head -5)
if [[ -z "$bad" ]] && ((n_samples >= (chaos_s / 2))); then
    ok "no duplicate or stray pod in $n_samples samples"
else
    not_ok "duplicates/strays in $n_samples samples: ${bad:-too few samples}"
fi

# ---- the operator: alive, no crash, leading --------------------------------------------------------
check "operator still running" kill -0 "$op_pid"
check_not "no crash in its log" grep -Eq "SIGSEGV|SIGABRT|SIGBUS|crashed|AddressSanitizer|Assertion" "$work/op/operator.log"
expect_eq "Lease holder" "$identity" \
    "$(kubectl -n cirrus-system get lease cirrus-operator -o jsonpath='{.spec.holderIdentity}')"
lost=$(grep -c "stopped leading" "$work/op/operator.log")
won=$(grep -c "acquired the lease" "$work/op/operator.log")
expect_eq "won the lease back after every loss (acquired = 1 + lost)" "$((lost + 1))" "$won"
check_not "no other holder ever seen" grep -q 'the lease is held by "' "$work/op/operator.log"
# The elector runs beside the loop on its own client: a loop held up by an answer (up to the
# 30 s timeout) must not cost the lease. A loss must follow a failure of the lease's own
# requests since it was last acquired (the elector logs the first of each failing streak).
unexplained=$(awk '/acquired the lease/ { failed = 0 }
    /kube: lease .*: (get|update|create|renewal) failed/ { failed = 1 }
    /stopped leading/ && !failed { n++ } END { print n + 0 }' "$work/op/operator.log")
expect_eq "every lease loss follows a failure of the lease's own requests" 0 "$unexplained"
port=$(sed -n 's/.*metrics on :\([0-9]*\).*/\1/p' "$work/op/operator.log" | tail -1)
check "/metrics: leader_election_master_status 1" \
    grep -q '^leader_election_master_status{name="cirrus-operator"} 1$' <<<"$(curl -fsS "http://127.0.0.1:$port/metrics")"
echo "faults: the lease was lost $lost times (its own requests failing past the renew deadline), won back keeping the counts $(grep -c "nobody led meanwhile" "$work/op/operator.log") times"

# ---- the faults the proxy injected ------------------------------------------------------------------
report=$(cat "$work/faults.json")
echo "faults: injected $(jq -c '.faults' <<<"$report") over $(jq .requests <<<"$report") requests ($(jq .watches <<<"$report") watches), seed $seed"
for kind in too_many_requests server_error conflict delayed truncated watch_cut watch_gone; do
    n=$(jq ".faults.$kind" <<<"$report")
    ((n >= 1)) && ok "injected $kind: $n" || not_ok "no $kind injected"
done

test_operator_stop
rc=$?
expect_eq "operator exits 0 on SIGTERM" 0 "$rc"
finish
