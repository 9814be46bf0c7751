/* fuzz.h: what every libFuzzer harness in tests/fuzz shares.
 *
 * FUZZ_CHECK(cond, fmt, ...) states an invariant of the code under test beyond "it did not
 * crash": when it does not hold, the harness prints the message and aborts, which libFuzzer
 * reports as a crash and saves the input. fuzz_scratch_dir() is a private directory (made
 * once, removed at exit) for the decoders that read files.
 */
#ifndef CIRRUS_FUZZ_H
#define CIRRUS_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FUZZ_CHECK(cond, ...)                                                             \
    do {                                                                                  \
        if (!(cond)) {                                                                    \
            fprintf(stderr, "fuzz invariant broken at %s:%d: %s: ", __FILE__, __LINE__,   \
                    #cond);                                                               \
            fprintf(stderr, __VA_ARGS__);                                                 \
            fputc('\n', stderr);                                                          \
            abort();                                                                      \
        }                                                                                 \
    } while (0)

/* The directory; aborts if it cannot be made. */
const char *fuzz_scratch_dir(void);
/* Write len bytes to dir/name (replacing it); aborts on failure. */
void fuzz_write_file(const char *dir, const char *name, const void *data, size_t len);
/* Read dir/name whole into a malloc'd buffer (NUL-terminated); NULL if it cannot. */
unsigned char *fuzz_read_file(const char *dir, const char *name, size_t *len);

#endif
