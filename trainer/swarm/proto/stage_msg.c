/* stage_msg: stage message bodies and activation payloads. See stage_msg.h. */
#include "stage_msg.h"

#include <stdlib.h>
#include <string.h>

#include "../../../common/le.h"
#include "../../codec/q8.h"

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "raw f32 activations are sent in host order, which the wire defines as little-endian"
#endif

/* ---- parts ---- */

/* Token ids go as one byte each (the vocabulary of a byte-level model), converted through a
 * small buffer so a sender needs no scratch space of a microbatch's size. */
static void put_tokens(wire_writer *w, const int32_t *t, size_t n)
{
    uint8_t buf[512];
    for (size_t at = 0; at < n;) {
        size_t take = n - at < sizeof buf ? n - at : sizeof buf;
        for (size_t i = 0; i < take; i++) buf[i] = (uint8_t)t[at + i];
        wire_put_bytes(w, buf, take);
        at += take;
    }
}

static int get_tokens(wire_reader *r, int32_t *out, size_t n)
{
    const uint8_t *b = wire_get_bytes(r, n);
    if (!b) return CIRRUS_ECORRUPT;
    for (size_t i = 0; i < n; i++) out[i] = b[i];
    return 0;
}

void stage_msg_put_acts(wire_writer *w, const float *x, size_t n, int codec)
{
    if (codec != STAGE_CODEC_Q8) {
        wire_put_bytes(w, x, n * sizeof(float));
        return;
    }
    size_t len = codec_q8_encoded_size(n);
    uint8_t *buf = malloc(len ? len : 1);
    if (!buf || codec_q8_encode(buf, x, n) != 0)
        w->failed = 1; /* out of memory or a non-finite activation: refuse to send */
    else
        wire_put_bytes(w, buf, len);
    free(buf);
}

/* n floats encoded with codec, not necessarily the end of the payload. */
static int get_floats(wire_reader *r, float *out, size_t n, int codec)
{
    if (codec == STAGE_CODEC_Q8) {
        size_t len = codec_q8_encoded_size(n);
        const void *p = wire_get_bytes(r, len);
        if (!p || codec_q8_decode(out, n, p, len) != 0) return CIRRUS_ECORRUPT;
        return 0;
    }
    if (codec != STAGE_CODEC_NONE || n > SIZE_MAX / sizeof(float)) return CIRRUS_ECORRUPT;
    const void *p = wire_get_bytes(r, n * sizeof(float));
    if (!p) return CIRRUS_ECORRUPT;
    memcpy(out, p, n * sizeof(float));
    return 0;
}

/* The payload was read without error and to its end. */
static int done(const wire_reader *r)
{
    return wire_reader_done(r) ? CIRRUS_ECORRUPT : 0;
}

int stage_msg_get_acts(wire_reader *r, float *out, size_t n, int codec)
{
    return get_floats(r, out, n, codec) ? CIRRUS_ECORRUPT : done(r);
}

int stage_msg_get_empty(wire_reader *r)
{
    return done(r);
}

/* ---- FORWARD / BACKWARD ---- */

void stage_msg_put_microbatch(wire_writer *w, const stage_microbatch *m, size_t C)
{
    const size_t n = (size_t)m->B * m->T;
    wire_put_u64(w, m->id);
    wire_put_u32(w, m->B);
    wire_put_u32(w, m->T);
    const uint8_t flags[4] = {m->keep, m->codec, m->has_targets, 0};
    wire_put_bytes(w, flags, sizeof flags);
    if (m->tokens)
        put_tokens(w, m->tokens, n);
    else if (m->hidden)
        stage_msg_put_acts(w, m->hidden, n * C, m->codec);
    if (m->has_targets && m->targets) put_tokens(w, m->targets, n);
    if (m->grad_out) stage_msg_put_acts(w, m->grad_out, n * C, m->codec);
}

int stage_msg_get_microbatch(wire_reader *r, uint16_t type, const stage_mb_dest *d,
                             stage_microbatch *m)
{
    memset(m, 0, sizeof *m);
    if (type != STAGE_FORWARD && type != STAGE_BACKWARD) return CIRRUS_ECORRUPT;
    m->id = wire_get_u64(r);
    m->B = wire_get_u32(r);
    m->T = wire_get_u32(r);
    const uint8_t *flags = wire_get_bytes(r, 4); /* keep, codec, has_targets, 0 */
    if (!flags) return CIRRUS_ECORRUPT;
    m->keep = flags[0];
    m->codec = flags[1];
    m->has_targets = flags[2];
    if (flags[3] != 0 || m->B < 1 || m->B > d->max_B || m->T < 1 || m->T > d->max_T ||
        (m->codec != STAGE_CODEC_NONE && m->codec != STAGE_CODEC_Q8) || m->has_targets > 1 ||
        (m->has_targets && !d->last) || (type == STAGE_BACKWARD && d->last && !m->has_targets))
        return CIRRUS_ECORRUPT;
    const size_t n = (size_t)m->B * m->T;
    if (d->first) {
        if (get_tokens(r, d->tokens, n)) return CIRRUS_ECORRUPT;
        m->tokens = d->tokens;
    } else {
        if (get_floats(r, d->hidden, n * d->C, m->codec)) return CIRRUS_ECORRUPT;
        m->hidden = d->hidden;
    }
    if (m->has_targets) {
        if (get_tokens(r, d->targets, n)) return CIRRUS_ECORRUPT;
        m->targets = d->targets;
    }
    if (type == STAGE_BACKWARD && !d->last) {
        if (get_floats(r, d->grad_out, n * d->C, m->codec)) return CIRRUS_ECORRUPT;
        m->grad_out = d->grad_out;
    }
    return done(r);
}

void stage_msg_put_loss(wire_writer *w, float loss)
{
    wire_put_f32(w, loss);
}

int stage_msg_get_loss(wire_reader *r, float *loss)
{
    *loss = wire_get_f32(r);
    return done(r);
}

/* ---- the optimizer step ---- */

void stage_msg_put_tied(wire_writer *w, const float *g, size_t n)
{
    wire_put_bytes(w, g, n * sizeof(float));
}

int stage_msg_get_tied(wire_reader *r, size_t n, const float **g)
{
    *g = NULL;
    if (n > SIZE_MAX / sizeof(float)) return CIRRUS_ECORRUPT;
    const float *p = wire_get_bytes(r, n * sizeof(float));
    if (!p || done(r)) return CIRRUS_ECORRUPT;
    *g = p;
    return 0;
}

#define SUMSQ_PART_SIZE 16 /* u64 offset, f64 sum */

void stage_msg_put_sumsq(wire_writer *w, const stage_sumsq_part *parts, uint32_t n)
{
    wire_put_u32(w, n);
    for (uint32_t i = 0; i < n; i++) {
        wire_put_u64(w, parts[i].offset);
        wire_put_f64(w, parts[i].sumsq);
    }
}

int stage_msg_get_sumsq(wire_reader *r, stage_sumsq_part **parts, uint32_t *n)
{
    *parts = NULL;
    *n = 0;
    uint32_t count = wire_get_u32(r);
    if (r->failed || count != (r->len - r->pos) / SUMSQ_PART_SIZE ||
        (r->len - r->pos) % SUMSQ_PART_SIZE)
        return CIRRUS_ECORRUPT;
    if (count == 0) return done(r);
    stage_sumsq_part *list = malloc(sizeof *list * count);
    if (!list) return CIRRUS_ENOMEM;
    for (uint32_t i = 0; i < count; i++) {
        list[i].offset = wire_get_u64(r);
        list[i].sumsq = wire_get_f64(r);
    }
    if (done(r)) {
        free(list);
        return CIRRUS_ECORRUPT;
    }
    *parts = list;
    *n = count;
    return 0;
}

void stage_msg_put_step(wire_writer *w, const stage_step *s)
{
    wire_put_f32(w, s->lr);
    wire_put_f32(w, s->grad_scale);
    wire_put_u64(w, s->step);
    wire_put_f64(w, s->sumsq);
}

int stage_msg_get_step(wire_reader *r, stage_step *s)
{
    s->lr = wire_get_f32(r);
    s->grad_scale = wire_get_f32(r);
    s->step = wire_get_u64(r);
    s->sumsq = wire_get_f64(r);
    if (done(r) || s->step < 1 || !(s->lr >= 0.0f) || !(s->grad_scale > 0.0f) ||
        !(s->sumsq >= 0.0))
        return CIRRUS_ECORRUPT;
    return 0;
}

/* ---- membership and gradient averaging ---- */

void stage_msg_put_info(wire_writer *w, const stage_info *in)
{
    const uint32_t v[] = {in->l0,     in->l1,     in->n_layer,
                          in->n_embd, in->n_head, in->seq_len};
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) wire_put_u32(w, v[i]);
    wire_put_u64(w, in->n_params);
    wire_put_u64(w, in->steps);
    wire_put_str(w, in->ring);
}

int stage_msg_get_info(wire_reader *r, stage_info *in)
{
    memset(in, 0, sizeof *in);
    in->l0 = wire_get_u32(r);
    in->l1 = wire_get_u32(r);
    in->n_layer = wire_get_u32(r);
    in->n_embd = wire_get_u32(r);
    in->n_head = wire_get_u32(r);
    in->seq_len = wire_get_u32(r);
    in->n_params = wire_get_u64(r);
    in->steps = wire_get_u64(r);
    if (wire_get_str(r, in->ring, sizeof in->ring)) {
        in->ring[0] = '\0';
        return CIRRUS_ECORRUPT;
    }
    return done(r);
}

void stage_msg_put_average(wire_writer *w, const stage_average *a)
{
    wire_put_u64(w, a->round);
    wire_put_u32(w, a->n);
    for (uint32_t i = 0; i < a->n && i < STAGE_AVERAGE_MAX_MEMBERS; i++)
        wire_put_str(w, a->addrs[i]);
    wire_put_u32(w, a->ring_ms);
}

int stage_msg_get_average(wire_reader *r, stage_average *a)
{
    a->round = wire_get_u64(r);
    a->n = wire_get_u32(r);
    a->ring_ms = STAGE_RING_MS_DEFAULT;
    if (r->failed || a->round == 0 || a->n < 1 || a->n > STAGE_AVERAGE_MAX_MEMBERS)
        return CIRRUS_ECORRUPT;
    for (uint32_t i = 0; i < a->n; i++)
        if (wire_get_str(r, a->addrs[i], sizeof a->addrs[i])) return CIRRUS_ECORRUPT;
    /* Optional: a client that does not say gets the old fixed limit. */
    if (r->len - r->pos >= 4) a->ring_ms = wire_get_u32(r);
    if (done(r) || a->ring_ms < 1 || a->ring_ms > STAGE_RING_MS_MAX) return CIRRUS_ECORRUPT;
    return 0;
}

void stage_msg_put_average_ok(wire_writer *w, uint32_t microbatches)
{
    wire_put_u32(w, microbatches);
}

int stage_msg_get_average_ok(wire_reader *r, uint32_t *microbatches)
{
    *microbatches = wire_get_u32(r);
    return done(r);
}

/* ---- state copies ---- */

void stage_msg_put_state_get(wire_writer *w, const stage_state_get *q)
{
    wire_put_u64(w, q->offset);
    wire_put_u64(w, q->count);
}

int stage_msg_get_state_get(wire_reader *r, uint64_t total, stage_state_get *q)
{
    q->offset = 0;
    q->count = total;
    /* Empty: everything at once, which the slice cap bounds like any other request (a
     * larger state would make a reply no frame can carry). */
    if (r->len == 0) return total <= STAGE_STATE_SLICE ? 0 : CIRRUS_ECORRUPT;
    q->offset = wire_get_u64(r);
    q->count = wire_get_u64(r);
    if (done(r) || q->offset > total || q->count > total - q->offset ||
        q->count > STAGE_STATE_SLICE)
        return CIRRUS_ECORRUPT;
    return 0;
}

void stage_msg_put_state_head(wire_writer *w, uint64_t steps, uint64_t n,
                              const stage_origin *origins, uint32_t n_origins)
{
    wire_put_u64(w, steps);
    wire_put_u64(w, n);
    wire_put_u32(w, n_origins);
    for (uint32_t i = 0; i < n_origins; i++) {
        wire_put_u32(w, origins[i].segment);
        wire_put_u64(w, origins[i].from);
    }
}

#define ORIGIN_BYTES 12 /* u32 segment, u64 from */

stage_origin stage_msg_origin_at(const stage_state_slice *s, uint32_t i)
{
    const uint8_t *b = s->origins + (size_t)i * ORIGIN_BYTES;
    return (stage_origin){(uint32_t)le_get(b, 4), le_get(b + 4, 8)};
}

void stage_msg_put_state_floats(wire_writer *w, const float *x, uint64_t count)
{
    wire_put_bytes(w, x, (size_t)count * sizeof(float));
}

int stage_msg_get_state_slice(wire_reader *r, uint64_t count, stage_state_slice *s)
{
    s->steps = wire_get_u64(r);
    s->n = wire_get_u64(r);
    s->n_origins = wire_get_u32(r);
    s->origins = s->floats = NULL;
    if (r->failed || count > STAGE_STATE_SLICE || s->n_origins > STAGE_MAX_ORIGINS)
        return CIRRUS_ECORRUPT;
    s->origins = wire_get_bytes(r, (size_t)s->n_origins * ORIGIN_BYTES);
    if (!s->origins) return CIRRUS_ECORRUPT;
    for (uint32_t i = 0; i < s->n_origins; i++) {
        const stage_origin o = stage_msg_origin_at(s, i);
        if (o.from < 1 || o.from > s->steps ||
            (i > 0 && o.segment <= stage_msg_origin_at(s, i - 1).segment))
            return CIRRUS_ECORRUPT;
    }
    const uint8_t *f = wire_get_bytes(r, (size_t)count * sizeof(float));
    if (!f || done(r)) return CIRRUS_ECORRUPT;
    s->floats = f;
    return 0;
}

void stage_msg_put_params_set(wire_writer *w, const stage_params_set *q, const float *x)
{
    wire_put_u64(w, q->steps);
    wire_put_u64(w, q->n);
    wire_put_u64(w, q->offset);
    wire_put_u64(w, q->count);
    if (x) wire_put_bytes(w, x, (size_t)q->count * sizeof(float));
}

/* PARAMS_SET and STATE_SET: n the receiver's parameter count, total the floats a slice
 * may address (n, or 3n for the whole state). */
static int get_set(wire_reader *r, uint64_t n, uint64_t total, stage_params_set *q)
{
    q->steps = wire_get_u64(r);
    q->n = wire_get_u64(r);
    q->offset = wire_get_u64(r);
    q->count = wire_get_u64(r);
    q->floats = NULL;
    if (r->failed || q->n != n || q->offset > total || q->count > total - q->offset ||
        q->count > STAGE_STATE_SLICE)
        return CIRRUS_ECORRUPT;
    const uint8_t *f = wire_get_bytes(r, (size_t)q->count * sizeof(float));
    if (!f || done(r)) return CIRRUS_ECORRUPT;
    q->floats = f;
    return 0;
}

int stage_msg_get_params_set(wire_reader *r, uint64_t n, stage_params_set *q)
{
    return get_set(r, n, n, q);
}

int stage_msg_get_state_set(wire_reader *r, uint64_t n, stage_params_set *q)
{
    return n > UINT64_MAX / 3 ? CIRRUS_ECORRUPT : get_set(r, n, 3 * n, q);
}

void stage_msg_put_sync(wire_writer *w, const char *donor)
{
    wire_put_str(w, donor);
}

int stage_msg_get_sync(wire_reader *r, char donor[STAGE_ADDR_MAX])
{
    if (wire_get_str(r, donor, STAGE_ADDR_MAX)) {
        donor[0] = '\0';
        return CIRRUS_ECORRUPT;
    }
    return done(r);
}

/* Floats [off, off + count) of the runs laid end to end, piece by piece in order. */
static void walk_runs(const stage_run *runs, int n, uint64_t off, uint64_t count,
                      void (*piece)(void *ctx, float *at, uint64_t count), void *ctx)
{
    uint64_t at = 0; /* where run i starts */
    for (int i = 0; i < n && count > 0; i++) {
        const uint64_t len = runs[i].count;
        if (off < at + len) {
            const uint64_t from = off - at, take = len - from < count ? len - from : count;
            piece(ctx, runs[i].at + from, take);
            off += take;
            count -= take;
        }
        at += len;
    }
}

static void put_piece(void *ctx, float *at, uint64_t count)
{
    stage_msg_put_state_floats(ctx, at, count);
}

void stage_msg_put_runs(wire_writer *w, const stage_run *runs, int n, uint64_t off,
                        uint64_t count)
{
    walk_runs(runs, n, off, count, put_piece, w);
}

static void take_piece(void *ctx, float *at, uint64_t count)
{
    const uint8_t **src = ctx;
    memcpy(at, *src, sizeof(float) * count);
    *src += sizeof(float) * count;
}

void stage_msg_take_runs(const stage_run *runs, int n, uint64_t off, const uint8_t *floats,
                         uint64_t count)
{
    walk_runs(runs, n, off, count, take_piece, &floats);
}

int stage_fetch_state(stage_state_call call, stage_state_sink sink, void *ctx,
                      uint64_t expect_n, uint64_t *steps, stage_origins *origins,
                      cirrus_error *err)
{
    const uint64_t total = 3 * expect_n;
    if (origins) origins->n = 0;
    for (int attempt = 0; attempt < 3; attempt++) {
        uint64_t first_steps = 0;
        int restart = 0;
        for (uint64_t off = 0; off < total && !restart; off += STAGE_STATE_SLICE) {
            const stage_state_get q = {
                .offset = off,
                .count = total - off < STAGE_STATE_SLICE ? total - off : STAGE_STATE_SLICE};
            wire_writer w;
            wire_reader r;
            wire_writer_init(&w, 64);
            stage_msg_put_state_get(&w, &q);
            int rc = call(ctx, &w, &r, err);
            wire_writer_free(&w);
            if (rc) return rc;
            stage_state_slice sl;
            if (stage_msg_get_state_slice(&r, q.count, &sl) || sl.n != expect_n)
                return cirrus_fail(err, CIRRUS_EMISMATCH,
                                   "STATE_GET reply: %llu optimizer floats (expected %llu) or "
                                   "a slice that is not the %llu floats asked for",
                                   (unsigned long long)sl.n, (unsigned long long)expect_n,
                                   (unsigned long long)q.count);
            if (off == 0) first_steps = sl.steps;
            if (sl.steps != first_steps) {
                restart = 1; /* the donor stepped: its state is another one now */
                break;
            }
            sink(ctx, off, sl.floats, q.count);
            if (origins && off + q.count >= total) { /* the last slice */
                if (sl.n_origins > origins->max)
                    return cirrus_fail(err, CIRRUS_EMISMATCH, "STATE_GET reply: %u moments "
                                       "origins, more than the %u segments of this peer",
                                       sl.n_origins, origins->max);
                for (uint32_t i = 0; i < sl.n_origins; i++)
                    origins->o[i] = stage_msg_origin_at(&sl, i);
                origins->n = sl.n_origins;
            }
        }
        if (!restart) {
            *steps = first_steps;
            return 0;
        }
    }
    return cirrus_fail(err, CIRRUS_EIO, "the donor kept stepping while its state was fetched");
}
