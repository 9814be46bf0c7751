#include "step_share.h"

#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../../../common/clock.h"
#include "../../../common/log.h"

#define BARRIER_TIMEOUT_S 300.0

/* The leader hears of every peer it loses (pipeline_on_peer_lost). */
static void note_lost_peer(void *ctx, int stage, const char *addr, int unsummed)
{
    step_share *sh = ctx;
    if (!unsummed || sh->o.index != 0 || sh->n_lost >= (int)(sizeof sh->lost / sizeof sh->lost[0]))
        return;
    for (int i = 0; i < sh->n_lost; i++)
        if (sh->lost[i].stage == stage && strcmp(sh->lost[i].addr, addr) == 0) return;
    sh->lost[sh->n_lost].stage = stage;
    snprintf(sh->lost[sh->n_lost].addr, sizeof sh->lost[0].addr, "%s", addr);
    sh->n_lost++;
}

/* How long an ARRIVE asks the coordinator to hold its answer until what this client waits
 * for is there (the barrier's clients wait this way rather than polling); well inside the
 * call's own 5 s limit. */
#define BARRIER_HOLD_MS 1000

static int barrier_call(step_share *sh, uint8_t op, uint32_t stage, const char *addr,
                        cirrus_error *err)
{
    coord_step_sync req = {.op = op, .step = sh->step, .client_index = (uint32_t)sh->o.index,
                           .n_clients = (uint32_t)sh->o.n_clients,
                           .microbatches = (uint32_t)sh->mine, .loss_sum = sh->loss_sum,
                           .redo_seen = sh->redo_seen, .stage = stage,
                           .wait_ms = op == COORD_STEP_ARRIVE ? BARRIER_HOLD_MS : 0};
    snprintf(req.addr, sizeof req.addr, "%s", addr ? addr : "");
    return coord_client_step_sync(sh->o.coord, &req, 5000, &sh->barrier, err);
}

static int asked_to_stop(const step_share *sh) { return sh->o.stop && *sh->o.stop; }

/* A barrier call that fails for want of the coordinator (it restarts, the network blips)
 * is tried again until `deadline` (seconds, clock_now_s()); its barrier state is rebuilt by the
 * clients' next calls. Only a refusal (CIRRUS_EINVAL: this client does not fit the job)
 * or being asked to stop ends the wait at once. */
static int barrier_call_until(step_share *sh, uint8_t op, uint32_t stage, const char *addr,
                              double deadline, cirrus_error *err)
{
    for (int warned = 0;; warned = 1) {
        int rc = barrier_call(sh, op, stage, addr, err);
        if (!rc || rc == CIRRUS_EINVAL || clock_now_s() > deadline || asked_to_stop(sh))
            return rc;
        if (!warned) log_warn("step barrier: %s; trying again", err->msg);
        usleep(100000); /* the coordinator is away: ask every 0.1 s */
    }
}

/* The leader posts a notice for the other clients (REDO): a lost peer's backwards, or the
 * whole step again. The call carries the newest id the leader posted, so a restarted
 * coordinator numbers a re-posted notice past every id a follower has acted on. */
static int post_notice(step_share *sh, uint32_t stage, const char *addr, int again,
                       double deadline, cirrus_error *err)
{
    int rc = barrier_call_until(sh, COORD_STEP_REDO, stage, addr, deadline, err);
    if (rc) return rc;
    sh->redo_seen = sh->barrier.latest_notice;
    if (again) return 0;
    if (stage == COORD_ALL_STAGES) sh->n_posted = 0; /* a restart redoes everything */
    if (sh->n_posted < (int)(sizeof sh->posted / sizeof sh->posted[0])) {
        sh->posted[sh->n_posted].stage = (int)stage;
        snprintf(sh->posted[sh->n_posted].addr, sizeof sh->posted[0].addr, "%s", addr);
        sh->n_posted++;
    }
    return 0;
}

/* The barrier's answer shows no notice as new as the leader's last: the coordinator
 * restarted and forgot this step's notices, and followers that had not acted on them would
 * be counted as if they had. Post them again (a follower that already acted on one does it
 * again harmlessly: a lost peer is lost once; a restart is detected and done again). */
static int repost_forgotten(step_share *sh, double deadline, cirrus_error *err)
{
    if (!sh->n_posted || sh->barrier.latest_notice >= sh->redo_seen) return 0;
    log_warn("step %llu: the coordinator forgot %d notice(s) (it restarted?): posting them "
             "again", (unsigned long long)sh->step, sh->n_posted);
    for (int i = 0; i < sh->n_posted; i++) {
        int rc = post_notice(sh, (uint32_t)sh->posted[i].stage, sh->posted[i].addr, 1,
                             deadline, err);
        if (rc) return rc;
    }
    return 0;
}

/* The leader: announce the peers lost with their stage unsummed, then wait until every
 * client has arrived having acted on them. */
static int leader_gather(step_share *sh, cirrus_error *err)
{
    const double deadline = clock_now_s() + BARRIER_TIMEOUT_S;
    for (int i = 0; i < sh->n_lost; i++) {
        int rc = post_notice(sh, (uint32_t)sh->lost[i].stage, sh->lost[i].addr, 0, deadline,
                             err);
        if (rc) return rc;
        log_info("step %llu: peer %s of stage %d lost; the other clients redo its backwards",
                 (unsigned long long)sh->step, sh->lost[i].addr, sh->lost[i].stage);
    }
    sh->n_lost = 0;
    for (;;) { /* each ARRIVE is held until every client is counted, or for 1 s */
        int rc = barrier_call_until(sh, COORD_STEP_ARRIVE, 0, NULL, deadline, err);
        if (!rc) rc = repost_forgotten(sh, deadline, err);
        if (rc) return rc;
        if (sh->barrier.arrived == (uint32_t)sh->o.n_clients) return 0;
        if (asked_to_stop(sh))
            return cirrus_fail(err, CIRRUS_ECLOSED, "asked to stop while step %llu waited for "
                               "%d of %d clients", (unsigned long long)sh->step,
                               sh->o.n_clients - (int)sh->barrier.arrived, sh->o.n_clients);
        if (clock_now_s() > deadline)
            return cirrus_fail(err, CIRRUS_ETIMEDOUT, "step %llu: %u of %d clients finished "
                               "their share within %.0f s", (unsigned long long)sh->step,
                               sh->barrier.arrived, sh->o.n_clients, BARRIER_TIMEOUT_S);
    }
}

/* This client's share of the step, run again from scratch (the step restarts). */
static int redo_share(step_share *sh, cirrus_error *err)
{
    float losses[PIPE_MAX_MICRO];
    int rc = pipeline_redo_step(sh->p, losses, err);
    sh->loss_sum = 0.0;
    for (int m = 0; !rc && m < sh->mine; m++) sh->loss_sum += losses[m];
    return rc;
}

/* The peers hold more of the step than it has: a client died half-way through its share
 * and its replacement ran the share again. Which gradients are whose cannot be told apart,
 * so the step starts again: every peer drops its gradients, every client runs its whole
 * share once more, and every stage sums from scratch. */
static int leader_restart_step(step_share *sh, int stage, int excess, cirrus_error *err)
{
    log_warn("step %llu: stage %d's peers hold %d microbatch(es) more than the step has (a "
             "client died half-way?): the step starts again", (unsigned long long)sh->step,
             stage, excess);
    int rc = pipeline_take_over(sh->p, err);
    if (!rc) rc = post_notice(sh, COORD_ALL_STAGES, "restart", 0, clock_now_s() + BARRIER_TIMEOUT_S,
                              err);
    if (rc) return rc;
    sh->n_lost = 0; /* the restart redoes everything */
    if ((rc = redo_share(sh, err)) || (rc = leader_gather(sh, err))) return rc;
    return PIPELINE_STEP_RESTARTED;
}

/* pipeline_step_sync.settle: before a stage sums, every client's share must be whole. */
static int leader_settle(void *ctx, int stage, int missing, cirrus_error *err)
{
    step_share *sh = ctx;
    if (missing < 0) return leader_restart_step(sh, stage, -missing, err);
    if (missing > 0) /* a follower admitted a peer this client has not: admit it too */
        sh->o.admit(sh->o.admit_ctx, sh->step);
    return sh->n_lost || missing ? leader_gather(sh, err) : 0;
}

/* A follower: wait until the leader has applied the step, redoing what it asks. */
static int follower_wait(step_share *sh, cirrus_error *err)
{
    const double wait_s = BARRIER_TIMEOUT_S + sh->o.outer_wait_s;
    const double deadline = clock_now_s() + wait_s;
    for (;;) { /* each ARRIVE is held until the step is applied or there is news, or 1 s */
        int rc = barrier_call_until(sh, COORD_STEP_ARRIVE, 0, NULL, deadline, err);
        if (rc) return rc;
        if (sh->barrier.applied_step >= sh->step) return 0;
        for (uint32_t i = 0; i < sh->barrier.n_notices; i++) {
            const coord_step_notice *n = &sh->barrier.notices[i];
            if (n->id <= sh->redo_seen) continue;
            if (n->stage == COORD_ALL_STAGES) /* the step restarts: the whole share again */
                rc = redo_share(sh, err);
            else
                rc = pipeline_peer_reported_lost(sh->p, (int)n->stage, n->addr, err);
            if (rc) return rc;
            sh->redo_seen = n->id;
        }
        if (asked_to_stop(sh))
            return cirrus_fail(err, CIRRUS_ECLOSED, "asked to stop while waiting for client 0 "
                               "to apply step %llu", (unsigned long long)sh->step);
        if (clock_now_s() > deadline)
            return cirrus_fail(err, CIRRUS_ETIMEDOUT, "step %llu was not applied within %.0f s",
                               (unsigned long long)sh->step, wait_s);
    }
}

void step_share_init(step_share *sh, pipeline *p, const step_share_options *o)
{
    memset(sh, 0, sizeof *sh);
    sh->p = p;
    sh->o = *o;
    pipeline_on_peer_lost(p, note_lost_peer, sh);
    pipeline_set_follower(p, o->index > 0);
}

void step_share_begin(step_share *sh, uint64_t step, int mine)
{
    sh->step = step;
    sh->mine = mine;
    sh->loss_sum = 0.0;
    sh->n_lost = 0;
    sh->n_posted = 0;
}

int step_share_lead(step_share *sh, int microbatches, float lr, float grad_scale,
                    step_share_applied_fn before_applied, void *ctx, double *total_loss,
                    cirrus_error *err)
{
    pipeline_step_sync sync = {microbatches, leader_settle, sh};
    int rc = leader_gather(sh, err);
    if (!rc) rc = pipeline_step_shared(sh->p, lr, grad_scale, sh->step, &sync, err);
    *total_loss = sh->barrier.loss_sum; /* every client's share, from the gather */
    if (!rc && before_applied) rc = before_applied(ctx, err);
    /* The region joined the job at a later step: the followers go there too. */
    if (!rc && pipeline_steps_done(sh->p) > sh->step) sh->step = pipeline_steps_done(sh->p);
    /* Best effort: if the coordinator is away, the leader's next ARRIVE says it too. */
    cirrus_error why;
    if (!rc && barrier_call_until(sh, COORD_STEP_APPLIED, 0, NULL, clock_now_s() + 30.0, &why))
        log_warn("step %llu: could not say it was applied: %s", (unsigned long long)sh->step,
                 why.msg);
    return rc;
}

int step_share_follow(step_share *sh, cirrus_error *err)
{
    int rc = follower_wait(sh, err);
    if (rc) return rc;
    /* Only outer steps move a region on (a join); without them a later applied step is
     * not this run's (the coordinator outlived a restart from a checkpoint). */
    const uint64_t at = sh->o.outer_wait_s > 0 && sh->barrier.applied_step > sh->step
                            ? sh->barrier.applied_step : sh->step;
    if (at > sh->step)
        log_info("step %llu: the leader's region joined the job at step %llu: going there too",
                 (unsigned long long)sh->step, (unsigned long long)at);
    pipeline_step_skip(sh->p, at);
    return 0;
}
