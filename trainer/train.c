/* train: see train.h. */
#include "train.h"

#include <stdio.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../common/clock.h"
#include "../common/log.h"
#include "ckpt/checkpoint.h"
#include "data/loader.h"
#include "model/stage.h"
#include "optim/adamw.h"

void train_options_defaults(train_options *o)
{
    memset(o, 0, sizeof *o);
    gpt_config_preset(&o->model, "tiny", NULL);
    o->batch = 8;
    o->seq = 0; /* 0: the model's context */
    o->steps = 1000;
    o->lr = 3e-3f;
    o->warmup = -1;
    o->val_fraction = 0.05;
    o->seed = 1337;
    o->log_every = 10;
    o->eval_batches = 16;
}

/* Mean loss over the first n batches of the validation split. */
static float evaluate(const train_executor *ex, const data_corpus *corpus, int B, int T, int n,
                      uint64_t seed, int32_t *x, int32_t *y)
{
    data_loader *val = NULL;
    if (!ex->eval || data_loader_new(&val, corpus, DATA_VAL, B, T, 0, 1, seed, NULL))
        return -1.0f;
    uint64_t avail = data_loader_batches_per_epoch(val);
    if ((uint64_t)n > avail) n = (int)avail;
    double sum = 0.0;
    for (int i = 0; i < n; i++) {
        data_loader_next(val, x, y);
        float loss = 0.0f;
        /* A pipeline's evaluation fails over lost peers, and says why it could not. */
        cirrus_error err = {0};
        if (ex->eval(ex->ctx, B, T, x, y, &loss, &err)) {
            log_warn("validation: %s (no validation loss)", err.msg);
            sum = -1.0 * n;
            break;
        }
        sum += loss;
    }
    data_loader_free(val);
    return n > 0 ? (float)(sum / n) : -1.0f;
}

/* The in-process executor: one stage spanning the whole model. */
typedef struct local_exec {
    gpt_model *model;
    gpt_stage *stage;
    adamw *opt;
} local_exec;

static int local_step(void *vctx, uint64_t id, int B, int T, const int32_t *x,
                      const int32_t *y, float lr, uint64_t step, float *loss,
                      cirrus_error *err)
{
    local_exec *l = vctx;
    gpt_stage_input in = {.id = id, .B = B, .T = T, .tokens = x, .targets = y};
    int rc = gpt_stage_forward(l->stage, &in, NULL, loss, 1);
    if (!rc) rc = gpt_stage_backward(l->stage, &in, NULL, NULL);
    if (rc) return cirrus_fail(err, rc, "training step %llu failed", (unsigned long long)step);
    /* Gradients are zero on entry: calloc'd, then consumed by every adamw_step. */
    gpt_fold_tied_grads(l->model);
    double sumsq = adamw_total_sumsq(l->opt, l->model->grads, 1.0f);
    adamw_step(l->opt, l->model->params, l->model->grads, 1.0f, sumsq, lr, step);
    return 0;
}

static int local_eval(void *vctx, int B, int T, const int32_t *x, const int32_t *y,
                      float *loss, cirrus_error *err)
{
    local_exec *l = vctx;
    gpt_stage_input in = {.id = 0, .B = B, .T = T, .tokens = x, .targets = y};
    int rc = gpt_stage_forward(l->stage, &in, NULL, loss, 0);
    return rc ? cirrus_fail(err, rc, "evaluation failed") : 0;
}

static void format_eta(char *buf, size_t len, double s)
{
    if (s < 0) s = 0;
    int h = (int)(s / 3600), m = (int)(s / 60) % 60, sec = (int)s % 60;
    if (h)
        snprintf(buf, len, "%dh%02dm", h, m);
    else
        snprintf(buf, len, "%dm%02ds", m, sec);
}

/* Write the checkpoint of meta->step: from this process's model, or gathered from where
 * the executor keeps it (the stage peers), checked to be at the same step. */
static int save_checkpoint(const train_options *o, const train_executor *ex,
                           const gpt_model *model, const adamw *opt, const ckpt_meta *meta,
                           cirrus_error *err)
{
    if (!o->executor) return ckpt_save(o->ckpt_dir, meta, model->params, opt->m, opt->v, err);
    const size_t n = meta->span.count;
    float *buf = malloc(sizeof(float) * n * 3);
    if (!buf) return cirrus_fail(err, CIRRUS_ENOMEM, "cannot allocate a checkpoint's buffers");
    uint64_t steps = 0;
    int rc = ex->gather(ex->ctx, buf, buf + n, buf + 2 * n, &steps, err);
    if (!rc && steps != meta->step)
        rc = cirrus_fail(err, CIRRUS_EMISMATCH, "the peers have taken %llu steps, not %llu",
                         (unsigned long long)steps, (unsigned long long)meta->step);
    if (!rc) rc = ckpt_save(o->ckpt_dir, meta, buf, buf + n, buf + 2 * n, err);
    free(buf);
    return rc;
}

/* The newest complete checkpoint of o->ckpt_dir, refused unless it fits this run: the
 * model shape and job (ckpt_load_newest), the seed, and a step within --steps. */
static int load_checked(const train_options *o, ckpt_meta *meta, float *p, float *m, float *v,
                        char *used, size_t used_cap, cirrus_error *skipped, cirrus_error *err)
{
    int rc = ckpt_load_newest(o->ckpt_dir, &o->model, o->job, meta, p, m, v, used, used_cap,
                              skipped, err);
    if (!rc && meta->seed != o->seed)
        rc = cirrus_fail(err, CIRRUS_EMISMATCH, "checkpoint %s was trained with --seed %llu, "
                         "not %llu (the data order and the peers' initialisation follow it)",
                         used, (unsigned long long)meta->seed, (unsigned long long)o->seed);
    if (!rc && meta->step > (uint64_t)o->steps)
        rc = cirrus_fail(err, CIRRUS_EINVAL, "checkpoint %s is at step %llu, past --steps %d",
                         used, (unsigned long long)meta->step, o->steps);
    return rc;
}

int train_resume_check(const train_options *o, cirrus_error *err)
{
    if (!o->resume || !o->ckpt_dir) return 0;
    const size_t n = gpt_num_params(&o->model);
    float *buf = malloc(sizeof(float) * n * 3);
    if (!buf) return cirrus_fail(err, CIRRUS_ENOMEM, "cannot allocate a checkpoint's buffers");
    ckpt_meta meta;
    char used[4096];
    cirrus_error skipped;
    int rc = load_checked(o, &meta, buf, buf + n, buf + 2 * n, used, sizeof used, &skipped,
                          err);
    free(buf);
    return rc == CIRRUS_ENOENT ? 0 : rc;
}

/* Continue from the newest complete checkpoint of o->ckpt_dir (CIRRUS_ENOENT: there is
 * none): the parameters and AdamW moments (into this process's model, or installed on the
 * stage peers unless they are already at or past the checkpoint's step: a replaced client
 * whose peers trained on), the step counter, and so the learning rate's place in the
 * schedule, and the data loader's position. Flags that shape the schedule (--steps, --lr,
 * --warmup) are this run's: the operator starts every pod of a job with the same ones. */
static int resume(const train_options *o, const train_executor *ex, gpt_model *model,
                  adamw *opt, data_loader *train, uint64_t *step, int rollback,
                  cirrus_error *err)
{
    const size_t n = gpt_num_params(&o->model);
    float *buf = NULL;
    if (o->executor && !(buf = malloc(sizeof(float) * n * 3)))
        return cirrus_fail(err, CIRRUS_ENOMEM, "cannot allocate a checkpoint's buffers");
    float *p = buf ? buf : model->params, *m = buf ? buf + n : opt->m,
          *v = buf ? buf + 2 * n : opt->v;
    ckpt_meta meta;
    char used[4096];
    cirrus_error skipped;
    int rc = load_checked(o, &meta, p, m, v, used, sizeof used, &skipped, err);
    if (skipped.msg[0] && !o->quiet)
        log_warn("%s: refused; resuming from the previous checkpoint", skipped.msg);
    uint64_t at = 0;
    if (!rc && o->executor && ex->first_step) at = ex->first_step(ex->ctx);
    if (!rc && o->executor && !rollback && at >= meta.step && at > 0) {
        /* The peers trained past it (this client replaced one that wrote it): their state
         * is newer; train_run carries on from them. */
        if (!o->quiet)
            log_info("checkpoint %s is at step %llu, the stage peers at %llu: training goes "
                     "on from the peers", used, (unsigned long long)meta.step,
                     (unsigned long long)at);
        free(buf);
        return CIRRUS_ENOENT;
    }
    if (!rc && o->executor) rc = ex->install(ex->ctx, p, m, v, meta.step, err);
    if (!rc) rc = data_loader_seek(train, meta.data_pos, err);
    if (!rc) {
        *step = meta.step;
        if (!o->quiet)
            log_info("%s from step %llu (%s)", rollback ? "rolled back" : "resuming",
                     (unsigned long long)meta.step, used);
    }
    free(buf);
    return rc;
}

/* The data loader at the batch after `step`'s: read again from the start (the loader is
 * deterministic), for a model that lives elsewhere and is at `step`. */
static int loader_skip_to(data_loader *train, uint64_t step, int32_t *x, int32_t *y,
                          cirrus_error *err)
{
    int rc = data_loader_seek(train, (data_position){0, 0}, err);
    for (uint64_t i = 0; !rc && i < step; i++) data_loader_next(train, x, y);
    return rc;
}

/* No checkpoint to roll back to: the seed's model (zero moments) installed where the model
 * lives, and training from step 0. */
static int restart_from_seed(const train_options *o, const train_executor *ex,
                             data_loader *train, uint64_t *step, cirrus_error *err)
{
    const size_t n = gpt_num_params(&o->model);
    gpt_model m = {0};
    float *moments = calloc(2 * n, sizeof(float));
    int rc = moments ? gpt_model_init(&m, &o->model, err)
                     : cirrus_fail(err, CIRRUS_ENOMEM, "cannot allocate the seed's state");
    if (!rc) {
        gpt_model_seed(&m, o->seed);
        rc = ex->install(ex->ctx, m.params, moments, moments + n, 0, err);
    }
    if (!rc) rc = data_loader_seek(train, (data_position){0, 0}, err);
    if (!rc) {
        *step = 0;
        log_warn("no checkpoint written yet: training starts again from the seed");
    }
    gpt_model_free(&m);
    free(moments);
    return rc;
}

/* Step `*step + 1` failed (`failure`). If the executor can make the model's home whole again
 * (a stage lost every peer and replacements joined), the model is restored: by the
 * executor (the global parameters across regions), or rolled back to the newest checkpoint
 * in o->ckpt_dir, or to the seed when none is written yet. *step receives where training
 * goes on, and *reread whether the loader was moved (else the failed batch runs again).
 * Otherwise the failure stands. */
static int recover(const train_options *o, const train_executor *ex, data_loader *train,
                   uint64_t *step, int32_t *x, int32_t *y, int *reread,
                   const cirrus_error *failure, cirrus_error *err)
{
    int need_state = 0;
    cirrus_error why = *failure;
    *reread = 0;
    int rc = ex->recover ? ex->recover(ex->ctx, failure, &need_state, &why)
                         : (failure->code ? failure->code : CIRRUS_EIO);
    if (rc) {
        if (err) *err = why; /* err may be NULL (callers that only want the code) */
        return rc;
    }
    if (!need_state) {
        const uint64_t at = ex->first_step ? ex->first_step(ex->ctx) : *step;
        if (at == *step) return 0; /* the model is where it was: the step runs again */
        *reread = 1;
        *step = at;
        return loader_skip_to(train, at, x, y, err);
    }
    if (!o->ckpt_dir || !ex->install)
        return cirrus_fail(err, CIRRUS_ECLOSED, "%s; the lost stage's state cannot be restored "
                           "without checkpoints (--ckpt)", failure->msg);
    *reread = 1;
    rc = resume(o, ex, NULL, NULL, train, step, 1, err);
    return rc == CIRRUS_ENOENT ? restart_from_seed(o, ex, train, step, err) : rc;
}

int train_run(const train_options *o, train_result *res, cirrus_error *err)
{
    const int B = o->batch, T = o->seq > 0 ? o->seq : o->model.seq_len;
    int rc;
    data_corpus corpus = {0};
    gpt_model model = {0};
    gpt_stage *st = NULL;
    adamw opt = {0};
    data_loader *train = NULL;
    int32_t *x = NULL, *y = NULL;
    FILE *metrics = NULL;
    res->tokens = res->seconds = 0;
    res->loss = NAN; /* none until this run takes a step (a replaced client may take none) */

    if ((rc = gpt_config_validate(&o->model, err))) goto out;
    if (o->steps < 1) {
        rc = cirrus_fail(err, CIRRUS_EINVAL, "steps must be at least 1, got %d", o->steps);
        goto out;
    }
    if (B < 1 || T < 1 || T > o->model.seq_len) {
        rc = cirrus_fail(err, CIRRUS_EINVAL, "batch %d x seq %d invalid (seq must be in [1, %d])",
                         B, T, o->model.seq_len);
        goto out;
    }
    if (o->executor && o->resume && !o->executor->install) {
        rc = cirrus_fail(err, CIRRUS_EINVAL, "this executor cannot resume from a checkpoint");
        goto out;
    }
    if (o->job && strlen(o->job) > CKPT_JOB_MAX) {
        rc = cirrus_fail(err, CIRRUS_EINVAL, "job id '%s' is over %d bytes", o->job,
                         CKPT_JOB_MAX);
        goto out;
    }
    if (o->executor && o->ckpt_dir && !o->executor->gather) {
        rc = cirrus_fail(err, CIRRUS_EINVAL, "this executor cannot write checkpoints");
        goto out;
    }
    if ((rc = data_corpus_load(&corpus, o->data, o->val_fraction, err))) goto out;
    adamw_config ac = adamw_defaults(o->lr, o->steps);
    if (o->warmup >= 0) ac.warmup_steps = o->warmup > 0 ? o->warmup : 1;
    gpt_span all = {0, gpt_num_params(&o->model)};
    local_exec local = {&model, NULL, &opt};
    train_executor local_ex = {.ctx = &local, .step = local_step, .eval = local_eval};
    const train_executor *ex = o->executor ? o->executor : &local_ex;
    if (!o->executor) {
        if ((rc = gpt_model_init(&model, &o->model, err))) goto out;
        gpt_model_seed(&model, o->seed);
        if ((rc = gpt_stage_new(&st, &model, 0, o->model.n_layer, B, T, err))) goto out;
        local.stage = st;
        if ((rc = adamw_init(&opt, &o->model, &all, 1, &ac, err))) goto out;
    }
    if ((rc = data_loader_new(&train, &corpus, DATA_TRAIN, B, T, o->data_rank,
                                 o->data_world > 0 ? o->data_world : 1, o->seed, err)))
        goto out;
    x = malloc(sizeof(int32_t) * (size_t)B * T);
    y = malloc(sizeof(int32_t) * (size_t)B * T);
    if (!x || !y) {
        rc = cirrus_fail(err, CIRRUS_ENOMEM, "cannot allocate a batch");
        goto out;
    }

    uint64_t step = 0;
    int resumed = 0;
    if (o->resume && o->ckpt_dir &&
        (rc = resume(o, ex, &model, &opt, train, &step, 0, err)) != 0) {
        if (rc != CIRRUS_ENOENT) goto out;
        rc = 0; /* nothing to resume from: a new run */
    } else if (o->resume && o->ckpt_dir) {
        resumed = 1;
    }
    /* A model that lives elsewhere (stage peers) may have trained already: a client that
     * replaces a lost one carries on at the peers' step, with the data and learning rate of
     * that step, instead of starting the schedule again. The data position is found again
     * by reading that many batches from the start (the loader is deterministic). */
    uint64_t at = o->executor && ex->first_step ? ex->first_step(ex->ctx) : 0;
    if (at > step) {
        step = at < (uint64_t)o->steps ? at : (uint64_t)o->steps;
        if ((rc = loader_skip_to(train, step, x, y, err))) goto out;
        if (!o->quiet) log_info("the model has taken %llu steps: training goes on from there",
                                (unsigned long long)step);
    }

    if (o->metrics && !(metrics = fopen(o->metrics, resumed ? "a" : "w"))) {
        rc = cirrus_fail(err, CIRRUS_EIO, "cannot write metrics file %s", o->metrics);
        goto out;
    }

    double t0 = clock_now_s(), t_last = t0;
    uint64_t last_step = step;
    int ran = 0, joined_at_end = 0;
    for (; step < (uint64_t)o->steps; step++) {
        data_loader_next(train, x, y);
        float loss = 0.0f, lr = adamw_lr(&ac, step);
        for (;;) { /* a step whose stage lost every peer runs again once the model is whole */
            cirrus_error failure = {0};
            if (!ex->step(ex->ctx, step + 1, B, T, x, y, lr, step + 1, &loss, &failure)) break;
            int reread;
            if ((rc = recover(o, ex, train, &step, x, y, &reread, &failure, err))) goto out;
            if (step >= (uint64_t)o->steps) {
                joined_at_end = 1; /* the job's state is already past the last step */
                break;
            }
            if (reread) data_loader_next(train, x, y);
            lr = adamw_lr(&ac, step);
        }
        if (step >= (uint64_t)o->steps) {
            /* The region joined the job at its end: say where the model is, as the last
             * progress line would (its digest is the job's final one). */
            char where[512] = "";
            if (joined_at_end && !o->quiet && ex->describe)
                ex->describe(ex->ctx, o->json, where, sizeof where);
            if (joined_at_end && !o->quiet && o->json)
                printf("{\"step\":%d,\"joined_the_job_at_its_end\":true%s}\n", o->steps, where);
            else if (joined_at_end && !o->quiet)
                printf("step %6d/%d | the region took the job's final state%s\n", o->steps,
                       o->steps, where);
            fflush(stdout);
            break;
        }
        res->loss = loss;
        if (res->losses && step < (uint64_t)res->losses_cap) res->losses[step] = loss;
        res->tokens += (double)B * T;
        ran++;

        int last = step + 1 == (uint64_t)o->steps;
        float val = -1.0f; /* evaluated only every eval_every steps */
        if (o->eval_every > 0 && (step + 1) % (uint64_t)o->eval_every == 0 && !last)
            val = evaluate(ex, &corpus, B, T, o->eval_batches, o->seed, x, y);
        if (metrics) {
            fprintf(metrics, "{\"step\":%llu,\"loss\":%.9g,\"lr\":%.6g",
                    (unsigned long long)(step + 1), loss, lr);
            if (val >= 0) fprintf(metrics, ",\"val_loss\":%.6g", val);
            char where[512] = ""; /* where the model runs: stages, outer step, WAN bytes */
            if (ex->describe) ex->describe(ex->ctx, 1, where, sizeof where);
            fprintf(metrics, "%s}\n", where);
            fflush(metrics);
        }
        if (!o->quiet && ((step + 1) % (uint64_t)o->log_every == 0 || last || val >= 0)) {
            double t = clock_now_s();
            double tps = (double)(step + 1 - last_step) * B * T / (t - t_last + 1e-9);
            char where[512] = "";
            if (ex->describe) ex->describe(ex->ctx, o->json, where, sizeof where);
            if (o->json) {
                printf("{\"step\":%llu,\"loss\":%.9g,\"lr\":%.6g,\"tokens_per_s\":%.1f",
                       (unsigned long long)(step + 1), loss, lr, tps);
                if (val >= 0) printf(",\"val_loss\":%.6g", val);
                printf("%s}\n", where);
            } else {
                char eta[32], vbuf[32] = "";
                format_eta(eta, sizeof eta, (o->steps - step - 1) * B * T / (tps + 1e-9));
                if (val >= 0) snprintf(vbuf, sizeof vbuf, " | val %.4f", val);
                printf("step %6llu/%d | loss %.4f%s | lr %.2e | %7.0f tok/s | ETA %s%s\n",
                       (unsigned long long)(step + 1), o->steps, loss, vbuf, lr, tps, eta, where);
            }
            fflush(stdout);
            t_last = t;
            last_step = step + 1;
        }
        const int stopping = !last && o->stop && *o->stop;
        int ckpt_due = o->ckpt_dir && (last || stopping ||
                                       (o->ckpt_every > 0 &&
                                        (step + 1) % (uint64_t)o->ckpt_every == 0));
        if (ckpt_due) {
            ckpt_meta meta = {.cfg = o->model, .step = step + 1,
                              .data_pos = data_loader_tell(train), .rng_state = o->seed,
                              .seed = o->seed, .span = all};
            snprintf(meta.job, sizeof meta.job, "%s", o->job ? o->job : "");
            if ((rc = save_checkpoint(o, ex, &model, &opt, &meta, err))) goto out;
        }
        if (stopping) {
            if (!o->quiet)
                log_info("asked to stop: ending after step %llu%s", (unsigned long long)(step + 1),
                         o->ckpt_dir ? ", checkpoint written" : "");
            step++;
            break;
        }
        if (o->stop_after > 0 && ran >= o->stop_after) {
            step++;
            break;
        }
    }
    res->seconds = clock_now_s() - t0;
    res->step = step;
    res->val_loss = evaluate(ex, &corpus, B, T, o->eval_batches, o->seed, x, y);
    /* A validation loss below 0 is none (not evaluated here, or the evaluation failed). */
    char v6[32] = "null", v9[32] = "null", vt[32] = "none", l9[32] = "null", lt[32] = "none";
    if (isfinite(res->loss)) {
        snprintf(l9, sizeof l9, "%.9g", res->loss);
        snprintf(lt, sizeof lt, "%.4f", res->loss);
    }
    if (res->val_loss >= 0) {
        snprintf(v6, sizeof v6, "%.6g", res->val_loss);
        snprintf(v9, sizeof v9, "%.9g", res->val_loss);
        snprintf(vt, sizeof vt, "%.4f", res->val_loss);
    }
    if (metrics)
        fprintf(metrics, "{\"step\":%llu,\"final\":true,\"val_loss\":%s}\n",
                (unsigned long long)step, v6);
    if (!o->quiet) {
        char where[512] = "";
        if (o->json && ex->describe) ex->describe(ex->ctx, 1, where, sizeof where);
        if (o->json)
            printf("{\"step\":%llu,\"final\":true,\"loss\":%s,\"val_loss\":%s,"
                   "\"tokens\":%.0f,\"seconds\":%.3f%s}\n",
                   (unsigned long long)step, l9, v9, res->tokens, res->seconds, where);
        else
            printf("done: %llu steps, train loss %s, val loss %s, %.0f tokens in %.1fs\n",
                   (unsigned long long)step, lt, vt, res->tokens, res->seconds);
        fflush(stdout);
    }
    rc = 0;
out:
    if (metrics) fclose(metrics);
    free(x);
    free(y);
    data_loader_free(train);
    adamw_free(&opt);
    gpt_stage_free(st);
    gpt_model_free(&model);
    data_corpus_free(&corpus);
    return rc;
}
