/* ops_select: the CPU backend's table and the choice of backend. See ops.h.
 *
 * This is the one file compiled differently in the CUDA build (`make cuda` adds
 * -DCIRRUS_CUDA): there ops_select("cuda") can reach the CUDA backend; everywhere else the
 * rest of the objects are the plain build's, unchanged.
 */
#include "ops.h"

#include <stdlib.h>
#include <string.h>

#include "../codec/q8.h"
#include "cpu/cpu_gemm.h"

#ifdef CIRRUS_CUDA
#include "cuda/ops_cuda.h"
#endif

static float *cpu_alloc(size_t n)
{
    return calloc(n ? n : 1, sizeof(float));
}

static void cpu_free(float *p)
{
    free(p);
}

/* The model's own products: cpu_gemm's fixed tiles. */
static void cpu_sgemm_rm(int ta, int tb, int M, int N, int K, float alpha, const float *A,
                         int lda, const float *B, int ldb, float beta, float *C, int ldc)
{
    cpu_sgemm(ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K, alpha, A,
              lda, B, ldb, beta, C, ldc);
}

static int cpu_status(cirrus_error *err)
{
    (void)err;
    return 0;
}

const ops_backend ops_backend_cpu = {
    .name = "cpu",
    .alloc = cpu_alloc,
    .free = cpu_free,
    .status = cpu_status,
    .encoder_forward = ops_encoder_forward,
    .encoder_backward = ops_encoder_backward,
    .layernorm_forward = ops_layernorm_forward,
    .layernorm_backward = ops_layernorm_backward,
    .matmul_forward = ops_matmul_forward,
    .matmul_backward = ops_matmul_backward,
    .attention_forward = ops_attention_forward,
    .attention_backward = ops_attention_backward,
    .gelu_forward = ops_gelu_forward,
    .gelu_backward = ops_gelu_backward,
    .crossentropy_forward = ops_crossentropy_forward,
    .crossentropy_backward = ops_crossentropy_backward,
    .head_forward = ops_head_forward,
    .head_backward = ops_head_backward,
    .sgemm = cpu_sgemm_rm,
    .fold = ops_fold,
    .sumsq = ops_sumsq,
    .sumsq_many = ops_sumsq_many,
    .adamw_update = ops_adamw_update,
    .adamw_update_many = ops_adamw_update_many,
    .q8_encode = codec_q8_encode,
    .q8_decode = codec_q8_decode,
};

static const ops_backend *selected = &ops_backend_cpu;

int ops_select(const char *name, cirrus_error *err)
{
    if (strcmp(name, "cpu") == 0) {
        selected = &ops_backend_cpu;
        return 0;
    }
    if (strcmp(name, "cuda") == 0) {
#ifdef CIRRUS_CUDA
        const ops_backend *b;
        int rc = ops_cuda_open(&b, err);
        if (rc) return rc;
        selected = b;
        return 0;
#else
        return cirrus_fail(err, CIRRUS_EINVAL,
                           "--backend cuda: this cirrus-trainer was built without CUDA "
                           "(build it with `make cuda`)");
#endif
    }
    return cirrus_fail(err, CIRRUS_EINVAL, "--backend must be cpu or cuda, got '%s'", name);
}

const ops_backend *ops_selected(void)
{
    return selected;
}
