/* sync_params: see sync_params.h. */
#include "sync_params.h"

#include <stdlib.h>
#include <string.h>

/* Whether tensor t is selected by the spec (every = 0: all; -1: no-embed; K: every K-th). */
static int selected(const gpt_tensor_info *t, long every)
{
    if (every == 0) return 1;
    const int embedding = !strcmp(t->name, "wte") || !strcmp(t->name, "wpe");
    if (every < 0) return !embedding;
    if (embedding) return 0;
    return t->layer < 0 || t->layer % every == 0; /* the final LayerNorm, and blocks 0, K.. */
}

int sync_params_parse(const char *spec, const gpt_config *cfg, sync_params *out,
                      cirrus_error *err)
{
    memset(out, 0, sizeof *out);
    long every = 0;
    if (!spec || !strcmp(spec, "all")) {
        every = 0;
    } else if (!strcmp(spec, "no-embed")) {
        every = -1;
    } else if (!strncmp(spec, "every:", 6)) {
        char *end;
        every = strtol(spec + 6, &end, 10);
        if (end == spec + 6 || *end || every < 1 || every > cfg->n_layer)
            return cirrus_fail(err, CIRRUS_EINVAL, "--sync-params every:K needs 1 <= K <= %d "
                               "(the model's layers), got '%s'", cfg->n_layer, spec);
    } else {
        return cirrus_fail(err, CIRRUS_EINVAL, "--sync-params must be all, no-embed or "
                           "every:K, got '%s'", spec);
    }
    const size_t nt = gpt_num_tensors(cfg);
    gpt_tensor_info *table = malloc(nt * sizeof *table);
    out->spans = malloc(nt * sizeof *out->spans);
    if (!table || !out->spans) {
        free(table);
        sync_params_free(out);
        return cirrus_fail(err, CIRRUS_ENOMEM, "out of memory");
    }
    gpt_tensor_table(cfg, table);
    for (size_t i = 0; i < nt; i++) {
        if (!selected(&table[i], every)) continue;
        gpt_span *last = out->n_spans ? &out->spans[out->n_spans - 1] : NULL;
        if (last && last->offset + last->count == table[i].offset)
            last->count += table[i].numel;
        else
            out->spans[out->n_spans++] = (gpt_span){table[i].offset, table[i].numel};
        out->count += table[i].numel;
    }
    free(table);
    if (out->count == 0) {
        sync_params_free(out);
        return cirrus_fail(err, CIRRUS_EINVAL, "--sync-params '%s' selects no parameter", spec);
    }
    return 0;
}

void sync_params_free(sync_params *sp)
{
    free(sp->spans);
    memset(sp, 0, sizeof *sp);
}

int sync_params_slice(const sync_params *sp, uint64_t lo, uint64_t hi, sync_params *out,
                      cirrus_error *err)
{
    memset(out, 0, sizeof *out);
    if (lo >= hi || hi > sp->count)
        return cirrus_fail(err, CIRRUS_EINVAL, "slice [%llu, %llu) of %zu synchronised floats",
                           (unsigned long long)lo, (unsigned long long)hi, sp->count);
    if (!(out->spans = malloc(sp->n_spans * sizeof out->spans[0])))
        return cirrus_fail(err, CIRRUS_ENOMEM, "out of memory");
    uint64_t at = 0; /* packed offset of span i */
    for (size_t i = 0; i < sp->n_spans; at += sp->spans[i].count, i++) {
        const uint64_t a = at > lo ? at : lo, end = at + sp->spans[i].count,
                       b = end < hi ? end : hi;
        if (a >= b) continue;
        out->spans[out->n_spans++] = (gpt_span){sp->spans[i].offset + (size_t)(a - at),
                                                (size_t)(b - a)};
        out->count += (size_t)(b - a);
    }
    return 0;
}

void sync_params_pack(const sync_params *sp, const float *model, float *packed)
{
    for (size_t i = 0; i < sp->n_spans; i++) {
        memcpy(packed, model + sp->spans[i].offset, sp->spans[i].count * sizeof(float));
        packed += sp->spans[i].count;
    }
}

void sync_params_unpack(const sync_params *sp, const float *packed, float *model)
{
    for (size_t i = 0; i < sp->n_spans; i++) {
        memcpy(model + sp->spans[i].offset, packed, sp->spans[i].count * sizeof(float));
        packed += sp->spans[i].count;
    }
}
