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
    void (*free)(collective *c);
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

static inline void collective_free(collective *c)
{
    if (c) c->ops->free(c);
}
#endif
