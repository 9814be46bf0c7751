/* TCP ring all-reduce: ranks as threads of one process, linked by real loopback sockets. */
#include <pthread.h>
#include <string.h>
#include <unistd.h>

#include "../../common/rng.h"
#include "../../trainer/net/collective.h"
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
    int rc_create, rc_reduce;
    cirrus_error err;
} rank_ctx;

static void *rank_main(void *arg)
{
    rank_ctx *c = arg;
    collective *coll = NULL;
    c->rc_create = ring_create(&coll, c->rank, c->world, c->listen_fd, c->hosts, c->ports,
                               &c->opt, &c->err);
    if (c->rc_create) return NULL;
    for (int i = 0; i < c->calls && !c->rc_reduce; i++) {
        if (c->die_after && i == c->die_after) break;
        c->rc_reduce = collective_allreduce_sum(coll, c->data, c->n, &c->err);
    }
    collective_destroy(coll);
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
 * known exactly. Sizes cover empty chunks, ragged segments and many pipelined chunks. */
TEST(ring_allreduce_exact_sums)
{
    const size_t sizes[] = {1, 3, 7, 1000, 65537, 1000003};
    for (int world = 2; world <= 4; world++) {
        for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
            size_t n = sizes[si];
            float *data[MAX_RANKS];
            for (int r = 0; r < world; r++) {
                data[r] = malloc(sizeof(float) * n);
                for (size_t i = 0; i < n; i++) data[r][i] = (float)((i % 97) + 1000 * r);
            }
            rank_ctx ctx[MAX_RANKS];
            run_ring(world, data, n, 1, 4096, -1, ctx);
            for (int r = 0; r < world; r++) {
                ASSERT_OK(ctx[r].rc_create);
                if (ctx[r].rc_reduce) TEST_FAIL("rank %d: %s", r, ctx[r].err.msg);
                for (size_t i = 0; i < n; i++) {
                    float want = (float)(world * (i % 97) + 1000 * world * (world - 1) / 2);
                    if (data[r][i] != want)
                        TEST_FAIL("world %d n %zu rank %d [%zu]: %g != %g", world, n, r, i,
                                  data[r][i], want);
                }
                free(data[r]);
            }
        }
    }
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
        ASSERT_OK(ctx[r].rc_create);
        if (r != 1 && ctx[r].rc_reduce) failed++;
    }
    ASSERT_EQ(failed, 2);
    for (int r = 0; r < WORLD; r++) free(data[r]);
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
