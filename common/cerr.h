/* cerr: the one error vocabulary of Cirrus.
 *
 * Every fallible internal call returns 0 or a negative cirrus_status. Calls whose failure a
 * user must understand (bad flags, a corrupt checkpoint, a missing corpus) also fill a
 * cirrus_error with a one-line message naming the problem, in the style of jansson's
 * json_error_t, so main() can print it and exit without guessing.
 */
#ifndef CIRRUS_CERR_H
#define CIRRUS_CERR_H

#include <stddef.h>

enum cirrus_status {
    CIRRUS_OK = 0,
    CIRRUS_EINVAL = -1,    /* bad argument or configuration */
    CIRRUS_ENOMEM = -2,    /* allocation failed */
    CIRRUS_EIO = -3,       /* read/write/open failed */
    CIRRUS_ECORRUPT = -4,  /* checksum, magic or structure wrong */
    CIRRUS_EMISMATCH = -5, /* valid data that does not fit this model/config */
    CIRRUS_ENOENT = -6,    /* file or object does not exist */
    CIRRUS_ETRUNC = -7,    /* input ended early */
    CIRRUS_ETIMEDOUT = -8, /* a deadline passed */
    CIRRUS_ECLOSED = -9,   /* the other end closed the connection */
    CIRRUS_ECONFLICT = -10, /* stale write (HTTP 409): re-read and retry */
    CIRRUS_EGONE = -11,    /* moved on without the caller: an expired resourceVersion (HTTP
                            * 410: re-list), a stage that moved, an outer round completed
                            * without the caller's message (take its result) */
};

typedef struct cirrus_error {
    int code;
    char msg[256];
} cirrus_error;

const char *cirrus_strerror(int code);

/* Fill err (if not NULL) with code and a printf-style message; returns code so callers can
 * write `return cirrus_fail(err, CIRRUS_EINVAL, "...")`. */
int cirrus_fail(cirrus_error *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif
