/* bench: see bench.h. */
#include "bench.h"

#include <cblas.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../common/clock.h"
#include "../common/rng.h"
#include "model/cpu/cpu_gemm.h"
#include "model/ops.h"
#include "model/stage.h"
#include "optim/adamw.h"

double bench_flops_per_token(const gpt_config *cfg, int T)
{
    const double C = cfg->n_embd, V = cfg->vocab;
    /* per layer: qkv 3C^2 + proj C^2 + fc 4C^2 + fcproj 4C^2 multiply-adds, and attention
     * scores + weighted sum over T positions (computed for the full square): 2TC. */
    double fwd = cfg->n_layer * (2.0 * 12.0 * C * C + 2.0 * 2.0 * T * C) + 2.0 * C * V;
    return 3.0 * fwd;
}

typedef struct gemm_shape {
    CBLAS_TRANSPOSE ta, tb;
    int m, n, k;
} gemm_shape;

/* The sgemm calls of one training step's linear layers, as ops_cpu.c issues them. */
static int step_shapes(const gpt_config *cfg, int N, gemm_shape *s)
{
    const int C = cfg->n_embd, V = cfg->vocab;
    const int io[4][2] = {{C, 3 * C}, {C, C}, {C, 4 * C}, {4 * C, C}};
    int n = 0;
    for (int l = 0; l < cfg->n_layer; l++) {
        for (int j = 0; j < 4; j++) {
            int IC = io[j][0], OC = io[j][1];
            s[n++] = (gemm_shape){CblasNoTrans, CblasTrans, N, OC, IC};   /* forward */
            s[n++] = (gemm_shape){CblasNoTrans, CblasNoTrans, N, IC, OC}; /* d input */
            s[n++] = (gemm_shape){CblasTrans, CblasNoTrans, OC, IC, N};   /* d weight */
        }
    }
    s[n++] = (gemm_shape){CblasNoTrans, CblasTrans, N, V, C};
    s[n++] = (gemm_shape){CblasNoTrans, CblasNoTrans, N, C, V};
    s[n++] = (gemm_shape){CblasTrans, CblasNoTrans, V, C, N};
    return n;
}

/* GFLOP/s of sgemm alone over the step's shapes, best of a few repetitions. On the CPU:
 * OpenBLAS threading each product itself (tiled = 0, the reference), or Cirrus's fixed
 * tiles (cpu_sgemm, what the model runs). On another backend (gpu != NULL): its own product
 * (cuBLAS), on its own memory, each call waited for. */
static double sgemm_ceiling(const gpt_config *cfg, int N, int reps, int tiled,
                            const ops_backend *gpu)
{
    gemm_shape *s = malloc(sizeof *s * (size_t)(12 * cfg->n_layer + 3));
    if (!s) return 0.0;
    int n = step_shapes(cfg, N, s);
    size_t maxa = 0;
    double flops = 0.0;
    for (int i = 0; i < n; i++) {
        size_t sz[3] = {(size_t)s[i].m * s[i].k, (size_t)s[i].k * s[i].n,
                        (size_t)s[i].m * s[i].n};
        for (int j = 0; j < 3; j++) maxa = sz[j] > maxa ? sz[j] : maxa;
        flops += 2.0 * s[i].m * s[i].n * s[i].k;
    }
    const ops_backend *mem = gpu ? gpu : &ops_backend_cpu;
    float *a = mem->alloc(maxa), *b = mem->alloc(maxa), *c = mem->alloc(maxa);
    double best = 1e30;
    if (!tiled && !gpu) cpu_gemm_blas_threads(omp_get_max_threads());
    for (int r = 0; a && b && c && r < reps; r++) {
        double t0 = clock_now_s();
        for (int i = 0; i < n; i++) {
            int lda = s[i].ta == CblasNoTrans ? s[i].k : s[i].m;
            int ldb = s[i].tb == CblasNoTrans ? s[i].n : s[i].k;
            if (gpu)
                gpu->sgemm(s[i].ta == CblasTrans, s[i].tb == CblasTrans, s[i].m, s[i].n, s[i].k,
                           1.0f, a, lda, b, ldb, 1.0f, c, s[i].n);
            else if (tiled)
                cpu_sgemm(s[i].ta, s[i].tb, s[i].m, s[i].n, s[i].k, 1.0f, a, lda, b, ldb, 1.0f, c,
                          s[i].n);
            else
                cblas_sgemm(CblasRowMajor, s[i].ta, s[i].tb, s[i].m, s[i].n, s[i].k, 1.0f, a,
                            lda, b, ldb, 1.0f, c, s[i].n);
        }
        double dt = clock_now_s() - t0;
        best = dt < best ? dt : best;
    }
    if (!tiled && !gpu) cpu_gemm_blas_threads(1);
    mem->free(a);
    mem->free(b);
    mem->free(c);
    free(s);
    return best < 1e30 ? flops / best / 1e9 : 0.0;
}

int bench_train(const gpt_config *cfg, int B, int T, int steps, bench_result *r,
                cirrus_error *err)
{
    gpt_model m;
    gpt_stage *st = NULL;
    adamw opt = {0};
    int32_t *x = malloc(sizeof(int32_t) * (size_t)B * T), *y = malloc(sizeof(int32_t) * (size_t)B * T);
    int rc = gpt_model_init(&m, cfg, err);
    if (rc) goto out_nomodel;
    gpt_model_seed(&m, 1);
    if ((rc = gpt_stage_new(&st, &m, 0, cfg->n_layer, B, T, err))) goto out;
    adamw_config ac = adamw_defaults(1e-3f, steps + 2);
    gpt_span all = {0, m.n_params};
    if ((rc = adamw_init(&opt, cfg, &all, 1, &ac, err))) goto out;
    if (!x || !y) {
        rc = cirrus_fail(err, CIRRUS_ENOMEM, "cannot allocate a batch");
        goto out;
    }
    rng_state rng;
    rng_seed(&rng, 7);
    for (int i = 0; i < B * T; i++) {
        x[i] = (int32_t)rng_below(&rng, (uint64_t)cfg->vocab);
        y[i] = (int32_t)rng_below(&rng, (uint64_t)cfg->vocab);
    }
    double t0 = 0.0, phase[3] = {0};
    for (int s = 0; s < steps + 2; s++) {
        if (s == 2) t0 = clock_now_s(); /* two warm-up steps: page faults, thread pools */
        gpt_stage_input in = {.id = (uint64_t)s + 1, .B = B, .T = T, .tokens = x, .targets = y};
        float loss;
        double ta = clock_now_s();
        gpt_stage_forward(st, &in, NULL, &loss, 1);
        double tb = clock_now_s();
        gpt_stage_backward(st, &in, NULL, NULL);
        double tc = clock_now_s();
        gpt_fold_tied_grads(&m);
        double ss = adamw_total_sumsq(&opt, m.grads, 1.0f);
        adamw_step(&opt, m.params, m.grads, 1.0f, ss, 1e-4f, (uint64_t)s + 1);
        if (s >= 2) {
            phase[0] += tb - ta;
            phase[1] += tc - tb;
            phase[2] += clock_now_s() - tc;
        }
    }
    double dt = clock_now_s() - t0;
    for (int i = 0; i < 3; i++) r->phase_ms[i] = 1e3 * phase[i] / steps;
    r->tokens_per_s = (double)steps * B * T / dt;
    r->model_flops_per_token = bench_flops_per_token(cfg, T);
    r->model_gflops = r->tokens_per_s * r->model_flops_per_token / 1e9;
    const ops_backend *gpu = m.ops == &ops_backend_cpu ? NULL : m.ops;
    r->sgemm_gflops = sgemm_ceiling(cfg, B * T, 5, 0, gpu);
    r->tiled_gflops = gpu ? r->sgemm_gflops : sgemm_ceiling(cfg, B * T, 5, 1, NULL);
    if (gpu && (rc = gpu->status(err))) goto out;
out:
    adamw_free(&opt);
    gpt_stage_free(st);
    gpt_model_free(&m);
out_nomodel:
    free(x);
    free(y);
    return rc;
}
