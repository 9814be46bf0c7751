/* rpc_server: see rpc_server.h. */
#include "rpc_server.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include "../../../common/clock.h"
#include "../../../common/log.h"
#include "rpc.h"

#define ADDR_MAX 64

struct slot {
    int used;
    int in_hello;        /* accepted, HELLO not done: its thread has not closed fd */
    int evicted;         /* shut down to make room; its thread is on its way out */
    int heard;           /* a whole frame header has arrived (await_header): never evicted */
    int fd;
    int64_t since_ms;    /* accepted at */
    char addr[ADDR_MAX]; /* the peer's address without its port */
};

struct rpc_server {
    rpc_server_options o;
    pthread_t acceptor;
    atomic_int stopping;
    pthread_mutex_t mu;
    pthread_cond_t ended;
    struct slot *slots; /* max_conns of them (under mu) */
    int open;
    int max_hellos; /* connections before HELLO, from everywhere */
    uint64_t accepted, refused, evicted;
    /* For sampled logs (log_warn_sampled): refusals at accept, and drops by kind, so a
     * flood of one kind does not hide the first of another. */
    atomic_ullong refusals_seen;
    log_kinds drops_seen;
};

typedef struct conn_job {
    rpc_server *s;
    net_conn *c;
    int slot;
} conn_job;

/* HELLO is over (done or failed): from now on the thread may close the connection, so
 * eviction must not touch its descriptor. */
static void hello_over(rpc_server *s, int slot)
{
    pthread_mutex_lock(&s->mu);
    s->slots[slot].in_hello = 0;
    pthread_mutex_unlock(&s->mu);
}

static void release(rpc_server *s, int slot)
{
    pthread_mutex_lock(&s->mu);
    s->slots[slot] = (struct slot){0};
    s->open--;
    pthread_cond_broadcast(&s->ended);
    pthread_mutex_unlock(&s->mu);
}

/* Requests until the connection ends, the server stops or the other end goes quiet. */
static void serve_requests(rpc_server *s, rpc_server_conn *sc)
{
    const rpc_server_options *o = &s->o;
    net_conn *c = sc->c;
    int64_t idle_until = clock_now_ms() + o->idle_ms;
    while (!atomic_load(&s->stopping)) {
        /* Wait for a frame's first byte here, not inside net_recv_frame: a receive that
         * timed out part-way through a frame would leave the stream inside its payload. */
        if (!net_pending(c)) {
            struct pollfd pfd = {.fd = net_fd(c), .events = POLLIN};
            int pr = poll(&pfd, 1, o->poll_ms);
            if (pr < 0 && errno != EINTR) return;
            if (pr <= 0) {
                if (o->idle_ms && clock_now_ms() > idle_until) {
                    log_info("closing %s: idle for %u ms", net_peer_name(c), o->idle_ms);
                    return;
                }
                continue;
            }
        }
        wire_header h;
        const uint8_t *payload;
        cirrus_error err = {0};
        int rc = net_recv_frame(c, &h, &payload, o->io_timeout_ms, &err);
        if (rc == CIRRUS_ECLOSED) return;
        if (rc) {
            log_warn_sampled(log_kind(&s->drops_seen, err.msg), "%s dropped %s: %s", o->what,
                             net_peer_name(c), err.msg);
            return;
        }
        idle_until = clock_now_ms() + o->idle_ms;
        wire_writer reply;
        wire_writer_init(&reply, o->reply_limit);
        int drop = 0;
        if (h.type != WIRE_PING) { /* PING: liveness, answered alike by every server */
            rc = o->handle(o->ctx, sc, &h, payload, &reply, &drop, &err);
        } else if (h.payload_len) {
            drop = 1;
            rc = cirrus_fail(&err, CIRRUS_ECORRUPT, "PING with a %u-byte payload", h.payload_len);
        }
        if (!rc && reply.failed) rc = cirrus_fail(&err, CIRRUS_ENOMEM, "reply too large");
        if (rc) {
            wire_writer_free(&reply);
            if (drop)
                log_warn_sampled(log_kind(&s->drops_seen, err.msg), "%s dropped %s: %s (request type %u)",
                                 o->what, net_peer_name(c), err.msg, h.type);
            rpc_refuse(c, h.request_id, rc, err.msg, o->io_timeout_ms);
            if (drop) return;
            continue;
        }
        /* Every reply is its request's type + 1 (PING's is PONG). */
        rc = net_send_frame(c, (uint16_t)(h.type + 1), h.request_id, reply.data,
                            (uint32_t)reply.len, o->io_timeout_ms);
        wire_writer_free(&reply);
        if (rc) return;
    }
}

/* Wait (at most the HELLO deadline) until a whole frame header is in the socket, peeked at
 * and left there, and mark the slot heard: from then on the bytes are no longer in the
 * socket for speaking() to see, so the mark must come before HELLO reads them. Returns
 * early, unmarked, on a close, an eviction or the deadline: HELLO then fails as it would. */
static void await_header(rpc_server *s, const conn_job *job)
{
    const int fd = net_fd(job->c);
    const int64_t deadline = clock_now_ms() + s->o.hello_timeout_ms;
    uint8_t peek[WIRE_HEADER_SIZE];
    for (;;) {
        ssize_t n = recv(fd, peek, sizeof peek, MSG_PEEK | MSG_DONTWAIT);
        if (n == (ssize_t)sizeof peek) break;
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
            return;
        const int64_t left = deadline - clock_now_ms();
        if (left <= 0 || atomic_load(&s->stopping)) return;
        int wait_ms = left < s->o.poll_ms ? (int)left : s->o.poll_ms;
        if (n > 0) { /* part of a header: poll would return at once; a trickle is slow */
            usleep((useconds_t)(wait_ms < 50 ? wait_ms : 50) * 1000);
            continue;
        }
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        if (poll(&pfd, 1, wait_ms) < 0 && errno != EINTR) return;
    }
    pthread_mutex_lock(&s->mu);
    s->slots[job->slot].heard = 1;
    pthread_mutex_unlock(&s->mu);
}

static void *conn_main(void *arg)
{
    conn_job job = *(conn_job *)arg;
    free(arg);
    rpc_server *s = job.s;
    rpc_server_conn sc = {.c = job.c};
    cirrus_error err = {0};
    /* HELLO is read under the connection's small default cap: a stranger announcing a
     * large frame gets no buffer for it. */
    const int64_t began_ms = clock_now_ms();
    await_header(s, &job);
    const int64_t left_ms = s->o.hello_timeout_ms - (clock_now_ms() - began_ms);
    int rc = net_hello_server(sc.c, s->o.job_id, &sc.role, &sc.id, left_ms > 1 ? (int)left_ms : 1,
                              &err);
    hello_over(s, job.slot);
    if (rc) {
        log_warn_sampled(log_kind(&s->drops_seen, err.msg), "%s dropped %s: %s", s->o.what,
                         net_peer_name(sc.c), err.msg);
    } else {
        net_set_max_payload(sc.c, s->o.max_payload);
        if (s->o.opened) s->o.opened(s->o.ctx, &sc);
        serve_requests(s, &sc);
    }
    net_close(sc.c);
    release(s, job.slot);
    return NULL;
}

/* The address a connection came from, without its port ("[::1]:7000" -> "[::1]"). */
static void addr_of(const net_conn *c, char out[ADDR_MAX])
{
    snprintf(out, ADDR_MAX, "%s", net_peer_name(c));
    char *colon = strrchr(out, ':');
    if (colon) *colon = '\0';
}

/* Whether a connection before HELLO has sent a whole frame header: its thread has it or
 * will have it as soon as it runs (the bytes wait in the socket). Such a client speaks the
 * protocol (a flood's silent or trickling connections never get that far within the HELLO
 * deadline, and an oversize or wrong-job HELLO is refused as soon as it is read), so it is
 * never the one evicted: on a loaded machine, a real client's HELLO may wait longer for its
 * thread than a flood takes to open max_hellos newer connections. Under mu. */
static int speaking(const struct slot *t)
{
    int queued = 0;
    return t->heard || (ioctl(t->fd, FIONREAD, &queued) == 0 && queued >= WIRE_HEADER_SIZE);
}

/* Make room among the connections before HELLO by shutting down the oldest (of addr, or
 * of all with addr NULL): its thread's HELLO fails at once and frees the slot. The oldest
 * rather than the newcomer, because a client that speaks the protocol is past HELLO in a
 * round trip, while a silent flood would otherwise hold every slot for the whole HELLO
 * deadline. Under mu. */
static void evict_oldest(rpc_server *s, const char *addr)
{
    struct slot *oldest = NULL;
    for (int i = 0; i < s->o.max_conns; i++) {
        struct slot *t = &s->slots[i];
        if (t->used && t->in_hello && !t->evicted && (!addr || !strcmp(t->addr, addr)) &&
            (!oldest || t->since_ms < oldest->since_ms) && !speaking(t))
            oldest = t;
    }
    if (!oldest) return;
    oldest->evicted = 1;
    s->evicted++;
    shutdown(oldest->fd, SHUT_RDWR);
}

/* A slot for c, or NULL with the cap it would break. Under mu. */
static const char *admit(rpc_server *s, const net_conn *c, const char *addr, int *slot)
{
    int from_addr = 0, hellos = 0, leaving = 0;
    *slot = -1;
    for (int i = 0; i < s->o.max_conns; i++) {
        const struct slot *t = &s->slots[i];
        if (!t->used) {
            if (*slot < 0) *slot = i;
        } else if (t->evicted) {
            leaving++;
        } else if (t->in_hello) {
            hellos++;
            from_addr += strcmp(t->addr, addr) == 0;
        }
    }
    if (*slot < 0) {
        /* Every slot taken: make room for the next one, unless room is on its way. */
        if (!leaving) evict_oldest(s, NULL);
        return "connections open";
    }
    if (from_addr >= s->o.max_hellos_per_addr) evict_oldest(s, addr);
    else if (hellos >= s->max_hellos) evict_oldest(s, NULL);
    struct slot *t = &s->slots[*slot];
    *t = (struct slot){.used = 1, .in_hello = 1, .fd = net_fd(c), .since_ms = clock_now_ms()};
    snprintf(t->addr, sizeof t->addr, "%s", addr);
    s->open++;
    return NULL;
}

static void spawn(rpc_server *s, net_conn *c)
{
    char addr[ADDR_MAX];
    addr_of(c, addr);
    int slot = -1;
    pthread_mutex_lock(&s->mu);
    const char *full = admit(s, c, addr, &slot);
    if (full) s->refused++;
    else s->accepted++;
    pthread_mutex_unlock(&s->mu);
    if (full) {
        log_warn_sampled(&s->refusals_seen, "%s refused %s: too many %s", s->o.what,
                         net_peer_name(c), full);
        net_close(c);
        return;
    }
    conn_job *job = malloc(sizeof *job);
    pthread_attr_t attr;
    pthread_t th;
    int ok = 0;
    if (job && pthread_attr_init(&attr) == 0) {
        *job = (conn_job){s, c, slot};
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        if (s->o.stack_bytes) pthread_attr_setstacksize(&attr, s->o.stack_bytes);
        ok = pthread_create(&th, &attr, conn_main, job) == 0;
        pthread_attr_destroy(&attr);
    }
    if (ok) return;
    log_warn("%s refused %s: cannot start a thread", s->o.what, net_peer_name(c));
    free(job);
    net_close(c);
    release(s, slot);
}

static void *accept_main(void *arg)
{
    rpc_server *s = arg;
    while (!atomic_load(&s->stopping)) {
        net_conn *c = NULL;
        cirrus_error err = {0};
        int rc = net_accept(s->o.listen_fd, s->o.poll_ms, &c, &err);
        if (rc == 0) {
            spawn(s, c);
        } else if (rc != CIRRUS_ETIMEDOUT) {
            log_warn("%s: accept: %s", s->o.what, err.msg);
            usleep(50 * 1000); /* e.g. out of descriptors: do not spin */
        }
        if (s->o.tick) s->o.tick(s->o.ctx);
    }
    return NULL;
}

int rpc_server_start(const rpc_server_options *o, rpc_server **out, cirrus_error *err)
{
    *out = NULL;
    if (o->max_conns < 1 || !o->handle || o->poll_ms < 1)
        return cirrus_fail(err, CIRRUS_EINVAL, "%s: a server needs max_conns, poll_ms, handle",
                           o->what);
    rpc_server *s = calloc(1, sizeof *s);
    struct slot *slots = calloc((size_t)o->max_conns, sizeof *slots);
    if (!s || !slots) {
        free(s);
        free(slots);
        return cirrus_fail(err, CIRRUS_ENOMEM, "%s: out of memory for its server", o->what);
    }
    s->o = *o;
    s->slots = slots;
    s->max_hellos = o->max_conns / 4 > 4 ? o->max_conns / 4 : 4;
    if (!s->o.max_hellos_per_addr) {
        const int eighth = o->max_conns / 8;
        s->o.max_hellos_per_addr = eighth < 4 ? 4 : eighth > 16 ? 16 : eighth;
    }
    atomic_init(&s->stopping, 0);
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->ended, NULL);
    if (pthread_create(&s->acceptor, NULL, accept_main, s) != 0) {
        pthread_cond_destroy(&s->ended);
        pthread_mutex_destroy(&s->mu);
        free(slots);
        free(s);
        return cirrus_fail(err, CIRRUS_ENOMEM, "%s: cannot start the accept thread", o->what);
    }
    *out = s;
    return 0;
}

void rpc_server_stop(rpc_server *s)
{
    if (!s) return;
    atomic_store(&s->stopping, 1);
    pthread_join(s->acceptor, NULL);
    pthread_mutex_lock(&s->mu);
    /* Connections before HELLO would hold the stop up to their deadline: end them now
     * (as eviction does); the others see the flag within poll_ms. */
    for (int i = 0; i < s->o.max_conns; i++)
        if (s->slots[i].used && s->slots[i].in_hello && !s->slots[i].evicted) {
            s->slots[i].evicted = 1;
            shutdown(s->slots[i].fd, SHUT_RDWR);
        }
    while (s->open > 0) pthread_cond_wait(&s->ended, &s->mu);
    pthread_mutex_unlock(&s->mu);
    pthread_cond_destroy(&s->ended);
    pthread_mutex_destroy(&s->mu);
    free(s->slots);
    free(s);
}

void rpc_server_get_counts(rpc_server *s, rpc_server_counts *out)
{
    pthread_mutex_lock(&s->mu);
    int in_hello = 0; /* derived: the slots say it */
    for (int i = 0; i < s->o.max_conns; i++) in_hello += s->slots[i].used && s->slots[i].in_hello;
    *out = (rpc_server_counts){s->open, in_hello, s->accepted, s->refused, s->evicted};
    pthread_mutex_unlock(&s->mu);
}
