/* le: n-byte little-endian integers, whatever the host's byte order. Every field Cirrus
 * writes to a file or a socket goes through these, never through a raw struct copy. */
#ifndef CIRRUS_LE_H
#define CIRRUS_LE_H

#include <stdint.h>

static inline void le_put(uint8_t *p, uint64_t v, int n)
{
    for (int i = 0; i < n; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static inline uint64_t le_get(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = 0; i < n; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

#endif
