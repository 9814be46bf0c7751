/* heartbeat: the stage peer at its coordinator. It registers, heartbeats its counters and
 * its capacity (forward and backward samples per busy second, over recent work), takes
 * the rebalancing instruction a heartbeat carries (move.c), and registers again after a
 * move. */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "../../../common/log.h"
#include "peer_internal.h"

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
void *peer_heartbeat_main(void *arg)
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
    peer_mover mv = {.cc = cc};
    while (!*p->stop) {
        peer_mover_poll(p, &mv);
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
                peer_take_instruction(p, instruction);
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
