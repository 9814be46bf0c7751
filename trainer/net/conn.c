#include "conn.h"

#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "../../common/clock.h"
#include "pacer.h"

#define XXH_STATIC_LINKING_ONLY
/* Inlined, XXH3 is compiled for this CPU (-march) rather than the shared library's generic
 * build: 1.5-3x as fast, which a CPU-bound bulk transfer (the ring all-reduce) feels. */
#define XXH_INLINE_ALL
#include <xxhash.h>

#define NET_DEFAULT_MAX_PAYLOAD (64u << 20)
#define NET_IOV_WINDOW 64 /* iovecs per writev call, well under IOV_MAX */
#define NET_LISTEN_BACKLOG 128

struct net_conn {
    const net_transport *tp;
    void *tp_state; /* the transport's own (TLS: its session); NULL for TCP */
    uint64_t sent, received; /* socket bytes, counted by the TCP transport (relaxed atomics) */
    int fd;
    uint32_t max_payload;
    uint8_t *rx; /* payload of the last frame received; rx_cap <= max_payload */
    size_t rx_cap;
    int lowat;     /* the socket's SO_RCVLOWAT: 1 but during net_recv_frame_into */
    int lowat_cap; /* the kernel's cap on it, once a mark was capped; INT_MAX before */
    char peer[64]; /* "ip:port", or "[ip6]:port" */
    net_pacer *pacer; /* NULL: unpaced; borrowed */
};

/* ---- the plain TCP transport ---- */

/* Each counter has one writer (the thread reading, the thread writing), so a relaxed load
 * and store suffice: no locked add per syscall, and a metrics reader never sees a torn
 * value. */
static void count_bytes(uint64_t *counter, long n)
{
    if (n > 0)
        __atomic_store_n(counter, __atomic_load_n(counter, __ATOMIC_RELAXED) + (uint64_t)n,
                         __ATOMIC_RELAXED);
}

static long tcp_read(net_conn *c, void *buf, size_t n)
{
    long r = recv(c->fd, buf, n, 0);
    count_bytes(&c->received, r);
    return r;
}

/* sendmsg rather than writev for MSG_NOSIGNAL: a peer that vanished is an EPIPE for this
 * connection, not a SIGPIPE that kills the whole process. */
static long tcp_writev(net_conn *c, const struct iovec *iov, int iovcnt)
{
    struct msghdr m = {.msg_iov = (struct iovec *)iov, .msg_iovlen = (size_t)iovcnt};
    struct iovec paced[16];
    size_t grant = 0;
    if (c->pacer && iovcnt > 0) {
        /* What the pacer grants, from the front of iov (a short write, as the kernel's). */
        size_t want = 0;
        int k = 0;
        for (; k < iovcnt && k < 16; k++) want += iov[k].iov_len;
        grant = net_pacer_take(c->pacer, want);
        size_t left = grant;
        int n = 0;
        for (; n < k && left; n++) {
            paced[n] = iov[n];
            if (paced[n].iov_len > left) paced[n].iov_len = left;
            left -= paced[n].iov_len;
        }
        m.msg_iov = paced;
        m.msg_iovlen = (size_t)n;
    }
    long w = sendmsg(c->fd, &m, MSG_NOSIGNAL);
    count_bytes(&c->sent, w);
    if (c->pacer) net_pacer_refund(c->pacer, grant - (w > 0 ? (size_t)w : 0));
    return w;
}

void net_conn_set_pacer(net_conn *c, net_pacer *p) { c->pacer = p; }

static void tcp_close(net_conn *c)
{
    close(c->fd);
}

const net_transport net_tcp_transport = {
    .name = "tcp", .read = tcp_read, .writev = tcp_writev, .close = tcp_close};

const net_transport *net_conn_transport(const net_conn *c) { return c->tp; }
void *net_conn_transport_state(const net_conn *c) { return c->tp_state; }

void net_conn_set_transport(net_conn *c, const net_transport *tp, void *state)
{
    c->tp = tp;
    c->tp_state = state;
}

int net_pending(const net_conn *c) { return c->tp->pending && c->tp->pending(c); }

void net_conn_bytes(const net_conn *c, uint64_t *sent, uint64_t *received)
{
    if (sent) *sent = __atomic_load_n(&c->sent, __ATOMIC_RELAXED);
    if (received) *received = __atomic_load_n(&c->received, __ATOMIC_RELAXED);
}

/* ---- deadlines: one absolute deadline per call, so a peer that trickles one byte at a
 * time cannot stretch a call past its timeout ---- */

int64_t net_now_ms(void)
{
    return clock_now_ms();
}

/* -1 means no deadline. */
static int64_t deadline_after(int timeout_ms)
{
    return timeout_ms < 0 ? -1 : net_now_ms() + timeout_ms;
}

/* Wait until fd is ready for events or the deadline passes. Readiness includes errors and
 * hang-ups: the syscall that follows reports them. */
int net_wait_fd(int fd, short events, int64_t deadline)
{
    for (;;) {
        int left = -1;
        if (deadline >= 0) {
            int64_t d = deadline - net_now_ms();
            if (d <= 0) return CIRRUS_ETIMEDOUT;
            left = d > INT_MAX ? INT_MAX : (int)d;
        }
        struct pollfd p = {.fd = fd, .events = events};
        int n = poll(&p, 1, left);
        if (n > 0) return 0;
        if (n < 0 && errno != EINTR) return CIRRUS_EIO;
    }
}

/* Set the socket's receive low-water mark: poll() then reports it readable only once `bytes`
 * are queued (or the link failed or closed, whatever the mark). The kernel caps the mark
 * (Linux: at half of tcp_rmem's maximum); a frame above the cap gets no mark at all, as
 * every wait would end part-way through it. Returns the mark now in force. */
static int set_lowat(net_conn *c, int bytes)
{
    if (bytes > c->lowat_cap) bytes = 1;
    if (bytes == c->lowat) return bytes;
    int got = 0;
    socklen_t len = sizeof got;
    if (setsockopt(c->fd, SOL_SOCKET, SO_RCVLOWAT, &bytes, sizeof bytes) != 0 ||
        getsockopt(c->fd, SOL_SOCKET, SO_RCVLOWAT, &got, &len) != 0)
        got = 0;
    if (got < bytes) {
        c->lowat_cap = got > 1 ? got : 1;
        int one = 1;
        setsockopt(c->fd, SOL_SOCKET, SO_RCVLOWAT, &one, sizeof one);
        got = 1;
    }
    c->lowat = got;
    return got;
}

/* Read exactly n bytes, adding each one to *got so the caller can tell a close at a frame
 * boundary from one mid-frame. A reset counts as the peer closing. */
static int read_full(net_conn *c, uint8_t *buf, size_t n, int64_t deadline, size_t *got)
{
    size_t off = 0;
    while (off < n) {
        long r = c->tp->read(c, buf + off, n - off);
        if (r > 0) {
            off += (size_t)r;
            *got += (size_t)r;
        } else if (r == 0) {
            errno = 0;
            return CIRRUS_ECLOSED;
        } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
            /* Woken before the whole frame the mark asked for was in (the kernel may do so
             * under memory pressure): the mark could now ask for more than the frame still
             * owes, so wait for single bytes for the rest of it. */
            set_lowat(c, 1);
            int rc = net_wait_fd(c->fd, POLLIN, deadline);
            if (rc) return rc;
        } else if (errno != EINTR) {
            return errno == ECONNRESET ? CIRRUS_ECLOSED : CIRRUS_EIO;
        }
    }
    return 0;
}

/* Write head then all of iov, resuming after partial writes and never modifying the
 * caller's iovecs; at most NET_IOV_WINDOW of them go to one writev call. */
static int write_all(net_conn *c, struct iovec head, const struct iovec *iov, int iovcnt,
                     int64_t deadline)
{
#define IOV_AT(j) ((j) < 0 ? &head : &iov[j])
    int i = -1;     /* the iovec being sent; -1 is head */
    size_t off = 0; /* bytes of it already sent */
    for (;;) {
        struct iovec win[NET_IOV_WINDOW];
        int n = 0;
        for (int j = i; j < iovcnt && n < NET_IOV_WINDOW; j++) {
            size_t skip = j == i ? off : 0;
            if (IOV_AT(j)->iov_len == skip) continue;
            win[n].iov_base = (uint8_t *)IOV_AT(j)->iov_base + skip;
            win[n++].iov_len = IOV_AT(j)->iov_len - skip;
        }
        if (n == 0) return 0;
        long w = c->tp->writev(c, win, n);
        if (w <= 0) {
            /* 0 is "no progress" from a transport (a TLS one may say so): wait like EAGAIN. */
            if (w == 0 || errno == EAGAIN || errno == EWOULDBLOCK) {
                int rc = net_wait_fd(c->fd, POLLOUT, deadline);
                if (rc) return rc;
            } else if (errno != EINTR) {
                return errno == EPIPE || errno == ECONNRESET ? CIRRUS_ECLOSED : CIRRUS_EIO;
            }
            continue;
        }
        size_t left = (size_t)w;
        for (; i < iovcnt && left >= IOV_AT(i)->iov_len - off; i++, off = 0)
            left -= IOV_AT(i)->iov_len - off;
        off += left; /* 0 once everything is sent */
    }
#undef IOV_AT
}

/* ---- connections ---- */

/* "ip:port" ("[ip6]:port") of an IPv4 or IPv6 address; returns the port. */
static int sockaddr_name(const struct sockaddr_storage *sa, char *out, size_t size)
{
    const struct sockaddr_in *s4 = (const void *)sa;
    const struct sockaddr_in6 *s6 = (const void *)sa;
    int v6 = sa->ss_family == AF_INET6;
    char ip[INET6_ADDRSTRLEN] = "?";
    inet_ntop(sa->ss_family, v6 ? (const void *)&s6->sin6_addr : (const void *)&s4->sin_addr,
              ip, sizeof ip);
    int port = ntohs(v6 ? s6->sin6_port : s4->sin_port);
    snprintf(out, size, v6 ? "[%s]:%d" : "%s:%d", ip, port);
    return port;
}

/* Wrap a connected non-blocking socket; takes ownership of fd, closing it on failure. */
static int conn_new(int fd, net_conn **out, cirrus_error *err)
{
    net_conn *c = calloc(1, sizeof *c);
    if (!c) {
        close(fd);
        return cirrus_fail(err, CIRRUS_ENOMEM, "out of memory for a connection");
    }
    c->tp = &net_tcp_transport;
    c->fd = fd;
    c->max_payload = NET_DEFAULT_MAX_PAYLOAD;
    c->lowat = 1; /* the kernel's default */
    c->lowat_cap = INT_MAX;
    int one = 1;
    /* Frames are request/response and latency-bound: never wait for Nagle to coalesce. */
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    struct sockaddr_storage sa = {0};
    socklen_t len = sizeof sa;
    getpeername(fd, (struct sockaddr *)&sa, &len); /* on failure: "?:0" */
    sockaddr_name(&sa, c->peer, sizeof c->peer);
    *out = c;
    return 0;
}

static int resolve(const char *host, int port, int passive, struct addrinfo **res,
                   cirrus_error *err)
{
    if (port < 0 || port > 65535)
        return cirrus_fail(err, CIRRUS_EINVAL, "port %d is outside 0..65535", port);
    char ps[8];
    snprintf(ps, sizeof ps, "%d", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0)};
    if (host && !*host) host = NULL;
    int rc = getaddrinfo(host, ps, &hints, res);
    if (rc)
        return cirrus_fail(err, CIRRUS_EINVAL, "cannot resolve '%s': %s", host ? host : "*",
                           gai_strerror(rc));
    return 0;
}

int net_listen(const char *host, int port, int *listen_fd, int *bound_port, cirrus_error *err)
{
    struct addrinfo *res = NULL;
    int rc = resolve(host, port, 1, &res, err), fd = -1, e = 0;
    if (rc) return rc;
    for (struct addrinfo *a = res; a; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
        int one = 1;
        /* A restarted peer must rebind its port at once, not after TIME_WAIT expires. */
        if (fd >= 0 && setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) == 0 &&
            bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, NET_LISTEN_BACKLOG) == 0)
            break;
        e = errno;
        if (fd >= 0) close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    if (fd < 0)
        return cirrus_fail(err, CIRRUS_EIO, "cannot listen on %s:%d: %s", host ? host : "*",
                           port, strerror(e));
    struct sockaddr_storage sa = {0};
    socklen_t len = sizeof sa;
    char name[64];
    getsockname(fd, (struct sockaddr *)&sa, &len); /* cannot fail on a bound socket */
    int p = sockaddr_name(&sa, name, sizeof name);
    if (bound_port) *bound_port = p;
    *listen_fd = fd;
    return 0;
}

int net_accept(int listen_fd, int timeout_ms, net_conn **out, cirrus_error *err)
{
    int64_t deadline = deadline_after(timeout_ms);
    for (;;) {
        int fd = accept4(listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd >= 0) return conn_new(fd, out, err);
        /* A connection reset while queued is that client's problem, not the listener's. */
        if (errno == EINTR || errno == ECONNABORTED || errno == EPROTO) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
            return cirrus_fail(err, CIRRUS_EIO, "accept: %s", strerror(errno));
        int rc = net_wait_fd(listen_fd, POLLIN, deadline);
        if (rc == CIRRUS_ETIMEDOUT)
            return cirrus_fail(err, rc, "no connection within %d ms", timeout_ms);
        if (rc) return cirrus_fail(err, rc, "poll: %s", strerror(errno));
    }
}

/* One non-blocking connect attempt bounded by the call's deadline; 0 or an errno value. */
static int connect_one(const struct addrinfo *a, int64_t deadline, int *out_fd)
{
    int fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) return errno;
    int e = 0;
    if (connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
        e = errno;
        /* EINTR: the connect goes on asynchronously, exactly as EINPROGRESS. */
        if (e == EINPROGRESS || e == EINTR) {
            int rc = net_wait_fd(fd, POLLOUT, deadline);
            socklen_t len = sizeof e;
            if (rc == CIRRUS_ETIMEDOUT)
                e = ETIMEDOUT;
            else if (rc || getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &len) != 0)
                e = errno;
        }
    }
    if (e) {
        close(fd);
        return e;
    }
    *out_fd = fd;
    return 0;
}

int net_connect(const char *host, int port, int timeout_ms, net_conn **out, cirrus_error *err)
{
    /* Name resolution is not bounded by the deadline; peers are addressed by IP in practice. */
    int64_t deadline = deadline_after(timeout_ms);
    struct addrinfo *res = NULL;
    int rc = resolve(host, port, 0, &res, err), fd = -1, e = ENOENT;
    if (rc) return rc;
    for (struct addrinfo *a = res; a && e != ETIMEDOUT; a = a->ai_next)
        if ((e = connect_one(a, deadline, &fd)) == 0) break;
    freeaddrinfo(res);
    if (e == ETIMEDOUT)
        return cirrus_fail(err, CIRRUS_ETIMEDOUT, "connect to %s:%d: no answer within %d ms",
                           host, port, timeout_ms);
    if (e) return cirrus_fail(err, CIRRUS_EIO, "connect to %s:%d: %s", host, port, strerror(e));
    return conn_new(fd, out, err);
}

void net_close(net_conn *c)
{
    if (!c) return;
    c->tp->close(c);
    free(c->rx);
    free(c);
}

int net_fd(const net_conn *c) { return c->fd; }
const char *net_peer_name(const net_conn *c) { return c ? c->peer : "?:0"; }

void net_set_max_payload(net_conn *c, uint32_t max_payload)
{
    c->max_payload = max_payload > WIRE_MAX_PAYLOAD ? WIRE_MAX_PAYLOAD : max_payload;
    /* Keep the buffer within the new cap: a lowered limit should also free the memory. */
    if (c->rx_cap > c->max_payload) {
        free(c->rx);
        c->rx = NULL;
        c->rx_cap = 0;
    }
}

/* ---- frames ---- */

static int send_until(net_conn *c, uint16_t type, uint64_t request_id, const struct iovec *iov,
                      int iovcnt, int64_t deadline)
{
    if (type == 0 || type > WIRE_TYPE_MAX || iovcnt < 0 || (iovcnt > 0 && !iov))
        return CIRRUS_EINVAL;
    size_t total = 0;
    for (int i = 0; i < iovcnt; i++) {
        if (iov[i].iov_len > WIRE_MAX_PAYLOAD - total || (iov[i].iov_len && !iov[i].iov_base))
            return CIRRUS_EINVAL;
        total += iov[i].iov_len;
    }
    /* The header with its checksum streamed over the iovecs, so the payload is not gathered
     * into one buffer first. */
    uint8_t hdr[WIRE_HEADER_SIZE];
    wire_header_encode(hdr, type, request_id, NULL, (uint32_t)total);
    XXH3_state_t st;
    XXH3_INITSTATE(&st);
    XXH3_64bits_reset(&st);
    XXH3_64bits_update(&st, hdr, 24);
    for (int i = 0; i < iovcnt; i++)
        if (iov[i].iov_len) XXH3_64bits_update(&st, iov[i].iov_base, iov[i].iov_len);
    uint64_t sum = XXH3_64bits_digest(&st);
    for (int b = 0; b < 8; b++) hdr[24 + b] = (uint8_t)(sum >> (8 * b));

    return write_all(c, (struct iovec){.iov_base = hdr, .iov_len = sizeof hdr}, iov, iovcnt,
                     deadline);
}

int net_send_framev(net_conn *c, uint16_t type, uint64_t request_id, const struct iovec *iov,
                    int iovcnt, int timeout_ms)
{
    return send_until(c, type, request_id, iov, iovcnt, deadline_after(timeout_ms));
}

int net_send_frame(net_conn *c, uint16_t type, uint64_t request_id, const void *payload,
                   uint32_t len, int timeout_ms)
{
    struct iovec iov = {.iov_base = (void *)payload, .iov_len = len};
    return send_until(c, type, request_id, &iov, len ? 1 : 0, deadline_after(timeout_ms));
}

/* A message for a failed read: the close/timeout/error, and how far into the frame. */
static int recv_fail(const net_conn *c, int rc, size_t got, int timeout_ms, cirrus_error *err)
{
    int e = errno;
    const char *why = c->tp->last_error ? c->tp->last_error(c) : NULL;
    if (rc == CIRRUS_EIO && why) return cirrus_fail(err, rc, "recv: %s", why);
    if (rc == CIRRUS_ECLOSED && got > 0)
        return cirrus_fail(err, CIRRUS_ETRUNC, "connection closed mid-frame (after %zu bytes)",
                           got);
    if (rc == CIRRUS_ECLOSED)
        return cirrus_fail(err, rc, "connection %s by peer", e == ECONNRESET ? "reset" : "closed");
    if (rc == CIRRUS_ETIMEDOUT)
        return cirrus_fail(err, rc, "no complete frame within %d ms (%zu bytes received)",
                           timeout_ms, got);
    return cirrus_fail(err, rc, "recv: %s", strerror(e));
}

static int recv_until(net_conn *c, wire_header *h, const uint8_t **payload, int64_t deadline,
                      int timeout_ms, cirrus_error *err)
{
    uint8_t hdr[WIRE_HEADER_SIZE];
    size_t got = 0;
    *payload = NULL;
    memset(h, 0, sizeof *h);
    set_lowat(c, 1); /* a frame of unknown size: wake for any byte */
    int rc = read_full(c, hdr, sizeof hdr, deadline, &got);
    if (rc) return recv_fail(c, rc, got, timeout_ms, err);
    /* Validate before allocating: a hostile length never reaches malloc. */
    rc = wire_header_decode(hdr, c->max_payload, h, err);
    if (rc) return rc;
    if (h->payload_len > c->rx_cap) {
        size_t cap = c->rx_cap * 2 > h->payload_len ? c->rx_cap * 2 : h->payload_len;
        if (cap > c->max_payload) cap = c->max_payload;
        free(c->rx); /* nothing in it is worth copying */
        c->rx_cap = 0;
        if (!(c->rx = malloc(cap)))
            return cirrus_fail(err, CIRRUS_ENOMEM, "no memory for a %u-byte frame", h->payload_len);
        c->rx_cap = cap;
    }
    if (h->payload_len > 0) {
        rc = read_full(c, c->rx, h->payload_len, deadline, &got);
        if (rc) return recv_fail(c, rc, got, timeout_ms, err);
    }
    if (!wire_checksum_ok(hdr, c->rx, h->payload_len))
        return cirrus_fail(err, CIRRUS_ECORRUPT,
                           "frame checksum mismatch (type %u, %u-byte payload)", h->type,
                           h->payload_len);
    *payload = h->payload_len ? c->rx : NULL;
    return 0;
}

int net_recv_frame(net_conn *c, wire_header *h, const uint8_t **payload, int timeout_ms,
                   cirrus_error *err)
{
    return recv_until(c, h, payload, deadline_after(timeout_ms), timeout_ms, err);
}

int net_recv_frame_into(net_conn *c, wire_header *h, void *buf, uint32_t len, int timeout_ms,
                        cirrus_error *err)
{
    int64_t deadline = deadline_after(timeout_ms);
    uint8_t hdr[WIRE_HEADER_SIZE];
    size_t got = 0, frame = WIRE_HEADER_SIZE + (size_t)len;
    memset(h, 0, sizeof *h);
    if (len > c->max_payload)
        return cirrus_fail(err, CIRRUS_EINVAL, "a %u-byte frame is over this connection's limit",
                           len);
    /* The frame's size is known, so ask to be woken once when all of it is in rather than
     * for every TCP segment: on a CPU-bound bulk link the wake-ups cost more than the copy.
     * A closed or failed link wakes poll() whatever the mark; a peer that sends less than
     * the mark asks for runs into the deadline, and the reads then tell a frame of the wrong
     * size (a protocol error) from one cut short (a timeout). */
    /* Bytes the transport already holds (TLS) may be all the frame: no wait for the socket. */
    if (!net_pending(c) && frame <= INT_MAX && set_lowat(c, (int)frame) > 1) {
        /* A timeout here is not yet the answer: what did arrive may be a wrong frame, and
         * the reads below say which (they end at the same deadline). */
        int rc = net_wait_fd(c->fd, POLLIN, deadline);
        if (rc && rc != CIRRUS_ETIMEDOUT) return recv_fail(c, rc, got, timeout_ms, err);
    }
    int rc = read_full(c, hdr, sizeof hdr, deadline, &got);
    if (rc) return recv_fail(c, rc, got, timeout_ms, err);
    if ((rc = wire_header_decode(hdr, len, h, err))) return rc;
    if (h->payload_len != len)
        return cirrus_fail(err, CIRRUS_ECORRUPT,
                           "frame of %u bytes (type %u) where one of %u was expected",
                           h->payload_len, h->type, len);
    if (len && (rc = read_full(c, buf, len, deadline, &got)))
        return recv_fail(c, rc, got, timeout_ms, err);
    if (!wire_checksum_ok(hdr, buf, len))
        return cirrus_fail(err, CIRRUS_ECORRUPT,
                           "frame checksum mismatch (type %u, %u-byte payload)", h->type, len);
    return 0;
}

int net_same_host(const net_conn *c)
{
    struct sockaddr_storage me = {0}, peer = {0};
    socklen_t lm = sizeof me, lp = sizeof peer;
    if (getsockname(c->fd, (struct sockaddr *)&me, &lm) != 0 ||
        getpeername(c->fd, (struct sockaddr *)&peer, &lp) != 0 || me.ss_family != peer.ss_family)
        return 0;
    if (peer.ss_family == AF_INET) {
        const struct sockaddr_in *m = (const void *)&me, *p = (const void *)&peer;
        return m->sin_addr.s_addr == p->sin_addr.s_addr ||
               (ntohl(p->sin_addr.s_addr) >> 24) == 127;
    }
    if (peer.ss_family == AF_INET6) {
        const struct sockaddr_in6 *m = (const void *)&me, *p = (const void *)&peer;
        const uint8_t *a = p->sin6_addr.s6_addr;
        return memcmp(&m->sin6_addr, &p->sin6_addr, sizeof p->sin6_addr) == 0 ||
               IN6_IS_ADDR_LOOPBACK(&p->sin6_addr) ||
               (IN6_IS_ADDR_V4MAPPED(&p->sin6_addr) && a[12] == 127);
    }
    return 0;
}

/* ---- handshake ---- */

/* Copy untrusted text for a message, replacing control and non-ASCII bytes so it cannot
 * forge log lines or terminal escapes. */
static void printable(char *out, size_t size, const void *src, size_t n)
{
    const unsigned char *s = src;
    size_t i = 0;
    for (; i < n && i + 1 < size; i++)
        out[i] = s[i] >= 0x20 && s[i] < 0x7f ? (char)s[i] : '?';
    out[i] = '\0';
}

static int job_id_ok(const char *job_id)
{
    size_t n = job_id ? strlen(job_id) : 0;
    return n >= 1 && n <= WIRE_JOB_ID_MAX;
}

int net_hello_client(net_conn *c, const char *job_id, uint16_t role, uint32_t peer_id,
                     int timeout_ms, cirrus_error *err)
{
    if (!job_id_ok(job_id))
        return cirrus_fail(err, CIRRUS_EINVAL, "job id must be 1..%d bytes", WIRE_JOB_ID_MAX);
    int64_t deadline = deadline_after(timeout_ms);
    wire_writer w;
    wire_writer_init(&w, 2 + 4 + 2 + WIRE_JOB_ID_MAX);
    wire_put_u16(&w, role);
    wire_put_u32(&w, peer_id);
    wire_put_str(&w, job_id);
    struct iovec iov = {.iov_base = w.data, .iov_len = w.len};
    int rc = w.failed ? CIRRUS_ENOMEM : send_until(c, WIRE_HELLO, 1, &iov, 1, deadline);
    wire_header h;
    const uint8_t *p;
    if (rc) {
        cirrus_fail(err, rc, "sending HELLO to %s: %s", c->peer, cirrus_strerror(rc));
        goto out;
    }
    if ((rc = recv_until(c, &h, &p, deadline, timeout_ms, err))) goto out;
    if (h.type == WIRE_HELLO_OK && h.payload_len == 0) goto out;
    if (h.type == WIRE_ERROR) {
        /* The server's reason, truncated and made printable rather than trusted. */
        wire_reader r;
        wire_reader_init(&r, p, h.payload_len);
        wire_get_u32(&r);
        size_t n = wire_get_u16(&r);
        const void *text = wire_get_bytes(&r, n);
        char msg[160];
        printable(msg, sizeof msg, text ? text : "(unreadable)", text ? n : 12);
        rc = cirrus_fail(err, CIRRUS_EMISMATCH, "%s refused the handshake: %s", c->peer, msg);
        goto out;
    }
    rc = cirrus_fail(err, CIRRUS_ECORRUPT, "expected HELLO_OK from %s, got type %u (%u bytes)",
                     c->peer, h.type, h.payload_len);
out:
    wire_writer_free(&w);
    return rc;
}

/* Best effort: tell a refused client why before dropping it; it may already be gone. */
static void send_refusal(net_conn *c, uint64_t request_id, int code, const char *msg,
                         int64_t deadline)
{
    wire_writer w;
    wire_writer_init(&w, 4 + 2 + 256); /* fits any cirrus_error message */
    wire_put_u32(&w, (uint32_t)(int32_t)code);
    wire_put_str(&w, msg);
    if (!w.failed) {
        struct iovec iov = {.iov_base = w.data, .iov_len = w.len};
        send_until(c, WIRE_ERROR, request_id, &iov, 1, deadline);
    }
    wire_writer_free(&w);
}

/* Check a first frame against this job: 0, or the reason to refuse it in e. */
static int hello_check(const wire_header *h, const uint8_t *p, const char *job_id,
                       uint16_t *role, uint32_t *peer_id, cirrus_error *e)
{
    if (h->type != WIRE_HELLO)
        return cirrus_fail(e, CIRRUS_ECORRUPT, "expected HELLO as the first frame, got type %u",
                           h->type);
    wire_reader r;
    wire_reader_init(&r, p, h->payload_len);
    uint16_t got_role = wire_get_u16(&r);
    uint32_t got_peer = wire_get_u32(&r);
    char got_job[WIRE_JOB_ID_MAX + 1], shown[WIRE_JOB_ID_MAX + 1];
    if (wire_get_str(&r, got_job, sizeof got_job) || wire_reader_done(&r) || !got_job[0])
        return cirrus_fail(e, CIRRUS_ECORRUPT, "malformed HELLO (%u-byte payload)",
                           h->payload_len);
    printable(shown, sizeof shown, got_job, strlen(got_job));
    if (strcmp(got_job, job_id) != 0)
        return cirrus_fail(e, CIRRUS_EMISMATCH, "wrong job id '%s'", shown);
    if (role) *role = got_role;
    if (peer_id) *peer_id = got_peer;
    return 0;
}

int net_hello_server(net_conn *c, const char *job_id, uint16_t *role, uint32_t *peer_id,
                     int timeout_ms, cirrus_error *err)
{
    if (!job_id_ok(job_id))
        return cirrus_fail(err, CIRRUS_EINVAL, "job id must be 1..%d bytes", WIRE_JOB_ID_MAX);
    int64_t deadline = deadline_after(timeout_ms);
    cirrus_error e = {0};
    wire_header h;
    const uint8_t *p;
    /* A broken frame gets no answer (the framing is lost); a well-framed refusal does. */
    int rc = recv_until(c, &h, &p, deadline, timeout_ms, &e);
    if (rc == 0 && (rc = hello_check(&h, p, job_id, role, peer_id, &e)))
        send_refusal(c, h.request_id, rc, e.msg, deadline);
    else if (rc == 0 && (rc = send_until(c, WIRE_HELLO_OK, h.request_id, NULL, 0, deadline)))
        cirrus_fail(&e, rc, "sending HELLO_OK: %s", cirrus_strerror(rc));
    if (rc && err) *err = e;
    return rc;
}

int net_split_hostport(const char *addr, char *host, size_t host_size, int *port,
                       int allow_zero, cirrus_error *err)
{
    const char *colon = strrchr(addr, ':');
    char *end = NULL;
    long v = colon ? strtol(colon + 1, &end, 10) : -1;
    if (!colon || colon == addr || (size_t)(colon - addr) >= host_size || !end || *end ||
        end == colon + 1 || v < (allow_zero ? 0 : 1) || v > 65535)
        return cirrus_fail(err, CIRRUS_EINVAL, "'%s' is not HOST:PORT", addr);
    memcpy(host, addr, (size_t)(colon - addr));
    host[colon - addr] = '\0';
    *port = (int)v;
    return 0;
}
