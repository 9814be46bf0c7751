/* log: one line per event on stderr, prefixed with the process role ("trainer",
 * "stage 1", "operator", ...) so interleaved logs of a whole region stay readable. */
#ifndef CIRRUS_LOG_H
#define CIRRUS_LOG_H

#include <stdatomic.h>

void log_set_role(const char *role);
void log_info(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void log_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void log_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* A warning a flood repeats (a refused connection, a failed handshake): *count counts the
 * events (atomically); the 1st, 2nd, 4th, 8th... are logged, with "(N so far)", so a
 * million refusals write 20 lines. */
void log_warn_sampled(atomic_ullong *count, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#endif
