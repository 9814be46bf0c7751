/* outer: the optimizer of the outer step across regions (DiLoCo), beside AdamW.
 *
 * Every region trains its own replica for H inner steps; the gateways then average the
 * regions' pseudo-gradients delta = theta_global - theta_region and every region applies
 * the same outer update to the global parameters. DiLoCo found SGD with Nesterov momentum
 * (lr 0.7, momentum 0.9) the best outer optimizer; lr 1 with momentum 0 is plain
 * averaging of the replicas (FedAvg).
 *
 * The update must come out bit-identical in every region: it is one plain loop over the
 * buffer in index order, each element on its own, with no reduction whose order could
 * depend on threads or vector width (and this file is built without -ffast-math).
 */
#ifndef CIRRUS_OUTER_H
#define CIRRUS_OUTER_H

#include <stddef.h>

typedef struct outer_options {
    float lr;       /* outer learning rate (DiLoCo: 0.7) */
    float momentum; /* Nesterov momentum (DiLoCo: 0.9; 0: plain SGD on the pseudo-gradient) */
} outer_options;

#define OUTER_DEFAULT_LR 0.7f
#define OUTER_DEFAULT_MOMENTUM 0.9f

/* One Nesterov step over n floats, as torch.optim.SGD(nesterov=True) takes it:
 *   mom = momentum * mom + delta;  theta -= lr * (delta + momentum * mom).
 * With momentum 0, theta -= lr * delta (mom is then left untouched and may be NULL). */
void outer_step(const outer_options *o, float *theta, float *mom, const float *delta, size_t n);

#endif
