/* ops_cpu: layer kernels on the CPU. Matrix products go to OpenBLAS through cpu_sgemm
 * (tiles fixed by the shape, see cpu_gemm.h); the rest are OpenMP loops. Attention runs one
 * (batch, head) pair per thread and calls OpenBLAS, single-threaded, inside that thread. */
#include <math.h>
#include <string.h>

#include "cpu_gemm.h"
#include "../ops.h"

/* Column block for row reductions (bias and LayerNorm parameter gradients): each thread owns
 * whole columns, so the summation order is fixed whatever the thread count. */
#define COL_BLOCK 64

void ops_encoder_forward(float *out, const int32_t *tokens, const float *wte, const float *wpe,
                         int B, int T, int C)
{
#pragma omp parallel for schedule(static)
    for (int bt = 0; bt < B * T; bt++) {
        const float *we = wte + (size_t)tokens[bt] * C;
        const float *pe = wpe + (size_t)(bt % T) * C;
        float *o = out + (size_t)bt * C;
        for (int c = 0; c < C; c++) o[c] = we[c] + pe[c];
    }
}

void ops_encoder_backward(float *dwte, float *dwpe, const float *dout, const int32_t *tokens,
                          int B, int T, int C)
{
    /* Scatter-add into token rows: sequential so repeated tokens add in a fixed order. */
    for (int bt = 0; bt < B * T; bt++) {
        float *dwe = dwte + (size_t)tokens[bt] * C;
        float *dpe = dwpe + (size_t)(bt % T) * C;
        const float *d = dout + (size_t)bt * C;
        for (int c = 0; c < C; c++) {
            dwe[c] += d[c];
            dpe[c] += d[c];
        }
    }
}

void ops_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                           const float *w, const float *b, int N, int C)
{
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C;
        float m = 0.0f;
        for (int c = 0; c < C; c++) m += x[c];
        m /= (float)C;
        float v = 0.0f;
        for (int c = 0; c < C; c++) v += (x[c] - m) * (x[c] - m);
        v /= (float)C;
        float s = 1.0f / sqrtf(v + 1e-5f);
        float *o = out + (size_t)n * C;
        for (int c = 0; c < C; c++) o[c] = (x[c] - m) * s * w[c] + b[c];
        mean[n] = m;
        rstd[n] = s;
    }
}

void ops_layernorm_backward(float *dinp, float *dw, float *db, const float *dout,
                            const float *inp, const float *w, const float *mean,
                            const float *rstd, int N, int C)
{
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C, *d = dout + (size_t)n * C;
        const float m = mean[n], s = rstd[n];
        float dmean = 0.0f, dnorm_norm = 0.0f;
        for (int c = 0; c < C; c++) {
            float dn = d[c] * w[c];
            dmean += dn;
            dnorm_norm += dn * (x[c] - m) * s;
        }
        dmean /= (float)C;
        dnorm_norm /= (float)C;
        float *di = dinp + (size_t)n * C;
        for (int c = 0; c < C; c++) {
            float norm = (x[c] - m) * s;
            di[c] += (d[c] * w[c] - dmean - norm * dnorm_norm) * s;
        }
    }
#pragma omp parallel for schedule(static)
    for (int c0 = 0; c0 < C; c0 += COL_BLOCK) {
        const int c1 = c0 + COL_BLOCK < C ? c0 + COL_BLOCK : C;
        float accw[COL_BLOCK] = {0}, accb[COL_BLOCK] = {0};
        for (int n = 0; n < N; n++) {
            const float *x = inp + (size_t)n * C, *d = dout + (size_t)n * C;
            const float m = mean[n], s = rstd[n];
            for (int c = c0; c < c1; c++) {
                accw[c - c0] += d[c] * (x[c] - m) * s;
                accb[c - c0] += d[c];
            }
        }
        for (int c = c0; c < c1; c++) {
            dw[c] += accw[c - c0];
            db[c] += accb[c - c0];
        }
    }
}

void ops_matmul_forward(float *out, const float *base, const float *inp, const float *w,
                        const float *bias, int N, int IC, int OC)
{
    /* Seed out with base + bias, then let sgemm accumulate (beta = 1): one pass fewer than
     * adding bias and residual afterwards. */
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        float *o = out + (size_t)n * OC;
        const float *r = base ? base + (size_t)n * OC : NULL;
        for (int c = 0; c < OC; c++) o[c] = (r ? r[c] : 0.0f) + (bias ? bias[c] : 0.0f);
    }
    cpu_sgemm(CblasNoTrans, CblasTrans, N, OC, IC, 1.0f, inp, IC, w, IC,
                1.0f, out, OC);
}

static void column_sums_add(float *acc, const float *x, int N, int C)
{
#pragma omp parallel for schedule(static)
    for (int c0 = 0; c0 < C; c0 += COL_BLOCK) {
        const int c1 = c0 + COL_BLOCK < C ? c0 + COL_BLOCK : C;
        float sum[COL_BLOCK] = {0};
        for (int n = 0; n < N; n++) {
            const float *row = x + (size_t)n * C;
            for (int c = c0; c < c1; c++) sum[c - c0] += row[c];
        }
        for (int c = c0; c < c1; c++) acc[c] += sum[c - c0];
    }
}

void ops_matmul_backward(float *dinp, int accumulate, float *dw, float *dbias,
                         const float *dout, const float *inp, const float *w, int N, int IC,
                         int OC)
{
    cpu_sgemm(CblasNoTrans, CblasNoTrans, N, IC, OC, 1.0f, dout, OC, w, IC,
                accumulate ? 1.0f : 0.0f, dinp, IC);
    cpu_sgemm(CblasTrans, CblasNoTrans, OC, IC, N, 1.0f, dout, OC, inp, IC,
                1.0f, dw, IC);
    if (dbias) column_sums_add(dbias, dout, N, OC);
}

void ops_attention_forward(float *out, float *att, const float *qkv, int B, int T, int C,
                           int NH)
{
    const int hs = C / NH;
    const float scale = 1.0f / sqrtf((float)hs);
    const int C3 = 3 * C;
    cpu_gemm_init();
#pragma omp parallel for schedule(static)
    for (int bh = 0; bh < B * NH; bh++) {
        const int b = bh / NH, h = bh % NH;
        const float *q = qkv + (size_t)b * T * C3 + h * hs;
        const float *k = q + C, *v = q + 2 * C;
        float *a = att + (size_t)bh * T * T;
        /* Scores for all (t, t2); the causal half above the diagonal is zeroed by softmax. */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs, 1.0f, q, C3, k, C3,
                    0.0f, a, T);
        for (int t = 0; t < T; t++) {
            float *row = a + (size_t)t * T;
            ops_softmax_row(row, t + 1, scale);
            memset(row + t + 1, 0, sizeof(float) * (size_t)(T - t - 1));
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hs, T, 1.0f, a, T, v, C3,
                    0.0f, out + (size_t)b * T * C + h * hs, C);
    }
}

void ops_attention_backward(float *dqkv, float *datt, const float *dout, const float *qkv,
                            const float *att, int B, int T, int C, int NH)
{
    const int hs = C / NH;
    const float scale = 1.0f / sqrtf((float)hs);
    const int C3 = 3 * C;
    cpu_gemm_init();
#pragma omp parallel for schedule(static)
    for (int bh = 0; bh < B * NH; bh++) {
        const int b = bh / NH, h = bh % NH;
        const float *q = qkv + (size_t)b * T * C3 + h * hs;
        const float *k = q + C, *v = q + 2 * C;
        float *dq = dqkv + (size_t)b * T * C3 + h * hs;
        float *dk = dq + C, *dv = dq + 2 * C;
        const float *a = att + (size_t)bh * T * T;
        const float *d = dout + (size_t)b * T * C + h * hs;
        float *da = datt + (size_t)bh * T * T;
        /* d(att) = dout V^T ; dV = att^T dout */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs, 1.0f, d, C, v, C3,
                    0.0f, da, T);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T, 1.0f, a, T, d, C,
                    0.0f, dv, C3);
        /* Softmax backward, row by row: dS = att * (datt - <att, datt>), causal part only. */
        for (int t = 0; t < T; t++) {
            const float *ar = a + (size_t)t * T;
            float *dr = da + (size_t)t * T;
            float dot = 0.0f;
            for (int j = 0; j <= t; j++) dot += ar[j] * dr[j];
            for (int j = 0; j <= t; j++) dr[j] = ar[j] * (dr[j] - dot);
            for (int j = t + 1; j < T; j++) dr[j] = 0.0f;
        }
        /* S = scale * Q K^T, so dQ = scale * dS K and dK = scale * dS^T Q. */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hs, T, scale, da, T, k, C3,
                    0.0f, dq, C3);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T, scale, da, T, q, C3,
                    0.0f, dk, C3);
    }
}

void ops_crossentropy_forward(float *probs, float *losses, const float *logits,
                              const int32_t *targets, int N, int V)
{
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        float *p = probs + (size_t)n * V;
        memcpy(p, logits + (size_t)n * V, sizeof(float) * (size_t)V);
        ops_softmax_row(p, V, 1.0f);
        /* A probability that underflowed to 0 would give an infinite loss; clamp it. */
        float pt = p[targets[n]];
        losses[n] = -logf(pt > 1e-30f ? pt : 1e-30f);
    }
}

void ops_crossentropy_backward(float *dlogits, const float *probs, const int32_t *targets,
                               float dloss, int N, int V)
{
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *p = probs + (size_t)n * V;
        float *d = dlogits + (size_t)n * V;
        for (int v = 0; v < V; v++) d[v] = p[v] * dloss;
        d[targets[n]] -= dloss;
    }
}

void ops_head_forward(float *logits, const float *inp, const float *wte, int N, int C, int V)
{
    cpu_sgemm(CblasNoTrans, CblasTrans, N, V, C, 1.0f, inp, C, wte, C, 0.0f,
                logits, V);
}

void ops_head_backward(float *dinp, float *dwte, const float *dlogits, const float *inp,
                       const float *wte, int N, int C, int V)
{
    cpu_sgemm(CblasNoTrans, CblasNoTrans, N, C, V, 1.0f, dlogits, V, wte, C,
                0.0f, dinp, C);
    cpu_sgemm(CblasTrans, CblasNoTrans, V, C, N, 1.0f, dlogits, V, inp, C,
                1.0f, dwte, C);
}
