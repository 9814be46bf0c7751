/* coord_internal: what the modules of the region coordinator share — the coordinator's
 * state (one struct, behind one mutex) and the functions each module offers the others.
 * Not for use outside trainer/swarm/coord/; the public face is coordinator.h.
 *
 *   coordinator.c  the owner: options, start and stop, the snapshot, the role's loop
 *   members.c      the membership table: REGISTER, HEARTBEAT, CLIENT_REPORT, PEERS, LEAVE,
 *                  epochs and expiry
 *   barrier.c      the step barrier of several pipeline clients (STEP_SYNC): ARRIVE
 *                  answers held until awaited, REDO notices
 *   moves.c        rebalancing: feeding the policy, instructions, moves remembered by name
 *   server.c       the request dispatch table, served by proto/rpc_server.c
 */
#ifndef CIRRUS_COORD_INTERNAL_H
#define CIRRUS_COORD_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>

#include "../../../common/clock.h"
#include "../../net/wire.h"
#include "../policy/rebalance.h"
#include "coordinator.h"
#include "http_status.h"

#define COORD_IO_TIMEOUT_MS 5000 /* a frame that started arriving, or a reply, must finish */
#define COORD_POLL_MS 100        /* how often idle threads look at the stop flag */
#define COORD_THREAD_STACK (256u << 10)

typedef struct member {
    uint32_t id;
    coord_registration reg;
    coord_stats stats;
    int has_stats;
    coord_report report;
    int has_report;
    int64_t last_seen_ms;
    uint32_t instruction;
    int64_t instructed_ms; /* when the instruction was given */
} member;

/* A stage peer that moved (it re-registered at the stage it was told to move to), by name.
 * A peer's name outlives its process where names are stable (the operator names each peer
 * after its Pod, which a replacement keeps): a replaced peer that comes back at its
 * original stage is told to move again at once, rather than the swarm waiting a
 * rebalancing period to find the same imbalance. */
typedef struct moved_peer {
    char name[COORD_NAME_MAX + 1];
    uint32_t stage;
} moved_peer;

/* One client's latest ARRIVE at the step barrier. */
typedef struct step_slot {
    uint64_t step; /* 0: never arrived */
    uint32_t microbatches;
    double loss_sum;
    uint64_t redo_seen;
} step_slot;

typedef struct step_notice {
    uint64_t id, step;
    uint32_t stage;
    char addr[COORD_NAME_MAX + 1];
} step_notice;

/* The step barrier of the job's pipeline clients (STEP_SYNC). Not tied to registrations:
 * clients that reconnect or re-register keep their slots. */
typedef struct step_barrier {
    uint32_t n_clients; /* 0 until the first ARRIVE */
    uint64_t applied_step;
    step_slot slots[COORD_MAX_CLIENTS];
    step_notice notices[COORD_NOTICE_KEEP]; /* a ring: notice id k at (k - 1) % size */
    uint64_t next_notice;                   /* the id the next REDO gets; from 1 */
    uint64_t posted;                        /* notices recorded by this coordinator */
} step_barrier;

struct coordinator {
    coordinator_options o; /* defaults filled in; job_id and host point at the copies below */
    char job_id[WIRE_JOB_ID_MAX + 1];
    char host[COORD_HOST_MAX + 1];
    uint64_t epoch;
    int64_t start_ms;
    int lfd, port, http_port;
    http_status *http;
    struct rpc_server *server;
    atomic_int stopping; /* raised by coord_server_stop: the barrier's waits give up */
    uint32_t max_conns;

    pthread_mutex_t mu; /* everything below */
    pthread_cond_t barrier_changed; /* on CLOCK_MONOTONIC; broadcast on every barrier change */
    member *members; /* [max_peers], sorted by id (ids only grow; removal keeps order) */
    size_t n_members;
    uint32_t next_id;
    uint64_t step, expirations, registrations;
    uint64_t retired_retried, retired_lost; /* totals of clients no longer in the table */
    double loss;
    int loss_from_client;
    /* rebalancing (NULL rb: off) */
    rebalance_state *rb;
    int64_t next_rebalance_ms;
    int rebalance_started;  /* the first period began (with the job's first step) */
    uint32_t *rb_ids;      /* [max_peers] the peers the policy was fed last period */
    size_t n_rb_ids;
    uint64_t moves, withdrawn;
    coord_move recent[COORD_RECENT_MOVES]; /* a ring: the latest at (n_moves - 1) % size */
    moved_peer *moved; /* [max_peers] a ring: the stage each moved peer (by name) went to */
    size_t n_moved;    /* entries ever written; the latest at (n_moved - 1) % max_peers */
    step_barrier barrier;
};

/* A request's outcome: 0 and a reply payload, or a code and message for WIRE_ERROR;
 * `drop` when the request was malformed (the connection's stream is not to be trusted). */
typedef struct outcome {
    int drop;
    cirrus_error err;
} outcome;

/* ---- server.c ---- */

/* Mark the request malformed: answered ECORRUPT with oc->err's message, then its
 * connection dropped. Returns the code. */
int coord_malformed(outcome *oc);
/* Start serving co->lfd (proto/rpc_server.c). */
int coord_server_start(coordinator *co, cirrus_error *err);
/* Raise the stop flag and stop the server (it waits for every connection thread). */
void coord_server_stop(coordinator *co);

/* ---- members.c (the find/reap/info calls: co->mu held) ---- */

member *coord_members_find(coordinator *co, uint32_t id);
/* Forget the members silent for longer than expire_ms. */
void coord_members_reap(coordinator *co, int64_t now);
void coord_members_info(const member *m, coord_peer_info *pi);
/* The requests: p[n] the payload; 0 and the reply written, or a code (oc filled). */
int coord_members_register(coordinator *co, const uint8_t *p, uint32_t n, wire_writer *reply,
                           outcome *oc);
int coord_members_heartbeat(coordinator *co, const uint8_t *p, uint32_t n, wire_writer *reply,
                            outcome *oc);
int coord_members_report(coordinator *co, const uint8_t *p, uint32_t n, wire_writer *reply,
                         outcome *oc);
int coord_members_peers(coordinator *co, const uint8_t *p, uint32_t n, wire_writer *reply,
                        outcome *oc);
int coord_members_leave(coordinator *co, const uint8_t *p, uint32_t n, outcome *oc);

/* ---- barrier.c ---- */

int coord_barrier_step_sync(coordinator *co, const uint8_t *p, uint32_t n, wire_writer *reply,
                            outcome *oc);

/* ---- moves.c (co->mu held) ---- */

moved_peer *coord_moves_find(coordinator *co, const char *name);
/* Remember where a named stage peer moved. */
void coord_moves_remember(coordinator *co, const char *name, uint32_t stage);
/* Whether stage has o.max_stage_peers stage peers (those moving there counted there), not
 * counting self: no peer may be sent there then. 0 when there is no bound. */
int coord_moves_stage_full(const coordinator *co, uint32_t stage, const member *self);
/* One period of the rebalancer, when it is due. */
void coord_moves_rebalance(coordinator *co, int64_t now);

#endif
