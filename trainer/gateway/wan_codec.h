/* wan_codec: how a gateway compresses pseudo-gradients for the WAN between regions.
 *
 * A table of codecs (fp32, fp16, blockwise int8, top-k, 2/4-bit) behind one vtable, each
 * with a plain scalar reference the fast path must equal bit for bit, and a self-describing
 * message around a codec's body (header, optional zstd) whose decoder trusts nothing it
 * reads. Encoding can carry an error-feedback residual, so what a lossy codec drops this
 * round is sent in a later one.
 *
 * Independent of trainer/codec/q8 on purpose: that codec is the activation format between
 * stage peers inside a region (fixed, unframed, latency-bound); this one is the gateway's
 * format between regions (self-describing, bandwidth-bound, can change without touching the
 * pipeline). The q8 block format and rounding rules are the same ideas, reimplemented.
 *
 * Message (all integers little-endian; WAN_HEADER_SIZE bytes, then the payload):
 *
 *   off size field
 *     0    4 magic     "CWAN" (0x4e415743 read as a little-endian u32)
 *     4    1 version   WAN_VERSION
 *     5    1 codec     enum wan_codec_id
 *     6    1 flags     bit 0: the payload is one zstd frame of the body; others must be 0
 *     7    1 bits      value width: none 32, fp16 16, q8 8, topk 8|16, lowbit 2|4
 *     8    8 n         values in the vector (must equal what the receiver expects)
 *    16    8 k         topk: entries sent, 1 <= k <= n (0 iff n == 0); other codecs: 0
 *    24    8 body_len  body bytes before zstd: exact for the dense codecs, within the
 *                      codec's bound for topk; a zstd frame must declare exactly this
 *
 * No checksum: the frame carrying the message (trainer/net/wire) has one. The bodies are
 * described in wan_codec_dense.c (none, fp16, q8, lowbit) and wan_codec_topk.c.
 *
 * Decoding is a pure function of the bytes: no threads, no dependence on the CPU (fast
 * paths use the same operations in the same order as the references; the build's -std=c11
 * keeps GCC from contracting a*b+c into an FMA, and no codec writes one expression where
 * that could change a result). Like the rest of the trainer it assumes the default
 * floating-point environment (round to nearest, no flush-to-zero). Encoding is as
 * deterministic, except that zstd's output may change with the libzstd version (any
 * version decodes it to the same body). Any non-finite value is refused on both sides:
 * encoders return CIRRUS_EINVAL for NaN/Inf input, decoders CIRRUS_ECORRUPT for bytes that
 * would decode to one. Everything is reentrant; callers split work across threads by
 * message.
 */
#ifndef CIRRUS_WAN_CODEC_H
#define CIRRUS_WAN_CODEC_H

#include <stddef.h>
#include <stdint.h>

#include "../../common/cerr.h"

/* Codec ids are on the wire; never renumber. */
enum wan_codec_id {
    WAN_CODEC_NONE = 0,   /* fp32, lossless */
    WAN_CODEC_FP16 = 1,   /* IEEE binary16, round to nearest even, saturating at +-65504 */
    WAN_CODEC_Q8 = 2,     /* blocks of 64: fp32 scale absmax/127, int8 in [-127, 127] */
    WAN_CODEC_TOPK = 3,   /* k largest |x|: varint index gaps, fp16 or q8 values */
    WAN_CODEC_LOWBIT = 4, /* blocks of 64: fp32 scale absmax/L, codes in [-L, L],
                           * L = 7 at 4 bits, 1 at 2 bits */
    WAN_CODEC_COUNT
};

#define WAN_MAGIC 0x4e415743u /* "CWAN" */
#define WAN_VERSION 1
#define WAN_HEADER_SIZE 32
#define WAN_FLAG_ZSTD 1u
#define WAN_ZSTD_LEVEL 3
#define WAN_CODEC_BLOCK 64 /* q8 and lowbit: values per scale */
/* Encoders and decoders work through the vector in chunks of this many values (a multiple
 * of WAN_CODEC_BLOCK), so no n-sized temporary is needed for error feedback or top-k. */
#define WAN_CODEC_CHUNK 4096
/* Larger vectors are refused, which keeps every size computation far from overflow. */
#define WAN_CODEC_N_MAX ((uint64_t)1 << 40)

typedef struct wan_codec_params {
    int id;         /* enum wan_codec_id */
    /* topk: fraction of entries kept, (0, 1]; k = max(1, ceil(density * n)), where a product
     * within 1e-12 (relative) of an integer counts as that integer. */
    double density;
    /* Value width: lowbit 2 or 4 (required); topk 16 (fp16 values, the default) or 8 (q8
     * values); none/fp16/q8 have one width each (32/16/8). 0 means the codec's default. */
    int bits;
    /* 1: zstd (WAN_ZSTD_LEVEL) over the body, kept only where it makes the message smaller
     * (the header's flag says which), so +zstd never costs more than the header. */
    int zstd;
    /* topk: entries sent. 0 on encode means "from density"; wan_message_info and the codec
     * decoders take it from the header, since k, not density, is what the bytes carry. */
    size_t k;
} wan_codec_params;

/* A codec's body, without the message header. Callers outside this module use wan_encode /
 * wan_decode; the vtable is public so tests can hold the fast path to the reference. */
typedef struct wan_codec {
    const char *name; /* "none", "fp16", "q8", "topk", "lowbit" */
    int id;
    /* 1 where a sender should keep a residual (wan_encode's error feedback): topk and
     * lowbit drop most of the signal by design; q8 rounds deterministically, so its error
     * repeats round after round rather than averaging out. fp16 and none: 0. */
    int error_feedback;
    /* Most body bytes for n values (exact for every codec but topk); SIZE_MAX for params
     * the codec does not take. */
    size_t (*bound)(size_t n, const wan_codec_params *p);
    /* Encode x[0..n) into out (cap >= bound). CIRRUS_EINVAL: a non-finite x or bad p. */
    int (*encode)(const float *x, size_t n, const wan_codec_params *p, uint8_t *out,
                  size_t cap, size_t *len);
    /* Decode exactly len body bytes into out[0..n). CIRRUS_ECORRUPT for anything the
     * encoder cannot have written; never writes outside out[0..n). */
    int (*decode)(const uint8_t *in, size_t len, size_t n, const wan_codec_params *p,
                  float *out);
    int (*encode_ref)(const float *x, size_t n, const wan_codec_params *p, uint8_t *out,
                      size_t cap, size_t *len);
    int (*decode_ref)(const uint8_t *in, size_t len, size_t n, const wan_codec_params *p,
                      float *out);
    /* r[i] = r[i] - decode(in)[i], the same bits as decoding then subtracting: the error
     * feedback's update without an n-float temporary. NULL for the blockwise codecs, whose
     * body for values [0, a), a a multiple of WAN_CODEC_CHUNK, is the first bound(a) bytes,
     * so the update decodes one chunk at a time with decode. */
    int (*decode_sub)(const uint8_t *in, size_t len, size_t n, const wan_codec_params *p,
                      float *r);
} wan_codec;

/* NULL if unknown. */
const wan_codec *wan_codec_by_name(const char *name);
const wan_codec *wan_codec_by_id(int id);

/* "none", "fp16", "q8", "topk:DENSITY[:8|16]", "lowbit:2|4", each optionally followed by
 * "+zstd". CIRRUS_EINVAL with a one-line message naming the problem; p is then unchanged. */
int wan_codec_parse(const char *spec, wan_codec_params *p, cirrus_error *err);
/* The inverse, for logs and status: parse(format(p)) gives p back (density printed with
 * the fewest digits that read back the same double). */
void wan_codec_format(const wan_codec_params *p, char *buf, size_t size);

/* The room wan_encode needs for n values with p (with +zstd, libzstd's worst case);
 * SIZE_MAX if p or n is refused. */
size_t wan_encode_bound(size_t n, const wan_codec_params *p);
/* The largest message wan_decode accepts for n values, whatever the codec: what a receiver
 * must be ready to take. zstd is kept only when it shrinks the body, so this is the header
 * plus the largest body, fp32's 4n (top-k's is at most 3n even at density 1). */
size_t wan_message_max(size_t n);

/* Encode x[0..n) as one message into out (cap >= wan_encode_bound(n, p)).
 * With residual != NULL (n floats, zeros at the start), sends y = x + residual and leaves
 * residual = y - wan_decode(message), bit for bit what the receiver decodes, so the mass
 * lost this round goes out in later rounds. y is formed in residual itself (no n-float
 * temporary). CIRRUS_EINVAL (message in err) for bad params, a small cap, or a non-finite x
 * or x + residual: checked first, so residual is then unchanged. The one failure after that
 * is topk's CIRRUS_ENOMEM (its ~0.5 MiB of selection scratch), which leaves residual = y:
 * this round's x is kept as if nothing was sent, so do not add it again. A failing zstd
 * does not fail the call: the body goes uncompressed. */
int wan_encode(const wan_codec_params *p, const float *x, float *residual, size_t n,
               uint8_t *out, size_t cap, size_t *len, cirrus_error *err);

/* Decode a message of exactly len bytes into out[0..n). Every header field is checked
 * before use (magic, version, codec, flags, bits, n == the expected n, k, body_len against
 * the codec's size for n), a zstd payload must be exactly one frame declaring body_len
 * (the only allocation, of body_len bytes, comes after that check), and the body is
 * validated by the codec as it is decoded. A bad message returns CIRRUS_ECORRUPT with a
 * one-line message; out is then unspecified but nothing past out[n) is written.
 * CIRRUS_ENOMEM if the zstd scratch buffer cannot be had. */
int wan_decode(const uint8_t *in, size_t len, float *out, size_t n, cirrus_error *err);

/* The header of a message, checked as wan_decode checks it (n is not compared: it is
 * returned), for logs and for a receiver that learns the codec from the sender. For topk,
 * p->k is the header's k and p->density = k / n. */
int wan_message_info(const uint8_t *in, size_t len, wan_codec_params *p, size_t *n,
                     cirrus_error *err);

/* The k a topk message carries for n values with p (p->k if set, else from p->density);
 * SIZE_MAX for params topk does not take. */
size_t wan_codec_topk_k(size_t n, const wan_codec_params *p);

/* The table's entries, defined in wan_codec_dense.c and wan_codec_topk.c (top-k sends its
 * values through fp16 or q8). Elsewhere, use wan_codec_by_id / _by_name. */
extern const wan_codec wan_codec_none_def;
extern const wan_codec wan_codec_fp16_def;
extern const wan_codec wan_codec_q8_def;
extern const wan_codec wan_codec_lowbit_def;
extern const wan_codec wan_codec_topk_def;

#endif
