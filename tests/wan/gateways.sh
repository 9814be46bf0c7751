#!/usr/bin/env bash
# Two regions as the operator runs them, on loopback: per region a `gateway` (coordinator +
# WAN end, TLS with certificates from `cirrus-trainer certs`), one `stage` peer per stage and
# a `client`. Region r1's gateway is SIGKILLed in the middle of training and started again
# on its ports with no state: it takes the job's global state from r0's gateway, its peers
# and client find it again, the client pushes again what the lost gateway held, and both
# regions end with the same global parameters.
# Whether the rejoining gateway is a round behind the other when its client pushes again
# depends on timing (the lost gateway may or may not have sent its message of the round it
# died in): either way it must be back in step within two rounds, not follow a round behind
# to the end.
# With FRAGMENTS=P the gateways cut the parameters into P fragments (--fragments): every
# fragment's lane must rejoin likewise.
# Usage: tests/wan/gateways.sh path/to/cirrus-trainer   (CIRRUS_CORPUS names the corpus)
set -u
bin=$1
frags=${FRAGMENTS:-1}
tmp=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done; wait 2>/dev/null; [ -n "${WAN_KEEP:-}" ] && cp -r "$tmp" "$WAN_KEEP"; rm -rf "$tmp"; }
trap cleanup EXIT
pass=0 fail=0
ok() { echo "ok   $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1"; fail=$((fail + 1)); }
port() { python3 "$(dirname "$0")/../swarm/free_port.py"; }

model=(--layers 2 --width 64 --heads 4 --context 32)
job=jgw
"$bin" certs --job "$job" --region r0 --region r1 --out "$tmp/certs" || bad certs_made
declare -A gport hport wport
for r in r0 r1; do gport[$r]=$(port); hport[$r]=$(port); wport[$r]=$(port); done
regions="r0=127.0.0.1:${wport[r0]},r1=127.0.0.1:${wport[r1]}"
start_gateway() { # region
    "$bin" gateway --job "$job" --listen "127.0.0.1:${gport[$1]}" --http-port "${hport[$1]}" \
        --stages 2 "${model[@]}" --heartbeat-ms 200 --sync-every 5 --region "$1" \
        --regions "$regions" --tls-dir "$tmp/certs/$1" --codec q8 --sync-timeout-s 20 \
        --fragments "$frags" \
        2>>"$tmp/gw-$1.err" &
    gw_pid=$!
    pids+=("$gw_pid")
}
declare -A gw client
for r in r0 r1; do
    start_gateway "$r"; gw[$r]=$gw_pid
    for spec in "0 0:1" "1 1:2"; do
        read -r index layers <<<"$spec"
        OMP_NUM_THREADS=1 "$bin" stage --serve "$layers" "${model[@]}" --batch 4 --job "$job" \
            --listen 127.0.0.1:0 --coordinator "127.0.0.1:${gport[$r]}" --stage-index "$index" \
            2>>"$tmp/peers-$r.err" &
        pids+=($!)
    done
    "$bin" client --job "$job" --coordinator "127.0.0.1:${gport[$r]}" "${model[@]}" --batch 4 \
        --steps 400 --sync-every 5 --region "$r" --log-every 1 --eval-batches 4 --json \
        >"$tmp/client-$r.json" 2>"$tmp/client-$r.err" &
    client[$r]=$!
    pids+=("${client[$r]}")
done

# Kill r1's gateway once it has taken a few outer steps, and start it again at once.
outer_step() { curl -s "http://127.0.0.1:${hport[$1]}/status" | sed -n 's/.*"outer": *{ *"step": *\([0-9-]*\).*/\1/p' | head -1; }
outer_of() { python3 -c 'import json,sys; print(json.load(sys.stdin).get("outer",{}).get("step",-1))' 2>/dev/null; }
for _ in $(seq 300); do
    s=$(curl -s "http://127.0.0.1:${hport[r1]}/status" | outer_of)
    [ "${s:--1}" -ge 3 ] && break
    sleep 0.1
done
kill -KILL "${gw[r1]}"
echo "    r1's gateway killed at outer step ${s:-?}"
start_gateway r1
killed_ok=1
# Bounded: a region that never catches up fails the test instead of hanging it.
for _ in $(seq 1500); do
    kill -0 "${client[r0]}" 2>/dev/null || kill -0 "${client[r1]}" 2>/dev/null || break
    sleep 0.1
done
kill "${client[r0]}" "${client[r1]}" 2>/dev/null
for r in r0 r1; do wait "${client[$r]}" || killed_ok=0; done
f0=$(grep '"final":true' "$tmp/client-r0.json") f1=$(grep '"final":true' "$tmp/client-r1.json")
d0=$(sed -n 's/.*"digest":"\([0-9a-f]*\)".*/\1/p' <<<"$f0")
d1=$(sed -n 's/.*"digest":"\([0-9a-f]*\)".*/\1/p' <<<"$f1")
if [ "$killed_ok" = 1 ] && [ -n "$d0" ] && [ "$d0" = "$d1" ] &&
    [ "$(grep -c 'took the global state of outer step' "$tmp/gw-r1.err")" -ge "$frags" ]; then
    ok gateway_killed_mid_training_rejoins_from_a_live_gateway
else
    bad gateway_killed_mid_training_rejoins_from_a_live_gateway
    echo "r0: $f0"; echo "r1: $f1"; tail -5 "$tmp/gw-r1.err"; tail -5 "$tmp/client-r1.err"
fi
# In step again: the live region went on without the restarted one for at most two rounds
# (the one it died in and the one it caught up in), not every round to the end: in every
# fragment's lane.
without=$(grep -c 'going on without region' "$tmp/gw-r0.err")
if [ "$without" -le $((2 * frags)) ]; then
    ok restarted_gateway_back_in_step_within_two_rounds
else
    bad restarted_gateway_back_in_step_within_two_rounds
    echo "    r0 went on without r1 in $without rounds"; grep 'going on without' "$tmp/gw-r0.err" | tail -3
fi
echo "gateways ($frags fragment(s)): $pass passed, $fail failed"
[ "$fail" -eq 0 ]
