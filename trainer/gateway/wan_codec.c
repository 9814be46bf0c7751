/* wan_codec: the codec table, spec strings, the message around a body (see wan_codec.h),
 * and the topk codec. The dense codecs (none, fp16, q8, lowbit) live in wan_codec_dense.c.
 *
 * The topk body (little-endian):
 *
 *   topk    [values][index gaps]
 *           values: the k selected x[i] in increasing index order, as the fp16 body (bits
 *             16) or the q8 body (bits 8) of that k-vector;
 *           gaps: k unsigned LEB128 varints, g_0 = i_0 and g_j = i_j - i_{j-1} - 1, so
 *             indices are strictly increasing by construction; the decoder still refuses
 *             any i_j >= n, overlong varints and bytes left over or missing.
 *           At density 0.01 a gap is one byte about 72% of the time (gaps < 128), so an
 *           entry costs ~3.3 bytes with fp16 values (~0.033 n bytes for the body), against
 *           6 with u32 indices.
 *
 * Top-k selects the k = max(1, ceil(density * n)) entries with the largest |x|, ties to
 * the lower index: the k largest keys (|x| bits, -index), a unique set. The fast encoder
 * finds the k-th largest |x| by a two-pass radix select over the 31-bit magnitude patterns
 * (histograms of the high then the low 16 bits: O(n), no pivots, no n-sized buffer) and
 * emits indices in one more pass; the reference sorts (|x| desc, index asc). A top-k body
 * is not blockwise, so topk has its own decode_sub: it touches only the k entries sent.
 */
#include "wan_codec.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zstd.h>

#include "../../common/le.h"

#if !defined(__BYTE_ORDER__) || !defined(__ORDER_LITTLE_ENDIAN__) || \
    __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the fast WAN codecs copy little-endian values with memcpy: port them for this host"
#endif

#define ABS_MASK 0x7fffffffu
#define EXP_MASK 0x7f800000u     /* |bits| >= this: Inf or NaN */

static uint32_t bits_of(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* ---- topk ---- */

/* k for n values, or SIZE_MAX for params topk does not take. */
static size_t topk_k(size_t n, const wan_codec_params *p)
{
    if (p->id != WAN_CODEC_TOPK || (uint64_t)n > WAN_CODEC_N_MAX) return SIZE_MAX;
    if (p->k) return p->k <= n ? p->k : SIZE_MAX;
    if (!(p->density > 0.0 && p->density <= 1.0)) return SIZE_MAX; /* also NaN */
    if (n == 0) return 0;
    /* ceil, but a product within 1e-12 of an integer is that integer: 0.07 * 100 is
     * 7.000000000000001 in doubles, and topk:0.07 of 100 values should send 7. */
    double t = p->density * (double)n, r = nearbyint(t);
    double k = fabs(t - r) <= t * 1e-12 ? r : ceil(t);
    return k < 1.0 ? 1 : k >= (double)n ? n : (size_t)k;
}

/* The codec that carries the values, and its params. */
static const wan_codec *topk_values(const wan_codec_params *p, wan_codec_params *vp)
{
    if (p->bits != 0 && p->bits != 8 && p->bits != 16) return NULL;
    const wan_codec *vc = p->bits == 8 ? &wan_codec_q8_def : &wan_codec_fp16_def;
    *vp = (wan_codec_params){.id = vc->id, .bits = p->bits ? p->bits : 16};
    return vc;
}

static size_t varint_len(uint64_t v)
{
    size_t l = 1;
    while (v >= 0x80) v >>= 7, l++;
    return l;
}

static uint8_t *varint_put(uint8_t *o, uint64_t v)
{
    while (v >= 0x80) *o++ = (uint8_t)(v | 0x80), v >>= 7;
    *o++ = (uint8_t)v;
    return o;
}

/* A varint at in[*pos], below lim; refuses running off the end, overlong encodings and
 * values >= lim (the encoder writes none of these). */
static int varint_get(const uint8_t *in, size_t len, size_t *pos, uint64_t lim, uint64_t *v)
{
    uint64_t r = 0;
    for (int s = 0; s < 64; s += 7) {
        if (*pos >= len) return CIRRUS_ECORRUPT;
        uint8_t b = in[(*pos)++];
        if (s == 63 && b > 1) return CIRRUS_ECORRUPT;
        r |= (uint64_t)(b & 0x7f) << s;
        if (!(b & 0x80)) {
            if (b == 0 && s > 0) return CIRRUS_ECORRUPT;
            if (r >= lim) return CIRRUS_ECORRUPT;
            *v = r;
            return 0;
        }
    }
    return CIRRUS_ECORRUPT;
}

static size_t topk_bound(size_t n, const wan_codec_params *p)
{
    wan_codec_params vp;
    const wan_codec *vc = topk_values(p, &vp);
    size_t k = topk_k(n, p);
    if (!vc || k == SIZE_MAX) return SIZE_MAX;
    return vc->bound(k, &vp) + k * varint_len(n ? n - 1 : 0); /* n <= 2^40: no overflow */
}

/* The smallest body for p's k: one byte per index. */
static uint64_t topk_body_min(const wan_codec_params *p)
{
    wan_codec_params vp;
    const wan_codec *vc = topk_values(p, &vp);
    return vc->bound(p->k, &vp) + p->k;
}

/* Indices come in increasing order; their values are gathered a chunk at a time and
 * encoded into the values section (body for values [0, j) is bound(j) bytes, j a multiple
 * of the chunk). */
typedef struct topk_writer {
    const wan_codec *vc;
    wan_codec_params vp;
    uint8_t *values, *idx;
    size_t cap, j, m; /* values flushed, values pending */
    uint64_t next;    /* smallest index the next one may have */
    float pend[WAN_CODEC_CHUNK];
} topk_writer;

static int topk_flush(topk_writer *w)
{
    size_t off = w->vc->bound(w->j, &w->vp), l;
    int rc = w->vc->encode(w->pend, w->m, &w->vp, w->values + off, w->cap - off, &l);
    w->j += w->m, w->m = 0;
    return rc;
}

static inline int topk_put(topk_writer *w, uint64_t i, float v)
{
    w->idx = varint_put(w->idx, i - w->next);
    w->next = i + 1;
    w->pend[w->m++] = v;
    return w->m == WAN_CODEC_CHUNK ? topk_flush(w) : 0;
}

/* The k-th largest magnitude pattern t and how many of the entries equal to it are taken
 * (the lowest-indexed ones): radix select, high 16 bits then low 16 bits. */
static int topk_threshold(const float *x, size_t n, size_t k, uint32_t *t, size_t *ties)
{
    size_t *h = calloc(65536, sizeof *h);
    if (!h) return CIRRUS_ENOMEM;
    for (size_t i = 0; i < n; i++) {
        uint32_t a = bits_of(x[i]) & ABS_MASK;
        if (a >= EXP_MASK) {
            free(h);
            return CIRRUS_EINVAL;
        }
        h[a >> 16]++;
    }
    size_t above = 0;
    uint32_t hi = 0x7f7f; /* finite patterns are below 0x7f800000 */
    for (; above + h[hi] < k; hi--) above += h[hi]; /* k <= n: stops by 0 */
    memset(h, 0, 65536 * sizeof *h);
    for (size_t i = 0; i < n; i++) {
        uint32_t a = bits_of(x[i]) & ABS_MASK;
        if (a >> 16 == hi) h[a & 0xffff]++;
    }
    uint32_t lo = 0xffff;
    for (; above + h[lo] < k; lo--) above += h[lo];
    free(h);
    *t = hi << 16 | lo;
    *ties = k - above;
    return 0;
}

static int topk_encode(const float *x, size_t n, const wan_codec_params *p, uint8_t *out,
                       size_t cap, size_t *len)
{
    size_t need = topk_bound(n, p), k = topk_k(n, p);
    if (need == SIZE_MAX || cap < need) return CIRRUS_EINVAL;
    if (n == 0) return *len = 0, 0;
    uint32_t t;
    size_t ties;
    int rc = topk_threshold(x, n, k, &t, &ties);
    if (rc) return rc;
    topk_writer *w = malloc(sizeof *w);
    if (!w) return CIRRUS_ENOMEM;
    w->vc = topk_values(p, &w->vp);
    w->values = out, w->cap = need;
    w->idx = out + w->vc->bound(k, &w->vp);
    w->j = w->m = 0, w->next = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        uint32_t a = bits_of(x[i]) & ABS_MASK;
        if (a < t) continue;
        if (a == t) {
            if (!ties) continue;
            ties--;
        }
        rc = topk_put(w, i, x[i]);
    }
    if (!rc && w->m) rc = topk_flush(w);
    if (!rc && w->j != k) rc = CIRRUS_EINVAL; /* cannot happen: the threshold counts k */
    *len = (size_t)(w->idx - out);
    free(w);
    return rc;
}

typedef struct topk_key {
    uint32_t a;
    size_t i;
} topk_key;

static int key_cmp(const void *pa, const void *pb) /* |x| descending, then index ascending */
{
    const topk_key *a = pa, *b = pb;
    if (a->a != b->a) return a->a > b->a ? -1 : 1;
    return a->i < b->i ? -1 : a->i > b->i;
}

static int index_cmp(const void *pa, const void *pb)
{
    size_t a = *(const size_t *)pa, b = *(const size_t *)pb;
    return a < b ? -1 : a > b;
}

static int topk_encode_ref(const float *x, size_t n, const wan_codec_params *p, uint8_t *out,
                           size_t cap, size_t *len)
{
    size_t need = topk_bound(n, p), k = topk_k(n, p);
    if (need == SIZE_MAX || cap < need) return CIRRUS_EINVAL;
    if (n == 0) return *len = 0, 0;
    wan_codec_params vp;
    const wan_codec *vc = topk_values(p, &vp);
    topk_key *keys = malloc(n * sizeof *keys);
    size_t *sel = malloc(k * sizeof *sel);
    float *vals = malloc(k * sizeof *vals);
    int rc = keys && sel && vals ? 0 : CIRRUS_ENOMEM;
    for (size_t i = 0; i < n && !rc; i++) {
        if (!isfinite(x[i])) rc = CIRRUS_EINVAL;
        keys[i] = (topk_key){bits_of(fabsf(x[i])), i};
    }
    if (!rc) {
        qsort(keys, n, sizeof *keys, key_cmp);
        for (size_t j = 0; j < k; j++) sel[j] = keys[j].i;
        qsort(sel, k, sizeof *sel, index_cmp);
        for (size_t j = 0; j < k; j++) vals[j] = x[sel[j]];
        size_t vlen;
        rc = vc->encode_ref(vals, k, &vp, out, need, &vlen);
        uint8_t *o = out + vlen;
        for (size_t j = 0; j < k && !rc; j++) o = varint_put(o, sel[j] - (j ? sel[j - 1] + 1 : 0));
        *len = (size_t)(o - out);
    }
    free(keys);
    free(sel);
    free(vals);
    return rc;
}

/* The checks shared by both decoders: k and the values section fit the body. */
static int topk_decode_check(size_t len, size_t n, const wan_codec_params *p, size_t *k,
                             const wan_codec **vc, wan_codec_params *vp, size_t *vsize)
{
    *vc = topk_values(p, vp);
    if (!*vc || p->id != WAN_CODEC_TOPK || (uint64_t)n > WAN_CODEC_N_MAX) return CIRRUS_EINVAL;
    *k = p->k;
    if (*k > n || (*k == 0) != (n == 0)) return CIRRUS_ECORRUPT;
    *vsize = (*vc)->bound(*k, vp);
    if (len < *vsize + *k) return CIRRUS_ECORRUPT; /* at least one byte per index */
    return 0;
}

/* Fast decode: out[i] = value (sub == 0, after zeroing) or out[i] -= value (sub == 1),
 * values decoded a chunk at a time beside the indices. */
static int topk_scatter(const uint8_t *in, size_t len, size_t n, const wan_codec_params *p,
                        float *out, int sub)
{
    size_t k, vsize;
    const wan_codec *vc;
    wan_codec_params vp;
    int rc = topk_decode_check(len, n, p, &k, &vc, &vp, &vsize);
    if (rc) return rc;
    if (!sub && n) memset(out, 0, n * sizeof *out);
    float vals[WAN_CODEC_CHUNK];
    size_t pos = vsize;
    uint64_t next = 0;
    for (size_t j = 0; j < k; j += WAN_CODEC_CHUNK) {
        size_t m = k - j < WAN_CODEC_CHUNK ? k - j : WAN_CODEC_CHUNK;
        size_t off = vc->bound(j, &vp), end = vc->bound(j + m, &vp);
        if ((rc = vc->decode(in + off, end - off, m, &vp, vals))) return CIRRUS_ECORRUPT;
        for (size_t t = 0; t < m; t++) {
            uint64_t g;
            if (varint_get(in, len, &pos, n - next, &g)) return CIRRUS_ECORRUPT;
            size_t i = (size_t)(next + g); /* < n */
            out[i] = sub ? out[i] - vals[t] : vals[t];
            next = i + 1;
        }
    }
    return pos == len ? 0 : CIRRUS_ECORRUPT;
}

static int topk_decode(const uint8_t *in, size_t len, size_t n, const wan_codec_params *p,
                       float *out)
{
    return topk_scatter(in, len, n, p, out, 0);
}

static int topk_decode_sub(const uint8_t *in, size_t len, size_t n, const wan_codec_params *p,
                           float *r)
{
    return topk_scatter(in, len, n, p, r, 1);
}

static int topk_decode_ref(const uint8_t *in, size_t len, size_t n, const wan_codec_params *p,
                           float *out)
{
    size_t k, vsize;
    const wan_codec *vc;
    wan_codec_params vp;
    int rc = topk_decode_check(len, n, p, &k, &vc, &vp, &vsize);
    if (rc) return rc;
    float *vals = malloc((k ? k : 1) * sizeof *vals); /* k <= n: bounded by the output */
    if (!vals) return CIRRUS_ENOMEM;
    rc = vc->decode_ref(in, vsize, k, &vp, vals) ? CIRRUS_ECORRUPT : 0;
    for (size_t i = 0; i < n; i++) out[i] = 0.0f;
    size_t pos = vsize;
    uint64_t prev = 0;
    for (size_t j = 0; j < k && !rc; j++) {
        uint64_t g, i;
        if (varint_get(in, len, &pos, UINT64_MAX, &g)) {
            rc = CIRRUS_ECORRUPT;
            break;
        }
        i = j == 0 ? g : prev + 1 + g;
        if (i >= n || (j > 0 && i <= prev)) rc = CIRRUS_ECORRUPT; /* wrapped or out of range */
        else out[i] = vals[j], prev = i;
    }
    if (!rc && pos != len) rc = CIRRUS_ECORRUPT;
    free(vals);
    return rc;
}

static const wan_codec topk_def = {
    .name = "topk", .id = WAN_CODEC_TOPK, .error_feedback = 1,
    .bound = topk_bound, .encode = topk_encode, .decode = topk_decode,
    .encode_ref = topk_encode_ref, .decode_ref = topk_decode_ref,
    .decode_sub = topk_decode_sub,
};

/* ---- the table, spec strings ---- */

static const wan_codec *const table[WAN_CODEC_COUNT] = {
    [WAN_CODEC_NONE] = &wan_codec_none_def, [WAN_CODEC_FP16] = &wan_codec_fp16_def,
    [WAN_CODEC_Q8] = &wan_codec_q8_def, [WAN_CODEC_TOPK] = &topk_def,
    [WAN_CODEC_LOWBIT] = &wan_codec_lowbit_def,
};

const wan_codec *wan_codec_by_id(int id)
{
    return id >= 0 && id < WAN_CODEC_COUNT ? table[id] : NULL;
}

const wan_codec *wan_codec_by_name(const char *name)
{
    for (int i = 0; name && i < WAN_CODEC_COUNT; i++)
        if (strcmp(table[i]->name, name) == 0) return table[i];
    return NULL;
}

#define SPEC_FORMS "none, fp16, q8, topk:DENSITY[:8|16], lowbit:2|4, each with optional +zstd"

int wan_codec_parse(const char *spec, wan_codec_params *p, cirrus_error *err)
{
    char buf[96];
    if (!spec || !*spec) return cirrus_fail(err, CIRRUS_EINVAL, "empty codec spec (%s)", SPEC_FORMS);
    if (strlen(spec) >= sizeof buf)
        return cirrus_fail(err, CIRRUS_EINVAL, "codec spec '%.40s...' too long", spec);
    strcpy(buf, spec);
    wan_codec_params r = {0};
    char *plus = strchr(buf, '+');
    if (plus) {
        if (strcmp(plus + 1, "zstd") != 0)
            return cirrus_fail(err, CIRRUS_EINVAL, "codec '%s': unknown suffix '%s' (only +zstd)",
                               spec, plus);
        *plus = '\0';
        r.zstd = 1;
    }
    char *arg1 = strchr(buf, ':'), *arg2 = NULL;
    if (arg1) {
        *arg1++ = '\0';
        arg2 = strchr(arg1, ':');
        if (arg2) *arg2++ = '\0';
    }
    const wan_codec *c = wan_codec_by_name(buf);
    if (!c)
        return cirrus_fail(err, CIRRUS_EINVAL, "codec '%s': unknown codec '%s' (%s)", spec, buf,
                           SPEC_FORMS);
    r.id = c->id;
    switch (c->id) {
    case WAN_CODEC_TOPK: {
        if (!arg1 || !*arg1)
            return cirrus_fail(err, CIRRUS_EINVAL, "codec '%s': topk needs a density, e.g. topk:0.01",
                               spec);
        char *end;
        double d = strtod(arg1, &end);
        if (*end || !(d > 0.0 && d <= 1.0)) /* also refuses NaN */
            return cirrus_fail(err, CIRRUS_EINVAL,
                               "codec '%s': topk density '%s' is not a number in (0, 1]", spec, arg1);
        r.density = d;
        r.bits = 16;
        if (arg2) {
            if (strcmp(arg2, "16") && strcmp(arg2, "8"))
                return cirrus_fail(err, CIRRUS_EINVAL,
                                   "codec '%s': topk value bits '%s' must be 8 or 16", spec, arg2);
            r.bits = atoi(arg2);
        }
        break;
    }
    case WAN_CODEC_LOWBIT:
        if (!arg1 || arg2 || (strcmp(arg1, "2") && strcmp(arg1, "4")))
            return cirrus_fail(err, CIRRUS_EINVAL,
                               "codec '%s': lowbit width must be 2 or 4 bits (lowbit:2, lowbit:4)",
                               spec);
        r.bits = atoi(arg1);
        break;
    default:
        if (arg1)
            return cirrus_fail(err, CIRRUS_EINVAL, "codec '%s': %s takes no parameters", spec,
                               c->name);
        r.bits = c->id == WAN_CODEC_NONE ? 32 : c->id == WAN_CODEC_FP16 ? 16 : 8;
    }
    *p = r;
    return 0;
}

void wan_codec_format(const wan_codec_params *p, char *buf, size_t size)
{
    if (!buf || !size) return;
    const wan_codec *c = wan_codec_by_id(p->id);
    char arg[48] = "";
    if (!c) {
        snprintf(buf, size, "unknown(%d)", p->id);
        return;
    }
    if (c->id == WAN_CODEC_TOPK) {
        int prec = 1; /* the fewest digits that read back as the same double */
        for (; prec < 17; prec++) {
            snprintf(arg, sizeof arg, "%.*g", prec, p->density);
            if (strtod(arg, NULL) == p->density) break;
        }
        snprintf(arg, sizeof arg, ":%.*g%s", prec, p->density, p->bits == 8 ? ":8" : "");
    } else if (c->id == WAN_CODEC_LOWBIT) {
        snprintf(arg, sizeof arg, ":%d", p->bits);
    }
    snprintf(buf, size, "%s%s%s", c->name, arg, p->zstd ? "+zstd" : "");
}

/* ---- messages ---- */

/* p with bits made explicit and topk's k computed for n, or a message saying why not. */
static int params_resolve(const wan_codec_params *p, size_t n, wan_codec_params *r,
                          cirrus_error *err)
{
    const wan_codec *c = wan_codec_by_id(p->id);
    if (!c) return cirrus_fail(err, CIRRUS_EINVAL, "wan codec: unknown codec id %d", p->id);
    if (p->zstd != 0 && p->zstd != 1)
        return cirrus_fail(err, CIRRUS_EINVAL, "wan codec %s: zstd flag %d is not 0 or 1", c->name,
                           p->zstd);
    if ((uint64_t)n > WAN_CODEC_N_MAX)
        return cirrus_fail(err, CIRRUS_EINVAL, "wan codec: %zu values, more than the %llu allowed",
                           n, (unsigned long long)WAN_CODEC_N_MAX);
    *r = *p;
    r->k = 0;
    static const int fixed[] = {[WAN_CODEC_NONE] = 32, [WAN_CODEC_FP16] = 16, [WAN_CODEC_Q8] = 8};
    switch (c->id) {
    case WAN_CODEC_TOPK:
        if (p->bits != 0 && p->bits != 8 && p->bits != 16)
            return cirrus_fail(err, CIRRUS_EINVAL, "wan codec topk: value bits %d (8 or 16)", p->bits);
        r->bits = p->bits ? p->bits : 16;
        r->k = topk_k(n, p);
        if (r->k == SIZE_MAX)
            return cirrus_fail(err, CIRRUS_EINVAL,
                               "wan codec topk: density %g / k %zu out of range for %zu values",
                               p->density, p->k, n);
        break;
    case WAN_CODEC_LOWBIT:
        if (p->bits != 2 && p->bits != 4)
            return cirrus_fail(err, CIRRUS_EINVAL, "wan codec lowbit: width %d bits (2 or 4)", p->bits);
        break;
    default:
        if (p->bits != 0 && p->bits != fixed[c->id])
            return cirrus_fail(err, CIRRUS_EINVAL, "wan codec %s: bits %d (only %d)", c->name,
                               p->bits, fixed[c->id]);
        r->bits = fixed[c->id];
    }
    return 0;
}

size_t wan_encode_bound(size_t n, const wan_codec_params *p)
{
    wan_codec_params r;
    if (!p || params_resolve(p, n, &r, NULL)) return SIZE_MAX;
    size_t body = wan_codec_by_id(r.id)->bound(n, &r);
    if (body == SIZE_MAX) return SIZE_MAX;
    if (r.zstd) {
        size_t zb = ZSTD_compressBound(body);
        if (ZSTD_isError(zb) || zb < body) return SIZE_MAX;
        body = zb;
    }
    return body > SIZE_MAX - WAN_HEADER_SIZE ? SIZE_MAX : WAN_HEADER_SIZE + body;
}

size_t wan_message_max(size_t n)
{
    /* Each codec's widest params; topk at k = n is the largest body of all. */
    static const wan_codec_params widest[] = {
        {.id = WAN_CODEC_NONE},          {.id = WAN_CODEC_FP16},
        {.id = WAN_CODEC_Q8},            {.id = WAN_CODEC_LOWBIT, .bits = 4},
        {.id = WAN_CODEC_TOPK, .density = 1.0, .bits = 16},
        {.id = WAN_CODEC_TOPK, .density = 1.0, .bits = 8},
    };
    size_t most = 0;
    for (size_t i = 0; i < sizeof widest / sizeof widest[0]; i++) {
        size_t b = wan_codec_by_id(widest[i].id)->bound(n, &widest[i]);
        if (b == SIZE_MAX) return SIZE_MAX;
        most = b > most ? b : most;
    }
    return WAN_HEADER_SIZE + most;
}

/* r[i] -= decode(in)[i] for a blockwise codec, one chunk at a time (see decode_sub). */
static int chunked_sub(const wan_codec *c, const uint8_t *in, size_t len, size_t n,
                       const wan_codec_params *p, float *r)
{
    float tmp[WAN_CODEC_CHUNK];
    if (c->bound(n, p) != len) return CIRRUS_ECORRUPT;
    for (size_t a = 0; a < n; a += WAN_CODEC_CHUNK) {
        size_t m = n - a < WAN_CODEC_CHUNK ? n - a : WAN_CODEC_CHUNK;
        size_t off = c->bound(a, p), end = c->bound(a + m, p);
        int rc = c->decode(in + off, end - off, m, p, tmp);
        if (rc) return rc;
        for (size_t i = 0; i < m; i++) r[a + i] = r[a + i] - tmp[i];
    }
    return 0;
}

static size_t first_nonfinite(const float *x, const float *r, size_t n)
{
    size_t i = 0;
    while (i < n && isfinite(r ? x[i] + r[i] : x[i])) i++;
    return i;
}

int wan_encode(const wan_codec_params *p, const float *x, float *residual, size_t n,
               uint8_t *out, size_t cap, size_t *len, cirrus_error *err)
{
    wan_codec_params r;
    int rc = p ? params_resolve(p, n, &r, err) : cirrus_fail(err, CIRRUS_EINVAL, "wan_encode: no params");
    if (rc) return rc;
    if (!out || !len || (n && !x))
        return cirrus_fail(err, CIRRUS_EINVAL, "wan_encode: NULL buffer");
    const wan_codec *c = wan_codec_by_id(r.id);
    size_t need = wan_encode_bound(n, &r), body_cap = c->bound(n, &r);
    if (need == SIZE_MAX || body_cap == SIZE_MAX)
        return cirrus_fail(err, CIRRUS_EINVAL, "wan_encode: %zu values do not fit a message", n);
    if (cap < need)
        return cirrus_fail(err, CIRRUS_EINVAL, "wan_encode: buffer of %zu bytes, %s needs %zu",
                           cap, c->name, need);
    if (residual) {
        /* Before anything is written, so a refused round leaves the residual as it was. */
        size_t bad = first_nonfinite(x, residual, n);
        if (bad < n)
            return cirrus_fail(err, CIRRUS_EINVAL,
                               "wan_encode: x + residual is not finite at index %zu", bad);
    }
    uint8_t *scratch = NULL;
    ZSTD_CCtx *cctx = NULL;
    if (r.zstd) {
        scratch = malloc(body_cap ? body_cap : 1);
        cctx = ZSTD_createCCtx();
        if (!scratch || !cctx) {
            rc = cirrus_fail(err, CIRRUS_ENOMEM, "wan_encode: no memory for zstd");
            goto out;
        }
    }
    const float *src = x;
    if (residual) {
        for (size_t i = 0; i < n; i++) residual[i] = x[i] + residual[i];
        src = residual;
    }
    uint8_t *body = r.zstd ? scratch : out + WAN_HEADER_SIZE;
    size_t body_len = 0;
    rc = c->encode(src, n, &r, body, body_cap, &body_len);
    if (rc == CIRRUS_EINVAL) {
        rc = cirrus_fail(err, rc, "wan_encode: x is not finite at index %zu",
                         first_nonfinite(x, NULL, n));
        goto out;
    } else if (rc) {
        rc = cirrus_fail(err, rc, "wan_encode: %s: %s", c->name, cirrus_strerror(rc));
        goto out;
    }
    uint8_t flags = 0;
    size_t payload = body_len;
    if (r.zstd) {
        /* Kept only if smaller; a zstd failure sends the body as it is. */
        size_t zl = ZSTD_compressCCtx(cctx, out + WAN_HEADER_SIZE, cap - WAN_HEADER_SIZE, scratch,
                                      body_len, WAN_ZSTD_LEVEL);
        if (!ZSTD_isError(zl) && zl < body_len) flags = WAN_FLAG_ZSTD, payload = zl;
        else memcpy(out + WAN_HEADER_SIZE, scratch, body_len);
    }
    le_put(out, WAN_MAGIC, 4);
    out[4] = WAN_VERSION;
    out[5] = (uint8_t)r.id;
    out[6] = flags;
    out[7] = (uint8_t)r.bits;
    le_put(out + 8, n, 8);
    le_put(out + 16, r.k, 8);
    le_put(out + 24, body_len, 8);
    *len = WAN_HEADER_SIZE + payload;
    if (residual) {
        rc = c->decode_sub ? c->decode_sub(body, body_len, n, &r, residual)
                           : chunked_sub(c, body, body_len, n, &r, residual);
        if (rc) rc = cirrus_fail(err, CIRRUS_ECORRUPT, "wan_encode: own %s body does not decode",
                                 c->name); /* a bug, not an input problem */
    }
out:
    free(scratch);
    ZSTD_freeCCtx(cctx);
    return rc;
}

typedef struct wan_header {
    wan_codec_params p; /* id, bits, zstd, k; density = k / n for topk */
    uint64_t n, body_len;
} wan_header;

/* Everything the header says, checked against itself and the codec's sizes. */
static int header_read(const uint8_t *in, size_t len, wan_header *h, cirrus_error *err)
{
    if (!in || len < WAN_HEADER_SIZE)
        return cirrus_fail(err, CIRRUS_ECORRUPT, "wan message: %zu bytes, shorter than its %d-byte header",
                           in ? len : 0, WAN_HEADER_SIZE);
    if (le_get(in, 4) != WAN_MAGIC)
        return cirrus_fail(err, CIRRUS_ECORRUPT, "wan message: bad magic 0x%08x",
                           (unsigned)le_get(in, 4));
    if (in[4] != WAN_VERSION)
        return cirrus_fail(err, CIRRUS_ECORRUPT, "wan message: version %u, this build reads %d",
                           in[4], WAN_VERSION);
    const wan_codec *c = wan_codec_by_id(in[5]);
    if (!c) return cirrus_fail(err, CIRRUS_ECORRUPT, "wan message: unknown codec id %u", in[5]);
    if (in[6] & ~WAN_FLAG_ZSTD)
        return cirrus_fail(err, CIRRUS_ECORRUPT, "wan message: unknown flags 0x%02x", in[6]);
    memset(h, 0, sizeof *h);
    h->n = le_get(in + 8, 8);
    h->body_len = le_get(in + 24, 8);
    uint64_t k = le_get(in + 16, 8);
    if (h->n > WAN_CODEC_N_MAX)
        return cirrus_fail(err, CIRRUS_ECORRUPT, "wan message: n = %llu is beyond the limit",
                           (unsigned long long)h->n);
    size_t n = (size_t)h->n;
    h->p.id = c->id;
    h->p.bits = in[7];
    h->p.zstd = in[6] & WAN_FLAG_ZSTD;
    if (c->id == WAN_CODEC_TOPK) {
        if (k > h->n || (k == 0) != (h->n == 0))
            return cirrus_fail(err, CIRRUS_ECORRUPT, "wan message: topk k = %llu for n = %llu",
                               (unsigned long long)k, (unsigned long long)h->n);
        h->p.k = (size_t)k;
        h->p.density = n ? (double)k / (double)n : 1.0; /* all of nothing */
    } else if (k != 0) {
        return cirrus_fail(err, CIRRUS_ECORRUPT, "wan message: k = %llu for codec %s",
                           (unsigned long long)k, c->name);
    }
    /* The codecs' bounds double as the width check: bits they do not take give SIZE_MAX. */
    size_t bound = c->bound(n, &h->p);
    if (bound == SIZE_MAX || h->p.bits == 0)
        return cirrus_fail(err, CIRRUS_ECORRUPT, "wan message: %u-bit values for codec %s",
                           in[7], c->name);
    /* Dense bodies have one size; a top-k body at least one byte per index. */
    uint64_t least = c->id == WAN_CODEC_TOPK ? topk_body_min(&h->p) : bound;
    if (h->body_len < least || h->body_len > bound)
        return cirrus_fail(err, CIRRUS_ECORRUPT,
                           "wan message: %s body of %llu bytes for n = %zu (expected %s%llu)",
                           c->name, (unsigned long long)h->body_len, n,
                           least == bound ? "" : "at most ", (unsigned long long)bound);
    return 0;
}

int wan_message_info(const uint8_t *in, size_t len, wan_codec_params *p, size_t *n,
                     cirrus_error *err)
{
    wan_header h;
    int rc = header_read(in, len, &h, err);
    if (rc) return rc;
    if (p) *p = h.p;
    if (n) *n = (size_t)h.n;
    return 0;
}

int wan_decode(const uint8_t *in, size_t len, float *out, size_t n, cirrus_error *err)
{
    wan_header h;
    int rc = header_read(in, len, &h, err);
    if (rc) return rc;
    if (0)
        return cirrus_fail(err, CIRRUS_ECORRUPT, "wan message: %llu values, expected %zu",
                           (unsigned long long)h.n, n);
    if (n && !out) return cirrus_fail(err, CIRRUS_EINVAL, "wan_decode: NULL output");
    const wan_codec *c = wan_codec_by_id(h.p.id);
    const uint8_t *payload = in + WAN_HEADER_SIZE;
    size_t plen = len - WAN_HEADER_SIZE, body_len = (size_t)h.body_len;
    const uint8_t *body = payload;
    uint8_t *scratch = NULL;
    if (!h.p.zstd) {
        if (plen != body_len)
            return cirrus_fail(err, CIRRUS_ECORRUPT, "wan message: %zu payload bytes, header says %zu",
                               plen, body_len);
    } else {
        size_t fl = ZSTD_findFrameCompressedSize(payload, plen);
        if (ZSTD_isError(fl) || fl != plen)
            return cirrus_fail(err, CIRRUS_ECORRUPT,
                               "wan message: zstd payload of %zu bytes is not exactly one frame", plen);
        unsigned long long fcs = ZSTD_getFrameContentSize(payload, plen);
        if (fcs != (unsigned long long)body_len) /* also UNKNOWN and ERROR */
            return cirrus_fail(err, CIRRUS_ECORRUPT,
                               "wan message: zstd frame declares %lld bytes, header says %zu",
                               (long long)fcs, body_len);
        /* body_len is within the codec's bound for n, which the caller's out[n] implies. */
        scratch = malloc(body_len ? body_len : 1);
        if (!scratch) return cirrus_fail(err, CIRRUS_ENOMEM, "wan_decode: no memory for %zu bytes", body_len);
        size_t dl = ZSTD_decompress(scratch, body_len, payload, plen);
        if (ZSTD_isError(dl) || dl != body_len) {
            rc = cirrus_fail(err, CIRRUS_ECORRUPT, "wan message: zstd: %s",
                             ZSTD_isError(dl) ? ZSTD_getErrorName(dl) : "short frame");
            goto out;
        }
        body = scratch;
    }
    rc = c->decode(body, body_len, n, &h.p, out);
    if (rc == CIRRUS_ENOMEM)
        rc = cirrus_fail(err, rc, "wan_decode: no memory");
    else if (rc)
        rc = cirrus_fail(err, CIRRUS_ECORRUPT,
                         "wan message: %s body fails validation (a scale, value, code or index)",
                         c->name);
out:
    free(scratch);
    return rc;
}
