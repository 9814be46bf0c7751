/* pipeline_members: which peers serve each stage. A peer is connected and checked (INFO:
 * the layers of this model it serves), peers behind the region's step are brought to it
 * (SYNC: a copy of a live peer of the stage) or left out, peers the coordinator lists join
 * between steps, a peer that moved to another stage (rebalancing) leaves its old one
 * unbanned, one another client lost is dropped here too, and a step a lost stage cut
 * short is abandoned. See pipeline.h. */
#include <stdio.h>
#include <string.h>

#include "../../../common/log.h"
#include "pipeline_internal.h"

int pipe_connect_peer(pipeline *p, int s, int k, const char *addr, int *l1, uint64_t *steps,
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
            if (!pipe_peer_alive(p, s, k)) continue;
            int rc = peer_steps(p, s, k, &steps[k], err);
            if (rc) return rc;
            if (steps[k] == p->steps_done) donor = k;
        }
        for (int k = 0; k < p->link[s].n; k++) {
            if (!pipe_peer_alive(p, s, k) || steps[k] == p->steps_done) continue;
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
            if (pipe_alive_count(p, s) == 0)
                return rc ? rc : cirrus_fail(err, CIRRUS_ECLOSED, "stage %d has no peer at "
                                             "step %llu", s, (unsigned long long)p->steps_done);
        }
    }
    return 0;
}

int pipeline_abandon_step(pipeline *p, cirrus_error *err)
{
    (void)err; /* nothing here fails the pipeline: a peer that fails is dropped */
    p->n_mb = p->next_start = p->mb_active = 0;
    p->n_tasks = 0;
    memset(p->averaged, 0, sizeof p->averaged);
    p->restoring = 1;
    /* The survivors drop what they accumulated of the step (the state to come replaces
     * their parameters anyway, but not gradients). */
    for (int s = 0; s < p->n; s++)
        for (int k = 0; k < p->link[s].n; k++) {
            if (!pipe_peer_alive(p, s, k)) continue;
            wire_writer w;
            wire_reader r;
            cirrus_error why = {0}, ignored = {0};
            wire_writer_init(&w, 0);
            int rc = pipe_call_peer(p, s, k, STAGE_RESET, &w, &r, &why);
            /* A stage left empty by this is one more to wait for: not an error here. */
            if (rc) pipe_peer_failed(p, s, k, &why, &ignored);
        }
    log_warn("the step in progress is abandoned: the model's state is installed again once "
             "every stage has a peer");
    return 0;
}

int pipeline_resume_intact(pipeline *p, cirrus_error *err)
{
    if (!p->restoring) return 0;
    for (int s = 0; s < p->n; s++) {
        int intact = 0;
        for (int k = 0; k < p->link[s].n && !intact; k++) {
            uint64_t steps;
            /* A replacement is at step 0 (or none): only a peer that trained every step
             * with the others is at the client's. */
            intact = pipe_peer_alive(p, s, k) && p->steps_done > 0 &&
                     !peer_steps(p, s, k, &steps, err) && steps == p->steps_done;
        }
        if (!intact) return CIRRUS_ENOENT;
    }
    p->restoring = 0;
    log_info("every stage has a peer at step %llu: no state was lost",
             (unsigned long long)p->steps_done);
    return pipeline_align_peers(p, err);
}

int pipeline_restoring(const pipeline *p)
{
    return p->restoring;
}

int pipeline_take_over(pipeline *p, cirrus_error *err)
{
    for (int s = 0; s < p->n; s++)
        for (int k = 0; k < p->link[s].n; k++) {
            wire_writer w;
            wire_reader r;
            wire_writer_init(&w, 0);
            int rc = pipe_peer_alive(p, s, k)
                         ? pipe_call_peer(p, s, k, STAGE_RESET, &w, &r, err)
                         : 0;
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
            if (pipe_alive_count(p, o) == 1)
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
        if (pipe_peer_alive(p, s, k) && strcmp(L->peer[k].addr, addr) == 0) return 0; /* known */
    for (int i = 0; i < p->n_dead; i++)
        if (strcmp(p->dead[i], addr) == 0) return 0; /* lost once: never again */
    int rc = retire_moved(p, s, addr, err);
    if (rc) return rc;
    int k = 0;
    while (k < L->n && pipe_peer_alive(p, s, k)) k++;
    if (k == PIPE_MAX_PEERS)
        return cirrus_fail(err, CIRRUS_EINVAL, "stage %d already has %d peers", s, k);
    int donor = pipe_any_live_peer(p, s);
    if (donor < 0 && !p->restoring)
        return cirrus_fail(err, CIRRUS_ECLOSED, "stage %d has no peer to copy", s);
    if (k == L->n) L->n++;
    int l1 = L->l1;
    uint64_t steps;
    rc = pipe_connect_peer(p, s, k, addr, &l1, &steps, err);
    /* The same process under another name would be averaged twice: its ring address (or
     * a missing one, with which it cannot average at all) gives it away. */
    for (int j = 0; !rc && j < L->n; j++)
        if (j != k && pipe_peer_alive(p, s, j) &&
            (!L->peer[k].ring[0] || strcmp(L->peer[j].ring, L->peer[k].ring) == 0))
            rc = cirrus_fail(err, CIRRUS_EINVAL,
                             "peer %s has no ring address or the same one as %s", addr,
                             L->peer[j].addr);
    /* A peer at the stage's step holds its state already (it took it from a peer of the
     * stage, or trained every step with them). One behind copies it (SYNC), which drops
     * the gradients it holds: only between steps, and only by the client that steps, so
     * that no other client's microbatch is ever lost to it. Until then it is left out. */
    /* Restoring, every peer takes the state installed next: none is behind. */
    const int behind = !rc && !p->restoring && (steps != p->steps_done || steps == 0);
    if (behind && (p->follower || p->n_mb)) {
        net_close(L->peer[k].c);
        L->peer[k].c = NULL;
        return 0;
    }
    if (behind) rc = sync_peer(p, s, k, donor, err);
    if (!rc && pipe_track_peer(p, s, k)) rc = cirrus_fail(err, CIRRUS_ENOMEM, "out of memory");
    if (rc) {
        net_close(L->peer[k].c);
        L->peer[k].c = NULL;
        return rc;
    }
    p->counters.peers_joined++;
    if (behind)
        log_info("stage %d: peer %s joined (state from %s)", s, addr, L->peer[donor].addr);
    else if (p->restoring)
        log_info("stage %d: peer %s joined (at step %llu; it takes the state installed next)",
                 s, addr, (unsigned long long)steps);
    else
        log_info("stage %d: peer %s joined (already at step %llu)", s, addr,
                 (unsigned long long)steps);
    return 0;
}

int pipeline_peer_reported_lost(pipeline *p, int s, const char *addr, cirrus_error *err)
{
    if (s < 0 || s >= p->n) return cirrus_fail(err, CIRRUS_EINVAL, "no stage %d", s);
    for (int k = 0; k < p->link[s].n; k++) {
        if (!pipe_peer_alive(p, s, k) || strcmp(p->link[s].peer[k].addr, addr) != 0) continue;
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
