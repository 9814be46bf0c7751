/* pipeline: see pipeline.h.
 *
 * Fault handling. A peer that fails a request at the transport level (closed, timed out,
 * garbled) is marked dead and the request goes to another live peer of its stage. A dead
 * peer takes the gradients it accumulated in this step with it, so the client keeps, for
 * every microbatch of the step, what each stage's backward needs (tokens, the stage input
 * and the gradient of its output) and which peer served it; the backwards the dead peer
 * served are re-run on survivors. At the step, every stage's live peers report how many
 * microbatches they accumulated: the sum must equal the step's microbatches, which proves
 * none was lost and none counted twice. A peer that refuses a request (WIRE_ERROR) is not
 * a fault of the network: that error ends the step.
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../../../common/log.h"
#include "pipeline_internal.h"

/* ---- requests ---- */

static int peer_alive(const pipeline *p, int s, int k)
{
    return p->link[s].peer[k].c != NULL;
}

static int alive_count(const pipeline *p, int s)
{
    int n = 0;
    for (int k = 0; k < p->link[s].n; k++) n += peer_alive(p, s, k);
    return n;
}

/* A transport failure, or a peer that left the stage (rebalancing): the peer is gone as
 * far as this client is concerned. A refusal is not (rpc.h maps none to a fault) except
 * "moved": the peer serves another stage now. */
int pipe_is_peer_fault(int rc)
{
    return rpc_is_fault(rc) || rc == STAGE_MOVED;
}

/* "stage S peer ADDR", naming the other end in messages. */
static const char *peer_name(const pipeline *p, int s, int k, char out[STAGE_ADDR_MAX + 32])
{
    snprintf(out, STAGE_ADDR_MAX + 32, "stage %d peer %s", s, p->link[s].peer[k].addr);
    return out;
}

static int send_to(pipeline *p, int s, int k, uint16_t type, uint64_t id, const wire_writer *w,
                   cirrus_error *err)
{
    char who[STAGE_ADDR_MAX + 32];
    if (!peer_alive(p, s, k)) return cirrus_fail(err, CIRRUS_ECLOSED, "stage %d peer %d is gone", s, k);
    return rpc_send(p->link[s].peer[k].c, type, id, w, p->timeout_ms, peer_name(p, s, k, who),
                    err);
}

/* Wait for peer k of stage s to answer request id of `type` (with type + 1). A refusal
 * comes back with the peer's code as rpc.h maps it, and its message. */
static int await_reply(pipeline *p, int s, int k, uint16_t type, uint64_t id, wire_reader *r,
                       int timeout_ms, cirrus_error *err)
{
    char who[STAGE_ADDR_MAX + 32];
    if (!peer_alive(p, s, k)) return cirrus_fail(err, CIRRUS_ECLOSED, "stage %d peer %d is gone", s, k);
    return rpc_await(p->link[s].peer[k].c, type, id, timeout_ms, peer_name(p, s, k, who), r,
                     err);
}

int pipe_call_peer(pipeline *p, int s, int k, uint16_t type, const wire_writer *w,
                     wire_reader *r, cirrus_error *err)
{
    uint64_t id = ++p->next_id;
    int rc = send_to(p, s, k, type, id, w, err);
    return rc ? rc : await_reply(p, s, k, type, id, r, p->timeout_ms, err);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Peers answer their first requests slowly (memory is touched for the first time); until
 * then they get the caller's full timeout, not the stage's learned deadline. */
#define PIPE_WARM_REQUESTS 8

/* Requests to a peer get at least this many times the latency its measured throughput
 * predicts (the stage's deadline has the same margin over the stage's median). */
#define PIPE_PEER_DEADLINE_RATIO 3.0

/* The learned deadline, in seconds, for a forward or backward of B samples on peer k of
 * stage s. The stage's estimator follows the latencies of all its peers, so a peer several
 * times slower than the others (other hardware) would miss it on every request and be
 * dropped as hung; its own measured throughput stretches its deadline. */
static double learned_deadline(const pipeline *p, int s, int k, uint16_t type, int B)
{
    double d = deadline_get(p->deadline[s][type == STAGE_BACKWARD]);
    double rate = wiring_throughput(p->wiring, s, p->link[s].peer[k].wid);
    if (rate > 0) {
        double units = type == STAGE_BACKWARD ? WIRING_BACKWARD_COST * B : B;
        double own = PIPE_PEER_DEADLINE_RATIO * units / rate;
        if (own > d) d = own;
    }
    return d;
}

/* A forward or backward of B samples under its learned deadline; the latency teaches the
 * deadline estimator and the wiring. The only live peer of a stage, or a peer still
 * warming up, gets the full timeout: there is nothing better to fail over to, or its
 * latency says nothing yet. */
static int call_timed(pipeline *p, int s, int k, uint16_t type, int B, const wire_writer *w,
                      wire_reader *r, cirrus_error *err)
{
    deadline_estimator *d = p->deadline[s][type == STAGE_BACKWARD];
    peer_link *pl = &p->link[s].peer[k];
    const int saved = p->timeout_ms;
    const int learned = alive_count(p, s) > 1 && pl->served >= PIPE_WARM_REQUESTS;
    const enum wiring_kind kind = type == STAGE_BACKWARD ? WIRING_BACKWARD : WIRING_FORWARD;
    double t0 = now_s();
    if (learned) p->timeout_ms = (int)(learned_deadline(p, s, k, type, B) * 1000.0) + 1;
    int rc = pipe_call_peer(p, s, k, type, w, r, err);
    p->timeout_ms = saved;
    const double took = now_s() - t0;
    if (!rc) pl->served++;
    if (!rc && learned)
        deadline_observe(d, took);
    else if (rc == CIRRUS_ETIMEDOUT)
        deadline_observe_timeout(d, took);
    /* A refusal is an error answer (the wiring bans until re-added); transport failures
     * remove the peer from the wiring anyway (peer_failed). */
    wiring_report(p->wiring, s, pl->wid, kind, B, took,
                  !rc ? WIRING_OK : rc == CIRRUS_ETIMEDOUT ? WIRING_TIMEOUT : WIRING_ERROR);
    return rc;
}

/* The first live peer of stage s (for requests that are not routed work); -1 if none. */
int pipe_any_live_peer(const pipeline *p, int s)
{
    for (int k = 0; k < p->link[s].n; k++)
        if (peer_alive(p, s, k)) return k;
    return -1;
}

/* The live peer of stage s the wiring picks for work of `charge` samples (in forward
 * units); -1 if none. */
static int routed_peer(pipeline *p, int s, double charge)
{
    uint32_t wid;
    if (wiring_choose(p->wiring, s, WIRING_FORWARD, charge, WIRING_NONE, &wid)) return -1;
    for (int k = 0; k < p->link[s].n; k++)
        if (peer_alive(p, s, k) && p->link[s].peer[k].wid == wid) return k;
    return -1; /* not reached: the wiring holds the live peers only */
}

/* Slot k of stage s now holds a new live connection: the wiring tries it at once. */
static int track_peer(pipeline *p, int s, int k)
{
    peer_link *pl = &p->link[s].peer[k];
    pl->wid = ++p->next_wid;
    return wiring_peer_add(p->wiring, s, pl->wid);
}

static int redo_backwards_of(pipeline *p, int s, int dead, cirrus_error *err);
static int reassign_tasks_of(pipeline *p, int s, int k, cirrus_error *err);

/* Drop a peer after a transport failure: its queued and unanswered tasks go to other peers,
 * and the backwards whose gradients it held are re-run on survivors. A peer that only timed out is not banned (SWARM's rule): its
 * connection is closed (a late reply must not be mistaken for another), and if the
 * coordinator still lists it later, it rejoins with fresh state. */
int pipe_peer_failed(pipeline *p, int s, int k, const cirrus_error *why, cirrus_error *err)
{
    peer_link *pl = &p->link[s].peer[k];
    if (!pl->c) return 0;
    log_warn("stage %d peer %s lost: %s", s, pl->addr, why->msg);
    net_close(pl->c);
    pl->c = NULL;
    wiring_peer_remove(p->wiring, s, pl->wid);
    p->counters.peers_lost++;
    if (p->on_lost) p->on_lost(p->on_lost_ctx, s, pl->addr, !p->averaged[s]);
    /* Banned, unless it only timed out or moved to another stage (it rejoins there). */
    if (why->code != CIRRUS_ETIMEDOUT && why->code != STAGE_MOVED &&
        p->n_dead < (int)(sizeof p->dead / sizeof p->dead[0]))
        memcpy(p->dead[p->n_dead++], pl->addr, STAGE_ADDR_MAX); /* both STAGE_ADDR_MAX */
    if (alive_count(p, s) == 0)
        return cirrus_fail(err, CIRRUS_ECLOSED, "stage %d has no live peer left (last: %s)", s,
                           why->msg);
    int rc = reassign_tasks_of(p, s, k, err);
    /* Once the stage's gradients are summed, every survivor holds the dead peer's share. */
    return rc || p->averaged[s] ? rc : redo_backwards_of(p, s, k, err);
}

/* ---- microbatches ---- */

/* The FORWARD (grad_out NULL) or BACKWARD request for stage s: the first stage gets the
 * tokens, the others their input activations; the last the targets. */
static void put_microbatch(pipeline *p, wire_writer *w, int s, uint64_t id, int B, int T,
                           int keep, const int32_t *x, const int32_t *y, const float *in,
                           const float *grad_out)
{
    const int last = s == p->n - 1;
    const stage_microbatch m = {
        .id = id, .B = (uint32_t)B, .T = (uint32_t)T, .keep = (uint8_t)keep,
        .codec = (uint8_t)p->codec, .has_targets = (uint8_t)(last && y),
        .tokens = s == 0 ? x : NULL, .hidden = s == 0 ? NULL : in,
        .targets = last ? y : NULL, .grad_out = last ? NULL : grad_out};
    stage_msg_put_microbatch(w, &m, (size_t)p->cfg.n_embd);
}

/* Run a request on stage s, on `prefer` if it is alive, else on the peer the wiring picks
 * for work of `charge` samples in forward units (0: not routed work, any live peer), moving
 * on after transport failures. B is the microbatch of a forward or backward (the latency
 * report). *served receives the peer that answered. */
static int on_stage(pipeline *p, int s, int prefer, uint16_t type, int B, double charge,
                    const wire_writer *w, wire_reader *r, int *served, cirrus_error *err)
{
    for (;;) {
        int k = prefer >= 0 && peer_alive(p, s, prefer) ? prefer
                : charge > 0                            ? routed_peer(p, s, charge)
                                                        : pipe_any_live_peer(p, s);
        if (k < 0) return cirrus_fail(err, CIRRUS_ECLOSED, "stage %d has no live peer", s);
        prefer = -1;
        int rc = type == STAGE_FORWARD || type == STAGE_BACKWARD
                     ? call_timed(p, s, k, type, B, w, r, err)
                     : pipe_call_peer(p, s, k, type, w, r, err);
        if (!rc) {
            *served = k;
            return 0;
        }
        if (!pipe_is_peer_fault(rc)) return rc;
        p->counters.retried++;
        cirrus_error why = *err;
        if ((rc = pipe_peer_failed(p, s, k, &why, err))) return rc;
    }
}

static int forward_stage(pipeline *p, int s, uint64_t id, int B, int T, int keep,
                         const int32_t *x, const int32_t *y, float *loss, int *served,
                         cirrus_error *err)
{
    const size_t n = (size_t)B * T * p->cfg.n_embd;
    wire_writer w;
    wire_reader r;
    wire_writer_init(&w, PIPE_REPLY_LIMIT);
    put_microbatch(p, &w, s, id, B, T, keep, x, y, p->acts[s], NULL);
    /* A training forward books its backward on the same peer too (it comes back there, to
     * the kept activations): the wiring charges both at once. */
    const double charge = keep ? B * (1.0 + WIRING_BACKWARD_COST) : B;
    int rc = on_stage(p, s, -1, STAGE_FORWARD, B, charge, &w, &r, served, err);
    wire_writer_free(&w);
    if (rc) return rc;
    if (s == p->n - 1 ? stage_msg_get_loss(&r, loss)
                      : stage_msg_get_acts(&r, p->acts[s + 1], n, p->codec))
        return cirrus_fail(err, CIRRUS_ECORRUPT, "stage %d: bad forward reply", s);
    return 0;
}

/* ---- microbatches in flight ----
 *
 * Up to `inflight` microbatches of a step move through the stages at once, so the peers of
 * a stage work side by side and a slow peer delays only the microbatches it holds. This is
 * where routing by measured speed pays: with one microbatch in flight every request waits
 * for the one before, so handing a 3x slower peer its fair quarter of a stage's work still
 * costs nearly what round robin does (1.2x better, measured; BENCHMARKS.md). Each forward
 * or backward is a task, assigned to a peer when it
 * becomes ready (the wiring picks the forward's peer; the backward returns to it) and
 * queued at the client: a peer has at most one request of this client on the wire, so
 * the client still chooses what it does next. Backwards first (they finish a microbatch
 * and find the activations of a recent forward), then the oldest microbatch. */

/* One forward or backward of one microbatch at one stage. */
typedef struct task {
    int m, s, k;             /* microbatch (index in the step), stage, peer slot */
    uint16_t type;           /* STAGE_FORWARD or STAGE_BACKWARD */
    int redo;                /* a backward re-run for a lost peer: only its gradients count */
    int sent;                /* on the wire (id, t_sent, deadline valid) */
    int learned;             /* the deadline is the stage's learned one */
    uint64_t id;
    double t_sent, deadline; /* seconds (now_s) */
} task;

static int task_push(pipeline *p, const task *t)
{
    if (p->n_tasks == p->cap_tasks) {
        int cap = p->cap_tasks ? 2 * p->cap_tasks : 64;
        task *grown = realloc(p->tasks, sizeof *grown * (size_t)cap);
        if (!grown) return CIRRUS_ENOMEM;
        p->tasks = grown;
        p->cap_tasks = cap;
    }
    p->tasks[p->n_tasks++] = *t;
    return 0;
}

static void task_drop(pipeline *p, int i)
{
    p->tasks[i] = p->tasks[--p->n_tasks];
}

/* Give task t a live peer of its stage: a forward goes where the wiring says, booking its
 * backward there too; a backward goes back to its forward's peer (the activations), or,
 * if that one is gone, where the wiring says (that peer recomputes the forward). */
static int task_assign(pipeline *p, task *t, cirrus_error *err)
{
    const mb_record *mb = &p->mb[t->m];
    int k = -1;
    if (t->type == STAGE_FORWARD)
        k = routed_peer(p, t->s, mb->B * (1.0 + WIRING_BACKWARD_COST));
    else if (!t->redo && mb->fw_peer[t->s] >= 0 && peer_alive(p, t->s, mb->fw_peer[t->s]))
        k = mb->fw_peer[t->s];
    else
        k = routed_peer(p, t->s, WIRING_BACKWARD_COST * mb->B);
    if (k < 0) return cirrus_fail(err, CIRRUS_ECLOSED, "stage %d has no live peer", t->s);
    t->k = k;
    t->sent = 0;
    return 0;
}

static int task_add(pipeline *p, int m, int s, uint16_t type, int redo, cirrus_error *err)
{
    task t = {.m = m, .s = s, .type = type, .redo = redo};
    int rc = task_assign(p, &t, err);
    if (!rc && task_push(p, &t)) rc = cirrus_fail(err, CIRRUS_ENOMEM, "out of memory");
    return rc;
}

static int engine_run(pipeline *p, cirrus_error *err);

/* The dead peer k of stage s held the gradients of some of this step's backwards: they are
 * run again on survivors (the recomputed grad_in is not needed: upstream already has it). */
static int redo_backwards_of(pipeline *p, int s, int dead, cirrus_error *err)
{
    int rc = 0;
    for (int m = 0; m < p->n_mb && !rc; m++) {
        if (p->mb[m].bw_peer[s] != dead) continue;
        p->mb[m].bw_peer[s] = -1;
        p->counters.redone++;
        rc = task_add(p, m, s, STAGE_BACKWARD, 1, err);
    }
    /* Outside the flow of microbatches (a peer lost while averaging), run them now. */
    return rc || p->in_engine ? rc : engine_run(p, err);
}

/* Tasks queued for, or sent to, the lost peer k of stage s go to other peers. */
static int reassign_tasks_of(pipeline *p, int s, int k, cirrus_error *err)
{
    for (int i = 0; i < p->n_tasks; i++) {
        task *t = &p->tasks[i];
        if (t->s != s || t->k != k) continue;
        if (t->sent) p->counters.retried++;
        int rc = task_assign(p, t, err);
        if (rc) return rc;
    }
    return 0;
}

/* The FORWARD or BACKWARD request of task t. */
static void put_task(pipeline *p, wire_writer *w, const task *t)
{
    const mb_record *mb = &p->mb[t->m];
    put_microbatch(p, w, t->s, mb->id, mb->B, mb->T, t->type == STAGE_FORWARD, mb->x, mb->y,
                   mb->in[t->s], t->type == STAGE_BACKWARD ? mb->gout[t->s] : NULL);
}

/* Put task t on the wire to its peer, under the stage's learned deadline once the peer is
 * warm and has a live alternative (as call_timed). */
static int task_send(pipeline *p, task *t, cirrus_error *err)
{
    peer_link *pl = &p->link[t->s].peer[t->k];
    wire_writer w;
    wire_writer_init(&w, PIPE_REPLY_LIMIT);
    put_task(p, &w, t);
    t->id = ++p->next_id;
    int rc = send_to(p, t->s, t->k, t->type, t->id, &w, err);
    wire_writer_free(&w);
    if (rc) return rc;
    t->sent = 1;
    t->learned = alive_count(p, t->s) > 1 && pl->served >= PIPE_WARM_REQUESTS;
    t->t_sent = now_s();
    t->deadline = t->t_sent + (t->learned ? learned_deadline(p, t->s, t->k, t->type,
                                                             p->mb[t->m].B)
                                          : p->timeout_ms / 1000.0);
    return 0;
}

/* What the latency of a finished (rc 0) or failed task teaches the estimators. */
static void task_observe(pipeline *p, const task *t, int rc)
{
    peer_link *pl = &p->link[t->s].peer[t->k];
    deadline_estimator *d = p->deadline[t->s][t->type == STAGE_BACKWARD];
    const double took = now_s() - t->t_sent;
    if (!rc) pl->served++;
    if (!rc && t->learned)
        deadline_observe(d, took);
    else if (rc == CIRRUS_ETIMEDOUT)
        deadline_observe_timeout(d, took);
    wiring_report(p->wiring, t->s, pl->wid,
                  t->type == STAGE_BACKWARD ? WIRING_BACKWARD : WIRING_FORWARD,
                  p->mb[t->m].B, took,
                  !rc ? WIRING_OK : rc == CIRRUS_ETIMEDOUT ? WIRING_TIMEOUT : WIRING_ERROR);
}

/* Task t was answered with r: keep what the reply carries. A malformed reply is a fault of
 * the peer (the task stays, to be sent elsewhere). */
static int task_read_reply(pipeline *p, const task *t, wire_reader *r, cirrus_error *err)
{
    mb_record *mb = &p->mb[t->m];
    const size_t n = (size_t)mb->B * mb->T * p->cfg.n_embd;
    const int last = t->s == p->n - 1;
    int rc;
    if (t->type == STAGE_FORWARD)
        rc = last ? stage_msg_get_loss(r, &mb->loss)
                  : stage_msg_get_acts(r, mb->in[t->s + 1], n, p->codec);
    else if (t->s > 0) /* a redo's grad_in is read (it must be well formed) and dropped */
        rc = stage_msg_get_acts(r, t->redo ? p->acts[0] : mb->gout[t->s - 1], n, p->codec);
    else
        rc = stage_msg_get_empty(r);
    if (rc)
        return cirrus_fail(err, CIRRUS_ECORRUPT, "stage %d peer %s: bad %s reply", t->s,
                           p->link[t->s].peer[t->k].addr,
                           t->type == STAGE_FORWARD ? "FORWARD" : "BACKWARD");
    return 0;
}

/* Task t is done: queue what comes next for its microbatch. */
static int task_done(pipeline *p, const task *t, cirrus_error *err)
{
    mb_record *mb = &p->mb[t->m];
    const int last = t->s == p->n - 1;
    if (t->type == STAGE_FORWARD) {
        mb->fw_peer[t->s] = t->k;
        return task_add(p, t->m, last ? t->s : t->s + 1, last ? STAGE_BACKWARD : STAGE_FORWARD,
                        0, err);
    }
    mb->bw_peer[t->s] = t->k;
    if (t->redo) return 0;
    if (t->s > 0) return task_add(p, t->m, t->s - 1, STAGE_BACKWARD, 0, err);
    p->counters.microbatches++;
    p->mb_active--;
    return 0;
}

/* Which queued task peer k of stage s does next: backwards first, then the oldest
 * microbatch; -1 if none. */
static int next_task_for(const pipeline *p, int s, int k)
{
    int best = -1;
    for (int i = 0; i < p->n_tasks; i++) {
        const task *t = &p->tasks[i];
        if (t->s != s || t->k != k) continue;
        if (t->sent) return -1; /* busy */
        if (best < 0) {
            best = i;
            continue;
        }
        const task *b = &p->tasks[best];
        const int tb = t->type == STAGE_BACKWARD, bb = b->type == STAGE_BACKWARD;
        if (tb > bb || (tb == bb && t->m < b->m)) best = i;
    }
    return best;
}


/* Send every idle peer its next task. */
static int dispatch(pipeline *p, cirrus_error *err)
{
    for (int s = 0; s < p->n; s++)
        for (int k = 0; k < p->link[s].n; k++) {
            if (!peer_alive(p, s, k)) continue;
            int i = next_task_for(p, s, k);
            if (i < 0) continue;
            cirrus_error why;
            if (!task_send(p, &p->tasks[i], &why)) continue;
            p->counters.retried++;
            int rc = pipe_peer_failed(p, s, k, &why, err);
            if (rc) return rc;
            k = -1; /* tasks moved to other peers of the stage: look at all of them again */
        }
    return 0;
}

/* The reply to task i (its peer's socket is readable, or its deadline passed). */
static int task_answer(pipeline *p, int i, int timed_out, cirrus_error *err)
{
    task t = p->tasks[i];
    wire_reader r;
    cirrus_error why = {0};
    int rc;
    if (timed_out) {
        rc = cirrus_fail(&why, CIRRUS_ETIMEDOUT, "stage %d peer %s: no reply within %.3f s",
                         t.s, p->link[t.s].peer[t.k].addr, now_s() - t.t_sent);
    } else {
        /* Readable: the frame is arriving; a peer stalling mid-frame still meets the
         * deadline, with a little slack for the frame that has begun. */
        double left = t.deadline - now_s();
        rc = await_reply(p, t.s, t.k, t.type, t.id, &r, (int)((left > 0.1 ? left : 0.1) * 1000),
                         &why);
    }
    if (!rc) rc = task_read_reply(p, &t, &r, &why);
    task_observe(p, &t, rc);
    if (!rc) {
        task_drop(p, i);
        return task_done(p, &t, err);
    }
    if (!pipe_is_peer_fault(rc)) {
        *err = why;
        return rc;
    }
    return pipe_peer_failed(p, t.s, t.k, &why, err);
}

/* Wait for the first reply or deadline among the requests on the wire, and handle it. */
static int engine_wait(pipeline *p, cirrus_error *err)
{
    struct pollfd fds[PIPE_MAX_STAGES * PIPE_MAX_PEERS];
    int which[PIPE_MAX_STAGES * PIPE_MAX_PEERS], n = 0;
    double first = 0;
    for (int i = 0; i < p->n_tasks; i++) {
        const task *t = &p->tasks[i];
        if (!t->sent) continue;
        fds[n] = (struct pollfd){.fd = net_fd(p->link[t->s].peer[t->k].c), .events = POLLIN};
        which[n++] = i;
        if (n == 1 || t->deadline < first) first = t->deadline;
    }
    if (n == 0) return cirrus_fail(err, CIRRUS_EIO, "tasks queued but none on the wire");
    double left = first - now_s();
    int ready = poll(fds, (nfds_t)n, left > 0 ? (int)(left * 1000.0) + 1 : 0);
    if (ready < 0 && errno != EINTR) return cirrus_fail(err, CIRRUS_EIO, "poll: %s", strerror(errno));
    /* One event per wait: handling it may move or drop other tasks. */
    for (int j = 0; j < n && ready > 0; j++)
        if (fds[j].revents) return task_answer(p, which[j], 0, err);
    for (int j = 0; j < n; j++)
        if (p->tasks[which[j]].deadline <= now_s()) return task_answer(p, which[j], 1, err);
    return 0;
}

/* After an error the requests still on the wire would answer out of turn: their peers'
 * connections are closed (the pipeline is not used again after a failed step). */
static void engine_abandon(pipeline *p)
{
    for (int i = 0; i < p->n_tasks; i++) {
        peer_link *pl = &p->link[p->tasks[i].s].peer[p->tasks[i].k];
        if (p->tasks[i].sent && pl->c) {
            net_close(pl->c);
            pl->c = NULL;
            wiring_peer_remove(p->wiring, p->tasks[i].s, pl->wid);
        }
    }
    p->n_tasks = 0;
}

/* The window: microbatches started and not finished at once. */
static int engine_window(const pipeline *p)
{
    if (p->inflight > 0) return p->inflight;
    int peers = 0; /* default: one per live peer, enough to keep every peer busy */
    for (int s = 0; s < p->n; s++) peers += alive_count(p, s);
    return peers;
}

/* Run tasks until every started microbatch, and every queued redo, is done. */
static int engine_run(pipeline *p, cirrus_error *err)
{
    int rc = 0;
    p->in_engine = 1;
    while (!rc) {
        while (!rc && p->next_start < p->n_mb && p->mb_active < engine_window(p)) {
            p->mb_active++;
            rc = task_add(p, p->next_start++, 0, STAGE_FORWARD, 0, err);
        }
        if (rc || (rc = dispatch(p, err))) break;
        if (p->n_tasks == 0 && p->next_start == p->n_mb) break;
        rc = engine_wait(p, err);
    }
    p->in_engine = 0;
    if (rc) engine_abandon(p);
    return rc;
}

static int keep_record(pipeline *p, int m, uint64_t id, int B, int T, const int32_t *x,
                       const int32_t *y)
{
    mb_record *mb = &p->mb[m];
    const size_t N = (size_t)p->max_B * p->max_T, C = (size_t)p->cfg.n_embd;
    if (!mb->x) {
        mb->x = malloc(sizeof(int32_t) * N);
        mb->y = malloc(sizeof(int32_t) * N);
        mb->in = calloc((size_t)p->n, sizeof(float *));
        mb->gout = calloc((size_t)p->n, sizeof(float *));
        mb->bw_peer = malloc(sizeof(int) * (size_t)p->n);
        mb->fw_peer = malloc(sizeof(int) * (size_t)p->n);
        if (!mb->x || !mb->y || !mb->in || !mb->gout || !mb->bw_peer || !mb->fw_peer)
            return CIRRUS_ENOMEM;
        for (int s = 0; s < p->n; s++) {
            mb->in[s] = s ? malloc(sizeof(float) * N * C) : NULL;
            mb->gout[s] = s < p->n - 1 ? malloc(sizeof(float) * N * C) : NULL;
            if ((s && !mb->in[s]) || (s < p->n - 1 && !mb->gout[s])) return CIRRUS_ENOMEM;
        }
    }
    memcpy(mb->x, x, sizeof(int32_t) * (size_t)B * T);
    memcpy(mb->y, y, sizeof(int32_t) * (size_t)B * T);
    for (int s = 0; s < p->n; s++) mb->bw_peer[s] = mb->fw_peer[s] = -1;
    mb->id = id;
    mb->B = B;
    mb->T = T;
    mb->loss = 0.0f;
    return 0;
}

int pipeline_microbatches(pipeline *p, uint64_t first_id, int n, int B, int T,
                          const int32_t *x, const int32_t *y, float *losses, cirrus_error *err)
{
    if (n < 1 || p->n_mb + n > PIPE_MAX_MICRO)
        return cirrus_fail(err, CIRRUS_EINVAL, "%d microbatches: a step holds 1 to %d", n,
                           PIPE_MAX_MICRO);
    if (B < 1 || B > p->max_B || T < 1 || T > p->max_T)
        return cirrus_fail(err, CIRRUS_EINVAL, "microbatch %d x %d exceeds %d x %d", B, T,
                           p->max_B, p->max_T);
    const int first = p->n_mb;
    const size_t BT = (size_t)B * T;
    for (int i = 0; i < n; i++)
        if (keep_record(p, first + i, first_id + (uint64_t)i, B, T, x + i * BT, y + i * BT))
            return cirrus_fail(err, CIRRUS_ENOMEM, "out of memory");
    p->next_start = first;
    p->n_mb = first + n; /* from here on, their backwards count toward the step */
    int rc = engine_run(p, err);
    for (int i = 0; !rc && i < n; i++) losses[i] = p->mb[first + i].loss;
    return rc;
}

int pipeline_redo_step(pipeline *p, float *losses, cirrus_error *err)
{
    for (int m = 0; m < p->n_mb; m++) {
        for (int s = 0; s < p->n; s++) p->mb[m].bw_peer[s] = p->mb[m].fw_peer[s] = -1;
        p->mb[m].loss = 0.0f;
    }
    memset(p->averaged, 0, sizeof p->averaged);
    p->n_tasks = 0;
    p->next_start = p->mb_active = 0;
    int rc = engine_run(p, err);
    for (int m = 0; !rc && m < p->n_mb; m++) losses[m] = p->mb[m].loss;
    return rc;
}

int pipeline_microbatch(pipeline *p, uint64_t id, int B, int T, const int32_t *x,
                        const int32_t *y, float *loss, cirrus_error *err)
{
    return pipeline_microbatches(p, id, 1, B, T, x, y, loss, err);
}

int pipeline_eval(pipeline *p, int B, int T, const int32_t *x, const int32_t *y, float *loss,
                  cirrus_error *err)
{
    int served;
    for (int s = 0; s < p->n; s++) {
        int rc = forward_stage(p, s, 0, B, T, 0, x, y, loss, &served, err);
        if (rc) return rc;
    }
    return 0;
}

/* ---- the optimizer step ---- */

/* The same request to every live peer of stage s; r receives one reply (for requests
 * whose replies are equal on all peers). Peers failing at the transport are dropped. */
static int on_all_peers(pipeline *p, int s, uint16_t type, const wire_writer *w, wire_reader *r,
                        int *answered, cirrus_error *err)
{
    uint64_t id = ++p->next_id;
    int sent[PIPE_MAX_PEERS] = {0}, faulty[PIPE_MAX_PEERS] = {0}, rc = 0;
    cirrus_error why[PIPE_MAX_PEERS];
    *answered = 0;
    for (int k = 0; k < p->link[s].n; k++)
        if (peer_alive(p, s, k)) sent[k] = send_to(p, s, k, type, id, w, &why[k]) == 0 ? 1 : -1;
    for (int k = 0; k < p->link[s].n; k++) {
        if (sent[k] == 0) continue;
        int prc = sent[k] == 1 ? await_reply(p, s, k, type, id, r, p->timeout_ms, &why[k])
                               : CIRRUS_ECLOSED;
        if (!prc) {
            (*answered)++;
        } else if (pipe_is_peer_fault(prc)) {
            faulty[k] = 1;
        } else if (!rc) {
            *err = why[k];
            rc = prc;
        }
    }
    /* Only now, with every reply read, may the failures be handled (that can mean new
     * requests to the survivors). */
    for (int k = 0; k < p->link[s].n && !rc; k++)
        if (faulty[k]) rc = pipe_peer_failed(p, s, k, &why[k], err);
    return rc;
}

/* Sum each stage's gradients over its live peers, checking that together they hold every
 * microbatch of the step exactly once. Repeated, with the same round, until it completes
 * without a member failing. */
static int average_stages(pipeline *p, const pipeline_step_sync *sync, cirrus_error *err)
{
    const int expected = sync ? sync->total_mb : p->n_mb;
    int restarts = 0;
    for (int s = 0; s < p->n; s++) {
        uint64_t round = ++p->round;
        int missing = 0; /* microbatches the last complete attempt lacked */
        for (int attempt = 0;; attempt++) {
            if (attempt > PIPE_MAX_PEERS + 2)
                return cirrus_fail(err, CIRRUS_EIO, "stage %d: averaging keeps failing", s);
            /* The other clients redo what lost peers held for them, and peers they admitted
             * that this client has not are admitted, before the stage's peers sum. */
            if (sync && sync->settle) {
                int rc = sync->settle(sync->ctx, s, missing, err);
                if (rc == PIPELINE_STEP_RESTARTED) { /* every stage sums from scratch */
                    if (++restarts > 3)
                        return cirrus_fail(err, CIRRUS_EIO, "the step keeps being restarted");
                    memset(p->averaged, 0, sizeof p->averaged);
                    s = -1;
                    break;
                }
                if (rc) return rc;
            }
            /* The members' ring gives up after `limit` without progress; this client
             * waits that long again for their answers (a refusal from each survivor, none
             * from a member that hangs). */
            const double limit = deadline_get(p->avg_deadline[s]);
            const double t0 = now_s(), wait_until = t0 + 2.0 * limit;
            stage_average *avg = &p->avg;
            avg->round = round;
            avg->n = 0;
            avg->ring_ms = (uint32_t)(limit * 1000.0) + 1;
            for (int k = 0; k < p->link[s].n; k++)
                if (peer_alive(p, s, k))
                    memcpy(avg->addrs[avg->n++], p->link[s].peer[k].ring, STAGE_ADDR_MAX);
            wire_writer w;
            wire_writer_init(&w, 64 * 1024);
            stage_msg_put_average(&w, avg);
            uint64_t id = ++p->next_id;
            int sent[PIPE_MAX_PEERS] = {0}, failed = 0;
            uint32_t held = 0;
            cirrus_error why[PIPE_MAX_PEERS];
            for (int k = 0; k < p->link[s].n; k++)
                if (peer_alive(p, s, k))
                    sent[k] = send_to(p, s, k, STAGE_AVERAGE, id, &w, &why[k]) == 0 ? 1 : -1;
            wire_writer_free(&w);
            int faulty[PIPE_MAX_PEERS] = {0};
            for (int k = 0; k < p->link[s].n; k++) {
                if (sent[k] == 0) continue;
                wire_reader r;
                const double left = wait_until - now_s();
                int rc = sent[k] == 1 ? await_reply(p, s, k, STAGE_AVERAGE, id, &r,
                                                    (int)((left > 0.01 ? left : 0.01) * 1000.0),
                                                    &why[k])
                                      : CIRRUS_ECLOSED;
                if (rc == CIRRUS_ETIMEDOUT) deadline_observe_timeout(p->avg_deadline[s], now_s() - t0);
                if (!rc) {
                    uint32_t mb = 0;
                    if (!stage_msg_get_average_ok(&r, &mb)) {
                        held += mb;
                        continue;
                    }
                    rc = cirrus_fail(&why[k], CIRRUS_ECORRUPT, "bad AVERAGE reply");
                }
                /* A member that failed, or a refusal because another member vanished
                 * mid-ring: the round is repeated. Only transport faults remove a peer. */
                failed = 1;
                faulty[k] = pipe_is_peer_fault(rc);
            }
            for (int k = 0; k < p->link[s].n; k++) {
                int rc = faulty[k] ? pipe_peer_failed(p, s, k, &why[k], err) : 0;
                if (rc) return rc;
            }
            if (failed) {
                p->counters.retried++;
                missing = 0;
                continue;
            }
            deadline_observe(p->avg_deadline[s], now_s() - t0);
            if (sync && held != (uint32_t)expected && attempt < PIPE_MAX_PEERS + 2) {
                missing = expected - (int)held; /* < 0: more than the step has */
                continue;
            }
            if (held != (uint32_t)expected)
                return cirrus_fail(err, CIRRUS_EIO,
                                   "stage %d: peers hold %u microbatches, the step has %d", s,
                                   held, expected);
            p->averaged[s] = 1;
            break;
        }
    }
    return 0;
}

/* Move the head's share of d(wte) from the last stage to the first, fold it there and give
 * the folded gradient back to the last stage, whose wte copy takes the same update. */
static int exchange_tied(pipeline *p, cirrus_error *err)
{
    const size_t n = (size_t)p->cfg.vocab * p->cfg.n_embd;
    const int first = 0, last = p->n - 1;
    wire_writer w;
    wire_reader r;
    int served, answered;
    wire_writer_init(&w, 0);
    const float *g = NULL;
    int rc = on_stage(p, last, -1, STAGE_HEAD_GRAD, 0, 0, &w, &r, &served, err);
    if (!rc && stage_msg_get_tied(&r, n, &g))
        rc = cirrus_fail(err, CIRRUS_ECORRUPT, "bad HEAD_GRAD reply");
    if (rc) return rc;
    memcpy(p->tied, g, sizeof(float) * n);
    wire_writer_init(&w, PIPE_REPLY_LIMIT);
    stage_msg_put_tied(&w, p->tied, n);
    rc = on_all_peers(p, first, STAGE_FOLD_TIED, &w, &r, &answered, err);
    wire_writer_free(&w);
    if (!rc && (!answered || stage_msg_get_tied(&r, n, &g)))
        rc = cirrus_fail(err, CIRRUS_ECORRUPT, "bad FOLD_TIED reply");
    if (rc || first == last) return rc;
    memcpy(p->tied, g, sizeof(float) * n);
    wire_writer_init(&w, PIPE_REPLY_LIMIT);
    stage_msg_put_tied(&w, p->tied, n);
    rc = on_all_peers(p, last, STAGE_SET_TIED, &w, &r, &answered, err);
    wire_writer_free(&w);
    return rc;
}

static int part_cmp(const void *a, const void *b)
{
    uint64_t x = ((const stage_sumsq_part *)a)->offset, y = ((const stage_sumsq_part *)b)->offset;
    return x < y ? -1 : x > y;
}

/* The global sum of squares: every stage's per-tensor sums, each tensor once (wte is held
 * by the first and last stages), added in buffer order like adamw_total_sumsq(). */
static int global_sumsq(pipeline *p, double *total, cirrus_error *err)
{
    size_t n = 0;
    stage_sumsq_part *parts = NULL;
    int rc = 0;
    for (int s = 0; !rc && s < p->n; s++) {
        wire_writer w;
        wire_reader r;
        int served;
        stage_sumsq_part *got = NULL;
        uint32_t k = 0;
        wire_writer_init(&w, 0);
        if ((rc = on_stage(p, s, -1, STAGE_SUMSQ, 0, 0, &w, &r, &served, err))) break;
        if ((rc = stage_msg_get_sumsq(&r, &got, &k))) {
            rc = rc == CIRRUS_ENOMEM ? cirrus_fail(err, rc, "out of memory")
                                     : cirrus_fail(err, rc, "stage %d: bad SUMSQ reply", s);
            break;
        }
        stage_sumsq_part *grown = k ? realloc(parts, sizeof *parts * (n + k)) : parts;
        if (k && !grown)
            rc = cirrus_fail(err, CIRRUS_ENOMEM, "out of memory");
        else if (k) {
            parts = grown;
            memcpy(parts + n, got, sizeof *parts * k);
            n += k;
        }
        free(got);
    }
    if (!rc) {
        if (n) qsort(parts, n, sizeof *parts, part_cmp);
        *total = 0.0;
        for (size_t i = 0; i < n; i++)
            if (i == 0 || parts[i].offset != parts[i - 1].offset) *total += parts[i].sumsq;
    }
    free(parts);
    return rc;
}

int pipeline_step(pipeline *p, float lr, float grad_scale, uint64_t step, cirrus_error *err)
{
    return pipeline_step_shared(p, lr, grad_scale, step, NULL, err);
}

void pipeline_step_skip(pipeline *p, uint64_t step)
{
    p->n_mb = p->next_start = p->mb_active = 0;
    p->steps_done = step;
}

int pipeline_step_shared(pipeline *p, float lr, float grad_scale, uint64_t step,
                         const pipeline_step_sync *sync, cirrus_error *err)
{
    double total = 0.0;
    int rc = average_stages(p, sync, err);
    if (!rc) rc = exchange_tied(p, err);
    if (!rc) rc = global_sumsq(p, &total, err);
    for (int s = 0; !rc && s < p->n; s++) {
        wire_writer w;
        wire_reader r;
        int answered;
        const stage_step st = {.lr = lr, .grad_scale = grad_scale, .step = step,
                               .sumsq = total};
        wire_writer_init(&w, 64);
        stage_msg_put_step(&w, &st);
        rc = on_all_peers(p, s, STAGE_STEP, &w, &r, &answered, err);
        wire_writer_free(&w);
        if (!rc && !answered) rc = cirrus_fail(err, CIRRUS_ECLOSED, "stage %d: no peer stepped", s);
    }
    p->n_mb = p->next_start = p->mb_active = 0;
    memset(p->averaged, 0, sizeof p->averaged);
    if (!rc) p->steps_done = step;
    return rc;
}

/* ---- membership ---- */

/* Connect to one peer and check what it serves; fills slot k of stage s. */
static int connect_peer(pipeline *p, int s, int k, const char *addr, int *l1, uint64_t *steps,
                        cirrus_error *err)
{
    const gpt_config *cfg = &p->cfg;
    peer_link *pl = &p->link[s].peer[k];
    char host[STAGE_ADDR_MAX];
    int port, rc;
    memset(pl, 0, sizeof *pl);
    snprintf(pl->addr, sizeof pl->addr, "%s", addr);
    if ((rc = net_split_hostport(addr, host, sizeof host, &port, 0, err))) return rc;
    if ((rc = net_connect(host, port, p->timeout_ms, &pl->c, err))) return rc;
    net_set_max_payload(pl->c, PIPE_REPLY_LIMIT);
    if ((rc = net_hello_client(pl->c, p->job_id, STAGE_ROLE_CLIENT, 0, p->timeout_ms, err)))
        goto fail;
    wire_writer w;
    wire_reader r;
    wire_writer_init(&w, 0);
    if ((rc = pipe_call_peer(p, s, k, STAGE_INFO, &w, &r, err))) goto fail;
    stage_info in;
    const int bad = stage_msg_get_info(&r, &in);
    *steps = in.steps;
    memcpy(pl->ring, in.ring, sizeof pl->ring);
    int expect_l0 = s ? p->link[s - 1].l1 : 0;
    if (bad || (int)in.l0 != expect_l0 || in.l1 <= in.l0 || (*l1 >= 0 && (int)in.l1 != *l1) ||
        (int)in.n_layer != cfg->n_layer || (int)in.n_embd != cfg->n_embd ||
        (int)in.n_head != cfg->n_head || (int)in.seq_len != cfg->seq_len) {
        rc = cirrus_fail(err, CIRRUS_EMISMATCH,
                         "stage %d at %s serves layers [%u, %u) of a model of %u layers x "
                         "%u (%u heads, context %u); expected layers from %d of %d x %d "
                         "(%d heads, context %d)",
                         s, addr, in.l0, in.l1, in.n_layer, in.n_embd, in.n_head, in.seq_len,
                         expect_l0, cfg->n_layer, cfg->n_embd, cfg->n_head, cfg->seq_len);
        goto fail;
    }
    *l1 = (int)in.l1;
    return 0;
fail:
    net_close(pl->c);
    pl->c = NULL;
    return rc;
}

int pipeline_connect(pipeline **out, const char *job_id, int n, const int *peers,
                     const char *const *addrs, const gpt_config *cfg, int max_B, int max_T,
                     int codec, int timeout_ms, cirrus_error *err)
{
    *out = NULL;
    if (n < 1 || n > PIPE_MAX_STAGES)
        return cirrus_fail(err, CIRRUS_EINVAL, "stages must be in [1, %d], got %d",
                           PIPE_MAX_STAGES, n);
    for (int s = 0; s < n; s++)
        if (peers[s] < 1 || peers[s] > PIPE_MAX_PEERS)
            return cirrus_fail(err, CIRRUS_EINVAL, "stage %d: peers must be in [1, %d], got %d",
                               s, PIPE_MAX_PEERS, peers[s]);
    pipeline *p = calloc(1, sizeof *p);
    if (!p) return cirrus_fail(err, CIRRUS_ENOMEM, "out of memory");
    p->n = n;
    p->cfg = *cfg;
    p->codec = codec;
    p->timeout_ms = timeout_ms;
    p->max_B = max_B;
    p->max_T = max_T;
    snprintf(p->job_id, sizeof p->job_id, "%s", job_id);
    deadline_config dc = deadline_config_default();
    /* Until a stage has answered a few times, wait as long as the caller's timeout. */
    dc.initial_s = timeout_ms / 1000.0;
    /* Dropping a healthy peer costs a state copy when it rejoins: with several peers
     * sharing a few cores, scheduling alone can triple a latency, so a request is given
     * up only past 3x the median and never before 1 s (a hung peer still goes in ~1 s). */
    dc.min_ratio = PIPE_PEER_DEADLINE_RATIO;
    dc.floor_s = 1.0;
    /* An averaging round is given up past 3x the median round and never before 2 s (a
     * member's first rounds also connect the ring). */
    deadline_config ac = dc;
    ac.floor_s = 2.0;
    for (int s = 0; s < n; s++)
        for (int kind = 0; kind < 3; kind++)
            if (deadline_estimator_create(kind < 2 ? &p->deadline[s][kind] : &p->avg_deadline[s],
                                          kind < 2 ? &dc : &ac) != 0) {
                pipeline_close(p);
                return cirrus_fail(err, CIRRUS_ENOMEM, "out of memory");
            }
    p->policy = WIRING_LEAST_LOADED;
    if (!(p->wiring = wiring_create(n, p->policy, 0))) {
        pipeline_close(p);
        return cirrus_fail(err, CIRRUS_ENOMEM, "out of memory");
    }
    const size_t N = (size_t)max_B * max_T, C = (size_t)cfg->n_embd;
    int rc = 0;
    for (int s = 0; s <= n && !rc; s++)
        if (!(p->acts[s] = malloc(sizeof(float) * N * C))) rc = CIRRUS_ENOMEM;
    p->tied = malloc(sizeof(float) * (size_t)cfg->vocab * C);
    if (rc || !p->tied) {
        rc = cirrus_fail(err, CIRRUS_ENOMEM, "out of memory");
        goto fail;
    }
    int a = 0;
    for (int s = 0; s < n; s++) {
        int l1 = -1; /* every peer of a stage must serve the same layers */
        for (int k = 0; k < peers[s]; k++) {
            uint64_t steps;
            p->link[s].n = k + 1;
            if ((rc = connect_peer(p, s, k, addrs[a++], &l1, &steps, err))) goto fail;
            if (steps > p->steps_done && steps != STAGE_STEPS_UNKNOWN) p->steps_done = steps;
            if (track_peer(p, s, k)) {
                rc = cirrus_fail(err, CIRRUS_ENOMEM, "out of memory");
                goto fail;
            }
        }
        p->link[s].l0 = s ? p->link[s - 1].l1 : 0;
        p->link[s].l1 = l1;
    }
    if (p->link[n - 1].l1 != cfg->n_layer) {
        rc = cirrus_fail(err, CIRRUS_EMISMATCH, "the stages end at layer %d of %d",
                         p->link[n - 1].l1, cfg->n_layer);
        goto fail;
    }
    *out = p;
    return 0;
fail:
    pipeline_close(p);
    return rc;
}

/* Peer k of stage s takes the state of peer `donor` of the stage (SYNC); it drops the
 * gradients it holds, so only between steps, or for a peer that holds none. */
static int sync_peer(pipeline *p, int s, int k, int donor, cirrus_error *err)
{
    wire_writer w;
    wire_reader r;
    wire_writer_init(&w, 512);
    stage_msg_put_sync(&w, p->link[s].peer[donor].addr);
    int rc = pipe_call_peer(p, s, k, STAGE_SYNC, &w, &r, err);
    wire_writer_free(&w);
    return rc;
}

/* The optimizer steps peer k of stage s has taken (INFO). */
static int peer_steps(pipeline *p, int s, int k, uint64_t *steps, cirrus_error *err)
{
    wire_writer w;
    wire_reader r;
    wire_writer_init(&w, 0);
    int rc = pipe_call_peer(p, s, k, STAGE_INFO, &w, &r, err);
    if (rc) return rc;
    stage_info in;
    if (stage_msg_get_info(&r, &in))
        return cirrus_fail(err, CIRRUS_ECORRUPT, "stage %d: bad INFO reply", s);
    *steps = in.steps;
    return 0;
}

int pipeline_align_peers(pipeline *p, cirrus_error *err)
{
    for (int s = 0; s < p->n; s++) {
        int donor = -1;
        uint64_t steps[PIPE_MAX_PEERS] = {0};
        for (int k = 0; k < p->link[s].n; k++) {
            if (!peer_alive(p, s, k)) continue;
            int rc = peer_steps(p, s, k, &steps[k], err);
            if (rc) return rc;
            if (steps[k] == p->steps_done) donor = k;
        }
        for (int k = 0; k < p->link[s].n; k++) {
            if (!peer_alive(p, s, k) || steps[k] == p->steps_done) continue;
            peer_link *pl = &p->link[s].peer[k];
            int rc = 0;
            if (!p->follower && donor >= 0) {
                rc = sync_peer(p, s, k, donor, err);
                if (!rc) {
                    log_info("stage %d: peer %s was behind (step %llu of %llu): it took the "
                             "state of %s", s, pl->addr, (unsigned long long)steps[k],
                             (unsigned long long)p->steps_done, p->link[s].peer[donor].addr);
                    continue;
                }
            }
            /* Not for this client to copy (a follower), or the copy failed: left out now,
             * admitted once it is at the stage's step. */
            log_info("stage %d: peer %s is behind (step %llu of %llu): left out for now", s,
                     pl->addr, (unsigned long long)steps[k], (unsigned long long)p->steps_done);
            net_close(pl->c);
            pl->c = NULL;
            wiring_peer_remove(p->wiring, s, pl->wid);
            if (alive_count(p, s) == 0)
                return rc ? rc : cirrus_fail(err, CIRRUS_ECLOSED, "stage %d has no peer at "
                                             "step %llu", s, (unsigned long long)p->steps_done);
        }
    }
    return 0;
}

int pipeline_take_over(pipeline *p, cirrus_error *err)
{
    for (int s = 0; s < p->n; s++)
        for (int k = 0; k < p->link[s].n; k++) {
            wire_writer w;
            wire_reader r;
            wire_writer_init(&w, 0);
            int rc = peer_alive(p, s, k) ? pipe_call_peer(p, s, k, STAGE_RESET, &w, &r, err) : 0;
            if (rc) return rc;
        }
    return 0;
}

/* A peer listed at stage s that this client still has live at another stage moved there
 * (rebalancing). Between steps it holds none of this client's gradients: it leaves its
 * old stage without a ban, its connection (refused since the move) closed. */
static int retire_moved(pipeline *p, int s, const char *addr, cirrus_error *err)
{
    for (int o = 0; o < p->n; o++)
        for (int k = 0; o != s && k < p->link[o].n; k++) {
            peer_link *pl = &p->link[o].peer[k];
            if (!pl->c || strcmp(pl->addr, addr) != 0) continue;
            if (alive_count(p, o) == 1)
                return cirrus_fail(err, CIRRUS_EINVAL, "peer %s is stage %d's last", addr, o);
            log_info("stage %d: peer %s moved to stage %d", o, addr, s);
            net_close(pl->c);
            pl->c = NULL;
            wiring_peer_remove(p->wiring, o, pl->wid);
            p->counters.peers_lost++;
        }
    return 0;
}

int pipeline_join(pipeline *p, int s, const char *addr, cirrus_error *err)
{
    if (s < 0 || s >= p->n) return cirrus_fail(err, CIRRUS_EINVAL, "no stage %d", s);
    stage_link *L = &p->link[s];
    for (int k = 0; k < L->n; k++)
        if (peer_alive(p, s, k) && strcmp(L->peer[k].addr, addr) == 0) return 0; /* known */
    for (int i = 0; i < p->n_dead; i++)
        if (strcmp(p->dead[i], addr) == 0) return 0; /* lost once: never again */
    int rc = retire_moved(p, s, addr, err);
    if (rc) return rc;
    int k = 0;
    while (k < L->n && peer_alive(p, s, k)) k++;
    if (k == PIPE_MAX_PEERS)
        return cirrus_fail(err, CIRRUS_EINVAL, "stage %d already has %d peers", s, k);
    int donor = pipe_any_live_peer(p, s);
    if (donor < 0) return cirrus_fail(err, CIRRUS_ECLOSED, "stage %d has no peer to copy", s);
    if (k == L->n) L->n++;
    int l1 = L->l1;
    uint64_t steps;
    rc = connect_peer(p, s, k, addr, &l1, &steps, err);
    /* The same process under another name would be averaged twice: its ring address (or
     * a missing one, with which it cannot average at all) gives it away. */
    for (int j = 0; !rc && j < L->n; j++)
        if (j != k && peer_alive(p, s, j) &&
            (!L->peer[k].ring[0] || strcmp(L->peer[j].ring, L->peer[k].ring) == 0))
            rc = cirrus_fail(err, CIRRUS_EINVAL,
                             "peer %s has no ring address or the same one as %s", addr,
                             L->peer[j].addr);
    /* A peer at the stage's step holds its state already (it took it from a peer of the
     * stage, or trained every step with them). One behind copies it (SYNC), which drops
     * the gradients it holds: only between steps, and only by the client that steps, so
     * that no other client's microbatch is ever lost to it. Until then it is left out. */
    const int behind = !rc && (steps != p->steps_done || steps == 0); /* 0: a seed to check */
    if (behind && (p->follower || p->n_mb)) {
        net_close(L->peer[k].c);
        L->peer[k].c = NULL;
        return 0;
    }
    if (behind) rc = sync_peer(p, s, k, donor, err);
    if (!rc && track_peer(p, s, k)) rc = cirrus_fail(err, CIRRUS_ENOMEM, "out of memory");
    if (rc) {
        net_close(L->peer[k].c);
        L->peer[k].c = NULL;
        return rc;
    }
    p->counters.peers_joined++;
    if (behind)
        log_info("stage %d: peer %s joined (state from %s)", s, addr, L->peer[donor].addr);
    else
        log_info("stage %d: peer %s joined (already at step %llu)", s, addr,
                 (unsigned long long)steps);
    return 0;
}

int pipeline_peer_reported_lost(pipeline *p, int s, const char *addr, cirrus_error *err)
{
    if (s < 0 || s >= p->n) return cirrus_fail(err, CIRRUS_EINVAL, "no stage %d", s);
    for (int k = 0; k < p->link[s].n; k++) {
        if (!peer_alive(p, s, k) || strcmp(p->link[s].peer[k].addr, addr) != 0) continue;
        /* Not banned: if it is alive after all, the coordinator still lists it and it
         * rejoins with the stage's state. */
        cirrus_error why;
        cirrus_fail(&why, CIRRUS_ETIMEDOUT, "reported lost by the client that steps");
        return pipe_peer_failed(p, s, k, &why, err);
    }
    return 0; /* lost here already: its backwards were redone then */
}

void pipeline_set_follower(pipeline *p, int follower)
{
    p->follower = follower;
}

void pipeline_on_peer_lost(pipeline *p, pipeline_lost_fn fn, void *ctx)
{
    p->on_lost = fn;
    p->on_lost_ctx = ctx;
}

void pipeline_log_routing(const pipeline *p)
{
    for (int s = 0; s < p->n; s++) {
        char line[1024];
        size_t used = 0;
        line[0] = '\0';
        for (int k = 0; k < p->link[s].n && used < sizeof line; k++) {
            const peer_link *pl = &p->link[s].peer[k];
            wiring_peer_stats ps = {0};
            if (!pl->c || wiring_peer_stats_get(p->wiring, s, pl->wid, &ps)) continue;
            used += (size_t)snprintf(line + used, sizeof line - used,
                                     "%s%s %u requests, %.0f samples/s", used ? "; " : "",
                                     pl->addr, pl->served, ps.throughput);
        }
        log_info("stage %d routing (%s): %s", s,
                 p->policy == WIRING_ROUND_ROBIN ? "round robin" : "wiring", line);
    }
}

uint64_t pipeline_steps_done(const pipeline *p)
{
    return p->steps_done;
}

void pipeline_stage_load(const pipeline *p, int s, int *peers, double *samples_per_s)
{
    *peers = 0;
    *samples_per_s = 0.0;
    for (int k = 0; s >= 0 && s < p->n && k < p->link[s].n; k++) {
        const peer_link *pl = &p->link[s].peer[k];
        if (!pl->c) continue;
        (*peers)++;
        const double rate = wiring_throughput(p->wiring, s, pl->wid);
        if (rate > 0) *samples_per_s += rate;
    }
}

const pipeline_counters *pipeline_get_counters(const pipeline *p)
{
    return &p->counters;
}

int pipeline_stages(const pipeline *p)
{
    return p->n;
}

const gpt_config *pipeline_config(const pipeline *p)
{
    return &p->cfg;
}

int pipeline_set_routing(pipeline *p, enum wiring_policy policy, int inflight, uint64_t seed,
                         cirrus_error *err)
{
    if (p->n_mb) return cirrus_fail(err, CIRRUS_EINVAL, "routing changes between steps only");
    if (inflight < 0 || inflight > PIPE_MAX_MICRO)
        return cirrus_fail(err, CIRRUS_EINVAL, "microbatches in flight must be in [0, %d], got %d",
                           PIPE_MAX_MICRO, inflight);
    p->inflight = inflight;
    wiring *w = wiring_create(p->n, policy, seed);
    if (!w) return cirrus_fail(err, CIRRUS_EINVAL, "bad routing policy %d", (int)policy);
    for (int s = 0; s < p->n; s++)
        for (int k = 0; k < p->link[s].n; k++)
            if (peer_alive(p, s, k) && wiring_peer_add(w, s, p->link[s].peer[k].wid)) {
                wiring_destroy(w);
                return cirrus_fail(err, CIRRUS_ENOMEM, "out of memory");
            }
    wiring_destroy(p->wiring);
    p->wiring = w;
    p->policy = policy;
    return 0;
}

void pipeline_close(pipeline *p)
{
    if (!p) return;
    wiring_destroy(p->wiring);
    for (int s = 0; s < p->n; s++) {
        for (int kind = 0; kind < 2; kind++) deadline_estimator_destroy(p->deadline[s][kind]);
        deadline_estimator_destroy(p->avg_deadline[s]);
    }
    for (int s = 0; s < p->n; s++)
        for (int k = 0; k < p->link[s].n; k++) net_close(p->link[s].peer[k].c);
    for (int s = 0; s <= p->n; s++) free(p->acts[s]);
    for (int m = 0; m < PIPE_MAX_MICRO; m++) {
        mb_record *mb = &p->mb[m];
        if (!mb->x) continue;
        for (int s = 0; s < p->n; s++) {
            if (mb->in) free(mb->in[s]);
            if (mb->gout) free(mb->gout[s]);
        }
        free(mb->x);
        free(mb->y);
        free(mb->in);
        free(mb->gout);
        free(mb->bw_peer);
        free(mb->fw_peer);
    }
    free(p->tasks);
    free(p->tied);
    free(p);
}
