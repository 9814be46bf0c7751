/* q8 (codec_q8_*): blockwise 8-bit quantisation of activations and their gradients.
 *
 * Each block of CODEC_Q8_BLOCK floats becomes a little-endian fp32 scale (absmax / 127)
 * followed by CODEC_Q8_BLOCK int8 values round(x / scale); the last block may be short.
 * 64 floats (256 bytes) become 68 bytes: 3.76x smaller. An all-zero block has scale 0 and
 * decodes to zeros (no division by zero); non-finite inputs are rejected by the encoder.
 * Decoding checks the encoded length and that every scale is finite and non-negative, so
 * bytes from the network cannot produce NaN or out-of-range writes.
 */
#ifndef CIRRUS_CODEC_Q8_H
#define CIRRUS_CODEC_Q8_H

#include <stddef.h>
#include <stdint.h>

#define CODEC_Q8_BLOCK 64

/* Bytes needed to encode n floats. */
size_t codec_q8_encoded_size(size_t n);
/* Encode n floats into out (codec_q8_encoded_size(n) bytes). Returns CIRRUS_EINVAL if any
 * input is NaN or infinite (out is then unspecified). */
int codec_q8_encode(uint8_t *out, const float *x, size_t n);
/* Decode in (in_len bytes, which must equal codec_q8_encoded_size(n)) into n floats.
 * Returns CIRRUS_ECORRUPT on a wrong length or a bad scale; out is then unspecified. */
int codec_q8_decode(float *out, size_t n, const uint8_t *in, size_t in_len);

/* The straightforward scalar versions, kept as the reference the fast ones are tested
 * against. */
int codec_q8_encode_ref(uint8_t *out, const float *x, size_t n);
int codec_q8_decode_ref(float *out, size_t n, const uint8_t *in, size_t in_len);

#endif
