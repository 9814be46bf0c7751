/* stage: forward and backward of a layer range of the model. See stage.h. */
#include "stage.h"

#include <stdlib.h>
#include <string.h>

#include "../../common/log.h"
#include "ops.h"

/* Activations of one transformer block, (N,...) with N = B*T rows. */
typedef struct layer_acts {
    float *ln1, *ln1_mean, *ln1_rstd; /* (N,C), (N), (N) */
    float *qkv;                        /* (N,3C) */
    float *atty;                       /* (N,C) attention output before projection */
    float *att;                        /* (B,NH,T,T) attention probabilities */
    float *res2;                       /* (N,C) residual after attention */
    float *ln2, *ln2_mean, *ln2_rstd;  /* (N,C), (N), (N) */
    float *fch, *fchg;                 /* (N,4C) MLP pre- and post-GELU */
    float *res3;                       /* (N,C) block output */
} layer_acts;

struct gpt_stage {
    gpt_model *m;
    const ops_backend *ops; /* m->ops: its kernels, and the memory of every buffer below */
    int l0, l1, max_B, max_T;
    int first, last;
    /* Which input the activations belong to (0 = none kept). */
    uint64_t kept_id;
    int kept_B, kept_T;
    /* forward */
    float *x0;                       /* (N,C) stage input: embeddings or received hidden */
    layer_acts *acts;                /* l1 - l0 */
    float *lnf, *lnf_mean, *lnf_rstd; /* last stage */
    float *logits, *probs, *losses;  /* (N,V), (N,V), (N) */
    /* backward scratch, shared by all layers */
    float *dres, *dC, *d3C, *d4C, *datt, *dlogits;
    /* every allocation above, for one free() loop */
    float **allocs;
    int n_allocs, cap_allocs;
};

static float *stage_alloc(gpt_stage *s, size_t n, int *failed)
{
    if (n == 0) return NULL;
    if (s->n_allocs == s->cap_allocs) {
        int cap = s->cap_allocs ? 2 * s->cap_allocs : 32;
        float **a = realloc(s->allocs, sizeof(float *) * (size_t)cap);
        if (!a) {
            *failed = 1;
            return NULL;
        }
        s->allocs = a;
        s->cap_allocs = cap;
    }
    float *p = s->ops->alloc(n);
    if (!p) *failed = 1;
    s->allocs[s->n_allocs++] = p;
    return p;
}

int gpt_stage_new(gpt_stage **out, gpt_model *m, int l0, int l1, int max_B, int max_T,
                     cirrus_error *err)
{
    const gpt_config *cfg = &m->cfg;
    *out = NULL;
    if (l0 < 0 || l1 > cfg->n_layer || l0 > l1)
        return cirrus_fail(err, CIRRUS_EINVAL, "stage layers [%d, %d) outside [0, %d)", l0, l1,
                           cfg->n_layer);
    if (l0 == l1 && l0 != 0 && l1 != cfg->n_layer)
        return cirrus_fail(err, CIRRUS_EINVAL, "stage [%d, %d) owns nothing", l0, l1);
    if (max_B < 1 || max_T < 1 || max_T > cfg->seq_len)
        return cirrus_fail(err, CIRRUS_EINVAL,
                           "batch %d x context %d invalid (context must be in [1, %d])", max_B,
                           max_T, cfg->seq_len);
    gpt_stage *s = calloc(1, sizeof *s);
    if (!s) return cirrus_fail(err, CIRRUS_ENOMEM, "cannot allocate a stage");
    s->m = m;
    s->ops = m->ops;
    s->l0 = l0;
    s->l1 = l1;
    s->max_B = max_B;
    s->max_T = max_T;
    s->first = l0 == 0;
    s->last = l1 == cfg->n_layer;
    const size_t N = (size_t)max_B * max_T, C = (size_t)cfg->n_embd, V = (size_t)cfg->vocab;
    const size_t att = (size_t)max_B * cfg->n_head * max_T * max_T;
    int failed = 0;
    s->acts = calloc((size_t)(l1 - l0) + 1, sizeof(layer_acts));
    failed |= !s->acts;
    s->x0 = stage_alloc(s, N * C, &failed);
    for (int l = 0; !failed && l < l1 - l0; l++) {
        layer_acts *a = &s->acts[l];
        a->ln1 = stage_alloc(s, N * C, &failed);
        a->ln1_mean = stage_alloc(s, N, &failed);
        a->ln1_rstd = stage_alloc(s, N, &failed);
        a->qkv = stage_alloc(s, N * 3 * C, &failed);
        a->atty = stage_alloc(s, N * C, &failed);
        a->att = stage_alloc(s, att, &failed);
        a->res2 = stage_alloc(s, N * C, &failed);
        a->ln2 = stage_alloc(s, N * C, &failed);
        a->ln2_mean = stage_alloc(s, N, &failed);
        a->ln2_rstd = stage_alloc(s, N, &failed);
        a->fch = stage_alloc(s, N * 4 * C, &failed);
        a->fchg = stage_alloc(s, N * 4 * C, &failed);
        a->res3 = stage_alloc(s, N * C, &failed);
    }
    if (s->last) {
        s->lnf = stage_alloc(s, N * C, &failed);
        s->lnf_mean = stage_alloc(s, N, &failed);
        s->lnf_rstd = stage_alloc(s, N, &failed);
        s->logits = stage_alloc(s, N * V, &failed);
        s->probs = stage_alloc(s, N * V, &failed);
        s->losses = stage_alloc(s, N, &failed);
        s->dlogits = stage_alloc(s, N * V, &failed);
    }
    s->dres = stage_alloc(s, N * C, &failed);
    s->dC = stage_alloc(s, N * C, &failed);
    s->d3C = stage_alloc(s, N * 3 * C, &failed);
    s->d4C = stage_alloc(s, N * 4 * C, &failed);
    s->datt = stage_alloc(s, att, &failed);
    if (failed) {
        gpt_stage_free(s);
        return cirrus_fail(err, CIRRUS_ENOMEM, "cannot allocate activations for batch %d x %d",
                           max_B, max_T);
    }
    *out = s;
    return 0;
}

void gpt_stage_free(gpt_stage *s)
{
    if (!s) return;
    for (int i = 0; i < s->n_allocs; i++) s->ops->free(s->allocs[i]);
    free(s->allocs);
    free(s->acts);
    free(s);
}

int gpt_stage_is_first(const gpt_stage *s)
{
    return s->first;
}

int gpt_stage_is_last(const gpt_stage *s)
{
    return s->last;
}

static int check_tokens(const int32_t *tok, size_t n, int V)
{
    for (size_t i = 0; i < n; i++)
        if (tok[i] < 0 || tok[i] >= V) return CIRRUS_EINVAL;
    return 0;
}

static int check_input(const gpt_stage *s, const gpt_stage_input *in, int need_targets)
{
    if (in->B < 1 || in->B > s->max_B || in->T < 1 || in->T > s->max_T) return CIRRUS_EINVAL;
    const size_t N = (size_t)in->B * in->T;
    const int V = s->m->cfg.vocab;
    if (s->first ? !in->tokens || check_tokens(in->tokens, N, V) : !in->hidden)
        return CIRRUS_EINVAL;
    if (s->last && in->targets && check_tokens(in->targets, N, V)) return CIRRUS_EINVAL;
    if (s->last && need_targets && !in->targets) return CIRRUS_EINVAL;
    return 0;
}

static void layer_forward(const gpt_stage *s, int l, const float *x, layer_acts *a, int B,
                          int T)
{
    const gpt_config *cfg = &s->m->cfg;
    const gpt_layer_tensors *w = &s->m->w.layer[l];
    const int N = B * T, C = cfg->n_embd;
    s->ops->layernorm_forward(a->ln1, a->ln1_mean, a->ln1_rstd, x, w->ln1w, w->ln1b, N, C);
    s->ops->matmul_forward(a->qkv, NULL, a->ln1, w->qkvw, w->qkvb, N, C, 3 * C);
    s->ops->attention_forward(a->atty, a->att, a->qkv, B, T, C, cfg->n_head);
    s->ops->matmul_forward(a->res2, x, a->atty, w->attprojw, w->attprojb, N, C, C);
    s->ops->layernorm_forward(a->ln2, a->ln2_mean, a->ln2_rstd, a->res2, w->ln2w, w->ln2b, N, C);
    s->ops->matmul_forward(a->fch, NULL, a->ln2, w->fcw, w->fcb, N, C, 4 * C);
    s->ops->gelu_forward(a->fchg, a->fch, N * 4 * C);
    s->ops->matmul_forward(a->res3, a->res2, a->fchg, w->fcprojw, w->fcprojb, N, 4 * C, C);
}

/* dres holds d(block output) on entry and d(block input) on return. */
static void layer_backward(const gpt_stage *s, int l, const float *x, const layer_acts *a,
                           int B, int T)
{
    const gpt_config *cfg = &s->m->cfg;
    const gpt_layer_tensors *w = &s->m->w.layer[l];
    gpt_layer_tensors *g = &s->m->g.layer[l];
    const int N = B * T, C = cfg->n_embd;
    float *dres = s->dres;
    /* MLP: res3 = res2 + fcproj(gelu(fc(ln2(res2)))) */
    s->ops->matmul_backward(s->d4C, 0, g->fcprojw, g->fcprojb, dres, a->fchg, w->fcprojw, N,
                        4 * C, C);
    s->ops->gelu_backward(s->d4C, a->fch, s->d4C, N * 4 * C);
    s->ops->matmul_backward(s->dC, 0, g->fcw, g->fcb, s->d4C, a->ln2, w->fcw, N, C, 4 * C);
    s->ops->layernorm_backward(dres, g->ln2w, g->ln2b, s->dC, a->res2, w->ln2w, a->ln2_mean,
                           a->ln2_rstd, N, C);
    /* attention: res2 = x + attproj(attn(qkv(ln1(x)))) */
    s->ops->matmul_backward(s->dC, 0, g->attprojw, g->attprojb, dres, a->atty, w->attprojw, N, C,
                        C);
    s->ops->attention_backward(s->d3C, s->datt, s->dC, a->qkv, a->att, B, T, C, cfg->n_head);
    s->ops->matmul_backward(s->dC, 0, g->qkvw, g->qkvb, s->d3C, a->ln1, w->qkvw, N, C, 3 * C);
    s->ops->layernorm_backward(dres, g->ln1w, g->ln1b, s->dC, x, w->ln1w, a->ln1_mean,
                           a->ln1_rstd, N, C);
}

/* 0, or CIRRUS_EIO after a device error (logged: the ops are void, as on the CPU). Checked
 * before the host reads what the kernels wrote. */
static int stage_device_ok(const gpt_stage *s)
{
    cirrus_error e = {0};
    if (!s->ops->status(&e)) return 0;
    log_error("stage [%d, %d): %s backend: %s", s->l0, s->l1, s->ops->name, e.msg);
    return CIRRUS_EIO;
}

static const float *stage_output(const gpt_stage *s)
{
    return s->l1 > s->l0 ? s->acts[s->l1 - s->l0 - 1].res3 : s->x0;
}

int gpt_stage_forward(gpt_stage *s, const gpt_stage_input *in, float *out, float *loss,
                      int keep)
{
    if (check_input(s, in, 0)) return CIRRUS_EINVAL;
    if ((!s->last || !in->targets) && !out) return CIRRUS_EINVAL;
    if (s->last && in->targets && !loss) return CIRRUS_EINVAL;
    const gpt_model *m = s->m;
    const int B = in->B, T = in->T, N = B * T, C = m->cfg.n_embd, V = m->cfg.vocab;
    s->kept_id = 0;
    if (s->first)
        s->ops->encoder_forward(s->x0, in->tokens, m->w.wte, m->w.wpe, B, T, C);
    else
        memcpy(s->x0, in->hidden, sizeof(float) * (size_t)N * C);
    const float *x = s->x0;
    for (int l = s->l0; l < s->l1; l++) {
        layer_acts *a = &s->acts[l - s->l0];
        layer_forward(s, l, x, a, B, T);
        x = a->res3;
    }
    if (!s->last) {
        if (stage_device_ok(s)) return CIRRUS_EIO;
        memcpy(out, x, sizeof(float) * (size_t)N * C);
    } else {
        s->ops->layernorm_forward(s->lnf, s->lnf_mean, s->lnf_rstd, x, m->w.lnfw, m->w.lnfb, N, C);
        s->ops->head_forward(s->logits, s->lnf, m->w.wte, N, C, V);
        if (in->targets) {
            s->ops->crossentropy_forward(s->probs, s->losses, s->logits, in->targets, N, V);
            if (stage_device_ok(s)) return CIRRUS_EIO;
            double sum = 0.0; /* in a fixed order, in double: the loss is reported bit-exact */
            for (int n = 0; n < N; n++) sum += s->losses[n];
            *loss = (float)(sum / N);
        } else {
            if (stage_device_ok(s)) return CIRRUS_EIO;
            memcpy(out, s->logits, sizeof(float) * (size_t)N * V);
        }
    }
    if (keep) {
        s->kept_id = in->id;
        s->kept_B = B;
        s->kept_T = T;
    }
    return 0;
}

int gpt_stage_backward(gpt_stage *s, const gpt_stage_input *in, const float *grad_out,
                       float *grad_in)
{
    if (check_input(s, in, 1)) return CIRRUS_EINVAL;
    if ((!s->last && !grad_out) || (!s->first && !grad_in)) return CIRRUS_EINVAL;
    gpt_model *m = s->m;
    const int B = in->B, T = in->T, N = B * T, C = m->cfg.n_embd, V = m->cfg.vocab;
    if (!(in->id != 0 && s->kept_id == in->id && s->kept_B == B && s->kept_T == T)) {
        /* Stateless backward: the activations are gone (or belong to another microbatch),
         * so recompute them from the input. */
        float loss;
        int rc = gpt_stage_forward(s, in, s->last ? NULL : s->dres, &loss, 1);
        if (rc) return rc;
        s->kept_id = in->id;
    }
    if (s->last) {
        s->ops->crossentropy_backward(s->dlogits, s->probs, in->targets, 1.0f / (float)N, N, V);
        s->ops->head_backward(s->dC, m->grad_head, s->dlogits, s->lnf, m->w.wte, N, C, V);
        memset(s->dres, 0, sizeof(float) * (size_t)N * C);
        s->ops->layernorm_backward(s->dres, m->g.lnfw, m->g.lnfb, s->dC, stage_output(s),
                               m->w.lnfw, s->lnf_mean, s->lnf_rstd, N, C);
    } else {
        memcpy(s->dres, grad_out, sizeof(float) * (size_t)N * C);
    }
    for (int l = s->l1 - 1; l >= s->l0; l--) {
        const float *x = l == s->l0 ? s->x0 : s->acts[l - 1 - s->l0].res3;
        layer_backward(s, l, x, &s->acts[l - s->l0], B, T);
    }
    if (s->first)
        s->ops->encoder_backward(m->g.wte, m->g.wpe, s->dres, in->tokens, B, T, C);
    if (stage_device_ok(s)) return CIRRUS_EIO;
    if (!s->first) memcpy(grad_in, s->dres, sizeof(float) * (size_t)N * C);
    return 0;
}
