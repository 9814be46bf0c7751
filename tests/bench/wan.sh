#!/usr/bin/env bash
# Outer rounds on a shaped WAN (make bench-wan): two regions in network namespaces
# (tests/wan/netns.sh; gateway + 2 stage peers + client each, as in Kubernetes), for each
# codec the time an outer round spends on the WAN against the time its payload needs at the
# link's rate, with TLS; then the same at 1 Gbit/s with and without TLS (--wan-insecure),
# beside `openssl speed -evp aes-256-gcm` on this machine.
#   payload   the codec message one gateway sends per round (the "N-byte delta" it logs;
#             medians, like wire, over the rounds after the first)
#   wire      WAN bytes it sent per round (TLS records, frames, acks of the other direction)
#   WAN ms    per round, the shorter of the two gateways' "ms on the WAN" (from its push to
#             the new global state: its own message crossed, the other's too), median over
#             the rounds after the first; best ms: the fastest of them
#   ideal ms  payload x 8 / rate
#   round     payload bytes per second of (median) WAN time / the link's rate: the whole
#             round (encoding, both messages, their acknowledgements, decoding, the step)
#   link      payload bytes per second over the time the receiver saw the message arrive
#             (its first byte to its DONE; median) / the link's rate: how fully a sync
#             uses the link while it sends (TCP/IP and TLS headers count against it)
# Then the time to synchronise 100 MB of parameters (~25 M, --codec none) at 100 Mbit/s
# against bytes / bandwidth.
# Usage: tests/bench/wan.sh path/to/cirrus-trainer   (CIRRUS_CORPUS names the corpus)
#   WAN_BENCH_RATE (default 10mbit), WAN_BENCH_ROUNDS (default 5), WAN_BENCH_CODECS
set -u
bin=$(realpath "$1")
here=$(cd "$(dirname "$0")" && pwd)
corpus=$(realpath "${CIRRUS_CORPUS:-build/data/kjv.txt}")
# shellcheck source=tests/wan/netns.sh
. "$here/../wan/netns.sh"
wan_prereqs || exit 1
rate=${WAN_BENCH_RATE:-10mbit} rounds=${WAN_BENCH_ROUNDS:-5}
codecs=${WAN_BENCH_CODECS-none q8 lowbit:4+zstd topk:0.01}
tmp=$(mktemp -d)
WAN_EXIT_HOOK='if [ -n "${WAN_BENCH_KEEP:-}" ]; then echo "wan bench: logs in $tmp"; else rm -rf "$tmp"; fi'
wan_setup 2 || exit 1
regions="r0=$(wan_addr 0):7443,r1=$(wan_addr 1):7443"
"$bin" certs --job bench --region r0 --region r1 --out "$tmp/certs" >/dev/null || exit 1
sync=5 steps=$((5 * rounds)) client_flags=() gateway_flags=()

# run NAME CODEC TLS(1/0) MODEL...: both regions train `rounds` outer rounds; logs in $tmp/NAME.
# A run whose client failed is tried again (twice at most), its failure named on stderr.
run() {
    local attempt
    for attempt in 1 2 3; do
        run_once "$@" && return 0
        echo "wan bench: run $1 failed (attempt $attempt):" >&2
        grep -h 'bad frame magic\|no live peer\|error\|failed' "$tmp/$1"/*.err | head -n 3 | sed 's/^/    /' >&2
        rm -rf "${tmp:?}/$1"
    done
    exit 1
}
run_once() {
    local name=$1 codec=$2 tls=$3 i s serve d=$tmp/$1
    shift 3
    local model=("$@") layers
    layers=$(sed -n 's/.*--layers \([0-9]*\).*/\1/p' <<<"${model[*]}")
    mkdir -p "$d"
    local clients=()
    for i in 0 1; do
        local sec=(--tls-dir "$tmp/certs/r$i")
        [ "$tls" = 0 ] && sec=(--wan-insecure)
        wan_spawn "$i" "$bin" gateway --job bench --listen 127.0.0.1:7400 --http-port -1 \
            --stages 2 "${model[@]}" --region "r$i" --regions "$regions" --sync-every "$sync" \
            --rebalance-period-s 0 --codec "$codec" "${sec[@]}" "${gateway_flags[@]}" \
            2>"$d/gw$i.err"
        for s in 0 1; do
            serve=$([ "$s" = 0 ] && echo 0:1 || echo "1:$layers")
            OMP_NUM_THREADS=1 wan_spawn "$i" "$bin" stage --serve "$serve" "${model[@]}" \
                --batch 4 --job bench --listen 127.0.0.1:0 --coordinator 127.0.0.1:7400 \
                --stage-index "$s" 2>"$d/s$i$s.err"
        done
        OMP_NUM_THREADS=1 wan_spawn "$i" "$bin" client --job bench --coordinator 127.0.0.1:7400 \
            "${model[@]}" --batch 4 --steps "$steps" --sync-every "$sync" --data "$corpus" \
            --eval-batches 1 --log-every "$steps" --json "${client_flags[@]}" >"$d/c$i.out" \
            2>"$d/c$i.err"
        clients+=("$WAN_PID")
    done
    local ok=1
    for i in 0 1; do
        timeout 600 tail --pid="${clients[i]}" -f /dev/null && wait "${clients[i]}" || ok=0
    done
    wan_stop 5 2>/dev/null
    [ "$ok" = 1 ]
}

# One table row from a run's gateway logs.
row() {
    python3 - "$tmp/$1" "$2" "$3" "$4" "$5" <<'PY'
import re, statistics, sys
d, codec, rate, tls, bps = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
pat = re.compile(r"outer round (\d+) done in [0-9.]+ s \((\d+) ms on the WAN\).*?(\d+)-byte delta, "
                 r"WAN bytes (\d+) sent")
sent = re.compile(r"outer round (\d+): (\d+)-byte message to region \S+ in ([0-9.]+) s")
logs, link = [], []
for g in (0, 1):
    lines = open(f"{d}/gw{g}.err").read().splitlines()
    logs.append({int(m[1]): (int(m[2]), int(m[3]), int(m[4])) for m in map(pat.search, lines) if m})
    link += [int(m[2]) / float(m[3]) for m in map(sent.search, lines) if m and int(m[1]) > 1]
ks = sorted(set(logs[0]) & set(logs[1]))
later = [k for k in ks if k > 1] or ks
per_round = [min(logs[0][k][0], logs[1][k][0]) for k in later]
ms, best = statistics.median(per_round), min(per_round)
payload = statistics.median(logs[0][k][1] for k in later)
wire = statistics.median(logs[0][k][2] - logs[0][k - 1][2] for k in later if k - 1 in logs[0])
ideal = payload * 8 / bps * 1000
good = payload / (ms / 1000) / (bps / 8) if ms > 0 else float("inf")
on_link = statistics.median(link) / (bps / 8) if link else float("nan")
print(f"{codec:<16} {rate:>7} {tls:>4} {payload:>10.0f} {wire:>10.0f} {ms:>7.0f} {best:>7.0f} "
      f"{ideal:>8.1f} {good:>6.2f} {on_link:>6.2f}")
PY
}

header() {
    printf "%-16s %7s %4s %10s %10s %7s %7s %8s %6s %6s\n" codec link TLS "payload B" "wire B" \
        "WAN ms" "best ms" "ideal ms" round link
}

bps=$(wan_rate_bps "$rate")
small=(--layers 2 --width 192 --heads 4 --context 32)
echo "cirrus: machine: $(nproc) CPUs, $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)"
echo "cirrus: two regions, model ${small[*]} (~0.95 M parameters), $rounds outer rounds of $sync steps"
echo "cirrus: link $rate each way (tbf: $(wan_tbf_params "$rate")), TLS 1.3"
for i in 0 1; do wan_shape "$i" "$rate"; done
header
for codec in $codecs; do
    run "shaped-$codec" "$codec" 1 "${small[@]}"
    row "shaped-$codec" "$codec" "$rate" yes "$bps"
done

# 1 Gbit/s: a bigger model (~5 M parameters, 20 MB per round with --codec none), so that a
# round is not over before TCP opens its window.
big=(--layers 4 --width 320 --heads 8 --context 32)
echo
echo "cirrus: link 1gbit each way (tbf: $(wan_tbf_params 1gbit)), model ${big[*]} (~5 M parameters)"
for i in 0 1; do wan_shape "$i" 1gbit; done
header
for codec in none q8; do
    for tls in 1 0; do
        run "fast-$codec-$tls" "$codec" "$tls" "${big[@]}"
        row "fast-$codec-$tls" "$codec" 1gbit "$([ "$tls" = 1 ] && echo yes || echo no)" 1000000000
    done
done

# Overlap: training goes on while a sync crosses the WAN (--sync-delay). The link's rate is
# chosen so that one q8 message needs 80% of the window of H = 50 inner steps (measured
# first, without syncs); the time a step takes then, with the regions syncing every 50 steps
# and merging the result once in from 25 steps later on (--sync-delay 25), against without
# syncs; the same with the parameters in 4 fragments synchronised at staggered times
# (--fragments 4, Streaming DiLoCo: each fragment's quarter of the bytes has the whole
# window); with blocking syncs (--sync-delay 0); and syncing over an unshaped link (what
# syncing costs besides the link: gathering and installing parameters, the gateways' work,
# the faster region waiting for the slower). Eight processes share this machine's cores, so
# one run's step time varies by several percent: each configuration but the blocking one
# runs WAN_BENCH_OVERLAP_REPS times (default 3), interleaved, and the ratios are medians of
# each repetition's ratio to the run without syncs beside it. A step's time from the
# client's per-step tokens/s, averaged over the steady state: from the first sync's step to
# the step before the last (the run's last step always waits for its sync, whatever the
# delay: the run ends with the global model). Stalls: the time steps took beyond 3x the
# median step (a client waiting for a sync), as a share of all the steps' time; what is left
# of the slowdown is every step being slower (the gateway, the clients' gathering and
# installing, and the shaped link's emulation all share the training's cores here).
step_s() { python3 -c 'import json, sys
lo, hi = 50, int(sys.argv[1]) - 1
v = [json.loads(l) for f in sys.argv[2:] for l in open(f) if l.startswith("{\"step\"") and "final" not in l]
t = [4 * 32 / o["tokens_per_s"] for o in v if lo <= o["step"] < hi]
print(sum(t) / len(t))' "$steps" "$tmp/$1/c0.out" "$tmp/$1/c1.out"; }
stall_share() { python3 -c 'import json, statistics, sys
lo, hi, out = 50, int(sys.argv[1]) - 1, []
for f in sys.argv[2:]:
    v = [json.loads(l) for l in open(f) if l.startswith("{\"step\"") and "final" not in l]
    t = [4 * 32 / o["tokens_per_s"] for o in v if lo <= o["step"] < hi]
    m = statistics.median(t)
    out.append(sum(x - m for x in t if x > 3 * m) / sum(t))
print(sum(out) / len(out))' "$steps" "$tmp/$1/c0.out" "$tmp/$1/c1.out"; }
echo
sync=0 steps=400 client_flags=(--log-every 1)
for i in 0 1; do wan_unshape "$i"; done
run overlap-none-1 q8 1 "${small[@]}"
base=$(step_s overlap-none-1)
msg=$(python3 -c "import math; n=$("$bin" train "${small[@]}" --steps 1 2>/dev/null | sed -n 's/.* \([0-9]*\) params).*/\1/p'); print(math.ceil(n / 64) * 68)")
# The bytes on the wire: TCP/IP and TLS headers add ~6% to a message at MTU 1500.
orate=$(python3 -c "print(int($msg * 1.06 * 8 / (0.8 * 50 * $base)))")
echo "cirrus: overlap: ${small[*]}, $steps steps; without syncs $(python3 -c "print(f'{$base * 1000:.1f}')") ms a step;" \
    "a $msg-byte q8 message, link ${orate} bit/s (80% of a 50-step window)"
reps=${WAN_BENCH_OVERLAP_REPS:-3}
for rep in $(seq 1 "$reps"); do
    if [ "$rep" -gt 1 ]; then
        sync=0 client_flags=(--log-every 1)
        for i in 0 1; do wan_unshape "$i"; done
        run "overlap-none-$rep" q8 1 "${small[@]}"
    fi
    sync=50 client_flags=(--log-every 1 --sync-delay 25)
    run "overlap-fast-$rep" q8 1 "${small[@]}"
    for i in 0 1; do wan_shape "$i" "${orate}bit"; done
    run "overlap-delay-$rep" q8 1 "${small[@]}"
    gateway_flags=(--fragments 4)
    run "overlap-frag-$rep" q8 1 "${small[@]}"
    gateway_flags=()
    if [ "$rep" = 1 ]; then
        client_flags=(--log-every 1)
        run overlap-block q8 1 "${small[@]}"
    fi
done
python3 - "$reps" "$(step_s overlap-block)" $(for rep in $(seq 1 "$reps"); do
    for k in none delay frag fast; do step_s "overlap-$k-$rep"; done
    for k in delay frag; do stall_share "overlap-$k-$rep"; done; done) <<'PY'
import statistics, sys
reps, block = int(sys.argv[1]), float(sys.argv[2])
v = [float(x) for x in sys.argv[3:]]
keys = ("none", "delay", "frag", "fast", "delay_stall", "frag_stall")
runs = [dict(zip(keys, v[6 * r:6 * r + 6])) for r in range(reps)]
def med(k): return statistics.median(r[k] / r["none"] - 1 for r in runs)
def each(k): return ", ".join(f"{r[k] / r['none'] - 1:+.1%}" for r in runs)
base = statistics.median(r["none"] for r in runs)
print(f"cirrus: overlap ({reps} repetitions; medians of each one's ratio): without syncs {base * 1000:.2f} ms a step; "
      f"--sync-delay 25 {med('delay'):+.1%} ({each('delay')}); with --fragments 4 too {med('frag'):+.1%} "
      f"({each('frag')}; goal <= +5%); blocking syncs {block / runs[0]['none'] - 1:+.1%}; "
      f"--sync-delay 25 on an unshaped link {med('fast'):+.1%} ({each('fast')})")
stalls = lambda k: ", ".join(f"{r[k]:.1%}" for r in runs)
print(f"cirrus: overlap: share of the step time spent stalled on a sync: --sync-delay 25 "
      f"{stalls('delay_stall')}; with --fragments 4 {stalls('frag_stall')}")
PY

# 100 MB of parameters (--codec none: 4 bytes each) at 100 Mbit/s, over TLS: ideal 8 s a
# round, both directions at once. The round's WAN time against it (goal <= 1.15x).
huge=(--layers 8 --width 512 --heads 8 --context 16)
echo
echo "cirrus: link 100mbit each way (tbf: $(wan_tbf_params 100mbit)), model ${huge[*]} (~25 M parameters, ~100 MB a message)"
for i in 0 1; do wan_shape "$i" 100mbit; done
header
sync=2 steps=10 client_flags=()
run "hundred-mb" none 1 "${huge[@]}"
row "hundred-mb" none 100mbit yes 100000000 | tee "$tmp/hundred.row"
read -r _ _ _ payload _ ms best ideal _ <"$tmp/hundred.row"
awk -v p="$payload" -v ms="$ms" -v best="$best" -v ideal="$ideal" 'BEGIN {
    printf "cirrus: %.1f MB synchronised in %.2f s (median of 4 rounds; best %.2f s) at 100 Mbit/s: " \
        "%.3fx bytes / bandwidth (%.2f s; best %.3fx)\n", p / 1e6, ms / 1000, best / 1000, ms / ideal,
        ideal / 1000, best / ideal }'

echo
echo "cirrus: openssl speed -evp aes-256-gcm (one core; TLS 1.3's cipher between the gateways)"
openssl speed -seconds 3 -evp aes-256-gcm 2>/dev/null | tail -3
