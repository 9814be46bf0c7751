/* outer_client: see outer_client.h. */
#include "outer_client.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../../../common/clock.h"
#include "../../../common/failpoint.h"
#include "../../../common/log.h"
#include "../../gateway/fragments.h"
#include "../../gateway/outer_msg.h"
#include "../../gateway/schedule.h"
#include "../../gateway/sync_params.h"
#include "../../net/conn.h"
#include "../proto/rpc.h"

#define OUTER_CALL_MS 30000 /* one PUSH or PULL exchange */
#define OUTER_POLL_MS 20    /* between PULLs while the round runs */
/* pull's code for a round given up because the run ends (not an error of the run). */
#define OUTER_ABANDONED CIRRUS_ECLOSED
/* pull's code, asked not to wait, for a round not done yet. */
#define OUTER_NOT_YET CIRRUS_ENOENT

/* One fragment's outer steps (gateway/fragments.h): its floats, its rounds. */
typedef struct frag {
    int f;
    uint64_t lead;        /* it pushes this many inner steps before each multiple of every */
    sync_params sp;       /* its floats in the whole model: m of them */
    uint64_t m;
    /* Its floats when pushed and the global ones pulled (m). */
    float *pushed_sync, *global;
    int pending;          /* a round was pushed and is not applied yet */
    uint64_t pending_round, pushed_at;
    uint64_t pushed_step; /* the inner step of the parameters last pushed */
    uint64_t result_due;  /* the clock (step + lead) by which the pending round is needed */
    uint64_t tokens, outer_step, digest;
    /* For the push's compute_ms: when it last pushed, and oc->outer_s then. */
    double pushed_wall_s, outer_s_at_push;
    uint32_t compute_ms;
    outer_schedule sched; /* when the rounds after outer_step are pushed (schedule.h) */
    char name[48];        /* " (fragment f of P)" in logs; "" with one fragment */
} frag;

struct outer_client {
    pipeline *p;
    coord_client *cc;
    uint64_t n;    /* the model's parameters */
    int every, timeout_ms;
    int delay;     /* inner steps the region trains on while a round runs */
    /* Whole-model buffers (n) of which a fragment's floats are used at a time: as gathered
     * for a push, and as installed; scratch for one fragment's floats. */
    float *pushed, *now, *scratch;
    uint64_t final_step; /* the run's last inner step */
    const volatile sig_atomic_t *stop;
    uint64_t wan_bytes;
    int region, regions;  /* the region's index among the job's and their number (PULL_OK) */
    /* outer_client_begin held its install to the end of the first step (other clients). */
    int install_held;
    /* Seconds spent in outer_client_begin and _after_step so far (calls ended), and when
     * the call under way began: what is not the region's compute. */
    double outer_s, call_began_s;
    int n_frags;
    frag frag[OUTER_MAX_FRAGMENTS];
};

static int head_pull(outer_client *oc, outer_pull_ok *a, cirrus_error *err);

int outer_client_open(pipeline *p, coord_client *cc, const gpt_config *cfg, int every,
                      int delay, const char *sync_spec, uint64_t final_step, int timeout_ms,
                      const volatile sig_atomic_t *stop, outer_client **out, cirrus_error *err)
{
    *out = NULL;
    if (!cc) return cirrus_fail(err, CIRRUS_EINVAL, "outer steps need the region's gateway "
                                "(--coordinator)");
    if (delay < 0 || delay >= every)
        return cirrus_fail(err, CIRRUS_EINVAL, "--sync-delay %d must be below --sync-every %d",
                           delay, every);
    outer_client *oc = calloc(1, sizeof *oc);
    if (!oc) return cirrus_fail(err, CIRRUS_ENOMEM, "out of memory");
    *oc = (outer_client){.p = p, .cc = cc, .n = gpt_num_params(cfg), .every = every,
                         .delay = delay, .final_step = final_step, .timeout_ms = timeout_ms,
                         .stop = stop, .n_frags = 1};
    sync_params all = {0};
    outer_pull_ok a;
    /* The gateway says how many fragments it cuts the parameters into. */
    int rc = head_pull(oc, &a, err);
    if (!rc) {
        oc->n_frags = a.fragments;
        oc->region = a.region;
        oc->regions = a.regions;
    }
    if (!rc && every < oc->n_frags)
        rc = cirrus_fail(err, CIRRUS_EINVAL, "--sync-every %d is below the gateway's %d "
                         "fragments: each needs an inner step of its own", every, oc->n_frags);
    if (!rc) rc = sync_params_parse(sync_spec, cfg, &all, err);
    if (!rc && all.count < (size_t)oc->n_frags)
        rc = cirrus_fail(err, CIRRUS_EINVAL, "%d fragments of %zu synchronised parameters",
                         oc->n_frags, all.count);
    uint64_t widest = 0;
    for (int f = 0; f < oc->n_frags && !rc; f++) {
        frag *fr = &oc->frag[f];
        uint64_t lo, hi;
        outer_fragment_range(all.count, oc->n_frags, f, &lo, &hi);
        fr->f = f;
        fr->lead = outer_fragment_lead(every, oc->n_frags, f);
        if (oc->n_frags > 1)
            snprintf(fr->name, sizeof fr->name, " (fragment %d of %d)", f, oc->n_frags);
        rc = sync_params_slice(&all, lo, hi, &fr->sp, err);
        fr->m = fr->sp.count;
        widest = fr->m > widest ? fr->m : widest;
        if (!rc && (!(fr->pushed_sync = malloc(fr->m * sizeof(float))) ||
                    !(fr->global = malloc(fr->m * sizeof(float)))))
            rc = cirrus_fail(err, CIRRUS_ENOMEM, "out of memory for the parameters");
    }
    sync_params_free(&all);
    if (!rc) {
        oc->pushed = malloc(oc->n * sizeof(float));
        oc->now = malloc(oc->n * sizeof(float));
        oc->scratch = malloc(widest * sizeof(float));
        if (!oc->pushed || !oc->now || !oc->scratch)
            rc = cirrus_fail(err, CIRRUS_ENOMEM, "out of memory for the parameters");
    }
    if (rc) {
        outer_client_close(oc);
        return rc;
    }
    *out = oc;
    return 0;
}

void outer_client_close(outer_client *oc)
{
    if (!oc) return;
    for (int f = 0; f < oc->n_frags; f++) {
        sync_params_free(&oc->frag[f].sp);
        free(oc->frag[f].pushed_sync);
        free(oc->frag[f].global);
    }
    free(oc->pushed);
    free(oc->now);
    free(oc->scratch);
    free(oc);
}

/* One extension call, retried while the gateway is unreachable (restarting: a gateway pod
 * replaced) until the outer step's deadline or the run's end. */
static int gateway_call(outer_client *oc, uint16_t type, const wire_writer *w, int64_t deadline,
                        const uint8_t **reply, uint32_t *len, cirrus_error *err)
{
    for (int warned = 0;;) {
        int rc = coord_client_ext_call(oc->cc, type, w, OUTER_CALL_MS, reply, len, err);
        if (!rpc_is_fault(rc) || net_now_ms() > deadline || (oc->stop && *oc->stop)) return rc;
        if (!warned++) log_warn("outer: the gateway: %s; trying again", err->msg);
        usleep(200 * 1000);
    }
}

/* Fragment fr's floats as last gathered (pushed_sync), round `round`. */
static int send_push(outer_client *oc, frag *fr, uint64_t round, uint64_t step,
                     int64_t deadline, cirrus_error *err)
{
    int rc = 0;
    for (uint64_t off = 0; !rc && off < fr->m;) {
        const uint64_t count = fr->m - off < OUTER_SLICE ? fr->m - off : OUTER_SLICE;
        const outer_push q = {.fragment = (uint16_t)fr->f, .round = round, .inner_step = step,
                              .at = step + fr->lead, .tokens = fr->tokens,
                              .compute_ms = fr->compute_ms, .n_params = fr->m,
                              .offset = off, .count = count};
        wire_writer w;
        wire_writer_init(&w, 64 + count * sizeof(float));
        outer_msg_put_push(&w, &q, fr->pushed_sync + off);
        const uint8_t *reply;
        uint32_t len;
        rc = gateway_call(oc, OUTER_PUSH, &w, deadline, &reply, &len, err);
        wire_writer_free(&w);
        off += count;
    }
    return rc;
}

/* Fragment fr's floats of buf, gathered from the stages holding them, and installed. */
static int gather(outer_client *oc, frag *fr, float *buf, cirrus_error *err)
{
    return pipeline_gather_spans(oc->p, fr->sp.spans, fr->sp.n_spans, buf, err);
}

static int install(outer_client *oc, frag *fr, const float *buf, cirrus_error *err)
{
    return pipeline_set_spans(oc->p, fr->sp.spans, fr->sp.n_spans, buf, err);
}

static int push(outer_client *oc, frag *fr, uint64_t round, uint64_t step, cirrus_error *err)
{
    uint64_t hold; /* tests: the region held up (stopped) just before it pushes round K */
    if (round > 0 && failpoint_on("stop-before-push", &hold) && hold == round) raise(SIGSTOP);
    /* The region's compute since the fragment's last push: the time less the outer steps'
     * (ended calls', and this one's so far). */
    const double now = clock_now_s(), outer_s = oc->outer_s + (now - oc->call_began_s);
    double compute_s = now - fr->pushed_wall_s - (outer_s - fr->outer_s_at_push);
    if (compute_s < 0.001) compute_s = 0.001;
    fr->compute_ms = fr->pushed_wall_s > 0 && compute_s < 4e6 ? (uint32_t)(compute_s * 1e3) : 0;
    fr->pushed_wall_s = now;
    fr->outer_s_at_push = outer_s;
    int rc = gather(oc, fr, oc->pushed, err);
    if (rc) return rc;
    sync_params_pack(&fr->sp, oc->pushed, fr->pushed_sync);
    fr->pushed_step = step;
    return send_push(oc, fr, round, step, net_now_ms() + oc->timeout_ms, err);
}

/* PULL round's global parameters of fragment fr into fr->global once the gateway has them;
 * without wait, OUTER_NOT_YET at once when it has not. */
static int pull(outer_client *oc, frag *fr, uint64_t round, int wait, cirrus_error *err)
{
    const int64_t deadline = net_now_ms() + oc->timeout_ms;
    for (uint64_t off = 0; off < fr->m;) {
        const uint64_t count = fr->m - off < OUTER_SLICE ? fr->m - off : OUTER_SLICE;
        const outer_pull q = {(uint16_t)fr->f, round, off, count};
        wire_writer w;
        wire_writer_init(&w, 64);
        outer_msg_put_pull(&w, &q);
        const uint8_t *reply;
        uint32_t len;
        int rc = gateway_call(oc, OUTER_PULL, &w, deadline, &reply, &len, err);
        wire_writer_free(&w);
        if (rc) return rc;
        wire_reader r;
        wire_reader_init(&r, reply, len);
        outer_pull_ok a;
        if (outer_msg_get_pull_ok(&r, count, &a) || a.fragments != oc->n_frags)
            return cirrus_fail(err, CIRRUS_ECORRUPT, "malformed PULL reply from the gateway");
        oc->wan_bytes = a.wan_bytes;
        if (!a.ready && round > 0 && !a.pushed && a.done + 1 == round) {
            /* The gateway does not hold our push (it restarted and took the job's state
             * from another region): push the same parameters again. */
            log_warn("outer: the gateway lost this region's push of outer step %llu%s: "
                     "sending it again", (unsigned long long)round, fr->name);
            if ((rc = send_push(oc, fr, round, fr->pushed_step, deadline, err))) return rc;
            off = 0;
            continue;
        }
        if (!a.ready) {
            if (!wait && off == 0) return OUTER_NOT_YET;
            if (oc->stop && *oc->stop)
                return cirrus_fail(err, OUTER_ABANDONED, "outer step %llu abandoned: the run "
                                   "is ending", (unsigned long long)round);
            if (net_now_ms() > deadline)
                return cirrus_fail(err, CIRRUS_ETIMEDOUT, "outer step %llu not done by the "
                                   "gateway within %d ms", (unsigned long long)round,
                                   oc->timeout_ms);
            /* A wait longer than the coordinator's expiry (a slow WAN's round) must not
             * have this client forgotten there. */
            cirrus_error ignored = {0};
            (void)coord_client_keepalive(oc->cc, 1000, &ignored);
            usleep(OUTER_POLL_MS * 1000);
            off = 0; /* a round completing mid-pull: every slice from one state */
            continue;
        }
        if (off > 0 && a.done != fr->outer_step)
            return cirrus_fail(err, CIRRUS_EMISMATCH, "the gateway moved from outer step %llu "
                               "to %llu during a pull", (unsigned long long)fr->outer_step,
                               (unsigned long long)a.done);
        fr->outer_step = a.done;
        fr->digest = a.digest;
        fr->sched = a.sched;
        memcpy(fr->global + off, a.floats, count * sizeof(float));
        off += count;
    }
    return 0;
}

/* The head of a PULL (no floats): the region's place among the job's and the gateway's
 * fragments. */
static int head_pull(outer_client *oc, outer_pull_ok *a, cirrus_error *err)
{
    const outer_pull q = {0, 0, 0, 0};
    wire_writer w;
    wire_writer_init(&w, 64);
    outer_msg_put_pull(&w, &q);
    const uint8_t *reply;
    uint32_t len;
    int rc = gateway_call(oc, OUTER_PULL, &w, net_now_ms() + oc->timeout_ms, &reply, &len, err);
    wire_writer_free(&w);
    if (rc) return rc;
    wire_reader r;
    wire_reader_init(&r, reply, len);
    if (outer_msg_get_pull_ok(&r, 0, a))
        return cirrus_fail(err, CIRRUS_ECORRUPT, "malformed PULL reply from the gateway");
    return 0;
}

int outer_client_region(coord_client *cc, int timeout_ms, const volatile sig_atomic_t *stop,
                        int *region, int *regions, cirrus_error *err)
{
    if (!cc) return cirrus_fail(err, CIRRUS_EINVAL, "outer steps need the region's gateway "
                                "(--coordinator)");
    outer_client oc = {.cc = cc, .timeout_ms = timeout_ms, .stop = stop};
    outer_pull_ok a;
    int rc = head_pull(&oc, &a, err);
    if (!rc) *region = a.region, *regions = a.regions;
    return rc;
}

int outer_client_data_shard(outer_client *oc, int *rank, int *world, cirrus_error *err)
{
    (void)err; /* told by the gateway at outer_client_open */
    *rank = oc->region;
    *world = oc->regions;
    return 0;
}

/* Round 0 of fragment fr: the region's floats pushed (a gateway with no global state,
 * restarted or alone, adopts them) and the latest global ones pulled into fr->global, not
 * installed. */
static int fetch_latest(outer_client *oc, frag *fr, cirrus_error *err)
{
    int rc = push(oc, fr, 0, pipeline_steps_done(oc->p), err);
    if (!rc) rc = pull(oc, fr, 0, 1, err);
    fr->pending = 0;
    return rc;
}

/* The same, and the global parameters installed as the region's. */
static int take_latest(outer_client *oc, frag *fr, cirrus_error *err)
{
    int rc = fetch_latest(oc, fr, err);
    if (!rc) {
        sync_params_unpack(&fr->sp, fr->global, oc->now); /* the rest stays regional */
        rc = install(oc, fr, oc->now, err);
    }
    return rc;
}

int outer_client_begin(outer_client *oc, int hold_install, cirrus_error *err)
{
    const uint64_t step = pipeline_steps_done(oc->p);
    int rc = 0;
    oc->call_began_s = clock_now_s();
    for (int f = 0; f < oc->n_frags && !rc; f++)
        rc = hold_install ? fetch_latest(oc, &oc->frag[f], err)
                          : take_latest(oc, &oc->frag[f], err);
    oc->install_held = !rc && hold_install;
    uint64_t outer_step, wan_bytes, digest;
    outer_client_progress(oc, &outer_step, &wan_bytes, &digest);
    if (!rc)
        log_info("outer: region at inner step %llu takes the global parameters of outer step "
                 "%llu (digest %016llx)%s", (unsigned long long)step,
                 (unsigned long long)outer_step, (unsigned long long)digest,
                 hold_install ? " once its first step is taken (the other clients held)" : "");
    /* Inner steps already taken belong to rounds before this one: count from here. */
    oc->outer_s += clock_now_s() - oc->call_began_s;
    return rc;
}

/* Fragment fr's global parameters (fr->global) installed in place of the region's. Where
 * the region trained on since its floats were pushed (fr->pushed_sync, at step pushed_at),
 * the progress it made meanwhile is kept on top: theta = global + (theta_now -
 * theta_at_push), the delayed merge of one-step-delayed outer updates. Where the global
 * floats are the pushed ones (a round that changed nothing; every region of a new job
 * starting from one seed) that is theta_now: nothing is installed, and the region's floats
 * stand bit for bit (the sum would round them). */
static int install_global(outer_client *oc, frag *fr, uint64_t pushed_at, cirrus_error *err)
{
    int rc;
    if (memcmp(fr->global, fr->pushed_sync, fr->m * sizeof(float)) == 0) return 0;
    if (pipeline_steps_done(oc->p) != pushed_at) {
        if ((rc = gather(oc, fr, oc->now, err))) return rc;
        sync_params_pack(&fr->sp, oc->now, oc->scratch);
        for (uint64_t i = 0; i < fr->m; i++)
            oc->scratch[i] = fr->global[i] + (oc->scratch[i] - fr->pushed_sync[i]);
        sync_params_unpack(&fr->sp, oc->scratch, oc->now);
    } else {
        sync_params_unpack(&fr->sp, fr->global, oc->now); /* the rest stays regional */
    }
    return install(oc, fr, oc->now, err);
}

/* Fragment fr's round pushed at step `pushed_at` is applied: its global parameters replace
 * the region's (merged with what it trained since the push: install_global). Without wait,
 * a round not done yet is left pending (OUTER_NOT_YET). */
static int apply_round(outer_client *oc, frag *fr, int wait, cirrus_error *err)
{
    int rc = pull(oc, fr, fr->pending_round, wait, err);
    if (rc == OUTER_NOT_YET && !wait) return rc;
    if (rc == OUTER_ABANDONED && oc->stop && *oc->stop) {
        log_warn("%s", err->msg); /* the region ends with its own parameters */
        fr->pending = 0;
        return 0;
    }
    if (rc) return rc;
    if (pipeline_steps_done(oc->p) != fr->pushed_at)
        log_info("outer: outer step %llu merged at inner step %llu (pushed at %llu)%s",
                 (unsigned long long)fr->pending_round,
                 (unsigned long long)pipeline_steps_done(oc->p), (unsigned long long)fr->pushed_at,
                 fr->name);
    rc = install_global(oc, fr, fr->pushed_at, err);
    fr->pending = 0;
    return rc;
}

/* The install outer_client_begin held, after the first step: the global parameters go in
 * with the step's progress on top, as a late round's (install_global; where they were the
 * region's already, nothing changes and the step stands bit for bit). */
static int install_held_begin(outer_client *oc, cirrus_error *err)
{
    oc->install_held = 0;
    const uint64_t begun_at = pipeline_steps_done(oc->p) - 1;
    int rc = 0;
    for (int f = 0; f < oc->n_frags && !rc; f++)
        rc = install_global(oc, &oc->frag[f], begun_at, err);
    return rc;
}

/* Fragment fr after inner step `step` (see outer_client_after_step). */
static int frag_after_step(outer_client *oc, frag *fr, uint64_t step, cirrus_error *err)
{
    const uint64_t every = (uint64_t)oc->every, at = step + fr->lead; /* its own clock */
    int rc = 0;
    /* Overlap: from `delay` steps after the push on, the result is merged as soon as it is
     * in; the region waits for it only when the fragment's next outer step is due (its push
     * must start from the merged parameters) or the run ends. So a sync that takes longer
     * than `delay` steps, or a region that pushed later than this one, costs no waiting as
     * long as the round is done within the window. */
    if (fr->pending && (step >= fr->pushed_at + (uint64_t)oc->delay || step >= oc->final_step)) {
        const int due = at >= fr->result_due || step >= oc->final_step;
        rc = apply_round(oc, fr, due, err);
        if (rc == OUTER_NOT_YET && !due) rc = 0;
        if (rc) return rc;
    }
    /* The last step is an outer step too (every region ends at the same step): the run
     * ends with the global model whatever its length. */
    if ((!fr->pending && outer_schedule_push_due(&fr->sched, every, at)) ||
        step == oc->final_step) {
        /* The rounds are pushed where the global state's schedule says (k x every - lead
         * in every region while no link is too slow for every H steps; the last step's is
         * the one after), so the regions stay in step however one of them rejoined. */
        const uint64_t want = outer_schedule_round(&fr->sched, fr->outer_step, every, at);
        fr->result_due = outer_schedule_result_due(&fr->sched, every, at);
        const int64_t deadline = net_now_ms() + oc->timeout_ms;
        fr->pending_round = want;
        fr->pushed_at = step;
        fr->pending = 1;
        for (;;) {
            rc = push(oc, fr, want, step, err);
            if (rc == CIRRUS_ECONFLICT) {
                /* The gateway took a later global state from another region (this region
                 * was cut off, or its gateway restarted or repaired): the region takes it
                 * too, and joins this round if the job is not past it yet. */
                log_warn("outer: %s; the region takes the global parameters%s", err->msg,
                         fr->name);
                fr->tokens = 0;
                if ((rc = take_latest(oc, fr, err))) return rc;
                if (fr->outer_step >= want) return 0; /* the job is past it */
                fr->pending = 1;
                continue;
            }
            if (rc != CIRRUS_ENOENT || net_now_ms() > deadline || (oc->stop && *oc->stop))
                break;
            usleep(200 * 1000); /* the gateway is behind the job and catching up */
        }
        if (rc) return rc;
        fr->tokens = 0;
    }
    /* The last step waits for its round: the model the run ends with is the global one. */
    if (fr->pending && (oc->delay == 0 || step >= oc->final_step))
        rc = apply_round(oc, fr, 1, err);
    return rc;
}

int outer_client_after_step(outer_client *oc, uint64_t step, uint64_t tokens,
                            cirrus_error *err)
{
    oc->call_began_s = clock_now_s();
    int rc = oc->install_held ? install_held_begin(oc, err) : 0;
    for (int f = 0; f < oc->n_frags && !rc; f++) {
        oc->frag[f].tokens += tokens;
        rc = frag_after_step(oc, &oc->frag[f], step, err);
    }
    oc->outer_s += clock_now_s() - oc->call_began_s;
    return rc;
}

int outer_client_restore(outer_client *oc, cirrus_error *err)
{
    int rc = 0;
    oc->install_held = 0; /* the global parameters go in here */
    for (int f = 0; f < oc->n_frags && !rc; f++) {
        frag *fr = &oc->frag[f];
        rc = pull(oc, fr, fr->pending ? fr->pending_round : 0 /* the latest */, 1, err);
    }
    float *m = NULL, *v = NULL;
    if (!rc && (!(m = malloc(oc->n * sizeof(float))) || !(v = malloc(oc->n * sizeof(float)))))
        rc = cirrus_fail(err, CIRRUS_ENOMEM, "out of memory for the optimizer's state");
    if (!rc) rc = pipeline_gather_state_as_is(oc->p, oc->now, m, v, err);
    if (!rc) {
        for (int f = 0; f < oc->n_frags; f++)
            sync_params_unpack(&oc->frag[f].sp, oc->frag[f].global, oc->now);
        rc = pipeline_set_state(oc->p, oc->now, m, v, pipeline_steps_done(oc->p), err);
    }
    free(m);
    free(v);
    for (int f = 0; f < oc->n_frags; f++) oc->frag[f].pending = 0;
    uint64_t outer_step, wan_bytes, digest;
    outer_client_progress(oc, &outer_step, &wan_bytes, &digest);
    if (!rc)
        log_info("outer: the region is restored at inner step %llu from the global parameters "
                 "of outer step %llu (digest %016llx)",
                 (unsigned long long)pipeline_steps_done(oc->p), (unsigned long long)outer_step,
                 (unsigned long long)digest);
    return rc;
}

uint64_t outer_client_job_step(const outer_client *oc)
{
    /* The latest push step of any fragment's latest outer step. */
    uint64_t job = 0;
    for (int f = 0; f < oc->n_frags; f++) {
        const frag *fr = &oc->frag[f];
        const uint64_t at = fr->sched.at;
        const uint64_t step = at > fr->lead ? at - fr->lead : 0;
        job = step > job ? step : job;
    }
    return job < oc->final_step ? job : oc->final_step;
}

int outer_client_join_job(outer_client *oc, cirrus_error *err)
{
    const uint64_t from = pipeline_steps_done(oc->p), to = outer_client_job_step(oc);
    uint64_t steps;
    float *m = malloc(oc->n * sizeof(float)), *v = malloc(oc->n * sizeof(float));
    /* `pushed` is free between rounds (nothing is pending after the round that told us). */
    int rc = m && v ? pipeline_gather_state(oc->p, oc->pushed, m, v, &steps, err)
                    : cirrus_fail(err, CIRRUS_ENOMEM, "out of memory for the optimizer's state");
    if (!rc) rc = pipeline_set_state(oc->p, oc->pushed, m, v, to, err);
    free(m);
    free(v);
    for (int f = 0; f < oc->n_frags; f++) oc->frag[f].pending = 0;
    uint64_t outer_step, wan_bytes, digest;
    outer_client_progress(oc, &outer_step, &wan_bytes, &digest);
    if (!rc)
        log_info("outer: the job is at outer step %llu: the region joins it at inner step %llu "
                 "(it was at %llu)", (unsigned long long)outer_step, (unsigned long long)to,
                 (unsigned long long)from);
    return rc;
}

void outer_client_progress(const outer_client *oc, uint64_t *outer_step, uint64_t *wan_bytes,
                           uint64_t *digest)
{
    /* The latest outer step every fragment took part in, and one digest of them all. */
    uint64_t digests[OUTER_MAX_FRAGMENTS];
    *outer_step = UINT64_MAX;
    for (int f = 0; f < oc->n_frags; f++) {
        const frag *fr = &oc->frag[f];
        *outer_step = fr->outer_step < *outer_step ? fr->outer_step : *outer_step;
        digests[f] = fr->digest;
    }
    *wan_bytes = oc->wan_bytes;
    *digest = outer_fragments_digest(digests, oc->n_frags);
}
