/* nccl_collective: the collective interface over NCCL (see nccl_collective.cu); only the
 * `make cuda` build has it, and the CUDA backend's table hands it out (ops.h). */
#ifndef CIRRUS_NCCL_COLLECTIVE_H
#define CIRRUS_NCCL_COLLECTIVE_H

#include <stdint.h>

#include "collective.h"

/* A new communicator's id (DEVICE_COLLECTIVE_ID_BYTES), made on rank 0. */
int nccl_collective_id(uint8_t *id, cirrus_error *err);
/* Join the communicator `id` as `rank` of `world`; fails (the communicator aborted) when it
 * is not up within timeout_ms, which is also each all-reduce's limit until
 * collective_set_timeout changes it. */
int nccl_collective_new(collective **out, int rank, int world, const uint8_t *id,
                        int timeout_ms, cirrus_error *err);

#endif
