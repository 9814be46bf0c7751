/* executor: see executor.h. */
#include "executor.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "../../../common/clock.h"
#include "../../../common/failpoint.h"
#include "../../../common/log.h"
#include "outer_client.h"
#include "step_share.h"

struct pipeline_executor {
    pipeline *p;
    int micro; /* sequences per microbatch; a step's batch is split into B / micro of them */
    coord_client *coord; /* NULL: no coordinator to report to */
    double t_last;
    /* Several clients may share each step: this one runs a contiguous run of its
     * microbatches and meets the others at the coordinator's step barrier (step_share.c).
     * Client 0, the leader, runs the optimizer step. */
    int index, n_clients;
    step_share share;          /* with n_clients > 1 */
    uint64_t exit_mid_step;    /* tests: die half-way through this step's share (0: never) */
    outer_client *outer;       /* outer steps across regions (the leader's); NULL: none */
    int region_rank, regions;  /* a follower's region among the job's, from the gateway */
    const char *region;        /* shown on progress lines; NULL: not */
    int outer_begun;
    int replace_wait_s;        /* for a replacement of a stage's last peer */
    int joined_job;            /* the region just jumped to the job's step (pipe_recover) */
    uint64_t step_min_ms;      /* tests (failpoint step-min-ms): a step takes at least this */
    const volatile sig_atomic_t *stop;
};

/* Tell the coordinator how training goes (for /status); never fatal. */
static void report_step(pipeline_executor *e, uint64_t step, float loss, int tokens)
{
    if (!e->coord) return;
    double t = clock_now_s();
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
    pipeline_executor *e = ctx;
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

/* The outer steps told the region that the job is past it (the region restarted or was cut
 * off while the others trained on): it joins the job's step (e->joined_job), and the step in
 * hand does not count (joined_job_failure: JOINED_JOB, which pipe_recover turns into
 * "training goes on from first_step()"). */
#define JOINED_JOB CIRRUS_ECONFLICT
static int join_job_if_behind(pipeline_executor *e, cirrus_error *err)
{
    if (outer_client_job_step(e->outer) <= pipeline_steps_done(e->p)) return 0;
    int rc = outer_client_join_job(e->outer, err);
    if (!rc) e->joined_job = 1;
    return rc;
}

static int joined_job_failure(const pipeline_executor *e, cirrus_error *err)
{
    return cirrus_fail(err, JOINED_JOB, "the region joined the job at inner step %llu",
                       (unsigned long long)pipeline_steps_done(e->p));
}

/* The outer steps' part of a step, once the optimizer step is taken (and, with several
 * clients, before the followers are let go: step_share_lead): push, merge or install the
 * global parameters, and join the job if it is past the region. */
typedef struct after_step {
    pipeline_executor *e;
    uint64_t step, tokens;
} after_step;

static int outer_after_step(void *ctx, cirrus_error *err)
{
    const after_step *a = ctx;
    int rc = outer_client_after_step(a->e->outer, a->step, a->tokens, err);
    return rc ? rc : join_job_if_behind(a->e, err);
}

static int pipe_step(void *ctx, uint64_t id, int B, int T, const int32_t *x, const int32_t *y,
                     float lr, uint64_t step, float *loss, cirrus_error *err)
{
    pipeline_executor *e = ctx;
    const double began_s = clock_now_s();
    const int M = B / e->micro;
    float losses[PIPE_MAX_MICRO];
    if (M > PIPE_MAX_MICRO)
        return cirrus_fail(err, CIRRUS_EINVAL, "%d microbatches per step: at most %d", M,
                           PIPE_MAX_MICRO);
    if (M < e->n_clients)
        return cirrus_fail(err, CIRRUS_EINVAL, "%d microbatches per step cannot be shared by "
                           "%d clients", M, e->n_clients);
    admit_new_peers(e, step);
    if (e->outer && !e->outer_begun) { /* the region starts from the global parameters */
        /* With followers, which may run this step's share on the peers already, the install
         * and a join wait for the step's end, while they are held (outer_after_step). */
        const int held = e->n_clients > 1;
        uint64_t late_ms; /* tests: the followers' share reaches the peers first */
        if (failpoint_on("outer-begin-delay-ms", &late_ms)) usleep((useconds_t)late_ms * 1000);
        int rc = outer_client_begin(e->outer, held, err);
        if (rc) return rc;
        e->outer_begun = 1;
        if (!held && (rc = join_job_if_behind(e, err))) return rc;
        if (e->joined_job) return joined_job_failure(e, err);
    }
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
    after_step outer = {e, step, (uint64_t)B * (uint64_t)T};
    if (e->n_clients == 1) {
        rc = pipeline_step(e->p, lr, 1.0f / (float)M, step, err);
        *loss = (float)(loss_sum / M);
        if (!rc && e->outer) rc = outer_after_step(&outer, err);
    } else if (e->index == 0) {
        double total = 0.0;
        e->share.loss_sum = loss_sum;
        rc = step_share_lead(&e->share, M, lr, 1.0f / (float)M,
                             e->outer ? outer_after_step : NULL, &outer, &total, err);
        *loss = (float)(total / M);
    } else {
        e->share.loss_sum = loss_sum;
        rc = step_share_follow(&e->share, err);
        *loss = (float)(e->share.loss_sum / mine); /* this client's share (as last redone) */
        /* The leader's region joined the job at a later step (step_share_follow). */
        if (!rc && pipeline_steps_done(e->p) > step) e->joined_job = 1;
    }
    if (!rc) report_step(e, step, *loss, mine * e->micro * T);
    if (!rc && e->joined_job) rc = joined_job_failure(e, err);
    if (e->step_min_ms) { /* tests: outer windows (H steps' time) alike on any machine */
        const double left_s = began_s + (double)e->step_min_ms / 1000.0 - clock_now_s();
        if (left_s > 0) usleep((useconds_t)(left_s * 1e6));
    }
    return rc;
}

static int pipe_eval(void *ctx, int B, int T, const int32_t *x, const int32_t *y, float *loss,
                     cirrus_error *err)
{
    pipeline_executor *e = ctx;
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
    pipeline_executor *e = ctx;
    return pipeline_gather_state(e->p, params, adam_m, adam_v, steps, err);
}

/* A resume: the checkpoint's state on every peer. Only the leader resumes (it alone has
 * --ckpt); a follower would have to install it between the leader's steps. */
static int pipe_install(void *ctx, const float *params, const float *adam_m,
                        const float *adam_v, uint64_t steps, cirrus_error *err)
{
    pipeline_executor *e = ctx;
    if (e->index != 0)
        return cirrus_fail(err, CIRRUS_EINVAL, "only client 0 resumes from a checkpoint");
    return pipeline_set_state(e->p, params, adam_m, adam_v, steps, err);
}

/* A step failed. If a stage lost every peer (and with them its state), wait for the
 * coordinator to list replacements, admit them, and have the model's state restored. */
static int pipe_recover(void *ctx, const cirrus_error *failure, int *need_state,
                        cirrus_error *err)
{
    pipeline_executor *e = ctx;
    const int lost = pipeline_empty_stage(e->p);
    *need_state = 0;
    if (e->joined_job) { /* not a failure: the model is at the job's step */
        e->joined_job = 0;
        return 0;
    }
    if (lost < 0 && !pipeline_restoring(e->p)) {
        *err = *failure; /* not a lost stage: the failure stands */
        return failure->code ? failure->code : CIRRUS_EIO;
    }
    if (e->n_clients > 1)
        return cirrus_fail(err, CIRRUS_ECLOSED, "%s; with %d clients sharing the step a lost "
                           "stage is not restored in place (restarted, the clients resume from "
                           "the checkpoint)", failure->msg, e->n_clients);
    if (!e->coord)
        return cirrus_fail(err, CIRRUS_ECLOSED, "%s; no coordinator (--coordinator) lists a "
                           "replacement", failure->msg);
    if (lost >= 0)
        log_warn("%s: stage %d has no peer left, and its state went with them; waiting up to "
                 "%d s for a replacement", failure->msg, lost, e->replace_wait_s);
    else
        log_warn("%s: the model's state is still to be restored", failure->msg);
    int rc = pipeline_abandon_step(e->p, err);
    const double deadline = clock_now_s() + e->replace_wait_s;
    int empty;
    while (!rc && (empty = pipeline_empty_stage(e->p)) >= 0) {
        if (clock_now_s() > deadline)
            return cirrus_fail(err, CIRRUS_ETIMEDOUT, "stage %d has had no peer for %d s "
                               "(--wait-peers-s): its state cannot be restored", empty,
                               e->replace_wait_s);
        if (e->stop && *e->stop)
            return cirrus_fail(err, CIRRUS_ECLOSED, "asked to stop while stage %d has no peer",
                               empty);
        usleep(250 * 1000);
        admit_new_peers(e, pipeline_steps_done(e->p) + 1);
    }
    if (rc) return rc;
    rc = pipeline_resume_intact(e->p, err);
    if (rc != CIRRUS_ENOENT) return rc; /* 0: the step runs again */
    if (e->outer) return outer_client_restore(e->outer, err);
    *need_state = 1; /* a checkpoint's, or the seed's (train.c) */
    return 0;
}

static uint64_t pipe_first_step(void *ctx)
{
    return pipeline_steps_done(((pipeline_executor *)ctx)->p);
}

/* Progress lines of a pipeline client: each stage's live peers and measured samples/s. */
static void pipe_describe(void *ctx, int json, char *buf, size_t size)
{
    pipeline_executor *e = ctx;
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
    if (json && used < size) used += (size_t)snprintf(buf + used, size - used, "]");
    if (e->region && used < size)
        used += (size_t)snprintf(buf + used, size - used,
                                 json ? ",\"region\":\"%s\"" : " | region %s", e->region);
    if (e->outer && used < size) {
        uint64_t outer_step, wan_bytes, digest;
        outer_client_progress(e->outer, &outer_step, &wan_bytes, &digest);
        snprintf(buf + used, size - used,
                 json ? ",\"outer_step\":%llu,\"wan_bytes\":%llu,\"digest\":\"%016llx\""
                      : " | outer %llu, WAN %llu B, digest %016llx",
                 (unsigned long long)outer_step, (unsigned long long)wan_bytes,
                 (unsigned long long)digest);
    }
}

int pipeline_executor_open(pipeline *p, const pipeline_executor_options *o,
                           pipeline_executor **out, train_executor *ex, cirrus_error *err)
{
    /* On the heap: the step share's lost-peer lists make it large. */
    pipeline_executor *e = calloc(1, sizeof *e);
    if (!e) return cirrus_fail(err, CIRRUS_ENOMEM, "out of memory for the pipeline executor");
    *e = (pipeline_executor){.p = p, .micro = o->micro, .coord = o->coord, .index = o->index,
                             .n_clients = o->n_clients, .exit_mid_step = o->exit_mid_step,
                             .region = o->region, .stop = o->stop,
                             .replace_wait_s = o->replace_wait_s > 0 ? o->replace_wait_s : 600};
    if (!failpoint_on("step-min-ms", &e->step_min_ms)) e->step_min_ms = 0;
    const int timeout_ms = o->sync_timeout_ms > 0 ? o->sync_timeout_ms : 600000;
    if (o->n_clients > 1) {
        const step_share_options so = {
            .coord = o->coord, .index = o->index, .n_clients = o->n_clients,
            .admit = admit_new_peers, .admit_ctx = e, .stop = o->stop,
            .outer_wait_s = o->sync_every > 0 ? timeout_ms / 1000.0 : 0};
        step_share_init(&e->share, p, &so);
    }
    if (o->sync_every > 0) {
        /* The leader takes the outer steps, between its optimizer step and letting the
         * followers go (step_share_lead); a follower only reads its region's shard of the
         * data from the gateway. */
        int rc = o->index > 0
                     ? outer_client_region(o->coord, timeout_ms, o->stop, &e->region_rank,
                                           &e->regions, err)
                     : outer_client_open(p, o->coord, pipeline_config(p), o->sync_every,
                                         o->sync_delay, o->sync_params, o->final_step,
                                         timeout_ms, o->stop, &e->outer, err);
        if (rc) {
            free(e);
            return rc;
        }
    }
    /* Only the leader evaluates: the clients share one model, and a follower's validation
     * passes would only load the peers. */
    *ex = (train_executor){e, pipe_step, o->index == 0 ? pipe_eval : NULL, pipe_gather,
                           pipe_describe, pipe_first_step, pipe_install, pipe_recover};
    *out = e;
    return 0;
}

int pipeline_executor_data_shard(pipeline_executor *e, int *rank, int *world,
                                 cirrus_error *err)
{
    *rank = 0, *world = 1;
    if (e->regions > 0) *rank = e->region_rank, *world = e->regions; /* a follower */
    return e->outer ? outer_client_data_shard(e->outer, rank, world, err) : 0;
}

void pipeline_executor_close(pipeline_executor *e)
{
    if (e) outer_client_close(e->outer);
    free(e);
}
