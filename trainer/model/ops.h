/* ops: the kernel interface of the model, and its CPU implementation.
 *
 * ops_backend is the one interface every backend implements: a table of the layer kernels
 * below plus how to allocate the memory they work on. The stage (stage.c) calls kernels only
 * through the table its model was created with, so the same model table and stage code run
 * on the CPU (ops_backend_cpu: the ops_* functions declared here, the reference) or on a GPU
 * (trainer/model/cuda/, in the binary `make cuda` builds). The process picks one at start-up
 * with ops_select() (`--backend cpu|cuda`); gpt_model_init() binds the selected one.
 *
 * N = B*T rows of a (B,T,C) activation. Forward kernels write their outputs; backward
 * kernels ADD parameter gradients (dw, db) and either add to or overwrite input gradients as
 * each comment says. Every reduction over rows is split by columns across threads, so
 * results do not depend on the number of threads.
 */
#ifndef CIRRUS_OPS_H
#define CIRRUS_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "../../common/cerr.h"

struct collective; /* net/collective.h */

/* out (N,C) = wte[tokens] + wpe[t]; tokens are checked by the caller. */
void ops_encoder_forward(float *out, const int32_t *tokens, const float *wte, const float *wpe,
                         int B, int T, int C);
/* dwte[token] += dout; dwpe[t] += dout. */
void ops_encoder_backward(float *dwte, float *dwpe, const float *dout, const int32_t *tokens,
                          int B, int T, int C);

/* LayerNorm over the last dimension, eps 1e-5; saves per-row mean and 1/std. */
void ops_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                           const float *w, const float *b, int N, int C);
/* dinp += d/dinp; dw += ; db += . */
void ops_layernorm_backward(float *dinp, float *dw, float *db, const float *dout,
                            const float *inp, const float *w, const float *mean,
                            const float *rstd, int N, int C);

/* out (N,OC) = base + inp (N,IC) @ w(OC,IC)^T + bias, where base is a (N,OC) tensor to add
 * (the residual stream) or NULL. out may alias base. */
void ops_matmul_forward(float *out, const float *base, const float *inp, const float *w,
                        const float *bias, int N, int IC, int OC);
/* dinp (N,IC) = (accumulate ? dinp : 0) + dout @ w ; dw += dout^T @ inp ; dbias += sum. */
void ops_matmul_backward(float *dinp, int accumulate, float *dw, float *dbias,
                         const float *dout, const float *inp, const float *w, int N, int IC,
                         int OC);

/* Causal multi-head attention from fused qkv (B,T,3C): out (B,T,C), att (B,NH,T,T) the
 * softmax probabilities (zero above the diagonal). */
void ops_attention_forward(float *out, float *att, const float *qkv, int B, int T, int C,
                           int NH);
/* dqkv (B,T,3C) overwritten; datt is (B,NH,T,T) scratch. */
void ops_attention_backward(float *dqkv, float *datt, const float *dout, const float *qkv,
                            const float *att, int B, int T, int C, int NH);

/* GELU, tanh approximation (GPT-2). backward: dinp = dout * gelu'(inp), overwriting. */
void ops_gelu_forward(float *out, const float *inp, int n);
void ops_gelu_backward(float *dinp, const float *inp, const float *dout, int n);

/* In place: row[0..n) = softmax(scale * row[0..n)). */
void ops_softmax_row(float *row, int n, float scale);

/* probs (N,V) = softmax(logits); losses[n] = -log probs[n, targets[n]]. */
void ops_crossentropy_forward(float *probs, float *losses, const float *logits,
                              const int32_t *targets, int N, int V);
/* dlogits (N,V) = (probs - onehot(targets)) * dloss, overwriting. */
void ops_crossentropy_backward(float *dlogits, const float *probs, const int32_t *targets,
                               float dloss, int N, int V);

/* logits (N,V) = inp (N,C) @ wte^T (the tied LM head). */
void ops_head_forward(float *logits, const float *inp, const float *wte, int N, int C, int V);
/* dinp (N,C) = dlogits @ wte (overwrite); dwte += dlogits^T @ inp. */
void ops_head_backward(float *dinp, float *dwte, const float *dlogits, const float *inp,
                       const float *wte, int N, int C, int V);

/* ---- the optimizer's and the codec's kernels (CPU: model/cpu/ops_optim.c) ---- */

/* dst[i] += src[i], then src[i] = 0, for i < n: the tied head's gradient folded into the
 * embedding's before a step (one float addition each: the same bits on every backend). */
void ops_fold(float *dst, float *src, size_t n);

/* Sum of squares of (scale * x[i]) over n floats, in double: chunks of OPS_SUMSQ_CHUNK
 * floats each summed in index order, then the chunks' sums added in order. Every backend
 * does exactly these additions (no fused multiply-adds), so every backend gives the same
 * bits, whatever its thread count. */
#define OPS_SUMSQ_CHUNK 65536
double ops_sumsq(const float *x, size_t n, float scale);
/* out[i] = ops_sumsq(base + offset[i], count[i], scale) for i < n, the same bits. */
void ops_sumsq_many(const float *base, const size_t *offset, const size_t *count, int n,
                    float scale, double *out);

/* One AdamW step's constants (see adamw_step: bc1, bc2 the bias corrections). */
typedef struct ops_adamw_args {
    float grad_scale; /* scale * clip factor applied to every gradient */
    float lr, beta1, beta2, bc1, bc2, eps, weight_decay;
} ops_adamw_args;
/* For i < n: g' = g * grad_scale; g = 0; m, v updated; p -= lr * (mhat / (sqrt(vhat) + eps)
 * + weight_decay * p), in binary32 with no fused multiply-adds (bit-equal across backends). */
void ops_adamw_update(float *p, float *g, float *m, float *v, size_t n, const ops_adamw_args *a);
/* One tensor of a batched AdamW step: its parameters/gradients at p + param, its moments at
 * m + state and v + state, count floats, its own constants. */
typedef struct ops_adamw_tensor {
    size_t param, state, count;
    ops_adamw_args a;
} ops_adamw_tensor;
/* ops_adamw_update for each of n tensors: the same bits as a call per tensor. */
void ops_adamw_update_many(float *p, float *g, float *m, float *v, const ops_adamw_tensor *t,
                           int n);

/* ---- the backend table ---- */

typedef struct ops_backend {
    const char *name; /* "cpu", "cuda" */
    /* n zeroed floats that these kernels and the host can both read and write (the CUDA
     * backend: managed memory), and their release. NULL when out of memory. */
    float *(*alloc)(size_t n);
    void (*free)(float *p);
    /* 0, or the first device error since start-up (sticky: the device is unusable after it),
     * with err filled. The CPU backend never fails. Kernels are void, as on the CPU, so the
     * stage asks this once after a forward or backward. */
    int (*status)(cirrus_error *err);
    void (*encoder_forward)(float *out, const int32_t *tokens, const float *wte,
                            const float *wpe, int B, int T, int C);
    void (*encoder_backward)(float *dwte, float *dwpe, const float *dout,
                             const int32_t *tokens, int B, int T, int C);
    void (*layernorm_forward)(float *out, float *mean, float *rstd, const float *inp,
                              const float *w, const float *b, int N, int C);
    void (*layernorm_backward)(float *dinp, float *dw, float *db, const float *dout,
                               const float *inp, const float *w, const float *mean,
                               const float *rstd, int N, int C);
    void (*matmul_forward)(float *out, const float *base, const float *inp, const float *w,
                           const float *bias, int N, int IC, int OC);
    void (*matmul_backward)(float *dinp, int accumulate, float *dw, float *dbias,
                            const float *dout, const float *inp, const float *w, int N, int IC,
                            int OC);
    void (*attention_forward)(float *out, float *att, const float *qkv, int B, int T, int C,
                              int NH);
    void (*attention_backward)(float *dqkv, float *datt, const float *dout, const float *qkv,
                               const float *att, int B, int T, int C, int NH);
    void (*gelu_forward)(float *out, const float *inp, int n);
    void (*gelu_backward)(float *dinp, const float *inp, const float *dout, int n);
    void (*crossentropy_forward)(float *probs, float *losses, const float *logits,
                                 const int32_t *targets, int N, int V);
    void (*crossentropy_backward)(float *dlogits, const float *probs, const int32_t *targets,
                                  float dloss, int N, int V);
    void (*head_forward)(float *logits, const float *inp, const float *wte, int N, int C,
                         int V);
    void (*head_backward)(float *dinp, float *dwte, const float *dlogits, const float *inp,
                          const float *wte, int N, int C, int V);
    /* Row-major C (M,N) = alpha op(A) (M,K) @ op(B) (K,N) + beta C, op = transpose when ta
     * or tb is 1: the product the matmuls are made of, exposed for `bench`'s ceiling. */
    void (*sgemm)(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
                  const float *B, int ldb, float beta, float *C, int ldc);
    /* The optimizer (optim/adamw.c calls these on the buffers of its backend); fold, the
     * tied gradients' fold before it (gpt_fold_tied_grads). */
    void (*fold)(float *dst, float *src, size_t n);
    double (*sumsq)(const float *x, size_t n, float scale);
    /* Many tensors' sums of squares at once (the optimizer's, a tensor each): the bits of a
     * sumsq call per tensor; on the GPU one launch and one copy back instead of one each. */
    void (*sumsq_many)(const float *base, const size_t *offset, const size_t *count, int n,
                       float scale, double *out);
    void (*adamw_update)(float *p, float *g, float *m, float *v, size_t n,
                         const ops_adamw_args *a);
    /* Every tensor of a step at once (on the GPU one launch, not one per tensor). */
    void (*adamw_update_many)(float *p, float *g, float *m, float *v,
                              const ops_adamw_tensor *t, int n);
    /* The q8 activation codec (codec/q8.h), bit-equal across backends; buffers from this
     * backend's alloc. The wire path still encodes on the host (the buffers are managed
     * memory, so that works on both backends); these are the device versions for later. */
    int (*q8_encode)(uint8_t *out, const float *x, size_t n);
    int (*q8_decode)(float *out, size_t n, const uint8_t *in, size_t in_len);
    /* The device's own all-reduce for the peers of a stage whose backends all have it
     * (CUDA: NCCL, net/nccl_collective.cu), or NULL (the CPU: the TCP ring does it).
     * device_collective_id makes a new communicator's id (DEVICE_COLLECTIVE_ID_BYTES,
     * net/collective.h) on rank 0; device_collective_new joins it as `rank` of `world`,
     * giving up after timeout_ms. swarm/peer/averaging.c builds one over the ring. */
    int (*device_collective_id)(uint8_t *id, cirrus_error *err);
    int (*device_collective_new)(struct collective **out, int rank, int world,
                                 const uint8_t *id, int timeout_ms, cirrus_error *err);
} ops_backend;

extern const ops_backend ops_backend_cpu;

/* Make `name` ("cpu" or "cuda") the backend of every model created from now on. Fails with
 * CIRRUS_EINVAL for an unknown name or a binary built without it, and with CIRRUS_EIO when
 * the CUDA backend cannot start (no driver, no device: err says which). Call it once, before
 * any model exists. */
int ops_select(const char *name, cirrus_error *err);
/* The selected backend (the CPU one unless ops_select() chose another). */
const ops_backend *ops_selected(void);

#endif
