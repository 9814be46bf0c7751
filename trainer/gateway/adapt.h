/* adapt: how hard a gateway compresses, chosen per outer step from what its links carry
 * (Nebula-I's adaptive communication). Pure: no I/O, no clock.
 *
 * A ladder of codecs from the densest (fp32) to the sparsest (1% top-k, zstd). Each outer
 * step the gateway knows the slowest link's measured rate and the window a sync has (the
 * time between two of the region's pushes, H inner steps). It takes the densest rung whose
 * message crosses the slowest link within `budget` of the window; moving to a denser rung
 * (the link got faster) needs room under a lower budget, so a rate near a boundary does not
 * flip the codec every round. If even the sparsest rung does not fit, it is taken, and the
 * gateway asks for the syncs to be spaced further apart (adapt_stride, schedule.h).
 */
#ifndef CIRRUS_ADAPT_H
#define CIRRUS_ADAPT_H

#include <stddef.h>
#include <stdint.h>

#include "wan_codec.h"

#define ADAPT_BUDGET 0.8         /* of the window a sync may take */
#define ADAPT_BACKOFF_BUDGET 0.5 /* ...and to move to a denser codec */
#define ADAPT_RUNGS 6
#define ADAPT_START_RUNG 2       /* q8, until the links are measured */

/* A message of this many bytes or more measures a link's rate; a smaller one mostly
 * measures what the link lets through at once (its queue, TCP's first window) and latency. */
#define ADAPT_RATE_TRUST_BYTES (256.0 * 1024)

/* A reading timed over this long or more (the receiver's clock counts milliseconds: 5% at
 * most) counts towards a run of faster readings; a shorter one is mostly rounding. */
#define ADAPT_RATE_TIMED_S 0.020
/* This many faster, timed readings in a row: the link carried at least the least of them
 * that often, and the estimate rises to it whatever the messages' size. */
#define ADAPT_RATE_RUN 3

/* A link's rate estimate, fed one reading per message sent. */
typedef struct adapt_rate {
    double Bps;                  /* bytes per second; <= 0: not measured yet */
    double run[ADAPT_RATE_RUN];  /* the latest faster, timed readings in a row */
    int run_n;
} adapt_rate;

/* The estimate after a message of `bytes` crossed in `seconds`: a slower reading is believed
 * at once (the next sync must fit it); a faster one moves the estimate half way for a message
 * of ADAPT_RATE_TRUST_BYTES or more, in proportion to its share of that for a smaller one (a
 * quarter of that size: an eighth of the way), so that a few-KiB top-k message sent in one
 * burst cannot make a slow link look fast (and send the next sync dense). Yet a sparse
 * codec's small messages alone must find a recovered link again within a few rounds: after
 * ADAPT_RATE_RUN faster readings in a row, each timed over ADAPT_RATE_TIMED_S or more, the
 * estimate is at least their least. The first reading is taken as it is. */
void adapt_rate_update(adapt_rate *est, uint64_t bytes, double seconds);

/* The ladder's rung r (0 densest .. ADAPT_RUNGS - 1 sparsest). */
void adapt_rung(int r, wan_codec_params *p);
/* Bytes a message of rung r for n values takes, as estimated before encoding. */
double adapt_bytes(int r, uint64_t n);

/* The rung for the next outer step, from the current one: link_Bps, the slowest link's
 * measured bytes per second (<= 0: not measured yet: stay); window_s, the time between
 * syncs (<= 0: not known yet: stay). why receives one line for the logs and /status. */
int adapt_choose(int current, uint64_t n, double link_Bps, double window_s, char *why,
                 size_t why_size);

/* The stride (schedule.h) to wish for: the smallest power of two s up to OUTER_MAX_STRIDE
 * whose window, s x base_window_s, the sparsest rung's message crosses within the budget
 * (the lower ADAPT_BACKOFF_BUDGET for an s below current: a link near a boundary does not
 * flip the spacing every round); OUTER_MAX_STRIDE if none. So syncs are spaced out only
 * when compressing harder cannot make them fit, and back to every H steps as soon as the
 * sparsest message fits again, before any denser codec is tried. base_window_s: the
 * region's compute time of H inner steps. current unchanged while the link or the window
 * is not measured yet. max_stride (rounded down to a power of two) bounds all of it,
 * OUTER_MAX_STRIDE the largest. */
uint32_t adapt_stride(uint32_t current, uint64_t n, double link_Bps, double base_window_s,
                      uint32_t max_stride);

#endif
