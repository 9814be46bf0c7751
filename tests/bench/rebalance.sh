#!/usr/bin/env bash
# Live rebalancing against static assignments: the region of tests/swarm/rebalance.sh (2
# stages of equal depth, every peer slowed 8x on its CPU time) run as a static 3,1, a
# static 2,2 (the best static assignment of 4 equal peers), and 3,1 rebalanced every 6 s.
# Throughput is the median per-step tokens/s: the static runs over steps 2..80, the
# rebalanced run before the move (steps 2..J-2) and after the moved peer joined (J+1..80).
# The three run interleaved, REPEATS times; each figure is the best of its runs.
# Usage: tests/bench/rebalance.sh path/to/cirrus-trainer [REPEATS]   (CIRRUS_CORPUS: corpus)
set -u
bin=$1
repeats=${2:-2}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
common=(local --stages 2 --peer-slowdown 8 --layers 4 --width 128 --heads 4 --context 64
        --batch 32 --microbatch 2 --inflight 8 --act-slots 8 --steps 80 --log-every 1
        --eval-batches 1 --json)
echo "cirrus: machine: $(nproc) CPUs; load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "cirrus: ${common[*]}"
for r in $(seq "$repeats"); do
    for run in static-3,1 static-2,2 rebalanced; do
        case $run in
        static-*) extra=(--stage-peers "${run#static-}") ;;
        rebalanced) extra=(--stage-peers 3,1 --rebalance-period-s 6) ;;
        esac
        "$bin" "${common[@]}" "${extra[@]}" >"$tmp/$run-$r.json" 2>"$tmp/$run-$r.err" ||
            { echo "cirrus: run $run $r failed:"; tail -3 "$tmp/$run-$r.err"; exit 1; }
    done
done
echo "cirrus: load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$tmp" "$repeats" <<'PY'
import json, re, statistics, sys
tmp, repeats = sys.argv[1], int(sys.argv[2])
def tps(path):
    return {l["step"]: l["tokens_per_s"] for l in map(json.loads, open(path)) if "final" not in l}
def static(run, r):
    t = tps(f"{tmp}/{run}-{r}.json")
    return statistics.median(t[s] for s in t if s >= 2)
def rebalanced(r):
    t = tps(f"{tmp}/rebalanced-{r}.json")
    err = open(f"{tmp}/rebalanced-{r}.err").read()
    j = int(re.search(r"1 peer\(s\) joined before step (\d+)", err).group(1))
    return (statistics.median(t[s] for s in t if 2 <= s <= j - 2),
            statistics.median(t[s] for s in t if s > j), j)
runs = range(1, repeats + 1)
s31 = [static("static-3,1", r) for r in runs]
s22 = [static("static-2,2", r) for r in runs]
rb = [rebalanced(r) for r in runs]
before, after = max(b for b, _, _ in rb), max(a for _, a, _ in rb)
print()
print("| assignment | tokens/s (median step, best of %d) | runs |" % repeats)
print("|---|---|---|")
print(f"| static 3,1 | {max(s31):.0f} | {' / '.join(f'{x:.0f}' for x in s31)} |")
print(f"| static 2,2 (best static) | {max(s22):.0f} | {' / '.join(f'{x:.0f}' for x in s22)} |")
print(f"| rebalanced, before the move (3,1) | {before:.0f} | {' / '.join(f'{b:.0f}' for b, _, _ in rb)} |")
print(f"| rebalanced, after the move (2,2) | {after:.0f} | {' / '.join(f'{a:.0f}' for _, a, _ in rb)} |")
print(f"| **after / before** | **{after / before:.2f}x** | {' / '.join(f'{a / b:.2f}' for b, a, _ in rb)} |")
print(f"| **after / static 2,2** | **{after / max(s22):.0%}** | {' / '.join(f'{a / s:.0%}' for (_, a, _), s in zip(rb, s22))} |")
print(f"\njoined before step: {[j for _, _, j in rb]}")
PY
