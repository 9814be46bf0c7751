/* roles: the SWARM subcommands of cirrus-trainer.
 *
 *   stage   serve layers [l0, l1) of the model to pipeline clients
 *   client  train through a pipeline of stage peers
 *   local   a whole region on loopback: one stage peer process per stage, and a client
 */
#include "roles.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <time.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../../common/log.h"
#include "../../common/role_args.h"
#include "cli.h"
#include "../net/conn.h"
#include "../optim/adamw.h"
#include "../swarm/coord/coordinator.h"
#include "../swarm/client/pipeline.h"
#include "../swarm/peer/stage_peer.h"
#include "../swarm/proto/stage_msg.h"
#include "../swarm/client/step_share.h"

#define PIPE_TIMEOUT_MS 60000

static volatile sig_atomic_t stop_requested;

static void on_signal(int sig)
{
    (void)sig;
    stop_requested = 1;
}

/* Split "a,b,c" in place at sep into at most max pieces; -1 if there are more. */
static int split_list(char *s, const char **out, int max, char sep)
{
    int n = 0;
    const char seps[2] = {sep, 0};
    char *save = NULL;
    for (char *tok = strtok_r(s, seps, &save); tok; tok = strtok_r(NULL, seps, &save)) {
        if (n == max) return -1;
        out[n++] = tok;
    }
    return n;
}

static int parse_layers(const char *text, int *l0, int *l1)
{
    char *end;
    long a = strtol(text, &end, 10);
    if (end == text || *end != ':') return CIRRUS_EINVAL;
    const char *second = end + 1;
    long b = strtol(second, &end, 10);
    if (end == second || *end || a < 0 || b <= a || b > 1024) return CIRRUS_EINVAL;
    *l0 = (int)a;
    *l1 = (int)b;
    return 0;
}

int roles_cmd_stage(int argc, char **argv)
{
    model_flags mf = {.preset = "tiny"};
    const char *job = "cirrus", *listen_addr = "127.0.0.1:0", *layers = NULL;
    int listen_fd = -1, batch = 8, seq = 0, help = 0, ring_fd = -1, stage_index = 0;
    const char *ring_addr = NULL, *coordinator = NULL, *advertise = "127.0.0.1", *name = NULL;
    char ring_default[STAGE_ADDR_MAX];
    uint64_t seed = 1337;
    float slowdown = 1.0f, stall_s = 0.0f;
    int act_slots = STAGE_PEER_DEFAULT_SLOTS, slowdown_cpu = 0, stall_at = 0;
    flag_spec flags[] = {
        MODEL_FLAGS(mf),
        {ROLE_FLAG_JOB, FLAG_STR, &job, 0, 0, "job id; clients of other jobs are refused", 0},
        {ROLE_FLAG_SERVE, FLAG_STR, &layers, 0, 0, "layers served, L0:L1 (required)", 0},
        {ROLE_FLAG_LISTEN, FLAG_STR, &listen_addr, 0, 0, "HOST:PORT to serve on", 0},
        {ROLE_FLAG_LISTEN_FD, FLAG_INT, &listen_fd, 0, 65535, "serve on an inherited socket", 0},
        {ROLE_FLAG_BATCH, FLAG_INT, &batch, 1, 65536, "largest microbatch (sequences)", 0},
        {ROLE_FLAG_SEQ, FLAG_INT, &seq, 1, 65536, "largest sequence (default: the context)", 0},
        {ROLE_FLAG_SEED, FLAG_U64, &seed, 0, 0, "the job's seed (initial weights)", 0},
        {ROLE_FLAG_RING_ADDR, FLAG_STR, &ring_addr, 0, 0,
         "HOST:PORT where the stage's other peers reach this one for gradient averaging "
         "(default: a free port on the --advertise host)",
         0},
        {ROLE_FLAG_RING_FD, FLAG_INT, &ring_fd, 0, 65535, "inherited socket listening at --ring-addr",
         0},
        {ROLE_FLAG_COORDINATOR, FLAG_STR, &coordinator, 0, 0, "the region's coordinator, HOST:PORT", 0},
        {ROLE_FLAG_STAGE_INDEX, FLAG_INT, &stage_index, 0, 63, "this stage's index, for the coordinator",
         0},
        {ROLE_FLAG_ADVERTISE, FLAG_STR, &advertise, 0, 0, "host clients reach this peer at", 0},
        {ROLE_FLAG_NAME, FLAG_STR, &name, 0, 0,
         "its name at the coordinator, kept by a replacement (the operator gives the Pod's); "
         "default: made of the stage, host and port",
         0},
        {"slowdown", FLAG_FLOAT, &slowdown, 1, 1000,
         "tests and benchmarks only: be F times slower (sleep (F-1) x the compute time "
         "after each forward and backward; default 1)",
         0},
        {"slowdown-cpu", FLAG_BOOL, &slowdown_cpu, 0, 0,
         "tests and benchmarks only: --slowdown sleeps (F-1) x the compute's CPU time, not "
         "its wall time, so other processes on the cores do not stretch the sleep",
         0},
        {"act-slots", FLAG_INT, &act_slots, 1, STAGE_PEER_MAX_SLOTS,
         "forwards whose activations are kept for their backward (default 4; more "
         "microbatches in flight need more, each costs a microbatch's activations)",
         0},
        {"stall-average-at", FLAG_INT, &stall_at, 1, 1e9,
         "tests only: hang --stall-s seconds in the gradient averaging of this step", 0},
        {"stall-s", FLAG_FLOAT, &stall_s, 0, 3600, "tests only: see --stall-average-at", 0},
        {"help", FLAG_BOOL, &help, 0, 0, "show this help", 0},
    };
    cirrus_error err = {0};
    if (flags_parse(flags, NFLAGS(flags), argc, argv, &err)) return cli_fail_input("stage", &err);
    char coord_host[256];
    int coord_port = 0;
    if (coordinator &&
        net_split_hostport(coordinator, coord_host, sizeof coord_host, &coord_port, 0, &err))
        return cli_fail_input("stage", &err);
    if (help) {
        fprintf(stderr, "usage: cirrus-trainer stage --serve L0:L1 [flags]\n");
        flags_usage(flags, NFLAGS(flags));
        return 0;
    }
    if (name && (!name[0] || !coord_name_ok(name))) {
        cirrus_fail(&err, CIRRUS_EINVAL, "--name must be 1..%d characters of [A-Za-z0-9._:-]",
                    COORD_NAME_MAX);
        return cli_fail_input("stage", &err);
    }
    stage_peer_options o = {.job_id = job, .max_B = batch, .seed = seed, .slowdown = slowdown,
                            .slowdown_cpu = slowdown_cpu, .act_slots = act_slots,
                            .stall_at = stall_at, .stall_s = stall_s, .name = name};
    if (cli_model_from_flags(&mf, &o.model, &err)) return cli_fail_input("stage", &err);
    if (!layers || parse_layers(layers, &o.l0, &o.l1) || o.l1 > o.model.n_layer) {
        cirrus_fail(&err, CIRRUS_EINVAL, "--serve must be L0:L1 with 0 <= L0 < L1 <= %d",
                    o.model.n_layer);
        return cli_fail_input("stage", &err);
    }
    o.max_T = seq ? seq : o.model.seq_len;
    if (o.max_T > o.model.seq_len) {
        cirrus_fail(&err, CIRRUS_EINVAL, "--seq %d exceeds the context %d", o.max_T,
                    o.model.seq_len);
        return cli_fail_input("stage", &err);
    }
    o.adam = adamw_defaults(0.0f, 1);
    /* Gradient averaging with the other peers of the stage: where they reach this peer. */
    if (ring_addr) {
        char host[STAGE_ADDR_MAX];
        int port, bound;
        if (net_split_hostport(ring_addr, host, sizeof host, &port, 0, &err))
            return cli_fail_input("stage", &err);
        o.ring_addr = ring_addr;
        if (ring_fd >= 0)
            o.ring_listen_fd = ring_fd;
        else if (net_listen(host, port, &o.ring_listen_fd, &bound, &err))
            return cli_fail_input("stage", &err);
    } else {
        /* No address given: a free port on the advertised host, so peers started by hand
         * can average without picking ports (two peers of a stage need two addresses). */
        int bound;
        if (net_listen(advertise, 0, &o.ring_listen_fd, &bound, &err))
            return cli_fail_input("stage", &err);
        snprintf(ring_default, sizeof ring_default, "%s:%d", advertise, bound);
        o.ring_addr = ring_addr = ring_default;
    }
    char role[64];
    snprintf(role, sizeof role, "stage %d:%d", o.l0, o.l1);
    log_set_role(role);
    if (listen_fd >= 0) {
        o.listen_fd = listen_fd;
    } else {
        char host[256];
        int port, bound;
        if (net_split_hostport(listen_addr, host, sizeof host, &port, 1, &err))
            return cli_fail_input("stage", &err);
        if (net_listen(host, port, &o.listen_fd, &bound, &err)) return cli_fail_input("stage", &err);
        log_info("listening on %s:%d", host, bound);
    }
    if (coordinator) {
        struct sockaddr_in sa;
        socklen_t len = sizeof sa;
        o.coord_host = coord_host;
        o.coord_port = coord_port;
        o.stage_index = stage_index;
        o.advertise_host = advertise;
        o.advertise_port = getsockname(o.listen_fd, (struct sockaddr *)&sa, &len) == 0
                               ? ntohs(sa.sin_port)
                               : 0;
    }
    signal(SIGTERM, on_signal);
    signal(SIGINT, on_signal);
    signal(SIGPIPE, SIG_IGN);
    int rc = stage_peer_run(&o, &stop_requested, &err);
    close(o.listen_fd);
    if (ring_addr) close(o.ring_listen_fd);
    if (rc) {
        fprintf(stderr, "cirrus-trainer stage: %s\n", err.msg);
        return 1;
    }
    return 0;
}

/* ---- the client: the training loop of train.c, with the model on the stage peers ---- */

typedef struct pipe_exec {
    pipeline *p;
    int micro; /* sequences per microbatch; a step's batch is split into B / micro of them */
    coord_client *coord; /* NULL: no coordinator to report to */
    double t_last;
    /* Several clients share each step (--clients): this one runs a contiguous run of its
     * microbatches and meets the others at the coordinator's step barrier (step_share.c).
     * Client 0, the leader, runs the optimizer step. */
    int index, n_clients;
    step_share share;          /* with n_clients > 1 */
    uint64_t exit_mid_step;    /* tests: die half-way through this step's share (0: never) */
} pipe_exec;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Tell the coordinator how training goes (for /status); never fatal. */
static void report_step(pipe_exec *e, uint64_t step, float loss, int tokens)
{
    if (!e->coord) return;
    double t = now_s();
    coord_report rep = {.step = step, .loss = loss,
                        .tokens_per_s = e->t_last > 0 ? tokens / (t - e->t_last) : 0.0,
                        .mb_retried = pipeline_get_counters(e->p)->retried};
    e->t_last = t;
    cirrus_error err = {0};
    if (coord_client_report(e->coord, &rep, 1000, NULL, &err))
        log_warn("coordinator: %s", err.msg);
}

/* Between steps: peers the coordinator knows and this client does not (replacements of
 * lost peers, new capacity, peers that moved to another stage) join their stage. */
static void admit_new_peers(void *ctx, uint64_t step)
{
    pipe_exec *e = ctx;
    const uint64_t joined = pipeline_get_counters(e->p)->peers_joined;
    if (!e->coord) return;
    coord_peer_info *peers = NULL;
    size_t n = 0;
    cirrus_error err = {0};
    if (coord_client_peers(e->coord, COORD_ALL_STAGES, 1000, &peers, &n, NULL, &err)) {
        log_warn("coordinator: %s", err.msg);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        char addr[STAGE_ADDR_MAX];
        snprintf(addr, sizeof addr, "%s:%u", peers[i].host, (unsigned)peers[i].port);
        if ((int)peers[i].stage < pipeline_stages(e->p) &&
            pipeline_join(e->p, (int)peers[i].stage, addr, &err))
            log_warn("peer %s could not join stage %u: %s", addr, peers[i].stage, err.msg);
    }
    free(peers);
    const uint64_t now_joined = pipeline_get_counters(e->p)->peers_joined;
    if (now_joined > joined)
        log_info("%llu peer(s) joined before step %llu", (unsigned long long)(now_joined - joined),
                 (unsigned long long)step);
}

static int pipe_step(void *ctx, uint64_t id, int B, int T, const int32_t *x, const int32_t *y,
                     float lr, uint64_t step, float *loss, cirrus_error *err)
{
    pipe_exec *e = ctx;
    const int M = B / e->micro;
    float losses[PIPE_MAX_MICRO];
    if (M > PIPE_MAX_MICRO)
        return cirrus_fail(err, CIRRUS_EINVAL, "%d microbatches per step: at most %d", M,
                           PIPE_MAX_MICRO);
    if (M < e->n_clients)
        return cirrus_fail(err, CIRRUS_EINVAL, "%d microbatches per step cannot be shared by "
                           "%d clients", M, e->n_clients);
    admit_new_peers(e, step);
    /* This client's share: a contiguous run of the step's microbatches. */
    const int first = e->index * M / e->n_clients;
    const int mine = (e->index + 1) * M / e->n_clients - first;
    const size_t off = (size_t)first * e->micro * T;
    const uint64_t first_id = (id - 1) * (uint64_t)M + (uint64_t)first + 1;
    if (e->exit_mid_step == step) { /* tests: a pod preempted half-way through its share */
        pipeline_microbatches(e->p, first_id, 1, e->micro, T, x + off, y + off, losses, err);
        log_warn("exiting half-way through step %llu (--exit-mid-step)",
                 (unsigned long long)step);
        _exit(137);
    }
    if (e->n_clients > 1) step_share_begin(&e->share, step, mine);
    int rc = pipeline_microbatches(e->p, first_id, mine, e->micro, T, x + off, y + off, losses,
                                   err);
    if (rc) return rc;
    double loss_sum = 0.0;
    for (int m = 0; m < mine; m++) loss_sum += losses[m]; /* in order: reproducible */
    if (e->n_clients == 1) {
        rc = pipeline_step(e->p, lr, 1.0f / (float)M, step, err);
        *loss = (float)(loss_sum / M);
    } else if (e->index == 0) {
        double total = 0.0;
        e->share.loss_sum = loss_sum;
        rc = step_share_lead(&e->share, M, lr, 1.0f / (float)M, &total, err);
        *loss = (float)(total / M);
    } else {
        e->share.loss_sum = loss_sum;
        rc = step_share_follow(&e->share, err);
        *loss = (float)(e->share.loss_sum / mine); /* this client's share (as last redone) */
    }
    if (!rc) report_step(e, step, *loss, mine * e->micro * T);
    return rc;
}

static int pipe_eval(void *ctx, int B, int T, const int32_t *x, const int32_t *y, float *loss,
                     cirrus_error *err)
{
    pipe_exec *e = ctx;
    const int M = B / e->micro;
    double sum = 0.0;
    for (int m = 0; m < M; m++) {
        float l;
        const size_t off = (size_t)m * e->micro * T;
        int rc = pipeline_eval(e->p, e->micro, T, x + off, y + off, &l, err);
        if (rc) return rc;
        sum += l;
    }
    *loss = (float)(sum / M);
    return 0;
}

static int pipe_gather(void *ctx, float *params, float *adam_m, float *adam_v, uint64_t *steps,
                       cirrus_error *err)
{
    pipe_exec *e = ctx;
    return pipeline_gather_state(e->p, params, adam_m, adam_v, steps, err);
}

static uint64_t pipe_first_step(void *ctx)
{
    return pipeline_steps_done(((pipe_exec *)ctx)->p);
}

/* Progress lines of a pipeline client: each stage's live peers and measured samples/s. */
static void pipe_describe(void *ctx, int json, char *buf, size_t size)
{
    pipe_exec *e = ctx;
    size_t used = (size_t)snprintf(buf, size, json ? ",\"stages\":[" : " | peers");
    for (int s = 0; s < pipeline_stages(e->p) && used < size; s++) {
        int peers;
        double rate;
        pipeline_stage_load(e->p, s, &peers, &rate);
        used += (size_t)(json ? snprintf(buf + used, size - used,
                                         "%s{\"peers\":%d,\"samples_per_s\":%.1f}",
                                         s ? "," : "", peers, rate)
                              : snprintf(buf + used, size - used, "%s%d (%.0f samples/s)",
                                         s ? ", " : " ", peers, rate));
    }
    if (json && used < size) snprintf(buf + used, size - used, "]");
}

static int parse_codec(const char *name, int *codec, cirrus_error *err)
{
    if (strcmp(name, "none") == 0)
        *codec = STAGE_CODEC_NONE;
    else if (strcmp(name, "q8") == 0)
        *codec = STAGE_CODEC_Q8;
    else
        return cirrus_fail(err, CIRRUS_EINVAL, "--act-compress must be none or q8, got '%s'",
                           name);
    return 0;
}

static int parse_routing(const char *name, enum wiring_policy *policy, cirrus_error *err)
{
    if (strcmp(name, "wiring") == 0)
        *policy = WIRING_LEAST_LOADED;
    else if (strcmp(name, "rr") == 0)
        *policy = WIRING_ROUND_ROBIN;
    else
        return cirrus_fail(err, CIRRUS_EINVAL, "--routing must be wiring or rr, got '%s'",
                           name);
    return 0;
}

/* A client of the coordinator at addr (NULL: none). It connects lazily, so a coordinator
 * that is not up yet is not an error here. */
static coord_client *coord_open(const char *addr, const char *job, cirrus_error *err)
{
    char host[256];
    int port;
    coord_client *cc = NULL;
    if (addr && (net_split_hostport(addr, host, sizeof host, &port, 0, err) ||
                 coord_client_open(host, port, job, &cc, err)))
        return NULL;
    return cc;
}

/* Register as a pipeline client (for /status); never fatal. */
static void client_register(coord_client *cc)
{
    if (!cc) return;
    cirrus_error err = {0};
    coord_registration reg = {.role = COORD_ROLE_CLIENT, .stage = COORD_NO_STAGE};
    coord_registered ack;
    snprintf(reg.name, sizeof reg.name, "client-%d", (int)getpid());
    if (coord_client_register(cc, &reg, 2000, &ack, &err))
        log_warn("coordinator: %s (training continues without it)", err.msg);
}

/* ---- discovery: the stage peers of a region, from its coordinator ---- */

/* Peers found through the coordinator, in its order (registration order, stage-major). */
typedef struct discovered {
    int n;                                              /* stages */
    int peers[PIPE_MAX_STAGES];                         /* per stage */
    char addr[PIPE_MAX_STAGES * PIPE_MAX_PEERS][STAGE_ADDR_MAX];
    const char *addrs[PIPE_MAX_STAGES * PIPE_MAX_PEERS]; /* stage-major, into addr */
} discovered;

/* Sort the coordinator's list into d; 1 if every stage has a peer. `missing` names the
 * stages without one (for the log line and the error). */
static int group_by_stage(const coord_peer_info *list, size_t count, uint32_t n_stages,
                          discovered *d, char *missing, size_t missing_len)
{
    d->n = (int)n_stages;
    int a = 0, complete = 1;
    size_t used = 0;
    missing[0] = '\0';
    for (int s = 0; s < d->n; s++) {
        d->peers[s] = 0;
        for (size_t i = 0; i < count && d->peers[s] < PIPE_MAX_PEERS; i++) {
            if ((int)list[i].stage != s) continue;
            snprintf(d->addr[a], sizeof d->addr[a], "%s:%u", list[i].host,
                     (unsigned)list[i].port);
            d->addrs[a] = d->addr[a];
            a++;
            d->peers[s]++;
        }
        if (d->peers[s] == 0) {
            complete = 0;
            if (used < missing_len)
                used += (size_t)snprintf(missing + used, missing_len - used, "%s%d",
                                         used ? ", " : "", s);
        }
    }
    return complete;
}

/* Ask the coordinator for the live peers of every stage until each stage has at least one
 * (pods come up in any order and their addresses are known only once they register), for
 * at most wait_s seconds. What is waited for is logged when it changes, not every poll. */
static int discover_stages(coord_client *cc, const char *coordinator, int wait_s,
                           discovered *d, cirrus_error *err)
{
    const double deadline = now_s() + wait_s;
    char waiting[512] = "", last[512] = "";
    for (;;) {
        coord_peer_info *list = NULL;
        size_t count = 0;
        uint32_t n_stages = 0;
        cirrus_error cerr = {0};
        if (coord_client_peers(cc, COORD_ALL_STAGES, 2000, &list, &count, &n_stages, &cerr)) {
            snprintf(waiting, sizeof waiting, "the coordinator at %s (%s)", coordinator,
                     cerr.msg);
        } else if (n_stages < 1 || n_stages > PIPE_MAX_STAGES) {
            free(list);
            return cirrus_fail(err, CIRRUS_EINVAL, "coordinator %s serves %u stages; a client "
                               "drives 1 to %d", coordinator, n_stages, PIPE_MAX_STAGES);
        } else {
            char missing[400];
            int complete = group_by_stage(list, count, n_stages, d, missing, sizeof missing);
            free(list);
            if (complete) return 0;
            snprintf(waiting, sizeof waiting, "a peer in each of stages [%s] (of %u) at %s",
                     missing, n_stages, coordinator);
        }
        if (now_s() >= deadline)
            return cirrus_fail(err, CIRRUS_ETIMEDOUT, "still waiting for %s after %d s "
                               "(--wait-peers-s)", waiting, wait_s);
        if (strcmp(waiting, last) != 0) {
            log_info("waiting for %s", waiting);
            snprintf(last, sizeof last, "%s", waiting);
        }
        usleep(250000);
    }
}

/* Where the client finds its stage peers: listed on the command line, or discovered. */
typedef struct peer_source {
    int n;                    /* stages; 0: ask the coordinator */
    const int *peers;         /* per stage */
    const char *const *addrs; /* stage-major */
    int wait_s;               /* how long discovery may wait for every stage to have a peer */
} peer_source;

/* Connect to the listed peers, or to those the coordinator lists. A discovered peer may be
 * gone while still listed (until its registration expires): a connection that fails at the
 * transport is retried with a fresh list until the wait is over. */
static int connect_pipeline(pipeline **p, const peer_source *src, coord_client *cc,
                            const char *coordinator, const char *job, const gpt_config *cfg,
                            int micro, int T, int codec, cirrus_error *err)
{
    if (src->n)
        return pipeline_connect(p, job, src->n, src->peers, src->addrs, cfg, micro, T, codec,
                                PIPE_TIMEOUT_MS, err);
    static discovered d; /* large; one client per process */
    const double deadline = now_s() + src->wait_s;
    for (;;) {
        int left = (int)ceil(deadline - now_s());
        int rc = discover_stages(cc, coordinator, left > 0 ? left : 0, &d, err);
        if (rc) return rc;
        rc = pipeline_connect(p, job, d.n, d.peers, d.addrs, cfg, micro, T, codec,
                              PIPE_TIMEOUT_MS, err);
        if (!rc) {
            log_info("connected to %d stages found through %s", d.n, coordinator);
            return 0;
        }
        if (rc == CIRRUS_EMISMATCH || rc == CIRRUS_EINVAL || rc == CIRRUS_ENOMEM ||
            now_s() >= deadline)
            return rc;
        log_warn("%s; asking %s again", err->msg, coordinator);
        sleep(1);
    }
}

/* How a client routes microbatches (--routing, --inflight). */
typedef struct routing_flags {
    const char *name;
    enum wiring_policy policy;
    int inflight;
} routing_flags;

/* Which of the region's clients this one is (--clients, --client-index). */
typedef struct client_share {
    int n_clients, index;
    int exit_mid_step; /* tests: --exit-mid-step */
} client_share;

/* Train through the stage peers of src. */
static int run_client(const char *cmd, train_options *o, const char *job,
                      const peer_source *src, int codec, int micro, const char *coordinator,
                      const routing_flags *routing, const client_share *share)
{
    cirrus_error err = {0};
    pipeline *p = NULL;
    const int T = o->seq ? o->seq : o->model.seq_len;
    if (micro < 1 || o->batch % micro) {
        cirrus_fail(&err, CIRRUS_EINVAL, "--microbatch %d must divide --batch %d", micro,
                    o->batch);
        return cli_fail_input(cmd, &err);
    }
    if (share->n_clients > 1 && !coordinator) {
        cirrus_fail(&err, CIRRUS_EINVAL, "--clients %d needs --coordinator: the clients meet "
                    "there every step", share->n_clients);
        return cli_fail_input(cmd, &err);
    }
    if (share->index >= share->n_clients) {
        cirrus_fail(&err, CIRRUS_EINVAL, "--client-index %d must be below --clients %d",
                    share->index, share->n_clients);
        return cli_fail_input(cmd, &err);
    }
    if (share->index > 0 && o->ckpt_dir) {
        cirrus_fail(&err, CIRRUS_EINVAL, "--ckpt: client 0 writes the checkpoints");
        return cli_fail_input(cmd, &err);
    }
    coord_client *cc = coord_open(coordinator, job, &err);
    if (coordinator && !cc) return cli_fail_input(cmd, &err);
    if (connect_pipeline(&p, src, cc, coordinator, job, &o->model, micro, T, codec, &err)) {
        fprintf(stderr, "cirrus-trainer %s: %s\n", cmd, err.msg);
        coord_client_close(cc);
        return err.code == CIRRUS_EMISMATCH || err.code == CIRRUS_EINVAL ? EXIT_BAD_INPUT : 1;
    }
    if ((share->n_clients == 1 && pipeline_take_over(p, &err)) ||
        pipeline_set_routing(p, routing->policy, routing->inflight, o->seed, &err)) {
        fprintf(stderr, "cirrus-trainer %s: %s\n", cmd, err.msg);
        pipeline_close(p);
        coord_client_close(cc);
        return 1;
    }
    client_register(cc);
    static pipe_exec pe; /* large (the lost-peer list); one client per process */
    pe = (pipe_exec){.p = p, .micro = micro, .coord = cc, .index = share->index,
                     .n_clients = share->n_clients,
                     .exit_mid_step = (uint64_t)share->exit_mid_step};
    if (share->n_clients > 1)
        step_share_init(&pe.share, p, cc, share->index, share->n_clients, admit_new_peers, &pe);
    if (pipeline_align_peers(p, &err)) {
        fprintf(stderr, "cirrus-trainer %s: %s\n", cmd, err.msg);
        if (pe.coord) coord_client_leave(pe.coord, 1000, NULL);
        coord_client_close(pe.coord);
        pipeline_close(p);
        return 1;
    }
    /* Only the leader evaluates: the clients share one model, and a follower's validation
     * passes would only load the peers. */
    train_executor ex = {&pe, pipe_step, share->index == 0 ? pipe_eval : NULL, pipe_gather,
                         pipe_describe, pipe_first_step};
    o->executor = &ex;
    int rc = cli_run_training(cmd, o);
    pipeline_log_routing(p);
    const pipeline_counters *pc = pipeline_get_counters(p);
    /* One line for people and scripts: every microbatch completed, and what it took. */
    log_info("pipeline counters: {\"microbatches\":%llu,\"retried\":%llu,\"redone\":%llu,"
             "\"peers_lost\":%llu,\"peers_joined\":%llu}",
             (unsigned long long)pc->microbatches, (unsigned long long)pc->retried,
             (unsigned long long)pc->redone, (unsigned long long)pc->peers_lost,
             (unsigned long long)pc->peers_joined);
    if (pe.coord) coord_client_leave(pe.coord, 1000, NULL);
    coord_client_close(pe.coord);
    pipeline_close(p);
    return rc;
}


int roles_cmd_client(int argc, char **argv)
{
    train_options o;
    train_options_defaults(&o);
    o.data = cli_default_data();
    model_flags mf = {.preset = "tiny"};
    const char *job = "cirrus", *stages = NULL, *act = "none", *coordinator = NULL;
    routing_flags routing = {"wiring", WIRING_LEAST_LOADED, 0};
    int help = 0, micro = 0, wait_s = 600;
    client_share share = {1, 0, 0};
    flag_spec flags[] = {
        MODEL_FLAGS(mf),
        TRAIN_FLAGS(o),
        CKPT_FLAGS(o),
        {ROLE_FLAG_JOB, FLAG_STR, &job, 0, 0, "job id", 0},
        {ROLE_FLAG_STAGES, FLAG_STR, &stages, 0, 0,
         "stage peers, stages in order separated by '/', a stage's peers by ',' "
         "(default: ask --coordinator)",
         0},
        {ROLE_FLAG_MICROBATCH, FLAG_INT, &micro, 1, 65536, "sequences per microbatch (default: batch)",
         0},
        {ROLE_FLAG_COORDINATOR, FLAG_STR, &coordinator, 0, 0,
         "the region's coordinator, HOST:PORT: finds the stage peers when --stages is not "
         "given, admits new peers between steps, receives progress",
         0},
        {ROLE_FLAG_CLIENTS, FLAG_INT, &share.n_clients, 1, COORD_MAX_CLIENTS,
         "clients sharing each step's batch (default 1); they meet at --coordinator", 0},
        {ROLE_FLAG_CLIENT_INDEX, FLAG_INT, &share.index, 0, COORD_MAX_CLIENTS - 1,
         "which of them this is (0, the default, runs the optimizer step)", 0},
        {"exit-mid-step", FLAG_INT, &share.exit_mid_step, 1, 1e9,
         "tests only: exit (137) after one microbatch of this step, as a preempted pod", 0},
        {"wait-peers-s", FLAG_INT, &wait_s, 0, 86400,
         "without --stages: seconds to wait until every stage has a peer (default 600)", 0},
        {ROLE_FLAG_ACT_COMPRESS, FLAG_STR, &act, 0, 0, "activation codec: none or q8", 0},
        {"routing", FLAG_STR, &routing.name, 0, 0,
         "which peer of a stage gets a microbatch: wiring (least loaded by measured "
         "throughput, default) or rr (round robin, speed ignored)",
         0},
        {"inflight", FLAG_INT, &routing.inflight, 0, PIPE_MAX_MICRO,
         "microbatches in flight at once (default 0: one per stage peer)", 0},
        {"help", FLAG_BOOL, &help, 0, 0, "show this help", 0},
    };
    cirrus_error err = {0};
    if (flags_parse(flags, NFLAGS(flags), argc, argv, &err)) return cli_fail_input("client", &err);
    if (help) {
        fprintf(stderr, "usage: cirrus-trainer client --stages HOST:PORT,... [flags]\n"
                        "       cirrus-trainer client --coordinator HOST:PORT [flags]\n");
        flags_usage(flags, NFLAGS(flags));
        return 0;
    }
    int codec = STAGE_CODEC_NONE;
    if (cli_model_from_flags(&mf, &o.model, &err) || parse_codec(act, &codec, &err) ||
        parse_routing(routing.name, &routing.policy, &err))
        return cli_fail_input("client", &err);
    if (!stages && !coordinator) {
        cirrus_fail(&err, CIRRUS_EINVAL,
                    "--stages HOST:PORT,... or --coordinator HOST:PORT is required");
        return cli_fail_input("client", &err);
    }
    micro = micro ? micro : o.batch;
    if (!stages) {
        peer_source src = {.n = 0, .wait_s = wait_s};
        return run_client("client", &o, job, &src, codec, micro, coordinator, &routing, &share);
    }
    char *list = strdup(stages);
    const char *stage_lists[PIPE_MAX_STAGES], *addrs[PIPE_MAX_STAGES * PIPE_MAX_PEERS];
    int peers[PIPE_MAX_STAGES], n_addrs = 0;
    int n = list ? split_list(list, stage_lists, PIPE_MAX_STAGES, '/') : -1;
    for (int s = 0; s < n; s++) {
        peers[s] = split_list((char *)stage_lists[s], addrs + n_addrs, PIPE_MAX_PEERS, ',');
        if (peers[s] < 1) n = -1;
        if (n < 0) break;
        n_addrs += peers[s];
    }
    int rc;
    if (n < 1) {
        cirrus_fail(&err, CIRRUS_EINVAL,
                    "--stages must list 1 to %d stages of 1 to %d HOST:PORT peers",
                    PIPE_MAX_STAGES, PIPE_MAX_PEERS);
        rc = cli_fail_input("client", &err);
    } else {
        peer_source src = {.n = n, .peers = peers, .addrs = addrs};
        rc = run_client("client", &o, job, &src, codec, micro, coordinator, &routing, &share);
    }
    free(list);
    return rc;
}

/* ---- local: a region on loopback ---- */

/* What a spawned stage peer is told: its layers, sockets and the stage's ring. */
typedef struct peer_spec {
    int stage, l0, l1, listen_fd, ring_fd;
    const char *ring_addr;   /* HOST:PORT of ring_fd */
    const char *coordinator; /* HOST:PORT */
    double slowdown;         /* > 1: --slowdown for this peer (tests, benchmarks) */
    int slowdown_cpu;        /* --slowdown-cpu */
    int act_slots;           /* --act-slots; 0: the peer's default */
    int stall_at;            /* > 0: --stall-average-at (tests) */
    double stall_s;          /* --stall-s */
} peer_spec;

/* In a child of `local`: the region's processes go when `local` goes, however it ends
 * (killed included), instead of serving on as orphans. */
static void die_with_parent(pid_t parent)
{
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(1); /* it went before the line above took effect */
}

/* Start a stage peer process on inherited listening sockets. */
static pid_t spawn_stage(const peer_spec *ps, const gpt_config *cfg, const train_options *o,
                         int micro, const char *job)
{
    const pid_t parent = getpid();
    pid_t pid = fork();
    if (pid != 0) return pid;
    die_with_parent(parent);
    /* dup clears close-on-exec: the exec'd peer inherits the sockets. */
    int fd = dup(ps->listen_fd), rfd = dup(ps->ring_fd);
    char a_fd[16], a_layers[32], a_nl[16], a_w[16], a_h[16], a_ctx[16], a_b[16], a_seq[16],
        a_seed[32], a_rfd[16], a_stage[16];
    snprintf(a_fd, sizeof a_fd, "%d", fd);
    snprintf(a_layers, sizeof a_layers, "%d:%d", ps->l0, ps->l1);
    snprintf(a_nl, sizeof a_nl, "%d", cfg->n_layer);
    snprintf(a_w, sizeof a_w, "%d", cfg->n_embd);
    snprintf(a_h, sizeof a_h, "%d", cfg->n_head);
    snprintf(a_ctx, sizeof a_ctx, "%d", cfg->seq_len);
    snprintf(a_b, sizeof a_b, "%d", micro);
    snprintf(a_seq, sizeof a_seq, "%d", o->seq ? o->seq : cfg->seq_len);
    snprintf(a_seed, sizeof a_seed, "%llu", (unsigned long long)o->seed);
    snprintf(a_rfd, sizeof a_rfd, "%d", rfd);
    snprintf(a_stage, sizeof a_stage, "%d", ps->stage);
    /* Several processes share the cores: one compute thread each, sleeping when idle. */
    setenv("OMP_NUM_THREADS", "1", 0);
    setenv("OMP_WAIT_POLICY", "passive", 0);
    char *args[48] = {ROLE_TRAINER_BIN, ROLE_STAGE, ROLE_ARG(ROLE_FLAG_LISTEN_FD), a_fd, ROLE_ARG(ROLE_FLAG_SERVE), a_layers,
                      ROLE_ARG(ROLE_FLAG_LAYERS), a_nl, ROLE_ARG(ROLE_FLAG_WIDTH), a_w, ROLE_ARG(ROLE_FLAG_HEADS), a_h, ROLE_ARG(ROLE_FLAG_CONTEXT), a_ctx,
                      ROLE_ARG(ROLE_FLAG_BATCH), a_b, ROLE_ARG(ROLE_FLAG_SEQ), a_seq, ROLE_ARG(ROLE_FLAG_SEED), a_seed, ROLE_ARG(ROLE_FLAG_JOB), (char *)job};
    int n = 22;
    if (ps->coordinator) {
        char *coord[] = {ROLE_ARG(ROLE_FLAG_COORDINATOR), (char *)ps->coordinator, ROLE_ARG(ROLE_FLAG_STAGE_INDEX), a_stage};
        for (size_t i = 0; i < sizeof coord / sizeof coord[0]; i++) args[n++] = coord[i];
    }
    char *ring[] = {ROLE_ARG(ROLE_FLAG_RING_ADDR), (char *)ps->ring_addr, ROLE_ARG(ROLE_FLAG_RING_FD), a_rfd};
    for (size_t i = 0; i < sizeof ring / sizeof ring[0]; i++) args[n++] = ring[i];
    char a_slow[32];
    if (ps->slowdown > 1.0) {
        snprintf(a_slow, sizeof a_slow, "%g", ps->slowdown);
        args[n++] = "--slowdown";
        args[n++] = a_slow;
        if (ps->slowdown_cpu) args[n++] = "--slowdown-cpu";
    }
    char a_slots[16];
    if (ps->act_slots > 0) {
        snprintf(a_slots, sizeof a_slots, "%d", ps->act_slots);
        args[n++] = "--act-slots";
        args[n++] = a_slots;
    }
    char a_stall_at[16], a_stall_s[32];
    if (ps->stall_at > 0) {
        snprintf(a_stall_at, sizeof a_stall_at, "%d", ps->stall_at);
        snprintf(a_stall_s, sizeof a_stall_s, "%g", ps->stall_s);
        args[n++] = "--stall-average-at";
        args[n++] = a_stall_at;
        args[n++] = "--stall-s";
        args[n++] = a_stall_s;
    }
    args[n] = NULL;
    execv("/proc/self/exe", args);
    _exit(127);
}

/* A follower client of `local`: the leader's training flags, its own share. */
typedef struct follower_spec {
    const train_options *o;
    const char *job, *coordinator;
    int micro;
    const char *act, *routing;
    int inflight, index, n_clients;
} follower_spec;

/* Start follower client fs->index as a process; its progress lines go nowhere (the
 * leader's show every client's loss), its log to stderr. */
static pid_t spawn_follower(const follower_spec *fs)
{
    const pid_t parent = getpid();
    pid_t pid = fork();
    if (pid != 0) return pid;
    die_with_parent(parent);
    const train_options *o = fs->o;
    const gpt_config *cfg = &o->model;
    char v[16][32];
    int i = 0;
#define NUM(fmt, x) (snprintf(v[i], sizeof v[i], fmt, x), v[i++])
    char *args[64] = {ROLE_TRAINER_BIN, ROLE_CLIENT,
                      ROLE_ARG(ROLE_FLAG_COORDINATOR), (char *)fs->coordinator,
                      ROLE_ARG(ROLE_FLAG_JOB), (char *)fs->job,
                      ROLE_ARG(ROLE_FLAG_LAYERS), NUM("%d", cfg->n_layer),
                      ROLE_ARG(ROLE_FLAG_WIDTH), NUM("%d", cfg->n_embd),
                      ROLE_ARG(ROLE_FLAG_HEADS), NUM("%d", cfg->n_head),
                      ROLE_ARG(ROLE_FLAG_CONTEXT), NUM("%d", cfg->seq_len),
                      ROLE_ARG(ROLE_FLAG_BATCH), NUM("%d", o->batch),
                      ROLE_ARG(ROLE_FLAG_SEQ), NUM("%d", o->seq ? o->seq : cfg->seq_len),
                      ROLE_ARG(ROLE_FLAG_SEED), NUM("%llu", (unsigned long long)o->seed),
                      ROLE_ARG(ROLE_FLAG_STEPS), NUM("%d", o->steps),
                      ROLE_ARG(ROLE_FLAG_MICROBATCH), NUM("%d", fs->micro),
                      ROLE_ARG(ROLE_FLAG_CLIENTS), NUM("%d", fs->n_clients),
                      ROLE_ARG(ROLE_FLAG_CLIENT_INDEX), NUM("%d", fs->index),
                      "--eval-every", NUM("%d", o->eval_every > 0 ? o->eval_every : o->steps),
                      "--eval-batches", NUM("%d", o->eval_batches),
                      "--inflight", NUM("%d", fs->inflight),
                      ROLE_ARG(ROLE_FLAG_DATA), (char *)o->data,
                      ROLE_ARG(ROLE_FLAG_ACT_COMPRESS), (char *)fs->act,
                      "--routing", (char *)fs->routing,
                      "--log-every", "1000000000",
                      NULL};
#undef NUM
    int devnull = open("/dev/null", O_WRONLY);
    if (devnull >= 0) dup2(devnull, STDOUT_FILENO);
    setenv("OMP_NUM_THREADS", "1", 0);
    execv("/proc/self/exe", args);
    _exit(127);
}

/* --slow-peer STAGE:PEER:F */
typedef struct slow_peer {
    int stage, peer;
    double factor;
} slow_peer;

/* --stage-peers N0,N1,...: one count per stage, each 1..PIPE_MAX_PEERS. */
static int parse_stage_peers(const char *text, int n_stages, int *peers, cirrus_error *err)
{
    const char *q = text;
    int n = 0;
    for (;;) {
        char *end;
        long v = strtol(q, &end, 10);
        if (end == q || v < 1 || v > PIPE_MAX_PEERS || n == n_stages) break;
        peers[n++] = (int)v;
        if (*end == '\0' && n == n_stages) return 0;
        if (*end != ',') break;
        q = end + 1;
    }
    return cirrus_fail(err, CIRRUS_EINVAL,
                       "--stage-peers must list %d peer counts (one per stage, 1 to %d each, "
                       "separated by ','), got '%s'",
                       n_stages, PIPE_MAX_PEERS, text);
}

static int parse_slow_peer(const char *text, int n_stages, int n_peers, slow_peer *sp,
                           cirrus_error *err)
{
    char tail;
    if (sscanf(text, "%d:%d:%lf%c", &sp->stage, &sp->peer, &sp->factor, &tail) != 3 ||
        sp->stage < 0 || sp->stage >= n_stages || sp->peer < 0 || sp->peer >= n_peers ||
        !(sp->factor >= 1.0 && sp->factor <= 1000.0))
        return cirrus_fail(err, CIRRUS_EINVAL,
                           "--slow-peer must be STAGE:PEER:F with STAGE < %d, PEER < %d and "
                           "1 <= F <= 1000, got '%s'",
                           n_stages, n_peers, text);
    return 0;
}

/* SIGTERM to every process, and SIGKILL to those still there 3 s later (a peer stuck in a
 * request would otherwise hold `local` up). */
static void stop_processes(pid_t *pids, int n)
{
    for (int i = 0; i < n; i++) kill(pids[i], SIGTERM);
    int left = n;
    for (int tick = 0; left > 0 && tick < 300; tick++) {
        for (int i = 0; i < n; i++)
            if (pids[i] > 0 && waitpid(pids[i], NULL, WNOHANG) == pids[i]) {
                pids[i] = 0;
                left--;
            }
        if (left > 0) usleep(10 * 1000);
    }
    for (int i = 0; i < n; i++)
        if (pids[i] > 0) {
            kill(pids[i], SIGKILL);
            waitpid(pids[i], NULL, 0);
        }
}

/* --stall-peer STAGE:PEER:STEP:SECONDS */
typedef struct stall_peer {
    int stage, peer, step;
    double seconds;
} stall_peer;

static int parse_stall_peer(const char *text, int n_stages, int n_peers, stall_peer *sp,
                            cirrus_error *err)
{
    char tail;
    if (sscanf(text, "%d:%d:%d:%lf%c", &sp->stage, &sp->peer, &sp->step, &sp->seconds,
               &tail) != 4 ||
        sp->stage < 0 || sp->stage >= n_stages || sp->peer < 0 || sp->peer >= n_peers ||
        sp->step < 1 || !(sp->seconds >= 0.0 && sp->seconds <= 3600.0))
        return cirrus_fail(err, CIRRUS_EINVAL,
                           "--stall-peer must be STAGE:PEER:STEP:SECONDS with STAGE < %d, "
                           "PEER < %d, STEP >= 1 and 0 <= SECONDS <= 3600, got '%s'",
                           n_stages, n_peers, text);
    return 0;
}

int roles_cmd_local(int argc, char **argv)
{
    train_options o;
    train_options_defaults(&o);
    o.data = cli_default_data();
    model_flags mf = {.preset = "tiny"};
    const char *act = "none", *slow_text = NULL, *stage_peers = NULL, *job = "cirrus-local";
    routing_flags routing = {"wiring", WIRING_LEAST_LOADED, 0};
    slow_peer slow = {-1, -1, 1.0};
    const char *stall_text = NULL;
    stall_peer stall = {-1, -1, 0, 0.0};
    int n_stages = 2, n_peers = 1, micro = 0, help = 0, status_port = 0, rebalance_s = 0;
    int act_slots = 0, n_clients = 1;
    float peer_slowdown = 1.0f;
    flag_spec flags[] = {
        MODEL_FLAGS(mf),
        TRAIN_FLAGS(o),
        CKPT_FLAGS(o),
        {ROLE_FLAG_STAGES, FLAG_INT, &n_stages, 1, PIPE_MAX_STAGES, "pipeline stages (default 2)", 0},
        {"peers", FLAG_INT, &n_peers, 1, PIPE_MAX_PEERS, "peers per stage (default 1)", 0},
        {ROLE_FLAG_CLIENTS, FLAG_INT, &n_clients, 1, COORD_MAX_CLIENTS,
         "clients sharing each step's batch (default 1); client 0 runs here, the others as "
         "processes",
         0},
        {"stage-peers", FLAG_STR, &stage_peers, 0, 0,
         "peers of each stage, N0,N1,... (overrides --peers; e.g. 3,1 starts unbalanced)", 0},
        {ROLE_FLAG_MICROBATCH, FLAG_INT, &micro, 1, 65536,
         "sequences per microbatch (default: batch / peers)", 0},
        {ROLE_FLAG_ACT_COMPRESS, FLAG_STR, &act, 0, 0, "activation codec: none or q8", 0},
        {"routing", FLAG_STR, &routing.name, 0, 0,
         "which peer of a stage gets a microbatch: wiring (least loaded by measured "
         "throughput, default) or rr (round robin, speed ignored)",
         0},
        {"inflight", FLAG_INT, &routing.inflight, 0, PIPE_MAX_MICRO,
         "microbatches in flight at once (default 0: one per stage peer)", 0},
        {"act-slots", FLAG_INT, &act_slots, 1, STAGE_PEER_MAX_SLOTS,
         "every peer's --act-slots: forwards whose activations it keeps for their backward "
         "(default 4; a window of more microbatches in flight than peers needs more)",
         0},
        {"slow-peer", FLAG_STR, &slow_text, 0, 0,
         "tests and benchmarks only: STAGE:PEER:F starts that peer with --slowdown F "
         "(F times slower)",
         0},
        {"stall-peer", FLAG_STR, &stall_text, 0, 0,
         "tests only: STAGE:PEER:STEP:SECONDS makes that peer hang SECONDS in the gradient "
         "averaging of STEP",
         0},
        {"peer-slowdown", FLAG_FLOAT, &peer_slowdown, 1, 1000,
         "tests and benchmarks only: start every peer with --slowdown F --slowdown-cpu, so "
         "that the sleep, not a shared CPU, bounds each peer's capacity (default 1)",
         0},
        {ROLE_FLAG_REBALANCE_PERIOD_S, FLAG_INT, &rebalance_s, 0, 86400,
         "seconds between the coordinator's rebalancing decisions (0, the default: never)", 0},
        {ROLE_FLAG_JOB, FLAG_STR, &job, 0, 0, "job id (default cirrus-local)", 0},
        {"status-port", FLAG_INT, &status_port, 0, 65535,
         "port of the coordinator's /status and /metrics (default: any free one)", 0},
        {"help", FLAG_BOOL, &help, 0, 0, "show this help", 0},
    };
    cirrus_error err = {0};
    if (flags_parse(flags, NFLAGS(flags), argc, argv, &err)) return cli_fail_input("local", &err);
    if (help) {
        fprintf(stderr, "usage: cirrus-trainer local --stages S --peers P [flags]\n");
        flags_usage(flags, NFLAGS(flags));
        return 0;
    }
    int codec = STAGE_CODEC_NONE;
    if (cli_model_from_flags(&mf, &o.model, &err) || parse_codec(act, &codec, &err) ||
        parse_routing(routing.name, &routing.policy, &err))
        return cli_fail_input("local", &err);
    if (n_stages > o.model.n_layer) {
        cirrus_fail(&err, CIRRUS_EINVAL, "--stages %d exceeds the model's %d layers", n_stages,
                    o.model.n_layer);
        return cli_fail_input("local", &err);
    }
    int peers[PIPE_MAX_STAGES];
    for (int s = 0; s < n_stages; s++) peers[s] = n_peers;
    if (stage_peers && parse_stage_peers(stage_peers, n_stages, peers, &err))
        return cli_fail_input("local", &err);
    if (stage_peers) { /* the widest stage, for the defaults below and --slow-peer */
        n_peers = 1;
        for (int s = 0; s < n_stages; s++) n_peers = peers[s] > n_peers ? peers[s] : n_peers;
    }
    if (slow_text && parse_slow_peer(slow_text, n_stages, n_peers, &slow, &err))
        return cli_fail_input("local", &err);
    if (stall_text && parse_stall_peer(stall_text, n_stages, n_peers, &stall, &err))
        return cli_fail_input("local", &err);
    if (!micro) micro = o.batch / n_peers > 0 ? o.batch / n_peers : 1;
    /* The region's coordinator runs inside this process (as it runs inside the gateway). */
    coordinator *co = NULL;
    coordinator_options co_opt = {.job_id = job, .host = "127.0.0.1", .port = 0,
                                  .http_port = status_port, .n_stages = (uint32_t)n_stages,
                                  .n_layer = (uint32_t)o.model.n_layer,
                                  .rebalance_period_ms = (uint32_t)rebalance_s * 1000u};
    if (coordinator_start(&co_opt, &co, &err)) {
        fprintf(stderr, "cirrus-trainer local: coordinator: %s\n", err.msg);
        return 1;
    }
    char coord_addr[32];
    snprintf(coord_addr, sizeof coord_addr, "127.0.0.1:%d", coordinator_port(co));
    if (o.json) /* stdout carries only JSON lines then */
        log_info("coordinator at %s; status at http://127.0.0.1:%d/status and /metrics",
                 coord_addr, coordinator_http_port(co));
    else
        printf("cirrus: coordinator at %s; status at http://127.0.0.1:%d/status and /metrics\n",
               coord_addr, coordinator_http_port(co));
    fflush(stdout);
    enum { MAXP = PIPE_MAX_STAGES * PIPE_MAX_PEERS };
    static pid_t pids[MAXP];
    static char addr_buf[MAXP][32], ring_buf[MAXP][32];
    static const char *addrs[MAXP];
    int started = 0, rc = 0;
    for (int s = 0; s < n_stages && !rc; s++) {
        const int l0 = s * o.model.n_layer / n_stages, l1 = (s + 1) * o.model.n_layer / n_stages;
        int fds[PIPE_MAX_PEERS], rfds[PIPE_MAX_PEERS], port, rport;
        for (int k = 0; k < peers[s]; k++) fds[k] = rfds[k] = -1;
        for (int k = 0; k < peers[s] && !rc; k++) {
            if (net_listen("127.0.0.1", 0, &fds[k], &port, &err) ||
                net_listen("127.0.0.1", 0, &rfds[k], &rport, &err)) {
                rc = cli_fail_input("local", &err);
                break;
            }
            snprintf(addr_buf[started + k], sizeof addr_buf[0], "127.0.0.1:%d", port);
            addrs[started + k] = addr_buf[started + k];
            snprintf(ring_buf[started + k], sizeof ring_buf[0], "127.0.0.1:%d", rport);
        }
        for (int k = 0; k < peers[s] && !rc; k++) {
            double f = peer_slowdown * (s == slow.stage && k == slow.peer ? slow.factor : 1.0);
            peer_spec ps = {s, l0, l1, fds[k], rfds[k], ring_buf[started], coord_addr,
                            f < 1000.0 ? f : 1000.0, peer_slowdown > 1.0f, act_slots,
                            s == stall.stage && k == stall.peer ? stall.step : 0, stall.seconds};
            fflush(stdout);
            pids[started] = spawn_stage(&ps, &o.model, &o, micro, job);
            if (pids[started] < 0) {
                rc = 1;
                break;
            }
            if (!o.json)
                printf("cirrus: stage %d peer %d serves layers [%d, %d) at %s (pid %d)\n", s,
                       k, l0, l1, addrs[started], (int)pids[started]);
            started++;
        }
        for (int k = 0; k < peers[s]; k++) {
            if (fds[k] >= 0) close(fds[k]);
            if (rfds[k] >= 0) close(rfds[k]);
        }
    }
    peer_source src = {.n = n_stages, .peers = peers, .addrs = addrs};
    static pid_t clients[COORD_MAX_CLIENTS];
    int followers = 0;
    for (int i = 1; i < n_clients && !rc; i++) {
        follower_spec fs = {&o, job, coord_addr, micro, act, routing.name, routing.inflight,
                            i, n_clients};
        if ((clients[followers] = spawn_follower(&fs)) < 0) rc = 1;
        else followers++;
    }
    client_share share = {n_clients, 0, 0};
    if (!rc) rc = run_client("local", &o, job, &src, codec, micro, coord_addr, &routing, &share);
    for (int i = 0; i < followers; i++) {
        int status = 0;
        if (rc) kill(clients[i], SIGTERM);
        waitpid(clients[i], &status, 0);
        if (!rc && (!WIFEXITED(status) || WEXITSTATUS(status) != 0)) {
            fprintf(stderr, "cirrus-trainer local: client %d failed\n", i + 1);
            rc = 1;
        }
    }
    stop_processes(pids, started);
    coordinator_stop(co);
    return rc;
}

int roles_cmd_gateway(int argc, char **argv)
{
    const char *job = "cirrus", *listen_addr = "0.0.0.0:7400";
    int stages = 1, layers = 0, http_port = 7480, heartbeat_ms = 0, help = 0, rebalance_s = 30;
    int exit_after_redo = 0;
    flag_spec flags[] = {
        {ROLE_FLAG_JOB, FLAG_STR, &job, 0, 0, "job id; members of other jobs are refused", 0},
        {ROLE_FLAG_LISTEN, FLAG_STR, &listen_addr, 0, 0, "HOST:PORT for peers and clients", 0},
        {ROLE_FLAG_HTTP_PORT, FLAG_INT, &http_port, -1, 65535, "/status and /metrics port (-1: none)",
         0},
        {ROLE_FLAG_STAGES, FLAG_INT, &stages, 1, PIPE_MAX_STAGES, "pipeline stages of the job", 0},
        {ROLE_FLAG_LAYERS, FLAG_INT, &layers, 0, 1024, "the model's layers (checks registrations)", 0},
        {ROLE_FLAG_HEARTBEAT_MS, FLAG_INT, &heartbeat_ms, 0, 600000, "members' heartbeat interval", 0},
        {ROLE_FLAG_REBALANCE_PERIOD_S, FLAG_INT, &rebalance_s, 0, 86400,
         "seconds between rebalancing decisions: a peer of an over-provisioned stage moves to "
         "the bottleneck when that clearly raises the slowest stage's capacity (0: never; "
         "default 30)",
         0},
        {"test-exit-after-redo", FLAG_BOOL, &exit_after_redo, 0, 0,
         "tests only: exit on the first step-barrier call after a REDO notice was posted", 0},
        {"help", FLAG_BOOL, &help, 0, 0, "show this help", 0},
    };
    cirrus_error err = {0};
    if (flags_parse(flags, NFLAGS(flags), argc, argv, &err))
        return cli_fail_input("gateway", &err);
    if (help) {
        fprintf(stderr, "usage: cirrus-trainer gateway --job ID --stages S [flags]\n");
        flags_usage(flags, NFLAGS(flags));
        return 0;
    }
    char host[256];
    int port;
    if (net_split_hostport(listen_addr, host, sizeof host, &port, 1, &err))
        return cli_fail_input("gateway", &err);
    log_set_role("gateway");
    coordinator_options o = {.job_id = job, .host = host, .port = port, .http_port = http_port,
                             .n_stages = (uint32_t)stages, .n_layer = (uint32_t)layers,
                             .heartbeat_ms = (uint32_t)heartbeat_ms,
                             .rebalance_period_ms = (uint32_t)rebalance_s * 1000u,
                             .test_exit_after_redo = exit_after_redo};
    signal(SIGTERM, on_signal);
    signal(SIGINT, on_signal);
    signal(SIGPIPE, SIG_IGN);
    if (coordinator_run(&o, &stop_requested, &err)) {
        fprintf(stderr, "cirrus-trainer gateway: %s\n", err.msg);
        return err.code == CIRRUS_EINVAL ? EXIT_BAD_INPUT : 1;
    }
    return 0;
}
