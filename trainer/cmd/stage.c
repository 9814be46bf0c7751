/* stage: `cirrus-trainer stage`, a stage peer serving layers [l0, l1) of the model to
 * pipeline clients, averaging its gradients with the stage's other peers and, given
 * --coordinator, registering with the region's coordinator. The peer itself is
 * swarm/peer/stage_peer.c; this file turns flags into its options and binds its sockets.
 */
#include "roles.h"

#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "../../common/log.h"
#include "../net/conn.h"
#include "../optim/adamw.h"
#include "../swarm/peer/stage_peer.h"
#include "../swarm/proto/coord_msg.h"
#include "../swarm/proto/stage_msg.h"
#include "roles_common.h"

/* --serve L0:L1: 0 <= L0 < L1 <= 1024 (the model's own bound is checked later). */
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
    const char *backend = "cpu";
    char ring_default[STAGE_ADDR_MAX];
    uint64_t seed = 1337;
    float slowdown = 1.0f;
    int act_slots = STAGE_PEER_DEFAULT_SLOTS, slowdown_cpu = 0;
    int max_conns = STAGE_PEER_DEFAULT_CONNS;
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
        {ROLE_FLAG_MAX_CONNECTIONS, FLAG_INT, &max_conns, 1, STAGE_PEER_MAX_CONNS,
         "connections served at once, a thread each; more are closed when accepted "
         "(default 128)",
         0},
        BACKEND_FLAG(backend),
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
    if (cli_select_backend(backend, &err)) return cli_fail_input("stage", &err);
    stage_peer_options o = {.job_id = job, .max_B = batch, .seed = seed, .slowdown = slowdown,
                            .slowdown_cpu = slowdown_cpu, .act_slots = act_slots,
                            .name = name,
                            .max_conns = max_conns};
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
    roles_catch_signals();
    int rc = stage_peer_run(&o, &roles_stop_requested, &err);
    close(o.listen_fd);
    if (ring_addr) close(o.ring_listen_fd);
    if (rc) {
        fprintf(stderr, "cirrus-trainer stage: %s\n", err.msg);
        return 1;
    }
    return 0;
}
