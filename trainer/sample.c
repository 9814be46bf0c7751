/* sample: see sample.h. Recomputes the whole window each byte (no KV cache): for byte
 * models of this size that costs milliseconds and keeps one forward path. */
#include "sample.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../common/rng.h"
#include "model/stage.h"

static int pick(const float *logits, int V, float temperature, rng_state *r)
{
    int best = 0;
    for (int v = 1; v < V; v++)
        if (logits[v] > logits[best]) best = v;
    if (temperature <= 0.0f) return best;
    double sum = 0.0;
    double p[GPT_VOCAB];
    for (int v = 0; v < V; v++) {
        p[v] = exp((double)(logits[v] - logits[best]) / temperature);
        sum += p[v];
    }
    double u = rng_uniform(r) * sum;
    for (int v = 0; v < V; v++) {
        u -= p[v];
        if (u <= 0.0) return v;
    }
    return best;
}

int sample_generate(gpt_model *m, const char *prompt, int n_tokens, float temperature,
                    uint64_t seed, FILE *out, cirrus_error *err)
{
    const int Tmax = m->cfg.seq_len, V = m->cfg.vocab;
    size_t plen = strlen(prompt);
    size_t cap = plen + (size_t)n_tokens + 1;
    int32_t *ctx = malloc(sizeof(int32_t) * cap);
    float *logits = malloc(sizeof(float) * (size_t)Tmax * V);
    gpt_stage *st = NULL;
    int rc = 0;
    if (!ctx || !logits) {
        rc = cirrus_fail(err, CIRRUS_ENOMEM, "cannot allocate the sampling context");
        goto out;
    }
    if ((rc = gpt_stage_new(&st, m, 0, m->cfg.n_layer, 1, Tmax, err))) goto out;
    size_t len = 0;
    if (plen == 0) ctx[len++] = '\n'; /* an empty prompt starts a new line */
    for (size_t i = 0; i < plen; i++) ctx[len++] = (unsigned char)prompt[i];
    fputs(prompt, out);
    rng_state r;
    rng_seed(&r, seed);
    for (int i = 0; i < n_tokens; i++) {
        int T = len < (size_t)Tmax ? (int)len : Tmax;
        gpt_stage_input in = {.B = 1, .T = T, .tokens = ctx + len - T};
        if ((rc = gpt_stage_forward(st, &in, logits, NULL, 0))) {
            cirrus_fail(err, rc, "forward failed while sampling");
            goto out;
        }
        int next = pick(logits + (size_t)(T - 1) * V, V, temperature, &r);
        ctx[len++] = next;
        fputc(next, out);
    }
    fputc('\n', out);
    fflush(out);
out:
    gpt_stage_free(st);
    free(ctx);
    free(logits);
    return rc;
}
