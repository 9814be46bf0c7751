/* sync_params: which parameters the outer steps synchronise (Nebula-I's parameter-efficient
 * mode, `--sync-params`); the rest each region trains on its own.
 *
 *   all          every tensor (the default)
 *   no-embed     all but the token and position embeddings (wte, wpe): the largest tensors
 *                of a byte- or word-level model's vocabulary stay regional
 *   every:K      the transformer blocks 0, K, 2K, ... and the final LayerNorm
 *
 * The gateway and the region's client derive the same spans from the same spec and model,
 * so only the selected floats cross the WAN and only they are replaced by the outer step.
 */
#ifndef CIRRUS_SYNC_PARAMS_H
#define CIRRUS_SYNC_PARAMS_H

#include <stddef.h>

#include "../../common/cerr.h"
#include "../model/gpt.h"

typedef struct sync_params {
    gpt_span *spans;  /* in buffer order, merged where adjacent */
    size_t n_spans;
    size_t count;     /* floats selected */
} sync_params;

/* The spans spec selects of cfg's parameters; CIRRUS_EINVAL with a message for a bad spec
 * or one that selects nothing. Free with sync_params_free. */
int sync_params_parse(const char *spec, const gpt_config *cfg, sync_params *out,
                      cirrus_error *err);
void sync_params_free(sync_params *sp);
/* The packed floats [lo, hi) of sp as a selection of their own (a fragment, fragments.h);
 * CIRRUS_EINVAL for an empty or out-of-range slice. */
int sync_params_slice(const sync_params *sp, uint64_t lo, uint64_t hi, sync_params *out,
                      cirrus_error *err);
/* Copy the selected floats of a whole-model buffer into packed[count], and back. */
void sync_params_pack(const sync_params *sp, const float *model, float *packed);
void sync_params_unpack(const sync_params *sp, const float *packed, float *model);

#endif
