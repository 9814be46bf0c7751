/* progress, the reader thread against a scripted gateway on loopback reached through
 * --resolve: figures published and announced (with the time they were read, again when they
 * did not change), another job's status ignored, a hung gateway neither blocking the caller
 * nor the shutdown, outer figures kept with their answer; and a disabled reader. No cluster
 * needed (`operator-tests progress`). */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "../../operator/progress.h"
#include "../unit/test.h"
#include "kube_test_util.h"
#include "progress_fixture.h"

/* ---- the reader thread against a scripted gateway ----------------------------------------- */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int drained;
static char drained_key[PROGRESS_KEY_MAX];
static void on_key(void *ctx, const char *key)
{
    (void)ctx;
    drained++;
    snprintf(drained_key, sizeof drained_key, "%s", key);
}

/* Wait until progress_get answers with step `step` (or -1: anything), at most timeout_s. */
static int wait_step(progress *p, const char *region, int64_t step, double timeout_s,
                     progress_result *out)
{
    double end = now_s() + timeout_s;
    while (now_s() < end) {
        if (progress_get(p, UID, region, out) && (step < 0 || out->step == step)) return 1;
        struct timespec ts = {0, 20 * 1000000L};
        nanosleep(&ts, NULL);
    }
    return 0;
}

TEST_T(progress_reader_thread, 60)
{
    static const char ok1[] =
        "{\"job_id\":\"" UID "\",\"step\":10,\"loss\":4.5,\"tokens_per_s\":100}";
    static const char wrong[] =
        "{\"job_id\":\"another-job\",\"step\":99,\"loss\":0.1,\"tokens_per_s\":9}";
    static const char ok2[] =
        "{\"job_id\":\"" UID "\",\"step\":20,\"loss\":4.0,\"tokens_per_s\":120}";
    tk_fake *f = tk_fake_new();
    tk_fake_route(f, "GET /status HTTP/1.1", 200, NULL, ok1, 0);
    tk_fake_route(f, "GET /status HTTP/1.1", 200, NULL, wrong, 0);
    tk_fake_route(f, "GET /status HTTP/1.1", 200, NULL, ok2, 0);
    tk_fake_route(f, "GET /status HTTP/1.1", 200, NULL, "{\"job_id\":", 1); /* hangs */
    tk_fake_route(f, "GET /status HTTP/1.1", 200, NULL, "{", 1);               /* hangs */
    int port = tk_fake_run(f);
    char resolve[128], url[128];
    snprintf(resolve, sizeof resolve, "job-r1-gw.ns.svc:%d:127.0.0.1", port);
    snprintf(url, sizeof url, "http://job-r1-gw.ns.svc:%d/status", port);
    const char *vals[] = {resolve};
    progress *p = NULL;
    cirrus_error err;
    progress_options o = {.period_s = 1, .resolve = vals, .n_resolve = 1};
    ASSERT_OK(progress_new(&o, &p, &err));
    progress_result r;
    ASSERT(!progress_get(p, UID, "r1", &r));
    /* A region whose gateway is not there (nothing listens on port 1): only errors. */
    progress_target t[] = {{"r1", url}, {"r2", "http://127.0.0.1:1/status"}};
    ASSERT_OK(progress_watch(p, "ns/job", UID, 2, t));
    /* A new job is read at once, through --resolve. */
    double t0 = now_s();
    int64_t wall0 = (int64_t)time(NULL);
    ASSERT(wait_step(p, "r1", 10, 5, &r));
    ASSERT_LT(now_s() - t0, 0.9);
    ASSERT_NEAR(r.loss, 4.5, 0);
    ASSERT_NEAR(r.tokens_per_s, 100, 0);
    ASSERT(wall0 <= r.read_s && r.read_s <= (int64_t)time(NULL));
    ASSERT(!progress_get(p, UID, "r2", &r));
    /* Both were read in the same round: r2's failure is known with r1's answer. */
    progress_region pr;
    progress_region_get(p, UID, "r1", &pr);
    ASSERT(pr.watched && pr.answered && !pr.failing && pr.res.step == 10);
    ASSERT(wall0 <= pr.watched_s && pr.watched_s <= pr.res.read_s);
    progress_region_get(p, UID, "r2", &pr);
    ASSERT(pr.watched && !pr.answered && pr.failing && !strcmp(pr.failing, "unreachable"));
    progress_region_get(p, UID, "r3", &pr);
    ASSERT(!pr.watched && !pr.answered && !pr.failing);
    drained = 0;
    progress_drain(p, on_key, NULL);
    ASSERT_EQ(drained, 1);
    ASSERT(!strcmp(drained_key, "ns/job"));
    progress_drain(p, on_key, NULL);
    ASSERT_EQ(drained, 1); /* announced once */
    /* Next period: another job's status, ignored (the figures stay) and named as the cause;
     * then ours again. */
    double w0 = now_s();
    while (tk_fake_served(f) < 2 && now_s() - w0 < 5) {
        struct timespec ts = {0, 20 * 1000000L};
        nanosleep(&ts, NULL);
    }
    int named = 0;
    while (!named && now_s() - w0 < 5) {
        progress_region_get(p, UID, "r1", &pr);
        named = pr.failing && !strcmp(pr.failing, "another job's /status");
        if (pr.res.step == 20) break; /* the next read came first: too late to see it */
    }
    ASSERT(named);
    ASSERT_EQ(pr.res.step, 10);
    ASSERT(wait_step(p, "r1", 20, 5, &r));
    ASSERT_NEAR(r.loss, 4.0, 0);
    ASSERT(!progress_get(p, "another-job", "r1", &r));
    progress_drain(p, on_key, NULL);
    ASSERT_EQ(drained, 2);
    ASSERT_EQ(tk_fake_served(f), 3);
    /* Then the gateway hangs mid-answer: the caller's calls stay immediate while the read
     * waits for its 2 s limit, and the figures stay. */
    while (tk_fake_served(f) < 4) {
        struct timespec ts = {0, 20 * 1000000L};
        nanosleep(&ts, NULL);
    }
    double c0 = now_s();
    for (int i = 0; i < 100; i++) {
        ASSERT(progress_get(p, UID, "r1", &r));
        ASSERT_OK(progress_watch(p, "ns/job", UID, 2, t));
        progress_drain(p, on_key, NULL);
    }
    ASSERT_LT(now_s() - c0, 0.5); /* never waits for the hung read (2 s) */
    ASSERT_EQ(r.step, 20);
    /* The hung read ends at its 2 s limit, and its round with it. */
    progress_stats st;
    progress_get_stats(p, &st);
    uint64_t rounds = st.rounds;
    while (st.rounds == rounds && now_s() - c0 < 10) progress_get_stats(p, &st);
    ASSERT_LT(now_s() - c0, 8.0); /* 2 s, and slack for a loaded machine (valgrind) */
    ASSERT_LT(1.5, now_s() - c0);
    ASSERT_EQ(st.wrong_job, 1);
    ASSERT_EQ(st.ok, 2);
    ASSERT_EQ(st.invalid, 0);
    ASSERT(st.errors >= 5); /* r2 four times, the hung read */
    ASSERT(progress_get(p, UID, "r1", &r) && r.step == 20);
    /* Regions forgotten with their job; a re-registered job is a new one, read at once. */
    progress_forget(p, "ns/job");
    ASSERT(!progress_get(p, UID, "r1", &r));
    ASSERT_OK(progress_watch(p, "ns/job", UID, 1, t));
    while (tk_fake_served(f) < 5) {
        struct timespec ts = {0, 20 * 1000000L};
        nanosleep(&ts, NULL);
    }
    /* Shutdown while a read hangs: progress_free returns within a moment. */
    double s0 = now_s();
    progress_free(p);
    ASSERT_LT(now_s() - s0, 0.5);
    tk_fake_stop(f);
}

/* The same figures again are news too: their read time moves (progressTime), and the job is
 * announced; when the gateway then fails, the figures and their time stay. */
TEST_T(progress_same_figures, 30)
{
    static const char ok1[] =
        "{\"job_id\":\"" UID "\",\"step\":10,\"loss\":4.5,\"tokens_per_s\":100}";
    tk_fake *f = tk_fake_new();
    tk_fake_route(f, "GET /status HTTP/1.1", 200, NULL, ok1, 0);
    tk_fake_route(f, "GET /status HTTP/1.1", 200, NULL, ok1, 0);
    /* then HTTP 500 ("no route") for ever */
    int port = tk_fake_run(f);
    char url[128];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/status", port);
    progress *p = NULL;
    cirrus_error err;
    progress_options o = {.period_s = 1};
    ASSERT_OK(progress_new(&o, &p, &err));
    progress_target t[] = {{"r1", url}};
    ASSERT_OK(progress_watch(p, "ns/job", UID, 1, t));
    progress_result r;
    ASSERT(wait_step(p, "r1", 10, 5, &r));
    int64_t first = r.read_s;
    drained = 0;
    progress_drain(p, on_key, NULL);
    ASSERT_EQ(drained, 1);
    double w0 = now_s();
    while (tk_fake_served(f) < 2 && now_s() - w0 < 5) {
        struct timespec ts = {0, 20 * 1000000L};
        nanosleep(&ts, NULL);
    }
    progress_result r2 = r;
    while (r2.read_s == first && now_s() - w0 < 5) ASSERT(progress_get(p, UID, "r1", &r2));
    ASSERT_LT(first, r2.read_s); /* read a period (1 s) later */
    ASSERT_EQ(r2.step, 10);
    progress_drain(p, on_key, NULL);
    ASSERT_EQ(drained, 2);
    /* The third read gets HTTP 500: unreachable, and the second answer stays. That it fails
     * is news (the condition says how); the same failure again is not. */
    progress_region pr = {0};
    while (!pr.failing && now_s() - w0 < 8) progress_region_get(p, UID, "r1", &pr);
    ASSERT(pr.failing && !strcmp(pr.failing, "unreachable"));
    ASSERT(pr.answered && pr.res.step == 10 && pr.res.read_s == r2.read_s);
    progress_drain(p, on_key, NULL);
    ASSERT_EQ(drained, 3);
    progress_stats st;
    progress_get_stats(p, &st);
    while (st.errors < 2 && now_s() - w0 < 8) progress_get_stats(p, &st);
    ASSERT_EQ(st.errors, 2);
    progress_drain(p, on_key, NULL);
    ASSERT_EQ(drained, 3);
    progress_free(p);
    tk_fake_stop(f);
}

/* The reader keeps an answer's outer figures with it, and drops them (only them) when the
 * next answer's outer object is malformed. */
TEST_T(progress_reader_outer, 30)
{
    static const char ok1[] = OUTER("3", "10", "20");
    static const char bad[] = "{\"job_id\":\"" UID "\",\"step\":41,\"loss\":2.5,"
                              "\"tokens_per_s\":10,\"outer\":{\"step\":4,"
                              "\"wan_bytes_sent\":-1,\"wan_bytes_received\":20}}";
    tk_fake *f = tk_fake_new();
    tk_fake_route(f, "GET /status HTTP/1.1", 200, NULL, ok1, 0);
    tk_fake_route(f, "GET /status HTTP/1.1", 200, NULL, bad, 0);
    int port = tk_fake_run(f);
    char url[128];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/status", port);
    progress *p = NULL;
    cirrus_error err;
    progress_options o = {.period_s = 1};
    ASSERT_OK(progress_new(&o, &p, &err));
    progress_target t[] = {{"r1", url}};
    ASSERT_OK(progress_watch(p, "ns/job", UID, 1, t));
    progress_result r;
    ASSERT(wait_step(p, "r1", 40, 5, &r));
    ASSERT(r.has_outer && r.outer.step == 3 && r.outer.wan_bytes == 30);
    ASSERT(wait_step(p, "r1", 41, 5, &r));
    ASSERT(!r.has_outer && r.outer_ignored && strstr(r.outer_ignored, "wan_bytes_sent"));
    progress_stats st;
    progress_get_stats(p, &st);
    ASSERT_EQ(st.invalid, 0); /* the answer counted */
    progress_free(p);
    tk_fake_stop(f);
}

TEST(progress_disabled)
{
    progress *p = NULL;
    cirrus_error err;
    progress_options o = {.period_s = 0};
    ASSERT_OK(progress_new(&o, &p, &err));
    progress_target t[] = {{"r1", "http://127.0.0.1:1/status"}};
    ASSERT_OK(progress_watch(p, "ns/job", UID, 1, t));
    progress_result r;
    ASSERT(!progress_get(p, UID, "r1", &r));
    progress_drain(p, on_key, NULL);
    progress_free(p);
    /* NULL is "no reader" for the controller. */
    ASSERT(!progress_get(NULL, UID, "r1", &r));
    ASSERT_OK(progress_watch(NULL, "ns/job", UID, 1, t));
    progress_forget(NULL, "ns/job");
    progress_drain(NULL, on_key, NULL);
    progress_free(NULL);
}
