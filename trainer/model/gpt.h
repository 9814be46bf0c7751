/* gpt: the one definition of the Cirrus language model's parameters.
 *
 * A GPT-2 style decoder over a byte vocabulary (256 symbols, so any text trains with no
 * tokenizer files). Every parameter tensor is named ONCE, in the X-macro tables below; the
 * flat parameter buffer, its gradient, the optimizer state, checkpoints and the slice owned
 * by a pipeline stage are all derived from these tables. Backends (CPU now, CUDA later) bind
 * their pointers with gpt_weights_bind() and never list tensors themselves.
 *
 * Layout of the flat buffer, in order:
 *   [embedding tensors][layer 0 tensors][layer 1 tensors]...[final tensors]
 * so the parameters of any layer range [l0, l1) are one contiguous span, and so is any
 * pipeline stage's (stage 0 adds the embeddings in front, the last stage the final
 * LayerNorm behind). The LM head is tied to wte (see gpt_stage_param_span()).
 */
#ifndef CIRRUS_GPT_H
#define CIRRUS_GPT_H

#include <stddef.h>
#include <stdint.h>

#include "../../common/cerr.h"

#define GPT_VOCAB 256

typedef struct gpt_config {
    int n_layer; /* transformer blocks */
    int n_embd;  /* model width C */
    int n_head;  /* attention heads; must divide n_embd */
    int seq_len; /* maximum context T (size of the position table) */
    int vocab;   /* always GPT_VOCAB for byte-level models */
} gpt_config;

/* Tensor tables: X(name, rows, cols). C = n_embd, V = vocab, T = seq_len are in scope
 * where the tables expand. rows > 1 marks a matrix (weight-decayed); rows == 1 a vector. */
#define GPT_EMBED_TENSORS(X)                                                               \
    X(wte, V, C) /* token embedding, also the LM head (tied) */                           \
    X(wpe, T, C) /* position embedding */

#define GPT_LAYER_TENSORS(X)                                                               \
    X(ln1w, 1, C)         /* pre-attention LayerNorm gain */                              \
    X(ln1b, 1, C)         /* pre-attention LayerNorm bias */                              \
    X(qkvw, 3 * C, C)     /* fused q,k,v projection, out x in */                          \
    X(qkvb, 1, 3 * C)                                                                      \
    X(attprojw, C, C)     /* attention output projection */                               \
    X(attprojb, 1, C)                                                                      \
    X(ln2w, 1, C)         /* pre-MLP LayerNorm gain */                                    \
    X(ln2b, 1, C)                                                                          \
    X(fcw, 4 * C, C)      /* MLP up-projection (4x width) */                              \
    X(fcb, 1, 4 * C)                                                                       \
    X(fcprojw, C, 4 * C)  /* MLP down-projection */                                       \
    X(fcprojb, 1, C)

#define GPT_FINAL_TENSORS(X)                                                               \
    X(lnfw, 1, C) /* final LayerNorm gain */                                              \
    X(lnfb, 1, C)

/* Pointers into one flat buffer (parameters, or their gradients). */
typedef struct gpt_layer_tensors {
#define GPT_FIELD(name, rows, cols) float *name;
    GPT_LAYER_TENSORS(GPT_FIELD)
} gpt_layer_tensors;

typedef struct gpt_weights {
    GPT_EMBED_TENSORS(GPT_FIELD)
    GPT_FINAL_TENSORS(GPT_FIELD)
#undef GPT_FIELD
    gpt_layer_tensors *layer; /* n_layer entries */
} gpt_weights;

/* One row of the derived tensor table. */
typedef struct gpt_tensor_info {
    char name[32];  /* e.g. "wte", "layer3.qkvw" */
    int layer;      /* -1 for embedding/final tensors */
    size_t rows, cols;
    size_t offset;  /* in floats, into the flat buffer */
    size_t numel;
    int decay;      /* 1 for matrices (AdamW weight decay), 0 for vectors */
} gpt_tensor_info;

/* Span of floats [offset, offset + count) of the flat buffer. */
typedef struct gpt_span {
    size_t offset, count;
} gpt_span;

/* ---- configuration ---- */

/* Fill cfg from a preset name ("tiny", "small"); returns CIRRUS_EINVAL for an unknown one. */
int gpt_config_preset(gpt_config *cfg, const char *name, cirrus_error *err);
/* Check a configuration for consistency (heads divide width, positive sizes, bounds). */
int gpt_config_validate(const gpt_config *cfg, cirrus_error *err);

/* ---- the derived layout ---- */

size_t gpt_num_params(const gpt_config *cfg);
size_t gpt_num_tensors(const gpt_config *cfg);
/* Fill table (gpt_num_tensors() entries) in buffer order. */
void gpt_tensor_table(const gpt_config *cfg, gpt_tensor_info *table);
/* Carve per-tensor pointers out of a flat buffer laid out as above. w->layer must point to
 * n_layer gpt_layer_tensors. */
void gpt_weights_bind(const gpt_config *cfg, float *base, gpt_weights *w);
/* Span of layers [l0, l1), plus embeddings if l0 == 0 and final tensors if l1 == n_layer. */
gpt_span gpt_stage_param_span(const gpt_config *cfg, int l0, int l1);
/* The spans a stage serving layers [l0, l1) keeps optimizer state for, in buffer order:
 * its parameter span, preceded by wte when it is the last stage but not the first (the
 * tied LM head: that stage updates its own copy of wte in step with the first stage's).
 * Returns how many (1 or 2) were written to out. */
int gpt_stage_state_spans(const gpt_config *cfg, int l0, int l1, gpt_span out[2]);

/* ---- the model: parameters and gradients of the whole network ---- */

struct ops_backend;

typedef struct gpt_model {
    gpt_config cfg;
    /* The backend whose memory holds params, grads and grad_head, and whose kernels the
     * stages of this model run (ops_selected() when the model was created). */
    const struct ops_backend *ops;
    size_t n_params;
    float *params;         /* flat, gpt layout */
    float *grads;          /* flat, same layout */
    /* The LM head's share of d(loss)/d(wte). Kept apart from grads.wte (the embedding's
     * share) until gpt_fold_tied_grads(), so that the sum is formed in the same order
     * whether the first and last stages live in one process or in two. */
    float *grad_head;      /* V x C */
    gpt_weights w, g;
} gpt_model;

/* Allocates with, and binds, the selected backend (ops_select()). */
int gpt_model_init(gpt_model *m, const gpt_config *cfg, cirrus_error *err);
void gpt_model_free(gpt_model *m);
/* GPT-2 initialisation: N(0, 0.02), residual projections scaled by 1/sqrt(2 n_layer),
 * LayerNorm gains 1, biases 0. Deterministic in seed. */
void gpt_model_seed(gpt_model *m, uint64_t seed);
void gpt_zero_grads(gpt_model *m);
/* grads.wte += grad_head; grad_head = 0. Called once per optimizer step. */
void gpt_fold_tied_grads(gpt_model *m);
/* grads.wte += head (V x C): the LM head's share, which a pipeline's first stage receives
 * from the last; the same additions in the same order as gpt_fold_tied_grads(). */
void gpt_add_head_grad(gpt_model *m, const float *head);

#endif
