/* wan_msg: the messages between the gateways of a job's regions (wire types 192..207).
 *
 * A gateway connects to every other one (TLS 1.3 with the job's certificates unless
 * --wan-insecure), says HELLO with role WAN_ROLE_GATEWAY and its region index, then JOIN;
 * over that connection it sends its own pseudo-gradient of each outer round to that
 * region. Each round's message (a wan_codec message) goes as PARTs, one-way frames of at
 * most WAN_PART_BYTES, pipelined without waiting, then DONE, which is answered once the
 * receiver holds the whole message and it hashes right. A connection cut mid-message is
 * re-established and the message sent on from what the receiver holds (HAVE); the
 * receiver keeps a round it has once.
 *
 *   JOIN     str region, u32 index, u32 n_regions, u64 n_params, u64 round, u64 digest,
 *            u32 fragment, u32 n_fragments
 *     -> OK  the same fields, of the receiver
 *            A connection serves one fragment's lane (fragments.h): its JOIN names it, and
 *            n_params, round and digest are that fragment's.
 *   PART     u64 round, u64 total, u64 offset, bytes (to the frame's end)
 *   DONE     u64 round, u64 tokens, u64 prev_digest, u64 total, u64 hash (XXH3-64 of the
 *            message), u64 at (the clock the sender's region pushed the round at), u32 wish
 *            (the stride its gateway wishes for after the next round; schedule.h)
 *            -> OK: u64 round, u64 receive_ms (from the first byte of the
 *            message's first PART to its DONE, as the receiver saw them: what the link
 *            carried, without the reply's way back, which queues behind the other
 *            direction's message; 0 when the receiver had the message already)
 *
 *   HAVE     u64 round, u64 total -> OK: u64 got, u64 hash (XXH3-64 of those got bytes)
 *            How much of the sender's message of `round` (of `total` bytes) the receiver
 *            holds, in order, from an earlier connection: a sender whose connection was cut
 *            mid-message asks on the new one, and when the hash matches its own first got
 *            bytes, sends PARTs from there instead of the whole message again. got is 0 when
 *            the receiver holds none of it; total when it holds all of it.
 *
 *   STATE    u64 offset, u64 count -> OK: u64 round, u64 digest, schedule (u64 at, u32
 *            stride, u32 next_stride: when the rounds after it are pushed), count f32: floats
 *            [offset, offset + count) of the sender's global state (n parameters, then n
 *            outer momentum), at most WAN_STATE_SLICE a frame. How a gateway that lost its
 *            state (restarted, cut off past the others) or holds a different one (digest)
 *            takes the job's from a live gateway, instead of from a checkpoint file.
 *
 * round: the gateway's latest completed outer step (WAN_NO_ROUND: it has no global state
 * yet); digest: of its global parameters and
 * momentum after it. prev_digest in DONE: the sender's digest after round - 1, which every
 * receiver compares with its own (one model everywhere, checked every round).
 */
#ifndef CIRRUS_WAN_MSG_H
#define CIRRUS_WAN_MSG_H

#include <stdint.h>

#include "../net/wire.h"
#include "schedule.h"

enum wan_msg {
    WAN_JOIN = 192,
    WAN_JOIN_OK = 193,
    WAN_DONE = 194,
    WAN_DONE_OK = 195,
    WAN_PART = 196, /* one-way */
    WAN_STATE = 198,
    WAN_STATE_OK = 199,
    WAN_HAVE = 200,
    WAN_HAVE_OK = 201,
};

#define WAN_STATE_SLICE ((uint64_t)1 << 20) /* floats per STATE_OK (4 MiB) at most */
#define WAN_STATE_SLICE_MIN ((uint64_t)1 << 14) /* what a fetcher asks at least (64 KiB) */
#define WAN_NO_ROUND UINT64_MAX             /* JOIN's round of a gateway without state */
/* DONE refused: the receiver completed that round without the sender's delta (it came too
 * late); the sender takes the receiver's result instead of finishing the round itself. */
#define WAN_LEFT_OUT CIRRUS_EGONE

#define WAN_ROLE_GATEWAY 8           /* HELLO role of a gateway's WAN connection */
#define WAN_PART_BYTES (256u << 10)  /* message bytes per PART (>= 64 KiB: WAN-sized) */
#define WAN_REGION_MAX 63            /* bytes of a region name */
#define WAN_MAX_REGIONS 16           /* the CRD's maxItems */

typedef struct wan_join {
    char region[WAN_REGION_MAX + 1];
    uint32_t index, n_regions;
    uint64_t n_params, round, digest;
    uint32_t fragment, n_fragments;
} wan_join;

typedef struct wan_part {
    uint64_t round, total, offset;
    const uint8_t *bytes; /* get: inside the payload */
    uint64_t len;
} wan_part;

typedef struct wan_done {
    uint64_t round, tokens, prev_digest, total, hash, at;
    uint32_t wish; /* get: a valid stride */
} wan_done;

void wan_msg_put_join(wire_writer *w, const wan_join *j);
/* Refuses a region name that is empty, too long or not [A-Za-z0-9._-], index >=
 * n_regions, n_regions outside 1..WAN_MAX_REGIONS, n_fragments outside
 * 1..OUTER_MAX_FRAGMENTS and fragment >= n_fragments. */
int wan_msg_get_join(wire_reader *r, wan_join *j);
void wan_msg_put_part(wire_writer *w, const wan_part *p);
/* Refuses offset + len past total and total over max_total. */
int wan_msg_get_part(wire_reader *r, uint64_t max_total, wan_part *p);
void wan_msg_put_done(wire_writer *w, const wan_done *d);
int wan_msg_get_done(wire_reader *r, uint64_t max_total, wan_done *d);
typedef struct wan_state_slice {
    uint64_t round, digest;
    outer_schedule sched;
    const uint8_t *floats; /* get: count f32 inside the payload */
} wan_state_slice;

void wan_msg_put_state(wire_writer *w, uint64_t offset, uint64_t count);
/* Refuses a slice outside the 2n floats of the state or over WAN_STATE_SLICE. */
int wan_msg_get_state(wire_reader *r, uint64_t n, uint64_t *offset, uint64_t *count);
void wan_msg_put_state_ok(wire_writer *w, uint64_t round, uint64_t digest,
                          const outer_schedule *sched, const float *x, uint64_t count);
int wan_msg_get_state_ok(wire_reader *r, uint64_t count, wan_state_slice *s);
void wan_msg_put_have(wire_writer *w, uint64_t round, uint64_t total);
/* Refuses total over max_total. */
int wan_msg_get_have(wire_reader *r, uint64_t max_total, uint64_t *round, uint64_t *total);
void wan_msg_put_have_ok(wire_writer *w, uint64_t got, uint64_t hash);
/* Refuses got over total (the message the sender asked about). */
int wan_msg_get_have_ok(wire_reader *r, uint64_t total, uint64_t *got, uint64_t *hash);
void wan_msg_put_done_ok(wire_writer *w, uint64_t round, uint64_t receive_ms);
int wan_msg_get_done_ok(wire_reader *r, uint64_t *round, uint64_t *receive_ms);

#endif
