/* cpu_gemm: see cpu_gemm.h. */
#include "cpu_gemm.h"

#include <omp.h>
#include <pthread.h>

/* Tiles are at least TILE_MIN wide (below that, a tile's fixed costs, a call and packing
 * all of the other operand, outweigh its work), at most TILE_MAX_COUNT per product (enough
 * for 16 cores), as many as a power of two (so they split evenly over 2, 4, 8 or 16
 * threads; rounding their width up may leave one fewer), and a multiple of TILE_ALIGN elements wide, which covers every x86 kernel's
 * unrolling (4 to 16) so that only a product's last tile has an edge. Measured on the small
 * model (docs/BENCHMARKS.md): 64-wide tiles, up to 16, cost 6-18% against OpenBLAS threading
 * a product itself; these settings cost 0-5%. */
#define TILE_MIN 128
#define TILE_MAX_COUNT 16
#define TILE_ALIGN 16

static pthread_once_t single_threaded_once = PTHREAD_ONCE_INIT;

void cpu_gemm_blas_threads(int n)
{
    /* The OpenMP build of OpenBLAS also sets OpenMP's thread count (of the calling thread)
     * to n; Cirrus's own loops must keep theirs. */
    const int ours = omp_get_max_threads();
    openblas_set_num_threads(n);
    omp_set_num_threads(ours);
}

static void set_single_threaded(void)
{
    cpu_gemm_blas_threads(1);
}

void cpu_gemm_init(void)
{
    pthread_once(&single_threaded_once, set_single_threaded);
}

void cpu_gemm_tiling(int M, int N, int *by_rows, int *tile, int *count)
{
    /* Split the longer side of the output: more, wider tiles. */
    *by_rows = M >= N;
    const int len = *by_rows ? M : N;
    /* A power of two: the tiles then split evenly over 2, 4, 8 or 16 threads. */
    int n = 1;
    while (n * 2 <= TILE_MAX_COUNT && len / (n * 2) >= TILE_MIN) n *= 2;
    int t = (len + n - 1) / n;
    t = (t + TILE_ALIGN - 1) / TILE_ALIGN * TILE_ALIGN;
    if (t < 1) t = 1;
    *tile = t;
    *count = len > 0 ? (len + t - 1) / t : 0;
}

void cpu_sgemm(enum CBLAS_TRANSPOSE ta, enum CBLAS_TRANSPOSE tb, int M, int N, int K,
               float alpha, const float *A, int lda, const float *B, int ldb, float beta,
               float *C, int ldc)
{
    cpu_gemm_init();
    int by_rows, tile, count;
    cpu_gemm_tiling(M, N, &by_rows, &tile, &count);
    /* Which thread runs a tile does not matter, so the schedule may balance freely. */
#pragma omp parallel for schedule(dynamic, 1)
    for (int i = 0; i < count; i++) {
        const int lo = i * tile;
        if (by_rows) {
            const int rows = M - lo < tile ? M - lo : tile;
            /* Rows lo.. of op(A): rows of A, or columns of A stored transposed. */
            const float *a = ta == CblasNoTrans ? A + (size_t)lo * lda : A + lo;
            cblas_sgemm(CblasRowMajor, ta, tb, rows, N, K, alpha, a, lda, B, ldb, beta,
                        C + (size_t)lo * ldc, ldc);
        } else {
            const int cols = N - lo < tile ? N - lo : tile;
            /* Columns lo.. of op(B): columns of B, or rows of B stored transposed. */
            const float *b = tb == CblasNoTrans ? B + lo : B + (size_t)lo * ldb;
            cblas_sgemm(CblasRowMajor, ta, tb, M, cols, K, alpha, A, lda, b, ldb, beta,
                        C + lo, ldc);
        }
    }
}
