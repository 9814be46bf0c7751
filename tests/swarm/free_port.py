"""Print a free TCP port on 127.0.0.1 below the kernel's ephemeral range.

A port the kernel hands out for bind(0) lies inside that range, and between this script
releasing it and the process under test binding it, any outgoing connection may take it.
Below the range only an explicit bind can."""
import random
import socket

try:
    low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
except (OSError, ValueError, IndexError):
    low = 32768
low = max(low, 12000)
for _ in range(200):
    port = random.randrange(10000, low)
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            continue
    print(port)
    break
else:
    raise SystemExit("no free port below the ephemeral range")
