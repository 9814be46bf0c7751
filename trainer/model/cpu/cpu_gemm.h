/* cpu_gemm: the CPU backend's matrix product, with results that do not depend on the number
 * of threads.
 *
 * OpenBLAS, left to thread a product itself, splits the output between as many threads as
 * it has; each part goes through the kernel's full-width or edge micro-kernels depending on
 * where the split falls, and on some kernels (Haswell and Zen: AVX2 + FMA) those round
 * differently. A product computed with 2 threads then differs in the last bits from the same
 * product with 1 or 3 (issue: `train` with 2 threads drifted from the stage processes).
 *
 * cpu_sgemm instead cuts the output into tiles whose bounds depend only on the shape, runs
 * the tiles on Cirrus's OpenMP threads, and has OpenBLAS compute each tile single-threaded.
 * Every element is then computed by the same kernel code over the same data in the same
 * order, whatever the thread count and whichever thread runs its tile.
 */
#ifndef CIRRUS_CPU_GEMM_H
#define CIRRUS_CPU_GEMM_H

#include <cblas.h>

/* Row-major C (M,N) = alpha * op(A) (M,K) @ op(B) (K,N) + beta * C, as cblas_sgemm. */
void cpu_sgemm(enum CBLAS_TRANSPOSE ta, enum CBLAS_TRANSPOSE tb, int M, int N, int K,
               float alpha, const float *A, int lda, const float *B, int ldb, float beta,
               float *C, int ldc);

/* Make OpenBLAS single-threaded in this process (idempotent; cpu_sgemm calls it). Cirrus
 * runs its own threads; a product called inside them must not start more. */
void cpu_gemm_init(void);

/* Let OpenBLAS thread each call over n threads itself (the benchmark's reference), or n = 1
 * as cpu_gemm_init; OpenMP's thread count for Cirrus's loops is kept. */
void cpu_gemm_blas_threads(int n);

/* The tiling cpu_sgemm uses for an M x N output: tiles along rows (by_rows = 1) or columns,
 * each `tile` wide except the last. A function of the shape alone (exposed for the tests). */
void cpu_gemm_tiling(int M, int N, int *by_rows, int *tile, int *count);

#endif
