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

/* A run of the flat buffer optimised as one unit: one tensor (or the part of one inside a
 * span). Segments are in buffer order. */
typedef struct adamw_segment {
    size_t offset; /* into the flat parameter/gradient buffer */
    size_t state;  /* into m and v */
    size_t count;
    int decay;
    /* The optimizer step after which this segment's moments started from zero again (0:
     * they have been trained since the first step): bias correction counts from there. */
    uint64_t moments_from;
} adamw_segment;

struct ops_backend;

typedef struct adamw {
    adamw_config cfg;
    /* The backend (ops_selected() at adamw_init) that holds m and v and runs the update;
     * params and grads must be that backend's memory too (the model's). */
    const struct ops_backend *ops;
    size_t state_count; /* floats of m (and of v): the spans' total */
    float *m, *v;
    adamw_segment *seg;
    int n_seg;
    /* The segments as the backend's batched calls take them, made once at adamw_init:
     * their offsets and counts (sumsq_many), the update table (adamw_update_many; its
     * constants filled in by each step), and room for the per-segment sums. */
    size_t *seg_offset, *seg_count;
    struct ops_adamw_tensor *update;
    double *seg_sums;
} adamw;

/* Optimizer state for the parameters inside `spans` (in buffer order, not overlapping): a
 * whole model is one span; a pipeline stage is its own span, plus wte for the last stage,
 * which applies the tied LM head's update to its copy of the embedding. */
int adamw_init(adamw *o, const gpt_config *model, const gpt_span *spans, int n_spans,
                 const adamw_config *cfg, cirrus_error *err);
void adamw_free(adamw *o);

/* Learning rate at step (0-based): linear warmup, then cosine decay to min_lr_ratio * lr. */
float adamw_lr(const adamw_config *cfg, uint64_t step);

/* Sum of squares of (scale * x) over n floats, in double, in an order that does not
 * depend on the thread count. */
double adamw_grad_sumsq(const float *x, size_t n, float scale);

/* Per-segment sums of squares of (scale * grads), grads being the flat buffer. The global
 * total is the sum of all segments' values in buffer order (adamw_sum_in_order), which is
 * the same whether one process or several stages computed the parts. */
void adamw_segment_sumsq(const adamw *o, const float *grads, float scale, double *out);
double adamw_sum_in_order(const double *parts, int n);
/* Both of the above for an optimizer that owns every segment (one process); the parts go
 * in the optimizer's own room for them (seg_sums). */
double adamw_total_sumsq(const adamw *o, const float *grads, float scale);

/* One update of the segments' parameters from their gradients (params and grads are the
 * flat buffers). The gradients are consumed: left zero, ready for the next step's
 * accumulation (zeroing inside the update saves a separate pass over memory).
 * grad_scale multiplies the gradients first (1 / microbatches accumulated); total_sumsq is
 * the global sum of squares of the scaled gradients, for clipping. step is 1-based (bias
 * correction). Returns the global gradient norm before clipping. */
float adamw_step(adamw *o, float *params, float *grads, float grad_scale,
                 double total_sumsq, float lr, uint64_t step);

/* The state was replaced at optimizer step `steps` (a checkpoint's, a restore): segments
 * whose moments are all zero now start again there, i.e. their bias correction counts the
 * steps since, as Adam's does from its first step (with the training's count, about 1 by
 * then, the first updates of fresh moments would be 0.45 lr, then up to 1.1 lr, with betas
 * 0.9/0.95). Returns how many segments start again. */
int adamw_restart_fresh_moments(adamw *o, uint64_t steps);

#endif
