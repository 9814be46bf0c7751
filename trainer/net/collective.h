/* collective: the all-reduce the peers of one pipeline stage use to average gradients.
 *
 * One interface, two implementations: a TCP ring (ring.c), which every build has and which
 * builds the other, and NCCL (nccl_collective.cu, the `make cuda` build), used when every
 * peer of the stage runs the CUDA backend. A communicator is built for one membership
 * (rank, world, addresses); when the membership changes the caller frees it and builds a
 * new one, which is how an NCCL communicator must be handled too.
 */
#ifndef CIRRUS_COLLECTIVE_H
#define CIRRUS_COLLECTIVE_H

#include <stddef.h>
#include <stdint.h>

#include "../../common/cerr.h"

typedef struct collective collective;

typedef struct collective_ops {
    const char *name;
    /* In place: data[i] = sum over ranks of data[i]. Every rank passes the same n. */
    int (*allreduce_sum)(collective *c, float *data, size_t n, cirrus_error *err);
    void (*free)(collective *c);
} collective_ops;

struct collective {
    const collective_ops *ops;
    int rank, world;
    int timeout_ms; /* the longest one call waits on another rank before it fails */
};

/* The size of a device communicator's id (NCCL's ncclUniqueId), which rank 0 makes and the
 * others are handed (ops.h: device_collective_id/new). */
#define DEVICE_COLLECTIVE_ID_BYTES 128

static inline void collective_set_timeout(collective *c, int timeout_ms)
{
    if (c && timeout_ms > 0) c->timeout_ms = timeout_ms;
}

static inline int collective_allreduce_sum(collective *c, float *data, size_t n,
                                           cirrus_error *err)
{
    return c->ops->allreduce_sum(c, data, n, err);
}

static inline void collective_free(collective *c)
{
    if (c) c->ops->free(c);
}
#endif
