#include "certs.h"
#include "certs_internal.h"

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
int certs_ssl_fail(cirrus_error *err, int code, const char *fmt, ...)
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
int certs_check_host_name(const char *what, const char *s, cirrus_error *err)
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
int certs_check_label(const char *what, const char *s, size_t n, cirrus_error *err)
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
        return certs_ssl_fail(err, CIRRUS_EIO, "generating a P-256 key");
    }
    return 0;
}

/* 128 random bits: unique without a serial database, and unguessable (RFC 5280 allows up
 * to 20 octets; a positive 128-bit number takes at most 17). */
static int set_random_serial(X509 *x, cirrus_error *err)
{
    unsigned char raw[16];
    if (RAND_bytes(raw, sizeof raw) != 1) return certs_ssl_fail(err, CIRRUS_EIO, "random serial");
    BIGNUM *bn = BN_bin2bn(raw, sizeof raw, NULL);
    int ok = bn != NULL;
    if (ok && BN_is_zero(bn)) ok = BN_set_word(bn, 1); /* serials must be positive */
    ok = ok && BN_to_ASN1_INTEGER(bn, X509_get_serialNumber(x)) != NULL;
    BN_free(bn);
    return ok ? 0 : certs_ssl_fail(err, CIRRUS_EIO, "random serial");
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
        return certs_ssl_fail(err, CIRRUS_EINVAL, "common name \"%.64s\"", cn);
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
        return certs_ssl_fail(err, CIRRUS_EIO, "new certificate");
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
    return ok ? 0 : certs_ssl_fail(err, CIRRUS_EIO, "extension %s", OBJ_nid2sn(nid));
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
    return ok ? 0 : certs_ssl_fail(err, CIRRUS_EIO, "extension subjectAltName");
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

/* x and key (NULL: none) as PEM. The key goes through a secure-memory BIO, which wipes its
 * buffer when freed. */
static int export_pem(X509 *x, EVP_PKEY *key, certs_pair *out, cirrus_error *err)
{
    BIO *cb = BIO_new(BIO_s_mem()), *kb = key ? BIO_new(BIO_s_secmem()) : NULL;
    int rc = 0;
    if (!cb || (key && !kb) || !PEM_write_bio_X509(cb, x) ||
        (key && !PEM_write_bio_PrivateKey(kb, key, NULL, NULL, 0, NULL, NULL))) {
        rc = certs_ssl_fail(err, CIRRUS_EIO, "writing PEM");
    } else {
        out->cert_pem = bio_string(cb);
        out->key_pem = key ? bio_string(kb) : NULL;
        if (!out->cert_pem || (key && !out->key_pem)) {
            certs_pair_free(out);
            rc = cirrus_fail(err, CIRRUS_ENOMEM, "PEM: out of memory");
        }
    }
    BIO_free(cb);
    BIO_free(kb);
    return rc;
}

/* Sign x with signer (ECDSA with SHA-256 for our keys) and write it and key as PEM. */
static int sign_export(X509 *x, EVP_PKEY *signer, EVP_PKEY *key, certs_pair *out,
                       cirrus_error *err)
{
    if (X509_sign(x, signer, EVP_sha256()) <= 0)
        return certs_ssl_fail(err, CIRRUS_EIO, "signing the certificate");
    return export_pem(x, key, out, err);
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
    return *out ? 0 : certs_ssl_fail(err, CIRRUS_ENOMEM, "%s", what);
}

int certs_parse_cert(const char *pem, const char *what, X509 **out, cirrus_error *err)
{
    BIO *b;
    int rc = pem_bio(pem, what, &b, err);
    if (rc < 0) return rc;
    *out = PEM_read_bio_X509(b, NULL, no_passphrase, NULL);
    BIO_free(b);
    return *out ? 0 : certs_ssl_fail(err, CIRRUS_EINVAL, "%s is not a PEM certificate", what);
}

static int parse_key(const char *pem, const char *what, EVP_PKEY **out, cirrus_error *err)
{
    BIO *b;
    int rc = pem_bio(pem, what, &b, err);
    if (rc < 0) return rc;
    *out = PEM_read_bio_PrivateKey(b, NULL, no_passphrase, NULL);
    BIO_free(b);
    return *out ? 0 : certs_ssl_fail(err, CIRRUS_EINVAL, "%s is not a PEM private key", what);
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
        return certs_ssl_fail(err, CIRRUS_EINVAL, "the CA key does not belong to the CA certificate");
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
        rc = certs_ssl_fail(err, CIRRUS_EIO, "issuer name");
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
    int rc = certs_check_label("job", job, job ? strlen(job) : 0, err);
    if (rc == 0) rc = certs_check_label("region", region, region ? strlen(region) : 0, err);
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
        if ((rc = certs_check_host_name(what, dns[i], err)) < 0) return rc;
    }
    return 0;
}

/* Keep the leaf inside its issuer's lifetime: past the CA's notAfter it would not verify. */
static int clamp_to_issuer(X509 *x, X509 *ca, cirrus_error *err)
{
    const ASN1_TIME *ca_end = X509_get0_notAfter(ca);
    int cmp = ASN1_TIME_compare(X509_get0_notAfter(x), ca_end);
    if (cmp == -2) return certs_ssl_fail(err, CIRRUS_EINVAL, "the CA certificate's notAfter");
    if (cmp > 0 && !X509_set1_notAfter(x, ca_end))
        return certs_ssl_fail(err, CIRRUS_EIO, "leaf notAfter");
    return 0;
}

/* A leaf for `key` (its public half), issued by ca_cert and signed with ca_key: the
 * extensions and names certs_make_leaf documents. The caller checked the arguments. */
static int issue_leaf(X509 *ca_cert, EVP_PKEY *ca_key, EVP_PKEY *key, const char *job,
                      const char *region, const char *common_name, const char *const *dns,
                      size_t n_dns, long nb_s, long na_s, X509 **out, cirrus_error *err)
{
    char uri[sizeof CERTS_URI_SCHEME + 2 * CERTS_MAX_LABEL + 1];
    snprintf(uri, sizeof uri, CERTS_URI_SCHEME "%s/%s", job, region);
    X509 *x = NULL;
    int rc = new_cert(key, common_name, nb_s, na_s, &x, err);
    if (rc == 0 && !X509_set_issuer_name(x, X509_get_subject_name(ca_cert)))
        rc = certs_ssl_fail(err, CIRRUS_EIO, "issuer name");
    if (rc == 0) rc = clamp_to_issuer(x, ca_cert, err);
    if (rc == 0) rc = add_ext(x, ca_cert, NID_basic_constraints, "CA:FALSE", err);
    if (rc == 0) rc = add_ext(x, ca_cert, NID_key_usage, "critical,digitalSignature", err);
    if (rc == 0) rc = add_ext(x, ca_cert, NID_ext_key_usage, "serverAuth,clientAuth", err);
    if (rc == 0) rc = add_ext(x, ca_cert, NID_subject_key_identifier, "hash", err);
    if (rc == 0) rc = add_ext(x, ca_cert, NID_authority_key_identifier, "keyid:always", err);
    if (rc == 0) rc = add_san(x, dns, n_dns, uri, err);
    if (rc == 0 && X509_sign(x, ca_key, EVP_sha256()) <= 0)
        rc = certs_ssl_fail(err, CIRRUS_EIO, "signing the certificate");
    if (rc < 0) X509_free(x);
    *out = rc < 0 ? NULL : x;
    return rc;
}

/* The CA as an issuer: parsed, and checked to be one whose key is its own. */
static int load_issuer(const certs_pair *ca, X509 **ca_cert, EVP_PKEY **ca_key,
                       cirrus_error *err)
{
    *ca_cert = NULL, *ca_key = NULL;
    int rc = certs_parse_cert(ca->cert_pem, "CA certificate", ca_cert, err);
    if (rc == 0) rc = parse_key(ca->key_pem, "CA key", ca_key, err);
    if (rc == 0) rc = check_issuer(*ca_cert, *ca_key, err);
    return rc;
}

static int make_leaf(const certs_pair *ca, const char *job, const char *region,
                     const char *common_name, const char *const *dns, size_t n_dns, long nb_s,
                     long na_s, certs_pair *out, cirrus_error *err)
{
    int rc = check_leaf_args(ca, job, region, common_name, dns, n_dns, nb_s, na_s, err);
    if (rc < 0) return rc;
    X509 *ca_cert = NULL, *x = NULL;
    EVP_PKEY *ca_key = NULL, *key = NULL;
    rc = load_issuer(ca, &ca_cert, &ca_key, err);
    if (rc == 0) rc = gen_key(&key, err);
    if (rc == 0)
        rc = issue_leaf(ca_cert, ca_key, key, job, region, common_name, dns, n_dns, nb_s, na_s,
                        &x, err);
    if (rc == 0) rc = export_pem(x, key, out, err);
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

/* ---- requests: a key made where it is used, its certificate issued elsewhere ---- */

static int parse_request(const char *pem, X509_REQ **out, cirrus_error *err)
{
    BIO *b;
    int rc = pem_bio(pem, "certificate request", &b, err);
    if (rc < 0) return rc;
    *out = PEM_read_bio_X509_REQ(b, NULL, no_passphrase, NULL);
    BIO_free(b);
    return *out ? 0 : certs_ssl_fail(err, CIRRUS_EINVAL, "not a PEM certificate request");
}

static int make_request(const char *region, certs_pair *out, cirrus_error *err)
{
    EVP_PKEY *key = NULL;
    X509_REQ *req = X509_REQ_new();
    X509_NAME *name = req ? X509_REQ_get_subject_name(req) : NULL;
    int rc = req ? gen_key(&key, err) : certs_ssl_fail(err, CIRRUS_ENOMEM, "certificate request");
    /* The subject is a label for people; the issuer decides the identity (certs_sign_request). */
    if (rc == 0 && (!X509_REQ_set_version(req, X509_REQ_VERSION_1) || !name ||
                    !X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_UTF8,
                                                (const unsigned char *)region, -1, -1, 0) ||
                    !X509_REQ_set_pubkey(req, key) || X509_REQ_sign(req, key, EVP_sha256()) <= 0))
        rc = certs_ssl_fail(err, CIRRUS_EIO, "signing the certificate request");
    BIO *rb = rc ? NULL : BIO_new(BIO_s_mem()), *kb = rc ? NULL : BIO_new(BIO_s_secmem());
    if (rc == 0 && (!rb || !kb || !PEM_write_bio_X509_REQ(rb, req) ||
                    !PEM_write_bio_PrivateKey(kb, key, NULL, NULL, 0, NULL, NULL)))
        rc = certs_ssl_fail(err, CIRRUS_EIO, "writing PEM");
    if (rc == 0) {
        out->cert_pem = bio_string(rb);
        out->key_pem = bio_string(kb);
        if (!out->cert_pem || !out->key_pem) {
            certs_pair_free(out);
            rc = cirrus_fail(err, CIRRUS_ENOMEM, "PEM: out of memory");
        }
    }
    BIO_free(rb);
    BIO_free(kb);
    X509_REQ_free(req);
    EVP_PKEY_free(key);
    return rc;
}

int certs_make_request(const char *region, certs_pair *out, cirrus_error *err)
{
    if (!out) return cirrus_fail(err, CIRRUS_EINVAL, "certs_make_request: out is NULL");
    out->cert_pem = out->key_pem = NULL;
    int rc = certs_check_label("region", region, region ? strlen(region) : 0, err);
    if (rc < 0) return rc;
    ERR_clear_error();
    rc = make_request(region, out, err);
    ERR_clear_error();
    return rc;
}

/* The request's key, once its self-signature shows the requester holds the private half,
 * and only of the one kind this PKI issues for (P-256). */
static int request_key(X509_REQ *req, EVP_PKEY **key, cirrus_error *err)
{
    char group[32] = "";
    *key = X509_REQ_get_pubkey(req);
    if (!*key) return certs_ssl_fail(err, CIRRUS_EINVAL, "the certificate request has no key");
    if (X509_REQ_verify(req, *key) != 1)
        return certs_ssl_fail(err, CIRRUS_EINVAL, "the certificate request's signature is not its key's");
    if (!EVP_PKEY_is_a(*key, "EC") ||
        !EVP_PKEY_get_group_name(*key, group, sizeof group, NULL) ||
        (strcmp(group, "prime256v1") && strcmp(group, "P-256"))) {
        ERR_clear_error();
        return cirrus_fail(err, CIRRUS_EINVAL, "the certificate request's key is not P-256");
    }
    return 0;
}

static int sign_request(const certs_pair *ca, const char *request_pem, const char *job,
                        const char *region, const char *common_name, const char *const *dns,
                        size_t n_dns, int days, char **cert_pem, cirrus_error *err)
{
    int rc = check_days(days, err);
    if (rc == 0)
        rc = check_leaf_args(ca, job, region, common_name, dns, n_dns, -BACKDATE_S,
                             days * 86400L, err);
    if (rc < 0) return rc;
    X509_REQ *req = NULL;
    X509 *ca_cert = NULL, *x = NULL;
    EVP_PKEY *ca_key = NULL, *key = NULL;
    certs_pair pem = {0};
    rc = parse_request(request_pem, &req, err);
    if (rc == 0) rc = request_key(req, &key, err);
    if (rc == 0) rc = load_issuer(ca, &ca_cert, &ca_key, err);
    if (rc == 0)
        rc = issue_leaf(ca_cert, ca_key, key, job, region, common_name, dns, n_dns,
                        -BACKDATE_S, days * 86400L, &x, err);
    if (rc == 0) rc = export_pem(x, NULL, &pem, err);
    if (rc == 0) *cert_pem = pem.cert_pem;
    X509_free(x);
    X509_free(ca_cert);
    X509_REQ_free(req);
    EVP_PKEY_free(key);
    EVP_PKEY_free(ca_key);
    return rc;
}

int certs_sign_request(const certs_pair *ca, const char *request_pem, const char *job,
                       const char *region, const char *common_name, const char *const *dns,
                       size_t n_dns, int days, char **cert_pem, cirrus_error *err)
{
    if (!cert_pem) return cirrus_fail(err, CIRRUS_EINVAL, "certs_sign_request: out is NULL");
    *cert_pem = NULL;
    ERR_clear_error();
    int rc = sign_request(ca, request_pem, job, region, common_name, dns, n_dns, days,
                          cert_pem, err);
    ERR_clear_error();
    return rc;
}

int certs_request_matches(const char *cert_pem, const char *request_pem, cirrus_error *err)
{
    X509 *x = NULL;
    X509_REQ *req = NULL;
    ERR_clear_error();
    int rc = certs_parse_cert(cert_pem, "certificate", &x, err);
    if (rc == 0) rc = parse_request(request_pem, &req, err);
    if (rc == 0) rc = EVP_PKEY_eq(X509_get0_pubkey(x), X509_REQ_get0_pubkey(req)) == 1;
    X509_free(x);
    X509_REQ_free(req);
    ERR_clear_error();
    return rc;
}
