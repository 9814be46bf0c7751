#!/usr/bin/env bash
# A stage that loses its only peer loses its state: the region's client waits for a
# replacement and restores the model instead of failing.
#   1. one region with checkpoints: the stage's only peer is SIGKILLed, a replacement starts
#      2 s later; the client rolls back to the newest checkpoint and finishes every step,
#      at the validation loss of a fault-free run (within 0.5%: the steps after the
#      checkpoint run again on the same data).
#   2. two regions: region r1's stage 1 loses its only peer; r1 takes the global parameters
#      of the latest outer step, training goes on at the same inner step, and both regions
#      end with the same global-parameter digest.
#   3. no replacement within --wait-peers-s: the run fails, naming the stage and the wait.
#   4. no checkpoints and one region: the run fails, saying the state cannot be restored.
#   5. checkpoints asked for but none written yet: training starts again from the seed.
# Usage: tests/swarm/restore.sh path/to/cirrus-trainer   (CIRRUS_CORPUS names the corpus)
set -u
bin=$(realpath "$1")
[ -n "${CIRRUS_CORPUS:-}" ] && CIRRUS_CORPUS=$(realpath "$CIRRUS_CORPUS") && export CIRRUS_CORPUS
tmp=$(mktemp -d)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
    wait 2>/dev/null
    rm -rf "$tmp"
}
trap cleanup EXIT
pass=0 fail=0
ok() { echo "ok   $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1"; fail=$((fail + 1)); }

seed=7
model=(--layers 4 --width 64 --heads 4 --context 32)
common=(--stages 2 --peers 1 "${model[@]}" --batch 8 --seed "$seed" --eval-batches 8)

# start NAME ARGS...: `local` in the background, stdout/stderr in $tmp/NAME.{out,err}.
start() {
    local name=$1
    shift
    ("$bin" local "$@" >"$tmp/$name.out" 2>"$tmp/$name.err"; echo "rc=$?" >>"$tmp/$name.out") &
    pids+=($!)
}
# at_step NAME STEP [REGION]: wait until NAME's progress lines reach STEP (60 s at most).
at_step() {
    local name=$1 want=$2 region=${3:-}
    for _ in $(seq 600); do
        local at
        at=$(grep -E "^step .*${region:+region $region}" "$tmp/$name.out" |
            sed -nE 's/^step +([0-9]+)\/.*/\1/p' | tail -1)
        [ -n "$at" ] && [ "$at" -ge "$want" ] && return 0
        grep -q '^rc=' "$tmp/$name.out" && return 1
        sleep 0.1
    done
    return 1
}
finished() { # finished NAME: wait for the run's end (120 s at most); its exit code
    local name=$1
    for _ in $(seq 1200); do
        grep -q '^rc=' "$tmp/$name.out" 2>/dev/null && break
        sleep 0.1
    done
    sed -nE 's/^rc=([0-9]+)$/\1/p' "$tmp/$name.out"
}
# kill_peer NAME STAGE [REGION]: SIGKILL that stage's only peer; prints its coordinator.
kill_peer() {
    local name=$1 stage=$2 prefix=${3:+region $3: }
    local pid coord
    pid=$(sed -nE "s/^cirrus: ${prefix}stage $stage peer 0 .*\(pid ([0-9]+)\)/\1/p" "$tmp/$name.out")
    coord=$(sed -nE "s/^cirrus: ${prefix}coordinator at ([0-9.]+:[0-9]+);.*/\1/p" "$tmp/$name.out")
    [ -n "$pid" ] && kill -9 "$pid" && echo "$coord"
}
# replace COORD L0:L1 STAGE: a new peer process on new ports, as a rescheduled pod.
replace() {
    local rport
    rport=$(python3 "$(dirname "$0")/free_port.py")
    OMP_NUM_THREADS=1 "$bin" stage --serve "$2" "${model[@]}" --batch 8 --seed "$seed" \
        --job cirrus-local --listen 127.0.0.1:0 --coordinator "$1" --stage-index "$3" \
        --ring-addr "127.0.0.1:$rport" 2>>"$tmp/replacement.err" &
    pids+=($!)
}

# 1. Checkpoint rollback.
steps=600
"$bin" local "${common[@]}" --steps "$steps" --json >"$tmp/ref.json" 2>"$tmp/ref.err" ||
    { bad reference_run; tail -3 "$tmp/ref.err"; exit 1; }
start ckpt "${common[@]}" --steps "$steps" --log-every 10 --ckpt "$tmp/ck" --ckpt-every 100 \
    --wait-peers-s 60
if at_step ckpt 250 && coord=$(kill_peer ckpt 1); then
    killed_at=$(sed -nE 's/^step +([0-9]+)\/.*/\1/p' "$tmp/ckpt.out" | tail -1)
    sleep 2
    replace "$coord" 2:4 1
    rc=$(finished ckpt)
    back=$(sed -nE 's/.*rolled back from step ([0-9]+) .*/\1/p' "$tmp/ckpt.err" | tail -1)
    val=$(sed -nE 's/^done: .* val loss ([0-9.]+),.*/\1/p' "$tmp/ckpt.out")
    ref=$(tail -1 "$tmp/ref.json")
    echo "    killed stage 1's only peer after step $killed_at; rolled back to step ${back:-none}; val loss ${val:-none}"
    if [ "$rc" = 0 ] && grep -q "done: $steps steps" "$tmp/ckpt.out" &&
        grep -q 'stage 1 has no peer left.*waiting up to 60 s' "$tmp/ckpt.err" &&
        [ -n "$back" ] && [ $((back % 100)) -eq 0 ] && [ "$back" -ge 200 ] && [ "$back" -le "$killed_at" ] &&
        python3 -c 'import json,sys; r=json.loads(sys.argv[1])["val_loss"]; v=float(sys.argv[2]); print(f"    fault-free val loss {r:.4f}"); sys.exit(abs(v-r)/r >= 0.005)' "$ref" "$val"; then
        ok rollback_to_checkpoint_after_a_stage_lost_its_only_peer
    else
        bad rollback_to_checkpoint_after_a_stage_lost_its_only_peer
        tail -5 "$tmp/ckpt.err"
    fi
else
    bad rollback_to_checkpoint_after_a_stage_lost_its_only_peer
fi

# 2. Two regions: the region takes the global parameters.
steps=800
start regions --regions 2 --sync-every 20 "${common[@]}" --steps "$steps" --log-every 10 \
    --wait-peers-s 60
if at_step regions 200 r1 && coord=$(kill_peer regions 1 r1); then
    sleep 2
    replace "$coord" 2:4 1
    rc=$(finished regions)
    restored=$(grep -c '\[local r1\].*the region is restored at inner step' "$tmp/regions.err")
    digests=$(grep -E "^step +$steps/" "$tmp/regions.out" | sed -nE 's/.*digest ([0-9a-f]+).*/\1/p' | sort -u | wc -l)
    finals=$(grep -c "^done: $steps steps" "$tmp/regions.out")
    echo "    region r1 restored $restored time(s); final digests distinct: $digests; regions done: $finals"
    if [ "$rc" = 0 ] && [ "$restored" -eq 1 ] && [ "$digests" -eq 1 ] && [ "$finals" -ge 1 ] &&
        grep -q 'fresh moments at step' "$tmp/replacement.err"; then
        ok region_restores_a_lost_stage_from_the_global_parameters
    else
        bad region_restores_a_lost_stage_from_the_global_parameters
        grep -E 'r1\]' "$tmp/regions.err" | grep -vE 'outer round|registered|expired' | tail -8
    fi
else
    bad region_restores_a_lost_stage_from_the_global_parameters
fi

# fails_with NAME TEST REPLACE MESSAGE: NAME (started) past step 50 loses stage 1's only
# peer (a replacement started when REPLACE is 1); the run must exit 1 saying MESSAGE.
fails_with() {
    local name=$1 test=$2 coord rc
    if at_step "$name" 50 && coord=$(kill_peer "$name" 1); then
        [ "$3" = 1 ] && replace "$coord" 2:4 1
        rc=$(finished "$name")
        if [ "$rc" = 1 ] && grep -qF "$4" "$tmp/$name.err"; then
            ok "$test"
        else
            bad "$test"
            echo "    exit ${rc:-none}"; tail -3 "$tmp/$name.err"
        fi
    else
        bad "$test"
    fi
}

# 3. No replacement: the wait ends the run.
start nowait "${common[@]}" --steps 100000 --log-every 10 --ckpt "$tmp/ck3" --wait-peers-s 2
fails_with nowait no_replacement_fails_after_the_wait 0 'stage 1 has had no peer for 2 s (--wait-peers-s)'

# 4. No checkpoint, one region: nothing to restore the stage from.
start nockpt "${common[@]}" --steps 100000 --log-every 10 --wait-peers-s 60
fails_with nockpt without_checkpoints_the_lost_stage_fails_the_run 1 'cannot be restored without checkpoints (--ckpt)'

# 5. Checkpoints asked for, none written yet: training starts again from the seed, and (the
#    same steps on the same data) ends at the fault-free run's validation loss.
steps=300
"$bin" local "${common[@]}" --steps "$steps" --json >"$tmp/ref5.json" 2>"$tmp/ref5.err" ||
    bad reference_run_5
start seed "${common[@]}" --steps "$steps" --log-every 10 --ckpt "$tmp/ck5" --ckpt-every 1000 \
    --wait-peers-s 60
if at_step seed 60 && coord=$(kill_peer seed 1); then
    replace "$coord" 2:4 1
    rc=$(finished seed)
    val=$(sed -nE 's/^done: .* val loss ([0-9.]+),.*/\1/p' "$tmp/seed.out")
    if [ "$rc" = 0 ] && grep -q "done: $steps steps" "$tmp/seed.out" &&
        grep -q 'no checkpoint written yet: training starts again from the seed' "$tmp/seed.err" &&
        python3 -c 'import json,sys; r=json.loads(sys.argv[1])["val_loss"]; v=float(sys.argv[2]); print(f"    started again from the seed: val loss {v:.4f}, fault-free {r:.4f}"); sys.exit(abs(v-r)/r >= 0.005)' "$(tail -1 "$tmp/ref5.json")" "$val"; then
        ok no_checkpoint_yet_starts_again_from_the_seed
    else
        bad no_checkpoint_yet_starts_again_from_the_seed
        echo "    exit ${rc:-none}"; tail -3 "$tmp/seed.err"
    fi
else
    bad no_checkpoint_yet_starts_again_from_the_seed
fi

echo "restore: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
