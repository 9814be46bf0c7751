/* kube_workqueue: client-go's rate-limited work queue for reconcile keys.
 *
 * Keys ("namespace/name") are deduplicated: a key waits in the queue at most once, and a
 * key added while it is being processed is queued again when done() is called, so one key
 * is never reconciled twice at the same time and no change is lost. add_rate_limited()
 * requeues a failed key after max(per-key backoff, global token bucket): the per-key part
 * is 5 ms * 2^failures capped at 1000 s, the bucket 10 qps with a burst of 100
 * (DefaultControllerRateLimiter). forget() clears a key's failures after a success.
 *
 * Time comes from a clock function so tests can step it. Single-threaded, like the event
 * loop that owns it: get() never blocks; next_ready_ns() says how long the loop may sleep.
 */
#ifndef CIRRUS_KUBE_WORKQUEUE_H
#define CIRRUS_KUBE_WORKQUEUE_H

#include <stddef.h>
#include <stdint.h>

typedef struct kube_workqueue kube_workqueue;

#define KUBE_WQ_BASE_DELAY_NS 5000000LL            /* 5 ms */
#define KUBE_WQ_MAX_DELAY_NS 1000000000000LL       /* 1000 s */
#define KUBE_WQ_QPS 10
#define KUBE_WQ_BURST 100

/* Monotonic nanoseconds. */
typedef int64_t (*kube_clock_fn)(void *ctx);

typedef struct kube_workqueue_stats {
    size_t depth;      /* keys ready to be processed */
    size_t waiting;    /* keys waiting for their delay */
    uint64_t adds;     /* add() calls that queued (workqueue_adds_total) */
    uint64_t retries;  /* add_rate_limited() calls (workqueue_retries_total) */
} kube_workqueue_stats;

/* clock NULL: CLOCK_MONOTONIC. NULL on allocation failure. */
kube_workqueue *kube_workqueue_new(kube_clock_fn clock, void *clock_ctx);
void kube_workqueue_free(kube_workqueue *q);

/* 0 or CIRRUS_ENOMEM. */
int kube_workqueue_add(kube_workqueue *q, const char *key);
/* Add once delay_ns has passed (a key already waiting keeps the earlier time). */
int kube_workqueue_add_after(kube_workqueue *q, const char *key, int64_t delay_ns);
/* Add after the rate limiter's delay for key (returned in *delay_ns if not NULL); counts
 * as a failure of key. */
int kube_workqueue_add_rate_limited(kube_workqueue *q, const char *key, int64_t *delay_ns);
/* Stop tracking key's failures: its next add_rate_limited starts from 5 ms again. */
void kube_workqueue_forget(kube_workqueue *q, const char *key);
int kube_workqueue_num_requeues(kube_workqueue *q, const char *key);

/* The next ready key (1), valid until done(); 0 when none is ready. */
int kube_workqueue_get(kube_workqueue *q, const char **key);
/* Processing of key finished (successfully or not); it is requeued if re-added meanwhile. */
void kube_workqueue_done(kube_workqueue *q, const char *key);

/* 0 when a key is ready, the nanoseconds until the next delayed key is, -1 when idle. */
int64_t kube_workqueue_next_ready_ns(kube_workqueue *q);
void kube_workqueue_get_stats(kube_workqueue *q, kube_workqueue_stats *st);

#endif
