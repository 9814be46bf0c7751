# shellcheck shell=bash
# netns: regions in network namespaces joined by a shaped WAN, for the WAN tests
# (tests/wan/shaped.sh) and the WAN benchmark (tests/bench/wan.sh). Source it; it needs root.
#
#   wan_prereqs              0, or prints "skip: <reason>" and returns 77 (the caller skips)
#   wan_setup N              N regions (1..8): namespaces cirrus-wanI-<pid>-<rand>, each with
#                            loopback up and one interface "wan" at 10.213.0.(I+1)/24, all
#                            cabled to a bridge in a namespace of their own (cirrus-wanbr-...);
#                            registers wan_teardown on EXIT (and turns INT/TERM into an exit)
#   wan_ns I                 the namespace of region I
#   wan_addr I               its WAN address (10.213.0.(I+1))
#   wan_exec I CMD...        run CMD inside region I (ip netns exec), in the foreground
#   wan_spawn I CMD...       start CMD inside region I in the background (redirections on the
#                            call apply to it); WAN_PID is its pid (CMD's own: ip execs it),
#                            also kept in WAN_PIDS for wan_stop
#   wan_stop [GRACE]         SIGTERM to every process wan_spawn started that still runs; those
#                            still there after GRACE s (default 5) are named on stderr and
#                            killed; all are reaped. Returns 1 when one had to be killed.
#   wan_shape I RATE         shape region I's egress to RATE (tc rate: 20mbit, 1gbit, ...)
#   wan_set_rate I RATE      change that rate while traffic flows (tc qdisc change)
#   wan_unshape I            remove the shaping
#   wan_link_down I / wan_link_up I   cut / restore region I's WAN cable (ip link set)
#   wan_tcp_retries I N      net.ipv4.tcp_retries2 in region I (per namespace): how many
#                            retransmissions TCP makes before it gives a connection up
#   wan_teardown             wan_stop, then end every other process left in the namespaces
#                            and delete them (the veths and qdiscs go with them); safe to call
#                            twice
#   WAN_EXIT_HOOK            a command the EXIT trap runs after wan_teardown (the caller's
#                            own cleanup: the library owns the EXIT trap)
#
# Layout: region I's "wan" is one end of a veth pair whose other end ("rI") is a port of
# bridge "br" in the bridge namespace. Each region's egress is shaped on its own "wan", so a
# link between two regions runs at RATE in each direction, and with three regions a region's
# RATE is its uplink, shared by the traffic to both others. Nothing but loopback and
# 10.213.0.0/24 inside these namespaces is touched; the host's network is left alone.
#
# The shaping is a token bucket filter (tbf): RATE, with
#   burst   = max(8 KiB, 2 ms at RATE)  (8 KiB up to 32mbit, 25 KB at 100mbit, 250 KB at
#             1gbit): the bucket
#             must hold several MTU-sized packets (veth hands tbf GSO packets, which tbf
#             splits into segments that each must fit the bucket) and, at high rates, enough
#             for the shaper's timer granularity; small enough that a transfer of more than
#             a few hundred KiB is paced at RATE (the first burst bytes pass at line speed).
#   latency = 100 ms (WAN_TBF_LATENCY): how long a packet may queue before tbf drops it, so
#             the queue is RATE x 100 ms (12 KiB at 1mbit, 1.2 MiB at 100mbit), a bottleneck
#             buffer like a WAN router's: TCP fills it, sees drops and recovers as on a real
#             link. There is no added propagation delay (no netem): round trips are the
#             queueing delay alone.

WAN_SUBNET=10.213.0
WAN_NS=()
WAN_PIDS=()
WAN_BR_NS=
WAN_SUFFIX=
WAN_TBF_LATENCY=${WAN_TBF_LATENCY:-100ms}

# Prerequisites: root, ip and tc, and that a namespace, a veth and a tbf qdisc can be made.
wan_prereqs() {
    local why=
    if [ "$(id -u)" != 0 ]; then why="needs root (network namespaces)"
    elif ! command -v ip >/dev/null || ! command -v tc >/dev/null; then why="needs ip and tc (iproute2)"
    else
        local probe="cirrus-wanprobe-$$-$RANDOM"
        if ! ip netns add "$probe" 2>/dev/null; then why="cannot create a network namespace (ip netns add)"
        else
            if ! ip -n "$probe" link add p0 type veth peer name p1 2>/dev/null; then
                why="cannot create a veth pair in a network namespace"
            elif ! ip -n "$probe" link set p0 up 2>/dev/null ||
                ! tc -n "$probe" qdisc add dev p0 root tbf rate 10mbit burst 16kb latency 100ms 2>/dev/null; then
                why="no tbf qdisc (sch_tbf) for shaping"
            elif ! ip -n "$probe" link add pb type bridge 2>/dev/null; then
                why="cannot create a bridge in a network namespace"
            fi
            ip netns del "$probe" 2>/dev/null
        fi
    fi
    [ -z "$why" ] && return 0
    echo "skip: $why"
    return 77
}

wan_ns() { echo "${WAN_NS[$1]}"; }
wan_addr() { echo "$WAN_SUBNET.$(($1 + 1))"; }
wan_exec() { local i=$1; shift; ip netns exec "${WAN_NS[$i]}" "$@"; }
wan_spawn() {
    local i=$1; shift
    ip netns exec "${WAN_NS[$i]}" "$@" &
    WAN_PID=$!
    WAN_PIDS+=("$WAN_PID")
}

wan_stop() {
    local grace=${1:-5} p t alive=() rc=0
    for p in "${WAN_PIDS[@]}"; do kill -TERM "$p" 2>/dev/null && alive+=("$p"); done
    for ((t = 0; t < grace * 10; t++)); do
        local left=()
        for p in "${alive[@]}"; do kill -0 "$p" 2>/dev/null && left+=("$p"); done
        alive=("${left[@]}")
        [ "${#alive[@]}" -eq 0 ] && break
        sleep 0.1
    done
    for p in "${alive[@]}"; do
        echo "wan: pid $p ($(tr '\0' ' ' </proc/"$p"/cmdline 2>/dev/null | cut -c1-60)) still ran ${grace} s after SIGTERM; killed" >&2
        kill -KILL "$p" 2>/dev/null
        rc=1
    done
    for p in "${WAN_PIDS[@]}"; do wait "$p" 2>/dev/null; done
    WAN_PIDS=()
    return $rc
}

# tbf's burst and latency for a rate (see the top): "burst B latency L".
wan_tbf_params() {
    local bps
    bps=$(wan_rate_bps "$1") || return 1
    local burst=$((bps / 8 / 500)) # 2 ms
    [ "$burst" -lt 8192 ] && burst=8192
    echo "burst $burst latency $WAN_TBF_LATENCY"
}

# A tc rate (500kbit, 20mbit, 1gbit, 1000000bit, ...) in bits per second.
wan_rate_bps() {
    local r=${1,,} n unit
    n=${r%%[a-z]*} unit=${r#"$n"}
    case "$unit" in
        bit|"") echo "$n" ;;
        kbit) echo $((n * 1000)) ;;
        mbit) echo $((n * 1000000)) ;;
        gbit) echo $((n * 1000000000)) ;;
        *) echo "wan: rate '$1': use bit, kbit, mbit or gbit with a whole number" >&2; return 1 ;;
    esac
}

wan_shape() {
    local p
    p=$(wan_tbf_params "$2") || return 1
    # shellcheck disable=SC2086
    tc -n "${WAN_NS[$1]}" qdisc replace dev wan root tbf rate "$2" $p
}
wan_set_rate() {
    local p
    p=$(wan_tbf_params "$2") || return 1
    # shellcheck disable=SC2086
    tc -n "${WAN_NS[$1]}" qdisc change dev wan root tbf rate "$2" $p
}
wan_unshape() { tc -n "${WAN_NS[$1]}" qdisc del dev wan root 2>/dev/null || true; }
wan_link_down() { ip -n "${WAN_NS[$1]}" link set wan down; }
wan_link_up() { ip -n "${WAN_NS[$1]}" link set wan up; }
wan_tcp_retries() { wan_exec "$1" sysctl -qw "net.ipv4.tcp_retries2=$2"; }

# Namespaces of this library whose creating shell is gone (a run killed with SIGKILL):
# their processes are ended and the namespaces deleted. The creator's pid is in the name.
wan_reap_stale() {
    local ns pid
    for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E '^cirrus-wan(br|[0-9]+)-[0-9]+-[0-9a-f]+$'); do
        pid=$(cut -d- -f3 <<<"$ns")
        kill -0 "$pid" 2>/dev/null && continue
        wan__kill_in "$ns"
        ip netns del "$ns" 2>/dev/null
    done
}

# End every process in namespace $1 (TERM, then KILL after 3 s).
wan__kill_in() {
    local pids p i
    pids=$(ip netns pids "$1" 2>/dev/null)
    [ -z "$pids" ] && return 0
    for p in $pids; do kill -TERM "$p" 2>/dev/null; done
    for i in $(seq 30); do
        pids=$(ip netns pids "$1" 2>/dev/null)
        [ -z "$pids" ] && return 0
        sleep 0.1
    done
    for p in $pids; do kill -KILL "$p" 2>/dev/null; done
    sleep 0.2
}

wan_teardown() {
    local ns
    [ "${#WAN_PIDS[@]}" -gt 0 ] && wan_stop 3 2>/dev/null
    for ns in "${WAN_NS[@]}" $WAN_BR_NS; do
        wan__kill_in "$ns"
        ip netns del "$ns" 2>/dev/null
    done
    WAN_NS=()
    WAN_BR_NS=
}

wan__on_exit() {
    local rc=$?
    wan_teardown
    [ -n "${WAN_EXIT_HOOK:-}" ] && eval "$WAN_EXIT_HOOK"
    return $rc
}

# Whether region $1 reaches address $2: a TCP connect to a closed port is refused, not lost.
wan__reachable() {
    wan_exec "$1" python3 -c '
import socket, sys
try:
    socket.create_connection((sys.argv[1], 9), timeout=0.5).close()
except ConnectionRefusedError:
    pass
except OSError:
    sys.exit(1)' "$2" 2>/dev/null
}

wan_setup() {
    local n=$1 i ns
    if [ "$n" -lt 1 ] || [ "$n" -gt 8 ]; then echo "wan_setup: 1..8 regions, not $n" >&2; return 1; fi
    trap wan__on_exit EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
    wan_reap_stale
    WAN_SUFFIX="$$-$(printf %04x $((RANDOM * 2 + RANDOM % 2)))"
    WAN_BR_NS="cirrus-wanbr-$WAN_SUFFIX"
    ip netns add "$WAN_BR_NS" || return 1
    ip -n "$WAN_BR_NS" link set lo up &&
        ip -n "$WAN_BR_NS" link add name br type bridge forward_delay 0 stp_state 0 mcast_snooping 0 &&
        ip -n "$WAN_BR_NS" link set dev br up || return 1
    for ((i = 0; i < n; i++)); do
        ns="cirrus-wan$i-$WAN_SUFFIX"
        ip netns add "$ns" || return 1
        WAN_NS[i]=$ns
        # No IPv6 on the WAN: its neighbour discovery would only add traffic to the link.
        ip netns exec "$ns" sysctl -qw net.ipv6.conf.all.disable_ipv6=1 2>/dev/null
        ip netns exec "$ns" sysctl -qw net.ipv6.conf.default.disable_ipv6=1 2>/dev/null
        ip -n "$ns" link set lo up &&
            ip -n "$ns" link add name wan type veth peer name "r$i" netns "$WAN_BR_NS" &&
            ip -n "$ns" addr add "$(wan_addr "$i")/24" dev wan &&
            ip -n "$ns" link set wan up &&
            ip -n "$WAN_BR_NS" link set "r$i" master br &&
            ip -n "$WAN_BR_NS" link set "r$i" up || return 1
    done
    # Every region reaches every other before the caller starts anything.
    for ((i = 1; i < n; i++)); do
        local t
        for t in $(seq 50); do
            wan__reachable 0 "$(wan_addr "$i")" && break
            [ "$t" = 50 ] && { echo "wan_setup: region $i unreachable from region 0" >&2; return 1; }
            sleep 0.1
        done
    done
}
