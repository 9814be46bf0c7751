/* adamw: see adamw.h. */
#include "adamw.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../model/ops.h"

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

int adamw_init(adamw *o, const gpt_config *model, const gpt_span *spans, int n_spans,
                 const adamw_config *cfg, cirrus_error *err)
{
    memset(o, 0, sizeof *o);
    o->cfg = *cfg;
    o->ops = ops_selected();
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
            o->seg[o->n_seg++] = (adamw_segment){lo, o->state_count, hi - lo, table[i].decay, 0};
            o->state_count += hi - lo;
        }
    }
    free(table);
    table = NULL;
    const size_t n = o->n_seg ? (size_t)o->n_seg : 1;
    o->seg_offset = calloc(n, sizeof *o->seg_offset);
    o->seg_count = calloc(n, sizeof *o->seg_count);
    o->update = calloc(n, sizeof *o->update);
    o->seg_sums = calloc(n, sizeof *o->seg_sums);
    if (!o->seg_offset || !o->seg_count || !o->update || !o->seg_sums) goto nomem;
    for (int s = 0; s < o->n_seg; s++) {
        o->seg_offset[s] = o->seg[s].offset;
        o->seg_count[s] = o->seg[s].count;
        o->update[s] = (ops_adamw_tensor){.param = o->seg[s].offset, .state = o->seg[s].state,
                                          .count = o->seg[s].count};
    }
    o->m = o->ops->alloc(o->state_count);
    o->v = o->ops->alloc(o->state_count);
    if (!o->m || !o->v) goto nomem;
    return 0;
nomem:
    free(table);
    adamw_free(o);
    return cirrus_fail(err, CIRRUS_ENOMEM, "cannot allocate optimizer state");
}

void adamw_free(adamw *o)
{
    if (o->ops) {
        o->ops->free(o->m);
        o->ops->free(o->v);
    }
    free(o->seg);
    free(o->seg_offset);
    free(o->seg_count);
    free(o->update);
    free(o->seg_sums);
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

double adamw_grad_sumsq(const float *grads, size_t n, float scale)
{
    return ops_sumsq(grads, n, scale);
}

void adamw_segment_sumsq(const adamw *o, const float *grads, float scale, double *out)
{
    o->ops->sumsq_many(grads, o->seg_offset, o->seg_count, o->n_seg, scale, out);
}

double adamw_sum_in_order(const double *parts, int n)
{
    double total = 0.0;
    for (int i = 0; i < n; i++) total += parts[i];
    return total;
}

double adamw_total_sumsq(const adamw *o, const float *grads, float scale)
{
    adamw_segment_sumsq(o, grads, scale, o->seg_sums);
    return adamw_sum_in_order(o->seg_sums, o->n_seg);
}

float adamw_step(adamw *o, float *params, float *grads, float grad_scale,
                 double total_sumsq, float lr, uint64_t step)
{
    const adamw_config *c = &o->cfg;
    float norm = (float)sqrt(total_sumsq);
    float clip = 1.0f;
    if (c->grad_clip > 0.0f && norm > c->grad_clip) clip = c->grad_clip / (norm + 1e-6f);
    const float b1 = c->beta1, b2 = c->beta2;
    ops_adamw_args a = {.grad_scale = grad_scale * clip, .lr = lr, .beta1 = b1, .beta2 = b2,
                        .eps = c->eps};
    /* Every tensor in one backend call (one launch on a GPU). */
    for (int s = 0; s < o->n_seg; s++) {
        const adamw_segment *seg = &o->seg[s];
        a.weight_decay = seg->decay ? c->weight_decay : 0.0f;
        if (seg->moments_from && step > seg->moments_from) { /* fresh moments: their own count */
            const float tf = (float)(step - seg->moments_from);
            a.bc1 = 1.0f - powf(b1, tf);
            a.bc2 = 1.0f - powf(b2, tf);
        } else {
            a.bc1 = 1.0f - powf(b1, (float)step);
            a.bc2 = 1.0f - powf(b2, (float)step);
        }
        o->update[s].a = a;
    }
    o->ops->adamw_update_many(params, grads, o->m, o->v, o->update, o->n_seg);
    return norm;
}

int adamw_restart_fresh_moments(adamw *o, uint64_t steps)
{
    int n = 0;
    for (int s = 0; s < o->n_seg; s++) {
        adamw_segment *seg = &o->seg[s];
        /* Through the backend: m and v may live in device memory. */
        const int fresh = steps > 0 && o->ops->sumsq(o->m + seg->state, seg->count, 1.0f) == 0.0 &&
                          o->ops->sumsq(o->v + seg->state, seg->count, 1.0f) == 0.0;
        seg->moments_from = fresh ? steps : 0;
        n += fresh;
    }
    return n;
}
