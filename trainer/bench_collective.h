/* bench_collective: all-reduce benchmark of the TCP ring over loopback (see the .c). */
#ifndef CIRRUS_BENCH_COLLECTIVE_H
#define CIRRUS_BENCH_COLLECTIVE_H

#include <stddef.h>

#include "../common/cerr.h"

typedef struct bench_collective_options {
    int world;               /* ranks, each a process */
    size_t min_bytes, max_bytes; /* sizes doubled from min to max */
    size_t chunk_bytes;      /* ring pipelining chunk */
    int json;
} bench_collective_options;

int bench_collective(const bench_collective_options *o, cirrus_error *err);

#endif
