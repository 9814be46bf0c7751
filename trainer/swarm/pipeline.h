/* pipeline: the client side of a pipeline of stage peers (one peer per stage for now).
 *
 * A client drives each microbatch through the stages in order and keeps every stage's
 * input, so the backward can be sent to the stage with exactly the input its forward saw
 * (stage peers recompute if they no longer hold the activations). After the backward it
 * runs the optimizer step across stages: the tied-embedding gradient exchange, the global
 * gradient norm (per-tensor sums, added in buffer order) and the STEP itself, which makes
 * the result bit-identical to single-process training.
 */
#ifndef CIRRUS_PIPELINE_H
#define CIRRUS_PIPELINE_H

#include <stdint.h>

#include "../model/gpt.h"

typedef struct pipeline pipeline;

/* Connect to stage peers at addrs[0..n) ("host:port", in stage order) and check that they
 * serve consecutive layer ranges covering cfg's model. */
int pipeline_connect(pipeline **out, const char *job_id, int n, const char *const *addrs,
                     const gpt_config *cfg, int max_B, int max_T, int codec, int timeout_ms,
                     cirrus_error *err);
void pipeline_close(pipeline *p);

/* Forward + backward of one microbatch; *loss is its mean loss. Gradients accumulate on
 * the peers until pipeline_step(). */
int pipeline_microbatch(pipeline *p, uint64_t id, int B, int T, const int32_t *x,
                        const int32_t *y, float *loss, cirrus_error *err);
/* Optimizer step on every stage (grad_scale = 1 / microbatches accumulated). */
int pipeline_step(pipeline *p, float lr, float grad_scale, uint64_t step, cirrus_error *err);
/* Forward only: the mean loss of a batch, nothing kept. */
int pipeline_eval(pipeline *p, int B, int T, const int32_t *x, const int32_t *y, float *loss,
                  cirrus_error *err);

#endif
