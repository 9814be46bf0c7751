/* pipeline_step: the optimizer step across the stages. Each stage's peers sum their
 * gradients (AVERAGE: a ring among themselves, which the client names and checks: every
 * microbatch of the step held exactly once), the tied embedding's two gradient shares are
 * folded (HEAD_GRAD, FOLD_TIED, SET_TIED), the global gradient norm is formed from
 * per-tensor sums in buffer order (SUMSQ), and every peer takes the same AdamW STEP: the
 * result is bit-identical to training in one process. See pipeline.h. */
#include <stdlib.h>
#include <string.h>

#include "pipeline_internal.h"

/* Sum each stage's gradients over its live peers, checking that together they hold every
 * microbatch of the step exactly once. Repeated, with the same round, until it completes
 * without a member failing. */
static int average_stages(pipeline *p, const pipeline_step_sync *sync, cirrus_error *err)
{
    const int expected = sync ? sync->total_mb : p->n_mb;
    int restarts = 0;
    for (int s = 0; s < p->n; s++) {
        uint64_t round = ++p->round;
        int missing = 0; /* microbatches the last complete attempt lacked */
        for (int attempt = 0;; attempt++) {
            if (attempt > PIPE_MAX_PEERS + 2)
                return cirrus_fail(err, CIRRUS_EIO, "stage %d: averaging keeps failing", s);
            /* The other clients redo what lost peers held for them, and peers they admitted
             * that this client has not are admitted, before the stage's peers sum. */
            if (sync && sync->settle) {
                int rc = sync->settle(sync->ctx, s, missing, err);
                if (rc == PIPELINE_STEP_RESTARTED) { /* every stage sums from scratch */
                    if (++restarts > 3)
                        return cirrus_fail(err, CIRRUS_EIO, "the step keeps being restarted");
                    memset(p->averaged, 0, sizeof p->averaged);
                    s = -1;
                    break;
                }
                if (rc) return rc;
            }
            /* The members' ring gives up after `limit` without progress; this client
             * waits that long again for their answers (a refusal from each survivor, none
             * from a member that hangs). */
            const double limit = deadline_get(p->avg_deadline[s]);
            const double t0 = clock_now_s(), wait_until = t0 + 2.0 * limit;
            stage_average *avg = &p->avg;
            avg->round = round;
            avg->n = 0;
            avg->ring_ms = (uint32_t)(limit * 1000.0) + 1;
            for (int k = 0; k < p->link[s].n; k++)
                if (pipe_peer_alive(p, s, k))
                    memcpy(avg->addrs[avg->n++], p->link[s].peer[k].ring, STAGE_ADDR_MAX);
            wire_writer w;
            wire_writer_init(&w, 64 * 1024);
            stage_msg_put_average(&w, avg);
            uint64_t id = ++p->next_id;
            int sent[PIPE_MAX_PEERS] = {0}, failed = 0;
            uint32_t held = 0;
            cirrus_error why[PIPE_MAX_PEERS];
            for (int k = 0; k < p->link[s].n; k++)
                if (pipe_peer_alive(p, s, k))
                    sent[k] = pipe_send(p, s, k, STAGE_AVERAGE, id, &w, &why[k]) == 0 ? 1 : -1;
            wire_writer_free(&w);
            int faulty[PIPE_MAX_PEERS] = {0};
            for (int k = 0; k < p->link[s].n; k++) {
                if (sent[k] == 0) continue;
                wire_reader r;
                const double left = wait_until - clock_now_s();
                int rc = sent[k] == 1 ? pipe_await(p, s, k, STAGE_AVERAGE, id, &r,
                                                   (int)((left > 0.01 ? left : 0.01) * 1000.0),
                                                   &why[k])
                                      : CIRRUS_ECLOSED;
                if (rc == CIRRUS_ETIMEDOUT)
                    deadline_observe_timeout(p->avg_deadline[s], clock_now_s() - t0);
                if (!rc) {
                    uint32_t mb = 0;
                    if (!stage_msg_get_average_ok(&r, &mb)) {
                        held += mb;
                        continue;
                    }
                    rc = cirrus_fail(&why[k], CIRRUS_ECORRUPT, "bad AVERAGE reply");
                }
                /* A member that failed, or a refusal because another member vanished
                 * mid-ring: the round is repeated. Only transport faults remove a peer. */
                failed = 1;
                faulty[k] = pipe_is_peer_fault(rc);
            }
            for (int k = 0; k < p->link[s].n; k++) {
                int rc = faulty[k] ? pipe_peer_failed(p, s, k, &why[k], err) : 0;
                if (rc) return rc;
            }
            if (failed) {
                p->counters.retried++;
                missing = 0;
                continue;
            }
            deadline_observe(p->avg_deadline[s], clock_now_s() - t0);
            if (sync && held != (uint32_t)expected && attempt < PIPE_MAX_PEERS + 2) {
                missing = expected - (int)held; /* < 0: more than the step has */
                continue;
            }
            if (held != (uint32_t)expected)
                return cirrus_fail(err, CIRRUS_EIO,
                                   "stage %d: peers hold %u microbatches, the step has %d", s,
                                   held, expected);
            p->averaged[s] = 1;
            break;
        }
    }
    return 0;
}

/* Move the head's share of d(wte) from the last stage to the first, fold it there and give
 * the folded gradient back to the last stage, whose wte copy takes the same update. */
static int exchange_tied(pipeline *p, cirrus_error *err)
{
    const size_t n = (size_t)p->cfg.vocab * p->cfg.n_embd;
    const int first = 0, last = p->n - 1;
    wire_writer w;
    wire_reader r;
    int served, answered;
    wire_writer_init(&w, 0);
    const float *g = NULL;
    int rc = pipe_on_stage(p, last, -1, STAGE_HEAD_GRAD, 0, 0, &w, &r, &served, err);
    if (!rc && stage_msg_get_tied(&r, n, &g))
        rc = cirrus_fail(err, CIRRUS_ECORRUPT, "bad HEAD_GRAD reply");
    if (rc) return rc;
    memcpy(p->tied, g, sizeof(float) * n);
    wire_writer_init(&w, PIPE_REPLY_LIMIT);
    stage_msg_put_tied(&w, p->tied, n);
    rc = pipe_on_all_peers(p, first, STAGE_FOLD_TIED, &w, &r, &answered, err);
    wire_writer_free(&w);
    if (!rc && (!answered || stage_msg_get_tied(&r, n, &g)))
        rc = cirrus_fail(err, CIRRUS_ECORRUPT, "bad FOLD_TIED reply");
    if (rc || first == last) return rc;
    memcpy(p->tied, g, sizeof(float) * n);
    wire_writer_init(&w, PIPE_REPLY_LIMIT);
    stage_msg_put_tied(&w, p->tied, n);
    rc = pipe_on_all_peers(p, last, STAGE_SET_TIED, &w, &r, &answered, err);
    wire_writer_free(&w);
    return rc;
}

static int part_cmp(const void *a, const void *b)
{
    uint64_t x = ((const stage_sumsq_part *)a)->offset, y = ((const stage_sumsq_part *)b)->offset;
    return x < y ? -1 : x > y;
}

/* The global sum of squares: every stage's per-tensor sums, each tensor once (wte is held
 * by the first and last stages), added in buffer order like adamw_total_sumsq(). */
static int global_sumsq(pipeline *p, double *total, cirrus_error *err)
{
    size_t n = 0;
    stage_sumsq_part *parts = NULL;
    int rc = 0;
    for (int s = 0; !rc && s < p->n; s++) {
        wire_writer w;
        wire_reader r;
        int served;
        stage_sumsq_part *got = NULL;
        uint32_t k = 0;
        wire_writer_init(&w, 0);
        if ((rc = pipe_on_stage(p, s, -1, STAGE_SUMSQ, 0, 0, &w, &r, &served, err))) break;
        if ((rc = stage_msg_get_sumsq(&r, &got, &k))) {
            rc = rc == CIRRUS_ENOMEM ? cirrus_fail(err, rc, "out of memory")
                                     : cirrus_fail(err, rc, "stage %d: bad SUMSQ reply", s);
            break;
        }
        stage_sumsq_part *grown = k ? realloc(parts, sizeof *parts * (n + k)) : parts;
        if (k && !grown)
            rc = cirrus_fail(err, CIRRUS_ENOMEM, "out of memory");
        else if (k) {
            parts = grown;
            memcpy(parts + n, got, sizeof *parts * k);
            n += k;
        }
        free(got);
    }
    if (!rc) {
        if (n) qsort(parts, n, sizeof *parts, part_cmp);
        *total = 0.0;
        for (size_t i = 0; i < n; i++)
            if (i == 0 || parts[i].offset != parts[i - 1].offset) *total += parts[i].sumsq;
    }
    free(parts);
    return rc;
}

int pipeline_step(pipeline *p, float lr, float grad_scale, uint64_t step, cirrus_error *err)
{
    return pipeline_step_shared(p, lr, grad_scale, step, NULL, err);
}

void pipeline_step_skip(pipeline *p, uint64_t step)
{
    p->n_mb = p->next_start = p->mb_active = 0;
    p->steps_done = step;
}

int pipeline_step_shared(pipeline *p, float lr, float grad_scale, uint64_t step,
                         const pipeline_step_sync *sync, cirrus_error *err)
{
    double total = 0.0;
    int rc = average_stages(p, sync, err);
    if (!rc) rc = exchange_tied(p, err);
    if (!rc) rc = global_sumsq(p, &total, err);
    for (int s = 0; !rc && s < p->n; s++) {
        wire_writer w;
        wire_reader r;
        int answered;
        const stage_step st = {.lr = lr, .grad_scale = grad_scale, .step = step,
                               .sumsq = total};
        wire_writer_init(&w, 64);
        stage_msg_put_step(&w, &st);
        rc = pipe_on_all_peers(p, s, STAGE_STEP, &w, &r, &answered, err);
        wire_writer_free(&w);
        if (!rc && !answered) rc = cirrus_fail(err, CIRRUS_ECLOSED, "stage %d: no peer stepped", s);
    }
    p->n_mb = p->next_start = p->mb_active = 0;
    memset(p->averaged, 0, sizeof p->averaged);
    if (!rc) p->steps_done = step;
    return rc;
}
