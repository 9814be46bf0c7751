/* The per-job PKI: what certs_make_ca / certs_make_leaf put into the certificates (read
 * back with OpenSSL, not with our own code), that certs_verify accepts exactly the chains
 * and host names it should, that bad arguments and garbage PEM fail with a message and
 * leave OpenSSL's error queue empty, and that every OpenSSL allocation failure is handled
 * without a leak. */
#include <stddef.h>
#include <string.h>
#include <time.h>

#include <openssl/bio.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include "../../common/certs.h"
#include "../unit/test.h"

static X509 *load_cert(const char *pem)
{
    BIO *b = BIO_new_mem_buf(pem, -1);
    X509 *x = b ? PEM_read_bio_X509(b, NULL, NULL, NULL) : NULL;
    BIO_free(b);
    if (!x) TEST_FAIL("cannot parse certificate PEM");
    return x;
}

static EVP_PKEY *load_key(const char *pem)
{
    BIO *b = BIO_new_mem_buf(pem, -1);
    EVP_PKEY *k = b ? PEM_read_bio_PrivateKey(b, NULL, NULL, NULL) : NULL;
    BIO_free(b);
    if (!k) TEST_FAIL("cannot parse key PEM");
    return k;
}

/* 1 critical, 0 not critical, -1 absent. */
static int ext_critical(X509 *x, int nid)
{
    int i = X509_get_ext_by_NID(x, nid, -1);
    return i < 0 ? -1 : X509_EXTENSION_get_critical(X509_get_ext(x, i));
}

static void subject_cn(X509 *x, char *buf, int n)
{
    buf[0] = '\0';
    ASSERT(X509_NAME_get_text_by_NID(X509_get_subject_name(x), NID_commonName, buf, n) > 0);
}

/* Seconds from now to t (negative: in the past). */
static long secs_from_now(const ASN1_TIME *t)
{
    int days = 0, secs = 0;
    ASSERT(ASN1_TIME_diff(&days, &secs, NULL, t) == 1);
    return (long)days * 86400 + secs;
}

/* The key is ECDSA P-256, PKCS#8 PEM, and belongs to the certificate. */
static void check_key(const certs_pair *p, X509 *x)
{
    ASSERT(strncmp(p->key_pem, "-----BEGIN PRIVATE KEY-----", 27) == 0);
    ASSERT(strncmp(p->cert_pem, "-----BEGIN CERTIFICATE-----", 27) == 0);
    EVP_PKEY *k = load_key(p->key_pem);
    char group[64] = "";
    ASSERT(EVP_PKEY_is_a(k, "EC"));
    ASSERT(EVP_PKEY_get_group_name(k, group, sizeof group, NULL) == 1);
    ASSERT(strcmp(group, "prime256v1") == 0);
    ASSERT(X509_check_private_key(x, k) == 1);
    EVP_PKEY_free(k);
    ASSERT_EQ(X509_get_signature_nid(x), NID_ecdsa_with_SHA256);
    ASSERT_EQ(X509_get_version(x), X509_VERSION_3);
    /* 128 random bits: positive, more than 64 bits long with overwhelming probability. */
    BIGNUM *serial = ASN1_INTEGER_to_BN(X509_get0_serialNumber(x), NULL);
    ASSERT(serial && !BN_is_negative(serial) && BN_num_bits(serial) > 64 &&
           BN_num_bits(serial) <= 128);
    BN_free(serial);
}

static void check_validity(X509 *x, long days)
{
    long nb = secs_from_now(X509_get0_notBefore(x)), na = secs_from_now(X509_get0_notAfter(x));
    ASSERT(nb <= -3600 && nb > -3600 - 60);
    ASSERT(na <= days * 86400 && na > days * 86400 - 60);
}

TEST(certs_ca)
{
    certs_pair ca = {0};
    cirrus_error err = {0};
    ASSERT_OK(certs_make_ca("job-1", 30, &ca, &err));
    ASSERT(ERR_peek_error() == 0);
    X509 *x = load_cert(ca.cert_pem);
    char cn[128];
    subject_cn(x, cn, sizeof cn);
    ASSERT(strcmp(cn, "cirrus job CA job-1") == 0);
    ASSERT(X509_NAME_cmp(X509_get_subject_name(x), X509_get_issuer_name(x)) == 0);
    ASSERT(X509_check_issued(x, x) == X509_V_OK); /* self-signed */
    check_key(&ca, x);
    check_validity(x, 30);

    /* basicConstraints CA:TRUE critical; keyUsage exactly keyCertSign + cRLSign, critical. */
    ASSERT_EQ(X509_check_ca(x), 1);
    ASSERT_EQ(ext_critical(x, NID_basic_constraints), 1);
    BASIC_CONSTRAINTS *bc = X509_get_ext_d2i(x, NID_basic_constraints, NULL, NULL);
    ASSERT(bc && bc->ca);
    BASIC_CONSTRAINTS_free(bc);
    ASSERT_EQ(ext_critical(x, NID_key_usage), 1);
    ASSERT_EQ(X509_get_key_usage(x), KU_KEY_CERT_SIGN | KU_CRL_SIGN);
    ASSERT_EQ(ext_critical(x, NID_subject_key_identifier), 0);
    ASSERT(X509_get0_subject_key_id(x) != NULL);
    ASSERT_EQ(ext_critical(x, NID_ext_key_usage), -1);
    ASSERT_EQ(ext_critical(x, NID_subject_alt_name), -1);

    /* The CA verifies against itself, and not for a host name it does not carry. */
    ASSERT_OK(certs_verify(ca.cert_pem, ca.cert_pem, NULL, &err));
    ASSERT_EQ(certs_verify(ca.cert_pem, ca.cert_pem, "job-1", &err), CIRRUS_EINVAL);

    /* A second CA for the same job: another key, another serial. */
    certs_pair ca2 = {0};
    ASSERT_OK(certs_make_ca("job-1", 30, &ca2, &err));
    X509 *x2 = load_cert(ca2.cert_pem);
    ASSERT(ASN1_INTEGER_cmp(X509_get0_serialNumber(x), X509_get0_serialNumber(x2)) != 0);
    ASSERT(strcmp(ca.key_pem, ca2.key_pem) != 0);
    /* ... which does not vouch for the first, although the names are the same. */
    ASSERT_EQ(certs_verify(ca2.cert_pem, ca.cert_pem, NULL, &err), CIRRUS_EINVAL);
    ASSERT(ERR_peek_error() == 0);
    X509_free(x2);
    X509_free(x);
    certs_pair_free(&ca2);
    certs_pair_free(&ca);
    ASSERT(ca.cert_pem == NULL && ca.key_pem == NULL);
}

static const char *const gw_dns[] = {"gateway", "gateway.job-1.svc",
                                     "gateway.job-1.svc.cluster.local"};

/* A leaf of job-1's region r1, where the test is about the other arguments. */
static int leaf_r1(const certs_pair *ca, const char *cn, const char *const *dns, size_t n,
                   int days, certs_pair *out, cirrus_error *err)
{
    return certs_make_leaf(ca, "job-1", "r1", cn, dns, n, days, out, err);
}

TEST(certs_leaf)
{
    certs_pair ca = {0}, leaf = {0};
    cirrus_error err = {0};
    ASSERT_OK(certs_make_ca("job-1", 30, &ca, &err));
    ASSERT_OK(certs_make_leaf(&ca, "job-1", "us-east", "gateway us-east", gw_dns, 3, 7, &leaf,
                              &err));
    ASSERT(ERR_peek_error() == 0);
    X509 *cax = load_cert(ca.cert_pem), *x = load_cert(leaf.cert_pem);
    char cn[128];
    subject_cn(x, cn, sizeof cn);
    ASSERT(strcmp(cn, "gateway us-east") == 0);
    ASSERT(X509_NAME_cmp(X509_get_issuer_name(x), X509_get_subject_name(cax)) == 0);
    ASSERT(X509_check_issued(cax, x) == X509_V_OK);
    check_key(&leaf, x);
    check_validity(x, 7);
    /* The leaf's key is not the CA's. */
    EVP_PKEY *cak = load_key(ca.key_pem);
    ASSERT(X509_check_private_key(x, cak) != 1);
    ERR_clear_error();
    EVP_PKEY_free(cak);

    /* basicConstraints CA:FALSE; keyUsage digitalSignature critical; both EKUs; AKI = the
     * CA's SKI. */
    ASSERT_EQ(X509_check_ca(x), 0);
    BASIC_CONSTRAINTS *bc = X509_get_ext_d2i(x, NID_basic_constraints, NULL, NULL);
    ASSERT(bc && !bc->ca);
    BASIC_CONSTRAINTS_free(bc);
    ASSERT_EQ(ext_critical(x, NID_key_usage), 1);
    ASSERT_EQ(X509_get_key_usage(x), KU_DIGITAL_SIGNATURE);
    ASSERT_EQ(X509_get_extended_key_usage(x), XKU_SSL_SERVER | XKU_SSL_CLIENT);
    ASSERT(X509_check_purpose(x, X509_PURPOSE_SSL_SERVER, 0) == 1);
    ASSERT(X509_check_purpose(x, X509_PURPOSE_SSL_CLIENT, 0) == 1);
    const ASN1_OCTET_STRING *aki = X509_get0_authority_key_id(x);
    ASSERT(aki && ASN1_OCTET_STRING_cmp(aki, X509_get0_subject_key_id(cax)) == 0);

    /* subjectAltName: exactly the three DNS names, in order, then the URI identity. */
    GENERAL_NAMES *san = X509_get_ext_d2i(x, NID_subject_alt_name, NULL, NULL);
    ASSERT(san && sk_GENERAL_NAME_num(san) == 4);
    for (int i = 0; i < 3; i++) {
        GENERAL_NAME *gn = sk_GENERAL_NAME_value(san, i);
        ASSERT_EQ(gn->type, GEN_DNS);
        ASSERT(strcmp((const char *)ASN1_STRING_get0_data(gn->d.dNSName), gw_dns[i]) == 0);
    }
    GENERAL_NAME *uri = sk_GENERAL_NAME_value(san, 3);
    ASSERT_EQ(uri->type, GEN_URI);
    ASSERT(strcmp((const char *)ASN1_STRING_get0_data(uri->d.uniformResourceIdentifier),
                  "cirrus://job-1/us-east") == 0);
    GENERAL_NAMES_free(san);
    char job[64], region[64];
    ASSERT_OK(certs_identity(leaf.cert_pem, job, sizeof job, region, sizeof region, &err));
    ASSERT(strcmp(job, "job-1") == 0 && strcmp(region, "us-east") == 0);
    ASSERT_OK(certs_identity_x509(x, NULL, 0, region, sizeof region, &err));
    ASSERT(strcmp(region, "us-east") == 0);

    /* Verifies against its CA, for each of its names (case-insensitively, as DNS) ... */
    ASSERT_OK(certs_verify(ca.cert_pem, leaf.cert_pem, NULL, &err));
    for (int i = 0; i < 3; i++)
        ASSERT_OK(certs_verify(ca.cert_pem, leaf.cert_pem, gw_dns[i], &err));
    ASSERT_OK(certs_verify(ca.cert_pem, leaf.cert_pem, "GATEWAY.job-1.svc", &err));
    /* ... not for a name outside the SAN, nor for its CN (SAN only). */
    err.msg[0] = '\0';
    ASSERT_EQ(certs_verify(ca.cert_pem, leaf.cert_pem, "gateway.job-2.svc", &err),
              CIRRUS_EINVAL);
    ASSERT(strstr(err.msg, "not valid for host name \"gateway.job-2.svc\""));
    ASSERT_EQ(certs_verify(ca.cert_pem, leaf.cert_pem, "gateway.job-1", &err), CIRRUS_EINVAL);
    ASSERT_EQ(certs_verify(ca.cert_pem, leaf.cert_pem, "evil.gateway", &err), CIRRUS_EINVAL);
    /* A leaf is not a CA: it does not verify itself, and cannot issue. */
    ASSERT_EQ(certs_verify(leaf.cert_pem, leaf.cert_pem, NULL, &err), CIRRUS_EINVAL);
    certs_pair sub = {0};
    err.msg[0] = '\0';
    ASSERT_EQ(certs_make_leaf(&leaf, "job-1", "r1", "x", gw_dns, 1, 7, &sub, &err), CIRRUS_EINVAL);
    ASSERT(strstr(err.msg, "not a CA"));
    ASSERT(sub.cert_pem == NULL && sub.key_pem == NULL);
    ASSERT(ERR_peek_error() == 0);

    X509_free(x);
    X509_free(cax);
    certs_pair_free(&leaf);
    certs_pair_free(&ca);
}

/* Two CAs for the same job name (a rotation): the names match, the keys do not. */
TEST(certs_other_ca)
{
    certs_pair a = {0}, b = {0}, leaf_a = {0}, leaf_b = {0}, mixed = {0}, out = {0};
    cirrus_error err = {0};
    ASSERT_OK(certs_make_ca("job-1", 30, &a, &err));
    ASSERT_OK(certs_make_ca("job-1", 30, &b, &err));
    ASSERT_OK(certs_make_leaf(&a, "job-1", "r1", "gw", gw_dns, 3, 7, &leaf_a, &err));
    ASSERT_OK(certs_make_leaf(&b, "job-1", "r1", "gw", gw_dns, 3, 7, &leaf_b, &err));
    ASSERT_OK(certs_verify(a.cert_pem, leaf_a.cert_pem, "gateway", &err));
    ASSERT_OK(certs_verify(b.cert_pem, leaf_b.cert_pem, "gateway", &err));
    err.msg[0] = '\0';
    ASSERT_EQ(certs_verify(b.cert_pem, leaf_a.cert_pem, NULL, &err), CIRRUS_EINVAL);
    ASSERT(strstr(err.msg, "does not verify against the CA: "));
    ASSERT_EQ(certs_verify(b.cert_pem, leaf_a.cert_pem, "gateway", &err), CIRRUS_EINVAL);
    ASSERT_EQ(certs_verify(a.cert_pem, leaf_b.cert_pem, "gateway", &err), CIRRUS_EINVAL);
    /* A CA of another job. */
    certs_pair c = {0};
    ASSERT_OK(certs_make_ca("job-2", 30, &c, &err));
    ASSERT_EQ(certs_verify(c.cert_pem, leaf_a.cert_pem, NULL, &err), CIRRUS_EINVAL);
    ASSERT(ERR_peek_error() == 0);

    /* A's certificate with B's key cannot issue. */
    mixed.cert_pem = a.cert_pem;
    mixed.key_pem = b.key_pem;
    err.msg[0] = '\0';
    ASSERT_EQ(leaf_r1(&mixed, "gw", gw_dns, 1, 7, &out, &err), CIRRUS_EINVAL);
    ASSERT(strstr(err.msg, "CA key does not belong"));
    ASSERT(out.cert_pem == NULL && out.key_pem == NULL);
    ASSERT(ERR_peek_error() == 0);

    certs_pair_free(&c);
    certs_pair_free(&leaf_b);
    certs_pair_free(&leaf_a);
    certs_pair_free(&b);
    certs_pair_free(&a);
}

/* A leaf never outlives its CA; long names fit (the CN is cut, the SAN is not). */
TEST(certs_limits)
{
    certs_pair ca = {0}, leaf = {0};
    cirrus_error err = {0};
    ASSERT_OK(certs_make_ca("job-1", 1, &ca, &err));
    ASSERT_OK(certs_make_leaf(&ca, "job-1", "r1", "gw", gw_dns, 1, 365, &leaf, &err));
    X509 *cax = load_cert(ca.cert_pem), *x = load_cert(leaf.cert_pem);
    ASSERT(ASN1_TIME_compare(X509_get0_notAfter(x), X509_get0_notAfter(cax)) == 0);
    ASSERT_OK(certs_verify(ca.cert_pem, leaf.cert_pem, "gateway", &err));
    X509_free(x);
    X509_free(cax);
    certs_pair_free(&leaf);
    certs_pair_free(&ca);

    /* A 253-byte job name and a 253-byte host name of four 63-byte labels. */
    char job[254], host[254];
    memset(job, 'j', 253);
    job[253] = '\0';
    memset(host, 'h', 253);
    host[253] = '\0';
    host[63] = host[127] = host[191] = '.';
    ASSERT_OK(certs_make_ca(job, 36500, &ca, &err));
    cax = load_cert(ca.cert_pem);
    char cn[128];
    subject_cn(cax, cn, sizeof cn);
    ASSERT_EQ(strlen(cn), CERTS_CN_MAX);
    ASSERT(strncmp(cn, "cirrus job CA jjj", 17) == 0);
    check_validity(cax, 36500);
    const char *const names[] = {host, "*.gw.example"};
    ASSERT_OK(certs_make_leaf(&ca, "job-1", "r1", job, names, 2, 36500, &leaf, &err));
    ASSERT_OK(certs_verify(ca.cert_pem, leaf.cert_pem, host, &err));
    ASSERT_OK(certs_verify(ca.cert_pem, leaf.cert_pem, "eu.gw.example", &err));
    ASSERT_EQ(certs_verify(ca.cert_pem, leaf.cert_pem, "a.eu.gw.example", &err), CIRRUS_EINVAL);
    X509_free(cax);
    certs_pair_free(&leaf);

    /* No DNS names: a valid leaf, valid for no host name (its CN is not one); its SAN is
     * the identity alone. */
    ASSERT_OK(certs_make_leaf(&ca, "job-1", "r1", "gateway", NULL, 0, 7, &leaf, &err));
    x = load_cert(leaf.cert_pem);
    GENERAL_NAMES *san = X509_get_ext_d2i(x, NID_subject_alt_name, NULL, NULL);
    ASSERT(san && sk_GENERAL_NAME_num(san) == 1);
    ASSERT_EQ(sk_GENERAL_NAME_value(san, 0)->type, GEN_URI);
    GENERAL_NAMES_free(san);
    X509_free(x);
    ASSERT_OK(certs_verify(ca.cert_pem, leaf.cert_pem, NULL, &err));
    ASSERT_EQ(certs_verify(ca.cert_pem, leaf.cert_pem, "gateway", &err), CIRRUS_EINVAL);
    certs_pair_free(&leaf);

    /* 64 names is the most. */
    const char *many[CERTS_MAX_DNS];
    for (int i = 0; i < CERTS_MAX_DNS; i++) many[i] = "gw.example";
    ASSERT_OK(certs_make_leaf(&ca, "job-1", "r1", "gw", many, CERTS_MAX_DNS, 7, &leaf, &err));
    certs_pair_free(&leaf);
    certs_pair_free(&ca);
}

/* rc is CIRRUS_EINVAL with a message containing want, and out was left empty. */
static void expect_einval(int rc, const cirrus_error *err, const char *want,
                          const certs_pair *out, int line)
{
    if (rc != CIRRUS_EINVAL) TEST_FAIL("line %d: rc %d, want CIRRUS_EINVAL", line, rc);
    if (!strstr(err->msg, want))
        TEST_FAIL("line %d: message \"%s\" lacks \"%s\"", line, err->msg, want);
    if (out && (out->cert_pem || out->key_pem)) TEST_FAIL("line %d: out not empty", line);
    if (ERR_peek_error() != 0) TEST_FAIL("line %d: OpenSSL error queue not empty", line);
}
#define EXPECT_EINVAL(call, want, out)                                                     \
    do {                                                                                   \
        err.msg[0] = '\0';                                                                 \
        expect_einval((call), &err, (want), (out), __LINE__);                              \
    } while (0)

TEST(certs_bad_arguments)
{
    certs_pair ca = {0}, out = {0};
    cirrus_error err = {0};
    char long_name[300];
    memset(long_name, 'a', 254);
    long_name[254] = '\0';

    EXPECT_EINVAL(certs_make_ca(NULL, 30, &out, &err), "job name is empty", &out);
    EXPECT_EINVAL(certs_make_ca("", 30, &out, &err), "job name is empty", &out);
    EXPECT_EINVAL(certs_make_ca(long_name, 30, &out, &err), "254 bytes", &out);
    EXPECT_EINVAL(certs_make_ca("job\n1", 30, &out, &err), "control character", &out);
    EXPECT_EINVAL(certs_make_ca("job", 0, &out, &err), "0 days", &out);
    EXPECT_EINVAL(certs_make_ca("job", -1, &out, &err), "-1 days", &out);
    EXPECT_EINVAL(certs_make_ca("job", 36501, &out, &err), "36501 days", &out);
    EXPECT_EINVAL(certs_make_ca("job", 30, NULL, &err), "out is NULL", NULL);
    ASSERT_EQ(certs_make_ca("job", 0, &out, NULL), CIRRUS_EINVAL); /* err is optional */
    /* Invalid UTF-8 in the CN: OpenSSL's reason is in the message. */
    EXPECT_EINVAL(certs_make_ca("job\xff", 30, &out, &err), "common name", &out);

    ASSERT_OK(certs_make_ca("job-1", 30, &ca, &err));
    const char *dns1[] = {"gw"};
    EXPECT_EINVAL(leaf_r1(NULL, "gw", dns1, 1, 7, &out, &err), "no CA", &out);
    EXPECT_EINVAL(leaf_r1(&ca, NULL, dns1, 1, 7, &out, &err), "common name is empty",
                  &out);
    EXPECT_EINVAL(leaf_r1(&ca, "", dns1, 1, 7, &out, &err), "common name is empty",
                  &out);
    EXPECT_EINVAL(leaf_r1(&ca, long_name, dns1, 1, 7, &out, &err), "254 bytes", &out);
    EXPECT_EINVAL(leaf_r1(&ca, "gw", dns1, 1, 0, &out, &err), "0 days", &out);
    EXPECT_EINVAL(leaf_r1(&ca, "gw", dns1, 1, 36501, &out, &err), "36501", &out);
    EXPECT_EINVAL(leaf_r1(&ca, "gw", NULL, 1, 7, &out, &err), "dns is NULL", &out);
    EXPECT_EINVAL(leaf_r1(&ca, "gw", dns1, 65, 7, &out, &err), "65 DNS names", &out);
    EXPECT_EINVAL(leaf_r1(&ca, "gw", dns1, 1, 7, NULL, &err), "out is NULL", NULL);

    const char *bad_dns[][2] = {
        {NULL, "dns[1]: host name is empty"},
        {"", "dns[1]: host name is empty"},
        {long_name, "dns[1]: host name is 254 bytes"},
        {"gw.example,DNS:evil", "byte 0x2c at 10"},
        {"gw example", "byte 0x20 at 2"},
        {"gw..example", "label of 0 bytes"},
        {".gw", "label of 0 bytes"},
        {"gw.", "label of 0 bytes"},
        {"gw.*.example", "byte 0x2a at 3"},
        {"*", "byte 0x2a at 0"},
        {"gw\xc3\xa9", "byte 0xc3 at 2"},
        {"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa.b", "label of 64 bytes"},
    };
    for (size_t i = 0; i < sizeof bad_dns / sizeof bad_dns[0]; i++) {
        const char *names[] = {"gw", bad_dns[i][0]};
        err.msg[0] = '\0';
        expect_einval(leaf_r1(&ca, "gw", names, 2, 7, &out, &err), &err, bad_dns[i][1],
                      &out, (int)i);
    }

    EXPECT_EINVAL(certs_verify(ca.cert_pem, ca.cert_pem, "", &err), "dns_name: host name is empty",
                  NULL);
    EXPECT_EINVAL(certs_verify(ca.cert_pem, ca.cert_pem, "a b", &err), "dns_name: byte 0x20",
                  NULL);
    EXPECT_EINVAL(certs_verify(NULL, ca.cert_pem, NULL, &err), "CA certificate: no PEM", NULL);
    EXPECT_EINVAL(certs_verify(ca.cert_pem, NULL, NULL, &err), "certificate: no PEM", NULL);

    /* certs_pair_free: NULL-safe, and idempotent on a freed pair. */
    certs_pair_free(NULL);
    certs_pair_free(&out);
    certs_pair_free(&ca);
    certs_pair_free(&ca);
}

/* ---- the job/region identity ---- */

/* x with its subjectAltName replaced by the given URIs (n bytes each, NULs allowed): a
 * forged name, to see certs_identity_x509 read names only the way it should. Unsigned
 * afterwards, which does not matter: the identity is read after the handshake verified. */
static void set_uris(X509 *x, const char *const *uris, const int *lens, int n)
{
    int i = X509_get_ext_by_NID(x, NID_subject_alt_name, -1);
    if (i >= 0) X509_EXTENSION_free(X509_delete_ext(x, i));
    GENERAL_NAMES *names = GENERAL_NAMES_new();
    for (int k = 0; k < n; k++) {
        GENERAL_NAME *gn = GENERAL_NAME_new();
        ASN1_IA5STRING *str = ASN1_IA5STRING_new();
        ASSERT(gn && str && ASN1_STRING_set(str, uris[k], lens[k]));
        GENERAL_NAME_set0_value(gn, GEN_URI, str);
        ASSERT(sk_GENERAL_NAME_push(names, gn));
    }
    ASSERT(X509_add1_ext_i2d(x, NID_subject_alt_name, names, 0, X509V3_ADD_DEFAULT) == 1);
    GENERAL_NAMES_free(names);
}

TEST(certs_identity)
{
    certs_pair ca = {0}, leaf = {0}, out = {0};
    cirrus_error err = {0};
    char job[CERTS_MAX_LABEL + 1], region[CERTS_MAX_LABEL + 1];
    ASSERT_OK(certs_make_ca("job-1", 30, &ca, &err));
    /* The longest names, and DNS labels' every character class. */
    char j63[64], r63[64];
    memset(j63, 'j', 63);
    memset(r63, '9', 63);
    j63[63] = r63[63] = '\0';
    j63[30] = '-';
    ASSERT_OK(certs_make_leaf(&ca, j63, r63, "gw", gw_dns, 1, 7, &leaf, &err));
    ASSERT_OK(certs_identity(leaf.cert_pem, job, sizeof job, region, sizeof region, &err));
    ASSERT(strcmp(job, j63) == 0 && strcmp(region, r63) == 0);
    /* A buffer too small is an error, not a truncated name that might match another. */
    EXPECT_EINVAL(certs_identity(leaf.cert_pem, job, 63, region, sizeof region, &err),
                  "job (63 bytes) does not fit 63", NULL);
    ASSERT(job[0] == '\0');
    certs_pair_free(&leaf);
    /* The CA names no identity; garbage is not a certificate. */
    EXPECT_EINVAL(certs_identity(ca.cert_pem, job, sizeof job, region, sizeof region, &err),
                  "names no cirrus:// identity", NULL);
    EXPECT_EINVAL(certs_identity("garbage", job, sizeof job, NULL, 0, &err),
                  "not a PEM certificate", NULL);
    EXPECT_EINVAL(certs_identity_x509(NULL, job, sizeof job, NULL, 0, &err), "no certificate",
                  NULL);

    /* Names that are not DNS labels never reach a certificate. */
    char j64[65];
    memset(j64, 'j', 64);
    j64[64] = '\0';
    const char *bad[][3] = {
        {NULL, "r1", "job is empty"},        {"", "r1", "job is empty"},
        {"job-1", NULL, "region is empty"},  {j64, "r1", "job is 64 bytes"},
        {"job-1", j64, "region is 64 bytes"}, {"Job", "r1", "job: byte 0x4a at 0"},
        {"job/2", "r1", "job: byte 0x2f at 3"}, {"job-1", "r1/x", "region: byte 0x2f at 2"},
        {"job.1", "r1", "job: byte 0x2e"},   {"-job", "r1", "starts or ends with '-'"},
        {"job-1", "r-", "region \"r-\" starts or ends"}, {"job-1", "r\xc3\xa9", "byte 0xc3"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err.msg[0] = '\0';
        expect_einval(certs_make_leaf(&ca, bad[i][0], bad[i][1], "gw", gw_dns, 1, 7, &out, &err),
                      &err, bad[i][2], &out, (int)i);
    }

    /* Forged names read back: exactly one cirrus:// URI of two labels, or an error. */
    ASSERT_OK(certs_make_leaf(&ca, "job-1", "r1", "gw", gw_dns, 1, 7, &leaf, &err));
    X509 *x = load_cert(leaf.cert_pem);
    const struct {
        const char *uri[2];
        int len[2], n;
        const char *want; /* NULL: accepted as job-1 / r2 */
    } forged[] = {
        {{"https://job-1/r1", "cirrus://job-1/r2"}, {16, 17}, 2, NULL},
        {{"https://job-1/r1"}, {16}, 1, "names no cirrus:// identity"},
        {{"cirrus://job-1/r1", "cirrus://job-1/r2"}, {17, 17}, 2, "names 2 cirrus:// identities"},
        {{"cirrus://job-1"}, {14}, 1, "identity URI has no region"},
        {{"cirrus://job-1/"}, {15}, 1, "certificate's region is empty"},
        {{"cirrus:///r1"}, {12}, 1, "certificate's job is empty"},
        {{"cirrus://job-1/r1/x"}, {19}, 1, "region: byte 0x2f at 2"},
        {{"cirrus://job-1/r1\0x"}, {19}, 1, "region: byte 0x00 at 2"},
        {{"cirrus://JOB-1/r1"}, {17}, 1, "job: byte 0x4a at 0"},
        {{"cirrus://job-1:443/r1"}, {21}, 1, "job: byte 0x3a at 5"},
    };
    for (size_t i = 0; i < sizeof forged / sizeof forged[0]; i++) {
        set_uris(x, forged[i].uri, forged[i].len, forged[i].n);
        err.msg[0] = '\0';
        int rc = certs_identity_x509(x, job, sizeof job, region, sizeof region, &err);
        if (!forged[i].want) {
            ASSERT_OK(rc);
            ASSERT(strcmp(job, "job-1") == 0 && strcmp(region, "r2") == 0);
        } else {
            expect_einval(rc, &err, forged[i].want, NULL, 100 + (int)i);
            ASSERT(job[0] == '\0' && region[0] == '\0');
        }
    }
    X509_free(x);
    certs_pair_free(&leaf);
    certs_pair_free(&ca);
}

/* Validity given in seconds from now: an expired leaf (for the TLS tests), and the limits. */
TEST(certs_leaf_validity)
{
    certs_pair ca = {0}, leaf = {0}, out = {0};
    cirrus_error err = {0};
    ASSERT_OK(certs_make_ca("job-1", 30, &ca, &err));
    ASSERT_OK(certs_make_leaf_valid(&ca, "job-1", "r1", "gw", gw_dns, 1, -2 * 86400, -86400,
                                    &leaf, &err));
    X509 *x = load_cert(leaf.cert_pem);
    long nb = secs_from_now(X509_get0_notBefore(x)), na = secs_from_now(X509_get0_notAfter(x));
    ASSERT(nb <= -2 * 86400 && nb > -2 * 86400 - 60);
    ASSERT(na <= -86400 && na > -86400 - 60);
    X509_free(x);
    EXPECT_EINVAL(certs_verify(ca.cert_pem, leaf.cert_pem, NULL, &err), "expired", NULL);
    certs_pair_free(&leaf);
    /* Not valid for another hour. */
    ASSERT_OK(certs_make_leaf_valid(&ca, "job-1", "r1", "gw", gw_dns, 1, 3600, 7200, &leaf,
                                    &err));
    EXPECT_EINVAL(certs_verify(ca.cert_pem, leaf.cert_pem, NULL, &err), "not yet valid", NULL);
    certs_pair_free(&leaf);
    /* Past the CA's end: clamped to it, as certs_make_leaf does. */
    ASSERT_OK(certs_make_leaf_valid(&ca, "job-1", "r1", "gw", gw_dns, 1, 0, 365 * 86400L, &leaf,
                                    &err));
    X509 *cax = load_cert(ca.cert_pem);
    x = load_cert(leaf.cert_pem);
    ASSERT(ASN1_TIME_compare(X509_get0_notAfter(x), X509_get0_notAfter(cax)) == 0);
    X509_free(x);
    X509_free(cax);
    certs_pair_free(&leaf);

    EXPECT_EINVAL(certs_make_leaf_valid(&ca, "job-1", "r1", "gw", gw_dns, 1, 60, 60, &out, &err),
                  "validity ends (60 s) before it starts (60 s)", &out);
    EXPECT_EINVAL(certs_make_leaf_valid(&ca, "job-1", "r1", "gw", gw_dns, 1, 0,
                                        36501 * 86400L, &out, &err),
                  "outside +-36500 days", &out);
    EXPECT_EINVAL(certs_make_leaf_valid(&ca, "job-1", "r1", "gw", gw_dns, 1, -36501 * 86400L,
                                        0, &out, &err),
                  "outside +-36500 days", &out);
    certs_pair_free(&ca);
}

/* Change one base64 character inside the signature, the end of the DER: 48 characters into
 * the second-to-last line, a full one, which is 3 to 64 bytes from the end of a 70-odd
 * byte ECDSA signature, and away from any '=' padding. */
static void corrupt_signature(char *pem)
{
    char *p = strstr(pem, "\n-----END");
    ASSERT(p);
    int lines = 0;
    while (p > pem && lines < 2) /* back to the '\n' before the second-to-last line */
        if (*--p == '\n') lines++;
    ASSERT(lines == 2 && strchr(p + 1, '\n') - (p + 1) == 64);
    p += 1 + 48;
    *p = *p == 'A' ? 'B' : 'A';
}

TEST(certs_garbage_pem)
{
    certs_pair ca = {0}, out = {0};
    cirrus_error err = {0};
    ASSERT_OK(certs_make_ca("job-1", 30, &ca, &err));
    /* A stale error someone else left must not be reported as ours. */
    ERR_raise_data(ERR_LIB_USER, 1, "stale");

    EXPECT_EINVAL(certs_verify("garbage", ca.cert_pem, NULL, &err),
                  "CA certificate is not a PEM certificate: error:", NULL);
    ASSERT(strstr(err.msg, "no start line"));
    EXPECT_EINVAL(certs_verify(ca.cert_pem, "garbage", NULL, &err),
                  "certificate is not a PEM certificate", NULL);
    const char *bad_body = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
    EXPECT_EINVAL(certs_verify(ca.cert_pem, bad_body, NULL, &err), "not a PEM certificate",
                  NULL);
    /* Truncated half-way; and a key where a certificate should be. */
    size_t n = strlen(ca.cert_pem);
    char *half = strndup(ca.cert_pem, n / 2);
    EXPECT_EINVAL(certs_verify(ca.cert_pem, half, NULL, &err), "not a PEM certificate", NULL);
    EXPECT_EINVAL(certs_verify(ca.key_pem, ca.cert_pem, NULL, &err), "not a PEM certificate",
                  NULL);
    /* One changed character in the signature: parses, does not verify (the CA's own
     * signature is checked too when it verifies itself). */
    char *flipped = strdup(ca.cert_pem);
    corrupt_signature(flipped);
    EXPECT_EINVAL(certs_verify(flipped, flipped, NULL, &err), "signature failure", NULL);
    certs_pair leaf = {0};
    ASSERT_OK(certs_make_leaf(&ca, "job-1", "r1", "gw", gw_dns, 1, 7, &leaf, &err));
    char *bad_leaf = strdup(leaf.cert_pem);
    corrupt_signature(bad_leaf);
    ASSERT_OK(certs_verify(ca.cert_pem, leaf.cert_pem, NULL, &err));
    EXPECT_EINVAL(certs_verify(ca.cert_pem, bad_leaf, NULL, &err), "signature failure", NULL);
    free(bad_leaf);
    certs_pair_free(&leaf);

    certs_pair bad = {half, ca.key_pem};
    EXPECT_EINVAL(certs_make_leaf(&bad, "job-1", "r1", "gw", gw_dns, 1, 7, &out, &err),
                  "CA certificate is not a PEM certificate", &out);
    bad.cert_pem = ca.cert_pem;
    bad.key_pem = "garbage";
    EXPECT_EINVAL(certs_make_leaf(&bad, "job-1", "r1", "gw", gw_dns, 1, 7, &out, &err),
                  "CA key is not a PEM private key", &out);
    bad.key_pem = ca.cert_pem;
    EXPECT_EINVAL(certs_make_leaf(&bad, "job-1", "r1", "gw", gw_dns, 1, 7, &out, &err),
                  "CA key is not a PEM private key", &out);
    /* An encrypted key is refused, without prompting for a passphrase. */
    EVP_PKEY *k = load_key(ca.key_pem);
    BIO *b = BIO_new(BIO_s_mem());
    ASSERT(PEM_write_bio_PKCS8PrivateKey(b, k, EVP_aes_128_cbc(), "pw", 2, NULL, NULL) == 1);
    char *enc = NULL;
    long len = BIO_get_mem_data(b, &enc);
    char *enc_pem = strndup(enc, (size_t)len);
    BIO_free(b);
    EVP_PKEY_free(k);
    bad.key_pem = enc_pem;
    EXPECT_EINVAL(certs_make_leaf(&bad, "job-1", "r1", "gw", gw_dns, 1, 7, &out, &err),
                  "CA key is not a PEM private key", &out);

    free(enc_pem);
    free(flipped);
    free(half);
    certs_pair_free(&ca);
}

/* ---- every OpenSSL allocation failing in turn ---- */

/* OpenSSL's allocator, counting live blocks and failing the fail_at'th call. A header in
 * front of each block keeps realloc simple. */
static long mem_live, mem_fail_at = -1, mem_calls;
static int mem_failed;
typedef union { size_t n; max_align_t align; } mem_hdr;

static void *mem_alloc(size_t n, const char *file, int line)
{
    (void)file, (void)line;
    if (++mem_calls == mem_fail_at) {
        mem_failed = 1;
        return NULL;
    }
    mem_hdr *h = malloc(sizeof *h + n);
    if (!h) return NULL;
    h->n = n;
    mem_live++;
    return h + 1;
}

static void mem_free(void *p, const char *file, int line)
{
    (void)file, (void)line;
    if (!p) return;
    mem_live--;
    free((mem_hdr *)p - 1);
}

static void *mem_realloc(void *p, size_t n, const char *file, int line)
{
    if (!p) return mem_alloc(n, file, line);
    if (n == 0) {
        mem_free(p, file, line);
        return NULL;
    }
    if (++mem_calls == mem_fail_at) {
        mem_failed = 1;
        return NULL;
    }
    mem_hdr *h = realloc((mem_hdr *)p - 1, sizeof *h + n);
    if (!h) return NULL;
    h->n = n;
    return h + 1;
}

/* Run op with the n'th OpenSSL allocation failing, for n = 1, 1 + stride, ... until op
 * makes fewer allocations than n. Each run fails cleanly (negative status, a message, out
 * empty, the error queue empty) or, where OpenSSL got by without the memory, succeeds with
 * a certificate that verifies. Live blocks may grow by what OpenSSL caches on the way, not
 * by a leak per failure. valgrind shows leaks exactly; this is the check that runs always. */
static void sweep(int op, const certs_pair *ca, long stride)
{
    const char *const dns[] = {"gateway", "gw.example"};
    cirrus_error err;
    long live0 = mem_live, failures = 0;
    for (long n = 1;; n += stride) {
        certs_pair out = {0};
        err.msg[0] = '\0';
        mem_calls = 0;
        mem_failed = 0;
        mem_fail_at = n;
        int rc = op == 0   ? certs_make_ca("job-1", 7, &out, &err)
                 : op == 1 ? certs_make_leaf(ca, "job-1", "r1", "gw", dns, 2, 7, &out, &err)
                           : certs_verify(ca->cert_pem, ca->cert_pem, NULL, &err);
        mem_fail_at = -1;
        if (!mem_failed) {
            ASSERT_OK(rc);
            certs_pair_free(&out);
            break;
        }
        ASSERT(ERR_peek_error() == 0);
        if (rc < 0) {
            failures++;
            if (!err.msg[0]) TEST_FAIL("op %d, allocation %ld: rc %d without a message", op, n, rc);
            ASSERT(out.cert_pem == NULL && out.key_pem == NULL);
        } else if (op == 0) {
            ASSERT_OK(certs_verify(out.cert_pem, out.cert_pem, NULL, &err));
        } else if (op == 1) {
            ASSERT_OK(certs_verify(ca->cert_pem, out.cert_pem, "gw.example", &err));
        }
        certs_pair_free(&out);
    }
    ASSERT(failures > 10);
    if (mem_live - live0 > 32)
        TEST_FAIL("op %d: %ld OpenSSL blocks more after %ld failed calls", op, mem_live - live0,
                  failures);
}

TEST_T(certs_allocation_failures, 300)
{
    /* Only possible before OpenSSL's first allocation: true in the forked test child unless
     * something initialised OpenSSL at start-up. */
    if (!CRYPTO_set_mem_functions(mem_alloc, mem_realloc, mem_free))
        TEST_SKIP("OpenSSL allocated before the test started");
    certs_pair ca = {0};
    cirrus_error err;
    /* Twice first, so OpenSSL's one-time set-up (providers, error strings) is done. */
    for (int i = 0; i < 2; i++) {
        ASSERT_OK(certs_make_ca("job-1", 7, &ca, &err));
        certs_pair leaf = {0};
        ASSERT_OK(leaf_r1(&ca, "gw", (const char *const[]){"gw"}, 1, 7, &leaf, &err));
        ASSERT_OK(certs_verify(ca.cert_pem, leaf.cert_pem, "gw", &err));
        certs_pair_free(&leaf);
        if (i == 0) certs_pair_free(&ca);
    }
    /* Every 7th allocation keeps this to seconds (a sweep of each one was valgrind-clean). */
    for (int op = 0; op < 3; op++) sweep(op, &ca, 7);
    certs_pair_free(&ca);
}
