/* barrier: the step barrier of a job's pipeline clients (STEP_SYNC) — ARRIVE, APPLIED and
 * REDO notices, an ARRIVE's answer held until what it waits for is there. See
 * coord_internal.h and proto/coord_msg.h. */
#include <string.h>
#include <unistd.h>

#include "../../../common/failpoint.h"
#include "../../../common/clock.h"
#include "../../../common/log.h"
#include "coord_internal.h"

/* ---- the step barrier (callers hold co->mu) ---- */

/* Notice ids only grow, across restarts of the coordinator too: a client that acted on
 * notice k before a restart skips every id <= k, so a notice re-posted to a restarted
 * coordinator must get a larger id. Every call carries the newest id its client has seen
 * (the leader's: the newest it posted), and the next id is kept above all of them. */
static void notice_ids_after(step_barrier *b, uint64_t seen)
{
    if (seen >= b->next_notice) b->next_notice = seen + 1;
}

static int step_arrive(coordinator *co, const coord_step_sync *q, outcome *oc)
{
    step_barrier *b = &co->barrier;
    /* A different count is another job's (or a misconfigured) client: refuse it rather
     * than let it reshape the barrier under the others. */
    if (b->n_clients && q->n_clients != b->n_clients)
        return cirrus_fail(&oc->err, CIRRUS_EINVAL, "n_clients %u differs from the job's %u",
                           q->n_clients, b->n_clients);
    b->n_clients = q->n_clients;
    notice_ids_after(b, q->redo_seen);
    b->slots[q->client_index] = (step_slot){.step = q->step, .microbatches = q->microbatches,
                                            .loss_sum = q->loss_sum,
                                            .redo_seen = q->redo_seen};
    /* The leader arrives at t only once t - 1 was applied: this survives a lost APPLIED. */
    if (q->client_index == 0 && q->step - 1 > b->applied_step) b->applied_step = q->step - 1;
    return 0;
}

static void step_applied(coordinator *co, uint64_t step)
{
    if (step > co->barrier.applied_step) co->barrier.applied_step = step;
}

static void step_redo(coordinator *co, const coord_step_sync *q)
{
    step_barrier *b = &co->barrier;
    notice_ids_after(b, q->redo_seen);
    step_notice *nt = &b->notices[(b->next_notice - 1) % COORD_NOTICE_KEEP];
    *nt = (step_notice){.id = b->next_notice++, .step = q->step, .stage = q->stage};
    b->posted++;
    memcpy(nt->addr, q->addr, sizeof nt->addr);
    log_info("step %llu: REDO notice %llu for stage %u peer %s",
             (unsigned long long)q->step, (unsigned long long)nt->id, q->stage, q->addr);
}

/* The oldest notice id still in the ring. */
static uint64_t oldest_notice(const step_barrier *b)
{
    return b->next_notice > COORD_NOTICE_KEEP ? b->next_notice - COORD_NOTICE_KEEP : 1;
}

static const step_notice *notice_at(const step_barrier *b, uint64_t id)
{
    return &b->notices[(id - 1) % COORD_NOTICE_KEEP];
}

/* Step t's notices: the newest id, and the ones after redo_seen, oldest first (the first
 * COORD_MAX_NOTICES: a client that acts on them and asks again gets the rest). */
static void step_notices(const step_barrier *b, uint64_t t, uint64_t redo_seen,
                         coord_step_state *st)
{
    for (uint64_t id = oldest_notice(b); id < b->next_notice; id++) {
        const step_notice *nt = notice_at(b, id);
        if (nt->id != id || nt->step != t) continue; /* ids skipped by notice_ids_after */
        st->latest_notice = id;
        if (id <= redo_seen || st->n_notices == COORD_MAX_NOTICES) continue;
        coord_step_notice *out = &st->notices[st->n_notices++];
        out->id = id;
        out->stage = nt->stage;
        memcpy(out->addr, nt->addr, sizeof out->addr);
    }
}

/* The clients counted at step t: arrived there after acting on its latest notice. Sums in
 * client order so every reader of the same state gets the same loss bit for bit. */
static void step_count(const step_barrier *b, uint64_t t, coord_step_state *st)
{
    uint64_t mb = 0;
    for (uint32_t i = 0; i < COORD_MAX_CLIENTS; i++) {
        const step_slot *s = &b->slots[i];
        if (s->step != t || s->redo_seen < st->latest_notice) continue;
        st->arrived++;
        mb += s->microbatches;
        st->loss_sum += s->loss_sum;
    }
    st->microbatches = mb > UINT32_MAX ? UINT32_MAX : (uint32_t)mb;
}

static void step_state(const step_barrier *b, uint64_t t, uint64_t redo_seen,
                       coord_step_state *st)
{
    memset(st, 0, sizeof *st);
    st->applied_step = b->applied_step;
    step_notices(b, t, redo_seen, st);
    step_count(b, t, st);
}

/* What an ARRIVE with wait_ms waits for: the leader (client 0), every client counted at t;
 * a follower, t applied or a notice it has not acted on. */
static int step_awaited(const coord_step_sync *q, const coord_step_state *st)
{
    if (q->client_index == 0) return st->arrived >= q->n_clients;
    return st->applied_step >= q->step || st->n_notices > 0;
}

/* Hold an ARRIVE's answer (co->mu held) until what it waits for is there, its wait_ms is
 * up or the coordinator stops; *st is the state then. The clients wait at the barrier this
 * way instead of polling it: an answer goes out as soon as the change it waits for is
 * made (every barrier change broadcasts barrier_changed), and no request is made in
 * between. Waits in slices of COORD_POLL_MS to see the stop flag. */
static void step_hold(coordinator *co, const coord_step_sync *q, coord_step_state *st)
{
    const int64_t end_ns = clock_now_ns() + (int64_t)q->wait_ms * 1000000;
    while (!step_awaited(q, st) && !atomic_load(&co->stopping)) {
        const int64_t now_ns = clock_now_ns();
        if (now_ns >= end_ns) break;
        int64_t until = now_ns + (int64_t)COORD_POLL_MS * 1000000;
        if (until > end_ns) until = end_ns;
        struct timespec ts = {.tv_sec = until / 1000000000, .tv_nsec = until % 1000000000};
        pthread_cond_timedwait(&co->barrier_changed, &co->mu, &ts);
        step_state(&co->barrier, q->step, q->redo_seen, st);
    }
}

int coord_barrier_step_sync(coordinator *co, const uint8_t *p, uint32_t n, wire_writer *reply,
                        outcome *oc)
{
    coord_step_sync q;
    if (coord_get_step_sync(p, n, &q, &oc->err)) return coord_malformed(oc);
    if (q.op == COORD_STEP_REDO && q.stage >= co->o.n_stages && q.stage != COORD_ALL_STAGES)
        return cirrus_fail(&oc->err, CIRRUS_EINVAL, "STEP_SYNC REDO stage %u is outside 0..%u",
                           q.stage, co->o.n_stages - 1);
    int rc = 0;
    pthread_mutex_lock(&co->mu);
    /* A test's gateway lost just after posting a notice: the leader knows the notice, the
     * coordinator that comes back does not. */
    if (co->barrier.posted && failpoint_on("exit-after-redo", NULL)) {
        log_warn("exiting with a REDO notice posted (failpoint exit-after-redo)");
        _exit(137);
    }
    if (q.op == COORD_STEP_ARRIVE) rc = step_arrive(co, &q, oc);
    else if (q.op == COORD_STEP_APPLIED) step_applied(co, q.step);
    else step_redo(co, &q);
    if (!rc) {
        pthread_cond_broadcast(&co->barrier_changed);
        coord_step_state st;
        step_state(&co->barrier, q.step, q.redo_seen, &st);
        if (q.wait_ms) step_hold(co, &q, &st);
        coord_put_step_state(reply, &st);
    }
    pthread_mutex_unlock(&co->mu);
    return rc;
}
