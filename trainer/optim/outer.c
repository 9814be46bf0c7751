/* outer: see outer.h. */
#include "outer.h"

void outer_step(const outer_options *o, float *theta, float *mom, const float *delta, size_t n)
{
    const float lr = o->lr, mu = o->momentum;
    if (mu == 0.0f) {
        for (size_t i = 0; i < n; i++) theta[i] -= lr * delta[i];
        return;
    }
    for (size_t i = 0; i < n; i++) {
        const float m = mu * mom[i] + delta[i];
        mom[i] = m;
        theta[i] -= lr * (delta[i] + mu * m);
    }
}
