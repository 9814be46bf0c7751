/* wan_codec: the codec table, spec strings and the message around a codec's body (see
 * wan_codec.h). The codecs live in wan_codec_dense.c (none, fp16, q8, lowbit) and
 * wan_codec_topk.c.
 */
#include "wan_codec.h"
#include "wan_codec_bits.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zstd.h>
#include <zstd_errors.h>

#include "../../common/le.h"


/* ---- the table, spec strings ---- */

static const wan_codec *const table[WAN_CODEC_COUNT] = {
    [WAN_CODEC_NONE] = &wan_codec_none_def, [WAN_CODEC_FP16] = &wan_codec_fp16_def,
    [WAN_CODEC_Q8] = &wan_codec_q8_def, [WAN_CODEC_TOPK] = &wan_codec_topk_def,
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
    if (!spec || !*spec)
        return cirrus_fail(err, CIRRUS_EINVAL, "empty codec spec (%s)", SPEC_FORMS);
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
            return cirrus_fail(err, CIRRUS_EINVAL,
                               "codec '%s': topk needs a density, e.g. topk:0.01", spec);
        char *end;
        double d = strtod(arg1, &end);
        if (*end || !(d > 0.0 && d <= 1.0)) /* also refuses NaN */
            return cirrus_fail(err, CIRRUS_EINVAL,
                               "codec '%s': topk density '%s' is not a number in (0, 1]", spec,
                               arg1);
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
            return cirrus_fail(err, CIRRUS_EINVAL, "wan codec topk: value bits %d (8 or 16)",
                               p->bits);
        r->bits = p->bits ? p->bits : 16;
        r->k = wan_codec_topk_k(n, p);
        if (r->k == SIZE_MAX)
            return cirrus_fail(err, CIRRUS_EINVAL,
                               "wan codec topk: density %g / k %zu out of range for %zu values",
                               p->density, p->k, n);
        break;
    case WAN_CODEC_LOWBIT:
        if (p->bits != 2 && p->bits != 4)
            return cirrus_fail(err, CIRRUS_EINVAL, "wan codec lowbit: width %d bits (2 or 4)",
                               p->bits);
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
    /* The largest of each codec's widest bound: fp32's today, computed so it stays true. */
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

/* The first i with x[i] (+ r[i]) NaN or Inf, or n: a chunk at a time, each a branch-free
 * max of sign-cleared bit patterns the vectoriser takes, then the scan for the index only in
 * a chunk that has one. */
static size_t first_nonfinite(const float *x, const float *r, size_t n)
{
    for (size_t b = 0; b < n; b += WAN_CODEC_CHUNK) {
        size_t m = n - b < WAN_CODEC_CHUNK ? n - b : WAN_CODEC_CHUNK;
        uint32_t mx = 0;
        for (size_t i = 0; i < m; i++) {
            uint32_t a = bits_of(r ? x[b + i] + r[b + i] : x[b + i]) & ABS_MASK;
            mx = a > mx ? a : mx;
        }
        if (mx < EXP_MASK) continue;
        for (size_t i = 0; i < m; i++)
            if (!isfinite(r ? x[b + i] + r[b + i] : x[b + i])) return b + i;
    }
    return n;
}

int wan_encode(const wan_codec_params *p, const float *x, float *residual, size_t n,
               uint8_t *out, size_t cap, size_t *len, cirrus_error *err)
{
    wan_codec_params r;
    if (!p) return cirrus_fail(err, CIRRUS_EINVAL, "wan_encode: no params");
    int rc = params_resolve(p, n, &r, err);
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
    if (rc == CIRRUS_ENOMEM && residual) {
        rc = cirrus_fail(err, rc, "wan_encode: %s: no memory (the residual keeps this x)",
                         c->name);
        goto out;
    } else if (rc == CIRRUS_EINVAL) {
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
        return cirrus_fail(err, CIRRUS_ECORRUPT,
                           "wan message: %zu bytes, shorter than its %d-byte header",
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
    /* Dense bodies have one size; a top-k body's exact size is for its decoder to check. */
    int topk = c->id == WAN_CODEC_TOPK;
    if (h->body_len > bound || (!topk && h->body_len != bound))
        return cirrus_fail(err, CIRRUS_ECORRUPT,
                           "wan message: %s body of %llu bytes for n = %zu (expected %s%zu)",
                           c->name, (unsigned long long)h->body_len, n, topk ? "at most " : "",
                           bound);
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
    if (h.n != (uint64_t)n)
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
            return cirrus_fail(err, CIRRUS_ECORRUPT,
                               "wan message: %zu payload bytes, header says %zu", plen, body_len);
    } else {
        size_t fl = ZSTD_findFrameCompressedSize(payload, plen);
        if (ZSTD_isError(fl) || fl != plen)
            return cirrus_fail(err, CIRRUS_ECORRUPT,
                               "wan message: zstd payload of %zu bytes is not exactly one frame",
                               plen);
        unsigned long long fcs = ZSTD_getFrameContentSize(payload, plen);
        if (fcs != (unsigned long long)body_len) /* also UNKNOWN and ERROR */
            return cirrus_fail(err, CIRRUS_ECORRUPT,
                               "wan message: zstd frame declares %lld bytes, header says %zu",
                               (long long)fcs, body_len);
        /* body_len is within the codec's bound for n, which the caller's out[n] implies. */
        scratch = malloc(body_len ? body_len : 1);
        if (!scratch)
            return cirrus_fail(err, CIRRUS_ENOMEM, "wan_decode: no memory for %zu bytes", body_len);
        size_t dl = ZSTD_decompress(scratch, body_len, payload, plen);
        if (ZSTD_isError(dl) || dl != body_len) {
            int nomem = ZSTD_isError(dl) && ZSTD_getErrorCode(dl) == ZSTD_error_memory_allocation;
            rc = cirrus_fail(err, nomem ? CIRRUS_ENOMEM : CIRRUS_ECORRUPT, "wan message: zstd: %s",
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
