/* fragments: see fragments.h. */
#include "fragments.h"

#include <xxhash.h>

void outer_fragment_range(uint64_t m, int n_fragments, int f, uint64_t *lo, uint64_t *hi)
{
    /* m * f / P without overflow for any m a model can have (m < 2^40, P <= 8). */
    *lo = m / (uint64_t)n_fragments * (uint64_t)f + m % (uint64_t)n_fragments * (uint64_t)f /
                                                         (uint64_t)n_fragments;
    *hi = f + 1 == n_fragments ? m
                               : m / (uint64_t)n_fragments * (uint64_t)(f + 1) +
                                     m % (uint64_t)n_fragments * (uint64_t)(f + 1) /
                                         (uint64_t)n_fragments;
}

uint64_t outer_fragment_lead(int every, int n_fragments, int f)
{
    return (uint64_t)(n_fragments - 1 - f) * (uint64_t)every / (uint64_t)n_fragments;
}

uint64_t outer_fragments_digest(const uint64_t *digests, int n_fragments)
{
    if (n_fragments == 1) return digests[0];
    return XXH3_64bits(digests, (size_t)n_fragments * sizeof digests[0]);
}
