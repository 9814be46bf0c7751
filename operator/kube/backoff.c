#include "backoff.h"

#include <time.h>
#include <unistd.h>

void kube_backoff_init(kube_backoff *b, uint64_t seed)
{
    b->initial_ms = KUBE_BACKOFF_INITIAL_MS;
    b->max_ms = KUBE_BACKOFF_MAX_MS;
    b->reset_ms = KUBE_BACKOFF_RESET_MS;
    b->jitter = 1.0;
    b->cur_ms = b->initial_ms;
    b->last_step_ms = INT64_MIN;
    if (seed == 0) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        seed = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 20) ^ ((uint64_t)getpid() << 40);
    }
    rng_seed(&b->rng, seed);
}

int64_t kube_backoff_next(kube_backoff *b, int64_t now_ms)
{
    if (b->last_step_ms != INT64_MIN && now_ms - b->last_step_ms > b->reset_ms)
        b->cur_ms = b->initial_ms;
    b->last_step_ms = now_ms;
    int64_t d = b->cur_ms;
    b->cur_ms = d * 2 > b->max_ms ? b->max_ms : d * 2;
    return d + (int64_t)(b->jitter * rng_uniform(&b->rng) * (double)d);
}
