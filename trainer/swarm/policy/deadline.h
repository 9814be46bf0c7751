/* deadline: how long a client waits for a stage peer before retrying elsewhere.
 *
 * The SWARM reference waits a fixed 30 s (forward) / 75 s (backward), and its users
 * complain about guessed timeouts (seeds.md, "Fault handling"; hivemind #676 proposes
 * median + k * MAD). Too long wastes a stage's slot on a dead peer, too short re-sends work
 * a slow but healthy peer was about to finish. Here the deadline follows the latencies
 * actually seen: over a window of the most recent ones,
 *
 *   base     = max(median + k * 1.4826 * MAD, min_ratio * median)
 *   deadline = clamp(base * backoff, floor, ceiling)
 *
 * MAD (median absolute deviation) scaled by 1.4826 estimates a standard deviation that one
 * huge outlier cannot drag (its breakdown point is 50%, a mean's or stddev's is 0).
 * min_ratio keeps a margin when latencies are almost constant (MAD ~ 0 would otherwise put
 * the deadline at the median, and the next small hiccup would time out). Until min_samples
 * latencies were seen, a generous initial deadline applies: a cold peer (allocation,
 * warm-up) is slow once. backoff is 1 normally and doubles with each timeout (as TCP's
 * retransmission timer, RFC 6298): if every latency shifts up at once (a slower network),
 * the window alone would need half its length of timeouts to follow.
 *
 * Keep one estimator per (stage, kind): a backward costs ~2.5x a forward. Pure: no clock
 * reads, no I/O. Defines deadline_config and the opaque deadline_estimator.
 */
#ifndef CIRRUS_DEADLINE_H
#define CIRRUS_DEADLINE_H

#include "../../../common/cerr.h"

typedef struct deadline_config {
    int window;       /* latencies kept (ring buffer), 1..4096; default 64 */
    int min_samples;  /* latencies needed before the estimate is trusted, 1..window; 8 */
    double k;         /* MAD multiplier, >= 0; 6 */
    double min_ratio; /* deadline >= min_ratio * median, >= 1; 1.5 */
    double floor_s;   /* lower clamp, > 0; 0.05 s */
    double ceiling_s; /* upper clamp, >= floor_s; 120 s */
    double initial_s; /* before min_samples (then clamped); 75 s, the reference's largest */
} deadline_config;

/* The scale that makes MAD estimate sigma for normally distributed latencies. */
#define DEADLINE_MAD_SCALE 1.4826

typedef struct deadline_estimator deadline_estimator;

deadline_config deadline_config_default(void);
/* cfg NULL = defaults. CIRRUS_EINVAL on an out-of-range field, CIRRUS_ENOMEM. */
int deadline_estimator_new(deadline_estimator **out, const deadline_config *cfg);
void deadline_estimator_free(deadline_estimator *d);

/* One successful request's latency (seconds from request to response). CIRRUS_EINVAL
 * (and nothing recorded) for a negative, NaN or infinite value. */
int deadline_observe(deadline_estimator *d, double seconds);
/* A request that timed out after waiting `seconds`: its latency is unknown but at least
 * that, so max(seconds, current deadline) is recorded (without it, only requests that beat
 * the deadline would be seen, and a deadline that is too short could never grow), and the
 * back-off doubles. A later success within the window's own deadline ends the back-off;
 * one that needed the back-off keeps it until the window has caught up. */
int deadline_observe_timeout(deadline_estimator *d, double seconds);

/* The deadline to use for the next request, in seconds. O(1): it is recomputed when a
 * latency is observed. */
double deadline_get(const deadline_estimator *d);
/* Statistics of the current window: returns the number of latencies in it (0: median and
 * MAD are set to 0), *median and *mad (raw, unscaled) when not NULL. */
int deadline_stats(const deadline_estimator *d, double *median, double *mad);

#endif
