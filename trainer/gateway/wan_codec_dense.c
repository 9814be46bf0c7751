/* wan_codec_dense: the codecs of the WAN table that send every value (see wan_codec.h):
 * none (fp32), fp16, and the blockwise absmax codecs q8 (8 bits) and lowbit (4 or 2 bits),
 * one quantiser for all three widths. Each body for values [0, a), a a multiple of
 * WAN_CODEC_CHUNK, is its first bound(a) bytes, so the error feedback and top-k's values can
 * run through them a chunk at a time.
 *
 * Bodies (little-endian):
 *
 *   none    n x binary32. The decoder refuses NaN/Inf.
 *   fp16    n x binary16, round to nearest even, |x| saturated at 65504 first so no finite
 *           input becomes Inf; values below 2^-25 round to zero (error feedback keeps what
 *           that drops). The decoder refuses Inf/NaN halves. |x - y| <= 2^-11 |x| in the
 *           normal range 2^-14 <= |x| <= 65504.
 *   q8, lowbit: ceil(n / 64) blocks, the last one short when 64 does not divide n. A block
 *           of len values at width b (8, 4 or 2 bits):
 *
 *   off  size                field
 *     0     4                scale  IEEE binary32 in [+0, SCALE_MAX(L)]
 *     4     ceil(len * b/8)  codes  q8: int8 q[i] in [-127, 127];
 *                                   lowbit: c[i] = q[i] + L in [0, 2L], packed low bits
 *                                   first (value i in bits (i*b) mod 8 of byte i*b/8);
 *                                   the unused high bits of a short block's last byte are 0
 *
 * with L = 127 (q8), 7 (4 bits), 1 (2 bits: ternary). Symmetric levels keep zero exact,
 * so zero and sparse regions decode to zeros rather than noise, and one rounding formula
 * serves every width. 64 values take 68 bytes (q8), 36 (4 bits), 20 (2 bits).
 *
 * The q8/lowbit arithmetic, which the reference and the fast versions both follow bit for
 * bit (all binary32, round to nearest even; no add takes a product directly, so FMA contraction
 * cannot change a result):
 *
 *   absmax = max |x[i]| over the block             (no NaN or Inf: refused)
 *   pre    = 2^64 if absmax < 2^-96 else 1         (exact; keeps L/absmax finite for
 *                                                   nearly-subnormal blocks)
 *   inv    = L / (absmax * pre), or 0 if absmax == 0   (a zero block: no division by zero)
 *   v      = (x[i] * pre) * inv                    (|v| <= L * (1 + 2^-22))
 *   q[i]   = round-half-away-from-zero(v), clamped to [-L, L]
 *   scale  = min(absmax / L, SCALE_MAX(L))
 *   decode: y[i] = (float)q[i] * scale
 *
 * so |x - y| <= absmax/(2L) + absmax * 2^-20 (+ 2^-140 where the scale is subnormal).
 * The reference rounds with roundf; the fast versions with (int)(|v| + 0.49999997f) and
 * the sign, which equals roundf for every |v| <= 2^24 (checked exhaustively for
 * trainer/codec/q8, whose rule this is). SCALE_MAX(L) is the largest float s with L * s
 * finite: the decoder refuses larger scales (and any sign bit, NaN or Inf: one unsigned
 * compare of the bit pattern), the q8 value -128 and the lowbit code 2L + 1 (all ones),
 * and nonzero padding bits, so every decoded value is finite and the decoder accepts only
 * what the encoder writes.
 *
 * The fast versions are plain loops for the vectoriser, over whole blocks with constant
 * trip counts for q8/lowbit (absmax as an unsigned max of the sign-cleared bit patterns,
 * which also finds NaN/Inf). The fp16 fast conversions are branch-free integer code rather
 * than F16C intrinsics, so they are the same on every CPU. No OpenMP: the caller owns the
 * threads.
 */
#include "wan_codec.h"
#include "wan_codec_bits.h"

#include <float.h>
#include <math.h>
#include <string.h>

#include "../../common/le.h"

#if !defined(__BYTE_ORDER__) || !defined(__ORDER_LITTLE_ENDIAN__) || \
    __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the fast WAN codecs copy little-endian scales with memcpy: port them for this host"
#endif

_Static_assert(sizeof(float) == sizeof(uint32_t) && FLT_RADIX == 2 && FLT_MANT_DIG == 24 &&
                   FLT_MAX_EXP == 128,
               "the WAN codecs need IEEE binary32 float");
_Static_assert(WAN_CODEC_BLOCK == 64 && WAN_CODEC_CHUNK % WAN_CODEC_BLOCK == 0, "block size");

#define BLK WAN_CODEC_BLOCK
#define SCALE_BYTES 4
#define TINY 0x1p-96f
#define PRE 0x1p64f
#define HALF_DOWN 0x1.fffffep-2f /* 0.49999997f, the float just below 1/2 */
#define HALF_MAX_BITS 0x477fe000u /* 65504.0f, the largest binary16 */

/* ---- none: fp32 ---- */

static size_t none_bound(size_t n, const wan_codec_params *p)
{
    if (p->id != WAN_CODEC_NONE || (p->bits != 0 && p->bits != 32)) return SIZE_MAX;
    return (uint64_t)n > WAN_CODEC_N_MAX ? SIZE_MAX : 4 * n;
}

static int none_encode_ref(const float *x, size_t n, const wan_codec_params *p, uint8_t *out,
                           size_t cap, size_t *len)
{
    size_t need = none_bound(n, p);
    if (need == SIZE_MAX || cap < need) return CIRRUS_EINVAL;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(x[i])) return CIRRUS_EINVAL;
        le_put(out + 4 * i, bits_of(x[i]), 4);
    }
    *len = need;
    return 0;
}

static int none_decode_ref(const uint8_t *in, size_t len, size_t n, const wan_codec_params *p,
                           float *out)
{
    size_t need = none_bound(n, p);
    if (need == SIZE_MAX) return CIRRUS_EINVAL;
    if (len != need) return CIRRUS_ECORRUPT;
    for (size_t i = 0; i < n; i++) {
        out[i] = float_of((uint32_t)le_get(in + 4 * i, 4));
        if (!isfinite(out[i])) return CIRRUS_ECORRUPT;
    }
    return 0;
}

/* Max of the sign-cleared patterns: >= EXP_MASK iff some value is NaN or Inf. */
static uint32_t abs_bits_max(const float *restrict x, size_t n)
{
    uint32_t m = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t a = bits_of(x[i]) & ABS_MASK;
        m = a > m ? a : m;
    }
    return m;
}

static int none_encode(const float *x, size_t n, const wan_codec_params *p, uint8_t *out,
                       size_t cap, size_t *len)
{
    size_t need = none_bound(n, p);
    if (need == SIZE_MAX || cap < need) return CIRRUS_EINVAL;
    if (n && abs_bits_max(x, n) >= EXP_MASK) return CIRRUS_EINVAL;
    if (n) memcpy(out, x, need);
    *len = need;
    return 0;
}

static int none_decode(const uint8_t *in, size_t len, size_t n, const wan_codec_params *p,
                       float *out)
{
    size_t need = none_bound(n, p);
    if (need == SIZE_MAX) return CIRRUS_EINVAL;
    if (len != need) return CIRRUS_ECORRUPT;
    if (n) memcpy(out, in, need);
    if (n && abs_bits_max(out, n) >= EXP_MASK) return CIRRUS_ECORRUPT;
    return 0;
}

/* ---- fp16 ---- */

/* Reference conversions, by the definition: frexp, an explicit round-half-to-even. */
static float round_half_even(float t) /* t >= 0, t < 2^23 */
{
    float r = floorf(t), d = t - r; /* both exact */
    if (d > 0.5f || (d == 0.5f && fmodf(r, 2.0f) == 1.0f)) r += 1.0f;
    return r;
}

static uint16_t half_from_float_ref(float f) /* f finite */
{
    uint16_t sign = signbit(f) ? 0x8000 : 0;
    float a = fabsf(f);
    if (a >= 65504.0f) return sign | 0x7bff;
    if (a < 0x1p-14f) /* subnormal half (or zero): a multiple of 2^-24; 1024 is 2^-14 */
        return sign | (uint16_t)round_half_even(a * 0x1p24f);
    int e;
    float s = round_half_even(frexpf(a, &e) * 2048.0f); /* a = s * 2^(e - 11), s in [1024, 2048] */
    if (s == 2048.0f) s = 1024.0f, e++;
    return sign | (uint16_t)((e + 14) << 10 | ((int)s - 1024)); /* a < 65504: e + 14 <= 30 */
}

static float float_from_half_ref(uint16_t h) /* h not Inf/NaN */
{
    int e = (h >> 10) & 0x1f, m = h & 0x3ff;
    float a = e ? ldexpf((float)(1024 + m), e - 25) : ldexpf((float)m, -24);
    return h & 0x8000 ? -a : a;
}

/* Fast conversions: branch-free integer code the vectoriser takes, independent of the
 * SIMD extensions present (F16C's instructions would give the same bits). Normal halves
 * round by adding 0xfff plus the kept lsb before the shift; subnormal ones let the FPU
 * round: a + 0.5f puts a's multiple of 2^-24 in the low mantissa bits of 0.5f. Selects
 * are masks, not ?:, which GCC would turn into a branch around the float add (it may trap)
 * and then not vectorise. */
static inline uint16_t half_from_float(float f) /* f finite */
{
    uint32_t u = bits_of(f), a = u & ABS_MASK;
    a = a < HALF_MAX_BITS ? a : HALF_MAX_BITS;
    uint32_t sub = bits_of(float_of(a) + 0.5f) - 0x3f000000u;
    uint32_t nrm = (a + 0xc8000fffu + ((a >> 13) & 1)) >> 13; /* rebias 127 -> 15, round */
    uint32_t below = 0u - (uint32_t)(a < 0x38800000u);         /* below 2^-14: subnormal */
    uint32_t h = (sub & below) | (nrm & ~below);
    return (uint16_t)(h | ((u >> 16) & 0x8000));
}

static inline float float_from_half(uint16_t h) /* h not Inf/NaN */
{
    uint32_t t = ((uint32_t)(h & 0x7fff) << 13) + 0x38000000u; /* rebias 15 -> 127 */
    uint32_t sub = bits_of(float_of(t + 0x00800000u) - 0x1p-14f); /* m * 2^-24, exact */
    uint32_t normal = 0u - (uint32_t)((h & 0x7c00) != 0);
    uint32_t r = (t & normal) | (sub & ~normal);
    return float_of(r | (uint32_t)(h & 0x8000) << 16);
}

static size_t fp16_bound(size_t n, const wan_codec_params *p)
{
    if (p->id != WAN_CODEC_FP16 || (p->bits != 0 && p->bits != 16)) return SIZE_MAX;
    return (uint64_t)n > WAN_CODEC_N_MAX ? SIZE_MAX : 2 * n;
}

static int fp16_encode_ref(const float *x, size_t n, const wan_codec_params *p, uint8_t *out,
                           size_t cap, size_t *len)
{
    size_t need = fp16_bound(n, p);
    if (need == SIZE_MAX || cap < need) return CIRRUS_EINVAL;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(x[i])) return CIRRUS_EINVAL;
        le_put(out + 2 * i, half_from_float_ref(x[i]), 2);
    }
    *len = need;
    return 0;
}

static int fp16_decode_ref(const uint8_t *in, size_t len, size_t n, const wan_codec_params *p,
                           float *out)
{
    size_t need = fp16_bound(n, p);
    if (need == SIZE_MAX) return CIRRUS_EINVAL;
    if (len != need) return CIRRUS_ECORRUPT;
    for (size_t i = 0; i < n; i++) {
        uint16_t h = (uint16_t)le_get(in + 2 * i, 2);
        if ((h & 0x7c00) == 0x7c00) return CIRRUS_ECORRUPT; /* Inf or NaN */
        out[i] = float_from_half_ref(h);
    }
    return 0;
}

static int fp16_encode(const float *x, size_t n, const wan_codec_params *p, uint8_t *out,
                       size_t cap, size_t *len)
{
    size_t need = fp16_bound(n, p);
    if (need == SIZE_MAX || cap < need) return CIRRUS_EINVAL;
    uint16_t h[WAN_CODEC_CHUNK];
    for (size_t b = 0; b < n; b += WAN_CODEC_CHUNK) {
        size_t m = n - b < WAN_CODEC_CHUNK ? n - b : WAN_CODEC_CHUNK;
        const float *restrict xb = x + b;
        uint32_t bad = 0;
        for (size_t i = 0; i < m; i++) {
            bad |= (bits_of(xb[i]) & ABS_MASK) >= EXP_MASK;
            h[i] = half_from_float(xb[i]);
        }
        if (bad) return CIRRUS_EINVAL;
        memcpy(out + 2 * b, h, 2 * m);
    }
    *len = need;
    return 0;
}

static int fp16_decode(const uint8_t *in, size_t len, size_t n, const wan_codec_params *p,
                       float *out)
{
    size_t need = fp16_bound(n, p);
    if (need == SIZE_MAX) return CIRRUS_EINVAL;
    if (len != need) return CIRRUS_ECORRUPT;
    uint16_t h[WAN_CODEC_CHUNK];
    for (size_t b = 0; b < n; b += WAN_CODEC_CHUNK) {
        size_t m = n - b < WAN_CODEC_CHUNK ? n - b : WAN_CODEC_CHUNK;
        memcpy(h, in + 2 * b, 2 * m);
        float *restrict ob = out + b;
        uint32_t bad = 0;
        for (size_t i = 0; i < m; i++) {
            bad |= (h[i] & 0x7c00) == 0x7c00;
            ob[i] = float_from_half(h[i]);
        }
        if (bad) return CIRRUS_ECORRUPT;
    }
    return 0;
}

const wan_codec wan_codec_none_def = {
    .name = "none", .id = WAN_CODEC_NONE, .error_feedback = 0,
    .bound = none_bound, .encode = none_encode, .decode = none_decode,
    .encode_ref = none_encode_ref, .decode_ref = none_decode_ref, .decode_sub = NULL,
};

const wan_codec wan_codec_fp16_def = {
    .name = "fp16", .id = WAN_CODEC_FP16, .error_feedback = 0,
    .bound = fp16_bound, .encode = fp16_encode, .decode = fp16_decode,
    .encode_ref = fp16_encode_ref, .decode_ref = fp16_decode_ref, .decode_sub = NULL,
};

/* ---- q8 and lowbit ---- */

/* SCALE_MAX(L) and its bit pattern; found by stepping from FLT_MAX / L with nextafterf
 * until L * s is the last finite product. For L = 7 and 1 it is absmax / L itself for
 * every finite absmax, so only q8 ever clamps. */
#define SMAX_127 0x1.020406p+121f
#define SMAX_127_BITS 0x7c010203u
#define SMAX_7 0x1.249248p+125f
#define SMAX_7_BITS 0x7e124924u
#define SMAX_1 FLT_MAX
#define SMAX_1_BITS 0x7f7fffffu

/* Bytes for n values at width bits (8, 4 or 2); saturates for counts no vector has. */
static size_t blockwise_size(size_t n, int bits)
{
    if ((uint64_t)n > WAN_CODEC_N_MAX) return SIZE_MAX;
    size_t full = n / BLK, tail = n % BLK;
    return full * (SCALE_BYTES + (size_t)BLK * bits / 8) +
           (tail ? SCALE_BYTES + (tail * bits + 7) / 8 : 0);
}

/* 8 (q8), 4 or 2 (lowbit), or 0 for params this codec does not take. */
static int q8_width(const wan_codec_params *p)
{
    return p->id == WAN_CODEC_Q8 && (p->bits == 0 || p->bits == 8) ? 8 : 0;
}

static int lowbit_width(const wan_codec_params *p)
{
    return p->id == WAN_CODEC_LOWBIT && (p->bits == 2 || p->bits == 4) ? p->bits : 0;
}

typedef struct qparams {
    float pre, inv, scale;
} qparams;

/* The per-block constants of the formulas at the top; shared by both versions. */
static inline qparams block_params(float absmax, float L, float smax)
{
    qparams p;
    p.pre = absmax < TINY ? PRE : 1.0f;
    p.inv = absmax > 0.0f ? L / (absmax * p.pre) : 0.0f;
    p.scale = absmax / L;
    if (p.scale > smax) p.scale = smax;
    /* A block so small that its scale underflows to 0 (absmax below L x 2^-150) decodes to
     * zeros whatever its codes: write zero codes, so that the message is the one zeros
     * encode to (encode(decode(m)) == m; the fuzzer found nonzero codes under a 0 scale). */
    if (p.scale == 0.0f) p.inv = 0.0f;
    return p;
}

static float level_count(int bits) /* L */
{
    return bits == 8 ? 127.0f : bits == 4 ? 7.0f : 1.0f;
}

static float scale_max(int bits)
{
    return bits == 8 ? SMAX_127 : bits == 4 ? SMAX_7 : SMAX_1;
}

static uint32_t scale_max_bits(int bits)
{
    return bits == 8 ? SMAX_127_BITS : bits == 4 ? SMAX_7_BITS : SMAX_1_BITS;
}

/* ---- reference: one value at a time, written to be read ---- */

static int ref_encode(const float *x, size_t n, int bits, uint8_t *out, size_t cap, size_t *len)
{
    size_t need = blockwise_size(n, bits);
    if (need == SIZE_MAX || cap < need) return CIRRUS_EINVAL;
    const float L = level_count(bits);
    const int Li = (int)L;
    uint8_t *o = out;
    for (size_t b = 0; b < n; b += BLK) {
        size_t m = n - b < BLK ? n - b : BLK;
        float absmax = 0.0f;
        for (size_t i = 0; i < m; i++) {
            if (!isfinite(x[b + i])) return CIRRUS_EINVAL;
            float a = fabsf(x[b + i]);
            if (a > absmax) absmax = a;
        }
        qparams p = block_params(absmax, L, scale_max(bits));
        uint32_t sb;
        memcpy(&sb, &p.scale, sizeof sb);
        le_put(o, sb, SCALE_BYTES);
        o += SCALE_BYTES;
        size_t nbytes = (m * (size_t)bits + 7) / 8;
        memset(o, 0, nbytes);
        for (size_t i = 0; i < m; i++) {
            float v = (x[b + i] * p.pre) * p.inv;
            float r = roundf(v);
            if (r > L) r = L;
            if (r < -L) r = -L;
            int q = (int)r;
            if (bits == 8) {
                o[i] = (uint8_t)(int8_t)q;
            } else {
                size_t bit = i * (size_t)bits;
                o[bit / 8] |= (uint8_t)((unsigned)(q + Li) << (bit % 8));
            }
        }
        o += nbytes;
    }
    *len = need;
    return 0;
}

static int ref_decode(const uint8_t *in, size_t len, size_t n, int bits, float *out)
{
    if (len != blockwise_size(n, bits)) return CIRRUS_ECORRUPT;
    const int Li = (int)level_count(bits);
    const unsigned mask = (1u << bits) - 1;
    for (size_t b = 0; b < n; b += BLK) {
        size_t m = n - b < BLK ? n - b : BLK;
        uint32_t sb = (uint32_t)le_get(in, SCALE_BYTES);
        float scale;
        memcpy(&scale, &sb, sizeof scale);
        if (!isfinite(scale) || signbit(scale) || scale > scale_max(bits)) return CIRRUS_ECORRUPT;
        in += SCALE_BYTES;
        for (size_t i = 0; i < m; i++) {
            int q;
            if (bits == 8) {
                q = (int8_t)in[i];
                if (q == -128) return CIRRUS_ECORRUPT;
            } else {
                size_t bit = i * (size_t)bits;
                unsigned c = (in[bit / 8] >> (bit % 8)) & mask;
                if (c == mask) return CIRRUS_ECORRUPT; /* 2L + 1: never written */
                q = (int)c - Li;
            }
            out[b + i] = (float)q * scale;
        }
        size_t used = m * (size_t)bits, nbytes = (used + 7) / 8;
        if (used % 8 && in[nbytes - 1] >> (used % 8)) return CIRRUS_ECORRUPT; /* padding */
        in += nbytes;
    }
    return 0;
}

/* ---- fast: whole-block loops for the vectoriser ---- */

static inline __attribute__((always_inline)) void
quantize(int8_t *restrict q, const float *restrict x, size_t m, float pre, float inv, int Li)
{
    for (size_t i = 0; i < m; i++) {
        float v = (x[i] * pre) * inv;
        int32_t t = (int32_t)(fabsf(v) + HALF_DOWN); /* |v| <= L * (1 + 2^-22): in range */
        t = t > Li ? Li : t;
        q[i] = (int8_t)(v < 0.0f ? -t : t);
    }
}

/* One block of m <= 64 values. Inlined with constant bits, and with m == 64 for the full
 * blocks, so every loop has constant bounds. */
static inline __attribute__((always_inline)) int
fast_encode_block(uint8_t *restrict out, const float *restrict x, size_t m, const int bits)
{
    uint32_t mx = 0;
    for (size_t i = 0; i < m; i++) {
        uint32_t u;
        memcpy(&u, &x[i], sizeof u);
        u &= ABS_MASK;
        mx = u > mx ? u : mx;
    }
    if (mx >= EXP_MASK) return CIRRUS_EINVAL;
    float absmax;
    memcpy(&absmax, &mx, sizeof absmax);
    const int Li = bits == 8 ? 127 : bits == 4 ? 7 : 1;
    qparams p = block_params(absmax, (float)Li, scale_max(bits));
    memcpy(out, &p.scale, SCALE_BYTES);
    out += SCALE_BYTES;
    int8_t q[BLK];
    /* pre == 1 but for nearly-all-subnormal blocks; as a constant, x * 1.0f folds away. */
    if (p.pre == 1.0f) quantize(q, x, m, 1.0f, p.inv, Li);
    else quantize(q, x, m, p.pre, p.inv, Li);
    if (bits == 8) {
        memcpy(out, q, m);
        return 0;
    }
    uint8_t c[BLK];
    for (size_t i = 0; i < BLK; i++) c[i] = i < m ? (uint8_t)(q[i] + Li) : 0;
    if (bits == 4) {
        for (size_t j = 0; j < (m + 1) / 2; j++) out[j] = (uint8_t)(c[2 * j] | c[2 * j + 1] << 4);
    } else {
        for (size_t j = 0; j < (m + 3) / 4; j++)
            out[j] = (uint8_t)(c[4 * j] | c[4 * j + 1] << 2 | c[4 * j + 2] << 4 |
                               c[4 * j + 3] << 6);
    }
    return 0;
}

static inline __attribute__((always_inline)) int
fast_encode(const float *x, size_t n, const int bits, uint8_t *out, size_t cap, size_t *len)
{
    size_t need = blockwise_size(n, bits);
    if (need == SIZE_MAX || cap < need) return CIRRUS_EINVAL;
    const size_t bb = SCALE_BYTES + (size_t)BLK * bits / 8;
    size_t b = 0;
    for (; n - b >= BLK; b += BLK, out += bb)
        if (fast_encode_block(out, x + b, BLK, bits)) return CIRRUS_EINVAL;
    if (b < n && fast_encode_block(out, x + b, n - b, bits)) return CIRRUS_EINVAL;
    *len = need;
    return 0;
}

static inline __attribute__((always_inline)) int
fast_decode_block(float *restrict out, const uint8_t *restrict in, size_t m, const int bits)
{
    uint32_t sb;
    memcpy(&sb, in, sizeof sb);
    /* One unsigned compare: a sign bit, NaN, Inf and too large all exceed it. */
    if (sb > scale_max_bits(bits)) return CIRRUS_ECORRUPT;
    float scale;
    memcpy(&scale, &sb, sizeof scale);
    in += SCALE_BYTES;
    int bad = 0;
    if (bits == 8) {
        const int8_t *restrict q = (const int8_t *)in;
        for (size_t i = 0; i < m; i++) {
            bad |= q[i] == -128;
            out[i] = (float)q[i] * scale;
        }
        return bad ? CIRRUS_ECORRUPT : 0;
    }
    const int Li = bits == 4 ? 7 : 1;
    const unsigned mask = (1u << bits) - 1;
    const size_t per = 8 / (size_t)bits, nbytes = (m * (size_t)bits + 7) / 8;
    uint8_t c[BLK + 3];
    for (size_t j = 0; j < nbytes; j++)
        for (size_t t = 0; t < per; t++) c[j * per + t] = (uint8_t)((in[j] >> (t * bits)) & mask);
    for (size_t i = 0; i < m; i++) {
        bad |= c[i] == mask;
        out[i] = (float)((int32_t)c[i] - Li) * scale;
    }
    for (size_t i = m; i < nbytes * per; i++) bad |= c[i] != 0; /* padding of a short block */
    return bad ? CIRRUS_ECORRUPT : 0;
}

static inline __attribute__((always_inline)) int
fast_decode(const uint8_t *in, size_t len, size_t n, const int bits, float *out)
{
    if (len != blockwise_size(n, bits)) return CIRRUS_ECORRUPT;
    const size_t bb = SCALE_BYTES + (size_t)BLK * bits / 8;
    size_t b = 0;
    for (; n - b >= BLK; b += BLK, in += bb)
        if (fast_decode_block(out + b, in, BLK, bits)) return CIRRUS_ECORRUPT;
    if (b < n && fast_decode_block(out + b, in, n - b, bits)) return CIRRUS_ECORRUPT;
    return 0;
}

/* ---- the two table entries ---- */

static size_t q8_bound(size_t n, const wan_codec_params *p)
{
    return q8_width(p) ? blockwise_size(n, 8) : SIZE_MAX;
}

static int q8_encode(const float *x, size_t n, const wan_codec_params *p, uint8_t *out,
                     size_t cap, size_t *len)
{
    if (!q8_width(p)) return CIRRUS_EINVAL;
    return fast_encode(x, n, 8, out, cap, len);
}

static int q8_decode(const uint8_t *in, size_t len, size_t n, const wan_codec_params *p,
                     float *out)
{
    if (!q8_width(p)) return CIRRUS_EINVAL;
    return fast_decode(in, len, n, 8, out);
}

static int q8_encode_ref(const float *x, size_t n, const wan_codec_params *p, uint8_t *out,
                         size_t cap, size_t *len)
{
    if (!q8_width(p)) return CIRRUS_EINVAL;
    return ref_encode(x, n, 8, out, cap, len);
}

static int q8_decode_ref(const uint8_t *in, size_t len, size_t n, const wan_codec_params *p,
                         float *out)
{
    if (!q8_width(p)) return CIRRUS_EINVAL;
    return ref_decode(in, len, n, 8, out);
}

static size_t lowbit_bound(size_t n, const wan_codec_params *p)
{
    int w = lowbit_width(p);
    return w ? blockwise_size(n, w) : SIZE_MAX;
}

/* Separate instantiations per width, so each gets constant-bound loops. */
static int lowbit_encode(const float *x, size_t n, const wan_codec_params *p, uint8_t *out,
                         size_t cap, size_t *len)
{
    switch (lowbit_width(p)) {
    case 4: return fast_encode(x, n, 4, out, cap, len);
    case 2: return fast_encode(x, n, 2, out, cap, len);
    default: return CIRRUS_EINVAL;
    }
}

static int lowbit_decode(const uint8_t *in, size_t len, size_t n, const wan_codec_params *p,
                         float *out)
{
    switch (lowbit_width(p)) {
    case 4: return fast_decode(in, len, n, 4, out);
    case 2: return fast_decode(in, len, n, 2, out);
    default: return CIRRUS_EINVAL;
    }
}

static int lowbit_encode_ref(const float *x, size_t n, const wan_codec_params *p, uint8_t *out,
                             size_t cap, size_t *len)
{
    int w = lowbit_width(p);
    return w ? ref_encode(x, n, w, out, cap, len) : CIRRUS_EINVAL;
}

static int lowbit_decode_ref(const uint8_t *in, size_t len, size_t n, const wan_codec_params *p,
                             float *out)
{
    int w = lowbit_width(p);
    return w ? ref_decode(in, len, n, w, out) : CIRRUS_EINVAL;
}

const wan_codec wan_codec_q8_def = {
    .name = "q8",
    .id = WAN_CODEC_Q8,
    .error_feedback = 1,
    .bound = q8_bound,
    .encode = q8_encode,
    .decode = q8_decode,
    .encode_ref = q8_encode_ref,
    .decode_ref = q8_decode_ref,
    .decode_sub = NULL, /* blockwise: wan_encode decodes chunk by chunk */
};

const wan_codec wan_codec_lowbit_def = {
    .name = "lowbit",
    .id = WAN_CODEC_LOWBIT,
    .error_feedback = 1,
    .bound = lowbit_bound,
    .encode = lowbit_encode,
    .decode = lowbit_decode,
    .encode_ref = lowbit_encode_ref,
    .decode_ref = lowbit_decode_ref,
    .decode_sub = NULL,
};
