/* coordinator: the region coordinator of a SWARM job — who is alive, at which stage, how
 * fast — and the job's /status and /metrics.
 *
 * Stage peers and pipeline clients register over the wire protocol (proto/coord_msg.h), then
 * heartbeat; a member that misses its heartbeats for expire_ms is forgotten. Clients ask
 * for the live peers of each stage and report training totals. Nothing is kept on disk:
 * after a restart the coordinator has a new epoch, members see "unknown peer" and
 * re-register, and the membership is back within one heartbeat interval.
 *
 * One thread accepts; one thread per connection serves requests; the membership table is
 * behind one mutex. A malformed request drops that connection only. HTTP (GET /status as
 * JSON, GET /metrics as Prometheus text 0.0.4) is served by libmicrohttpd on its own port
 * (http_status.h).
 *
 * Rebalancing (rebalance_period_ms > 0): every period the coordinator feeds swarm/
 * rebalance.c every live stage peer (its stage and capacity, coord_stats_capacity) and
 * forgets the gone; for each move the policy accepts it tells the peer to move
 * (coordinator_set_instruction) and logs one line. An instruction the peer has not carried
 * out (re-registered at the new stage) within COORD_MOVE_WITHDRAW periods, and at least
 * COORD_MOVE_WITHDRAW_MIN_MS, is withdrawn. Moves are counted in /status and /metrics.
 */
#ifndef CIRRUS_COORDINATOR_H
#define CIRRUS_COORDINATOR_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

#include "../../../common/cerr.h"
#include "../proto/coord_msg.h"
#include "snapshot.h"

#define COORD_DEFAULT_HEARTBEAT_MS 1000
#define COORD_DEFAULT_MAX_PEERS 4096
#define COORD_MAX_PEERS 16384
/* Connections served at once (a thread each): a region's members hold one each. */
#define COORD_DEFAULT_MAX_CONNS 512
#define COORD_MAX_CONNS (COORD_MAX_PEERS + 256)
#define COORD_MOVE_WITHDRAW 3          /* periods an instruction may take... */
#define COORD_MOVE_WITHDRAW_MIN_MS 120000 /* ...and at least this long (a large state) */

typedef struct coordinator_options {
    const char *job_id;     /* 1..63 bytes; members must present it in their HELLO */
    const char *host;       /* bind address of both ports; NULL or "" = all interfaces */
    int port;               /* peer protocol; 0 = a free port (coordinator_port) */
    int http_port;          /* /status and /metrics; 0 = a free port, -1 = no HTTP */
    uint32_t n_stages;      /* 1..COORD_MAX_STAGES */
    uint32_t n_layer;       /* > 0: registered layer ranges must end at or before it */
    uint32_t heartbeat_ms;  /* interval told to members; 0: COORD_DEFAULT_HEARTBEAT_MS */
    uint32_t expire_ms;     /* silence after which a member is dropped; 0: 3 x heartbeat */
    uint32_t max_peers;     /* membership table size; 0: COORD_DEFAULT_MAX_PEERS */
    uint32_t idle_ms;       /* drop connections silent this long; 0: max(60 s, 4 x expire) */
    uint32_t max_conns;     /* connections served at once; 0: COORD_DEFAULT_MAX_CONNS */
    uint64_t epoch;         /* 0: a fresh one from the clock (53 bits, exact in JSON) */
    uint32_t rebalance_period_ms; /* 0: no rebalancing */
    uint32_t max_stage_peers;     /* rebalancing moves no peer into a stage with this many
                                   * (the operator's peers.max); 0: no bound */
    /* Requests of types COORD_EXT_FIRST..COORD_EXT_LAST go to this handler (NULL: refused
     * as unknown), outside the coordinator's lock, on the requester's connection thread:
     * the gateway's outer sync speaks to its region's leader client this way, through the
     * one server a region already has. ext_request_limit (> COORD_REQUEST_LIMIT) is the
     * largest request payload then accepted. */
    coord_ext_handler ext_handler;
    void *ext_ctx;
    /* NULL, or fills the outer sync's part of /status and /metrics (0; else left out). */
    int (*ext_status)(void *ext_ctx, coord_outer_view *out);
    uint32_t ext_request_limit;
} coordinator_options;

typedef struct coordinator coordinator;

/* Bind both ports, start serving, return at once. */
int coordinator_start(const coordinator_options *o, coordinator **out, cirrus_error *err);
/* Stop serving, close every connection, free everything (waits for the threads). */
void coordinator_stop(coordinator *co);
int coordinator_port(const coordinator *co);
int coordinator_http_port(const coordinator *co); /* -1 without HTTP */
uint64_t coordinator_epoch(const coordinator *co);

/* Tell a stage peer to move to another stage (rebalancing; delivered with each
 * HEARTBEAT_OK until the peer registers at that stage). COORD_NO_INSTRUCTION clears it.
 * CIRRUS_ENOENT for an unknown peer, CIRRUS_EINVAL for a stage out of range. */
int coordinator_set_instruction(coordinator *co, uint32_t peer_id, uint32_t stage);

/* ---- a consistent copy of the state (the types are in snapshot.h) ---- */

int coordinator_snapshot(coordinator *co, coord_snapshot *out);

/* The whole role: start, serve until *stop becomes non-zero, stop. Logs the ports. */
int coordinator_run(const coordinator_options *o, volatile sig_atomic_t *stop,
                    cirrus_error *err);

#endif
