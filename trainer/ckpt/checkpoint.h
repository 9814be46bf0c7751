/* checkpoint: versioned, checksummed, atomically written training state.
 *
 * One file, DIR/cirrus.ckpt, all integers little-endian:
 *   header   magic "CIRRUSCK", format version, model config, step, data position, RNG state,
 *            seed, the span of the flat parameter buffer stored (a stage stores its own),
 *            the job id that wrote it ("" for `train`)
 *   payload  parameters, AdamW first moment, AdamW second moment (span.count floats each)
 *   trailer  CRC-32 (zlib) of everything before it
 * Saving writes DIR/cirrus.ckpt.tmp and fsyncs it, renames the old DIR/cirrus.ckpt to
 * DIR/cirrus.ckpt.prev, renames the new one into place and fsyncs DIR: a crash at any
 * point leaves a complete checkpoint, and the previous one stays as a fallback for a
 * newest one damaged later (ckpt_load_newest). Loading checks magic, version, sizes, the
 * checksum and (if asked) the config and job before it touches the caller's buffers, so a
 * rejected file changes nothing.
 */
#ifndef CIRRUS_CHECKPOINT_H
#define CIRRUS_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>

#include "../../common/cerr.h"
#include "../data/loader.h"
#include "../model/gpt.h"

#define CKPT_FILE "cirrus.ckpt"
#define CKPT_PREV_FILE "cirrus.ckpt.prev"
#define CKPT_VERSION 2 /* 2: the job id in the header */
#define CKPT_JOB_MAX 63 /* bytes of a job id (the wire's WIRE_JOB_ID_MAX) */

typedef struct ckpt_meta {
    gpt_config cfg;
    uint64_t step;          /* optimizer steps completed */
    data_position data_pos; /* where the train loader resumes */
    uint64_t rng_state;
    uint64_t seed;
    gpt_span span;          /* part of the flat buffer stored: (0, n_params) for a model */
    char job[CKPT_JOB_MAX + 1]; /* the job that trained it; "" for none (`train`) */
} ckpt_meta;

/* Save params/adam_m/adam_v (meta->span.count floats each) to dir (created if missing). */
int ckpt_save(const char *dir, const ckpt_meta *meta, const float *params,
              const float *adam_m, const float *adam_v, cirrus_error *err);

/* Read only the header (to learn the config before allocating). */
int ckpt_read_meta(const char *dir, ckpt_meta *meta, cirrus_error *err);

/* Load into buffers of meta->span.count floats. If expect is not NULL the stored config
 * must equal it and the stored span must equal *expect_span. adam_m/adam_v may be NULL
 * (sampling needs only parameters). On failure nothing is written to the buffers. */
int ckpt_load(const char *dir, const gpt_config *expect, const gpt_span *expect_span,
              ckpt_meta *meta, float *params, float *adam_m, float *adam_v,
              cirrus_error *err);

/* A resume's load: the newest complete checkpoint of dir into buffers of the whole model
 * (gpt_num_params(expect) floats each). That is DIR/cirrus.ckpt, or, when it is damaged
 * (truncated, checksum, bad header) or missing, DIR/cirrus.ckpt.prev; why a damaged newest
 * one was passed over goes to *skipped (its message names the file; "" when it was not).
 * A checkpoint of another model shape, or of another job when job is not NULL, is refused
 * (CIRRUS_EMISMATCH) without trying the previous one: it is the same job's. CIRRUS_ENOENT
 * when dir holds neither; *used (if not NULL) receives the path of the file loaded. */
int ckpt_load_newest(const char *dir, const gpt_config *expect, const char *job,
                     ckpt_meta *meta, float *params, float *adam_m, float *adam_v,
                     char *used, size_t used_cap, cirrus_error *skipped, cirrus_error *err);

#endif
