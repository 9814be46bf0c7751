/* ops_vecmath: the transcendental-heavy kernels (GELU, softmax).
 *
 * This file alone is built with -ffast-math (see the Makefile) so that GCC calls glibc's
 * vectorised tanhf/expf (libmvec): a scalar tanhf per MLP activation otherwise costs about as
 * much time as the MLP's matrix products on a 2-core machine. The kernels never see
 * infinities or NaNs by construction (softmax subtracts the row maximum first), which is
 * what -ffinite-math-only assumes. Results stay deterministic: same binary, same bits.
 *
 * The vectorised tanhf and the scalar one that finishes a loop's last few elements do not
 * round alike, so the elementwise loops are cut into blocks fixed by the length alone (never
 * by the thread count): each element then takes the same path with 1, 2 or 3 threads.
 */
#include <math.h>

#include "../ops.h"

#define GELU_K 0.7978845608028654f /* sqrt(2/pi) */
#define GELU_A 0.044715f

/* Elements per block: a multiple of every vector width (4 to 16 floats), big enough that
 * the parallel loop's overhead is small. */
#define ELEM_BLOCK 4096

static void gelu_forward_block(float *restrict out, const float *restrict inp, int n)
{
    for (int i = 0; i < n; i++) {
        float x = inp[i];
        float u = GELU_K * (x + GELU_A * x * x * x);
        out[i] = 0.5f * x * (1.0f + tanhf(u));
    }
}

void ops_gelu_forward(float *out, const float *inp, int n)
{
#pragma omp parallel for schedule(static)
    for (int b = 0; b < n; b += ELEM_BLOCK)
        gelu_forward_block(out + b, inp + b, n - b < ELEM_BLOCK ? n - b : ELEM_BLOCK);
}

/* dinp may be dout (the backward runs in place). */
static void gelu_backward_block(float *dinp, const float *inp,
                                const float *dout, int n)
{
    for (int i = 0; i < n; i++) {
        float x = inp[i];
        float u = GELU_K * (x + GELU_A * x * x * x);
        float th = tanhf(u);
        float sech2 = 1.0f - th * th;
        float du = GELU_K * (1.0f + 3.0f * GELU_A * x * x);
        dinp[i] = dout[i] * (0.5f * (1.0f + th) + 0.5f * x * sech2 * du);
    }
}

void ops_gelu_backward(float *dinp, const float *inp, const float *dout, int n)
{
#pragma omp parallel for schedule(static)
    for (int b = 0; b < n; b += ELEM_BLOCK)
        gelu_backward_block(dinp + b, inp + b, dout + b, n - b < ELEM_BLOCK ? n - b : ELEM_BLOCK);
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
