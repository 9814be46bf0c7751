#!/usr/bin/env bash
# checkpoint.every and peers.max do what the CRD says (issue 13, defect 3: both were accepted
# and ignored), against the real control plane (run by run.sh with KUBECONFIG set and kubectl
# on PATH). kwok runs no containers: what is tested is the pods the API server holds, and
# that the trainer's own flag tables take their command lines. The operator runs as its own
# ServiceAccount, watching only this test's namespace:
#   * checkpoint.every 37: the region's client 0 (the one that steps) runs with
#     --ckpt /checkpoints/r1 (inside its checkpoints mount) --ckpt-every 37; client 1 with
#     neither (the trainer refuses --ckpt there); unset, --ckpt-every is 100;
#   * peers {replicas: 2, max: 3}: 2 peer pods per stage, never 3; the gateway runs with
#     --max-stage-peers 3 (its rebalancing bound); max unset: --max-stage-peers = replicas;
#     replicas raised to 3: 3 per stage; raised to 4 over max: refused by the API server;
#   * `cirrus-trainer ROLE ARGS --help` accepts every pod's arguments (build/bin).
# Last line: "specfields: N passed, N failed"; exits non-zero if anything failed.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
trainer=$root/build/bin/cirrus-trainer
# shellcheck source=tests/operator/lib.sh
source "$root/tests/operator/lib.sh"
focused_test_begin specfields cirrus-specfields-test
test_operator_start "$work" "$NS" || fail_fast "operator not leading: $(tail -3 "$work/operator.log")"

kn apply -f - >/dev/null <<EOF
apiVersion: cirrus.dev/v1alpha1
kind: SwarmJob
metadata: {name: ck}
spec:
  image: cirrus:latest
  pipeline: {stages: 2}
  checkpoint: {every: 37}
  regions: [{name: r1, peers: {replicas: 2, min: 1, max: 3}, clients: 2}]
---
apiVersion: cirrus.dev/v1alpha1
kind: SwarmJob
metadata: {name: plain}
spec:
  image: cirrus:latest
  regions: [{name: r1, peers: {replicas: 2, min: 1}, clients: 1}]
EOF
n_pods() { kn get pods -l "cirrus.dev/job=$1" -o name | wc -l; }
has_pods() { [[ $(n_pods "$1") == "$2" ]]; }
# ck: gateway + 2 stages x 2 peers + 2 clients; plain: gateway + 2 peers + 1 client.
poll_until 60 has_pods ck 7 || fail_fast "ck: $(n_pods ck) pods, want 7"
poll_until 60 has_pods plain 4 || fail_fast "plain: $(n_pods plain) pods, want 4"
args() { kn get pod "$1" -o jsonpath='{.spec.containers[0].args[*]}'; }
arg() { # POD FLAG: the value after FLAG in POD's args ("" if absent)
    local a prev=
    for a in $(args "$1"); do
        [[ "$prev" == "$2" ]] && { echo "$a"; return; }
        prev=$a
    done
}

# ---- checkpoint.every -------------------------------------------------------------------------
expect_eq "ck client 0: --ckpt" /checkpoints/r1 "$(arg ck-r1-c0 --ckpt)"
expect_eq "ck client 0: --ckpt-every (checkpoint.every 37)" 37 "$(arg ck-r1-c0 --ckpt-every)"
mount=$(kn get pod ck-r1-c0 -o jsonpath='{.spec.containers[0].volumeMounts[?(@.name=="checkpoints")].mountPath}')
check "ck client 0: --ckpt is inside its checkpoints mount ($mount)" test -n "$mount" -a "${mount%/}/r1" == "$(arg ck-r1-c0 --ckpt)"
expect_eq "ck client 1: no --ckpt, no --ckpt-every" "" "$(arg ck-r1-c1 --ckpt)$(arg ck-r1-c1 --ckpt-every)"
expect_eq "plain client 0: --ckpt-every (default 100)" 100 "$(arg plain-r1-c0 --ckpt-every)"

# ---- peers.max --------------------------------------------------------------------------------
expect_eq "ck: peer pods of stage 0 and 1 (replicas 2, max 3)" "2 2" \
    "$(kn get pods -l cirrus.dev/job=ck,cirrus.dev/role=peer,cirrus.dev/stage=0 -o name | wc -l) $(kn get pods -l cirrus.dev/job=ck,cirrus.dev/role=peer,cirrus.dev/stage=1 -o name | wc -l)"
expect_eq "ck gateway: --max-stage-peers (peers.max 3)" 3 "$(arg ck-r1-gw --max-stage-peers)"
expect_eq "plain gateway: --max-stage-peers (max unset: replicas 2)" 2 "$(arg plain-r1-gw --max-stage-peers)"

# ---- the trainer takes every pod's command line ----------------------------------------------
if [[ -x "$trainer" ]]; then
    for p in $(kn get pods -l 'cirrus.dev/job in (ck,plain)' -o jsonpath='{.items[*].metadata.name}'); do
        role=$(kn get pod "$p" -o jsonpath='{.metadata.labels.cirrus\.dev/role}')
        [[ "$role" == peer ]] && role=stage
        # shellcheck disable=SC2046
        if out=$("$trainer" "$role" $(args "$p") --help 2>&1); then ok "cirrus-trainer $role takes $p's args"; else not_ok "cirrus-trainer $role refuses $p's args: $(tail -1 <<<"$out")"; fi
    done
else
    not_ok "$trainer is missing (make all)"
fi

# ---- replicas within max, and over it ---------------------------------------------------------
kn patch sj ck --type=json -p '[{"op":"replace","path":"/spec/regions/0/peers/replicas","value":3}]' >/dev/null
check "ck: replicas 3 (= max): 3 peer pods per stage" poll_until 30 has_pods ck 9
out=$(kn patch sj ck --type=json -p '[{"op":"replace","path":"/spec/regions/0/peers/replicas","value":4}]' 2>&1)
if [[ $? != 0 && "$out" == *"peers.max must be >= peers.replicas"* ]]; then ok "ck: replicas 4 over max 3 refused ($(grep -o 'peers.max must be >= peers.replicas' <<<"$out"))"; else not_ok "ck: replicas 4 over max 3: $out"; fi
sleep 2
expect_eq "ck: still 9 pods" 9 "$(n_pods ck)"

test_operator_stop
rc=$?
expect_eq "operator exits 0 on SIGTERM" 0 "$rc"
finish
