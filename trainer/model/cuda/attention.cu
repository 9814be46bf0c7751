/* attention: causal multi-head attention on the GPU, the same contract as the CPU's
 * ops_attention_forward/backward (ops.h): qkv (B,T,3C) in, out (B,T,C), att (B,NH,T,T) the
 * softmax probabilities with zeros above the diagonal.
 *
 * The same plan as the CPU's (ops_cpu.c): the four products per head are cuBLAS
 * strided-batched sgemms (a call per sequence, its heads the batch: a head's q, k, v sit hs
 * floats apart in a row of qkv), and the row-wise softmax and its backward are a block per
 * row of att. cuBLAS gives the same bits on every run on the same GPU, and the row kernels
 * reduce in a fixed tree order, so the whole is deterministic. The full T x T products waste
 * the causal upper half (masked to zero afterwards), as the CPU's do; a flash-style kernel
 * that never writes att would be checked against this one.
 *
 * The first version (a thread per output element walking its dot product) was 10x slower
 * at GPT-2's shape on an H200 (docs/BENCHMARKS.md).
 */
#include <math.h>

#include "cuda_internal.cuh"

/* Row-major C_i (M,N) = alpha op(A_i) op(B_i) + beta C_i for i < count, with A_i = A + i*sA
 * and so on: the operands swapped for column-major cuBLAS, as ops_cuda.cu's sgemm. */
static void sgemm_batched(int ta, int tb, int M, int N, int K, float alpha, const float *A,
                          int lda, long long sA, const float *B, int ldb, long long sB,
                          float beta, float *C, int ldc, long long sC, int count)
{
    if (cuda_g.failed) return;
    cublasStatus_t st = cublasSgemmStridedBatched(
        cuda_g.blas, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, N, M, K,
        &alpha, B, ldb, sB, A, lda, sA, &beta, C, ldc, sC, count);
    if (st != CUBLAS_STATUS_SUCCESS)
        cuda_fail(__FILE__, __LINE__, "cublasSgemmStridedBatched", cublasGetStatusString(st));
}

/* One block per row t of att (blockIdx.x = (b*NH + h)*T + t), in place: the scores become
 * softmax(scale * s_j) for j <= t and 0 after, ops_softmax_row's arithmetic. */
__global__ void att_softmax_kernel(float *att, int T, float scale)
{
    __shared__ float sh[CUDA_ROW_THREADS];
    const int t = blockIdx.x % T;
    float *row = att + (size_t)blockIdx.x * T;
    float mx = -INFINITY;
    for (int j = threadIdx.x; j <= t; j += CUDA_ROW_THREADS) mx = fmaxf(mx, row[j]);
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

/* One block per row: dS = att * (datt - <att, datt>) on j <= t, 0 above, in place in datt. */
__global__ void att_dsoftmax_kernel(float *datt, const float *att, int T)
{
    __shared__ float sh[CUDA_ROW_THREADS];
    const int t = blockIdx.x % T;
    const float *a = att + (size_t)blockIdx.x * T;
    float *dr = datt + (size_t)blockIdx.x * T;
    float dot = 0.0f;
    for (int j = threadIdx.x; j <= t; j += CUDA_ROW_THREADS) dot += a[j] * dr[j];
    dot = cuda_block_sum(dot, sh);
    for (int j = threadIdx.x; j < T; j += CUDA_ROW_THREADS)
        dr[j] = j <= t ? a[j] * (dr[j] - dot) : 0.0f;
}

void cuda_attention_forward(float *out, float *att, const float *qkv, int B, int T, int C,
                            int NH)
{
    if (cuda_g.failed) return;
    const int hs = C / NH, C3 = 3 * C;
    const float scale = 1.0f / sqrtf((float)hs);
    const long long TT = (long long)T * T;
    for (int b = 0; b < B; b++) { /* scores S = Q K^T, unscaled (the softmax scales) */
        const float *q = qkv + (size_t)b * T * C3;
        sgemm_batched(0, 1, T, T, hs, 1.0f, q, C3, hs, q + C, C3, hs, 0.0f,
                      att + (size_t)b * NH * TT, T, TT, NH);
    }
    att_softmax_kernel<<<B * NH * T, CUDA_ROW_THREADS, 0, cuda_g.stream>>>(att, T, scale);
    for (int b = 0; b < B; b++) /* out = att V */
        sgemm_batched(0, 0, T, hs, T, 1.0f, att + (size_t)b * NH * TT, T, TT,
                      qkv + (size_t)b * T * C3 + 2 * C, C3, hs, 0.0f, out + (size_t)b * T * C,
                      C, hs, NH);
    cuda_finish("attention_forward");
}

void cuda_attention_backward(float *dqkv, float *datt, const float *dout, const float *qkv,
                             const float *att, int B, int T, int C, int NH)
{
    if (cuda_g.failed) return;
    const int hs = C / NH, C3 = 3 * C;
    const float scale = 1.0f / sqrtf((float)hs);
    const long long TT = (long long)T * T;
    for (int b = 0; b < B; b++) {
        const float *q = qkv + (size_t)b * T * C3, *d = dout + (size_t)b * T * C;
        const float *a = att + (size_t)b * NH * TT;
        float *dq = dqkv + (size_t)b * T * C3, *da = datt + (size_t)b * NH * TT;
        /* d(att) = dout V^T ; dV = att^T dout */
        sgemm_batched(0, 1, T, T, hs, 1.0f, d, C, hs, q + 2 * C, C3, hs, 0.0f, da, T, TT, NH);
        sgemm_batched(1, 0, T, hs, T, 1.0f, a, T, TT, d, C, hs, 0.0f, dq + 2 * C, C3, hs, NH);
    }
    att_dsoftmax_kernel<<<B * NH * T, CUDA_ROW_THREADS, 0, cuda_g.stream>>>(datt, att, T);
    for (int b = 0; b < B; b++) { /* S = scale Q K^T: dQ = scale dS K, dK = scale dS^T Q */
        const float *q = qkv + (size_t)b * T * C3, *da = datt + (size_t)b * NH * TT;
        float *dq = dqkv + (size_t)b * T * C3;
        sgemm_batched(0, 0, T, hs, T, scale, da, T, TT, q + C, C3, hs, 0.0f, dq, C3, hs, NH);
        sgemm_batched(1, 0, T, hs, T, scale, da, T, TT, q, C3, hs, 0.0f, dq + C, C3, hs, NH);
    }
    cuda_finish("attention_backward");
}
