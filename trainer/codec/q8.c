/* q8: blockwise 8-bit quantisation (see q8.h), in the style of ggml's Q8_0.
 *
 * Encoded block (4 + len bytes, len = CODEC_Q8_BLOCK except for a short last block):
 *
 *   off  size  field
 *     0     4  scale   IEEE binary32, little-endian
 *     4   len  q[len]  int8, two's complement
 *
 * The exact arithmetic, which the reference and the fast versions both follow bit for bit
 * (all binary32, round-to-nearest-even; no add ever takes a product directly, so
 * -ffp-contract / FMA cannot change a result):
 *
 *   absmax = max |x[i]| over the block               (the block must hold no NaN or Inf)
 *   pre    = 2^64 if absmax < 2^-96 else 1           (exact; keeps 127/absmax finite for
 *                                                     nearly-subnormal blocks, changes no
 *                                                     result where 127/absmax is finite)
 *   inv    = 127 / (absmax * pre), or 0 if absmax == 0 (a zero block: no division by zero)
 *   v      = (x[i] * pre) * inv                      (|v| <= 127.00002)
 *   q[i]   = round-half-away-from-zero(v), clamped to [-127, 127]
 *   scale  = min(absmax / 127, Q8_SCALE_MAX)
 *   decode: y[i] = (float)q[i] * scale
 *
 * Rounding: the reference uses roundf(v). The fast version uses
 * sign(v) * (int)(|v| + 0.49999997f), 0.49999997f being the float just below 1/2; a scratch
 * program checked it equals roundf(v) for every float |v| <= 2^24 (all 2.5e9 of them). The
 * tempting (int)(|v| + 0.5f) is wrong: 0.49999997f + 0.5f rounds to 1.0f, so it gives 1.
 *
 * Q8_SCALE_MAX is the largest float s with 127 * s finite; only blocks whose absmax is
 * within a few ulps of FLT_MAX are clamped to it (absmax/127 rounds up to one ulp above).
 * That keeps every decoded value finite, also for the largest blocks the encoder accepts.
 *
 * The decoder accepts exactly what the encoder can produce: in_len == codec_q8_encoded_size(n)
 * and every scale's bit pattern in [+0.0, Q8_SCALE_MAX], which rejects NaN, +-Inf, every
 * negative scale including -0.0, and scales so large that 127 * scale would overflow.
 * The int8 value -128 is REJECTED (CIRRUS_ECORRUPT): the encoder never emits it (q is clamped
 * to [-127, 127], symmetric like ggml), so it can only come from corruption, and with it
 * refused |y| <= 127 * scale <= FLT_MAX always holds. Bytes from the network therefore
 * decode to finite floats or to an error, never to NaN or Inf.
 *
 * The fast versions are plain C loops over one block that GCC vectorises at -O3
 * -march=native: absmax as an unsigned max of the float bit patterns with the sign bit
 * cleared (for non-negative floats the integer order is the float order, and NaN/Inf
 * patterns are all >= 0x7f800000, so one reduction finds absmax and checks finiteness);
 * the rounding above; decoding as int8 -> float times scale with an OR-reduced check for
 * -128. No OpenMP here: callers split the work by blocks.
 *
 * Measured throughput of the fast versions (16 MiB of floats = 4 Mi values per call, one
 * thread, best of 20 calls, gcc 12.2 -O3 -march=native, 2-core 2.3 GHz AVX-512 Xeon VM;
 * GB/s counts the 16 MiB float side in both directions):
 *   encode  ~15 GB/s  (14.7-15.4; in L2, 256 KiB: ~19 GB/s)   reference: 0.77 GB/s
 *   decode  ~20.5 GB/s (20.2-21.3; in L2, 256 KiB: ~31 GB/s)  reference: 8.0 GB/s
 */
#include "q8.h"
#include "q8_format.h"

#include <float.h>
#include <math.h>
#include <string.h>

#include "../../common/cerr.h"

#if !defined(__BYTE_ORDER__) || !defined(__ORDER_LITTLE_ENDIAN__) || \
    __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "codec_q8 copies the little-endian scale with memcpy: port it for this host"
#endif

_Static_assert(sizeof(float) == sizeof(uint32_t) && FLT_RADIX == 2 && FLT_MANT_DIG == 24 &&
                   FLT_MAX_EXP == 128,
               "codec_q8 needs IEEE binary32 float");
_Static_assert(CODEC_Q8_BLOCK > 0 && CODEC_Q8_BLOCK <= 64, "block size");

_Static_assert(Q8_BLOCK_BYTES == 68, "a full block is a 4-byte scale and 64 int8 values");
_Static_assert(CODEC_Q8_BLOCK * sizeof(float) * 68 == Q8_BLOCK_BYTES * 256,
               "256 bytes of floats become 68 bytes");

#define Q8_SCALE_MAX_BITS 0x7c010203u /* the bit pattern of Q8_SCALE_MAX (q8_format.h) */
#define Q8_HALF_DOWN 0x1.fffffep-2f   /* 0.49999997f, the float just below 1/2 */
#define Q8_ABS_MASK 0x7fffffffu
#define Q8_EXP_MASK 0x7f800000u       /* |bits| >= this: Inf or NaN */

size_t codec_q8_encoded_size(size_t n)
{
    size_t full = n / CODEC_Q8_BLOCK, tail = n % CODEC_Q8_BLOCK;
    /* Saturates rather than wraps for counts no float array can have. */
    if (full > (SIZE_MAX - Q8_BLOCK_BYTES) / Q8_BLOCK_BYTES) return SIZE_MAX;
    return full * Q8_BLOCK_BYTES + (tail ? Q8_SCALE_BYTES + tail : 0);
}

/* n floats must be addressable, so anything larger is a bad length, not a buffer. */
static int q8_n_plausible(size_t n)
{
    return n <= SIZE_MAX / sizeof(float);
}

typedef struct q8_params {
    float pre, inv, scale;
} q8_params;

/* The per-block constants of the formulas at the top; shared by both versions. */
static inline q8_params q8_block_params(float absmax)
{
    q8_params p;
    p.pre = absmax < Q8_TINY ? Q8_PRE : 1.0f;
    p.inv = absmax > 0.0f ? 127.0f / (absmax * p.pre) : 0.0f;
    p.scale = absmax / 127.0f;
    if (p.scale > Q8_SCALE_MAX) p.scale = Q8_SCALE_MAX;
    return p;
}

/* ---- reference: one element at a time, written to be read ---- */

int codec_q8_encode_ref(uint8_t *out, const float *x, size_t n)
{
    for (size_t b = 0; b < n; b += CODEC_Q8_BLOCK) {
        size_t len = n - b < CODEC_Q8_BLOCK ? n - b : CODEC_Q8_BLOCK;
        float absmax = 0.0f;
        for (size_t i = 0; i < len; i++) {
            if (!isfinite(x[b + i])) return CIRRUS_EINVAL;
            float a = fabsf(x[b + i]);
            if (a > absmax) absmax = a;
        }
        q8_params p = q8_block_params(absmax);
        memcpy(out, &p.scale, Q8_SCALE_BYTES);
        for (size_t i = 0; i < len; i++) {
            float v = (x[b + i] * p.pre) * p.inv;
            float r = roundf(v);
            if (r > 127.0f) r = 127.0f;
            if (r < -127.0f) r = -127.0f;
            out[Q8_SCALE_BYTES + i] = (uint8_t)(int8_t)r; /* r is integral, in range */
        }
        out += Q8_SCALE_BYTES + len;
    }
    return 0;
}

int codec_q8_decode_ref(float *out, size_t n, const uint8_t *in, size_t in_len)
{
    if (!q8_n_plausible(n) || in_len != codec_q8_encoded_size(n)) return CIRRUS_ECORRUPT;
    for (size_t b = 0; b < n; b += CODEC_Q8_BLOCK) {
        size_t len = n - b < CODEC_Q8_BLOCK ? n - b : CODEC_Q8_BLOCK;
        float scale;
        memcpy(&scale, in, Q8_SCALE_BYTES);
        if (!isfinite(scale) || signbit(scale) || scale > Q8_SCALE_MAX)
            return CIRRUS_ECORRUPT;
        for (size_t i = 0; i < len; i++) {
            int8_t q = (int8_t)in[Q8_SCALE_BYTES + i];
            if (q == -128) return CIRRUS_ECORRUPT;
            out[b + i] = (float)q * scale;
        }
        in += Q8_SCALE_BYTES + len;
    }
    return 0;
}

/* ---- fast: whole-block loops for the vectoriser ---- */

static inline __attribute__((always_inline)) void
q8_quantize(uint8_t *restrict q, const float *restrict x, size_t len, float pre, float inv)
{
    for (size_t i = 0; i < len; i++) {
        float v = (x[i] * pre) * inv;
        int32_t t = (int32_t)(fabsf(v) + Q8_HALF_DOWN); /* |v| <= 127.00002: in range */
        t = t > 127 ? 127 : t;
        q[i] = (uint8_t)(v < 0.0f ? -t : t);
    }
}

/* Called with len == CODEC_Q8_BLOCK for full blocks (inlined, so the loops have a constant
 * trip count) and once with the short tail. */
static inline __attribute__((always_inline)) int
q8_encode_block(uint8_t *restrict out, const float *restrict x, size_t len)
{
    uint32_t m = 0;
    for (size_t i = 0; i < len; i++) {
        uint32_t u;
        memcpy(&u, &x[i], sizeof u);
        u &= Q8_ABS_MASK;
        m = u > m ? u : m;
    }
    if (m >= Q8_EXP_MASK) return CIRRUS_EINVAL;
    float absmax;
    memcpy(&absmax, &m, sizeof absmax);
    q8_params p = q8_block_params(absmax);
    memcpy(out, &p.scale, Q8_SCALE_BYTES);
    /* pre == 1 for every block but nearly-all-subnormal ones; with the constant, the
     * multiply by it folds away (x * 1.0f == x exactly). */
    if (p.pre == 1.0f) q8_quantize(out + Q8_SCALE_BYTES, x, len, 1.0f, p.inv);
    else q8_quantize(out + Q8_SCALE_BYTES, x, len, p.pre, p.inv);
    return 0;
}

int codec_q8_encode(uint8_t *out, const float *x, size_t n)
{
    size_t b = 0;
    for (; n - b >= CODEC_Q8_BLOCK; b += CODEC_Q8_BLOCK, out += Q8_BLOCK_BYTES)
        if (q8_encode_block(out, x + b, CODEC_Q8_BLOCK)) return CIRRUS_EINVAL;
    if (b < n && q8_encode_block(out, x + b, n - b)) return CIRRUS_EINVAL;
    return 0;
}

static inline __attribute__((always_inline)) int
q8_decode_block(float *restrict out, const uint8_t *restrict in, size_t len)
{
    uint32_t sb;
    memcpy(&sb, in, sizeof sb);
    /* One unsigned compare: negative (sign bit set), NaN, Inf and too large all exceed it. */
    if (sb > Q8_SCALE_MAX_BITS) return CIRRUS_ECORRUPT;
    float scale;
    memcpy(&scale, &sb, sizeof scale);
    const int8_t *restrict q = (const int8_t *)(in + Q8_SCALE_BYTES);
    int bad = 0;
    for (size_t i = 0; i < len; i++) {
        bad |= q[i] == -128;
        out[i] = (float)q[i] * scale;
    }
    return bad ? CIRRUS_ECORRUPT : 0;
}

int codec_q8_decode(float *out, size_t n, const uint8_t *in, size_t in_len)
{
    if (!q8_n_plausible(n) || in_len != codec_q8_encoded_size(n)) return CIRRUS_ECORRUPT;
    size_t b = 0;
    for (; n - b >= CODEC_Q8_BLOCK; b += CODEC_Q8_BLOCK, in += Q8_BLOCK_BYTES)
        if (q8_decode_block(out + b, in, CODEC_Q8_BLOCK)) return CIRRUS_ECORRUPT;
    if (b < n && q8_decode_block(out + b, in, n - b)) return CIRRUS_ECORRUPT;
    return 0;
}
