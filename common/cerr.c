#include "cerr.h"

#include <stdarg.h>
#include <stdio.h>

const char *cirrus_strerror(int code)
{
    switch (code) {
    case CIRRUS_OK: return "ok";
    case CIRRUS_EINVAL: return "invalid argument";
    case CIRRUS_ENOMEM: return "out of memory";
    case CIRRUS_EIO: return "input/output error";
    case CIRRUS_ECORRUPT: return "corrupt data";
    case CIRRUS_EMISMATCH: return "configuration mismatch";
    case CIRRUS_ENOENT: return "not found";
    case CIRRUS_ETRUNC: return "truncated input";
    case CIRRUS_ETIMEDOUT: return "timed out";
    case CIRRUS_ECLOSED: return "connection closed";
    case CIRRUS_ECONFLICT: return "conflict";
    case CIRRUS_EGONE: return "gone";
    default: return "unknown error";
    }
}

int cirrus_fail(cirrus_error *err, int code, const char *fmt, ...)
{
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
        err->code = code;
    }
    return code;
}
