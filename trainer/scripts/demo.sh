#!/usr/bin/env bash
# The Cirrus demo (make demo): two regions on this machine, each a SWARM region (its
# gateway, 2 pipeline stages of peer processes, a client routing microbatches between them
# over loopback), train the tiny model on disjoint halves of the King James Bible; every
# 50 steps their gateways take an outer step over TLS (outer lr 0.5, the embeddings
# regional: the configuration docs/BENCHMARKS.md found best), sending 2-bit pseudo-gradients.
# Live progress shows the loss and the WAN bytes; then the loss curves and the WAN bytes
# are plotted to a PNG and text is generated from the checkpoint the job wrote.
# Usage: demo.sh TRAINER CORPUS OUTDIR (CIRRUS_DEMO_STEPS overrides 3000;
# CIRRUS_DEMO_REGIONS / CIRRUS_DEMO_STAGES / CIRRUS_DEMO_PEERS the job's shape,
# CIRRUS_DEMO_CODEC the WAN codec)
set -euo pipefail
bin=$1 corpus=$2 out=$3
steps=${CIRRUS_DEMO_STEPS:-3000}
rm -rf "$out"
mkdir -p "$out"

regions=${CIRRUS_DEMO_REGIONS:-2} stages=${CIRRUS_DEMO_STAGES:-2} peers=${CIRRUS_DEMO_PEERS:-1}
codec=${CIRRUS_DEMO_CODEC:-lowbit:2+zstd} sync=${CIRRUS_DEMO_SYNC_EVERY:-50}
echo "cirrus demo: $regions regions of $stages stages x $peers peers train the tiny model" \
    "($steps steps each) on $corpus; outer steps every $sync steps, codec $codec, TLS"
"$bin" local --regions "$regions" --sync-every "$sync" --codec "$codec" --stages "$stages" \
    --outer-lr 0.5 --sync-params no-embed \
    --peers "$peers" --model tiny --steps "$steps" --batch 8 --lr 3e-3 --eval-every 250 \
    --log-every 25 --data "$corpus" --ckpt "$out/ckpt" --ckpt-every 1000 \
    --metrics "$out/metrics.jsonl"

# Loss curves: training loss every step, validation loss every 250 steps.
sed -nE 's/^\{"step":([0-9]+),"loss":([^,}]+).*/\1 \2/p' "$out/metrics.jsonl" >"$out/train.dat"
sed -nE 's/^\{"step":([0-9]+),.*"val_loss":([^,}]+).*/\1 \2/p' "$out/metrics.jsonl" >"$out/val.dat"
# Bytes that crossed between the gateways (both directions, TLS included), in MB.
sed -nE 's/^\{"step":([0-9]+),.*"wan_bytes":([0-9]+).*/\1 \2/p' "$out/metrics.jsonl" |
    awk '{ printf "%s %.3f\n", $1, $2 / 1e6 }' >"$out/wan.dat"
gnuplot <<GP
set terminal png size 1000,560
set output "$out/loss.png"
set title "Cirrus tiny model on the King James Bible (byte-level): $regions regions of $stages stages x $peers peers, outer step every $sync steps ($codec)"
set xlabel "step"
set ylabel "cross-entropy (nats per byte)"
set grid
set key top right
set yrange [0.8:6]
set y2label "MB across the WAN (both directions, TLS included)"
set y2tics
set ytics nomirror
plot "$out/train.dat" using 1:2 with lines lc rgb "#4c72b0" title "train loss (region r0)", \
     "$out/val.dat" using 1:2 with linespoints pt 7 lc rgb "#dd8452" title "validation loss", \
     log(256) with lines dt 2 lc rgb "#888888" title "chance: ln 256", \
     "$out/wan.dat" using 1:2 axes x1y2 with steps lc rgb "#55a868" title "WAN MB"
GP
echo "cirrus demo: loss and WAN bytes plotted to $out/loss.png ($(tail -1 "$out/wan.dat" | cut -d' ' -f2) MB crossed the WAN)"

echo "cirrus demo: sampling from the trained model (prompt 'And God said')"
echo "----------------------------------------------------------------------"
"$bin" sample --ckpt "$out/ckpt" --prompt "And God said" --tokens 400 --temperature 0.7
echo "----------------------------------------------------------------------"
echo "cirrus demo: done. Checkpoint in $out/ckpt; try:"
echo "  $bin sample --ckpt $out/ckpt --prompt 'In the beginning' --tokens 300"
