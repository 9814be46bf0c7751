/* blas_kernel: see blas_kernel.h. */
#include "blas_kernel.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../../common/log.h"

char *openblas_get_corename(void); /* OpenBLAS extension, not in cblas.h */

const char *blas_kernel_name(void)
{
    return openblas_get_corename();
}

/* Kernels OpenBLAS falls back to when it cannot identify a modern x86 CPU. */
static int is_fallback_kernel(const char *name)
{
    static const char *fallback[] = {"Prescott", "Core2", "Penryn", "Dunnington", "Nehalem",
                                     "Katmai", "Coppermine", "Northwood", "Banias"};
    for (size_t i = 0; i < sizeof fallback / sizeof fallback[0]; i++)
        if (strcmp(name, fallback[i]) == 0) return 1;
    return 0;
}

void blas_kernel_ensure(char **argv)
{
    if (getenv("OPENBLAS_CORETYPE")) return; /* the user's (or our earlier) choice */
    if (!is_fallback_kernel(blas_kernel_name())) return;
    const char *want = NULL;
#if defined(__x86_64__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
        want = "SkylakeX";
    else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        want = "Haswell";
#endif
    if (!want) return;
    if (setenv("OPENBLAS_CORETYPE", want, 1) != 0) return;
    execv("/proc/self/exe", argv);
    /* exec failed (no /proc?): carry on with the slow kernel rather than fail. */
    log_warn("OpenBLAS runs its generic %s kernel; set OPENBLAS_CORETYPE=%s for speed",
             blas_kernel_name(), want);
}
