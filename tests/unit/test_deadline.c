/* Tests of trainer/swarm/deadline: exact median and MAD (against a sorted reference), the
 * formula on known data, clamps, the initial deadline, the ring window, robustness to an
 * outlier, and timeouts that must make a too-short deadline grow. */
#include <stdlib.h>
#include <string.h>

#include "../../common/cerr.h"
#include "../../common/rng.h"
#include "../../trainer/swarm/policy/deadline.h"
#include "test.h"

static deadline_estimator *make(int window, int min_samples)
{
    deadline_config c = deadline_config_default();
    c.window = window;
    c.min_samples = min_samples;
    deadline_estimator *d;
    ASSERT_OK(deadline_estimator_new(&d, &c));
    return d;
}

static void feed(deadline_estimator *d, const double *x, int n)
{
    for (int i = 0; i < n; i++) ASSERT_OK(deadline_observe(d, x[i]));
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double sorted_median(double *a, int n)
{
    qsort(a, (size_t)n, sizeof *a, cmp_double);
    return n % 2 ? a[n / 2] : a[n / 2 - 1] + (a[n / 2] - a[n / 2 - 1]) / 2;
}

TEST(deadline_median_mad_known_data)
{
    double med, mad;
    deadline_estimator *d = make(64, 1);
    const double odd[5] = {4, 1, 100, 3, 2}; /* median 3, |x - 3| = 1 2 97 0 1 -> MAD 1 */
    feed(d, odd, 5);
    ASSERT_EQ(deadline_stats(d, &med, &mad), 5);
    ASSERT(med == 3.0 && mad == 1.0);
    deadline_estimator_free(d);

    d = make(64, 1);
    const double even[4] = {4, 2, 1, 3}; /* median 2.5, deviations 1.5 .5 .5 1.5 -> 1 */
    feed(d, even, 4);
    ASSERT_EQ(deadline_stats(d, &med, &mad), 4);
    ASSERT(med == 2.5 && mad == 1.0);
    deadline_estimator_free(d);

    /* The deadline itself: median 1, MAD 0.1875 (all values exact in binary). */
    d = make(64, 8);
    const double x[8] = {1, 1.25, 0.75, 1.5, 0.5, 1, 1.125, 0.875};
    feed(d, x, 8);
    ASSERT_EQ(deadline_stats(d, &med, &mad), 8);
    ASSERT(med == 1.0 && mad == 0.1875);
    ASSERT_NEAR(deadline_get(d), 1.0 + 6 * 1.4826 * 0.1875, 1e-12);
    deadline_estimator_free(d);
}

/* Selection against sorting, on random windows with many duplicates, through the ring's
 * wrap-around (only the last `window` latencies count). */
TEST(deadline_matches_sorted_reference)
{
    rng_state r;
    rng_seed(&r, 5);
    double hist[300], a[64];
    for (int trial = 0; trial < 200; trial++) {
        int window = 1 + (int)rng_below(&r, 64);
        int n = 1 + (int)rng_below(&r, 300);
        deadline_estimator *d = make(window, 1);
        for (int i = 0; i < n; i++) {
            hist[i] = trial % 2 ? (double)rng_below(&r, 6) : rng_uniform(&r) * 10;
            ASSERT_OK(deadline_observe(d, hist[i]));
        }
        int m = n < window ? n : window;
        memcpy(a, hist + n - m, (size_t)m * sizeof *a);
        double want_med = sorted_median(a, m);
        for (int i = 0; i < m; i++) a[i] = fabs(hist[n - m + i] - want_med);
        double want_mad = sorted_median(a, m);
        double med, mad;
        ASSERT_EQ(deadline_stats(d, &med, &mad), m);
        ASSERT(med == want_med);
        ASSERT(mad == want_mad);
        deadline_estimator_free(d);
    }
}

TEST(deadline_initial_until_min_samples)
{
    deadline_estimator *d = make(64, 8);
    ASSERT(deadline_get(d) == 75.0);
    for (int i = 0; i < 7; i++) {
        ASSERT_OK(deadline_observe(d, 0.2 + 0.01 * i));
        ASSERT(deadline_get(d) == 75.0);
    }
    ASSERT_OK(deadline_observe(d, 0.2));
    ASSERT_LT(deadline_get(d), 1.0);
    deadline_estimator_free(d);
    /* An initial deadline above the ceiling is clamped to it. */
    deadline_config c = deadline_config_default();
    c.ceiling_s = 10;
    ASSERT_OK(deadline_estimator_new(&d, &c));
    ASSERT(deadline_get(d) == 10.0);
    deadline_estimator_free(d);
}

TEST(deadline_clamps_and_min_ratio)
{
    deadline_estimator *d = make(64, 8);
    for (int i = 0; i < 20; i++) ASSERT_OK(deadline_observe(d, 0.001 + 0.0001 * (i % 3)));
    ASSERT(deadline_get(d) == 0.05); /* floor */
    deadline_estimator_free(d);
    d = make(64, 8);
    for (int i = 0; i < 20; i++) ASSERT_OK(deadline_observe(d, 100 + 20 * (i % 5)));
    ASSERT(deadline_get(d) == 120.0); /* ceiling */
    deadline_estimator_free(d);
    /* Constant latencies: MAD 0, the deadline keeps 50% above the median. */
    d = make(64, 8);
    for (int i = 0; i < 20; i++) ASSERT_OK(deadline_observe(d, 2.0));
    ASSERT(deadline_get(d) == 3.0);
    deadline_estimator_free(d);
}

TEST(deadline_robust_to_an_outlier)
{
    rng_state r;
    rng_seed(&r, 3);
    deadline_estimator *d = make(64, 8);
    double x[64], sum = 0, sum2 = 0;
    for (int i = 0; i < 63; i++) {
        x[i] = 1.0 + 0.1 * rng_normal(&r); /* MAD term above min_ratio */
        ASSERT_OK(deadline_observe(d, x[i]));
    }
    double before = deadline_get(d);
    x[63] = 1000; /* one request stuck behind a GC pause or a reconnect */
    ASSERT_OK(deadline_observe(d, x[63]));
    double after = deadline_get(d);
    for (int i = 0; i < 64; i++) sum += x[i], sum2 += x[i] * x[i];
    double mean = sum / 64, sd = sqrt(sum2 / 64 - mean * mean);
    fprintf(stderr, "  deadline %.4f -> %.4f s with a 1000 s outlier (mean + 6 sd: %.1f s)\n",
            before, after, mean + 6 * sd);
    ASSERT_LT(fabs(after - before) / before, 0.05);
    ASSERT_LT(after, 2.0);
    ASSERT_LT(100.0, mean + 6 * sd); /* what a mean/stddev rule would have done */
    deadline_estimator_free(d);
}

/* Latencies jump from ~1 s to 10 s (all peers at once): timeouts must raise the deadline
 * within a few requests, and it must then stay up rather than fall back and time out again. */
TEST(deadline_timeouts_grow_it)
{
    rng_state r;
    rng_seed(&r, 8);
    deadline_estimator *d = make(64, 8);
    for (int i = 0; i < 64; i++) ASSERT_OK(deadline_observe(d, 1.0 + 0.02 * rng_normal(&r)));
    ASSERT_LT(deadline_get(d), 1.6);
    int timeouts = 0, late = 0;
    for (int i = 0; i < 200; i++) {
        double lat = 10.0 + 0.2 * rng_normal(&r), dl = deadline_get(d);
        if (lat > dl) {
            ASSERT_OK(deadline_observe_timeout(d, dl));
            timeouts++;
            if (i >= 10) late++;
        } else {
            ASSERT_OK(deadline_observe(d, lat));
        }
    }
    fprintf(stderr, "  shift 1 s -> 10 s: %d timeouts (%d after the first 10 requests), "
            "deadline now %.2f s\n", timeouts, late, deadline_get(d));
    ASSERT(timeouts <= 5);
    ASSERT_EQ(late, 0);
    double med;
    deadline_stats(d, &med, NULL);
    ASSERT_NEAR(med, 10.0, 0.5);
    ASSERT_LT(deadline_get(d), 20.0); /* the window caught up: back-off over */
    ASSERT(deadline_get(d) > 10.5);
    /* And back down: fast latencies end the back-off at once. */
    for (int i = 0; i < 64; i++) ASSERT_OK(deadline_observe(d, 1.0));
    ASSERT(deadline_get(d) == 1.5);
    deadline_estimator_free(d);
}

TEST(deadline_rejects_bad_input)
{
    deadline_estimator *d = make(64, 8);
    ASSERT_EQ(deadline_observe(d, -1), CIRRUS_EINVAL);
    ASSERT_EQ(deadline_observe(d, NAN), CIRRUS_EINVAL);
    ASSERT_EQ(deadline_observe(d, INFINITY), CIRRUS_EINVAL);
    ASSERT_EQ(deadline_observe_timeout(d, NAN), CIRRUS_EINVAL);
    ASSERT_EQ(deadline_stats(d, NULL, NULL), 0);
    deadline_estimator_free(d);
    deadline_config c = deadline_config_default();
    deadline_estimator *e = (deadline_estimator *)&c;
    c.window = 0;
    ASSERT_EQ(deadline_estimator_new(&e, &c), CIRRUS_EINVAL);
    ASSERT(e == NULL);
    c = deadline_config_default();
    c.min_samples = 65;
    ASSERT_EQ(deadline_estimator_new(&e, &c), CIRRUS_EINVAL);
    c = deadline_config_default();
    c.floor_s = 200; /* above the ceiling */
    ASSERT_EQ(deadline_estimator_new(&e, &c), CIRRUS_EINVAL);
    c = deadline_config_default();
    c.min_ratio = 0.5;
    ASSERT_EQ(deadline_estimator_new(&e, &c), CIRRUS_EINVAL);
    deadline_estimator_free(NULL);
}
