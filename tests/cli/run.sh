#!/usr/bin/env bash
# Command-line tests of cirrus-trainer: exit codes, one-line errors, JSON output, sampling.
# Usage: tests/cli/run.sh path/to/cirrus-trainer   (CIRRUS_CORPUS names the corpus)
set -u
bin=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pass=0 fail=0

# expect NAME CODE PATTERN -- CMD...: exit code CODE and stderr (one line) matching PATTERN.
expect() {
    local name=$1 code=$2 pattern=$3
    shift 4
    "$@" >"$tmp/out" 2>"$tmp/err"
    local rc=$?
    local lines
    lines=$(grep -c . "$tmp/err")
    if [ "$rc" -eq "$code" ] && grep -qE -- "$pattern" "$tmp/err" && { [ "$code" -eq 0 ] || [ "$lines" -eq 1 ]; }; then
        echo "ok   $name"; pass=$((pass + 1))
    else
        echo "FAIL $name: exit $rc (want $code), stderr:"; sed 's/^/    /' "$tmp/err"; fail=$((fail + 1))
    fi
}

check() { # check NAME CONDITION-COMMAND...
    local name=$1
    shift
    if "$@"; then echo "ok   $name"; pass=$((pass + 1)); else echo "FAIL $name"; fail=$((fail + 1)); fi
}

tiny=(--layers 2 --width 32 --heads 2 --context 16 --batch 2 --log-every 1)

expect no_command 2 'no command given' -- "$bin"
expect unknown_command 2 "unknown command 'fly'" -- "$bin" fly
expect unknown_flag 2 "unknown flag '--bogus'" -- "$bin" train --bogus
expect missing_value 2 '--steps needs a value' -- "$bin" train --steps
expect equals_form 2 '--steps must be in \[1, ' -- "$bin" train --steps=0
expect bool_equals_form 2 "--json: 'maybe' is not true or false" -- "$bin" train --json=maybe
expect unknown_flag_equals_form 2 "unknown flag '--bogus'" -- "$bin" train --bogus=1
expect zero_steps 2 '--steps must be in \[1, ' -- "$bin" train --steps 0
expect bad_seed 2 "--seed: 'x1' is not a valid number" -- "$bin" train --seed x1
expect negative_seed 2 '--seed must not be negative' -- "$bin" train --seed -3
expect bad_number 2 "--lr: 'fast' is not a valid number" -- "$bin" train --lr fast
expect heads_not_dividing 2 'heads \(5\) must divide the width \(128\)' -- "$bin" train --heads 5
expect unknown_preset 2 "unknown model preset 'huge'" -- "$bin" train --model huge
expect missing_data 2 "$tmp/nope.txt" -- "$bin" train --data "$tmp/nope.txt"
expect seq_too_long 2 'seq must be in \[1, 16\]' -- "$bin" train "${tiny[@]}" --seq 17
expect resume_needs_ckpt 2 '--resume needs --ckpt' -- "$bin" train --resume
expect sample_needs_ckpt 2 '--ckpt DIR is required' -- "$bin" sample
expect sample_missing_ckpt 2 'not found' -- "$bin" sample --ckpt "$tmp/none"
expect backend_unknown 2 "--backend must be cpu or cuda, got 'gpu'" -- "$bin" train --backend gpu
expect backend_cuda_not_built 2 'built without CUDA' -- "$bin" train "${tiny[@]}" --backend cuda

# A short JSON run: every line an object; steps carry step/loss/lr/tokens_per_s, the last
# val_loss and tokens.
"$bin" train "${tiny[@]}" --steps 3 --json --ckpt "$tmp/ck" >"$tmp/json" 2>"$tmp/err"
check json_run_exit0 test $? -eq 0
check json_lines_valid python3 - "$tmp/json" <<'PY'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
steps, final = lines[:-1], lines[-1]
assert len(steps) == 3, lines
for i, s in enumerate(steps):
    assert s["step"] == i + 1 and {"loss", "lr", "tokens_per_s"} <= s.keys(), s
assert final["final"] and final["step"] == 3 and final["tokens"] == 3 * 2 * 16, final
assert 0 < final["val_loss"] < 6, final
PY

# Sampling continues the prompt.
"$bin" sample --ckpt "$tmp/ck" --prompt "In the beginning" --tokens 20 >"$tmp/sample" 2>"$tmp/err"
check sample_exit0 test $? -eq 0
check sample_starts_with_prompt grep -q '^In the beginning' "$tmp/sample"
check sample_length test "$(head -c 36 "$tmp/sample" | wc -c)" -eq 36

# A resumed run refuses a different model shape, naming the field.
expect resume_other_shape 2 'n_embd' -- "$bin" train --layers 2 --width 64 --heads 2 --context 16 --batch 2 --steps 4 --ckpt "$tmp/ck" --resume

# Corrupt and truncated checkpoints are refused with a clear message.
cp -r "$tmp/ck" "$tmp/bad"
printf '\x55' | dd of="$tmp/bad/cirrus.ckpt" bs=1 seek=200 conv=notrunc status=none
expect sample_corrupt_ckpt 2 'checksum' -- "$bin" sample --ckpt "$tmp/bad"
cp -r "$tmp/ck" "$tmp/short"
truncate -s 150 "$tmp/short/cirrus.ckpt"
expect sample_truncated_ckpt 2 'truncated|short|size' -- "$bin" sample --ckpt "$tmp/short"

# The benchmark prints its ratio.
"$bin" bench --layers 1 --width 32 --heads 2 --context 16 --batch 2 --steps 1 --json >"$tmp/bench" 2>"$tmp/err"
check bench_json python3 -c "import json,sys; d=json.load(open('$tmp/bench')); assert d['tokens_per_s'] > 0 and d['sgemm_gflops'] > 0 and 'ratio' in d"

# Training is bit-identical for any thread count: every step's loss and the checkpoint's
# bytes with 1, 2 and 3 threads (more threads than this machine's cores change nothing).
# Then the same under every OpenBLAS kernel this CPU can execute, each against itself: the
# kernels round differently from one another, but none may depend on the thread count.
det=(--layers 3 --width 64 --heads 4 --context 32 --batch 4 --steps 25 --log-every 1 --eval-batches 4 --json)
losses() { sed 's/,"tokens_per_s"[^}]*//; s/,"seconds"[^}]*//' "$1"; }
# same_for_threads NAME [ENV...]: 1, 2 and 3 threads give the same losses and checkpoint.
same_for_threads() {
    local name=$1 t ok=1
    shift
    for t in 1 2 3; do
        env "$@" OMP_NUM_THREADS=$t "$bin" train "${det[@]}" --ckpt "$tmp/det$t" \
            >"$tmp/det$t.json" 2>"$tmp/det$t.err" || { ok=0; tail -2 "$tmp/det$t.err"; }
    done
    for t in 2 3; do
        if ! cmp -s <(losses "$tmp/det1.json") <(losses "$tmp/det$t.json") ||
            ! cmp -s "$tmp/det1/cirrus.ckpt" "$tmp/det$t/cirrus.ckpt"; then
            ok=0; echo "    $name: $t threads differ from 1:"
            diff <(losses "$tmp/det1.json") <(losses "$tmp/det$t.json") | head -4 | sed 's/^/    /'
        fi
    done
    [ "$(grep -c '"step"' "$tmp/det1.json")" -eq 26 ] || ok=0
    rm -rf "$tmp"/det*
    check "$name" test "$ok" = 1
}
same_for_threads train_bit_identical_for_1_2_3_threads
flags=" $(grep -m1 '^flags' /proc/cpuinfo) "
has() { local f; for f in "$@"; do [[ $flags == *" $f "* ]] || return 1; done; }
kernels=(Prescott)
has avx && kernels+=(Sandybridge)
has avx2 fma && kernels+=(Haswell Zen)
has avx512f avx512bw avx512vl avx512dq && kernels+=(SkylakeX)
echo "cli: OpenBLAS kernels this CPU executes: ${kernels[*]}"
for k in "${kernels[@]}"; do
    # The kernel asked for must be the one that runs, or the check proves nothing.
    got=$(OPENBLAS_CORETYPE=$k "$bin" bench --layers 1 --width 32 --heads 2 --context 16 --batch 2 \
        --steps 1 --json 2>/dev/null | python3 -c "import json,sys; print(json.load(sys.stdin)['blas_kernel'])")
    check "openblas_kernel_${k}_selected" test "$got" = "$k"
    same_for_threads "train_bit_identical_for_1_2_3_threads_kernel_$k" OPENBLAS_CORETYPE="$k"
done

# SIGTERM (a preempted pod's notice) ends training after the step in progress: exit 0, the
# final line, a checkpoint at that step, from which --resume carries on.
"$bin" train "${tiny[@]}" --steps 1000000 --warmup 10 --json --ckpt "$tmp/term" \
    >"$tmp/term.out" 2>"$tmp/term.err" &
term_pid=$!
for _ in $(seq 600); do grep -q '"step"' "$tmp/term.out" && break; sleep 0.1; done
kill -TERM "$term_pid"
wait "$term_pid"
term_rc=$?
term_step=$(python3 -c "import json,sys; d=json.loads(open(sys.argv[1]).read().splitlines()[-1]); assert d['final']; print(d['step'])" "$tmp/term.out" 2>/dev/null)
check train_sigterm_exits_0 test "$term_rc" -eq 0
check train_sigterm_final_line_before_the_last_step test "${term_step:-0}" -gt 0 -a "${term_step:-0}" -lt 1000000
"$bin" train "${tiny[@]}" --steps $((${term_step:-0} + 2)) --warmup 10 --json --ckpt "$tmp/term" --resume \
    >"$tmp/term2.out" 2>"$tmp/term2.err"
check train_sigterm_checkpoint_resumes grep -q "resuming from step ${term_step:-x} (" "$tmp/term2.err"

# --summary-file: a client that finished writes how it ended as one line of JSON (the
# operator reads it as the Pod's termination message); a file it cannot write is a warning
# on stderr, never a failed run.
"$bin" stage --serve 0:2 --layers 2 --width 32 --heads 2 --context 16 --batch 2 \
    --listen 127.0.0.1:0 2>"$tmp/sum_stage.log" &
sum_peer=$!
for _ in $(seq 100); do grep -q 'listening on' "$tmp/sum_stage.log" && break; sleep 0.1; done
sum_port=$(sed -nE 's/.*listening on 127.0.0.1:([0-9]+).*/\1/p' "$tmp/sum_stage.log" | head -1)
sum_client=("$bin" client --stages "127.0.0.1:${sum_port:-1}" "${tiny[@]}" --steps 3)
"${sum_client[@]}" --summary-file "$tmp/summary" >"$tmp/sum.out" 2>"$tmp/sum.err"
check client_summary_exit0 test $? -eq 0
check client_summary_one_json_line python3 - "$tmp/summary" <<'PY'
import json, sys
text = open(sys.argv[1]).read()
assert text.endswith("\n") and text.count("\n") == 1 and len(text) < 4096, repr(text)
d = json.loads(text)
assert sorted(d) == ["loss", "step", "tokens", "val_loss"], d
assert d["step"] == 3 and d["tokens"] == 3 * 2 * 16, d
assert isinstance(d["step"], int) and isinstance(d["tokens"], int), d
assert 0 < d["loss"] < 10 and 0 < d["val_loss"] < 10, d
PY
check client_summary_matches_done_line grep -qE "^done: 3 steps, train loss $(python3 -c "import json,sys; print('%.4f' % json.load(open(sys.argv[1]))['loss'])" "$tmp/summary")," "$tmp/sum.out"
expect client_summary_unwritable_dir_warns 0 "warn: --summary-file $tmp/none/summary: No such file or directory" -- \
    "${sum_client[@]}" --summary-file "$tmp/none/summary"
expect client_summary_full_disk_warns 0 'warn: --summary-file /dev/full: No space left on device' -- \
    "${sum_client[@]}" --summary-file /dev/full
kill "$sum_peer" 2>/dev/null
wait "$sum_peer" 2>/dev/null

# A stage peer's name at the coordinator must be a valid member name.
expect stage_bad_name 2 '--name must be' -- "$bin" stage --serve 0:1 --name 'bad name!'

# A region resumes from its checkpoint (a pod restarted, a job unsuspended): `local` (its
# client) killed after step 7 of 12 with checkpoints every 5 continues from step 5 with the
# same --ckpt and ends at 12 with the losses of an uninterrupted run, bit for bit: the
# peers get the checkpoint's parameters and AdamW moments, the loader its position, the
# schedule its step, and the stages' float operations are deterministic (one peer each).
res=(--stages 2 --layers 2 --width 32 --heads 2 --context 16 --batch 4 --log-every 1 --warmup 3
     --eval-batches 2 --json --steps 12)
last_losses() { python3 -c "import json,sys; d=json.loads(open(sys.argv[1]).read().splitlines()[-1]); assert d['final'], d; print(d['step'], repr(d['loss']), repr(d['val_loss']))" "$1"; }
"$bin" local "${res[@]}" >"$tmp/res_full.out" 2>"$tmp/res_full.err"
check local_uninterrupted_run test $? -eq 0
"$bin" local "${res[@]}" --ckpt "$tmp/rk" --ckpt-every 5 --stop-after 7 >"$tmp/res_a.out" 2>"$tmp/res_a.err"
check local_stopped_at_7 test "$(last_losses "$tmp/res_a.out" | cut -d' ' -f1)" = 7
"$bin" local "${res[@]}" --ckpt "$tmp/rk" --ckpt-every 5 >"$tmp/res_b.out" 2>"$tmp/res_b.err"
check local_resumed_exit0 test $? -eq 0
check local_resumes_from_step_5 grep -q "resuming from step 5 ($tmp/rk/cirrus.ckpt)" "$tmp/res_b.err"
check local_resumed_first_step_is_6 python3 -c "import json,sys; d=json.loads(open(sys.argv[1]).readline()); assert d['step'] == 6, d" "$tmp/res_b.out"
check local_resumed_ends_as_uninterrupted test "$(last_losses "$tmp/res_b.out")" = "$(last_losses "$tmp/res_full.out")"
# Steps 6..12 of the resumed run are the uninterrupted run's, loss for loss.
steps_6_12() { python3 -c "import json,sys; print([ (d['step'], d['loss']) for d in map(json.loads, open(sys.argv[1])) if not d.get('final') and d['step'] >= 6])" "$1"; }
check local_resumed_losses_equal test "$(steps_6_12 "$tmp/res_b.out")" = "$(steps_6_12 "$tmp/res_full.out")"
# A finished run's checkpoint resumes at its end: nothing left to train.
"$bin" local "${res[@]}" --ckpt "$tmp/rk" >"$tmp/res_c.out" 2>"$tmp/res_c.err"
check local_finished_resumes_at_12 grep -q "resuming from step 12 (" "$tmp/res_c.err"

# With outer steps (--sync-every 4), the gateway's global state (theta_global, momentum, the
# codec's residual) is not in the checkpoint: a resumed region's gateway starts empty,
# adopts the region's resumed parameters, and, its client being at outer step 2 with no
# region holding a later state, makes them outer step 1's; the run goes on to outer step 3
# and step 12. Not bit-identical to an uninterrupted run (momentum restarts at 0), so only
# the way through is asserted here.
"$bin" local "${res[@]}" --sync-every 4 --ckpt "$tmp/ro" --ckpt-every 5 --stop-after 7 >/dev/null 2>&1
"$bin" local "${res[@]}" --sync-every 4 --ckpt "$tmp/ro" --ckpt-every 5 >"$tmp/ro.out" 2>"$tmp/ro.err"
check local_outer_resumed_exit0 test $? -eq 0
check local_outer_resumes_from_step_5 grep -q "resuming from step 5 (" "$tmp/ro.err"
check local_outer_gateway_reseeded grep -q "this gateway's becomes outer step 1's" "$tmp/ro.err"
check local_outer_resumed_to_outer_step_3 python3 -c "import json,sys; d=json.loads(open(sys.argv[1]).read().splitlines()[-1]); assert d['final'] and d['step'] == 12 and d['outer_step'] == 3, d" "$tmp/ro.out"

# SIGTERM (a suspended job's pods are deleted) writes a checkpoint at the step it ends
# after; the next run resumes there.
"$bin" local "${res[@]}" --steps 1000000 --ckpt "$tmp/rt" >"$tmp/rt.out" 2>"$tmp/rt.err" &
rt_pid=$!
for _ in $(seq 600); do grep -q '"step":3' "$tmp/rt.out" && break; sleep 0.1; done
kill -TERM "$rt_pid"
wait "$rt_pid"
check local_sigterm_exit0 test $? -eq 0
rt_step=$(python3 -c "import json,sys; d=json.loads(open(sys.argv[1]).read().splitlines()[-1]); print(d['step'])" "$tmp/rt.out" 2>/dev/null)
"$bin" local "${res[@]}" --steps $((${rt_step:-0} + 2)) --ckpt "$tmp/rt" >"$tmp/rt2.out" 2>"$tmp/rt2.err"
check local_sigterm_checkpoint_resumes grep -q "resuming from step ${rt_step:-x} (" "$tmp/rt2.err"

# A damaged newest checkpoint is refused in one line naming it, and the previous one is
# used (saving keeps it as cirrus.ckpt.prev): here the one of step 10 is damaged, so the
# run resumes from step 5.
"$bin" local "${res[@]}" --ckpt "$tmp/rd" --ckpt-every 5 --stop-after 10 >/dev/null 2>&1
printf '\x55' | dd of="$tmp/rd/cirrus.ckpt" bs=1 seek=300 conv=notrunc status=none
"$bin" local "${res[@]}" --ckpt "$tmp/rd" --ckpt-every 5 >"$tmp/rd.out" 2>"$tmp/rd.err"
check local_corrupt_exit0 test $? -eq 0
check local_corrupt_named grep -q "checkpoint $tmp/rd/cirrus.ckpt: checksum mismatch: refused; resuming from the previous checkpoint" "$tmp/rd.err"
check local_corrupt_previous_used grep -q "resuming from step 5 ($tmp/rd/cirrus.ckpt.prev)" "$tmp/rd.err"
check local_corrupt_ends_as_uninterrupted test "$(last_losses "$tmp/rd.out")" = "$(last_losses "$tmp/res_full.out")"
# Truncated (a copy cut short) is damaged too.
"$bin" local "${res[@]}" --ckpt "$tmp/rs" --ckpt-every 5 --stop-after 10 >/dev/null 2>&1
truncate -s 1000 "$tmp/rs/cirrus.ckpt"
"$bin" local "${res[@]}" --ckpt "$tmp/rs" --ckpt-every 5 >"$tmp/rs.out" 2>"$tmp/rs.err"
check local_truncated_previous_used grep -q "resuming from step 5 ($tmp/rs/cirrus.ckpt.prev)" "$tmp/rs.err"
# Both damaged: nothing to resume from that can be trusted, so it fails (not a new run).
truncate -s 1000 "$tmp/rs/cirrus.ckpt" "$tmp/rs/cirrus.ckpt.prev"
expect local_all_damaged_refused 2 "checkpoint $tmp/rs/cirrus.ckpt.prev: truncated" -- \
    "$bin" local "${res[@]}" --ckpt "$tmp/rs"
# Another model shape, another job, another seed: refused in one line, exit 2, before training.
expect local_resume_other_shape 2 "checkpoint $tmp/rk/cirrus.ckpt has n_embd 32, model has 64" -- \
    "$bin" local "${res[@]}" --width 64 --ckpt "$tmp/rk"
expect local_resume_other_job 2 "checkpoint $tmp/rk/cirrus.ckpt belongs to job 'cirrus-local', not to this job 'other'" -- \
    "$bin" local "${res[@]}" --job other --ckpt "$tmp/rk"
expect local_resume_other_seed 2 "was trained with --seed 1337, not 7" -- \
    "$bin" local "${res[@]}" --seed 7 --ckpt "$tmp/rk"
expect local_regions_do_not_resume 2 'holds a checkpoint: local --regions 2 does not resume' -- \
    "$bin" local "${res[@]}" --regions 2 --ckpt "$tmp/rk"

# A crash leaves the signal and a backtrace on stderr (common/crash.c), and the exit status
# a crash has (128 + 11): a stage peer, serving, is sent SIGSEGV.
"$bin" stage --serve 0:1 --layers 2 --width 32 --heads 2 --context 16 --batch 2 --listen 127.0.0.1:0 >/dev/null 2>"$tmp/crash.err" &
crash_pid=$!
for _ in $(seq 100); do grep -q 'serving layers' "$tmp/crash.err" && break; sleep 0.1; done
kill -SEGV "$crash_pid"
wait "$crash_pid" 2>/dev/null
crash_rc=$?
check crash_exit_status_139 test "$crash_rc" -eq 139
check crash_names_the_signal grep -q '^cirrus-trainer stage: crashed with SIGSEGV; backtrace' "$tmp/crash.err"
check crash_backtrace_frames grep -q 'cirrus-trainer(.*+0x[0-9a-f]*)' "$tmp/crash.err"

# The demo script end to end, briefly: a local region trains, the loss plot is drawn and
# text is sampled from the checkpoint the region wrote.
if CIRRUS_DEMO_STEPS=30 CIRRUS_DEMO_SYNC_EVERY=10 bash "$(dirname "$0")/../../trainer/scripts/demo.sh" "$bin" "$CIRRUS_CORPUS" \
    "$tmp/demo" >"$tmp/demo.out" 2>"$tmp/demo.err"; then
    check demo_ran true
else
    check demo_ran false; tail -5 "$tmp/demo.err"
fi
check demo_loss_plot test -s "$tmp/demo/loss.png"
# Both regions took outer steps 10, 20 and 30 over TLS: WAN bytes were plotted, and grew.
check demo_wan_bytes awk 'NR == 1 { first = $2 } END { exit !(NR >= 30 && $2 > first && $2 > 0) }' "$tmp/demo/wan.dat"
check demo_checkpoint_from_the_region test -s "$tmp/demo/ckpt/cirrus.ckpt"
check demo_sampled grep -q '^And God said' "$tmp/demo.out"

# Several clients without --microbatch: the default cuts each step's batch into a microbatch
# for every client (it once stayed the whole batch, and the run refused to start: "1
# microbatches per step cannot be shared by 2 clients", as every SwarmJob region with
# clients: 2 did, the operator passing no --microbatch).
"$bin" local --stages 2 --clients 2 --layers 2 --width 32 --heads 2 --context 16 --batch 4 \
    --steps 3 --log-every 1 --eval-batches 1 >"$tmp/clients.out" 2>"$tmp/clients.err"
check local_two_clients_default_microbatch test $? -eq 0
check local_two_clients_trained grep -q '^done: 3 steps' "$tmp/clients.out"

# Asked to stop (SIGTERM), `local` with two regions of two clients ends at once, its
# processes with it, exit 0: each region's second client was left waiting at the step
# barrier for a step its leader would not finish (5 minutes), and `local` waited for it.
stop_job=cli-stop-$$
"$bin" local --regions 2 --stages 2 --clients 2 --layers 2 --width 32 --heads 2 --context 16 \
    --batch 4 --steps 100000 --sync-every 5 --log-every 1 --eval-batches 1 --job "$stop_job" \
    >"$tmp/stop.out" 2>"$tmp/stop.err" &
stop_pid=$!
timeout 60 bash -c "until grep -q '^step *20' '$tmp/stop.out'; do sleep 0.1; done"
kill -TERM "$stop_pid"
timeout 20 tail --pid="$stop_pid" -f /dev/null || kill -KILL "$stop_pid"
wait "$stop_pid"
check local_asked_to_stop_exits_0_within_20_s test $? -eq 0
check local_asked_to_stop_leaves_no_process test -z "$(pgrep -f -- "--job $stop_job")"
pkill -KILL -f -- "--job $stop_job"

echo "cli: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
