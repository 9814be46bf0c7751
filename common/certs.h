/* certs: the per-job PKI: the CA and region gateway certificates the operator puts into
 * each SwarmJob's Secret, and the throwaway ones `cirrus-trainer local --regions` makes.
 *
 * Every job gets its own CA, and each region's gateway a leaf signed by it: gateways of
 * one job trust exactly each other, and deleting the job's Secret revokes everything it
 * issued, with no CRL to run. Each leaf names its job and region in a machine-checkable
 * way, a URI subjectAltName "cirrus://<job>/<region>" (certs_identity), so a gateway can
 * tell which region it is talking to and refuse a certificate of another job (a URI SAN,
 * not the CN, because the CN is a free-text label and SANs are what TLS stacks match).
 * Certificates follow the RFC 5280 profile that Go and rustls peers insist on (SKI on the
 * CA, AKI on leaves, host names in subjectAltName only), so certs_verify checks with
 * OpenSSL's strict mode. Keys are ECDSA P-256: small Secrets, fast handshakes, supported
 * by every TLS stack.
 *
 * Everything crosses this interface as PEM strings, the form they take in the Secret; the
 * OpenSSL objects never leave certs.c, but for certs_identity_x509, which reads a peer
 * certificate the TLS code already holds. Calls return 0 or a negative cirrus_status and fill
 * err with a one-line message; OpenSSL's error queue is left empty either way.
 */
#ifndef CIRRUS_CERTS_H
#define CIRRUS_CERTS_H

#include <stddef.h>

#include "cerr.h"

/* OpenSSL's X509 (openssl/types.h), declared so this header needs no OpenSSL include. */
struct x509_st;

/* Limits on arguments. Names longer than 64 bytes fit a DNS name but not an X.509 CN
 * (RFC 5280 ub-common-name), so the CN is cut at 64 bytes (on a UTF-8 boundary): it is a
 * label for people; host names live in subjectAltName. */
#define CERTS_MAX_NAME 253
#define CERTS_MAX_DNS 64
#define CERTS_MAX_DAYS 36500
#define CERTS_CN_MAX 64
/* A job or region name in a leaf's identity: a DNS label (what the SwarmJob CRD allows for
 * both), so "cirrus://<job>/<region>" needs no escaping and parses back unambiguously. */
#define CERTS_MAX_LABEL 63
#define CERTS_URI_SCHEME "cirrus://"

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

/* A leaf for region's gateway of job, signed by ca: ECDSA P-256, CN common_name,
 * subjectAltName DNS:<each of dns[0..n_dns)> then URI:cirrus://<job>/<region> (the
 * identity certs_identity reads back), basicConstraints CA:FALSE, keyUsage
 * digitalSignature critical, extendedKeyUsage serverAuth+clientAuth (gateways talk to each
 * other both ways), subject and authority key identifiers, random 128-bit serial, valid
 * now-1h .. now+days but never past the CA's notAfter (a leaf cannot outlive its issuer
 * anyway). job and region are DNS labels: 1..63 lowercase letters, digits and '-', starting
 * and ending with a letter or digit. dns names are host names (letters, digits, '-',
 * dot-separated labels of 1..63 bytes, an optional leading "*." wildcard). With n_dns 0 the
 * leaf is valid for no host name (see certs_verify). Fails with CIRRUS_EINVAL if ca is not
 * a CA or its key is not its own. On error *out is {NULL, NULL}. */
int certs_make_leaf(const certs_pair *ca, const char *job, const char *region,
                    const char *common_name, const char *const *dns, size_t n_dns, int days,
                    certs_pair *out, cirrus_error *err);

/* certs_make_leaf with the validity given as seconds from now: notBefore = now +
 * not_before_s, notAfter = now + not_after_s (still clamped to the CA's notAfter). Both
 * within +-CERTS_MAX_DAYS days and not_before_s < not_after_s; either may be negative. For
 * tests (an expired or not-yet-valid leaf) and short-lived certificates; certs_make_leaf is
 * this with -3600 and days * 86400. */
int certs_make_leaf_valid(const certs_pair *ca, const char *job, const char *region,
                          const char *common_name, const char *const *dns, size_t n_dns,
                          long not_before_s, long not_after_s, certs_pair *out,
                          cirrus_error *err);

/* A key for region's gateway and a PKCS#10 request, signed with it, for its certificate:
 * the key stays where it was made (a member cluster), the request goes to whoever holds the
 * job's CA (certs_sign_request). out->cert_pem is the request ("-----BEGIN CERTIFICATE
 * REQUEST-----"), out->key_pem the key (ECDSA P-256). region: a DNS label (the subject's
 * CN, a label for people). On error *out is {NULL, NULL}. */
int certs_make_request(const char *region, certs_pair *out, cirrus_error *err);

/* The leaf certs_make_leaf would make, for the key of request_pem instead of a new one:
 * the request's self-signature is checked (its sender holds the key) and its key must be
 * P-256; its subject and any extensions it asks for are ignored (the identity, names and
 * validity are the issuer's arguments). *cert_pem: a malloc'd PEM, NULL on error. */
int certs_sign_request(const certs_pair *ca, const char *request_pem, const char *job,
                       const char *region, const char *common_name, const char *const *dns,
                       size_t n_dns, int days, char **cert_pem, cirrus_error *err);

/* 1 if cert_pem certifies the key of request_pem, 0 if another key, < 0 (CIRRUS_EINVAL) if
 * either does not parse. */
int certs_request_matches(const char *cert_pem, const char *request_pem, cirrus_error *err);

/* Verify cert_pem chains to ca_cert_pem (X509_STORE / X509_verify_cert, strict RFC 5280
 * checks, at the current time) and, if dns_name is not NULL, that it is valid for that
 * host name (X509_check_host, subjectAltName only: the CN is never taken as a host name, as
 * Go and browsers do). 0 or CIRRUS_EINVAL with a message saying why (the verify error
 * string). The CA verifies against itself (its self-signature is checked, which OpenSSL
 * skips for trust anchors by default). */
int certs_verify(const char *ca_cert_pem, const char *cert_pem, const char *dns_name,
                 cirrus_error *err);

/* The job and region a leaf names: its one URI subjectAltName "cirrus://<job>/<region>",
 * both parts DNS labels (as certs_make_leaf writes them), copied NUL-terminated into job
 * and region (either may be NULL to skip it). Only the name is read: the caller has
 * verified the chain (certs_verify, or the TLS handshake). CIRRUS_EINVAL with a message if
 * the certificate names no such identity, more than one, a malformed one, or a buffer is
 * too small. certs_identity_x509 is the same for a parsed certificate (the TLS code's peer
 * certificate); certs_identity parses cert_pem first. */
int certs_identity_x509(const struct x509_st *cert, char *job, size_t job_size, char *region,
                        size_t region_size, cirrus_error *err);
int certs_identity(const char *cert_pem, char *job, size_t job_size, char *region,
                   size_t region_size, cirrus_error *err);

#endif
