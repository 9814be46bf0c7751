/* gpt: presets, the derived tensor table, and model allocation. See gpt.h. */
#include "gpt.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../common/model_presets.h"
#include "../../common/rng.h"
#include "ops.h"

static const struct {
    const char *name;
    gpt_config cfg;
} presets[] = {
#define PRESET(name, layers, width, heads, context)                                          \
    {#name, {.n_layer = layers, .n_embd = width, .n_head = heads, .seq_len = context,         \
             .vocab = GPT_VOCAB}},
    CIRRUS_MODEL_PRESETS(PRESET)
#undef PRESET
};

int gpt_config_preset(gpt_config *cfg, const char *name, cirrus_error *err)
{
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++) {
        if (strcmp(presets[i].name, name) == 0) {
            *cfg = presets[i].cfg;
            return 0;
        }
    }
    return cirrus_fail(err, CIRRUS_EINVAL, "unknown model preset '%s' (known: tiny, small, medium)",
                       name);
}

/* Upper bounds keep every derived size well inside size_t and int arithmetic. */
#define GPT_MAX_LAYERS 1024
#define GPT_MAX_EMBD 16384
#define GPT_MAX_SEQ 65536

int gpt_config_validate(const gpt_config *cfg, cirrus_error *err)
{
    if (cfg->n_layer < 1 || cfg->n_layer > GPT_MAX_LAYERS)
        return cirrus_fail(err, CIRRUS_EINVAL, "layers must be in [1, %d], got %d",
                           GPT_MAX_LAYERS, cfg->n_layer);
    if (cfg->n_embd < 1 || cfg->n_embd > GPT_MAX_EMBD)
        return cirrus_fail(err, CIRRUS_EINVAL, "width must be in [1, %d], got %d",
                           GPT_MAX_EMBD, cfg->n_embd);
    if (cfg->n_head < 1 || cfg->n_embd % cfg->n_head != 0)
        return cirrus_fail(err, CIRRUS_EINVAL, "heads (%d) must divide the width (%d)",
                           cfg->n_head, cfg->n_embd);
    if (cfg->seq_len < 1 || cfg->seq_len > GPT_MAX_SEQ)
        return cirrus_fail(err, CIRRUS_EINVAL, "context must be in [1, %d], got %d",
                           GPT_MAX_SEQ, cfg->seq_len);
    if (cfg->vocab != GPT_VOCAB)
        return cirrus_fail(err, CIRRUS_EINVAL, "vocabulary must be %d (bytes), got %d",
                           GPT_VOCAB, cfg->vocab);
    return 0;
}

/* The one walk over the tensor tables; everything else is derived from it. */
typedef void (*tensor_visit)(void *ctx, const char *name, int layer, size_t rows,
                             size_t cols);

static void gpt_visit_tensors(const gpt_config *cfg, tensor_visit visit, void *ctx)
{
    const size_t C = (size_t)cfg->n_embd, V = (size_t)cfg->vocab, T = (size_t)cfg->seq_len;
#define GPT_VISIT(name, rows, cols) visit(ctx, #name, layer, (rows), (cols));
    int layer = -1;
    GPT_EMBED_TENSORS(GPT_VISIT)
    for (layer = 0; layer < cfg->n_layer; layer++) {
        GPT_LAYER_TENSORS(GPT_VISIT)
    }
    layer = -1;
    GPT_FINAL_TENSORS(GPT_VISIT)
#undef GPT_VISIT
    (void)V;
    (void)T;
}

typedef struct table_ctx {
    gpt_tensor_info *table; /* may be NULL: count only */
    size_t n, offset;
} table_ctx;

static void table_add(void *vctx, const char *name, int layer, size_t rows, size_t cols)
{
    table_ctx *ctx = vctx;
    if (ctx->table) {
        gpt_tensor_info *t = &ctx->table[ctx->n];
        if (layer >= 0)
            snprintf(t->name, sizeof t->name, "layer%d.%s", layer, name);
        else
            snprintf(t->name, sizeof t->name, "%s", name);
        t->layer = layer;
        t->rows = rows;
        t->cols = cols;
        t->offset = ctx->offset;
        t->numel = rows * cols;
        t->decay = rows > 1;
    }
    ctx->n++;
    ctx->offset += rows * cols;
}

size_t gpt_num_tensors(const gpt_config *cfg)
{
    table_ctx ctx = {0};
    gpt_visit_tensors(cfg, table_add, &ctx);
    return ctx.n;
}

size_t gpt_num_params(const gpt_config *cfg)
{
    table_ctx ctx = {0};
    gpt_visit_tensors(cfg, table_add, &ctx);
    return ctx.offset;
}

void gpt_tensor_table(const gpt_config *cfg, gpt_tensor_info *table)
{
    table_ctx ctx = {.table = table};
    gpt_visit_tensors(cfg, table_add, &ctx);
}

void gpt_weights_bind(const gpt_config *cfg, float *base, gpt_weights *w)
{
    const size_t C = (size_t)cfg->n_embd, V = (size_t)cfg->vocab, T = (size_t)cfg->seq_len;
    float *p = base;
#define GPT_BIND(name, rows, cols) w->name = p, p += (size_t)(rows) * (cols);
#define GPT_BIND_LAYER(name, rows, cols) w->layer[l].name = p, p += (size_t)(rows) * (cols);
    GPT_EMBED_TENSORS(GPT_BIND)
    for (int l = 0; l < cfg->n_layer; l++) {
        GPT_LAYER_TENSORS(GPT_BIND_LAYER)
    }
    GPT_FINAL_TENSORS(GPT_BIND)
#undef GPT_BIND
#undef GPT_BIND_LAYER
    (void)V;
    (void)T;
}

typedef struct span_ctx {
    size_t embed, per_layer, final; /* floats in each section; per_layer from layer 0 */
} span_ctx;

static void span_add(void *vctx, const char *name, int layer, size_t rows, size_t cols)
{
    span_ctx *ctx = vctx;
    (void)name;
    if (layer > 0) return;
    if (layer == 0)
        ctx->per_layer += rows * cols;
    else if (ctx->per_layer == 0)
        ctx->embed += rows * cols;
    else
        ctx->final += rows * cols;
}

gpt_span gpt_stage_param_span(const gpt_config *cfg, int l0, int l1)
{
    span_ctx ctx = {0};
    gpt_visit_tensors(cfg, span_add, &ctx);
    gpt_span s;
    s.offset = l0 == 0 ? 0 : ctx.embed + (size_t)l0 * ctx.per_layer;
    size_t end = ctx.embed + (size_t)l1 * ctx.per_layer + (l1 == cfg->n_layer ? ctx.final : 0);
    s.count = end - s.offset;
    return s;
}

int gpt_stage_state_spans(const gpt_config *cfg, int l0, int l1, gpt_span out[2])
{
    int n = 0;
    if (l1 == cfg->n_layer && l0 != 0) out[n++] = (gpt_span){0, (size_t)cfg->vocab * cfg->n_embd};
    out[n++] = gpt_stage_param_span(cfg, l0, l1);
    return n;
}

int gpt_model_init(gpt_model *m, const gpt_config *cfg, cirrus_error *err)
{
    memset(m, 0, sizeof *m);
    int rc = gpt_config_validate(cfg, err);
    if (rc) return rc;
    m->cfg = *cfg;
    m->ops = ops_selected();
    m->n_params = gpt_num_params(cfg);
    size_t head = (size_t)cfg->vocab * cfg->n_embd;
    m->params = m->ops->alloc(m->n_params);
    m->grads = m->ops->alloc(m->n_params);
    m->grad_head = m->ops->alloc(head);
    m->w.layer = calloc((size_t)cfg->n_layer, sizeof(gpt_layer_tensors));
    m->g.layer = calloc((size_t)cfg->n_layer, sizeof(gpt_layer_tensors));
    if (!m->params || !m->grads || !m->grad_head || !m->w.layer || !m->g.layer) {
        gpt_model_free(m);
        return cirrus_fail(err, CIRRUS_ENOMEM, "cannot allocate a model of %zu parameters",
                           gpt_num_params(cfg));
    }
    gpt_weights_bind(cfg, m->params, &m->w);
    gpt_weights_bind(cfg, m->grads, &m->g);
    return 0;
}

void gpt_model_free(gpt_model *m)
{
    if (m->ops) {
        m->ops->free(m->params);
        m->ops->free(m->grads);
        m->ops->free(m->grad_head);
    }
    free(m->w.layer);
    free(m->g.layer);
    memset(m, 0, sizeof *m);
}

static void fill_normal(float *x, size_t n, float std, rng_state *r)
{
    for (size_t i = 0; i < n; i++) x[i] = std * rng_normal(r);
}

static void fill_const(float *x, size_t n, float v)
{
    for (size_t i = 0; i < n; i++) x[i] = v;
}

void gpt_model_seed(gpt_model *m, uint64_t seed)
{
    const gpt_config *cfg = &m->cfg;
    const size_t C = (size_t)cfg->n_embd;
    rng_state r;
    rng_seed(&r, seed);
    /* GPT-2: residual-stream projections get std 0.02/sqrt(2L) so the residual's variance
     * does not grow with depth. */
    const float std = 0.02f, proj_std = 0.02f / sqrtf(2.0f * (float)cfg->n_layer);
    fill_normal(m->w.wte, (size_t)cfg->vocab * C, std, &r);
    fill_normal(m->w.wpe, (size_t)cfg->seq_len * C, std / 2, &r);
    for (int l = 0; l < cfg->n_layer; l++) {
        gpt_layer_tensors *L = &m->w.layer[l];
        fill_const(L->ln1w, C, 1.0f);
        fill_const(L->ln1b, C, 0.0f);
        fill_normal(L->qkvw, 3 * C * C, std, &r);
        fill_const(L->qkvb, 3 * C, 0.0f);
        fill_normal(L->attprojw, C * C, proj_std, &r);
        fill_const(L->attprojb, C, 0.0f);
        fill_const(L->ln2w, C, 1.0f);
        fill_const(L->ln2b, C, 0.0f);
        fill_normal(L->fcw, 4 * C * C, std, &r);
        fill_const(L->fcb, 4 * C, 0.0f);
        fill_normal(L->fcprojw, 4 * C * C, proj_std, &r);
        fill_const(L->fcprojb, C, 0.0f);
    }
    fill_const(m->w.lnfw, C, 1.0f);
    fill_const(m->w.lnfb, C, 0.0f);
}

void gpt_zero_grads(gpt_model *m)
{
    memset(m->grads, 0, m->n_params * sizeof(float));
    memset(m->grad_head, 0, (size_t)m->cfg.vocab * m->cfg.n_embd * sizeof(float));
}

void gpt_add_head_grad(gpt_model *m, const float *head)
{
    const size_t n = (size_t)m->cfg.vocab * m->cfg.n_embd;
    for (size_t i = 0; i < n; i++) m->g.wte[i] += head[i];
}

/* Through the backend: on a GPU, a host loop here moved both tensors' pages of managed
 * memory to the host and back every step (most of the optimizer's 5 ms at the small
 * preset on an H200). */
void gpt_fold_tied_grads(gpt_model *m)
{
    m->ops->fold(m->g.wte, m->grad_head, (size_t)m->cfg.vocab * m->cfg.n_embd);
}
