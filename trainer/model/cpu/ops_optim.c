/* ops_optim: the CPU versions of the optimizer's kernels (ops.h): the gradient's sum of
 * squares and the AdamW update. Built, like the rest, with -std=c11, where GCC does not fuse
 * a multiply and an add (-ffp-contract=off), which is what lets the CUDA versions (built
 * with -fmad=false) give the same bits. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../ops.h"

/* Fixed-size chunks summed by any thread, then the chunk sums added in order: the result is
 * the same for any number of threads. */
double ops_sumsq(const float *x, size_t n, float scale)
{
    size_t nchunks = (n + OPS_SUMSQ_CHUNK - 1) / OPS_SUMSQ_CHUNK;
    double *part = calloc(nchunks ? nchunks : 1, sizeof(double));
    double total = 0.0;
    if (!part) { /* degrade to a serial sum rather than fail an optimizer step */
        for (size_t i = 0; i < n; i++) total += (double)(x[i] * scale) * (x[i] * scale);
        return total;
    }
#pragma omp parallel for schedule(static)
    for (size_t c = 0; c < nchunks; c++) {
        size_t lo = c * OPS_SUMSQ_CHUNK, hi = lo + OPS_SUMSQ_CHUNK < n ? lo + OPS_SUMSQ_CHUNK : n;
        double s = 0.0;
        for (size_t i = lo; i < hi; i++) {
            float g = x[i] * scale;
            s += (double)g * g;
        }
        part[c] = s;
    }
    for (size_t c = 0; c < nchunks; c++) total += part[c];
    free(part);
    return total;
}

void ops_fold(float *dst, float *src, size_t n)
{
    for (size_t i = 0; i < n; i++) dst[i] += src[i];
    memset(src, 0, n * sizeof(float));
}

void ops_sumsq_many(const float *base, const size_t *offset, const size_t *count, int n,
                    float scale, double *out)
{
    for (int i = 0; i < n; i++) out[i] = ops_sumsq(base + offset[i], count[i], scale);
}

void ops_adamw_update_many(float *p, float *g, float *m, float *v, const ops_adamw_tensor *t,
                           int n)
{
    for (int i = 0; i < n; i++)
        ops_adamw_update(p + t[i].param, g + t[i].param, m + t[i].state, v + t[i].state,
                         t[i].count, &t[i].a);
}

void ops_adamw_update(float *p, float *g, float *m, float *v, size_t n, const ops_adamw_args *a)
{
    const float gs = a->grad_scale, lr = a->lr, b1 = a->beta1, b2 = a->beta2;
    const float bc1 = a->bc1, bc2 = a->bc2, eps = a->eps, wd = a->weight_decay;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        float gi = g[i] * gs;
        g[i] = 0.0f;
        m[i] = b1 * m[i] + (1.0f - b1) * gi;
        v[i] = b2 * v[i] + (1.0f - b2) * gi * gi;
        float mhat = m[i] / bc1, vhat = v[i] / bc2;
        p[i] -= lr * (mhat / (sqrtf(vhat) + eps) + wd * p[i]);
    }
}
