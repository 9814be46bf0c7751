/* stage_msg: activation payload helpers. See stage_msg.h. */
#include "stage_msg.h"

#include <stdlib.h>
#include <string.h>

#include "../../codec/q8.h"

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "raw f32 activations are sent in host order, which the wire defines as little-endian"
#endif

void stage_put_floats(wire_writer *w, const float *x, size_t n, int codec)
{
    if (codec != STAGE_CODEC_Q8) {
        wire_put_bytes(w, x, n * sizeof(float));
        return;
    }
    size_t len = codec_q8_encoded_size(n);
    uint8_t *buf = malloc(len ? len : 1);
    if (!buf || codec_q8_encode(buf, x, n) != 0)
        w->failed = 1; /* out of memory or a non-finite activation: refuse to send */
    else
        wire_put_bytes(w, buf, len);
    free(buf);
}

int stage_get_floats(wire_reader *r, float *out, size_t n, int codec)
{
    if (codec == STAGE_CODEC_Q8) {
        size_t len = codec_q8_encoded_size(n);
        const void *p = wire_get_bytes(r, len);
        if (!p || codec_q8_decode(out, n, p, len) != 0) return CIRRUS_ECORRUPT;
        return 0;
    }
    if (codec != STAGE_CODEC_NONE || n > SIZE_MAX / sizeof(float)) return CIRRUS_ECORRUPT;
    const void *p = wire_get_bytes(r, n * sizeof(float));
    if (!p) return CIRRUS_ECORRUPT;
    memcpy(out, p, n * sizeof(float));
    return 0;
}

int stage_fetch_state(stage_state_call call, stage_state_sink sink, void *ctx,
                      uint64_t expect_n, uint64_t *steps, cirrus_error *err)
{
    const uint64_t total = 3 * expect_n;
    for (int attempt = 0; attempt < 3; attempt++) {
        uint64_t first_steps = 0;
        int restart = 0;
        for (uint64_t off = 0; off < total && !restart; off += STAGE_STATE_SLICE) {
            const uint64_t count = total - off < STAGE_STATE_SLICE ? total - off
                                                                   : STAGE_STATE_SLICE;
            wire_writer w;
            wire_reader r;
            wire_writer_init(&w, 64);
            wire_put_u64(&w, off);
            wire_put_u64(&w, count);
            int rc = call(ctx, &w, &r, err);
            wire_writer_free(&w);
            if (rc) return rc;
            const uint64_t st = wire_get_u64(&r), n = wire_get_u64(&r);
            const uint8_t *floats = r.failed ? NULL : wire_get_bytes(&r, count * sizeof(float));
            if (!floats || n != expect_n || wire_reader_done(&r))
                return cirrus_fail(err, CIRRUS_EMISMATCH,
                                   "STATE_GET reply: %llu optimizer floats (expected %llu) or "
                                   "a slice that is not the %llu floats asked for",
                                   (unsigned long long)n, (unsigned long long)expect_n,
                                   (unsigned long long)count);
            if (off == 0) first_steps = st;
            if (st != first_steps) {
                restart = 1; /* the donor stepped: its state is another one now */
                break;
            }
            sink(ctx, off, floats, count);
        }
        if (!restart) {
            *steps = first_steps;
            return 0;
        }
    }
    return cirrus_fail(err, CIRRUS_EIO, "the donor kept stepping while its state was fetched");
}
