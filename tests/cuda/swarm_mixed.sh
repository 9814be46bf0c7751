#!/usr/bin/env bash
# On a GPU machine (tests/cuda/run.sh runs it when one is present): regions started by
# hand, as Kubernetes starts them (a gateway, stage peers that know only the gateway, a
# client), whose stages mix backends:
#   mixed    a CUDA and a CPU peer in stage 0 (averaged over the TCP ring), CUDA in stage 1;
#   twogpu   two CUDA peers in stage 0, which build an NCCL communicator over the ring (on
#            one GPU NCCL refuses two ranks on one device: both must fall back to the ring).
# Checks, for each: the peers report the backends asked for; stage 0 had both peers at every
# step; every step's loss and the final validation loss within 1e-4 relative of
# single-process CPU training on the same batches (the CPU-only equivalence test in
# tests/swarm/run.sh holds 1e-5 between summation orders). And the mixed region's
# checkpoint resumes CPU `train` for one more step and is read by `sample` on both backends.
# Usage: swarm_mixed.sh CUDA-TRAINER [cpu]   (CIRRUS_CORPUS: the corpus). Exit 0: all passed.
# With `cpu`, the CPU backend stands in for the GPU (as gpu-tests --cpu-as-gpu), so that this
# script's own plumbing runs in `make test` on machines without a GPU.
set -u
bin=$1 gpu=${2:-cuda}
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=../lib/suite.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib/suite.sh"

model=(--layers 3 --width 64 --heads 4 --context 32)
run=(--batch 8 --lr 1e-3 --steps 25 --log-every 1 --eval-batches 4 --json)

"$bin" train "${model[@]}" "${run[@]}" --backend cpu >"$tmp/train.json" 2>"$tmp/train.err" ||
    bad "cpu train ran: $(tail -1 "$tmp/train.err")"

gpus=0
# (the caller found a GPU: without nvidia-smi to count them, one)
[ "$gpu" = cuda ] && { gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU'); [ "$gpus" -ge 1 ] || gpus=1; }
# region NAME SPEC...: a gateway, one stage peer per SPEC ("STAGE LAYERS BACKEND"; the k-th
# GPU peer on GPU k mod the GPUs there are), then a client training 25 steps with a
# checkpoint in $tmp/NAME.ck; its losses checked against CPU train's. Peer logs in
# $tmp/NAME.peers.
region() {
    local name=$1; shift
    local gport k=0 spec index layers backend
    gport=$(python3 "$here/../swarm/free_port.py")
    "$bin" gateway --job "$name" --listen "127.0.0.1:$gport" --http-port -1 --stages 2 --layers 3 \
        2>"$tmp/$name.gateway" &
    pids+=($!)
    for spec in "$@"; do
        read -r index layers backend <<<"$spec"
        local dev=()
        if [ "$backend" = cuda ] && [ "$gpus" -gt 0 ]; then
            dev=(env CUDA_VISIBLE_DEVICES=$((k % gpus))); k=$((k + 1))
        fi
        OMP_NUM_THREADS=2 "${dev[@]}" "$bin" stage --serve "$layers" "${model[@]}" --job "$name" \
            --listen 127.0.0.1:0 --coordinator "127.0.0.1:$gport" --stage-index "$index" \
            --backend "$backend" 2>>"$tmp/$name.peers" &
        pids+=($!)
    done
    for _ in $(seq 100); do
        [ "$(grep -c 'registered peer' "$tmp/$name.gateway")" -ge $# ] && break
        sleep 0.1
    done
    # The peers say which backend serves them.
    local want got
    want=$(for spec in "$@"; do read -r index layers backend <<<"$spec"; echo "$backend"; done | sort | tr '\n' ' ')
    got=$(grep -o 'on the [a-z]* backend' "$tmp/$name.peers" | awk '{print $3}' | sort | tr '\n' ' ')
    if [ "$got" = "$want" ]; then ok "${name}_peers_on_backends ($got)"
    else bad "${name}_peers_on_backends: got '$got', want '$want'"; sed 's/^/    /' "$tmp/$name.peers"; fi
    mkdir -p "$tmp/$name.ck"
    if "$bin" client --job "$name" --coordinator "127.0.0.1:$gport" "${model[@]}" "${run[@]}" \
        --microbatch 2 --ckpt "$tmp/$name.ck" >"$tmp/$name.json" 2>"$tmp/$name.client" &&
        python3 - "$tmp/train.json" "$tmp/$name.json" <<'PY'; then ok "${name}_matches_cpu_train"; else bad "${name}_matches_cpu_train"; tail -3 "$tmp/$name.client" "$tmp/$name.peers"; fi
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
assert len(a) == len(b) == 26, (len(a), len(b))
steps = [x for x in b if not x.get("final")]
assert all(x["stages"][0]["peers"] == 2 for x in steps), "stage 0 lost a peer"
worst = max(abs(x["loss"] - y["loss"]) / x["loss"] for x, y in zip(a, b))
final = abs(a[-1]["val_loss"] - b[-1]["val_loss"]) / a[-1]["val_loss"]
print(f"    worst relative loss difference over 25 steps {worst:.2e}, final val loss {final:.2e} (limit 1e-4)")
assert worst < 1e-4 and final < 1e-4
PY
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
    wait 2>/dev/null
    pids=()
}

# A CUDA and a CPU peer average stage 0 over the TCP ring; a CUDA peer serves stage 1.
region mixed "0 0:1 $gpu" "0 0:1 cpu" "1 1:3 $gpu"
if [ "$gpu" = cuda ] && grep -q 'averaging: 1 of 2 peers can build a device collective for these members; the TCP ring averages' "$tmp/mixed.peers"; then
    ok "mixed_stage_averages_over_the_ring"
elif [ "$gpu" = cuda ]; then
    bad "mixed_stage_averages_over_the_ring"; grep averaging "$tmp/mixed.peers" | sed 's/^/    /'
fi
# Two CUDA peers in stage 0: they build an NCCL communicator over the ring. On one GPU NCCL
# refuses two ranks on one device, and both must say so and average over the ring instead.
region twogpu "0 0:1 $gpu" "0 0:1 $gpu" "1 1:3 cpu"
if [ "$gpu" = cuda ]; then
    # (-ge: a repeated round rebuilds the ring and says it again)
    if [ "$gpus" -ge 2 ] && [ "$(grep -c 'averaging: nccl among the stage.s 2 peers' "$tmp/twogpu.peers")" -ge 2 ]; then
        ok "two_gpu_peers_average_with_nccl"
    elif [ "$gpus" -eq 1 ] && [ "$(grep -c 'the device collective did not start on every peer (NCCL init: .*Duplicate GPU' "$tmp/twogpu.peers")" -ge 1 ] &&
        [ "$(grep -c 'the TCP ring averages' "$tmp/twogpu.peers")" -ge 2 ]; then
        ok "two_peers_on_one_gpu_fall_back_to_the_ring (NCCL refused the shared device)"
    else
        bad "two_gpu_peers_nccl_or_fallback ($gpus GPUs)"; grep averaging "$tmp/twogpu.peers" | sed 's/^/    /'
    fi
fi

# The checkpoint the mixed region wrote: CPU training resumes from it, both backends sample it.
if "$bin" train "${model[@]}" --batch 8 --lr 1e-3 --steps 26 --ckpt "$tmp/mixed.ck" --resume --json \
    --backend cpu >"$tmp/resumed.json" 2>"$tmp/resumed.err" &&
    grep -q '"step":26,"final":true' "$tmp/resumed.json"; then
    ok "mixed_region_checkpoint_resumes_cpu_train ($(grep -o '"step":26,"final":true,"loss":[^,]*' "$tmp/resumed.json"))"
else
    bad mixed_region_checkpoint_resumes_cpu_train; tail -3 "$tmp/resumed.err"
fi
for backend in $(printf "%s\n" cpu "$gpu" | sort -u); do
    if "$bin" sample --ckpt "$tmp/mixed.ck" --tokens 32 --backend "$backend" >"$tmp/s.$backend" 2>"$tmp/s.err" &&
        [ -s "$tmp/s.$backend" ]; then
        ok "mixed_region_checkpoint_samples_on_$backend"
    else
        bad "mixed_region_checkpoint_samples_on_$backend"; tail -2 "$tmp/s.err"
    fi
done

echo "cirrus: mixed-backend region ($gpu + cpu): $pass passed, $fail failed"
[ "$fail" -eq 0 ]
