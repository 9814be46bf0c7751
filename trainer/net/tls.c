#include "tls.h"

#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <openssl/bio.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>
#include <openssl/x509v3.h>

#define TLS_FILE_MAX (64u << 10) /* our PEM files are under 1 KiB: a bigger one is a mistake */
/* A frame header and the start of its payload are written as one record (writev below):
 * alone, the 32-byte header would cost a 22-byte record overhead and a syscall of its own. */
#define TLS_COALESCE 16384 /* TLS's largest record payload */
/* Room for one record on the wire: the payload, header, content type, tag, and a margin. */
#define TLS_RECORD_ROOM (16384 + 256)
/* Records go out, and come in, up to 16 per syscall rather than one: a syscall per 16 KiB
 * is a large share of a bulk transfer's cost (tls_throughput in tests/unit/test_tls.c).
 * The reading side is ours, not OpenSSL's read-ahead: that one moves everything still
 * buffered to the front of its buffer before each record (for alignment), which with 16
 * records buffered copies the stream 8 times over. */
#define TLS_IN_BUFFER (16 * TLS_RECORD_ROOM)
#define TLS_OUT_BUFFER (16 * TLS_RECORD_ROOM)

struct net_tls_ctx {
    SSL_CTX *ssl;
    char job[CERTS_MAX_LABEL + 1];   /* every peer's leaf must name it */
    char region[NET_TLS_REGION_MAX]; /* the one this gateway's own leaf names */
};

/* A connection's TLS state, the net_conn's transport state once the handshake starts. Its
 * socket I/O goes through the TCP transport (net_tcp_transport), which counts the bytes. */
typedef struct tls_conn {
    SSL *ssl;
    int established; /* the handshake succeeded: reads and writes are allowed */
    int fatal;       /* failed for good: no more calls on ssl but SSL_free, and */
    int fatal_errno; /* what every later read or write repeats (0: the end of the stream) */
    int eof;         /* the socket read returned 0 */
    int io_errno;    /* errno of the last failed socket call, kept past OpenSSL */
    char job[CERTS_MAX_LABEL + 1];
    char expect[NET_TLS_REGION_MAX]; /* "" when any region of the job will do */
    char peer_region[NET_TLS_REGION_MAX];
    char why[192];   /* why the verify callback refused the peer's certificate */
    char error[192]; /* OpenSSL's reason for the last failed read or write */
    /* Once established, records OpenSSL writes collect in out (bio_write) and go to the
     * socket together (flush_out). unreported: plaintext bytes of the last writev whose
     * records did not all get out; that writev said EAGAIN, and its retry reports them. */
    uint8_t *out;
    size_t out_off, out_len, unreported;
    /* Socket bytes read ahead, handed to OpenSSL as it asks for them (bio_read). */
    uint8_t *in;
    size_t in_off, in_len;
    uint8_t wbuf[TLS_COALESCE];
} tls_conn;

static tls_conn *state(const net_conn *c) { return net_conn_transport_state(c); }

/* The first queued OpenSSL error as one line ("" if none), and the queue emptied. */
static void ssl_error_line(char *buf, size_t size)
{
    unsigned long e = ERR_get_error();
    buf[0] = '\0';
    if (e) ERR_error_string_n(e, buf, size);
    ERR_clear_error();
}

/* ---- a BIO over the TCP transport: OpenSSL's socket I/O, counted by conn.c ---- */

/* Send what is collected in out: 0 once it is all on the socket, else -1 with errno
 * (EAGAIN: the socket is full, the rest stays for the next call). */
static int flush_out(net_conn *c, tls_conn *t)
{
    while (t->out_off < t->out_len) {
        struct iovec v = {.iov_base = t->out + t->out_off, .iov_len = t->out_len - t->out_off};
        long w = net_tcp_transport.writev(c, &v, 1);
        if (w > 0) {
            t->out_off += (size_t)w;
        } else if (w == 0 || errno != EINTR) {
            t->io_errno = w == 0 ? EPIPE : errno;
            errno = t->io_errno;
            return -1;
        }
    }
    t->out_off = t->out_len = 0;
    return 0;
}

static int bio_write(BIO *b, const char *data, size_t len, size_t *written)
{
    net_conn *c = BIO_get_data(b);
    tls_conn *t = state(c);
    BIO_clear_retry_flags(b);
    if (t->out) { /* established: collect (the handshake's flights go straight out) */
        if (t->out_len == TLS_OUT_BUFFER && flush_out(c, t) < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK) BIO_set_retry_write(b);
            return 0;
        }
        size_t n = len < TLS_OUT_BUFFER - t->out_len ? len : TLS_OUT_BUFFER - t->out_len;
        memcpy(t->out + t->out_len, data, n);
        t->out_len += n;
        *written = n;
        return 1;
    }
    struct iovec iov = {.iov_base = (void *)data, .iov_len = len};
    long w;
    do w = net_tcp_transport.writev(c, &iov, 1);
    while (w < 0 && errno == EINTR);
    if (w > 0) {
        *written = (size_t)w;
        return 1;
    }
    t->io_errno = w < 0 ? errno : EPIPE;
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) BIO_set_retry_write(b);
    return 0;
}

/* OpenSSL asks for a record's 5-byte header, then its body: both come from in, which one
 * recv fills with as much as the socket has. */
static int bio_read(BIO *b, char *data, size_t len, size_t *readbytes)
{
    net_conn *c = BIO_get_data(b);
    tls_conn *t = state(c);
    long r = 0;
    BIO_clear_retry_flags(b);
    if (t->in_off == t->in_len) {
        t->in_off = t->in_len = 0;
        do r = net_tcp_transport.read(c, t->in, TLS_IN_BUFFER);
        while (r < 0 && errno == EINTR);
        if (r > 0) t->in_len = (size_t)r;
    }
    if (t->in_off < t->in_len) {
        size_t n = len < t->in_len - t->in_off ? len : t->in_len - t->in_off;
        memcpy(data, t->in + t->in_off, n);
        t->in_off += n;
        *readbytes = n;
        return 1;
    }
    t->io_errno = r < 0 ? errno : 0;
    t->eof = r == 0;
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) BIO_set_retry_read(b);
    return 0;
}

static long bio_ctrl(BIO *b, int cmd, long num, void *ptr)
{
    (void)num, (void)ptr;
    const tls_conn *t = state(BIO_get_data(b));
    switch (cmd) {
    case BIO_CTRL_FLUSH: return 1; /* out is sent by the transport's calls, which wait */
    case BIO_CTRL_EOF: return t->eof;
    case BIO_CTRL_PENDING: return (long)(t->in_len - t->in_off);
    default: return 0;
    }
}

static BIO_METHOD *bio_method;
static pthread_once_t bio_once = PTHREAD_ONCE_INIT;

/* Made once and kept for the process (a few bytes, reachable, so no leak to report). */
static void bio_method_init(void)
{
    int index = BIO_get_new_index();
    BIO_METHOD *m = index < 0 ? NULL : BIO_meth_new(index | BIO_TYPE_SOURCE_SINK, "net_conn");
    if (m && (!BIO_meth_set_write_ex(m, bio_write) || !BIO_meth_set_read_ex(m, bio_read) ||
              !BIO_meth_set_ctrl(m, bio_ctrl))) {
        BIO_meth_free(m);
        m = NULL;
    }
    bio_method = m;
    ERR_clear_error();
}

/* ---- the TLS transport ---- */

/* A failed SSL_read / SSL_write as conn.c's transports report failures: -1 with errno
 * (EAGAIN when OpenSSL waits on the socket, either way: TLS 1.3 without renegotiation or
 * post-handshake authentication wants the direction it is doing), or 0 at the end of the
 * stream. */
static long io_fail(tls_conn *t, int ret, int writing)
{
    int e = SSL_get_error(t->ssl, ret), code;
    switch (e) {
    case SSL_ERROR_WANT_READ:
    case SSL_ERROR_WANT_WRITE:
        code = EAGAIN;
        break;
    case SSL_ERROR_ZERO_RETURN: /* close_notify, or the socket's end: see net_tls_ctx_new */
        code = writing ? EPIPE : 0;
        break;
    case SSL_ERROR_SYSCALL: /* the socket failed, or ended with records cut short */
        code = t->io_errno ? t->io_errno : writing ? EPIPE : 0;
        t->fatal = 1, t->fatal_errno = code;
        break;
    default: /* SSL_ERROR_SSL: a bad record (tampering), an alert, a protocol error */
        ssl_error_line(t->error, sizeof t->error);
        code = EPROTO;
        t->fatal = 1, t->fatal_errno = code;
    }
    ERR_clear_error();
    if (code == 0) return 0;
    errno = code;
    return -1;
}

/* Reads and writes on a connection whose handshake failed (never plaintext), or after a
 * fatal error (the same answer again: the end, the socket's errno, or OpenSSL's reason). */
static long dead(tls_conn *t, int writing)
{
    if (!t->established) {
        snprintf(t->error, sizeof t->error, "TLS: the handshake failed");
        errno = EPROTO;
        return -1;
    }
    if (t->fatal_errno == 0 && !writing) return 0;
    errno = t->fatal_errno ? t->fatal_errno : EPIPE;
    return -1;
}

static long tls_read(net_conn *c, void *buf, size_t n)
{
    tls_conn *t = state(c);
    if (!t->established || t->fatal) return dead(t, 0);
    t->error[0] = '\0';
    t->io_errno = 0;
    size_t got = 0;
    long r = SSL_read_ex(t->ssl, buf, n, &got) ? (long)got : io_fail(t, 0, 0);
    if (t->out_len > t->out_off) { /* a record a read made OpenSSL write (a KeyUpdate) */
        int e = errno;
        flush_out(c, t); /* best-effort: the next write sends the rest first */
        errno = e;
    }
    return r;
}

/* A send of collected records that stopped: -1 with errno. A full socket leaves done bytes
 * to report on the retry; anything else ends the session. */
static long write_fail(tls_conn *t, size_t done)
{
    if (errno == EAGAIN || errno == EWOULDBLOCK)
        t->unreported += done;
    else
        t->fatal = 1, t->fatal_errno = errno;
    return -1;
}

/* The next SSL_write's bytes at iovec i, offset off: at most one record's worth, straight
 * from the iovec, or gathered into wbuf when a short remainder is followed by more (a frame
 * header with the start of its payload), so a record is never wasted on a few bytes. */
static const void *next_chunk(tls_conn *t, const struct iovec *iov, int iovcnt, int i,
                              size_t off, size_t *len)
{
    size_t left = iov[i].iov_len - off;
    if (left >= TLS_COALESCE || i + 1 == iovcnt) {
        *len = left < TLS_COALESCE ? left : TLS_COALESCE;
        return (const uint8_t *)iov[i].iov_base + off;
    }
    size_t n = 0;
    for (; i < iovcnt && n < TLS_COALESCE; i++, off = 0) {
        size_t k = iov[i].iov_len - off < TLS_COALESCE - n ? iov[i].iov_len - off
                                                           : TLS_COALESCE - n;
        memcpy(t->wbuf + n, (const uint8_t *)iov[i].iov_base + off, k);
        n += k;
    }
    *len = n;
    return t->wbuf;
}

/* Up to TLS_OUT_BUFFER of records per call, one record per SSL_write, then one send. The
 * bytes are reported written only once their records are on the socket: if the send stops
 * short, this says EAGAIN and the retry (conn.c's write_all retries with the same iovecs
 * after waiting) finishes sending and reports them. A retry after OpenSSL's own WANT_WRITE
 * starts at the same place with the same bytes, as OpenSSL requires. */
static long tls_writev(net_conn *c, const struct iovec *iov, int iovcnt)
{
    tls_conn *t = state(c);
    if (!t->established || t->fatal) return dead(t, 1);
    t->error[0] = '\0';
    t->io_errno = 0;
    if (t->unreported) {
        if (flush_out(c, t) < 0) return write_fail(t, 0);
        size_t n = t->unreported;
        t->unreported = 0;
        return (long)n;
    }
    size_t done = 0, off = 0;
    int i = 0;
    while (i < iovcnt && TLS_OUT_BUFFER - t->out_len >= TLS_RECORD_ROOM) {
        if (off == iov[i].iov_len) {
            i++, off = 0;
            continue;
        }
        size_t len, w = 0;
        const void *p = next_chunk(t, iov, iovcnt, i, off, &len);
        if (!SSL_write_ex(t->ssl, p, len, &w)) {
            long r = io_fail(t, 0, 1);
            if (done == 0 || t->fatal) return r;
            break; /* OpenSSL waits for the socket: send what it took */
        }
        done += w;
        for (; w > 0 && i < iovcnt; i++, off = 0) { /* step over the w bytes written */
            size_t k = iov[i].iov_len - off;
            if (w < k) {
                off += w;
                break;
            }
            w -= k;
        }
    }
    if (flush_out(c, t) < 0) return write_fail(t, done);
    return (long)done;
}

/* Records already read (ours, in) or plaintext not yet returned (OpenSSL's): conn.c must
 * not wait on the socket for them. */
static int tls_pending(const net_conn *c)
{
    const tls_conn *t = state(c);
    return t->established && !t->fatal && (t->in_off < t->in_len || SSL_has_pending(t->ssl));
}

static const char *tls_last_error(const net_conn *c)
{
    const tls_conn *t = state(c);
    return t->error[0] ? t->error : NULL;
}

/* close_notify best-effort: sent if the socket takes it now, never waited for (the peer may
 * be gone, and a close must not block). Not after a fatal error, as OpenSSL requires. */
static void tls_close(net_conn *c)
{
    tls_conn *t = state(c);
    if (t->established && !t->fatal) {
        SSL_shutdown(t->ssl);
        flush_out(c, t);
    }
    SSL_free(t->ssl); /* and the BIO */
    ERR_clear_error();
    OPENSSL_cleanse(t->wbuf, sizeof t->wbuf);
    free(t->out);
    free(t->in);
    free(t);
    net_conn_set_transport(c, &net_tcp_transport, NULL);
    net_tcp_transport.close(c);
}

static const net_transport tls_transport = {.name = "tls",
                                            .read = tls_read,
                                            .writev = tls_writev,
                                            .close = tls_close,
                                            .pending = tls_pending,
                                            .last_error = tls_last_error};

const char *net_tls_cipher(const net_conn *c)
{
    if (!c || net_conn_transport(c) != &tls_transport) return NULL;
    const tls_conn *t = state(c);
    return t->established && !t->fatal ? SSL_get_cipher_name(t->ssl) : NULL;
}

/* ---- verifying the peer ---- */

/* The reason a chain did not verify, in the words of net_tls_connect's contract. */
static void describe_verify_error(int code, char *why, size_t size)
{
    const char *s = X509_verify_cert_error_string(code);
    switch (code) {
    case X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT:
    case X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT_LOCALLY:
    case X509_V_ERR_UNABLE_TO_VERIFY_LEAF_SIGNATURE:
    case X509_V_ERR_DEPTH_ZERO_SELF_SIGNED_CERT:
    case X509_V_ERR_SELF_SIGNED_CERT_IN_CHAIN:
    case X509_V_ERR_CERT_CHAIN_TOO_LONG: /* depth 0: only leaves the CA signed itself */
        snprintf(why, size, "unknown CA: not issued by this job's CA (%s)", s);
        break;
    case X509_V_ERR_CERT_HAS_EXPIRED:
        snprintf(why, size, "expired");
        break;
    case X509_V_ERR_CERT_NOT_YET_VALID:
        snprintf(why, size, "not yet valid");
        break;
    default:
        snprintf(why, size, "%s", s);
    }
}

/* OpenSSL's chain verification first, then, for the leaf, the job and region it names. The
 * reason for a refusal goes to the connection's state, for the handshake's message. */
static int verify_cb(int ok, X509_STORE_CTX *xs)
{
    SSL *ssl = X509_STORE_CTX_get_ex_data(xs, SSL_get_ex_data_X509_STORE_CTX_idx());
    tls_conn *t = ssl ? SSL_get_app_data(ssl) : NULL;
    if (!t) return 0;
    if (!ok) {
        if (!t->why[0])
            describe_verify_error(X509_STORE_CTX_get_error(xs), t->why, sizeof t->why);
        return 0;
    }
    if (X509_STORE_CTX_get_error_depth(xs) > 0) return 1; /* the CA: nothing more to check */
    char job[CERTS_MAX_LABEL + 1], region[NET_TLS_REGION_MAX];
    cirrus_error e = {0};
    if (certs_identity_x509(X509_STORE_CTX_get_current_cert(xs), job, sizeof job, region,
                            sizeof region, &e) != 0)
        snprintf(t->why, sizeof t->why, "%.180s", e.msg);
    else if (strcmp(job, t->job) != 0)
        snprintf(t->why, sizeof t->why, "it is for job '%s', not '%s'", job, t->job);
    else if (t->expect[0] && strcmp(region, t->expect) != 0)
        snprintf(t->why, sizeof t->why, "it is for region '%s', not '%s'", region, t->expect);
    else {
        memcpy(t->peer_region, region, sizeof region);
        return 1;
    }
    /* CERT_REJECTED: the peer is sent a bad_certificate alert. */
    X509_STORE_CTX_set_error(xs, X509_V_ERR_CERT_REJECTED);
    return 0;
}

/* Alerts by which a peer refused our certificate (or found none it liked). */
static int certificate_alert(int reason)
{
    switch (reason) {
    case SSL_R_SSLV3_ALERT_BAD_CERTIFICATE:
    case SSL_R_SSLV3_ALERT_CERTIFICATE_EXPIRED:
    case SSL_R_SSLV3_ALERT_CERTIFICATE_REVOKED:
    case SSL_R_SSLV3_ALERT_CERTIFICATE_UNKNOWN:
    case SSL_R_SSLV3_ALERT_UNSUPPORTED_CERTIFICATE:
    case SSL_R_TLSV1_ALERT_UNKNOWN_CA:
    case SSL_R_TLSV1_ALERT_ACCESS_DENIED:
    case SSL_R_TLSV13_ALERT_CERTIFICATE_REQUIRED:
        return 1;
    default:
        return 0;
    }
}

/* The message and status for a handshake that failed with SSL_get_error's e. */
static int handshake_fail(net_conn *c, tls_conn *t, int e, cirrus_error *err)
{
    unsigned long first = ERR_peek_error();
    int reason = ERR_GET_LIB(first) == ERR_LIB_SSL ? ERR_GET_REASON(first) : 0;
    const char *alert = ERR_reason_error_string(first);
    char line[160], why[256];
    int code = CIRRUS_EINVAL;
    ssl_error_line(line, sizeof line);
    if (t->why[0])
        snprintf(why, sizeof why, "peer certificate refused: %s", t->why);
    else if (reason == SSL_R_PEER_DID_NOT_RETURN_A_CERTIFICATE)
        snprintf(why, sizeof why, "the peer sent no certificate");
    else if (certificate_alert(reason))
        snprintf(why, sizeof why, "the peer refused us: %s", alert ? alert : line);
    else if (e == SSL_ERROR_SYSCALL && !line[0] && t->io_errno != 0 &&
             t->io_errno != ECONNRESET && t->io_errno != EPIPE) {
        code = CIRRUS_EIO;
        snprintf(why, sizeof why, "%s", strerror(t->io_errno));
    } else if (e == SSL_ERROR_ZERO_RETURN || (e == SSL_ERROR_SYSCALL && !line[0])) {
        code = CIRRUS_ECLOSED;
        snprintf(why, sizeof why, "the peer closed the connection");
    } else {
        code = CIRRUS_ECORRUPT;
        snprintf(why, sizeof why, "not a TLS 1.3 peer: %s", line[0] ? line : "no reason given");
    }
    return cirrus_fail(err, code, "TLS handshake with %s: %s", net_peer_name(c), why);
}

/* ---- the handshake ---- */


/* A TLS state on c, its transport from now on; 0 or CIRRUS_ENOMEM (c is untouched then). */
static int attach(net_conn *c, net_tls_ctx *ctx, int server, const char *expect,
                  tls_conn **out, cirrus_error *err)
{
    pthread_once(&bio_once, bio_method_init);
    tls_conn *t = bio_method ? calloc(1, sizeof *t) : NULL;
    uint8_t *in = t ? malloc(TLS_IN_BUFFER) : NULL;
    SSL *ssl = in ? SSL_new(ctx->ssl) : NULL;
    BIO *b = ssl ? BIO_new(bio_method) : NULL;
    if (!b) {
        SSL_free(ssl);
        free(in);
        free(t);
        ERR_clear_error();
        return cirrus_fail(err, CIRRUS_ENOMEM, "out of memory for a TLS session");
    }
    BIO_set_data(b, c);
    BIO_set_init(b, 1);
    SSL_set_bio(ssl, b, b); /* ssl owns b */
    SSL_set_app_data(ssl, t);
    if (server)
        SSL_set_accept_state(ssl);
    else
        SSL_set_connect_state(ssl);
    t->ssl = ssl;
    t->in = in;
    memcpy(t->job, ctx->job, sizeof t->job);
    snprintf(t->expect, sizeof t->expect, "%s", expect ? expect : "");
    net_conn_set_transport(c, &tls_transport, t);
    *out = t;
    return 0;
}

static int handshake(net_conn *c, net_tls_ctx *ctx, int server, const char *expect_region,
                     char *peer_region, size_t peer_region_size, int timeout_ms,
                     cirrus_error *err)
{
    if (peer_region && peer_region_size) peer_region[0] = '\0';
    if (!c || !ctx)
        return cirrus_fail(err, CIRRUS_EINVAL, "TLS handshake: no connection or context");
    if (expect_region && (!*expect_region || strlen(expect_region) > CERTS_MAX_LABEL))
        return cirrus_fail(err, CIRRUS_EINVAL,
                           "TLS handshake: the expected region must be 1..%d bytes",
                           CERTS_MAX_LABEL);
    if (peer_region && peer_region_size < NET_TLS_REGION_MAX)
        return cirrus_fail(err, CIRRUS_EINVAL, "TLS handshake: peer_region needs %d bytes",
                           NET_TLS_REGION_MAX);
    if (net_conn_transport(c) != &net_tcp_transport)
        return cirrus_fail(err, CIRRUS_EINVAL, "TLS handshake with %s: not a plain TCP connection",
                           net_peer_name(c));
    ERR_clear_error();
    tls_conn *t = NULL;
    int rc = attach(c, ctx, server, expect_region, &t, err);
    if (rc) return rc;
    int64_t deadline = timeout_ms < 0 ? -1 : net_now_ms() + timeout_ms;
    for (;;) {
        t->io_errno = 0;
        int r = SSL_do_handshake(t->ssl);
        if (r == 1) break;
        int e = SSL_get_error(t->ssl, r);
        if (e != SSL_ERROR_WANT_READ && e != SSL_ERROR_WANT_WRITE) {
            t->fatal = 1;
            return handshake_fail(c, t, e, err);
        }
        ERR_clear_error();
        rc = net_wait_fd(net_fd(c), e == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT, deadline);
        if (rc == CIRRUS_ETIMEDOUT)
            return cirrus_fail(err, rc, "TLS handshake with %s: not done within %d ms",
                               net_peer_name(c), timeout_ms);
        if (rc) return cirrus_fail(err, rc, "TLS handshake with %s: poll: %s", net_peer_name(c),
                                   strerror(errno));
    }
    /* The callback accepted the leaf; make sure it ran (a certificate, verified, named). */
    if (!SSL_get0_peer_certificate(t->ssl) || SSL_get_verify_result(t->ssl) != X509_V_OK ||
        !t->peer_region[0]) {
        t->fatal = 1;
        ERR_clear_error();
        return cirrus_fail(err, CIRRUS_EINVAL,
                           "TLS handshake with %s: the peer sent no certificate",
                           net_peer_name(c));
    }
    if (!(t->out = malloc(TLS_OUT_BUFFER))) {
        t->fatal = 1;
        return cirrus_fail(err, CIRRUS_ENOMEM, "out of memory for a TLS session");
    }
    t->established = 1;
    if (peer_region) memcpy(peer_region, t->peer_region, NET_TLS_REGION_MAX);
    ERR_clear_error();
    return 0;
}

int net_tls_connect(net_conn *c, net_tls_ctx *ctx, const char *expect_region, char *peer_region,
                    size_t peer_region_size, int timeout_ms, cirrus_error *err)
{
    return handshake(c, ctx, 0, expect_region, peer_region, peer_region_size, timeout_ms, err);
}

int net_tls_accept(net_conn *c, net_tls_ctx *ctx, const char *expect_region, char *peer_region,
                   size_t peer_region_size, int timeout_ms, cirrus_error *err)
{
    return handshake(c, ctx, 1, expect_region, peer_region, peer_region_size, timeout_ms, err);
}

/* ---- contexts ---- */

/* Never prompt on a terminal for an encrypted key: gateways have none. */
static int no_passphrase(char *buf, int size, int rwflag, void *u)
{
    (void)buf, (void)size, (void)rwflag, (void)u;
    return -1;
}

/* One PEM object (a certificate if key is NULL, else a private key) from a string. */
static int parse_pem(const char *pem, const char *what, X509 **cert, EVP_PKEY **key,
                     cirrus_error *err)
{
    size_t n = pem ? strlen(pem) : 0;
    if (n == 0 || n > TLS_FILE_MAX)
        return cirrus_fail(err, CIRRUS_EINVAL, "%s: %s", what, n ? "too long" : "no PEM given");
    BIO *b = BIO_new_mem_buf(pem, (int)n);
    if (cert) *cert = b ? PEM_read_bio_X509(b, NULL, no_passphrase, NULL) : NULL;
    if (key) *key = b ? PEM_read_bio_PrivateKey(b, NULL, no_passphrase, NULL) : NULL;
    BIO_free(b);
    char line[160];
    ssl_error_line(line, sizeof line);
    if ((cert && !*cert) || (key && !*key))
        return cirrus_fail(err, CIRRUS_EINVAL, "%s is not a PEM %s: %s", what,
                           cert ? "certificate" : "private key", line[0] ? line : "?");
    return 0;
}

/* The leaf this gateway presents: issued by the CA (its signature; not its dates, see
 * tls.h), for this job; its region goes to region. */
static int check_own_leaf(X509 *ca, X509 *leaf, const char *job, char *region,
                          cirrus_error *err)
{
    char got_job[CERTS_MAX_LABEL + 1];
    cirrus_error e = {0};
    if (X509_check_ca(ca) != 1)
        return cirrus_fail(err, CIRRUS_EINVAL, "the CA certificate is not a CA");
    if (X509_verify(leaf, X509_get0_pubkey(ca)) != 1)
        return cirrus_fail(err, CIRRUS_EINVAL,
                           "this gateway's certificate was not issued by the job's CA");
    if (certs_identity_x509(leaf, got_job, sizeof got_job, region, NET_TLS_REGION_MAX, &e))
        return cirrus_fail(err, CIRRUS_EINVAL, "this gateway's certificate: %s", e.msg);
    if (strcmp(got_job, job) != 0)
        return cirrus_fail(err, CIRRUS_EINVAL,
                           "this gateway's certificate is for job '%s', not '%s'", got_job, job);
    return 0;
}

/* An SSL_CTX with this file's settings (tls.h); NULL if OpenSSL is out of memory. */
static SSL_CTX *new_ssl_ctx(X509 *ca, X509 *leaf, EVP_PKEY *key)
{
    SSL_CTX *s = SSL_CTX_new(TLS_method());
    int ok = s && SSL_CTX_set_min_proto_version(s, TLS1_3_VERSION) &&
             SSL_CTX_set_max_proto_version(s, TLS1_3_VERSION) &&
             SSL_CTX_set_num_tickets(s, 0) &&
             X509_VERIFY_PARAM_set_flags(SSL_CTX_get0_param(s), X509_V_FLAG_X509_STRICT) &&
             X509_STORE_add_cert(SSL_CTX_get_cert_store(s), ca) &&
             SSL_CTX_use_certificate(s, leaf) == 1 && SSL_CTX_use_PrivateKey(s, key) == 1;
    if (!ok) {
        SSL_CTX_free(s);
        return NULL;
    }
    /* The end of the socket without close_notify reads as an end of stream, as on plain TCP:
     * frames carry their length and checksum, so a cut inside one is still caught (ETRUNC),
     * and a cut between frames is a peer gone, which callers handle anyway. */
    SSL_CTX_set_options(s, SSL_OP_IGNORE_UNEXPECTED_EOF | SSL_OP_NO_RENEGOTIATION);
    SSL_CTX_set_session_cache_mode(s, SSL_SESS_CACHE_OFF);
    SSL_CTX_set_mode(s, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
    SSL_CTX_set_verify(s, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, verify_cb);
    X509_VERIFY_PARAM_set_depth(SSL_CTX_get0_param(s), 0); /* the CA signs leaves itself */
    return s;
}

int net_tls_ctx_new(net_tls_ctx **out, const char *ca_pem, const char *cert_pem,
                    const char *key_pem, const char *job, cirrus_error *err)
{
    if (!out) return cirrus_fail(err, CIRRUS_EINVAL, "net_tls_ctx_new: out is NULL");
    *out = NULL;
    if (!job || !*job || strlen(job) > CERTS_MAX_LABEL)
        return cirrus_fail(err, CIRRUS_EINVAL, "the job name must be 1..%d bytes", CERTS_MAX_LABEL);
    ERR_clear_error();
    X509 *ca = NULL, *leaf = NULL;
    EVP_PKEY *key = NULL;
    net_tls_ctx *x = calloc(1, sizeof *x);
    int rc = x ? 0 : cirrus_fail(err, CIRRUS_ENOMEM, "out of memory for a TLS context");
    if (rc == 0) rc = parse_pem(ca_pem, "the CA certificate", &ca, NULL, err);
    if (rc == 0) rc = parse_pem(cert_pem, "this gateway's certificate", &leaf, NULL, err);
    if (rc == 0) rc = parse_pem(key_pem, "this gateway's key", NULL, &key, err);
    if (rc == 0) rc = check_own_leaf(ca, leaf, job, x->region, err);
    if (rc == 0 && X509_check_private_key(leaf, key) != 1)
        rc = cirrus_fail(err, CIRRUS_EINVAL, "this gateway's key does not match its certificate");
    if (rc == 0) memcpy(x->job, job, strlen(job) + 1);
    if (rc == 0 && !(x->ssl = new_ssl_ctx(ca, leaf, key)))
        rc = cirrus_fail(err, CIRRUS_ENOMEM, "setting up TLS: out of memory");
    X509_free(ca);
    X509_free(leaf);
    EVP_PKEY_free(key);
    ERR_clear_error();
    if (rc) {
        net_tls_ctx_free(x);
        return rc;
    }
    *out = x;
    return 0;
}

/* A whole small file as a NUL-terminated string; the caller frees (cleansing a key). */
static int read_file(const char *path, const char *what, char **out, cirrus_error *err)
{
    *out = NULL;
    FILE *f = path ? fopen(path, "rb") : NULL;
    if (!f)
        return cirrus_fail(err, CIRRUS_ENOENT, "%s '%s': %s", what, path ? path : "(none)",
                           path ? strerror(errno) : "no file given");
    char *buf = malloc(TLS_FILE_MAX + 1);
    size_t n = buf ? fread(buf, 1, TLS_FILE_MAX + 1, f) : 0;
    int bad = buf && ferror(f);
    fclose(f);
    if (!buf) return cirrus_fail(err, CIRRUS_ENOMEM, "out of memory reading %s", what);
    if (bad || n > TLS_FILE_MAX) {
        OPENSSL_cleanse(buf, n);
        free(buf);
        return cirrus_fail(err, bad ? CIRRUS_EIO : CIRRUS_EINVAL, "%s '%s': %s", what, path,
                           bad ? "read error" : "larger than 64 KiB");
    }
    buf[n] = '\0';
    *out = buf;
    return 0;
}

int net_tls_ctx_load(net_tls_ctx **out, const char *ca_file, const char *cert_file,
                     const char *key_file, const char *job, cirrus_error *err)
{
    char *ca = NULL, *cert = NULL, *key = NULL;
    if (out) *out = NULL;
    int rc = read_file(ca_file, "the CA certificate", &ca, err);
    if (rc == 0) rc = read_file(cert_file, "this gateway's certificate", &cert, err);
    if (rc == 0) rc = read_file(key_file, "this gateway's key", &key, err);
    if (rc == 0) rc = net_tls_ctx_new(out, ca, cert, key, job, err);
    if (key) OPENSSL_cleanse(key, strlen(key));
    free(key);
    free(cert);
    free(ca);
    return rc;
}

void net_tls_ctx_free(net_tls_ctx *ctx)
{
    if (!ctx) return;
    SSL_CTX_free(ctx->ssl); /* reference-counted: live connections keep theirs */
    free(ctx);
}

const char *net_tls_ctx_region(const net_tls_ctx *ctx) { return ctx->region; }
