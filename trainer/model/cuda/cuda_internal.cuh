/* cuda_internal: what the CUDA backend's .cu files share: the device state (one stream, one
 * cuBLAS handle), the sticky first error, and a fixed-order block reduction.
 */
#ifndef CIRRUS_CUDA_INTERNAL_CUH
#define CIRRUS_CUDA_INTERNAL_CUH

#include <cublas_v2.h>
#include <cuda_runtime.h>

extern "C" {
#include "ops_cuda.h"
}

/* Threads per block of every row-wise kernel. Fixed (never derived from the device) so the
 * reduction trees, and so the results, are the same on every GPU. */
#define CUDA_ROW_THREADS 256
#define CUDA_ELEM_THREADS 256

struct cuda_state {
    int ready;
    cudaStream_t stream;
    cublasHandle_t blas;
    /* Without concurrent managed access (pre-Pascal, Windows) the host may touch no managed
     * memory while any kernel runs, so a stream's sync is not enough: the whole device's. */
    int device_sync;
    int32_t *tokens; /* device copy of the last token/target array */
    size_t tokens_cap;
    int failed;      /* sticky: the first error, in err */
    cirrus_error err;
};
extern cuda_state cuda_g;

/* Record the first failure as `file:line what -> detail` (later ones are its consequences). */
void cuda_fail(const char *file, int line, const char *what, const char *detail);
static inline int cuda_ok(cudaError_t e, const char *file, int line, const char *what)
{
    if (e == cudaSuccess) return 1;
    cuda_fail(file, line, what, cudaGetErrorString(e));
    return 0;
}
/* 1 on success; otherwise records the error and gives 0. */
#define CUDA_OK(call) cuda_ok((call), __FILE__, __LINE__, #call)
/* After a kernel launch or a sequence of them: launch errors, then completion (every op
 * ends with the host able to read what it wrote: managed memory and no overlap yet). */
void cuda_finish(const char *op);
/* A device copy of n int32 values from host (or managed) memory; NULL after an error. */
const int32_t *cuda_tokens(const int32_t *host, size_t n);

static inline unsigned cuda_blocks(size_t n, unsigned threads)
{
    return (unsigned)((n + threads - 1) / threads);
}

/* Sum of v over the block, in a fixed tree order; every thread gets the result. blockDim.x
 * must be CUDA_ROW_THREADS. */
__device__ __forceinline__ float cuda_block_sum(float v, float *shared)
{
    shared[threadIdx.x] = v;
    __syncthreads();
    for (int s = CUDA_ROW_THREADS / 2; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s) shared[threadIdx.x] += shared[threadIdx.x + s];
        __syncthreads();
    }
    float r = shared[0];
    __syncthreads();
    return r;
}

__device__ __forceinline__ float cuda_block_max(float v, float *shared)
{
    shared[threadIdx.x] = v;
    __syncthreads();
    for (int s = CUDA_ROW_THREADS / 2; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s)
            shared[threadIdx.x] = fmaxf(shared[threadIdx.x], shared[threadIdx.x + s]);
        __syncthreads();
    }
    float r = shared[0];
    __syncthreads();
    return r;
}

/* optim_codec.cu: fills the fold, sumsq, adamw_update and q8 entries of the table. */
void cuda_optim_codec_fill(ops_backend *b);

/* attention.cu */
void cuda_attention_forward(float *out, float *att, const float *qkv, int B, int T, int C,
                            int NH);
void cuda_attention_backward(float *dqkv, float *datt, const float *dout, const float *qkv,
                             const float *att, int B, int T, int C, int NH);

#endif
