/* certs_internal: what certs.c and certs_verify.c share (not for other callers). */
#ifndef CIRRUS_CERTS_INTERNAL_H
#define CIRRUS_CERTS_INTERNAL_H

#include <stddef.h>

#include "cerr.h"

struct x509_st;

/* err from OpenSSL's first queued error (the root cause) after the message; the queue
 * emptied. An allocation failure inside OpenSSL is CIRRUS_ENOMEM whatever code says. */
__attribute__((format(printf, 3, 4))) int certs_ssl_fail(cirrus_error *err, int code,
                                                         const char *fmt, ...);
/* A PEM certificate parsed (what: its name in messages). */
int certs_parse_cert(const char *pem, const char *what, struct x509_st **out, cirrus_error *err);
/* s[0..n) a DNS label: 1..63 lowercase letters, digits and '-', no '-' at either end. */
int certs_check_label(const char *what, const char *s, size_t n, cirrus_error *err);
/* s a host name (dot-separated labels, an optional leading "*."). */
int certs_check_host_name(const char *what, const char *s, cirrus_error *err);

#endif
