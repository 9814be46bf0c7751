/* TCP ring all-reduce: ranks as threads of one process, linked by real loopback sockets. */
#include <pthread.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../../common/rng.h"
#include "../../trainer/net/ring.h"
#include "../../trainer/net/conn.h"
#include "test.h"

#define MAX_RANKS 8

typedef struct rank_ctx {
    int rank, world, listen_fd;
    const char **hosts;
    int *ports;
    ring_options opt;
    float *data;
    size_t n;
    int calls;        /* all-reduces to run */
    int die_after;    /* > 0: this rank destroys its ring before the call, simulating death */
    int rc_new, rc_reduce;
    cirrus_error err;
} rank_ctx;

static void *rank_main(void *arg)
{
    rank_ctx *c = arg;
    collective *coll = NULL;
    c->rc_new = ring_new(&coll, c->rank, c->world, c->listen_fd, c->hosts, c->ports,
                               &c->opt, &c->err);
    if (c->rc_new) return NULL;
    for (int i = 0; i < c->calls && !c->rc_reduce; i++) {
        if (c->die_after && i == c->die_after) break;
        c->rc_reduce = collective_allreduce_sum(coll, c->data, c->n, &c->err);
    }
    collective_free(coll);
    return NULL;
}

/* Run `world` ranks; data[r] is rank r's buffer of n floats. */
static void run_ring(int world, float **data, size_t n, int calls, size_t chunk_bytes,
                     int die_rank, rank_ctx *ctx)
{
    const char *hosts[MAX_RANKS];
    int ports[MAX_RANKS], fds[MAX_RANKS];
    pthread_t th[MAX_RANKS];
    for (int r = 0; r < world; r++) {
        hosts[r] = "127.0.0.1";
        ASSERT_OK(net_listen("127.0.0.1", 0, &fds[r], &ports[r], NULL));
    }
    for (int r = 0; r < world; r++) {
        ctx[r] = (rank_ctx){.rank = r, .world = world, .listen_fd = fds[r], .hosts = hosts,
                            .ports = ports, .data = data[r], .n = n, .calls = calls};
        ctx[r].opt = (ring_options){.job_id = "ring-test", .timeout_ms = 2000,
                                    .chunk_bytes = chunk_bytes};
        if (r == die_rank) ctx[r].die_after = 1;
        ASSERT(pthread_create(&th[r], NULL, rank_main, &ctx[r]) == 0);
    }
    for (int r = 0; r < world; r++) pthread_join(th[r], NULL);
    for (int r = 0; r < world; r++) close(fds[r]);
}

/* Integer-valued inputs make every sum exact whatever the order, so the expected result is
 * known exactly. */
static void check_exact_sums(int world, size_t n, size_t chunk_bytes)
{
    float *data[MAX_RANKS];
    for (int r = 0; r < world; r++) {
        data[r] = malloc(sizeof(float) * (n ? n : 1));
        for (size_t i = 0; i < n; i++) data[r][i] = (float)((i % 97) + 1000 * r);
    }
    rank_ctx ctx[MAX_RANKS];
    run_ring(world, data, n, 1, chunk_bytes, -1, ctx);
    for (int r = 0; r < world; r++) {
        ASSERT_OK(ctx[r].rc_new);
        if (ctx[r].rc_reduce) TEST_FAIL("rank %d: %s", r, ctx[r].err.msg);
        for (size_t i = 0; i < n; i++) {
            float want = (float)(world * (i % 97) + 1000 * world * (world - 1) / 2);
            if (data[r][i] != want)
                TEST_FAIL("world %d n %zu chunk %zu rank %d [%zu]: %g != %g", world, n,
                          chunk_bytes, r, i, data[r][i], want);
        }
        free(data[r]);
    }
}

/* Sizes cover nothing at all, fewer floats than ranks, empty chunks, ragged segments and
 * many pipelined chunks. */
TEST(ring_allreduce_exact_sums)
{
    const size_t sizes[] = {0, 1, 3, 7, 1000, 65537, 1000003};
    for (int world = 2; world <= 5; world++)
        for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++)
            check_exact_sums(world, sizes[si], 4096);
    /* Chunks picked by the ring (at least 8 per segment, from 256 KiB up to the option):
     * frames several times a default socket buffer, received whole (SO_RCVLOWAT)... */
    check_exact_sums(2, 3000001, 4u << 20);
    check_exact_sums(4, 1000003, 1u << 20);
    /* ... and a largest chunk beyond the kernel's cap on the mark: received without it. */
    check_exact_sums(3, 1000003, 1u << 30);
}

/* With arbitrary floats the sum depends on order; every rank must still hold the same bits
 * (all peers of a stage must take the identical optimizer step), and repeated calls on one
 * communicator must work. */
TEST(ring_allreduce_ranks_agree_bitwise)
{
    enum { WORLD = 3 };
    const size_t n = 300001;
    float *data[MAX_RANKS];
    rng_state g;
    rng_seed(&g, 9);
    double *want = calloc(n, sizeof(double));
    for (int r = 0; r < WORLD; r++) {
        data[r] = malloc(sizeof(float) * n);
        for (size_t i = 0; i < n; i++) data[r][i] = rng_normal(&g);
    }
    /* The first call is checked against a double-precision reference. */
    rank_ctx ctx[MAX_RANKS];
    for (size_t i = 0; i < n; i++)
        for (int r = 0; r < WORLD; r++) want[i] += data[r][i];
    run_ring(WORLD, data, n, 1, 65536, -1, ctx);
    for (int r = 0; r < WORLD; r++) ASSERT_OK(ctx[r].rc_reduce);
    for (int r = 1; r < WORLD; r++) ASSERT(memcmp(data[0], data[r], sizeof(float) * n) == 0);
    for (size_t i = 0; i < n; i++) ASSERT_NEAR(data[0][i], want[i], 1e-5 * (1 + fabs(want[i])));
    /* Three more calls on one communicator: each multiplies the (already equal) buffers by
     * WORLD, so the result is 27 x the first sum. */
    run_ring(WORLD, data, n, 3, 65536, -1, ctx);
    for (int r = 0; r < WORLD; r++) ASSERT_OK(ctx[r].rc_reduce);
    for (int r = 1; r < WORLD; r++) ASSERT(memcmp(data[0], data[r], sizeof(float) * n) == 0);
    for (size_t i = 0; i < 1000; i++)
        ASSERT_NEAR(data[0][i], 27.0 * want[i], 1e-4 * (1 + fabs(27.0 * want[i])));
    for (int r = 0; r < WORLD; r++) free(data[r]);
    free(want);
}

/* A rank that dies before an all-reduce must not hang the others: they fail within the
 * deadline with an error, so the caller can rebuild the ring with the survivors. */
TEST(ring_dead_rank_fails_fast)
{
    enum { WORLD = 3 };
    const size_t n = 100000;
    float *data[MAX_RANKS];
    for (int r = 0; r < WORLD; r++) data[r] = calloc(n, sizeof(float));
    rank_ctx ctx[MAX_RANKS];
    run_ring(WORLD, data, n, 2, 65536, 1, ctx); /* rank 1 leaves after one call */
    int failed = 0;
    for (int r = 0; r < WORLD; r++) {
        ASSERT_OK(ctx[r].rc_new);
        if (r != 1 && ctx[r].rc_reduce) failed++;
    }
    ASSERT_EQ(failed, 2);
    for (int r = 0; r < WORLD; r++) free(data[r]);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* A left neighbour that misbehaves must fail the all-reduce within its deadline, never
 * hang it nor slip bad data into the sum: one that sends nothing, a frame cut off half-way,
 * a well-formed frame shorter than the chunk it owes, a payload whose checksum fails, a
 * frame tagged for another call, a length beyond the chunk's, and a link closed mid-frame.
 * Rank 0 is a real ring rank; rank 1 is played by hand. */
TEST(ring_bad_peer_fails_within_deadline)
{
    enum { N = 4096, CHUNK = 4096 }; /* rank 0 first receives floats [2048, 3072) */
    enum { SILENT, HALF, SHORT, BAD_SUM, BAD_TAG, TOO_LONG, CLOSED, MODES };
    const int want[MODES] = {CIRRUS_ETIMEDOUT, CIRRUS_ETIMEDOUT, 0,       CIRRUS_ECORRUPT,
                             CIRRUS_ECORRUPT,  CIRRUS_ECORRUPT,  CIRRUS_ETRUNC};
    for (int mode = 0; mode < MODES; mode++) {
        const char *hosts[2] = {"127.0.0.1", "127.0.0.1"};
        int ports[2], fds[2];
        for (int r = 0; r < 2; r++)
            ASSERT_OK(net_listen("127.0.0.1", 0, &fds[r], &ports[r], NULL));
        float *data = calloc(N, sizeof(float));
        rank_ctx ctx = {.rank = 0, .world = 2, .listen_fd = fds[0], .hosts = hosts,
                        .ports = ports, .data = data, .n = N, .calls = 1};
        ctx.opt = (ring_options){.job_id = "ring-test", .timeout_ms = 300, .chunk_bytes = CHUNK};
        pthread_t th;
        ASSERT(pthread_create(&th, NULL, rank_main, &ctx) == 0);
        /* Rank 1: accept rank 0's link to its right, then link to rank 0 as its left. */
        net_conn *in = NULL, *out = NULL;
        uint16_t role;
        uint32_t peer;
        ASSERT_OK(net_accept(fds[1], 5000, &in, NULL));
        ASSERT_OK(net_hello_server(in, "ring-test", &role, &peer, 5000, NULL));
        ASSERT_OK(net_connect("127.0.0.1", ports[0], 5000, &out, NULL));
        ASSERT_OK(net_hello_client(out, "ring-test", 128, 1, 5000, NULL));
        double t0 = now_s();
        if (mode != SILENT) {
            static float payload[2 * CHUNK / sizeof(float)];
            uint8_t hdr[WIRE_HEADER_SIZE];
            uint32_t len = mode == SHORT ? 16 : mode == TOO_LONG ? 2 * CHUNK : CHUNK;
            /* The first chunk of the first call: type 128, tag (call 1, item 0). */
            uint64_t tag = mode == BAD_TAG ? 2ull << 32 : 1ull << 32;
            payload[0] = 1.0f;
            wire_header_encode(hdr, 128, tag, payload, len);
            if (mode == BAD_SUM) payload[0] = 2.0f; /* changed after the checksum */
            size_t part = mode == HALF || mode == CLOSED ? len / 2
                          : mode == TOO_LONG                ? CHUNK
                                                            : len;
            ASSERT(write(net_fd(out), hdr, sizeof hdr) == (ssize_t)sizeof hdr);
            ASSERT(write(net_fd(out), payload, part) == (ssize_t)part);
            if (mode == CLOSED) {
                net_close(out);
                out = NULL;
            }
        }
        pthread_join(th, NULL);
        double dt = now_s() - t0;
        ASSERT_OK(ctx.rc_new);
        if (ctx.rc_reduce == 0) TEST_FAIL("mode %d: the all-reduce succeeded", mode);
        if (want[mode] && ctx.rc_reduce != want[mode])
            TEST_FAIL("mode %d: error %d (%s), expected %d", mode, ctx.rc_reduce, ctx.err.msg,
                      want[mode]);
        ASSERT_LT(dt, 3.0);
        net_close(in);
        net_close(out);
        for (int r = 0; r < 2; r++) close(fds[r]);
        free(data);
    }
}

/* A hello from another job's rank is refused with a message naming the job. */
TEST(ring_link_refuses_other_job)
{
    int fd, port;
    ASSERT_OK(net_listen("127.0.0.1", 0, &fd, &port, NULL));
    net_conn *c = NULL, *s = NULL;
    ASSERT_OK(net_connect("127.0.0.1", port, 1000, &c, NULL));
    ASSERT_OK(net_accept(fd, 1000, &s, NULL));
    /* The stranger's HELLO, sent without waiting for the answer. */
    wire_writer w;
    wire_writer_init(&w, 256);
    wire_put_u16(&w, 128);
    wire_put_u32(&w, 0);
    wire_put_str(&w, "other-job");
    ASSERT_OK(net_send_frame(c, WIRE_HELLO, 1, w.data, (uint32_t)w.len, 1000));
    wire_writer_free(&w);
    uint16_t role;
    uint32_t peer;
    cirrus_error err = {0};
    ASSERT_EQ(net_hello_server(s, "ring-test", &role, &peer, 1000, &err), CIRRUS_EMISMATCH);
    ASSERT(strstr(err.msg, "other-job") != NULL);
    net_close(s);
    net_close(c);
    close(fd);
}
