/* stage_msg: the messages between pipeline clients and stage peers (wire types 64..127).
 *
 * Every body is built and parsed by the put/get pair of its struct below (over wire_writer
 * and wire_reader: little-endian, bounds-checked), so the endpoints never lay out a message
 * by hand. Every request is answered by the type + 1 with the same request id, or by
 * WIRE_ERROR (i32 code, str message), read by proto/rpc.h. See docs/PROTOCOL.md.
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
 *   PARAMS_SET u64 steps, u64 n, u64 offset, u64 count, count f32 -> OK: empty. Between two
 *             steps, parameters [offset, offset + count) of the peer's n (its optimizer
 *             segments, in buffer order: the first third of STATE_GET) are replaced; the
 *             AdamW moments stay. The region's leader client installs the global
 *             parameters of an outer step this way (gateway/). Refused unless the peer has
 *             taken exactly `steps` steps and holds no gradients of an unfinished step
 *   STATE_SET u64 steps, u64 n, u64 offset, u64 count, count f32 -> OK: empty. Floats
 *             [offset, offset + count) of the peer's whole state (3n, laid out as STATE_GET
 *             serves it: parameters, AdamW m, v) are replaced; a slice at offset 0 drops the
 *             peer's gradients and leaves it at no step (STAGE_STEPS_UNKNOWN) until the
 *             slice that ends the state makes it a peer that has taken `steps` steps. How
 *             a resuming client installs a checkpoint on the peers
 *
 * A peer that moved to another stage (rebalancing) answers ERROR(STAGE_MOVED) to every
 * request on a connection opened before the move, and to every request while it moves.
 *
 * Activations travel as `codec`: 0 = raw f32 (B*T*C*4 bytes), 1 = codec_q8 blocks.
 */
#ifndef CIRRUS_STAGE_MSG_H
#define CIRRUS_STAGE_MSG_H

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
    STAGE_PARAMS_SET = 88,
    STAGE_PARAMS_SET_OK = 89,
    STAGE_STATE_SET = 90,
    STAGE_STATE_SET_OK = 91,
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

/* An optimizer segment of the stage (adamw's, in buffer order) whose AdamW moments started
 * again from zero after optimizer step `from` (adamw_segment.moments_from): its bias
 * correction counts from there. A copy of the state carries them, so that the copy steps
 * exactly as its donor does. */
typedef struct stage_origin {
    uint32_t segment;
    uint64_t from;
} stage_origin;

#define STAGE_MAX_ORIGINS 65536u /* origins one STATE_GET_OK may list */

/* The origins a fetch saw (stage_fetch_state): at most max of them into o[0..*n). */
typedef struct stage_origins {
    stage_origin *o;
    uint32_t max, n;
} stage_origins;

/* Fetch a peer's whole state (3 * expect_n floats) slice by slice into sink. Every slice
 * must carry the same step (a donor that stepped in between is asked again from the start,
 * a few times at most) and n == expect_n. *steps receives the donor's step, and origins
 * (NULL: not wanted) the donor's moments origins, as its last slice listed them (more than
 * origins->max: CIRRUS_EMISMATCH). On failure the sink may have received part of the
 * state. */
int stage_fetch_state(stage_state_call call, stage_state_sink sink, void *ctx,
                      uint64_t expect_n, uint64_t *steps, stage_origins *origins,
                      cirrus_error *err);

/* ---- message bodies: a typed struct and a put/get pair for each ----
 * put appends a body to a wire_writer (a writer past its cap latches `failed`, which the
 * sender checks). get reads one from a wire_reader over a received payload, checks every
 * length and count against the caps it is given, consumes the payload exactly, and returns
 * 0, or CIRRUS_ECORRUPT without writing past its outputs. Bodies that are empty (the
 * requests HEAD_GRAD, SUMSQ, INFO, RESET; most replies) are checked with
 * stage_msg_get_empty. */

#define STAGE_MB_HEAD_SIZE 20             /* FORWARD/BACKWARD bytes before the input */
#define STAGE_AVERAGE_MAX_MEMBERS 64      /* ring members named in one AVERAGE */
#define STAGE_RING_MS_DEFAULT 10000u      /* AVERAGE without ring_ms (older clients) */
#define STAGE_RING_MS_MAX 600000u         /* the longest ring_ms a client may ask for */

/* FORWARD and BACKWARD. Which input travels depends on the receiving stage: token bytes to
 * the first, activations to the others. Put writes the parts that are not NULL. */
typedef struct stage_microbatch {
    uint64_t id;             /* the microbatch; the key of the activations a peer keeps */
    uint32_t B, T;
    uint8_t keep;            /* FORWARD: keep the activations for the backward */
    uint8_t codec;           /* enum stage_codec of every activation part */
    uint8_t has_targets;     /* 0 or 1: targets follow the input (last stage only) */
    const int32_t *tokens;   /* (B*T) the first stage's input, each < 256; else NULL */
    const float *hidden;     /* (B*T*C) the input of the other stages; else NULL */
    const int32_t *targets;  /* (B*T) if has_targets; else NULL */
    const float *grad_out;   /* (B*T*C) BACKWARD to a stage before the last; else NULL */
} stage_microbatch;

/* What a stage peer accepts and where its parts go: the decoded microbatch's pointers
 * point into these buffers. */
typedef struct stage_mb_dest {
    uint32_t max_B, max_T;   /* the largest microbatch the peer was started for */
    size_t C;                /* n_embd */
    int first, last;         /* the stage holds the embedding / the LM head */
    int32_t *tokens, *targets;  /* max_B * max_T each */
    float *hidden, *grad_out;   /* max_B * max_T * C each */
} stage_mb_dest;

void stage_msg_put_microbatch(wire_writer *w, const stage_microbatch *m, size_t C);
/* type is STAGE_FORWARD or STAGE_BACKWARD: a BACKWARD carries grad_out unless d->last, and
 * targets if d->last; targets anywhere but the last stage are malformed. */
int stage_msg_get_microbatch(wire_reader *r, uint16_t type, const stage_mb_dest *d,
                             stage_microbatch *m);

/* FORWARD_OK of the last stage with targets: f32 mean loss. */
void stage_msg_put_loss(wire_writer *w, float loss);
int stage_msg_get_loss(wire_reader *r, float *loss);

/* FORWARD_OK otherwise, and BACKWARD_OK: n activations (or gradients) encoded with codec.
 * Put refuses (latches w->failed) a non-finite activation under codec_q8. */
void stage_msg_put_acts(wire_writer *w, const float *x, size_t n, int codec);
int stage_msg_get_acts(wire_reader *r, float *out, size_t n, int codec);

/* HEAD_GRAD_OK, FOLD_TIED, FOLD_TIED_OK, SET_TIED: n raw f32 (n = V*C). Get points *g at
 * them inside the payload (valid as long as the payload). */
void stage_msg_put_tied(wire_writer *w, const float *g, size_t n);
int stage_msg_get_tied(wire_reader *r, size_t n, const float **g);

/* SUMSQ_OK: the sum of squares of each optimizer tensor's gradient. */
typedef struct stage_sumsq_part {
    uint64_t offset;         /* the tensor's offset in the model's parameter buffer */
    double sumsq;
} stage_sumsq_part;

void stage_msg_put_sumsq(wire_writer *w, const stage_sumsq_part *parts, uint32_t n);
/* *parts is malloc'd (free() it; NULL when *n is 0). A count the payload cannot hold is
 * refused before anything is allocated; CIRRUS_ENOMEM if the allocation fails. */
int stage_msg_get_sumsq(wire_reader *r, stage_sumsq_part **parts, uint32_t *n);

/* STEP. Get also refuses step 0, lr < 0, grad_scale <= 0, a negative sum and NaNs. */
typedef struct stage_step {
    float lr, grad_scale;
    uint64_t step;           /* 1-based */
    double sumsq;            /* the global sum of squares of the gradient */
} stage_step;

void stage_msg_put_step(wire_writer *w, const stage_step *s);
int stage_msg_get_step(wire_reader *r, stage_step *s);

/* INFO_OK: what a peer serves. Get checks the syntax only: whether the layers fit the
 * asker's model is the asker's question (CIRRUS_EMISMATCH there). */
typedef struct stage_info {
    uint32_t l0, l1;         /* layers [l0, l1) */
    uint32_t n_layer, n_embd, n_head, seq_len;
    uint64_t n_params;
    uint64_t steps;          /* optimizer steps taken; STAGE_STEPS_UNKNOWN */
    char ring[STAGE_ADDR_MAX]; /* its gradient-averaging address; "" if none */
} stage_info;

void stage_msg_put_info(wire_writer *w, const stage_info *in);
int stage_msg_get_info(wire_reader *r, stage_info *in);

/* AVERAGE (about 18 KiB: keep it off small stacks). Get takes a missing ring_ms as
 * STAGE_RING_MS_DEFAULT; it refuses round 0, n outside 1..STAGE_AVERAGE_MAX_MEMBERS and
 * ring_ms outside 1..STAGE_RING_MS_MAX. Whether the members make a ring (distinct, this
 * peer among them, HOST:PORT) is the member's question. */
typedef struct stage_average {
    uint64_t round;          /* the client's round; a repeat keeps the number */
    uint32_t n;              /* members, in ring order */
    uint32_t ring_ms;        /* how long the ring may go without progress */
    char addrs[STAGE_AVERAGE_MAX_MEMBERS][STAGE_ADDR_MAX];
} stage_average;

void stage_msg_put_average(wire_writer *w, const stage_average *a);
int stage_msg_get_average(wire_reader *r, stage_average *a);

/* AVERAGE_OK: microbatches this peer accumulated since its last STEP. */
void stage_msg_put_average_ok(wire_writer *w, uint32_t microbatches);
int stage_msg_get_average_ok(wire_reader *r, uint32_t *microbatches);

/* STATE_GET: floats [offset, offset + count) of a state of `total` (3n) floats. Put always
 * names the slice; get takes an empty request as the whole state, and refuses a slice
 * outside it or over STAGE_STATE_SLICE (an empty one too, for a state over it). */
typedef struct stage_state_get {
    uint64_t offset, count;
} stage_state_get;

void stage_msg_put_state_get(wire_writer *w, const stage_state_get *q);
int stage_msg_get_state_get(wire_reader *r, uint64_t total, stage_state_get *q);

/* STATE_GET_OK: its head (put; the floats follow, appended by the peer), and a whole reply
 * of `count` floats (get; *floats points at them inside the payload). The head lists the
 * donor's moments origins (stage_origin), by increasing segment, each from in
 * [1, steps]; get refuses any other list. */
typedef struct stage_state_slice {
    uint64_t steps;          /* the donor's optimizer steps */
    uint64_t n;              /* floats in each of parameters, m and v */
    uint32_t n_origins;      /* <= STAGE_MAX_ORIGINS */
    const uint8_t *origins;  /* n_origins x (u32 segment, u64 from): stage_msg_origin_at */
    const uint8_t *floats;   /* count f32, little-endian, possibly unaligned */
} stage_state_slice;

void stage_msg_put_state_head(wire_writer *w, uint64_t steps, uint64_t n,
                              const stage_origin *origins, uint32_t n_origins);
stage_origin stage_msg_origin_at(const stage_state_slice *s, uint32_t i);
void stage_msg_put_state_floats(wire_writer *w, const float *x, uint64_t count);
int stage_msg_get_state_slice(wire_reader *r, uint64_t count, stage_state_slice *s);

/* PARAMS_SET: get checks that the slice lies inside the n parameters the receiver has
 * (n must equal its own) and is at most STAGE_STATE_SLICE floats; *floats points at them
 * inside the payload (little-endian, possibly unaligned). */
typedef struct stage_params_set {
    uint64_t steps;          /* the optimizer steps the peer must have taken */
    uint64_t n;              /* the peer's parameter count, as the sender knows it */
    uint64_t offset, count;
    const uint8_t *floats;
} stage_params_set;

/* Put writes the head and, if x is not NULL, x[0..count); with NULL the caller appends the
 * count floats (stage_msg_put_state_floats), e.g. piece by piece. */
void stage_msg_put_params_set(wire_writer *w, const stage_params_set *q, const float *x);
int stage_msg_get_params_set(wire_reader *r, uint64_t n, stage_params_set *q);
/* STATE_SET: the same body as PARAMS_SET (put with stage_msg_put_params_set), its slice
 * inside the 3n floats of the whole state. */
int stage_msg_get_state_set(wire_reader *r, uint64_t n, stage_params_set *q);

/* The floats of STATE_GET (a stage's parameters, then its AdamW m, then v) and of
 * PARAMS_SET (the parameters) lie in memory as runs laid end to end: the parameters of
 * the stage's spans (gpt_stage_state_spans) where they sit in the model's buffer, then
 * the moments. The peer serving them and the client gathering or installing them map a
 * slice onto their runs with the same walk. */
typedef struct stage_run {
    float *at;      /* read only by stage_msg_put_runs */
    uint64_t count;
} stage_run;

#define STAGE_MAX_RUNS 6 /* a stage's two spans, each in parameters, m and v */

/* Append floats [off, off + count) of runs[0..n) to w. */
void stage_msg_put_runs(wire_writer *w, const stage_run *runs, int n, uint64_t off,
                        uint64_t count);
/* Copy count floats as they travel (little-endian, possibly unaligned) into floats
 * [off, off + count) of runs[0..n). */
void stage_msg_take_runs(const stage_run *runs, int n, uint64_t off, const uint8_t *floats,
                         uint64_t count);

/* SYNC: the donor's "host:port". */
void stage_msg_put_sync(wire_writer *w, const char *donor);
int stage_msg_get_sync(wire_reader *r, char donor[STAGE_ADDR_MAX]);

/* An empty body: 0 if r holds nothing. */
int stage_msg_get_empty(wire_reader *r);

#endif
