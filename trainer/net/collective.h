/* collective: the all-reduce the peers of one pipeline stage use to average gradients.
 *
 * One interface, several implementations: a TCP ring for CPU builds (ring.c) and NCCL for
 * CUDA builds. A communicator is built for one membership (rank, world, addresses); when
 * the membership changes the caller destroys it and builds a new one, which is how an NCCL
 * communicator must be handled too.
 */
#ifndef CIRRUS_COLLECTIVE_H
#define CIRRUS_COLLECTIVE_H

#include <stddef.h>

#include "../../common/cerr.h"

typedef struct collective collective;

typedef struct collective_ops {
    const char *name;
    /* In place: data[i] = sum over ranks of data[i]. Every rank passes the same n. */
    int (*allreduce_sum)(collective *c, float *data, size_t n, cirrus_error *err);
    void (*destroy)(collective *c);
} collective_ops;

struct collective {
    const collective_ops *ops;
    int rank, world;
};

static inline int collective_allreduce_sum(collective *c, float *data, size_t n,
                                           cirrus_error *err)
{
    return c->ops->allreduce_sum(c, data, n, err);
}

static inline void collective_destroy(collective *c)
{
    if (c) c->ops->destroy(c);
}

/* ---- the TCP ring ---- */

typedef struct ring_options {
    const char *job_id;    /* handshake: ranks of another job are refused */
    int timeout_ms;        /* deadline for connecting and for each chunk */
    size_t chunk_bytes;    /* pipelining granularity (default 1 MiB) */
} ring_options;

/* Build rank `rank` of a ring of `world` ranks. listen_fd is this rank's listening socket
 * (bound before the ranks learn each other's addresses); hosts/ports give every rank's
 * address. Rank r connects to rank (r+1) % world and accepts from (r-1+world) % world. */
int ring_create(collective **out, int rank, int world, int listen_fd, const char *const *hosts,
                const int *ports, const ring_options *opt, cirrus_error *err);
/* From the next all-reduce on: give up after timeout_ms without progress (ring_options'
 * timeout_ms at creation). The stage's client learns the right figure as training goes. */
void ring_set_timeout(collective *ring, int timeout_ms);

#endif
