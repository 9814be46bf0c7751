/* The work queue against client-go's numbers, with a clock the test steps by hand. */
#include <string.h>

#include "../../common/cerr.h"
#include "../../operator/kube/workqueue.h"
#include "../unit/test.h"

#define MS 1000000LL
#define S 1000000000LL

static int64_t fake_now;
static int64_t fake_clock(void *ctx)
{
    (void)ctx;
    return fake_now;
}

static kube_workqueue *new_queue(void)
{
    fake_now = 1000 * S;
    kube_workqueue *q = kube_workqueue_new(fake_clock, NULL);
    ASSERT(q);
    return q;
}

static void expect_get(kube_workqueue *q, const char *want)
{
    const char *key = NULL;
    if (!kube_workqueue_get(q, &key)) TEST_FAIL("get: nothing ready, wanted %s", want);
    if (strcmp(key, want)) TEST_FAIL("get: %s, wanted %s", key, want);
}

static void expect_empty(kube_workqueue *q)
{
    const char *key = NULL;
    if (kube_workqueue_get(q, &key)) TEST_FAIL("get: %s, wanted nothing", key);
}

TEST(kube_workqueue_dedup)
{
    kube_workqueue *q = new_queue();
    ASSERT_EQ(kube_workqueue_next_ready_ns(q), -1);
    ASSERT_OK(kube_workqueue_add(q, "ns/a"));
    ASSERT_OK(kube_workqueue_add(q, "ns/b"));
    ASSERT_OK(kube_workqueue_add(q, "ns/a")); /* already queued: no second entry */
    kube_workqueue_stats st;
    kube_workqueue_get_stats(q, &st);
    ASSERT_EQ(st.depth, 2);
    ASSERT_EQ(st.adds, 2);
    ASSERT_EQ(kube_workqueue_next_ready_ns(q), 0);
    expect_get(q, "ns/a");
    /* Re-added while processing: not handed out again until done(). */
    ASSERT_OK(kube_workqueue_add(q, "ns/a"));
    ASSERT_OK(kube_workqueue_add(q, "ns/a"));
    expect_get(q, "ns/b");
    expect_empty(q);
    kube_workqueue_done(q, "ns/a");
    expect_get(q, "ns/a");
    expect_empty(q);
    kube_workqueue_done(q, "ns/a");
    kube_workqueue_done(q, "ns/b");
    expect_empty(q);
    ASSERT_EQ(kube_workqueue_next_ready_ns(q), -1);
    kube_workqueue_free(q);
}

TEST(kube_workqueue_add_after)
{
    kube_workqueue *q = new_queue();
    ASSERT_OK(kube_workqueue_add_after(q, "b", 20 * MS));
    ASSERT_OK(kube_workqueue_add_after(q, "a", 10 * MS));
    ASSERT_OK(kube_workqueue_add_after(q, "b", 30 * MS)); /* keeps the earlier 20 ms */
    ASSERT_EQ(kube_workqueue_next_ready_ns(q), 10 * MS);
    expect_empty(q);
    fake_now += 10 * MS - 1;
    expect_empty(q);
    fake_now += 1;
    expect_get(q, "a");
    ASSERT_EQ(kube_workqueue_next_ready_ns(q), 10 * MS);
    fake_now += 10 * MS;
    expect_get(q, "b");
    /* An earlier add_after moves a waiting key forward. */
    ASSERT_OK(kube_workqueue_add_after(q, "c", 50 * MS));
    ASSERT_OK(kube_workqueue_add_after(q, "c", 5 * MS));
    ASSERT_EQ(kube_workqueue_next_ready_ns(q), 5 * MS);
    /* A waiting key that is also added directly is processed once, now. */
    ASSERT_OK(kube_workqueue_add(q, "c"));
    expect_get(q, "c");
    fake_now += 5 * MS;
    expect_empty(q); /* still processing: the delayed add only marks it dirty */
    kube_workqueue_done(q, "c");
    expect_get(q, "c");
    kube_workqueue_done(q, "c");
    kube_workqueue_done(q, "a");
    kube_workqueue_done(q, "b");
    ASSERT_EQ(kube_workqueue_next_ready_ns(q), -1);
    kube_workqueue_free(q);
}

/* ItemExponentialFailureRateLimiter(5ms, 1000s): 5 ms * 2^n, capped. The clock moves 10 s
 * between failures so the token bucket never interferes. */
TEST(kube_workqueue_item_backoff)
{
    kube_workqueue *q = new_queue();
    int64_t want = 5 * MS, d;
    for (int i = 0; i < 25; i++) {
        ASSERT_OK(kube_workqueue_add_rate_limited(q, "ns/x", &d));
        ASSERT_EQ(d, want);
        ASSERT_EQ(kube_workqueue_num_requeues(q, "ns/x"), i + 1);
        want = want * 2 > 1000 * S ? 1000 * S : want * 2;
        fake_now += 10 * S;
    }
    /* The exact ladder: 5,10,20,... ms; failure 18 (655.36 s) is the last below the cap. */
    ASSERT_EQ(5 * MS << 17, 655360 * MS);
    kube_workqueue_forget(q, "ns/x");
    ASSERT_EQ(kube_workqueue_num_requeues(q, "ns/x"), 0);
    ASSERT_OK(kube_workqueue_add_rate_limited(q, "ns/x", &d));
    ASSERT_EQ(d, 5 * MS);
    /* Keys back off independently. */
    ASSERT_OK(kube_workqueue_add_rate_limited(q, "ns/y", &d));
    ASSERT_EQ(d, 5 * MS);
    ASSERT_OK(kube_workqueue_add_rate_limited(q, "ns/x", &d));
    ASSERT_EQ(d, 10 * MS);
    kube_workqueue_stats st;
    kube_workqueue_get_stats(q, &st);
    ASSERT_EQ(st.retries, 28);
    kube_workqueue_free(q);
}

/* The rate-limited requeue becomes ready exactly when the delay says. */
TEST(kube_workqueue_rate_limited_ready)
{
    kube_workqueue *q = new_queue();
    int64_t d;
    ASSERT_OK(kube_workqueue_add(q, "k"));
    expect_get(q, "k");
    ASSERT_OK(kube_workqueue_add_rate_limited(q, "k", &d)); /* failed: retry in 5 ms */
    kube_workqueue_done(q, "k");
    ASSERT_EQ(d, 5 * MS);
    expect_empty(q);
    ASSERT_EQ(kube_workqueue_next_ready_ns(q), 5 * MS);
    fake_now += 5 * MS;
    expect_get(q, "k");
    ASSERT_OK(kube_workqueue_add_rate_limited(q, "k", &d));
    kube_workqueue_done(q, "k");
    ASSERT_EQ(d, 10 * MS);
    fake_now += 10 * MS;
    expect_get(q, "k");
    kube_workqueue_forget(q, "k"); /* success */
    kube_workqueue_done(q, "k");
    ASSERT_EQ(kube_workqueue_num_requeues(q, "k"), 0);
    ASSERT_EQ(kube_workqueue_next_ready_ns(q), -1);
    kube_workqueue_free(q);
}

/* BucketRateLimiter(10 qps, burst 100), max'ed with the per-key 5 ms: 100 retries pass at
 * once, then one every 100 ms; a second of quiet refills 10 tokens. */
TEST(kube_workqueue_token_bucket)
{
    kube_workqueue *q = new_queue();
    char key[32];
    int64_t d;
    for (int i = 0; i < 100; i++) {
        snprintf(key, sizeof key, "k%d", i);
        ASSERT_OK(kube_workqueue_add_rate_limited(q, key, &d));
        ASSERT_EQ(d, 5 * MS); /* bucket 0, item 5 ms */
    }
    for (int i = 100; i < 105; i++) {
        snprintf(key, sizeof key, "k%d", i);
        ASSERT_OK(kube_workqueue_add_rate_limited(q, key, &d));
        ASSERT_EQ(d, (int64_t)(i - 99) * 100 * MS);
    }
    /* 5 tokens in debt; 1 s later 10 are back: 5 free, then 100 ms again. */
    fake_now += 1 * S;
    for (int i = 0; i < 5; i++) {
        snprintf(key, sizeof key, "j%d", i);
        ASSERT_OK(kube_workqueue_add_rate_limited(q, key, &d));
        ASSERT_EQ(d, 5 * MS);
    }
    ASSERT_OK(kube_workqueue_add_rate_limited(q, "j5", &d));
    ASSERT_EQ(d, 100 * MS);
    /* Partial refill: 50 ms later the debt is 50 ms, so the next waits 150 ms. */
    fake_now += 50 * MS;
    ASSERT_OK(kube_workqueue_add_rate_limited(q, "j6", &d));
    ASSERT_EQ(d, 150 * MS);
    /* The bucket never holds more than the burst: a long pause gives back 100, not more. */
    fake_now += 3600 * S;
    for (int i = 0; i < 100; i++) {
        snprintf(key, sizeof key, "m%d", i);
        ASSERT_OK(kube_workqueue_add_rate_limited(q, key, &d));
        ASSERT_EQ(d, 5 * MS);
    }
    ASSERT_OK(kube_workqueue_add_rate_limited(q, "m100", &d));
    ASSERT_EQ(d, 100 * MS);
    /* A key deep in its own backoff is not shortened by the bucket: max of both. */
    fake_now += 3600 * S;
    for (int i = 0; i < 10; i++) ASSERT_OK(kube_workqueue_add_rate_limited(q, "deep", &d));
    ASSERT_EQ(d, 5 * MS << 9);
    kube_workqueue_free(q);
}

/* Many keys through the hash table and heap: every key comes out exactly once, in time
 * order. */
TEST(kube_workqueue_many_keys)
{
    kube_workqueue *q = new_queue();
    char key[32];
    for (int i = 0; i < 5000; i++) {
        snprintf(key, sizeof key, "ns/%d", i);
        ASSERT_OK(kube_workqueue_add_after(q, key, (int64_t)((i * 7919) % 5000 + 1) * MS));
    }
    for (int i = 0; i < 5000; i += 2) {
        snprintf(key, sizeof key, "ns/%d", i);
        ASSERT_OK(kube_workqueue_add(q, key));
    }
    int got = 0;
    const char *k;
    while (kube_workqueue_get(q, &k)) {
        got++;
        kube_workqueue_done(q, k);
    }
    ASSERT_EQ(got, 2500);
    int64_t last = 0;
    for (int step = 0; step < 6000; step++) {
        fake_now += 1 * MS;
        while (kube_workqueue_get(q, &k)) {
            int i = atoi(k + 3);
            int64_t at = (int64_t)((i * 7919) % 5000 + 1);
            ASSERT(at >= last);
            last = at;
            got++;
            kube_workqueue_done(q, k);
        }
    }
    /* Odd keys once from the heap; even keys were done, their delayed adds fire again. */
    ASSERT_EQ(got, 7500);
    ASSERT_EQ(kube_workqueue_next_ready_ns(q), -1);
    kube_workqueue_free(q);
}
