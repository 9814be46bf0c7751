/* cli: see cli.h. */
#include "cli.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>

#include "../model/ops.h"

const char *cli_default_data(void)
{
    const char *env = getenv("CIRRUS_CORPUS");
    return env && *env ? env : "build/data/kjv.txt";
}

int cli_fail_input(const char *cmd, const cirrus_error *err)
{
    fprintf(stderr, "cirrus-trainer %s: %s\n", cmd, err->msg);
    return EXIT_BAD_INPUT;
}

int cli_select_backend(const char *name, cirrus_error *err)
{
    return ops_select(name, err);
}

int cli_model_from_flags(const model_flags *mf, gpt_config *cfg, cirrus_error *err)
{
    int rc = gpt_config_preset(cfg, mf->preset, err);
    if (rc) return rc;
    if (mf->layers) cfg->n_layer = mf->layers;
    if (mf->width) cfg->n_embd = mf->width;
    if (mf->heads) cfg->n_head = mf->heads;
    if (mf->context) cfg->seq_len = mf->context;
    return gpt_config_validate(cfg, err);
}

static volatile sig_atomic_t stop_signal;

static void on_stop_signal(int sig)
{
    (void)sig;
    stop_signal = 1;
}

const volatile sig_atomic_t *cli_stop_flag(void)
{
    return &stop_signal;
}

int cli_run_training(const char *cmd, const train_options *opts, train_result *out)
{
    /* SIGTERM (a preempted pod's notice, `kill`) or SIGINT ends the run after the step in
     * progress, with a checkpoint if there is a checkpoint directory. */
    train_options run = *opts;
    const train_options *o = &run;
    run.stop = &stop_signal;
    struct sigaction sa = {.sa_handler = on_stop_signal};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    if (!o->json)
        printf("cirrus: training %d layers x %d wide (%d heads, %zu params) on %s, "
               "%d steps of %d x %d tokens\n",
               o->model.n_layer, o->model.n_embd, o->model.n_head, gpt_num_params(&o->model),
               o->data, o->steps, o->batch, o->seq ? o->seq : o->model.seq_len);
    train_result res = {0};
    cirrus_error err = {0};
    int rc = train_run(o, &res, &err);
    /* Running out of memory or losing a peer is a runtime failure; anything else (flags,
     * files, checkpoints, a peer serving another model) is bad input. */
    if (rc && rc != CIRRUS_ENOMEM && rc != CIRRUS_ETIMEDOUT && rc != CIRRUS_ECLOSED)
        return cli_fail_input(cmd, &err);
    if (rc) {
        fprintf(stderr, "cirrus-trainer %s: %s\n", cmd, err.msg);
        return 1;
    }
    if (out) *out = res;
    return 0;
}
