/* pacer: a rate limit on what connections send, shared by several of them (a gateway's WAN
 * uplink: `--wan-mbit`).
 *
 * A token bucket in bytes: a send takes up to a chunk (5 ms of the rate, 1,448 bytes to
 * 64 KiB) and, when that leaves the bucket in debt, first sleeps until the debt is paid, so
 * what all the pacer's connections put on their sockets together never runs ahead of the
 * rate by more than the bucket (10 ms of the rate, at least 16 KiB: about what a shaped
 * link's queue lets through at once). It paces the TCP
 * transport (net_conn_set_pacer): the bytes counted are the socket's, TLS records and
 * handshakes included, as a shaped link counts them. Thread-safe.
 *
 * Why not the kernel's SO_MAX_PACING_RATE: it is per socket, not per gateway, and on a
 * loopback with 64 KiB segments it overshot a 2 Mbit/s rate by a fifth when tried here.
 */
#ifndef CIRRUS_PACER_H
#define CIRRUS_PACER_H

#include <stddef.h>

typedef struct net_pacer net_pacer;

/* NULL when out of memory or bytes_per_s <= 0. */
net_pacer *net_pacer_new(double bytes_per_s);
void net_pacer_free(net_pacer *p);
double net_pacer_rate(const net_pacer *p);
/* How many of want bytes may go now (> 0 when want > 0), after sleeping as long as the
 * bucket's debt needs. */
size_t net_pacer_take(net_pacer *p, size_t want);
/* Give back what was taken and not sent (a short or failed write). */
void net_pacer_refund(net_pacer *p, size_t bytes);

#endif
