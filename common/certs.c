#include "certs.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <openssl/bio.h>
#include <openssl/bn.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

/* Our PEMs are under 1 KiB; a bigger input is something else, and BIO_new_mem_buf takes an
 * int length. */
#define PEM_MAX (64u << 10)
/* Clocks across regions disagree: a peer a few minutes behind must not see a certificate
 * that is not valid yet. */
#define BACKDATE_S 3600

/* Fill err from OpenSSL's first queued error (the root cause; later entries are callers
 * adding context) and empty the queue. An allocation failure inside OpenSSL is reported as
 * CIRRUS_ENOMEM whatever code the caller picked. */
__attribute__((format(printf, 3, 4))) static int ssl_fail(cirrus_error *err, int code,
                                                          const char *fmt, ...)
{
    char what[160];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    unsigned long e = ERR_get_error();
    ERR_clear_error();
    if (e == 0) return cirrus_fail(err, code, "%s", what);
    char buf[160];
    ERR_error_string_n(e, buf, sizeof buf);
    if (ERR_GET_REASON(e) == ERR_R_MALLOC_FAILURE) code = CIRRUS_ENOMEM;
    return cirrus_fail(err, code, "%s: %s", what, buf);
}

/* ---- arguments ---- */

/* A name printed into a subject: present, at most CERTS_MAX_NAME bytes, and no control
 * characters (they would end up in logs and in `openssl x509 -text`). */
static int check_name(const char *what, const char *s, cirrus_error *err)
{
    if (!s || !*s) return cirrus_fail(err, CIRRUS_EINVAL, "%s is empty", what);
    size_t len = strlen(s);
    if (len > CERTS_MAX_NAME)
        return cirrus_fail(err, CIRRUS_EINVAL, "%s is %zu bytes, more than %d", what, len,
                           CERTS_MAX_NAME);
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c < 0x20 || c == 0x7f)
            return cirrus_fail(err, CIRRUS_EINVAL, "%s: control character 0x%02x at byte %zu",
                               what, c, i);
    }
    return 0;
}

static int host_char(unsigned char c)
{
    /* Explicit ranges, not isalnum: the locale must not widen what goes into a SAN. */
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '-';
}

/* A host name for subjectAltName: an optional "*." wildcard, then dot-separated labels of
 * 1..63 letters, digits and hyphens, at most CERTS_MAX_NAME bytes in all. Checked here
 * rather than left to OpenSSL, which would put any IA5 string into the SAN. */
static int check_host_name(const char *what, const char *s, cirrus_error *err)
{
    if (!s || !*s) return cirrus_fail(err, CIRRUS_EINVAL, "%s: host name is empty", what);
    size_t len = strlen(s);
    if (len > CERTS_MAX_NAME)
        return cirrus_fail(err, CIRRUS_EINVAL, "%s: host name is %zu bytes, more than %d",
                           what, len, CERTS_MAX_NAME);
    size_t start = (s[0] == '*' && s[1] == '.') ? 2 : 0;
    /* Characters first, so the messages below may quote the name. */
    for (size_t i = start; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        if (!host_char(c) && c != '.')
            return cirrus_fail(err, CIRRUS_EINVAL,
                               "%s: byte 0x%02x at %zu is not allowed in a host name", what,
                               c, i);
    }
    size_t label = 0;
    for (size_t i = start; i <= len; i++) {
        if (s[i] != '.' && s[i] != '\0') {
            label++;
            continue;
        }
        if (label == 0 || label > 63)
            return cirrus_fail(err, CIRRUS_EINVAL,
                               "%s: \"%.80s\" has a label of %zu bytes (want 1..63)", what, s,
                               label);
        label = 0;
    }
    return 0;
}

static int check_days(int days, cirrus_error *err)
{
    if (days < 1 || days > CERTS_MAX_DAYS)
        return cirrus_fail(err, CIRRUS_EINVAL, "validity of %d days is outside 1..%d", days,
                           CERTS_MAX_DAYS);
    return 0;
}

/* A job or region name of an identity: a DNS label of lowercase letters, digits and '-'
 * (see certs.h). n bytes of s, which need not be NUL-terminated: the same check reads
 * names back out of a peer's certificate, where an embedded NUL must fail too. Lowercase
 * only, so that two spellings can never name the same job or region. */
static int check_label(const char *what, const char *s, size_t n, cirrus_error *err)
{
    if (!s || n == 0) return cirrus_fail(err, CIRRUS_EINVAL, "%s is empty", what);
    if (n > CERTS_MAX_LABEL)
        return cirrus_fail(err, CIRRUS_EINVAL, "%s is %zu bytes, more than %d", what, n,
                           CERTS_MAX_LABEL);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-'))
            return cirrus_fail(err, CIRRUS_EINVAL,
                               "%s: byte 0x%02x at %zu is not a lowercase letter, digit or '-'",
                               what, c, i);
    }
    if (s[0] == '-' || s[n - 1] == '-')
        return cirrus_fail(err, CIRRUS_EINVAL, "%s \"%.*s\" starts or ends with '-'", what,
                           (int)n, s);
    return 0;
}

/* Offsets from now for notBefore / notAfter, in seconds. */
static int check_validity(long not_before_s, long not_after_s, cirrus_error *err)
{
    const long max = (long)CERTS_MAX_DAYS * 86400;
    if (not_before_s < -max || not_before_s > max || not_after_s < -max || not_after_s > max)
        return cirrus_fail(err, CIRRUS_EINVAL,
                           "validity offsets %ld..%ld s are outside +-%d days", not_before_s,
                           not_after_s, CERTS_MAX_DAYS);
    if (not_before_s >= not_after_s)
        return cirrus_fail(err, CIRRUS_EINVAL, "validity ends (%ld s) before it starts (%ld s)",
                           not_after_s, not_before_s);
    return 0;
}

/* ---- building ---- */

static int gen_key(EVP_PKEY **out, cirrus_error *err)
{
    *out = NULL;
    EVP_PKEY_CTX *ctx = EVP_PKEY_CTX_new_from_name(NULL, "EC", NULL);
    int ok = ctx && EVP_PKEY_keygen_init(ctx) > 0 &&
             EVP_PKEY_CTX_set_group_name(ctx, "P-256") > 0 && EVP_PKEY_generate(ctx, out) > 0;
    EVP_PKEY_CTX_free(ctx);
    if (!ok) {
        EVP_PKEY_free(*out);
        *out = NULL;
        return ssl_fail(err, CIRRUS_EIO, "generating a P-256 key");
    }
    return 0;
}

/* 128 random bits: unique without a serial database, and unguessable (RFC 5280 allows up
 * to 20 octets; a positive 128-bit number takes at most 17). */
static int set_random_serial(X509 *x, cirrus_error *err)
{
    unsigned char raw[16];
    if (RAND_bytes(raw, sizeof raw) != 1) return ssl_fail(err, CIRRUS_EIO, "random serial");
    BIGNUM *bn = BN_bin2bn(raw, sizeof raw, NULL);
    int ok = bn != NULL;
    if (ok && BN_is_zero(bn)) ok = BN_set_word(bn, 1); /* serials must be positive */
    ok = ok && BN_to_ASN1_INTEGER(bn, X509_get_serialNumber(x)) != NULL;
    BN_free(bn);
    return ok ? 0 : ssl_fail(err, CIRRUS_EIO, "random serial");
}

/* The CN, cut to CERTS_CN_MAX bytes without splitting a UTF-8 sequence (see certs.h). */
static int set_cn(X509 *x, const char *cn, cirrus_error *err)
{
    size_t len = strlen(cn);
    if (len > CERTS_CN_MAX) {
        len = CERTS_CN_MAX;
        while (len > 0 && ((unsigned char)cn[len] & 0xc0) == 0x80) len--;
    }
    if (!X509_NAME_add_entry_by_NID(X509_get_subject_name(x), NID_commonName, MBSTRING_UTF8,
                                    (const unsigned char *)cn, (int)len, -1, 0))
        return ssl_fail(err, CIRRUS_EINVAL, "common name \"%.64s\"", cn);
    return 0;
}

/* What CA and leaf share: version 3, random serial, valid from now + nb_s to now + na_s
 * (seconds), subject CN, public key. The issuer and extensions are the caller's. */
static int new_cert(EVP_PKEY *key, const char *cn, long nb_s, long na_s, X509 **out,
                    cirrus_error *err)
{
    time_t now = time(NULL);
    X509 *x = X509_new();
    *out = NULL;
    /* Whole days apart from seconds: the offsets fit an int day count and a small long
     * whatever the width of long. */
    if (!x || !X509_set_version(x, X509_VERSION_3) ||
        !X509_time_adj_ex(X509_getm_notBefore(x), (int)(nb_s / 86400), nb_s % 86400, &now) ||
        !X509_time_adj_ex(X509_getm_notAfter(x), (int)(na_s / 86400), na_s % 86400, &now) ||
        !X509_set_pubkey(x, key)) {
        X509_free(x);
        return ssl_fail(err, CIRRUS_EIO, "new certificate");
    }
    int rc = set_random_serial(x, err);
    if (rc == 0) rc = set_cn(x, cn, err);
    if (rc < 0) {
        X509_free(x);
        return rc;
    }
    *out = x;
    return 0;
}

/* One extension from OpenSSL's config syntax ("critical,CA:TRUE"); the values are our
 * constants, never user input. issuer supplies the authority key id. */
static int add_ext(X509 *x, X509 *issuer, int nid, const char *value, cirrus_error *err)
{
    X509V3_CTX ctx;
    X509V3_set_ctx_nodb(&ctx);
    X509V3_set_ctx(&ctx, issuer, x, NULL, NULL, 0);
    X509_EXTENSION *ext = X509V3_EXT_nconf_nid(NULL, &ctx, nid, value);
    int ok = ext && X509_add_ext(x, ext, -1);
    X509_EXTENSION_free(ext);
    return ok ? 0 : ssl_fail(err, CIRRUS_EIO, "extension %s", OBJ_nid2sn(nid));
}

/* subjectAltName built as objects, not as a "DNS:a,DNS:b" config string, so no name can
 * smuggle in another entry: the DNS names, then the URI identity (the last entry). */
static int add_san(X509 *x, const char *const *dns, size_t n, const char *uri,
                   cirrus_error *err)
{
    GENERAL_NAMES *names = GENERAL_NAMES_new();
    int ok = names != NULL;
    for (size_t i = 0; ok && i <= n; i++) {
        GENERAL_NAME *gn = GENERAL_NAME_new();
        ASN1_IA5STRING *s = ASN1_IA5STRING_new();
        if (!gn || !s || !ASN1_STRING_set(s, i < n ? dns[i] : uri, -1)) {
            GENERAL_NAME_free(gn);
            ASN1_IA5STRING_free(s);
            ok = 0;
            break;
        }
        GENERAL_NAME_set0_value(gn, i < n ? GEN_DNS : GEN_URI, s); /* gn owns s now */
        if (!sk_GENERAL_NAME_push(names, gn)) {
            GENERAL_NAME_free(gn);
            ok = 0;
        }
    }
    ok = ok && X509_add1_ext_i2d(x, NID_subject_alt_name, names, 0, X509V3_ADD_DEFAULT) == 1;
    GENERAL_NAMES_free(names);
    return ok ? 0 : ssl_fail(err, CIRRUS_EIO, "extension subjectAltName");
}

/* A memory BIO's contents as a malloc'd string; NULL if empty or out of memory. */
static char *bio_string(BIO *b)
{
    char *data = NULL;
    long n = BIO_get_mem_data(b, &data);
    if (n <= 0 || !data) return NULL;
    char *s = malloc((size_t)n + 1);
    if (!s) return NULL;
    memcpy(s, data, (size_t)n);
    s[n] = '\0';
    return s;
}

static void free_key_string(char *s)
{
    if (!s) return;
    OPENSSL_cleanse(s, strlen(s));
    free(s);
}

/* Sign x with signer (ECDSA with SHA-256 for our keys) and write it and key as PEM. The key
 * goes through a secure-memory BIO, which wipes its buffer when freed. */
static int sign_export(X509 *x, EVP_PKEY *signer, EVP_PKEY *key, certs_pair *out,
                       cirrus_error *err)
{
    if (X509_sign(x, signer, EVP_sha256()) <= 0)
        return ssl_fail(err, CIRRUS_EIO, "signing the certificate");
    BIO *cb = BIO_new(BIO_s_mem()), *kb = BIO_new(BIO_s_secmem());
    int rc = 0;
    if (!cb || !kb || !PEM_write_bio_X509(cb, x) ||
        !PEM_write_bio_PrivateKey(kb, key, NULL, NULL, 0, NULL, NULL)) {
        rc = ssl_fail(err, CIRRUS_EIO, "writing PEM");
    } else {
        out->cert_pem = bio_string(cb);
        out->key_pem = bio_string(kb);
        if (!out->cert_pem || !out->key_pem) {
            certs_pair_free(out);
            rc = cirrus_fail(err, CIRRUS_ENOMEM, "PEM: out of memory");
        }
    }
    BIO_free(cb);
    BIO_free(kb);
    return rc;
}

/* ---- parsing ---- */

/* Never prompt on the terminal for an encrypted key (OpenSSL's default with a NULL
 * callback): the operator has no terminal, and our keys are not encrypted. */
static int no_passphrase(char *buf, int size, int rwflag, void *u)
{
    (void)buf, (void)size, (void)rwflag, (void)u;
    return -1;
}

static int pem_bio(const char *pem, const char *what, BIO **out, cirrus_error *err)
{
    *out = NULL;
    if (!pem || !*pem) return cirrus_fail(err, CIRRUS_EINVAL, "%s: no PEM given", what);
    size_t len = strlen(pem);
    if (len > PEM_MAX)
        return cirrus_fail(err, CIRRUS_EINVAL, "%s: %zu bytes of PEM, more than %u", what, len,
                           PEM_MAX);
    *out = BIO_new_mem_buf(pem, (int)len);
    return *out ? 0 : ssl_fail(err, CIRRUS_ENOMEM, "%s", what);
}

static int parse_cert(const char *pem, const char *what, X509 **out, cirrus_error *err)
{
    BIO *b;
    int rc = pem_bio(pem, what, &b, err);
    if (rc < 0) return rc;
    *out = PEM_read_bio_X509(b, NULL, no_passphrase, NULL);
    BIO_free(b);
    return *out ? 0 : ssl_fail(err, CIRRUS_EINVAL, "%s is not a PEM certificate", what);
}

static int parse_key(const char *pem, const char *what, EVP_PKEY **out, cirrus_error *err)
{
    BIO *b;
    int rc = pem_bio(pem, what, &b, err);
    if (rc < 0) return rc;
    *out = PEM_read_bio_PrivateKey(b, NULL, no_passphrase, NULL);
    BIO_free(b);
    return *out ? 0 : ssl_fail(err, CIRRUS_EINVAL, "%s is not a PEM private key", what);
}

/* A CA we can issue from: a real CA (basicConstraints CA:TRUE), the key is its own, and it
 * has not expired (a leaf from it would be born dead). */
static int check_issuer(X509 *ca, EVP_PKEY *key, cirrus_error *err)
{
    if (X509_check_ca(ca) != 1) {
        ERR_clear_error();
        return cirrus_fail(err, CIRRUS_EINVAL,
                           "the CA certificate is not a CA (no basicConstraints CA:TRUE)");
    }
    if (X509_check_private_key(ca, key) != 1)
        return ssl_fail(err, CIRRUS_EINVAL, "the CA key does not belong to the CA certificate");
    if (X509_cmp_current_time(X509_get0_notAfter(ca)) <= 0) {
        ERR_clear_error();
        return cirrus_fail(err, CIRRUS_EINVAL, "the CA certificate has expired");
    }
    return 0;
}

/* ---- the interface ---- */

void certs_pair_free(certs_pair *p)
{
    if (!p) return;
    free(p->cert_pem);
    free_key_string(p->key_pem);
    p->cert_pem = p->key_pem = NULL;
}

static int make_ca(const char *job_name, int days, certs_pair *out, cirrus_error *err)
{
    int rc = check_name("job name", job_name, err);
    if (rc == 0) rc = check_days(days, err);
    if (rc < 0) return rc;
    char cn[sizeof "cirrus job CA " + CERTS_MAX_NAME];
    snprintf(cn, sizeof cn, "cirrus job CA %s", job_name);

    EVP_PKEY *key = NULL;
    X509 *x = NULL;
    rc = gen_key(&key, err);
    if (rc == 0) rc = new_cert(key, cn, -BACKDATE_S, days * 86400L, &x, err);
    if (rc == 0 && !X509_set_issuer_name(x, X509_get_subject_name(x)))
        rc = ssl_fail(err, CIRRUS_EIO, "issuer name");
    if (rc == 0) rc = add_ext(x, x, NID_basic_constraints, "critical,CA:TRUE", err);
    if (rc == 0) rc = add_ext(x, x, NID_key_usage, "critical,keyCertSign,cRLSign", err);
    if (rc == 0) rc = add_ext(x, x, NID_subject_key_identifier, "hash", err);
    if (rc == 0) rc = sign_export(x, key, key, out, err);
    X509_free(x);
    EVP_PKEY_free(key);
    return rc;
}

int certs_make_ca(const char *job_name, int days, certs_pair *out, cirrus_error *err)
{
    if (!out) return cirrus_fail(err, CIRRUS_EINVAL, "certs_make_ca: out is NULL");
    out->cert_pem = out->key_pem = NULL;
    ERR_clear_error(); /* so the first queued error is ours */
    int rc = make_ca(job_name, days, out, err);
    ERR_clear_error();
    return rc;
}

static int check_leaf_args(const certs_pair *ca, const char *job, const char *region,
                           const char *common_name, const char *const *dns, size_t n_dns,
                           long nb_s, long na_s, cirrus_error *err)
{
    if (!ca) return cirrus_fail(err, CIRRUS_EINVAL, "no CA given");
    int rc = check_label("job", job, job ? strlen(job) : 0, err);
    if (rc == 0) rc = check_label("region", region, region ? strlen(region) : 0, err);
    if (rc == 0) rc = check_name("common name", common_name, err);
    if (rc == 0) rc = check_validity(nb_s, na_s, err);
    if (rc < 0) return rc;
    if (n_dns > CERTS_MAX_DNS)
        return cirrus_fail(err, CIRRUS_EINVAL, "%zu DNS names, more than %d", n_dns,
                           CERTS_MAX_DNS);
    if (n_dns > 0 && !dns) return cirrus_fail(err, CIRRUS_EINVAL, "dns is NULL");
    for (size_t i = 0; i < n_dns; i++) {
        char what[32];
        snprintf(what, sizeof what, "dns[%zu]", i);
        if ((rc = check_host_name(what, dns[i], err)) < 0) return rc;
    }
    return 0;
}

/* Keep the leaf inside its issuer's lifetime: past the CA's notAfter it would not verify. */
static int clamp_to_issuer(X509 *x, X509 *ca, cirrus_error *err)
{
    const ASN1_TIME *ca_end = X509_get0_notAfter(ca);
    int cmp = ASN1_TIME_compare(X509_get0_notAfter(x), ca_end);
    if (cmp == -2) return ssl_fail(err, CIRRUS_EINVAL, "the CA certificate's notAfter");
    if (cmp > 0 && !X509_set1_notAfter(x, ca_end))
        return ssl_fail(err, CIRRUS_EIO, "leaf notAfter");
    return 0;
}

static int make_leaf(const certs_pair *ca, const char *job, const char *region,
                     const char *common_name, const char *const *dns, size_t n_dns, long nb_s,
                     long na_s, certs_pair *out, cirrus_error *err)
{
    int rc = check_leaf_args(ca, job, region, common_name, dns, n_dns, nb_s, na_s, err);
    if (rc < 0) return rc;
    char uri[sizeof CERTS_URI_SCHEME + 2 * CERTS_MAX_LABEL + 1];
    snprintf(uri, sizeof uri, CERTS_URI_SCHEME "%s/%s", job, region);
    X509 *ca_cert = NULL, *x = NULL;
    EVP_PKEY *ca_key = NULL, *key = NULL;
    rc = parse_cert(ca->cert_pem, "CA certificate", &ca_cert, err);
    if (rc == 0) rc = parse_key(ca->key_pem, "CA key", &ca_key, err);
    if (rc == 0) rc = check_issuer(ca_cert, ca_key, err);
    if (rc == 0) rc = gen_key(&key, err);
    if (rc == 0) rc = new_cert(key, common_name, nb_s, na_s, &x, err);
    if (rc == 0 && !X509_set_issuer_name(x, X509_get_subject_name(ca_cert)))
        rc = ssl_fail(err, CIRRUS_EIO, "issuer name");
    if (rc == 0) rc = clamp_to_issuer(x, ca_cert, err);
    if (rc == 0) rc = add_ext(x, ca_cert, NID_basic_constraints, "CA:FALSE", err);
    if (rc == 0) rc = add_ext(x, ca_cert, NID_key_usage, "critical,digitalSignature", err);
    if (rc == 0) rc = add_ext(x, ca_cert, NID_ext_key_usage, "serverAuth,clientAuth", err);
    if (rc == 0) rc = add_ext(x, ca_cert, NID_subject_key_identifier, "hash", err);
    if (rc == 0) rc = add_ext(x, ca_cert, NID_authority_key_identifier, "keyid:always", err);
    if (rc == 0) rc = add_san(x, dns, n_dns, uri, err);
    if (rc == 0) rc = sign_export(x, ca_key, key, out, err);
    X509_free(x);
    X509_free(ca_cert);
    EVP_PKEY_free(key);
    EVP_PKEY_free(ca_key);
    return rc;
}

int certs_make_leaf_valid(const certs_pair *ca, const char *job, const char *region,
                          const char *common_name, const char *const *dns, size_t n_dns,
                          long not_before_s, long not_after_s, certs_pair *out,
                          cirrus_error *err)
{
    if (!out) return cirrus_fail(err, CIRRUS_EINVAL, "certs_make_leaf: out is NULL");
    out->cert_pem = out->key_pem = NULL;
    ERR_clear_error();
    int rc = make_leaf(ca, job, region, common_name, dns, n_dns, not_before_s, not_after_s,
                       out, err);
    ERR_clear_error();
    return rc;
}

int certs_make_leaf(const certs_pair *ca, const char *job, const char *region,
                    const char *common_name, const char *const *dns, size_t n_dns, int days,
                    certs_pair *out, cirrus_error *err)
{
    if (!out) return cirrus_fail(err, CIRRUS_EINVAL, "certs_make_leaf: out is NULL");
    out->cert_pem = out->key_pem = NULL;
    int rc = check_days(days, err);
    if (rc < 0) return rc;
    return certs_make_leaf_valid(ca, job, region, common_name, dns, n_dns, -BACKDATE_S,
                                 days * 86400L, out, err);
}

/* The chain, with OpenSSL's strict RFC 5280 checks (what a Go or rustls peer would also
 * reject fails here first). The CA is the only trust anchor. */
static int check_chain(X509 *ca, X509 *cert, cirrus_error *err)
{
    X509_STORE *store = X509_STORE_new();
    X509_STORE_CTX *ctx = X509_STORE_CTX_new();
    int rc;
    if (!store || !ctx || !X509_STORE_add_cert(store, ca) ||
        !X509_STORE_CTX_init(ctx, store, cert, NULL)) {
        rc = ssl_fail(err, CIRRUS_EIO, "setting up verification");
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
            rc = ssl_fail(err, CIRRUS_EINVAL, "verifying the certificate");
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
    return ssl_fail(err, CIRRUS_EINVAL, "checking host name \"%s\"", name);
}

static int verify(const char *ca_cert_pem, const char *cert_pem, const char *dns_name,
                  cirrus_error *err)
{
    int rc = dns_name ? check_host_name("dns_name", dns_name, err) : 0;
    if (rc < 0) return rc;
    X509 *ca = NULL, *cert = NULL;
    rc = parse_cert(ca_cert_pem, "CA certificate", &ca, err);
    if (rc == 0) rc = parse_cert(cert_pem, "certificate", &cert, err);
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
    int rc = check_label("the certificate's job", j, jn, err);
    if (rc == 0) rc = check_label("the certificate's region", slash + 1, rn, err);
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
    int rc = parse_cert(cert_pem, "certificate", &x, err);
    if (rc == 0) rc = certs_identity_x509(x, job, job_size, region, region_size, err);
    X509_free(x);
    ERR_clear_error();
    return rc;
}
