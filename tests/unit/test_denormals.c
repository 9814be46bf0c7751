/* cpu_flush_denormals (trainer/model/cpu/denormals.h): in a thread of its own, so that the
 * rest of the suite keeps IEEE arithmetic (the codecs are specified for it). */
#include <float.h>
#include <pthread.h>

#include "../../trainer/model/cpu/denormals.h"
#include "test.h"

static volatile float tiny_half = 0x1p-127f; /* half of FLT_MIN: a subnormal */
static volatile float big = 0x1p100f;        /* volatile: no product is folded */

/* What a thread sees: [0] a product with a subnormal result (FTZ: 0), [1] a subnormal
 * operand with a normal result (DAZ: 0, IEEE 2^-27). */
static void probe(float *out)
{
    volatile float x = FLT_MIN;
    out[0] = x * 0.25f;
    out[1] = tiny_half * big;
}

static void *probe_in_thread(void *out)
{
    probe(out);
    return NULL;
}

static void *flush_then_check(void *arg)
{
    float *got = arg;
    probe(got); /* before: IEEE */
    cpu_flush_denormals();
    probe(got + 2);
    got[4] = FLT_MIN * (big / big); /* the smallest normal: kept */
    pthread_t t; /* a thread started afterwards flushes too */
    if (pthread_create(&t, NULL, probe_in_thread, got + 5) == 0) pthread_join(t, NULL);
    else got[5] = got[6] = -1.0f;
    /* So does an OpenMP team this thread starts (the model's kernels run in one). */
    float team[2] = {-1.0f, -1.0f};
#pragma omp parallel num_threads(2)
    {
        float mine[2];
        probe(mine);
#pragma omp critical
        {
            if (mine[0] != 0.0f || mine[1] != 0.0f) team[0] = team[1] = 1.0f;
            else if (team[0] < 0.0f) team[0] = team[1] = 0.0f;
        }
    }
    got[7] = team[0];
    return NULL;
}

TEST(denormals_flushed_in_this_thread_and_its_children)
{
#if defined(__x86_64__) || (defined(__i386__) && defined(__SSE_MATH__)) || defined(__aarch64__)
    float got[8] = {0};
    pthread_t t;
    ASSERT_EQ(pthread_create(&t, NULL, flush_then_check, got), 0);
    pthread_join(t, NULL);
    ASSERT(got[0] == 0x1p-128f && got[1] == 0x1p-27f); /* IEEE before */
    ASSERT(got[2] == 0.0f);                            /* FTZ */
    ASSERT(got[3] == 0.0f);                            /* DAZ */
    ASSERT(got[4] == FLT_MIN);
    ASSERT(got[5] == 0.0f && got[6] == 0.0f); /* a thread it started */
    ASSERT(got[7] == 0.0f);                   /* its OpenMP team */
    /* This thread was not touched. */
    float here[2];
    probe(here);
    ASSERT(here[0] == 0x1p-128f && here[1] == 0x1p-27f);
#endif
}
