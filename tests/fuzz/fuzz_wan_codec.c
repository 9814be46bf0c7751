/* fuzz_wan_codec: the cross-region message decoder (trainer/gateway/wan_codec.c and the
 * codecs in wan_codec_dense.c / wan_codec_topk.c), fed a message as a gateway receives it
 * from another region.
 *
 * Input: one message, header and payload (the harness takes n from its header through
 * wan_message_info; messages of more than MAX_N values are skipped, and the round trip
 * below runs up to ROUND_TRIP_N values, past one WAN_CODEC_CHUNK, so each input stays
 * fast). Invariants:
 *   decode: the verdict is 0 or CIRRUS_ECORRUPT; nothing is written past out[n) (a
 *     sentinel guard after the n floats, accepted or refused; also for a buffer of n - 1
 *     and n + 1 floats, which must be refused); a header wan_message_info refuses is
 *     refused; an accepted message decodes to finite floats only.
 *   reference: on the body (zstd-decompressed by the harness) the codec's fast decoder and
 *     its decode_ref agree on the verdict and bit for bit on the floats, and wan_decode
 *     accepts exactly when the framing is right (payload == body_len, or one zstd frame
 *     declaring body_len) and the codec accepts the body, with the same floats.
 *   round trip, y = decode(x) re-encoded with the header's params (topk: its k and width):
 *     z = decode(encode(y)) is accepted with the same header fields, and
 *       none, fp16, topk with fp16 values: z == y (none/fp16 bit for bit), and the message
 *         is canonical: encode(y) is x itself (header but the zstd flag, and the body);
 *         topk only when y has k nonzeros (with fewer, ties among zeros may pick others);
 *       q8, lowbit: |y - z| <= absmax/(2L) + absmax * 2^-20 + 2^-140 per block of 64 (the
 *         encoder's bound), topk with q8 values the same with the vector's absmax;
 *       a second round trip is a fixed point: encode(z) == encode(y) byte for byte (topk
 *         with q8 values: when z has k nonzeros);
 *     fast and reference encoders write the same body for y; with an error-feedback
 *     residual (zeros) and the input's zstd flag, the encoder leaves residual ==
 *     (y + 0) - decode(its message) bit for bit, that message decodes to z (in value) and
 *     is as long as encode(y) (with zstd: no longer).
 */
#include "fuzz.h"

#include <math.h>
#include <zstd.h>

#include "../../common/cerr.h"
#include "../../common/le.h"
#include "../../trainer/gateway/wan_codec.h"

#define MAX_N ((size_t)1 << 16)
#define ROUND_TRIP_N ((size_t)1 << 13) /* the encoders (top-k's reference sorts n keys) */
#define GUARD 16
#define SENTINEL 0x7fc0deadu /* a NaN pattern: never a decoded value */

static float *alloc_out(size_t n)
{
    uint32_t *o = malloc((n + GUARD) * sizeof(float));
    if (!o) abort();
    for (size_t i = 0; i < n + GUARD; i++) o[i] = SENTINEL;
    return (float *)o;
}

static void check_guard(const float *out, size_t n, const char *what)
{
    for (size_t i = n; i < n + GUARD; i++) {
        uint32_t u;
        memcpy(&u, &out[i], sizeof u);
        FUZZ_CHECK(u == SENTINEL, "%s wrote out[%zu] past n = %zu", what, i, n);
    }
}

static size_t nonzeros(const float *y, size_t n)
{
    size_t c = 0;
    for (size_t i = 0; i < n; i++) c += y[i] != 0.0f;
    return c;
}

/* The message m (len bytes, no zstd) has the input's header but its flags and the body. */
static int same_message(const uint8_t *m, size_t len, const uint8_t *hdr, const uint8_t *body,
                        size_t blen)
{
    return len == WAN_HEADER_SIZE + blen && memcmp(m, hdr, 6) == 0 &&
           memcmp(m + 7, hdr + 7, WAN_HEADER_SIZE - 7) == 0 &&
           (blen == 0 || memcmp(m + WAN_HEADER_SIZE, body, blen) == 0);
}

/* Encode y with p (zstd as p says) into a malloc'd message; decode it into a new z. */
static uint8_t *encode_decode(const wan_codec_params *p, const float *y, float *residual,
                              size_t n, size_t *len, float **z)
{
    cirrus_error err;
    size_t cap = wan_encode_bound(n, p);
    FUZZ_CHECK(cap != SIZE_MAX, "no encode bound for the params of an accepted message");
    uint8_t *m = malloc(cap);
    if (!m) abort();
    int rc = wan_encode(p, y, residual, n, m, cap, len, &err);
    FUZZ_CHECK(rc == 0, "the decoded vector does not encode: %s", err.msg);
    FUZZ_CHECK(*len <= cap && *len <= wan_message_max(n), "message of %zu bytes (cap %zu)", *len, cap);
    wan_codec_params q;
    size_t qn;
    FUZZ_CHECK(wan_message_info(m, *len, &q, &qn, &err) == 0, "own message's header refused: %s", err.msg);
    FUZZ_CHECK(qn == n && q.id == p->id && q.bits == p->bits && q.k == p->k,
               "own header says n %zu codec %d bits %d k %zu, not %zu %d %d %zu", qn, q.id, q.bits,
               q.k, n, p->id, p->bits, p->k);
    *z = alloc_out(n);
    FUZZ_CHECK(wan_decode(m, *len, *z, n, &err) == 0, "own message refused: %s", err.msg);
    check_guard(*z, n, "decode of an own message");
    return m;
}

/* The encoder's error bound for one value of a block with that absmax at L levels. */
static double q_tol(double absmax, double L)
{
    return absmax / (2.0 * L) + absmax * 0x1p-20 + 0x1p-140;
}

static void round_trip(const uint8_t *hdr, const wan_codec_params *p, const uint8_t *body,
                       size_t blen, const float *y, size_t n)
{
    const wan_codec *c = wan_codec_by_id(p->id);
    wan_codec_params q = *p;
    q.zstd = 0;
    size_t l1;
    float *z;
    uint8_t *m1 = encode_decode(&q, y, NULL, n, &l1, &z);
    size_t nz_y = nonzeros(y, n), nz_z = nonzeros(z, n);
    int fixed_point = 1; /* whether encode(z) must give m1 */
    switch (p->id) {
    case WAN_CODEC_NONE:
    case WAN_CODEC_FP16:
        FUZZ_CHECK(n == 0 || memcmp(z, y, n * sizeof(float)) == 0, "%s: decode(encode(y)) != y", c->name);
        FUZZ_CHECK(same_message(m1, l1, hdr, body, blen), "%s: encode(decode(x)) != x", c->name);
        break;
    case WAN_CODEC_TOPK: {
        FUZZ_CHECK(nz_y <= p->k, "topk: %zu nonzeros decoded from k = %zu", nz_y, p->k);
        if (p->bits == 16) {
            for (size_t i = 0; i < n; i++)
                FUZZ_CHECK(z[i] == y[i], "topk:16: y[%zu] = %a re-encodes to %a", i, y[i], z[i]);
            if (nz_y == p->k)
                FUZZ_CHECK(same_message(m1, l1, hdr, body, blen), "topk:16: encode(decode(x)) != x");
        } else {
            double absmax = 0;
            for (size_t i = 0; i < n; i++) absmax = fmax(absmax, fabs((double)y[i]));
            for (size_t i = 0; i < n; i++)
                FUZZ_CHECK(fabs((double)z[i] - (double)y[i]) <= q_tol(absmax, 127.0),
                           "topk:8: y[%zu] = %a re-encodes to %a (absmax %a)", i, y[i], z[i], absmax);
            fixed_point = nz_z == p->k;
        }
        break;
    }
    default: { /* q8, lowbit */
        double L = p->id == WAN_CODEC_Q8 ? 127.0 : p->bits == 4 ? 7.0 : 1.0;
        for (size_t b = 0; b < n; b += WAN_CODEC_BLOCK) {
            size_t end = n - b < WAN_CODEC_BLOCK ? n : b + WAN_CODEC_BLOCK;
            double absmax = 0;
            for (size_t i = b; i < end; i++) absmax = fmax(absmax, fabs((double)y[i]));
            for (size_t i = b; i < end; i++)
                FUZZ_CHECK(fabs((double)z[i] - (double)y[i]) <= q_tol(absmax, L),
                           "%s:%d: y[%zu] = %a re-encodes to %a (block absmax %a)", c->name,
                           p->bits, i, y[i], z[i], absmax);
        }
    }
    }
    /* (Where z is y bit for bit, encode(z) is m1 already.) */
    if (fixed_point && n && memcmp(z, y, n * sizeof(float)) != 0) {
        size_t l2;
        float *z2;
        uint8_t *m2 = encode_decode(&q, z, NULL, n, &l2, &z2);
        FUZZ_CHECK(l2 == l1 && memcmp(m2, m1, l1) == 0, "%s: encode(decode(m)) != m for m = encode(y)",
                   c->name);
        free(m2);
        free(z2);
    }

    /* The reference encoder writes the same body. */
    size_t bcap = c->bound(n, &q), lr;
    uint8_t *br = malloc(bcap ? bcap : 1);
    if (!br) abort();
    int rr = c->encode_ref(y, n, &q, br, bcap, &lr);
    FUZZ_CHECK(rr == 0, "%s: the reference encoder refuses the decoded vector (%d)", c->name, rr);
    FUZZ_CHECK(WAN_HEADER_SIZE + lr == l1 && (lr == 0 || memcmp(br, m1 + WAN_HEADER_SIZE, lr) == 0),
               "%s: fast and reference encoders differ", c->name);
    free(br);

    /* Error feedback (with the input's zstd flag): the residual is what the receiver does
     * not get, bit for bit. The encoder sends y + 0 (-0 becomes +0; the same body length),
     * so z3 equals z in value; zstd is lossless and kept only where it shrinks the body. */
    q.zstd = p->zstd;
    float *res = calloc(n ? n : 1, sizeof(float)), *z3;
    if (!res) abort();
    size_t l3;
    uint8_t *m3 = encode_decode(&q, y, res, n, &l3, &z3);
    for (size_t i = 0; i < n; i++) {
        float want = (y[i] + 0.0f) - z3[i];
        FUZZ_CHECK(memcmp(&res[i], &want, sizeof want) == 0,
                   "%s: residual[%zu] = %a, y - decode = %a", c->name, i, res[i], want);
        FUZZ_CHECK(z3[i] == z[i], "%s%s: y[%zu] + 0 decodes to %a, y to %a", c->name,
                   q.zstd ? "+zstd" : "", i, z3[i], z[i]);
    }
    FUZZ_CHECK(q.zstd ? l3 <= l1 : l3 == l1, "%s%s: %zu bytes, %zu for y", c->name, q.zstd ? "+zstd" : "",
               l3, l1);
    free(m3);
    free(z3);
    free(res);
    free(m1);
    free(z);
}

/* The body and the codec-level decoders: fast == reference, and wan_decode's verdict and
 * floats are those of the framing and the codec. */
static void check_codec(const uint8_t *data, size_t size, const wan_codec_params *p, size_t n,
                        int rc, const float *out)
{
    const wan_codec *c = wan_codec_by_id(p->id);
    FUZZ_CHECK(c && c->id == p->id, "codec id %d from an accepted header", p->id);
    const uint8_t *payload = data + WAN_HEADER_SIZE;
    size_t plen = size - WAN_HEADER_SIZE, body_len = (size_t)le_get(data + 24, 8);
    const uint8_t *body = payload;
    size_t blen = plen;
    uint8_t *scratch = NULL;
    int framing = plen == body_len;
    if (p->zstd) {
        size_t fl = ZSTD_findFrameCompressedSize(payload, plen);
        unsigned long long fcs = ZSTD_getFrameContentSize(payload, plen);
        framing = !ZSTD_isError(fl) && fl == plen && fcs == (unsigned long long)body_len;
        body = NULL;
        if (framing) {
            scratch = malloc(body_len ? body_len : 1);
            if (!scratch) abort();
            size_t dl = ZSTD_decompress(scratch, body_len, payload, plen);
            framing = !ZSTD_isError(dl) && dl == body_len;
            body = framing ? scratch : NULL;
            blen = body_len;
        }
    }
    if (!body) {
        FUZZ_CHECK(rc != 0, "accepted a zstd payload that is not one frame of body_len bytes");
        free(scratch);
        return;
    }
    float *fast = alloc_out(n), *ref = alloc_out(n);
    int rf = c->decode(body, blen, n, p, fast), rr = c->decode_ref(body, blen, n, p, ref);
    check_guard(fast, n, "the fast codec decoder");
    check_guard(ref, n, "the reference codec decoder");
    FUZZ_CHECK(rf == rr, "%s: fast decode %d, reference %d", c->name, rf, rr);
    FUZZ_CHECK(rf == 0 || rf == CIRRUS_ECORRUPT, "%s: decode returned %d", c->name, rf);
    if (rf == 0)
        FUZZ_CHECK(n == 0 || memcmp(fast, ref, n * sizeof(float)) == 0, "%s: fast and reference floats differ",
                   c->name);
    FUZZ_CHECK((rc == 0) == (framing && rf == 0), "wan_decode %d, framing %s, %s decode %d", rc,
               framing ? "ok" : "bad", c->name, rf);
    if (rc == 0) {
        FUZZ_CHECK(n == 0 || memcmp(out, fast, n * sizeof(float)) == 0, "wan_decode and %s's decode differ",
                   c->name);
        if (n <= ROUND_TRIP_N) round_trip(data, p, body, blen, out, n);
    }
    free(fast);
    free(ref);
    free(scratch);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    cirrus_error err;
    wan_codec_params p;
    size_t hn = 0;
    int info = wan_message_info(data, size, &p, &hn, &err);
    FUZZ_CHECK(info == 0 || info == CIRRUS_ECORRUPT, "wan_message_info returned %d", info);
    if (info == 0 && hn > MAX_N) return 0;
    /* A refused header is refused whatever the n; take one from the input. */
    size_t n = info == 0 ? hn : size >= 10 ? (size_t)le_get(data + 8, 2) : 0;
    float *out = alloc_out(n);
    int rc = wan_decode(data, size, out, n, &err);
    FUZZ_CHECK(rc == 0 || rc == CIRRUS_ECORRUPT, "wan_decode returned %d (%s)", rc, err.msg);
    check_guard(out, n, "wan_decode");
    if (info) {
        FUZZ_CHECK(rc != 0, "wan_decode accepted a header wan_message_info refuses");
        free(out);
        return 0;
    }
    if (rc == 0)
        for (size_t i = 0; i < n; i++) FUZZ_CHECK(isfinite(out[i]), "decoded y[%zu] = %a", i, out[i]);
    /* A receiver expecting another n refuses the message and stays inside its buffer. */
    for (int d = -1; d <= 1; d += 2) {
        if (d < 0 && n == 0) continue;
        size_t m = n + (size_t)d;
        float *o = alloc_out(m);
        FUZZ_CHECK(wan_decode(data, size, o, m, &err) == CIRRUS_ECORRUPT, "%zu values accepted as %zu", n, m);
        check_guard(o, m, "wan_decode with another n");
        free(o);
    }
    check_codec(data, size, &p, n, rc, out);
    free(out);
    return 0;
}
