/* stage_proto: activation payload helpers. See stage_proto.h. */
#include "stage_proto.h"

#include <stdlib.h>
#include <string.h>

#include "../net/codec_q8.h"

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
