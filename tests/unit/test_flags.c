/* Tests of common/flags: regressions found by the fuzz harness tests/fuzz/fuzz_flags.c. */
#include <stdint.h>
#include <string.h>

#include "../../common/flags.h"
#include "test.h"

/* strtoull skips blanks and takes a sign: " -1" and "+1" must not reach it as a u64. */
TEST(flags_u64_digits_only)
{
    uint64_t seed = 5;
    flag_spec t[] = {{"seed", FLAG_U64, &seed, 0, 0, "seed", 0}};
    cirrus_error err;
    const char *bad[] = {"--seed= -1", "--seed=\t-7", "--seed=+3", "--seed= 4", "--seed=-2", "--seed="};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char *argv[1] = {(char *)bad[i]};
        ASSERT_EQ(flags_parse(t, 1, 1, argv, &err), CIRRUS_EINVAL);
        ASSERT_EQ(seed, 5u);
    }
    char *ok[1] = {"--seed=18446744073709551615"};
    ASSERT_EQ(flags_parse(t, 1, 1, ok, &err), 0);
    ASSERT(seed == UINT64_MAX);
    char *sep[2] = {"--seed", " 9"};
    ASSERT_EQ(flags_parse(t, 1, 2, sep, &err), CIRRUS_EINVAL);
}
