/* Tests of trainer/net/tls over real loopback sockets, with certificates made here by
 * common/certs: frames of every size through a good pair (and the byte counters of both
 * ends), the refusals (another CA, another job, another region, expired, no certificate,
 * plaintext), each with its message and no frame delivered, a flipped byte in the stream,
 * the context's checks, and TLS vs TCP throughput on this CPU (printed, never asserted). */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>

#include "../../common/certs.h"
#include "../../trainer/net/tls.h"
#include "test.h"

#define JOB "job-1"
#define T_MS 10000 /* for calls that should succeed: generous, never reached */
#define T_DATA 200 /* frame types of these tests */
#define T_BYE 201

/* ---- certificates ---- */

typedef struct pki {
    certs_pair ca, other_ca;
    certs_pair r1, r2;     /* job-1's regions r1 (the server) and r2 (the client) */
    certs_pair other_r2;   /* r2, issued by another CA */
    certs_pair job2_r2;    /* r2 of job-2, issued by job-1's CA */
    certs_pair expired_r2; /* valid two days ago to one day ago */
    net_tls_ctx *server, *client; /* r1's and r2's contexts */
} pki;

static void leaf(const certs_pair *ca, const char *job, const char *region, certs_pair *out)
{
    cirrus_error err = {0};
    const char *dns[] = {"gateway"};
    if (certs_make_leaf(ca, job, region, "gateway", dns, 1, 7, out, &err))
        TEST_FAIL("certs_make_leaf: %s", err.msg);
}

static net_tls_ctx *ctx_of(const certs_pair *ca, const certs_pair *leaf, const char *job)
{
    net_tls_ctx *ctx = NULL;
    cirrus_error err = {0};
    if (net_tls_ctx_new(&ctx, ca->cert_pem, leaf->cert_pem, leaf->key_pem, job, &err))
        TEST_FAIL("net_tls_ctx_new: %s", err.msg);
    return ctx;
}

static void pki_make(pki *p)
{
    cirrus_error err = {0};
    memset(p, 0, sizeof *p);
    ASSERT_OK(certs_make_ca(JOB, 30, &p->ca, &err));
    ASSERT_OK(certs_make_ca(JOB, 30, &p->other_ca, &err));
    leaf(&p->ca, JOB, "r1", &p->r1);
    leaf(&p->ca, JOB, "r2", &p->r2);
    leaf(&p->other_ca, JOB, "r2", &p->other_r2);
    leaf(&p->ca, "job-2", "r2", &p->job2_r2);
    const char *dns[] = {"gateway"};
    ASSERT_OK(certs_make_leaf_valid(&p->ca, JOB, "r2", "gateway", dns, 1, -2 * 86400, -86400,
                                    &p->expired_r2, &err));
    p->server = ctx_of(&p->ca, &p->r1, JOB);
    p->client = ctx_of(&p->ca, &p->r2, JOB);
}

static void pki_free(pki *p)
{
    certs_pair *all[] = {&p->ca, &p->other_ca, &p->r1, &p->r2, &p->other_r2, &p->job2_r2,
                         &p->expired_r2};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) certs_pair_free(all[i]);
    net_tls_ctx_free(p->server);
    net_tls_ctx_free(p->client);
}

static void fill(uint8_t *p, size_t n, uint64_t seed)
{
    uint64_t x = seed * 0x9E3779B97F4A7C15ULL + 1;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        p[i] = (uint8_t)x;
    }
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* ---- the server: accept one connection, TLS (or not), then echo until it ends ---- */

typedef struct server {
    int lfd, port;
    net_tls_ctx *ctx; /* NULL: plain TCP */
    const char *expect;
    int handshake_ms;
    /* results */
    int rc; /* the handshake's */
    cirrus_error err;
    char peer_region[NET_TLS_REGION_MAX];
    int frames; /* delivered after the handshake (or after a refusal: must stay 0) */
    int end_rc; /* what the receive loop ended with */
    cirrus_error end_err;
    uint64_t sent, received; /* counters when T_BYE arrived */
    atomic_int counted;
    int keep;      /* hand the connection over after the handshake, instead of echoing */
    net_conn *conn; /* ... here */
    pthread_t th;
} server;

static void *server_main(void *arg)
{
    server *s = arg;
    net_conn *c = NULL;
    cirrus_error err = {0};
    if (net_accept(s->lfd, T_MS, &c, &err)) TEST_FAIL("accept: %s", err.msg);
    s->rc = s->ctx ? net_tls_accept(c, s->ctx, s->expect, s->peer_region, sizeof s->peer_region,
                                    s->handshake_ms, &s->err)
                   : 0;
    if (s->keep) {
        s->conn = c;
        return NULL;
    }
    for (;;) {
        wire_header h;
        const uint8_t *p;
        /* After a refusal, whatever the client sends must not come through as a frame. */
        int rc = net_recv_frame(c, &h, &p, s->rc ? 1000 : T_MS, &s->end_err);
        if (rc) {
            s->end_rc = rc;
            break;
        }
        s->frames++;
        if (h.type == T_BYE) {
            net_conn_bytes(c, &s->sent, &s->received);
            atomic_store(&s->counted, 1);
        } else if ((rc = net_send_frame(c, h.type, h.request_id, p, h.payload_len, T_MS))) {
            s->end_rc = rc;
            break;
        }
    }
    net_close(c);
    return NULL;
}

/* Listening; the caller may change the settings before server_run. */
static void server_init(server *s, net_tls_ctx *ctx, const char *expect)
{
    memset(s, 0, sizeof *s);
    cirrus_error err = {0};
    ASSERT_OK(net_listen("127.0.0.1", 0, &s->lfd, &s->port, &err));
    s->ctx = ctx;
    s->expect = expect;
    s->handshake_ms = T_MS;
}

static void server_run(server *s) { ASSERT_OK(pthread_create(&s->th, NULL, server_main, s)); }

static void server_start(server *s, net_tls_ctx *ctx, const char *expect)
{
    server_init(s, ctx, expect);
    server_run(s);
}

static void server_join(server *s)
{
    pthread_join(s->th, NULL);
    close(s->lfd);
}

/* A blocking socket connected to 127.0.0.1:port, for clients that are not net_conns. */
static int tcp_dial(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT(fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) == 0);
    return fd;
}

static net_conn *dial(int port)
{
    net_conn *c = NULL;
    cirrus_error err = {0};
    if (net_connect("127.0.0.1", port, T_MS, &c, &err)) TEST_FAIL("connect: %s", err.msg);
    return c;
}

/* ---- a good pair ---- */

/* Frames of 0 B, 1 B, 1 MiB and 16 MiB (and one sent as three iovecs) echoed through c, the
 * echoes received with net_recv_frame and net_recv_frame_into. Returns the payload bytes
 * sent. */
static uint64_t echo_sizes(net_conn *c)
{
    const uint32_t sizes[] = {0, 1, 1u << 20, 16u << 20};
    uint8_t *out = malloc(16u << 20), *in = malloc(16u << 20);
    ASSERT(out && in);
    uint64_t total = 0;
    cirrus_error err = {0};
    wire_header h;
    for (int i = 0; i < 4; i++) {
        uint32_t n = sizes[i];
        fill(out, n, 7 + i);
        ASSERT_OK(net_send_frame(c, T_DATA, 100 + i, out, n, T_MS));
        total += n;
        if (n <= 1) {
            const uint8_t *p;
            if (net_recv_frame(c, &h, &p, T_MS, &err)) TEST_FAIL("recv: %s", err.msg);
            ASSERT_EQ(h.payload_len, n);
            ASSERT(n == 0 || memcmp(p, out, n) == 0);
        } else {
            memset(in, 0, n);
            if (net_recv_frame_into(c, &h, in, n, T_MS, &err)) TEST_FAIL("recv: %s", err.msg);
            ASSERT(memcmp(in, out, n) == 0);
        }
        ASSERT(h.type == T_DATA && h.request_id == 100u + (unsigned)i);
    }
    /* A short first iovec, then a large one: the header-coalescing path with a payload
     * that starts in one record and runs on for many. */
    fill(out, 3u << 20, 99);
    struct iovec iov[3] = {{out, 5}, {out + 5, (3u << 20) - 9}, {out + (3u << 20) - 4, 4}};
    ASSERT_OK(net_send_framev(c, T_DATA, 7, iov, 3, T_MS));
    total += 3u << 20;
    if (net_recv_frame_into(c, &h, in, 3u << 20, T_MS, &err)) TEST_FAIL("recv: %s", err.msg);
    ASSERT(memcmp(in, out, 3u << 20) == 0);
    free(out);
    free(in);
    return total;
}

/* The round trip, then the counters at a quiet moment (the server counted on T_BYE, the
 * client after sending it): each end's sent is the other's received. */
static void round_trip(net_tls_ctx *sctx, net_tls_ctx *cctx)
{
    server s;
    server_start(&s, sctx, sctx ? "r2" : NULL);
    net_conn *c = dial(s.port);
    char region[NET_TLS_REGION_MAX] = "?";
    cirrus_error err = {0};
    if (cctx && net_tls_connect(c, cctx, "r1", region, sizeof region, T_MS, &err))
        TEST_FAIL("net_tls_connect: %s", err.msg);
    if (cctx) {
        ASSERT(strcmp(region, "r1") == 0);
        ASSERT(net_tls_cipher(c) && strncmp(net_tls_cipher(c), "TLS_", 4) == 0);
        fprintf(stderr, "  cipher %s\n", net_tls_cipher(c));
    } else {
        ASSERT(net_tls_cipher(c) == NULL);
    }
    uint64_t payload = echo_sizes(c);
    ASSERT_OK(net_send_frame(c, T_BYE, 1, NULL, 0, T_MS));
    uint64_t sent, received;
    net_conn_bytes(c, &sent, &received);
    while (!atomic_load(&s.counted)) usleep(1000);
    net_close(c); /* close_notify: the server's receive ends cleanly */
    server_join(&s);
    if (sctx) {
        ASSERT_OK(s.rc);
        ASSERT(strcmp(s.peer_region, "r2") == 0);
    }
    ASSERT_EQ(s.frames, 6);
    ASSERT_EQ(s.end_rc, CIRRUS_ECLOSED);
    ASSERT_EQ(sent, s.received);
    ASSERT_EQ(received, s.sent);
    /* 32-byte headers on 6 frames each way; TLS adds its handshake and records. */
    ASSERT(sent >= payload + 6 * 32 && received >= payload + 5 * 32);
    if (cctx) ASSERT(sent > payload + 6 * 32 + 1000); /* a handshake is ~1-2 KB each way */
    fprintf(stderr, "  %s: payload %llu B, sent %llu B, received %llu B\n", cctx ? "tls" : "tcp",
            (unsigned long long)payload, (unsigned long long)sent, (unsigned long long)received);
}

TEST_T(tls_round_trip, 60)
{
    pki p;
    pki_make(&p);
    ASSERT(strcmp(net_tls_ctx_region(p.server), "r1") == 0);
    round_trip(p.server, p.client);
    round_trip(NULL, NULL); /* the counters of plain TCP */
    ASSERT(ERR_peek_error() == 0);
    pki_free(&p);
}

/* Both ends in this thread once the handshake is done (or plain TCP with NULL contexts). */
static void tls_pair(net_tls_ctx *sctx, net_tls_ctx *cctx, net_conn **s, net_conn **c)
{
    server srv;
    server_init(&srv, sctx, NULL);
    srv.keep = 1;
    server_run(&srv);
    *c = dial(srv.port);
    cirrus_error err = {0};
    if (cctx && net_tls_connect(*c, cctx, NULL, NULL, 0, T_MS, &err))
        TEST_FAIL("connect: %s", err.msg);
    server_join(&srv);
    if (srv.rc) TEST_FAIL("accept: %s", srv.err.msg);
    *s = srv.conn;
}

/* Records already read ahead into OpenSSL's buffer, with nothing left on the socket: the
 * second net_recv_frame_into must take them at once, not sleep on SO_RCVLOWAT until its
 * deadline (it would then still succeed, hence the time check, at half the deadline). */
TEST_T(tls_recv_into_buffered_records, 30)
{
    pki p;
    pki_make(&p);
    net_conn *s, *c;
    tls_pair(p.server, p.client, &s, &c);
    uint8_t a[3000], b[3000], in[3000];
    fill(a, sizeof a, 1);
    fill(b, sizeof b, 2);
    for (int round = 0; round < 3; round++) {
        ASSERT_OK(net_send_frame(c, T_DATA, 1, a, sizeof a, T_MS));
        ASSERT_OK(net_send_frame(c, T_DATA, 2, b, sizeof b, T_MS));
        usleep(100 * 1000); /* both on the receiver's socket before it reads */
        wire_header h;
        cirrus_error err = {0};
        ASSERT_OK(net_recv_frame_into(s, &h, in, sizeof in, 4000, &err));
        ASSERT(h.request_id == 1 && memcmp(in, a, sizeof a) == 0);
        ASSERT(net_pending(s)); /* b's record, read ahead with a's */
        double t0 = now_ms();
        if (net_recv_frame_into(s, &h, in, sizeof in, 4000, &err))
            TEST_FAIL("second frame: %s", err.msg);
        ASSERT_LT(now_ms() - t0, 2000);
        ASSERT(h.request_id == 2 && memcmp(in, b, sizeof b) == 0 && !net_pending(s));
    }
    net_close(c);
    net_close(s);
    pki_free(&p);
}

/* Frames of many iovecs of random sizes (0 B to 40 KB, more than one writev window of
 * them), sent while the receiver sleeps: the socket fills, so records are left to go out
 * on a retry (tls.c's unreported bytes) and OpenSSL's own retries happen; every byte must
 * arrive in order. */
typedef struct iov_sender {
    net_conn *c;
    const uint8_t *data;
    uint32_t frame; /* one iovec of this many bytes, or 0: 200 of random sizes */
    int frames, rc;
} iov_sender;

static void *iov_sender_main(void *arg)
{
    iov_sender *u = arg;
    uint64_t x = 12345;
    for (int f = 0; f < u->frames && !u->rc; f++) {
        struct iovec iov[200] = {{(void *)u->data, u->frame}};
        size_t off = 0;
        for (int i = 0; i < 200 && !u->frame; i++) {
            x = x * 6364136223846793005ULL + 1442695040888963407ULL; /* an LCG */
            size_t n = (x >> 33) % 4 == 0 ? 0 : (x >> 35) % 40000;
            iov[i].iov_base = (void *)(u->data + off);
            iov[i].iov_len = n;
            off += n;
        }
        u->rc = net_send_framev(u->c, T_DATA, (uint64_t)f, iov, u->frame ? 1 : 200, T_MS);
    }
    return NULL;
}

TEST_T(tls_iovecs_and_a_slow_reader, 60)
{
    pki p;
    pki_make(&p);
    net_conn *s, *c;
    tls_pair(p.server, p.client, &s, &c);
    uint8_t *data = malloc(200 * 40000);
    ASSERT(data);
    fill(data, 200 * 40000, 11);
    iov_sender u = {.c = c, .data = data, .frames = 6};
    pthread_t th;
    ASSERT_OK(pthread_create(&th, NULL, iov_sender_main, &u));
    for (int f = 0; f < u.frames; f++) {
        usleep(150 * 1000);
        wire_header h;
        const uint8_t *pl;
        cirrus_error err = {0};
        if (net_recv_frame(s, &h, &pl, T_MS, &err)) TEST_FAIL("recv: %s", err.msg);
        ASSERT_EQ(h.request_id, f);
        ASSERT(h.payload_len > 1000000 && memcmp(pl, data, h.payload_len) == 0);
    }
    pthread_join(th, NULL);
    ASSERT_OK(u.rc);
    free(data);
    net_close(c);
    net_close(s);
    pki_free(&p);
}

/* ---- refusals ---- */

/* A client through net_tls_connect: its handshake's result, and if it got through, the
 * result of sending a frame and waiting for an answer (a refusal by the server shows there,
 * as an alert). */
typedef struct client_result {
    int rc, recv_rc;
    cirrus_error err, recv_err;
} client_result;

static void api_client(int port, net_tls_ctx *ctx, const char *expect, client_result *r)
{
    memset(r, 0, sizeof *r);
    net_conn *c = dial(port);
    r->rc = net_tls_connect(c, ctx, expect, NULL, 0, T_MS, &r->err);
    if (r->rc == 0) {
        uint8_t x[100] = {0};
        net_send_frame(c, T_DATA, 1, x, sizeof x, T_MS);
        wire_header h;
        const uint8_t *p;
        r->recv_rc = net_recv_frame(c, &h, &p, T_MS, &r->recv_err);
    }
    net_close(c);
}

static void expect_msg(const char *who, const cirrus_error *err, const char *want)
{
    if (!strstr(err->msg, want)) TEST_FAIL("%s: \"%s\" lacks \"%s\"", who, err->msg, want);
    fprintf(stderr, "  %s: %s\n", who, err->msg);
}

/* The server refused with code and a message holding want, and delivered no frame. */
static void server_refused(server *s, int code, const char *want)
{
    server_join(s);
    if (s->rc != code) TEST_FAIL("server: rc %d (%s), want %d", s->rc, s->err.msg, code);
    expect_msg("server", &s->err, want);
    ASSERT_EQ(s->frames, 0);
    ASSERT(s->end_rc != 0);
}

TEST_T(tls_refuses_other_job_region_or_expired, 30)
{
    pki p;
    pki_make(&p);
    net_tls_ctx *job2 = ctx_of(&p.ca, &p.job2_r2, "job-2");
    server s;
    client_result r;

    /* The client wants region r3; the server is r1. */
    server_start(&s, p.server, NULL);
    api_client(s.port, p.client, "r3", &r);
    ASSERT_EQ(r.rc, CIRRUS_EINVAL);
    expect_msg("client", &r.err, "peer certificate refused: it is for region 'r1', not 'r3'");
    server_refused(&s, CIRRUS_EINVAL, "the peer refused us: sslv3 alert bad certificate");

    /* The server wants r3; the client is r2: refused after the client's handshake ended, so
     * the client hears of it on its first receive. */
    server_start(&s, p.server, "r3");
    api_client(s.port, p.client, NULL, &r);
    server_refused(&s, CIRRUS_EINVAL, "peer certificate refused: it is for region 'r2', not 'r3'");
    ASSERT_OK(r.rc);
    ASSERT_EQ(r.recv_rc, CIRRUS_EIO);
    expect_msg("client recv", &r.recv_err, "bad certificate");

    /* A gateway of job-2 (a leaf from the same CA): it refuses job-1's server ... */
    server_start(&s, p.server, NULL);
    api_client(s.port, job2, NULL, &r);
    ASSERT_EQ(r.rc, CIRRUS_EINVAL);
    expect_msg("client", &r.err, "it is for job 'job-1', not 'job-2'");
    server_refused(&s, CIRRUS_EINVAL, "bad certificate");
    net_tls_ctx_free(job2);

    /* A context with an expired leaf can be made (its peers judge the dates) ... */
    net_tls_ctx *old = ctx_of(&p.ca, &p.expired_r2, JOB);
    /* ... and the server refuses it, */
    server_start(&s, p.server, NULL);
    api_client(s.port, old, NULL, &r);
    server_refused(&s, CIRRUS_EINVAL, "peer certificate refused: expired");
    ASSERT_EQ(r.recv_rc, CIRRUS_EIO);
    expect_msg("client recv", &r.recv_err, "certificate expired");
    /* as a client refuses an expired server. */
    server_start(&s, old, NULL);
    api_client(s.port, p.client, NULL, &r);
    ASSERT_EQ(r.rc, CIRRUS_EINVAL);
    expect_msg("client", &r.err, "peer certificate refused: expired");
    server_refused(&s, CIRRUS_EINVAL, "the peer refused us: sslv3 alert certificate expired");
    ASSERT(ERR_peek_error() == 0);
    net_tls_ctx_free(old);
    pki_free(&p);
}

/* A file in the test's directory holding a, then b (if not NULL); its path in path. */
static void write_file(char *path, const char *name, const char *a, const char *b)
{
    snprintf(path, 512, "%s/%s", test_tmpdir(), name);
    FILE *f = fopen(path, "w");
    ASSERT(f && fputs(a, f) >= 0 && (!b || fputs(b, f) >= 0) && fclose(f) == 0);
}

/* A TLS 1.3 client written directly on OpenSSL, which checks nothing of the server but its
 * chain: it presents leaf (none if NULL), then writes a byte and reads. Returns whether its
 * handshake finished; the reason its read failed goes to why. */
static int raw_client(int port, const certs_pair *ca, const certs_pair *leaf, char *why,
                      size_t size)
{
    SSL_CTX *x = SSL_CTX_new(TLS_client_method());
    ASSERT(x && SSL_CTX_set_min_proto_version(x, TLS1_3_VERSION));
    char path[512];
    write_file(path, "raw-ca.pem", ca->cert_pem, NULL);
    ASSERT(SSL_CTX_load_verify_locations(x, path, NULL) == 1);
    SSL_CTX_set_verify(x, SSL_VERIFY_PEER, NULL);
    if (leaf) { /* certificate and key from one file, as servers often keep them */
        write_file(path, "raw-leaf.pem", leaf->cert_pem, leaf->key_pem);
        ASSERT(SSL_CTX_use_certificate_file(x, path, SSL_FILETYPE_PEM) == 1 &&
               SSL_CTX_use_PrivateKey_file(x, path, SSL_FILETYPE_PEM) == 1);
    }
    int fd = tcp_dial(port);
    struct timeval tv = {.tv_sec = 5};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    SSL *ssl = SSL_new(x);
    ASSERT(ssl && SSL_set_fd(ssl, fd));
    int ok = SSL_connect(ssl) == 1;
    why[0] = '\0';
    if (ok) {
        char buf[64];
        SSL_write(ssl, "x", 1);
        if (SSL_read(ssl, buf, sizeof buf) <= 0)
            ERR_error_string_n(ERR_peek_error(), why, size);
    }
    SSL_free(ssl);
    close(fd);
    SSL_CTX_free(x);
    ERR_clear_error();
    return ok;
}

/* Refusals only a client that does not play by our rules can provoke. */
TEST_T(tls_refuses_foreign_and_missing_certificates, 30)
{
    pki p;
    pki_make(&p);
    server s;
    char why[256];
    /* No certificate at all. */
    server_start(&s, p.server, NULL);
    ASSERT(raw_client(s.port, &p.ca, NULL, why, sizeof why)); /* TLS 1.3: it gets this far */
    server_refused(&s, CIRRUS_EINVAL, "the peer sent no certificate");
    ASSERT(strstr(why, "certificate required"));
    /* A leaf from another CA. */
    server_start(&s, p.server, NULL);
    raw_client(s.port, &p.ca, &p.other_r2, why, sizeof why);
    server_refused(&s, CIRRUS_EINVAL, "peer certificate refused: unknown CA");
    ASSERT(strstr(why, "unknown ca"));
    /* A leaf of job-2 from job-1's own CA. */
    server_start(&s, p.server, NULL);
    raw_client(s.port, &p.ca, &p.job2_r2, why, sizeof why);
    server_refused(&s, CIRRUS_EINVAL, "it is for job 'job-2', not 'job-1'");
    ASSERT(strstr(why, "bad certificate"));

    /* Through our API, a client whose CA is another one refuses the server itself. */
    net_tls_ctx *other = ctx_of(&p.other_ca, &p.other_r2, JOB);
    client_result r;
    server_start(&s, p.server, NULL);
    api_client(s.port, other, NULL, &r);
    ASSERT_EQ(r.rc, CIRRUS_EINVAL);
    expect_msg("client", &r.err, "peer certificate refused: unknown CA");
    server_refused(&s, CIRRUS_EINVAL, "the peer refused us: tlsv1 alert unknown ca");
    ASSERT(ERR_peek_error() == 0);
    net_tls_ctx_free(other);
    pki_free(&p);
}

/* A client speaking the Cirrus handshake in plaintext, and one saying nothing: refused
 * within the deadline, no crash, nothing delivered. */
TEST_T(tls_refuses_plaintext_and_silence, 30)
{
    pki p;
    pki_make(&p);
    server s;
    cirrus_error err = {0};
    server_init(&s, p.server, NULL);
    s.handshake_ms = 2000;
    server_run(&s);
    double t0 = now_ms();
    net_conn *c = dial(s.port);
    ASSERT(net_hello_client(c, JOB, 1, 1, 3000, &err) != 0);
    fprintf(stderr, "  plaintext client: %s\n", err.msg);
    net_close(c);
    server_refused(&s, CIRRUS_ECORRUPT, "not a TLS 1.3 peer");
    ASSERT_LT(now_ms() - t0, 2000);

    server_init(&s, p.server, NULL);
    s.handshake_ms = 300;
    server_run(&s);
    c = dial(s.port);
    server_refused(&s, CIRRUS_ETIMEDOUT, "not done within 300 ms");
    net_close(c);
    pki_free(&p);
}

/* ---- a flipped byte ---- */

/* A TCP relay between the client and the server that flips one bit of the client's stream
 * at offset flip_at (set by the client once its handshake is done). */
typedef struct relay {
    int lfd, port, to_port;
    _Atomic uint64_t flip_at;
    pthread_t th;
} relay;

static void *relay_main(void *arg)
{
    relay *r = arg;
    struct pollfd lp = {.fd = r->lfd, .events = POLLIN};
    int a = poll(&lp, 1, T_MS) == 1 ? accept(r->lfd, NULL, NULL) : -1, b = tcp_dial(r->to_port);
    ASSERT(a >= 0);
    uint64_t pos = 0; /* of the client's stream */
    uint8_t buf[1 << 16];
    for (int open = 2; open == 2;) {
        struct pollfd p[2] = {{.fd = a, .events = POLLIN}, {.fd = b, .events = POLLIN}};
        if (poll(p, 2, T_MS) <= 0) break;
        for (int i = 0; i < 2; i++) {
            if (!(p[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
            ssize_t n = recv(p[i].fd, buf, sizeof buf, 0);
            if (n <= 0) {
                open--;
                break;
            }
            uint64_t at = atomic_load(&r->flip_at);
            if (i == 0 && at >= pos && at < pos + (uint64_t)n) buf[at - pos] ^= 0x10;
            if (i == 0) pos += (uint64_t)n;
            if (send(p[1 - i].fd, buf, (size_t)n, MSG_NOSIGNAL) != n) open = 0;
        }
    }
    close(a);
    close(b);
    return NULL;
}

TEST_T(tls_flipped_byte_drops_the_connection, 30)
{
    pki p;
    pki_make(&p);
    server s;
    server_start(&s, p.server, NULL);
    relay r = {.to_port = s.port, .flip_at = UINT64_MAX};
    cirrus_error err = {0};
    ASSERT_OK(net_listen("127.0.0.1", 0, &r.lfd, &r.port, &err));
    ASSERT_OK(pthread_create(&r.th, NULL, relay_main, &r));
    net_conn *c = dial(r.port);
    ASSERT_OK(net_tls_connect(c, p.client, "r1", NULL, 0, T_MS, &err));
    uint64_t handshake;
    net_conn_bytes(c, &handshake, NULL);
    atomic_store(&r.flip_at, handshake + 100); /* inside the first record's ciphertext */
    uint8_t *x = calloc(1, 1u << 20);
    int send_rc = net_send_frame(c, T_DATA, 1, x, 1u << 20, T_MS);
    wire_header h;
    const uint8_t *pl;
    int recv_rc = net_recv_frame(c, &h, &pl, T_MS, &err);
    fprintf(stderr, "  client: send %d, recv %d: %s\n", send_rc, recv_rc, err.msg);
    ASSERT(recv_rc != 0);
    net_close(c);
    server_join(&s);
    pthread_join(r.th, NULL);
    close(r.lfd);
    ASSERT(s.rc == 0 && s.frames == 0); /* the handshake passed; the tampered frame did not */
    ASSERT(s.end_rc == CIRRUS_EIO || s.end_rc == CIRRUS_ECORRUPT);
    expect_msg("server recv", &s.end_err, "bad record mac");
    free(x);
    pki_free(&p);
}

/* ---- contexts ---- */

TEST(tls_ctx_checks)
{
    pki p;
    pki_make(&p);
    net_tls_ctx *ctx = NULL;
    cirrus_error err = {0};
    const struct {
        const certs_pair *ca, *cert;
        const char *key, *job, *want;
    } bad[] = {
        {&p.ca, &p.r1, NULL, "job-2", "is for job 'job-1', not 'job-2'"},
        {&p.ca, &p.other_r2, NULL, JOB, "was not issued by the job's CA"},
        {&p.r1, &p.r2, NULL, JOB, "the CA certificate is not a CA"},
        {&p.ca, &p.r1, p.r2.key_pem, JOB, "key does not match its certificate"},
        {&p.ca, &p.r1, p.r1.cert_pem, JOB, "this gateway's key is not a PEM private key"},
        {&p.ca, &p.ca, NULL, JOB, "names no cirrus:// identity"},
        {&p.ca, &p.r1, NULL, "", "the job name must be 1..63 bytes"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err.msg[0] = '\0';
        int rc = net_tls_ctx_new(&ctx, bad[i].ca->cert_pem, bad[i].cert->cert_pem,
                                 bad[i].key ? bad[i].key : bad[i].cert->key_pem, bad[i].job,
                                 &err);
        if (rc != CIRRUS_EINVAL || !strstr(err.msg, bad[i].want))
            TEST_FAIL("case %zu: rc %d, \"%s\", want \"%s\"", i, rc, err.msg, bad[i].want);
        ASSERT(ctx == NULL && ERR_peek_error() == 0);
    }
    ASSERT_EQ(net_tls_ctx_new(&ctx, "garbage", p.r1.cert_pem, p.r1.key_pem, JOB, &err),
              CIRRUS_EINVAL);
    ASSERT(strstr(err.msg, "the CA certificate is not a PEM certificate"));
    ASSERT(ERR_peek_error() == 0);

    /* From files, as the operator mounts them. */
    char ca[512], crt[512], key[512];
    write_file(ca, "ca.crt", p.ca.cert_pem, NULL);
    write_file(crt, "tls.crt", p.r1.cert_pem, NULL);
    write_file(key, "tls.key", p.r1.key_pem, NULL);
    ASSERT_OK(net_tls_ctx_load(&ctx, ca, crt, key, JOB, &err));
    ASSERT(strcmp(net_tls_ctx_region(ctx), "r1") == 0);
    net_tls_ctx_free(ctx);
    ASSERT_EQ(net_tls_ctx_load(&ctx, ca, crt, "/nonexistent/tls.key", JOB, &err), CIRRUS_ENOENT);
    ASSERT(strstr(err.msg, "/nonexistent/tls.key") && ctx == NULL);
    net_tls_ctx_free(NULL);

    /* A connection already TLS, and bad arguments. */
    net_tls_ctx *sctx = p.server, *cctx = p.client;
    net_conn *s, *c;
    tls_pair(sctx, cctx, &s, &c);
    ASSERT_EQ(net_tls_connect(c, cctx, NULL, NULL, 0, T_MS, &err), CIRRUS_EINVAL);
    ASSERT(strstr(err.msg, "not a plain TCP connection"));
    char small[8];
    ASSERT_EQ(net_tls_connect(c, cctx, NULL, small, sizeof small, T_MS, &err), CIRRUS_EINVAL);
    ASSERT_EQ(net_tls_connect(c, cctx, "", NULL, 0, T_MS, &err), CIRRUS_EINVAL);
    net_close(c);
    net_close(s);
    /* Freeing the context while connections live is safe: they hold their own reference. */
    tls_pair(sctx, cctx, &s, &c);
    net_tls_ctx_free(sctx);
    net_tls_ctx_free(cctx);
    p.server = p.client = NULL;
    uint8_t one = 42, in = 0;
    wire_header h;
    ASSERT_OK(net_send_frame(c, T_DATA, 1, &one, 1, T_MS));
    ASSERT_OK(net_recv_frame_into(s, &h, &in, 1, T_MS, &err));
    ASSERT_EQ(in, 42);
    net_close(c);
    net_close(s);
    pki_free(&p);
}

/* ---- throughput (printed for the record; nothing timed is asserted) ---- */

/* Seconds to move frames x frame bytes from c to s. */
static double pump_through(net_conn *s, net_conn *c, int frames, uint32_t frame)
{
    uint8_t *out = malloc(frame), *in = malloc(frame);
    ASSERT(out && in);
    fill(out, frame, 3);
    iov_sender u = {.c = c, .data = out, .frame = frame, .frames = frames};
    net_set_max_payload(s, frame);
    pthread_t th;
    double t0 = now_ms();
    ASSERT_OK(pthread_create(&th, NULL, iov_sender_main, &u));
    cirrus_error err = {0};
    for (int i = 0; i < frames; i++) {
        wire_header h;
        if (net_recv_frame_into(s, &h, in, frame, T_MS, &err)) TEST_FAIL("recv: %s", err.msg);
        ASSERT_EQ(h.request_id, i);
    }
    double dt = (now_ms() - t0) / 1e3;
    pthread_join(th, NULL);
    ASSERT_OK(u.rc);
    ASSERT(memcmp(in, out, frame) == 0);
    free(in);
    free(out);
    return dt;
}

TEST_T(tls_throughput, 120)
{
    int quick = getenv("CIRRUS_TEST_QUICK") != NULL;
    const uint32_t frame = 16u << 20;
    const int frames = quick ? 2 : 16; /* 256 MiB, or 32 MiB in the sanitizer run */
    pki p;
    pki_make(&p);
    net_conn *s, *c;
    tls_pair(p.server, p.client, &s, &c);
    double tls_s = pump_through(s, c, frames, frame);
    uint64_t sent;
    net_conn_bytes(c, &sent, NULL);
    fprintf(stderr, "  tls (%s): %d MiB in %.3f s = %.0f MB/s, %.2f%% on the wire over payload\n",
            net_tls_cipher(c), frames * 16, tls_s, frames * (double)frame / tls_s / 1e6,
            100.0 * ((double)sent / ((double)frames * (frame + 32)) - 1));
    net_close(c);
    net_close(s);
    tls_pair(NULL, NULL, &s, &c);
    double tcp_s = pump_through(s, c, frames, frame);
    fprintf(stderr, "  tcp: %d MiB in %.3f s = %.0f MB/s\n", frames * 16, tcp_s,
            frames * (double)frame / tcp_s / 1e6);
    net_close(c);
    net_close(s);
    pki_free(&p);
}
