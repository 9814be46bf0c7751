/* roles_common: see roles_common.h. */
#include "roles_common.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../../common/clock.h"
#include "../../common/log.h"
#include "../net/conn.h"
#include "../swarm/client/executor.h"
#include "../swarm/proto/coord_msg.h"
#include "../swarm/proto/stage_msg.h"

#define PIPE_TIMEOUT_MS 60000

volatile sig_atomic_t roles_stop_requested;

static void on_signal(int sig)
{
    (void)sig;
    roles_stop_requested = 1;
}

void roles_catch_signals(void)
{
    signal(SIGTERM, on_signal);
    signal(SIGINT, on_signal);
    signal(SIGPIPE, SIG_IGN);
}

int roles_default_microbatch(int batch, int parts)
{
    if (parts < 1) parts = 1;
    for (int m = batch / parts; m > 1; m--)
        if (batch % m == 0) return m;
    return 1;
}

int roles_parse_codec(const char *name, int *codec, cirrus_error *err)
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

int roles_parse_routing(const char *name, enum wiring_policy *policy, cirrus_error *err)
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
    const double deadline = clock_now_s() + wait_s;
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
        if (clock_now_s() >= deadline)
            return cirrus_fail(err, CIRRUS_ETIMEDOUT, "still waiting for %s after %d s "
                               "(--wait-peers-s)", waiting, wait_s);
        if (strcmp(waiting, last) != 0) {
            log_info("waiting for %s", waiting);
            snprintf(last, sizeof last, "%s", waiting);
        }
        usleep(250000);
    }
}

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
    const double deadline = clock_now_s() + src->wait_s;
    for (;;) {
        int left = (int)ceil(deadline - clock_now_s());
        int rc = discover_stages(cc, coordinator, left > 0 ? left : 0, &d, err);
        if (rc) return rc;
        rc = pipeline_connect(p, job, d.n, d.peers, d.addrs, cfg, micro, T, codec,
                              PIPE_TIMEOUT_MS, err);
        if (!rc) {
            log_info("connected to %d stages found through %s", d.n, coordinator);
            return 0;
        }
        if (rc == CIRRUS_EMISMATCH || rc == CIRRUS_EINVAL || rc == CIRRUS_ENOMEM ||
            clock_now_s() >= deadline)
            return rc;
        log_warn("%s; asking %s again", err->msg, coordinator);
        sleep(1);
    }
}

int roles_resume_setup(const char *cmd, train_options *o, const char *job)
{
    cirrus_error err = {0};
    o->resume = o->ckpt_dir != NULL;
    o->job = job;
    if (train_resume_check(o, &err)) {
        fprintf(stderr, "cirrus-trainer %s: %s\n", cmd, err.msg);
        return 1;
    }
    return 0;
}

/* --summary-file: how the run ended, in one line of JSON (common/role_args.h). A file that
 * cannot be written is a warning, not a failed run: the training itself is done. */
static void write_summary(const char *path, const train_result *res)
{
    char loss[32] = "null", val[32] = "null";
    if (isfinite(res->loss) && res->loss >= 0) snprintf(loss, sizeof loss, "%.9g", res->loss);
    if (isfinite(res->val_loss) && res->val_loss >= 0)
        snprintf(val, sizeof val, "%.9g", res->val_loss);
    FILE *f = fopen(path, "w");
    int ok = f && fprintf(f, "{\"step\":%llu,\"loss\":%s,\"val_loss\":%s,\"tokens\":%.0f}\n",
                          (unsigned long long)res->step, loss, val, res->tokens) > 0;
    int e = errno;
    if (f && fclose(f) && ok) {
        ok = 0;
        e = errno;
    }
    if (!ok) log_warn("--summary-file %s: %s (training finished; no summary written)", path,
                      strerror(e));
}

int roles_run_client(const char *cmd, train_options *o, const char *job, const peer_source *src,
                     int codec, int micro, const char *coordinator, const routing_flags *routing,
                     const client_share *share)
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
    if (roles_resume_setup(cmd, o, job)) return EXIT_BAD_INPUT;
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
    pipeline_executor *pe = NULL;
    train_executor ex;
    pipeline_executor_options eo = {.micro = micro, .coord = cc, .index = share->index,
                                    .n_clients = share->n_clients,
                                    .exit_mid_step = (uint64_t)share->exit_mid_step,
                                    .sync_every = share->sync_every,
                                    .sync_timeout_ms = share->sync_timeout_s * 1000,
                                    .sync_delay = share->sync_delay,
                                    .sync_params = share->sync_params,
                                    .final_step = (uint64_t)o->steps,
                                    .region = share->region, .stop = cli_stop_flag(),
                                    .replace_wait_s = src->wait_s};
    int rc = 1;
    if (pipeline_executor_open(p, &eo, &pe, &ex, &err) || pipeline_align_peers(p, &err) ||
        pipeline_executor_data_shard(pe, &o->data_rank, &o->data_world, &err)) {
        fprintf(stderr, "cirrus-trainer %s: %s\n", cmd, err.msg);
        goto out;
    }
    if (o->data_world > 1)
        log_info("region %d of %d: training on its shard of every batch", o->data_rank + 1,
                 o->data_world);
    o->executor = &ex;
    train_result res = {0};
    rc = cli_run_training(cmd, o, &res);
    if (!rc && share->summary_file) write_summary(share->summary_file, &res);
    pipeline_log_routing(p);
    const pipeline_counters *pc = pipeline_get_counters(p);
    /* One line for people and scripts: every microbatch completed, and what it took. */
    log_info("pipeline counters: {\"microbatches\":%llu,\"retried\":%llu,\"redone\":%llu,"
             "\"peers_lost\":%llu,\"peers_joined\":%llu}",
             (unsigned long long)pc->microbatches, (unsigned long long)pc->retried,
             (unsigned long long)pc->redone, (unsigned long long)pc->peers_lost,
             (unsigned long long)pc->peers_joined);
out:
    if (cc) coord_client_leave(cc, 1000, NULL);
    coord_client_close(cc);
    pipeline_close(p);
    pipeline_executor_close(pe); /* after the pipeline: its lost-peer hook points in here */
    return rc;
}
