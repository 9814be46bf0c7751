/* train: the single-process training loop (every stage in one process).
 *
 * Reads the corpus, builds the model from a seed (or resumes a checkpoint), runs AdamW
 * steps over batches from the loader, reports progress, evaluates on the validation split
 * and saves checkpoints. `cirrus-trainer train` is a thin flag parser around train_run();
 * tests call train_run() directly.
 */
#ifndef CIRRUS_TRAIN_H
#define CIRRUS_TRAIN_H

#include <signal.h>
#include <stdint.h>

#include "model/gpt.h"

/* Where the model lives. NULL in train_options means in this process; the pipeline client
 * supplies one that runs the stages on remote peers. */
typedef struct train_executor {
    void *ctx;
    /* Forward, backward and optimizer step of one batch. */
    int (*step)(void *ctx, uint64_t id, int B, int T, const int32_t *x, const int32_t *y,
                float lr, uint64_t step, float *loss, cirrus_error *err);
    /* Mean loss of one batch, nothing kept. NULL: this executor does not evaluate (a
     * follower of several clients: the leader evaluates the shared model), and the
     * validation loss is reported as none. */
    int (*eval)(void *ctx, int B, int T, const int32_t *x, const int32_t *y, float *loss,
                cirrus_error *err);
    /* The whole model's parameters and AdamW moments (gpt_num_params() floats each), for a
     * checkpoint; *steps: optimizer steps taken. NULL: this executor cannot checkpoint. */
    int (*gather)(void *ctx, float *params, float *adam_m, float *adam_v, uint64_t *steps,
                  cirrus_error *err);
    /* What a progress line adds about where the model runs: JSON members (",\"k\":v...")
     * when json, else text (" | ..."); NULL: nothing. */
    void (*describe)(void *ctx, int json, char *buf, size_t size);
    /* Optimizer steps the model has taken where it lives (0 for a new one); training
     * starts there. NULL: 0. */
    uint64_t (*first_step)(void *ctx);
    /* A checkpoint's whole state (as gather returns it) installed where the model lives,
     * which has then taken `steps` optimizer steps: a resume. NULL: this executor cannot
     * resume from a checkpoint. */
    int (*install)(void *ctx, const float *params, const float *adam_m, const float *adam_v,
                   uint64_t steps, cirrus_error *err);
    /* After a step failed (`failure`): make the model's home whole again if that can be
     * done. 0 when it is: the model is where first_step() says (*need_state 0: the executor
     * restored it itself), or its state is lost and must be installed (*need_state 1:
     * train_run rolls back to the newest checkpoint, or to the seed if none is written
     * yet). Nonzero (err) when it cannot: the run fails. NULL: a failed step fails the
     * run. */
    int (*recover)(void *ctx, const cirrus_error *failure, int *need_state, cirrus_error *err);
} train_executor;

typedef struct train_options {
    gpt_config model;
    int batch, seq;     /* B x T tokens per step */
    int steps;          /* total optimizer steps (a resumed run continues to this) */
    float lr;           /* peak learning rate */
    int warmup;         /* warmup steps; < 0 means 5% of steps */
    const char *data;   /* corpus path */
    double val_fraction;
    const char *ckpt_dir; /* NULL: no checkpoints */
    int ckpt_every;     /* steps between checkpoints (0: only at the end) */
    int resume;         /* continue from the newest complete checkpoint in ckpt_dir, if any */
    const char *job;    /* the job id checkpoints carry; a resume refuses another job's
                         * (NULL: "", and a resume accepts any job's) */
    uint64_t seed;
    int json;           /* one JSON object per line on stdout instead of human lines */
    int quiet;          /* no progress output (tests) */
    int log_every;      /* steps between progress lines */
    int eval_batches;   /* validation batches for val_loss */
    int eval_every;     /* steps between validation evaluations (0: only at the end) */
    const char *metrics; /* append one JSON line per step to this file (NULL: none) */
    int stop_after;     /* stop (as if killed) after this many steps of this run; 0: never */
    const train_executor *executor; /* NULL: the model lives in this process */
    /* This run reads shard data_rank of data_world of every global batch (the regions of a
     * job: disjoint data, together what one run with data_world x the batch would read);
     * 0 of 1 by default. Validation batches are the same for every shard. */
    int data_rank, data_world;
    /* Set (by a signal handler) to end training after the step in progress, writing a
     * checkpoint if ckpt_dir is set; NULL: never. The run then ends as a finished one. */
    const volatile sig_atomic_t *stop;
} train_options;

/* Sensible defaults for everything; the caller sets model, data and steps. */
void train_options_defaults(train_options *o);

typedef struct train_result {
    uint64_t step;       /* steps completed in total (including resumed ones) */
    float loss;          /* last training loss */
    float val_loss;      /* validation loss at the end */
    double tokens;       /* tokens trained on in this run */
    double seconds;      /* wall time of this run's steps */
    float *losses;       /* optional, caller-owned: losses[step] for each step run */
    int losses_cap;
} train_result;

int train_run(const train_options *o, train_result *res, cirrus_error *err);

/* Whether train_run could resume o (o->resume, o->ckpt_dir): 0 when there is nothing to
 * resume from or the newest complete checkpoint fits the run (shape, job, seed, step),
 * else train_run's error. For a role that would start processes first (`local`, `client`):
 * a checkpoint it cannot use is refused before anything runs. Reads the whole file. */
int train_resume_check(const train_options *o, cirrus_error *err);

#endif
