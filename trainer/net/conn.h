/* conn: a connection that carries wire frames, with deadlines.
 *
 * A connection is a transport (a vtable: read, write, close) plus the framing on top, so
 * TLS (net/tls.h) layers in without any caller changing (the way redis and gloo layer it):
 * the TCP transport moves and counts the socket's bytes, and a transport above it takes
 * the connection over with net_conn_set_transport. Every call takes a deadline in
 * milliseconds; a call that cannot finish in time returns CIRRUS_ETIMEDOUT and the
 * connection should be dropped. Sockets are
 * non-blocking, waited on with poll(); TCP_NODELAY is set (frames are latency-bound).
 */
#ifndef CIRRUS_CONN_H
#define CIRRUS_CONN_H

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "../../common/cerr.h"
#include "wire.h"

typedef struct net_conn net_conn;

typedef struct net_transport {
    const char *name;
    /* Like read(2)/write(2) on a non-blocking fd: > 0 bytes, 0 at EOF (read), or -1 with
     * errno (EAGAIN when it would block). */
    long (*read)(net_conn *c, void *buf, size_t n);
    long (*writev)(net_conn *c, const struct iovec *iov, int iovcnt);
    void (*close)(net_conn *c);
    /* Optional (NULL: never). Non-zero when read may return bytes without the socket being
     * readable (TLS: records already read and buffered): waits for readability are skipped
     * then, so buffered data is never left to sit until a deadline. */
    int (*pending)(const net_conn *c);
    /* Optional (NULL: errno says it all). A one-line reason for the last failed read or
     * writev (TLS: OpenSSL's error), used in the messages of failed receives. */
    const char *(*last_error)(const net_conn *c);
} net_transport;

/* The plain TCP transport every connection starts with. Its read and writev count the
 * bytes moved on the socket (net_conn_bytes), so a transport layered above it (TLS) calls
 * them for its socket I/O and the counters include its records and handshake. */
extern const net_transport net_tcp_transport;
/* For a transport taking over a connection: the current transport and its state, and the
 * swap (the old transport's state is the new one's to keep, e.g. as its lower layer). */
const net_transport *net_conn_transport(const net_conn *c);
void *net_conn_transport_state(const net_conn *c);
void net_conn_set_transport(net_conn *c, const net_transport *tp, void *state);

/* Whether a receive on c can make progress with the socket not readable (its transport
 * holds bytes already read: TLS records). A caller that polls net_fd(c) before receiving
 * must skip the poll then, or those bytes wait for the next packet (or forever). */
int net_pending(const net_conn *c);

/* Milliseconds on the monotonic clock (clock_now_ms): the base of every deadline here. */
int64_t net_now_ms(void);
/* Wait until fd is ready for events (POLLIN/POLLOUT) or the absolute deadline (net_now_ms
 * based; -1: none) passes: 0, CIRRUS_ETIMEDOUT or CIRRUS_EIO. Readiness includes errors and
 * hang-ups: the call that follows reports them. For transports driving their own I/O. */
int net_wait_fd(int fd, short events, int64_t deadline);

/* Pace what the TCP transport sends on c (p shared with other connections, borrowed: it
 * must outlive c; NULL: unpaced). TLS above it is paced too: it writes through it. */
typedef struct net_pacer net_pacer;
void net_conn_set_pacer(net_conn *c, net_pacer *p);

/* Bytes this connection moved on the socket so far (for TLS: records and handshake
 * included): the WAN byte counters. Safe to call from another thread while it is used. */
void net_conn_bytes(const net_conn *c, uint64_t *sent, uint64_t *received);

/* Split "host:port" (the last ':' separates; port 1..65535, or 0 when allow_zero) into
 * host (NUL-terminated, fits host_size) and *port. CIRRUS_EINVAL with a message otherwise. */
int net_split_hostport(const char *addr, char *host, size_t host_size, int *port,
                       int allow_zero, cirrus_error *err);

/* Listen on host:port (port 0 picks a free one, reported in *bound_port). */
int net_listen(const char *host, int port, int *listen_fd, int *bound_port, cirrus_error *err);
/* Accept one connection within timeout_ms (-1: wait forever). */
int net_accept(int listen_fd, int timeout_ms, net_conn **out, cirrus_error *err);
int net_connect(const char *host, int port, int timeout_ms, net_conn **out, cirrus_error *err);
void net_close(net_conn *c);
int net_fd(const net_conn *c);
/* "host:port" of the other end, for logs. */
const char *net_peer_name(const net_conn *c);

/* Largest payload this connection accepts (default 64 MiB, at most WIRE_MAX_PAYLOAD). */
void net_set_max_payload(net_conn *c, uint32_t max_payload);

/* Send one frame whose payload is the concatenation of iov[0..iovcnt). */
int net_send_framev(net_conn *c, uint16_t type, uint64_t request_id, const struct iovec *iov,
                    int iovcnt, int timeout_ms);
int net_send_frame(net_conn *c, uint16_t type, uint64_t request_id, const void *payload,
                   uint32_t len, int timeout_ms);
/* Receive one frame. The payload lands in a buffer owned by the connection, valid until
 * the next receive; *payload may be NULL when payload_len is 0. Protocol errors return
 * CIRRUS_ECORRUPT with a message naming what was wrong. */
int net_recv_frame(net_conn *c, wire_header *h, const uint8_t **payload, int timeout_ms,
                   cirrus_error *err);

/* Receive one frame whose payload is exactly len bytes, straight into buf: for bulk
 * transfers whose sizes both ends know (the ring all-reduce's chunks), sparing the copy out
 * of the connection's buffer and waking only once the whole frame has arrived. A frame of
 * any other length is CIRRUS_ECORRUPT; every check of net_recv_frame applies. The caller
 * checks type and request id; buf holds the payload only when the call returns 0. */
int net_recv_frame_into(net_conn *c, wire_header *h, void *buf, uint32_t len, int timeout_ms,
                        cirrus_error *err);

/* Whether both ends of the connection are on this host (loopback, or our own address). */
int net_same_host(const net_conn *c);

/* Handshake: the connecting side sends HELLO(role, peer_id, job_id) and waits for
 * HELLO_OK; the accepting side checks the job id and answers, or fails with a message. */
int net_hello_client(net_conn *c, const char *job_id, uint16_t role, uint32_t peer_id,
                     int timeout_ms, cirrus_error *err);
int net_hello_server(net_conn *c, const char *job_id, uint16_t *role, uint32_t *peer_id,
                     int timeout_ms, cirrus_error *err);

#endif
