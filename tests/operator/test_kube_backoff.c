/* The reflector backoff: 800 ms doubling to 30 s, jitter in [d, 2d), reset after 2 min
 * without a failure (client-go's NewExponentialBackoffManager(800ms, 30s, 2min, 2, 1)). */
#include "../../operator/kube/backoff.h"
#include "../unit/test.h"

TEST(kube_backoff_numbers)
{
    kube_backoff b;
    kube_backoff_init(&b, 42);
    const int64_t base[] = {800, 1600, 3200, 6400, 12800, 25600, 30000, 30000, 30000};
    int64_t now = 1000000, last = 0;
    for (int i = 0; i < 9; i++) {
        int64_t d = kube_backoff_next(&b, now);
        if (d < base[i] || d >= 2 * base[i])
            TEST_FAIL("step %d: %lld not in [%lld, %lld)", i, (long long)d, (long long)base[i],
                      (long long)(2 * base[i]));
        last = now;
        now += d; /* failing again right after each wait */
    }
    /* Exactly 2 min after the last step is not yet a reset; just over is. */
    now = last + 120000;
    ASSERT(kube_backoff_next(&b, now) >= 30000);
    now += 120001;
    int64_t d = kube_backoff_next(&b, now);
    ASSERT(d >= 800 && d < 1600);

    /* The jitter spreads clients: over many draws it covers the range. */
    int64_t lo = 1 << 30, hi = 0;
    for (int i = 0; i < 1000; i++) {
        kube_backoff_init(&b, (uint64_t)i + 1);
        d = kube_backoff_next(&b, 0);
        lo = d < lo ? d : lo;
        hi = d > hi ? d : hi;
    }
    ASSERT(lo < 850 && hi > 1550 && hi < 1600);
}
