/* outer_client: see outer_client.h. */
#include "outer_client.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../../../common/log.h"
#include "../../gateway/outer_msg.h"
#include "../../gateway/sync_params.h"
#include "../../net/conn.h"
#include "../proto/rpc.h"

#define OUTER_CALL_MS 30000 /* one PUSH or PULL exchange */
#define OUTER_POLL_MS 20    /* between PULLs while the round runs */
/* pull's code for a round given up because the run ends (not an error of the run). */
#define OUTER_ABANDONED CIRRUS_ECLOSED
/* pull's code, asked not to wait, for a round not done yet. */
#define OUTER_NOT_YET CIRRUS_ENOENT

struct outer_client {
    pipeline *p;
    coord_client *cc;
    uint64_t n;    /* the model's parameters */
    sync_params sp; /* those the outer steps synchronise (--sync-params): m of them */
    uint64_t m;
    int every, timeout_ms;
    int delay;     /* inner steps the region trains on while a round runs */
    /* The region's whole parameters when pushed and now (n); the synchronised ones when
     * pushed, the global ones pulled, and scratch (m). */
    float *pushed, *now, *pushed_sync, *global, *scratch;
    int pending;   /* a round was pushed and is not applied yet */
    uint64_t final_step; /* the run's last inner step */
    uint64_t pending_round, pushed_at;
    uint64_t pushed_step; /* the inner step of the parameters last pushed */
    const volatile sig_atomic_t *stop;
    uint64_t tokens, outer_step, wan_bytes, digest;
};


int outer_client_open(pipeline *p, coord_client *cc, const gpt_config *cfg, int every,
                      int delay, const char *sync_spec, uint64_t final_step, int timeout_ms,
                      const volatile sig_atomic_t *stop, outer_client **out, cirrus_error *err)
{
    *out = NULL;
    if (!cc) return cirrus_fail(err, CIRRUS_EINVAL, "outer steps need the region's gateway "
                                "(--coordinator)");
    if (delay < 0 || delay >= every)
        return cirrus_fail(err, CIRRUS_EINVAL, "--sync-delay %d must be below --sync-every %d",
                           delay, every);
    outer_client *oc = calloc(1, sizeof *oc);
    if (!oc) return cirrus_fail(err, CIRRUS_ENOMEM, "out of memory");
    *oc = (outer_client){.p = p, .cc = cc, .n = gpt_num_params(cfg), .every = every,
                         .delay = delay, .final_step = final_step, .timeout_ms = timeout_ms,
                         .stop = stop};
    int rc = sync_params_parse(sync_spec, cfg, &oc->sp, err);
    if (rc) {
        free(oc);
        return rc;
    }
    oc->m = oc->sp.count;
    oc->pushed = malloc(oc->n * sizeof(float));
    oc->now = malloc(oc->n * sizeof(float));
    oc->pushed_sync = malloc(oc->m * sizeof(float));
    oc->global = malloc(oc->m * sizeof(float));
    oc->scratch = malloc(oc->m * sizeof(float));
    if (!oc->pushed || !oc->now || !oc->pushed_sync || !oc->global || !oc->scratch) {
        outer_client_close(oc);
        return cirrus_fail(err, CIRRUS_ENOMEM, "out of memory for the parameters");
    }
    *out = oc;
    return 0;
}

void outer_client_close(outer_client *oc)
{
    if (!oc) return;
    sync_params_free(&oc->sp);
    free(oc->pushed);
    free(oc->now);
    free(oc->pushed_sync);
    free(oc->global);
    free(oc->scratch);
    free(oc);
}

/* One extension call, retried while the gateway is unreachable (restarting: a gateway pod
 * replaced) until the outer step's deadline or the run's end. */
static int gateway_call(outer_client *oc, uint16_t type, const wire_writer *w, int64_t deadline,
                        const uint8_t **reply, uint32_t *len, cirrus_error *err)
{
    for (int warned = 0;;) {
        int rc = coord_client_ext_call(oc->cc, type, w, OUTER_CALL_MS, reply, len, err);
        if (!rpc_is_fault(rc) || net_now_ms() > deadline || (oc->stop && *oc->stop)) return rc;
        if (!warned++) log_warn("outer: the gateway: %s; trying again", err->msg);
        usleep(200 * 1000);
    }
}

/* The synchronised parameters as last gathered (pushed_sync), round `round`. */
static int send_push(outer_client *oc, uint64_t round, uint64_t step, int64_t deadline,
                     cirrus_error *err)
{
    int rc = 0;
    for (uint64_t off = 0; !rc && off < oc->m;) {
        const uint64_t count = oc->m - off < OUTER_SLICE ? oc->m - off : OUTER_SLICE;
        const outer_push q = {.round = round, .inner_step = step, .tokens = oc->tokens,
                              .n_params = oc->m, .offset = off, .count = count};
        wire_writer w;
        wire_writer_init(&w, 64 + count * sizeof(float));
        outer_msg_put_push(&w, &q, oc->pushed_sync + off);
        const uint8_t *reply;
        uint32_t len;
        rc = gateway_call(oc, OUTER_PUSH, &w, deadline, &reply, &len, err);
        wire_writer_free(&w);
        off += count;
    }
    return rc;
}

static int push(outer_client *oc, uint64_t round, uint64_t step, cirrus_error *err)
{
    int rc = pipeline_gather_params(oc->p, oc->pushed, err);
    if (rc) return rc;
    sync_params_pack(&oc->sp, oc->pushed, oc->pushed_sync);
    oc->pushed_step = step;
    return send_push(oc, round, step, net_now_ms() + oc->timeout_ms, err);
}

/* PULL round's global parameters into theta once the gateway has them; without wait,
 * OUTER_NOT_YET at once when it has not. */
static int pull(outer_client *oc, uint64_t round, int wait, cirrus_error *err)
{
    const int64_t deadline = net_now_ms() + oc->timeout_ms;
    for (uint64_t off = 0; off < oc->m;) {
        const uint64_t count = oc->m - off < OUTER_SLICE ? oc->m - off : OUTER_SLICE;
        const outer_pull q = {round, off, count};
        wire_writer w;
        wire_writer_init(&w, 64);
        outer_msg_put_pull(&w, &q);
        const uint8_t *reply;
        uint32_t len;
        int rc = gateway_call(oc, OUTER_PULL, &w, deadline, &reply, &len, err);
        wire_writer_free(&w);
        if (rc) return rc;
        wire_reader r;
        wire_reader_init(&r, reply, len);
        outer_pull_ok a;
        if (outer_msg_get_pull_ok(&r, count, &a))
            return cirrus_fail(err, CIRRUS_ECORRUPT, "malformed PULL reply from the gateway");
        oc->wan_bytes = a.wan_bytes;
        if (!a.ready && round > 0 && !a.pushed && a.done + 1 == round) {
            /* The gateway does not hold our push (it restarted and took the job's state
             * from another region): push the same parameters again. */
            log_warn("outer: the gateway lost this region's push of outer step %llu: sending "
                     "it again", (unsigned long long)round);
            if ((rc = send_push(oc, round, oc->pushed_step, deadline, err))) return rc;
            off = 0;
            continue;
        }
        if (!a.ready) {
            if (!wait && off == 0) return OUTER_NOT_YET;
            if (oc->stop && *oc->stop)
                return cirrus_fail(err, OUTER_ABANDONED, "outer step %llu abandoned: the run "
                                   "is ending", (unsigned long long)round);
            if (net_now_ms() > deadline)
                return cirrus_fail(err, CIRRUS_ETIMEDOUT, "outer step %llu not done by the "
                                   "gateway within %d ms", (unsigned long long)round,
                                   oc->timeout_ms);
            usleep(OUTER_POLL_MS * 1000);
            off = 0; /* a round completing mid-pull: every slice from one state */
            continue;
        }
        if (off > 0 && a.done != oc->outer_step)
            return cirrus_fail(err, CIRRUS_EMISMATCH, "the gateway moved from outer step %llu "
                               "to %llu during a pull", (unsigned long long)oc->outer_step,
                               (unsigned long long)a.done);
        oc->outer_step = a.done;
        oc->digest = a.digest;
        memcpy(oc->global + off, a.floats, count * sizeof(float));
        off += count;
    }
    return 0;
}

int outer_client_data_shard(outer_client *oc, int *rank, int *world, cirrus_error *err)
{
    const outer_pull q = {0, 0, 0}; /* no floats: only the reply's head */
    wire_writer w;
    wire_writer_init(&w, 64);
    outer_msg_put_pull(&w, &q);
    const uint8_t *reply;
    uint32_t len;
    int rc = gateway_call(oc, OUTER_PULL, &w, net_now_ms() + oc->timeout_ms, &reply, &len, err);
    wire_writer_free(&w);
    if (rc) return rc;
    wire_reader r;
    wire_reader_init(&r, reply, len);
    outer_pull_ok a;
    if (outer_msg_get_pull_ok(&r, 0, &a))
        return cirrus_fail(err, CIRRUS_ECORRUPT, "malformed PULL reply from the gateway");
    *rank = a.region;
    *world = a.regions;
    return 0;
}

/* The gateway's latest global parameters, installed as the region's. A gateway with none
 * (restarted, alone) adopts the region's own first (round 0). */
static int take_latest(outer_client *oc, cirrus_error *err)
{
    int rc = push(oc, 0, pipeline_steps_done(oc->p), err);
    if (!rc) rc = pull(oc, 0, 1, err);
    if (!rc) rc = pipeline_gather_params(oc->p, oc->now, err);
    if (!rc) {
        sync_params_unpack(&oc->sp, oc->global, oc->now); /* the rest stays regional */
        rc = pipeline_set_params(oc->p, oc->now, err);
    }
    oc->pending = 0;
    return rc;
}

int outer_client_begin(outer_client *oc, cirrus_error *err)
{
    const uint64_t step = pipeline_steps_done(oc->p);
    int rc = take_latest(oc, err);
    if (!rc)
        log_info("outer: region at inner step %llu takes the global parameters of outer step "
                 "%llu (digest %016llx)", (unsigned long long)step,
                 (unsigned long long)oc->outer_step, (unsigned long long)oc->digest);
    /* Inner steps already taken belong to rounds before this one: count from here. */
    return rc;
}

/* The round pushed at step `pushed_at` is applied: its global parameters replace the
 * region's. Where the region trained on meanwhile (overlap), the progress it made since
 * the push is kept on top: theta = global + (theta_now - theta_at_push), the delayed merge
 * of one-step-delayed outer updates. Without wait, a round not done yet is left pending
 * (OUTER_NOT_YET). */
static int apply_round(outer_client *oc, int wait, cirrus_error *err)
{
    int rc = pull(oc, oc->pending_round, wait, err);
    if (rc == OUTER_NOT_YET && !wait) return rc;
    if (rc == OUTER_ABANDONED && oc->stop && *oc->stop) {
        log_warn("%s", err->msg); /* the region ends with its own parameters */
        oc->pending = 0;
        return 0;
    }
    if (rc) return rc;
    if (pipeline_steps_done(oc->p) != oc->pushed_at) {
        log_info("outer: outer step %llu merged at inner step %llu (pushed at %llu)",
                 (unsigned long long)oc->pending_round,
                 (unsigned long long)pipeline_steps_done(oc->p), (unsigned long long)oc->pushed_at);
        if ((rc = pipeline_gather_params(oc->p, oc->now, err))) return rc;
        sync_params_pack(&oc->sp, oc->now, oc->scratch);
        for (uint64_t i = 0; i < oc->m; i++)
            oc->scratch[i] = oc->global[i] + (oc->scratch[i] - oc->pushed_sync[i]);
        sync_params_unpack(&oc->sp, oc->scratch, oc->now);
    } else {
        memcpy(oc->now, oc->pushed, oc->n * sizeof(float));
        sync_params_unpack(&oc->sp, oc->global, oc->now); /* the rest stays regional */
    }
    rc = pipeline_set_params(oc->p, oc->now, err);
    oc->pending = 0;
    return rc;
}

int outer_client_after_step(outer_client *oc, uint64_t step, uint64_t tokens,
                            cirrus_error *err)
{
    oc->tokens += tokens;
    int rc = 0;
    /* Overlap: from `delay` steps after the push on, the result is merged as soon as it is
     * in; the region waits for it only when the next outer step is due (its push must
     * start from the merged parameters) or the run ends. So a sync that takes longer than
     * `delay` steps, or a region that pushed later than this one, costs no waiting as long
     * as the round is done within the window. */
    if (oc->pending && step >= oc->pushed_at + (uint64_t)oc->delay) {
        const int due = step % (uint64_t)oc->every == 0 || step >= oc->final_step;
        rc = apply_round(oc, due, err);
        if (rc == OUTER_NOT_YET && !due) rc = 0;
        if (rc) return rc;
    }
    /* The last step is an outer step too (every region ends at the same step): the run
     * ends with the global model whatever its length. */
    if (step % (uint64_t)oc->every == 0 || step == oc->final_step) {
        /* Outer step k is pushed at inner step k x every in every region (the last step's
         * is the one after), so the regions stay in step however one of them rejoined. */
        const uint64_t want = (step + (uint64_t)oc->every - 1) / (uint64_t)oc->every;
        const int64_t deadline = net_now_ms() + oc->timeout_ms;
        oc->pending_round = want;
        oc->pushed_at = step;
        oc->pending = 1;
        for (;;) {
            rc = push(oc, want, step, err);
            if (rc == CIRRUS_ECONFLICT) {
                /* The gateway took a later global state from another region (this region
                 * was cut off, or its gateway restarted or repaired): the region takes it
                 * too, and joins this round if the job is not past it yet. */
                log_warn("outer: %s; the region takes the global parameters", err->msg);
                oc->tokens = 0;
                if ((rc = take_latest(oc, err))) return rc;
                if (oc->outer_step >= want) return 0; /* the job is past it */
                oc->pending = 1;
                continue;
            }
            if (rc != CIRRUS_ENOENT || net_now_ms() > deadline || (oc->stop && *oc->stop))
                break;
            usleep(200 * 1000); /* the gateway is behind the job and catching up */
        }
        if (rc) return rc;
        oc->tokens = 0;
    }
    /* The last step waits for its round: the model the run ends with is the global one. */
    if (oc->pending && (oc->delay == 0 || step >= oc->final_step)) rc = apply_round(oc, 1, err);
    return rc;
}

int outer_client_restore(outer_client *oc, cirrus_error *err)
{
    const uint64_t round = oc->pending ? oc->pending_round : 0; /* 0: the latest */
    int rc = pull(oc, round, 1, err);
    float *m = NULL, *v = NULL;
    if (!rc && (!(m = malloc(oc->n * sizeof(float))) || !(v = malloc(oc->n * sizeof(float)))))
        rc = cirrus_fail(err, CIRRUS_ENOMEM, "out of memory for the optimizer's state");
    if (!rc) rc = pipeline_gather_state_as_is(oc->p, oc->now, m, v, err);
    if (!rc) {
        sync_params_unpack(&oc->sp, oc->global, oc->now);
        rc = pipeline_set_state(oc->p, oc->now, m, v, pipeline_steps_done(oc->p), err);
    }
    free(m);
    free(v);
    oc->pending = 0;
    if (!rc)
        log_info("outer: the region is restored at inner step %llu from the global parameters "
                 "of outer step %llu (digest %016llx)",
                 (unsigned long long)pipeline_steps_done(oc->p),
                 (unsigned long long)oc->outer_step, (unsigned long long)oc->digest);
    return rc;
}

uint64_t outer_client_job_step(const outer_client *oc)
{
    const uint64_t at = oc->outer_step * (uint64_t)oc->every;
    return at < oc->final_step ? at : oc->final_step;
}

int outer_client_join_job(outer_client *oc, cirrus_error *err)
{
    const uint64_t from = pipeline_steps_done(oc->p), to = outer_client_job_step(oc);
    uint64_t steps;
    float *m = malloc(oc->n * sizeof(float)), *v = malloc(oc->n * sizeof(float));
    /* `pushed` is free between rounds (nothing is pending after the round that told us). */
    int rc = m && v ? pipeline_gather_state(oc->p, oc->pushed, m, v, &steps, err)
                    : cirrus_fail(err, CIRRUS_ENOMEM, "out of memory for the optimizer's state");
    if (!rc) rc = pipeline_set_state(oc->p, oc->pushed, m, v, to, err);
    free(m);
    free(v);
    oc->pending = 0;
    if (!rc)
        log_info("outer: the job is at outer step %llu: the region joins it at inner step %llu "
                 "(it was at %llu)", (unsigned long long)oc->outer_step, (unsigned long long)to,
                 (unsigned long long)from);
    return rc;
}

void outer_client_progress(const outer_client *oc, uint64_t *outer_step, uint64_t *wan_bytes,
                           uint64_t *digest)
{
    *outer_step = oc->outer_step;
    *wan_bytes = oc->wan_bytes;
    *digest = oc->digest;
}
