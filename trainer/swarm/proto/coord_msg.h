/* coord_msg: the messages between the region coordinator and its members (wire types
 * 16..63): encoded and decoded in coord_msg.c, the member's side of them in coord_client.c.
 *
 * Stage peers and pipeline clients register with the coordinator, heartbeat with their
 * statistics, and ask it for the live peers of a stage; pipeline clients also report the
 * training totals shown on /status. Payloads are built with wire_writer and parsed with
 * wire_reader (little-endian, bounds-checked, consumed exactly). Every request is answered
 * by its type + 1 with the same request id, or by WIRE_ERROR (i32 code, str message):
 *
 *   REGISTER       u16 role, u32 stage, u32 l0, u32 l1, str name, str host, u16 port,
 *                  f64 throughput
 *     -> OK        u32 peer_id, u32 heartbeat_ms, u32 expire_ms, u64 epoch
 *   HEARTBEAT      u64 epoch, u32 peer_id, u64 samples, u64 step, f32 loss,
 *                  f64 tokens_per_s, f64 fwd_throughput, f64 bwd_throughput
 *     -> OK        u64 epoch, u32 instruction (a stage to move to, or COORD_NO_INSTRUCTION)
 *   PEERS          u32 stage (or COORD_ALL_STAGES)
 *     -> OK        u64 epoch, u32 n_stages, u32 count, count x (u32 id, u32 stage, u32 l0,
 *                  u32 l1, str name, str host, u16 port, f64 throughput)
 *   CLIENT_REPORT  u64 epoch, u32 peer_id, u64 step, f32 loss, f64 tokens_per_s,
 *                  u64 microbatches_retried, u64 microbatches_lost   (totals since start)
 *     -> OK        u64 epoch
 *   LEAVE          u64 epoch, u32 peer_id -> OK: empty
 *   STEP_SYNC      u8 op, u64 step, u32 client_index, u32 n_clients, u32 microbatches,
 *                  f64 loss_sum, u64 redo_seen, u32 stage, str addr
 *     -> OK        u64 applied_step, u32 arrived, u32 microbatches, f64 loss_sum,
 *                  u64 latest_notice, u32 n, n x (u64 id, u32 stage, str addr)
 *
 * STEP_SYNC is the step barrier of the pipeline clients of one job (one barrier per
 * coordinator, independent of registrations): a client ARRIVEs at step t with its share
 * (microbatches, loss sum), the leader (client 0) reports APPLIED once the optimizer step
 * is done, and anyone may post a REDO notice (a stage peer at addr lost step t's work).
 * Every op is answered with the barrier's state for step t; see coord_step_state.
 *
 * A HEARTBEAT, CLIENT_REPORT or LEAVE naming a peer id the coordinator does not know, or
 * an epoch other than its own, is answered ERROR(CIRRUS_ENOENT, "unknown peer ..."): the
 * member re-registers (coord_client does so by itself). A malformed request is answered
 * ERROR(CIRRUS_ECORRUPT, why) and that connection is dropped. See docs/PROTOCOL.md.
 */
#ifndef CIRRUS_COORD_PROTO_H
#define CIRRUS_COORD_PROTO_H

#include <stddef.h>
#include <stdint.h>

#include "../../../common/cerr.h"
#include "../../../common/role_args.h"
#include "../../net/wire.h"

enum coord_msg {
    COORD_REGISTER = 16,
    COORD_REGISTER_OK = 17,
    COORD_HEARTBEAT = 18,
    COORD_HEARTBEAT_OK = 19,
    COORD_PEERS = 20,
    COORD_PEERS_OK = 21,
    COORD_CLIENT_REPORT = 22,
    COORD_CLIENT_REPORT_OK = 23,
    COORD_LEAVE = 24,
    COORD_LEAVE_OK = 25,
    COORD_STEP_SYNC = 26,
    COORD_STEP_SYNC_OK = 27,
};

/* Roles in REGISTER (and in the connection's HELLO). */
enum coord_role { COORD_ROLE_STAGE = 1, COORD_ROLE_CLIENT = 2 };

#define COORD_NAME_MAX 63          /* bytes of a member's stable name (may be empty) */
#define COORD_HOST_MAX 255         /* bytes of a listen host */
#define COORD_MAX_STAGES 1024      /* largest stage count a coordinator serves */
#define COORD_MAX_LAYERS 65536     /* l1 bound when the coordinator knows no layer count */
#define COORD_NO_STAGE 0xffffffffu /* the stage of a client */
#define COORD_ALL_STAGES 0xffffffffu
#define COORD_NO_INSTRUCTION 0xffffffffu
#define COORD_REQUEST_LIMIT 4096u    /* largest request payload a coordinator accepts */
#define COORD_REPLY_LIMIT (16u << 20) /* largest reply payload a member accepts */
#define COORD_MAX_CLIENTS ROLE_MAX_CLIENTS       /* pipeline clients of one job in the step barrier */
#define COORD_MAX_NOTICES 16       /* REDO notices in one STEP_SYNC_OK */
#define COORD_NOTICE_KEEP 64       /* REDO notices the coordinator remembers (newest) */
#define COORD_STEP_WAIT_MAX_MS 2000 /* the longest an ARRIVE may ask its answer to be held */

/* Types a coordinator hands to its extension (coordinator_options.ext_handler): requests
 * are even, replies the type + 1. The region's outer sync (gateway/outer_msg.h) uses them. */
#define COORD_EXT_FIRST 48
#define COORD_EXT_LAST 63

/* Serves one extension request: p[0..n) is its payload; appends the reply to *reply, or
 * returns a code with a message in err (answered as WIRE_ERROR). *drop: the request was
 * malformed and its connection is dropped. */
typedef int (*coord_ext_handler)(void *ctx, uint16_t type, const uint8_t *p, size_t n,
                                 wire_writer *reply, int *drop, cirrus_error *err);

typedef struct coord_registration {
    uint16_t role;                   /* enum coord_role */
    uint32_t stage;                  /* < n_stages; COORD_NO_STAGE for a client */
    uint32_t l0, l1;                 /* layers [l0, l1) served; 0, 0 for a client */
    char name[COORD_NAME_MAX + 1];   /* stable name: re-registering under it keeps the id */
    char host[COORD_HOST_MAX + 1];   /* where the peer listens; may be empty for a client */
    uint16_t port;                   /* 1..65535 for a stage peer */
    double throughput;               /* measured samples/s, finite and >= 0 */
} coord_registration;

typedef struct coord_registered {
    uint32_t peer_id;
    uint32_t heartbeat_ms, expire_ms;
    uint64_t epoch;
} coord_registered;

typedef struct coord_stats {
    uint64_t samples, step;
    float loss;                      /* NaN: none */
    double tokens_per_s;
    /* A stage peer's forward and backward samples per second of its own compute (busy
     * time, not wall time: an idle peer keeps its rate), over recent work; 0: not
     * measured yet. */
    double fwd_throughput, bwd_throughput;
} coord_stats;

/* A stage peer's capacity in forward units per busy second (a backward counts as
 * WIRING_BACKWARD_COST forwards, as the wiring charges it) for the training mix of one
 * forward and one backward per sample: (1 + cost) / (1/fwd + 1/bwd). The forward rate
 * alone when no backward was measured (a peer before the rebalancing heartbeats filled
 * bwd_throughput in); 0 when nothing was. */
double coord_stats_capacity(const coord_stats *s);

typedef struct coord_report {
    uint64_t step;
    float loss;                      /* NaN: none */
    double tokens_per_s;
    uint64_t mb_retried, mb_lost;    /* totals since the client started */
} coord_report;

typedef struct coord_peer_info {
    uint32_t id, stage, l0, l1;
    char name[COORD_NAME_MAX + 1];
    char host[COORD_HOST_MAX + 1];
    uint16_t port;
    double throughput;               /* samples/s: the latest measured forward rate */
} coord_peer_info;

/* ---- the step barrier (STEP_SYNC) ---- */

enum coord_step_op {
    COORD_STEP_ARRIVE = 1,  /* client_index finished its share of step: counted */
    COORD_STEP_APPLIED = 2, /* the optimizer step `step` is applied (sent by the leader) */
    COORD_STEP_REDO = 3,    /* the stage peer at addr lost step `step`'s work: redo it;
                             * stage COORD_ALL_STAGES: the step starts again, every client
                             * runs its whole share once more (addr names why) */
};

typedef struct coord_step_sync {
    uint8_t op;                      /* enum coord_step_op */
    uint64_t step;                   /* >= 1 */
    uint32_t client_index;           /* < n_clients; client 0 is the leader */
    uint32_t n_clients;              /* 1..COORD_MAX_CLIENTS, the same for every ARRIVE */
    uint32_t microbatches;           /* ARRIVE: microbatches this client did for step */
    double loss_sum;                 /* ARRIVE: the sum of their losses; finite */
    uint64_t redo_seen;              /* the newest REDO notice id this client acted on */
    uint32_t stage;                  /* REDO: the stage of addr (< n_stages); else ignored */
    char addr[COORD_NAME_MAX + 1];   /* REDO: "host:port", non-empty; else empty */
    uint32_t wait_ms;                /* ARRIVE: hold the answer until what this client waits
                                      * for is there, at most this long (0: answer at once;
                                      * <= COORD_STEP_WAIT_MAX_MS); 0 for the other ops */
} coord_step_sync;

typedef struct coord_step_notice {
    uint64_t id;                     /* 1, 2, ... in the order the coordinator got them */
    uint32_t stage;
    char addr[COORD_NAME_MAX + 1];
} coord_step_notice;

/* The barrier's state for the request's step t. A slot is counted when it arrived at t
 * after acting on every REDO notice of t (its redo_seen >= latest_notice). */
typedef struct coord_step_state {
    uint64_t applied_step;           /* the newest step known applied (0: none) */
    uint32_t arrived;                /* clients counted at t */
    uint32_t microbatches;           /* their sum (saturates at UINT32_MAX) */
    double loss_sum;                 /* their sum in client order (never NaN; may be inf) */
    uint64_t latest_notice;          /* the newest REDO notice id of t; 0: none */
    uint32_t n_notices;              /* <= COORD_MAX_NOTICES */
    /* t's notices with id > the request's redo_seen, oldest first; when there are more,
     * the oldest COORD_MAX_NOTICES (act on them, ask again for the rest). */
    coord_step_notice notices[COORD_MAX_NOTICES];
} coord_step_state;

/* ---- payload encoding and decoding (shared by coordinator and members) ----
 * Decoders check the syntax and everything a message says about itself (string lengths
 * and characters, finite non-negative rates, role/stage/layer consistency); the
 * coordinator then checks what depends on it (stage < n_stages, l1 <= n_layer). They
 * return 0 or CIRRUS_ECORRUPT with a message naming the field. */

void coord_put_registration(wire_writer *w, const coord_registration *r);
int coord_get_registration(const void *p, size_t n, coord_registration *r, cirrus_error *err);
void coord_put_heartbeat(wire_writer *w, uint64_t epoch, uint32_t peer_id, const coord_stats *s);
int coord_get_heartbeat(const void *p, size_t n, uint64_t *epoch, uint32_t *peer_id,
                        coord_stats *s, cirrus_error *err);
void coord_put_report(wire_writer *w, uint64_t epoch, uint32_t peer_id, const coord_report *r);
int coord_get_report(const void *p, size_t n, uint64_t *epoch, uint32_t *peer_id,
                     coord_report *r, cirrus_error *err);
void coord_put_step_sync(wire_writer *w, const coord_step_sync *s);
int coord_get_step_sync(const void *p, size_t n, coord_step_sync *s, cirrus_error *err);
void coord_put_step_state(wire_writer *w, const coord_step_state *st);
int coord_get_step_state(const void *p, size_t n, coord_step_state *st, cirrus_error *err);
void coord_put_peer_info(wire_writer *w, const coord_peer_info *pi);
int coord_get_peer_info(wire_reader *r, coord_peer_info *pi);

/* What a REGISTER or a STEP_SYNC says about itself, whoever receives it: 0, or
 * CIRRUS_ECORRUPT with a message naming the field. A member checks its own before sending
 * (the coordinator would drop the connection for it). */
int coord_registration_ok(const coord_registration *r, cirrus_error *err);
int coord_step_sync_ok(const coord_step_sync *s, cirrus_error *err);

/* 1 if s is a valid name (COORD_NAME_MAX bytes of [A-Za-z0-9._:-], may be empty) or host
 * (1..COORD_HOST_MAX bytes of the same set; IPv6 literals need no brackets). */
int coord_name_ok(const char *s);
int coord_host_ok(const char *s);

/* ---- the member side (coord_client.c): one connection to the coordinator, re-established
 * on demand ---- */

typedef struct coord_client coord_client;

/* Create a client for the coordinator at host:port of job job_id. Connects lazily: the
 * first call (and the first after a connection failure) connects and shakes hands within
 * that call's deadline. Calls on one client are serialised by its own lock. */
int coord_client_open(const char *host, int port, const char *job_id, coord_client **out,
                      cirrus_error *err);
void coord_client_close(coord_client *c);

/* Register (or re-register) as reg; the registration is remembered for automatic
 * re-registration. */
int coord_client_register(coord_client *c, const coord_registration *reg, int timeout_ms,
                          coord_registered *out, cirrus_error *err);

/* Heartbeat with stats. If the coordinator does not know this peer (it restarted: new
 * epoch, or the peer expired), re-register with the remembered registration and heartbeat
 * again, all within timeout_ms; *reregistered (if not NULL) says whether that happened.
 * *instruction receives the rebalancing instruction (COORD_NO_INSTRUCTION: none). */
int coord_client_heartbeat(coord_client *c, const coord_stats *stats, int timeout_ms,
                           uint32_t *instruction, int *reregistered, cirrus_error *err);

/* Training totals of a pipeline client; re-registers like coord_client_heartbeat. */
int coord_client_report(coord_client *c, const coord_report *rep, int timeout_ms,
                        int *reregistered, cirrus_error *err);
/* A client busy elsewhere than its steps (waiting for an outer round) stays alive: its last
 * report is sent again once a heartbeat interval has passed since the last one (nothing
 * before its first report, or sooner). */
int coord_client_keepalive(coord_client *c, int timeout_ms, cirrus_error *err);

/* The live stage peers of one stage (or COORD_ALL_STAGES). *peers is malloc'd (free()
 * it; NULL when *n is 0); *n_stages (if not NULL) receives the coordinator's stage count.
 * Needs no registration. */
int coord_client_peers(coord_client *c, uint32_t stage, int timeout_ms,
                       coord_peer_info **peers, size_t *n, uint32_t *n_stages,
                       cirrus_error *err);

/* One STEP_SYNC: *out receives the barrier's state for req->step. A request the
 * coordinator would refuse is refused here (CIRRUS_EINVAL) without being sent; the
 * coordinator answers CIRRUS_EINVAL for an ARRIVE whose n_clients differs from the job's
 * and for a REDO stage >= its n_stages. Needs no registration. */
int coord_client_step_sync(coord_client *c, const coord_step_sync *req, int timeout_ms,
                           coord_step_state *out, cirrus_error *err);

/* One request -> reply of an extension type (COORD_EXT_FIRST..COORD_EXT_LAST, even) with
 * req's payload; on success *reply and *reply_len point at the answer's payload, valid until
 * the next call on c (hold no other call meanwhile: the caller serialises). Needs no
 * registration. */
int coord_client_ext_call(coord_client *c, uint16_t type, const wire_writer *req,
                          int timeout_ms, const uint8_t **reply, uint32_t *reply_len,
                          cirrus_error *err);

/* Leave the membership now rather than expiring; forgets the registration. */
int coord_client_leave(coord_client *c, int timeout_ms, cirrus_error *err);

/* The current registration's id and epoch (0 and 0 before registering). */
uint32_t coord_client_peer_id(coord_client *c);
uint64_t coord_client_epoch(coord_client *c);

#endif
