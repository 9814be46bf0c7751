/* adamw: AdamW with decoupled weight decay, global gradient-norm clipping and a
 * warmup + cosine learning-rate schedule, over a span of the flat parameter buffer.
 *
 * The span lets a pipeline stage own the optimizer state of just its parameters. Clipping
 * needs the norm of the WHOLE model's gradient, so it is two calls: adamw_grad_sumsq() per
 * span (summed across stages by the caller), then adamw_step() with the global total.
 * Weight decay applies to matrices only (the tensor table's decay flag).
 */
#ifndef CIRRUS_ADAMW_H
#define CIRRUS_ADAMW_H

#include <stdint.h>

#include "../model/gpt.h"

typedef struct adamw_config {
    float lr;           /* peak learning rate */
    float min_lr_ratio; /* cosine floor as a fraction of lr */
    int warmup_steps;
    int total_steps;
    float beta1, beta2, eps;
    float weight_decay;
    float grad_clip; /* max global L2 norm; <= 0 disables clipping */
} adamw_config;

/* The defaults Cirrus trains with (GPT-2/3 style: betas 0.9/0.95, decay 0.1, clip 1). */
adamw_config adamw_defaults(float lr, int total_steps);

typedef struct adamw_segment {
    size_t offset, count; /* relative to the span */
    int decay;
} adamw_segment;

typedef struct adamw {
    adamw_config cfg;
    gpt_span span;
    float *m, *v;      /* span.count each */
    adamw_segment *seg; /* the span cut along tensor boundaries */
    int n_seg;
} adamw;

int adamw_create(adamw *o, const gpt_config *model, gpt_span span, const adamw_config *cfg,
                 cirrus_error *err);
void adamw_destroy(adamw *o);

/* Learning rate at step (0-based): linear warmup, then cosine decay to min_lr_ratio * lr. */
float adamw_lr(const adamw_config *cfg, uint64_t step);

/* Sum of squares of (scale * grads) over n floats, in double, in an order that does not
 * depend on the thread count. */
double adamw_grad_sumsq(const float *grads, size_t n, float scale);

/* One update of params[span] from grads[span] (both pointing at the span's first float).
 * The gradients are consumed: they are left zero, ready for the next step's accumulation
 * (zeroing inside the update saves a separate pass over memory).
 * grad_scale multiplies the gradients first (1 / microbatches accumulated); total_sumsq is
 * the global sum of squares of the scaled gradients, for clipping. step is 1-based (bias
 * correction). Returns the global gradient norm before clipping. */
float adamw_step(adamw *o, float *params, float *grads, float grad_scale,
                 double total_sumsq, float lr, uint64_t step);

#endif
