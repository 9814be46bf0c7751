/* certs_verify: checking what certs.c issued: a chain to the job's CA, a host name, the
 * job and region a leaf names (certs.h). */
#include <string.h>

#include <openssl/err.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include "certs.h"
#include "certs_internal.h"

/* The chain, with OpenSSL's strict RFC 5280 checks (what a Go or rustls peer would also
 * reject fails here first). The CA is the only trust anchor. */
static int check_chain(X509 *ca, X509 *cert, cirrus_error *err)
{
    X509_STORE *store = X509_STORE_new();
    X509_STORE_CTX *ctx = X509_STORE_CTX_new();
    int rc;
    if (!store || !ctx || !X509_STORE_add_cert(store, ca) ||
        !X509_STORE_CTX_init(ctx, store, cert, NULL)) {
        rc = certs_ssl_fail(err, CIRRUS_EIO, "setting up verification");
    } else {
        /* CHECK_SS_SIGNATURE: a CA verifying against itself has its own signature checked,
         * which OpenSSL skips for trust anchors by default. */
        X509_STORE_CTX_set_flags(ctx, X509_V_FLAG_X509_STRICT | X509_V_FLAG_CHECK_SS_SIGNATURE);
        int ok = X509_verify_cert(ctx);
        if (ok == 1) {
            rc = 0;
        } else if (ok == 0) {
            int e = X509_STORE_CTX_get_error(ctx);
            rc = cirrus_fail(err, CIRRUS_EINVAL, "certificate does not verify against the CA: %s",
                             X509_verify_cert_error_string(e));
        } else {
            rc = certs_ssl_fail(err, CIRRUS_EINVAL, "verifying the certificate");
        }
    }
    X509_STORE_CTX_free(ctx);
    X509_STORE_free(store);
    return rc;
}

/* subjectAltName only, and "*.x" matches one whole label: what Go and browsers accept. */
static int check_host(X509 *cert, const char *name, cirrus_error *err)
{
    unsigned flags = X509_CHECK_FLAG_NEVER_CHECK_SUBJECT | X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS;
    int r = X509_check_host(cert, name, strlen(name), flags, NULL);
    if (r == 1) return 0;
    if (r == 0)
        return cirrus_fail(err, CIRRUS_EINVAL, "certificate is not valid for host name \"%s\"",
                           name);
    return certs_ssl_fail(err, CIRRUS_EINVAL, "checking host name \"%s\"", name);
}

static int verify(const char *ca_cert_pem, const char *cert_pem, const char *dns_name,
                  cirrus_error *err)
{
    int rc = dns_name ? certs_check_host_name("dns_name", dns_name, err) : 0;
    if (rc < 0) return rc;
    X509 *ca = NULL, *cert = NULL;
    rc = certs_parse_cert(ca_cert_pem, "CA certificate", &ca, err);
    if (rc == 0) rc = certs_parse_cert(cert_pem, "certificate", &cert, err);
    if (rc == 0) rc = check_chain(ca, cert, err);
    if (rc == 0 && dns_name) rc = check_host(cert, dns_name, err);
    X509_free(cert);
    X509_free(ca);
    return rc;
}

int certs_verify(const char *ca_cert_pem, const char *cert_pem, const char *dns_name,
                 cirrus_error *err)
{
    ERR_clear_error();
    int rc = verify(ca_cert_pem, cert_pem, dns_name, err);
    ERR_clear_error();
    return rc;
}

/* ---- identity ---- */

/* Copy n bytes of src as a NUL-terminated string into out (skipped when out is NULL). */
static int copy_out(const char *what, const char *src, size_t n, char *out, size_t size,
                    cirrus_error *err)
{
    if (!out) return 0;
    if (n >= size)
        return cirrus_fail(err, CIRRUS_EINVAL,
                           "the certificate's %s (%zu bytes) does not fit %zu", what, n, size);
    memcpy(out, src, n);
    out[n] = '\0';
    return 0;
}

/* "cirrus://<job>/<region>", n bytes of u (an IA5String: may hold a NUL, so never strlen). */
static int parse_identity(const char *u, size_t n, char *job, size_t job_size, char *region,
                          size_t region_size, cirrus_error *err)
{
    const size_t pre = sizeof CERTS_URI_SCHEME - 1;
    const char *j = u + pre, *slash = memchr(j, '/', n - pre);
    if (!slash)
        return cirrus_fail(err, CIRRUS_EINVAL, "the certificate's identity URI has no region");
    size_t jn = (size_t)(slash - j), rn = n - pre - jn - 1;
    int rc = certs_check_label("the certificate's job", j, jn, err);
    if (rc == 0) rc = certs_check_label("the certificate's region", slash + 1, rn, err);
    if (rc == 0) rc = copy_out("job", j, jn, job, job_size, err);
    if (rc == 0) rc = copy_out("region", slash + 1, rn, region, region_size, err);
    return rc;
}

static int identity(const X509 *cert, char *job, size_t job_size, char *region,
                    size_t region_size, cirrus_error *err)
{
    int crit = 0;
    GENERAL_NAMES *names = X509_get_ext_d2i(cert, NID_subject_alt_name, &crit, NULL);
    if (!names) /* crit: -1 no extension, -2 two of them, else one that did not decode */
        return cirrus_fail(err, CIRRUS_EINVAL, "the certificate %s",
                           crit == -1   ? "names no cirrus:// identity"
                           : crit == -2 ? "has two subjectAltName extensions"
                                        : "has a subjectAltName that does not decode");
    const ASN1_IA5STRING *uri = NULL;
    int found = 0;
    for (int i = 0; i < sk_GENERAL_NAME_num(names); i++) {
        const GENERAL_NAME *gn = sk_GENERAL_NAME_value(names, i);
        if (gn->type != GEN_URI) continue;
        const char *d = (const char *)ASN1_STRING_get0_data(gn->d.uniformResourceIdentifier);
        int len = ASN1_STRING_length(gn->d.uniformResourceIdentifier);
        if (len >= (int)sizeof CERTS_URI_SCHEME - 1 &&
            memcmp(d, CERTS_URI_SCHEME, sizeof CERTS_URI_SCHEME - 1) == 0) {
            uri = gn->d.uniformResourceIdentifier;
            found++;
        }
    }
    /* Two identities would let one certificate pass as either: refuse rather than pick. */
    int rc;
    if (found == 1)
        rc = parse_identity((const char *)ASN1_STRING_get0_data(uri),
                            (size_t)ASN1_STRING_length(uri), job, job_size, region, region_size,
                            err);
    else if (found > 1)
        rc = cirrus_fail(err, CIRRUS_EINVAL, "the certificate names %d cirrus:// identities",
                         found);
    else
        rc = cirrus_fail(err, CIRRUS_EINVAL, "the certificate names no cirrus:// identity");
    GENERAL_NAMES_free(names);
    return rc;
}

int certs_identity_x509(const struct x509_st *cert, char *job, size_t job_size, char *region,
                        size_t region_size, cirrus_error *err)
{
    if (job && job_size) job[0] = '\0';
    if (region && region_size) region[0] = '\0';
    if (!cert) return cirrus_fail(err, CIRRUS_EINVAL, "no certificate");
    int rc = identity(cert, job, job_size, region, region_size, err);
    if (rc) { /* never half an identity */
        if (job && job_size) job[0] = '\0';
        if (region && region_size) region[0] = '\0';
    }
    ERR_clear_error(); /* a malformed extension leaves decoding errors */
    return rc;
}

int certs_identity(const char *cert_pem, char *job, size_t job_size, char *region,
                   size_t region_size, cirrus_error *err)
{
    ERR_clear_error();
    X509 *x = NULL;
    int rc = certs_parse_cert(cert_pem, "certificate", &x, err);
    if (rc == 0) rc = certs_identity_x509(x, job, job_size, region, region_size, err);
    X509_free(x);
    ERR_clear_error();
    return rc;
}
