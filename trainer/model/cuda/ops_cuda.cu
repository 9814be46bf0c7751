/* ops_cuda: the CUDA backend's start-up, memory, matrix products (cuBLAS) and the
 * elementwise and row-wise kernels. Attention is in attention.cu. See ops_cuda.h.
 *
 * Every kernel that reduces does so in an order fixed by the shape: a column in groups of
 * COL_GROUP_ROWS rows, each walked by one thread, then the groups in order; or one block of
 * CUDA_ROW_THREADS reduces a row through a fixed tree. No atomics.
 * Each op ends synchronised (cuda_finish), because the host code around the kernels reads the
 * managed buffers directly; overlapping copies and compute (a stream per role) comes later.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_internal.cuh"

extern "C" {
#include "../../net/nccl_collective.h"
}

cuda_state cuda_g;

void cuda_fail(const char *file, int line, const char *what, const char *detail)
{
    if (cuda_g.failed) return;
    cuda_g.failed = 1;
    const char *base = strrchr(file, '/');
    cirrus_fail(&cuda_g.err, CIRRUS_EIO, "%s:%d %s -> %s", base ? base + 1 : file, line, what,
                detail);
}

void cuda_finish(const char *op)
{
    if (cuda_g.failed) return;
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess)
        e = cuda_g.device_sync ? cudaDeviceSynchronize() : cudaStreamSynchronize(cuda_g.stream);
    if (e != cudaSuccess) cuda_fail(__FILE__, __LINE__, op, cudaGetErrorString(e));
}

const int32_t *cuda_tokens(const int32_t *host, size_t n)
{
    if (cuda_g.failed) return NULL;
    if (n > cuda_g.tokens_cap) {
        cudaFree(cuda_g.tokens);
        cuda_g.tokens = NULL;
        cuda_g.tokens_cap = 0;
        if (!CUDA_OK(cudaMalloc(&cuda_g.tokens, n * sizeof(int32_t)))) return NULL;
        cuda_g.tokens_cap = n;
    }
    /* cudaMemcpyDefault: the caller's array may be pageable host memory or managed. */
    if (!CUDA_OK(cudaMemcpyAsync(cuda_g.tokens, host, n * sizeof(int32_t), cudaMemcpyDefault,
                                 cuda_g.stream)))
        return NULL;
    return cuda_g.tokens;
}

static void blas_check(cublasStatus_t st, const char *what)
{
    if (st != CUBLAS_STATUS_SUCCESS) cuda_fail(__FILE__, __LINE__, what, cublasGetStatusString(st));
}

/* Row-major C (M,N) = alpha op(A) op(B) + beta C, as cblas_sgemm (and cpu_sgemm) take it.
 * cuBLAS is column-major, where a row-major matrix is its transpose: C^T = op(B)^T op(A)^T,
 * i.e. the same call with the operands swapped. */
static void sgemm(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
                  const float *B, int ldb, float beta, float *C, int ldc)
{
    if (cuda_g.failed) return;
    blas_check(cublasSgemm(cuda_g.blas, tb ? CUBLAS_OP_T : CUBLAS_OP_N,
                           ta ? CUBLAS_OP_T : CUBLAS_OP_N, N, M, K, &alpha, B, ldb, A, lda,
                           &beta, C, ldc),
               "cublasSgemm");
}

static void cuda_sgemm_op(int ta, int tb, int M, int N, int K, float alpha, const float *A,
                          int lda, const float *B, int ldb, float beta, float *C, int ldc)
{
    sgemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    cuda_finish("sgemm");
}

/* Device scratch for the two-pass reductions, kept and grown (ops run one at a time). */
static void *scratch(size_t bytes)
{
    static void *buf;
    static size_t cap;
    if (cuda_g.failed) return NULL;
    if (bytes > cap) {
        cudaFree(buf);
        buf = NULL;
        cap = 0;
        if (!CUDA_OK(cudaMalloc(&buf, bytes))) return NULL;
        cap = bytes;
    }
    return buf;
}

/* ---- column sums in a fixed order ----
 * A thread per column walking all N rows left a GPU nearly idle (C threads, N serial loads:
 * 40% of a GPT-2-shaped step on an H200). Instead the rows go in groups of COL_GROUP_ROWS,
 * a thread per (group, column), then a thread per column adds the groups in order: twice
 * the launches, N/64 times the parallelism, and an order that depends on the shape alone. */

#define COL_GROUP_ROWS 64
#define COL_THREADS 64
#define MAX_GRID_Y 65535

static unsigned col_groups(int N) { return (unsigned)((N + COL_GROUP_ROWS - 1) / COL_GROUP_ROWS); }

static dim3 col_grid(int C, unsigned groups)
{
    return dim3(cuda_blocks((size_t)C, COL_THREADS), groups < MAX_GRID_Y ? groups : MAX_GRID_Y);
}

/* part[g][c] = sum of x[n][c] over the rows of group g, in row order. */
__global__ void col_partial_kernel(float *part, const float *x, int N, int C, unsigned groups)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    for (unsigned g = blockIdx.y; g < groups; g += gridDim.y) {
        int lo = (int)g * COL_GROUP_ROWS, hi = min(N, lo + COL_GROUP_ROWS);
        float s = 0.0f;
        for (int n = lo; n < hi; n++) s += x[(size_t)n * C + c];
        part[(size_t)g * C + c] = s;
    }
}

/* acc[c] += the groups' sums, in group order. */
__global__ void col_finish_kernel(float *acc, const float *part, unsigned groups, int C)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float s = 0.0f;
    for (unsigned g = 0; g < groups; g++) s += part[(size_t)g * C + c];
    acc[c] += s;
}

/* acc (C) += the column sums of x (N,C). */
static void column_sums_add(float *acc, const float *x, int N, int C)
{
    if (N <= 0 || C <= 0) return; /* nothing to add, and a grid of 0 blocks is an error */
    unsigned groups = col_groups(N);
    float *part = (float *)scratch((size_t)groups * C * sizeof(float));
    if (!part) return;
    col_partial_kernel<<<col_grid(C, groups), COL_THREADS, 0, cuda_g.stream>>>(part, x, N, C,
                                                                               groups);
    col_finish_kernel<<<cuda_blocks((size_t)C, COL_THREADS), COL_THREADS, 0, cuda_g.stream>>>(
        acc, part, groups, C);
}

/* ---- memory ---- */

static float *cuda_alloc(size_t n)
{
    float *p = NULL;
    size_t bytes = (n ? n : 1) * sizeof(float);
    if (cudaMallocManaged(&p, bytes, cudaMemAttachGlobal) != cudaSuccess) {
        cudaGetLastError(); /* out of memory is the caller's ENOMEM, not a device failure */
        return NULL;
    }
    if (!CUDA_OK(cudaMemset(p, 0, bytes)) || !CUDA_OK(cudaDeviceSynchronize())) {
        cudaFree(p);
        return NULL;
    }
    return p;
}

static void cuda_free(float *p)
{
    if (p) cudaFree(p);
}

static int cuda_status(cirrus_error *err)
{
    if (!cuda_g.failed) return 0;
    if (err) *err = cuda_g.err;
    return cuda_g.err.code;
}

/* ---- embeddings ---- */

__global__ void encoder_forward_kernel(float *out, const int32_t *tok, const float *wte,
                                       const float *wpe, int N, int T, int C)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)N * C) return;
    int bt = (int)(i / C), c = (int)(i % C);
    out[i] = wte[(size_t)tok[bt] * C + c] + wpe[(size_t)(bt % T) * C + c];
}

/* dwte: a thread per (token value, channel), walking that value's positions in row order
 * (the host lists them: a stable counting sort), so repeated tokens add in the CPU's order
 * and no two threads touch the same element. */
__global__ void encoder_backward_wte_kernel(float *dwte, const float *dout, const int32_t *pos,
                                            const int32_t *start, int V, int C)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)V * C) return;
    const int v = (int)(i / C), c = (int)(i % C);
    float acc = dwte[i];
    for (int k = start[v]; k < start[v + 1]; k++) acc += dout[(size_t)pos[k] * C + c];
    dwte[i] = acc;
}

/* dwpe: a thread per (position, channel), the sequences in order. */
__global__ void encoder_backward_wpe_kernel(float *dwpe, const float *dout, int B, int T, int C)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)T * C) return;
    float acc = dwpe[i];
    for (int b = 0; b < B; b++) acc += dout[(size_t)b * T * C + i];
    dwpe[i] = acc;
}

static void cuda_encoder_forward(float *out, const int32_t *tokens, const float *wte,
                                 const float *wpe, int B, int T, int C)
{
    const int32_t *tok = cuda_tokens(tokens, (size_t)B * T);
    if (!tok) return;
    size_t n = (size_t)B * T * C;
    encoder_forward_kernel<<<cuda_blocks(n, CUDA_ELEM_THREADS), CUDA_ELEM_THREADS, 0,
                             cuda_g.stream>>>(out, tok, wte, wpe, B * T, T, C);
    cuda_finish("encoder_forward");
}

static void cuda_encoder_backward(float *dwte, float *dwpe, const float *dout,
                                  const int32_t *tokens, int B, int T, int C)
{
    if (cuda_g.failed || B <= 0 || T <= 0 || C <= 0) return;
    const int N = B * T;
    int V = 0; /* tokens were checked against the vocabulary before they got here */
    for (int i = 0; i < N; i++) V = tokens[i] >= V ? tokens[i] + 1 : V;
    int32_t *list = (int32_t *)malloc(sizeof(int32_t) * ((size_t)N + V + 1));
    if (!list) {
        cuda_fail(__FILE__, __LINE__, "encoder_backward", "out of host memory");
        return;
    }
    int32_t *start = list + N; /* start[v]..start[v+1]: where value v's positions are */
    memset(start, 0, sizeof(int32_t) * ((size_t)V + 1));
    for (int i = 0; i < N; i++) start[tokens[i] + 1]++;
    for (int v = 0; v < V; v++) start[v + 1] += start[v];
    for (int i = 0; i < N; i++) list[start[tokens[i]]++] = i;
    for (int v = V; v > 0; v--) start[v] = start[v - 1]; /* undo the fill's advance */
    start[0] = 0;
    int32_t *dev = (int32_t *)scratch(sizeof(int32_t) * ((size_t)N + V + 1));
    if (dev && CUDA_OK(cudaMemcpyAsync(dev, list, sizeof(int32_t) * ((size_t)N + V + 1),
                                       cudaMemcpyHostToDevice, cuda_g.stream))) {
        size_t nw = (size_t)V * C, np = (size_t)T * C;
        encoder_backward_wte_kernel<<<cuda_blocks(nw, CUDA_ELEM_THREADS), CUDA_ELEM_THREADS, 0,
                                      cuda_g.stream>>>(dwte, dout, dev, dev + N, V, C);
        encoder_backward_wpe_kernel<<<cuda_blocks(np, CUDA_ELEM_THREADS), CUDA_ELEM_THREADS, 0,
                                      cuda_g.stream>>>(dwpe, dout, B, T, C);
    }
    cuda_finish("encoder_backward"); /* before the host buffer goes: the copy reads it */
    free(list);
}

/* ---- LayerNorm ---- */

__global__ void layernorm_forward_kernel(float *out, float *mean, float *rstd, const float *inp,
                                         const float *w, const float *b, int C)
{
    __shared__ float sh[CUDA_ROW_THREADS];
    const size_t row = blockIdx.x;
    const float *x = inp + row * C;
    float s = 0.0f;
    for (int c = threadIdx.x; c < C; c += CUDA_ROW_THREADS) s += x[c];
    const float m = cuda_block_sum(s, sh) / (float)C;
    float v = 0.0f;
    for (int c = threadIdx.x; c < C; c += CUDA_ROW_THREADS) v += (x[c] - m) * (x[c] - m);
    const float r = 1.0f / sqrtf(cuda_block_sum(v, sh) / (float)C + 1e-5f);
    float *o = out + row * C;
    for (int c = threadIdx.x; c < C; c += CUDA_ROW_THREADS) o[c] = (x[c] - m) * r * w[c] + b[c];
    if (threadIdx.x == 0) {
        mean[row] = m;
        rstd[row] = r;
    }
}

__global__ void layernorm_backward_rows_kernel(float *dinp, const float *dout, const float *inp,
                                               const float *w, const float *mean,
                                               const float *rstd, int C)
{
    __shared__ float sh[CUDA_ROW_THREADS];
    const size_t row = blockIdx.x;
    const float *x = inp + row * C, *d = dout + row * C;
    const float m = mean[row], s = rstd[row];
    float dm = 0.0f, dnn = 0.0f;
    for (int c = threadIdx.x; c < C; c += CUDA_ROW_THREADS) {
        float dn = d[c] * w[c];
        dm += dn;
        dnn += dn * (x[c] - m) * s;
    }
    dm = cuda_block_sum(dm, sh) / (float)C;
    dnn = cuda_block_sum(dnn, sh) / (float)C;
    float *di = dinp + row * C;
    for (int c = threadIdx.x; c < C; c += CUDA_ROW_THREADS) {
        float norm = (x[c] - m) * s;
        di[c] += (d[c] * w[c] - dm - norm * dnn) * s;
    }
}

/* Parameter gradients, first pass: per group of rows (see column_sums_add), in row order. */
__global__ void layernorm_backward_cols_kernel(float *pw, float *pb, const float *dout,
                                               const float *inp, const float *mean,
                                               const float *rstd, int N, int C, unsigned groups)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    for (unsigned g = blockIdx.y; g < groups; g += gridDim.y) {
        int lo = (int)g * COL_GROUP_ROWS, hi = min(N, lo + COL_GROUP_ROWS);
        float aw = 0.0f, ab = 0.0f;
        for (int n = lo; n < hi; n++) {
            float d = dout[(size_t)n * C + c];
            aw += d * (inp[(size_t)n * C + c] - mean[n]) * rstd[n];
            ab += d;
        }
        pw[(size_t)g * C + c] = aw;
        pb[(size_t)g * C + c] = ab;
    }
}

static void cuda_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                                   const float *w, const float *b, int N, int C)
{
    if (cuda_g.failed) return;
    layernorm_forward_kernel<<<N, CUDA_ROW_THREADS, 0, cuda_g.stream>>>(out, mean, rstd, inp,
                                                                         w, b, C);
    cuda_finish("layernorm_forward");
}

static void cuda_layernorm_backward(float *dinp, float *dw, float *db, const float *dout,
                                    const float *inp, const float *w, const float *mean,
                                    const float *rstd, int N, int C)
{
    if (cuda_g.failed || N <= 0 || C <= 0) return;
    layernorm_backward_rows_kernel<<<N, CUDA_ROW_THREADS, 0, cuda_g.stream>>>(
        dinp, dout, inp, w, mean, rstd, C);
    unsigned groups = col_groups(N);
    float *pw = (float *)scratch(2 * (size_t)groups * C * sizeof(float));
    if (pw) {
        float *pb = pw + (size_t)groups * C;
        dim3 grid = col_grid(C, groups), fin(cuda_blocks((size_t)C, COL_THREADS));
        layernorm_backward_cols_kernel<<<grid, COL_THREADS, 0, cuda_g.stream>>>(
            pw, pb, dout, inp, mean, rstd, N, C, groups);
        col_finish_kernel<<<fin, COL_THREADS, 0, cuda_g.stream>>>(dw, pw, groups, C);
        col_finish_kernel<<<fin, COL_THREADS, 0, cuda_g.stream>>>(db, pb, groups, C);
    }
    cuda_finish("layernorm_backward");
}

/* ---- linear layers and the tied head ---- */

/* out = base + bias, elementwise (out may be base): the product is then added with beta 1. */
__global__ void seed_kernel(float *out, const float *base, const float *bias, int N, int OC)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)N * OC) return;
    out[i] = (base ? base[i] : 0.0f) + (bias ? bias[i % OC] : 0.0f);
}

static void cuda_matmul_forward(float *out, const float *base, const float *inp, const float *w,
                                const float *bias, int N, int IC, int OC)
{
    if (cuda_g.failed) return;
    size_t n = (size_t)N * OC;
    seed_kernel<<<cuda_blocks(n, CUDA_ELEM_THREADS), CUDA_ELEM_THREADS, 0, cuda_g.stream>>>(
        out, base, bias, N, OC);
    sgemm(0, 1, N, OC, IC, 1.0f, inp, IC, w, IC, 1.0f, out, OC);
    cuda_finish("matmul_forward");
}

static void cuda_matmul_backward(float *dinp, int accumulate, float *dw, float *dbias,
                                 const float *dout, const float *inp, const float *w, int N,
                                 int IC, int OC)
{
    if (cuda_g.failed) return;
    sgemm(0, 0, N, IC, OC, 1.0f, dout, OC, w, IC, accumulate ? 1.0f : 0.0f, dinp, IC);
    sgemm(1, 0, OC, IC, N, 1.0f, dout, OC, inp, IC, 1.0f, dw, IC);
    if (dbias) column_sums_add(dbias, dout, N, OC);
    cuda_finish("matmul_backward");
}

static void cuda_head_forward(float *logits, const float *inp, const float *wte, int N, int C,
                              int V)
{
    sgemm(0, 1, N, V, C, 1.0f, inp, C, wte, C, 0.0f, logits, V);
    cuda_finish("head_forward");
}

static void cuda_head_backward(float *dinp, float *dwte, const float *dlogits, const float *inp,
                               const float *wte, int N, int C, int V)
{
    sgemm(0, 0, N, C, V, 1.0f, dlogits, V, wte, C, 0.0f, dinp, C);
    sgemm(1, 0, V, C, N, 1.0f, dlogits, V, inp, C, 1.0f, dwte, C);
    cuda_finish("head_backward");
}

/* ---- GELU (tanh approximation) ---- */

#define GELU_K 0.7978845608028654f /* sqrt(2/pi) */
#define GELU_A 0.044715f

__global__ void gelu_forward_kernel(float *out, const float *inp, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float x = inp[i];
    out[i] = 0.5f * x * (1.0f + tanhf(GELU_K * (x + GELU_A * x * x * x)));
}

/* dinp may be dout (the stage runs it in place): each thread reads before it writes. */
__global__ void gelu_backward_kernel(float *dinp, const float *inp, const float *dout, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float x = inp[i];
    float th = tanhf(GELU_K * (x + GELU_A * x * x * x));
    float du = GELU_K * (1.0f + 3.0f * GELU_A * x * x);
    dinp[i] = dout[i] * (0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * du);
}

static void cuda_gelu_forward(float *out, const float *inp, int n)
{
    if (cuda_g.failed) return;
    gelu_forward_kernel<<<cuda_blocks((size_t)n, CUDA_ELEM_THREADS), CUDA_ELEM_THREADS, 0,
                          cuda_g.stream>>>(out, inp, n);
    cuda_finish("gelu_forward");
}

static void cuda_gelu_backward(float *dinp, const float *inp, const float *dout, int n)
{
    if (cuda_g.failed) return;
    gelu_backward_kernel<<<cuda_blocks((size_t)n, CUDA_ELEM_THREADS), CUDA_ELEM_THREADS, 0,
                           cuda_g.stream>>>(dinp, inp, dout, n);
    cuda_finish("gelu_backward");
}

/* ---- cross-entropy over the vocabulary ---- */

__global__ void crossentropy_forward_kernel(float *probs, float *losses, const float *logits,
                                            const int32_t *targets, int V)
{
    __shared__ float sh[CUDA_ROW_THREADS];
    const size_t row = blockIdx.x;
    const float *l = logits + row * V;
    float *p = probs + row * V;
    float mx = -INFINITY;
    for (int v = threadIdx.x; v < V; v += CUDA_ROW_THREADS) mx = fmaxf(mx, l[v]);
    mx = cuda_block_max(mx, sh);
    float s = 0.0f;
    for (int v = threadIdx.x; v < V; v += CUDA_ROW_THREADS) {
        p[v] = expf(l[v] - mx);
        s += p[v];
    }
    const float inv = 1.0f / cuda_block_sum(s, sh);
    for (int v = threadIdx.x; v < V; v += CUDA_ROW_THREADS) p[v] *= inv;
    __syncthreads();
    if (threadIdx.x == 0) {
        /* A probability that underflowed to 0 would give an infinite loss; clamp it. */
        float pt = p[targets[row]];
        losses[row] = -logf(pt > 1e-30f ? pt : 1e-30f);
    }
}

__global__ void crossentropy_backward_kernel(float *dlogits, const float *probs,
                                             const int32_t *targets, float dloss, int N, int V)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)N * V) return;
    int n = (int)(i / V), v = (int)(i % V);
    float d = probs[i] * dloss;
    dlogits[i] = v == targets[n] ? d - dloss : d;
}

static void cuda_crossentropy_forward(float *probs, float *losses, const float *logits,
                                      const int32_t *targets, int N, int V)
{
    const int32_t *tgt = cuda_tokens(targets, (size_t)N);
    if (!tgt) return;
    crossentropy_forward_kernel<<<N, CUDA_ROW_THREADS, 0, cuda_g.stream>>>(probs, losses,
                                                                            logits, tgt, V);
    cuda_finish("crossentropy_forward");
}

static void cuda_crossentropy_backward(float *dlogits, const float *probs,
                                       const int32_t *targets, float dloss, int N, int V)
{
    const int32_t *tgt = cuda_tokens(targets, (size_t)N);
    if (!tgt) return;
    size_t n = (size_t)N * V;
    crossentropy_backward_kernel<<<cuda_blocks(n, CUDA_ELEM_THREADS), CUDA_ELEM_THREADS, 0,
                                   cuda_g.stream>>>(dlogits, probs, tgt, dloss, N, V);
    cuda_finish("crossentropy_backward");
}

/* ---- start-up ---- */

static ops_backend cuda_backend;

static void fill_table(ops_backend *b)
{
    b->name = "cuda";
    b->alloc = cuda_alloc;
    b->free = cuda_free;
    b->status = cuda_status;
    b->encoder_forward = cuda_encoder_forward;
    b->encoder_backward = cuda_encoder_backward;
    b->layernorm_forward = cuda_layernorm_forward;
    b->layernorm_backward = cuda_layernorm_backward;
    b->matmul_forward = cuda_matmul_forward;
    b->matmul_backward = cuda_matmul_backward;
    b->attention_forward = cuda_attention_forward;
    b->attention_backward = cuda_attention_backward;
    b->gelu_forward = cuda_gelu_forward;
    b->gelu_backward = cuda_gelu_backward;
    b->crossentropy_forward = cuda_crossentropy_forward;
    b->crossentropy_backward = cuda_crossentropy_backward;
    b->head_forward = cuda_head_forward;
    b->head_backward = cuda_head_backward;
    b->sgemm = cuda_sgemm_op;
    cuda_optim_codec_fill(b);
    b->device_collective_id = nccl_collective_id;
    b->device_collective_new = nccl_collective_new;
}

extern "C" int ops_cuda_open(const ops_backend **out, cirrus_error *err)
{
    *out = NULL;
    if (cuda_g.ready) {
        *out = &cuda_backend;
        return 0;
    }
    /* Without a driver the runtime answers cudaErrorInsufficientDriver (35) and leaves the
     * count unwritten, so it starts at 0 and the error is looked at first. */
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e == cudaErrorInsufficientDriver)
        return cirrus_fail(err, CIRRUS_EIO,
                           "--backend cuda: no usable NVIDIA driver (none installed, or older "
                           "than CUDA %d.%d needs): %s",
                           CUDART_VERSION / 1000, CUDART_VERSION % 1000 / 10,
                           cudaGetErrorString(e));
    if (e == cudaErrorNoDevice || (e == cudaSuccess && count == 0))
        return cirrus_fail(err, CIRRUS_EIO, "--backend cuda: the driver sees no CUDA device");
    if (e != cudaSuccess)
        return cirrus_fail(err, CIRRUS_EIO, "--backend cuda: cannot start CUDA: %s",
                           cudaGetErrorString(e));
    int managed = 0, concurrent = 0;
    cudaDeviceProp prop;
    if ((e = cudaSetDevice(0)) != cudaSuccess ||
        (e = cudaGetDeviceProperties(&prop, 0)) != cudaSuccess ||
        (e = cudaDeviceGetAttribute(&managed, cudaDevAttrManagedMemory, 0)) != cudaSuccess ||
        (e = cudaDeviceGetAttribute(&concurrent, cudaDevAttrConcurrentManagedAccess, 0)) !=
            cudaSuccess)
        return cirrus_fail(err, CIRRUS_EIO, "--backend cuda: cannot use device 0: %s",
                           cudaGetErrorString(e));
    if (!managed)
        return cirrus_fail(err, CIRRUS_EIO, "--backend cuda: device 0 (%s) has no managed memory",
                           prop.name);
    cuda_g.device_sync = !concurrent;
    if ((e = cudaStreamCreateWithFlags(&cuda_g.stream, cudaStreamNonBlocking)) != cudaSuccess)
        return cirrus_fail(err, CIRRUS_EIO, "--backend cuda: cannot create a stream: %s",
                           cudaGetErrorString(e));
    cublasStatus_t st = cublasCreate(&cuda_g.blas);
    if (st != CUBLAS_STATUS_SUCCESS) {
        cudaStreamDestroy(cuda_g.stream);
        return cirrus_fail(err, CIRRUS_EIO, "--backend cuda: cannot start cuBLAS: %s",
                           cublasGetStatusString(st));
    }
    /* fp32 as written: no TF32 tensor-core rounding, so the CPU equivalence holds. */
    cublasSetStream(cuda_g.blas, cuda_g.stream);
    cublasSetMathMode(cuda_g.blas, CUBLAS_PEDANTIC_MATH);
    fill_table(&cuda_backend);
    cuda_g.ready = 1;
    *out = &cuda_backend;
    return 0;
}
