#include "rng.h"

#include <math.h>

void rng_seed(rng_state *r, uint64_t seed)
{
    r->s = seed;
}

static uint64_t rng_mix(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

uint64_t rng_next(rng_state *r)
{
    return rng_mix(r->s += 0x9e3779b97f4a7c15ULL);
}

uint64_t rng_derive(uint64_t seed, uint64_t stream)
{
    return rng_mix(seed) ^ rng_mix(stream ^ 0xd1b54a32d192ed03ULL);
}

float rng_uniform(rng_state *r)
{
    return (float)(rng_next(r) >> 40) * (1.0f / 16777216.0f);
}

uint64_t rng_below(rng_state *r, uint64_t n)
{
    /* Rejection sampling: discard the top partial range so every value is equally likely. */
    uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    uint64_t x;
    do {
        x = rng_next(r);
    } while (x >= limit);
    return x % n;
}

float rng_normal(rng_state *r)
{
    /* u1 in (0, 1] so log() is finite. Computed in double: the same bits everywhere. */
    double u1 = ((double)(rng_next(r) >> 11) + 1.0) * (1.0 / 9007199254740992.0);
    double u2 = (double)(rng_next(r) >> 11) * (1.0 / 9007199254740992.0);
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}
