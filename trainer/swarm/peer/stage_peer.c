/* stage_peer: see stage_peer.h. */
#include "stage_peer.h"

#include <errno.h>
#include <math.h>
#include <poll.h>
#include <stdio.h>
#include <time.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../../common/log.h"
#include "../../model/stage.h"
#include "../../net/ring.h"
#include "../../net/conn.h"
#include "../proto/coord_msg.h"
#include "../proto/rpc.h"
#include "../proto/stage_msg.h"

#define PEER_IO_TIMEOUT_MS 60000
#define PEER_REPLY_LIMIT (256u << 20)
#define PEER_MAX_MEMBERS STAGE_AVERAGE_MAX_MEMBERS /* peers of a stage in one AVERAGE */

/* One forward's activations, kept for its backward (a gpt_stage over the shared model). */
typedef struct act_slot {
    gpt_stage *stage;
    uint64_t id;   /* the microbatch whose activations it holds; 0: none */
    uint64_t used; /* when last used (the peer's request count): the oldest is reused */
} act_slot;

/* What serving layers [l0, l1) needs beyond the shared model: activation slots, the
 * optimizer state of the stage's parameters and the buffers gradients are packed into for
 * averaging. Built apart from the peer, so that a move to another stage is prepared
 * without touching the stage being served, and swapped in whole. */
typedef struct stage_kit {
    int l0, l1;
    gpt_stage *slot[STAGE_PEER_MAX_SLOTS];
    adamw adam;
    float *pack, *backup;
    size_t pack_count;
} stage_kit;

typedef struct peer {
    const stage_peer_options *opt;
    pthread_mutex_t mu; /* one request at a time: the model, stage and buffers below */
    gpt_model model;
    /* The stage served now: options give the first one; a move (rebalancing) changes it. */
    int l0, l1, stage;
    act_slot slot[STAGE_PEER_MAX_SLOTS];
    int n_slots;
    uint64_t uses;
    uint64_t backwards, recomputed; /* backwards served; of them, without kept activations */
    adamw adam;
    size_t N, C, V;
    int32_t *tokens, *targets; /* max_B * max_T */
    float *in, *out, *grad;    /* max_B * max_T * max(C, V) */
    size_t act_cap;
    collective *ring;          /* the stage's peers, built at the first AVERAGE */
    char ring_members[PEER_MAX_MEMBERS * STAGE_ADDR_MAX]; /* the list the ring was built for */
    /* An AVERAGE as parsed (under mu; per peer, as several peers may share a process: the
     * tests run them as threads). */
    stage_average avg;
    char avg_hosts[PEER_MAX_MEMBERS][STAGE_ADDR_MAX];
    char avg_members[PEER_MAX_MEMBERS * STAGE_ADDR_MAX];
    float *pack;               /* gradients packed for the all-reduce */
    float *backup;             /* the packed gradients from before the last round */
    size_t pack_count;
    uint64_t last_round;       /* the client's round number of the last AVERAGE seen */
    int summed;                /* the gradients are a stage-wide sum since the last STEP */
    uint32_t mb_since_step;    /* backwards accumulated since the last STEP */
    volatile sig_atomic_t *stop;
    int active;                /* connection threads alive (under mu) */
    /* counters for the coordinator's heartbeats (under mu) */
    uint64_t samples, steps;
    int stalled; /* --stall-average-at has happened */
    /* Capacity: samples and seconds of the peer's own compute (the --slowdown sleep
     * included), forwards and backwards apart; never reset (the heartbeat differences). */
    uint64_t fwd_n, bwd_n;
    double fwd_busy_s, bwd_busy_s;
    /* Rebalancing (under mu). A connection opened before the peer last left a stage
     * (conn generation < gen) speaks for that stage and is refused; `moving` is set while
     * the mover thread builds the new stage, when only it touches the model. */
    uint32_t gen;
    atomic_int moving;
    int move_to;               /* the stage the coordinator wants it at; -1: none */
    double move_asked_s;       /* when that instruction arrived (mono_s) */
    double retry_after_s;      /* a failed move is not tried again before this */
    int rates_reset;           /* moved: the heartbeat's capacity estimates start again */
    char name[COORD_NAME_MAX + 1]; /* its name at the coordinator, kept across moves */
} peer;

typedef struct conn_job {
    peer *p;
    net_conn *c;
} conn_job;

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

/* Pack (or unpack) every optimizer segment's gradient, and the LM head's share on the last
 * stage, into one buffer for one all-reduce. */
static void pack_gradients(peer *p, float *buf, int unpack)
{
    float *g = buf;
    for (int s = 0; s < p->adam.n_seg; s++) {
        float *t = p->model.grads + p->adam.seg[s].offset;
        size_t n = sizeof(float) * p->adam.seg[s].count;
        if (unpack)
            memcpy(t, g, n);
        else
            memcpy(g, t, n);
        g += p->adam.seg[s].count;
    }
    if (p->l1 == p->opt->model.n_layer) {
        if (unpack)
            memcpy(p->model.grad_head, g, sizeof(float) * p->V * p->C);
        else
            memcpy(g, p->model.grad_head, sizeof(float) * p->V * p->C);
    }
}

/* Undo a completed round: back to this peer's own gradients (kept in `backup`). Needed
 * before a round is repeated, and before a backward is re-run here on behalf of a lost
 * peer (its microbatch must land in one peer's own share, not in a sum). */
static void unsum_gradients(peer *p)
{
    if (!p->summed) return;
    pack_gradients(p, p->backup, 1);
    p->summed = 0;
}

/* AVERAGE: sum this stage's gradients over the members the client named. attempt (the
 * request id, shared by all members of one attempt) names the ring's handshake, so a
 * connection left over from a failed attempt can never join the next one. */
static int average_gradients(peer *p, wire_reader *r, uint64_t attempt, wire_writer *reply,
                             const char **why)
{
    const stage_peer_options *o = p->opt;
    stage_average *a = &p->avg;
    char(*addrs)[STAGE_ADDR_MAX] = a->addrs, (*hosts)[STAGE_ADDR_MAX] = p->avg_hosts;
    char *members = p->avg_members;
    const char *host_ptr[PEER_MAX_MEMBERS];
    int ports[PEER_MAX_MEMBERS];
    members[0] = '\0';
    *why = "malformed AVERAGE";
    /* ring_ms: how long the ring may go without progress before it gives up (the client
     * learns it from the rounds it has seen). */
    if (stage_msg_get_average(r, a)) return CIRRUS_ECORRUPT;
    const uint64_t round = a->round;
    const uint32_t n = a->n, ring_ms = a->ring_ms;
    int rank = -1;
    for (uint32_t i = 0; i < n; i++) {
        for (uint32_t j = 0; j < i; j++)
            if (strcmp(addrs[i], addrs[j]) == 0) { /* one rank each */
                *why = "AVERAGE lists one ring address twice (do two peers share a --ring-addr?)";
                return CIRRUS_ECORRUPT;
            }
        if (o->ring_addr && strcmp(addrs[i], o->ring_addr) == 0) rank = (int)i;
        strcat(members, addrs[i]); /* fits: n * STAGE_ADDR_MAX */
        strcat(members, ",");
    }
    *why = "AVERAGE names members without this peer, or an address that is not HOST:PORT";
    if (rank < 0 && n > 1) return CIRRUS_EINVAL;
    for (uint32_t i = 0; n > 1 && i < n; i++) {
        if (net_split_hostport(addrs[i], hosts[i], sizeof hosts[i], &ports[i], 0, NULL))
            return CIRRUS_EINVAL;
        host_ptr[i] = hosts[i];
    }
    stage_msg_put_average_ok(reply, p->mb_since_step);
    /* A repeated round (a member failed): start again from this peer's own gradients, and
     * build a new ring, as every member of the repeat does. */
    unsum_gradients(p);
    if (round == p->last_round && p->ring) {
        collective_destroy(p->ring);
        p->ring = NULL;
    }
    p->last_round = round;
    if (n == 1) return 0; /* a lone member's gradients are the sum */
    pack_gradients(p, p->pack, 0);
    memcpy(p->backup, p->pack, sizeof(float) * p->pack_count);
    if (p->ring && strcmp(members, p->ring_members) != 0) {
        collective_destroy(p->ring);
        p->ring = NULL;
    }
    cirrus_error err = {0};
    *why = "gradient averaging failed";
    if (!p->ring) {
        char ring_job[WIRE_JOB_ID_MAX + 1];
        snprintf(ring_job, sizeof ring_job, "%.30s#%llu", o->job_id,
                 (unsigned long long)attempt);
        ring_options ro = {.job_id = ring_job, .timeout_ms = (int)ring_ms,
                           .chunk_bytes = 1 << 20};
        int rc = ring_create(&p->ring, rank, (int)n, o->ring_listen_fd, host_ptr, ports, &ro,
                             &err);
        if (rc) {
            log_warn("averaging: %s", err.msg);
            return CIRRUS_EIO; /* the request was fine; the ring was not */
        }
        snprintf(p->ring_members, sizeof p->ring_members, "%s", members);
    }
    if (o->stall_at > 0 && p->steps + 1 == (uint64_t)o->stall_at && !p->stalled) {
        p->stalled = 1;
        log_warn("averaging: stalling %.1f s in step %d (--stall-average-at)", o->stall_s,
                 o->stall_at);
        usleep((useconds_t)(o->stall_s * 1e6));
    }
    ring_set_timeout(p->ring, (int)ring_ms);
    int rc = collective_allreduce_sum(p->ring, p->pack, p->pack_count, &err);
    if (rc) {
        /* A member left: drop the ring (the gradients are untouched); the client repeats
         * the round with the survivors. */
        log_warn("averaging: %s", err.msg);
        collective_destroy(p->ring);
        p->ring = NULL;
        return CIRRUS_EIO;
    }
    pack_gradients(p, p->pack, 1);
    p->summed = 1;
    return 0;
}

/* Floats [off, off + count) of this peer's state (proto/stage_msg.h: its optimizer segments'
 * parameters, then AdamW m, then v), appended to w. */
static void put_state_range(peer *p, wire_writer *w, uint64_t off, uint64_t count)
{
    const uint64_t n = p->adam.state_count;
    uint64_t at = 0; /* where the current piece starts in the 3n floats */
    for (int s = 0; s < p->adam.n_seg + 2 && count > 0; s++) {
        const float *src = s < p->adam.n_seg ? p->model.params + p->adam.seg[s].offset
                           : s == p->adam.n_seg ? p->adam.m
                                                : p->adam.v;
        const uint64_t len = s < p->adam.n_seg ? p->adam.seg[s].count : n;
        if (off < at + len) {
            const uint64_t from = off - at, take = len - from < count ? len - from : count;
            stage_msg_put_state_floats(w, src + from, take);
            off += take;
            count -= take;
        }
        at += len;
    }
}

/* STATE_GET: this peer's parameters and optimizer state, for a peer joining the stage:
 * all of it, or the slice the request names (checked against the state's size). */
static int put_state(peer *p, wire_reader *r, wire_writer *w)
{
    stage_state_get q;
    if (stage_msg_get_state_get(r, 3 * (uint64_t)p->adam.state_count, &q))
        return CIRRUS_ECORRUPT;
    stage_msg_put_state_head(w, p->steps, p->adam.state_count);
    put_state_range(p, w, q.offset, q.count);
    return 0;
}

/* PARAMS_SET: the global parameters of an outer step (or a slice of them) replace this
 * peer's, between two steps; the optimizer state stays. */
static int set_params(peer *p, wire_reader *r, const char **why)
{
    stage_params_set q;
    if (stage_msg_get_params_set(r, p->adam.state_count, &q)) return CIRRUS_ECORRUPT;
    if (q.steps != p->steps || p->mb_since_step || p->summed) {
        *why = "PARAMS_SET refused: the peer is not between the steps the client names";
        return CIRRUS_EMISMATCH;
    }
    uint64_t off = q.offset, count = q.count, at = 0;
    const uint8_t *src = q.floats;
    for (int s = 0; s < p->adam.n_seg && count > 0; s++) {
        const uint64_t len = p->adam.seg[s].count;
        if (off < at + len) {
            const uint64_t from = off - at, take = len - from < count ? len - from : count;
            memcpy(p->model.params + p->adam.seg[s].offset + from, src, take * sizeof(float));
            src += take * sizeof(float);
            off += take;
            count -= take;
        }
        at += len;
    }
    return 0;
}

/* A connection to the donor at host:port, checked (INFO) to serve layers [l0, l1) of this
 * peer's model: a donor that moved to another stage since it was named must not hand over
 * that stage's state, even one of the same size. */
static int donor_open(peer *p, const char *host, int port, int l0, int l1, net_conn **out,
                      const char **why, cirrus_error *err)
{
    const gpt_config *cfg = &p->opt->model;
    net_conn *c = NULL;
    wire_writer w;
    wire_reader r;
    stage_info in;
    *out = NULL;
    *why = "cannot reach the donor peer";
    wire_writer_init(&w, 0);
    int rc = net_connect(host, port, 10000, &c, err);
    if (!rc) rc = net_hello_client(c, p->opt->job_id, STAGE_ROLE_SYNC, 0, 10000, err);
    if (!rc) {
        net_set_max_payload(c, PEER_REPLY_LIMIT);
        rc = rpc_call(c, STAGE_INFO, 1, &w, 10000, "the donor", &r, err);
    }
    if (rc && rpc_is_fault(rc)) goto out;
    *why = "the donor does not serve the expected layers of this model";
    /* A donor that refuses INFO cannot be asked for its state either. */
    if (rc) {
        rc = cirrus_fail(err, CIRRUS_EMISMATCH, "%s", err->msg);
        goto out;
    }
    if (stage_msg_get_info(&r, &in) || (int)in.l0 != l0 || (int)in.l1 != l1 ||
        (int)in.n_layer != cfg->n_layer || (int)in.n_embd != cfg->n_embd ||
        (int)in.n_head != cfg->n_head || (int)in.seq_len != cfg->seq_len) {
        rc = cirrus_fail(err, CIRRUS_EMISMATCH, "donor %s:%d serves layers [%u, %u) of %u, "
                         "not [%d, %d) of %d", host, port, in.l0, in.l1, in.n_layer, l0, l1,
                         cfg->n_layer);
        goto out;
    }
    *out = c;
    c = NULL;
out:
    wire_writer_free(&w);
    if (c) net_close(c);
    return rc;
}

/* Fetching a donor's state into this peer: the donor's connection, and where its floats
 * go (the segments of `adam` in this peer's model, then adam's m and v). */
typedef struct state_taker {
    peer *p;
    net_conn *c;
    adamw *adam;
    uint64_t next_id;
} state_taker;

static int donor_call(void *ctx, const wire_writer *req, wire_reader *reply, cirrus_error *err)
{
    state_taker *t = ctx;
    if (req->failed) return cirrus_fail(err, CIRRUS_ENOMEM, "out of memory");
    int rc = rpc_call(t->c, STAGE_STATE_GET, ++t->next_id, req, 60000, "the donor", reply, err);
    /* Whatever its reason, a donor that refuses has no state for this peer. */
    if (rc && !rpc_is_fault(rc)) rc = cirrus_fail(err, CIRRUS_EMISMATCH, "%s", err->msg);
    return rc;
}

static void take_floats(void *ctx, uint64_t off, const uint8_t *floats, uint64_t count)
{
    state_taker *t = ctx;
    const adamw *adam = t->adam;
    const uint64_t n = adam->state_count;
    uint64_t at = 0;
    for (int s = 0; s < adam->n_seg + 2 && count > 0; s++) {
        float *dst = s < adam->n_seg ? t->p->model.params + adam->seg[s].offset
                     : s == adam->n_seg ? adam->m
                                        : adam->v;
        const uint64_t len = s < adam->n_seg ? adam->seg[s].count : n;
        if (off < at + len) {
            const uint64_t from = off - at, take = len - from < count ? len - from : count;
            memcpy(dst + from, floats, sizeof(float) * take);
            floats += sizeof(float) * take;
            off += take;
            count -= take;
        }
        at += len;
    }
}

/* STATE_GET from the donor on c, slice by slice: its step, and the parameters and AdamW
 * moments of the segments of `adam`, copied into this peer's model and into `adam`. On
 * failure part of them may have been copied: the caller treats the state as unknown. */
static int take_state(peer *p, net_conn *c, adamw *adam, uint64_t *steps, const char **why,
                      cirrus_error *err)
{
    *why = "cannot fetch the donor's state";
    state_taker t = {p, c, adam, 1};
    int rc = stage_fetch_state(donor_call, take_floats, &t, adam->state_count, steps, err);
    if (rc == CIRRUS_EMISMATCH) *why = "the donor's state does not fit this peer";
    return rc;
}

/* The gradients of an unfinished step are dropped (a new state, a new stage). */
static void drop_gradients(peer *p)
{
    memset(p->model.grads, 0, sizeof(float) * p->model.n_params);
    memset(p->model.grad_head, 0, sizeof(float) * p->V * p->C);
    p->mb_since_step = 0;
    p->summed = 0;
}

/* SYNC: fetch a live peer's state and make it ours. Nothing changes unless all of it
 * arrived and has the size of this peer's segments. */
static int sync_from(peer *p, const char *donor, const char **why)
{
    char host[STAGE_ADDR_MAX];
    int port, rc;
    net_conn *c = NULL;
    cirrus_error err = {0};
    uint64_t steps = 0;
    *why = "cannot reach the donor peer";
    if ((rc = net_split_hostport(donor, host, sizeof host, &port, 0, &err)) ||
        (rc = donor_open(p, host, port, p->l0, p->l1, &c, why, &err)))
        goto out;
    if ((rc = take_state(p, c, &p->adam, &steps, why, &err))) {
        /* Part of the state may be the donor's now: at no step is it anyone's, until a
         * copy succeeds (a client admits a peer without a copy only at the stage's step). */
        p->steps = STAGE_STEPS_UNKNOWN;
        drop_gradients(p);
        goto out;
    }
    p->steps = steps;
    drop_gradients(p);
    log_info("joined the stage with the state of %s at step %llu", donor,
             (unsigned long long)steps);
out:
    if (rc && err.msg[0]) log_warn("sync from %s: %s", donor, err.msg);
    net_close(c);
    return rc;
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
    struct timespec wall, cpu;
} work_clock;

static void work_start(work_clock *w)
{
    clock_gettime(CLOCK_MONOTONIC, &w->wall);
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
    return seconds_since(CLOCK_MONOTONIC, &w->wall);
}

/* A peer started with --slowdown F stands for slower hardware: having computed for a
 * while, it stays busy (the lock held, as a busy device) for (F - 1) x as long. "A while"
 * is the compute's wall time, or with slowdown_cpu its CPU time (this thread's: compute
 * runs on the calling thread, one OpenMP thread in local regions), which other processes
 * competing for the cores do not stretch. */
static void slow_down(const peer *p, const work_clock *t0)
{
    const double seconds = p->opt->slowdown_cpu ? seconds_since(CLOCK_THREAD_CPUTIME_ID, &t0->cpu)
                                                : wall_since(t0);
    const double extra = (p->opt->slowdown - 1.0) * seconds;
    if (!(extra > 0)) return;
    struct timespec ts = {(time_t)extra, (long)((extra - (double)(time_t)extra) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static void start_move_locked(peer *p);

/* Serve one request under the lock; fills the reply. Returns 0, or a status code after
 * which the connection is dropped (with *why set). `gen` is the connection's generation:
 * one opened before this peer last left a stage speaks for that stage. */
static int serve(peer *p, uint32_t gen, const wire_header *h, const uint8_t *payload,
                 wire_writer *reply, const char **why)
{
    const stage_peer_options *o = p->opt;
    const int first = p->l0 == 0, last = p->l1 == o->model.n_layer;
    if (atomic_load(&p->moving) || gen != p->gen) {
        /* Refused, the connection kept: the client takes the peer out of the old stage
         * (without banning it) and sends the work elsewhere. */
        *why = atomic_load(&p->moving)
                   ? "this peer is moving to another stage (rebalancing)"
                   : "this peer moved to another stage (rebalancing); connect again";
        return STAGE_MOVED;
    }
    const size_t VC = p->V * p->C;
    wire_reader r;
    wire_reader_init(&r, payload, h->payload_len);
    gpt_stage_input in = {0};
    int keep, codec, rc;
    *why = "malformed request";
    switch (h->type) {
    case STAGE_FORWARD: {
        if (parse_microbatch(p, STAGE_FORWARD, &r, &in, &keep, &codec)) return CIRRUS_ECORRUPT;
        float loss = 0.0f;
        *why = "forward failed";
        work_clock t0;
        work_start(&t0);
        int hit;
        gpt_stage *st = slot_for(p, keep ? in.id : 0, &hit);
        if ((rc = gpt_stage_forward(st, &in, p->out, &loss, keep))) return rc;
        slow_down(p, &t0);
        p->fwd_busy_s += wall_since(&t0);
        p->fwd_n += (uint64_t)in.B;
        p->samples += (uint64_t)in.B;
        if (last && in.targets)
            stage_msg_put_loss(reply, loss);
        else
            stage_msg_put_acts(reply, p->out, (size_t)in.B * in.T * (last ? p->V : p->C),
                               last ? STAGE_CODEC_NONE : codec);
        return 0;
    }
    case STAGE_BACKWARD: {
        if (parse_microbatch(p, STAGE_BACKWARD, &r, &in, &keep, &codec)) return CIRRUS_ECORRUPT;
        const size_t n = (size_t)in.B * in.T * p->C;
        *why = "backward failed";
        unsum_gradients(p); /* a backward re-run for a lost peer after a round */
        work_clock t0;
        work_start(&t0);
        int hit;
        gpt_stage *st = slot_for(p, in.id, &hit);
        p->backwards++;
        p->recomputed += !hit;
        if ((rc = gpt_stage_backward(st, &in, p->grad, p->out))) return rc;
        slow_down(p, &t0);
        p->bwd_busy_s += wall_since(&t0);
        p->bwd_n += (uint64_t)in.B;
        p->mb_since_step++;
        if (!first) stage_msg_put_acts(reply, p->out, n, codec);
        return 0;
    }
    case STAGE_AVERAGE:
        return average_gradients(p, &r, h->request_id, reply, why);
    case STAGE_RESET:
        if (stage_msg_get_empty(&r)) return CIRRUS_ECORRUPT;
        drop_gradients(p);
        if (p->move_to >= 0) start_move_locked(p); /* it holds no gradients now */
        return 0;
    case STAGE_STATE_GET:
        *why = "malformed STATE_GET: a slice outside the state, or over its size limit";
        return put_state(p, &r, reply);
    case STAGE_PARAMS_SET:
        *why = "malformed PARAMS_SET: a slice outside the parameters, or over its size limit";
        return set_params(p, &r, why);
    case STAGE_SYNC: {
        char donor[STAGE_ADDR_MAX];
        if (stage_msg_get_sync(&r, donor)) return CIRRUS_ECORRUPT;
        rc = sync_from(p, donor, why);
        return rc && rc != CIRRUS_EMISMATCH ? CIRRUS_EIO : rc; /* the request was fine */
    }
    case STAGE_HEAD_GRAD:
        *why = "HEAD_GRAD sent to a stage without the LM head";
        if (!last || h->payload_len) return CIRRUS_EINVAL;
        stage_msg_put_tied(reply, p->model.grad_head, VC);
        return 0;
    case STAGE_FOLD_TIED: {
        *why = "FOLD_TIED sent to a stage without the embedding";
        if (!first) return CIRRUS_EINVAL;
        const float *head;
        *why = "malformed request";
        if (stage_msg_get_tied(&r, VC, &head)) return CIRRUS_ECORRUPT;
        /* The same addition, in the same order, as gpt_fold_tied_grads(). */
        for (size_t i = 0; i < VC; i++) p->model.g.wte[i] += head[i];
        if (last) memset(p->model.grad_head, 0, VC * sizeof(float)); /* folded */
        stage_msg_put_tied(reply, p->model.g.wte, VC);
        return 0;
    }
    case STAGE_SET_TIED: {
        *why = "SET_TIED sent to a stage without the LM head";
        if (!last || first) return CIRRUS_EINVAL;
        const float *g;
        *why = "malformed request";
        if (stage_msg_get_tied(&r, VC, &g)) return CIRRUS_ECORRUPT;
        memcpy(p->model.g.wte, g, VC * sizeof(float));
        memset(p->model.grad_head, 0, VC * sizeof(float)); /* folded into g.wte */
        return 0;
    }
    case STAGE_SUMSQ: {
        if (stage_msg_get_empty(&r)) return CIRRUS_ECORRUPT;
        const size_t n_seg = (size_t)(p->adam.n_seg ? p->adam.n_seg : 1);
        double *sums = malloc(sizeof(double) * n_seg);
        stage_sumsq_part *parts = malloc(sizeof *parts * n_seg);
        *why = "out of memory";
        rc = sums && parts ? 0 : CIRRUS_ENOMEM;
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
    case STAGE_STEP: {
        stage_step st;
        if (stage_msg_get_step(&r, &st)) return CIRRUS_ECORRUPT;
        adamw_step(&p->adam, p->model.params, p->model.grads, st.grad_scale, st.sumsq, st.lr,
                   st.step);
        p->steps = st.step;
        p->mb_since_step = 0;
        p->summed = 0;
        /* Told to move: now, between steps, it leaves no gradients behind. */
        if (p->move_to >= 0) start_move_locked(p);
        return 0;
    }
    case STAGE_INFO: {
        if (stage_msg_get_empty(&r)) return CIRRUS_ECORRUPT;
        const gpt_config *c = &o->model;
        stage_info info = {.l0 = (uint32_t)p->l0, .l1 = (uint32_t)p->l1,
                           .n_layer = (uint32_t)c->n_layer, .n_embd = (uint32_t)c->n_embd,
                           .n_head = (uint32_t)c->n_head, .seq_len = (uint32_t)c->seq_len,
                           .n_params = p->model.n_params, .steps = p->steps};
        snprintf(info.ring, sizeof info.ring, "%s", o->ring_addr ? o->ring_addr : "");
        stage_msg_put_info(reply, &info);
        return 0;
    }
    default:
        *why = "unknown request type";
        return CIRRUS_ECORRUPT;
    }
}

static void *conn_main(void *arg)
{
    conn_job *job = arg;
    peer *p = job->p;
    net_conn *c = job->c;
    free(job);
    cirrus_error err = {0};
    uint16_t role;
    uint32_t peer_id;
    if (net_hello_server(c, p->opt->job_id, &role, &peer_id, 5000, &err)) {
        log_warn("dropped %s: %s", net_peer_name(c), err.msg);
        goto out;
    }
    net_set_max_payload(c, PEER_REPLY_LIMIT);
    pthread_mutex_lock(&p->mu);
    const uint32_t gen = p->gen; /* the stage this connection was opened for */
    pthread_mutex_unlock(&p->mu);
    while (!*p->stop) {
        /* Wait for a frame's first byte here, not inside net_recv_frame: a receive that
         * timed out part-way through a large frame (a slow sender, a loaded machine) would
         * leave the stream inside its payload. */
        if (!net_pending(c)) {
            struct pollfd pfd = {.fd = net_fd(c), .events = POLLIN};
            int pr = poll(&pfd, 1, 1000);
            if (pr < 0 && errno != EINTR) break;
            if (pr <= 0) continue; /* idle: look at the stop flag again */
        }
        wire_header h;
        const uint8_t *payload;
        int rc = net_recv_frame(c, &h, &payload, PEER_IO_TIMEOUT_MS, &err);
        if (rc == CIRRUS_ECLOSED) break;
        if (rc) {
            log_warn("dropped %s: %s", net_peer_name(c), err.msg);
            break;
        }
        wire_writer reply;
        wire_writer_init(&reply, PEER_REPLY_LIMIT);
        const char *why = NULL;
        pthread_mutex_lock(&p->mu);
        rc = serve(p, gen, &h, payload, &reply, &why);
        pthread_mutex_unlock(&p->mu);
        if (!rc && reply.failed) {
            rc = CIRRUS_ENOMEM;
            why = "reply too large";
        }
        if (rc && rc != CIRRUS_ECORRUPT) {
            /* A valid request that could not be done (a ring member vanished, a donor was
             * unreachable): say so and keep serving this client. */
            log_warn("refused %s: %s (request type %u)", net_peer_name(c), why, h.type);
            wire_writer_free(&reply);
            rpc_refuse(c, h.request_id, rc, why, 1000);
            continue;
        }
        if (rc) { /* malformed: this connection is not speaking our protocol */
            log_warn("dropped %s: %s (request type %u)", net_peer_name(c), why, h.type);
            rpc_refuse(c, h.request_id, rc, why, 1000);
            wire_writer_free(&reply);
            break;
        }
        rc = net_send_frame(c, (uint16_t)(h.type + 1), h.request_id, reply.data,
                            (uint32_t)reply.len, PEER_IO_TIMEOUT_MS);
        wire_writer_free(&reply);
        if (rc) break;
    }
out:
    net_close(c);
    pthread_mutex_lock(&p->mu);
    p->active--;
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

/* ---- the stage kit ---- */

static void kit_free(stage_kit *k)
{
    for (int i = 0; i < STAGE_PEER_MAX_SLOTS; i++) gpt_stage_destroy(k->slot[i]);
    adamw_destroy(&k->adam);
    free(k->pack);
    free(k->backup);
    memset(k, 0, sizeof *k);
}

/* Everything serving layers [l0, l1) needs; on failure nothing is left allocated. */
static int kit_build(peer *p, int l0, int l1, stage_kit *k, cirrus_error *err)
{
    const stage_peer_options *o = p->opt;
    int rc = 0;
    memset(k, 0, sizeof *k);
    k->l0 = l0;
    k->l1 = l1;
    for (int i = 0; i < p->n_slots && !rc; i++)
        rc = gpt_stage_create(&k->slot[i], &p->model, l0, l1, o->max_B, o->max_T, err);
    gpt_span spans[2];
    const int n = gpt_stage_state_spans(&o->model, l0, l1, spans);
    if (!rc) rc = adamw_create(&k->adam, &o->model, spans, n, &o->adam, err);
    if (!rc) {
        const int last = l1 == o->model.n_layer; /* also packs the LM head's d(wte) share */
        k->pack_count = k->adam.state_count + (last ? p->V * p->C : 0);
        k->pack = malloc(sizeof(float) * (k->pack_count ? k->pack_count : 1));
        k->backup = malloc(sizeof(float) * (k->pack_count ? k->pack_count : 1));
        if (!k->pack || !k->backup)
            rc = cirrus_fail(err, CIRRUS_ENOMEM, "cannot allocate stage buffers");
    }
    if (rc) kit_free(k);
    return rc;
}

/* Serve k's layers from now on (under the lock, or before serving); k receives what the
 * peer had, for kit_free. The activation slots start empty. */
static void kit_swap(peer *p, stage_kit *k)
{
    stage_kit old = {.l0 = p->l0, .l1 = p->l1, .adam = p->adam, .pack = p->pack,
                     .backup = p->backup, .pack_count = p->pack_count};
    for (int i = 0; i < p->n_slots; i++) {
        old.slot[i] = p->slot[i].stage;
        p->slot[i] = (act_slot){.stage = k->slot[i]};
    }
    p->l0 = k->l0;
    p->l1 = k->l1;
    p->adam = k->adam;
    p->pack = k->pack;
    p->backup = k->backup;
    p->pack_count = k->pack_count;
    *k = old;
}

/* ---- moving to another stage (rebalancing) ---- */

static double mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Leave the current stage (under the lock): from now on every request is refused until
 * the mover has built the new one, and connections opened before are refused for good. */
static void start_move_locked(peer *p)
{
    if (atomic_load(&p->moving) || p->move_to < 0) return;
    const int clean = p->mb_since_step == 0 && !p->summed;
    log_info("leaving stage %d for stage %d%s", p->stage, p->move_to,
             clean ? "" : " with gradients of an unfinished step (its client runs them again)");
    p->gen++;
    atomic_store(&p->moving, 1);
}

/* A heartbeat's instruction: the stage the coordinator wants this peer at, or none. The
 * peer leaves when it holds no gradients of an unfinished step (now, or after the next
 * STEP), or after STAGE_PEER_MOVE_WAIT_S in any case (a client that died mid-step). */
static void take_instruction(peer *p, uint32_t ins)
{
    const double now = mono_s();
    pthread_mutex_lock(&p->mu);
    if (atomic_load(&p->moving)) {
        /* busy moving: the instruction is the one being carried out, or is stale */
    } else if (ins == COORD_NO_INSTRUCTION || ins >= COORD_MAX_STAGES || (int)ins == p->stage) {
        /* none, or where it is already (moved, not registered there yet) */
        if (p->move_to >= 0) log_info("move to stage %d withdrawn by the coordinator", p->move_to);
        p->move_to = -1;
    } else if (now >= p->retry_after_s) {
        if (p->move_to != (int)ins) {
            p->move_to = (int)ins;
            p->move_asked_s = now;
            log_info("told to move from stage %d to stage %d: leaving between steps", p->stage,
                     p->move_to);
        }
        if ((p->mb_since_step == 0 && !p->summed) || now - p->move_asked_s > STAGE_PEER_MOVE_WAIT_S)
            start_move_locked(p);
    }
    pthread_mutex_unlock(&p->mu);
}

/* Take the stage of the live peer `donor` serves: its layers (checked with INFO), a new
 * kit for them, and its parameters and optimizer state (STATE_GET), all while `moving`
 * keeps every request away from the model; then swap the kit in. */
static int adopt_stage(peer *p, const coord_peer_info *donor, int to, cirrus_error *err)
{
    net_conn *c = NULL;
    stage_kit kit;
    const char *why;
    uint64_t steps = 0;
    if (donor->l1 > (uint32_t)p->opt->model.n_layer)
        return cirrus_fail(err, CIRRUS_EMISMATCH, "stage %d serves layers up to %u of %d", to,
                           donor->l1, p->opt->model.n_layer);
    int rc = donor_open(p, donor->host, donor->port, (int)donor->l0, (int)donor->l1, &c, &why,
                        err);
    if (rc) return rc;
    if ((rc = kit_build(p, (int)donor->l0, (int)donor->l1, &kit, err))) {
        net_close(c);
        return rc;
    }
    rc = take_state(p, c, &kit.adam, &steps, &why, err);
    net_close(c);
    if (rc) {
        kit_free(&kit);
        return rc;
    }
    pthread_mutex_lock(&p->mu);
    kit_swap(p, &kit);
    p->stage = to;
    p->steps = steps;
    drop_gradients(p);
    collective_destroy(p->ring); /* the new stage's members are named by the next AVERAGE */
    p->ring = NULL;
    p->ring_members[0] = '\0';
    p->last_round = 0;
    p->rates_reset = 1;
    p->move_to = -1;
    atomic_store(&p->moving, 0);
    pthread_mutex_unlock(&p->mu);
    kit_free(&kit); /* the old stage's */
    log_info("moved to stage %d: layers [%u, %u), state of %s:%u at step %llu", to, donor->l0,
             donor->l1, donor->host, donor->port, (unsigned long long)steps);
    return 0;
}

/* Move to stage `to`: ask the coordinator for its live peers and adopt the state of the
 * first that answers. */
static int move_stage(peer *p, coord_client *cc, int to, cirrus_error *err)
{
    coord_peer_info *list = NULL;
    size_t n = 0;
    uint32_t n_stages = 0;
    int rc = coord_client_peers(cc, (uint32_t)to, 5000, &list, &n, &n_stages, err);
    if (rc) return rc;
    rc = cirrus_fail(err, CIRRUS_ENOENT, "no live peer of stage %d to copy its state from", to);
    if ((uint32_t)to >= n_stages)
        rc = cirrus_fail(err, CIRRUS_EINVAL, "told to move to stage %d of a %u-stage job", to,
                         n_stages);
    for (size_t i = 0; i < n && (uint32_t)to < n_stages; i++) {
        const stage_peer_options *o = p->opt;
        if (list[i].port == o->advertise_port && strcmp(list[i].host, o->advertise_host) == 0)
            continue; /* itself, listed there already */
        cirrus_error e = {0};
        if (!(rc = adopt_stage(p, &list[i], to, &e))) break;
        log_warn("moving to stage %d: %s", to, e.msg);
        *err = e;
    }
    free(list);
    return rc;
}

/* The mover runs apart from the heartbeat thread, which keeps the peer's registration
 * alive however long a large stage's state takes to download. */
typedef struct mover {
    peer *p;
    coord_client *cc;
    int to;
    pthread_t th;
    int running;
    atomic_int done;
} mover;

static void *mover_main(void *arg)
{
    mover *mv = arg;
    peer *p = mv->p;
    cirrus_error err = {0};
    if (move_stage(p, mv->cc, mv->to, &err)) {
        pthread_mutex_lock(&p->mu);
        log_warn("move to stage %d failed: %s; serving stage %d again, retrying in %d s",
                 mv->to, err.msg, p->stage, STAGE_PEER_MOVE_RETRY_S);
        p->retry_after_s = mono_s() + STAGE_PEER_MOVE_RETRY_S;
        p->move_to = -1;
        atomic_store(&p->moving, 0);
        pthread_mutex_unlock(&p->mu);
    }
    atomic_store(&mv->done, 1);
    return NULL;
}

/* Start the mover when the peer has left its stage, and reap it when it is done. */
static void mover_poll(peer *p, mover *mv)
{
    if (mv->running && atomic_load(&mv->done)) {
        pthread_join(mv->th, NULL);
        mv->running = 0;
    }
    if (mv->running || !atomic_load(&p->moving)) return;
    pthread_mutex_lock(&p->mu);
    mv->to = p->move_to;
    pthread_mutex_unlock(&p->mu);
    atomic_store(&mv->done, 0);
    mv->p = p;
    if (pthread_create(&mv->th, NULL, mover_main, mv) == 0) {
        mv->running = 1;
        return;
    }
    pthread_mutex_lock(&p->mu);
    log_warn("cannot start a thread to move to stage %d; staying at stage %d", mv->to, p->stage);
    p->move_to = -1;
    p->retry_after_s = mono_s() + STAGE_PEER_MOVE_RETRY_S;
    atomic_store(&p->moving, 0);
    pthread_mutex_unlock(&p->mu);
}

/* ---- heartbeats ---- */

/* A rate over recent work. The samples and busy seconds since the last heartbeat are added
 * to sums that decay by RATE_DECAY per heartbeat with new work, so the estimate follows a
 * peer whose speed changes within ~10 heartbeats, and an idle peer (an over-provisioned
 * stage) keeps its capacity instead of looking slow. */
#define RATE_DECAY 0.9
typedef struct rate_est {
    double n, t;
    uint64_t last_n;
    double last_t;
} rate_est;

static double rate_update(rate_est *e, uint64_t n, double t)
{
    const double dn = (double)(n - e->last_n), dt = t - e->last_t;
    e->last_n = n;
    e->last_t = t;
    if (dn > 0 || dt > 0) {
        e->n = e->n * RATE_DECAY + dn;
        e->t = e->t * RATE_DECAY + dt;
    }
    return e->t > 0 ? e->n / e->t : 0.0;
}

/* This peer's registration as it stands (under the lock). */
static void current_registration(const peer *p, coord_registration *reg)
{
    const stage_peer_options *o = p->opt;
    *reg = (coord_registration){.role = COORD_ROLE_STAGE, .stage = (uint32_t)p->stage,
                                .l0 = (uint32_t)p->l0, .l1 = (uint32_t)p->l1,
                                .port = (uint16_t)o->advertise_port};
    snprintf(reg->host, sizeof reg->host, "%s", o->advertise_host);
    memcpy(reg->name, p->name, sizeof reg->name);
}

/* The heartbeat's statistics (under the lock). Capacity: forward and backward samples per
 * second of this peer's own compute, over recent work. */
static void current_stats(peer *p, rate_est *fwd, rate_est *bwd, coord_stats *st)
{
    if (p->rates_reset) { /* a new stage: its own speed there, from scratch */
        *fwd = (rate_est){.last_n = p->fwd_n, .last_t = p->fwd_busy_s};
        *bwd = (rate_est){.last_n = p->bwd_n, .last_t = p->bwd_busy_s};
        p->rates_reset = 0;
    }
    *st = (coord_stats){.loss = NAN, .samples = p->samples, .step = p->steps};
    st->fwd_throughput = rate_update(fwd, p->fwd_n, p->fwd_busy_s);
    st->bwd_throughput = rate_update(bwd, p->bwd_n, p->bwd_busy_s);
}

/* Register with the coordinator and heartbeat until stopped. The coordinator client
 * re-registers by itself after a coordinator restart; errors are logged, never fatal: a
 * peer keeps serving its clients while the coordinator is away. A heartbeat may carry an
 * instruction to move to another stage: the mover carries it out, then the peer registers
 * again at its new stage. */
static void *heartbeat_main(void *arg)
{
    peer *p = arg;
    const stage_peer_options *o = p->opt;
    coord_client *cc = NULL;
    cirrus_error err = {0};
    if (coord_client_open(o->coord_host, o->coord_port, o->job_id, &cc, &err)) {
        log_warn("coordinator: %s", err.msg);
        return NULL;
    }
    coord_registered ack = {.heartbeat_ms = 1000}; /* until the coordinator says */
    int registered = 0, registered_stage = -1;
    rate_est fwd = {0}, bwd = {0};
    mover mv = {.cc = cc};
    while (!*p->stop) {
        mover_poll(p, &mv);
        coord_registration reg;
        coord_stats st;
        pthread_mutex_lock(&p->mu);
        current_registration(p, &reg);
        current_stats(p, &fwd, &bwd, &st);
        pthread_mutex_unlock(&p->mu);
        if (registered && (int)reg.stage != registered_stage) registered = 0; /* it moved */
        if (!registered) {
            registered = coord_client_register(cc, &reg, 2000, &ack, &err) == 0;
            if (registered) registered_stage = (int)reg.stage;
            else log_warn("coordinator: %s", err.msg);
        } else {
            uint32_t instruction;
            if (coord_client_heartbeat(cc, &st, 2000, &instruction, NULL, &err))
                log_warn("coordinator: %s", err.msg);
            else
                take_instruction(p, instruction);
        }
        /* Sleep one interval in short naps so a stop, or a move starting or ending, is
         * noticed quickly. */
        for (uint32_t slept = 0; slept < ack.heartbeat_ms && !*p->stop; slept += 50) {
            if (mv.running ? atomic_load(&mv.done) : atomic_load(&p->moving)) break;
            usleep(50000);
        }
    }
    if (mv.running) pthread_join(mv.th, NULL);
    if (registered) coord_client_leave(cc, 1000, NULL);
    coord_client_close(cc);
    return NULL;
}

static int peer_setup(peer *p, const stage_peer_options *o, cirrus_error *err)
{
    int rc;
    if ((rc = gpt_model_create(&p->model, &o->model, err))) return rc;
    gpt_model_init(&p->model, o->seed);
    p->n_slots = o->act_slots > 0 ? o->act_slots : STAGE_PEER_DEFAULT_SLOTS;
    if (p->n_slots > STAGE_PEER_MAX_SLOTS)
        return cirrus_fail(err, CIRRUS_EINVAL, "%d activation slots: at most %d", p->n_slots,
                           STAGE_PEER_MAX_SLOTS);
    p->C = (size_t)o->model.n_embd;
    p->V = (size_t)o->model.vocab;
    p->N = (size_t)o->max_B * o->max_T;
    p->stage = o->stage_index;
    p->move_to = -1;
    /* Its name at the coordinator stays the one it started with, also after a move:
     * registering again under it keeps the peer's id (and clears the instruction). */
    if (o->name && o->name[0])
        snprintf(p->name, sizeof p->name, "%s", o->name);
    else
        snprintf(p->name, sizeof p->name, "stage%d-%s-%d", o->stage_index,
                 o->advertise_host ? o->advertise_host : "", o->advertise_port);
    stage_kit kit;
    if ((rc = kit_build(p, o->l0, o->l1, &kit, err))) return rc;
    kit_swap(p, &kit); /* kit now holds the empty start: nothing to free */
    size_t width = p->C > p->V ? p->C : p->V;
    p->tokens = malloc(sizeof(int32_t) * p->N);
    p->targets = malloc(sizeof(int32_t) * p->N);
    p->in = malloc(sizeof(float) * p->N * width);
    p->out = malloc(sizeof(float) * p->N * width);
    p->grad = malloc(sizeof(float) * p->N * width);
    if (!p->tokens || !p->targets || !p->in || !p->out || !p->grad)
        return cirrus_fail(err, CIRRUS_ENOMEM, "cannot allocate stage buffers");
    return 0;
}

static void peer_teardown(peer *p)
{
    collective_destroy(p->ring);
    free(p->tokens);
    free(p->targets);
    free(p->in);
    free(p->out);
    free(p->grad);
    stage_kit kit = {0};
    kit_swap(p, &kit); /* the peer's kit, to free */
    kit_free(&kit);
    gpt_model_destroy(&p->model);
}

int stage_peer_run(const stage_peer_options *o, volatile sig_atomic_t *stop, cirrus_error *err)
{
    peer p = {.opt = o, .stop = stop};
    pthread_mutex_init(&p.mu, NULL);
    int rc = peer_setup(&p, o, err);
    if (rc) goto out;
    log_info("serving layers [%d, %d) of %d", p.l0, p.l1, o->model.n_layer);
    pthread_t heartbeat;
    int heartbeating = o->coord_host && pthread_create(&heartbeat, NULL, heartbeat_main, &p) == 0;
    while (!*stop) {
        net_conn *c = NULL;
        cirrus_error aerr;
        int arc = net_accept(o->listen_fd, 200, &c, &aerr);
        if (arc == CIRRUS_ETIMEDOUT) continue;
        if (arc) {
            log_warn("accept: %s", aerr.msg);
            continue;
        }
        conn_job *job = malloc(sizeof *job);
        pthread_t th;
        if (!job) {
            net_close(c);
            continue;
        }
        *job = (conn_job){&p, c};
        pthread_mutex_lock(&p.mu);
        p.active++;
        pthread_mutex_unlock(&p.mu);
        if (pthread_create(&th, NULL, conn_main, job) != 0) {
            net_close(c);
            free(job);
            pthread_mutex_lock(&p.mu);
            p.active--;
            pthread_mutex_unlock(&p.mu);
            continue;
        }
        pthread_detach(th);
    }
    if (heartbeating) pthread_join(heartbeat, NULL);
    /* Connection threads notice the stop flag within a second; wait for them. */
    for (;;) {
        pthread_mutex_lock(&p.mu);
        int active = p.active;
        pthread_mutex_unlock(&p.mu);
        if (!active) break;
        usleep(10000);
    }
    if (p.backwards)
        log_info("served %llu backwards, %llu of them without kept activations (%d slots)",
                 (unsigned long long)p.backwards, (unsigned long long)p.recomputed, p.n_slots);
out:
    peer_teardown(&p);
    pthread_mutex_destroy(&p.mu);
    return rc;
}
