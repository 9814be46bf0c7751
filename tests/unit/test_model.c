/* Model tests: finite-difference gradients, stage splits, recompute, the tensor table. */
#include <string.h>

#include "../../common/rng.h"
#include "../../trainer/model/gpt.h"
#include "../../trainer/model/ops.h"
#include "../../trainer/model/stage.h"
#include "test.h"

/* A small model whose parameters are all perturbed away from the init (LayerNorm gains not
 * exactly 1, biases not 0) so every term of every gradient formula is exercised. */
static void make_model(gpt_model *m, int n_layer, uint64_t seed)
{
    gpt_config cfg = {.n_layer = n_layer, .n_embd = 16, .n_head = 2, .seq_len = 8,
                      .vocab = GPT_VOCAB};
    ASSERT_OK(gpt_model_init(m, &cfg, NULL));
    gpt_model_seed(m, seed);
    rng_state r;
    rng_seed(&r, seed + 1);
    for (size_t i = 0; i < m->n_params; i++) m->params[i] += 0.05f * rng_normal(&r);
}

static void make_batch(int32_t *x, int32_t *y, int n, uint64_t seed)
{
    rng_state r;
    rng_seed(&r, seed);
    for (int i = 0; i < n; i++) {
        x[i] = (int32_t)rng_below(&r, GPT_VOCAB);
        y[i] = (int32_t)rng_below(&r, GPT_VOCAB);
    }
}

enum { B = 2, T = 8 };

/* Loss and (folded) gradient of the whole model as one stage. */
static float full_loss(gpt_model *m, gpt_stage *st, const int32_t *x, const int32_t *y,
                       int with_grad)
{
    gpt_stage_input in = {.id = 1, .B = B, .T = T, .tokens = x, .targets = y};
    float loss = 0.0f;
    ASSERT_OK(gpt_stage_forward(st, &in, NULL, &loss, with_grad));
    if (with_grad) {
        gpt_zero_grads(m);
        ASSERT_OK(gpt_stage_backward(st, &in, NULL, NULL));
        gpt_fold_tied_grads(m);
    }
    return loss;
}

/* Directional finite differences, tensor by tensor. Along a unit direction d,
 * (L(p + h d) - L(p - h d)) / 2h must equal <grad, d>. The fp32 loss carries a rounding
 * error of ~2e-7 (a few ulp of a value near 5.5, measured), so with h = 1e-2 the quotient
 * is good to ~2e-5; Richardson extrapolation over h and h/2 removes the O(h^2) truncation
 * error (which reached 2e-3 for some biases). Observed errors stay below 3e-5, hence the
 * tolerance 2e-4 + 1e-3 * |expected|: a 1% error in any term of a backward formula fails. Two directions per tensor: the gradient's own (where
 * <grad, d> = |grad|, so a wrong gradient cannot hide in a small projection) and a random
 * one (so a gradient that is right only along itself is still caught). */
TEST(model_gradient_check_every_tensor)
{
    gpt_model m;
    make_model(&m, 2, 11);
    gpt_stage *st;
    ASSERT_OK(gpt_stage_new(&st, &m, 0, 2, B, T, NULL));
    int32_t x[B * T], y[B * T];
    make_batch(x, y, B * T, 5);
    full_loss(&m, st, x, y, 1);
    float *grad = malloc(sizeof(float) * m.n_params);
    memcpy(grad, m.grads, sizeof(float) * m.n_params);
    size_t nt = gpt_num_tensors(&m.cfg);
    gpt_tensor_info *tab = calloc(nt, sizeof *tab);
    gpt_tensor_table(&m.cfg, tab);
    rng_state r;
    rng_seed(&r, 99);
    const float h = 1e-2f;
    for (size_t t = 0; t < nt; t++) {
        float *d = malloc(sizeof(float) * tab[t].numel);
        for (int dir = 0; dir < 2; dir++) {
            double norm = 0.0;
            for (size_t i = 0; i < tab[t].numel; i++) {
                d[i] = dir == 0 ? grad[tab[t].offset + i] : rng_normal(&r);
                norm += (double)d[i] * d[i];
            }
            if (norm == 0.0) TEST_FAIL("%s: zero gradient", tab[t].name);
            double expect = 0.0;
            for (size_t i = 0; i < tab[t].numel; i++) {
                d[i] = (float)(d[i] / sqrt(norm));
                expect += (double)d[i] * grad[tab[t].offset + i];
            }
            float *p = m.params + tab[t].offset;
            float *save = malloc(sizeof(float) * tab[t].numel);
            memcpy(save, p, sizeof(float) * tab[t].numel);
            double dq[2]; /* central differences at h and h/2 */
            for (int k = 0; k < 2; k++) {
                const float hk = k ? h / 2 : h;
                for (size_t i = 0; i < tab[t].numel; i++) p[i] = save[i] + hk * d[i];
                double lp = full_loss(&m, st, x, y, 0);
                for (size_t i = 0; i < tab[t].numel; i++) p[i] = save[i] - hk * d[i];
                double lm = full_loss(&m, st, x, y, 0);
                dq[k] = (lp - lm) / (2.0 * hk);
            }
            memcpy(p, save, sizeof(float) * tab[t].numel);
            free(save);
            double numeric = (4.0 * dq[1] - dq[0]) / 3.0; /* Richardson: error O(h^4) */
            double tol = 2e-4 + 1e-3 * fabs(expect);
            if (!(fabs(numeric - expect) <= tol))
                TEST_FAIL("%s (%s direction): numeric %.6g, analytic %.6g", tab[t].name,
                          dir == 0 ? "gradient" : "random", numeric, expect);
        }
        free(d);
    }
    free(tab);
    free(grad);
    gpt_stage_free(st);
    gpt_model_free(&m);
}

/* The input gradient a middle stage returns, checked the same way: the stage's output
 * contracted with a fixed random grad_out is the scalar. */
TEST(model_gradient_check_stage_input)
{
    gpt_model m;
    make_model(&m, 3, 21);
    const int C = m.cfg.n_embd, N = B * T;
    gpt_stage *st;
    ASSERT_OK(gpt_stage_new(&st, &m, 1, 2, B, T, NULL));
    float *hin = malloc(sizeof(float) * N * C), *gout = malloc(sizeof(float) * N * C);
    float *out = malloc(sizeof(float) * N * C), *gin = malloc(sizeof(float) * N * C);
    float *d = malloc(sizeof(float) * N * C), *hp = malloc(sizeof(float) * N * C);
    rng_state r;
    rng_seed(&r, 3);
    for (int i = 0; i < N * C; i++) {
        hin[i] = rng_normal(&r);
        gout[i] = rng_normal(&r);
        d[i] = rng_normal(&r);
    }
    gpt_stage_input in = {.id = 7, .B = B, .T = T, .hidden = hin};
    ASSERT_OK(gpt_stage_backward(st, &in, gout, gin));
    double norm = 0.0, expect = 0.0;
    for (int i = 0; i < N * C; i++) norm += (double)d[i] * d[i];
    for (int i = 0; i < N * C; i++) {
        d[i] = (float)(d[i] / sqrt(norm));
        expect += (double)d[i] * gin[i];
    }
    const float h = 1e-2f;
    double dq[2];
    for (int k = 0; k < 2; k++) {
        const float hk = k ? h / 2 : h;
        double f[2];
        for (int s = 0; s < 2; s++) {
            for (int i = 0; i < N * C; i++) hp[i] = hin[i] + (s ? -hk : hk) * d[i];
            gpt_stage_input pin = {.id = 0, .B = B, .T = T, .hidden = hp};
            ASSERT_OK(gpt_stage_forward(st, &pin, out, NULL, 0));
            f[s] = 0.0;
            for (int i = 0; i < N * C; i++) f[s] += (double)out[i] * gout[i];
        }
        dq[k] = (f[0] - f[1]) / (2.0 * hk);
    }
    double numeric = (4.0 * dq[1] - dq[0]) / 3.0;
    /* The scalar is a sum over N*C outputs of size ~1, so its rounding error is larger
     * than the loss's (~1e-5 absolute); the tolerance scales accordingly. */
    ASSERT_NEAR(numeric, expect, 2e-3 + 1e-3 * fabs(expect));
    free(hin), free(gout), free(out), free(gin), free(d), free(hp);
    gpt_stage_free(st);
    gpt_model_free(&m);
}

/* Run the model as consecutive stage slices; return the loss. Gradients land in m. */
static float run_split(gpt_model *m, const int *bounds, int nstages, const int32_t *x,
                       const int32_t *y, int recompute)
{
    const int C = m->cfg.n_embd, N = B * T;
    gpt_stage *st[8];
    float *act[9] = {0}, *grad[9] = {0};
    for (int s = 0; s < nstages; s++) {
        ASSERT_OK(gpt_stage_new(&st[s], m, bounds[s], bounds[s + 1], B, T, NULL));
        act[s + 1] = malloc(sizeof(float) * N * C);
        grad[s + 1] = malloc(sizeof(float) * N * C);
    }
    gpt_zero_grads(m);
    float loss = 0.0f;
    gpt_stage_input in[8];
    for (int s = 0; s < nstages; s++) {
        in[s] = (gpt_stage_input){.id = 100 + s, .B = B, .T = T, .tokens = x,
                                  .hidden = act[s], .targets = y};
        ASSERT_OK(gpt_stage_forward(st[s], &in[s], act[s + 1], &loss, !recompute));
    }
    for (int s = nstages - 1; s >= 0; s--)
        ASSERT_OK(gpt_stage_backward(st[s], &in[s], grad[s + 1], grad[s]));
    gpt_fold_tied_grads(m);
    for (int s = 0; s < nstages; s++) {
        gpt_stage_free(st[s]);
        free(act[s + 1]);
        free(grad[s + 1]);
    }
    return loss;
}

TEST(model_stage_split_bit_identical)
{
    gpt_model m;
    make_model(&m, 3, 31);
    int32_t x[B * T], y[B * T];
    make_batch(x, y, B * T, 8);
    const int whole[] = {0, 3}, two[] = {0, 2, 3}, three[] = {0, 1, 2, 3};
    float l1 = run_split(&m, whole, 1, x, y, 0);
    float *g1 = malloc(sizeof(float) * m.n_params);
    memcpy(g1, m.grads, sizeof(float) * m.n_params);
    float l2 = run_split(&m, two, 2, x, y, 0);
    ASSERT(memcmp(&l1, &l2, sizeof l1) == 0);
    ASSERT(memcmp(g1, m.grads, sizeof(float) * m.n_params) == 0);
    float l3 = run_split(&m, three, 3, x, y, 0);
    ASSERT(memcmp(&l1, &l3, sizeof l1) == 0);
    ASSERT(memcmp(g1, m.grads, sizeof(float) * m.n_params) == 0);
    /* Stateless backward: nothing kept, every stage recomputes its forward. */
    float l4 = run_split(&m, three, 3, x, y, 1);
    ASSERT(memcmp(&l1, &l4, sizeof l1) == 0);
    ASSERT(memcmp(g1, m.grads, sizeof(float) * m.n_params) == 0);
    free(g1);
    gpt_model_free(&m);
}

/* A backward for another microbatch than the kept one must recompute, not reuse. */
TEST(model_backward_recomputes_for_other_input)
{
    gpt_model m;
    make_model(&m, 2, 41);
    gpt_stage *st;
    ASSERT_OK(gpt_stage_new(&st, &m, 0, 2, B, T, NULL));
    int32_t x1[B * T], y1[B * T], x2[B * T], y2[B * T];
    make_batch(x1, y1, B * T, 1);
    make_batch(x2, y2, B * T, 2);
    gpt_stage_input a = {.id = 1, .B = B, .T = T, .tokens = x1, .targets = y1};
    gpt_stage_input b = {.id = 2, .B = B, .T = T, .tokens = x2, .targets = y2};
    float loss;
    gpt_zero_grads(&m);
    ASSERT_OK(gpt_stage_backward(st, &b, NULL, NULL)); /* reference: fresh recompute */
    float *ref = malloc(sizeof(float) * m.n_params);
    memcpy(ref, m.grads, sizeof(float) * m.n_params);
    ASSERT_OK(gpt_stage_forward(st, &a, NULL, &loss, 1)); /* keep a's activations */
    gpt_zero_grads(&m);
    ASSERT_OK(gpt_stage_backward(st, &b, NULL, NULL)); /* must not use a's */
    ASSERT(memcmp(ref, m.grads, sizeof(float) * m.n_params) == 0);
    free(ref);
    gpt_stage_free(st);
    gpt_model_free(&m);
}

TEST(model_rejects_bad_input)
{
    gpt_model m;
    make_model(&m, 2, 51);
    gpt_stage *st;
    cirrus_error err = {0};
    ASSERT_EQ(gpt_stage_new(&st, &m, 1, 5, B, T, &err), CIRRUS_EINVAL);
    ASSERT(strstr(err.msg, "outside") != NULL);
    ASSERT_EQ(gpt_stage_new(&st, &m, 0, 2, B, 9, &err), CIRRUS_EINVAL);
    ASSERT_OK(gpt_stage_new(&st, &m, 0, 2, B, T, NULL));
    int32_t x[B * T], y[B * T];
    make_batch(x, y, B * T, 1);
    float loss;
    x[3] = 256; /* out of vocabulary */
    gpt_stage_input in = {.id = 1, .B = B, .T = T, .tokens = x, .targets = y};
    ASSERT_EQ(gpt_stage_forward(st, &in, NULL, &loss, 0), CIRRUS_EINVAL);
    x[3] = 0;
    in.B = B + 1; /* more than the stage was sized for */
    ASSERT_EQ(gpt_stage_forward(st, &in, NULL, &loss, 0), CIRRUS_EINVAL);
    gpt_stage_free(st);
    gpt_model_free(&m);
}

TEST(model_config_validation)
{
    gpt_config c;
    cirrus_error err = {0};
    ASSERT_OK(gpt_config_preset(&c, "tiny", &err));
    c.n_head = 5; /* 128 % 5 != 0 */
    ASSERT_EQ(gpt_config_validate(&c, &err), CIRRUS_EINVAL);
    ASSERT(strstr(err.msg, "heads (5) must divide the width (128)") != NULL);
    ASSERT_EQ(gpt_config_preset(&c, "huge", &err), CIRRUS_EINVAL);
    ASSERT(strstr(err.msg, "huge") != NULL);
}

/* The layout derived from the table: presets have the advertised sizes, tensors tile the
 * buffer, and stage spans are contiguous and cover the model exactly. */
TEST(model_tensor_table_and_spans)
{
    gpt_config tiny, small;
    ASSERT_OK(gpt_config_preset(&tiny, "tiny", NULL));
    ASSERT_OK(gpt_config_preset(&small, "small", NULL));
    ASSERT_EQ(gpt_num_params(&tiny), 842496);
    ASSERT_EQ(gpt_num_params(&small), 10844160);
    size_t nt = gpt_num_tensors(&small);
    ASSERT_EQ(nt, 2 + 12 * 6 + 2);
    gpt_tensor_info *tab = calloc(nt, sizeof *tab);
    gpt_tensor_table(&small, tab);
    size_t off = 0;
    for (size_t i = 0; i < nt; i++) {
        ASSERT_EQ(tab[i].offset, off);
        off += tab[i].numel;
    }
    ASSERT_EQ(off, gpt_num_params(&small));
    ASSERT(strcmp(tab[2].name, "layer0.ln1w") == 0);
    ASSERT_EQ(tab[4].rows, 3 * 384);
    gpt_span a = gpt_stage_param_span(&small, 0, 2), b = gpt_stage_param_span(&small, 2, 4),
             c = gpt_stage_param_span(&small, 4, 6);
    ASSERT_EQ(a.offset, 0);
    ASSERT_EQ(b.offset, a.offset + a.count);
    ASSERT_EQ(c.offset, b.offset + b.count);
    ASSERT_EQ(c.offset + c.count, gpt_num_params(&small));
    ASSERT_EQ(b.offset, tab[2 + 2 * 12].offset); /* layer 2 starts stage 2 */
    free(tab);
}

/* Op-level check of causal attention with O(1) inputs, where every term of the softmax
 * backward matters (inside the model the attention scores are small and some terms are
 * nearly invisible in the loss). f(qkv) = <attention(qkv), r>, checked along random unit
 * directions with Richardson-extrapolated central differences. */
static double attention_dot(const float *qkv, const float *r, int b, int t, int c, int nh)
{
    float *out = malloc(sizeof(float) * b * t * c), *att = malloc(sizeof(float) * b * nh * t * t);
    ops_attention_forward(out, att, qkv, b, t, c, nh);
    double f = 0.0;
    for (int i = 0; i < b * t * c; i++) f += (double)out[i] * r[i];
    free(out);
    free(att);
    return f;
}

TEST(ops_attention_gradient_check)
{
    enum { AB = 2, AT = 5, AC = 8, NH = 2, NQ = AB * AT * 3 * AC, NO = AB * AT * AC };
    float qkv[NQ], r[NO], out[NO], att[AB * NH * AT * AT], datt[AB * NH * AT * AT];
    float dqkv[NQ], d[NQ], qp[NQ];
    rng_state g;
    rng_seed(&g, 17);
    for (int i = 0; i < NQ; i++) qkv[i] = rng_normal(&g);
    for (int i = 0; i < NO; i++) r[i] = rng_normal(&g);
    ops_attention_forward(out, att, qkv, AB, AT, AC, NH);
    ops_attention_backward(dqkv, datt, r, qkv, att, AB, AT, AC, NH);
    for (int trial = 0; trial < 4; trial++) {
        double norm = 0.0, expect = 0.0;
        for (int i = 0; i < NQ; i++) {
            d[i] = trial == 0 ? dqkv[i] : rng_normal(&g);
            norm += (double)d[i] * d[i];
        }
        for (int i = 0; i < NQ; i++) {
            d[i] = (float)(d[i] / sqrt(norm));
            expect += (double)d[i] * dqkv[i];
        }
        double dq[2];
        for (int k = 0; k < 2; k++) {
            const float h = k ? 5e-3f : 1e-2f;
            for (int i = 0; i < NQ; i++) qp[i] = qkv[i] + h * d[i];
            double fp = attention_dot(qp, r, AB, AT, AC, NH);
            for (int i = 0; i < NQ; i++) qp[i] = qkv[i] - h * d[i];
            double fm = attention_dot(qp, r, AB, AT, AC, NH);
            dq[k] = (fp - fm) / (2.0 * h);
        }
        double numeric = (4.0 * dq[1] - dq[0]) / 3.0;
        ASSERT_NEAR(numeric, expect, 2e-4 + 1e-3 * fabs(expect));
    }
}

/* OpenBLAS's kernel is chosen per CPU (see trainer/model/cpu/blas_kernel.h); check the chosen one
 * computes correct products on the shapes and transpositions the model uses, including
 * sizes that are not multiples of any vector width. Reference in double. */
#include <cblas.h>

TEST(blas_sgemm_matches_reference)
{
    const int shapes[][3] = {{37, 29, 53}, {64, 384, 128}, {5, 1, 300}, {130, 96, 17}};
    rng_state r;
    rng_seed(&r, 5);
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
        for (int tr = 0; tr < 4; tr++) {
            const int ta = tr & 1, tb = tr >> 1;
            float *a = malloc(sizeof(float) * M * K), *b = malloc(sizeof(float) * K * N);
            float *c = malloc(sizeof(float) * M * N);
            for (int i = 0; i < M * K; i++) a[i] = rng_normal(&r);
            for (int i = 0; i < K * N; i++) b[i] = rng_normal(&r);
            cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans,
                        tb ? CblasTrans : CblasNoTrans, M, N, K, 1.0f, a, ta ? M : K, b,
                        tb ? K : N, 0.0f, c, N);
            for (int i = 0; i < M; i++)
                for (int j = 0; j < N; j++) {
                    double ref = 0.0;
                    for (int k = 0; k < K; k++)
                        ref += (double)(ta ? a[k * M + i] : a[i * K + k]) *
                               (tb ? b[j * K + k] : b[k * N + j]);
                    /* fp32 accumulation of K products of N(0,1) values: error ~ eps*sqrt(K). */
                    ASSERT_NEAR(c[i * N + j], ref, 1e-5 * K);
                }
            free(a), free(b), free(c);
        }
    }
}
