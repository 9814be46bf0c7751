/* fuzz_q8: the activation codec's decoder (trainer/codec/q8.c), fed encoded activations as
 * a peer receives them, and its encoder, fed arbitrary float bit patterns.
 *
 * Input: byte 0 selects how the element count n is chosen (from bytes 1-2, or the count
 * the remaining length encodes), the rest is the encoded buffer (and, read as floats, the
 * encoder's input). Invariants:
 *   decode: the fast and the reference decoder agree (same verdict, bit-identical floats);
 *     an accepted buffer has the exact encoded length and decodes to finite floats with
 *     |y| <= 127 * its block's scale; no write outside the n floats (ASan).
 *   encode: fast and reference agree bit for bit and refuse exactly the blocks with NaN/Inf;
 *     decode(encode(x)) is accepted and within half a quantisation step of x
 *     (|x - y| <= scale / 2, plus float rounding).
 */
#include "fuzz.h"

#include <float.h>
#include <math.h>

#include "../../common/cerr.h"
#include "../../trainer/codec/q8.h"

#define MAX_N 8192

/* The n whose encoding is len bytes, or (size_t)-1. */
static size_t n_for_len(size_t len)
{
    size_t full = len / (4 + CODEC_Q8_BLOCK), rem = len % (4 + CODEC_Q8_BLOCK);
    if (rem == 0) return full * CODEC_Q8_BLOCK;
    if (rem > 4) return full * CODEC_Q8_BLOCK + rem - 4;
    return (size_t)-1;
}

static void check_decode(const uint8_t *in, size_t len, size_t n)
{
    float *a = malloc((n ? n : 1) * sizeof(float)), *b = malloc((n ? n : 1) * sizeof(float));
    if (!a || !b) abort();
    int ra = codec_q8_decode(a, n, in, len), rb = codec_q8_decode_ref(b, n, in, len);
    FUZZ_CHECK(ra == rb, "fast decode %d, reference %d", ra, rb);
    FUZZ_CHECK(ra == 0 || ra == CIRRUS_ECORRUPT, "decode returned %d", ra);
    if (ra == 0) {
        FUZZ_CHECK(len == codec_q8_encoded_size(n), "accepted %zu bytes for %zu floats", len, n);
        FUZZ_CHECK(n == 0 || memcmp(a, b, n * sizeof(float)) == 0, "fast and reference floats differ");
        for (size_t i = 0; i < n; i++) {
            float scale;
            memcpy(&scale, in + (i / CODEC_Q8_BLOCK) * (4 + CODEC_Q8_BLOCK), 4);
            FUZZ_CHECK(isfinite(a[i]), "decoded y[%zu] = %g", i, a[i]);
            FUZZ_CHECK(fabsf(a[i]) <= 127.0f * scale, "|y[%zu]| = %g > 127 * %g", i, a[i], scale);
        }
    }
    free(a);
    free(b);
}

static void check_encode(const uint8_t *bytes, size_t len)
{
    size_t n = len / 4;
    if (n > MAX_N) n = MAX_N;
    float *x = malloc((n ? n : 1) * sizeof(float)), *y = malloc((n ? n : 1) * sizeof(float));
    size_t esz = codec_q8_encoded_size(n);
    uint8_t *e1 = malloc(esz ? esz : 1), *e2 = malloc(esz ? esz : 1);
    if (!x || !y || !e1 || !e2) abort();
    if (n) memcpy(x, bytes, n * sizeof(float));
    int bad = 0;
    for (size_t i = 0; i < n; i++) bad |= !isfinite(x[i]);
    int r1 = codec_q8_encode(e1, x, n), r2 = codec_q8_encode_ref(e2, x, n);
    FUZZ_CHECK(r1 == r2, "fast encode %d, reference %d", r1, r2);
    FUZZ_CHECK((r1 != 0) == bad, "encode %d on input %s NaN/Inf", r1, bad ? "with" : "without");
    if (r1 == 0) {
        FUZZ_CHECK(esz == 0 || memcmp(e1, e2, esz) == 0, "fast and reference encodings differ");
        FUZZ_CHECK(codec_q8_decode(y, n, e1, esz) == 0, "own encoding refused");
        for (size_t b = 0; b < n; b += CODEC_Q8_BLOCK) {
            size_t end = n - b < CODEC_Q8_BLOCK ? n : b + CODEC_Q8_BLOCK;
            double absmax = 0;
            for (size_t i = b; i < end; i++) absmax = fmax(absmax, fabs((double)x[i]));
            float scale;
            memcpy(&scale, e1 + (b / CODEC_Q8_BLOCK) * (4 + CODEC_Q8_BLOCK), 4);
            /* half a step, float rounding of the products, and a subnormal scale's error */
            double tol = 0.5 * (double)scale + 1e-6 * absmax + 128.0 * FLT_TRUE_MIN;
            for (size_t i = b; i < end; i++)
                FUZZ_CHECK(fabs((double)x[i] - (double)y[i]) <= tol,
                           "x[%zu] = %a decodes to %a (scale %a, tolerance %a)", i, x[i], y[i],
                           scale, tol);
        }
    }
    free(x);
    free(y);
    free(e1);
    free(e2);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 3) return 0;
    const uint8_t *in = data + 3;
    size_t len = size - 3;
    size_t n = (size_t)(data[1] | data[2] << 8) % (MAX_N + 1);
    if (data[0] & 1) {
        size_t m = n_for_len(len);
        if (m != (size_t)-1) n = m;
    }
    check_decode(in, len, n);
    /* The counts no float array can have are refused, never used. */
    FUZZ_CHECK(codec_q8_decode(NULL, SIZE_MAX / 2, in, len) == CIRRUS_ECORRUPT, "huge n accepted");
    if (data[0] & 2) check_encode(in, len);
    return 0;
}
