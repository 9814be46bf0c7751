/* coord_test_util: the coordinator tests' shared helpers. See coord_test_util.h. */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "../../trainer/net/conn.h"
#include "../../trainer/swarm/coord/coordinator.h"
#include "coord_test_util.h"
#include "test.h"

/* ---- helpers ---- */

double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Open descriptors, to show that stopping closes every socket the coordinator opened. */
int count_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    ASSERT(d != NULL);
    int n = 0;
    while (readdir(d)) n++;
    closedir(d);
    return n;
}

coordinator *start_at(uint32_t n_stages, uint32_t hb_ms, uint32_t expire_ms, int port,
                             uint64_t epoch)
{
    coordinator_options o = {.job_id = JOB, .host = "127.0.0.1", .port = port, .http_port = 0,
                             .n_stages = n_stages, .n_layer = 8, .heartbeat_ms = hb_ms,
                             .expire_ms = expire_ms, .epoch = epoch};
    coordinator *co = NULL;
    cirrus_error err = {0};
    if (coordinator_start(&o, &co, &err)) TEST_FAIL("coordinator_start: %s", err.msg);
    ASSERT(coordinator_port(co) > 0);
    ASSERT(coordinator_http_port(co) > 0);
    return co;
}

coordinator *start(uint32_t n_stages) { return start_at(n_stages, 1000, 0, 0, 0); }

coord_registration stage_reg(const char *name, uint32_t stage, uint32_t l0, uint32_t l1,
                                    uint16_t port, double throughput)
{
    coord_registration r = {.role = COORD_ROLE_STAGE, .stage = stage, .l0 = l0, .l1 = l1,
                            .port = port, .throughput = throughput};
    snprintf(r.name, sizeof r.name, "%s", name);
    snprintf(r.host, sizeof r.host, "127.0.0.1");
    return r;
}

coord_registration client_reg(const char *name)
{
    coord_registration r = {.role = COORD_ROLE_CLIENT, .stage = COORD_NO_STAGE};
    snprintf(r.name, sizeof r.name, "%s", name);
    return r;
}

coord_client *client_at(int port)
{
    coord_client *c = NULL;
    cirrus_error err = {0};
    if (coord_client_open("127.0.0.1", port, JOB, &c, &err))
        TEST_FAIL("coord_client_open: %s", err.msg);
    return c;
}

/* A member: a client handle, registered as r. */
coord_client *join(coordinator *co, coord_registration r, coord_registered *out)
{
    coord_client *c = client_at(coordinator_port(co));
    coord_registered id;
    cirrus_error err = {0};
    if (coord_client_register(c, &r, T_MS, &id, &err)) TEST_FAIL("register: %s", err.msg);
    if (out) *out = id;
    return c;
}

void heartbeat(coord_client *c, const coord_stats *s, uint32_t *instruction,
                      int *rereg)
{
    cirrus_error err = {0};
    if (coord_client_heartbeat(c, s, T_MS, instruction, rereg, &err))
        TEST_FAIL("heartbeat: %s", err.msg);
}

size_t list_peers(coord_client *c, uint32_t stage, coord_peer_info **out)
{
    coord_peer_info *p = NULL;
    size_t n = 0;
    cirrus_error err = {0};
    if (coord_client_peers(c, stage, T_MS, &p, &n, NULL, &err)) TEST_FAIL("peers: %s", err.msg);
    if (out) *out = p;
    else free(p);
    return n;
}

const coord_peer_info *by_id(const coord_peer_info *p, size_t n, uint32_t id)
{
    for (size_t i = 0; i < n; i++)
        if (p[i].id == id) return &p[i];
    return NULL;
}

/* ---- HTTP over a plain socket ---- */


void http_req(int port, const char *method, const char *path, http_reply *r)
{
    memset(r, 0, sizeof *r);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ASSERT(fd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof a)) TEST_FAIL("connect: %s", strerror(errno));
    char req[512];
    int n = snprintf(req, sizeof req,
                     "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
                     "Content-Length: 0\r\n\r\n", method, path);
    ASSERT_EQ(send(fd, req, (size_t)n, MSG_NOSIGNAL), n);
    size_t cap = 1 << 20, len = 0;
    char *buf = malloc(cap + 1);
    ASSERT(buf != NULL);
    double deadline = now_ms() + T_MS;
    for (;;) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int left = (int)(deadline - now_ms());
        if (left <= 0) TEST_FAIL("HTTP %s %s: no complete answer in time", method, path);
        if (poll(&p, 1, left) <= 0) continue;
        ssize_t got = recv(fd, buf + len, cap - len, 0);
        if (got == 0) break;
        if (got < 0) TEST_FAIL("recv: %s", strerror(errno));
        len += (size_t)got;
        ASSERT(len < cap);
    }
    close(fd);
    buf[len] = '\0';
    ASSERT_EQ(sscanf(buf, "HTTP/1.1 %d", &r->status), 1);
    char *end = strstr(buf, "\r\n\r\n");
    ASSERT(end != NULL);
    size_t head = (size_t)(end - buf);
    ASSERT(head < sizeof r->head);
    memcpy(r->head, buf, head);
    r->head[head] = '\0';
    r->body_len = len - head - 4;
    r->body = malloc(r->body_len + 1);
    ASSERT(r->body != NULL);
    memcpy(r->body, end + 4, r->body_len + 1);
    free(buf);
}

int has_header(const http_reply *r, const char *line)
{
    return strcasestr(r->head, line) != NULL;
}

json_t *get_status(coordinator *co)
{
    http_reply r;
    http_req(coordinator_http_port(co), "GET", "/status", &r);
    ASSERT_EQ(r.status, 200);
    ASSERT(has_header(&r, "\r\nContent-Type: application/json"));
    json_error_t je;
    json_t *j = json_loads(r.body, 0, &je);
    if (!j) TEST_FAIL("/status is not JSON (line %d: %s): %s", je.line, je.text, r.body);
    free(r.body);
    return j;
}

char *get_metrics(coordinator *co)
{
    http_reply r;
    http_req(coordinator_http_port(co), "GET", "/metrics", &r);
    ASSERT_EQ(r.status, 200);
    ASSERT(has_header(&r, "\r\nContent-Type: text/plain; version=0.0.4"));
    return r.body;
}

json_int_t jint(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    if (!json_is_integer(v)) TEST_FAIL("'%s' is not an integer", key);
    return json_integer_value(v);
}

double jnum(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    if (!json_is_number(v)) TEST_FAIL("'%s' is not a number", key);
    return json_number_value(v);
}

void has_line(const char *text, const char *line)
{
    size_t n = strlen(line);
    for (const char *p = text; (p = strstr(p, line)); p++)
        if ((p == text || p[-1] == '\n') && p[n] == '\n') return;
    TEST_FAIL("no line '%s' in:\n%s", line, text);
}

/* ---- raw protocol access, for abuse ---- */

net_conn *raw_connect(int port)
{
    net_conn *c = NULL;
    cirrus_error err = {0};
    if (net_connect("127.0.0.1", port, T_MS, &c, &err)) TEST_FAIL("connect: %s", err.msg);
    if (net_hello_client(c, JOB, COORD_ROLE_STAGE, 0, T_MS, &err))
        TEST_FAIL("hello: %s", err.msg);
    return c;
}

/* Send one request; return the reply type. An ERROR reply fills *code and msg. */
int raw_call(net_conn *c, uint16_t type, const void *p, size_t n, int *code,
                    char msg[256])
{
    static uint64_t rid = 100;
    ASSERT_OK(net_send_frame(c, type, ++rid, p, (uint32_t)n, T_MS));
    wire_header h;
    const uint8_t *rp;
    cirrus_error err = {0};
    if (net_recv_frame(c, &h, &rp, T_MS, &err)) TEST_FAIL("raw recv: %s", err.msg);
    ASSERT_EQ(h.request_id, rid);
    if (h.type == WIRE_ERROR) {
        wire_reader r;
        wire_reader_init(&r, rp, h.payload_len);
        *code = (int32_t)wire_get_u32(&r);
        ASSERT_OK(wire_get_str(&r, msg, 256));
        ASSERT_OK(wire_reader_done(&r));
    }
    return h.type;
}

/* The coordinator closed this connection: the next receive sees EOF, not a timeout. */
void assert_dropped(net_conn *c)
{
    wire_header h;
    const uint8_t *p;
    cirrus_error err = {0};
    int rc = net_recv_frame(c, &h, &p, T_MS, &err);
    if (rc != CIRRUS_ECLOSED) TEST_FAIL("connection not dropped: %d (%s)", rc, err.msg);
}

/* Send a malformed request; it must be answered ERROR(ECORRUPT) naming `what`, then the
 * connection closed. */
void expect_refused(int port, uint16_t type, const void *p, size_t n, const char *what)
{
    net_conn *c = raw_connect(port);
    int code = 0;
    char msg[256] = "";
    ASSERT_EQ(raw_call(c, type, p, n, &code, msg), WIRE_ERROR);
    ASSERT_EQ(code, CIRRUS_ECORRUPT);
    if (!strstr(msg, what)) TEST_FAIL("error '%s' does not say '%s'", msg, what);
    assert_dropped(c);
    net_close(c);
}


/* ---- a member that heartbeats every interval from its own thread ---- */

static void *beat_main(void *arg)
{
    beater *b = arg;
    coord_stats s = {.loss = NAN, .fwd_throughput = 5};
    while (!atomic_load(&b->stop)) {
        int rereg = 0;
        cirrus_error err = {0};
        s.samples += 8;
        if (coord_client_heartbeat(b->c, &s, 1000, NULL, &rereg, &err)) {
            b->failures++;
            memcpy(b->last_error, err.msg, sizeof err.msg);
        }
        b->reregistrations += rereg;
        b->beats++;
        sleep_ms(b->interval_ms);
    }
    return NULL;
}

void beater_start(beater *b, coord_client *c, int interval_ms)
{
    memset(b, 0, sizeof *b);
    b->c = c;
    b->interval_ms = interval_ms;
    ASSERT_OK(pthread_create(&b->th, NULL, beat_main, b));
}

void beater_stop(beater *b)
{
    atomic_store(&b->stop, 1);
    pthread_join(b->th, NULL);
    if (b->failures) TEST_FAIL("%d heartbeats failed, last: %s", b->failures, b->last_error);
    ASSERT_EQ(b->reregistrations, 0);
    ASSERT(b->beats > 0);
}
