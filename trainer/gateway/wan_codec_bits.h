/* wan_codec_bits: a float's bit pattern and back, for the WAN codecs' files (internal).
 * The codecs compare magnitudes and spot NaN/Inf on the patterns: exact, branch-free and
 * the same on every CPU, which float comparisons under -ffast-math-like flags are not. */
#ifndef CIRRUS_WAN_CODEC_BITS_H
#define CIRRUS_WAN_CODEC_BITS_H

#include <stdint.h>
#include <string.h>

#define ABS_MASK 0x7fffffffu
#define EXP_MASK 0x7f800000u /* |bits| >= this: Inf or NaN */

static inline uint32_t bits_of(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float float_of(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

#endif
