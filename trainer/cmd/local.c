/* local: `cirrus-trainer local`, a whole region on loopback. It binds every socket first,
 * starts one stage peer process per stage peer (`stage`, sockets inherited) and the
 * follower clients (`client`), runs the region's coordinator and client 0 in its own
 * process, and stops them all when training ends.
 */
#include "roles.h"

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../../common/failpoint.h"
#include "../../common/log.h"
#include "../ckpt/checkpoint.h"
#include "../net/conn.h"
#include "../swarm/coord/coordinator.h"
#include "../swarm/peer/stage_peer.h"
#include "../gateway/outer_msg.h"
#include "../net/tls.h"
#include "../swarm/proto/stage_msg.h"
#include "roles_common.h"
#include "wan_roles.h"

/* Inner steps between outer steps when --regions asks for several and --sync-every says
 * nothing. */
#define LOCAL_DEFAULT_SYNC_EVERY 50

/* What a spawned stage peer is told: its layers, sockets and the stage's ring. */
typedef struct peer_spec {
    int stage, l0, l1, listen_fd, ring_fd;
    const char *ring_addr;   /* HOST:PORT of ring_fd */
    const char *coordinator; /* HOST:PORT */
    double slowdown;         /* > 1: --slowdown for this peer (tests, benchmarks) */
    int slowdown_cpu;        /* --slowdown-cpu */
    int act_slots;           /* --act-slots; 0: the peer's default */
    int stall_at;            /* > 0: --stall-peer's step (tests; failpoint.h) */
    double stall_s;          /* and seconds */
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
    if (ps->stall_at > 0) { /* --stall-peer: this peer's process only */
        char fp[96];
        snprintf(fp, sizeof fp, "stall-average-at=%d,stall-average-ms=%.0f", ps->stall_at,
                 ps->stall_s * 1000.0);
        setenv("CIRRUS_FAILPOINTS", fp, 1);
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
    int sync_every; /* outer steps: the follower reads its region's data shard (0: none) */
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
    char v[20][32];
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
                      NULL, NULL, NULL};
    if (fs->sync_every) {
        size_t end = 0;
        while (args[end]) end++;
        args[end] = ROLE_ARG(ROLE_FLAG_SYNC_EVERY);
        args[end + 1] = NUM("%d", fs->sync_every);
    }
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

/* --test-region-fault R:corrupt:K or R:exit:S, applied in region R's process. */
static int apply_region_fault(const char *text, int region, int *exit_step,
                              cirrus_error *err)
{
    int r;
    char kind[16];
    unsigned long long at;
    char tail;
    if (sscanf(text, "%d:%15[a-z]:%llu%c", &r, kind, &at, &tail) != 3 || at == 0 ||
        (strcmp(kind, "corrupt") != 0 && strcmp(kind, "exit") != 0))
        return cirrus_fail(err, CIRRUS_EINVAL, "--test-region-fault must be R:corrupt:K or "
                           "R:exit:S, got '%s'", text);
    if (r != region) return 0;
    if (kind[0] == 'c') failpoint_set("corrupt-after", at); /* this region's process only */
    else *exit_step = (int)at;
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
    int act_slots = 0, n_clients = 1, n_regions = 1;
    const char *region_fault = NULL;
    wan_flags wan = WAN_FLAGS_DEFAULTS;
    int exit_step = 0, wait_peers_s = 600;
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
         "sequences per microbatch (default: the largest divisor of batch giving a "
         "microbatch to every peer of a stage and every client)", 0},
        {ROLE_FLAG_ACT_COMPRESS, FLAG_STR, &act, 0, 0, "activation codec: none or q8", 0},
        ROUTING_FLAGS(routing),
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
        {"regions", FLAG_INT, &n_regions, 1, WAN_MAX_REGIONS,
         "regions, each a whole region (its gateway, stage peers and client) as processes "
         "here, on disjoint shards of the data, joined by outer steps (default 1)",
         0},
        WAN_FLAGS(wan),
        {"test-region-fault", FLAG_STR, &region_fault, 0, 0,
         "tests only: R:corrupt:K changes a global parameter in region R's gateway after "
         "outer step K; R:exit:S ends region R's process (gateway and client) half-way "
         "through inner step S, as a region lost",
         0},
        {"sync-delay", FLAG_INT, &wan.sync_delay, 0, 999999,
         "inner steps the regions train on at least while an outer step crosses the WAN, then "
         "merge its result once in (waiting only when the next is due; below --sync-every; "
         "0, the default: they wait for it)",
         0},
        {"wait-peers-s", FLAG_INT, &wait_peers_s, 1, 86400,
         "seconds a client waits for a replacement when a stage has lost every peer (then "
         "the model is restored: from the other regions, a checkpoint, or the seed; default "
         "600)",
         0},
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
    if (cli_model_from_flags(&mf, &o.model, &err) || roles_parse_codec(act, &codec, &err) ||
        roles_parse_routing(routing.name, &routing.policy, &err))
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
    if (!micro) micro = roles_default_microbatch(o.batch, n_peers > n_clients ? n_peers : n_clients);
    if (n_regions > 1 && !wan.sync_every) wan.sync_every = LOCAL_DEFAULT_SYNC_EVERY;
    /* Several regions: one process each (this one is region 0), each with its gateway's
     * outer sync next to its coordinator. */
    int region = 0, wan_fd = -1;
    net_tls_ctx *tls = NULL;
    static pid_t regions[WAN_MAX_REGIONS];
    static char region_names[WAN_MAX_REGIONS][WAN_REGION_MAX + 1];
    static char wan_addrs[WAN_MAX_REGIONS][WAN_LOCAL_ADDR_MAX];
    outer_sync *os = NULL;
    wan_local_end region_end;
    wan_codec_params codec_check;
    if (wan.sync_every && (strcmp(wan.codec, "auto") && wan_codec_parse(wan.codec, &codec_check, &err)))
        return cli_fail_input("local", &err);
    if (wan.sync_every && wan.fragments > wan.sync_every) {
        cirrus_fail(&err, CIRRUS_EINVAL, "--fragments %d needs --sync-every %d or more: each "
                    "fragment pushes at an inner step of its own", wan.fragments, wan.fragments);
        return cli_fail_input("local", &err);
    }
    ckpt_meta held;
    if (n_regions > 1 && o.ckpt_dir && ckpt_read_meta(o.ckpt_dir, &held, &err) != CIRRUS_ENOENT) {
        /* Region 0 alone writes the checkpoint (the regions end with one model); resuming
         * would give the others nothing of theirs (their AdamW moments, their data). A
         * job's regions each resume from their own (`client --ckpt`, one per region). */
        cirrus_fail(&err, CIRRUS_EINVAL, "--ckpt %s holds a checkpoint: local --regions %d "
                    "does not resume (give a new directory)", o.ckpt_dir, n_regions);
        return cli_fail_input("local", &err);
    }
    if (n_regions == 1 && roles_resume_setup("local", &o, job)) return EXIT_BAD_INPUT;
    if (wan.sync_every) {
        if (wan_local_regions(&wan, n_regions, job, &region, &wan_fd, &tls, region_names,
                              wan_addrs, regions, &region_end, &err)) {
            fprintf(stderr, "cirrus-trainer local: %s\n", err.msg);
            return 1;
        }
        const char *names[WAN_MAX_REGIONS], *addrs_wan[WAN_MAX_REGIONS];
        for (int r = 0; r < n_regions; r++) names[r] = region_names[r], addrs_wan[r] = wan_addrs[r];
        char role[32];
        snprintf(role, sizeof role, "local %s", region_names[region]);
        log_set_role(role);
        o.data_rank = region;
        o.data_world = n_regions;
        /* After the last outer step every region holds the same model: region 0 writes
         * the checkpoint and the metrics; the others' would only collide with them. */
        if (region > 0) o.ckpt_dir = o.metrics = NULL;
        if (region_fault && apply_region_fault(region_fault, region, &exit_step, &err)) {
            fprintf(stderr, "cirrus-trainer local: %s\n", err.msg);
            return EXIT_BAD_INPUT;
        }
        if (region > 0) status_port = 0; /* region 0 keeps the port asked for */
        if (wan_start_outer(&wan, job, region, n_regions, names, addrs_wan, wan_fd,
                            &o.model, tls, &os, &err)) {
            fprintf(stderr, "cirrus-trainer local: region %s: %s\n", region_names[region],
                    err.msg);
            net_tls_ctx_free(tls);
            return 1;
        }
    }
    /* The region's coordinator runs inside this process (as it runs inside the gateway). */
    coordinator *co = NULL;
    coordinator_options co_opt = {.job_id = job, .host = "127.0.0.1", .port = 0,
                                  .http_port = status_port, .n_stages = (uint32_t)n_stages,
                                  .n_layer = (uint32_t)o.model.n_layer,
                                  .rebalance_period_ms = (uint32_t)rebalance_s * 1000u,
                                  .ext_handler = os ? outer_sync_serve : NULL, .ext_ctx = os,
                                  .ext_status = os ? outer_sync_view : NULL,
                                  .ext_request_limit = OUTER_REQUEST_LIMIT};
    if (coordinator_start(&co_opt, &co, &err)) {
        fprintf(stderr, "cirrus-trainer local: coordinator: %s\n", err.msg);
        outer_sync_stop(os);
        net_tls_ctx_free(tls);
        return 1;
    }
    char coord_addr[32], where[WAN_REGION_MAX + 16] = "";
    snprintf(coord_addr, sizeof coord_addr, "127.0.0.1:%d", coordinator_port(co));
    if (n_regions > 1) /* which region's processes a line names (tests kill them) */
        snprintf(where, sizeof where, "region %s: ", region_names[region]);
    if (o.json) /* stdout carries only JSON lines then */
        log_info("coordinator at %s; status at http://127.0.0.1:%d/status and /metrics",
                 coord_addr, coordinator_http_port(co));
    else
        printf("cirrus: %scoordinator at %s; status at http://127.0.0.1:%d/status and "
               "/metrics\n", where, coord_addr, coordinator_http_port(co));
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
                printf("cirrus: %sstage %d peer %d serves layers [%d, %d) at %s (pid %d)\n",
                       where, s, k, l0, l1, addrs[started], (int)pids[started]);
            started++;
        }
        for (int k = 0; k < peers[s]; k++) {
            if (fds[k] >= 0) close(fds[k]);
            if (rfds[k] >= 0) close(rfds[k]);
        }
    }
    peer_source src = {.n = n_stages, .peers = peers, .addrs = addrs, .wait_s = wait_peers_s};
    static pid_t clients[COORD_MAX_CLIENTS];
    int followers = 0;
    for (int i = 1; i < n_clients && !rc; i++) {
        follower_spec fs = {&o, job, coord_addr, micro, act, routing.name, routing.inflight,
                            i, n_clients, wan.sync_every};
        if ((clients[followers] = spawn_follower(&fs)) < 0) rc = 1;
        else followers++;
    }
    client_share share = {n_clients, 0, exit_step, wan.sync_every, wan.sync_timeout_s, wan.sync_delay,
                          wan.sync_params, wan.sync_every ? region_names[region] : NULL,
                          NULL};
    if (!rc)
        rc = roles_run_client("local", &o, job, &src, codec, micro, coord_addr, &routing, &share);
    /* Asked to stop, the followers are too: one waiting at the step barrier for a step this
     * client will not finish would otherwise wait there for minutes. */
    const int stopping = *cli_stop_flag();
    for (int i = 0; i < followers; i++) {
        int status = 0;
        if (rc || stopping) kill(clients[i], SIGTERM);
        waitpid(clients[i], &status, 0);
        if (!rc && !stopping && (!WIFEXITED(status) || WEXITSTATUS(status) != 0)) {
            fprintf(stderr, "cirrus-trainer local: client %d failed\n", i + 1);
            rc = 1;
        }
    }
    stop_processes(pids, started);
    coordinator_stop(co);
    /* The gateway serves on until every region's client has finished (wan_local_end). */
    if (os) wan_local_finished(&region_end, region, n_regions, rc || stopping, cli_stop_flag());
    outer_sync_stop(os);
    net_tls_ctx_free(tls);
    if (region > 0) _exit(rc); /* a region's process ends here */
    for (int r = 1; r < n_regions && wan.sync_every; r++) {
        int status = 0;
        if (regions[r] <= 0) continue;
        if (rc || *cli_stop_flag()) kill(regions[r], SIGTERM); /* asked to stop: all stop */
        waitpid(regions[r], &status, 0);
        if (!rc && (!WIFEXITED(status) || WEXITSTATUS(status) != 0)) {
            fprintf(stderr, "cirrus-trainer local: region %s failed\n", region_names[r]);
            rc = 1;
        }
    }
    return rc;
}
