/* deadline: see deadline.h. */
#include "deadline.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define DEADLINE_MAX_WINDOW 4096

struct deadline_estimator {
    deadline_config cfg;
    double *ring;    /* the last `window` latencies, oldest overwritten first */
    double *scratch; /* selection works on a copy: the ring keeps arrival order */
    int n, next;     /* latencies held, slot for the next one */
    long long seen;  /* latencies ever observed */
    double base;     /* the window's deadline, before back-off */
    double backoff;  /* 1, doubled by each timeout until a success fits the window again */
    double deadline; /* cached: clamp(base * backoff) */
    double median, mad;
};

deadline_config deadline_config_default(void)
{
    deadline_config c = {.window = 64,
                         .min_samples = 8,
                         .k = 6.0,
                         .min_ratio = 1.5,
                         .floor_s = 0.05,
                         .ceiling_s = 120.0,
                         .initial_s = 75.0};
    return c;
}

static int finite_pos(double x)
{
    return x > 0 && !isinf(x);
}

static int config_ok(const deadline_config *c)
{
    return c->window >= 1 && c->window <= DEADLINE_MAX_WINDOW && c->min_samples >= 1 &&
           c->min_samples <= c->window && c->k >= 0 && !isinf(c->k) && c->min_ratio >= 1 &&
           !isinf(c->min_ratio) && finite_pos(c->floor_s) && finite_pos(c->ceiling_s) &&
           c->ceiling_s >= c->floor_s && finite_pos(c->initial_s);
}

static double clamp(double x, double lo, double hi)
{
    return x < lo ? lo : x > hi ? hi : x;
}

int deadline_estimator_new(deadline_estimator **out, const deadline_config *cfg)
{
    if (!out) return CIRRUS_EINVAL;
    *out = NULL;
    deadline_config c = cfg ? *cfg : deadline_config_default();
    if (!config_ok(&c)) return CIRRUS_EINVAL;
    deadline_estimator *d = calloc(1, sizeof *d);
    if (!d) return CIRRUS_ENOMEM;
    d->ring = malloc((size_t)c.window * sizeof *d->ring);
    d->scratch = malloc((size_t)c.window * sizeof *d->scratch);
    if (!d->ring || !d->scratch) {
        deadline_estimator_free(d);
        return CIRRUS_ENOMEM;
    }
    d->cfg = c;
    d->base = c.initial_s;
    d->backoff = 1;
    d->deadline = clamp(c.initial_s, c.floor_s, c.ceiling_s);
    *out = d;
    return CIRRUS_OK;
}

void deadline_estimator_free(deadline_estimator *d)
{
    if (!d) return;
    free(d->ring);
    free(d->scratch);
    free(d);
}

/* The k-th smallest of a[0..n) (0-based), by Hoare partitioning around a median-of-three
 * pivot: O(n) expected, no allocation. Afterwards a[0..k) <= a[k] <= a[k+1..n), which the
 * even-n median below relies on. */
static double select_kth(double *a, int n, int k)
{
    int lo = 0, hi = n - 1;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        double x = a[lo], y = a[mid], z = a[hi];
        double pivot = x < y ? (y < z ? y : (x < z ? z : x)) : (x < z ? x : (y < z ? z : y));
        int i = lo, j = hi;
        while (i <= j) {
            while (a[i] < pivot) i++;
            while (a[j] > pivot) j--;
            if (i <= j) {
                double t = a[i];
                a[i] = a[j];
                a[j] = t;
                i++, j--;
            }
        }
        if (k <= j) hi = j;
        else if (k >= i) lo = i;
        else break; /* a[j+1..i) all equal the pivot, k among them */
    }
    return a[k];
}

/* Exact median of a[0..n), n >= 1; reorders a. For even n, the mean of the two middle
 * values: the lower one is the largest of the part the selection left below a[n/2]. */
static double median_of(double *a, int n)
{
    int k = n / 2;
    double hi = select_kth(a, n, k);
    if (n % 2) return hi;
    double lo = a[0];
    for (int i = 1; i < k; i++)
        if (a[i] > lo) lo = a[i];
    return lo + (hi - lo) / 2;
}

static void update(deadline_estimator *d)
{
    const deadline_config *c = &d->cfg;
    memcpy(d->scratch, d->ring, (size_t)d->n * sizeof *d->scratch);
    d->median = median_of(d->scratch, d->n);
    for (int i = 0; i < d->n; i++) d->scratch[i] = fabs(d->ring[i] - d->median);
    d->mad = median_of(d->scratch, d->n);
    if (d->seen < c->min_samples) {
        d->base = c->initial_s;
    } else {
        double spread = d->median + c->k * DEADLINE_MAD_SCALE * d->mad;
        double ratio = c->min_ratio * d->median;
        d->base = spread > ratio ? spread : ratio;
    }
}

static void set_deadline(deadline_estimator *d)
{
    d->deadline = clamp(d->base * d->backoff, d->cfg.floor_s, d->cfg.ceiling_s);
}

static void record(deadline_estimator *d, double seconds)
{
    d->ring[d->next] = seconds;
    d->next = (d->next + 1) % d->cfg.window;
    if (d->n < d->cfg.window) d->n++;
    d->seen++;
    update(d);
}

int deadline_observe(deadline_estimator *d, double seconds)
{
    if (!d || !(seconds >= 0) || isinf(seconds)) return CIRRUS_EINVAL;
    record(d, seconds);
    /* Back-off ends once the window alone would have waited long enough; a success that
     * only arrived thanks to back-off (latencies shifted up) keeps it until the window has
     * caught up, so the deadline does not fall back and time out again at once. */
    if (seconds <= d->base) d->backoff = 1;
    set_deadline(d);
    return CIRRUS_OK;
}

int deadline_observe_timeout(deadline_estimator *d, double seconds)
{
    if (!d || !(seconds >= 0) || isinf(seconds)) return CIRRUS_EINVAL;
    record(d, seconds > d->deadline ? seconds : d->deadline);
    /* Doubling on timeout, as TCP's retransmission timer does (RFC 6298, 5.5): the window
     * needs half its length of censored samples to move the median, far too slow when all
     * latencies shifted at once. */
    if (d->base * d->backoff < d->cfg.ceiling_s) d->backoff *= 2;
    set_deadline(d);
    return CIRRUS_OK;
}

double deadline_get(const deadline_estimator *d)
{
    return d->deadline;
}

int deadline_stats(const deadline_estimator *d, double *median, double *mad)
{
    if (median) *median = d->n ? d->median : 0;
    if (mad) *mad = d->n ? d->mad : 0;
    return d->n;
}
