/* stage_msg: the messages between pipeline clients and stage peers (wire types 64..127).
 *
 * All payloads are built with wire_writer and parsed with wire_reader (little-endian,
 * bounds-checked). Every request is answered by the type + 1 with the same request id, or
 * by WIRE_ERROR (i32 code, str message). See docs/PROTOCOL.md.
 *
 *   FORWARD   u64 mb_id, u32 B, u32 T, u8 keep, u8 codec, u8 has_targets, u8 0,
 *             input (first stage: B*T token bytes; others: activations, see below),
 *             targets (B*T bytes, if has_targets)
 *     -> OK   last stage with targets: f32 loss; otherwise activations (B*T*C)
 *   BACKWARD  as FORWARD (keep ignored), then grad_out activations (non-last stages)
 *     -> OK   grad_in activations (B*T*C), empty for the first stage
 *   AVERAGE   u64 round, u32 n, n x str ring address (the members, in ring order),
 *             u32 ring_ms (optional: how long the ring may go without progress before it
 *             gives up; the client learns it from the rounds seen; 1..600000, default 10000)
 *     -> OK   u32 microbatches this peer accumulated since its last STEP. Sent to every
 *             member at once: they sum their gradients with a ring all-reduce (each peer's
 *             gradient is the sum over the microbatches it served). A repeated round (after
 *             a member died mid-way) first restores the gradients from before it.
 *   HEAD_GRAD (last stage) -> OK: V*C f32, the LM head's share of d(wte)
 *   FOLD_TIED (first stage) V*C f32 head share -> OK: V*C f32, the folded d(wte); a stage
 *             that is also the last clears its head share (it has been folded)
 *   SET_TIED  (last stage)  V*C f32 folded d(wte) -> OK: empty; clears the head share
 *   SUMSQ     -> OK: u32 n, n x (u64 tensor offset, f64 sum of squares of its gradient)
 *   STEP      f32 lr, f32 grad_scale, u64 step (1-based), f64 global sum of squares
 *     -> OK   empty
 *   INFO      -> OK: u32 l0, l1, n_layer, n_embd, n_head, seq_len, u64 n_params,
 *             u64 optimizer steps taken, str ring address ("" if none)
 *   STATE_GET [u64 offset, u64 count] -> OK: u64 steps, u64 n, then floats [offset,
 *             offset + count) of the peer's state: n f32 parameters (its optimizer segments,
 *             in buffer order), n f32 AdamW m, n f32 v. Without a payload: all 3n at once
 *             (if that fits a frame). Large stages are fetched in slices (stage_fetch_state)
 *   SYNC      str donor "host:port" -> OK: empty, once this peer has fetched the donor's
 *             state (STATE_GET) and taken it as its own; how a new peer joins a stage
 *   RESET     -> OK: empty. A client taking over (the previous one died mid-step) drops the
 *             gradients of the unfinished step; parameters and optimizer state are kept
 *
 * A peer that moved to another stage (rebalancing) answers ERROR(STAGE_MOVED) to every
 * request on a connection opened before the move, and to every request while it moves.
 *
 * Activations travel as `codec`: 0 = raw f32 (B*T*C*4 bytes), 1 = codec_q8 blocks.
 */
#ifndef CIRRUS_STAGE_PROTO_H
#define CIRRUS_STAGE_PROTO_H

#include <stddef.h>
#include <stdint.h>

#include "../../../common/cerr.h"
#include "../../net/wire.h"

enum stage_msg {
    STAGE_FORWARD = 64,
    STAGE_FORWARD_OK = 65,
    STAGE_BACKWARD = 66,
    STAGE_BACKWARD_OK = 67,
    STAGE_HEAD_GRAD = 68,
    STAGE_HEAD_GRAD_OK = 69,
    STAGE_FOLD_TIED = 70,
    STAGE_FOLD_TIED_OK = 71,
    STAGE_SET_TIED = 72,
    STAGE_SET_TIED_OK = 73,
    STAGE_SUMSQ = 74,
    STAGE_SUMSQ_OK = 75,
    STAGE_STEP = 76,
    STAGE_STEP_OK = 77,
    STAGE_INFO = 78,
    STAGE_INFO_OK = 79,
    STAGE_AVERAGE = 80,
    STAGE_AVERAGE_OK = 81,
    STAGE_STATE_GET = 82,
    STAGE_STATE_GET_OK = 83,
    STAGE_SYNC = 84,
    STAGE_SYNC_OK = 85,
    STAGE_RESET = 86,
    STAGE_RESET_OK = 87,
};

enum stage_codec { STAGE_CODEC_NONE = 0, STAGE_CODEC_Q8 = 1 };

#define STAGE_ROLE_CLIENT 2 /* handshake role of a pipeline client */
#define STAGE_ROLE_SYNC 3   /* handshake role of a joining peer fetching state */
#define STAGE_ADDR_MAX 280  /* bytes of a "host:port" string */

/* The code of the ERROR a peer answers once it has left its stage (rebalancing), to every
 * request on a connection opened before, and to all requests while it moves. The client
 * takes the peer out of that stage without banning its address: it rejoins at its new
 * stage through the coordinator. */
#define STAGE_MOVED CIRRUS_EGONE

/* The optimizer steps INFO reports for a peer whose state copy failed half-way. */
#define STAGE_STEPS_UNKNOWN UINT64_MAX

/* A stage's state is fetched in slices of at most this many floats (32 MiB a frame): a
 * stage of a large model holds more than a frame may carry. */
#define STAGE_STATE_SLICE ((uint64_t)8 << 20)

/* One STATE_GET exchange on the caller's connection: send req, and on success leave the
 * reply's payload in *reply. */
typedef int (*stage_state_call)(void *ctx, const wire_writer *req, wire_reader *reply,
                                cirrus_error *err);
/* Where floats [offset, offset + count) of the fetched state go. */
typedef void (*stage_state_sink)(void *ctx, uint64_t offset, const uint8_t *floats,
                                 uint64_t count);

/* Fetch a peer's whole state (3 * expect_n floats) slice by slice into sink. Every slice
 * must carry the same step (a donor that stepped in between is asked again from the start,
 * a few times at most) and n == expect_n. *steps receives the donor's step. On failure the
 * sink may have received part of the state. */
int stage_fetch_state(stage_state_call call, stage_state_sink sink, void *ctx,
                      uint64_t expect_n, uint64_t *steps, cirrus_error *err);

/* Append n floats encoded with codec. */
void stage_put_floats(wire_writer *w, const float *x, size_t n, int codec);
/* Read n floats encoded with codec into out; CIRRUS_ECORRUPT if they are not there. */
int stage_get_floats(wire_reader *r, float *out, size_t n, int codec);

#endif
