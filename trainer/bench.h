/* bench: training throughput against the machine's sgemm ceiling, measured in one run.
 *
 * Times full training steps (forward, backward, AdamW) of a model on synthetic tokens and
 * reports tokens/s and model FLOP/s; then times OpenBLAS sgemm alone on exactly the matrix
 * shapes (and transpositions) of that step's linear layers and LM head, forward and
 * backward. The ratio says how close the whole trainer gets to its matrix-multiply ceiling.
 * The ceiling is OpenBLAS threading each product itself; the same products in the fixed
 * tiles the model uses (cpu_gemm.h, for results independent of the thread count) are timed
 * too, so the cost of that determinism is visible. With the CUDA backend (`--backend cuda`)
 * the steps run on the GPU and the ceiling is cuBLAS on the same shapes (tiled = the same).
 */
#ifndef CIRRUS_BENCH_H
#define CIRRUS_BENCH_H

#include "model/gpt.h"

typedef struct bench_result {
    double tokens_per_s;
    double model_flops_per_token; /* forward + backward, attention included */
    double model_gflops;          /* achieved */
    double sgemm_gflops;          /* ceiling on the same shapes: OpenBLAS's own threading,
                                   * or cuBLAS for the CUDA backend */
    double tiled_gflops;          /* the same shapes in cpu_sgemm's fixed tiles */
    double phase_ms[3];           /* per step: forward, backward, optimizer */
} bench_result;

/* Model FLOPs per trained token: 3 x forward (backward = 2 x forward). */
double bench_flops_per_token(const gpt_config *cfg, int T);

int bench_train(const gpt_config *cfg, int B, int T, int steps, bench_result *r,
                cirrus_error *err);

#endif
