/* failpoint: CIRRUS_FAILPOINTS read once, failpoint_set from inside. Each test runs in a
 * process of its own (runner.c forks), so each reads the environment afresh. */
#include <stdlib.h>

#include "../../common/failpoint.h"
#include "test.h"

TEST(failpoint_from_the_environment)
{
    setenv("CIRRUS_FAILPOINTS", "exit-after-redo,corrupt-after=7,bad=x1,stall-average-at=60", 1);
    uint64_t v = 99;
    ASSERT(failpoint_on("exit-after-redo", &v));
    ASSERT_EQ(v, 0u);
    ASSERT(failpoint_on("corrupt-after", &v));
    ASSERT_EQ(v, 7u);
    ASSERT(failpoint_on("stall-average-at", NULL));
    ASSERT(!failpoint_on("bad", NULL));         /* malformed: said and skipped */
    ASSERT(!failpoint_on("corrupt", NULL));     /* names match whole */
    /* Read once: a later change of the environment is not seen. */
    setenv("CIRRUS_FAILPOINTS", "other", 1);
    ASSERT(!failpoint_on("other", NULL));
    unsetenv("CIRRUS_FAILPOINTS");
}

TEST(failpoint_set_inside)
{
    unsetenv("CIRRUS_FAILPOINTS");
    ASSERT(!failpoint_on("corrupt-after", NULL));
    failpoint_set("corrupt-after", 2);
    uint64_t v = 0;
    ASSERT(failpoint_on("corrupt-after", &v));
    ASSERT_EQ(v, 2u);
    failpoint_set("corrupt-after", 3);
    ASSERT(failpoint_on("corrupt-after", &v));
    ASSERT_EQ(v, 3u);
}
