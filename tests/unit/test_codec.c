/* Tests of trainer/net/codec_q8: the size formula, the exact rounding rule, round-trip error
 * bounds, the fast versions against the reference bit for bit, and every way the encoder and
 * the decoder must refuse their input. Each check runs on both implementations. */
#include <float.h>
#include <stdint.h>
#include <string.h>

#include "../../common/cerr.h"
#include "../../trainer/codec/q8.h"
#include "test.h"

typedef int (*enc_fn)(uint8_t *, const float *, size_t);
typedef int (*dec_fn)(float *, size_t, const uint8_t *, size_t);

static const struct {
    const char *name;
    enc_fn enc;
    dec_fn dec;
} impls[2] = {
    {"fast", codec_q8_encode, codec_q8_decode},
    {"ref", codec_q8_encode_ref, codec_q8_decode_ref},
};

#define SCALE_MAX_BITS 0x7c010203u /* largest scale with 127 * scale finite: 0x1.020406p+121 */

/* ---- helpers ---- */

static uint64_t rng_next(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    *s = x;
    return x * 0x2545F4914F6CDD1DULL;
}

static double rng_uniform(uint64_t *s) /* in (0, 1) */
{
    return ((double)(rng_next(s) >> 11) + 0.5) / 9007199254740992.0;
}

static float rng_normal(uint64_t *s)
{
    double u = rng_uniform(s), v = rng_uniform(s);
    return (float)(sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v));
}

static float from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static uint32_t to_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static uint32_t scale_bits_at(const uint8_t *p) /* a little-endian scale, read byte by byte */
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void put_scale(uint8_t *p, uint32_t bits)
{
    for (int k = 0; k < 4; k++) p[k] = (uint8_t)(bits >> (8 * k));
}

static void *xmalloc(size_t size)
{
    void *p = malloc(size ? size : 1);
    ASSERT(p != NULL);
    return p;
}

/* Encode and decode x with implementation k; check every element against
 * |x - y| <= absmax/254 + absmax * 2^-20 + 2^-140 (the float rounding of the scale, the
 * product and, in the subnormal range, the scale itself), that every output is finite, and
 * return the largest error as a fraction of absmax/254 over blocks with absmax >= 2^-100. */
static double check_round_trip(int k, const float *x, size_t n)
{
    size_t len = codec_q8_encoded_size(n);
    uint8_t *enc = xmalloc(len);
    float *y = xmalloc(n * sizeof(float));
    ASSERT_OK(impls[k].enc(enc, x, n));
    ASSERT_OK(impls[k].dec(y, n, enc, len));
    double worst = 0.0;
    for (size_t b = 0; b < n; b += CODEC_Q8_BLOCK) {
        size_t blen = n - b < CODEC_Q8_BLOCK ? n - b : CODEC_Q8_BLOCK;
        double absmax = 0.0;
        for (size_t i = 0; i < blen; i++)
            if (fabs((double)x[b + i]) > absmax) absmax = fabs((double)x[b + i]);
        double bound = absmax / 254.0 + absmax * 0x1p-20 + 0x1p-140;
        for (size_t i = 0; i < blen; i++) {
            double err = fabs((double)x[b + i] - (double)y[b + i]);
            ASSERT(isfinite(y[b + i]));
            if (!(err <= bound))
                TEST_FAIL("%s: element %zu: x %.9g decoded %.9g, error %.9g > bound %.9g "
                          "(block absmax %.9g)",
                          impls[k].name, b + i, x[b + i], y[b + i], err, bound, absmax);
            if (absmax >= 0x1p-100 && err / (absmax / 254.0) > worst)
                worst = err / (absmax / 254.0);
        }
    }
    free(enc), free(y);
    return worst;
}

/* ---- the size formula ---- */

TEST(codec_encoded_size)
{
    ASSERT_EQ(codec_q8_encoded_size(0), 0);
    ASSERT_EQ(codec_q8_encoded_size(1), 5);
    ASSERT_EQ(codec_q8_encoded_size(63), 67);
    ASSERT_EQ(codec_q8_encoded_size(64), 68);
    ASSERT_EQ(codec_q8_encoded_size(65), 73);
    ASSERT_EQ(codec_q8_encoded_size(128), 136);
    ASSERT_EQ(codec_q8_encoded_size(1000), 1064); /* 15 * 68 + 4 + 40 */
    /* Counts no array can have saturate instead of wrapping to a small size. */
    ASSERT(codec_q8_encoded_size(SIZE_MAX) == SIZE_MAX);
}

TEST(codec_compression_ratio)
{
    size_t ns[] = {64, 640, 4096, 64 * 1000, (size_t)64 << 20};
    for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++) {
        size_t n = ns[i], enc = codec_q8_encoded_size(n);
        ASSERT_EQ(enc, n / 64 * 68);
        ASSERT_EQ(n * sizeof(float) * 68, enc * 256); /* exactly 256/68 */
        ASSERT_NEAR((double)(n * sizeof(float)) / (double)enc, 256.0 / 68.0, 1e-12);
        ASSERT_NEAR((double)(n * sizeof(float)) / (double)enc, 3.7647058823529, 1e-12);
    }
}

/* ---- the rounding rule and special blocks ---- */

/* absmax 127 makes inv exactly 1, so v == x and the rounding rule is seen directly:
 * halves go away from zero, and 0.49999997f (the float just below 1/2), where
 * (int)(v + 0.5f) would give 1, goes to 0. */
TEST(codec_rounding_half_away)
{
    static const float x[] = {127.0f, 0.5f,    1.5f,        2.5f,         -0.5f,
                              -1.5f,  -2.5f,   0.49999997f, -0.49999997f, 0.50000006f,
                              126.5f, -126.5f, 0.25f,       3.4999998f,   -127.0f,
                              0.0f,   1e-30f,  -63.5f,      62.5f};
    static const int8_t want[] = {127, 1,   2, 3, -1, -2, -3, 0,   0,  1,
                                  127, -127, 0, 3, -127, 0, 0,  -64, 63};
    size_t n = sizeof x / sizeof x[0];
    ASSERT_EQ(n, sizeof want);
    for (int k = 0; k < 2; k++) {
        uint8_t enc[4 + sizeof want];
        ASSERT_OK(impls[k].enc(enc, x, n));
        ASSERT_EQ(scale_bits_at(enc), to_bits(1.0f)); /* 127 / 127 */
        for (size_t i = 0; i < n; i++)
            if ((int8_t)enc[4 + i] != want[i])
                TEST_FAIL("%s: x %.9g encoded as %d, want %d", impls[k].name, x[i],
                          (int8_t)enc[4 + i], want[i]);
        float y[sizeof want];
        ASSERT_OK(impls[k].dec(y, n, enc, sizeof enc));
        for (size_t i = 0; i < n; i++) ASSERT(y[i] == (float)want[i]);
    }
}

TEST(codec_zero_block)
{
    /* Block 0 all zeros (some -0.0), block 1 nonzero, block 2 (a short tail) zeros. */
    size_t n = 64 + 64 + 7;
    float x[64 + 64 + 7];
    for (size_t i = 0; i < n; i++) x[i] = (i % 3) ? 0.0f : -0.0f;
    x[64 + 5] = 2.0f;
    for (int k = 0; k < 2; k++) {
        uint8_t enc[68 + 68 + 11];
        ASSERT_EQ(codec_q8_encoded_size(n), sizeof enc);
        memset(enc, 0xEE, sizeof enc);
        ASSERT_OK(impls[k].enc(enc, x, n));
        for (size_t i = 0; i < 68; i++) ASSERT_EQ(enc[i], 0);          /* scale 0, q 0 */
        for (size_t i = 136; i < sizeof enc; i++) ASSERT_EQ(enc[i], 0); /* the tail too */
        ASSERT_EQ(scale_bits_at(enc + 68), to_bits(2.0f / 127.0f));
        ASSERT_EQ((int8_t)enc[68 + 4 + 5], 127);
        float y[64 + 64 + 7];
        memset(y, 0xEE, sizeof y);
        ASSERT_OK(impls[k].dec(y, n, enc, sizeof enc));
        for (size_t i = 0; i < n; i++) {
            if (i == 64 + 5) continue;
            ASSERT_EQ(to_bits(y[i]), 0); /* +0.0 exactly, never NaN from 0/0 */
        }
        ASSERT(y[64 + 5] == 2.0f);
    }
}

TEST(codec_single_nonzero)
{
    for (int k = 0; k < 2; k++) {
        /* One value in a full block: it becomes -127 with scale 3/127 (0x3cc18306). */
        float x[64] = {0};
        x[17] = -3.0f;
        uint8_t enc[68];
        ASSERT_OK(impls[k].enc(enc, x, 64));
        static const uint8_t scale_le[4] = {0x06, 0x83, 0xc1, 0x3c};
        ASSERT(memcmp(enc, scale_le, 4) == 0);
        for (int i = 0; i < 64; i++) ASSERT_EQ(enc[4 + i], i == 17 ? 0x81 : 0);
        float y[64];
        ASSERT_OK(impls[k].dec(y, 64, enc, sizeof enc));
        for (int i = 0; i < 64; i++) ASSERT(y[i] == (i == 17 ? -3.0f : 0.0f));

        /* A one-element encoding: 1.0 -> scale 1/127 (0x3c010204) and q 127, 5 bytes. */
        float one = 1.0f, back = 0.0f;
        uint8_t e1[5];
        static const uint8_t want1[5] = {0x04, 0x02, 0x01, 0x3c, 0x7f};
        ASSERT_OK(impls[k].enc(e1, &one, 1));
        ASSERT(memcmp(e1, want1, 5) == 0);
        ASSERT_OK(impls[k].dec(&back, 1, e1, 5));
        ASSERT(back == 1.0f);
    }
}

/* ---- round trips ---- */

TEST(codec_round_trip_normal)
{
    size_t n = 100000 + 37; /* a ragged tail */
    float *x = xmalloc(n * sizeof(float));
    uint64_t s = 0x1234567;
    for (size_t i = 0; i < n; i++) x[i] = rng_normal(&s);
    for (int k = 0; k < 2; k++) {
        double worst = check_round_trip(k, x, n);
        /* Rounding to nearest makes the bound nearly attained; truncating would reach 2. */
        ASSERT(worst > 0.99);
        ASSERT(worst <= 1.0 + 254.0 * 0x1p-20);
    }
    free(x);
}

TEST(codec_round_trip_dynamic_range)
{
    size_t n = 64 * 300 + 50;
    float *x = xmalloc(n * sizeof(float));
    uint64_t s = 99;
    /* Each value: a normal times 2^e, e uniform in [-150, 124]: subnormals to ~1e37, mixed
     * within blocks (small values in a block of large ones decode to 0, within the bound). */
    for (size_t i = 0; i < n; i++)
        x[i] = (float)ldexp((double)rng_normal(&s), (int)(rng_next(&s) % 275) - 150);
    /* Whole blocks at the extremes: subnormal, around the 2^-96 prescale threshold, huge. */
    for (size_t i = 0; i < 64; i++) {
        x[64 * 10 + i] = from_bits((uint32_t)(rng_next(&s) % 0x800000)) * (i % 2 ? 1 : -1);
        x[64 * 11 + i] = 0x1p-96f * (float)(i + 1) / 64.0f; /* absmax exactly 2^-96 */
        x[64 * 12 + i] = 0x1p-96f * (float)i / 64.0f;       /* absmax just below */
        x[64 * 13 + i] = rng_normal(&s) * 1e37f;
        x[64 * 14 + i] = (float)i * 0x1p-149f;              /* 0 .. 63 * min subnormal */
    }
    /* The largest finite magnitudes, in a full block and in the tail. */
    x[64 * 20] = FLT_MAX, x[64 * 20 + 1] = -FLT_MAX, x[64 * 20 + 2] = 1.0f;
    x[n - 1] = -FLT_MAX;
    for (int k = 0; k < 2; k++) {
        double worst = check_round_trip(k, x, n);
        ASSERT(worst > 0.9);
        ASSERT(worst <= 1.0 + 254.0 * 0x1p-20);
    }

    /* The FLT_MAX block: scale clamped to the largest value whose 127 multiple is finite. */
    for (int k = 0; k < 2; k++) {
        uint8_t enc[68];
        float y[64];
        ASSERT_OK(impls[k].enc(enc, x + 64 * 20, 64));
        ASSERT_EQ(scale_bits_at(enc), SCALE_MAX_BITS);
        ASSERT_EQ((int8_t)enc[4], 127);
        ASSERT_EQ((int8_t)enc[5], -127);
        ASSERT_EQ((int8_t)enc[6], 0);
        ASSERT_OK(impls[k].dec(y, 64, enc, sizeof enc));
        ASSERT(y[0] == 0x1.fffffcp+127f && y[1] == -0x1.fffffcp+127f);

        /* A lone smallest subnormal: q 127, but its scale 2^-149/127 underflows to 0. */
        float tiny = 0x1p-149f, back = 1.0f;
        uint8_t e1[5];
        ASSERT_OK(impls[k].enc(e1, &tiny, 1));
        ASSERT_EQ(scale_bits_at(e1), 0);
        ASSERT_EQ((int8_t)e1[4], 127);
        ASSERT_OK(impls[k].dec(&back, 1, e1, 5));
        ASSERT(back == 0.0f);
    }
    free(x);
}

/* ---- the fast versions against the reference ---- */

/* Fill x[0..n) with one of several kinds of data, all finite. */
static void fill_kind(float *x, size_t n, int kind, uint64_t *s)
{
    for (size_t i = 0; i < n; i++) {
        switch (kind) {
        case 0: x[i] = rng_normal(s); break;
        case 1: x[i] = (float)ldexp((double)rng_normal(s), (int)(rng_next(s) % 275) - 150); break;
        case 2: { /* any finite bit pattern: subnormals, -0.0, huge */
            uint32_t u;
            do u = (uint32_t)rng_next(s);
            while ((u & 0x7f800000u) == 0x7f800000u);
            x[i] = from_bits(u);
            break;
        }
        case 3: /* halves and near-halves with absmax 127 where it lands */
            x[i] = (float)((int)(rng_next(s) % 255) - 127) + 0.5f * (float)(rng_next(s) % 2);
            if (rng_next(s) % 8 == 0) x[i] = (rng_next(s) % 2) ? 0.49999997f : -0.50000006f;
            if (x[i] > 127.0f) x[i] = 127.0f;
            if (x[i] < -127.0f) x[i] = -127.0f;
            break;
        default: /* sparse: mostly +-0 */
            x[i] = rng_next(s) % 16 ? ((rng_next(s) % 2) ? 0.0f : -0.0f) : rng_normal(s) * 1e-3f;
            break;
        }
    }
}

TEST(codec_fast_matches_ref)
{
    uint64_t s = 2024;
    size_t max_n = 64 * 80 + 63;
    float *x = xmalloc(max_n * sizeof(float));
    float *y_fast = xmalloc(max_n * sizeof(float)), *y_ref = xmalloc(max_n * sizeof(float));
    uint8_t *e_fast = xmalloc(codec_q8_encoded_size(max_n));
    uint8_t *e_ref = xmalloc(codec_q8_encoded_size(max_n));
    int n_compared = 0;
    for (int it = 0; it < 1500; it++) {
        size_t n;
        if (it < 200) n = (size_t)it; /* every size 0..199: every tail length, several times */
        else if (it < 300) n = 64 * (size_t)(it - 199) + (size_t)(it % 3) - 1; /* 64k-1 .. 64k+1 */
        else n = (size_t)(rng_next(&s) % (max_n + 1));
        if (n > max_n) n = max_n;
        int kind = it % 5;
        fill_kind(x, n, kind, &s);
        size_t len = codec_q8_encoded_size(n);
        memset(e_fast, 0x11, len), memset(e_ref, 0x22, len);
        ASSERT_OK(codec_q8_encode(e_fast, x, n));
        ASSERT_OK(codec_q8_encode_ref(e_ref, x, n));
        if (memcmp(e_fast, e_ref, len) != 0) {
            size_t at = 0;
            while (e_fast[at] == e_ref[at]) at++;
            TEST_FAIL("n %zu kind %d: encoded byte %zu: fast 0x%02x ref 0x%02x", n, kind, at,
                      e_fast[at], e_ref[at]);
        }
        memset(y_fast, 0x11, n * sizeof(float)), memset(y_ref, 0x22, n * sizeof(float));
        ASSERT_OK(codec_q8_decode(y_fast, n, e_fast, len));
        ASSERT_OK(codec_q8_decode_ref(y_ref, n, e_fast, len));
        if (n && memcmp(y_fast, y_ref, n * sizeof(float)) != 0) {
            size_t at = 0;
            while (to_bits(y_fast[at]) == to_bits(y_ref[at])) at++;
            TEST_FAIL("n %zu kind %d: decoded %zu: fast %a ref %a", n, kind, at, y_fast[at],
                      y_ref[at]);
        }
        n_compared++;
    }
    ASSERT_EQ(n_compared, 1500);

    /* Random byte strings as decoder input: both must agree on the verdict and, when they
     * accept, on every bit; accepted output is always finite. */
    int accepted = 0, refused = 0;
    for (int it = 0; it < 3000; it++) {
        size_t n = (size_t)(rng_next(&s) % 300);
        size_t len = codec_q8_encoded_size(n);
        for (size_t i = 0; i < len; i++) {
            uint8_t c = (uint8_t)rng_next(&s);
            e_fast[i] = (c == 0x80 && it % 4) ? 0x7f : c; /* -128 only in one try in four */
        }
        if (it % 2) /* mostly valid scales half the time */
            for (size_t b = 0; b < len; b += 68)
                put_scale(e_fast + b, (uint32_t)(rng_next(&s) % (SCALE_MAX_BITS + 1ull)));
        int rc_fast = codec_q8_decode(y_fast, n, e_fast, len);
        int rc_ref = codec_q8_decode_ref(y_ref, n, e_fast, len);
        ASSERT_EQ(rc_fast, rc_ref);
        if (rc_fast == 0) {
            accepted++;
            ASSERT(n == 0 || memcmp(y_fast, y_ref, n * sizeof(float)) == 0);
            for (size_t i = 0; i < n; i++) ASSERT(isfinite(y_fast[i]));
        } else {
            ASSERT_EQ(rc_fast, CIRRUS_ECORRUPT);
            refused++;
        }
    }
    ASSERT(accepted > 500 && refused > 500);
    free(x), free(y_fast), free(y_ref), free(e_fast), free(e_ref);
}

/* ---- refusals ---- */

TEST(codec_rejects_nonfinite)
{
    static const uint32_t bad[] = {0x7fc00000u, 0xffc00000u, 0x7fc01234u, 0x7f800001u,
                                   0x7f800000u, 0xff800000u};
    static const size_t at[] = {0, 1, 63, 64, 99};
    float x[100];
    uint8_t enc[108];
    ASSERT_EQ(codec_q8_encoded_size(100), sizeof enc);
    uint64_t s = 5;
    for (int k = 0; k < 2; k++)
        for (size_t b = 0; b < sizeof bad / sizeof bad[0]; b++)
            for (size_t a = 0; a < sizeof at / sizeof at[0]; a++) {
                for (int i = 0; i < 100; i++) x[i] = rng_normal(&s);
                x[at[a]] = from_bits(bad[b]);
                ASSERT_EQ(impls[k].enc(enc, x, 100), CIRRUS_EINVAL);
                x[at[a]] = (bad[b] >> 31) ? -FLT_MAX : FLT_MAX; /* the largest finite is fine */
                ASSERT_OK(impls[k].enc(enc, x, 100));
            }
    /* n == 0 encodes to nothing, whatever the pointers. */
    for (int k = 0; k < 2; k++) ASSERT_OK(impls[k].enc(NULL, NULL, 0));
}

TEST(codec_decode_rejects_bad_length)
{
    float x[100], y[100];
    uint64_t s = 6;
    for (int i = 0; i < 100; i++) x[i] = rng_normal(&s);
    uint8_t enc[109] = {0};
    ASSERT_OK(codec_q8_encode(enc, x, 100)); /* 108 bytes, one spare for the long case */
    for (int k = 0; k < 2; k++) {
        ASSERT_OK(impls[k].dec(y, 100, enc, 108));
        ASSERT_EQ(impls[k].dec(y, 100, enc, 107), CIRRUS_ECORRUPT); /* one short */
        ASSERT_EQ(impls[k].dec(y, 100, enc, 109), CIRRUS_ECORRUPT); /* one long */
        ASSERT_EQ(impls[k].dec(y, 100, enc, 68), CIRRUS_ECORRUPT);
        ASSERT_EQ(impls[k].dec(y, 100, enc, 0), CIRRUS_ECORRUPT);
        ASSERT_EQ(impls[k].dec(y, 99, enc, 108), CIRRUS_ECORRUPT); /* n disagrees */
        ASSERT_OK(impls[k].dec(y, 0, enc, 0));
        ASSERT_OK(impls[k].dec(NULL, 0, NULL, 0));
        ASSERT_EQ(impls[k].dec(y, 0, enc, 4), CIRRUS_ECORRUPT);
        /* Counts no float array can have: refused before anything is written. */
        ASSERT_EQ(impls[k].dec(y, SIZE_MAX, enc, SIZE_MAX), CIRRUS_ECORRUPT);
        size_t huge = SIZE_MAX / sizeof(float) + 1;
        ASSERT_EQ(impls[k].dec(y, huge, enc, codec_q8_encoded_size(huge)), CIRRUS_ECORRUPT);
    }
}

TEST(codec_decode_rejects_bad_scale)
{
    float x[100], y[100];
    uint64_t s = 7;
    for (int i = 0; i < 100; i++) x[i] = rng_normal(&s);
    uint8_t good[108], enc[108];
    ASSERT_OK(codec_q8_encode(good, x, 100));
    static const uint32_t bad[] = {
        0x7fc00000u, /* NaN */
        0xffc00000u, /* negative NaN */
        0x7f800001u, /* signalling NaN */
        0x7f800000u, /* +Inf */
        0xff800000u, /* -Inf */
        0xbf800000u, /* -1.0 */
        0x80000001u, /* the smallest negative subnormal */
        0x80000000u, /* -0.0: never produced by the encoder */
        0x7f7fffffu, /* FLT_MAX: 127 * it overflows */
        SCALE_MAX_BITS + 1,
    };
    static const size_t where[] = {0, 68}; /* a full block's scale and the tail's */
    for (int k = 0; k < 2; k++) {
        for (size_t b = 0; b < sizeof bad / sizeof bad[0]; b++)
            for (size_t w = 0; w < 2; w++) {
                memcpy(enc, good, sizeof enc);
                put_scale(enc + where[w], bad[b]);
                if (impls[k].dec(y, 100, enc, sizeof enc) != CIRRUS_ECORRUPT)
                    TEST_FAIL("%s: scale 0x%08x at %zu accepted", impls[k].name, bad[b],
                              where[w]);
            }
        /* The edges that are valid: 0, the smallest subnormal, the largest allowed. */
        static const uint32_t ok[] = {0u, 1u, SCALE_MAX_BITS};
        for (size_t o = 0; o < 3; o++) {
            memcpy(enc, good, sizeof enc);
            put_scale(enc + 68, ok[o]);
            enc[68 + 4] = 0x7f, enc[68 + 5] = 0x81; /* q = 127, -127 */
            ASSERT_OK(impls[k].dec(y, 100, enc, sizeof enc));
            ASSERT(y[64] == 127.0f * from_bits(ok[o]) && y[65] == -y[64]);
            ASSERT(isfinite(y[64]));
        }
        ASSERT(y[64] == 0x1.fffffcp+127f);
    }
}

TEST(codec_decode_rejects_minus_128)
{
    float x[100], y[100];
    uint64_t s = 8;
    for (int i = 0; i < 100; i++) x[i] = rng_normal(&s);
    uint8_t good[108], enc[108];
    ASSERT_OK(codec_q8_encode(good, x, 100));
    for (size_t i = 4; i < 108; i++) /* q bytes only: [4, 68) and [72, 108) */
        if (i < 68 || i >= 72) ASSERT(good[i] != 0x80);
    static const size_t at[] = {4, 67, 72, 107}; /* first/last of the full block and tail */
    for (int k = 0; k < 2; k++)
        for (size_t a = 0; a < 4; a++) {
            memcpy(enc, good, sizeof enc);
            enc[at[a]] = 0x80;
            ASSERT_EQ(impls[k].dec(y, 100, enc, sizeof enc), CIRRUS_ECORRUPT);
        }
}
