/* ops_vecmath: the transcendental-heavy kernels (GELU, softmax).
 *
 * This file alone is built with -ffast-math (see the Makefile) so that GCC calls glibc's
 * vectorised tanhf/expf (libmvec): a scalar tanhf per MLP activation otherwise costs about as
 * much time as the MLP's matrix products on a 2-core machine. The kernels never see
 * infinities or NaNs by construction (softmax subtracts the row maximum first), which is
 * what -ffinite-math-only assumes. Results stay deterministic: same binary, same bits.
 */
#include <math.h>

#include "ops.h"

#define GELU_K 0.7978845608028654f /* sqrt(2/pi) */
#define GELU_A 0.044715f

void ops_gelu_forward(float *out, const float *inp, int n)
{
#pragma omp parallel for schedule(static)
    for (int i = 0; i < n; i++) {
        float x = inp[i];
        float u = GELU_K * (x + GELU_A * x * x * x);
        out[i] = 0.5f * x * (1.0f + tanhf(u));
    }
}

void ops_gelu_backward(float *dinp, const float *inp, const float *dout, int n)
{
#pragma omp parallel for schedule(static)
    for (int i = 0; i < n; i++) {
        float x = inp[i];
        float u = GELU_K * (x + GELU_A * x * x * x);
        float th = tanhf(u);
        float sech2 = 1.0f - th * th;
        float du = GELU_K * (1.0f + 3.0f * GELU_A * x * x);
        dinp[i] = dout[i] * (0.5f * (1.0f + th) + 0.5f * x * sech2 * du);
    }
}

void ops_softmax_row(float *row, int n, float scale)
{
    float mx = row[0];
    for (int i = 1; i < n; i++) mx = row[i] > mx ? row[i] : mx;
    float sum = 0.0f;
    for (int i = 0; i < n; i++) {
        row[i] = expf(scale * (row[i] - mx));
        sum += row[i];
    }
    const float inv = 1.0f / sum;
    for (int i = 0; i < n; i++) row[i] *= inv;
}
