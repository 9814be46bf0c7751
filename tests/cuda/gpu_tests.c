/* gpu-tests: the CUDA backend against the CPU reference (`make test-gpu`).
 *
 *   gpu-tests            every kernel of ops.h on the same inputs on both backends (the
 *                        reducing ones also run twice on the GPU: the same bits); then
 *                        the whole model and a stage split, forward and backward, and three
 *                        AdamW steps; the gradient's sum of squares, the AdamW update and the
 *                        q8 codec bit-equal to the CPU's. Without a GPU: says so, exits 0.
 *   gpu-tests --probe    exit 0 if a GPU is usable, 3 if there is no driver or no device
 *                        (tests/cuda/run.sh picks its expectations with it).
 *   gpu-tests --cpu-as-gpu   everything above with the CPU backend in the GPU's place: every
 *                        comparison must then hold exactly. It runs this program's own code
 *                        (buffers, stage plumbing, checks) on machines without a GPU, so the
 *                        harness is not first exercised on the day a GPU runs it.
 *
 * Tolerances (fp32 both sides; the CPU and GPU sum in different orders and the CPU's tanhf
 * and expf are glibc's vector versions): a tensor passes when
 *     max |gpu - cpu| <= tol * max(max |cpu|, 1e-3)
 * with tol 1e-5 for single kernels, 1e-4 for the model's loss and gradients after a forward
 * and backward of 2 layers, and 1e-4 on the losses of three training steps. The sum of
 * squares, the AdamW update and the q8 codec must give the CPU's bits exactly; the kernels
 * that reduce (embedding, LayerNorm and attention backwards) are also run twice on the GPU
 * and must repeat their bits (no atomics).
 * Exit status: 0 all passed (or no GPU), 1 a failure.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "../../common/rng.h"
#include "../../trainer/codec/q8_format.h"
#include "../../trainer/model/cuda/ops_cuda.h"
#include "../../trainer/model/ops.h"
#include "../../trainer/model/stage.h"
#include "../../trainer/net/collective.h"
#include "../../trainer/optim/adamw.h"

static int failures, checks;
static const ops_backend *cpu = &ops_backend_cpu, *gpu;
static const char *gpu_name = "cuda"; /* "cpu" with --cpu-as-gpu */

/* Compare n floats normwise (see the top); prints one line per tensor. */
static void expect_close(const char *what, const float *got, const float *want, size_t n,
                         double tol)
{
    double maxref = 1e-3, maxdiff = 0.0;
    size_t worst = 0;
    for (size_t i = 0; i < n; i++) {
        double r = fabs((double)want[i]), d = fabs((double)got[i] - (double)want[i]);
        if (r > maxref) maxref = r;
        if (!(d <= maxdiff)) { /* also catches NaN */
            maxdiff = isnan(d) ? INFINITY : d;
            worst = i;
        }
    }
    checks++;
    int ok = maxdiff <= tol * maxref;
    if (!ok) failures++;
    printf("%s %-40s max|diff| %.3g (tol %.3g) at %zu: gpu %.9g cpu %.9g\n", ok ? "ok  " : "FAIL",
           what, maxdiff, tol * maxref, worst, n ? got[worst] : 0.0, n ? want[worst] : 0.0);
}

static void expect_same_bits(const char *what, const float *a, const float *b, size_t n)
{
    checks++;
    int ok = memcmp(a, b, n * sizeof(float)) == 0;
    if (!ok) failures++;
    printf("%s %-40s %s\n", ok ? "ok  " : "FAIL", what, ok ? "same bits" : "bits differ");
}

static rng_state rng;

/* A tensor on each backend holding the same values (uniform in [-scale, scale]). */
typedef struct pair {
    float *c, *g;
    size_t n;
} pair;

static pair pair_new(size_t n, float scale)
{
    pair p = {cpu->alloc(n), gpu->alloc(n), n};
    if (!p.c || !p.g) {
        fprintf(stderr, "gpu-tests: out of memory for %zu floats\n", n);
        exit(1);
    }
    for (size_t i = 0; i < n; i++) p.c[i] = scale * (2.0f * rng_uniform(&rng) - 1.0f);
    memcpy(p.g, p.c, n * sizeof(float));
    return p;
}

static void pair_free(pair *p)
{
    cpu->free(p->c);
    gpu->free(p->g);
}

static void check_pair(const char *what, const pair *p, double tol)
{
    expect_close(what, p->g, p->c, p->n, tol);
}

/* Runs a GPU kernel twice from the same inputs: `out` must come out bit-identical. The
 * kernel's inputs are restored from `saved` (the GPU copy of `in`) before the second run. */
static float *snapshot(const pair *p)
{
    float *s = malloc(p->n * sizeof(float));
    if (!s) exit(1);
    memcpy(s, p->g, p->n * sizeof(float));
    return s;
}

static int32_t *tokens_new(size_t n)
{
    int32_t *t = malloc(n * sizeof(int32_t));
    if (!t) exit(1);
    for (size_t i = 0; i < n; i++) t[i] = (int32_t)rng_below(&rng, GPT_VOCAB);
    return t;
}

enum { B = 2, T = 37, C = 96, NH = 3, V = GPT_VOCAB };
#define N (B * T)
#define TOL_KERNEL 1e-5

static void test_encoder(void)
{
    int32_t *tok = tokens_new(N);
    pair wte = pair_new((size_t)V * C, 1), wpe = pair_new((size_t)T * C, 1);
    pair out = pair_new((size_t)N * C, 0);
    cpu->encoder_forward(out.c, tok, wte.c, wpe.c, B, T, C);
    gpu->encoder_forward(out.g, tok, wte.g, wpe.g, B, T, C);
    check_pair("encoder_forward", &out, TOL_KERNEL);
    pair dwte = pair_new((size_t)V * C, 0.1f), dwpe = pair_new((size_t)T * C, 0.1f);
    float *w0 = snapshot(&dwte), *p0 = snapshot(&dwpe);
    cpu->encoder_backward(dwte.c, dwpe.c, out.c, tok, B, T, C);
    gpu->encoder_backward(dwte.g, dwpe.g, out.g, tok, B, T, C);
    check_pair("encoder_backward dwte", &dwte, TOL_KERNEL);
    check_pair("encoder_backward dwpe", &dwpe, TOL_KERNEL);
    float *first = snapshot(&dwte);
    memcpy(dwte.g, w0, dwte.n * sizeof(float));
    memcpy(dwpe.g, p0, dwpe.n * sizeof(float));
    gpu->encoder_backward(dwte.g, dwpe.g, out.g, tok, B, T, C);
    expect_same_bits("encoder_backward dwte, run twice", first, dwte.g, dwte.n);
    free(first), free(w0), free(p0), free(tok);
    pair_free(&wte), pair_free(&wpe), pair_free(&out), pair_free(&dwte), pair_free(&dwpe);
}

static void test_layernorm(void)
{
    pair inp = pair_new((size_t)N * C, 2), w = pair_new(C, 1), b = pair_new(C, 1);
    pair out = pair_new((size_t)N * C, 0), mean = pair_new(N, 0), rstd = pair_new(N, 0);
    cpu->layernorm_forward(out.c, mean.c, rstd.c, inp.c, w.c, b.c, N, C);
    gpu->layernorm_forward(out.g, mean.g, rstd.g, inp.g, w.g, b.g, N, C);
    check_pair("layernorm_forward out", &out, TOL_KERNEL);
    check_pair("layernorm_forward mean", &mean, TOL_KERNEL);
    check_pair("layernorm_forward rstd", &rstd, TOL_KERNEL);
    pair dout = pair_new((size_t)N * C, 1), dinp = pair_new((size_t)N * C, 0.5f);
    pair dw = pair_new(C, 0.5f), db = pair_new(C, 0.5f);
    float *dinp0 = snapshot(&dinp), *dw0 = snapshot(&dw), *db0 = snapshot(&db);
    /* Both sides from the CPU's statistics, so only the backward is compared. */
    memcpy(mean.g, mean.c, N * sizeof(float));
    memcpy(rstd.g, rstd.c, N * sizeof(float));
    cpu->layernorm_backward(dinp.c, dw.c, db.c, dout.c, inp.c, w.c, mean.c, rstd.c, N, C);
    gpu->layernorm_backward(dinp.g, dw.g, db.g, dout.g, inp.g, w.g, mean.g, rstd.g, N, C);
    check_pair("layernorm_backward dinp", &dinp, TOL_KERNEL);
    check_pair("layernorm_backward dw", &dw, TOL_KERNEL);
    check_pair("layernorm_backward db", &db, TOL_KERNEL);
    float *first = snapshot(&dinp), *first_dw = snapshot(&dw);
    memcpy(dinp.g, dinp0, dinp.n * sizeof(float));
    memcpy(dw.g, dw0, dw.n * sizeof(float));
    memcpy(db.g, db0, db.n * sizeof(float));
    gpu->layernorm_backward(dinp.g, dw.g, db.g, dout.g, inp.g, w.g, mean.g, rstd.g, N, C);
    expect_same_bits("layernorm_backward dinp, run twice", first, dinp.g, dinp.n);
    expect_same_bits("layernorm_backward dw, run twice", first_dw, dw.g, dw.n);
    free(first), free(first_dw), free(dinp0), free(dw0), free(db0);
    pair_free(&inp), pair_free(&w), pair_free(&b), pair_free(&out), pair_free(&mean);
    pair_free(&rstd), pair_free(&dout), pair_free(&dinp), pair_free(&dw), pair_free(&db);
}

static void test_matmul(int with_base, int with_bias, int accumulate)
{
    const int IC = C, OC = 3 * C;
    char name[64];
    pair inp = pair_new((size_t)N * IC, 1), w = pair_new((size_t)OC * IC, 0.2f);
    pair bias = pair_new(OC, 1), base = pair_new((size_t)N * OC, 1);
    pair out = pair_new((size_t)N * OC, 0);
    cpu->matmul_forward(out.c, with_base ? base.c : NULL, inp.c, w.c, with_bias ? bias.c : NULL,
                        N, IC, OC);
    gpu->matmul_forward(out.g, with_base ? base.g : NULL, inp.g, w.g, with_bias ? bias.g : NULL,
                        N, IC, OC);
    snprintf(name, sizeof name, "matmul_forward base %d bias %d", with_base, with_bias);
    check_pair(name, &out, TOL_KERNEL);
    pair dout = pair_new((size_t)N * OC, 1), dinp = pair_new((size_t)N * IC, 1);
    pair dw = pair_new((size_t)OC * IC, 1), db = pair_new(OC, 1);
    cpu->matmul_backward(dinp.c, accumulate, dw.c, with_bias ? db.c : NULL, dout.c, inp.c, w.c,
                         N, IC, OC);
    gpu->matmul_backward(dinp.g, accumulate, dw.g, with_bias ? db.g : NULL, dout.g, inp.g, w.g,
                         N, IC, OC);
    snprintf(name, sizeof name, "matmul_backward dinp (accumulate %d)", accumulate);
    check_pair(name, &dinp, TOL_KERNEL);
    check_pair("matmul_backward dw", &dw, TOL_KERNEL);
    if (with_bias) check_pair("matmul_backward dbias", &db, TOL_KERNEL);
    pair_free(&inp), pair_free(&w), pair_free(&bias), pair_free(&base), pair_free(&out);
    pair_free(&dout), pair_free(&dinp), pair_free(&dw), pair_free(&db);
}

static void test_attention(void)
{
    pair qkv = pair_new((size_t)N * 3 * C, 1), out = pair_new((size_t)N * C, 0);
    pair att = pair_new((size_t)B * NH * T * T, 0);
    cpu->attention_forward(out.c, att.c, qkv.c, B, T, C, NH);
    gpu->attention_forward(out.g, att.g, qkv.g, B, T, C, NH);
    check_pair("attention_forward out", &out, TOL_KERNEL);
    check_pair("attention_forward att", &att, TOL_KERNEL);
    pair dout = pair_new((size_t)N * C, 1), dqkv = pair_new((size_t)N * 3 * C, 9);
    pair datt = pair_new(att.n, 9);
    memcpy(att.g, att.c, att.n * sizeof(float)); /* the backward alone is compared */
    cpu->attention_backward(dqkv.c, datt.c, dout.c, qkv.c, att.c, B, T, C, NH);
    gpu->attention_backward(dqkv.g, datt.g, dout.g, qkv.g, att.g, B, T, C, NH);
    check_pair("attention_backward dqkv", &dqkv, TOL_KERNEL);
    float *first = snapshot(&dqkv);
    gpu->attention_backward(dqkv.g, datt.g, dout.g, qkv.g, att.g, B, T, C, NH);
    expect_same_bits("attention_backward dqkv, run twice", first, dqkv.g, dqkv.n);
    free(first);
    pair_free(&qkv), pair_free(&out), pair_free(&att), pair_free(&dout), pair_free(&dqkv);
    pair_free(&datt);
}

static void test_gelu(void)
{
    const int n = N * 4 * C + 3; /* not a multiple of any block */
    pair inp = pair_new((size_t)n, 4), out = pair_new((size_t)n, 0), d = pair_new((size_t)n, 1);
    cpu->gelu_forward(out.c, inp.c, n);
    gpu->gelu_forward(out.g, inp.g, n);
    check_pair("gelu_forward", &out, TOL_KERNEL);
    cpu->gelu_backward(d.c, inp.c, d.c, n); /* in place, as the stage runs it */
    gpu->gelu_backward(d.g, inp.g, d.g, n);
    check_pair("gelu_backward (in place)", &d, TOL_KERNEL);
    pair_free(&inp), pair_free(&out), pair_free(&d);
}

static void test_crossentropy_and_head(void)
{
    int32_t *tgt = tokens_new(N);
    pair inp = pair_new((size_t)N * C, 1), wte = pair_new((size_t)V * C, 0.3f);
    pair logits = pair_new((size_t)N * V, 0), probs = pair_new((size_t)N * V, 0);
    pair losses = pair_new(N, 0), dlogits = pair_new((size_t)N * V, 0);
    cpu->head_forward(logits.c, inp.c, wte.c, N, C, V);
    gpu->head_forward(logits.g, inp.g, wte.g, N, C, V);
    check_pair("head_forward", &logits, TOL_KERNEL);
    memcpy(logits.g, logits.c, logits.n * sizeof(float));
    cpu->crossentropy_forward(probs.c, losses.c, logits.c, tgt, N, V);
    gpu->crossentropy_forward(probs.g, losses.g, logits.g, tgt, N, V);
    check_pair("crossentropy_forward probs", &probs, TOL_KERNEL);
    check_pair("crossentropy_forward losses", &losses, TOL_KERNEL);
    memcpy(probs.g, probs.c, probs.n * sizeof(float));
    cpu->crossentropy_backward(dlogits.c, probs.c, tgt, 1.0f / N, N, V);
    gpu->crossentropy_backward(dlogits.g, probs.g, tgt, 1.0f / N, N, V);
    check_pair("crossentropy_backward", &dlogits, TOL_KERNEL);
    pair dinp = pair_new((size_t)N * C, 5), dwte = pair_new((size_t)V * C, 0.1f);
    memcpy(dlogits.g, dlogits.c, dlogits.n * sizeof(float));
    cpu->head_backward(dinp.c, dwte.c, dlogits.c, inp.c, wte.c, N, C, V);
    gpu->head_backward(dinp.g, dwte.g, dlogits.g, inp.g, wte.g, N, C, V);
    check_pair("head_backward dinp", &dinp, TOL_KERNEL);
    check_pair("head_backward dwte", &dwte, TOL_KERNEL);
    free(tgt);
    pair_free(&inp), pair_free(&wte), pair_free(&logits), pair_free(&probs);
    pair_free(&losses), pair_free(&dlogits), pair_free(&dinp), pair_free(&dwte);
}

static void expect_true(const char *what, int cond)
{
    checks++;
    if (!cond) failures++;
    printf("%s %s\n", cond ? "ok  " : "FAIL", what);
}

/* Bit-equal to the CPU: the same additions in the same order, no FMA (optim_codec.cu). */
static void test_sumsq_adamw(void)
{
    const size_t n = 3 * OPS_SUMSQ_CHUNK + 12345; /* a short last chunk */
    pair g = pair_new(n, 3);
    double sc = cpu->sumsq(g.c, n, 0.37f), sg = gpu->sumsq(g.g, n, 0.37f);
    checks++;
    int same = memcmp(&sc, &sg, sizeof sc) == 0;
    if (!same) failures++;
    printf("%s sumsq bit-equal: gpu %.17g cpu %.17g\n", same ? "ok  " : "FAIL", sg, sc);
    {   /* the tied gradients' fold */
        pair d = pair_new(n, 1), s2 = pair_new(n, 2);
        cpu->fold(d.c, s2.c, n);
        gpu->fold(d.g, s2.g, n);
        expect_same_bits("fold: sums == cpu", d.g, d.c, n);
        expect_same_bits("fold: source zeroed == cpu", s2.g, s2.c, n);
        pair_free(&d), pair_free(&s2);
    }
    /* Several tensors in one call (the optimizer's): empty, short, odd-length, unaligned,
     * longer than a chunk; each the bits of its own sumsq call. */
    const size_t off[5] = {0, 7, 7, 40, OPS_SUMSQ_CHUNK + 3};
    const size_t cnt[5] = {7, 0, 33, OPS_SUMSQ_CHUNK + 1, 2 * OPS_SUMSQ_CHUNK + 12000};
    double mc[5], mg[5], one[5];
    cpu->sumsq_many(g.c, off, cnt, 5, 0.37f, mc);
    gpu->sumsq_many(g.g, off, cnt, 5, 0.37f, mg);
    for (int t = 0; t < 5; t++) one[t] = cpu->sumsq(g.c + off[t], cnt[t], 0.37f);
    expect_true("sumsq_many == a sumsq per tensor (cpu)", memcmp(mc, one, sizeof mc) == 0);
    expect_true("sumsq_many bit-equal (gpu == cpu)", memcmp(mg, mc, sizeof mc) == 0);
    pair p = pair_new(n, 1), m = pair_new(n, 0.1f), v = pair_new(n, 0.1f);
    for (size_t i = 0; i < n; i++) v.c[i] = v.g[i] = fabsf(v.c[i]); /* a second moment */
    const ops_adamw_args a = {.grad_scale = 0.5f, .lr = 3e-3f, .beta1 = 0.9f, .beta2 = 0.95f,
                              .bc1 = 1.0f - powf(0.9f, 3.0f), .bc2 = 1.0f - powf(0.95f, 3.0f),
                              .eps = 1e-8f, .weight_decay = 0.1f};
    cpu->adamw_update(p.c, g.c, m.c, v.c, n, &a);
    gpu->adamw_update(p.g, g.g, m.g, v.g, n, &a);
    expect_same_bits("adamw_update params == cpu", p.g, p.c, n);
    expect_same_bits("adamw_update m == cpu", m.g, m.c, n);
    expect_same_bits("adamw_update v == cpu", v.g, v.c, n);
    expect_same_bits("adamw_update grads zeroed == cpu", g.g, g.c, n);
    /* The batched update (the optimizer's): tensors of several sizes, one empty, their
     * moments elsewhere than their parameters, each with its own constants. */
    ops_adamw_tensor t[4] = {{0, 100, 7, a}, {7, 0, 0, a}, {9, 107, 3 * OPS_SUMSQ_CHUNK, a},
                             {3 * OPS_SUMSQ_CHUNK + 20, 3 * OPS_SUMSQ_CHUNK + 200, 12000, a}};
    t[2].a.weight_decay = 0.0f;
    t[3].a.lr = 1e-3f;
    t[3].a.bc1 = 0.5f;
    pair p2 = pair_new(n, 1), g2 = pair_new(n, 3), m2 = pair_new(n, 0.1f), v2 = pair_new(n, 0.1f);
    for (size_t i = 0; i < n; i++) v2.c[i] = v2.g[i] = fabsf(v2.c[i]);
    cpu->adamw_update_many(p2.c, g2.c, m2.c, v2.c, t, 4);
    gpu->adamw_update_many(p2.g, g2.g, m2.g, v2.g, t, 4);
    expect_same_bits("adamw_update_many params == cpu", p2.g, p2.c, n);
    expect_same_bits("adamw_update_many m == cpu", m2.g, m2.c, n);
    expect_same_bits("adamw_update_many v == cpu", v2.g, v2.c, n);
    pair_free(&p2), pair_free(&g2), pair_free(&m2), pair_free(&v2);
    pair_free(&g), pair_free(&p), pair_free(&m), pair_free(&v);
}

static void test_q8(void)
{
    const size_t n = 10 * CODEC_Q8_BLOCK + 17; /* a short last block */
    const size_t bytes = codec_q8_encoded_size(n), words = (bytes + 3) / 4;
    pair x = pair_new(n, 5);
    x.c[3] = x.g[3] = 0.0f;
    for (size_t i = CODEC_Q8_BLOCK; i < 2 * CODEC_Q8_BLOCK; i++) /* an all-zero block */
        x.c[i] = x.g[i] = 0.0f;
    for (size_t i = 2 * CODEC_Q8_BLOCK; i < 3 * CODEC_Q8_BLOCK; i++) /* a nearly-subnormal one */
        x.c[i] = x.g[i] *= 0x1p-110f;
    pair enc = pair_new(words, 0), dec = pair_new(n, 0);
    int rc = cpu->q8_encode((uint8_t *)enc.c, x.c, n);
    int rg = gpu->q8_encode((uint8_t *)enc.g, x.g, n);
    expect_true("q8_encode: both succeed", rc == 0 && rg == 0);
    checks++;
    int same = memcmp(enc.c, enc.g, bytes) == 0;
    if (!same) failures++;
    printf("%s q8_encode bytes == cpu\n", same ? "ok  " : "FAIL");
    rc = cpu->q8_decode(dec.c, n, (const uint8_t *)enc.c, bytes);
    rg = gpu->q8_decode(dec.g, n, (const uint8_t *)enc.g, bytes);
    expect_true("q8_decode: both succeed", rc == 0 && rg == 0);
    expect_same_bits("q8_decode floats == cpu", dec.g, dec.c, n);
    x.g[n - 1] = NAN;
    expect_true("q8_encode refuses NaN (EINVAL)",
                gpu->q8_encode((uint8_t *)enc.g, x.g, n) == CIRRUS_EINVAL);
    uint8_t *e = (uint8_t *)enc.g;
    e[Q8_BLOCK_BYTES + 3] = 0x80; /* the scale of block 1 negative: corrupt */
    expect_true("q8_decode refuses a negative scale (ECORRUPT)",
                gpu->q8_decode(dec.g, n, e, bytes) == CIRRUS_ECORRUPT);
    expect_true("q8_decode refuses a wrong length (ECORRUPT)",
                gpu->q8_decode(dec.g, n, e, bytes - 1) == CIRRUS_ECORRUPT);
    pair_free(&x), pair_free(&enc), pair_free(&dec);
}

/* ---- the model ---- */

static const gpt_config mcfg = {.n_layer = 2, .n_embd = 64, .n_head = 4, .seq_len = 32,
                                .vocab = GPT_VOCAB};
enum { MB = 3, MT = 32, STEPS = 3 };
#define TOL_MODEL 1e-4

/* A model on the named backend with the weights of seed 7. */
static void model_on(gpt_model *m, const char *backend)
{
    cirrus_error err = {0};
    if (ops_select(backend, &err) || gpt_model_init(m, &mcfg, &err)) {
        fprintf(stderr, "gpu-tests: %s\n", err.msg);
        exit(1);
    }
    gpt_model_seed(m, 7);
}

static void batch(int step, int32_t *x, int32_t *y)
{
    rng_state r;
    rng_seed(&r, 300 + (uint64_t)step);
    for (int i = 0; i < MB * MT; i++) {
        x[i] = (int32_t)rng_below(&r, GPT_VOCAB);
        y[i] = (int32_t)rng_below(&r, GPT_VOCAB);
    }
}

/* Forward + backward of the whole model through the given stage bounds (in a row, as a
 * pipeline would run them); the loss to *loss, the gradients folded into m->grads. */
static int run_stages(gpt_model *m, const int *bounds, int n_stages, const int32_t *x,
                      const int32_t *y, uint64_t id, float *loss)
{
    gpt_stage *st[4] = {0};
    float *h[5] = {0}; /* h[i]: the input of stage i (hidden), h[i+1] its output */
    const size_t hid = (size_t)MB * MT * mcfg.n_embd;
    int rc = 0;
    for (int i = 0; i < n_stages && !rc; i++)
        rc = gpt_stage_new(&st[i], m, bounds[i], bounds[i + 1], MB, MT, NULL);
    for (int i = 1; i < n_stages; i++) h[i] = calloc(hid, sizeof(float));
    float *g = calloc(hid, sizeof(float)), *g2 = calloc(hid, sizeof(float));
    for (int i = 0; i < n_stages && !rc; i++) {
        gpt_stage_input in = {.id = id, .B = MB, .T = MT, .tokens = i == 0 ? x : NULL,
                              .hidden = h[i], .targets = i == n_stages - 1 ? y : NULL};
        rc = gpt_stage_forward(st[i], &in, i == n_stages - 1 ? NULL : h[i + 1], loss, 1);
    }
    for (int i = n_stages - 1; i >= 0 && !rc; i--) {
        gpt_stage_input in = {.id = id, .B = MB, .T = MT, .tokens = i == 0 ? x : NULL,
                              .hidden = h[i], .targets = i == n_stages - 1 ? y : NULL};
        rc = gpt_stage_backward(st[i], &in, i == n_stages - 1 ? NULL : g, i == 0 ? NULL : g2);
        float *t = g;
        g = g2, g2 = t;
    }
    if (!rc) gpt_fold_tied_grads(m);
    for (int i = 0; i < n_stages; i++) gpt_stage_free(st[i]), free(h[i + 1]);
    free(g), free(g2);
    return rc;
}

static void test_model(const int *bounds, int n_stages, const char *what)
{
    gpt_model mc, mg;
    model_on(&mc, "cpu");
    model_on(&mg, gpu_name);
    int32_t x[MB * MT], y[MB * MT];
    batch(0, x, y);
    float lc = 0, lg = 0;
    char name[96];
    if (run_stages(&mc, bounds, n_stages, x, y, 1, &lc) ||
        run_stages(&mg, bounds, n_stages, x, y, 1, &lg)) {
        printf("FAIL %s: a stage failed\n", what);
        failures++;
    } else {
        snprintf(name, sizeof name, "%s loss", what);
        expect_close(name, &lg, &lc, 1, TOL_MODEL);
        snprintf(name, sizeof name, "%s gradients", what);
        expect_close(name, mg.grads, mc.grads, mc.n_params, TOL_MODEL);
    }
    ops_select("cpu", NULL);
    gpt_model_free(&mc);
    gpt_model_free(&mg);
}

static void test_training(void)
{
    gpt_model m[2];
    model_on(&m[0], "cpu");
    model_on(&m[1], gpu_name);
    const adamw_config ac = adamw_defaults(1e-2f, STEPS);
    gpt_span all = {0, m[0].n_params};
    adamw opt[2];
    memset(opt, 0, sizeof opt); /* destroyable even if a create below fails */
    const int whole[2] = {0, mcfg.n_layer};
    float loss[2][STEPS];
    int rc = 0;
    for (int k = 0; k < 2 && !rc; k++) {
        ops_select(k ? gpu_name : "cpu", NULL); /* the optimizer binds the selected backend */
        rc = adamw_init(&opt[k], &mcfg, &all, 1, &ac, NULL);
        for (int s = 0; s < STEPS && !rc; s++) {
            int32_t x[MB * MT], y[MB * MT];
            batch(s, x, y);
            rc = run_stages(&m[k], whole, 1, x, y, (uint64_t)s + 1, &loss[k][s]);
            adamw_step(&opt[k], m[k].params, m[k].grads, 1.0f,
                       adamw_total_sumsq(&opt[k], m[k].grads, 1.0f), adamw_lr(&ac, (uint64_t)s),
                       (uint64_t)s + 1);
        }
    }
    if (rc) {
        printf("FAIL training: a step failed\n");
        failures++;
    } else {
        expect_close("3 AdamW steps: losses", loss[1], loss[0], STEPS, TOL_MODEL);
        /* Not the parameters: AdamW divides by sqrt(v), so a gradient element that is
         * rounding noise on both sides (a true zero) moves by +-lr on either, and such
         * elements legitimately differ. The losses are what must agree. */
    }
    adamw_free(&opt[0]);
    adamw_free(&opt[1]);
    ops_select("cpu", NULL);
    gpt_model_free(&m[0]);
    gpt_model_free(&m[1]);
}

/* The device collective (NCCL) as far as one GPU allows: NCCL refuses two ranks on one
 * device, so a communicator of one rank: it sums (a no-op), is freed and built again, as
 * after a membership change; and a communicator of two ranks that only this one joins must
 * give up at its deadline, aborted, rather than hang (a peer lost during the build). */
static void test_device_collective(void)
{
    if (!gpu->device_collective_new) {
        printf("skip device collective: the %s backend has none\n", gpu_name);
        return;
    }
    for (int round = 0; round < 2; round++) { /* built, freed, built again */
        uint8_t id[DEVICE_COLLECTIVE_ID_BYTES];
        collective *c = NULL;
        cirrus_error err = {0};
        int rc = gpu->device_collective_id(id, &err);
        /* A long deadline: a build that succeeds returns as soon as it is up, and under
         * compute-sanitizer NCCL's first set-up took over 10 s. */
        if (!rc) rc = gpu->device_collective_new(&c, 0, 1, id, 120000, &err);
        float v[3] = {1.5f, -2.0f, 3.25f};
        if (!rc) rc = collective_allreduce_sum(c, v, 3, &err);
        expect_true(round ? "device collective of 1 rank, built again, sums"
                          : "device collective of 1 rank sums",
                    rc == 0 && v[0] == 1.5f && v[1] == -2.0f && v[2] == 3.25f);
        if (rc) printf("    %s\n", err.msg);
        collective_free(c);
    }
    uint8_t id[DEVICE_COLLECTIVE_ID_BYTES];
    collective *c = NULL;
    cirrus_error err = {0};
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int rc = gpu->device_collective_id(id, &err);
    if (!rc) rc = gpu->device_collective_new(&c, 0, 2, id, 1500, &err);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double s = (double)(t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9;
    printf("    a 2-rank build with rank 1 missing: %.2f s, %s\n", s, rc ? err.msg : "built?!");
    expect_true("device collective: a missing rank fails the build at its deadline, no hang",
                rc != 0 && c == NULL && s >= 1.4 && s < 10.0);
    collective_free(c);
}

static int run_all(void)
{
    rng_seed(&rng, 42);
    test_encoder();
    test_layernorm();
    test_matmul(0, 1, 0);
    test_matmul(1, 1, 1);
    test_matmul(1, 0, 0);
    test_attention();
    test_gelu();
    test_crossentropy_and_head();
    test_sumsq_adamw();
    test_q8();
    const int whole[2] = {0, 2}, split[3] = {0, 1, 2};
    test_model(whole, 1, "model, one stage");
    test_model(split, 2, "model, stages [0,1) + [1,2)");
    test_training();
    test_device_collective();
    cirrus_error err = {0};
    if (gpu->status(&err)) {
        printf("FAIL device error: %s\n", err.msg);
        failures++;
    }
    printf("gpu-tests (%s against cpu): %d checks, %d failed\n", gpu_name, checks, failures);
    return failures ? 1 : 0;
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "--cpu-as-gpu") == 0) {
        gpu = &ops_backend_cpu;
        gpu_name = "cpu";
        return run_all();
    }
    int probe = argc > 1 && strcmp(argv[1], "--probe") == 0;
    int rt = 0, nccl = 0;
    cudaRuntimeGetVersion(&rt);
    ncclGetVersion(&nccl);
    /* Without a driver the count is left unwritten: it starts at 0. */
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (!probe)
        printf("gpu-tests: CUDA runtime %d, NCCL %d; cudaGetDeviceCount: %s, %d device(s)\n", rt,
               nccl, cudaGetErrorString(e), count);
    if (e == cudaErrorInsufficientDriver || e == cudaErrorNoDevice ||
        (e == cudaSuccess && count == 0)) {
        if (!probe) printf("gpu-tests: no GPU on this machine: nothing compared, exit 0\n");
        return probe ? 3 : 0;
    }
    cirrus_error err = {0};
    if (ops_cuda_open(&gpu, &err)) {
        fprintf(stderr, "gpu-tests: a GPU is present but the backend cannot start: %s\n",
                err.msg);
        return 1;
    }
    if (probe) return 0;
    return run_all();
}
