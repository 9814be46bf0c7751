/* optim_codec: the CUDA versions of the gradient's sum of squares, the AdamW update and the
 * q8 activation codec (ops.h), each giving the same bits as the CPU's.
 *
 * That is why this file alone is compiled with -fmad=false (cuda.mk): nvcc otherwise fuses
 * a*b + c into one FMA with a single rounding, while the CPU code (-std=c11: GCC does not
 * contract) rounds the product and the sum separately. Division and sqrtf are IEEE-rounded
 * by default (-prec-div, -prec-sqrt), as on the CPU. The arithmetic below is written in the
 * CPU's order, operation for operation.
 */
#include <math.h>

#include "cuda_internal.cuh"

extern "C" {
#include "../../codec/q8_format.h"
}

/* ---- sum of squares: one thread per chunk, in index order; the host adds the chunks ---- */

__global__ void sumsq_chunks_kernel(double *part, const float *x, size_t n, float scale,
                                    size_t nchunks)
{
    size_t c = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= nchunks) return;
    size_t lo = c * OPS_SUMSQ_CHUNK, hi = lo + OPS_SUMSQ_CHUNK < n ? lo + OPS_SUMSQ_CHUNK : n;
    double s = 0.0;
    for (size_t i = lo; i < hi; i++) {
        float g = x[i] * scale;
        s += (double)g * g;
    }
    part[c] = s;
}

static double cuda_sumsq(const float *x, size_t n, float scale)
{
    size_t nchunks = (n + OPS_SUMSQ_CHUNK - 1) / OPS_SUMSQ_CHUNK;
    if (cuda_g.failed || nchunks == 0) return 0.0;
    double *part = NULL;
    if (!CUDA_OK(cudaMallocManaged(&part, nchunks * sizeof(double), cudaMemAttachGlobal)))
        return NAN; /* the sticky error stops the step; NaN keeps it from looking normal */
    sumsq_chunks_kernel<<<cuda_blocks(nchunks, 64), 64, 0, cuda_g.stream>>>(part, x, n, scale,
                                                                             nchunks);
    cuda_finish("sumsq");
    double total = 0.0;
    if (!cuda_g.failed)
        for (size_t c = 0; c < nchunks; c++) total += part[c];
    cudaFree(part);
    return cuda_g.failed ? NAN : total;
}

/* ---- AdamW: elementwise, the CPU's expressions ---- */

__global__ void adamw_kernel(float *p, float *g, float *m, float *v, size_t n,
                             ops_adamw_args a)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float gi = g[i] * a.grad_scale;
    g[i] = 0.0f;
    m[i] = a.beta1 * m[i] + (1.0f - a.beta1) * gi;
    v[i] = a.beta2 * v[i] + (1.0f - a.beta2) * gi * gi;
    float mhat = m[i] / a.bc1, vhat = v[i] / a.bc2;
    p[i] -= a.lr * (mhat / (sqrtf(vhat) + a.eps) + a.weight_decay * p[i]);
}

static void cuda_adamw_update(float *p, float *g, float *m, float *v, size_t n,
                              const ops_adamw_args *a)
{
    if (cuda_g.failed || n == 0) return;
    adamw_kernel<<<cuda_blocks(n, CUDA_ELEM_THREADS), CUDA_ELEM_THREADS, 0, cuda_g.stream>>>(
        p, g, m, v, n, *a);
    cuda_finish("adamw_update");
}

/* ---- q8: one thread per block, the reference's arithmetic (codec/q8.c) ---- */

__device__ static void put_scale(uint8_t *o, float s)
{
    uint32_t b = __float_as_uint(s); /* little-endian, as the CPU's memcpy on x86/arm */
    for (int k = 0; k < 4; k++) o[k] = (uint8_t)(b >> (8 * k));
}

__device__ static float get_scale(const uint8_t *in)
{
    return __uint_as_float((uint32_t)in[0] | (uint32_t)in[1] << 8 | (uint32_t)in[2] << 16 |
                           (uint32_t)in[3] << 24);
}

/* *bad = 1 if any input is NaN or Inf (every writer stores the same 1: no order matters). */
__global__ void q8_encode_kernel(uint8_t *out, const float *x, size_t n, size_t nblocks, int *bad)
{
    size_t blk = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (blk >= nblocks) return;
    size_t b = blk * CODEC_Q8_BLOCK;
    size_t len = n - b < CODEC_Q8_BLOCK ? n - b : CODEC_Q8_BLOCK;
    const float *xb = x + b;
    float absmax = 0.0f;
    for (size_t i = 0; i < len; i++) {
        if (!isfinite(xb[i])) {
            *bad = 1;
            return;
        }
        float a = fabsf(xb[i]);
        if (a > absmax) absmax = a;
    }
    float pre = absmax < Q8_TINY ? Q8_PRE : 1.0f;
    float inv = absmax > 0.0f ? 127.0f / (absmax * pre) : 0.0f;
    float scale = absmax / 127.0f;
    if (scale > Q8_SCALE_MAX) scale = Q8_SCALE_MAX;
    uint8_t *o = out + blk * Q8_BLOCK_BYTES;
    put_scale(o, scale);
    for (size_t i = 0; i < len; i++) {
        float r = roundf((xb[i] * pre) * inv);
        if (r > 127.0f) r = 127.0f;
        if (r < -127.0f) r = -127.0f;
        o[Q8_SCALE_BYTES + i] = (uint8_t)(int8_t)r;
    }
}

/* *bad = 1 for a scale or a code the encoder cannot produce (see q8.c's decoder). */
__global__ void q8_decode_kernel(float *out, size_t n, const uint8_t *in, size_t nblocks, int *bad)
{
    size_t blk = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (blk >= nblocks) return;
    size_t b = blk * CODEC_Q8_BLOCK;
    size_t len = n - b < CODEC_Q8_BLOCK ? n - b : CODEC_Q8_BLOCK;
    const uint8_t *ib = in + blk * Q8_BLOCK_BYTES;
    float scale = get_scale(ib);
    if (!isfinite(scale) || signbit(scale) || scale > Q8_SCALE_MAX) {
        *bad = 1;
        return;
    }
    for (size_t i = 0; i < len; i++) {
        int8_t q = (int8_t)ib[Q8_SCALE_BYTES + i];
        if (q == -128) {
            *bad = 1;
            return;
        }
        out[b + i] = (float)q * scale;
    }
}

/* A flag the kernels set, read back after they finish; -1 after a device error. */
static int run_flagged(int which, void *out, const void *in, size_t n)
{
    size_t nblocks = (n + CODEC_Q8_BLOCK - 1) / CODEC_Q8_BLOCK;
    if (cuda_g.failed) return -1;
    if (nblocks == 0) return 0;
    int *bad = NULL;
    if (!CUDA_OK(cudaMallocManaged(&bad, sizeof(int), cudaMemAttachGlobal))) return -1;
    *bad = 0;
    unsigned grid = cuda_blocks(nblocks, 128);
    if (which == 0)
        q8_encode_kernel<<<grid, 128, 0, cuda_g.stream>>>((uint8_t *)out, (const float *)in, n,
                                                          nblocks, bad);
    else
        q8_decode_kernel<<<grid, 128, 0, cuda_g.stream>>>((float *)out, n, (const uint8_t *)in,
                                                          nblocks, bad);
    cuda_finish(which == 0 ? "q8_encode" : "q8_decode");
    int r = cuda_g.failed ? -1 : *bad;
    cudaFree(bad);
    return r;
}

static int cuda_q8_encode(uint8_t *out, const float *x, size_t n)
{
    int r = run_flagged(0, out, x, n);
    return r < 0 ? CIRRUS_EIO : r ? CIRRUS_EINVAL : 0;
}

static int cuda_q8_decode(float *out, size_t n, const uint8_t *in, size_t in_len)
{
    /* Lengths first, on the host, exactly as the CPU decoder checks them. */
    if (n > SIZE_MAX / sizeof(float) || in_len != codec_q8_encoded_size(n)) return CIRRUS_ECORRUPT;
    int r = run_flagged(1, out, in, n);
    return r < 0 ? CIRRUS_EIO : r ? CIRRUS_ECORRUPT : 0;
}

void cuda_optim_codec_fill(ops_backend *b)
{
    b->sumsq = cuda_sumsq;
    b->adamw_update = cuda_adamw_update;
    b->q8_encode = cuda_q8_encode;
    b->q8_decode = cuda_q8_decode;
}
