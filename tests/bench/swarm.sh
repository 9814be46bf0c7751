#!/usr/bin/env bash
# Pipeline throughput of a local region (2 stages x 2 peers): Cirrus's wiring against a
# fixed round-robin assignment (GPipe's: every stage's peers in turn, speed ignored), on
# equal peers and with stage 0's first peer 3x slower (--slow-peer 0:0:3), with one
# microbatch in flight and with the default window (one per peer). Every configuration
# runs REPEATS times, interleaved, and reports the best median per-step throughput.
# Usage: tests/bench/swarm.sh path/to/cirrus-trainer [REPEATS]   (CIRRUS_CORPUS: corpus)
set -u
bin=$1
repeats=${2:-2}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
model=(--layers 4 --width 256 --heads 4 --context 64 --batch 64 --microbatch 4 --steps 12)
echo "cirrus: machine: $(nproc) CPUs, $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1); load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "cirrus: local --stages 2 --peers 2 ${model[*]} (samples = sequences of 64 tokens)"
for r in $(seq "$repeats"); do
    for inflight in 1 0; do
        for slow in 0 1; do
            for routing in rr wiring; do
                extra=(); [ "$slow" = 1 ] && extra=(--slow-peer 0:0:3)
                out="$tmp/$routing-$inflight-$slow-$r"
                "$bin" local --stages 2 --peers 2 "${model[@]}" "${extra[@]}" --routing "$routing" \
                    --inflight "$inflight" --log-every 1 --eval-batches 1 --json >"$out.json" \
                    2>"$out.err" || { echo "cirrus: run $out failed:"; tail -3 "$out.err"; exit 1; }
            done
        done
    done
done
echo "cirrus: load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$tmp" "$repeats" <<'PY'
import glob, json, re, statistics, sys
tmp, repeats = sys.argv[1], int(sys.argv[2])
T = 64
def samples_per_s(path):
    lines = [json.loads(l) for l in open(path + ".json")]
    steps = [l["tokens_per_s"] for l in lines if "final" not in l and l["step"] > 1]
    return statistics.median(steps) / T
def slow_share(path):
    err = open(path + ".err").read()
    stage0 = re.search(r"stage 0 routing \([a-z ]+\): (.*)", err).group(1)
    served = [int(n) for n in re.findall(r" (\d+) requests", stage0)]
    return served[0] / sum(served)
best, share = {}, {}
for routing in ("rr", "wiring"):
    for inflight in ("1", "0"):
        for slow in ("0", "1"):
            runs = [f"{tmp}/{routing}-{inflight}-{slow}-{r}" for r in range(1, repeats + 1)]
            best[routing, inflight, slow] = max(samples_per_s(p) for p in runs)
            share[routing, inflight, slow] = statistics.mean(slow_share(p) for p in runs)
print()
print("| in flight | routing | equal peers (samples/s) | slow peer 0:0:3 (samples/s) | slow / equal | stage-0 share of peer 0.0 (slow) |")
print("|---|---|---|---|---|---|")
for inflight, label in (("1", "1"), ("0", "4 (default)")):
    for routing, name in (("rr", "round robin (fixed)"), ("wiring", "Cirrus wiring")):
        eq, sl = best[routing, inflight, "0"], best[routing, inflight, "1"]
        print(f"| {label} | {name} | {eq:.1f} | {sl:.1f} | {sl / eq:.2f} | {share[routing, inflight, '1']:.2f} |")
    r_eq = best["wiring", inflight, "0"] / best["rr", inflight, "0"]
    r_sl = best["wiring", inflight, "1"] / best["rr", inflight, "1"]
    print(f"| {label} | **wiring / round robin** | **{r_eq:.2f}x** | **{r_sl:.2f}x** | | |")
PY
