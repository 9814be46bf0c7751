/* nccl_collective: the collective interface (collective.h) over NCCL, for the peers of a
 * stage that all run the CUDA backend; only the `make cuda` build compiles it, and the CUDA
 * backend's table hands it out (ops.h: device_collective_id/new). The TCP ring stays what
 * builds it: rank 0 makes the communicator's id and the ring carries it to the others
 * (swarm/peer/averaging.c), and whatever fails here sends them back to the ring.
 *
 * Nothing may hang a survivor when a member dies: the communicator is non-blocking (init
 * and every call return at once) and this file polls it against a deadline (the round's
 * timeout), then ncclCommAbort()s it. The caller frees a failed collective and builds a new
 * one for the next membership, which is how NCCL wants a communicator replaced.
 *
 * The caller's buffers are host memory (the packed gradients); they travel through a device
 * buffer of this collective's own on a stream of its own. The deadline covers a whole call
 * (copies and the sum), where the TCP ring's is per chunk: the client sizes it from past
 * rounds (a few times the median), which holds either way.
 */
#include <cuda_runtime.h>
#include <nccl.h>
#include <new>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

extern "C" {
#include "collective.h"
#include "nccl_collective.h"
}

static_assert(sizeof(ncclUniqueId) == DEVICE_COLLECTIVE_ID_BYTES, "NCCL's id size changed");

struct nccl_collective {
    collective base;
    ncclComm_t comm;
    cudaStream_t stream;
    float *dev;
    size_t cap;
};

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + t.tv_nsec / 1e9;
}

static int nccl_fail(cirrus_error *err, ncclComm_t comm, const char *what, ncclResult_t r)
{
    const char *last = comm ? ncclGetLastError(comm) : NULL;
    return cirrus_fail(err, CIRRUS_EIO, "NCCL %s: %s%s%s", what, ncclGetErrorString(r),
                       last && *last ? ": " : "", last && *last ? last : "");
}

/* Until the communicator's pending work (its init, or the calls enqueued on `stream`) is
 * done, a member failed, or timeout_ms passed. */
static int wait_done(ncclComm_t comm, cudaStream_t stream, int timeout_ms, const char *what,
                     cirrus_error *err)
{
    const double deadline = now_s() + timeout_ms / 1e3;
    for (;;) {
        ncclResult_t st;
        ncclResult_t r = ncclCommGetAsyncError(comm, &st);
        if (r != ncclSuccess) return nccl_fail(err, comm, what, r);
        if (st != ncclSuccess && st != ncclInProgress) return nccl_fail(err, comm, what, st);
        if (st == ncclSuccess) {
            if (!stream) return 0;
            cudaError_t e = cudaStreamQuery(stream);
            if (e == cudaSuccess) return 0;
            if (e != cudaErrorNotReady)
                return cirrus_fail(err, CIRRUS_EIO, "NCCL %s: %s", what, cudaGetErrorString(e));
        }
        if (now_s() > deadline)
            return cirrus_fail(err, CIRRUS_EIO, "NCCL %s: not done after %d ms (a member lost?)",
                               what, timeout_ms);
        usleep(200);
    }
}

static int nccl_allreduce_sum(collective *c, float *data, size_t n, cirrus_error *err)
{
    nccl_collective *nc = (nccl_collective *)c;
    if (n == 0) return 0;
    if (n > nc->cap) {
        cudaFree(nc->dev);
        nc->dev = NULL;
        nc->cap = 0;
        cudaError_t e = cudaMalloc(&nc->dev, n * sizeof(float));
        if (e != cudaSuccess)
            return cirrus_fail(err, CIRRUS_ENOMEM, "NCCL buffer of %zu floats: %s", n,
                               cudaGetErrorString(e));
        nc->cap = n;
    }
    cudaError_t e = cudaMemcpyAsync(nc->dev, data, n * sizeof(float), cudaMemcpyHostToDevice,
                                    nc->stream);
    if (e != cudaSuccess)
        return cirrus_fail(err, CIRRUS_EIO, "NCCL copy in: %s", cudaGetErrorString(e));
    ncclResult_t r = ncclAllReduce(nc->dev, nc->dev, n, ncclFloat, ncclSum, nc->comm, nc->stream);
    if (r != ncclSuccess && r != ncclInProgress) return nccl_fail(err, nc->comm, "all-reduce", r);
    int rc = wait_done(nc->comm, nc->stream, c->timeout_ms, "all-reduce", err);
    if (rc) return rc; /* the caller frees (aborts) it; the stream is not waited on again */
    e = cudaMemcpyAsync(data, nc->dev, n * sizeof(float), cudaMemcpyDeviceToHost, nc->stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(nc->stream);
    if (e != cudaSuccess)
        return cirrus_fail(err, CIRRUS_EIO, "NCCL copy out: %s", cudaGetErrorString(e));
    return 0;
}

/* Abort, not destroy: it returns even when a member is gone or a call is stuck. */
static void nccl_free(collective *c)
{
    nccl_collective *nc = (nccl_collective *)c;
    if (nc->comm) ncclCommAbort(nc->comm);
    if (nc->stream) cudaStreamDestroy(nc->stream);
    cudaFree(nc->dev);
    delete nc;
}

static const collective_ops nccl_ops = {"nccl", nccl_allreduce_sum, nccl_free};

int nccl_collective_id(uint8_t *id, cirrus_error *err)
{
    ncclUniqueId u;
    ncclResult_t r = ncclGetUniqueId(&u);
    if (r != ncclSuccess) return nccl_fail(err, NULL, "unique id", r);
    memcpy(id, &u, sizeof u);
    return 0;
}

int nccl_collective_new(collective **out, int rank, int world, const uint8_t *id,
                                   int timeout_ms, cirrus_error *err)
{
    *out = NULL;
    nccl_collective *nc = new (std::nothrow) nccl_collective();
    if (!nc) return cirrus_fail(err, CIRRUS_ENOMEM, "NCCL collective");
    nc->base.ops = &nccl_ops;
    nc->base.rank = rank;
    nc->base.world = world;
    nc->base.timeout_ms = timeout_ms;
    cudaError_t e = cudaStreamCreateWithFlags(&nc->stream, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
        nc->stream = NULL;
        nccl_free(&nc->base);
        return cirrus_fail(err, CIRRUS_EIO, "NCCL stream: %s", cudaGetErrorString(e));
    }
    ncclUniqueId u;
    memcpy(&u, id, sizeof u);
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclResult_t r = ncclCommInitRankConfig(&nc->comm, world, u, rank, &cfg);
    int rc = 0;
    if (r != ncclSuccess && r != ncclInProgress)
        rc = nccl_fail(err, nc->comm, "init", r);
    else
        rc = wait_done(nc->comm, NULL, timeout_ms, "init", err);
    if (rc) {
        nccl_free(&nc->base);
        return rc;
    }
    *out = &nc->base;
    return 0;
}
