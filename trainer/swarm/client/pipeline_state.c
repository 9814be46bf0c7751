/* pipeline_state: the model's state between steps, gathered from one live peer of every
 * stage (checkpoints; the region's parameters for an outer step) and installed on every
 * peer of every stage (the global parameters an outer step produced). See pipeline.h. */
#include <stdlib.h>
#include <string.h>

#include "pipeline_internal.h"

/* ---- the model's state, for checkpoints ---- */

/* Fetching stage s's state from its peer k into whole-model buffers: each float of the
 * stage's state (its optimizer spans' parameters, then m, then v) lands at its place in
 * params, m or v. */
typedef struct state_gather {
    pipeline *p;
    int s, k;
    gpt_span spans[2];
    int n_spans;
    uint64_t n;         /* floats in the stage's spans */
    float *dst[3];      /* params, m, v: gpt_num_params() floats each */
} state_gather;

static int gather_call(void *ctx, const wire_writer *req, wire_reader *reply, cirrus_error *err)
{
    state_gather *g = ctx;
    return pipe_call_peer(g->p, g->s, g->k, STAGE_STATE_GET, req, reply, err);
}

static void gather_floats(void *ctx, uint64_t off, const uint8_t *floats, uint64_t count)
{
    state_gather *g = ctx;
    while (count > 0) {
        const int which = (int)(off / g->n); /* 0 params, 1 m, 2 v */
        uint64_t in = off % g->n;            /* position in the stage's spans */
        int i = 0;
        while (in >= g->spans[i].count) in -= g->spans[i++].count;
        const uint64_t left = g->spans[i].count - in, take = left < count ? left : count;
        memcpy(g->dst[which] + g->spans[i].offset + in, floats, sizeof(float) * take);
        floats += sizeof(float) * take;
        off += take;
        count -= take;
    }
}

int pipeline_gather_state(pipeline *p, float *params, float *adam_m, float *adam_v,
                          uint64_t *steps, cirrus_error *err)
{
    if (p->n_mb) return cirrus_fail(err, CIRRUS_EINVAL, "the state is gathered between steps");
    const size_t total = gpt_num_params(&p->cfg);
    float *buf = malloc(sizeof(float) * total * 3);
    if (!buf) return cirrus_fail(err, CIRRUS_ENOMEM, "out of memory");
    int rc = 0;
    uint64_t last_steps = 0; /* the last stage's: every stage must have taken as many */
    /* Last stage first: its wte copy is then overwritten by the first stage's. */
    for (int s = p->n - 1; s >= 0 && !rc; s--) {
        state_gather g = {.p = p, .s = s, .k = pipe_any_live_peer(p, s),
                          .dst = {buf, buf + total, buf + 2 * total}};
        g.n_spans = gpt_stage_state_spans(&p->cfg, p->link[s].l0, p->link[s].l1, g.spans);
        for (int i = 0; i < g.n_spans; i++) g.n += g.spans[i].count;
        uint64_t st = 0;
        for (;;) { /* a peer that fails at the transport is dropped; the next one is asked */
            if (g.k < 0) {
                rc = cirrus_fail(err, CIRRUS_ECLOSED, "stage %d has no live peer", s);
                break;
            }
            rc = stage_fetch_state(gather_call, gather_floats, &g, g.n, &st, err);
            if (!pipe_is_peer_fault(rc)) break;
            cirrus_error why = *err;
            if ((rc = pipe_peer_failed(p, s, g.k, &why, err))) break;
            g.k = pipe_any_live_peer(p, s);
        }
        if (!rc && s == p->n - 1) last_steps = st;
        if (!rc && st != last_steps)
            rc = cirrus_fail(err, CIRRUS_EMISMATCH, "stage %d has taken %llu steps, stage %d "
                             "%llu", s, (unsigned long long)st, p->n - 1,
                             (unsigned long long)last_steps);
    }
    if (!rc) {
        memcpy(params, buf, sizeof(float) * total);
        memcpy(adam_m, buf + total, sizeof(float) * total);
        memcpy(adam_v, buf + 2 * total, sizeof(float) * total);
        *steps = last_steps;
    }
    free(buf);
    return rc;
}

/* ---- the parameters alone, for the outer step across regions ---- */

/* Parameters [off, off + count) of stage s's spans, in span order: where they lie in the
 * whole model's buffer, piece by piece. */
typedef void (*span_piece_fn)(void *ctx, uint64_t model_offset, uint64_t stage_offset,
                              uint64_t count);

static void for_span_pieces(const gpt_span *spans, int n_spans, uint64_t off, uint64_t count,
                            span_piece_fn fn, void *ctx)
{
    uint64_t at = 0;
    for (int i = 0; i < n_spans && count > 0; i++) {
        const uint64_t len = spans[i].count;
        if (off < at + len) {
            const uint64_t from = off - at, take = len - from < count ? len - from : count;
            fn(ctx, spans[i].offset + from, off, take);
            off += take;
            count -= take;
        }
        at += len;
    }
}

typedef struct params_copy {
    float *model;         /* the whole model's parameters */
    const uint8_t *wire;  /* the slice's floats, as they travel */
    uint64_t wire_first;  /* the stage offset of wire's first float */
    int to_model;         /* 1: wire -> model (gather); 0: model -> writer (install) */
    wire_writer *w;
} params_copy;

static void copy_piece(void *ctx, uint64_t model_offset, uint64_t stage_offset, uint64_t count)
{
    params_copy *c = ctx;
    if (c->to_model)
        memcpy(c->model + model_offset, c->wire + (stage_offset - c->wire_first) * sizeof(float),
               count * sizeof(float));
    else
        stage_msg_put_state_floats(c->w, c->model + model_offset, count);
}

/* Stage s's spans and their total. */
static uint64_t stage_spans(const pipeline *p, int s, gpt_span spans[2], int *n_spans)
{
    *n_spans = gpt_stage_state_spans(&p->cfg, p->link[s].l0, p->link[s].l1, spans);
    uint64_t n = 0;
    for (int i = 0; i < *n_spans; i++) n += spans[i].count;
    return n;
}

/* Stage s's parameters from one live peer, slice by slice, into params; a peer that fails
 * at the transport is dropped and the next one asked. */
static int gather_stage_params(pipeline *p, int s, float *params, cirrus_error *err)
{
    gpt_span spans[2];
    int n_spans;
    const uint64_t n = stage_spans(p, s, spans, &n_spans);
    for (;;) {
        const int k = pipe_any_live_peer(p, s);
        if (k < 0) return cirrus_fail(err, CIRRUS_ECLOSED, "stage %d has no live peer", s);
        int rc = 0;
        for (uint64_t off = 0; off < n && !rc;) {
            const stage_state_get q = {off, n - off < STAGE_STATE_SLICE ? n - off
                                                                        : STAGE_STATE_SLICE};
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
                rc = cirrus_fail(err, CIRRUS_EMISMATCH, "stage %d is at step %llu, the client "
                                 "at %llu", s, (unsigned long long)sl.steps,
                                 (unsigned long long)p->steps_done);
            if (rc) break;
            params_copy c = {.model = params, .wire = sl.floats, .wire_first = off, .to_model = 1};
            for_span_pieces(spans, n_spans, off, q.count, copy_piece, &c);
            off += q.count;
        }
        if (!pipe_is_peer_fault(rc)) return rc;
        cirrus_error why = *err;
        if ((rc = pipe_peer_failed(p, s, k, &why, err))) return rc;
    }
}

int pipeline_gather_params(pipeline *p, float *params, cirrus_error *err)
{
    if (p->n_mb) return cirrus_fail(err, CIRRUS_EINVAL, "parameters are gathered between steps");
    /* Last stage first: its copy of the tied wte is then overwritten by the first stage's
     * (they are equal: both take the same folded gradient). */
    for (int s = p->n - 1; s >= 0; s--) {
        int rc = gather_stage_params(p, s, params, err);
        if (rc) return rc;
    }
    return 0;
}

int pipeline_set_params(pipeline *p, const float *params, cirrus_error *err)
{
    if (p->n_mb) return cirrus_fail(err, CIRRUS_EINVAL, "parameters are installed between steps");
    for (int s = 0; s < p->n; s++) {
        gpt_span spans[2];
        int n_spans, done = 0;
        const uint64_t n = stage_spans(p, s, spans, &n_spans);
        for (int k = 0; k < p->link[s].n; k++) {
            int rc = 0;
            for (uint64_t off = 0; off < n && !rc && p->link[s].peer[k].c;) {
                const stage_params_set q = {
                    .steps = p->steps_done, .n = n, .offset = off,
                    .count = n - off < STAGE_STATE_SLICE ? n - off : STAGE_STATE_SLICE};
                wire_writer w;
                wire_reader r;
                wire_writer_init(&w, 64 + q.count * sizeof(float));
                stage_msg_put_params_set(&w, &q, NULL);
                params_copy c = {.model = (float *)params, .to_model = 0, .w = &w};
                for_span_pieces(spans, n_spans, off, q.count, copy_piece, &c);
                rc = pipe_call_peer(p, s, k, STAGE_PARAMS_SET, &w, &r, err);
                wire_writer_free(&w);
                if (!rc && stage_msg_get_empty(&r))
                    rc = cirrus_fail(err, CIRRUS_ECORRUPT, "stage %d: a malformed PARAMS_SET "
                                     "reply", s);
                off += q.count;
            }
            if (!rc && p->link[s].peer[k].c) done++;
            if (pipe_is_peer_fault(rc)) {
                /* A peer that did not take the parameters must not serve on with its own. */
                cirrus_error why = *err;
                if ((rc = pipe_peer_failed(p, s, k, &why, err))) return rc;
            } else if (rc) {
                return rc;
            }
        }
        if (!done) return cirrus_fail(err, CIRRUS_ECLOSED, "stage %d has no live peer", s);
    }
    return 0;
}
