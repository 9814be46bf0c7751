/* kube_backoff: client-go's exponential backoff manager for re-list and re-watch.
 *
 * wait.NewExponentialBackoffManager(800ms, 30s, 2min, factor 2.0, jitter 1.0): each step
 * returns the current duration d plus a uniform [0, d) of jitter, then doubles d up to the
 * cap; if more than reset_ms passed since the previous step (two healthy minutes), d starts
 * over. Jitter keeps a thousand informers that lost the same API server from coming back in
 * the same millisecond. A plain struct (not opaque) so owners can embed it; time is passed
 * in, so tests need no sleeping.
 */
#ifndef CIRRUS_KUBE_BACKOFF_H
#define CIRRUS_KUBE_BACKOFF_H

#include <stdint.h>

#include "../../common/rng.h"

#define KUBE_BACKOFF_INITIAL_MS 800
#define KUBE_BACKOFF_MAX_MS 30000
#define KUBE_BACKOFF_RESET_MS 120000

typedef struct kube_backoff {
    int64_t initial_ms, max_ms, reset_ms;
    double jitter;        /* fraction of d added at most */
    int64_t cur_ms;       /* the next un-jittered duration */
    int64_t last_step_ms; /* when the previous step was taken; INT64_MIN: never */
    rng_state rng;
} kube_backoff;

/* The client-go numbers above; seed 0 picks one from the clock and pid. */
void kube_backoff_init(kube_backoff *b, uint64_t seed);
/* The delay before the next attempt, for a failure at monotonic time now_ms. */
int64_t kube_backoff_next(kube_backoff *b, int64_t now_ms);

#endif
