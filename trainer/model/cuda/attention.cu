/* attention: causal multi-head attention on the GPU, the same contract as the CPU's
 * ops_attention_forward/backward (ops.h): qkv (B,T,3C) in, out (B,T,C), att (B,NH,T,T) the
 * softmax probabilities with zeros above the diagonal.
 *
 * The scores, the causal mask and the softmax are one kernel (a block per row of att); the
 * products with V and the backward are one thread per output element, walking its sum in
 * index order. Nothing is accumulated across threads, so no atomics and a fixed order. This
 * is the straightforward version the equivalence tests need first; a flash-style kernel
 * that never writes att would be checked against it.
 */
#include <math.h>

#include "cuda_internal.cuh"

/* One block per (b, h, t): att[b,h,t,:] = softmax(scale * q_t . k_j) for j <= t, 0 after. */
__global__ void att_softmax_kernel(float *att, const float *qkv, int T, int C, int NH, float scale)
{
    __shared__ float sh[CUDA_ROW_THREADS];
    const int hs = C / NH;
    const int t = blockIdx.x % T, bh = blockIdx.x / T, b = bh / NH, h = bh % NH;
    const float *q = qkv + ((size_t)b * T + t) * 3 * C + (size_t)h * hs;
    float *row = att + (size_t)blockIdx.x * T;
    float mx = -INFINITY;
    for (int j = threadIdx.x; j <= t; j += CUDA_ROW_THREADS) {
        const float *k = qkv + ((size_t)b * T + j) * 3 * C + C + (size_t)h * hs;
        float s = 0.0f;
        for (int d = 0; d < hs; d++) s += q[d] * k[d];
        row[j] = s;
        mx = fmaxf(mx, s);
    }
    mx = cuda_block_max(mx, sh);
    float sum = 0.0f;
    for (int j = threadIdx.x; j <= t; j += CUDA_ROW_THREADS) {
        float e = expf(scale * (row[j] - mx));
        row[j] = e;
        sum += e;
    }
    const float inv = 1.0f / cuda_block_sum(sum, sh);
    for (int j = threadIdx.x; j < T; j += CUDA_ROW_THREADS) row[j] = j <= t ? row[j] * inv : 0.0f;
}

/* One thread per (b, t, h, d): out = sum_{j <= t} att[t, j] v_j[d]. */
__global__ void att_values_kernel(float *out, const float *att, const float *qkv, int B, int T,
                                  int C, int NH)
{
    const int hs = C / NH;
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)B * T * C) return;
    const int c = (int)(i % C), t = (int)(i / C % T), b = (int)(i / C / T);
    const int h = c / hs, d = c % hs;
    const float *a = att + (((size_t)b * NH + h) * T + t) * T;
    const float *v = qkv + (size_t)b * T * 3 * C + 2 * C + (size_t)h * hs + d;
    float s = 0.0f;
    for (int j = 0; j <= t; j++) s += a[j] * v[(size_t)j * 3 * C];
    out[i] = s;
}

/* One block per (b, h, t): datt row = dout_t . v_j, then the softmax backward in place:
 * dS = att * (datt - <att, datt>) on j <= t, 0 above. */
__global__ void att_dsoftmax_kernel(float *datt, const float *att, const float *dout,
                                    const float *qkv, int T, int C, int NH)
{
    __shared__ float sh[CUDA_ROW_THREADS];
    const int hs = C / NH;
    const int t = blockIdx.x % T, bh = blockIdx.x / T, b = bh / NH, h = bh % NH;
    const float *g = dout + ((size_t)b * T + t) * C + (size_t)h * hs;
    const float *a = att + (size_t)blockIdx.x * T;
    float *dr = datt + (size_t)blockIdx.x * T;
    float dot = 0.0f;
    for (int j = threadIdx.x; j <= t; j += CUDA_ROW_THREADS) {
        const float *v = qkv + ((size_t)b * T + j) * 3 * C + 2 * C + (size_t)h * hs;
        float s = 0.0f;
        for (int d = 0; d < hs; d++) s += g[d] * v[d];
        dr[j] = s;
        dot += a[j] * s;
    }
    dot = cuda_block_sum(dot, sh);
    for (int j = threadIdx.x; j < T; j += CUDA_ROW_THREADS)
        dr[j] = j <= t ? a[j] * (dr[j] - dot) : 0.0f;
}

/* One thread per (b, i, h, d) writes dq_i[d], dk_i[d] and dv_i[d]:
 *   dq_i = scale sum_{j <= i} dS[i,j] k_j     dk_i = scale sum_{j >= i} dS[j,i] q_j
 *   dv_i = sum_{j >= i} att[j,i] dout_j */
__global__ void att_dqkv_kernel(float *dqkv, const float *datt, const float *att,
                                const float *dout, const float *qkv, int B, int T, int C,
                                int NH, float scale)
{
    const int hs = C / NH;
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)B * T * C) return;
    const int c = (int)(idx % C), i = (int)(idx / C % T), b = (int)(idx / C / T);
    const int h = c / hs;
    const size_t C3 = 3 * (size_t)C;
    const float *q = qkv + (size_t)b * T * C3 + c, *k = q + C;
    const float *dS = datt + ((size_t)b * NH + h) * T * T;
    const float *a = att + ((size_t)b * NH + h) * T * T;
    const float *g = dout + (size_t)b * T * C + c;
    float dq = 0.0f, dk = 0.0f, dv = 0.0f;
    for (int j = 0; j <= i; j++) dq += dS[(size_t)i * T + j] * k[j * C3];
    for (int j = i; j < T; j++) {
        dk += dS[(size_t)j * T + i] * q[j * C3];
        dv += a[(size_t)j * T + i] * g[(size_t)j * C];
    }
    float *o = dqkv + ((size_t)b * T + i) * C3 + c;
    o[0] = scale * dq;
    o[C] = scale * dk;
    o[2 * C] = dv;
}

void cuda_attention_forward(float *out, float *att, const float *qkv, int B, int T, int C,
                            int NH)
{
    if (cuda_g.failed) return;
    const float scale = 1.0f / sqrtf((float)(C / NH));
    att_softmax_kernel<<<B * NH * T, CUDA_ROW_THREADS, 0, cuda_g.stream>>>(att, qkv, T, C, NH,
                                                                            scale);
    size_t n = (size_t)B * T * C;
    att_values_kernel<<<cuda_blocks(n, CUDA_ELEM_THREADS), CUDA_ELEM_THREADS, 0,
                        cuda_g.stream>>>(out, att, qkv, B, T, C, NH);
    cuda_finish("attention_forward");
}

void cuda_attention_backward(float *dqkv, float *datt, const float *dout, const float *qkv,
                             const float *att, int B, int T, int C, int NH)
{
    if (cuda_g.failed) return;
    const float scale = 1.0f / sqrtf((float)(C / NH));
    att_dsoftmax_kernel<<<B * NH * T, CUDA_ROW_THREADS, 0, cuda_g.stream>>>(datt, att, dout,
                                                                             qkv, T, C, NH);
    size_t n = (size_t)B * T * C;
    att_dqkv_kernel<<<cuda_blocks(n, CUDA_ELEM_THREADS), CUDA_ELEM_THREADS, 0,
                      cuda_g.stream>>>(dqkv, datt, att, dout, qkv, B, T, C, NH, scale);
    cuda_finish("attention_backward");
}
