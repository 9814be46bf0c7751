#!/usr/bin/env bash
# Live rebalancing: a region starts unbalanced, 3 peers on stage 0 and 1 on stage 1, two
# stages of equal depth. Every peer is slowed 8x on its own CPU time (--peer-slowdown: the
# sleep, not the 2 shared cores, bounds each peer's capacity), so stage 1 is the bottleneck
# and stage 0 idles two thirds of the time. The coordinator rebalances every 9 s, the first
# period counted from the first step (a loaded machine runs 5 or so steps in it). Asserted:
#  - the assignment converges to 2,2 with exactly one move (0 -> 1), and nothing moves in
#    the periods after it (no peer twice, no move back);
#  - the moved peer left between steps (no backward re-run) and joined stage 1; every
#    microbatch of every step completed once (the client's counters);
#  - the median per-step tokens/s after the join is >= 1.5x the median before the move
#    (ideal: 2x);
#  - the loss trajectory stays sane: finite, the final loss below the first step's.
# The run is stopped (SIGTERM: it ends after the step in progress, evaluated) once the
# coordinator has watched 2.5 periods after the move, so it lasts as long on any machine
# (a fast one ran its fixed 50 steps before 2 periods had passed): under a minute. When the
# machine is so loaded that only the throughput comparison fails (too low a ratio, or too
# few steps before the move to compare), the run is repeated once; any other failure fails
# at once.
# Usage: tests/swarm/rebalance.sh path/to/cirrus-trainer   (CIRRUS_CORPUS names the corpus)
set -u
bin=$1
here=$(dirname "$0")
tmp=$(mktemp -d)
run_pid=
cleanup() { [ -n "$run_pid" ] && kill "$run_pid" 2>/dev/null; wait 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT

steps=1000 period=9 # steps: a bound; the run is stopped in time
job=(local --stages 2 --stage-peers 3,1 --peer-slowdown 8 --rebalance-period-s "$period"
     --layers 4 --width 128 --heads 4 --context 64 --batch 32 --microbatch 2 --inflight 8 --act-slots 8
     --steps "$steps" --log-every 1 --eval-batches 1 --json)

attempt() { # N: 0 pass, 1 fail, 2 fail on the throughput ratio alone
    local n=$1 port
    port=$(python3 "$here/free_port.py")
    "$bin" "${job[@]}" --status-port "$port" >"$tmp/run$n.json" 2>"$tmp/run$n.err" &
    run_pid=$!
    # /status every 0.25 s while it trains: what the coordinator saw, for the checks below.
    # The run is asked to stop 2.5 periods after the first move, or after 150 s without one.
    python3 - "$port" "$run_pid" >"$tmp/status$n.jsonl" <<'PY'
import json, os, signal, sys, time, urllib.request
port, pid = sys.argv[1], int(sys.argv[2])
stopped = False
while True:
    try:
        os.kill(pid, 0)
    except OSError:
        break
    try:
        st = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=2))
        print(json.dumps(st), flush=True)
        rb, up = st.get("rebalance", {}), st.get("uptime_s", 0)
        moved = rb.get("recent") and up - rb["recent"][0]["at_s"] >= 2.5 * rb["period_s"]
        if not stopped and (moved or up > 150):
            os.kill(pid, signal.SIGTERM)
            stopped = True
    except (OSError, KeyError, ValueError):
        pass
    time.sleep(0.25)
PY
    wait "$run_pid"
    local rc=$?
    run_pid=
    if [ "$rc" -ne 0 ]; then
        echo "FAIL rebalance run $n exited $rc"; tail -5 "$tmp/run$n.err"; return 1
    fi
    python3 - "$tmp/run$n.json" "$tmp/run$n.err" "$tmp/status$n.jsonl" "$steps" <<'PY'
import json, math, re, statistics, sys
out, err_path, status_path, steps = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
lines = [json.loads(l) for l in open(out)]
err = open(err_path).read()
statuses = [json.loads(l) for l in open(status_path)]
per_step = [l for l in lines if "final" not in l]
final = lines[-1]
fails = []
def check(ok, what):
    if not ok:
        fails.append(what)
ran = final.get("step", 0) if final.get("final") else -1
check(len(per_step) == ran and 0 < ran < steps, f"{len(per_step)} step lines, final step {ran}")

# Convergence, from the coordinator: one move 0 -> 1, 2 peers per stage at the end, and no
# move in the periods after it.
# The last /status while the client trained (at the end it leaves first, then the peers).
training = [st for st in statuses if st["clients"] == 1]
assert training, "no /status answered while training"
last = training[-1]
rb = last["rebalance"]
moves = rb["recent"]
peers = [s["peers"] for s in last["stages"]]
check(rb["moves"] == 1 and len(moves) == 1, f"{rb['moves']} moves: {moves}")
check(all(m["from"] == 0 and m["to"] == 1 for m in moves), f"moves {moves}")
seen = {(m["peer"], m["period"]) for m in moves}
check(len(seen) == len(moves), "a peer moved twice in a period")
check(not any((b["from"], b["to"]) == (a["to"], a["from"]) for a in moves for b in moves),
      "a move back")
check(peers == [2, 2], f"peers per stage at the end: {peers}")
periods_after = (last["uptime_s"] - moves[0]["at_s"]) / rb["period_s"] if moves else 0
check(periods_after >= 2, f"only {periods_after:.1f} periods watched after the move")
check(len(re.findall(r"rebalance: peer \d+ .* moves from stage 0 to stage 1", err)) == 1,
      "not exactly one rebalance log line")

# The client: dropped the mover from stage 0 and admitted it at stage 1 between steps;
# every microbatch once; nothing re-run (it left between steps).
counters = json.loads(re.search(r"pipeline counters: (\{.*\})", err).group(1))
check(counters["microbatches"] == ran * 16, f"counters {counters}")
check(counters["peers_joined"] == 1 and counters["peers_lost"] == 1, f"counters {counters}")
check(counters["redone"] == 0, f"backwards re-run: {counters}")
joined = re.search(r"1 peer\(s\) joined before step (\d+)", err)
check(joined is not None, "no join logged")

# Throughput: median per-step tokens/s before the move (steps 2 .. J-2; step J-1 found the
# mover gone) and after the join (steps J+1 ..).
J = int(joined.group(1)) if joined else ran
tps = {l["step"]: l["tokens_per_s"] for l in per_step}
before = [tps[s] for s in range(2, J - 1) if s in tps]
after = [tps[s] for s in range(J + 1, ran + 1) if s in tps]
ratio = 0.0
if len(before) >= 3 and len(after) >= 8:
    ratio = statistics.median(after) / statistics.median(before)
    print(f"    rebalance: move decided at {moves[0]['at_s']:.1f} s (estimated minimum "
          f"{moves[0]['min_before']:.0f} -> {moves[0]['min_after']:.0f} forward units/s), "
          f"joined before step {J}; tokens/s median before {statistics.median(before):.0f} "
          f"({len(before)} steps), after {statistics.median(after):.0f} ({len(after)} steps): "
          f"{ratio:.2f}x")
else:
    # A loaded machine runs so few steps in the first rebalancing period that there is no
    # window to compare: like a low ratio, a matter of load (retried once), not of logic.
    ratio = -1.0
    print(f"    windows too short: {len(before)} steps before, {len(after)} after")

# The loss trajectory.
losses = [l["loss"] for l in per_step]
check(all(math.isfinite(x) for x in losses) and math.isfinite(final.get("val_loss", math.nan)),
      "a loss is not finite")
check(losses[-1] < losses[0], f"final loss {losses[-1]:.3f} not below the first {losses[0]:.3f}")

if fails:
    print("    " + "; ".join(fails))
    sys.exit(1)
if ratio < 0:
    sys.exit(2)
if ratio < 1.5:
    print(f"    throughput after rebalancing is {ratio:.2f}x the throughput before, not >= 1.5x; "
          f"tokens/s per step: {[round(tps[s]) for s in sorted(tps)]}")
    sys.exit(2)
PY
}

attempt 1
rc=$?
if [ "$rc" -eq 2 ]; then
    echo "    (machine load: running once more; load average $(cut -d' ' -f1-3 /proc/loadavg))"
    attempt 2
    rc=$?
fi
if [ "$rc" -eq 0 ]; then
    echo "ok   rebalance_3_1_converges_to_2_2_and_throughput_rises"
else
    echo "FAIL rebalance_3_1_converges_to_2_2_and_throughput_rises"
    grep -E "rebalance|move|joined|lost|counters" "$tmp"/run*.err | tail -15
fi
exit "$rc"
