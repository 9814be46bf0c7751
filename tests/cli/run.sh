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

# A stage peer's name at the coordinator must be a valid member name.
expect stage_bad_name 2 '--name must be' -- "$bin" stage --serve 0:1 --name 'bad name!'

# A region's client cannot resume yet: refused up front, not after training.
expect local_resume_refused 2 'resume' -- "$bin" local --stages 2 "${tiny[@]}" --steps 2 --ckpt "$tmp/ck" --resume

# The demo script end to end, briefly: a local region trains, the loss plot is drawn and
# text is sampled from the checkpoint the region wrote.
if CIRRUS_DEMO_STEPS=30 bash "$(dirname "$0")/../../trainer/scripts/demo.sh" "$bin" "$CIRRUS_CORPUS" \
    "$tmp/demo" >"$tmp/demo.out" 2>"$tmp/demo.err"; then
    check demo_ran true
else
    check demo_ran false; tail -5 "$tmp/demo.err"
fi
check demo_loss_plot test -s "$tmp/demo/loss.png"
check demo_checkpoint_from_the_region test -s "$tmp/demo/ckpt/cirrus.ckpt"
check demo_sampled grep -q '^And God said' "$tmp/demo.out"

echo "cli: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
