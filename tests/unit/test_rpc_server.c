/* rpc_server: the caps that keep a flood from filling a server, the reply and refusal
 * rules, and a clean stop. Real sockets on loopback; the flood comes from 127.0.0.2, the
 * legitimate client from 127.0.0.1 (Linux routes all of 127/8 to lo). */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "../../trainer/swarm/proto/rpc.h"
#include "../../trainer/swarm/proto/rpc_server.h"
#include "test.h"

enum { ECHO = 200, BROKEN = 202, REFUSED = 204 }; /* types no Cirrus server uses */

/* ECHO answers its payload; BROKEN is malformed (drop); REFUSED a refusal that keeps the
 * connection. */
static int echo_handle(void *ctx, rpc_server_conn *sc, const wire_header *h,
                       const uint8_t *payload, wire_writer *reply, int *drop, cirrus_error *err)
{
    (void)ctx;
    (void)sc;
    if (h->type == ECHO) {
        wire_put_bytes(reply, payload, h->payload_len);
        return 0;
    }
    if (h->type == REFUSED) return cirrus_fail(err, CIRRUS_ENOENT, "no such thing");
    *drop = 1;
    return cirrus_fail(err, CIRRUS_ECORRUPT, "request type %u is not ours", h->type);
}

static rpc_server *start(int *port, int max_conns, uint32_t idle_ms, int hello_ms)
{
    int lfd;
    if (net_listen("127.0.0.1", 0, &lfd, port, NULL)) return NULL;
    const rpc_server_options o = {.what = "test server", .listen_fd = lfd, .job_id = "rpc-test",
                                  .hello_timeout_ms = hello_ms, .io_timeout_ms = 2000,
                                  .max_payload = 1 << 16, .reply_limit = 1 << 16,
                                  .idle_ms = idle_ms, .max_conns = max_conns, .poll_ms = 20,
                                  .handle = echo_handle};
    rpc_server *s = NULL;
    return rpc_server_start(&o, &s, NULL) ? NULL : s;
}

/* A connection from `from` (an address on lo) that sends nothing; -1 if refused. */
static int silent_from(const char *from, int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in src = {.sin_family = AF_INET}, dst = {.sin_family = AF_INET,
                                                             .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, from, &src.sin_addr);
    inet_pton(AF_INET, "127.0.0.1", &dst.sin_addr);
    if (fd < 0 || bind(fd, (struct sockaddr *)&src, sizeof src) ||
        connect(fd, (struct sockaddr *)&dst, sizeof dst)) {
        if (fd >= 0) close(fd);
        return -1;
    }
    return fd;
}

/* n silent connections, each from an address of its own (127.0.0.10 on); 0 if one was
 * refused. */
static int silent_from_many(int port, int *fds, int n)
{
    char from[32];
    for (int i = 0; i < n; i++) {
        snprintf(from, sizeof from, "127.0.0.%d", 10 + i);
        if ((fds[i] = silent_from(from, port)) < 0) return 0;
    }
    return 1;
}

/* Whether the other end closed fd within ms. */
static int closed_within(int fd, int ms)
{
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    char b;
    return poll(&pfd, 1, ms) == 1 && recv(fd, &b, 1, MSG_DONTWAIT) == 0;
}

static int echo(net_conn *c, uint64_t id, const char *text, cirrus_error *err)
{
    wire_writer w;
    wire_writer_init(&w, 1024);
    wire_put_bytes(&w, text, strlen(text));
    int rc = rpc_send(c, ECHO, id, &w, 2000, "test server", err);
    wire_writer_free(&w);
    wire_reader r;
    if (!rc) rc = rpc_await(c, ECHO, id, 2000, "test server", &r, err);
    if (!rc && (r.len != strlen(text) || memcmp(r.data, text, r.len)))
        rc = cirrus_fail(err, CIRRUS_ECORRUPT, "echo came back changed");
    return rc;
}

static int client(int port, net_conn **c, cirrus_error *err)
{
    int rc = net_connect("127.0.0.1", port, 2000, c, err);
    if (!rc) rc = net_hello_client(*c, "rpc-test", 1, 7, 2000, err);
    return rc;
}

/* Waits up to 2 s for the server's count of connections before HELLO (or, with `open`,
 * of all connections: threads gone) to reach n. */
static int count_reaches(rpc_server *s, int open, int n)
{
    rpc_server_counts c;
    for (int i = 0; i < 200; i++) {
        rpc_server_get_counts(s, &c);
        if ((open ? c.open : c.in_hello) == n) return 1;
        usleep(10 * 1000);
    }
    return 0;
}
#define in_hello_reaches(s, n) count_reaches(s, 0, n)

/* Silent connections from one address hold at most max_hellos_per_addr slots (16 / 8 -> 4
 * here): each newcomer past that shuts the oldest down, none is refused, and a client from
 * another address is served meanwhile; the last four go at the HELLO deadline. */
TEST(rpc_server_caps_silent_connections_per_address)
{
    int port;
    rpc_server *s = start(&port, 16, 0, 600);
    ASSERT(s);
    enum { FLOOD = 12 };
    int fds[FLOOD];
    for (int i = 0; i < FLOOD; i++) {
        ASSERT((fds[i] = silent_from("127.0.0.2", port)) >= 0);
        usleep(5 * 1000); /* accepted in this order: the oldest is the first */
    }
    int closed = 0;
    for (int i = 0; i < FLOOD - 4; i++) closed += closed_within(fds[i], 2000);
    ASSERT_EQ(closed, FLOOD - 4);
    ASSERT(in_hello_reaches(s, 4));
    rpc_server_counts n;
    rpc_server_get_counts(s, &n);
    ASSERT_EQ(n.evicted, (uint64_t)(FLOOD - 4));
    ASSERT_EQ(n.refused, 0u);
    net_conn *c = NULL;
    cirrus_error err = {0};
    if (client(port, &c, &err) || echo(c, 1, "served beside the flood", &err))
        TEST_FAIL("%s", err.msg);
    /* The newest four are dropped at their HELLO deadline (600 ms). */
    for (int i = FLOOD - 4; i < FLOOD; i++) ASSERT(closed_within(fds[i], 3000));
    ASSERT(in_hello_reaches(s, 0));
    ASSERT(count_reaches(s, 1, 1)); /* their threads gone */
    for (int i = 0; i < FLOOD; i++) close(fds[i]);
    net_close(c);
    rpc_server_stop(s);
}

/* From many addresses, connections before HELLO are bounded by max_conns / 4 (4 of 16
 * here) in all: the oldest make room, the connections already served are untouched. */
TEST(rpc_server_caps_silent_connections_in_all)
{
    int port;
    rpc_server *s = start(&port, 16, 0, 10000);
    ASSERT(s);
    net_conn *c = NULL;
    cirrus_error err = {0};
    if (client(port, &c, &err) || echo(c, 1, "before", &err)) TEST_FAIL("%s", err.msg);
    enum { FLOOD = 40 };
    int fds[FLOOD];
    ASSERT(silent_from_many(port, fds, FLOOD));
    rpc_server_counts n;
    for (int i = 0; i < 200; i++) { /* every one accepted */
        rpc_server_get_counts(s, &n);
        if (n.accepted == FLOOD + 1) break;
        usleep(10 * 1000);
    }
    if (!in_hello_reaches(s, 4)) {
        rpc_server_get_counts(s, &n);
        TEST_FAIL("in hello %d, open %d, accepted %llu, evicted %llu, refused %llu", n.in_hello,
                  n.open, (unsigned long long)n.accepted, (unsigned long long)n.evicted,
                  (unsigned long long)n.refused);
    }
    ASSERT(count_reaches(s, 1, 5)); /* the evicted threads gone */
    rpc_server_get_counts(s, &n);
    /* Shut down to make room, or (while every slot was still held by threads on their way
     * out) closed on accept; never the served one. */
    ASSERT_EQ(n.evicted + n.refused, (uint64_t)(FLOOD - 4));
    ASSERT(n.evicted >= 1);
    if (echo(c, 2, "the served one is untouched", &err)) TEST_FAIL("%s", err.msg);
    net_conn *c2 = NULL;
    if (client(port, &c2, &err) || echo(c2, 1, "a newcomer is served", &err))
        TEST_FAIL("%s", err.msg);
    for (int i = 0; i < FLOOD; i++) close(fds[i]);
    net_close(c2);
    net_close(c);
    rpc_server_stop(s);
}

/* A client whose HELLO has begun (its header in, the payload on its way: a slow client's
 * thread not yet at it) is never the oldest shut down: a flood from 40 addresses against 16
 * slots before HELLO (64 / 4) cycles around it, and its HELLO then completes and it is served. */
TEST(rpc_server_never_evicts_a_hello_under_way)
{
    int port;
    rpc_server *s = start(&port, 64, 0, 10000);
    ASSERT(s);
    wire_writer w;
    wire_writer_init(&w, 64);
    wire_put_u16(&w, 1);
    wire_put_u32(&w, 7);
    wire_put_str(&w, "rpc-test");
    uint8_t hdr[WIRE_HEADER_SIZE];
    wire_header_encode(hdr, WIRE_HELLO, 1, w.data, (uint32_t)w.len);
    const int slow = silent_from("127.0.0.1", port);
    ASSERT(slow >= 0);
    ASSERT(send(slow, hdr, sizeof hdr, 0) == (ssize_t)sizeof hdr);
    usleep(50 * 1000); /* the oldest connection before HELLO, by far */
    enum { FLOOD = 40 };
    int fds[FLOOD];
    ASSERT(silent_from_many(port, fds, FLOOD));
    rpc_server_counts n;
    for (int i = 0; i < 200; i++) { /* every one accepted, the flood's oldest evicted */
        rpc_server_get_counts(s, &n);
        if (n.accepted == FLOOD + 1 && n.evicted >= FLOOD + 1 - 16) break;
        usleep(10 * 1000);
    }
    ASSERT(n.evicted >= FLOOD + 1 - 16);
    ASSERT(!closed_within(slow, 100));
    ASSERT(send(slow, w.data, w.len, 0) == (ssize_t)w.len);
    uint8_t got[WIRE_HEADER_SIZE];
    wire_header h;
    struct timeval tv = {2, 0};
    setsockopt(slow, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    ASSERT(recv(slow, got, sizeof got, MSG_WAITALL) == (ssize_t)sizeof got);
    ASSERT(wire_header_decode(got, 0, &h, NULL) == 0);
    ASSERT_EQ(h.type, WIRE_HELLO_OK);
    wire_writer_free(&w);
    for (int i = 0; i < FLOOD; i++) close(fds[i]);
    close(slow);
    rpc_server_stop(s);
}

/* max_conns bounds the connections served, HELLO done or not. */
TEST(rpc_server_caps_connections)
{
    int port;
    rpc_server *s = start(&port, 3, 0, 600);
    ASSERT(s);
    net_conn *c[4] = {0};
    cirrus_error err = {0};
    for (int i = 0; i < 3; i++)
        if (client(port, &c[i], &err) || echo(c[i], 1, "x", &err)) TEST_FAIL("%s", err.msg);
    /* The fourth is closed on accept: its HELLO fails. */
    ASSERT(client(port, &c[3], &err) != 0);
    net_close(c[3]);
    rpc_server_counts n;
    rpc_server_get_counts(s, &n);
    ASSERT_EQ(n.open, 3);
    ASSERT_EQ(n.refused, 1u);
    /* One leaves: a newcomer is served. */
    net_close(c[0]);
    int rc = -1;
    for (int attempt = 0; attempt < 50 && rc; attempt++) {
        rc = client(port, &c[0], &err);
        if (!rc) rc = echo(c[0], 2, "y", &err);
        if (rc) {
            net_close(c[0]);
            c[0] = NULL;
            usleep(20 * 1000);
        }
    }
    if (rc) TEST_FAIL("a newcomer after one left: %s", err.msg);
    for (int i = 0; i < 3; i++) net_close(c[i]);
    rpc_server_stop(s);
}

/* A refusal keeps the connection; a malformed request is refused and then dropped; an idle
 * connection is closed after idle_ms. */
TEST(rpc_server_refusals_and_idle)
{
    int port;
    rpc_server *s = start(&port, 8, 300, 600);
    ASSERT(s);
    net_conn *c = NULL;
    cirrus_error err = {0};
    if (client(port, &c, &err)) TEST_FAIL("%s", err.msg);
    wire_writer w;
    wire_writer_init(&w, 16);
    wire_reader r;
    ASSERT_OK(rpc_send(c, REFUSED, 1, &w, 2000, "t", &err));
    ASSERT_EQ(rpc_await(c, REFUSED, 1, 2000, "t", &r, &err), CIRRUS_ENOENT);
    ASSERT(strstr(err.msg, "no such thing"));
    if (echo(c, 2, "still served", &err)) TEST_FAIL("%s", err.msg);
    ASSERT_OK(rpc_send(c, BROKEN, 3, &w, 2000, "t", &err));
    ASSERT_EQ(rpc_await(c, BROKEN, 3, 2000, "t", &r, &err), CIRRUS_EINVAL); /* ECORRUPT maps */
    ASSERT(closed_within(net_fd(c), 2000));
    net_close(c);
    /* Idle: closed after 300 ms of silence, not before. */
    if (client(port, &c, &err)) TEST_FAIL("%s", err.msg);
    ASSERT(!closed_within(net_fd(c), 100));
    ASSERT(closed_within(net_fd(c), 3000));
    net_close(c);
    wire_writer_free(&w);
    rpc_server_stop(s);
}

/* Stopping does not wait for silent connections' HELLO deadline. */
TEST(rpc_server_stops_without_waiting_for_hellos)
{
    int port;
    rpc_server *s = start(&port, 16, 0, 10000);
    ASSERT(s);
    int fds[3];
    for (int i = 0; i < 3; i++) ASSERT((fds[i] = silent_from("127.0.0.3", port)) >= 0);
    ASSERT(in_hello_reaches(s, 3));
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    rpc_server_stop(s);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    const double took = (double)(t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) * 1e-9;
    ASSERT(took < 5.0); /* the HELLO deadline is 10 s */
    for (int i = 0; i < 3; i++) {
        ASSERT(closed_within(fds[i], 1000));
        close(fds[i]);
    }
}
