/* Tests of trainer/net/conn over real sockets on 127.0.0.1: round trips up to 40 MiB,
 * deadlines, limits, and protocol abuse. Each abuse test runs a threaded echo server, keeps
 * a well-behaved client echoing before and after the abuse, and checks that the server
 * dropped only the abusive connection, with the specific error. */
#include <dirent.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "../../trainer/net/conn.h"
#include "test.h"

#define JOB "job-A"
#define T_MS 5000 /* for calls that should succeed: generous, never reached */
#define MAX_CONNS 16

/* ---- helpers ---- */

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* Open descriptors, to show a test closed every socket it (and its server) opened. */
static int count_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    ASSERT(d != NULL);
    int n = 0;
    while (readdir(d)) n++;
    closedir(d);
    return n;
}

static void fill(uint8_t *p, size_t n, uint64_t seed)
{
    uint64_t x = seed * 0x9E3779B97F4A7C15ULL + 1;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        p[i] = (uint8_t)x;
    }
}

/* ---- the echo server: one acceptor thread, one thread per connection ---- */

typedef struct echo_server echo_server;
typedef struct conn_slot {
    echo_server *srv;
    net_conn *c; /* NULL once its thread is closing it */
    pthread_t th;
} conn_slot;

struct echo_server {
    int lfd, port;
    atomic_int stop;
    pthread_t acceptor;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    conn_slot slots[MAX_CONNS];
    int n_slots;
    /* What the last connection to end ended with (CIRRUS_ECLOSED for a clean goodbye). */
    int n_ended, last_error;
    char last_msg[256];
    uint16_t last_role;
    uint32_t last_peer_id;
};

static void *serve_conn(void *arg)
{
    conn_slot *s = arg;
    echo_server *srv = s->srv;
    net_conn *c = s->c;
    cirrus_error err = {0};
    uint16_t role = 0;
    uint32_t peer_id = 0;
    int rc = net_hello_server(c, JOB, &role, &peer_id, T_MS, &err);
    if (rc == 0) {
        pthread_mutex_lock(&srv->mu);
        srv->last_role = role, srv->last_peer_id = peer_id;
        pthread_mutex_unlock(&srv->mu);
    }
    while (rc == 0) {
        wire_header h;
        const uint8_t *p;
        rc = net_recv_frame(c, &h, &p, 10 * T_MS, &err);
        if (rc == 0 && (rc = net_send_frame(c, h.type, h.request_id, p, h.payload_len, T_MS)))
            cirrus_fail(&err, rc, "echo send: %s", cirrus_strerror(rc));
    }
    pthread_mutex_lock(&srv->mu);
    s->c = NULL;
    srv->n_ended++;
    srv->last_error = rc;
    memcpy(srv->last_msg, err.msg, sizeof err.msg);
    pthread_cond_broadcast(&srv->cv);
    pthread_mutex_unlock(&srv->mu);
    net_close(c); /* only this connection: the server goes on */
    return NULL;
}

static void *accept_loop(void *arg)
{
    echo_server *srv = arg;
    while (!atomic_load(&srv->stop)) {
        net_conn *c = NULL;
        /* A short accept timeout is the stop flag's polling interval. */
        if (net_accept(srv->lfd, 20, &c, NULL) != 0) continue;
        pthread_mutex_lock(&srv->mu);
        if (srv->n_slots == MAX_CONNS) {
            net_close(c);
        } else {
            conn_slot *s = &srv->slots[srv->n_slots++];
            s->srv = srv, s->c = c;
            if (pthread_create(&s->th, NULL, serve_conn, s) != 0) TEST_FAIL("pthread_create");
        }
        pthread_mutex_unlock(&srv->mu);
    }
    return NULL;
}

static void server_start(echo_server *srv)
{
    memset(srv, 0, sizeof *srv);
    cirrus_error err = {0};
    ASSERT_OK(net_listen("127.0.0.1", 0, &srv->lfd, &srv->port, &err));
    ASSERT(srv->port > 0);
    pthread_mutex_init(&srv->mu, NULL);
    pthread_cond_init(&srv->cv, NULL);
    ASSERT_OK(pthread_create(&srv->acceptor, NULL, accept_loop, srv));
}

/* Stop accepting, unblock every live connection, and join every thread. */
static void server_stop(echo_server *srv)
{
    atomic_store(&srv->stop, 1);
    pthread_join(srv->acceptor, NULL);
    pthread_mutex_lock(&srv->mu);
    for (int i = 0; i < srv->n_slots; i++)
        if (srv->slots[i].c) shutdown(net_fd(srv->slots[i].c), SHUT_RDWR);
    pthread_mutex_unlock(&srv->mu);
    for (int i = 0; i < srv->n_slots; i++) pthread_join(srv->slots[i].th, NULL);
    close(srv->lfd);
    pthread_mutex_destroy(&srv->mu);
    pthread_cond_destroy(&srv->cv);
}

/* Wait until n connections have ended; fails after 3 s. */
static void server_wait_ended(echo_server *srv, int n)
{
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 3;
    pthread_mutex_lock(&srv->mu);
    while (srv->n_ended < n)
        if (pthread_cond_timedwait(&srv->cv, &srv->mu, &until) == ETIMEDOUT)
            TEST_FAIL("server saw %d ended connections, expected %d", srv->n_ended, n);
    pthread_mutex_unlock(&srv->mu);
}

/* ---- a well-behaved client ---- */

static net_conn *good_client(int port)
{
    net_conn *c = NULL;
    cirrus_error err = {0};
    if (net_connect("127.0.0.1", port, T_MS, &c, &err)) TEST_FAIL("connect: %s", err.msg);
    if (net_hello_client(c, JOB, 7, 42, T_MS, &err)) TEST_FAIL("hello: %s", err.msg);
    return c;
}

/* Send n seeded bytes split into `pieces` uneven iovecs (with empty ones among them) and
 * check the echo byte for byte. */
static void echo_check(net_conn *c, size_t n, uint64_t seed, int pieces)
{
    uint8_t *buf = malloc(n ? n : 1);
    struct iovec *iov = calloc((size_t)pieces * 2, sizeof *iov);
    ASSERT(buf && iov);
    fill(buf, n, seed);
    size_t off = 0;
    int k = 0;
    for (int i = 0; i < pieces; i++) {
        size_t len = (n - off) / (size_t)(pieces - i);
        if (i % 3 == 1 && i < pieces - 1) len /= 2; /* uneven pieces */
        iov[k++] = (struct iovec){.iov_base = buf + off, .iov_len = len};
        if (i % 2 == 0) iov[k++] = (struct iovec){.iov_base = NULL, .iov_len = 0};
        off += len;
    }
    uint64_t rid = 1000 + seed;
    ASSERT_OK(net_send_framev(c, 200, rid, iov, k, T_MS));
    wire_header h;
    const uint8_t *p;
    cirrus_error err = {0};
    if (net_recv_frame(c, &h, &p, T_MS, &err)) TEST_FAIL("echo recv: %s", err.msg);
    ASSERT_EQ(h.type, 200);
    ASSERT(h.request_id == rid);
    ASSERT_EQ(h.payload_len, n);
    if (n == 0)
        ASSERT(p == NULL);
    else
        ASSERT(memcmp(p, buf, n) == 0);
    free(iov);
    free(buf);
}

/* ---- raw sockets for the abuse: bytes no conn.c function would send ---- */

static int raw_connect(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    ASSERT(fd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    ASSERT_OK(connect(fd, (struct sockaddr *)&a, sizeof a));
    /* A server that failed to drop us shows up as a read timeout, not a hung test. */
    struct timeval tv = {.tv_sec = 3};
    ASSERT_OK(setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv));
    return fd;
}

static void raw_write(int fd, const void *p, size_t n)
{
    ASSERT_EQ(send(fd, p, n, MSG_NOSIGNAL), (long)n);
}

static void raw_read(int fd, void *p, size_t n)
{
    size_t off = 0;
    while (off < n) {
        long r = recv(fd, (uint8_t *)p + off, n - off, 0);
        if (r <= 0) TEST_FAIL("raw read: %s", r == 0 ? "EOF" : strerror(errno));
        off += (size_t)r;
    }
}

static void put_le(uint8_t *p, uint64_t v, int n)
{
    for (int i = 0; i < n; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* Send HELLO for job and return the type of the server's answer (its payload is skipped
 * into msg when it is a WIRE_ERROR). */
static int raw_hello(int fd, const char *job, char *msg, size_t msg_size)
{
    wire_writer w;
    wire_writer_init(&w, 256);
    wire_put_u16(&w, 1);
    wire_put_u32(&w, 99);
    wire_put_str(&w, job);
    ASSERT_EQ(w.failed, 0);
    uint8_t hdr[WIRE_HEADER_SIZE];
    wire_header_encode(hdr, WIRE_HELLO, 5, w.data, (uint32_t)w.len);
    raw_write(fd, hdr, sizeof hdr);
    raw_write(fd, w.data, w.len);
    wire_writer_free(&w);

    wire_header h;
    uint8_t payload[512];
    cirrus_error err = {0};
    raw_read(fd, hdr, sizeof hdr);
    ASSERT_OK(wire_header_decode(hdr, sizeof payload, &h, &err));
    ASSERT(h.request_id == 5);
    raw_read(fd, payload, h.payload_len);
    ASSERT(wire_checksum_ok(hdr, payload, h.payload_len));
    if (h.type == WIRE_ERROR) {
        wire_reader r;
        wire_reader_init(&r, payload, h.payload_len);
        ASSERT_EQ((int32_t)wire_get_u32(&r), CIRRUS_EMISMATCH);
        ASSERT_OK(wire_get_str(&r, msg, msg_size));
        ASSERT_OK(wire_reader_done(&r));
    }
    return h.type;
}

/* The abuser's view of being dropped: EOF or a reset, before its read timeout. Anything
 * the server said first (a WIRE_ERROR) is skipped. */
static void raw_expect_dropped(int fd)
{
    uint8_t buf[4096];
    for (;;) {
        long r = recv(fd, buf, sizeof buf, 0);
        if (r == 0 || (r < 0 && errno == ECONNRESET)) return;
        if (r < 0 && errno != EINTR) TEST_FAIL("not dropped: %s", strerror(errno));
    }
}

/* A frame header sealed with a correct checksum, for an abuser to tamper with. */
static void raw_header(uint8_t hdr[WIRE_HEADER_SIZE], const void *payload, uint32_t n)
{
    wire_header_encode(hdr, WIRE_PING, 77, payload, n);
}

/* The shape of every abuse test: a good client echoes, the abuser does its thing and is
 * dropped, the server recorded `code` with a message containing `what`, and the good
 * client (and a new one) are still served. No thread or descriptor outlives the test. */
static void abuse_test(void (*abuse)(int fd), int code, const char *what)
{
    int fds0 = count_fds();
    echo_server srv;
    server_start(&srv);
    net_conn *good = good_client(srv.port);
    echo_check(good, 1000, 1, 3);

    int fd = raw_connect(srv.port);
    abuse(fd);
    raw_expect_dropped(fd);
    close(fd);
    server_wait_ended(&srv, 1);
    pthread_mutex_lock(&srv.mu);
    int last = srv.last_error;
    char msg[256];
    memcpy(msg, srv.last_msg, sizeof msg);
    pthread_mutex_unlock(&srv.mu);
    if (last != code)
        TEST_FAIL("server recorded %d (%s: %s), expected %d", last, cirrus_strerror(last), msg,
                  code);
    if (!strstr(msg, what)) TEST_FAIL("server message '%s' does not say '%s'", msg, what);

    echo_check(good, 1000, 2, 3);
    echo_check(good, 300000, 3, 5);
    net_conn *again = good_client(srv.port);
    echo_check(again, 10, 4, 1);
    net_close(again);
    net_close(good);
    server_stop(&srv);
    ASSERT_EQ(count_fds(), fds0);
}

/* ---- round trips ---- */

TEST_T(conn_round_trip_sizes, 20)
{
    int fds0 = count_fds();
    echo_server srv;
    server_start(&srv);
    net_conn *c = good_client(srv.port);
    char want[32];
    snprintf(want, sizeof want, "127.0.0.1:%d", srv.port);
    ASSERT(strcmp(net_peer_name(c), want) == 0);
    echo_check(c, 0, 1, 1);
    echo_check(c, 1, 2, 1);
    echo_check(c, 1 << 20, 3, 4);
    echo_check(c, 1 << 20, 4, 100); /* more iovecs than one writev call takes */
    echo_check(c, 40u << 20, 5, 3);
    /* A tiny send buffer: hundreds of partial writes, landing mid-iovec. (A tiny receive
     * buffer would only meet delayed ACKs and crawl.) */
    int small = 4096;
    ASSERT_OK(setsockopt(net_fd(c), SOL_SOCKET, SO_SNDBUF, &small, sizeof small));
    for (int k = 0; k < 20; k++) echo_check(c, 1000 + 37 * (size_t)k, 10 + k, 1 + k);
    echo_check(c, 1 << 20, 8, 1000);
    echo_check(c, 7, 6, 2); /* a small frame after a big one reuses the buffer */
    pthread_mutex_lock(&srv.mu);
    ASSERT_EQ(srv.last_role, 7);
    ASSERT_EQ(srv.last_peer_id, 42);
    pthread_mutex_unlock(&srv.mu);
    net_close(c);
    server_wait_ended(&srv, 1);
    ASSERT_EQ(srv.last_error, CIRRUS_ECLOSED); /* a clean goodbye is not a protocol error */
    server_stop(&srv);
    ASSERT_EQ(count_fds(), fds0);
}

/* ---- deadlines ---- */

/* The peer is in the listen backlog, never accepted: nothing ever answers. */
TEST_T(conn_recv_deadline, 5)
{
    int lfd, port;
    cirrus_error err = {0};
    ASSERT_OK(net_listen("127.0.0.1", 0, &lfd, &port, &err));
    net_conn *c;
    ASSERT_OK(net_connect("127.0.0.1", port, T_MS, &c, &err));
    ASSERT_OK(net_send_frame(c, WIRE_PING, 1, NULL, 0, T_MS));
    wire_header h;
    const uint8_t *p;
    double t0 = now_ms();
    ASSERT_EQ(net_recv_frame(c, &h, &p, 200, &err), CIRRUS_ETIMEDOUT);
    double dt = now_ms() - t0;
    ASSERT_EQ(err.code, CIRRUS_ETIMEDOUT);
    ASSERT(dt >= 195 && dt < 600);
    /* And accept with nothing to accept twice over (the first connection is queued). */
    net_conn *a;
    ASSERT_OK(net_accept(lfd, 100, &a, &err));
    net_close(a);
    t0 = now_ms();
    ASSERT_EQ(net_accept(lfd, 100, &a, &err), CIRRUS_ETIMEDOUT);
    ASSERT((dt = now_ms() - t0) >= 95 && dt < 500);
    net_close(c);
    close(lfd);
}

typedef struct trickle {
    int fd;
    atomic_int stop;
} trickle;

static void *trickle_main(void *arg)
{
    trickle *t = arg;
    uint8_t hdr[WIRE_HEADER_SIZE];
    raw_header(hdr, NULL, 0);
    for (int i = 0; i < WIRE_HEADER_SIZE && !atomic_load(&t->stop); i++) {
        if (send(t->fd, hdr + i, 1, MSG_NOSIGNAL) != 1) break;
        usleep(20000);
    }
    return NULL;
}

/* One byte every 20 ms keeps every single read short, but the deadline is for the call. */
TEST_T(conn_deadline_is_per_call_not_per_read, 5)
{
    int lfd, port;
    cirrus_error err = {0};
    ASSERT_OK(net_listen("127.0.0.1", 0, &lfd, &port, &err));
    net_conn *c;
    ASSERT_OK(net_connect("127.0.0.1", port, T_MS, &c, &err));
    trickle t = {.fd = accept(lfd, NULL, NULL)};
    ASSERT(t.fd >= 0);
    pthread_t th;
    ASSERT_OK(pthread_create(&th, NULL, trickle_main, &t));
    wire_header h;
    const uint8_t *p;
    double t0 = now_ms();
    ASSERT_EQ(net_recv_frame(c, &h, &p, 200, &err), CIRRUS_ETIMEDOUT);
    double dt = now_ms() - t0;
    ASSERT(dt >= 195 && dt < 450);
    atomic_store(&t.stop, 1);
    pthread_join(th, NULL);
    close(t.fd);
    net_close(c);
    close(lfd);
}

/* A 40 MiB frame to a peer that never reads cannot fit in the socket buffers. */
TEST_T(conn_send_deadline, 5)
{
    int lfd, port;
    cirrus_error err = {0};
    ASSERT_OK(net_listen("127.0.0.1", 0, &lfd, &port, &err));
    net_conn *c;
    ASSERT_OK(net_connect("127.0.0.1", port, T_MS, &c, &err));
    size_t n = 40u << 20;
    uint8_t *buf = calloc(1, n);
    ASSERT(buf != NULL);
    double t0 = now_ms();
    ASSERT_EQ(net_send_frame(c, WIRE_PING, 1, buf, (uint32_t)n, 300), CIRRUS_ETIMEDOUT);
    double dt = now_ms() - t0;
    ASSERT(dt >= 295 && dt < 800);
    free(buf);
    net_close(c);
    close(lfd);
}

TEST_T(conn_connect_refused, 5)
{
    int lfd, port;
    cirrus_error err = {0};
    ASSERT_OK(net_listen("127.0.0.1", 0, &lfd, &port, &err));
    close(lfd); /* nothing listens on port now */
    net_conn *c = NULL;
    ASSERT_EQ(net_connect("127.0.0.1", port, T_MS, &c, &err), CIRRUS_EIO);
    ASSERT(strstr(err.msg, "refused") != NULL);
    ASSERT_EQ(net_connect("127.0.0.1", 70000, T_MS, &c, &err), CIRRUS_EINVAL);
}

/* ---- limits ---- */

TEST_T(conn_default_limit_refuses_64mib_plus_1, 20)
{
    int fds0 = count_fds();
    echo_server srv;
    server_start(&srv);
    net_conn *c = good_client(srv.port);
    echo_check(c, 64u << 20, 1, 2); /* exactly the limit is fine */

    size_t n = (64u << 20) + 1;
    uint8_t *buf = calloc(1, n);
    ASSERT(buf != NULL);
    /* The server drops us after the header, so the send may or may not see it. */
    int rc = net_send_frame(c, 200, 1, buf, (uint32_t)n, T_MS);
    ASSERT(rc == 0 || rc == CIRRUS_ECLOSED);
    wire_header h;
    const uint8_t *p;
    cirrus_error err = {0};
    ASSERT_EQ(net_recv_frame(c, &h, &p, T_MS, &err), CIRRUS_ECLOSED);
    server_wait_ended(&srv, 1);
    ASSERT_EQ(srv.last_error, CIRRUS_ECORRUPT);
    if (!strstr(srv.last_msg, "frame of 67108865 bytes exceeds the 67108864-byte limit"))
        TEST_FAIL("server said '%s'", srv.last_msg);
    free(buf);
    net_close(c);
    server_stop(&srv);
    ASSERT_EQ(count_fds(), fds0);
}

/* A connected pair in this thread; small frames fit the socket buffers. */
static void pair(int lfd, int port, net_conn **tx, net_conn **rx)
{
    cirrus_error err = {0};
    ASSERT_OK(net_connect("127.0.0.1", port, T_MS, tx, &err));
    ASSERT_OK(net_accept(lfd, T_MS, rx, &err));
}

TEST_T(conn_set_max_payload, 5)
{
    int lfd, port;
    cirrus_error err = {0};
    ASSERT_OK(net_listen("127.0.0.1", 0, &lfd, &port, &err));
    net_conn *tx, *rx;
    wire_header h;
    const uint8_t *p;
    uint8_t buf[1001] = {0};

    pair(lfd, port, &tx, &rx);
    net_set_max_payload(rx, 1000);
    ASSERT_OK(net_send_frame(tx, WIRE_PING, 1, buf, 1000, T_MS));
    ASSERT_OK(net_recv_frame(rx, &h, &p, T_MS, &err));
    ASSERT_EQ(h.payload_len, 1000);
    ASSERT_OK(net_send_frame(tx, WIRE_PING, 2, buf, 1001, T_MS));
    ASSERT_EQ(net_recv_frame(rx, &h, &p, T_MS, &err), CIRRUS_ECORRUPT);
    if (!strstr(err.msg, "frame of 1001 bytes exceeds the 1000-byte limit"))
        TEST_FAIL("message '%s'", err.msg);
    net_close(tx), net_close(rx);

    /* A limit above WIRE_MAX_PAYLOAD is clamped to it (header written raw: no 256 MiB). */
    pair(lfd, port, &tx, &rx);
    net_set_max_payload(rx, UINT32_MAX);
    uint8_t hdr[WIRE_HEADER_SIZE];
    raw_header(hdr, NULL, 0);
    put_le(hdr + 16, (uint64_t)WIRE_MAX_PAYLOAD + 1, 4);
    raw_write(net_fd(tx), hdr, sizeof hdr);
    ASSERT_EQ(net_recv_frame(rx, &h, &p, T_MS, &err), CIRRUS_ECORRUPT);
    ASSERT(strstr(err.msg, "exceeds the 268435456-byte limit") != NULL);
    net_close(tx), net_close(rx);

    /* Sending more than WIRE_MAX_PAYLOAD, or a type outside 1..255, is refused locally. */
    pair(lfd, port, &tx, &rx);
    struct iovec big[2] = {{buf, WIRE_MAX_PAYLOAD}, {buf, 1}};
    ASSERT_EQ(net_send_framev(tx, WIRE_PING, 3, big, 2, T_MS), CIRRUS_EINVAL);
    ASSERT_EQ(net_send_frame(tx, 0, 3, NULL, 0, T_MS), CIRRUS_EINVAL);
    ASSERT_EQ(net_send_frame(tx, 256, 3, NULL, 0, T_MS), CIRRUS_EINVAL);
    net_close(tx), net_close(rx);
    close(lfd);
}

typedef struct bulk_send {
    net_conn *tx;
    const uint8_t *buf;
    uint32_t len;
    int rc;
} bulk_send;

static void *bulk_send_main(void *arg)
{
    bulk_send *b = arg;
    b->rc = net_send_frame(b->tx, WIRE_PING, 42, b->buf, b->len, T_MS);
    return NULL;
}

/* net_recv_frame_into: a frame many socket buffers long lands whole in the caller's buffer;
 * ordinary receives on the same connection then wake for any byte again (a mark left at
 * the bulk size would stall them until their deadline); a frame of another length, a bad
 * checksum and a length over the connection's limit are refused with messages. */
TEST_T(conn_recv_frame_into, 20)
{
    enum { BIG = 8 << 20 };
    int lfd, port;
    cirrus_error err = {0};
    ASSERT_OK(net_listen("127.0.0.1", 0, &lfd, &port, &err));
    net_conn *tx, *rx;
    wire_header h;
    const uint8_t *p;
    uint8_t *src = malloc(BIG), *dst = malloc(BIG);
    fill(src, BIG, 7);

    pair(lfd, port, &tx, &rx);
    for (int round = 0; round < 2; round++) {
        bulk_send b = {.tx = tx, .buf = src, .len = BIG};
        pthread_t th;
        ASSERT(pthread_create(&th, NULL, bulk_send_main, &b) == 0);
        memset(dst, 0, BIG);
        ASSERT_OK(net_recv_frame_into(rx, &h, dst, BIG, T_MS, &err));
        pthread_join(th, NULL);
        ASSERT_OK(b.rc);
        ASSERT_EQ(h.type, WIRE_PING);
        ASSERT(h.request_id == 42);
        ASSERT(memcmp(src, dst, BIG) == 0);
        /* A 10-byte frame, sent 50 ms later, arrives long before a 1 s deadline. */
        double t0 = now_ms();
        ASSERT_OK(net_send_frame(tx, WIRE_PING, 43, src, 10, T_MS));
        ASSERT_OK(net_recv_frame(rx, &h, &p, 1000, &err));
        ASSERT_EQ(h.payload_len, 10);
        ASSERT_LT(now_ms() - t0, 500);
    }

    /* A well-formed frame shorter than expected: a protocol error once the deadline ends
     * the wait, not a timeout. */
    ASSERT_OK(net_send_frame(tx, WIRE_PING, 44, src, 16, T_MS));
    ASSERT_EQ(net_recv_frame_into(rx, &h, dst, 4096, 200, &err), CIRRUS_ECORRUPT);
    if (!strstr(err.msg, "frame of 16 bytes (type 4) where one of 4096 was expected"))
        TEST_FAIL("message '%s'", err.msg);
    net_close(tx), net_close(rx);

    /* Longer than expected: refused from the header alone. */
    pair(lfd, port, &tx, &rx);
    ASSERT_OK(net_send_frame(tx, WIRE_PING, 45, src, 5000, T_MS));
    ASSERT_EQ(net_recv_frame_into(rx, &h, dst, 4096, T_MS, &err), CIRRUS_ECORRUPT);
    net_close(tx), net_close(rx);

    /* A payload changed after its checksum was computed. */
    pair(lfd, port, &tx, &rx);
    uint8_t hdr[WIRE_HEADER_SIZE];
    wire_header_encode(hdr, WIRE_PING, 46, src, 4096);
    raw_write(net_fd(tx), hdr, sizeof hdr);
    src[0] ^= 1;
    raw_write(net_fd(tx), src, 4096);
    ASSERT_EQ(net_recv_frame_into(rx, &h, dst, 4096, T_MS, &err), CIRRUS_ECORRUPT);
    if (!strstr(err.msg, "checksum")) TEST_FAIL("message '%s'", err.msg);
    net_close(tx), net_close(rx);

    /* Half a frame, then nothing: a timeout naming how much came. */
    pair(lfd, port, &tx, &rx);
    raw_write(net_fd(tx), hdr, sizeof hdr);
    raw_write(net_fd(tx), src, 1000);
    ASSERT_EQ(net_recv_frame_into(rx, &h, dst, 4096, 200, &err), CIRRUS_ETIMEDOUT);
    if (!strstr(err.msg, "1032 bytes received")) TEST_FAIL("message '%s'", err.msg);
    net_close(tx), net_close(rx);

    /* More than the connection accepts: refused before reading anything. */
    pair(lfd, port, &tx, &rx);
    net_set_max_payload(rx, 1000);
    ASSERT_EQ(net_recv_frame_into(rx, &h, dst, 1001, T_MS, &err), CIRRUS_EINVAL);
    net_close(tx), net_close(rx);
    close(lfd);
    free(src), free(dst);
}

/* ---- the handshake, seen from a conn.c client ---- */

TEST_T(conn_hello_wrong_job_id_client_side, 5)
{
    int fds0 = count_fds();
    echo_server srv;
    server_start(&srv);
    net_conn *c;
    cirrus_error err = {0};
    ASSERT_OK(net_connect("127.0.0.1", srv.port, T_MS, &c, &err));
    ASSERT_EQ(net_hello_client(c, "job-B", 1, 2, T_MS, &err), CIRRUS_EMISMATCH);
    if (!strstr(err.msg, "wrong job id 'job-B'")) TEST_FAIL("client message '%s'", err.msg);
    wire_header h;
    const uint8_t *p;
    ASSERT_EQ(net_recv_frame(c, &h, &p, T_MS, &err), CIRRUS_ECLOSED);
    server_wait_ended(&srv, 1);
    ASSERT_EQ(srv.last_error, CIRRUS_EMISMATCH);
    net_close(c);

    /* Job ids outside 1..WIRE_JOB_ID_MAX bytes are refused before anything is sent. */
    char long_id[WIRE_JOB_ID_MAX + 2];
    memset(long_id, 'j', sizeof long_id - 1);
    long_id[sizeof long_id - 1] = '\0';
    ASSERT_OK(net_connect("127.0.0.1", srv.port, T_MS, &c, &err));
    ASSERT_EQ(net_hello_client(c, "", 1, 2, T_MS, &err), CIRRUS_EINVAL);
    ASSERT_EQ(net_hello_client(c, long_id, 1, 2, T_MS, &err), CIRRUS_EINVAL);
    long_id[WIRE_JOB_ID_MAX] = '\0'; /* exactly the maximum: valid, just not this job */
    ASSERT_EQ(net_hello_client(c, long_id, 1, 2, T_MS, &err), CIRRUS_EMISMATCH);
    net_close(c);
    server_stop(&srv);
    ASSERT_EQ(count_fds(), fds0);
}

/* ---- protocol abuse, one test each ---- */

static void abuse_garbage(int fd)
{
    uint8_t junk[64];
    fill(junk, sizeof junk, 99);
    raw_write(fd, junk, sizeof junk);
}
TEST_T(conn_abuse_garbage_bytes, 10)
{
    abuse_test(abuse_garbage, CIRRUS_ECORRUPT, "magic");
}

static void abuse_wrong_magic(int fd)
{
    ASSERT_EQ(raw_hello(fd, JOB, NULL, 0), WIRE_HELLO_OK);
    uint8_t hdr[WIRE_HEADER_SIZE];
    raw_header(hdr, NULL, 0);
    hdr[3] = 'T'; /* "CRRT" */
    raw_write(fd, hdr, sizeof hdr);
}
TEST_T(conn_abuse_wrong_magic, 10)
{
    abuse_test(abuse_wrong_magic, CIRRUS_ECORRUPT, "bad frame magic 0x54525243");
}

static void abuse_huge_length(int fd)
{
    ASSERT_EQ(raw_hello(fd, JOB, NULL, 0), WIRE_HELLO_OK);
    uint8_t hdr[WIRE_HEADER_SIZE];
    raw_header(hdr, NULL, 0);
    put_le(hdr + 16, 1u << 31, 4);
    raw_write(fd, hdr, sizeof hdr);
}
TEST_T(conn_abuse_payload_len_2g, 10)
{
    abuse_test(abuse_huge_length, CIRRUS_ECORRUPT,
               "frame of 2147483648 bytes exceeds the 67108864-byte limit");
}

static void abuse_truncated(int fd)
{
    ASSERT_EQ(raw_hello(fd, JOB, NULL, 0), WIRE_HELLO_OK);
    uint8_t hdr[WIRE_HEADER_SIZE], body[100] = {0};
    raw_header(hdr, NULL, 0);
    put_le(hdr + 16, 1000, 4);
    raw_write(fd, hdr, sizeof hdr);
    raw_write(fd, body, sizeof body);
    shutdown(fd, SHUT_WR); /* closed: 900 promised bytes never come */
}
TEST_T(conn_abuse_truncated_frame, 10)
{
    abuse_test(abuse_truncated, CIRRUS_ETRUNC, "connection closed mid-frame");
}

static void abuse_wrong_job(int fd)
{
    char msg[256];
    ASSERT_EQ(raw_hello(fd, "job-B", msg, sizeof msg), WIRE_ERROR);
    if (strcmp(msg, "wrong job id 'job-B'") != 0) TEST_FAIL("WIRE_ERROR said '%s'", msg);
}
TEST_T(conn_abuse_wrong_job_id, 10)
{
    abuse_test(abuse_wrong_job, CIRRUS_EMISMATCH, "wrong job id 'job-B'");
}

static void abuse_frame_before_hello(int fd)
{
    uint8_t hdr[WIRE_HEADER_SIZE];
    raw_header(hdr, NULL, 0);
    raw_write(fd, hdr, sizeof hdr);
}
TEST_T(conn_abuse_frame_before_hello, 10)
{
    abuse_test(abuse_frame_before_hello, CIRRUS_ECORRUPT, "expected HELLO");
}

static void abuse_bad_checksum(int fd)
{
    ASSERT_EQ(raw_hello(fd, JOB, NULL, 0), WIRE_HELLO_OK);
    uint8_t hdr[WIRE_HEADER_SIZE], body[16] = "sixteen bytes!!";
    raw_header(hdr, body, sizeof body);
    body[5] ^= 0x10; /* one bit flipped "in transit" */
    raw_write(fd, hdr, sizeof hdr);
    raw_write(fd, body, sizeof body);
}
TEST_T(conn_abuse_bad_checksum, 10)
{
    abuse_test(abuse_bad_checksum, CIRRUS_ECORRUPT, "checksum mismatch");
}

/* A job id one byte over the maximum, and trailing bytes after a HELLO. */
static void abuse_malformed_hello(int fd)
{
    uint8_t payload[2 + 4 + 2 + WIRE_JOB_ID_MAX + 1], hdr[WIRE_HEADER_SIZE];
    memset(payload, 'j', sizeof payload);
    put_le(payload + 6, WIRE_JOB_ID_MAX + 1, 2);
    wire_header_encode(hdr, WIRE_HELLO, 5, payload, sizeof payload);
    raw_write(fd, hdr, sizeof hdr);
    raw_write(fd, payload, sizeof payload);
}
TEST_T(conn_abuse_malformed_hello, 10)
{
    abuse_test(abuse_malformed_hello, CIRRUS_ECORRUPT, "malformed HELLO");
}
