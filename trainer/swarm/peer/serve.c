/* serve: a stage peer's answers, one handler per request type in a table (the moving
 * and stage-switching checks come first, in peer_serve). Each runs under the peer's lock
 * and fills the reply; a nonzero return is a refusal (CIRRUS_ECORRUPT: a malformed request,
 * which also drops the connection) with *why saying what went wrong. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../../../common/clock.h"
#include "peer_internal.h"

/* A FORWARD or BACKWARD into the peer's buffers (the gradient of the output into p->grad);
 * returns 0 or CIRRUS_ECORRUPT. */
static int parse_microbatch(peer *p, uint16_t type, wire_reader *r, gpt_stage_input *in,
                            int *keep, int *codec)
{
    const stage_peer_options *o = p->opt;
    const stage_mb_dest d = {.max_B = (uint32_t)o->max_B, .max_T = (uint32_t)o->max_T,
                             .C = p->C, .first = p->l0 == 0,
                             .last = p->l1 == o->model.n_layer, .tokens = p->tokens,
                             .targets = p->targets, .hidden = p->in, .grad_out = p->grad};
    stage_microbatch m;
    if (stage_msg_get_microbatch(r, type, &d, &m)) return CIRRUS_ECORRUPT;
    *in = (gpt_stage_input){.id = m.id, .B = (int)m.B, .T = (int)m.T,
                            .tokens = m.tokens ? p->tokens : NULL,
                            .hidden = m.hidden ? p->in : NULL,
                            .targets = m.targets ? p->targets : NULL};
    *keep = m.keep;
    *codec = m.codec;
    return 0;
}

/* The slot for microbatch `id`: the one holding it, else the least recently used. *hit
 * says whether it holds the activations. */
static gpt_stage *slot_for(peer *p, uint64_t id, int *hit)
{
    int best = 0;
    for (int i = 0; i < p->n_slots; i++) {
        if (id && p->slot[i].id == id) {
            best = i;
            break;
        }
        if (p->slot[i].used < p->slot[best].used) best = i;
    }
    act_slot *s = &p->slot[best];
    *hit = id && s->id == id;
    s->id = id;
    s->used = ++p->uses;
    return s->stage;
}

/* When a forward or backward started: wall time, and this thread's CPU time. */
typedef struct work_clock {
    double wall; /* clock_now_s() */
    struct timespec cpu;
} work_clock;

static void work_start(work_clock *w)
{
    w->wall = clock_now_s();
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &w->cpu);
}

static double seconds_since(clockid_t clock, const struct timespec *t0)
{
    struct timespec t1;
    clock_gettime(clock, &t1);
    return (t1.tv_sec - t0->tv_sec) + (t1.tv_nsec - t0->tv_nsec) * 1e-9;
}

static double wall_since(const work_clock *w)
{
    return clock_now_s() - w->wall;
}

/* A peer started with --slowdown F stands for slower hardware: having computed for a
 * while, it stays busy (the lock held, as a busy device) for (F - 1) x as long. "A while"
 * is the compute's wall time, or with slowdown_cpu its CPU time (this thread's: compute
 * runs on the calling thread, one OpenMP thread in local regions), which other processes
 * competing for the cores do not stretch. */
static void slow_down(const peer *p, const work_clock *t0)
{
    const double seconds = p->opt->slowdown_cpu
                               ? seconds_since(CLOCK_THREAD_CPUTIME_ID, &t0->cpu)
                               : wall_since(t0);
    const double extra = (p->opt->slowdown - 1.0) * seconds;
    if (!(extra > 0)) return;
    struct timespec ts = {(time_t)extra, (long)((extra - (double)(time_t)extra) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* A forward or backward of B samples begun at t0 is done: the --slowdown sleep, then its
 * busy time and samples go to the capacity the heartbeats report. */
static void work_done(peer *p, const work_clock *t0, int B, double *busy_s, uint64_t *n)
{
    slow_down(p, t0);
    *busy_s += wall_since(t0);
    *n += (uint64_t)B;
}

/* ---- the handlers ---- */

typedef int (*handler)(peer *p, const wire_header *h, wire_reader *r, wire_writer *reply,
                       const char **why);

static int is_first(const peer *p)
{
    return p->l0 == 0;
}

static int is_last(const peer *p)
{
    return p->l1 == p->opt->model.n_layer;
}

static int on_forward(peer *p, const wire_header *h, wire_reader *r, wire_writer *reply,
                      const char **why)
{
    (void)h;
    gpt_stage_input in;
    int keep, codec, rc;
    if (parse_microbatch(p, STAGE_FORWARD, r, &in, &keep, &codec)) return CIRRUS_ECORRUPT;
    const int last = is_last(p);
    float loss = 0.0f;
    *why = "forward failed";
    work_clock t0;
    work_start(&t0);
    int hit;
    gpt_stage *st = slot_for(p, keep ? in.id : 0, &hit);
    if ((rc = gpt_stage_forward(st, &in, p->out, &loss, keep))) return rc;
    work_done(p, &t0, in.B, &p->fwd_busy_s, &p->fwd_n);
    p->samples += (uint64_t)in.B;
    if (last && in.targets)
        stage_msg_put_loss(reply, loss);
    else
        stage_msg_put_acts(reply, p->out, (size_t)in.B * in.T * (last ? p->V : p->C),
                           last ? STAGE_CODEC_NONE : codec);
    return 0;
}

static int on_backward(peer *p, const wire_header *h, wire_reader *r, wire_writer *reply,
                       const char **why)
{
    (void)h;
    gpt_stage_input in;
    int keep, codec, rc;
    if (parse_microbatch(p, STAGE_BACKWARD, r, &in, &keep, &codec)) return CIRRUS_ECORRUPT;
    const size_t n = (size_t)in.B * in.T * p->C;
    *why = "backward failed";
    peer_unsum_gradients(p); /* a backward re-run for a lost peer after a round */
    work_clock t0;
    work_start(&t0);
    int hit;
    gpt_stage *st = slot_for(p, in.id, &hit);
    p->backwards++;
    p->recomputed += !hit;
    if ((rc = gpt_stage_backward(st, &in, p->grad, p->out))) return rc;
    work_done(p, &t0, in.B, &p->bwd_busy_s, &p->bwd_n);
    p->mb_since_step++;
    if (!is_first(p)) stage_msg_put_acts(reply, p->out, n, codec);
    return 0;
}

static int on_average(peer *p, const wire_header *h, wire_reader *r, wire_writer *reply,
                      const char **why)
{
    return peer_average(p, r, h->request_id, reply, why);
}

static int on_reset(peer *p, const wire_header *h, wire_reader *r, wire_writer *reply,
                    const char **why)
{
    (void)h, (void)reply, (void)why;
    if (stage_msg_get_empty(r)) return CIRRUS_ECORRUPT;
    peer_drop_gradients(p);
    if (p->move_to >= 0) peer_start_move_locked(p); /* it holds no gradients now */
    return 0;
}

static int on_state_get(peer *p, const wire_header *h, wire_reader *r, wire_writer *reply,
                        const char **why)
{
    (void)h;
    int rc = peer_put_state(p, r, reply);
    *why = rc == CIRRUS_ENOMEM
               ? "out of memory for the STATE_GET reply"
               : "malformed STATE_GET: a slice outside the state, or over its size limit";
    return rc;
}

static int on_params_set(peer *p, const wire_header *h, wire_reader *r, wire_writer *reply,
                         const char **why)
{
    (void)h, (void)reply;
    *why = "malformed PARAMS_SET: a slice outside the parameters, or over its size limit";
    return peer_set_params(p, r, why);
}

static int on_state_set(peer *p, const wire_header *h, wire_reader *r, wire_writer *reply,
                        const char **why)
{
    (void)h, (void)reply;
    *why = "malformed STATE_SET: a slice outside the state, or over its size limit";
    return peer_set_state(p, r, why);
}

static int on_sync(peer *p, const wire_header *h, wire_reader *r, wire_writer *reply,
                   const char **why)
{
    (void)h, (void)reply;
    char donor[STAGE_ADDR_MAX];
    if (stage_msg_get_sync(r, donor)) return CIRRUS_ECORRUPT;
    int rc = peer_sync_from(p, donor, why);
    return rc && rc != CIRRUS_EMISMATCH ? CIRRUS_EIO : rc; /* the request was fine */
}

static int on_head_grad(peer *p, const wire_header *h, wire_reader *r, wire_writer *reply,
                        const char **why)
{
    (void)r;
    *why = "HEAD_GRAD sent to a stage without the LM head";
    if (!is_last(p) || h->payload_len) return CIRRUS_EINVAL;
    stage_msg_put_tied(reply, p->model.grad_head, p->V * p->C);
    return 0;
}

static int on_fold_tied(peer *p, const wire_header *h, wire_reader *r, wire_writer *reply,
                        const char **why)
{
    (void)h;
    const size_t VC = p->V * p->C;
    *why = "FOLD_TIED sent to a stage without the embedding";
    if (!is_first(p)) return CIRRUS_EINVAL;
    const float *head;
    *why = "malformed request";
    if (stage_msg_get_tied(r, VC, &head)) return CIRRUS_ECORRUPT;
    /* The same addition, in the same order, as gpt_fold_tied_grads(). */
    gpt_add_head_grad(&p->model, head);
    if (is_last(p)) memset(p->model.grad_head, 0, VC * sizeof(float)); /* folded */
    stage_msg_put_tied(reply, p->model.g.wte, VC);
    return 0;
}

static int on_set_tied(peer *p, const wire_header *h, wire_reader *r, wire_writer *reply,
                       const char **why)
{
    (void)h, (void)reply;
    const size_t VC = p->V * p->C;
    *why = "SET_TIED sent to a stage without the LM head";
    if (!is_last(p) || is_first(p)) return CIRRUS_EINVAL;
    const float *g;
    *why = "malformed request";
    if (stage_msg_get_tied(r, VC, &g)) return CIRRUS_ECORRUPT;
    memcpy(p->model.g.wte, g, VC * sizeof(float));
    memset(p->model.grad_head, 0, VC * sizeof(float)); /* folded into g.wte */
    return 0;
}

static int on_sumsq(peer *p, const wire_header *h, wire_reader *r, wire_writer *reply,
                    const char **why)
{
    (void)h;
    if (stage_msg_get_empty(r)) return CIRRUS_ECORRUPT;
    const size_t n_seg = (size_t)(p->adam.n_seg ? p->adam.n_seg : 1);
    double *sums = malloc(sizeof(double) * n_seg);
    stage_sumsq_part *parts = malloc(sizeof *parts * n_seg);
    *why = "out of memory";
    int rc = sums && parts ? 0 : CIRRUS_ENOMEM;
    if (!rc) {
        adamw_segment_sumsq(&p->adam, p->model.grads, 1.0f, sums);
        for (int s = 0; s < p->adam.n_seg; s++)
            parts[s] = (stage_sumsq_part){p->adam.seg[s].offset, sums[s]};
        stage_msg_put_sumsq(reply, parts, (uint32_t)p->adam.n_seg);
    }
    free(sums);
    free(parts);
    return rc;
}

static int on_step(peer *p, const wire_header *h, wire_reader *r, wire_writer *reply,
                   const char **why)
{
    (void)h, (void)reply, (void)why;
    stage_step st;
    if (stage_msg_get_step(r, &st)) return CIRRUS_ECORRUPT;
    adamw_step(&p->adam, p->model.params, p->model.grads, st.grad_scale, st.sumsq, st.lr,
               st.step);
    p->steps = st.step;
    p->mb_since_step = 0;
    p->summed = 0;
    /* Told to move: now, between steps, it leaves no gradients behind. */
    if (p->move_to >= 0) peer_start_move_locked(p);
    return 0;
}

static int on_info(peer *p, const wire_header *h, wire_reader *r, wire_writer *reply,
                   const char **why)
{
    (void)h, (void)why;
    if (stage_msg_get_empty(r)) return CIRRUS_ECORRUPT;
    const stage_peer_options *o = p->opt;
    const gpt_config *c = &o->model;
    stage_info info = {.l0 = (uint32_t)p->l0, .l1 = (uint32_t)p->l1,
                       .n_layer = (uint32_t)c->n_layer, .n_embd = (uint32_t)c->n_embd,
                       .n_head = (uint32_t)c->n_head, .seq_len = (uint32_t)c->seq_len,
                       .n_params = p->model.n_params, .steps = p->steps};
    snprintf(info.ring, sizeof info.ring, "%s", o->ring_addr ? o->ring_addr : "");
    stage_msg_put_info(reply, &info);
    return 0;
}

static const struct {
    uint16_t type;
    handler fn;
} handlers[] = {
    {STAGE_FORWARD, on_forward},     {STAGE_BACKWARD, on_backward},
    {STAGE_AVERAGE, on_average},     {STAGE_RESET, on_reset},
    {STAGE_STATE_GET, on_state_get}, {STAGE_PARAMS_SET, on_params_set},
    {STAGE_SYNC, on_sync},           {STAGE_HEAD_GRAD, on_head_grad},
    {STAGE_FOLD_TIED, on_fold_tied}, {STAGE_SET_TIED, on_set_tied},
    {STAGE_SUMSQ, on_sumsq},         {STAGE_STEP, on_step},
    {STAGE_INFO, on_info},           {STAGE_STATE_SET, on_state_set},
};

int peer_serve(peer *p, uint32_t gen, const wire_header *h, const uint8_t *payload,
               wire_writer *reply, const char **why)
{
    if (atomic_load(&p->moving) || gen != p->gen) {
        /* Refused, the connection kept: the client takes the peer out of the old stage
         * (without banning it) and sends the work elsewhere. */
        *why = atomic_load(&p->moving)
                   ? "this peer is moving to another stage (rebalancing)"
                   : "this peer moved to another stage (rebalancing); connect again";
        return STAGE_MOVED;
    }
    wire_reader r;
    wire_reader_init(&r, payload, h->payload_len);
    *why = "malformed request";
    for (size_t i = 0; i < sizeof handlers / sizeof handlers[0]; i++)
        if (handlers[i].type == h->type) return handlers[i].fn(p, h, &r, reply, why);
    *why = "unknown request type";
    return CIRRUS_ECORRUPT;
}
