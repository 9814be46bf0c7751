/* wan_link_internal: what the two sides of a lane's WAN connections share (wan_link.c:
 * the sending side and these helpers; wan_accept.c: the receiving side). */
#ifndef CIRRUS_WAN_LINK_INTERNAL_H
#define CIRRUS_WAN_LINK_INTERNAL_H

#include "outer_internal.h"
#include "wan_msg.h"

#define WAN_IO_TIMEOUT_MS 30000   /* a frame that started must finish in this time */
#define WAN_HANDSHAKE_MS 10000    /* TLS + HELLO + JOIN, all of it */
/* One TCP connect attempt: a SYN lost on a cut link is retried by the send loop (with its
 * backoff) rather than waited for, so that a stopping gateway is never held by one. */
#define WAN_CONNECT_MS 2000
#define WAN_POLL_MS 100
/* Who may hold the receivers. The WAN port faces the internet: connections still in their
 * handshake (not yet authenticated) get at most WAN_MAX_HANDSHAKES slots, at most
 * WAN_HANDSHAKES_PER_ADDR from one address, so idle or slow connections cannot take the
 * slots the regions' gateways need; a region's gateway holds at most
 * WAN_RECEIVERS_PER_REGION (its connection and one it left behind when it reconnected:
 * a newer JOIN shuts the oldest down). */
#define WAN_MAX_HANDSHAKES 16
#define WAN_HANDSHAKES_PER_ADDR 4
#define WAN_RECEIVERS_PER_REGION 2
/* ... per lane: a connection serves one fragment. */
#define WAN_MAX_RECEIVERS(lanes) \
    (WAN_MAX_HANDSHAKES + WAN_RECEIVERS_PER_REGION * WAN_MAX_REGIONS * (lanes))

/* Bytes this connection moved since last counted, added to the lane's and the group's
 * totals. Under mu. */
void wan_count_bytes(outer_lane *os, net_conn *c, uint64_t *seen_sent, uint64_t *seen_recv);
/* This lane's JOIN (its region, fragment, round and digest). */
wan_join wan_my_join(outer_lane *os);
/* The other end's JOIN must fit this job's layout: the region it names at the index it
 * names, (with TLS, cert_region non-NULL) the region its certificate names, the same
 * fragments and the same model. */
int wan_check_join(outer_lane *os, const wan_join *j, const char *cert_region,
                   cirrus_error *err);
/* TCP keepalive on a WAN connection (see wan_link.c). */
void wan_keep_alive(net_conn *c);
/* When the latest bytes on TCP socket fd reached the kernel, on net_now_ms's clock (see
 * wan_accept.c); now for a socket TCP_INFO does not answer for. */
int64_t wan_last_arrival_ms(int fd);
/* What region j said of its latest round (JOIN): it is back. */
void wan_note_round(outer_lane *os, int j, uint64_t round);

#endif
