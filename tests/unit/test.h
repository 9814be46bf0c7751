/* test: the Cirrus unit-test harness.
 *
 * One runner binary; every TEST() registers itself, runs in a forked child with a time
 * limit, and fails on the first broken ASSERT (message with file:line and both values).
 * The runner prints "N passed, N failed" and exits non-zero if anything failed, crashed or
 * timed out. `runner NAME...` runs only tests whose names contain one of the arguments.
 */
#ifndef CIRRUS_TEST_H
#define CIRRUS_TEST_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

typedef void (*test_fn)(void);
void test_register(const char *name, test_fn fn, int timeout_s);

#define TEST_T(name, timeout_s)                                                  \
    static void test_##name(void);                                               \
    __attribute__((constructor)) static void test_reg_##name(void)               \
    {                                                                            \
        test_register(#name, test_##name, timeout_s);                            \
    }                                                                            \
    static void test_##name(void)
#define TEST(name) TEST_T(name, 120)

#define TEST_FAIL(...)                                                           \
    do {                                                                         \
        fprintf(stderr, "  %s:%d: ", __FILE__, __LINE__);                       \
        fprintf(stderr, __VA_ARGS__);                                            \
        fprintf(stderr, "\n");                                                   \
        exit(1);                                                                 \
    } while (0)

#define ASSERT(cond)                                                             \
    do {                                                                         \
        if (!(cond)) TEST_FAIL("assertion failed: %s", #cond);                   \
    } while (0)
#define ASSERT_EQ(a, b)                                                          \
    do {                                                                         \
        long long a_ = (long long)(a), b_ = (long long)(b);                      \
        if (a_ != b_) TEST_FAIL("%s == %s: %lld != %lld", #a, #b, a_, b_);       \
    } while (0)
#define ASSERT_NEAR(a, b, tol)                                                   \
    do {                                                                         \
        double a_ = (double)(a), b_ = (double)(b);                               \
        if (!(fabs(a_ - b_) <= (tol)))                                           \
            TEST_FAIL("|%s - %s| <= %g: %.9g vs %.9g", #a, #b, (double)(tol), a_, b_); \
    } while (0)
#define ASSERT_LT(a, b)                                                          \
    do {                                                                         \
        double a_ = (double)(a), b_ = (double)(b);                               \
        if (!(a_ < b_)) TEST_FAIL("%s < %s: %.9g vs %.9g", #a, #b, a_, b_);      \
    } while (0)
#define ASSERT_OK(expr)                                                          \
    do {                                                                         \
        int rc_ = (expr);                                                        \
        if (rc_ != 0) TEST_FAIL("%s returned %d", #expr, rc_);                   \
    } while (0)

/* Skip the running test (counted as skipped, not passed), e.g. a long test in the
 * sanitizer run. */
#define TEST_SKIP(why)                                                           \
    do {                                                                         \
        fprintf(stderr, "  skipped: %s\n", why);                                 \
        exit(77);                                                                \
    } while (0)

/* A scratch directory unique to the running test (removed by the runner afterwards). */
const char *test_tmpdir(void);

#endif
