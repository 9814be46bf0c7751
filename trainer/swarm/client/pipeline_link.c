/* pipeline_link: the client's requests to its stage peers, and what happens when a peer
 * fails one.
 *
 * Fault handling. A peer that fails a request at the transport level (closed, timed out,
 * garbled) is marked dead and the request goes to another live peer of its stage. A dead
 * peer takes the gradients it accumulated in this step with it, so the client keeps, for
 * every microbatch of the step, what each stage's backward needs (tokens, the stage input
 * and the gradient of its output) and which peer served it; the backwards the dead peer
 * served are re-run on survivors (pipeline_engine.c). At the step, every stage's live
 * peers report how many microbatches they accumulated: the sum must equal the step's
 * microbatches, which proves none was lost and none counted twice (pipeline_step.c). A
 * peer that refuses a request (WIRE_ERROR) is not a fault of the network: that error ends
 * the step.
 */
#include <stdio.h>
#include <string.h>

#include "../../../common/log.h"
#include "pipeline_internal.h"

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

int pipe_send(pipeline *p, int s, int k, uint16_t type, uint64_t id, const wire_writer *w,
              cirrus_error *err)
{
    char who[STAGE_ADDR_MAX + 32];
    if (!pipe_peer_alive(p, s, k))
        return cirrus_fail(err, CIRRUS_ECLOSED, "stage %d peer %d is gone", s, k);
    return rpc_send(p->link[s].peer[k].c, type, id, w, p->timeout_ms, peer_name(p, s, k, who),
                    err);
}

int pipe_await(pipeline *p, int s, int k, uint16_t type, uint64_t id, wire_reader *r,
               int timeout_ms, cirrus_error *err)
{
    char who[STAGE_ADDR_MAX + 32];
    if (!pipe_peer_alive(p, s, k))
        return cirrus_fail(err, CIRRUS_ECLOSED, "stage %d peer %d is gone", s, k);
    return rpc_await(p->link[s].peer[k].c, type, id, timeout_ms, peer_name(p, s, k, who), r,
                     err);
}

int pipe_call_peer(pipeline *p, int s, int k, uint16_t type, const wire_writer *w,
                   wire_reader *r, cirrus_error *err)
{
    uint64_t id = ++p->next_id;
    int rc = pipe_send(p, s, k, type, id, w, err);
    return rc ? rc : pipe_await(p, s, k, type, id, r, p->timeout_ms, err);
}

/* Peers still warming up, and a stage's only live peer, get the full timeout: their
 * latency says nothing yet, or there is nothing better to fail over to. */
int pipe_deadline_learned(const pipeline *p, int s, int k)
{
    return pipe_alive_count(p, s) > 1 && p->link[s].peer[k].served >= PIPE_WARM_REQUESTS;
}

/* The learned deadline, in seconds, for a forward or backward of B samples on peer k of
 * stage s. The stage's estimator follows the latencies of all its peers, so a peer several
 * times slower than the others (other hardware) would miss it on every request and be
 * dropped as hung; its own measured throughput stretches its deadline. */
double pipe_learned_deadline(const pipeline *p, int s, int k, uint16_t type, int B)
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

void pipe_observe(pipeline *p, int s, int k, uint16_t type, int B, double took, int learned,
                  int rc)
{
    deadline_estimator *d = p->deadline[s][type == STAGE_BACKWARD];
    peer_link *pl = &p->link[s].peer[k];
    if (!rc) pl->served++;
    if (!rc && learned)
        deadline_observe(d, took);
    else if (rc == CIRRUS_ETIMEDOUT)
        deadline_observe_timeout(d, took);
    /* A refusal is an error answer (the wiring bans until re-added); transport failures
     * remove the peer from the wiring anyway (pipe_peer_failed). */
    wiring_report(p->wiring, s, pl->wid,
                  type == STAGE_BACKWARD ? WIRING_BACKWARD : WIRING_FORWARD, B, took,
                  !rc ? WIRING_OK : rc == CIRRUS_ETIMEDOUT ? WIRING_TIMEOUT : WIRING_ERROR);
}

/* A forward or backward of B samples, waited for alone (not in the engine), under its
 * learned deadline; the latency teaches the estimators. */
static int call_timed(pipeline *p, int s, int k, uint16_t type, int B, const wire_writer *w,
                      wire_reader *r, cirrus_error *err)
{
    const int saved = p->timeout_ms;
    const int learned = pipe_deadline_learned(p, s, k);
    double t0 = clock_now_s();
    if (learned) p->timeout_ms = (int)(pipe_learned_deadline(p, s, k, type, B) * 1000.0) + 1;
    int rc = pipe_call_peer(p, s, k, type, w, r, err);
    p->timeout_ms = saved;
    pipe_observe(p, s, k, type, B, clock_now_s() - t0, learned, rc);
    return rc;
}

int pipe_any_live_peer(const pipeline *p, int s)
{
    for (int k = 0; k < p->link[s].n; k++)
        if (pipe_peer_alive(p, s, k)) return k;
    return -1;
}

int pipe_routed_peer(pipeline *p, int s, double charge)
{
    uint32_t wid;
    if (wiring_choose(p->wiring, s, WIRING_FORWARD, charge, WIRING_NONE, &wid)) return -1;
    for (int k = 0; k < p->link[s].n; k++)
        if (pipe_peer_alive(p, s, k) && p->link[s].peer[k].wid == wid) return k;
    return -1; /* not reached: the wiring holds the live peers only */
}

int pipe_track_peer(pipeline *p, int s, int k)
{
    peer_link *pl = &p->link[s].peer[k];
    pl->wid = ++p->next_wid;
    return wiring_peer_add(p->wiring, s, pl->wid);
}

/* Drop a peer after a transport failure: its queued and unanswered tasks go to other
 * peers, and the backwards whose gradients it held are re-run on survivors. A peer that
 * only timed out is not banned (SWARM's rule): its connection is closed (a late reply must
 * not be mistaken for another), and if the coordinator still lists it later, it rejoins
 * with fresh state. */
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
    if (pipe_alive_count(p, s) == 0)
        return cirrus_fail(err, CIRRUS_ECLOSED, "stage %d has no live peer left (last: %s)", s,
                           why->msg);
    int rc = pipe_reassign_tasks_of(p, s, k, err);
    /* Once the stage's gradients are summed, every survivor holds the dead peer's share. */
    return rc || p->averaged[s] ? rc : pipe_redo_backwards_of(p, s, k, err);
}

/* B is the microbatch of a forward or backward (the latency report). *served receives the
 * peer that answered. */
int pipe_on_stage(pipeline *p, int s, int prefer, uint16_t type, int B, double charge,
                    const wire_writer *w, wire_reader *r, int *served, cirrus_error *err)
{
    for (;;) {
        int k = prefer >= 0 && pipe_peer_alive(p, s, prefer) ? prefer
                : charge > 0                            ? pipe_routed_peer(p, s, charge)
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

/* For requests whose replies are equal on all peers. Peers failing at the transport are
 * dropped. */
int pipe_on_all_peers(pipeline *p, int s, uint16_t type, const wire_writer *w, wire_reader *r,
                      int *answered, cirrus_error *err)
{
    uint64_t id = ++p->next_id;
    int sent[PIPE_MAX_PEERS] = {0}, faulty[PIPE_MAX_PEERS] = {0}, rc = 0;
    cirrus_error why[PIPE_MAX_PEERS];
    *answered = 0;
    for (int k = 0; k < p->link[s].n; k++)
        if (pipe_peer_alive(p, s, k))
            sent[k] = pipe_send(p, s, k, type, id, w, &why[k]) == 0 ? 1 : -1;
    for (int k = 0; k < p->link[s].n; k++) {
        if (sent[k] == 0) continue;
        int prc = sent[k] == 1 ? pipe_await(p, s, k, type, id, r, p->timeout_ms, &why[k])
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
