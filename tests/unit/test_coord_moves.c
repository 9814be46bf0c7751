/* Tests of the region coordinator's public entry (coordinator_run) and of rebalancing
 * (trainer/swarm/coord/moves.c): capacity from the heartbeat's stats, and moves between
 * unbalanced stages seen in /status and /metrics. */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "../../trainer/net/conn.h"
#include "../../trainer/swarm/coord/coordinator.h"
#include "coord_test_util.h"
#include "test.h"

/* ---- the public entry ---- */

typedef struct run_job {
    coordinator_options o;
    volatile sig_atomic_t stop;
    int rc;
    cirrus_error err;
} run_job;

static void *run_main(void *arg)
{
    run_job *j = arg;
    j->rc = coordinator_run(&j->o, &j->stop, &j->err);
    return NULL;
}

static int free_port(void)
{
    int fd, port;
    cirrus_error err = {0};
    ASSERT_OK(net_listen("127.0.0.1", 0, &fd, &port, &err));
    close(fd);
    return port;
}

TEST_T(coordinator_run_serves_until_stopped, 10)
{
    run_job j = {.o = {.job_id = JOB, .host = "127.0.0.1", .port = free_port(),
                       .http_port = free_port(), .n_stages = 3, .heartbeat_ms = 100}};
    pthread_t th;
    ASSERT_OK(pthread_create(&th, NULL, run_main, &j));
    /* It is up once it answers. */
    coord_client *c = client_at(j.o.port);
    coord_registration r = stage_reg("p", 2, 0, 1, 7001, 1);
    cirrus_error err = {0};
    double t0 = now_ms();
    while (coord_client_register(c, &r, T_MS, NULL, &err)) {
        if (now_ms() - t0 > T_MS) TEST_FAIL("coordinator_run never answered: %s", err.msg);
        sleep_ms(10);
    }
    http_reply h;
    http_req(j.o.http_port, "GET", "/metrics", &h);
    ASSERT_EQ(h.status, 200);
    has_line(h.body, "cirrus_peers{stage=\"2\"} 1");
    has_line(h.body, "cirrus_stages 3");
    free(h.body);
    __atomic_store_n(&j.stop, 1, __ATOMIC_RELAXED);
    pthread_join(th, NULL);
    ASSERT_OK(j.rc);
    coord_client_close(c);

    /* Bad options are refused with a message. */
    run_job bad = {.o = {.job_id = JOB, .n_stages = 0}};
    ASSERT_EQ(coordinator_run(&bad.o, &bad.stop, &bad.err), CIRRUS_EINVAL);
    ASSERT(strstr(bad.err.msg, "stage count") != NULL);
}

/* Capacity in forward units per busy second for one forward and one backward per sample:
 * a backward counts as WIRING_BACKWARD_COST (2.5) forwards. */
TEST_T(coordinator_capacity_from_stats, 5)
{
    coord_stats s = {.fwd_throughput = 10, .bwd_throughput = 4};
    ASSERT_NEAR(coord_stats_capacity(&s), 3.5 / (0.1 + 0.25), 1e-12); /* 10: as charged */
    s.bwd_throughput = 0; /* a peer that measures forwards only */
    ASSERT_NEAR(coord_stats_capacity(&s), 10, 0);
    s.fwd_throughput = 0;
    ASSERT_NEAR(coord_stats_capacity(&s), 0, 0);
}

/* Every period the coordinator feeds the policy its live stage peers: three peers of equal
 * capacity on stage 0 and one on stage 1 (of equal depth) -> exactly one stage-0 peer is
 * told to move to stage 1; once it registered there (2, 2), nothing moves again, however
 * many periods pass. /status and /metrics count the move. Before the job's first step
 * (peers reporting step 0) no period starts: nothing moves in three periods' time. */
TEST_T(coordinator_rebalances_unbalanced_stages, 15)
{
    coordinator_options o = {.job_id = JOB, .host = "127.0.0.1", .http_port = 0, .n_stages = 2,
                             .n_layer = 8, .heartbeat_ms = 1000, .rebalance_period_ms = 200};
    coordinator *co = NULL;
    cirrus_error err = {0};
    if (coordinator_start(&o, &co, &err)) TEST_FAIL("coordinator_start: %s", err.msg);
    enum { NP = 4 };
    static const char *names[NP] = {"a", "b", "c", "d"};
    coord_client *m[NP];
    coord_registered id[NP];
    for (int i = 0; i < NP; i++)
        m[i] = join(co, stage_reg(names[i], i < 3 ? 0 : 1, i < 3 ? 0 : 4, i < 3 ? 4 : 8,
                                  (uint16_t)(7001 + i), 10), &id[i]);
    coord_stats s = {.loss = NAN, .fwd_throughput = 10, .bwd_throughput = 4}; /* capacity 10 */
    uint32_t ins[NP];
    int mover = -1;
    for (double t0 = now_ms(); now_ms() - t0 < 600; sleep_ms(50))
        for (int i = 0; i < NP; i++) {
            heartbeat(m[i], &s, &ins[i], NULL);
            ASSERT_EQ(ins[i], COORD_NO_INSTRUCTION); /* not training yet */
        }
    s.step = 1; /* the job's first step: the first period starts */
    for (double t0 = now_ms(); mover < 0 && now_ms() - t0 < 3000; sleep_ms(50))
        for (int i = 0; i < NP; i++) {
            heartbeat(m[i], &s, &ins[i], NULL);
            if (ins[i] != COORD_NO_INSTRUCTION) mover = i;
        }
    ASSERT(mover >= 0 && mover < 3);
    ASSERT_EQ(ins[mover], 1);
    coord_snapshot snap;
    ASSERT_OK(coordinator_snapshot(co, &snap));
    ASSERT_EQ(snap.moves, 1);
    ASSERT_EQ(snap.n_recent, 1);
    ASSERT_EQ(snap.recent[0].peer_id, id[mover].peer_id);
    ASSERT_EQ(snap.recent[0].from_stage, 0);
    ASSERT_EQ(snap.recent[0].to_stage, 1);
    ASSERT_NEAR(snap.recent[0].min_before, 10, 1e-9);
    ASSERT_NEAR(snap.recent[0].min_after, 20, 1e-9);
    ASSERT_NEAR(snap.stage_capacity[0], 30, 1e-9);
    coord_snapshot_free(&snap);

    /* It moves: registers at stage 1 under the same name. Then 2, 2 stays put. */
    coord_registration moved = stage_reg(names[mover], 1, 4, 8, (uint16_t)(7001 + mover), 10);
    ASSERT_OK(coord_client_register(m[mover], &moved, T_MS, NULL, &err));
    for (double t0 = now_ms(); now_ms() - t0 < 1500; sleep_ms(50))
        for (int i = 0; i < NP; i++) {
            heartbeat(m[i], &s, &ins[i], NULL);
            ASSERT_EQ(ins[i], COORD_NO_INSTRUCTION);
        }
    json_t *j = get_status(co);
    json_t *rb = json_object_get(j, "rebalance");
    ASSERT_EQ(jint(rb, "moves"), 1);
    ASSERT_EQ(jint(rb, "withdrawn"), 0);
    ASSERT_NEAR(jnum(rb, "period_s"), 0.2, 1e-12);
    json_t *recent = json_object_get(rb, "recent");
    ASSERT_EQ(json_array_size(recent), 1);
    ASSERT_EQ(jint(json_array_get(recent, 0), "peer"), id[mover].peer_id);
    ASSERT_EQ(jint(json_array_get(recent, 0), "to"), 1);
    json_t *st = json_object_get(j, "stages");
    ASSERT_EQ(jint(json_array_get(st, 0), "peers"), 2);
    ASSERT_EQ(jint(json_array_get(st, 1), "peers"), 2);
    ASSERT_NEAR(jnum(json_array_get(st, 1), "capacity"), 20, 1e-9);
    json_t *me = json_array_get(json_object_get(j, "members"), (size_t)mover);
    ASSERT(json_is_null(json_object_get(me, "moving_to")));
    ASSERT_NEAR(jnum(me, "capacity"), 10, 1e-9);
    json_decref(j);
    char *t = get_metrics(co);
    has_line(t, "cirrus_rebalance_moves_total 1");
    has_line(t, "cirrus_stage_capacity{stage=\"1\"} 20");
    free(t);
    for (int i = 0; i < NP; i++) coord_client_close(m[i]);
    coordinator_stop(co);
}

/* max_stage_peers (the gateway's --max-stage-peers, the operator's peers.max): the same
 * unbalanced swarm as above, but stage 1 already has the most peers a stage may have, so
 * nobody is told to move there over five periods. */
TEST_T(coordinator_rebalance_bounded_by_max_stage_peers, 15)
{
    coordinator_options o = {.job_id = JOB, .host = "127.0.0.1", .http_port = 0, .n_stages = 2,
                             .n_layer = 8, .heartbeat_ms = 1000, .rebalance_period_ms = 200,
                             .max_stage_peers = 1};
    coordinator *co = NULL;
    cirrus_error err = {0};
    if (coordinator_start(&o, &co, &err)) TEST_FAIL("coordinator_start: %s", err.msg);
    enum { NP = 4 };
    static const char *names[NP] = {"a", "b", "c", "d"};
    coord_client *m[NP];
    coord_registered id[NP];
    for (int i = 0; i < NP; i++)
        m[i] = join(co, stage_reg(names[i], i < 3 ? 0 : 1, i < 3 ? 0 : 4, i < 3 ? 4 : 8,
                                  (uint16_t)(7001 + i), 10), &id[i]);
    coord_stats s = {.loss = NAN, .step = 1, .fwd_throughput = 10, .bwd_throughput = 4};
    uint32_t ins;
    for (double t0 = now_ms(); now_ms() - t0 < 1000; sleep_ms(50))
        for (int i = 0; i < NP; i++) {
            heartbeat(m[i], &s, &ins, NULL);
            ASSERT_EQ(ins, COORD_NO_INSTRUCTION);
        }
    coord_snapshot snap;
    ASSERT_OK(coordinator_snapshot(co, &snap));
    ASSERT_EQ(snap.moves, 0);
    coord_snapshot_free(&snap);
    for (int i = 0; i < NP; i++) coord_client_close(m[i]);
    coordinator_stop(co);
}
