/* cpu_flush_denormals (trainer/model/cpu/denormals.h): in a thread of its own, so that the
 * rest of the suite keeps IEEE arithmetic (the codecs are specified for it). */
#include <float.h>
#include <pthread.h>

#include "../../trainer/model/cpu/denormals.h"
#include "test.h"

static volatile float tiny_half = 0x1p-127f; /* half of FLT_MIN: a subnormal */
static volatile float one = 1.0f;            /* volatile: x * 1 is not folded to x */

static void *halve_in_thread(void *out)
{
    *(float *)out = tiny_half * 0.5f;
    return NULL;
}

static void *flush_then_check(void *arg)
{
    float *got = arg;
    volatile float x = FLT_MIN;
    got[0] = x * 0.25f; /* before: a subnormal result */
    cpu_flush_denormals();
    got[1] = x * 0.25f;       /* a subnormal result: flushed to zero */
    got[2] = tiny_half * one; /* a subnormal operand: read as zero */
    got[3] = FLT_MIN * one;   /* the smallest normal: kept */
    pthread_t t; /* a thread started afterwards (OpenMP's, OpenBLAS's) flushes too */
    if (pthread_create(&t, NULL, halve_in_thread, &got[4]) == 0) pthread_join(t, NULL);
    else got[4] = -1.0f;
    return NULL;
}

TEST(denormals_flushed_in_this_thread_and_its_children)
{
#if defined(__x86_64__) || defined(__i386__) || defined(__aarch64__)
    float got[5] = {0};
    pthread_t t;
    ASSERT_EQ(pthread_create(&t, NULL, flush_then_check, got), 0);
    pthread_join(t, NULL);
    ASSERT(got[0] == 0x1p-128f);
    ASSERT(got[1] == 0.0f);
    ASSERT(got[2] == 0.0f);
    ASSERT(got[3] == FLT_MIN);
    ASSERT(got[4] == 0.0f);
    /* This thread was not touched. */
    volatile float x = FLT_MIN;
    ASSERT(x * 0.25f == 0x1p-128f);
#endif
}
