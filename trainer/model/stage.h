/* stage: run a slice of the model, as a SWARM pipeline stage does.
 *
 * A stage owns transformer blocks [l0, l1) of a gpt_model; the first stage (l0 == 0) also
 * owns the embeddings and the last (l1 == n_layer) the final LayerNorm, the tied LM head
 * and the loss. The single-process trainer is simply one stage spanning every layer, or
 * several stages called in a row.
 *
 *   forward(input) -> output        hidden states (B,T,C); the last stage gives the loss
 *                                   (or logits when no targets are given)
 *   backward(input, grad_output)    accumulates parameter gradients (+=) and returns
 *                                   grad_input (B,T,C); the first stage has none
 *
 * Backward is stateless from the caller's side: it takes the same input the forward took.
 * If the stage still holds the activations of that input (forward with keep = 1 and the same
 * id), they are used; otherwise the forward is recomputed first. This is what lets any peer
 * of a stage serve any backward, and both paths give bit-identical results.
 */
#ifndef CIRRUS_STAGE_H
#define CIRRUS_STAGE_H

#include <stdint.h>

#include "gpt.h"

typedef struct gpt_stage gpt_stage;

typedef struct gpt_stage_input {
    uint64_t id;            /* microbatch id (any value but 0); matches a kept forward */
    int B, T;               /* batch and context, <= the stage's maxima */
    const int32_t *tokens;  /* (B,T) first stage only */
    const float *hidden;    /* (B,T,C) every other stage */
    const int32_t *targets; /* (B,T) last stage; NULL asks forward for logits instead */
} gpt_stage_input;

/* A stage over layers [l0, l1) of m, with activation memory for up to max_B x max_T. */
int gpt_stage_new(gpt_stage **out, gpt_model *m, int l0, int l1, int max_B, int max_T,
                     cirrus_error *err);
void gpt_stage_free(gpt_stage *s);

int gpt_stage_is_first(const gpt_stage *s);
int gpt_stage_is_last(const gpt_stage *s);

/* Forward. Non-last stages write hidden states (B,T,C) to out. The last stage writes the
 * mean cross-entropy over B*T tokens to *loss when targets are given, or logits (B,T,V) to
 * out when they are not. keep = 1 retains activations for a backward with the same id. */
int gpt_stage_forward(gpt_stage *s, const gpt_stage_input *in, float *out, float *loss,
                      int keep);

/* Backward of the mean loss (last stage) or of <grad_out, output> (other stages).
 * Parameter gradients are added to m->grads (and m->grad_head for the LM head). grad_in
 * (B,T,C) is written by every stage but the first, where it may be NULL. The last stage
 * requires targets. */
int gpt_stage_backward(gpt_stage *s, const gpt_stage_input *in, const float *grad_out,
                       float *grad_in);

#endif
