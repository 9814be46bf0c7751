#include "workqueue.h"

#include <stdlib.h>
#include <string.h>

#include "../../common/cerr.h"
#include "../../common/clock.h"

/* Everything the queue knows about one key; freed when it knows nothing worth keeping. */
struct wq_item {
    struct wq_item *hnext;
    char *key;
    int dirty;      /* must be processed (again): queued, or re-added while processing */
    int queued;     /* in the ready FIFO */
    int processing; /* handed out by get(), done() not yet called */
    int waiting;    /* in the delay heap */
    int failures;   /* add_rate_limited() calls since the last forget() */
    int64_t ready_at;
    size_t heap_idx;
};

struct kube_workqueue {
    kube_clock_fn clock;
    void *clock_ctx;
    struct wq_item **buckets;
    size_t nbuckets, nitems;
    struct wq_item **fifo; /* ring of ready items */
    size_t fifo_head, fifo_len, fifo_cap;
    struct wq_item **heap; /* min-heap on ready_at */
    size_t heap_len, heap_cap;
    /* Token bucket in nanoseconds of credit: one token = 1e9 / qps ns. Integer arithmetic
     * keeps the delays exact (100 ms, not 99.999 ms). */
    int64_t token_ns, credit_ns, credit_max_ns, bucket_last;
    int bucket_started;
    uint64_t adds, retries;
};

static int64_t mono_ns(void *ctx)
{
    (void)ctx;
    return clock_now_ns();
}

static uint64_t hash_key(const char *s)
{
    uint64_t h = 1469598103934665603ULL; /* FNV-1a */
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ULL;
    return h;
}

kube_workqueue *kube_workqueue_new(kube_clock_fn clock, void *clock_ctx)
{
    kube_workqueue *q = calloc(1, sizeof *q);
    if (!q) return NULL;
    q->clock = clock ? clock : mono_ns;
    q->clock_ctx = clock_ctx;
    q->nbuckets = 64;
    q->buckets = calloc(q->nbuckets, sizeof *q->buckets);
    if (!q->buckets) {
        free(q);
        return NULL;
    }
    q->token_ns = 1000000000LL / KUBE_WQ_QPS;
    q->credit_max_ns = q->token_ns * KUBE_WQ_BURST;
    return q;
}

void kube_workqueue_free(kube_workqueue *q)
{
    if (!q) return;
    for (size_t b = 0; b < q->nbuckets; b++)
        for (struct wq_item *it = q->buckets[b], *next; it; it = next) {
            next = it->hnext;
            free(it->key);
            free(it);
        }
    free(q->buckets);
    free(q->fifo);
    free(q->heap);
    free(q);
}

/* ---- the key table --------------------------------------------------------------------- */

static struct wq_item *lookup(kube_workqueue *q, const char *key)
{
    for (struct wq_item *it = q->buckets[hash_key(key) & (q->nbuckets - 1)]; it; it = it->hnext)
        if (!strcmp(it->key, key)) return it;
    return NULL;
}

static struct wq_item *lookup_or_create(kube_workqueue *q, const char *key)
{
    struct wq_item *it = lookup(q, key);
    if (it) return it;
    if (q->nitems >= q->nbuckets) {
        /* Grow at load factor 1 so chains stay short. */
        size_t nb = q->nbuckets * 2;
        struct wq_item **b = calloc(nb, sizeof *b);
        if (!b) return NULL;
        for (size_t i = 0; i < q->nbuckets; i++)
            for (struct wq_item *x = q->buckets[i], *next; x; x = next) {
                next = x->hnext;
                size_t h = hash_key(x->key) & (nb - 1);
                x->hnext = b[h];
                b[h] = x;
            }
        free(q->buckets);
        q->buckets = b;
        q->nbuckets = nb;
    }
    it = calloc(1, sizeof *it);
    if (!it || !(it->key = strdup(key))) {
        free(it);
        return NULL;
    }
    size_t h = hash_key(key) & (q->nbuckets - 1);
    it->hnext = q->buckets[h];
    q->buckets[h] = it;
    q->nitems++;
    return it;
}

static void maybe_release(kube_workqueue *q, struct wq_item *it)
{
    if (it->dirty || it->queued || it->processing || it->waiting || it->failures) return;
    for (struct wq_item **p = &q->buckets[hash_key(it->key) & (q->nbuckets - 1)]; *p;
         p = &(*p)->hnext)
        if (*p == it) {
            *p = it->hnext;
            break;
        }
    q->nitems--;
    free(it->key);
    free(it);
}

/* ---- ready FIFO and delay heap --------------------------------------------------------- */

static int fifo_push(kube_workqueue *q, struct wq_item *it)
{
    if (q->fifo_len == q->fifo_cap) {
        size_t cap = q->fifo_cap ? q->fifo_cap * 2 : 64;
        struct wq_item **f = malloc(cap * sizeof *f);
        if (!f) return CIRRUS_ENOMEM;
        for (size_t i = 0; i < q->fifo_len; i++) f[i] = q->fifo[(q->fifo_head + i) % q->fifo_cap];
        free(q->fifo);
        q->fifo = f;
        q->fifo_cap = cap;
        q->fifo_head = 0;
    }
    q->fifo[(q->fifo_head + q->fifo_len) % q->fifo_cap] = it;
    q->fifo_len++;
    it->queued = 1;
    return 0;
}

static void heap_swap(kube_workqueue *q, size_t a, size_t b)
{
    struct wq_item *t = q->heap[a];
    q->heap[a] = q->heap[b];
    q->heap[b] = t;
    q->heap[a]->heap_idx = a;
    q->heap[b]->heap_idx = b;
}

static void heap_up(kube_workqueue *q, size_t i)
{
    while (i > 0 && q->heap[(i - 1) / 2]->ready_at > q->heap[i]->ready_at) {
        heap_swap(q, i, (i - 1) / 2);
        i = (i - 1) / 2;
    }
}

static void heap_down(kube_workqueue *q, size_t i)
{
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < q->heap_len && q->heap[l]->ready_at < q->heap[m]->ready_at) m = l;
        if (r < q->heap_len && q->heap[r]->ready_at < q->heap[m]->ready_at) m = r;
        if (m == i) return;
        heap_swap(q, i, m);
        i = m;
    }
}

static struct wq_item *heap_pop(kube_workqueue *q)
{
    struct wq_item *top = q->heap[0];
    q->heap_len--;
    if (q->heap_len) {
        q->heap[0] = q->heap[q->heap_len];
        q->heap[0]->heap_idx = 0;
        heap_down(q, 0);
    }
    top->waiting = 0;
    return top;
}

/* ---- queue operations ------------------------------------------------------------------ */

static int add_item(kube_workqueue *q, struct wq_item *it)
{
    if (it->dirty) return 0; /* already due to be processed: dedup */
    it->dirty = 1;
    q->adds++;
    if (it->processing) return 0; /* done() queues it */
    if (fifo_push(q, it)) {
        it->dirty = 0;
        return CIRRUS_ENOMEM;
    }
    return 0;
}

int kube_workqueue_add(kube_workqueue *q, const char *key)
{
    struct wq_item *it = lookup_or_create(q, key);
    if (!it) return CIRRUS_ENOMEM;
    int rc = add_item(q, it);
    maybe_release(q, it);
    return rc;
}

int kube_workqueue_add_after(kube_workqueue *q, const char *key, int64_t delay_ns)
{
    if (delay_ns <= 0) return kube_workqueue_add(q, key);
    struct wq_item *it = lookup_or_create(q, key);
    if (!it) return CIRRUS_ENOMEM;
    int64_t at = q->clock(q->clock_ctx) + delay_ns;
    if (it->waiting) {
        if (at < it->ready_at) { /* keep the earlier time, as client-go's delaying queue */
            it->ready_at = at;
            heap_up(q, it->heap_idx);
        }
        return 0;
    }
    if (q->heap_len == q->heap_cap) {
        size_t cap = q->heap_cap ? q->heap_cap * 2 : 64;
        struct wq_item **h = realloc(q->heap, cap * sizeof *h);
        if (!h) {
            maybe_release(q, it);
            return CIRRUS_ENOMEM;
        }
        q->heap = h;
        q->heap_cap = cap;
    }
    it->ready_at = at;
    it->waiting = 1;
    it->heap_idx = q->heap_len;
    q->heap[q->heap_len++] = it;
    heap_up(q, it->heap_idx);
    return 0;
}

/* ItemExponentialFailureRateLimiter: 5 ms * 2^failures, capped at 1000 s. */
static int64_t item_delay(struct wq_item *it)
{
    int exp = it->failures++;
    double d = (double)KUBE_WQ_BASE_DELAY_NS;
    for (int i = 0; i < exp && d <= (double)KUBE_WQ_MAX_DELAY_NS; i++) d *= 2;
    return d > (double)KUBE_WQ_MAX_DELAY_NS ? KUBE_WQ_MAX_DELAY_NS : (int64_t)d;
}

/* BucketRateLimiter (golang.org/x/time/rate): reserve one token, return the wait. The
 * bucket starts full. */
static int64_t bucket_delay(kube_workqueue *q, int64_t now)
{
    if (!q->bucket_started) {
        q->credit_ns = q->credit_max_ns;
        q->bucket_last = now;
        q->bucket_started = 1;
    } else if (now > q->bucket_last) {
        int64_t c = q->credit_ns + (now - q->bucket_last);
        q->credit_ns = c > q->credit_max_ns ? q->credit_max_ns : c;
        q->bucket_last = now;
    }
    /* Credit may go negative: later reservations queue up behind this one. */
    q->credit_ns -= q->token_ns;
    return q->credit_ns < 0 ? -q->credit_ns : 0;
}

int kube_workqueue_add_rate_limited(kube_workqueue *q, const char *key, int64_t *delay_ns)
{
    struct wq_item *it = lookup_or_create(q, key);
    if (!it) return CIRRUS_ENOMEM;
    int64_t a = item_delay(it);
    int64_t b = bucket_delay(q, q->clock(q->clock_ctx));
    int64_t d = a > b ? a : b; /* MaxOfRateLimiter */
    q->retries++;
    if (delay_ns) *delay_ns = d;
    return kube_workqueue_add_after(q, key, d);
}

void kube_workqueue_forget(kube_workqueue *q, const char *key)
{
    struct wq_item *it = lookup(q, key);
    if (!it) return;
    it->failures = 0;
    maybe_release(q, it);
}

int kube_workqueue_num_requeues(kube_workqueue *q, const char *key)
{
    struct wq_item *it = lookup(q, key);
    return it ? it->failures : 0;
}

/* Move delayed keys whose time has come into the ready FIFO. */
static void promote(kube_workqueue *q)
{
    int64_t now = q->clock(q->clock_ctx);
    while (q->heap_len && q->heap[0]->ready_at <= now) {
        struct wq_item *it = heap_pop(q);
        if (add_item(q, it)) { /* out of memory: retry on the next call */
            it->waiting = 1;
            it->heap_idx = q->heap_len;
            q->heap[q->heap_len++] = it;
            heap_up(q, it->heap_idx);
            return;
        }
        maybe_release(q, it);
    }
}

int kube_workqueue_get(kube_workqueue *q, const char **key)
{
    promote(q);
    if (!q->fifo_len) return 0;
    struct wq_item *it = q->fifo[q->fifo_head];
    q->fifo_head = (q->fifo_head + 1) % q->fifo_cap;
    q->fifo_len--;
    it->queued = 0;
    it->dirty = 0;
    it->processing = 1;
    *key = it->key;
    return 1;
}

void kube_workqueue_done(kube_workqueue *q, const char *key)
{
    struct wq_item *it = lookup(q, key);
    if (!it || !it->processing) return;
    it->processing = 0;
    if (it->dirty && fifo_push(q, it)) {
        /* Out of memory: park it in the delay heap instead of dropping the change. */
        it->dirty = 0;
        kube_workqueue_add_after(q, it->key, KUBE_WQ_BASE_DELAY_NS);
        return;
    }
    maybe_release(q, it);
}

int64_t kube_workqueue_next_ready_ns(kube_workqueue *q)
{
    if (q->fifo_len) return 0;
    if (!q->heap_len) return -1;
    int64_t d = q->heap[0]->ready_at - q->clock(q->clock_ctx);
    return d > 0 ? d : 0;
}

void kube_workqueue_get_stats(kube_workqueue *q, kube_workqueue_stats *st)
{
    st->depth = q->fifo_len;
    st->waiting = q->heap_len;
    st->adds = q->adds;
    st->retries = q->retries;
}
