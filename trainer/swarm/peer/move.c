/* move: a stage peer moving to another stage (rebalancing). The coordinator's instruction
 * arrives with a heartbeat; the peer leaves between steps (or after a wait, whatever it
 * holds), refuses every request while a mover thread fetches the new stage's layers and
 * state from a live peer there into a freshly built stage kit, and swaps the kit in. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../../../common/clock.h"
#include "../../../common/log.h"
#include "peer_internal.h"

/* ---- the stage kit ---- */

void peer_kit_free(stage_kit *k)
{
    for (int i = 0; i < STAGE_PEER_MAX_SLOTS; i++) gpt_stage_free(k->slot[i]);
    adamw_free(&k->adam);
    free(k->pack);
    free(k->backup);
    memset(k, 0, sizeof *k);
}

int peer_kit_build(peer *p, int l0, int l1, stage_kit *k, cirrus_error *err)
{
    const stage_peer_options *o = p->opt;
    int rc = 0;
    memset(k, 0, sizeof *k);
    k->l0 = l0;
    k->l1 = l1;
    for (int i = 0; i < p->n_slots && !rc; i++)
        rc = gpt_stage_new(&k->slot[i], &p->model, l0, l1, o->max_B, o->max_T, err);
    gpt_span spans[2];
    const int n = gpt_stage_state_spans(&o->model, l0, l1, spans);
    if (!rc) rc = adamw_init(&k->adam, &o->model, spans, n, &o->adam, err);
    if (!rc) {
        const int last = l1 == o->model.n_layer; /* also packs the LM head's d(wte) share */
        k->pack_count = k->adam.state_count + (last ? p->V * p->C : 0);
        k->pack = malloc(sizeof(float) * (k->pack_count ? k->pack_count : 1));
        k->backup = malloc(sizeof(float) * (k->pack_count ? k->pack_count : 1));
        if (!k->pack || !k->backup)
            rc = cirrus_fail(err, CIRRUS_ENOMEM, "cannot allocate stage buffers");
    }
    if (rc) peer_kit_free(k);
    return rc;
}

/* Under the lock, or before serving. The activation slots start empty. */
void peer_kit_swap(peer *p, stage_kit *k)
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

/* Leave the current stage (under the lock): from now on every request is refused until
 * the mover has built the new one, and connections opened before are refused for good. */
void peer_start_move_locked(peer *p)
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
void peer_take_instruction(peer *p, uint32_t ins)
{
    const double now = clock_now_s();
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
            peer_start_move_locked(p);
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
    int rc = peer_donor_open(p, donor->host, donor->port, (int)donor->l0, (int)donor->l1, &c, &why,
                        err);
    if (rc) return rc;
    if ((rc = peer_kit_build(p, (int)donor->l0, (int)donor->l1, &kit, err))) {
        net_close(c);
        return rc;
    }
    rc = peer_take_state(p, c, kit.l0, kit.l1, &kit.adam, &steps, &why, err);
    net_close(c);
    if (rc) {
        peer_kit_free(&kit);
        return rc;
    }
    pthread_mutex_lock(&p->mu);
    peer_kit_swap(p, &kit);
    p->stage = to;
    p->steps = steps;
    peer_drop_gradients(p);
    peer_drop_rings(p); /* the new stage's members are named by the next AVERAGE */
    p->last_round = 0;
    p->rates_reset = 1;
    p->move_to = -1;
    atomic_store(&p->moving, 0);
    pthread_mutex_unlock(&p->mu);
    peer_kit_free(&kit); /* the old stage's */
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

static void *mover_main(void *arg)
{
    peer_mover *mv = arg;
    peer *p = mv->p;
    cirrus_error err = {0};
    if (move_stage(p, mv->cc, mv->to, &err)) {
        pthread_mutex_lock(&p->mu);
        log_warn("move to stage %d failed: %s; serving stage %d again, retrying in %d s",
                 mv->to, err.msg, p->stage, STAGE_PEER_MOVE_RETRY_S);
        p->retry_after_s = clock_now_s() + STAGE_PEER_MOVE_RETRY_S;
        p->move_to = -1;
        atomic_store(&p->moving, 0);
        pthread_mutex_unlock(&p->mu);
    }
    atomic_store(&mv->done, 1);
    return NULL;
}

void peer_mover_poll(peer *p, peer_mover *mv)
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
    p->retry_after_s = clock_now_s() + STAGE_PEER_MOVE_RETRY_S;
    atomic_store(&p->moving, 0);
    pthread_mutex_unlock(&p->mu);
}
