/* The kernel backend of the harnesses that build models (fuzz_ckpt, fuzz_seeds): they load
 * and write checkpoints but run no kernel, so a backend that only allocates, as the CPU one
 * does, keeps BLAS and OpenMP out of the sanitized fuzz builds. Replaces ops_select.c there. */
#include <stdlib.h>

#include "../../trainer/model/ops.h"

static float *fuzz_alloc(size_t n)
{
    return calloc(n ? n : 1, sizeof(float));
}

static void fuzz_free(float *p)
{
    free(p);
}

static const ops_backend fuzz_backend = {.name = "cpu", .alloc = fuzz_alloc, .free = fuzz_free};

const ops_backend *ops_selected(void)
{
    return &fuzz_backend;
}
