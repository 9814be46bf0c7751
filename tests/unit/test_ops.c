/* CPU kernel tests: cpu_sgemm's tiles compute the right product, and every kernel gives the
 * same bits whatever the number of threads (the stage processes run one thread each, `train`
 * as many as the machine has; checkpoints and losses must agree). */
#include <omp.h>
#include <string.h>

#include "../../common/rng.h"
#include "../../trainer/model/cpu/cpu_gemm.h"
#include "../../trainer/model/ops.h"
#include "test.h"

static float *random_floats(size_t n, uint64_t seed)
{
    float *p = malloc(sizeof(float) * n);
    ASSERT(p);
    rng_state r;
    rng_seed(&r, seed);
    for (size_t i = 0; i < n; i++) p[i] = rng_normal(&r);
    return p;
}

TEST(cpu_gemm_tiling_covers_the_output)
{
    const int dims[][2] = {{1, 1}, {64, 64}, {65, 7}, {7, 65}, {2048, 384}, {384, 2048},
                           {100000, 3}, {1000, 1000}};
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++) {
        int by_rows, tile, count;
        cpu_gemm_tiling(dims[i][0], dims[i][1], &by_rows, &tile, &count);
        const int len = by_rows ? dims[i][0] : dims[i][1];
        ASSERT_EQ(by_rows, dims[i][0] >= dims[i][1]);
        ASSERT(count >= 1 && count <= 16);
        ASSERT(tile * count >= len && tile * (count - 1) < len);
        if (count > 1) ASSERT_EQ(tile % 16, 0);
    }
    /* The small model's shapes at batch 8 x 256 and 4 x 64 split evenly over 2, 4, 8. */
    int by_rows, tile, count;
    cpu_gemm_tiling(2048, 1152, &by_rows, &tile, &count);
    ASSERT(by_rows && tile == 128 && count == 16);
    cpu_gemm_tiling(256, 1152, &by_rows, &tile, &count);
    ASSERT(!by_rows && tile == 144 && count == 8);
}

/* Row-major reference in double. */
static double ref_entry(const float *a, const float *b, int ta, int tb, int M, int N, int K,
                        int i, int j)
{
    double s = 0.0;
    for (int k = 0; k < K; k++)
        s += (double)(ta ? a[k * M + i] : a[i * K + k]) * (tb ? b[j * K + k] : b[k * N + j]);
    return s;
}

/* Shapes cut by rows and by columns into several tiles, with ragged last tiles; all four
 * transpositions; alpha and beta not 1, so every tile's pointers and C's accumulation are
 * checked. */
TEST(cpu_sgemm_matches_reference)
{
    const int shapes[][3] = {{300, 70, 33}, {70, 300, 33}, {600, 40, 9}, {40, 600, 9},
                             {129, 129, 5}, {40, 17, 300}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
        for (int tr = 0; tr < 4; tr++) {
            const int ta = tr & 1, tb = tr >> 1;
            float *a = random_floats((size_t)M * K, 10 + s), *b = random_floats((size_t)K * N, 20 + s);
            float *c = random_floats((size_t)M * N, 30 + s), *c0 = malloc(sizeof(float) * M * N);
            memcpy(c0, c, sizeof(float) * M * N);
            cpu_sgemm(ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K,
                      0.5f, a, ta ? M : K, b, tb ? K : N, 2.0f, c, N);
            for (int i = 0; i < M; i++)
                for (int j = 0; j < N; j++) {
                    double ref = 0.5 * ref_entry(a, b, ta, tb, M, N, K, i, j) + 2.0 * c0[i * N + j];
                    ASSERT_NEAR(c[i * N + j], ref, 1e-5 * (K + 4));
                }
            free(a), free(b), free(c), free(c0);
        }
    }
}

/* Run fn with 1 thread, then with each other count, and require the same bytes in out. */
typedef struct kernel_case {
    const char *name;
    void (*run)(void *ctx);
    void *ctx;
    float *out;
    size_t n;
} kernel_case;

static void same_bits_for_thread_counts(const kernel_case *k)
{
    const int counts[] = {1, 2, 3, 5};
    float *first = malloc(sizeof(float) * k->n);
    ASSERT(first);
    for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++) {
        omp_set_num_threads(counts[c]);
        k->run(k->ctx);
        if (c == 0) {
            memcpy(first, k->out, sizeof(float) * k->n);
        } else if (memcmp(first, k->out, sizeof(float) * k->n) != 0) {
            size_t i = 0;
            while (i < k->n && memcmp(first + i, k->out + i, sizeof(float)) == 0) i++;
            TEST_FAIL("%s: %d threads differ from 1 at element %zu: %.9g vs %.9g", k->name,
                      counts[c], i, first[i], k->out[i]);
        }
    }
    omp_set_num_threads(1);
    free(first);
}

/* A small layer: N rows (not a multiple of any vector width), IC -> OC. */
enum { NB = 3, NT = 37, NR = NB * NT, IC = 96, OC = 4 * IC, NH = 4, V = 256 };

typedef struct layer {
    float *inp, *w, *bias, *dout, *out, *dinp, *dw, *db, *mean, *rstd, *att, *datt, *qkv;
    int32_t *targets;
} layer;

static void run_matmul(void *p)
{
    layer *l = p;
    ops_matmul_forward(l->out, NULL, l->inp, l->w, l->bias, NR, IC, OC);
    memset(l->dw, 0, sizeof(float) * OC * IC);
    memset(l->db, 0, sizeof(float) * OC);
    ops_matmul_backward(l->dinp, 0, l->dw, l->db, l->dout, l->inp, l->w, NR, IC, OC);
    /* One buffer to compare: fold the three results into out's tail end. */
    memcpy(l->out, l->dinp, sizeof(float) * NR * IC);
    memcpy(l->out + NR * IC, l->dw, sizeof(float) * OC * IC);
    memcpy(l->out + NR * IC + OC * IC, l->db, sizeof(float) * OC);
}

static void run_gelu(void *p)
{
    layer *l = p;
    ops_gelu_forward(l->out, l->dout, NR * OC);
    ops_gelu_backward(l->out + NR * OC, l->dout, l->out, NR * OC);
}

static void run_layernorm(void *p)
{
    layer *l = p;
    ops_layernorm_forward(l->out, l->mean, l->rstd, l->inp, l->w, l->bias, NR, IC);
    memset(l->dinp, 0, sizeof(float) * NR * IC);
    memset(l->dw, 0, sizeof(float) * IC * 2);
    ops_layernorm_backward(l->dinp, l->dw, l->dw + IC, l->dout, l->inp, l->w, l->mean, l->rstd,
                           NR, IC);
    memcpy(l->out + NR * IC, l->dinp, sizeof(float) * NR * IC);
    memcpy(l->out + 2 * NR * IC, l->dw, sizeof(float) * IC * 2);
}

static void run_attention(void *p)
{
    layer *l = p;
    ops_attention_forward(l->out, l->att, l->qkv, NB, NT, IC, NH);
    ops_attention_backward(l->out + NR * IC, l->datt, l->dout, l->qkv, l->att, NB, NT, IC, NH);
}

static void run_head(void *p)
{
    layer *l = p;
    ops_head_forward(l->out, l->inp, l->w, NR, IC, V);
    float *losses = l->out + NR * V, *probs = l->dinp;
    ops_crossentropy_forward(probs, losses, l->out, l->targets, NR, V);
    ops_crossentropy_backward(l->out, probs, l->targets, 1.0f / NR, NR, V);
    memset(l->dw, 0, sizeof(float) * V * IC);
    ops_head_backward(l->out + NR * V + NR, l->dw, l->out, l->inp, l->w, NR, IC, V);
    memcpy(l->out + NR * V + NR + NR * IC, l->dw, sizeof(float) * V * IC);
}

TEST(ops_bit_identical_for_any_thread_count)
{
    layer l = {0};
    l.inp = random_floats(NR * IC, 1);
    l.w = random_floats((size_t)OC * IC, 2);
    l.bias = random_floats(OC, 3);
    l.dout = random_floats((size_t)NR * OC, 4);
    l.qkv = random_floats((size_t)NR * 3 * IC, 5);
    const size_t big = (size_t)NR * OC * 4 + (size_t)OC * IC * 2;
    l.out = calloc(big, sizeof(float));
    l.dinp = calloc((size_t)NR * OC, sizeof(float));
    l.dw = calloc((size_t)OC * IC, sizeof(float));
    l.db = calloc(OC, sizeof(float));
    l.mean = calloc(NR, sizeof(float));
    l.rstd = calloc(NR, sizeof(float));
    l.att = calloc((size_t)NB * NH * NT * NT, sizeof(float));
    l.datt = calloc((size_t)NB * NH * NT * NT, sizeof(float));
    l.targets = malloc(sizeof(int32_t) * NR);
    for (int i = 0; i < NR; i++) l.targets[i] = (i * 7919) % V;
    const kernel_case cases[] = {
        {"matmul", run_matmul, &l, l.out, (size_t)NR * IC + (size_t)OC * IC + OC},
        {"gelu", run_gelu, &l, l.out, (size_t)NR * OC * 2},
        {"layernorm", run_layernorm, &l, l.out, (size_t)2 * NR * IC + 2 * IC},
        {"attention", run_attention, &l, l.out, (size_t)NR * IC + (size_t)NR * 3 * IC},
        {"head+crossentropy", run_head, &l, l.out, (size_t)NR * V + NR + NR * IC + (size_t)V * IC},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) same_bits_for_thread_counts(&cases[i]);
    free(l.inp), free(l.w), free(l.bias), free(l.dout), free(l.qkv), free(l.out), free(l.dinp);
    free(l.dw), free(l.db), free(l.mean), free(l.rstd), free(l.att), free(l.datt), free(l.targets);
}
