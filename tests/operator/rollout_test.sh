#!/usr/bin/env bash
# A spec change rolls a job's stage peers a stage at a time, against the real control plane
# (run by run.sh with KUBECONFIG set and kubectl on PATH; the nodes are kwok's). A one-region
# job of 2 stages x 3 peers runs; its image changes; then:
#   * every pod is replaced with the new image and the job has all 6 peers Ready again;
#   * while it rolls, no stage ever has more than one of its 3 peers missing, starting or
#     terminating, after any change a watch of the pods saw (and one did: the roll was
#     watched, not missed);
#   * each peer's deletion is a RollingUpdate Event: 6 of them; nothing counted as a
#     preemption or a failure.
# Last line: "rollout: N passed, N failed"; exits non-zero if anything failed.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
# shellcheck source=tests/operator/lib.sh
source "$root/tests/operator/lib.sh"
focused_test_begin rollout cirrus-rollout-test
test_operator_start "$work" "$NS" || fail_fast "operator not leading: $(tail -3 "$work/operator.log")"

roll_job() { # IMAGE
    kn apply -f - >/dev/null <<EOF
apiVersion: cirrus.dev/v1alpha1
kind: SwarmJob
metadata: {name: roll}
spec:
  image: $1
  pipeline: {stages: 2}
  regions: [{name: r1, peers: {replicas: 3, min: 1}, clients: 1}]
EOF
}
ready_peers_are() { [[ "$(kn get sj roll -o jsonpath='{.status.readyPeers}')" == "$1" ]]; }
all_images() { # IMAGE: all 8 pods (gateway, 6 peers, client) exist with IMAGE
    local imgs
    imgs=$(kn get pods -l cirrus.dev/job=roll -o jsonpath='{range .items[*]}{.spec.containers[0].image}{"\n"}{end}')
    [[ $(grep -c . <<<"$imgs") == 8 && -z "$(grep -v "^$1\$" <<<"$imgs")" ]]
}
# From a watch of the peer pods (kubectl get -w --output-watch-events -o json: every change,
# in order), after each change past the watch's initial listing of SKIP pods: per stage, how
# many of its 3 peers are not serving (missing, not Ready, terminating). Prints the largest.
most_not_serving() { # WATCH-FILE SKIP
    python3 - "$1" "$2" <<'PY'
import json, sys
text, skip = open(sys.argv[1]).read(), int(sys.argv[2])
dec, at, pods, most, n = json.JSONDecoder(), 0, {}, 0, 0
while True:
    while at < len(text) and text[at].isspace():
        at += 1
    if at >= len(text):
        break
    ev, at = dec.raw_decode(text, at)
    o = ev["object"]
    name = o["metadata"]["name"]
    if ev["type"] == "DELETED":
        pods.pop(name, None)
    else:
        ready = any(c.get("type") == "Ready" and c.get("status") == "True"
                    for c in o.get("status", {}).get("conditions", []))
        pods[name] = (o["metadata"]["labels"]["cirrus.dev/stage"],
                      ready and not o["metadata"].get("deletionTimestamp"))
    n += 1
    if n >= skip:
        for s in ("0", "1"):
            most = max(most, 3 - sum(1 for st, up in pods.values() if st == s and up))
print(most)
PY
}
roll_job cirrus:latest
poll_until 90 ready_peers_are 6/6 || fail_fast "roll: 6 peers never Ready: '$(kn get sj roll -o jsonpath='{.status.readyPeers}')'"
before=$(kn get pods -l cirrus.dev/job=roll -o jsonpath='{range .items[*]}{.metadata.uid}{"\n"}{end}' | sort)

kn get pods -l cirrus.dev/job=roll,cirrus.dev/role=peer -w --output-watch-events -o json \
    >"$work/watch" 2>/dev/null &
watcher=$!
listed() { [[ $(grep -o '"type": *"ADDED"' "$work/watch" | wc -l) -ge 6 ]]; }
poll_until 30 listed || fail_fast "the watch of the peer pods listed no 6 pods"
roll_job cirrus:v2
rolled() { all_images cirrus:v2 && ready_peers_are 6/6; }
poll_until 120 rolled
sleep 1 # the last changes reach the watch
kill "$watcher" 2>/dev/null
wait "$watcher" 2>/dev/null
check "every pod runs the new image, all 6 peers Ready again" rolled
after=$(kn get pods -l cirrus.dev/job=roll -o jsonpath='{range .items[*]}{.metadata.uid}{"\n"}{end}' | sort)
expect_eq "pods kept from before the change" 0 "$(comm -12 <(echo "$before") <(echo "$after") | grep -c .)"
expect_eq "the most peers of one stage not serving at once, over every change the watch saw" 1 \
    "$(most_not_serving "$work/watch" 6)"
expect_eq "RollingUpdate Events" 6 "$(kn get events --field-selector reason=RollingUpdate -o name | wc -l)"
expect_eq "preemptions and failures counted" "0 0" \
    "$(kn get sj roll -o jsonpath='{.status.regions[0].preemptions} {.status.regions[0].failures}')"
finish
