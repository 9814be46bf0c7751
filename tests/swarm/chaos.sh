#!/usr/bin/env bash
# Chaos: a region trains while stage peers are killed with SIGKILL every few seconds and
# replacements join through the coordinator (CHAOS_CLIENTS=N: N clients share each step). Every step must complete, the client's
# counters must show every microbatch completed (none lost: each step checks that its
# stages' peers hold exactly its microbatches), and the final validation loss must be
# within 3% of a fault-free run of the same job.
# Usage: tests/swarm/chaos.sh path/to/cirrus-trainer   (CIRRUS_CORPUS names the corpus)
set -u
bin=$(realpath "$1")
# The run below works in its own directory (for a core file): the corpus by absolute path.
[ -n "${CIRRUS_CORPUS:-}" ] && CIRRUS_CORPUS=$(realpath "$CIRRUS_CORPUS") && export CIRRUS_CORPUS
tmp=$(mktemp -d)
extra_pids=()
cleanup() {
    for p in "${extra_pids[@]}"; do kill -9 "$p" 2>/dev/null; done
    [ -n "${run_pid:-}" ] && kill "$run_pid" 2>/dev/null
    wait 2>/dev/null
    if [ -n "${CHAOS_KEEP:-}" ] && [ "$fail" -ne 0 ]; then
        echo "chaos: logs of the failed attempt:"
        tail -n 25 "$tmp/run.err" "$tmp/run.out" 2>/dev/null
    fi
    rm -rf "$tmp"
}
trap cleanup EXIT
pass=0 fail=0
ok() { echo "ok   $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1"; fail=$((fail + 1)); }

steps=2400 micro=4 seed=1337
clients=${CHAOS_CLIENTS:-1} # several: each step's 2 microbatches are shared by the clients
model=(--layers 4 --width 64 --heads 4 --context 32)
job=(local --stages 2 --peers 2 --clients "$clients" "${model[@]}" --batch 8 --microbatch "$micro"
     --steps "$steps" --seed "$seed" --log-every 100 --eval-batches 8)

# The fault-free reference.
"$bin" "${job[@]}" --json >"$tmp/ref.json" 2>"$tmp/ref.err" || { bad reference_run; cat "$tmp/ref.err"; exit 1; }

# The chaos run, in the background; its stdout names the coordinator and the peers. It
# runs in $tmp with core dumps on, so that a crash leaves a backtrace (below).
(cd "$tmp" && ulimit -c unlimited 2>/dev/null; exec "$bin" "${job[@]}" >"$tmp/run.out" 2>"$tmp/run.err") &
run_pid=$!
for _ in $(seq 100); do grep -q 'training' "$tmp/run.out" && break; sleep 0.1; done
coord=$(sed -nE 's/^cirrus: coordinator at ([0-9.]+:[0-9]+);.*/\1/p' "$tmp/run.out")
mapfile -t victims < <(sed -nE 's/^cirrus: stage ([0-9]+) peer [0-9]+ serves layers \[([0-9]+), ([0-9]+)\) at .* \(pid ([0-9]+)\)/\1 \2 \3 \4/p' "$tmp/run.out")
[ -n "$coord" ] && [ "${#victims[@]}" -eq 4 ] || { bad chaos_setup; cat "$tmp/run.out"; exit 1; }

free_port() { python3 "$(dirname "$0")/free_port.py"; }
kills=0 joins=0
# The last step the run has printed (every 100).
last_step() { sed -nE 's/^step +([0-9]+)\/.*/\1/p' "$tmp/run.out" | tail -1; }
# A kill counts only while steps remain: the client notices a dead peer at the latest at the
# next step's averaging, so no peer is killed once the run is in its last 300 steps.
still_training() {
    kill -0 "$run_pid" 2>/dev/null || return 1
    local at
    at=$(last_step)
    [ -z "$at" ] || [ "$at" -lt $((steps - 300)) ]
}
# Kill one peer every 1.5 s, alternating stages, and start its replacement at once (a new
# process on new ports, as a rescheduled pod would be), while training runs.
for round in 1 2 3 4 5 6; do
    sleep 1.5
    still_training || break
    i=$(( (round - 1) % ${#victims[@]} ))
    read -r stage l0 l1 pid <<<"${victims[$i]}"
    kill -9 "$pid" 2>/dev/null && kills=$((kills + 1))
    rport=$(free_port)
    OMP_NUM_THREADS=1 "$bin" stage --serve "$l0:$l1" "${model[@]}" --batch "$micro" \
        --seed "$seed" --job cirrus-local --listen 127.0.0.1:0 --coordinator "$coord" \
        --stage-index "$stage" --ring-addr "127.0.0.1:$rport" 2>>"$tmp/replacements.err" &
    newpid=$!
    disown "$newpid" # killed on purpose later: no job-control noise
    extra_pids+=("$newpid")
    victims[$i]="$stage $l0 $l1 $newpid"
    joins=$((joins + 1))
done
# A peer that hangs instead of dying (SIGSTOP for 3 s, then SIGCONT): requests to it time
# out after the learned deadline, go to the other peer, and the client carries on.
read -r _ _ _ hung <<<"${victims[2]}" # replaced a few seconds ago: warm by now
hangs=0
if still_training && kill -STOP "$hung" 2>/dev/null; then
    sleep 3
    kill -CONT "$hung"
    hangs=1
fi
if wait "$run_pid"; then ok chaos_run_completed_all_steps; else
    rc=$?
    bad chaos_run_completed_all_steps; tail -5 "$tmp/run.err"
    core=$(ls "$tmp"/core* 2>/dev/null | head -1)
    if [ "$rc" -gt 128 ] && [ -n "$core" ] && command -v gdb >/dev/null; then
        echo "chaos: the run died of signal $((rc - 128)); its threads' backtraces:"
        gdb -batch -ex 'thread apply all bt 12' "$bin" "$core" 2>/dev/null | grep -E '^(#|Thread)' | head -80
    fi
fi
run_pid=
grep -q "done: $steps steps" "$tmp/run.out" && ok "all_${steps}_steps_done" || bad "all_${steps}_steps_done"

counters=$(sed -nE 's/.*pipeline counters: (\{.*\})/\1/p' "$tmp/run.err" | tail -1)
# With several clients, the followers' redo notices the leader posted for lost peers.
notices=$(grep -c 'the other clients redo' "$tmp/run.err")
# Steps the leader started again (the peers held more than the step: see below).
restarts=$(grep -c 'the step starts again' "$tmp/run.err")
ref_val=$(tail -1 "$tmp/ref.json")
final_val=$(sed -nE 's/^done: .* val loss ([0-9.]+),.*/\1/p' "$tmp/run.out")
if python3 - "$counters" "$ref_val" "$final_val" "$kills" "$steps" "$micro" "$hangs" "$clients" "$notices" "$restarts" <<'PY'; then ok chaos_counters_and_loss; else bad chaos_counters_and_loss; fi
import json, sys
c = json.loads(sys.argv[1]); ref = json.loads(sys.argv[2])["val_loss"]; val = float(sys.argv[3])
kills, steps, micro, hangs = int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]), int(sys.argv[7])
clients, notices, restarts = int(sys.argv[8]), int(sys.argv[9]), int(sys.argv[10])
print(f"    {clients} client(s); killed {kills} peers, hung {hangs}; counters {c}; "
      f"redo notices {notices}; steps restarted {restarts}; val loss {val:.4f} vs "
      f"fault-free {ref:.4f}")
# The counters are client 0's: its share of every step (the others' shares are proven by
# client 0's check, at every step, that the stages' peers hold all the step's microbatches).
# A step the leader started again ran its share once more: a follower that gave up on the
# hung peer redid a backward elsewhere, the leader kept the peer, which did the backward
# after all when it resumed, so the stage held one too many and the step was redone whole.
share = (8 // micro) // clients
assert clients > 1 or restarts == 0, "a lone client never restarts a step"
assert c["microbatches"] == (steps + restarts) * share, \
    "every microbatch of every step completed once (and once more per restarted step)"
# The hung peer is usually dropped at its stage's deadline (peers_lost = kills + 1), but
# not if the client was busy with it elsewhere (e.g. copying its state to a joining peer),
# so only completion and the accounting are asserted for the hang.
assert kills >= 4 and c["peers_lost"] >= kills and c["peers_joined"] >= kills, c
assert abs(val - ref) / ref < 0.03
PY
echo "chaos: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
