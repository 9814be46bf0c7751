#!/usr/bin/env bash
# make bench-collective: Cirrus's TCP ring all-reduce side by side with OpenMPI's
# MPI_Allreduce on the same sizes, in one run: OpenMPI forced onto TCP (like for like) and
# with its default shared-memory transport (the upper reference). 2 and 4 ranks.
# Usage: collective.sh TRAINER OUTDIR [MIN_MB MAX_MB]
# REPS=N (default 1) repeats the whole comparison N times, the implementations taking turns
# within each repetition, and reports the median busbw and the spread of the per-repetition
# ratio: on a small shared machine one run can be off by 2x, so compare within repetitions.
set -euo pipefail
bin=$1 out=$2 min=${3:-1} max=${4:-256} reps=${REPS:-1}
mkdir -p "$out"
mpicc -O2 -o "$out/mpi_allreduce" "$(dirname "$0")/mpi_allreduce.c"
results="$out/collective.jsonl"
: >"$results"
mpi=(mpirun --allow-run-as-root --oversubscribe --bind-to none)
for rep in $(seq "$reps"); do
    for ranks in 2 4; do
        tag() { sed "s/^{/{\"rep\":$rep,/"; }
        echo "cirrus: ring all-reduce, $ranks ranks (repetition $rep of $reps)"
        "$bin" bench-collective --ranks "$ranks" --min-mb "$min" --max-mb "$max" --json | tag | tee -a "$results"
        echo "cirrus: OpenMPI over TCP, $ranks ranks"
        "${mpi[@]}" -np "$ranks" --mca btl tcp,self --mca btl_tcp_if_include lo \
            "$out/mpi_allreduce" openmpi-tcp "$min" "$max" | tag | tee -a "$results"
        echo "cirrus: OpenMPI default (shared memory), $ranks ranks"
        "${mpi[@]}" -np "$ranks" "$out/mpi_allreduce" openmpi-shm "$min" "$max" | tag | tee -a "$results"
    done
done
python3 - "$results" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
by = {}
for r in rows:
    by.setdefault((r["impl"], r["ranks"], r["bytes"]), {})[r.get("rep", 1)] = r["busbw"]
reps = len({r.get("rep", 1) for r in rows})
med = lambda d: statistics.median(d.values()) if d else float("nan")
print(f"\nbusbw in GB/s (nccl-tests convention), median of {reps} repetition(s); "
      "ratio = cirrus / openmpi-tcp, median [min-max] over repetitions")
print(f"{'ranks':>5} {'MiB':>6} {'cirrus':>8} {'mpi-tcp':>8} {'mpi-shm':>8} {'ratio':>6} {'spread':>12}")
for (impl, ranks, size), c in sorted(by.items(), key=lambda kv: (kv[0][1], kv[0][2])):
    if impl != "cirrus-ring":
        continue
    t = by.get(("openmpi-tcp", ranks, size), {}); s = by.get(("openmpi-shm", ranks, size), {})
    ratios = [c[k] / t[k] for k in c if k in t and t[k] > 0]
    ratio = statistics.median(ratios) if ratios else float("nan")
    spread = f"[{min(ratios):.2f}-{max(ratios):.2f}]" if len(ratios) > 1 else ""
    print(f"{ranks:>5} {size >> 20:>6} {med(c):>8.3f} {med(t):>8.3f} {med(s):>8.3f} {ratio:>6.2f} {spread:>12}")
PY
