/* schedule: at which inner steps a fragment's outer rounds are pushed, and how a gateway
 * that even the sparsest codec cannot get through its window syncs less often (Nebula-I's
 * adaptive communication, its last resort).
 *
 * Each fragment counts inner steps on its own clock, at = step + lead (fragments.h). With
 * --sync-every H, round k is pushed at clock k x H. Every global state after round k carries
 * the clock its pushes were made at and two strides: round k + 1 is pushed stride x H
 * clock steps after round k, and round k + 2 next_stride x H after round k + 1. A stride of
 * 1 everywhere is plain --sync-every H. The strides are agreed, not guessed: each region's
 * message of round k says the stride its gateway wishes for the spacing after round k + 1
 * (adapt_stride), and every gateway that completes round k from the same messages takes the
 * largest wish, so all regions push at the same steps. Deciding one round ahead is what
 * lets a region know, when it pushes round k + 1, how long that round may take: until
 * round k + 2 is due. The schedule is part of the global state, its digest and its fetches
 * (a repaired or rejoining gateway takes it with the parameters). Pure: no I/O.
 */
#ifndef CIRRUS_SCHEDULE_H
#define CIRRUS_SCHEDULE_H

#include <stdint.h>

#include "../net/wire.h"

/* Syncs are stretched to at most this many times --sync-every: past it, a link that slow
 * is better treated as lost (the round's deadline) than waited for. */
#define OUTER_MAX_STRIDE 16u

typedef struct outer_schedule {
    uint64_t at;          /* the clock round k's pushes were made at (0 for round 0) */
    uint32_t stride;      /* round k + 1 comes stride x H clock steps after it */
    uint32_t next_stride; /* and round k + 2 next_stride x H after round k + 1 */
} outer_schedule;

/* Before any round: round 1 at H, round 2 at 2H. */
#define OUTER_SCHEDULE_START ((outer_schedule){.at = 0, .stride = 1, .next_stride = 1})

/* Whether a stride is one a schedule may hold: a power of two in 1..OUTER_MAX_STRIDE. */
int outer_stride_valid(uint32_t stride);

/* Whether clock `at` is a push point after the state s (of outer step `done`): past s->at,
 * on its grid of stride x every. With stride 1 from the start: at % every == 0. */
int outer_schedule_push_due(const outer_schedule *s, uint64_t every, uint64_t at);

/* The round a push at clock `at` makes, from the state of outer step done: done + the grid
 * points past s->at up to at (rounding up: a run's last step, off the grid, pushes the next
 * round). done itself when at is not past s->at: the job is past that push. */
uint64_t outer_schedule_round(const outer_schedule *s, uint64_t done, uint64_t every,
                              uint64_t at);

/* The clock by which the result of the round pushed at clock `pushed` (the one after the
 * state s) is needed: where the round after it is pushed. */
uint64_t outer_schedule_result_due(const outer_schedule *s, uint64_t every, uint64_t pushed);

/* The schedule after a round, from the one before it and the round's present messages:
 * their push clocks at[0..n) (the earliest past the previous round's is the round's) and
 * stride wishes wish[0..n) (each valid; the widest wins). Every gateway that completes the
 * round from the same messages computes the same. */
void outer_schedule_advance(outer_schedule *s, const uint64_t *at, const uint32_t *wish, int n);

/* On the wire: u64 at, u32 stride, u32 next_stride. Get refuses a stride that is not valid. */
void outer_schedule_put(wire_writer *w, const outer_schedule *s);
int outer_schedule_get(wire_reader *r, outer_schedule *s);

#endif
