/* ops_cuda: the CUDA backend of the kernel interface (ops.h), in the binary `make cuda`
 * builds. cuBLAS for the matrix products, Cirrus's own kernels for the rest; fp32 and
 * deterministic: no reduction whose order matters uses atomics, so a run repeats bit for bit
 * on the same GPU. Memory is CUDA managed memory, so the host code around the kernels (the
 * stage's copies, the optimizer, checkpoints) reads and writes the same buffers unchanged.
 * One stream and process-wide scratch buffers: one thread of a process uses the backend at a
 * time (a CUDA stage peer runs as a process of its own; the tests' in-process peers are CPU).
 */
#ifndef CIRRUS_OPS_CUDA_H
#define CIRRUS_OPS_CUDA_H

#include "../ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Start CUDA on device 0 (CUDA_VISIBLE_DEVICES picks it) and return the backend's table.
 * Fails with CIRRUS_EIO and a one-line reason when there is no usable driver, no device, or
 * cuBLAS cannot start; nothing is left half-initialised then. Idempotent. */
int ops_cuda_open(const ops_backend **out, cirrus_error *err);

#ifdef __cplusplus
}
#endif

#endif
