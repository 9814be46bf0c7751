/* Stage peers and the pipeline client in one process (threads, real loopback sockets), so
 * the sanitizer build covers them: three steps through two stage peers equal three steps
 * of the in-process model, bit for bit, losses and parameters. */
#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "../../common/rng.h"
#include "../../trainer/model/stage.h"
#include "../../trainer/net/conn.h"
#include "../../trainer/optim/adamw.h"
#include "../../trainer/train.h"
#include "../../trainer/swarm/coord/coordinator.h"
#include "../../trainer/swarm/client/executor.h"
#include "../../trainer/swarm/client/pipeline.h"
#include "../../trainer/swarm/peer/stage_peer.h"
#include "../../trainer/swarm/proto/rpc.h"
#include "../../trainer/swarm/proto/stage_msg.h"
#include "test.h"

enum { B = 2, T = 8, STEPS = 3 };

static const gpt_config cfg = {.n_layer = 3, .n_embd = 16, .n_head = 2, .seq_len = 8,
                               .vocab = GPT_VOCAB};

typedef struct peer_thread {
    stage_peer_options o;
    volatile sig_atomic_t stop;
    int rc;
} peer_thread;

static void *peer_main(void *arg)
{
    peer_thread *t = arg;
    t->rc = stage_peer_run(&t->o, &t->stop, NULL);
    return NULL;
}

static char loopback[] = "127.0.0.1";

/* Where and how a test's stage peer serves (seed 5, this file's model). */
typedef struct peer_spec {
    int l0, l1, max_B;
    const adamw_config *ac;
    int ring;        /* with a gradient-averaging listener (a stage of several peers) */
    coordinator *co; /* registers there at `stage` (NULL: none) */
    int stage;
} peer_spec;

/* A stage peer as a thread on loopback ports: its address into addr, and with s->ring its
 * averaging address into ring (both kept by the caller while it runs). */
static void start_peer(peer_thread *t, pthread_t *th, const peer_spec *s, char addr[32],
                       char ring[32])
{
    int port, rport;
    memset(t, 0, sizeof *t);
    t->o = (stage_peer_options){.job_id = "swarm-test", .model = cfg, .l0 = s->l0,
                                .l1 = s->l1, .max_B = s->max_B, .max_T = T, .seed = 5,
                                .adam = *s->ac};
    ASSERT_OK(net_listen(loopback, 0, &t->o.listen_fd, &port, NULL));
    snprintf(addr, 32, "127.0.0.1:%d", port);
    if (s->ring) {
        ASSERT_OK(net_listen(loopback, 0, &t->o.ring_listen_fd, &rport, NULL));
        snprintf(ring, 32, "127.0.0.1:%d", rport);
        t->o.ring_addr = ring;
    }
    if (s->co) {
        t->o.coord_host = loopback;
        t->o.coord_port = coordinator_port(s->co);
        t->o.stage_index = s->stage;
        t->o.advertise_host = loopback;
        t->o.advertise_port = port;
    }
    ASSERT(pthread_create(th, NULL, peer_main, t) == 0);
}

/* Stop the peer (unless the test stopped it already) and check that it ended well. */
static void stop_peer(peer_thread *t, pthread_t th, int stopped)
{
    if (!stopped) {
        t->stop = 1;
        pthread_join(th, NULL);
    }
    close(t->o.listen_fd);
    if (t->o.ring_addr) close(t->o.ring_listen_fd);
    ASSERT_OK(t->rc);
}

static void batch(int step, int32_t *x, int32_t *y)
{
    rng_state r;
    rng_seed(&r, 100 + (uint64_t)step);
    for (int i = 0; i < B * T; i++) {
        x[i] = (int32_t)rng_below(&r, GPT_VOCAB);
        y[i] = (int32_t)rng_below(&r, GPT_VOCAB);
    }
}

TEST(swarm_two_peers_equal_one_process)
{
    const adamw_config ac = adamw_defaults(1e-2f, STEPS);
    /* Reference: the whole model in this process, the same steps as train.c takes. */
    gpt_model m;
    ASSERT_OK(gpt_model_init(&m, &cfg, NULL));
    gpt_model_seed(&m, 5);
    gpt_stage *st;
    ASSERT_OK(gpt_stage_new(&st, &m, 0, cfg.n_layer, B, T, NULL));
    adamw opt;
    gpt_span all = {0, m.n_params};
    ASSERT_OK(adamw_init(&opt, &cfg, &all, 1, &ac, NULL));
    float ref_loss[STEPS];
    int32_t x[B * T], y[B * T];
    for (int s = 0; s < STEPS; s++) {
        batch(s, x, y);
        gpt_stage_input in = {.id = (uint64_t)s + 1, .B = B, .T = T, .tokens = x, .targets = y};
        ASSERT_OK(gpt_stage_forward(st, &in, NULL, &ref_loss[s], 1));
        ASSERT_OK(gpt_stage_backward(st, &in, NULL, NULL));
        gpt_fold_tied_grads(&m);
        adamw_step(&opt, m.params, m.grads, 1.0f, adamw_total_sumsq(&opt, m.grads, 1.0f),
                   adamw_lr(&ac, (uint64_t)s), (uint64_t)s + 1);
    }
    /* Two stage peers: layers [0, 2) and [2, 3). */
    peer_thread peers[2];
    pthread_t th[2];
    char addr[2][32], ring[2][32];
    const char *addrs[2] = {addr[0], addr[1]};
    const int bounds[3] = {0, 2, 3};
    for (int i = 0; i < 2; i++)
        start_peer(&peers[i], &th[i], &(peer_spec){bounds[i], bounds[i + 1], B, &ac, 0, NULL, 0},
                   addr[i], ring[i]);
    pipeline *p;
    cirrus_error err = {0};
    const int one_peer_each[2] = {1, 1};
    if (pipeline_connect(&p, "swarm-test", 2, one_peer_each, addrs, &cfg, B, T,
                         STAGE_CODEC_NONE, 5000, &err))
        TEST_FAIL("connect: %s", err.msg);
    for (int s = 0; s < STEPS; s++) {
        float loss;
        batch(s, x, y);
        if (pipeline_microbatch(p, (uint64_t)s + 1, B, T, x, y, &loss, &err) ||
            pipeline_step(p, adamw_lr(&ac, (uint64_t)s), 1.0f, (uint64_t)s + 1, &err))
            TEST_FAIL("step %d: %s", s, err.msg);
        ASSERT(memcmp(&loss, &ref_loss[s], sizeof loss) == 0);
    }
    /* After the steps, a forward of a fresh batch also matches: the peers' weights are the
     * reference's, the tied embedding included (the first and last stage both use it). */
    float loss, want;
    batch(99, x, y);
    ASSERT_OK(pipeline_eval(p, B, T, x, y, &loss, &err));
    gpt_stage_input in = {.id = 0, .B = B, .T = T, .tokens = x, .targets = y};
    ASSERT_OK(gpt_stage_forward(st, &in, NULL, &want, 0));
    ASSERT(memcmp(&loss, &want, sizeof loss) == 0);
    pipeline_close(p);
    for (int i = 0; i < 2; i++) stop_peer(&peers[i], th[i], 0);
    adamw_free(&opt);
    gpt_stage_free(st);
    gpt_model_free(&m);
}

/* The losses of in-process training with gradient accumulation over m microbatches per step
 * (batch(10 * step + i)), as the pipeline's peers must reproduce them: ref[step * m + i]. */
static void accumulation_losses(int msteps, int m_micro, float *ref)
{
    const adamw_config ac = adamw_defaults(1e-3f, msteps);
    gpt_model m;
    ASSERT_OK(gpt_model_init(&m, &cfg, NULL));
    gpt_model_seed(&m, 5);
    gpt_stage *st;
    ASSERT_OK(gpt_stage_new(&st, &m, 0, cfg.n_layer, B, T, NULL));
    adamw opt;
    gpt_span all = {0, m.n_params};
    ASSERT_OK(adamw_init(&opt, &cfg, &all, 1, &ac, NULL));
    int32_t x[B * T], y[B * T];
    for (int s = 0; s < msteps; s++) {
        for (int i = 0; i < m_micro; i++) {
            batch(10 * s + i, x, y);
            gpt_stage_input in = {.id = (uint64_t)i + 1, .B = B, .T = T, .tokens = x,
                                  .targets = y};
            ASSERT_OK(gpt_stage_forward(st, &in, NULL, &ref[s * m_micro + i], 1));
            ASSERT_OK(gpt_stage_backward(st, &in, NULL, NULL));
        }
        gpt_fold_tied_grads(&m);
        adamw_step(&opt, m.params, m.grads, 1.0f / m_micro,
                   adamw_total_sumsq(&opt, m.grads, 1.0f / m_micro), adamw_lr(&ac, (uint64_t)s),
                   (uint64_t)s + 1);
    }
    adamw_free(&opt);
    gpt_stage_free(st);
    gpt_model_free(&m);
}

/* Several microbatches in flight over a stage of two peers, one of them three times slower
 * (the wiring sends it less): every microbatch of every step is accumulated exactly once,
 * so the losses follow in-process gradient accumulation over the same microbatches, to
 * float rounding (the peers sum in another order). */
TEST(swarm_microbatches_in_flight_match_accumulation)
{
    enum { M = 4, MSTEPS = 3 };
    const adamw_config ac = adamw_defaults(1e-3f, MSTEPS);
    float ref[MSTEPS][M];
    accumulation_losses(MSTEPS, M, &ref[0][0]);
    int32_t x[M * B * T], y[M * B * T];
    /* Stage 0: layers [0, 2), one peer; stage 1: layers [2, 3), two peers averaging over a
     * ring, the second one slowed down 3x. */
    enum { NP = 3 };
    peer_thread peers[NP];
    pthread_t th[NP];
    char addr[NP][32], ring[NP][32];
    const char *addrs[NP] = {addr[0], addr[1], addr[2]};
    const int l0[NP] = {0, 2, 2}, l1[NP] = {2, 3, 3};
    for (int i = 0; i < NP; i++) {
        int port, rport;
        memset(&peers[i], 0, sizeof peers[i]);
        peers[i].o = (stage_peer_options){.job_id = "swarm-test", .model = cfg, .l0 = l0[i],
                                          .l1 = l1[i], .max_B = B, .max_T = T, .seed = 5,
                                          .adam = ac, .slowdown = i == 2 ? 3.0 : 1.0};
        ASSERT_OK(net_listen("127.0.0.1", 0, &peers[i].o.listen_fd, &port, NULL));
        ASSERT_OK(net_listen("127.0.0.1", 0, &peers[i].o.ring_listen_fd, &rport, NULL));
        snprintf(addr[i], sizeof addr[i], "127.0.0.1:%d", port);
        snprintf(ring[i], sizeof ring[i], "127.0.0.1:%d", rport);
        peers[i].o.ring_addr = ring[i];
        ASSERT(pthread_create(&th[i], NULL, peer_main, &peers[i]) == 0);
    }
    pipeline *p;
    cirrus_error err = {0};
    const int per_stage[2] = {1, 2};
    if (pipeline_connect(&p, "swarm-test", 2, per_stage, addrs, &cfg, B, T, STAGE_CODEC_NONE,
                         5000, &err) ||
        pipeline_set_routing(p, WIRING_LEAST_LOADED, M, 1, &err))
        TEST_FAIL("connect: %s", err.msg);
    for (int s = 0; s < MSTEPS; s++) {
        float loss[M];
        for (int i = 0; i < M; i++) batch(10 * s + i, x + i * B * T, y + i * B * T);
        if (pipeline_microbatches(p, (uint64_t)s * M + 1, M, B, T, x, y, loss, &err) ||
            pipeline_step(p, adamw_lr(&ac, (uint64_t)s), 1.0f / M, (uint64_t)s + 1, &err))
            TEST_FAIL("step %d: %s", s, err.msg);
        for (int i = 0; i < M; i++) ASSERT_NEAR(loss[i], ref[s][i], 1e-5 * ref[s][i]);
    }
    ASSERT_EQ(pipeline_get_counters(p)->microbatches, (uint64_t)(M * MSTEPS));
    ASSERT_EQ(pipeline_get_counters(p)->retried, 0);
    pipeline_close(p);
    for (int i = 0; i < NP; i++) {
        peers[i].stop = 1;
        pthread_join(th[i], NULL);
        close(peers[i].o.listen_fd);
        close(peers[i].o.ring_listen_fd);
        ASSERT_OK(peers[i].rc);
    }
}

/* The member of the coordinator's table serving at `port`: its id and stage; 0 if none. */
static uint32_t member_at(coordinator *co, int port, uint32_t *stage)
{
    coord_snapshot snap;
    ASSERT_OK(coordinator_snapshot(co, &snap));
    uint32_t id = 0;
    for (size_t i = 0; i < snap.n_members; i++)
        if (snap.members[i].info.port == port) {
            id = snap.members[i].info.id;
            *stage = snap.members[i].info.stage;
        }
    coord_snapshot_free(&snap);
    return id;
}

/* Rebalancing, the peer's side: between steps the coordinator tells a peer of stage 0 (of
 * two) to move to stage 1. It leaves, takes stage 1's layers and state from the peer there
 * and registers again; the client retires it from stage 0 and admits it at stage 1. Every
 * microbatch is accumulated exactly once and the moved peer's stage-1 gradients are right:
 * the losses follow in-process accumulation to float rounding, before and after. */
TEST(swarm_peer_moves_to_another_stage)
{
    /* Seven processes' worth of threads exchanging state with 5 s request deadlines: under
     * the sanitizers on 2 loaded cores a deadline can pass and the test fails for time, not
     * for memory. The optimised build runs it. */
    if (getenv("CIRRUS_TEST_QUICK")) TEST_SKIP("timing-bound multi-peer test (optimised build runs it)");
    enum { M = 4, MSTEPS = 5, MOVE_AT = 2 };
    const adamw_config ac = adamw_defaults(1e-3f, MSTEPS);
    float ref[MSTEPS][M];
    accumulation_losses(MSTEPS, M, &ref[0][0]);
    int32_t x[M * B * T], y[M * B * T];
    coordinator_options co_opt = {.job_id = "swarm-test", .host = "127.0.0.1", .http_port = -1,
                                  .n_stages = 2, .n_layer = (uint32_t)cfg.n_layer,
                                  /* Quick heartbeats carry the move instruction; a long
                                   * expiry keeps a loaded machine's late heartbeat from
                                   * expiring a live peer (seen: 351 ms against 300). */
                                  .heartbeat_ms = 100, .expire_ms = 10000};
    coordinator *co;
    cirrus_error err = {0};
    if (coordinator_start(&co_opt, &co, &err)) TEST_FAIL("coordinator: %s", err.msg);
    /* Stage 0: layers [0, 2), peers 0 and 1; stage 1: layers [2, 3), peer 2. */
    enum { NP = 3 };
    peer_thread peers[NP];
    pthread_t th[NP];
    char addr[NP][32], ring[NP][32];
    int ports[NP];
    const char *addrs[NP] = {addr[0], addr[1], addr[2]};
    const int l0[NP] = {0, 0, 2}, l1[NP] = {2, 2, 3}, stage[NP] = {0, 0, 1};
    for (int i = 0; i < NP; i++) {
        start_peer(&peers[i], &th[i], &(peer_spec){l0[i], l1[i], B, &ac, 1, co, stage[i]},
                   addr[i], ring[i]);
        ports[i] = peers[i].o.advertise_port;
    }
    pipeline *p;
    const int per_stage[2] = {2, 1};
    if (pipeline_connect(&p, "swarm-test", 2, per_stage, addrs, &cfg, B, T, STAGE_CODEC_NONE,
                         5000, &err) ||
        pipeline_set_routing(p, WIRING_LEAST_LOADED, M, 1, &err))
        TEST_FAIL("connect: %s", err.msg);
    for (int s = 0; s < MSTEPS; s++) {
        if (s == MOVE_AT) {
            /* Peer 1 registered, is told to move, and shows up at stage 1. */
            uint32_t id = 0, at = 0;
            for (int i = 0; i < 100 && !id; i++, usleep(20000)) id = member_at(co, ports[1], &at);
            ASSERT(id != 0);
            ASSERT_OK(coordinator_set_instruction(co, id, 1));
            /* Up to 30 s: a loaded machine under ASan has taken more than 5. */
            for (int i = 0; i < 1500 && at != 1; i++, usleep(20000)) member_at(co, ports[1], &at);
            ASSERT_EQ(at, 1);
            if (pipeline_join(p, 1, addr[1], &err)) TEST_FAIL("join: %s", err.msg);
        }
        float loss[M];
        for (int i = 0; i < M; i++) batch(10 * s + i, x + i * B * T, y + i * B * T);
        if (pipeline_microbatches(p, (uint64_t)s * M + 1, M, B, T, x, y, loss, &err) ||
            pipeline_step(p, adamw_lr(&ac, (uint64_t)s), 1.0f / M, (uint64_t)s + 1, &err))
            TEST_FAIL("step %d: %s", s, err.msg);
        for (int i = 0; i < M; i++) ASSERT_NEAR(loss[i], ref[s][i], 1e-5 * ref[s][i]);
    }
    const pipeline_counters *pc = pipeline_get_counters(p);
    ASSERT_EQ(pc->microbatches, (uint64_t)(M * MSTEPS));
    ASSERT_EQ(pc->peers_lost, 1); /* retired from stage 0 */
    ASSERT_EQ(pc->peers_joined, 1);
    ASSERT_EQ(pc->redone, 0);
    pipeline_close(p);
    for (int i = 0; i < NP; i++) stop_peer(&peers[i], th[i], 0);
    coordinator_stop(co);
}

/* The evaluation after the last step, through the pipeline executor, is where a stage peer
 * lost then once crashed a client (the loss of a peer was handled with no error record to
 * write into). Here one of stage 1's two peers stops as the final evaluation begins: the
 * evaluation fails over to the survivor, the run succeeds, and the validation loss is the
 * one the same run reaches in one process (a 2-peer stage sums its gradients in another
 * order: to float rounding). */
typedef struct evaluation_fault {
    train_executor inner;
    peer_thread *victim;
    pthread_t victim_th;
    int stopped;
} evaluation_fault;

static int eval_after_stopping_a_peer(void *ctx, int b, int t, const int32_t *x,
                                      const int32_t *y, float *loss, cirrus_error *err)
{
    evaluation_fault *f = ctx;
    if (!f->stopped) {
        f->victim->stop = 1; /* its connections close within a second */
        pthread_join(f->victim_th, NULL);
        f->stopped = 1;
    }
    return f->inner.eval(f->inner.ctx, b, t, x, y, loss, err);
}

static int step_through(void *ctx, uint64_t id, int b, int t, const int32_t *x,
                        const int32_t *y, float lr, uint64_t step, float *loss,
                        cirrus_error *err)
{
    evaluation_fault *f = ctx;
    return f->inner.step(f->inner.ctx, id, b, t, x, y, lr, step, loss, err);
}

TEST(swarm_peer_lost_in_final_evaluation)
{
    const char *corpus = getenv("CIRRUS_CORPUS");
    if (!corpus || !*corpus) TEST_FAIL("CIRRUS_CORPUS is not set (make test sets it)");
    train_options o;
    train_options_defaults(&o);
    o.model = cfg;
    o.batch = B;
    o.steps = 3;
    o.seed = 5;
    o.data = corpus;
    o.quiet = 1;
    o.eval_batches = 8; /* 16 forwards: the wiring sends the stopped peer some */
    train_result ref = {0};
    ASSERT_OK(train_run(&o, &ref, NULL));
    ASSERT(ref.val_loss > 0);

    /* Stage 0: layers [0, 2), one peer; stage 1: layers [2, 3), peers 1 and 2. */
    enum { NP = 3 };
    const adamw_config ac = adamw_defaults(o.lr, o.steps);
    peer_thread peers[NP];
    pthread_t th[NP];
    char addr[NP][32], ring[NP][32];
    const char *addrs[NP] = {addr[0], addr[1], addr[2]};
    const int l0[NP] = {0, 2, 2}, l1[NP] = {2, 3, 3};
    for (int i = 0; i < NP; i++)
        start_peer(&peers[i], &th[i], &(peer_spec){l0[i], l1[i], 1, &ac, 1, NULL, 0}, addr[i],
                   ring[i]);
    pipeline *p;
    cirrus_error err = {0};
    const int per_stage[2] = {1, 2};
    if (pipeline_connect(&p, "swarm-test", 2, per_stage, addrs, &cfg, 1, T, STAGE_CODEC_NONE,
                         5000, &err))
        TEST_FAIL("connect: %s", err.msg);
    pipeline_executor *pe;
    evaluation_fault f = {.victim = &peers[1], .victim_th = th[1]};
    const pipeline_executor_options eo = {.micro = 1, .n_clients = 1,
                                          .final_step = (uint64_t)o.steps};
    if (pipeline_executor_open(p, &eo, &pe, &f.inner, &err)) TEST_FAIL("executor: %s", err.msg);
    train_executor ex = f.inner;
    ex.ctx = &f;
    ex.step = step_through;
    ex.eval = eval_after_stopping_a_peer;
    ex.describe = NULL;
    ex.first_step = NULL;
    o.executor = &ex;
    train_result res = {0};
    ASSERT_OK(train_run(&o, &res, &err));
    ASSERT(f.stopped);
    ASSERT_EQ(pipeline_get_counters(p)->peers_lost, 1);
    ASSERT_EQ(res.step, 3);
    ASSERT_NEAR(res.val_loss, ref.val_loss, 1e-4 * ref.val_loss);
    pipeline_executor_close(pe);
    pipeline_close(p);
    for (int i = 0; i < NP; i++) stop_peer(&peers[i], th[i], i == 1);
}

/* A stage whose only peer is lost loses its state: the step in progress is abandoned, no
 * microbatch runs until a state is installed, a replacement joins the empty stage without a
 * copy (it holds its seed's parameters and zero moments, while the surviving stage holds
 * its trained ones), and once a whole state is installed the step that failed completes. */
/* A stage peer's whole state (3n floats: parameters, AdamW m, v) as STATE_GET serves it. */
typedef struct fetched {
    net_conn *c;
    float *state;
} fetched;

static int fetch_call(void *ctx, const wire_writer *req, wire_reader *reply, cirrus_error *err)
{
    return rpc_call(((fetched *)ctx)->c, STAGE_STATE_GET, 1, req, 5000, "the peer", reply, err);
}

static void fetch_floats(void *ctx, uint64_t off, const uint8_t *floats, uint64_t count)
{
    memcpy(((fetched *)ctx)->state + off, floats, count * sizeof(float));
}

static void fetch_peer_state(const char *addr, uint64_t n, float *state, uint64_t *steps)
{
    char host[64];
    int port;
    cirrus_error err = {0};
    fetched f = {NULL, state};
    if (net_split_hostport(addr, host, sizeof host, &port, 0, &err) ||
        net_connect(host, port, 5000, &f.c, &err) ||
        net_hello_client(f.c, "swarm-test", STAGE_ROLE_CLIENT, 0, 5000, &err) ||
        stage_fetch_state(fetch_call, fetch_floats, &f, n, steps, NULL, &err))
        TEST_FAIL("the state of %s: %s", addr, err.msg);
    net_close(f.c);
}

TEST(swarm_stage_lost_whole_is_restored)
{
    const adamw_config ac = adamw_defaults(1e-2f, 10);
    peer_thread peers[4];
    pthread_t th[4];
    char addr[4][32], ring[4][32];
    const peer_spec s0 = {0, 2, B, &ac, 0, NULL, 0}, s1 = {2, 3, B, &ac, 0, NULL, 0};
    const peer_spec s1_ring = {2, 3, B, &ac, 1, NULL, 0}; /* stage 1 of two peers */
    start_peer(&peers[0], &th[0], &s0, addr[0], ring[0]);
    start_peer(&peers[1], &th[1], &s1, addr[1], ring[1]);
    const char *addrs[2] = {addr[0], addr[1]};
    const int one_each[2] = {1, 1};
    pipeline *p;
    cirrus_error err = {0};
    if (pipeline_connect(&p, "swarm-test", 2, one_each, addrs, &cfg, B, T, STAGE_CODEC_NONE,
                         5000, &err))
        TEST_FAIL("connect: %s", err.msg);
    int32_t x[B * T], y[B * T];
    float loss;
    for (int s = 0; s < 2; s++) {
        batch(s, x, y);
        if (pipeline_microbatch(p, (uint64_t)s + 1, B, T, x, y, &loss, &err) ||
            pipeline_step(p, adamw_lr(&ac, (uint64_t)s), 1.0f, (uint64_t)s + 1, &err))
            TEST_FAIL("step %d: %s", s, err.msg);
    }
    peers[1].stop = 1; /* stage 1's only peer goes */
    pthread_join(th[1], NULL);
    batch(2, x, y);
    ASSERT(pipeline_microbatch(p, 3, B, T, x, y, &loss, &err) != 0);
    ASSERT_EQ(pipeline_empty_stage(p), 1);
    ASSERT_OK(pipeline_abandon_step(p, &err));
    ASSERT(pipeline_restoring(p));
    ASSERT_EQ(pipeline_microbatch(p, 3, B, T, x, y, &loss, &err), CIRRUS_EINVAL);
    start_peer(&peers[2], &th[2], &s1_ring, addr[2], ring[2]);
    if (pipeline_join(p, 1, addr[2], &err)) TEST_FAIL("join: %s", err.msg);
    ASSERT_EQ(pipeline_empty_stage(p), -1);
    ASSERT_EQ(pipeline_resume_intact(p, &err), CIRRUS_ENOENT); /* stage 1 is at step 0 */
    const size_t n = gpt_num_params(&cfg);
    float *state = malloc(3 * n * sizeof(float));
    ASSERT(state != NULL);
    if (pipeline_gather_state_as_is(p, state, state + n, state + 2 * n, &err))
        TEST_FAIL("gather: %s", err.msg);
    gpt_model seed;
    ASSERT_OK(gpt_model_init(&seed, &cfg, NULL));
    gpt_model_seed(&seed, 5);
    gpt_span own[2], first[2];
    /* Stage 1's last span is its layers (the one before, if any, its copy of the tied wte,
     * which the gather takes from stage 0); stage 0's first holds the embeddings. */
    const int n_own = gpt_stage_state_spans(&cfg, 2, 3, own);
    gpt_stage_state_spans(&cfg, 0, 2, first);
    const gpt_span layers = own[n_own - 1];
    const size_t o = layers.offset, f = first[0].offset;
    ASSERT(memcmp(state + o, seed.params + o, layers.count * sizeof(float)) == 0);
    for (size_t i = 0; i < layers.count; i++) ASSERT(state[n + o + i] == 0.0f);
    ASSERT(memcmp(state + f, seed.params + f, first[0].count * sizeof(float)) != 0);
    if (pipeline_set_state(p, state, state + n, state + 2 * n, 2, &err))
        TEST_FAIL("install: %s", err.msg);
    ASSERT(!pipeline_restoring(p));
    if (pipeline_microbatch(p, 3, B, T, x, y, &loss, &err) ||
        pipeline_step(p, adamw_lr(&ac, 2), 1.0f, 3, &err))
        TEST_FAIL("the step after the restore: %s", err.msg);
    ASSERT(loss > 0 && loss < 10);
    ASSERT_EQ(pipeline_steps_done(p), 3);
    /* A second peer joins the restored stage by copying its state, moments three steps
     * young: it takes their origin with them, so both step alike and stay one replica
     * (counting the copy's bias correction from step 0 would move it otherwise). */
    start_peer(&peers[3], &th[3], &s1_ring, addr[3], ring[3]);
    if (pipeline_join(p, 1, addr[3], &err)) TEST_FAIL("join by copy: %s", err.msg);
    for (int s = 3; s < 6; s++) {
        batch(s, x, y);
        if (pipeline_microbatch(p, (uint64_t)s + 1, B, T, x, y, &loss, &err) ||
            pipeline_step(p, adamw_lr(&ac, (uint64_t)s), 1.0f, (uint64_t)s + 1, &err))
            TEST_FAIL("step %d with two peers in stage 1: %s", s + 1, err.msg);
    }
    gpt_span spans[2];
    const int n_spans = gpt_stage_state_spans(&cfg, 2, 3, spans);
    uint64_t n1 = 0, steps2 = 0, steps3 = 0;
    for (int i = 0; i < n_spans; i++) n1 += spans[i].count;
    float *a = malloc(3 * n1 * sizeof(float)), *b = malloc(3 * n1 * sizeof(float));
    ASSERT(a && b);
    fetch_peer_state(addr[2], n1, a, &steps2);
    fetch_peer_state(addr[3], n1, b, &steps3);
    ASSERT(steps2 == 6 && steps3 == 6);
    ASSERT(memcmp(a, b, 3 * n1 * sizeof(float)) == 0);
    free(a);
    free(b);
    gpt_model_free(&seed);
    free(state);
    pipeline_close(p);
    for (int i = 0; i < 4; i++) stop_peer(&peers[i], th[i], i == 1);
}

/* Threads of this process now (/proc/self/task). */
static int thread_count(void)
{
    DIR *d = opendir("/proc/self/task");
    int n = 0;
    if (!d) return -1;
    for (struct dirent *e; (e = readdir(d));) n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

/* A connection to port on loopback that sends nothing; -1 if refused. */
static int silent_connection(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a)) {
        if (fd >= 0) close(fd);
        return -1;
    }
    return fd;
}

/* Whether the other end closed fd (a read finds the end of the stream), waiting up to 2 s. */
static int closed_by_peer(int fd)
{
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    char b;
    return poll(&pfd, 1, 2000) == 1 && recv(fd, &b, 1, MSG_DONTWAIT) == 0;
}

/* A flood of silent connections costs a stage peer at most its cap of threads: the ones
 * over --max-connections are closed at once (refused, or the oldest shut down to make
 * room), and once the flood goes, a client is served again. */
TEST(swarm_peer_caps_connections)
{
    enum { CAP = 4, FLOOD = 24 };
    peer_thread peer;
    pthread_t th;
    char addr[32];
    int port;
    memset(&peer, 0, sizeof peer);
    ASSERT_OK(net_listen("127.0.0.1", 0, &peer.o.listen_fd, &port, NULL));
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    peer.o = (stage_peer_options){.job_id = "swarm-test", .model = cfg, .l0 = 0,
                                  .l1 = cfg.n_layer, .max_B = B, .max_T = T, .seed = 5,
                                  .adam = adamw_defaults(1e-3f, 1), .listen_fd = peer.o.listen_fd,
                                  .max_conns = CAP};
    ASSERT(pthread_create(&th, NULL, peer_main, &peer) == 0);
    usleep(200 * 1000); /* the peer's model built, its accept loop running */
    const int threads_before = thread_count();
    int fds[FLOOD], closed = 0;
    for (int i = 0; i < FLOOD; i++) ASSERT((fds[i] = silent_connection(port)) >= 0);
    /* Closed on accept, or (the oldest before HELLO) shut down to make room: all but at
     * most CAP at once (proto/rpc_server.c). */
    for (int i = 0; i < FLOOD; i++) closed += closed_by_peer(fds[i]);
    ASSERT(closed >= FLOOD - CAP);
    ASSERT(thread_count() - threads_before <= CAP);
    for (int i = 0; i < FLOOD; i++) close(fds[i]);
    /* The silent ones' threads see their end at once; then a client is served. */
    pipeline *p = NULL;
    cirrus_error err = {0};
    const int one[1] = {1};
    const char *addrs[1] = {addr};
    int rc = -1;
    for (int attempt = 0; attempt < 50 && rc; attempt++) {
        rc = pipeline_connect(&p, "swarm-test", 1, one, addrs, &cfg, B, T, STAGE_CODEC_NONE,
                              5000, &err);
        if (rc) usleep(100 * 1000);
    }
    if (rc) TEST_FAIL("connect after the flood: %s", err.msg);
    int32_t x[B * T], y[B * T];
    float loss;
    batch(1, x, y);
    ASSERT_OK(pipeline_eval(p, B, T, x, y, &loss, &err));
    ASSERT(loss > 0);
    pipeline_close(p);
    peer.stop = 1;
    pthread_join(th, NULL);
    close(peer.o.listen_fd);
    ASSERT_OK(peer.rc);
}
