/* rng: the one pseudo-random generator of Cirrus.
 *
 * Hand-rolled on purpose: initialisation, data shuffling and sampling must give the same
 * numbers on every platform and libc, bit for bit, so runs are reproducible from a seed
 * and the whole state fits in one uint64 for checkpoints. SplitMix64 (Steele, Lea, Flood
 * 2014) is tiny, passes BigCrush, and any seed, 0 included, is fine.
 */
#ifndef CIRRUS_RNG_H
#define CIRRUS_RNG_H

#include <stdint.h>

typedef struct rng_state {
    uint64_t s;
} rng_state;

void rng_seed(rng_state *r, uint64_t seed);
uint64_t rng_next(rng_state *r);
/* Uniform in [0, 1) with 24 random bits, exactly representable as a float. */
float rng_uniform(rng_state *r);
/* Uniform integer in [0, n), n > 0, without modulo bias. */
uint64_t rng_below(rng_state *r, uint64_t n);
/* A seed for a sub-stream named by (seed, stream), e.g. the data order of one epoch: any
 * stream can be rebuilt from scratch without replaying the others. */
uint64_t rng_derive(uint64_t seed, uint64_t stream);
/* Standard normal (Box-Muller). */
float rng_normal(rng_state *r);

#endif
