/* Tests of common/certs' requests: a gateway key made where it is used (a member cluster)
 * and its certificate issued by whoever holds the job's CA. The issued leaf chains to the
 * CA, names the issuer's identity (not the request's), certifies the request's key (a TLS
 * context takes the pair); a tampered, foreign-key or garbage request is refused. */
#include <string.h>

#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include "../../common/certs.h"
#include "../../trainer/net/tls.h"
#include "test.h"

#define UID "0f8e7d6c-5b4a-4392-8170-6f5e4d3c2b1a"

TEST(certs_request_signed_by_the_job_ca)
{
    cirrus_error err = {0};
    certs_pair ca = {0}, req = {0}, other = {0};
    ASSERT_OK(certs_make_ca("job-1", 30, &ca, &err));
    ASSERT_OK(certs_make_request("r2", &req, &err));
    ASSERT(strstr(req.cert_pem, "-----BEGIN CERTIFICATE REQUEST-----") == req.cert_pem);
    ASSERT(strstr(req.key_pem, "-----BEGIN PRIVATE KEY-----") == req.key_pem);
    const char *dns[] = {"job-1-r2.ns.svc"};
    char *cert = NULL;
    /* Issued for region r2 of job UID: the issuer's identity, whatever the request says. */
    ASSERT_OK(certs_sign_request(&ca, req.cert_pem, UID, "r2", "job-1 r2", dns, 1, 30, &cert,
                                 &err));
    ASSERT_OK(certs_verify(ca.cert_pem, cert, "job-1-r2.ns.svc", &err));
    char job[64], region[64];
    ASSERT_OK(certs_identity(cert, job, sizeof job, region, sizeof region, &err));
    ASSERT(!strcmp(job, UID) && !strcmp(region, "r2"));
    ASSERT_EQ(certs_request_matches(cert, req.cert_pem, &err), 1);
    ASSERT_OK(certs_make_request("r2", &other, &err));
    ASSERT_EQ(certs_request_matches(cert, other.cert_pem, &err), 0);
    ASSERT_EQ(certs_request_matches(cert, "garbage", &err), CIRRUS_EINVAL);
    /* The certificate and the key that never left the requester make a gateway's pair. */
    net_tls_ctx *ctx = NULL;
    ASSERT_OK(net_tls_ctx_new(&ctx, ca.cert_pem, cert, req.key_pem, UID, &err));
    ASSERT(!strcmp(net_tls_ctx_region(ctx), "r2"));
    net_tls_ctx_free(ctx);
    ctx = NULL;
    ASSERT_EQ(net_tls_ctx_new(&ctx, ca.cert_pem, cert, other.key_pem, UID, &err), CIRRUS_EINVAL);
    free(cert);
    certs_pair_free(&ca);
    certs_pair_free(&req);
    certs_pair_free(&other);
}

/* A request whose signature is not its key's (one byte of the signature changed), one of
 * an RSA key, garbage, or bad arguments: refused with a message, nothing issued. */
TEST(certs_request_refusals)
{
    cirrus_error err = {0};
    certs_pair ca = {0}, req = {0};
    char *cert = NULL;
    ASSERT_OK(certs_make_ca("job-1", 30, &ca, &err));
    ASSERT_OK(certs_make_request("r2", &req, &err));
    /* The signature is the DER's tail: flip a bit of it through a parse and re-encode. */
    BIO *b = BIO_new_mem_buf(req.cert_pem, -1);
    X509_REQ *x = PEM_read_bio_X509_REQ(b, NULL, NULL, NULL);
    BIO_free(b);
    ASSERT(x);
    const ASN1_BIT_STRING *sig;
    X509_REQ_get0_signature(x, &sig, NULL);
    ((ASN1_BIT_STRING *)sig)->data[8] ^= 0x01;
    b = BIO_new(BIO_s_mem());
    ASSERT(PEM_write_bio_X509_REQ(b, x));
    char *pem = NULL;
    long n = BIO_get_mem_data(b, &pem);
    char *tampered = strndup(pem, (size_t)n);
    BIO_free(b);
    X509_REQ_free(x);
    ASSERT_EQ(certs_sign_request(&ca, tampered, UID, "r2", "r2", NULL, 0, 30, &cert, &err),
              CIRRUS_EINVAL);
    ASSERT(cert == NULL && strstr(err.msg, "signature"));
    free(tampered);
    /* An RSA key's request, correctly signed. */
    EVP_PKEY *rsa = EVP_RSA_gen(2048);
    x = X509_REQ_new();
    ASSERT(rsa && x && X509_REQ_set_pubkey(x, rsa) && X509_REQ_sign(x, rsa, EVP_sha256()) > 0);
    b = BIO_new(BIO_s_mem());
    ASSERT(PEM_write_bio_X509_REQ(b, x));
    n = BIO_get_mem_data(b, &pem);
    char *rsa_req = strndup(pem, (size_t)n);
    BIO_free(b);
    X509_REQ_free(x);
    EVP_PKEY_free(rsa);
    ASSERT_EQ(certs_sign_request(&ca, rsa_req, UID, "r2", "r2", NULL, 0, 30, &cert, &err),
              CIRRUS_EINVAL);
    ASSERT(strstr(err.msg, "not P-256"));
    free(rsa_req);
    ASSERT_EQ(certs_sign_request(&ca, "-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n", UID, "r2",
                                 "r2", NULL, 0, 30, &cert, &err),
              CIRRUS_EINVAL);
    ASSERT_EQ(certs_sign_request(&ca, req.cert_pem, UID, "R2", "r2", NULL, 0, 30, &cert, &err),
              CIRRUS_EINVAL);
    ASSERT_EQ(certs_sign_request(&req, req.cert_pem, UID, "r2", "r2", NULL, 0, 30, &cert, &err),
              CIRRUS_EINVAL);
    certs_pair_free(&req);
    ASSERT_EQ(certs_make_request("no/slash", &req, &err), CIRRUS_EINVAL);
    ASSERT(req.cert_pem == NULL && req.key_pem == NULL);
    certs_pair_free(&ca);
}
