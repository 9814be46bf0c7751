#!/usr/bin/env bash
# The CUDA build on any machine (make test-cuda-build, part of make test): what can run with
# or without a GPU. Without one, --backend cuda must be refused with exit 2 and one line that
# names the reason, in every command that has the flag, never a crash; with one, it trains.
# Either way the CUDA binary's --backend cpu must train exactly as the plain binary does, and
# a region with a CUDA (or, without a GPU, a stand-in CPU) peer beside a CPU peer in one
# stage must train as single-process CPU training does.
# Commands with --backend: train, sample, stage, bench.
# Usage: tests/cuda/run.sh PLAIN-TRAINER CUDA-TRAINER GPU-TESTS   (CIRRUS_CORPUS: the corpus)
set -u
plain=$1 cuda=$2 gpu_tests=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pass=0 fail=0

ok() { echo "ok   $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1"; fail=$((fail + 1)); }

# expect NAME CODE PATTERN -- CMD...: exit code CODE and exactly one stderr line matching PATTERN.
expect() {
    local name=$1 code=$2 pattern=$3
    shift 4
    "$@" >"$tmp/out" 2>"$tmp/err"
    local rc=$?
    if [ "$rc" -eq "$code" ] && [ "$(grep -c . "$tmp/err")" -eq 1 ] && grep -qE -- "$pattern" "$tmp/err"; then
        ok "$name"
    else
        bad "$name: exit $rc (want $code), stderr:"; sed 's/^/    /' "$tmp/err"
    fi
}

# 3 steps, a line each, then the final line: 4 lines with a "loss".
tiny=(--layers 2 --width 32 --heads 2 --context 16 --batch 2 --steps 3 --seed 5 --json --log-every 1)

# The plain build has the flag but not the backend.
expect plain_refuses_cuda 2 'built without CUDA \(build it with `make cuda`\)' -- \
    "$plain" train "${tiny[@]}" --backend cuda
expect cuda_build_rejects_unknown 2 "--backend must be cpu or cuda, got 'metal'" -- \
    "$cuda" train "${tiny[@]}" --backend metal

# The GPU tests binary links cuBLAS, the runtime and NCCL: it must load and report versions.
"$gpu_tests" >"$tmp/gt" 2>&1
rc=$?
if [ $rc -eq 0 ] && grep -qE '^gpu-tests: CUDA runtime [0-9]+, NCCL [0-9]+;' "$tmp/gt"; then
    ok "gpu_tests_runs ($(head -1 "$tmp/gt"))"
else
    bad "gpu_tests_runs: exit $rc"; sed 's/^/    /' "$tmp/gt"
fi

# The GPU test program's own code, with the CPU backend standing in for the GPU: it must
# run to the end with every comparison exact (59 checks, the device collective's skipped; under
# 50 means tests went missing).
"$gpu_tests" --cpu-as-gpu >"$tmp/self" 2>&1
rc=$?
if [ $rc -eq 0 ] && grep -qE '^gpu-tests \(cpu against cpu\): [0-9]+ checks, 0 failed$' "$tmp/self" &&
    [ "$(grep -c '^ok ' "$tmp/self")" -ge 50 ]; then
    ok "gpu_tests_harness_cpu_as_gpu ($(tail -1 "$tmp/self"))"
else
    bad "gpu_tests_harness_cpu_as_gpu: exit $rc"; grep -v '^ok ' "$tmp/self" | sed 's/^/    /'
fi

"$gpu_tests" --probe
probe=$?
case $probe in
0)
    echo "cirrus: a GPU is present: --backend cuda must train"
    "$cuda" train "${tiny[@]}" --backend cuda >"$tmp/gpu.json" 2>"$tmp/err"
    rc=$?
    if [ $rc -eq 0 ] && [ "$(grep -c '"loss"' "$tmp/gpu.json")" -eq 4 ]; then ok cuda_trains
    else bad "cuda_trains: exit $rc"; sed 's/^/    /' "$tmp/err"; fi
    "$cuda" bench --layers 2 --width 32 --heads 2 --context 16 --batch 2 --steps 2 --json \
        --backend cuda >"$tmp/bench.json" 2>"$tmp/err"
    rc=$?
    if [ $rc -eq 0 ] && grep -q '"backend":"cuda","blas_kernel":"cuBLAS"' "$tmp/bench.json"; then
        ok "cuda_bench ($(cat "$tmp/bench.json"))"
    else bad "cuda_bench: exit $rc"; sed 's/^/    /' "$tmp/err"; fi
    ;;
3)
    # No driver or no device: the reason, on one line, exit 2, for each command with the flag.
    reason='--backend cuda: (no usable NVIDIA driver|the driver sees no CUDA device)'
    expect train_without_gpu 2 "^cirrus-trainer train: $reason" -- \
        "$cuda" train "${tiny[@]}" --backend cuda
    expect stage_without_gpu 2 "^cirrus-trainer stage: $reason" -- \
        "$cuda" stage --serve 0:1 --layers 2 --width 32 --heads 2 --context 16 --backend cuda
    expect bench_without_gpu 2 "^cirrus-trainer bench: $reason" -- \
        "$cuda" bench --layers 1 --width 16 --heads 2 --context 8 --batch 1 --steps 1 --backend cuda
    mkdir -p "$tmp/ck"
    "$plain" train --layers 1 --width 16 --heads 2 --context 8 --batch 1 --steps 1 \
        --ckpt "$tmp/ck" >/dev/null 2>&1
    expect sample_without_gpu 2 "^cirrus-trainer sample: $reason" -- \
        "$cuda" sample --ckpt "$tmp/ck" --tokens 4 --backend cuda
    ;;
*)
    bad "gpu_tests --probe: exit $probe (want 0: GPU, or 3: none)"
    ;;
esac

# A region whose stage is served by a CUDA and a CPU peer together (tests/cuda/swarm_mixed.sh);
# without a GPU the CPU backend stands in, so the script's plumbing is exercised everywhere.
mixed_gpu=cpu
[ "$probe" -eq 0 ] && mixed_gpu=cuda
if bash "$(dirname "$0")/swarm_mixed.sh" "$cuda" "$mixed_gpu" >"$tmp/mixed" 2>&1; then
    ok "swarm_mixed_$mixed_gpu ($(tail -1 "$tmp/mixed"))"
else
    bad "swarm_mixed_$mixed_gpu"; sed 's/^/    /' "$tmp/mixed"
fi

# --backend cpu in the CUDA binary is the plain binary's code: the same losses, bit for bit.
"$plain" train "${tiny[@]}" >"$tmp/plain.json" 2>/dev/null
rc1=$?
"$cuda" train "${tiny[@]}" --backend cpu >"$tmp/cpu.json" 2>/dev/null
rc2=$?
if [ $rc1 -eq 0 ] && [ $rc2 -eq 0 ] && [ "$(grep -c '"loss"' "$tmp/plain.json")" -eq 4 ] &&
    cmp -s <(grep -o '"loss":[^,]*' "$tmp/plain.json") <(grep -o '"loss":[^,]*' "$tmp/cpu.json"); then
    ok "cuda_binary_cpu_backend_equals_plain ($(grep -o '"loss":[^,]*' "$tmp/cpu.json" | tail -1))"
else
    bad "cuda_binary_cpu_backend_equals_plain: exits $rc1/$rc2"
    diff <(grep -o '"loss":[^,]*' "$tmp/plain.json") <(grep -o '"loss":[^,]*' "$tmp/cpu.json") | sed 's/^/    /'
fi

echo "cirrus: cuda build tests: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
