/* Tests of trainer/gateway/wan_codec: spec strings, each codec's error bound, fast == reference
 * bit for bit (bytes and floats, ragged sizes, zero blocks, corrupted bodies), error feedback
 * losing no mass, zstd, compression ratios, and a decoder that refuses every malformed message
 * with CIRRUS_ECORRUPT (also run under ASan + UBSan). */
#include <float.h>
#include <stdint.h>
#include <string.h>
#include <zstd.h>

#include "../../common/cerr.h"
#include "../../common/le.h"
#include "../../common/rng.h"
#include "../../trainer/gateway/wan_codec.h"
#include "test.h"

/* ---- helpers ---- */

static void *xmalloc(size_t size)
{
    void *p = malloc(size ? size : 1);
    ASSERT(p != NULL);
    return p;
}

static wan_codec_params spec(const char *s)
{
    wan_codec_params p;
    cirrus_error err = {0};
    if (wan_codec_parse(s, &p, &err)) TEST_FAIL("parse '%s': %s", s, err.msg);
    return p;
}

/* Data of a few kinds: 0 mixed scales with zero blocks and zeros, 1 all zero, 2 subnormal
 * and tiny, 3 huge (up to FLT_MAX), 4 sparse, 5 ties (a few magnitudes). */
#define KINDS 6
static float *gen(size_t n, uint64_t seed, int kind)
{
    float *x = xmalloc(n * sizeof *x);
    rng_state r;
    rng_seed(&r, seed * 131 + (uint64_t)kind);
    float scale = 1.0f;
    for (size_t i = 0; i < n; i++) {
        if (i % 64 == 0)
            scale = rng_below(&r, 8) == 0 ? 0.0f : powf(10.0f, 4.0f * rng_uniform(&r) - 3.0f);
        float g = rng_normal(&r);
        switch (kind) {
        case 0: x[i] = rng_below(&r, 50) == 0 ? 0.0f : g * scale; break;
        case 1: x[i] = 0.0f; break;
        case 2: x[i] = rng_below(&r, 4) == 0 ? 0.0f : g * 0x1p-130f * (scale + 1.0f); break;
        case 3: x[i] = rng_below(&r, 97) == 0 ? (g < 0 ? -FLT_MAX : FLT_MAX) : g * 1e37f; break;
        case 4: x[i] = rng_below(&r, 100) == 0 ? g : 0.0f; break;
        default: x[i] = (float)((int)rng_below(&r, 5) - 2); break;
        }
    }
    return x;
}

/* Every configuration the table offers, as specs. */
static const char *const configs[] = {"none",     "fp16",   "q8",       "topk:0.01", "topk:0.1:8",
                                      "topk:0.3", "topk:1", "lowbit:4", "lowbit:2"};
#define NCONFIG (sizeof configs / sizeof configs[0])

/* The blockwise codecs and their L (levels each side of zero). */
static const struct { const char *spec; float L; } blockwise[] = {
    {"q8", 127.0f}, {"lowbit:4", 7.0f}, {"lowbit:2", 1.0f}};

/* Encode x with the codec's fast (ref = 0) or reference path into a fresh buffer. */
static uint8_t *body_encode(const wan_codec_params *p, const float *x, size_t n, int ref,
                            size_t *len)
{
    const wan_codec *c = wan_codec_by_id(p->id);
    size_t cap = c->bound(n, p);
    ASSERT(cap != SIZE_MAX);
    uint8_t *out = xmalloc(cap);
    ASSERT_OK((ref ? c->encode_ref : c->encode)(x, n, p, out, cap, len));
    ASSERT(*len <= cap);
    return out;
}

static uint8_t *msg_encode(const wan_codec_params *p, const float *x, float *residual, size_t n,
                           size_t *len)
{
    size_t cap = wan_encode_bound(n, p);
    ASSERT(cap != SIZE_MAX);
    uint8_t *out = xmalloc(cap);
    cirrus_error err = {0};
    if (wan_encode(p, x, residual, n, out, cap, len, &err)) TEST_FAIL("wan_encode: %s", err.msg);
    ASSERT(*len <= wan_message_max(n));
    return out;
}

static size_t msg_len(const char *s, const float *x, size_t n)
{
    wan_codec_params p = spec(s);
    size_t len;
    free(msg_encode(&p, x, NULL, n, &len));
    return len;
}

static void msg_decode_ok(const uint8_t *m, size_t len, float *out, size_t n)
{
    cirrus_error err = {0};
    if (wan_decode(m, len, out, n, &err)) TEST_FAIL("wan_decode: %s", err.msg);
}

/* The decoder refuses m: CIRRUS_ECORRUPT, a one-line message, nothing written past out[n). */
static void expect_corrupt(const uint8_t *m, size_t len, size_t n, const char *what)
{
    float *out = xmalloc((n + 1) * sizeof *out);
    out[n] = 12345.0f;
    cirrus_error err = {0};
    int rc = wan_decode(m, len, out, n, &err);
    if (rc != CIRRUS_ECORRUPT) TEST_FAIL("%s: wan_decode returned %d, not ECORRUPT", what, rc);
    ASSERT(err.code == CIRRUS_ECORRUPT && err.msg[0] && !strchr(err.msg, '\n'));
    ASSERT(out[n] == 12345.0f);
    free(out);
}

/* m with the size-byte little-endian field at off set to v is refused. */
static void corrupt_at(const uint8_t *m, size_t len, size_t n, size_t off, int size, uint64_t v,
                       const char *what)
{
    uint8_t *c = xmalloc(len);
    memcpy(c, m, len);
    le_put(c + off, v, size);
    expect_corrupt(c, len, n, what);
    free(c);
}

/* ---- the table and spec strings ---- */

TEST(wan_codec_table)
{
    static const char *names[] = {"none", "fp16", "q8", "topk", "lowbit"};
    ASSERT(WAN_CODEC_NONE == 0 && WAN_CODEC_FP16 == 1 && WAN_CODEC_Q8 == 2 &&
           WAN_CODEC_TOPK == 3 && WAN_CODEC_LOWBIT == 4); /* on the wire */
    for (int id = 0; id < WAN_CODEC_COUNT; id++) {
        const wan_codec *c = wan_codec_by_id(id);
        ASSERT(c && c->id == id && !strcmp(c->name, names[id]));
        ASSERT(wan_codec_by_name(names[id]) == c);
        ASSERT(c->bound && c->encode && c->decode && c->encode_ref && c->decode_ref);
    }
    ASSERT(wan_codec_by_id(-1) == NULL && wan_codec_by_id(WAN_CODEC_COUNT) == NULL);
    ASSERT(wan_codec_by_name("bogus") == NULL && wan_codec_by_name(NULL) == NULL);
    ASSERT(wan_codec_by_id(WAN_CODEC_TOPK)->error_feedback &&
           wan_codec_by_id(WAN_CODEC_LOWBIT)->error_feedback &&
           !wan_codec_by_id(WAN_CODEC_NONE)->error_feedback);
}

TEST(wan_codec_parse_valid)
{
    wan_codec_params p = spec("topk:0.01");
    ASSERT(p.id == WAN_CODEC_TOPK && p.density == 0.01 && p.bits == 16 && !p.zstd && p.k == 0);
    p = spec("topk:0.5:8+zstd");
    ASSERT(p.id == WAN_CODEC_TOPK && p.density == 0.5 && p.bits == 8 && p.zstd);
    wan_codec_params l = spec("lowbit:2"), q = spec("q8+zstd"), z = spec("none");
    ASSERT(l.id == WAN_CODEC_LOWBIT && l.bits == 2 && !l.zstd);
    ASSERT(q.id == WAN_CODEC_Q8 && q.bits == 8 && q.zstd && z.id == WAN_CODEC_NONE && z.bits == 32);
    static const char *round[] = {"none",   "fp16+zstd",  "q8",       "topk:0.01",
                                  "topk:1", "topk:1e-07", "lowbit:4", "lowbit:2+zstd",
                                  "topk:0.0123456789:8+zstd"};
    for (size_t i = 0; i < sizeof round / sizeof round[0]; i++) {
        char buf[64];
        wan_codec_params a = spec(round[i]);
        wan_codec_format(&a, buf, sizeof buf);
        wan_codec_params b = spec(buf);
        ASSERT(a.id == b.id && a.density == b.density && a.bits == b.bits && a.zstd == b.zstd);
        ASSERT(strcmp(buf, round[i]) == 0);
    }
}

TEST(wan_codec_parse_invalid)
{
    static const struct { const char *spec, *says; } bad[] = {
        {"topk:0", "density"},           {"topk:1.5", "density"},
        {"topk:-0.1", "density"},        {"topk:nan", "density"},
        {"topk:0.1x", "density"},        {"topk", "needs a density"},
        {"topk:0.1:12", "8 or 16"},      {"lowbit:3", "lowbit width"},
        {"lowbit", "lowbit width"},      {"lowbit:4:4", "lowbit width"},
        {"bogus", "unknown codec 'bogus'"}, {"q8+zip", "'+zip'"},
        {"q8:3", "no parameters"},       {"", "empty"},
        {"fp16+zstd+zstd", "suffix"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        wan_codec_params p = {.id = 77};
        cirrus_error err = {0};
        ASSERT_EQ(wan_codec_parse(bad[i].spec, &p, &err), CIRRUS_EINVAL);
        if (!strstr(err.msg, bad[i].says)) TEST_FAIL("'%s': message '%s'", bad[i].spec, err.msg);
        ASSERT(p.id == 77); /* unchanged */
    }
}

/* ---- error bounds ---- */

/* Every finite half round-trips; ties go to even; saturation; random floats within 2^-11. */
TEST(wan_codec_fp16_rounding)
{
    const wan_codec *c = wan_codec_by_id(WAN_CODEC_FP16);
    wan_codec_params p = spec("fp16");
    size_t n = 0, len, l2;
    uint8_t *h = xmalloc(2 * 65536);
    for (uint32_t v = 0; v < 65536; v++)
        if ((v & 0x7c00) != 0x7c00) le_put(h + 2 * n++, v, 2);
    float *f = xmalloc(n * sizeof *f), *g = xmalloc(n * sizeof *g);
    ASSERT(!c->decode(h, 2 * n, n, &p, f) && !c->decode_ref(h, 2 * n, n, &p, g));
    ASSERT(memcmp(f, g, n * sizeof *f) == 0);
    for (int ref = 0; ref < 2; ref++) {
        uint8_t *e = body_encode(&p, f, n, ref, &len);
        ASSERT(len == 2 * n && memcmp(e, h, len) == 0);
        free(e);
    }
    ASSERT(f[1] == 0x1p-24f && f[0x3c00] == 1.0f && f[0x7bff] == 65504.0f);
    /* Midpoints of neighbours (exact in float) round to the even one; f[v] is half v here. */
    float mid[3 * 0x7bff];
    uint16_t want[3 * 0x7bff];
    size_t m = 0;
    for (uint32_t v = 0; v < 0x7bff; v++) {
        float half = (f[v] + f[v + 1]) / 2;
        mid[m] = half, want[m++] = (uint16_t)(v % 2 ? v + 1 : v);
        mid[m] = nextafterf(half, 0.0f), want[m++] = (uint16_t)v;
        mid[m] = -nextafterf(half, INFINITY), want[m++] = (uint16_t)(0x8000 | (v + 1));
    }
    for (int ref = 0; ref < 2; ref++) {
        uint8_t *e = body_encode(&p, mid, m, ref, &len);
        for (size_t i = 0; i < m; i++)
            if (le_get(e + 2 * i, 2) != want[i])
                TEST_FAIL("%s: %a -> 0x%04x, want 0x%04x", ref ? "ref" : "fast", mid[i],
                          (unsigned)le_get(e + 2 * i, 2), want[i]);
        free(e);
    }
    /* Random floats of every exponent (and saturation instead of Inf): fast == ref, and the
     * relative error bound in the normal range. */
    size_t r = 1 << 18;
    float *x = xmalloc(r * sizeof *x), *y = xmalloc(r * sizeof *y);
    rng_state s;
    rng_seed(&s, 5);
    for (size_t i = 0; i < r; i++) {
        uint32_t u = (uint32_t)rng_next(&s);
        u = (u & 0x7f800000u) == 0x7f800000u ? u & 0xbfffffffu : u; /* finite */
        memcpy(&x[i], &u, sizeof u);
    }
    x[0] = 65519.99f, x[1] = 65520.0f, x[2] = -1e30f, x[3] = FLT_MAX;
    uint8_t *e = body_encode(&p, x, r, 0, &len), *e2 = body_encode(&p, x, r, 1, &l2);
    ASSERT(len == l2 && memcmp(e, e2, len) == 0);
    ASSERT_OK(c->decode(e, len, r, &p, y));
    for (size_t i = 0; i < r; i++) {
        float a = fabsf(x[i]);
        if (a >= 65504.0f) ASSERT(fabsf(y[i]) == 65504.0f);
        else if (a >= 0x1p-14f) ASSERT(fabsf(y[i] - x[i]) <= a * 0x1p-11f);
        else ASSERT(fabsf(y[i] - x[i]) <= 0x1p-25f);
    }
    free(h), free(f), free(g), free(x), free(y), free(e), free(e2);
}

/* q8 and lowbit: |x - y| <= absmax/(2L) + absmax * 2^-20 + 2^-140 per block, and the
 * exact rounding rule. */
TEST(wan_codec_blockwise_error_bounds)
{
    size_t n = 64 * 300 + 17;
    float *y = xmalloc(n * sizeof *y);
    for (size_t ci = 0; ci < 3; ci++)
        for (int kind = 0; kind < KINDS; kind++) {
            wan_codec_params p = spec(blockwise[ci].spec);
            float *x = gen(n, 2, kind);
            size_t len;
            uint8_t *m = msg_encode(&p, x, NULL, n, &len);
            msg_decode_ok(m, len, y, n);
            for (size_t b = 0; b < n; b += 64) {
                size_t e = b + 64 < n ? b + 64 : n;
                float absmax = 0.0f;
                for (size_t i = b; i < e; i++) absmax = fmaxf(absmax, fabsf(x[i]));
                double tol = absmax / (2.0 * blockwise[ci].L) + absmax * 0x1p-20 + 0x1p-140;
                for (size_t i = b; i < e; i++)
                    if (!isfinite(y[i]) || !(fabs((double)x[i] - y[i]) <= tol))
                        TEST_FAIL("%s kind %d [%zu]: %a -> %a, tol %a", blockwise[ci].spec, kind,
                                  i, x[i], y[i], tol);
            }
            free(x), free(m);
        }
    free(y);
    /* Blocks with absmax == L have inv == 1 and scale == 1, so v == x and y == q: rounding
     * is half away from zero, and 0.49999997f (the float below 1/2) goes to 0, where the
     * tempting (int)(|v| + 0.5f) gives 1. */
    for (int ci = 0; ci < 3; ci++) {
        wan_codec_params p = spec(blockwise[ci].spec);
        const wan_codec *c = wan_codec_by_id(p.id);
        float x[64], y[64];
        n = 0;
        x[n++] = blockwise[ci].L;
        for (float k = 0.0f; k < blockwise[ci].L && n + 6 <= 64; k += 1.0f) {
            float h = k + 0.5f;
            x[n++] = h, x[n++] = nextafterf(h, 0.0f), x[n++] = nextafterf(h, INFINITY);
            x[n++] = -h, x[n++] = -nextafterf(h, 0.0f), x[n++] = -nextafterf(h, INFINITY);
        }
        for (int ref = 0; ref < 2; ref++) {
            size_t len;
            uint8_t *b = body_encode(&p, x, n, ref, &len);
            ASSERT_OK((ref ? c->decode_ref : c->decode)(b, len, n, &p, y));
            for (size_t i = 0; i < n; i++)
                if (y[i] != roundf(x[i]))
                    TEST_FAIL("%s %s: %a -> %a, want %a", blockwise[ci].spec,
                              ref ? "ref" : "fast", x[i], y[i], roundf(x[i]));
            free(b);
        }
    }
}

/* Selection: the k largest |x|, ties to the lower index; k = max(1, ceil(density n)). */
TEST(wan_codec_topk_selection)
{
    float x[10] = {1, -3, 3, 2, -3, 0, 0.5f, 0, 0, 0}, y[10];
    wan_codec_params p = spec("topk:0.2"), info;
    size_t len, n;
    uint8_t *m = msg_encode(&p, x, NULL, 10, &len);
    msg_decode_ok(m, len, y, 10);
    for (int i = 0; i < 10; i++) ASSERT(y[i] == (i == 1 || i == 2 ? x[i] : 0.0f));
    ASSERT_OK(wan_message_info(m, len, &info, &n, NULL));
    ASSERT(n == 10 && info.k == 2 && info.id == WAN_CODEC_TOPK && info.bits == 16);
    free(m);
    /* k from density, products just above an integer, the k = 1 floor; every kept |x| is
     * >= every dropped one. */
    static const struct { double d; size_t n, k; } ks[] = {
        {0.07, 100, 7}, {0.01, 1000003, 10001}, {1e-9, 50, 1}, {1.0, 33, 33}, {0.5, 1, 1}};
    for (size_t i = 0; i < sizeof ks / sizeof ks[0]; i++) {
        wan_codec_params q = {.id = WAN_CODEC_TOPK, .density = ks[i].d};
        float *z = gen(ks[i].n, 3, 0), *w = xmalloc(ks[i].n * sizeof *w);
        m = msg_encode(&q, z, NULL, ks[i].n, &len);
        ASSERT_OK(wan_message_info(m, len, &info, NULL, NULL));
        ASSERT_EQ(info.k, ks[i].k);
        ASSERT_EQ(wan_codec_topk_k(ks[i].n, &q), ks[i].k);
        msg_decode_ok(m, len, w, ks[i].n);
        float kept_min = INFINITY, dropped_max = 0.0f;
        size_t kept = 0;
        for (size_t j = 0; j < ks[i].n; j++) {
            if (w[j] != 0.0f) kept++, kept_min = fminf(kept_min, fabsf(z[j]));
            else dropped_max = fmaxf(dropped_max, fabsf(z[j]));
        }
        ASSERT(kept <= ks[i].k && (kept == ks[i].k || dropped_max == 0.0f));
        ASSERT(kept == 0 || kept_min >= dropped_max);
        free(z), free(w), free(m);
    }
}

/* ---- fast == reference ---- */

static void check_fast_ref(const wan_codec_params *p, const float *x, size_t n, const char *what)
{
    const wan_codec *c = wan_codec_by_id(p->id);
    size_t l1, l2;
    uint8_t *a = body_encode(p, x, n, 0, &l1), *b = body_encode(p, x, n, 1, &l2);
    if (l1 != l2 || memcmp(a, b, l1)) TEST_FAIL("%s: fast and reference bodies differ", what);
    if (c->id != WAN_CODEC_TOPK) ASSERT_EQ(l1, c->bound(n, p)); /* dense sizes are exact */
    wan_codec_params q = *p;
    if (c->id == WAN_CODEC_TOPK) q.k = wan_codec_topk_k(n, p); /* as from a header */
    float *y1 = xmalloc(n * sizeof *y1), *y2 = xmalloc(n * sizeof *y2);
    ASSERT(!c->decode(a, l1, n, &q, y1) && !c->decode_ref(a, l1, n, &q, y2));
    if (memcmp(y1, y2, n * sizeof *y1)) TEST_FAIL("%s: fast and reference decodes differ", what);
    free(a), free(b), free(y1), free(y2);
}

TEST_T(wan_codec_fast_equals_ref, 600)
{
    static const size_t ns[] = {1, 63, 64, 65, 127, 4095, 4096, 4097, 9000, 1000003};
    for (size_t ci = 0; ci < NCONFIG; ci++)
        for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++)
            for (int kind = 0; kind < KINDS; kind++) {
                /* The large size: three kinds, one under the sanitizers. */
                if (ns[ni] > 10000 && (kind % 2 || (kind && getenv("CIRRUS_TEST_QUICK"))))
                    continue;
                wan_codec_params p = spec(configs[ci]);
                float *x = gen(ns[ni], ni, kind);
                char what[96];
                snprintf(what, sizeof what, "%s n=%zu kind %d", configs[ci], ns[ni], kind);
                check_fast_ref(&p, x, ns[ni], what);
                free(x);
            }
}

/* Random corruption of bodies: both decoders agree on refusing, and on the floats when not. */
TEST(wan_codec_corrupt_bodies_fast_equals_ref)
{
    size_t n = 200, len;
    rng_state r;
    rng_seed(&r, 9);
    float *y1 = xmalloc(n * sizeof *y1), *y2 = xmalloc(n * sizeof *y2);
    uint8_t *b = NULL;
    for (size_t ci = 0; ci < NCONFIG; ci++) {
        wan_codec_params p = spec(configs[ci]);
        const wan_codec *c = wan_codec_by_id(p.id);
        if (p.id == WAN_CODEC_TOPK) p.k = wan_codec_topk_k(n, &p);
        float *x = gen(n, 4, 0);
        uint8_t *body = body_encode(&p, x, n, 0, &len);
        b = realloc(b, len);
        int refused = 0;
        for (int t = 0; t < 3000; t++) {
            memcpy(b, body, len);
            for (int f = 0; f <= t % 3; f++)
                b[rng_below(&r, len)] ^= (uint8_t)(1u << rng_below(&r, 8));
            int r1 = c->decode(b, len, n, &p, y1), r2 = c->decode_ref(b, len, n, &p, y2);
            if (r1 != r2) TEST_FAIL("%s: fast %d, ref %d on the same bytes", configs[ci], r1, r2);
            ASSERT(r1 == 0 || r1 == CIRRUS_ECORRUPT);
            for (size_t i = 0; r1 == 0 && i < n; i++)
                ASSERT(isfinite(y1[i]) && memcmp(&y1[i], &y2[i], sizeof *y1) == 0);
            refused += r1 != 0;
        }
        if (p.id == WAN_CODEC_TOPK || p.id == WAN_CODEC_LOWBIT) ASSERT(refused > 0);
        free(x), free(body);
    }
    free(y1), free(y2), free(b);
}

/* ---- error feedback ---- */

/* R rounds of the same x through wan_encode with a residual: each round the residual is
 * exactly y - decoded (y = x + previous residual, as the receiver decodes it), and
 * sum(decoded) + residual == R x up to the float rounding of the additions. Fills, per
 * coordinate, the first round it was sent (R if never). */
static void ef_rounds(const char *s, const float *x, size_t n, int R, int *first_sent)
{
    wan_codec_params p = spec(s);
    float *res = xmalloc(n * sizeof *res), *y = xmalloc(n * sizeof *y), *d = xmalloc(n * 4);
    double *sum = xmalloc(n * sizeof *sum), *tol = xmalloc(n * sizeof *tol);
    for (size_t i = 0; i < n; i++) res[i] = 0.0f, sum[i] = 0.0, tol[i] = 0.0, first_sent[i] = R;
    for (int t = 0; t < R; t++) {
        for (size_t i = 0; i < n; i++) y[i] = x[i] + res[i];
        size_t len;
        uint8_t *m = msg_encode(&p, x, res, n, &len);
        msg_decode_ok(m, len, d, n);
        for (size_t i = 0; i < n; i++) {
            float want = y[i] - d[i];
            if (memcmp(&res[i], &want, sizeof want))
                TEST_FAIL("%s round %d [%zu]: residual %a, y - decoded %a", s, t, i, res[i], want);
            sum[i] += d[i];
            tol[i] += (fabs(y[i]) + fabs(res[i])) * 0x1p-23;
            if (d[i] != 0.0f && first_sent[i] == R) first_sent[i] = t;
        }
        free(m);
    }
    for (size_t i = 0; i < n; i++)
        if (!(fabs(sum[i] + res[i] - (double)R * x[i]) <= tol[i] + 1e-30))
            TEST_FAIL("%s [%zu]: sum %.9g + residual %.9g != %d * %.9g", s, i, sum[i], res[i],
                      R, x[i]);
    free(res), free(y), free(d), free(sum), free(tol);
}

/* topk and lowbit (and q8, fp16) lose no mass; topk sends every coordinate in time. */
TEST(wan_codec_error_feedback)
{
    size_t n = 10000;
    int R = 100, *first = xmalloc(n * sizeof *first);
    float *x = gen(n, 6, 0);
    ef_rounds("topk:0.01", x, n, 37, first);
    ef_rounds("topk:0.05:8+zstd", x, n, 20, first);
    ef_rounds("lowbit:2", x, n, 40, first);
    ef_rounds("lowbit:4+zstd", x, n, 20, first);
    ef_rounds("q8", x, n, 10, first);
    ef_rounds("fp16", x, n, 5, first);
    /* Magnitudes within a factor 1 + 1/(2R) of each other: a coordinate never sent after t
     * rounds holds t|x| > any sent one's (t - 1)(1 + 1/(2R)) + fp16 error, so each round
     * sends only unsent ones and 1/density rounds cover all n. */
    rng_state r;
    rng_seed(&r, 7);
    for (size_t i = 0; i < n; i++)
        x[i] = (rng_below(&r, 2) ? -1.0f : 1.0f) * (1.0f + rng_uniform(&r) / (2.0f * (float)R));
    ef_rounds("topk:0.01", x, n, R, first);
    for (size_t i = 0; i < n; i++)
        if (first[i] >= R) TEST_FAIL("[%zu] never sent in %d rounds", i, R);
    free(x), free(first);
}

TEST(wan_codec_encode_refuses_nonfinite)
{
    size_t n = 130, len;
    const float bad[] = {NAN, INFINITY, -INFINITY};
    for (size_t ci = 0; ci < NCONFIG; ci++) {
        wan_codec_params p = spec(configs[ci]);
        const wan_codec *c = wan_codec_by_id(p.id);
        size_t cap = wan_encode_bound(n, &p);
        uint8_t *out = xmalloc(cap);
        cirrus_error err = {0};
        float *x = gen(n, 10, 0), *res = xmalloc(n * sizeof *res);
        for (int b = 0; b < 3; b++) {
            x[77] = bad[b];
            ASSERT_EQ(c->encode(x, n, &p, out, cap, &len), CIRRUS_EINVAL);
            ASSERT_EQ(c->encode_ref(x, n, &p, out, cap, &len), CIRRUS_EINVAL);
            ASSERT_EQ(wan_encode(&p, x, NULL, n, out, cap, &len, &err), CIRRUS_EINVAL);
            ASSERT(strstr(err.msg, "index 77"));
        }
        x[77] = 1.0f;
        /* x + residual overflowing: refused, residual untouched. */
        for (size_t i = 0; i < n; i++) res[i] = (float)i;
        x[5] = FLT_MAX, res[5] = FLT_MAX;
        ASSERT_EQ(wan_encode(&p, x, res, n, out, cap, &len, &err), CIRRUS_EINVAL);
        ASSERT(strstr(err.msg, "index 5"));
        for (size_t i = 0; i < n; i++) ASSERT(res[i] == (i == 5 ? FLT_MAX : (float)i));
        /* A small buffer is refused up front. */
        ASSERT_EQ(wan_encode(&p, x, NULL, 3, out, WAN_HEADER_SIZE, &len, &err), CIRRUS_EINVAL);
        free(x), free(res), free(out);
    }
    wan_codec_params bad_id = {.id = 9}, three = {.id = WAN_CODEC_LOWBIT, .bits = 3};
    ASSERT(wan_encode_bound(10, &bad_id) == SIZE_MAX && wan_encode_bound(10, &three) == SIZE_MAX);
}

/* fp32 is exact; zero vectors decode to zeros (zero blocks: scale 0); n = 0 is a message. */
TEST(wan_codec_exact_zero_and_empty)
{
    size_t n = 5000, len;
    float *x = gen(n, 1, 0), *y = xmalloc(n * sizeof *y);
    x[7] = -0.0f, x[8] = FLT_MAX, x[9] = 0x1p-149f;
    wan_codec_params p = spec("none");
    uint8_t *m = msg_encode(&p, x, NULL, n, &len);
    ASSERT_EQ(len, WAN_HEADER_SIZE + 4 * n);
    msg_decode_ok(m, len, y, n);
    ASSERT(memcmp(x, y, n * sizeof *x) == 0);
    free(m);
    n = 64 * 3 + 1;
    for (size_t ci = 0; ci < NCONFIG; ci++) {
        p = spec(configs[ci]);
        for (size_t i = 0; i < n; i++) x[i] = 0.0f, y[i] = 1.0f;
        m = msg_encode(&p, x, NULL, n, &len);
        msg_decode_ok(m, len, y, n);
        for (size_t i = 0; i < n; i++) ASSERT(y[i] == 0.0f);
        free(m);
        m = msg_encode(&p, x, NULL, 0, &len);
        msg_decode_ok(m, len, y, 0);
        expect_corrupt(m, len, 1, "n = 0 message for n = 1");
        free(m);
    }
    free(x), free(y);
}

TEST(wan_codec_zstd)
{
    size_t n = 1 << 16, l1, l2;
    float *x = gen(n, 12, 4), *y1 = xmalloc(n * sizeof *y1), *y2 = xmalloc(n * sizeof *y2);
    static const char *const sparse[][2] = {{"q8", "q8+zstd"}, {"topk:0.01", "topk:0.01+zstd"},
                                            {"none", "none+zstd"}, {"lowbit:2", "lowbit:2+zstd"}};
    for (int i = 0; i < 4; i++) {
        wan_codec_params a = spec(sparse[i][0]), b = spec(sparse[i][1]);
        uint8_t *m1 = msg_encode(&a, x, NULL, n, &l1), *m2 = msg_encode(&b, x, NULL, n, &l2);
        msg_decode_ok(m1, l1, y1, n);
        msg_decode_ok(m2, l2, y2, n);
        ASSERT(memcmp(y1, y2, n * sizeof *y1) == 0 && l2 <= l1);
        if (a.id != WAN_CODEC_TOPK) ASSERT(m2[6] == WAN_FLAG_ZSTD && l2 < l1 / 2); /* 99% zeros */
        free(m1), free(m2);
    }
    /* Incompressible (random fp32): zstd is dropped, so never larger than without it. */
    float *r = gen(n, 13, 0);
    wan_codec_params b = spec("none+zstd");
    uint8_t *m2 = msg_encode(&b, r, NULL, n, &l2);
    ASSERT(l2 <= msg_len("none", r, n));
    msg_decode_ok(m2, l2, y2, n);
    ASSERT(memcmp(r, y2, n * sizeof *r) == 0);
    free(x), free(y1), free(y2), free(r), free(m2);
}

/* ---- the decoder refuses ---- */

TEST_T(wan_codec_reject_truncations, 300)
{
    size_t n = 300;
    static const char *const cs[] = {"none",     "fp16",          "q8+zstd", "topk:0.05",
                                     "lowbit:4", "lowbit:2+zstd", "q8",      "topk:0.05:8+zstd"};
    for (size_t ci = 0; ci < sizeof cs / sizeof cs[0]; ci++) {
        wan_codec_params p = spec(cs[ci]);
        float *x = gen(n, 14, 4); /* sparse: the dense +zstd ones do use zstd */
        size_t len;
        uint8_t *m = msg_encode(&p, x, NULL, n, &len);
        if (p.zstd && p.id != WAN_CODEC_TOPK) ASSERT(m[6] == WAN_FLAG_ZSTD);
        for (size_t l = 0; l < len; l++) expect_corrupt(m, l, n, cs[ci]);
        m = realloc(m, len + 1);
        m[len] = 0;
        expect_corrupt(m, len + 1, n, "one byte too many");
        free(x), free(m);
    }
}

TEST(wan_codec_reject_header_fields)
{
    size_t n = 1000, len;
    float *x = gen(n, 15, 0);
    for (size_t ci = 0; ci < NCONFIG; ci++) {
        wan_codec_params p = spec(configs[ci]);
        uint8_t *m = msg_encode(&p, x, NULL, n, &len);
        uint64_t body_len = le_get(m + 24, 8), topk = p.id == WAN_CODEC_TOPK;
        const struct { size_t off; int size; uint64_t v; const char *what; } bad[] = {
            {0, 4, 0x4e415744, "magic"},       {4, 1, 2, "version"},
            {5, 1, 5, "unknown codec"},        {5, 1, 255, "codec 255"},
            {5, 1, (m[5] + 1) % 5, "codec+1"}, {5, 1, (m[5] + 2) % 5, "codec+2"},
            {5, 1, (m[5] + 4) % 5, "codec-1"}, {6, 1, 2, "flags"},
            {6, 1, 1, "zstd flag, raw body"},  {7, 1, 12, "bits"},
            {7, 1, 0, "bits 0"},               {8, 8, n + 1, "n + 1"},
            {8, 8, n - 1, "n - 1"},            {8, 8, UINT64_MAX, "huge n"},
            {16, 8, topk ? n + 1 : 1, "k"},    {16, 8, topk ? 0 : UINT64_MAX, "k"},
            {24, 8, body_len + 1, "len + 1"},  {24, 8, body_len - 1, "len - 1"},
            {24, 8, UINT64_MAX, "huge len"},   {24, 8, 1ull << 40, "large len"},
        };
        for (size_t b = 0; b < sizeof bad / sizeof bad[0]; b++) {
            char what[80];
            snprintf(what, sizeof what, "%s: %s", configs[ci], bad[b].what);
            corrupt_at(m, len, n, bad[b].off, bad[b].size, bad[b].v, what);
        }
        expect_corrupt(m, len, n + 1, "expected n differs");
        free(m);
    }
    expect_corrupt(NULL, 0, 4, "NULL");
    free(x);
}

/* A top-k message with k fp16 values of 1.0 and the given gap bytes. */
static uint8_t *topk_msg(size_t n, size_t k, const uint8_t *gaps, size_t glen, size_t *len)
{
    *len = WAN_HEADER_SIZE + 2 * k + glen;
    uint8_t *m = xmalloc(*len);
    le_put(m, WAN_MAGIC, 4);
    m[4] = WAN_VERSION, m[5] = WAN_CODEC_TOPK, m[6] = 0, m[7] = 16;
    le_put(m + 8, n, 8), le_put(m + 16, k, 8), le_put(m + 24, 2 * k + glen, 8);
    for (size_t j = 0; j < k; j++) le_put(m + WAN_HEADER_SIZE + 2 * j, 0x3c00, 2);
    memcpy(m + WAN_HEADER_SIZE + 2 * k, gaps, glen);
    return m;
}

TEST(wan_codec_reject_topk_indices)
{
    size_t n = 100, len;
    float y[100];
    const uint8_t ok[] = {5, 0, 92}; /* indices 5, 6, 99 */
    uint8_t *m = topk_msg(n, 3, ok, sizeof ok, &len);
    msg_decode_ok(m, len, y, n);
    ASSERT(y[5] == 1.0f && y[6] == 1.0f && y[99] == 1.0f && y[0] == 0.0f);
    corrupt_at(m, len, n, WAN_HEADER_SIZE + 2, 2, 0x7c00, "Inf value");
    wan_codec_params kp = {.id = WAN_CODEC_TOPK, .bits = 16, .k = n + 1}; /* the codec's check */
    const wan_codec *tc = &wan_codec_topk_def;
    _Static_assert(WAN_HEADER_SIZE == 32, "the header size in the wire format");
    ASSERT(tc->decode(m + 32, len - 32, n, &kp, y) == CIRRUS_ECORRUPT);
    ASSERT(tc->decode_ref(m + 32, len - 32, n, &kp, y) == CIRRUS_ECORRUPT);
    free(m);
    static const struct { size_t n, k; uint8_t gaps[12]; size_t glen; const char *what; } bad[] = {
        {100, 3, {5, 0, 93}, 3, "index == n"}, {100, 1, {100}, 1, "first index == n"},
        {100, 3, {5, 0, 0x80 | 93, 0x7f}, 4, "index far past n"},
        /* Gaps are unsigned, so non-increasing indices need a gap that wraps: refused. */
        {100, 2, {5, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 1}, 11, "wrap"},
        {100, 2, {5, 0x80, 0x00}, 3, "overlong varint"}, {100, 2, {5, 0x80}, 2, "past the end"},
        {100, 3, {5, 0}, 2, "fewer indices than k"}, {100, 2, {5, 0, 0}, 3, "trailing bytes"},
        {1000, 2, {5, 0, 0}, 3, "trailing bytes within the bound (2-byte gaps)"},
        {100, 3, {98, 0, 0}, 3, "runs past n by increments"},
        {100, 101, {0}, 1, "k > n"}, {100, 0, {0}, 1, "k = 0"},
    };
    for (size_t b = 0; b < sizeof bad / sizeof bad[0]; b++) {
        m = topk_msg(bad[b].n, bad[b].k, bad[b].gaps, bad[b].glen, &len);
        expect_corrupt(m, len, bad[b].n, bad[b].what);
        free(m);
    }
    float x[100] = {0}; /* q8 values: a NaN scale */
    x[3] = 2.0f, x[50] = -1.0f;
    wan_codec_params p = spec("topk:0.02:8");
    m = msg_encode(&p, x, NULL, n, &len);
    corrupt_at(m, len, n, WAN_HEADER_SIZE, 4, 0x7fc00000, "NaN q8 scale");
    free(m);
}

TEST(wan_codec_reject_scales_and_codes)
{
    size_t n = 64 + 7, len; /* one full block and a short one */
    float *x = gen(n, 16, 0), *y = xmalloc(n * sizeof *y);
    static const uint32_t scales[] = {0x7fc00000, 0x7f800000, 0xff800000, 0x80000000, 0xbf800000};
    for (int ci = 0; ci < 3; ci++) {
        wan_codec_params p = spec(blockwise[ci].spec);
        uint8_t *m = msg_encode(&p, x, NULL, n, &len), *body = m + WAN_HEADER_SIZE;
        size_t full = 4 + 8 * (size_t)p.bits, H = WAN_HEADER_SIZE;
        for (int s = 0; s < 5; s++) /* NaN, +-Inf, -0, negative; in either block */
            for (size_t at = 0; at <= full; at += full)
                corrupt_at(m, len, n, H + at, 4, scales[s], "scale");
        uint32_t smax = p.bits == 8 ? 0x7c010203 : p.bits == 4 ? 0x7e124924 : 0x7f7fffff;
        le_put(body, smax, 4); /* the largest scale is fine, and decodes finite */
        msg_decode_ok(m, len, y, n);
        for (size_t i = 0; i < n; i++) ASSERT(isfinite(y[i]));
        if (p.bits != 2) corrupt_at(m, len, n, H, 4, smax + 1, "scale above SCALE_MAX");
        /* The never-written code: q8 -128, lowbit all ones; in either block. */
        for (size_t at = 4; at <= full + 4; at += full)
            corrupt_at(m, len, n, H + at, 1, p.bits == 8 ? 0x80 : body[at] | ((1u << p.bits) - 1),
                       "never-written code");
        if (p.bits != 8) corrupt_at(m, len, n, len - 1, 1, m[len - 1] | 0x80, "padding bits");
        free(m);
    }
    wan_codec_params p = spec("none");
    uint8_t *m = msg_encode(&p, x, NULL, n, &len);
    corrupt_at(m, len, n, WAN_HEADER_SIZE + 8, 4, 0x7fc00001, "NaN fp32");
    free(m);
    p = spec("fp16");
    m = msg_encode(&p, x, NULL, n, &len);
    corrupt_at(m, len, n, WAN_HEADER_SIZE + 2 * (n - 1), 2, 0xfc00, "-Inf half");
    free(m), free(x), free(y);
}

/* m's header (flag set to zstd) and a zstd frame of src, declaring its size or not; extra
 * bytes after the frame. */
static uint8_t *zstd_msg(const uint8_t *m, const void *src, size_t slen, int pledged,
                         const uint8_t *extra, size_t elen, size_t *len)
{
    size_t cap = ZSTD_compressBound(slen);
    uint8_t *out = xmalloc(WAN_HEADER_SIZE + cap + elen);
    memcpy(out, m, WAN_HEADER_SIZE);
    out[6] = WAN_FLAG_ZSTD;
    ZSTD_CCtx *z = ZSTD_createCCtx();
    ASSERT(!ZSTD_isError(ZSTD_CCtx_setParameter(z, ZSTD_c_contentSizeFlag, pledged)));
    size_t zl = ZSTD_compress2(z, out + WAN_HEADER_SIZE, cap, src, slen);
    ZSTD_freeCCtx(z);
    ASSERT(!ZSTD_isError(zl));
    if (elen) memcpy(out + WAN_HEADER_SIZE + zl, extra, elen);
    *len = WAN_HEADER_SIZE + zl + elen;
    return out;
}

TEST(wan_codec_reject_zstd)
{
    size_t n = 1000, len, zl;
    float *x = gen(n, 17, 4), *y = xmalloc(n * sizeof *y);
    wan_codec_params p = spec("q8");
    uint8_t *m = msg_encode(&p, x, NULL, n, &len), *body = m + WAN_HEADER_SIZE, *z;
    size_t blen = len - WAN_HEADER_SIZE, l2;
    uint8_t *big = xmalloc(2 * blen), skip[12] = {0x50, 0x2a, 0x4d, 0x18, 4};
    memcpy(big, body, blen);
    memcpy(big + blen, body, blen);
    uint8_t *second = zstd_msg(m, body, blen, 1, NULL, 0, &l2); /* the honest one decodes */
    msg_decode_ok(second, l2, y, n);
    const struct {
        const void *src;
        size_t slen;
        int pledged;
        const uint8_t *extra;
        size_t elen;
        const char *what;
    } bad[] = {
        {big, blen + 1, 1, NULL, 0, "frame declares a larger content size"},
        {big, 2 * blen, 1, NULL, 0, "frame declares twice the body"},
        {body, blen - 1, 1, NULL, 0, "frame declares a smaller content size"},
        {body, blen, 0, NULL, 0, "frame without a content size"},
        {body, blen, 1, second + WAN_HEADER_SIZE, l2 - WAN_HEADER_SIZE, "two frames"},
        /* ZSTD_decompress itself would accept a skippable frame after the body. */
        {body, blen, 1, skip, sizeof skip, "a skippable frame after the body"},
        {body, blen, 1, skip + 8, 3, "bytes after the frame"},
    };
    for (size_t b = 0; b < sizeof bad / sizeof bad[0]; b++) {
        z = zstd_msg(m, bad[b].src, bad[b].slen, bad[b].pledged, bad[b].extra, bad[b].elen, &zl);
        expect_corrupt(z, zl, n, bad[b].what);
        free(z);
    }
    /* Header and frame agreeing on 2^40 bytes: refused by the bound for n before any
     * allocation (frame: magic, single-segment descriptor, 8-byte content size, one last
     * RLE block). */
    uint8_t huge[WAN_HEADER_SIZE + 17], *f = huge + WAN_HEADER_SIZE;
    memcpy(huge, m, WAN_HEADER_SIZE);
    huge[6] = WAN_FLAG_ZSTD;
    le_put(huge + 24, 1ull << 40, 8);
    le_put(f, 0xFD2FB528, 4);
    f[4] = 0xE0;
    le_put(f + 5, 1ull << 40, 8);
    le_put(f + 13, 1 | 1 << 1 | 1000 << 3, 3);
    f[16] = 0;
    ASSERT(ZSTD_getFrameContentSize(f, 17) == 1ull << 40);
    ASSERT(ZSTD_findFrameCompressedSize(f, 17) == 17);
    expect_corrupt(huge, sizeof huge, n, "zstd frame of 2^40 bytes");
    /* Flipped bits inside a frame: refused, or (a flip the body tolerates) decoded. */
    uint8_t *g = xmalloc(l2);
    for (size_t t = 0; t < 8 * (l2 - WAN_HEADER_SIZE); t += 3) {
        memcpy(g, second, l2);
        g[WAN_HEADER_SIZE + t / 8] ^= (uint8_t)(1u << (t % 8));
        int rc = wan_decode(g, l2, y, n, NULL);
        ASSERT(rc == 0 || rc == CIRRUS_ECORRUPT);
    }
    free(g), free(big), free(second), free(m), free(x), free(y);
}

/* ---- sizes ---- */

TEST(wan_codec_compression_ratios)
{
    size_t n = 1 << 20, H = WAN_HEADER_SIZE, k = (size_t)ceil(0.01 * n);
    float *x = gen(n, 19, 0);
    ASSERT(msg_len("q8", x, n) - H <= n * 1.1);
    ASSERT_EQ(msg_len("q8", x, n) - H, n / 64 * 68); /* 4 + 64 bytes per 64 values */
    ASSERT_EQ(msg_len("fp16", x, n) - H, 2 * n);
    /* topk:0.01, fp16 values: k = ceil(0.01 n) entries of 2 value bytes and gaps of at most
     * k + (n - k) / 128 bytes in all: <= 0.038 n by the bound; random indices have mean gap
     * 100, one byte ~72% of the time, so ~3.3 bytes an entry in practice. */
    wan_codec_params p = spec("topk:0.01");
    ASSERT(wan_codec_by_id(WAN_CODEC_TOPK)->bound(n, &p) == 3 * k + (n - k) / 128);
    size_t len = msg_len("topk:0.01", x, n) - H;
    ASSERT(len <= 0.038 * n && len >= 3 * k && len <= 0.036 * n);
    ASSERT(msg_len("lowbit:2", x, n) <= n / 4 + n / 64 * 4 + H);
    ASSERT(msg_len("lowbit:4", x, n) <= n / 2 + n / 64 * 4 + H);
    /* Top-k at density 1 is 3 bytes a value (gaps of 0), below fp32, the largest message. */
    p = spec("topk:1");
    ASSERT(wan_codec_by_id(WAN_CODEC_TOPK)->bound(n, &p) == 3 * n);
    ASSERT(msg_len("topk:1", x, n) == H + 3 * n && wan_message_max(n) == H + 4 * n);
    free(x);
}
