#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdint.h>
#include <string.h>

static char log_role[64] = "cirrus";

void log_set_role(const char *role)
{
    snprintf(log_role, sizeof log_role, "%s", role);
}

static void log_emit(const char *level, const char *fmt, va_list ap)
{
    char line[1024];
    vsnprintf(line, sizeof line, fmt, ap);
    /* One fprintf per line so concurrent processes sharing stderr do not interleave. */
    fprintf(stderr, "[%s] %s: %s\n", log_role, level, line);
}

#define LOG_FN(fn, level)                  \
    void fn(const char *fmt, ...)          \
    {                                      \
        va_list ap;                        \
        va_start(ap, fmt);                 \
        log_emit(level, fmt, ap);          \
        va_end(ap);                        \
    }
LOG_FN(log_info, "info")
LOG_FN(log_warn, "warn")
LOG_FN(log_error, "error")

void log_warn_sampled(atomic_ullong *count, const char *fmt, ...)
{
    unsigned long long n = atomic_fetch_add(count, 1) + 1;
    if (n & (n - 1)) return; /* not a power of two */
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    log_warn("%s (%llu so far)", line, n);
}

atomic_ullong *log_kind(log_kinds *k, const char *msg)
{
    uint32_t h = 2166136261u; /* FNV-1a */
    for (const char *p = msg; *p && (*p < '0' || *p > '9'); p++) h = (h ^ (uint8_t)*p) * 16777619u;
    return &k->seen[h % LOG_KINDS];
}
