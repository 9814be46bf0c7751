#!/usr/bin/env bash
# The bytes/quality table of the outer steps (make bench-wan-quality): two regions, each on
# its shard of the data with half the batch, against data parallel over the same tokens (one
# run with the whole batch), for codec x H x outer learning rate x what is synchronised.
# Prints, per configuration, the WAN bytes (one gateway's, both directions, TLS included),
# the reduction against per-step fp32 data parallel (each region sending and receiving a
# 4-byte gradient per parameter every step), and the validation loss and its gap, as the mean
# over SEEDS (the same seeds for data parallel: seed-to-seed differences of data parallel
# itself are about 1%, as large as the gaps measured) and the largest gap of one seed against
# data parallel of the same seed.
# Usage: wan_quality.sh TRAINER [STEPS]   (CIRRUS_CORPUS names the corpus)
#   SEEDS (default "1337 7 99"), CONFIGS ("H codec outer-lr sync-params delay [fragments];...")
set -u
bin=$1 steps=${2:-3000}
seeds=(${SEEDS:-1337 7 99})
model=(--stages 2 --layers 2 --width 64 --heads 4 --context 64 --eval-batches 32 --lr 3e-3)
n=$("$bin" train "${model[@]:2}" --steps 1 2>/dev/null | sed -n 's/.* \([0-9]*\) params).*/\1/p')
dp_bytes=$((steps * 8 * n))
val() { grep '"final":true' | grep -v '"region":"r1"' | sed -n 's/.*"val_loss":\([0-9.]*\).*/\1/p'; }
wan() { grep '"final":true' | grep '"region":"r0"' | sed -n 's/.*"wan_bytes":\([0-9]*\).*/\1/p'; }
echo "machine: $(nproc) CPUs, $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)"
echo "model: 2 layers x 64, context 64, ${n} parameters; ${steps} steps; data parallel: batch 16"
echo "two regions: batch 8 each (equal tokens); TLS between the gateways; seeds ${seeds[*]}"
declare -A dp
for s in "${seeds[@]}"; do
    dp[$s]=$("$bin" local "${model[@]}" --batch 16 --steps "$steps" --seed "$s" --json 2>/dev/null | val)
done
# row NAME BYTES VALUES...: the mean gap and the worst paired one (values in seed order).
row() {
    local name=$1 bytes=$2
    shift 2
    python3 - "$name" "$bytes" "$dp_bytes" "${#seeds[@]}" "$@" \
        $(for s in "${seeds[@]}"; do echo "${dp[$s]}"; done) <<'PY'
import sys
name, b, dpb, k = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
v = [float(x) for x in sys.argv[5:5 + k]]
d = [float(x) for x in sys.argv[5 + k:5 + 2 * k]]
mv, md = sum(v) / k, sum(d) / k
worst = max((a - c) / c for a, c in zip(v, d))
print(f"{name:<40} {b:>13,} {dpb / b:>9,.0f}x {mv:>9.4f} {100 * (mv - md) / md:>+7.2f}% {100 * worst:>+8.2f}%")
PY
}
printf "%-40s %13s %10s %9s %8s %9s\n" configuration "WAN bytes" "vs DP" "val loss" "gap" "worst"
row "data parallel (fp32, per step)" "$dp_bytes" $(for s in "${seeds[@]}"; do echo "${dp[$s]}"; done)
default="100 none 0.7 all 0;50 none 0.7 all 0;100 q8 0.7 all 0;100 lowbit:4+zstd 0.7 all 0"
default+=";100 lowbit:2+zstd 0.7 all 0;50 lowbit:2+zstd 0.7 all 0;50 lowbit:2+zstd 0.5 all 0"
default+=";50 lowbit:2+zstd 0.5 no-embed 0;100 lowbit:2+zstd 0.5 no-embed 0"
default+=";50 lowbit:2+zstd 0.5 no-embed 10;50 lowbit:2+zstd 0.5 no-embed 10 4"
default+=";100 topk:0.01+zstd 0.7 all 0"
IFS=';' read -ra configs <<<"${CONFIGS:-$default}"
for cfg in "${configs[@]}"; do
    set -- $cfg
    vals=() w=
    for s in "${seeds[@]}"; do
        out=$("$bin" local --regions 2 "${model[@]}" --batch 8 --steps "$steps" --seed "$s" \
            --sync-every "$1" --codec "$2" --outer-lr "$3" --sync-params "$4" --sync-delay "$5" \
            --fragments "${6:-1}" --json 2>/dev/null)
        vals+=("$(val <<<"$out")")
        w=${w:-$(wan <<<"$out")}
    done
    row "H=$1 $2 lr $3 $4$([ "$5" != 0 ] && echo " delay $5")$([ "${6:-1}" != 1 ] && echo " frag $6")" \
        "$w" "${vals[@]}"
done
