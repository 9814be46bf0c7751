/* The OpenMPI side of `make bench-collective`: MPI_Allreduce (float sum) on the same sizes
 * and with the same iteration rule as cirrus-trainer bench-collective, printing the same
 * JSON lines, so the two can be compared in one run. Built with mpicc. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, world;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    const char *label = argc > 1 ? argv[1] : "openmpi";
    size_t min_b = (size_t)(argc > 2 ? atoi(argv[2]) : 1) << 20;
    size_t max_b = (size_t)(argc > 3 ? atoi(argv[3]) : 256) << 20;
    float *buf = malloc(max_b);
    for (size_t i = 0; i < max_b / sizeof(float); i++) buf[i] = (float)(i % 13);
    for (size_t bytes = min_b; bytes <= max_b; bytes *= 2) {
        int n = (int)(bytes / sizeof(float));
        int iters = (int)(512.0 * (1 << 20) / (double)bytes);
        iters = iters < 3 ? 3 : iters > 50 ? 50 : iters;
        MPI_Allreduce(MPI_IN_PLACE, buf, n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        for (int i = 0; i < iters; i++)
            MPI_Allreduce(MPI_IN_PLACE, buf, n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        double dt = (MPI_Wtime() - t0) / iters;
        double algbw = (double)bytes / dt / 1e9, busbw = algbw * 2.0 * (world - 1) / world;
        if (rank == 0)
            printf("{\"impl\":\"%s\",\"ranks\":%d,\"bytes\":%zu,\"time_us\":%.1f,"
                   "\"algbw\":%.3f,\"busbw\":%.3f}\n",
                   label, world, bytes, dt * 1e6, algbw, busbw);
        fflush(stdout);
    }
    free(buf);
    MPI_Finalize();
    return 0;
}
