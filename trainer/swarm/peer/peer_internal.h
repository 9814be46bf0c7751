/* peer_internal: what the modules of a stage peer share: the peer's state (one struct,
 * behind one mutex: the model is one) and the functions each module offers the others.
 * Not for use outside trainer/swarm/peer/; the public face is stage_peer.h.
 *
 *   stage_peer.c  the owner: set-up, the accept loop, a thread per connection, tear-down
 *   serve.c       the request handlers, a table by message type: forward, stateless
 *                 backward, the tied embedding, sums of squares, STEP, INFO
 *   averaging.c   the stage's gradients: summed with the stage's other peers (AVERAGE,
 *                 a ring), a round undone, dropped
 *   state.c       parameters and optimizer state: served (STATE_GET), replaced
 *                 (PARAMS_SET), copied from a donor peer (SYNC, and a move's new stage)
 *   move.c        moving to another stage (rebalancing): the stage kit, leaving, the mover
 *   heartbeat.c   registration and heartbeats with the coordinator, capacity estimates
 */
#ifndef CIRRUS_PEER_INTERNAL_H
#define CIRRUS_PEER_INTERNAL_H

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>

#include "../../model/stage.h"
#include "../../net/collective.h"
#include "../../net/conn.h"
#include "../proto/coord_msg.h"
#include "../proto/stage_msg.h"
#include "stage_peer.h"

#define PEER_IO_TIMEOUT_MS 60000
#define PEER_HELLO_TIMEOUT_MS 5000 /* from accept to the end of HELLO */
#define PEER_POLL_MS 200          /* how often the loops look at the stop flag */
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
    collective *device_ring;   /* NCCL over the same members when all run CUDA, else NULL */
    /* The member list a device collective last failed to start for: not tried again for
     * the same members (it would cost the build's deadline at every rebuild of the ring). */
    char device_failed_members[PEER_MAX_MEMBERS * STAGE_ADDR_MAX];
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
    /* counters for the coordinator's heartbeats (under mu) */
    uint64_t samples, steps;
    int stalled; /* failpoint stall-average-at has happened */
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

/* ---- serve.c ---- */

/* Serve one request under the lock; fills the reply. Returns 0, or a status code after
 * which the connection is dropped (with *why set). `gen` is the connection's generation:
 * one opened before this peer last left a stage speaks for that stage. */
int peer_serve(peer *p, uint32_t gen, const wire_header *h, const uint8_t *payload,
               wire_writer *reply, const char **why);

/* ---- averaging.c (all under the lock) ---- */

/* AVERAGE: sum this stage's gradients over the members the client named; attempt is the
 * request id. */
int peer_average(peer *p, wire_reader *r, uint64_t attempt, wire_writer *reply,
                 const char **why);
/* Back to this peer's own gradients after a completed round. */
void peer_unsum_gradients(peer *p);
/* The gradients of an unfinished step are dropped (a new state, a new stage). */
void peer_drop_gradients(peer *p);
/* The stage's collectives are freed (the ring and the device's): the next AVERAGE builds
 * them for its members. */
void peer_drop_rings(peer *p);

/* ---- state.c ---- */

/* After this peer's optimizer state was replaced by a checkpoint's or a restore, at
 * optimizer step `steps`: moments that are zero start again there
 * (adamw_restart_fresh_moments). A copy from a peer takes the donor's origins instead. */
void peer_note_moments(peer *p, uint64_t steps);

/* STATE_GET, PARAMS_SET, STATE_SET, SYNC (under the lock). */
int peer_put_state(peer *p, wire_reader *r, wire_writer *w);
int peer_set_params(peer *p, wire_reader *r, const char **why);
int peer_set_state(peer *p, wire_reader *r, const char **why);
int peer_sync_from(peer *p, const char *donor, const char **why);
/* A connection to the donor at host:port, checked (INFO) to serve layers [l0, l1). */
int peer_donor_open(peer *p, const char *host, int port, int l0, int l1, net_conn **out,
                    const char **why, cirrus_error *err);
/* The donor's step, parameters and AdamW moments of `adam`'s layers [l0, l1), copied into
 * this peer's model and into `adam`, with the donor's moments origins (stage_origin). */
int peer_take_state(peer *p, net_conn *c, int l0, int l1, adamw *adam, uint64_t *steps,
                    const char **why, cirrus_error *err);

/* ---- move.c ---- */

/* Everything serving layers [l0, l1) needs; on failure nothing is left allocated. */
int peer_kit_build(peer *p, int l0, int l1, stage_kit *k, cirrus_error *err);
void peer_kit_free(stage_kit *k);
/* Serve k's layers from now on; k receives what the peer had, for peer_kit_free. */
void peer_kit_swap(peer *p, stage_kit *k);
/* Leave the current stage for p->move_to (under the lock). */
void peer_start_move_locked(peer *p);
/* A heartbeat's instruction: the stage the coordinator wants this peer at, or none. */
void peer_take_instruction(peer *p, uint32_t instruction);

/* The mover runs apart from the heartbeat thread, which keeps the peer's registration
 * alive however long a large stage's state takes to download. */
typedef struct peer_mover {
    peer *p;
    coord_client *cc;
    int to;
    pthread_t th;
    int running;
    atomic_int done;
} peer_mover;

/* Start the mover when the peer has left its stage, and reap it when it is done. */
void peer_mover_poll(peer *p, peer_mover *mv);

/* ---- heartbeat.c ---- */

/* The heartbeat thread (arg: the peer), when the peer has a coordinator. */
void *peer_heartbeat_main(void *arg);

#endif
