/* ring: bandwidth-optimal all-reduce over TCP (reduce-scatter, then all-gather).
 *
 * The buffer is cut into `world` segments and each segment into chunks. There are
 * 2(world-1) phases; in each, every rank sends one segment to its right neighbour and
 * receives one from its left (adding it during reduce-scatter, copying it during
 * all-gather), so each rank sends 2(world-1)/world of the data: the bandwidth optimum.
 *
 * Phases are pipelined chunk by chunk: a sender thread streams chunk j of phase p as soon
 * as the receiver (the calling thread) has finished chunk j of phase p-1, which is exactly
 * the data it forwards. Sending and receiving thus overlap on both links all the time.
 *
 * Every rank ends with bit-identical sums: each segment is reduced once, in ring order, by
 * the rank that ends up owning it, and then copied verbatim to the others.
 *
 * On a small box the ring is bound by CPU (checksums, socket copies, the adds) and, within
 * one host, by cache, so (measured on 2 cores, docs/BENCHMARKS.md):
 *  - chunks are received straight into place (net_recv_frame_into: no copy out of the
 *    connection's buffer, and one wake-up per chunk instead of one per TCP segment);
 *  - a segment is cut into at least RING_MIN_CHUNKS chunks, so that the pipeline fills
 *    quickly and a chunk in flight stays cache-sized;
 *  - a link within one host gets a small fixed send buffer (ring_tune_links).
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "../../common/clock.h"
#include "ring.h"
#include "conn.h"

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "ring chunks carry floats in host order, which the wire defines as little-endian"
#endif

#define RING_ROLE 128        /* handshake role of a ring link */
#define RING_CHUNK_TYPE 128  /* wire type of a chunk frame */
#define RING_DEFAULT_CHUNK (1u << 20)
#define RING_MIN_CHUNKS 8             /* chunks per segment the size aims for ... */
#define RING_MIN_CHUNK (256u << 10)   /* ... but no chunk made smaller than this */
#define RING_MAX_CHUNK (64u << 20)    /* within any connection's default frame limit */
#define RING_LOCAL_SNDBUF (256 << 10) /* SO_SNDBUF of a same-host link (Linux doubles it) */

typedef struct ring {
    collective base;
    net_conn *left, *right; /* receive from left, send to right */
    ring_options opt;
    uint64_t calls;         /* tags frames so a stale chunk can never be mistaken */
    float *scratch;         /* a reduce-scatter chunk as received, before it is added */
    size_t scratch_cap;     /* in floats */
    /* The sender thread lives as long as the ring (a thread per call cost tens of
     * microseconds, which small buffers feel); it sends `call` and then clears it. */
    pthread_t sender;
    int sender_started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct ring_call *call; /* the call to send; NULL: none (set and cleared under mu) */
    int quit;
} ring;

/* Shared between the receiving (calling) thread and the sender thread of one call. */
typedef struct ring_call {
    ring *r;
    float *data;
    size_t n, nchunks, chunk;  /* chunk in floats */
    int phases;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    size_t done;               /* items (phase * nchunks + chunk) fully received */
    int failed;
    cirrus_error send_err;
    int send_rc;
} ring_call;

static size_t seg_start(size_t n, int world, int k)
{
    /* Balanced split: the first n % world segments hold one extra float. */
    size_t base = n / (size_t)world, extra = n % (size_t)world;
    return (size_t)k * base + ((size_t)k < extra ? (size_t)k : extra);
}

static int mod(int a, int w)
{
    return ((a % w) + w) % w;
}

/* Segment a rank sends (recv = 0) or receives (recv = 1) in a phase. */
static int phase_segment(int rank, int world, int phase, int recv)
{
    if (phase < world - 1) /* reduce-scatter step s = phase */
        return mod(rank - phase - recv, world);
    int s = phase - (world - 1); /* all-gather step */
    return mod(rank + 1 - s - recv, world);
}

/* The floats of chunk j of segment k: [*off, *off + *len). */
static void chunk_range(const ring_call *c, int k, size_t j, size_t *off, size_t *len)
{
    const int world = c->r->base.world;
    size_t s0 = seg_start(c->n, world, k), s1 = seg_start(c->n, world, k + 1);
    size_t lo = s0 + j * c->chunk, hi = lo + c->chunk;
    if (lo > s1) lo = s1;
    if (hi > s1) hi = s1;
    *off = lo;
    *len = hi - lo;
}

static uint64_t chunk_tag(const ring *r, size_t item)
{
    return (r->calls << 32) | (uint64_t)item;
}

static void *ring_sender(void *arg)
{
    ring_call *c = arg;
    ring *r = c->r;
    const int rank = r->base.rank, world = r->base.world;
    for (int p = 0; p < c->phases; p++) {
        int k = phase_segment(rank, world, p, 0);
        for (size_t j = 0; j < c->nchunks; j++) {
            size_t item = (size_t)p * c->nchunks + j;
            pthread_mutex_lock(&c->mu);
            /* Phase p forwards what phase p-1 received: wait for that chunk. */
            while (!c->failed && p > 0 && c->done <= item - c->nchunks)
                pthread_cond_wait(&c->cv, &c->mu);
            int failed = c->failed;
            pthread_mutex_unlock(&c->mu);
            if (failed) return NULL;
            size_t off, len;
            chunk_range(c, k, j, &off, &len);
            int rc = net_send_frame(r->right, RING_CHUNK_TYPE, chunk_tag(r, item),
                                    c->data + off, (uint32_t)(len * sizeof(float)),
                                    r->base.timeout_ms);
            if (rc) {
                pthread_mutex_lock(&c->mu);
                c->failed = 1;
                c->send_rc = rc;
                cirrus_fail(&c->send_err, rc, "ring rank %d: sending to rank %d: %s", rank,
                            mod(rank + 1, world), cirrus_strerror(rc));
                pthread_cond_broadcast(&c->cv);
                pthread_mutex_unlock(&c->mu);
                return NULL;
            }
        }
    }
    return NULL;
}

/* The sender thread: send each call's chunks as ring_allreduce_sum posts it. */
static void *ring_sender_main(void *arg)
{
    ring *r = arg;
    pthread_mutex_lock(&r->mu);
    for (;;) {
        while (!r->call && !r->quit) pthread_cond_wait(&r->cv, &r->mu);
        if (r->quit) break;
        ring_call *c = r->call;
        pthread_mutex_unlock(&r->mu);
        ring_sender(c);
        pthread_mutex_lock(&r->mu);
        r->call = NULL;
        pthread_cond_broadcast(&r->cv);
    }
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

static int ring_receive(ring_call *c, cirrus_error *err)
{
    ring *r = c->r;
    const int rank = r->base.rank, world = r->base.world;
    for (int p = 0; p < c->phases; p++) {
        int k = phase_segment(rank, world, p, 1);
        for (size_t j = 0; j < c->nchunks; j++) {
            size_t item = (size_t)p * c->nchunks + j, off, len;
            chunk_range(c, k, j, &off, &len);
            /* Reduce-scatter: into scratch, then added. All-gather: straight into place
             * (data's contents are undefined after a failed call anyway). */
            int reduce = p < world - 1;
            float *dst = c->data + off, *into = reduce ? r->scratch : dst;
            wire_header h;
            cirrus_error e = {0};
            int rc = net_recv_frame_into(r->left, &h, into, (uint32_t)(len * sizeof(float)),
                                         r->base.timeout_ms, &e);
            if (rc)
                return cirrus_fail(err, rc, "ring rank %d: chunk %zu of phase %d from rank %d: %s",
                                   rank, j, p, mod(rank - 1, world), e.msg);
            if (h.type != RING_CHUNK_TYPE || h.request_id != chunk_tag(r, item))
                return cirrus_fail(err, CIRRUS_ECORRUPT,
                                   "ring rank %d: unexpected frame (type %u, tag %llx) for "
                                   "chunk %zu of phase %d",
                                   rank, h.type, (unsigned long long)h.request_id, j, p);
            if (reduce)
                for (size_t i = 0; i < len; i++) dst[i] += into[i];
            pthread_mutex_lock(&c->mu);
            c->done = item + 1;
            int failed = c->failed;
            pthread_cond_broadcast(&c->cv);
            pthread_mutex_unlock(&c->mu);
            if (failed) return c->send_rc;
        }
    }
    return 0;
}

static int ring_allreduce_sum(collective *base, float *data, size_t n, cirrus_error *err)
{
    ring *r = (ring *)base;
    const int world = base->world;
    if (world == 1 || n == 0) return 0;
    ring_call c = {.r = r, .data = data, .n = n, .phases = 2 * (world - 1)};
    /* opt.chunk_bytes is the largest chunk; smaller buffers get at least RING_MIN_CHUNKS
     * per segment (down to RING_MIN_CHUNK). Every rank derives the same size from n and
     * world, as the frames' sizes must agree. */
    size_t max_seg = seg_start(n, world, 1);
    size_t fill = max_seg / RING_MIN_CHUNKS;
    if (fill < RING_MIN_CHUNK / sizeof(float)) fill = RING_MIN_CHUNK / sizeof(float);
    c.chunk = r->opt.chunk_bytes / sizeof(float);
    if (c.chunk > fill) c.chunk = fill;
    if (c.chunk > RING_MAX_CHUNK / sizeof(float)) c.chunk = RING_MAX_CHUNK / sizeof(float);
    c.nchunks = (max_seg + c.chunk - 1) / c.chunk;
    if (c.nchunks == 0) c.nchunks = 1;
    size_t need = c.chunk < max_seg ? c.chunk : max_seg;
    if (r->scratch_cap < need) {
        float *s = malloc(need * sizeof(float));
        if (!s)
            return cirrus_fail(err, CIRRUS_ENOMEM, "ring: no memory for a %zu-byte chunk",
                               need * sizeof(float));
        free(r->scratch);
        r->scratch = s;
        r->scratch_cap = need;
    }
    r->calls++;
    pthread_mutex_init(&c.mu, NULL);
    pthread_cond_init(&c.cv, NULL);
    int rc;
    if (!r->sender_started) {
        if (pthread_create(&r->sender, NULL, ring_sender_main, r) != 0) {
            rc = cirrus_fail(err, CIRRUS_ENOMEM, "ring: cannot start the sender thread");
            goto out;
        }
        r->sender_started = 1;
    }
    pthread_mutex_lock(&r->mu);
    r->call = &c;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    rc = ring_receive(&c, err);
    pthread_mutex_lock(&c.mu);
    if (rc) c.failed = 1;
    pthread_cond_broadcast(&c.cv);
    pthread_mutex_unlock(&c.mu);
    pthread_mutex_lock(&r->mu); /* the sender is done with c once it clears the call */
    while (r->call) pthread_cond_wait(&r->cv, &r->mu);
    pthread_mutex_unlock(&r->mu);
    if (!rc && c.send_rc) {
        rc = c.send_rc;
        if (err) *err = c.send_err;
    } else if (rc && rc == c.send_rc && err) {
        *err = c.send_err;
    }
out:
    pthread_mutex_destroy(&c.mu);
    pthread_cond_destroy(&c.cv);
    return rc;
}

static void ring_free(collective *base)
{
    ring *r = (ring *)base;
    if (r->sender_started) {
        pthread_mutex_lock(&r->mu);
        r->quit = 1;
        pthread_cond_broadcast(&r->cv);
        pthread_mutex_unlock(&r->mu);
        pthread_join(r->sender, NULL);
    }
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
    net_close(r->left);
    net_close(r->right);
    free(r->scratch);
    free(r);
}

static const collective_ops ring_ops = {
    .name = "tcp-ring",
    .allreduce_sum = ring_allreduce_sum,
    .free = ring_free,
};

/* ---- building the ring ---- */

typedef struct ring_dial {
    const char *host;
    int port, rank, timeout_ms;
    const char *job_id;
    net_conn *conn;
    int rc;
    cirrus_error err;
} ring_dial;

/* Socket settings of a built ring. A link within one host has no bandwidth-delay product to
 * cover, and whatever its send buffer holds is cache the two processes share: autotuned up
 * to 4 MiB per link, it evicted the very chunks being reduced, and a small fixed buffer made
 * the ring 10-20% faster on loopback at every size measured (docs/BENCHMARKS.md). Links to
 * other hosts keep autotuning, which a wide-area link needs. Best effort: a setting the
 * kernel refuses only costs speed. */
static void ring_tune_links(ring *r)
{
    if (net_same_host(r->right)) {
        int sndbuf = RING_LOCAL_SNDBUF;
        setsockopt(net_fd(r->right), SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof sndbuf);
    }
}

/* Connect to the right neighbour, retrying while it is not listening yet. Runs in its own
 * thread: every rank dials and accepts at once, and doing the two in sequence on all ranks
 * would wait in a circle. */
static void *ring_dial_right(void *arg)
{
    ring_dial *d = arg;
    const int64_t deadline = clock_now_ms() + d->timeout_ms;
    for (;;) {
        int left = (int)(deadline - clock_now_ms());
        if (left <= 0) break;
        d->rc = net_connect(d->host, d->port, left, &d->conn, &d->err);
        if (d->rc == 0) {
            d->rc = net_hello_client(d->conn, d->job_id, RING_ROLE, (uint32_t)d->rank,
                                     (int)(deadline - clock_now_ms()), &d->err);
            if (d->rc) {
                net_close(d->conn);
                d->conn = NULL;
            }
            return NULL;
        }
        struct timespec pause = {0, 50 * 1000 * 1000};
        nanosleep(&pause, NULL);
    }
    if (!d->rc) d->rc = cirrus_fail(&d->err, CIRRUS_ETIMEDOUT, "connecting timed out");
    return NULL;
}

int ring_new(collective **out, int rank, int world, int listen_fd, const char *const *hosts,
                const int *ports, const ring_options *opt, cirrus_error *err)
{
    *out = NULL;
    if (world < 1 || rank < 0 || rank >= world)
        return cirrus_fail(err, CIRRUS_EINVAL, "ring: rank %d outside world %d", rank, world);
    ring *r = calloc(1, sizeof *r);
    if (!r) return cirrus_fail(err, CIRRUS_ENOMEM, "ring: out of memory");
    r->base.ops = &ring_ops;
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    r->base.rank = rank;
    r->base.world = world;
    r->opt = *opt;
    if (r->opt.chunk_bytes < sizeof(float)) r->opt.chunk_bytes = RING_DEFAULT_CHUNK;
    r->base.timeout_ms = opt->timeout_ms > 0 ? opt->timeout_ms : 30000;
    if (world == 1) {
        *out = &r->base;
        return 0;
    }
    const int right = (rank + 1) % world, left = (rank + world - 1) % world;
    ring_dial d = {.host = hosts[right], .port = ports[right], .rank = rank,
                   .timeout_ms = r->base.timeout_ms, .job_id = opt->job_id};
    pthread_t dialer;
    if (pthread_create(&dialer, NULL, ring_dial_right, &d) != 0) {
        ring_free(&r->base);
        return cirrus_fail(err, CIRRUS_ENOMEM, "ring: cannot start the dialer thread");
    }
    int rc = 0;
    const int64_t deadline = clock_now_ms() + r->base.timeout_ms;
    /* Accept until the left neighbour shows up; anything else is refused and dropped. */
    while (!r->left) {
        int wait = (int)(deadline - clock_now_ms());
        if (wait <= 0) {
            rc = cirrus_fail(err, CIRRUS_ETIMEDOUT, "ring rank %d: rank %d never connected",
                             rank, left);
            break;
        }
        net_conn *c = NULL;
        if ((rc = net_accept(listen_fd, wait, &c, err))) break;
        uint16_t role;
        uint32_t peer;
        cirrus_error herr;
        if (net_hello_server(c, opt->job_id, &role, &peer, wait, &herr) == 0 &&
            role == RING_ROLE && peer == (uint32_t)left)
            r->left = c;
        else
            net_close(c);
    }
    pthread_join(dialer, NULL);
    if (!rc && d.rc) {
        rc = d.rc;
        cirrus_fail(err, rc, "ring rank %d: connecting to rank %d at %s:%d: %s", rank, right,
                    hosts[right], ports[right], d.err.msg);
    }
    r->right = d.conn;
    if (rc) {
        ring_free(&r->base);
        return rc;
    }
    ring_tune_links(r);
    *out = &r->base;
    return 0;
}
