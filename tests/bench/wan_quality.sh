#!/usr/bin/env bash
# The bytes/quality table of the outer steps (make bench-wan-quality): two regions, each on
# its shard of the data with half the batch, against data parallel over the same tokens (one
# run with the whole batch), for codecs x H. Prints, per configuration, the WAN bytes (both
# directions, TLS included), the reduction against per-step fp32 data parallel (each region
# sending and receiving a 4-byte gradient per parameter every step), and the validation-loss
# gap. Usage: wan_quality.sh TRAINER [STEPS]   (CIRRUS_CORPUS names the corpus)
set -u
bin=$1 steps=${2:-3000}
model=(--stages 2 --layers 2 --width 64 --heads 4 --context 64 --eval-batches 32 --lr 3e-3)
n=$("$bin" train "${model[@]:2}" --steps 1 2>/dev/null | sed -n 's/.* \([0-9]*\) params).*/\1/p')
dp_bytes=$((steps * 8 * n))
val() { grep '"final":true' | grep -v '"region":"r1"' | sed -n 's/.*"val_loss":\([0-9.]*\).*/\1/p'; }
wan() { grep '"final":true' | grep '"region":"r0"' | sed -n 's/.*"wan_bytes":\([0-9]*\).*/\1/p'; }
echo "model: 2 layers x 64, context 64, ${n} parameters; ${steps} steps; data parallel: batch 16"
echo "two regions: batch 8 each (equal tokens); TLS between the gateways"
dp=$("$bin" local "${model[@]}" --batch 16 --steps "$steps" --json 2>/dev/null | val)
printf "%-32s %12s %12s %10s %9s\n" configuration "WAN bytes" "vs DP" "val loss" "gap"
printf "%-32s %12s %12s %10s %9s\n" "data parallel (fp32, per step)" "$dp_bytes" "1x" "$dp" "-"
for cfg in ${CONFIGS:-"100 none 0" "100 q8 0" "100 lowbit:4+zstd 0" "100 lowbit:2+zstd 0" "100 topk:0.01+zstd 0" "50 lowbit:2+zstd 0" "20 topk:0.01+zstd 0" "100 lowbit:2+zstd 10"}; do
    set -- $cfg
    out=$("$bin" local --regions 2 "${model[@]}" --batch 8 --steps "$steps" --sync-every "$1" \
        --codec "$2" --sync-delay "$3" --json 2>/dev/null)
    v=$(val <<<"$out") w=$(wan <<<"$out")
    awk -v name="H=$1 $2 delay $3" -v w="$w" -v v="$v" -v dpb="$dp_bytes" -v dpv="$dp" \
        'BEGIN { printf "%-32s %12d %11.0fx %10.4f %8.1f%%\n", name, w, dpb / w, v, 100 * (v - dpv) / dpv }'
done
