/* certs: the per-job PKI the operator puts into each SwarmJob's Secret.
 *
 * Every job gets its own CA, and each region's gateway a leaf signed by it: gateways of
 * one job trust exactly each other, and deleting the job's Secret revokes everything it
 * issued, with no CRL to run. Certificates follow the RFC 5280 profile that Go and rustls
 * peers insist on (SKI on the CA, AKI on leaves, host names in subjectAltName only), so
 * certs_verify checks with OpenSSL's strict mode. Keys are ECDSA P-256: small Secrets,
 * fast handshakes, supported by every TLS stack.
 *
 * Everything crosses this interface as PEM strings, the form they take in the Secret; the
 * OpenSSL objects never leave certs.c. Calls return 0 or a negative cirrus_status and fill
 * err with a one-line message; OpenSSL's error queue is left empty either way.
 */
#ifndef CIRRUS_CERTS_H
#define CIRRUS_CERTS_H

#include <stddef.h>

#include "../common/cerr.h"

/* Limits on arguments. Names longer than 64 bytes fit a DNS name but not an X.509 CN
 * (RFC 5280 ub-common-name), so the CN is cut at 64 bytes (on a UTF-8 boundary): it is a
 * label for people; host names live in subjectAltName. */
#define CERTS_MAX_NAME 253
#define CERTS_MAX_DNS 64
#define CERTS_MAX_DAYS 36500
#define CERTS_CN_MAX 64

/* A PEM certificate and its private key, malloc'd NUL-terminated strings. */
typedef struct certs_pair {
    char *cert_pem; /* "-----BEGIN CERTIFICATE-----" */
    char *key_pem;  /* "-----BEGIN PRIVATE KEY-----" (unencrypted PKCS#8) */
} certs_pair;

/* Frees both, zeroes the key bytes first, NULL-safe; leaves *p as {NULL, NULL}. */
void certs_pair_free(certs_pair *p);

/* A self-signed CA for one job: ECDSA P-256, CN "cirrus job CA <job_name>",
 * basicConstraints CA:TRUE critical, keyUsage keyCertSign+cRLSign critical,
 * subjectKeyIdentifier, random 128-bit serial, valid from now-1h to now+days (the same end
 * as a leaf made now with the same days). On error *out is {NULL, NULL}. */
int certs_make_ca(const char *job_name, int days, certs_pair *out, cirrus_error *err);

/* A leaf for a region's gateway signed by ca: ECDSA P-256, CN common_name, subjectAltName
 * DNS:<each of dns[0..n_dns)>, basicConstraints CA:FALSE, keyUsage digitalSignature
 * critical, extendedKeyUsage serverAuth+clientAuth (gateways talk to each other both
 * ways), subject and authority key identifiers, random 128-bit serial, valid now-1h ..
 * now+days but never past the CA's notAfter (a leaf cannot outlive its issuer anyway).
 * dns names are host names (letters, digits, '-', dot-separated labels of 1..63 bytes, an
 * optional leading "*." wildcard). With n_dns 0 the leaf is valid for no host name (see
 * certs_verify). Fails with CIRRUS_EINVAL if ca is not a CA or its key is not its own.
 * On error *out is {NULL, NULL}. */
int certs_make_leaf(const certs_pair *ca, const char *common_name, const char *const *dns,
                    size_t n_dns, int days, certs_pair *out, cirrus_error *err);

/* Verify cert_pem chains to ca_cert_pem (X509_STORE / X509_verify_cert, strict RFC 5280
 * checks, at the current time) and, if dns_name is not NULL, that it is valid for that
 * host name (X509_check_host, subjectAltName only: the CN is never taken as a host name, as
 * Go and browsers do). 0 or CIRRUS_EINVAL with a message saying why (the verify error
 * string). The CA verifies against itself (its self-signature is checked, which OpenSSL
 * skips for trust anchors by default). */
int certs_verify(const char *ca_cert_pem, const char *cert_pem, const char *dns_name,
                 cirrus_error *err);

#endif
