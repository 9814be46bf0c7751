#!/usr/bin/env bash
# The Cirrus demo (make demo): a SWARM region on this machine (the coordinator, 2 pipeline
# stages of 2 peer processes each, and a client routing microbatches between them over
# loopback) trains the tiny model on the King James Bible for a few minutes with live
# progress; then the loss curves are plotted to a PNG and text is generated from the
# checkpoint the region wrote. Usage: demo.sh TRAINER CORPUS OUTDIR
# (CIRRUS_DEMO_STEPS overrides 4000; CIRRUS_DEMO_STAGES / CIRRUS_DEMO_PEERS the region's shape)
set -euo pipefail
bin=$1 corpus=$2 out=$3
steps=${CIRRUS_DEMO_STEPS:-4000}
rm -rf "$out"
mkdir -p "$out"

stages=${CIRRUS_DEMO_STAGES:-2} peers=${CIRRUS_DEMO_PEERS:-2}
echo "cirrus demo: a local region of $stages stages x $peers peers trains the tiny model" \
    "($steps steps) on $corpus"
"$bin" local --stages "$stages" --peers "$peers" --model tiny --steps "$steps" --batch 8 \
    --lr 3e-3 --eval-every 250 --log-every 25 --data "$corpus" --ckpt "$out/ckpt" \
    --ckpt-every 1000 --metrics "$out/metrics.jsonl"

# Loss curves: training loss every step, validation loss every 250 steps.
sed -nE 's/^\{"step":([0-9]+),"loss":([^,}]+).*/\1 \2/p' "$out/metrics.jsonl" >"$out/train.dat"
sed -nE 's/^\{"step":([0-9]+),.*"val_loss":([^,}]+).*/\1 \2/p' "$out/metrics.jsonl" >"$out/val.dat"
gnuplot <<GP
set terminal png size 1000,560
set output "$out/loss.png"
set title "Cirrus tiny model on the King James Bible (byte-level), $stages stages x $peers peers"
set xlabel "step"
set ylabel "cross-entropy (nats per byte)"
set grid
set key top right
set yrange [0.8:6]
plot "$out/train.dat" using 1:2 with lines lc rgb "#4c72b0" title "train loss", \
     "$out/val.dat" using 1:2 with linespoints pt 7 lc rgb "#dd8452" title "validation loss", \
     log(256) with lines dt 2 lc rgb "#888888" title "chance: ln 256"
GP
echo "cirrus demo: loss plot written to $out/loss.png"

echo "cirrus demo: sampling from the trained model (prompt 'And God said')"
echo "----------------------------------------------------------------------"
"$bin" sample --ckpt "$out/ckpt" --prompt "And God said" --tokens 400 --temperature 0.7
echo "----------------------------------------------------------------------"
echo "cirrus demo: done. Checkpoint in $out/ckpt; try:"
echo "  $bin sample --ckpt $out/ckpt --prompt 'In the beginning' --tokens 300"
