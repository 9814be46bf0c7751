/* Training-loop tests on the real corpus: determinism, resume, learning. */
#include <math.h>
#include <string.h>

#include "../../trainer/optim/adamw.h"
#include "../../trainer/train.h"
#include "test.h"

static const char *corpus(void)
{
    const char *p = getenv("CIRRUS_CORPUS");
    if (!p || !*p) TEST_FAIL("CIRRUS_CORPUS is not set (make test sets it)");
    return p;
}

/* A 2-layer, 64-wide model: a few hundred milliseconds per run. */
static void small_options(train_options *o, int steps)
{
    train_options_defaults(o);
    o->model = (gpt_config){.n_layer = 2, .n_embd = 64, .n_head = 4, .seq_len = 32,
                            .vocab = GPT_VOCAB};
    o->batch = 4;
    o->steps = steps;
    o->data = corpus();
    o->quiet = 1;
    o->eval_batches = 4;
}

static int file_equal(const char *a, const char *b)
{
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    int eq = fa && fb;
    while (eq) {
        int ca = fgetc(fa), cb = fgetc(fb);
        if (ca != cb) eq = 0;
        if (ca == EOF || cb == EOF) break;
    }
    if (fa) fclose(fa);
    if (fb) fclose(fb);
    return eq;
}

TEST(train_same_seed_same_losses)
{
    enum { STEPS = 12 };
    float a[STEPS], b[STEPS], c[STEPS];
    train_options o;
    small_options(&o, STEPS);
    train_result ra = {.losses = a, .losses_cap = STEPS};
    train_result rb = {.losses = b, .losses_cap = STEPS};
    train_result rc = {.losses = c, .losses_cap = STEPS};
    ASSERT_OK(train_run(&o, &ra, NULL));
    ASSERT_OK(train_run(&o, &rb, NULL));
    ASSERT(memcmp(a, b, sizeof a) == 0);
    ASSERT(memcmp(&ra.val_loss, &rb.val_loss, sizeof(float)) == 0);
    o.seed = 4242;
    ASSERT_OK(train_run(&o, &rc, NULL));
    ASSERT(memcmp(a, c, sizeof a) != 0);
}

/* Interrupt after 7 of 14 steps (checkpointing every step), resume to 14: the losses of
 * steps 8..14 and the final checkpoint file equal an uninterrupted run's, bit for bit. */
TEST(train_resume_equals_uninterrupted)
{
    enum { STEPS = 14 };
    char dir_a[512], dir_b[512], fa[600], fb[600];
    snprintf(dir_a, sizeof dir_a, "%s/a", test_tmpdir());
    snprintf(dir_b, sizeof dir_b, "%s/b", test_tmpdir());
    float whole[STEPS], parts[STEPS];
    memset(parts, 0, sizeof parts);
    train_options o;
    small_options(&o, STEPS);
    o.ckpt_every = 1;
    o.ckpt_dir = dir_a;
    train_result r = {.losses = whole, .losses_cap = STEPS};
    ASSERT_OK(train_run(&o, &r, NULL));
    o.ckpt_dir = dir_b;
    o.stop_after = 7;
    train_result r1 = {.losses = parts, .losses_cap = STEPS};
    ASSERT_OK(train_run(&o, &r1, NULL));
    ASSERT_EQ(r1.step, 7);
    o.stop_after = 0;
    o.resume = 1;
    train_result r2 = {.losses = parts, .losses_cap = STEPS};
    ASSERT_OK(train_run(&o, &r2, NULL));
    ASSERT_EQ(r2.step, STEPS);
    ASSERT(memcmp(whole, parts, sizeof whole) == 0);
    snprintf(fa, sizeof fa, "%s/cirrus.ckpt", dir_a);
    snprintf(fb, sizeof fb, "%s/cirrus.ckpt", dir_b);
    ASSERT(file_equal(fa, fb));
}

TEST(train_resume_refuses_other_model)
{
    char dir[512];
    snprintf(dir, sizeof dir, "%s/ck", test_tmpdir());
    train_options o;
    small_options(&o, 2);
    o.ckpt_dir = dir;
    train_result r = {0};
    ASSERT_OK(train_run(&o, &r, NULL));
    o.model.n_embd = 32;
    o.resume = 1;
    cirrus_error err = {0};
    ASSERT_EQ(train_run(&o, &r, &err), CIRRUS_EMISMATCH);
    ASSERT(strstr(err.msg, "n_embd") != NULL);
}

TEST(train_rejects_bad_options)
{
    train_options o;
    small_options(&o, 0);
    cirrus_error err = {0};
    train_result r = {0};
    ASSERT_EQ(train_run(&o, &r, &err), CIRRUS_EINVAL);
    ASSERT(strstr(err.msg, "steps") != NULL);
    small_options(&o, 1);
    o.data = "/nonexistent/corpus.txt";
    ASSERT_EQ(train_run(&o, &r, &err), CIRRUS_ENOENT);
    ASSERT(strstr(err.msg, "/nonexistent/corpus.txt") != NULL);
}

TEST(adamw_schedule_and_clipping)
{
    adamw_config c = adamw_defaults(1e-3f, 100);
    ASSERT_EQ(c.warmup_steps, 5);
    ASSERT_NEAR(adamw_lr(&c, 0), 2e-4, 1e-9);
    ASSERT_NEAR(adamw_lr(&c, 4), 1e-3, 1e-9);
    ASSERT_NEAR(adamw_lr(&c, 99), 1e-4, 1e-6); /* cosine floor: 10% of peak */
    ASSERT_NEAR(adamw_lr(&c, 52), 5.5e-4, 1e-5); /* halfway: (1 + 0.1) / 2 */
    /* One step on a 2-float span of a vector (no decay): the first Adam step moves each
     * parameter by lr * sign(g), whatever the clipping. */
    gpt_config cfg = {.n_layer = 1, .n_embd = 4, .n_head = 1, .seq_len = 2, .vocab = 256};
    size_t nt = gpt_num_tensors(&cfg);
    gpt_tensor_info *tab = calloc(nt, sizeof *tab);
    gpt_tensor_table(&cfg, tab);
    const size_t off = tab[3].offset;
    gpt_span span = {off, 2}; /* the first 2 floats of layer0.ln1b: a vector, not decayed */
    ASSERT(!tab[3].decay);
    adamw o;
    ASSERT_OK(adamw_init(&o, &cfg, &span, 1, &c, NULL));
    ASSERT_EQ(o.n_seg, 1);
    ASSERT_EQ(o.state_count, 2);
    size_t n = gpt_num_params(&cfg);
    float *p = calloc(n, sizeof(float)), *g = calloc(n, sizeof(float));
    p[off] = p[off + 1] = 1.0f;
    g[off] = 30.0f;
    g[off + 1] = -40.0f;
    g[off + 2] = 7.0f; /* outside the span: neither counted nor touched */
    double ss = adamw_total_sumsq(&o, g, 1.0f);
    ASSERT_NEAR(ss, 2500.0, 1e-9);
    float norm = adamw_step(&o, p, g, 1.0f, ss, 1e-3f, 1);
    ASSERT_NEAR(norm, 50.0, 1e-5);
    ASSERT_NEAR(p[off], 1.0 - 1e-3, 1e-6);
    ASSERT_NEAR(p[off + 1], 1.0 + 1e-3, 1e-6);
    ASSERT(g[off] == 0.0f && g[off + 1] == 0.0f); /* consumed */
    ASSERT(g[off + 2] == 7.0f && p[off + 2] == 0.0f);
    free(p);
    free(g);
    adamw_free(&o);
    free(tab);
}

/* Moments that start again from zero at step 10 (a restored stage) take Adam's first
 * step at step 11: each parameter moves by lr * sign(g). Moments trained since the start
 * keep the training's count, and so would fresh ones without the restart (a different
 * move: the check can fail). */
TEST(adamw_fresh_moments_count_from_their_restart)
{
    adamw_config c = adamw_defaults(1e-3f, 100);
    gpt_config cfg = {.n_layer = 1, .n_embd = 4, .n_head = 1, .seq_len = 2, .vocab = 256};
    size_t nt = gpt_num_tensors(&cfg);
    gpt_tensor_info *tab = calloc(nt, sizeof *tab);
    gpt_tensor_table(&cfg, tab);
    ASSERT(tab[2].offset + tab[2].numel == tab[3].offset); /* ln1w then ln1b */
    const gpt_span span = {tab[2].offset, tab[2].numel + tab[3].numel};
    size_t n = gpt_num_params(&cfg);
    float *p[2], *g = calloc(n, sizeof(float));
    adamw o[2];
    for (int k = 0; k < 2; k++) {
        ASSERT_OK(adamw_init(&o[k], &cfg, &span, 1, &c, NULL));
        ASSERT_EQ(o[k].n_seg, 2);
        p[k] = calloc(n, sizeof(float));
        for (uint64_t step = 1; step <= 10; step++) { /* both segments' moments trained */
            for (size_t i = 0; i < span.count; i++) g[span.offset + i] = 0.5f + (float)i;
            adamw_step(&o[k], p[k], g, 1.0f, 0.0, 1e-3f, step);
        }
        /* Segment 1's moments are lost and start again from zero. */
        memset(o[k].m + o[k].seg[1].state, 0, o[k].seg[1].count * sizeof(float));
        memset(o[k].v + o[k].seg[1].state, 0, o[k].seg[1].count * sizeof(float));
    }
    ASSERT_EQ(adamw_restart_fresh_moments(&o[0], 10), 1); /* o[1]: not told */
    ASSERT_EQ(o[0].seg[0].moments_from, 0);
    ASSERT_EQ(o[0].seg[1].moments_from, 10);
    const size_t at = span.offset + o[0].seg[1].offset - span.offset;
    float before[2] = {p[0][at], p[1][at]};
    for (int k = 0; k < 2; k++) {
        g[at] = -3.0f;
        adamw_step(&o[k], p[k], g, 1.0f, 0.0, 1e-3f, 11);
    }
    ASSERT_NEAR(p[0][at] - before[0], 1e-3, 1e-6);      /* Adam's first step: lr * sign */
    ASSERT(fabsf(p[1][at] - before[1] - 1e-3f) > 1e-4f); /* the training's count: not */
    for (int k = 0; k < 2; k++) {
        adamw_free(&o[k]);
        free(p[k]);
    }
    free(g);
    free(tab);
}

/* The tiny preset learns the King James Bible: validation loss from ln(256) = 5.55 to
 * below 2.5 in 500 steps of 8 x 128 bytes (about 20 s on 2 cores; 2.15 observed). */
TEST_T(train_tiny_learns_real_text, 600)
{
    if (getenv("CIRRUS_TEST_QUICK")) TEST_SKIP("long learning run (optimised build runs it)");
    train_options o;
    train_options_defaults(&o);
    o.data = corpus();
    o.steps = 500;
    o.quiet = 1;
    o.eval_batches = 32;
    enum { STEPS = 500 };
    float losses[STEPS];
    train_result r = {.losses = losses, .losses_cap = STEPS};
    ASSERT_OK(train_run(&o, &r, NULL));
    fprintf(stderr, "  tiny: first loss %.3f, final train loss %.3f, val loss %.3f, %.0f tok/s\n",
            losses[0], r.loss, r.val_loss, r.tokens / r.seconds);
    ASSERT_NEAR(losses[0], 5.545, 0.1); /* starts at chance: ln 256 */
    ASSERT_LT(r.val_loss, 2.5);
}
