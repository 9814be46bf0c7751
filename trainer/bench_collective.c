/* bench_collective: all-reduce time, algbw and busbw of the TCP ring, nccl-tests style.
 *
 * The parent binds one listening socket per rank on loopback, then forks the ranks as
 * separate processes (as the peers of a stage are), which build the ring and time
 * all-reduces of each size. Rank 0 prints one line per size. busbw = algbw * 2(n-1)/n, the
 * figure comparable across rank counts and with NCCL and MPI.
 */
#include "bench_collective.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../common/clock.h"
#include "net/ring.h"
#include "net/conn.h"

static int run_rank(int rank, const bench_collective_options *o, const int *fds,
                    const char *const *hosts, const int *ports)
{
    cirrus_error err = {0};
    collective *c = NULL;
    ring_options ro = {.job_id = "bench-collective", .timeout_ms = 60000,
                       .chunk_bytes = o->chunk_bytes};
    if (ring_new(&c, rank, o->world, fds[rank], hosts, ports, &ro, &err)) {
        fprintf(stderr, "rank %d: %s\n", rank, err.msg);
        return 1;
    }
    size_t max_n = o->max_bytes / sizeof(float);
    float *buf = malloc(sizeof(float) * (max_n ? max_n : 1));
    float one = 1.0f;
    if (!buf) return 1;
    for (size_t i = 0; i < max_n; i++) buf[i] = (float)(i % 13);
    if (rank == 0 && !o->json)
        printf("%12s %8s %10s %10s %10s\n", "bytes", "iters", "time(us)", "algbw(GB/s)",
               "busbw(GB/s)");
    for (size_t bytes = o->min_bytes; bytes <= o->max_bytes; bytes *= 2) {
        size_t n = bytes / sizeof(float);
        /* Fewer iterations for big messages: about 0.5 GB moved per size, 3..50 iterations. */
        int iters = (int)(512.0 * (1 << 20) / (double)bytes);
        iters = iters < 3 ? 3 : iters > 50 ? 50 : iters;
        if (collective_allreduce_sum(c, buf, n, &err)) goto fail; /* warm-up */
        if (collective_allreduce_sum(c, &one, 1, &err)) goto fail; /* barrier */
        double t0 = clock_now_s();
        for (int i = 0; i < iters; i++)
            if (collective_allreduce_sum(c, buf, n, &err)) goto fail;
        double dt = (clock_now_s() - t0) / iters;
        double algbw = (double)bytes / dt / 1e9;
        double busbw = algbw * 2.0 * (o->world - 1) / o->world;
        if (rank == 0) {
            if (o->json)
                printf("{\"impl\":\"cirrus-ring\",\"ranks\":%d,\"bytes\":%zu,\"time_us\":%.1f,"
                       "\"algbw\":%.3f,\"busbw\":%.3f}\n",
                       o->world, bytes, dt * 1e6, algbw, busbw);
            else
                printf("%12zu %8d %10.1f %10.3f %10.3f\n", bytes, iters, dt * 1e6, algbw,
                       busbw);
            fflush(stdout);
        }
    }
    free(buf);
    collective_free(c);
    return 0;
fail:
    fprintf(stderr, "rank %d: %s\n", rank, err.msg);
    free(buf);
    collective_free(c);
    return 1;
}

int bench_collective(const bench_collective_options *o, cirrus_error *err)
{
    if (o->world < 2 || o->world > 64)
        return cirrus_fail(err, CIRRUS_EINVAL, "--ranks must be in [2, 64], got %d", o->world);
    if (o->min_bytes < sizeof(float) || o->min_bytes > o->max_bytes)
        return cirrus_fail(err, CIRRUS_EINVAL, "sizes must satisfy 4 <= min <= max");
    int fds[64], ports[64];
    const char *hosts[64];
    for (int r = 0; r < o->world; r++) {
        hosts[r] = "127.0.0.1";
        int rc = net_listen("127.0.0.1", 0, &fds[r], &ports[r], err);
        if (rc) return rc;
    }
    pid_t pids[64];
    for (int r = 0; r < o->world; r++) {
        fflush(stdout);
        pids[r] = fork();
        if (pids[r] == 0) _exit(run_rank(r, o, fds, hosts, ports));
    }
    for (int r = 0; r < o->world; r++) close(fds[r]);
    int failed = 0;
    for (int r = 0; r < o->world; r++) {
        int st = 0;
        if (pids[r] < 0 || waitpid(pids[r], &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st))
            failed = 1;
    }
    return failed ? cirrus_fail(err, CIRRUS_EIO, "a rank failed (see its message above)") : 0;
}
