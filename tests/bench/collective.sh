#!/usr/bin/env bash
# make bench-collective: Cirrus's TCP ring all-reduce side by side with OpenMPI's
# MPI_Allreduce on the same sizes, in one run: OpenMPI forced onto TCP (like for like) and
# with its default shared-memory transport (the upper reference). 2 and 4 ranks.
# Usage: collective.sh TRAINER OUTDIR [MIN_MB MAX_MB]
set -euo pipefail
bin=$1 out=$2 min=${3:-1} max=${4:-256}
mkdir -p "$out"
mpicc -O2 -o "$out/mpi_allreduce" "$(dirname "$0")/mpi_allreduce.c"
results="$out/collective.jsonl"
: >"$results"
mpi=(mpirun --allow-run-as-root --oversubscribe --bind-to none)
for ranks in 2 4; do
    echo "cirrus: ring all-reduce, $ranks ranks"
    "$bin" bench-collective --ranks "$ranks" --min-mb "$min" --max-mb "$max" --json | tee -a "$results"
    echo "cirrus: OpenMPI over TCP, $ranks ranks"
    "${mpi[@]}" -np "$ranks" --mca btl tcp,self --mca btl_tcp_if_include lo \
        "$out/mpi_allreduce" openmpi-tcp "$min" "$max" | tee -a "$results"
    echo "cirrus: OpenMPI default (shared memory), $ranks ranks"
    "${mpi[@]}" -np "$ranks" "$out/mpi_allreduce" openmpi-shm "$min" "$max" | tee -a "$results"
done
python3 - "$results" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
by = {(r["impl"], r["ranks"], r["bytes"]): r for r in rows}
print("\nbusbw in GB/s (nccl-tests convention); ratio = cirrus / openmpi-tcp")
print(f"{'ranks':>5} {'MiB':>6} {'cirrus':>8} {'mpi-tcp':>8} {'mpi-shm':>8} {'ratio':>6}")
for (impl, ranks, size), r in sorted(by.items(), key=lambda kv: (kv[0][1], kv[0][2])):
    if impl != "cirrus-ring":
        continue
    t = by.get(("openmpi-tcp", ranks, size)); s = by.get(("openmpi-shm", ranks, size))
    ratio = r["busbw"] / t["busbw"] if t else float("nan")
    print(f"{ranks:>5} {size >> 20:>6} {r['busbw']:>8.3f} {t['busbw'] if t else float('nan'):>8.3f} "
          f"{s['busbw'] if s else float('nan'):>8.3f} {ratio:>6.2f}")
PY
