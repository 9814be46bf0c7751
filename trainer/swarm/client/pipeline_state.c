/* pipeline_state: the model's state between steps, gathered from one live peer of every
 * stage (checkpoints; the region's parameters for an outer step) and installed on every
 * peer of every stage (the global parameters an outer step produced; a checkpoint's whole
 * state when a client resumes). See pipeline.h. */
#include <stdlib.h>
#include <string.h>

#include "pipeline_internal.h"

/* Stage s's spans (their total in *n), and its runs (stage_msg.h) in the whole-model
 * buffers: the spans' parameters, then, with m and v, the spans' parts of those. */
static int stage_runs(const pipeline *p, int s, float *params, float *m, float *v,
                      stage_run runs[STAGE_MAX_RUNS], uint64_t *n)
{
    gpt_span spans[2];
    const int n_spans = gpt_stage_state_spans(&p->cfg, p->link[s].l0, p->link[s].l1, spans);
    float *base[3] = {params, m, v};
    int n_runs = 0;
    *n = 0;
    for (int i = 0; i < n_spans; i++) *n += spans[i].count;
    for (int b = 0; b < 3 && base[b]; b++)
        for (int i = 0; i < n_spans; i++)
            runs[n_runs++] = (stage_run){base[b] + spans[i].offset, spans[i].count};
    return n_runs;
}

/* ---- the model's state, for checkpoints ---- */

/* Fetching stage s's state from its peer k into whole-model buffers: each float of the
 * stage's state lands at its place in params, m or v. */
typedef struct state_gather {
    pipeline *p;
    int s, k;
    stage_run runs[STAGE_MAX_RUNS];
    int n_runs;
} state_gather;

static int gather_call(void *ctx, const wire_writer *req, wire_reader *reply, cirrus_error *err)
{
    state_gather *g = ctx;
    return pipe_call_peer(g->p, g->s, g->k, STAGE_STATE_GET, req, reply, err);
}

static void gather_floats(void *ctx, uint64_t off, const uint8_t *floats, uint64_t count)
{
    state_gather *g = ctx;
    stage_msg_take_runs(g->runs, g->n_runs, off, floats, count);
}

/* same_step: every stage must have taken as many steps (into *steps); else they may differ
 * (steps may be NULL). */
static int gather_state(pipeline *p, float *params, float *adam_m, float *adam_v,
                        uint64_t *steps, int same_step, cirrus_error *err)
{
    if (p->n_mb) return cirrus_fail(err, CIRRUS_EINVAL, "the state is gathered between steps");
    const size_t total = gpt_num_params(&p->cfg);
    float *buf = malloc(sizeof(float) * total * 3);
    if (!buf) return cirrus_fail(err, CIRRUS_ENOMEM, "out of memory");
    int rc = 0;
    uint64_t last_steps = 0; /* the last stage's: every stage must have taken as many */
    /* Last stage first: its wte copy is then overwritten by the first stage's. */
    for (int s = p->n - 1; s >= 0 && !rc; s--) {
        state_gather g = {.p = p, .s = s, .k = pipe_any_live_peer(p, s)};
        uint64_t n, st = 0;
        g.n_runs = stage_runs(p, s, buf, buf + total, buf + 2 * total, g.runs, &n);
        for (;;) { /* a peer that fails at the transport is dropped; the next one is asked */
            if (g.k < 0) {
                rc = cirrus_fail(err, CIRRUS_ECLOSED, "stage %d has no live peer", s);
                break;
            }
            /* Checkpoints carry no moments origins (CKPT format): not asked for. */
            rc = stage_fetch_state(gather_call, gather_floats, &g, n, &st, NULL, err);
            if (!pipe_is_peer_fault(rc)) break;
            cirrus_error why = *err;
            if ((rc = pipe_peer_failed(p, s, g.k, &why, err))) break;
            g.k = pipe_any_live_peer(p, s);
        }
        if (!rc && s == p->n - 1) last_steps = st;
        if (!rc && same_step && st != last_steps)
            rc = cirrus_fail(err, CIRRUS_EMISMATCH, "stage %d has taken %llu steps, stage %d "
                             "%llu", s, (unsigned long long)st, p->n - 1,
                             (unsigned long long)last_steps);
    }
    if (!rc) {
        memcpy(params, buf, sizeof(float) * total);
        memcpy(adam_m, buf + total, sizeof(float) * total);
        memcpy(adam_v, buf + 2 * total, sizeof(float) * total);
        if (steps) *steps = last_steps;
    }
    free(buf);
    return rc;
}

int pipeline_gather_state(pipeline *p, float *params, float *adam_m, float *adam_v,
                          uint64_t *steps, cirrus_error *err)
{
    return gather_state(p, params, adam_m, adam_v, steps, 1, err);
}

int pipeline_gather_state_as_is(pipeline *p, float *params, float *adam_m, float *adam_v,
                                cirrus_error *err)
{
    if (!p->restoring)
        return cirrus_fail(err, CIRRUS_EINVAL, "the state as is is gathered while restoring");
    return gather_state(p, params, adam_m, adam_v, NULL, 0, err);
}

/* ---- the parameters alone, for the outer step across regions ---- */

/* A range [lo, hi) of a stage's parameters, in the stage's own order (its spans one after
 * the other, as STATE_GET and PARAMS_SET count them). */
typedef struct stage_range {
    uint64_t lo, hi;
} stage_range;

/* The ranges of stage s's parameters that fall in the model's spans (NULL: all of them),
 * into *out (freed by the caller); how many, or -1 out of memory. */
static int stage_ranges(const pipeline *p, int s, const gpt_span *spans, size_t n_spans,
                        stage_range **out)
{
    gpt_span mine[2];
    const int n_mine = gpt_stage_state_spans(&p->cfg, p->link[s].l0, p->link[s].l1, mine);
    *out = malloc((spans ? n_spans * 2 : 1) * sizeof **out + 1);
    if (!*out) return -1;
    int n = 0;
    uint64_t local = 0; /* where mine[i] starts in the stage's order */
    if (!spans) {
        for (int i = 0; i < n_mine; i++) local += mine[i].count;
        (*out)[n++] = (stage_range){0, local};
        return n;
    }
    for (int i = 0; i < n_mine; local += mine[i].count, i++)
        for (size_t j = 0; j < n_spans; j++) {
            const size_t a = spans[j].offset > mine[i].offset ? spans[j].offset : mine[i].offset;
            const size_t e1 = spans[j].offset + spans[j].count, e2 = mine[i].offset + mine[i].count;
            const size_t b = e1 < e2 ? e1 : e2;
            if (a < b)
                (*out)[n++] = (stage_range){local + (a - mine[i].offset),
                                            local + (b - mine[i].offset)};
        }
    return n;
}

/* Stage s's parameters in the given ranges from one live peer, slice by slice, into
 * params; a peer that fails at the transport is dropped and the next one asked. */
static int gather_stage_params(pipeline *p, int s, const stage_range *ranges, int n_ranges,
                               float *params, cirrus_error *err)
{
    stage_run runs[STAGE_MAX_RUNS];
    uint64_t n;
    const int n_runs = stage_runs(p, s, params, NULL, NULL, runs, &n);
    for (;;) {
        const int k = pipe_any_live_peer(p, s);
        if (k < 0) return cirrus_fail(err, CIRRUS_ECLOSED, "stage %d has no live peer", s);
        int rc = 0;
        for (int g = 0; g < n_ranges && !rc; g++)
            for (uint64_t off = ranges[g].lo; off < ranges[g].hi && !rc;) {
                const uint64_t left = ranges[g].hi - off;
                const stage_state_get q = {off, left < STAGE_STATE_SLICE ? left : STAGE_STATE_SLICE};
                wire_writer w;
                wire_reader r;
                wire_writer_init(&w, 64);
                stage_msg_put_state_get(&w, &q);
                rc = pipe_call_peer(p, s, k, STAGE_STATE_GET, &w, &r, err);
                wire_writer_free(&w);
                stage_state_slice sl;
                if (!rc && (stage_msg_get_state_slice(&r, q.count, &sl) || sl.n != n))
                    rc = cirrus_fail(err, CIRRUS_ECORRUPT, "stage %d: a malformed state slice", s);
                if (!rc && sl.steps != p->steps_done)
                    rc = cirrus_fail(err, CIRRUS_EMISMATCH, "stage %d is at step %llu, the "
                                     "client at %llu", s, (unsigned long long)sl.steps,
                                     (unsigned long long)p->steps_done);
                if (rc) break;
                stage_msg_take_runs(runs, n_runs, off, sl.floats, q.count);
                off += q.count;
            }
        if (!pipe_is_peer_fault(rc)) return rc;
        cirrus_error why = *err;
        if ((rc = pipe_peer_failed(p, s, k, &why, err))) return rc;
    }
}

int pipeline_gather_params(pipeline *p, float *params, cirrus_error *err)
{
    return pipeline_gather_spans(p, NULL, 0, params, err);
}

int pipeline_gather_spans(pipeline *p, const gpt_span *spans, size_t n_spans, float *params,
                          cirrus_error *err)
{
    if (p->n_mb) return cirrus_fail(err, CIRRUS_EINVAL, "parameters are gathered between steps");
    /* Last stage first: its copy of the tied wte is then overwritten by the first stage's
     * (they are equal: both take the same folded gradient). */
    for (int s = p->n - 1; s >= 0; s--) {
        stage_range *ranges;
        const int n_ranges = stage_ranges(p, s, spans, n_spans, &ranges);
        if (n_ranges < 0) return cirrus_fail(err, CIRRUS_ENOMEM, "out of memory");
        int rc = n_ranges ? gather_stage_params(p, s, ranges, n_ranges, params, err) : 0;
        free(ranges);
        if (rc) return rc;
    }
    return 0;
}

/* Install on every live peer of every stage, slice by slice: the parameters alone
 * (PARAMS_SET, m and v NULL: the peers must be at the client's step) or the whole state
 * (STATE_SET: the peers take `steps` with it). A peer that fails at the transport is
 * dropped: no peer serves on with other parameters than its stage's. */
static int install(pipeline *p, const gpt_span *spans, size_t n_spans, uint16_t type,
                   const float *params, const float *m, const float *v, uint64_t steps,
                   cirrus_error *err)
{
    if (p->n_mb) return cirrus_fail(err, CIRRUS_EINVAL, "parameters are installed between steps");
    for (int s = 0; s < p->n; s++) {
        stage_run runs[STAGE_MAX_RUNS];
        uint64_t n;
        const int n_runs = stage_runs(p, s, (float *)params, (float *)m, (float *)v, runs, &n);
        stage_range *ranges;
        int n_ranges = stage_ranges(p, s, spans, n_spans, &ranges);
        if (n_ranges < 0) return cirrus_fail(err, CIRRUS_ENOMEM, "out of memory");
        if (m) ranges[0].hi = 3 * n; /* the whole state: parameters, then both moments */
        int done = 0, rc = 0;
        for (int k = 0; k < p->link[s].n && n_ranges; k++) {
            rc = 0;
            for (int g = 0; g < n_ranges && !rc; g++)
                for (uint64_t off = ranges[g].lo; off < ranges[g].hi && !rc && p->link[s].peer[k].c;) {
                    const uint64_t left = ranges[g].hi - off;
                    const stage_params_set q = {
                        .steps = steps, .n = n, .offset = off,
                        .count = left < STAGE_STATE_SLICE ? left : STAGE_STATE_SLICE};
                    wire_writer w;
                    wire_reader r;
                    wire_writer_init(&w, 64 + q.count * sizeof(float));
                    stage_msg_put_params_set(&w, &q, NULL);
                    stage_msg_put_runs(&w, runs, n_runs, off, q.count);
                    rc = pipe_call_peer(p, s, k, type, &w, &r, err);
                    wire_writer_free(&w);
                    if (!rc && stage_msg_get_empty(&r))
                        rc = cirrus_fail(err, CIRRUS_ECORRUPT, "stage %d: a malformed reply "
                                         "to %s", s, m ? "STATE_SET" : "PARAMS_SET");
                    off += q.count;
                }
            if (!rc && p->link[s].peer[k].c) done++;
            if (pipe_is_peer_fault(rc)) {
                cirrus_error why = *err;
                rc = pipe_peer_failed(p, s, k, &why, err);
            }
            if (rc) break;
        }
        free(ranges);
        if (rc) return rc;
        if (!done && n_ranges)
            return cirrus_fail(err, CIRRUS_ECLOSED, "stage %d has no live peer", s);
    }
    return 0;
}

int pipeline_set_params(pipeline *p, const float *params, cirrus_error *err)
{
    return pipeline_set_spans(p, NULL, 0, params, err);
}

int pipeline_set_spans(pipeline *p, const gpt_span *spans, size_t n_spans, const float *params,
                       cirrus_error *err)
{
    return install(p, spans, n_spans, STAGE_PARAMS_SET, params, NULL, NULL, p->steps_done, err);
}

int pipeline_set_state(pipeline *p, const float *params, const float *adam_m,
                       const float *adam_v, uint64_t steps, cirrus_error *err)
{
    if (!params || !adam_m || !adam_v || steps == STAGE_STEPS_UNKNOWN)
        return cirrus_fail(err, CIRRUS_EINVAL, "a state to install needs parameters, both "
                           "moments and a step");
    int rc = install(p, NULL, 0, STAGE_STATE_SET, params, adam_m, adam_v, steps, err);
    /* Every live peer took the whole state: they are all at `steps` (a peer that failed
     * was dropped), and a stage that had lost its state has one again. */
    if (!rc) {
        p->steps_done = steps;
        p->restoring = 0;
    }
    return rc;
}
