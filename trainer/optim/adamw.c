/* adamw: see adamw.h. */
#include "adamw.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

adamw_config adamw_defaults(float lr, int total_steps)
{
    adamw_config c = {
        .lr = lr,
        .min_lr_ratio = 0.1f,
        .warmup_steps = total_steps / 20 > 0 ? total_steps / 20 : 1,
        .total_steps = total_steps,
        .beta1 = 0.9f,
        .beta2 = 0.95f,
        .eps = 1e-8f,
        .weight_decay = 0.1f,
        .grad_clip = 1.0f,
    };
    return c;
}

int adamw_create(adamw *o, const gpt_config *model, const gpt_span *spans, int n_spans,
                 const adamw_config *cfg, cirrus_error *err)
{
    memset(o, 0, sizeof *o);
    o->cfg = *cfg;
    size_t nt = gpt_num_tensors(model);
    gpt_tensor_info *table = calloc(nt, sizeof *table);
    o->seg = calloc(nt, sizeof *o->seg);
    if (!table || !o->seg) goto nomem;
    gpt_tensor_table(model, table);
    for (size_t i = 0; i < nt; i++) {
        for (int s = 0; s < n_spans; s++) {
            size_t lo = table[i].offset, hi = lo + table[i].numel;
            size_t s0 = spans[s].offset, s1 = s0 + spans[s].count;
            if (hi <= s0 || lo >= s1) continue;
            if (lo < s0) lo = s0;
            if (hi > s1) hi = s1;
            o->seg[o->n_seg++] = (adamw_segment){lo, o->state_count, hi - lo, table[i].decay};
            o->state_count += hi - lo;
        }
    }
    free(table);
    table = NULL;
    o->m = calloc(o->state_count ? o->state_count : 1, sizeof(float));
    o->v = calloc(o->state_count ? o->state_count : 1, sizeof(float));
    if (!o->m || !o->v) goto nomem;
    return 0;
nomem:
    free(table);
    adamw_destroy(o);
    return cirrus_fail(err, CIRRUS_ENOMEM, "cannot allocate optimizer state");
}

void adamw_destroy(adamw *o)
{
    free(o->m);
    free(o->v);
    free(o->seg);
    memset(o, 0, sizeof *o);
}

float adamw_lr(const adamw_config *cfg, uint64_t step)
{
    if ((int64_t)step < cfg->warmup_steps)
        return cfg->lr * (float)(step + 1) / (float)cfg->warmup_steps;
    double span = (double)(cfg->total_steps - cfg->warmup_steps);
    double progress = span > 0 ? ((double)step - cfg->warmup_steps) / span : 1.0;
    if (progress > 1.0) progress = 1.0;
    double cosine = 0.5 * (1.0 + cos(M_PI * progress));
    double floor = cfg->min_lr_ratio;
    return (float)(cfg->lr * (floor + (1.0 - floor) * cosine));
}

/* Fixed-size chunks summed by any thread, then the chunk sums added in order: the result is
 * the same for any number of threads. */
#define SUMSQ_CHUNK 65536

double adamw_grad_sumsq(const float *grads, size_t n, float scale)
{
    size_t nchunks = (n + SUMSQ_CHUNK - 1) / SUMSQ_CHUNK;
    double *part = calloc(nchunks ? nchunks : 1, sizeof(double));
    double total = 0.0;
    if (!part) { /* degrade to a serial sum rather than fail an optimizer step */
        for (size_t i = 0; i < n; i++) total += (double)(grads[i] * scale) * (grads[i] * scale);
        return total;
    }
#pragma omp parallel for schedule(static)
    for (size_t c = 0; c < nchunks; c++) {
        size_t lo = c * SUMSQ_CHUNK, hi = lo + SUMSQ_CHUNK < n ? lo + SUMSQ_CHUNK : n;
        double s = 0.0;
        for (size_t i = lo; i < hi; i++) {
            float g = grads[i] * scale;
            s += (double)g * g;
        }
        part[c] = s;
    }
    for (size_t c = 0; c < nchunks; c++) total += part[c];
    free(part);
    return total;
}

void adamw_segment_sumsq(const adamw *o, const float *grads, float scale, double *out)
{
    for (int s = 0; s < o->n_seg; s++)
        out[s] = adamw_grad_sumsq(grads + o->seg[s].offset, o->seg[s].count, scale);
}

double adamw_sum_in_order(const double *parts, int n)
{
    double total = 0.0;
    for (int i = 0; i < n; i++) total += parts[i];
    return total;
}

double adamw_total_sumsq(const adamw *o, const float *grads, float scale)
{
    double total = 0.0;
    for (int s = 0; s < o->n_seg; s++)
        total += adamw_grad_sumsq(grads + o->seg[s].offset, o->seg[s].count, scale);
    return total;
}

float adamw_step(adamw *o, float *params, float *grads, float grad_scale,
                 double total_sumsq, float lr, uint64_t step)
{
    const adamw_config *c = &o->cfg;
    float norm = (float)sqrt(total_sumsq);
    float clip = 1.0f;
    if (c->grad_clip > 0.0f && norm > c->grad_clip) clip = c->grad_clip / (norm + 1e-6f);
    const float gs = grad_scale * clip;
    const float b1 = c->beta1, b2 = c->beta2;
    const float bc1 = 1.0f - powf(b1, (float)step), bc2 = 1.0f - powf(b2, (float)step);
    for (int s = 0; s < o->n_seg; s++) {
        const adamw_segment *seg = &o->seg[s];
        const float wd = seg->decay ? c->weight_decay : 0.0f;
        float *p = params + seg->offset, *m = o->m + seg->state, *v = o->v + seg->state;
        float *g = grads + seg->offset;
#pragma omp parallel for schedule(static)
        for (size_t i = 0; i < seg->count; i++) {
            float gi = g[i] * gs;
            g[i] = 0.0f;
            m[i] = b1 * m[i] + (1.0f - b1) * gi;
            v[i] = b2 * v[i] + (1.0f - b2) * gi * gi;
            float mhat = m[i] / bc1, vhat = v[i] / bc2;
            p[i] -= lr * (mhat / (sqrtf(vhat) + c->eps) + wd * p[i]);
        }
    }
    return norm;
}
