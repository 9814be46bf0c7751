/* cli: what every cirrus-trainer subcommand shares: exit codes, the model and training
 * flag tables, and running a training loop with the standard output. */
#ifndef CIRRUS_CLI_H
#define CIRRUS_CLI_H

#include "../../common/cerr.h"
#include "../../common/flags.h"
#include "../../common/role_args.h"
#include "../model/gpt.h"
#include "../train.h"

#define EXIT_BAD_INPUT 2

/* The corpus: $CIRRUS_CORPUS, else the one `make data` extracts. */
const char *cli_default_data(void);

/* Print "cirrus-trainer CMD: message" and return EXIT_BAD_INPUT. */
int cli_fail_input(const char *cmd, const cirrus_error *err);

/* Model shape flags: a preset, then optional overrides. */
typedef struct model_flags {
    const char *preset;
    int layers, width, heads, context;
} model_flags;

#define MODEL_FLAGS(mf)                                                                       \
    {ROLE_FLAG_MODEL, FLAG_STR, &(mf).preset, 0, 0, "model preset: tiny, small, medium", 0},  \
        {ROLE_FLAG_LAYERS, FLAG_INT, &(mf).layers, 1, 1024, "override the preset's layer count", 0}, \
        {ROLE_FLAG_WIDTH, FLAG_INT, &(mf).width, 1, 16384, "override the preset's width", 0}, \
        {ROLE_FLAG_HEADS, FLAG_INT, &(mf).heads, 1, 16384, "override the preset's head count", 0}, \
        {ROLE_FLAG_CONTEXT, FLAG_INT, &(mf).context, 1, 65536, "override the preset's context", 0}

int cli_model_from_flags(const model_flags *mf, gpt_config *cfg, cirrus_error *err);

/* Training-loop flags shared by train, client and local. */
#define TRAIN_FLAGS(o)                                                                        \
    {ROLE_FLAG_STEPS, FLAG_INT, &(o).steps, 1, 1e9, "optimizer steps (default 1000)", 0},     \
        {ROLE_FLAG_BATCH, FLAG_INT, &(o).batch, 1, 65536, "sequences per step (default 8)", 0}, \
        {ROLE_FLAG_SEQ, FLAG_INT, &(o).seq, 1, 65536, "tokens per sequence (default: the context)", \
         0},                                                                                  \
        {"lr", FLAG_FLOAT, &(o).lr, 1e-9, 10, "peak learning rate (default 3e-3)", 0},        \
        {"warmup", FLAG_INT, &(o).warmup, 0, 1e9, "warmup steps (default 5% of steps)", 0},   \
        {ROLE_FLAG_DATA, FLAG_STR, &(o).data, 0, 0, "training text file (default: the KJV corpus)", \
         0},                                                                                  \
        {ROLE_FLAG_SEED, FLAG_U64, &(o).seed, 0, 0, "random seed (default 1337)", 0},         \
        {"log-every", FLAG_INT, &(o).log_every, 1, 1e9, "steps between progress lines", 0},   \
        {"eval-every", FLAG_INT, &(o).eval_every, 1, 1e9, "steps between validation runs",   \
         0},                                                                                  \
        {"metrics", FLAG_STR, &(o).metrics, 0, 0, "append per-step JSON lines to this file", \
         0},                                                                                  \
        {"eval-batches", FLAG_INT, &(o).eval_batches, 1, 1e6, "validation batches", 0},       \
        {"json", FLAG_BOOL, &(o).json, 0, 0, "one JSON object per line on stdout", 0},        \
        {"stop-after", FLAG_INT, &(o).stop_after, 1, 1e9,                                     \
         "tests only: end after this many steps of this run, as if killed there (no "         \
         "checkpoint but --ckpt-every's)", 0}

/* Checkpoint flags shared by train, client and local. client and local resume from the
 * newest complete checkpoint in --ckpt whenever there is one; train only with --resume. */
#define CKPT_FLAGS(o)                                                                         \
    {ROLE_FLAG_CKPT, FLAG_STR, &(o).ckpt_dir, 0, 0,                                          \
     "checkpoint directory (client and local resume from the newest complete checkpoint in " \
     "it; train with --resume)", 0},                                                          \
        {ROLE_FLAG_CKPT_EVERY, FLAG_INT, &(o).ckpt_every, 1, 1e9,                                    \
         "steps between checkpoints (default: only at the end)", 0}

/* --backend: which kernels the model runs on (ops.h). Every command that computes with the
 * model in its own process has it: train, sample, stage. */
#define BACKEND_FLAG(name)                                                                    \
    {"backend", FLAG_STR, &(name), 0, 0,                                                     \
     "kernels: cpu (default) or cuda (a `make cuda` build on a machine with a GPU)", 0}

/* ops_select(name); on failure err holds the one-line reason (exit 2 then: the flag asked
 * for something this binary or machine cannot do). */
int cli_select_backend(const char *name, cirrus_error *err);

/* Print the banner, run train_run() and map its result to an exit code. SIGTERM or SIGINT
 * ends the run after the step in progress (with a checkpoint if o->ckpt_dir), exit 0.
 * out (may be NULL): the run's result, filled when it returns 0. */
int cli_run_training(const char *cmd, const train_options *o, train_result *out);
/* Set once SIGTERM or SIGINT asked cli_run_training's run to end (for what waits within a
 * step, e.g. an outer step across regions). */
const volatile sig_atomic_t *cli_stop_flag(void);

#endif
