#!/usr/bin/env bash
# On a GPU machine (tests/cuda/run.sh runs it when one is present): a CUDA peer and a CPU
# peer serve the same stage of a region started by hand, as Kubernetes starts it (a gateway,
# stage peers that know only the gateway, a client), their gradients averaged by the ring;
# the other stage is a CUDA peer. Checks:
#   * every step's loss and the final validation loss within 1e-4 relative of single-process
#     CPU training on the same batches (the backends round differently; the CPU-only
#     equivalence test in tests/swarm/run.sh holds 1e-5 between summation orders);
#   * the peers report the backends asked for, and stage 0 had both peers at every step;
#   * the region's checkpoint, gathered from CUDA and CPU peers, resumes CPU `train` for one
#     more step and is read by `sample` on either backend.
# Usage: swarm_mixed.sh CUDA-TRAINER [cpu]   (CIRRUS_CORPUS: the corpus). Exit 0: all passed.
# With `cpu`, the CPU backend stands in for the GPU (as gpu-tests --cpu-as-gpu), so that this
# script's own plumbing runs in `make test` on machines without a GPU.
set -u
bin=$1 gpu=${2:-cuda}
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done; wait 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
pass=0 fail=0
ok() { echo "ok   $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1"; fail=$((fail + 1)); }

model=(--layers 3 --width 64 --heads 4 --context 32)
run=(--batch 8 --lr 1e-3 --steps 25 --log-every 1 --eval-batches 4 --json)

"$bin" train "${model[@]}" "${run[@]}" --backend cpu >"$tmp/train.json" 2>"$tmp/train.err" ||
    bad "cpu train ran: $(tail -1 "$tmp/train.err")"

gport=$(python3 "$here/../swarm/free_port.py")
"$bin" gateway --job mixed --listen "127.0.0.1:$gport" --http-port -1 --stages 2 --layers 3 \
    2>"$tmp/gateway.err" &
pids+=($!)
for spec in "0 0:1 $gpu" "0 0:1 cpu" "1 1:3 $gpu"; do
    read -r index layers backend <<<"$spec"
    OMP_NUM_THREADS=2 "$bin" stage --serve "$layers" "${model[@]}" --job mixed --listen 127.0.0.1:0 \
        --coordinator "127.0.0.1:$gport" --stage-index "$index" --backend "$backend" \
        2>>"$tmp/peers.err" &
    pids+=($!)
done
for _ in $(seq 100); do
    [ "$(grep -c 'registered peer' "$tmp/gateway.err")" -ge 3 ] && break
    sleep 0.1
done
# The peers say which backend serves them: two on $gpu, one on cpu (two on cpu without a GPU).
want_gpu=2 want_cpu=1
[ "$gpu" = cpu ] && want_gpu=0 want_cpu=3
if [ "$(grep -c "on the cuda backend" "$tmp/peers.err")" -eq "$want_gpu" ] &&
    [ "$(grep -c "on the cpu backend" "$tmp/peers.err")" -eq "$want_cpu" ]; then
    ok "peers_on_backends ($(grep -o 'layers.*backend' "$tmp/peers.err" | sort | tr '\n' ';'))"
else
    bad peers_on_backends; sed 's/^/    /' "$tmp/peers.err"
fi
mkdir -p "$tmp/ck"
if "$bin" client --job mixed --coordinator "127.0.0.1:$gport" "${model[@]}" "${run[@]}" \
    --microbatch 2 --ckpt "$tmp/ck" >"$tmp/mixed.json" 2>"$tmp/client.err" &&
    python3 - "$tmp/train.json" "$tmp/mixed.json" "$gpu" <<'PY'; then ok mixed_backend_stage_matches_cpu_train; else bad mixed_backend_stage_matches_cpu_train; tail -3 "$tmp/client.err" "$tmp/peers.err"; fi
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
assert len(a) == len(b) == 26, (len(a), len(b))
steps = [x for x in b if not x.get("final")]
assert all(x["stages"][0]["peers"] == 2 for x in steps), "stage 0 lost a peer"
worst = max(abs(x["loss"] - y["loss"]) / x["loss"] for x, y in zip(a, b))
final = abs(a[-1]["val_loss"] - b[-1]["val_loss"]) / a[-1]["val_loss"]
print(f"    {sys.argv[3]} + cpu peers in stage 0, {sys.argv[3]} in stage 1: worst relative loss difference "
      f"over 25 steps {worst:.2e}, final val loss {final:.2e} (limit 1e-4)")
assert worst < 1e-4 and final < 1e-4
PY
for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
wait 2>/dev/null
pids=()

# The checkpoint the mixed region wrote: CPU training resumes from it, both backends sample it.
if "$bin" train "${model[@]}" --batch 8 --lr 1e-3 --steps 26 --ckpt "$tmp/ck" --resume --json \
    --backend cpu >"$tmp/resumed.json" 2>"$tmp/resumed.err" &&
    grep -q '"step":26,"final":true' "$tmp/resumed.json"; then
    ok "mixed_region_checkpoint_resumes_cpu_train ($(grep -o '"step":26,"final":true,"loss":[^,]*' "$tmp/resumed.json"))"
else
    bad mixed_region_checkpoint_resumes_cpu_train; tail -3 "$tmp/resumed.err"
fi
for backend in $(printf "%s\n" cpu "$gpu" | sort -u); do
    if "$bin" sample --ckpt "$tmp/ck" --tokens 32 --backend "$backend" >"$tmp/s.$backend" 2>"$tmp/s.err" &&
        [ -s "$tmp/s.$backend" ]; then
        ok "mixed_region_checkpoint_samples_on_$backend"
    else
        bad "mixed_region_checkpoint_samples_on_$backend"; tail -2 "$tmp/s.err"
    fi
done

echo "cirrus: mixed-backend region ($gpu + cpu): $pass passed, $fail failed"
[ "$fail" -eq 0 ]
