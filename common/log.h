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

/* Counters by kind for log_warn_sampled, so that a flood of one kind does not hide the first
 * of another: a kind is a message up to its first digit ("bad frame magic ", "frame of ",
 * "wrong job id 'x'"), hashed into one of LOG_KINDS counters. */
#define LOG_KINDS 64
typedef struct log_kinds {
    atomic_ullong seen[LOG_KINDS];
} log_kinds;
atomic_ullong *log_kind(log_kinds *k, const char *msg);

#endif
