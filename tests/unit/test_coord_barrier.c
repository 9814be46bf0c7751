/* Tests of the region coordinator's step barrier (trainer/swarm/coord/barrier.c, STEP_SYNC):
 * counting and summing arrivals, REDO notices and their ids across a restart, held
 * ARRIVEs, bad input, and the STEP_SYNC messages on their own. */
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

/* ---- the step barrier (STEP_SYNC) ---- */

static coord_step_sync step_req(uint8_t op, uint64_t step, uint32_t index, uint32_t n_clients,
                                uint32_t microbatches, double loss_sum, uint64_t redo_seen)
{
    return (coord_step_sync){.op = op, .step = step, .client_index = index,
                             .n_clients = n_clients, .microbatches = microbatches,
                             .loss_sum = loss_sum, .redo_seen = redo_seen};
}

static coord_step_sync redo_req(uint64_t step, uint32_t stage, const char *addr)
{
    coord_step_sync q = step_req(COORD_STEP_REDO, step, 0, 1, 0, 0, 0);
    q.stage = stage;
    snprintf(q.addr, sizeof q.addr, "%s", addr);
    return q;
}

static coord_step_state step_sync(coord_client *c, coord_step_sync q)
{
    coord_step_state st;
    cirrus_error err = {0};
    if (coord_client_step_sync(c, &q, T_MS, &st, &err)) TEST_FAIL("step sync: %s", err.msg);
    return st;
}

static coord_step_state arrive(coord_client *c, uint64_t step, uint32_t index, uint32_t n,
                               uint32_t mb, double loss, uint64_t redo_seen)
{
    return step_sync(c, step_req(COORD_STEP_ARRIVE, step, index, n, mb, loss, redo_seen));
}

/* Two clients of one job: arrivals counted and summed per step; APPLIED moves the applied
 * step; the leader arriving at t says t - 1 was applied; a follower's arrival says nothing
 * about it. No registration is needed. */
TEST_T(coordinator_step_barrier_counts, 10)
{
    coordinator *co = start(2);
    coord_client *lead = client_at(coordinator_port(co));
    coord_client *follow = client_at(coordinator_port(co));

    coord_step_state st = arrive(lead, 1, 0, 2, 3, 6.5, 0);
    ASSERT_EQ(st.arrived, 1);
    ASSERT_EQ(st.microbatches, 3);
    ASSERT_NEAR(st.loss_sum, 6.5, 0);
    ASSERT_EQ(st.applied_step, 0);
    ASSERT_EQ(st.latest_notice, 0);
    ASSERT_EQ(st.n_notices, 0);
    st = arrive(follow, 1, 1, 2, 5, 1.25, 0);
    ASSERT_EQ(st.arrived, 2);
    ASSERT_EQ(st.microbatches, 8);
    ASSERT_NEAR(st.loss_sum, 7.75, 0);
    ASSERT_EQ(st.applied_step, 0);

    /* Re-arriving replaces the slot rather than adding to it. */
    st = arrive(follow, 1, 1, 2, 4, 1.0, 0);
    ASSERT_EQ(st.arrived, 2);
    ASSERT_EQ(st.microbatches, 7);
    ASSERT_NEAR(st.loss_sum, 7.5, 0);

    /* APPLIED records no arrival; any client may ask for the state by it. */
    st = step_sync(lead, step_req(COORD_STEP_APPLIED, 1, 0, 2, 0, 0, 0));
    ASSERT_EQ(st.applied_step, 1);
    ASSERT_EQ(st.arrived, 2);
    ASSERT_EQ(st.microbatches, 7);
    /* An older APPLIED does not move it back. */
    st = step_sync(follow, step_req(COORD_STEP_APPLIED, 1, 1, 2, 0, 0, 0));
    ASSERT_EQ(st.applied_step, 1);

    /* Step 2: only the follower so far; nothing of step 1 is counted there. */
    st = arrive(follow, 2, 1, 2, 6, 2.0, 0);
    ASSERT_EQ(st.arrived, 1);
    ASSERT_EQ(st.microbatches, 6);
    ASSERT_NEAR(st.loss_sum, 2.0, 0);
    ASSERT_EQ(st.applied_step, 1);

    /* The leader at step 3: step 2 was applied even though its APPLIED never came. */
    st = arrive(lead, 3, 0, 2, 1, 0.5, 0);
    ASSERT_EQ(st.applied_step, 2);
    ASSERT_EQ(st.arrived, 1);
    ASSERT_EQ(st.microbatches, 1);
    /* A follower far ahead implies nothing. */
    st = arrive(follow, 9, 1, 2, 1, 0.5, 0);
    ASSERT_EQ(st.applied_step, 2);
    ASSERT_EQ(st.arrived, 1);
    /* The leader's slot left step 1: step 1 now counts neither. */
    st = step_sync(lead, step_req(COORD_STEP_APPLIED, 1, 0, 2, 0, 0, 0));
    ASSERT_EQ(st.arrived, 0);
    ASSERT_EQ(st.microbatches, 0);
    ASSERT_NEAR(st.loss_sum, 0, 0);
    ASSERT_EQ(st.applied_step, 2);

    coord_client_close(lead);
    coord_client_close(follow);
    coordinator_stop(co);
}

/* The loss is summed in client index order, whatever the arrival order, so every client
 * computes the same mean bit for bit: 1e16 + -1e16 + 1 is exactly 1 in that order, while
 * the arrival order (1 + -1e16 + 1e16) loses the 1. */
TEST_T(coordinator_step_barrier_sums_in_client_order, 10)
{
    coordinator *co = start(1);
    coord_client *c = client_at(coordinator_port(co));
    arrive(c, 7, 2, 3, 1, 1.0, 0);
    arrive(c, 7, 1, 3, 1, -1e16, 0);
    coord_step_state st = arrive(c, 7, 0, 3, 1, 1e16, 0);
    ASSERT_EQ(st.arrived, 3);
    ASSERT_EQ(st.microbatches, 3);
    ASSERT(st.loss_sum == 1.0);
    ASSERT(1.0 + -1e16 + 1e16 != 1.0); /* the test means something */
    coord_client_close(c);
    coordinator_stop(co);
}

/* A REDO notice for step t un-counts every client that has not acted on it: each is
 * listed the notice until it arrives again with redo_seen >= its id. Notices of other
 * steps are not listed; many are listed 16 at a time, oldest first; only the newest 64
 * are remembered. */
TEST_T(coordinator_step_barrier_redo, 10)
{
    coordinator *co = start(2);
    coord_client *lead = client_at(coordinator_port(co));
    coord_client *follow = client_at(coordinator_port(co));
    coord_client *peer = client_at(coordinator_port(co)); /* whoever saw the loss */

    /* A notice of step 3 first: it must not show at step 4. */
    coord_step_state st = step_sync(peer, redo_req(3, 0, "127.0.0.1:4000"));
    ASSERT_EQ(st.latest_notice, 1);
    ASSERT_EQ(st.n_notices, 1);
    ASSERT_EQ(st.notices[0].id, 1);

    arrive(lead, 4, 0, 2, 2, 2.0, 0);
    st = arrive(follow, 4, 1, 2, 3, 3.0, 0);
    ASSERT_EQ(st.arrived, 2);
    ASSERT_EQ(st.latest_notice, 0);
    ASSERT_EQ(st.n_notices, 0);

    st = step_sync(peer, redo_req(4, 1, "127.0.0.1:5000"));
    const uint64_t id = st.latest_notice;
    ASSERT_EQ(id, 2);
    ASSERT_EQ(st.n_notices, 1);
    ASSERT_EQ(st.notices[0].id, id);
    ASSERT_EQ(st.notices[0].stage, 1);
    ASSERT(!strcmp(st.notices[0].addr, "127.0.0.1:5000"));
    ASSERT_EQ(st.arrived, 0); /* neither has seen it */
    ASSERT_EQ(st.microbatches, 0);
    ASSERT_NEAR(st.loss_sum, 0, 0);

    /* The follower, not knowing yet, arrives again: it is told, and not counted. */
    st = arrive(follow, 4, 1, 2, 3, 3.0, 0);
    ASSERT_EQ(st.arrived, 0);
    ASSERT_EQ(st.latest_notice, id);
    ASSERT_EQ(st.n_notices, 1);
    ASSERT_EQ(st.notices[0].id, id);
    ASSERT_EQ(st.notices[0].stage, 1);
    ASSERT(!strcmp(st.notices[0].addr, "127.0.0.1:5000"));
    /* It redid its share and arrives having seen the notice: counted, nothing listed. */
    st = arrive(follow, 4, 1, 2, 4, 3.5, id);
    ASSERT_EQ(st.arrived, 1);
    ASSERT_EQ(st.microbatches, 4);
    ASSERT_NEAR(st.loss_sum, 3.5, 0);
    ASSERT_EQ(st.latest_notice, id);
    ASSERT_EQ(st.n_notices, 0);
    st = arrive(lead, 4, 0, 2, 2, 2.5, id);
    ASSERT_EQ(st.arrived, 2);
    ASSERT_EQ(st.microbatches, 6);
    ASSERT_NEAR(st.loss_sum, 6.0, 0);

    /* Step 3's notice is still listed at step 3 only. */
    st = step_sync(peer, step_req(COORD_STEP_APPLIED, 3, 0, 2, 0, 0, 0));
    ASSERT_EQ(st.latest_notice, 1);
    ASSERT_EQ(st.n_notices, 1);
    ASSERT_EQ(st.notices[0].id, 1);
    ASSERT(!strcmp(st.notices[0].addr, "127.0.0.1:4000"));

    /* 20 notices at step 5 (ids 3..22): 16 at a time, oldest first. */
    for (int k = 0; k < 20; k++) st = step_sync(peer, redo_req(5, (uint32_t)(k % 2), "h:1"));
    ASSERT_EQ(st.latest_notice, 22);
    ASSERT_EQ(st.n_notices, COORD_MAX_NOTICES);
    ASSERT_EQ(st.notices[0].id, 3);
    ASSERT_EQ(st.notices[COORD_MAX_NOTICES - 1].id, 18);
    st = arrive(lead, 5, 0, 2, 1, 1.0, 18);
    ASSERT_EQ(st.arrived, 0); /* 22 is newer than 18 */
    ASSERT_EQ(st.n_notices, 4);
    ASSERT_EQ(st.notices[0].id, 19);
    ASSERT_EQ(st.notices[3].id, 22);
    ASSERT_EQ(st.notices[3].stage, 1);
    st = arrive(lead, 5, 0, 2, 1, 1.0, 22);
    ASSERT_EQ(st.arrived, 1);
    ASSERT_EQ(st.n_notices, 0);

    /* 64 more notices elsewhere push step 3's out of memory. */
    for (int k = 0; k < COORD_NOTICE_KEEP; k++) step_sync(peer, redo_req(6, 0, "h:1"));
    st = step_sync(peer, step_req(COORD_STEP_APPLIED, 3, 0, 2, 0, 0, 0));
    ASSERT_EQ(st.latest_notice, 0);
    ASSERT_EQ(st.n_notices, 0);
    st = step_sync(peer, step_req(COORD_STEP_APPLIED, 6, 0, 2, 0, 0, 0));
    ASSERT_EQ(st.latest_notice, 22 + COORD_NOTICE_KEEP);
    ASSERT_EQ(st.notices[0].id, 23);

    coord_client_close(lead);
    coord_client_close(follow);
    coord_client_close(peer);
    coordinator_stop(co);
}

/* A restarted coordinator has forgotten its notices, but its ids must not start over: a
 * follower that acted on notice k skips ids <= k, so a notice the leader re-posts must get
 * a larger id. The leader's REDO carries the newest id it posted and a client's ARRIVE the
 * newest it acted on; the restarted coordinator numbers past both. */
TEST_T(coordinator_step_notice_ids_survive_restart, 10)
{
    coordinator *co = start(2);
    coord_client *lead = client_at(coordinator_port(co));
    for (int k = 0; k < 3; k++) step_sync(lead, redo_req(8, 1, "127.0.0.1:5000"));
    coord_step_state st = arrive(lead, 8, 0, 2, 2, 2.0, 3);
    ASSERT_EQ(st.latest_notice, 3);
    coord_client_close(lead);
    coordinator_stop(co);

    co = start(2); /* the restart: nothing remembered */
    lead = client_at(coordinator_port(co));
    coord_client *follow = client_at(coordinator_port(co));
    /* The follower acted on notice 3 before the restart; its arrival says so. */
    st = arrive(follow, 8, 1, 2, 3, 3.0, 3);
    ASSERT_EQ(st.latest_notice, 0); /* forgotten: the leader must see it is gone */
    ASSERT_EQ(st.arrived, 1);
    /* The leader re-posts: id 4, listed to the follower, which is no longer counted. */
    coord_step_sync q = redo_req(8, 1, "127.0.0.1:5000");
    q.redo_seen = 3;
    st = step_sync(lead, q);
    ASSERT_EQ(st.latest_notice, 4);
    st = arrive(follow, 8, 1, 2, 3, 3.0, 3);
    ASSERT_EQ(st.arrived, 0);
    ASSERT_EQ(st.n_notices, 1);
    ASSERT_EQ(st.notices[0].id, 4);
    ASSERT(!strcmp(st.notices[0].addr, "127.0.0.1:5000"));

    /* A client that saw more than the leader said (ids jump to 10): the next notice is 11,
     * and the ids skipped list nothing. */
    arrive(follow, 9, 1, 2, 3, 3.0, 10);
    st = step_sync(lead, redo_req(9, 0, "127.0.0.1:4000"));
    ASSERT_EQ(st.latest_notice, 11);
    ASSERT_EQ(st.n_notices, 1);
    ASSERT_EQ(st.notices[0].id, 11);
    coord_client_close(lead);
    coord_client_close(follow);
    coordinator_stop(co);
}

typedef struct held_arrive {
    coord_client *c;
    coord_step_sync q;
    coord_step_state st;
    double ms; /* how long the answer took */
} held_arrive;

static void *held_arrive_main(void *arg)
{
    held_arrive *h = arg;
    double t0 = now_ms();
    h->st = step_sync(h->c, h->q);
    h->ms = now_ms() - t0;
    return NULL;
}

/* Send an ARRIVE held up to 2 s from a thread of its own, then wait 300 ms: the caller
 * then makes the change it waits for, and held_join checks it was answered then. */
static void held_start(held_arrive *h, pthread_t *th, coord_client *c, coord_step_sync q)
{
    *h = (held_arrive){.c = c, .q = q};
    h->q.wait_ms = 2000;
    ASSERT(pthread_create(th, NULL, held_arrive_main, h) == 0);
    sleep_ms(300);
}

static void held_join(held_arrive *h, pthread_t th)
{
    pthread_join(th, NULL);
    if (h->ms < 250 || h->ms >= 1000) TEST_FAIL("answered after %.0f ms, not ~300", h->ms);
}

/* An ARRIVE with wait_ms is answered when what its client waits for is there, not before
 * and not much after: the leader's once every client is counted, a follower's once the
 * step is applied or a notice for it is posted; with nothing happening, after wait_ms.
 * Only an ARRIVE may wait, and at most COORD_STEP_WAIT_MAX_MS. */
TEST_T(coordinator_step_barrier_holds_arrivals, 15)
{
    coordinator *co = start(2);
    coord_client *lead = client_at(coordinator_port(co));
    coord_client *follow = client_at(coordinator_port(co));
    coord_client *other = client_at(coordinator_port(co));

    /* The leader waits for the follower, which comes 300 ms later. */
    held_arrive h;
    pthread_t th;
    held_start(&h, &th, lead, step_req(COORD_STEP_ARRIVE, 1, 0, 2, 2, 1.0, 0));
    arrive(follow, 1, 1, 2, 3, 2.0, 0);
    held_join(&h, th);
    ASSERT_EQ(h.st.arrived, 2);
    ASSERT_EQ(h.st.microbatches, 5);

    /* The follower waits for APPLIED, 300 ms later. */
    held_start(&h, &th, follow, step_req(COORD_STEP_ARRIVE, 1, 1, 2, 3, 2.0, 0));
    step_sync(lead, step_req(COORD_STEP_APPLIED, 1, 0, 2, 0, 0, 0));
    held_join(&h, th);
    ASSERT_EQ(h.st.applied_step, 1);

    /* At step 2 the follower waits; a notice posted 300 ms later wakes it, listed. */
    held_start(&h, &th, follow, step_req(COORD_STEP_ARRIVE, 2, 1, 2, 3, 2.0, 0));
    step_sync(other, redo_req(2, 1, "127.0.0.1:5000"));
    held_join(&h, th);
    ASSERT_EQ(h.st.n_notices, 1);

    /* Already there: answered at once. Nothing coming: answered after wait_ms. */
    h = (held_arrive){.c = follow, .q = step_req(COORD_STEP_ARRIVE, 1, 1, 2, 3, 2.0, 0)};
    h.q.wait_ms = 2000;
    held_arrive_main(&h);
    ASSERT(h.ms < 200);
    h = (held_arrive){.c = lead, .q = step_req(COORD_STEP_ARRIVE, 3, 0, 2, 2, 1.0, 0)};
    h.q.wait_ms = 400;
    held_arrive_main(&h);
    ASSERT_EQ(h.st.arrived, 1);
    ASSERT(h.ms >= 350 && h.ms < 1500);

    coord_client_close(lead);
    coord_client_close(follow);
    coord_client_close(other);
    coordinator_stop(co);

    /* The checks: an APPLIED that asks to wait, and too long a wait, are malformed. */
    coord_step_sync bad = step_req(COORD_STEP_APPLIED, 1, 0, 1, 0, 0, 0);
    bad.wait_ms = 10;
    wire_writer w;
    wire_writer_init(&w, 256);
    coord_put_step_sync(&w, &bad);
    coord_step_sync back;
    cirrus_error err = {0};
    ASSERT_EQ(coord_get_step_sync(w.data, w.len, &back, &err), CIRRUS_ECORRUPT);
    ASSERT(strstr(err.msg, "only an ARRIVE may wait"));
    wire_writer_free(&w);
    bad = step_req(COORD_STEP_ARRIVE, 1, 0, 1, 0, 0, 0);
    bad.wait_ms = COORD_STEP_WAIT_MAX_MS + 1;
    wire_writer_init(&w, 256);
    coord_put_step_sync(&w, &bad);
    ASSERT_EQ(coord_get_step_sync(w.data, w.len, &back, &err), CIRRUS_ECORRUPT);
    wire_writer_free(&w);
}

/* Encode q into w (reset first). */
static void put_step(wire_writer *w, coord_step_sync q)
{
    wire_writer_free(w);
    wire_writer_init(w, 1024);
    coord_put_step_sync(w, &q);
}

/* Send a STEP_SYNC on a raw connection; return the reply type (ERROR fills code, msg). */
static int raw_step(net_conn *c, coord_step_sync q, int *code, char msg[256])
{
    wire_writer w;
    wire_writer_init(&w, 1024);
    coord_put_step_sync(&w, &q);
    int type = raw_call(c, COORD_STEP_SYNC, w.data, w.len, code, msg);
    wire_writer_free(&w);
    return type;
}

/* Mistakes (a client count that differs from the job's, a stage the coordinator does not
 * have) are answered CIRRUS_EINVAL on a connection that stays; malformed requests are
 * CIRRUS_ECORRUPT and drop only their own connection. */
TEST_T(coordinator_step_barrier_bad_input, 15)
{
    coordinator *co = start(2);
    int port = coordinator_port(co);
    coord_client *lead = client_at(port);
    arrive(lead, 1, 0, 2, 1, 1.0, 0);

    /* Through the client: the codes come back as such. */
    coord_step_state st;
    cirrus_error err = {0};
    coord_step_sync q = step_req(COORD_STEP_ARRIVE, 1, 1, 3, 1, 1.0, 0);
    ASSERT_EQ(coord_client_step_sync(lead, &q, T_MS, &st, &err), CIRRUS_EINVAL);
    if (!strstr(err.msg, "n_clients 3 differs from the job's 2")) TEST_FAIL("%s", err.msg);
    q = redo_req(1, 2, "127.0.0.1:5000");
    ASSERT_EQ(coord_client_step_sync(lead, &q, T_MS, &st, &err), CIRRUS_EINVAL);
    if (!strstr(err.msg, "stage 2 is outside 0..1")) TEST_FAIL("%s", err.msg);
    /* What the coordinator would refuse as malformed is refused here, unsent. */
    q = step_req(9, 1, 0, 2, 1, 1.0, 0);
    ASSERT_EQ(coord_client_step_sync(lead, &q, T_MS, &st, &err), CIRRUS_EINVAL);
    ASSERT(strstr(err.msg, "op 9") != NULL);
    st = arrive(lead, 1, 0, 2, 1, 1.0, 0);
    ASSERT_EQ(st.arrived, 1); /* nothing of the refused requests was recorded */

    /* On one raw connection: refused, and the same connection answers the next request. */
    net_conn *g = raw_connect(port);
    int code = 0;
    char msg[256] = "";
    ASSERT_EQ(raw_step(g, step_req(COORD_STEP_ARRIVE, 1, 1, 3, 1, 1.0, 0), &code, msg),
              WIRE_ERROR);
    ASSERT_EQ(code, CIRRUS_EINVAL);
    ASSERT(strstr(msg, "n_clients 3 differs from the job's 2") != NULL);
    ASSERT_EQ(raw_step(g, redo_req(1, 2, "127.0.0.1:5000"), &code, msg), WIRE_ERROR);
    ASSERT_EQ(code, CIRRUS_EINVAL);
    ASSERT_EQ(raw_step(g, step_req(COORD_STEP_ARRIVE, 1, 1, 2, 2, 0.5, 0), &code, msg),
              COORD_STEP_SYNC_OK);

    /* Malformed: ERROR(ECORRUPT) naming the field, that connection dropped. */
    wire_writer w;
    wire_writer_init(&w, 16);
    put_step(&w, step_req(9, 1, 0, 2, 1, 1.0, 0));
    expect_refused(port, COORD_STEP_SYNC, w.data, w.len, "op 9");
    put_step(&w, step_req(0, 1, 0, 2, 1, 1.0, 0));
    expect_refused(port, COORD_STEP_SYNC, w.data, w.len, "op 0");
    put_step(&w, step_req(COORD_STEP_ARRIVE, 0, 0, 2, 1, 1.0, 0));
    expect_refused(port, COORD_STEP_SYNC, w.data, w.len, "step 0");
    put_step(&w, step_req(COORD_STEP_ARRIVE, 1, 2, 2, 1, 1.0, 0));
    expect_refused(port, COORD_STEP_SYNC, w.data, w.len, "client_index 2 is not below");
    put_step(&w, step_req(COORD_STEP_ARRIVE, 1, 0, 0, 1, 1.0, 0));
    expect_refused(port, COORD_STEP_SYNC, w.data, w.len, "n_clients 0 is outside 1..64");
    put_step(&w, step_req(COORD_STEP_ARRIVE, 1, 0, 65, 1, 1.0, 0));
    expect_refused(port, COORD_STEP_SYNC, w.data, w.len, "n_clients 65");
    put_step(&w, step_req(COORD_STEP_ARRIVE, 1, 0, 2, 1, NAN, 0));
    expect_refused(port, COORD_STEP_SYNC, w.data, w.len, "loss_sum");
    put_step(&w, step_req(COORD_STEP_ARRIVE, 1, 0, 2, 1, -INFINITY, 0));
    expect_refused(port, COORD_STEP_SYNC, w.data, w.len, "loss_sum");
    put_step(&w, redo_req(1, 0, ""));
    expect_refused(port, COORD_STEP_SYNC, w.data, w.len, "REDO without an addr");
    put_step(&w, redo_req(1, 0, "a b:1"));
    expect_refused(port, COORD_STEP_SYNC, w.data, w.len, "addr");
    q = step_req(COORD_STEP_ARRIVE, 1, 0, 2, 1, 1.0, 0);
    snprintf(q.addr, sizeof q.addr, "127.0.0.1:5000");
    put_step(&w, q);
    expect_refused(port, COORD_STEP_SYNC, w.data, w.len, "only REDO names one");
    put_step(&w, redo_req(1, 0, "127.0.0.1:5000"));
    for (size_t cut = 0; cut < w.len; cut += 7)
        expect_refused(port, COORD_STEP_SYNC, w.data, cut, "truncated STEP_SYNC");
    wire_put_u32(&w, 0);
    expect_refused(port, COORD_STEP_SYNC, w.data, w.len, "trailing bytes");
    wire_writer_free(&w);

    /* Meanwhile the good connection and the client kept being served, and nothing of the
     * malformed requests was recorded. */
    ASSERT_EQ(raw_step(g, step_req(COORD_STEP_APPLIED, 1, 1, 2, 0, 0, 0), &code, msg),
              COORD_STEP_SYNC_OK);
    net_close(g);
    st = arrive(lead, 1, 0, 2, 1, 1.0, 0);
    ASSERT_EQ(st.arrived, 2);
    ASSERT_EQ(st.microbatches, 3);
    ASSERT_NEAR(st.loss_sum, 1.5, 0);
    ASSERT_EQ(st.latest_notice, 0);
    ASSERT_EQ(st.applied_step, 1); /* the raw connection's APPLIED */
    coord_client_close(lead);
    coordinator_stop(co);
}

/* Decode a STEP_SYNC; it must fail with ECORRUPT and a message holding `what`. */
static void step_refused(coord_step_sync q, const char *what)
{
    wire_writer w;
    wire_writer_init(&w, 1024);
    coord_put_step_sync(&w, &q);
    coord_step_sync back;
    cirrus_error err = {0};
    ASSERT_EQ(coord_get_step_sync(w.data, w.len, &back, &err), CIRRUS_ECORRUPT);
    if (!strstr(err.msg, what)) TEST_FAIL("error '%s' does not say '%s'", err.msg, what);
    wire_writer_free(&w);
}

/* Decode a STEP_SYNC_OK; it must fail with ECORRUPT and a message holding `what`. */
static void state_refused(const coord_step_state *st, const char *what)
{
    wire_writer w;
    wire_writer_init(&w, 1 << 16);
    coord_put_step_state(&w, st);
    coord_step_state back;
    cirrus_error err = {0};
    ASSERT_EQ(coord_get_step_state(w.data, w.len, &back, &err), CIRRUS_ECORRUPT);
    if (!strstr(err.msg, what)) TEST_FAIL("error '%s' does not say '%s'", err.msg, what);
    wire_writer_free(&w);
}

static coord_step_state sample_state(void)
{
    coord_step_state st = {.applied_step = 41, .arrived = 3, .microbatches = 24,
                           .loss_sum = 77.125, .latest_notice = 9, .n_notices = 3};
    const uint64_t ids[3] = {4, 7, 9};
    for (int i = 0; i < 3; i++) {
        st.notices[i].id = ids[i];
        st.notices[i].stage = (uint32_t)i;
        snprintf(st.notices[i].addr, sizeof st.notices[i].addr, "10.0.0.%d:70%02d", i + 1, i);
    }
    return st;
}

TEST_T(coordinator_step_proto_round_trip, 5)
{
    /* Request: every op, every truncation refused (but that of the optional wait_ms as a
     * whole: a request without it waits 0 ms), trailing bytes refused. */
    coord_step_sync reqs[3] = {step_req(COORD_STEP_ARRIVE, 12, 3, 64, 7, -2.5, 5),
                               step_req(COORD_STEP_APPLIED, 1, 0, 1, 0, 0, 0),
                               redo_req(0xffffffffffull, 1023, "host-a.example:65535")};
    reqs[0].wait_ms = COORD_STEP_WAIT_MAX_MS;
    for (int k = 0; k < 3; k++) {
        wire_writer w;
        wire_writer_init(&w, 1024);
        coord_put_step_sync(&w, &reqs[k]);
        coord_step_sync back;
        cirrus_error err = {0};
        ASSERT_OK(coord_get_step_sync(w.data, w.len, &back, &err));
        ASSERT_EQ(back.op, reqs[k].op);
        ASSERT_EQ(back.step, reqs[k].step);
        ASSERT_EQ(back.client_index, reqs[k].client_index);
        ASSERT_EQ(back.n_clients, reqs[k].n_clients);
        ASSERT_EQ(back.microbatches, reqs[k].microbatches);
        ASSERT(back.loss_sum == reqs[k].loss_sum);
        ASSERT_EQ(back.redo_seen, reqs[k].redo_seen);
        ASSERT_EQ(back.stage, reqs[k].stage);
        ASSERT(!strcmp(back.addr, reqs[k].addr));
        ASSERT_EQ(back.wait_ms, reqs[k].wait_ms);
        for (size_t cut = 0; cut < w.len; cut++) {
            int rc = coord_get_step_sync(w.data, cut, &back, &err);
            if (cut == w.len - 4) {
                ASSERT_OK(rc);
                ASSERT_EQ(back.wait_ms, 0);
            } else {
                ASSERT_EQ(rc, CIRRUS_ECORRUPT);
                ASSERT(strstr(err.msg, cut < w.len - 4 ? "truncated STEP_SYNC" : "trailing"));
            }
        }
        wire_put_bytes(&w, "x", 1);
        ASSERT_EQ(coord_get_step_sync(w.data, w.len, &back, &err), CIRRUS_ECORRUPT);
        ASSERT(strstr(err.msg, "trailing") != NULL);
        wire_writer_free(&w);
    }
    step_refused(step_req(9, 1, 0, 2, 1, 1.0, 0), "op 9");
    step_refused(step_req(COORD_STEP_ARRIVE, 1, 2, 2, 1, 1.0, 0), "client_index 2");
    step_refused(step_req(COORD_STEP_ARRIVE, 1, 0, 2, 1, NAN, 0), "loss_sum");
    step_refused(step_req(COORD_STEP_APPLIED, 0, 0, 2, 0, 0, 0), "step 0");
    step_refused(step_req(COORD_STEP_APPLIED, 1, 0, 65, 0, 0, 0), "n_clients 65");
    step_refused(redo_req(1, 0, ""), "without an addr");
    step_refused(redo_req(1, 0, "a\"b"), "addr");
    /* An addr longer than 63 bytes is refused at the length, before it is copied. */
    {
        wire_writer w;
        wire_writer_init(&w, 1024);
        coord_step_sync q = redo_req(1, 0, "h:1");
        coord_put_step_sync(&w, &q);
        w.len -= 4 + 2 + 3; /* drop wait_ms and the addr, and write a long addr */
        char longaddr[101];
        memset(longaddr, 'a', 100);
        longaddr[100] = '\0';
        wire_put_str(&w, longaddr);
        coord_step_sync back;
        cirrus_error err = {0};
        ASSERT_EQ(coord_get_step_sync(w.data, w.len, &back, &err), CIRRUS_ECORRUPT);
        ASSERT(strstr(err.msg, "addr is 100 bytes") != NULL);
        wire_writer_free(&w);
    }

    /* Reply: round trip, every truncation refused. */
    coord_step_state st = sample_state(), back;
    wire_writer w;
    wire_writer_init(&w, 1 << 16);
    coord_put_step_state(&w, &st);
    cirrus_error err = {0};
    ASSERT_OK(coord_get_step_state(w.data, w.len, &back, &err));
    ASSERT_EQ(back.applied_step, 41);
    ASSERT_EQ(back.arrived, 3);
    ASSERT_EQ(back.microbatches, 24);
    ASSERT(back.loss_sum == 77.125);
    ASSERT_EQ(back.latest_notice, 9);
    ASSERT_EQ(back.n_notices, 3);
    for (int i = 0; i < 3; i++) {
        ASSERT_EQ(back.notices[i].id, st.notices[i].id);
        ASSERT_EQ(back.notices[i].stage, st.notices[i].stage);
        ASSERT(!strcmp(back.notices[i].addr, st.notices[i].addr));
    }
    for (size_t cut = 0; cut < w.len; cut++)
        ASSERT_EQ(coord_get_step_state(w.data, cut, &back, &err), CIRRUS_ECORRUPT);
    wire_put_bytes(&w, "x", 1);
    ASSERT_EQ(coord_get_step_state(w.data, w.len, &back, &err), CIRRUS_ECORRUPT);
    wire_writer_free(&w);
    /* An empty state, and an infinite sum (finite losses can overflow), are fine. */
    coord_step_state empty = {0};
    wire_writer_init(&w, 1024);
    coord_put_step_state(&w, &empty);
    ASSERT_OK(coord_get_step_state(w.data, w.len, &back, &err));
    ASSERT_EQ(w.len, 36);
    wire_writer_free(&w);
    st = sample_state();
    st.loss_sum = INFINITY;
    wire_writer_init(&w, 1 << 16);
    coord_put_step_state(&w, &st);
    ASSERT_OK(coord_get_step_state(w.data, w.len, &back, &err));
    wire_writer_free(&w);

    /* Every field checked. */
    st = sample_state();
    st.n_notices = COORD_MAX_NOTICES + 1;
    state_refused(&st, "lists 17 notices");
    st = sample_state();
    st.loss_sum = NAN;
    state_refused(&st, "loss_sum is NaN");
    st = sample_state();
    st.arrived = COORD_MAX_CLIENTS + 1;
    state_refused(&st, "arrived 65");
    st = sample_state();
    st.arrived = 0;
    state_refused(&st, "of no client");
    st = sample_state();
    st.notices[1].id = 4; /* not after notice 0 */
    state_refused(&st, "notice 1 id 4");
    st = sample_state();
    st.latest_notice = 8; /* notice 2 (id 9) is newer than the latest */
    state_refused(&st, "notice 2 id 9");
    st = sample_state();
    st.notices[0].id = 0;
    state_refused(&st, "notice 0 id 0");
    st = sample_state();
    st.notices[2].stage = COORD_MAX_STAGES;
    state_refused(&st, "notice 2 stage 1024");
    st = sample_state();
    st.notices[1].addr[0] = '\0';
    state_refused(&st, "notice 1 addr");
    st = sample_state();
    snprintf(st.notices[0].addr, sizeof st.notices[0].addr, "x y");
    state_refused(&st, "notice 0 addr");
}

