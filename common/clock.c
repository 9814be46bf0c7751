/* clock: see clock.h. */
#include "clock.h"

#include <time.h>

static struct timespec now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts;
}

double clock_now_s(void)
{
    const struct timespec ts = now();
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int64_t clock_now_ms(void)
{
    const struct timespec ts = now();
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int64_t clock_now_ns(void)
{
    const struct timespec ts = now();
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}
