/* pipeline_engine: a step's microbatches through the stages, several in flight at once.
 * Every forward and backward is a task queued for one peer; the engine sends each idle
 * peer its next task and handles the replies as they come (poll over the peers' sockets),
 * so one slow peer delays only the microbatches it holds. See pipeline.h. */
#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>

#include "pipeline_internal.h"

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

/* One forward waited for alone, outside the engine (the evaluation passes). */
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
    int rc = pipe_on_stage(p, s, -1, STAGE_FORWARD, B, charge, &w, &r, served, err);
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
 * or backward is a task, assigned to a peer when it becomes ready (the wiring picks the
 * forward's peer; the backward returns to it) and queued at the client: a peer has at most
 * one request of this client on the wire, so the client still chooses what it does next.
 * Backwards first (they finish a microbatch and find the activations of a recent forward),
 * then the oldest microbatch. */

/* One forward or backward of one microbatch at one stage. */
typedef struct task {
    int m, s, k;             /* microbatch (index in the step), stage, peer slot */
    uint16_t type;           /* STAGE_FORWARD or STAGE_BACKWARD */
    int redo;                /* a backward re-run for a lost peer: only its gradients count */
    int sent;                /* on the wire (id, t_sent, deadline valid) */
    int learned;             /* the deadline is the stage's learned one */
    uint64_t id;
    double t_sent, deadline; /* seconds (clock_now_s) */
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
        k = pipe_routed_peer(p, t->s, mb->B * (1.0 + WIRING_BACKWARD_COST));
    else if (!t->redo && mb->fw_peer[t->s] >= 0 && pipe_peer_alive(p, t->s, mb->fw_peer[t->s]))
        k = mb->fw_peer[t->s];
    else
        k = pipe_routed_peer(p, t->s, WIRING_BACKWARD_COST * mb->B);
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

/* The recomputed grad_in of a redone backward is not needed: upstream already has it. */
int pipe_redo_backwards_of(pipeline *p, int s, int dead, cirrus_error *err)
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

int pipe_reassign_tasks_of(pipeline *p, int s, int k, cirrus_error *err)
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
 * warm and has a live alternative (pipe_deadline_learned). */
static int task_send(pipeline *p, task *t, cirrus_error *err)
{
    wire_writer w;
    wire_writer_init(&w, PIPE_REPLY_LIMIT);
    put_task(p, &w, t);
    t->id = ++p->next_id;
    int rc = pipe_send(p, t->s, t->k, t->type, t->id, &w, err);
    wire_writer_free(&w);
    if (rc) return rc;
    t->sent = 1;
    t->learned = pipe_deadline_learned(p, t->s, t->k);
    t->t_sent = clock_now_s();
    t->deadline = t->t_sent + (t->learned ? pipe_learned_deadline(p, t->s, t->k, t->type,
                                                                  p->mb[t->m].B)
                                          : p->timeout_ms / 1000.0);
    return 0;
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
            if (!pipe_peer_alive(p, s, k)) continue;
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
                         t.s, p->link[t.s].peer[t.k].addr, clock_now_s() - t.t_sent);
    } else {
        /* Readable: the frame is arriving; a peer stalling mid-frame still meets the
         * deadline, with a little slack for the frame that has begun. */
        double left = t.deadline - clock_now_s();
        rc = pipe_await(p, t.s, t.k, t.type, t.id, &r, (int)((left > 0.1 ? left : 0.1) * 1000),
                         &why);
    }
    if (!rc) rc = task_read_reply(p, &t, &r, &why);
    pipe_observe(p, t.s, t.k, t.type, p->mb[t.m].B, clock_now_s() - t.t_sent, t.learned, rc);
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
    double left = first - clock_now_s();
    int ready = poll(fds, (nfds_t)n, left > 0 ? (int)(left * 1000.0) + 1 : 0);
    if (ready < 0 && errno != EINTR)
        return cirrus_fail(err, CIRRUS_EIO, "poll: %s", strerror(errno));
    /* One event per wait: handling it may move or drop other tasks. */
    for (int j = 0; j < n && ready > 0; j++)
        if (fds[j].revents) return task_answer(p, which[j], 0, err);
    for (int j = 0; j < n; j++)
        if (p->tasks[which[j]].deadline <= clock_now_s()) return task_answer(p, which[j], 1, err);
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
    for (int s = 0; s < p->n; s++) peers += pipe_alive_count(p, s);
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
    if (p->restoring)
        return cirrus_fail(err, CIRRUS_EINVAL, "a stage lost its state: no microbatch runs "
                           "until the model's state is installed again");
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
    if (p->restoring)
        return cirrus_fail(err, CIRRUS_EINVAL, "a stage lost its state: nothing is evaluated "
                           "until the model's state is installed again");
    for (int s = 0; s < p->n; s++) {
        int rc = forward_stage(p, s, 0, B, T, 0, x, y, loss, &served, err);
        if (rc) return rc;
    }
    return 0;
}
