/* wan_codec_topk: the topk codec of the WAN table (see wan_codec.h): the k largest |x|,
 * their indices as varint gaps, their values through the fp16 or q8 codec.
 *
 * Body (little-endian):
 *
 *   [values][index gaps]
 *     values: the k selected x[i] in increasing index order, as the fp16 body (bits 16) or
 *       the q8 body (bits 8) of that k-vector;
 *     gaps: k unsigned LEB128 varints, g_0 = i_0 and g_j = i_j - i_{j-1} - 1, so indices
 *       are strictly increasing by construction; the decoder still refuses any i_j >= n,
 *       overlong varints and bytes left over or missing.
 *
 * At density 0.01 a gap is one byte about 72% of the time (gaps < 128), so an entry costs
 * ~3.3 bytes with fp16 values (~0.033 n bytes for the body; at most 0.038 n, see
 * topk_bound), against 6 with u32 indices.
 *
 * Top-k selects the k = max(1, ceil(density * n)) entries with the largest |x|, ties to
 * the lower index: the k largest keys (|x| bits, -index), a unique set. The fast encoder
 * finds the k-th largest |x| by a two-pass radix select over the 31-bit magnitude patterns
 * (histograms of the high then the low 16 bits: O(n), no pivots, no n-sized buffer) and
 * emits indices in one more pass; the reference sorts (|x| desc, index asc). A top-k body
 * is not blockwise, so topk has its own decode_sub: it touches only the k entries sent.
 */
#include "wan_codec.h"
#include "wan_codec_bits.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>


/* k for n values, or SIZE_MAX for params topk does not take. */
size_t wan_codec_topk_k(size_t n, const wan_codec_params *p)
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

/* The values' bytes plus the most the gaps can take: each at most varint_len(n - 1), and
 * all together at most k + (n - k) / 128, since a gap g takes 1 + floor(g / 128) bytes or
 * fewer and the gaps add up to at most n - k. So even at k = n the body is at most 3n
 * bytes, less than fp32's 4n. */
static size_t topk_bound(size_t n, const wan_codec_params *p)
{
    wan_codec_params vp;
    const wan_codec *vc = topk_values(p, &vp);
    size_t k = wan_codec_topk_k(n, p);
    if (!vc || k == SIZE_MAX) return SIZE_MAX;
    size_t each = k * varint_len(n ? n - 1 : 0), sum = k + (n - k) / 128; /* n <= 2^40 */
    return vc->bound(k, &vp) + (each < sum ? each : sum);
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

/* Whether some x[j], j < m, has its magnitude pattern in [lo, hi]: branch-free, so the
 * vectoriser takes it, and the scalar loops below visit only the groups where one does. */
#define TOPK_GROUP 16
static inline int any_in_range(const float *restrict x, size_t m, uint32_t lo, uint32_t hi)
{
    uint32_t any = 0;
    for (size_t j = 0; j < m; j++) any |= ((bits_of(x[j]) & ABS_MASK) - lo) <= hi - lo;
    return any != 0;
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
    for (size_t g = 0; g < n; g += TOPK_GROUP) {
        size_t e = n - g < TOPK_GROUP ? n : g + TOPK_GROUP;
        if (!any_in_range(x + g, e - g, hi << 16, hi << 16 | 0xffff)) continue;
        for (size_t i = g; i < e; i++) {
            uint32_t a = bits_of(x[i]) & ABS_MASK;
            if (a >> 16 == hi) h[a & 0xffff]++;
        }
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
    size_t need = topk_bound(n, p), k = wan_codec_topk_k(n, p);
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
    for (size_t g = 0; g < n && !rc; g += TOPK_GROUP) {
        size_t e = n - g < TOPK_GROUP ? n : g + TOPK_GROUP;
        if (!any_in_range(x + g, e - g, t, ABS_MASK)) continue;
        for (size_t i = g; i < e && !rc; i++) {
            uint32_t a = bits_of(x[i]) & ABS_MASK;
            if (a < t) continue;
            if (a == t) {
                if (!ties) continue;
                ties--;
            }
            rc = topk_put(w, i, x[i]);
        }
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
    size_t need = topk_bound(n, p), k = wan_codec_topk_k(n, p);
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

const wan_codec wan_codec_topk_def = {
    .name = "topk", .id = WAN_CODEC_TOPK, .error_feedback = 1,
    .bound = topk_bound, .encode = topk_encode, .decode = topk_decode,
    .encode_ref = topk_encode_ref, .decode_ref = topk_decode_ref,
    .decode_sub = topk_decode_sub,
};
