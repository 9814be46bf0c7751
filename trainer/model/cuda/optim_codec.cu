/* optim_codec: the CUDA versions of the tied gradients' fold, the gradient's sum of squares,
 * the AdamW update and the q8 activation codec (ops.h), each giving the same bits as the
 * CPU's.
 *
 * That is why this file alone is compiled with -fmad=false (cuda.mk): nvcc otherwise fuses
 * a*b + c into one FMA with a single rounding, while the CPU code (-std=c11: GCC does not
 * contract) rounds the product and the sum separately. Division and sqrtf are IEEE-rounded
 * by default (-prec-div, -prec-sqrt), as on the CPU. The arithmetic below is written in the
 * CPU's order, operation for operation.
 */
#include <math.h>
#include <string.h>

#include "cuda_internal.cuh"

extern "C" {
#include "../../codec/q8_format.h"
}

/* ---- sum of squares: one thread per chunk, in index order; the host adds the chunks ----
 *
 * The CPU's definition fixes the order within a chunk (a serial double sum), so a chunk is
 * one thread's work. Each thread loads 32 floats before adding them, so that a warp has
 * whole cache lines in flight rather than one load at a time; and every tensor of the
 * optimizer's step goes in one launch (sumsq_many): a launch and a copy back per tensor,
 * ~150 of them at GPT-2's shape, cost more than the sums. */

#define SUMSQ_LOADS 32

__global__ void sumsq_chunks_kernel(double *part, const float *x, const size_t *lo,
                                    const unsigned *len, size_t nchunks, float scale)
{
    size_t c = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= nchunks) return;
    const float *p = x + lo[c];
    const unsigned n = len[c];
    unsigned i = 0;
    double s = 0.0;
    for (; i + SUMSQ_LOADS <= n; i += SUMSQ_LOADS) {
        float v[SUMSQ_LOADS];
#pragma unroll
        for (int k = 0; k < SUMSQ_LOADS; k++) v[k] = p[i + k];
#pragma unroll
        for (int k = 0; k < SUMSQ_LOADS; k++) {
            float g = v[k] * scale;
            s += (double)g * g;
        }
    }
    for (; i < n; i++) {
        float g = p[i] * scale;
        s += (double)g * g;
    }
    part[c] = s;
}

/* The chunk table (start, length) and the partials, on the device and pinned on the host;
 * kept and grown, since an allocation per call cost ~1 ms. */
static struct {
    size_t cap;
    size_t *lo, *lo_host;
    unsigned *len, *len_host;
    double *part, *part_host;
} sq;

static int sumsq_reserve(size_t nchunks)
{
    if (nchunks <= sq.cap) return 1;
    cudaFree(sq.lo);
    cudaFree(sq.len);
    cudaFree(sq.part);
    cudaFreeHost(sq.lo_host);
    cudaFreeHost(sq.len_host);
    cudaFreeHost(sq.part_host);
    memset(&sq, 0, sizeof sq);
    if (!CUDA_OK(cudaMalloc(&sq.lo, nchunks * sizeof *sq.lo)) ||
        !CUDA_OK(cudaMalloc(&sq.len, nchunks * sizeof *sq.len)) ||
        !CUDA_OK(cudaMalloc(&sq.part, nchunks * sizeof *sq.part)) ||
        !CUDA_OK(cudaMallocHost(&sq.lo_host, nchunks * sizeof *sq.lo_host)) ||
        !CUDA_OK(cudaMallocHost(&sq.len_host, nchunks * sizeof *sq.len_host)) ||
        !CUDA_OK(cudaMallocHost(&sq.part_host, nchunks * sizeof *sq.part_host)))
        return 0;
    sq.cap = nchunks;
    return 1;
}

static void cuda_sumsq_many(const float *base, const size_t *offset, const size_t *count,
                            int n, float scale, double *out)
{
    size_t nchunks = 0;
    for (int t = 0; t < n; t++) nchunks += (count[t] + OPS_SUMSQ_CHUNK - 1) / OPS_SUMSQ_CHUNK;
    /* NaN after a failure: the sticky error stops the step, NaN keeps it from looking
     * normal meanwhile. */
    if (cuda_g.failed || (nchunks && !sumsq_reserve(nchunks))) {
        for (int t = 0; t < n; t++) out[t] = NAN;
        return;
    }
    size_t c = 0;
    for (int t = 0; t < n; t++)
        for (size_t lo = 0; lo < count[t]; lo += OPS_SUMSQ_CHUNK, c++) {
            sq.lo_host[c] = offset[t] + lo;
            sq.len_host[c] = (unsigned)(count[t] - lo < OPS_SUMSQ_CHUNK ? count[t] - lo
                                                                         : OPS_SUMSQ_CHUNK);
        }
    if (nchunks) {
        CUDA_OK(cudaMemcpyAsync(sq.lo, sq.lo_host, nchunks * sizeof *sq.lo,
                                cudaMemcpyHostToDevice, cuda_g.stream));
        CUDA_OK(cudaMemcpyAsync(sq.len, sq.len_host, nchunks * sizeof *sq.len,
                                cudaMemcpyHostToDevice, cuda_g.stream));
        sumsq_chunks_kernel<<<cuda_blocks(nchunks, 64), 64, 0, cuda_g.stream>>>(
            sq.part, base, sq.lo, sq.len, nchunks, scale);
        CUDA_OK(cudaMemcpyAsync(sq.part_host, sq.part, nchunks * sizeof *sq.part,
                                cudaMemcpyDeviceToHost, cuda_g.stream));
        cuda_finish("sumsq");
    }
    c = 0;
    for (int t = 0; t < n; t++) { /* each tensor's chunks in index order, as the CPU */
        double total = 0.0;
        for (size_t lo = 0; lo < count[t]; lo += OPS_SUMSQ_CHUNK) total += sq.part_host[c++];
        out[t] = cuda_g.failed ? NAN : total;
    }
}

static double cuda_sumsq(const float *x, size_t n, float scale)
{
    const size_t zero = 0;
    double total;
    cuda_sumsq_many(x, &zero, &n, 1, scale, &total);
    return total;
}

/* ---- the tied head's gradient into the embedding's ---- */

__global__ void fold_kernel(float *dst, float *src, size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    dst[i] += src[i];
    src[i] = 0.0f;
}

static void cuda_fold(float *dst, float *src, size_t n)
{
    if (cuda_g.failed || n == 0) return;
    fold_kernel<<<cuda_blocks(n, CUDA_ELEM_THREADS), CUDA_ELEM_THREADS, 0, cuda_g.stream>>>(
        dst, src, n);
    cuda_finish("fold");
}

/* ---- AdamW: elementwise, the CPU's expressions ---- */

__device__ __forceinline__ void adamw_one(float *p, float *g, float *m, float *v,
                                          const ops_adamw_args &a)
{
    float gi = *g * a.grad_scale;
    *g = 0.0f;
    *m = a.beta1 * *m + (1.0f - a.beta1) * gi;
    *v = a.beta2 * *v + (1.0f - a.beta2) * gi * gi;
    float mhat = *m / a.bc1, vhat = *v / a.bc2;
    *p -= a.lr * (mhat / (sqrtf(vhat) + a.eps) + a.weight_decay * *p);
}

__global__ void adamw_kernel(float *p, float *g, float *m, float *v, size_t n,
                             ops_adamw_args a)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) adamw_one(p + i, g + i, m + i, v + i, a);
}

static void cuda_adamw_update(float *p, float *g, float *m, float *v, size_t n,
                              const ops_adamw_args *a)
{
    if (cuda_g.failed || n == 0) return;
    adamw_kernel<<<cuda_blocks(n, CUDA_ELEM_THREADS), CUDA_ELEM_THREADS, 0, cuda_g.stream>>>(
        p, g, m, v, n, *a);
    cuda_finish("adamw_update");
}

/* Every tensor of a step in one launch: blockIdx.y picks the tensor, the x blocks stride
 * over its elements. A launch and a synchronisation per tensor (~150 at GPT-2's shape) cost
 * more than the update at small shapes. */
#define ADAMW_MAX_X_BLOCKS 1024u
#define ADAMW_MAX_Y 65535

__global__ void adamw_many_kernel(float *p, float *g, float *m, float *v,
                                  const ops_adamw_tensor *t, int n)
{
    for (int k = blockIdx.y; k < n; k += gridDim.y) {
        const ops_adamw_tensor tk = t[k];
        for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < tk.count;
             i += (size_t)gridDim.x * blockDim.x)
            adamw_one(p + tk.param + i, g + tk.param + i, m + tk.state + i, v + tk.state + i,
                      tk.a);
    }
}

static void cuda_adamw_update_many(float *p, float *g, float *m, float *v,
                                   const ops_adamw_tensor *t, int n)
{
    static ops_adamw_tensor *table; /* on the device, kept and grown */
    static int cap;
    if (cuda_g.failed || n <= 0) return;
    if (n > cap) {
        cudaFree(table);
        table = NULL;
        cap = 0;
        if (!CUDA_OK(cudaMalloc(&table, sizeof *table * (size_t)n))) return;
        cap = n;
    }
    size_t most = 0;
    for (int k = 0; k < n; k++) most = t[k].count > most ? t[k].count : most;
    if (most == 0) return;
    unsigned x = cuda_blocks(most, CUDA_ELEM_THREADS);
    dim3 grid(x < ADAMW_MAX_X_BLOCKS ? x : ADAMW_MAX_X_BLOCKS, n < ADAMW_MAX_Y ? n : ADAMW_MAX_Y);
    if (CUDA_OK(cudaMemcpyAsync(table, t, sizeof *t * (size_t)n, cudaMemcpyHostToDevice,
                                cuda_g.stream)))
        adamw_many_kernel<<<grid, CUDA_ELEM_THREADS, 0, cuda_g.stream>>>(p, g, m, v, table, n);
    cuda_finish("adamw_update_many");
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
    b->fold = cuda_fold;
    b->sumsq = cuda_sumsq;
    b->sumsq_many = cuda_sumsq_many;
    b->adamw_update = cuda_adamw_update;
    b->adamw_update_many = cuda_adamw_update_many;
    b->q8_encode = cuda_q8_encode;
    b->q8_decode = cuda_q8_decode;
}
