/* ring: the pipelined TCP ring all-reduce, the CPU build's implementation of collective.h
 * (reduce-scatter then all-gather, chunk by chunk; see ring.c). Only code that builds a
 * communicator includes this; code that uses one needs collective.h alone. */
#ifndef CIRRUS_RING_H
#define CIRRUS_RING_H

#include <stddef.h>

#include "collective.h"

typedef struct ring_options {
    const char *job_id;    /* handshake: ranks of another job are refused */
    int timeout_ms;        /* deadline for connecting and for each chunk (later calls: the
                              collective's timeout_ms, collective_set_timeout) */
    size_t chunk_bytes;    /* pipelining granularity (default 1 MiB) */
} ring_options;

/* Build rank `rank` of a ring of `world` ranks. listen_fd is this rank's listening socket
 * (bound before the ranks learn each other's addresses); hosts/ports give every rank's
 * address. Rank r connects to rank (r+1) % world and accepts from (r-1+world) % world. */
int ring_new(collective **out, int rank, int world, int listen_fd, const char *const *hosts,
                const int *ports, const ring_options *opt, cirrus_error *err);

#endif
