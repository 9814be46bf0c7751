/* outer_msg: the messages between a region's leader client and its gateway's outer sync
 * (coordinator extension types, COORD_EXT_FIRST..; each answered by its type + 1 or by
 * WIRE_ERROR). Every length and offset is checked against the model's parameter count
 * before use.
 *
 * Every request starts with u16 fragment: the fragment of the parameters it is about
 * (fragments.h; 0 with one fragment); offsets and counts are within that fragment.
 *
 *   PUSH   u16 fragment, u64 round, u64 inner_step, u64 at, u64 tokens, u32 compute_ms,
 *          u64 n_params, u64 offset, u64 count, count f32 -> OK: empty.
 *          at: the fragment's clock at the push (inner_step + its lead; schedule.h).
 *          compute_ms: the client's time since the fragment's previous push less what it
 *          spent in the outer steps (pushing, pulling, waiting for rounds): the compute the
 *          round's message must cross in (--codec auto); 0: not known (the first push).
 *          The region's parameters after inner step `inner_step`, slice by slice (at most
 *          OUTER_SLICE floats a frame). Round 0 carries the initial parameters (the
 *          gateway adopts them as the global ones, or keeps those it has); round k >= 1
 *          starts outer step k once its last slice is in. tokens: what the region trained
 *          on since the last round (the weight of its pseudo-gradient).
 *   PULL   u16 fragment, u64 round, u64 offset, u64 count -> OK: u64 done (the latest completed round),
 *          u64 digest (of the global parameters and momentum after it), u64 wan_bytes
 *          (sent and received on the gateway's WAN sockets so far), u8 ready, u8 pushed
 *          (the gateway holds this region's push of `round`, or is past it), u16 region,
 *          u16 regions (the region's index among the job's regions, and their number:
 *          the client reads that shard of the data), u16 fragments (how many the gateway
 *          cuts the parameters into), the schedule after done (u64 at, u32 stride,
 *          u32 next_stride: when the next rounds are pushed; schedule.h), then, if ready
 *          (done >= round), count f32 of the global parameters at offset.
 */
#ifndef CIRRUS_OUTER_MSG_H
#define CIRRUS_OUTER_MSG_H

#include <stdint.h>

#include "../net/wire.h"
#include "../swarm/proto/coord_msg.h"
#include "schedule.h"

enum outer_msg {
    OUTER_PUSH = COORD_EXT_FIRST,
    OUTER_PUSH_OK = COORD_EXT_FIRST + 1,
    OUTER_PULL = COORD_EXT_FIRST + 2,
    OUTER_PULL_OK = COORD_EXT_FIRST + 3,
};

/* Floats a PUSH or PULL_OK carries at most: 8 MiB, inside COORD_REPLY_LIMIT. */
#define OUTER_SLICE ((uint64_t)2 << 20)
/* The largest request payload the gateway accepts (a PUSH of a full slice). */
#define OUTER_REQUEST_LIMIT ((uint32_t)(OUTER_SLICE * 4 + 256))

typedef struct outer_push {
    uint16_t fragment;
    uint64_t round, inner_step, at, tokens, n_params, offset, count;
    uint32_t compute_ms;
    const uint8_t *floats; /* get: count f32 inside the payload, possibly unaligned */
} outer_push;

typedef struct outer_pull {
    uint16_t fragment;
    uint64_t round, offset, count;
} outer_pull;

typedef struct outer_pull_ok {
    uint64_t done, digest, wan_bytes;
    uint8_t ready, pushed;
    uint16_t region, regions; /* get: regions >= 1, region < regions */
    uint16_t fragments;       /* get: 1..OUTER_MAX_FRAGMENTS */
    outer_schedule sched;     /* get: valid strides */
    const uint8_t *floats;    /* get: count f32 if ready, else NULL */
} outer_pull_ok;

/* The fragment a request is about, read without consuming it; -1 when the payload is too
 * short to say. */
int outer_msg_peek_fragment(const wire_reader *r);
/* Put writes x[0..count) after the head. Get refuses a slice outside n_params, over
 * OUTER_SLICE, a count the payload does not hold exactly, and n_params other than n (the fragment's floats). */
void outer_msg_put_push(wire_writer *w, const outer_push *q, const float *x);
int outer_msg_get_push(wire_reader *r, uint64_t n, outer_push *q);
void outer_msg_put_pull(wire_writer *w, const outer_pull *q);
int outer_msg_get_pull(wire_reader *r, uint64_t n, outer_pull *q);
/* x: the count floats to send when ready (NULL when not). */
void outer_msg_put_pull_ok(wire_writer *w, const outer_pull_ok *a, const float *x,
                           uint64_t count);
int outer_msg_get_pull_ok(wire_reader *r, uint64_t count, outer_pull_ok *a);

#endif
