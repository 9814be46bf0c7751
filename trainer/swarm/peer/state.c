/* state: a stage's parameters and optimizer state, served to a peer joining the stage
 * (STATE_GET), replaced by the global parameters of an outer step (PARAMS_SET) or by a
 * checkpoint's state (STATE_SET), and copied from a donor peer (SYNC; a move to another
 * stage, move.c). The floats travel in the
 * order stage_msg.h gives: the stage's spans' parameters, then AdamW m, then v. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../../common/log.h"
#include "../proto/rpc.h"
#include "peer_internal.h"

/* The runs (stage_msg.h) of this peer's state for layers [l0, l1) with optimizer state
 * `adam`: the spans' parameters in the model, then adam's m and v. Returns how many; the
 * first n_params of them are the parameters alone. */
static int state_runs(const peer *p, int l0, int l1, const adamw *adam,
                      stage_run runs[STAGE_MAX_RUNS], int *n_params)
{
    gpt_span spans[2];
    const int n = gpt_stage_state_spans(&p->opt->model, l0, l1, spans);
    for (int i = 0; i < n; i++)
        runs[i] = (stage_run){p->model.params + spans[i].offset, spans[i].count};
    runs[n] = (stage_run){adam->m, adam->state_count};
    runs[n + 1] = (stage_run){adam->v, adam->state_count};
    *n_params = n;
    return n + 2;
}

void peer_note_moments(peer *p, uint64_t steps)
{
    /* Only moments that are zero now are known to be fresh: a checkpoint carries no
     * origins (a copy from a peer does: peer_take_state). */
    const int n = adamw_restart_fresh_moments(&p->adam, steps);
    if (n)
        log_info("%d optimizer segment(s) start with fresh moments at step %llu (a restored "
                 "stage): their bias correction counts from there", n, (unsigned long long)steps);
}

/* STATE_GET: this peer's parameters and optimizer state, for a peer joining the stage:
 * all of it, or the slice the request names (checked against the state's size). */
int peer_put_state(peer *p, wire_reader *r, wire_writer *w)
{
    stage_state_get q;
    stage_run runs[STAGE_MAX_RUNS];
    int n_params;
    if (stage_msg_get_state_get(r, 3 * (uint64_t)p->adam.state_count, &q))
        return CIRRUS_ECORRUPT;
    /* Where this peer's moments started again (a restored stage): the copy must step as
     * this peer does, or the stage's peers would drift apart. */
    stage_origin *origins = malloc(((size_t)p->adam.n_seg + 1) * sizeof *origins);
    if (!origins) return CIRRUS_ENOMEM;
    uint32_t k = 0;
    for (int s = 0; s < p->adam.n_seg && k < STAGE_MAX_ORIGINS; s++)
        if (p->adam.seg[s].moments_from)
            origins[k++] = (stage_origin){(uint32_t)s, p->adam.seg[s].moments_from};
    stage_msg_put_state_head(w, p->steps, p->adam.state_count, origins, k);
    free(origins);
    const int n = state_runs(p, p->l0, p->l1, &p->adam, runs, &n_params);
    stage_msg_put_runs(w, runs, n, q.offset, q.count);
    return 0;
}

/* PARAMS_SET: the global parameters of an outer step (or a slice of them) replace this
 * peer's, between two steps; the optimizer state stays. */
int peer_set_params(peer *p, wire_reader *r, const char **why)
{
    stage_params_set q;
    stage_run runs[STAGE_MAX_RUNS];
    int n_params;
    if (stage_msg_get_params_set(r, p->adam.state_count, &q)) return CIRRUS_ECORRUPT;
    if (q.steps != p->steps || p->mb_since_step || p->summed) {
        *why = "PARAMS_SET refused: the peer is not between the steps the client names";
        return CIRRUS_EMISMATCH;
    }
    state_runs(p, p->l0, p->l1, &p->adam, runs, &n_params);
    stage_msg_take_runs(runs, n_params, q.offset, q.floats, q.count);
    return 0;
}

/* STATE_SET: a checkpoint's state (or a slice of it) replaces this peer's: parameters and
 * AdamW moments, and, once the last slice is in, the step count. From the first slice on
 * the peer holds no one's state until the last arrives: it is at no step
 * (STAGE_STEPS_UNKNOWN, which no client admits without a copy) and holds no gradients
 * (they were computed with the parameters being replaced). */
int peer_set_state(peer *p, wire_reader *r, const char **why)
{
    stage_params_set q;
    stage_run runs[STAGE_MAX_RUNS];
    int n_params;
    const uint64_t n = p->adam.state_count;
    if (stage_msg_get_state_set(r, n, &q)) return CIRRUS_ECORRUPT;
    if (q.steps == STAGE_STEPS_UNKNOWN) {
        *why = "STATE_SET refused: no step count";
        return CIRRUS_EINVAL;
    }
    if (q.offset == 0) {
        p->steps = STAGE_STEPS_UNKNOWN;
        peer_drop_gradients(p);
    } else if (p->steps != STAGE_STEPS_UNKNOWN) {
        *why = "STATE_SET refused: a slice after offset 0 without the first";
        return CIRRUS_EINVAL;
    }
    const int n_runs = state_runs(p, p->l0, p->l1, &p->adam, runs, &n_params);
    stage_msg_take_runs(runs, n_runs, q.offset, q.floats, q.count);
    if (q.offset + q.count == 3 * n) {
        p->steps = q.steps;
        peer_note_moments(p, q.steps);
        log_info("took a state installed by the client at step %llu", (unsigned long long)q.steps);
    }
    return 0;
}

/* A connection to the donor at host:port, checked (INFO) to serve layers [l0, l1) of this
 * peer's model: a donor that moved to another stage since it was named must not hand over
 * that stage's state, even one of the same size. */
int peer_donor_open(peer *p, const char *host, int port, int l0, int l1, net_conn **out,
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
 * go (the runs of the new state). */
typedef struct state_taker {
    net_conn *c;
    uint64_t next_id;
    stage_run runs[STAGE_MAX_RUNS];
    int n_runs;
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
    stage_msg_take_runs(t->runs, t->n_runs, off, floats, count);
}

/* STATE_GET from the donor on c, slice by slice: its step, and the parameters and AdamW
 * moments of layers [l0, l1) (those of `adam`), copied into this peer's model and into
 * `adam`. On failure part of them may have been copied: the caller treats the state as
 * unknown. */
int peer_take_state(peer *p, net_conn *c, int l0, int l1, adamw *adam, uint64_t *steps,
                    const char **why, cirrus_error *err)
{
    *why = "cannot fetch the donor's state";
    state_taker t = {.c = c, .next_id = 1};
    int n_params;
    t.n_runs = state_runs(p, l0, l1, adam, t.runs, &n_params);
    stage_origins origins = {malloc(((size_t)adam->n_seg + 1) * sizeof(stage_origin)),
                             (uint32_t)adam->n_seg, 0};
    if (!origins.o) return cirrus_fail(err, CIRRUS_ENOMEM, "out of memory");
    int rc = stage_fetch_state(donor_call, take_floats, &t, adam->state_count, steps, &origins,
                               err);
    /* The donor's moments origins: where its moments started again, ours do. */
    for (uint32_t i = 0; !rc && i < origins.n; i++)
        if (origins.o[i].segment >= (uint32_t)adam->n_seg)
            rc = cirrus_fail(err, CIRRUS_EMISMATCH, "the donor names optimizer segment %u of %d",
                             origins.o[i].segment, adam->n_seg);
    if (!rc) {
        for (int s = 0; s < adam->n_seg; s++) adam->seg[s].moments_from = 0;
        for (uint32_t i = 0; i < origins.n; i++)
            adam->seg[origins.o[i].segment].moments_from = origins.o[i].from;
        if (origins.n)
            log_info("%u optimizer segment(s) take the donor's fresh moments: their bias "
                     "correction counts from their restart", origins.n);
    }
    free(origins.o);
    if (rc == CIRRUS_EMISMATCH) *why = "the donor's state does not fit this peer";
    return rc;
}

/* SYNC: fetch a live peer's state and make it ours. Nothing changes unless all of it
 * arrived and has the size of this peer's segments. */
int peer_sync_from(peer *p, const char *donor, const char **why)
{
    char host[STAGE_ADDR_MAX];
    int port, rc;
    net_conn *c = NULL;
    cirrus_error err = {0};
    uint64_t steps = 0;
    *why = "cannot reach the donor peer";
    if ((rc = net_split_hostport(donor, host, sizeof host, &port, 0, &err)) ||
        (rc = peer_donor_open(p, host, port, p->l0, p->l1, &c, why, &err)))
        goto out;
    if ((rc = peer_take_state(p, c, p->l0, p->l1, &p->adam, &steps, why, &err))) {
        /* Part of the state may be the donor's now: at no step is it anyone's, until a
         * copy succeeds (a client admits a peer without a copy only at the stage's step). */
        p->steps = STAGE_STEPS_UNKNOWN;
        peer_drop_gradients(p);
        goto out;
    }
    p->steps = steps;
    peer_drop_gradients(p);
    log_info("joined the stage with the state of %s at step %llu", donor,
             (unsigned long long)steps);
out:
    if (rc && err.msg[0]) log_warn("sync from %s: %s", donor, err.msg);
    net_close(c);
    return rc;
}
