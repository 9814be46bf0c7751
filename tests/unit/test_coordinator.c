/* Tests of the region coordinator (trainer/swarm/coord/coordinator, proto/coord_msg, coord/http_status)
 * over real sockets on 127.0.0.1: registration and listing, heartbeats, expiry, a
 * coordinator restart, /status parsed with jansson field by field, /metrics line by line,
 * malformed requests that must drop only their own connection, and HTTP errors. */
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
#include "test.h"

#define JOB "job-coord"
#define T_MS 3000 /* for calls that should succeed: generous, never reached */

/* ---- helpers ---- */

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Open descriptors, to show that stopping closes every socket the coordinator opened. */
static int count_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    ASSERT(d != NULL);
    int n = 0;
    while (readdir(d)) n++;
    closedir(d);
    return n;
}

static coordinator *start_at(uint32_t n_stages, uint32_t hb_ms, uint32_t expire_ms, int port,
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

static coordinator *start(uint32_t n_stages) { return start_at(n_stages, 1000, 0, 0, 0); }

static coord_registration stage_reg(const char *name, uint32_t stage, uint32_t l0, uint32_t l1,
                                    uint16_t port, double throughput)
{
    coord_registration r = {.role = COORD_ROLE_STAGE, .stage = stage, .l0 = l0, .l1 = l1,
                            .port = port, .throughput = throughput};
    snprintf(r.name, sizeof r.name, "%s", name);
    snprintf(r.host, sizeof r.host, "127.0.0.1");
    return r;
}

static coord_registration client_reg(const char *name)
{
    coord_registration r = {.role = COORD_ROLE_CLIENT, .stage = COORD_NO_STAGE};
    snprintf(r.name, sizeof r.name, "%s", name);
    return r;
}

static coord_client *client_at(int port)
{
    coord_client *c = NULL;
    cirrus_error err = {0};
    if (coord_client_open("127.0.0.1", port, JOB, &c, &err))
        TEST_FAIL("coord_client_open: %s", err.msg);
    return c;
}

/* A member: a client handle, registered as r. */
static coord_client *join(coordinator *co, coord_registration r, coord_registered *out)
{
    coord_client *c = client_at(coordinator_port(co));
    coord_registered id;
    cirrus_error err = {0};
    if (coord_client_register(c, &r, T_MS, &id, &err)) TEST_FAIL("register: %s", err.msg);
    if (out) *out = id;
    return c;
}

static void heartbeat(coord_client *c, const coord_stats *s, uint32_t *instruction,
                      int *rereg)
{
    cirrus_error err = {0};
    if (coord_client_heartbeat(c, s, T_MS, instruction, rereg, &err))
        TEST_FAIL("heartbeat: %s", err.msg);
}

static size_t list_peers(coord_client *c, uint32_t stage, coord_peer_info **out)
{
    coord_peer_info *p = NULL;
    size_t n = 0;
    cirrus_error err = {0};
    if (coord_client_peers(c, stage, T_MS, &p, &n, NULL, &err)) TEST_FAIL("peers: %s", err.msg);
    if (out) *out = p;
    else free(p);
    return n;
}

static const coord_peer_info *by_id(const coord_peer_info *p, size_t n, uint32_t id)
{
    for (size_t i = 0; i < n; i++)
        if (p[i].id == id) return &p[i];
    return NULL;
}

/* ---- HTTP over a plain socket ---- */

typedef struct http_reply {
    int status;
    char head[4096];
    char *body; /* NUL-terminated */
    size_t body_len;
} http_reply;

static void http_req(int port, const char *method, const char *path, http_reply *r)
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

static int has_header(const http_reply *r, const char *line)
{
    return strcasestr(r->head, line) != NULL;
}

static json_t *get_status(coordinator *co)
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

static char *get_metrics(coordinator *co)
{
    http_reply r;
    http_req(coordinator_http_port(co), "GET", "/metrics", &r);
    ASSERT_EQ(r.status, 200);
    ASSERT(has_header(&r, "\r\nContent-Type: text/plain; version=0.0.4"));
    return r.body;
}

static json_int_t jint(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    if (!json_is_integer(v)) TEST_FAIL("'%s' is not an integer", key);
    return json_integer_value(v);
}

static double jnum(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    if (!json_is_number(v)) TEST_FAIL("'%s' is not a number", key);
    return json_number_value(v);
}

static void has_line(const char *text, const char *line)
{
    size_t n = strlen(line);
    for (const char *p = text; (p = strstr(p, line)); p++)
        if ((p == text || p[-1] == '\n') && p[n] == '\n') return;
    TEST_FAIL("no line '%s' in:\n%s", line, text);
}

/* ---- raw protocol access, for abuse ---- */

static net_conn *raw_connect(int port)
{
    net_conn *c = NULL;
    cirrus_error err = {0};
    if (net_connect("127.0.0.1", port, T_MS, &c, &err)) TEST_FAIL("connect: %s", err.msg);
    if (net_hello_client(c, JOB, COORD_ROLE_STAGE, 0, T_MS, &err))
        TEST_FAIL("hello: %s", err.msg);
    return c;
}

/* Send one request; return the reply type. An ERROR reply fills *code and msg. */
static int raw_call(net_conn *c, uint16_t type, const void *p, size_t n, int *code,
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
static void assert_dropped(net_conn *c)
{
    wire_header h;
    const uint8_t *p;
    cirrus_error err = {0};
    int rc = net_recv_frame(c, &h, &p, T_MS, &err);
    if (rc != CIRRUS_ECLOSED) TEST_FAIL("connection not dropped: %d (%s)", rc, err.msg);
}

/* Send a malformed request; it must be answered ERROR(ECORRUPT) naming `what`, then the
 * connection closed. */
static void expect_refused(int port, uint16_t type, const void *p, size_t n, const char *what)
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

/* ---- membership ---- */

TEST_T(coordinator_register_and_list, 10)
{
    coordinator *co = start(2);
    coord_registered a, b, d;
    coord_client *pa = join(co, stage_reg("peer-a", 0, 0, 4, 7001, 10.5), &a);
    coord_client *pb = join(co, stage_reg("peer-b", 0, 0, 4, 7002, 20.25), &b);
    coord_client *pd = join(co, stage_reg("peer-d", 1, 4, 8, 7003, 7), &d);
    ASSERT(a.peer_id != b.peer_id && b.peer_id != d.peer_id && a.peer_id != d.peer_id);
    ASSERT_EQ(a.epoch, coordinator_epoch(co));
    ASSERT_EQ(d.epoch, coordinator_epoch(co));
    ASSERT_EQ(a.heartbeat_ms, 1000);
    ASSERT_EQ(a.expire_ms, 3000); /* the default: three intervals */

    /* Any member (or a plain client that never registered) may list. */
    coord_client *q = client_at(coordinator_port(co));
    coord_peer_info *p;
    uint32_t n_stages = 0;
    size_t n = 0;
    cirrus_error err = {0};
    ASSERT_OK(coord_client_peers(q, COORD_ALL_STAGES, T_MS, &p, &n, &n_stages, &err));
    ASSERT_EQ(n, 3);
    ASSERT_EQ(n_stages, 2);
    const coord_peer_info *e = by_id(p, n, b.peer_id);
    ASSERT(e != NULL);
    ASSERT_EQ(e->stage, 0);
    ASSERT_EQ(e->l0, 0);
    ASSERT_EQ(e->l1, 4);
    ASSERT_EQ(e->port, 7002);
    ASSERT(!strcmp(e->host, "127.0.0.1"));
    ASSERT(!strcmp(e->name, "peer-b"));
    ASSERT_NEAR(e->throughput, 20.25, 0);
    free(p);

    ASSERT_EQ(list_peers(q, 0, &p), 2);
    ASSERT(by_id(p, 2, a.peer_id) && by_id(p, 2, b.peer_id));
    free(p);
    ASSERT_EQ(list_peers(q, 1, &p), 1);
    ASSERT_EQ(p[0].id, d.peer_id);
    ASSERT_EQ(p[0].l0, 4);
    ASSERT_EQ(p[0].l1, 8);
    ASSERT_NEAR(p[0].throughput, 7, 0);
    free(p);

    /* Re-registering under the same name keeps the id and updates the entry. */
    coord_registered a2;
    coord_registration ra = stage_reg("peer-a", 1, 4, 8, 7011, 9);
    ASSERT_OK(coord_client_register(pa, &ra, T_MS, &a2, &err));
    ASSERT_EQ(a2.peer_id, a.peer_id);
    ASSERT_EQ(list_peers(q, 1, NULL), 2);
    ASSERT_EQ(list_peers(q, 0, NULL), 1);

    /* Clients are members but not peers: they are not listed. */
    coord_client *cl = join(co, client_reg("client-0"), NULL);
    ASSERT_EQ(list_peers(q, COORD_ALL_STAGES, NULL), 3);

    coord_client_close(cl);
    coord_client_close(q);
    coord_client_close(pa);
    coord_client_close(pb);
    coord_client_close(pd);
    coordinator_stop(co);
}

TEST_T(coordinator_heartbeat_updates_stats, 10)
{
    coordinator *co = start(2);
    coord_registered a;
    coord_client *pa = join(co, stage_reg("peer-a", 0, 0, 4, 7001, 10), &a);
    coord_stats s = {.samples = 640, .step = 12, .loss = 3.25f, .tokens_per_s = 4096,
                     .fwd_throughput = 55.5, .bwd_throughput = 20};
    uint32_t ins = 0;
    int rereg = -1;
    heartbeat(pa, &s, &ins, &rereg);
    ASSERT_EQ(ins, COORD_NO_INSTRUCTION);
    ASSERT_EQ(rereg, 0);

    /* The listed throughput is now the measured forward rate. */
    coord_peer_info *p;
    ASSERT_EQ(list_peers(pa, 0, &p), 1);
    ASSERT_NEAR(p[0].throughput, 55.5, 0);
    free(p);

    coord_snapshot snap;
    ASSERT_OK(coordinator_snapshot(co, &snap));
    ASSERT_EQ(snap.n_members, 1);
    const coord_member_view *m = &snap.members[0];
    ASSERT_EQ(m->info.id, a.peer_id);
    ASSERT_EQ(m->stats.samples, 640);
    ASSERT_EQ(m->stats.step, 12);
    ASSERT_NEAR(m->stats.loss, 3.25, 0);
    ASSERT_NEAR(m->stats.tokens_per_s, 4096, 0);
    ASSERT_NEAR(m->stats.bwd_throughput, 20, 0);
    ASSERT_EQ(snap.step, 12);
    ASSERT_NEAR(snap.loss, 3.25, 0); /* no client reported: a heartbeat's loss */
    ASSERT_NEAR(snap.stage_throughput[0], 55.5, 0);
    coord_snapshot_free(&snap);

    /* A later heartbeat replaces the stats. */
    s.samples = 1280, s.step = 13, s.fwd_throughput = 60;
    heartbeat(pa, &s, &ins, &rereg);
    ASSERT_OK(coordinator_snapshot(co, &snap));
    ASSERT_EQ(snap.members[0].stats.samples, 1280);
    ASSERT_EQ(snap.step, 13);
    ASSERT_NEAR(snap.stage_throughput[0], 60, 0);
    coord_snapshot_free(&snap);

    /* The rebalancing instruction rides on HEARTBEAT_OK until the peer moves. */
    ASSERT_EQ(coordinator_set_instruction(co, a.peer_id, 2), CIRRUS_EINVAL);
    ASSERT_EQ(coordinator_set_instruction(co, 999, 1), CIRRUS_ENOENT);
    ASSERT_OK(coordinator_set_instruction(co, a.peer_id, 1));
    heartbeat(pa, &s, &ins, &rereg);
    ASSERT_EQ(ins, 1);
    heartbeat(pa, &s, &ins, &rereg);
    ASSERT_EQ(ins, 1);
    coord_registration moved = stage_reg("peer-a", 1, 4, 8, 7001, 10);
    cirrus_error err = {0};
    ASSERT_OK(coord_client_register(pa, &moved, T_MS, NULL, &err));
    heartbeat(pa, &s, &ins, &rereg);
    ASSERT_EQ(ins, COORD_NO_INSTRUCTION);

    /* Leaving is not expiring. */
    ASSERT_OK(coord_client_leave(pa, T_MS, &err));
    ASSERT_EQ(coord_client_peer_id(pa), 0);
    ASSERT_EQ(list_peers(pa, COORD_ALL_STAGES, NULL), 0);
    ASSERT_OK(coordinator_snapshot(co, &snap));
    ASSERT_EQ(snap.expirations, 0);
    coord_snapshot_free(&snap);
    ASSERT_EQ(coord_client_heartbeat(pa, &s, T_MS, NULL, NULL, &err), CIRRUS_EINVAL);

    coord_client_close(pa);
    coordinator_stop(co);
}

/* A peer moved by rebalancing and then replaced under the same name (the operator names a
 * peer after its Pod, which a replacement keeps) comes back at its original stage: the
 * coordinator tells it at once to move where its predecessor had been moved, both when it
 * registers fresh and when it registers while its predecessor's entry is still there. A
 * name that never moved gets no instruction. */
TEST_T(coordinator_replaced_moved_peer_moves_again, 10)
{
    coordinator *co = start(3);
    coord_registered a;
    coord_stats s = {.loss = NAN, .fwd_throughput = 5};
    uint32_t ins = 0;
    int rereg = 0;
    cirrus_error err = {0};
    coord_client *pa = join(co, stage_reg("job-r1-stage0-0", 0, 0, 3, 7001, 10), &a);
    ASSERT_OK(coordinator_set_instruction(co, a.peer_id, 2));
    coord_registration moved = stage_reg("job-r1-stage0-0", 2, 6, 8, 7001, 10);
    ASSERT_OK(coord_client_register(pa, &moved, T_MS, NULL, &err));
    heartbeat(pa, &s, &ins, &rereg);
    ASSERT_EQ(ins, COORD_NO_INSTRUCTION);

    /* Replaced before its predecessor expired: same name, original stage. */
    coord_client *pb = join(co, stage_reg("job-r1-stage0-0", 0, 0, 3, 7002, 10), NULL);
    heartbeat(pb, &s, &ins, &rereg);
    ASSERT_EQ(ins, 2);
    /* It moves: the instruction is done. */
    moved.port = 7002;
    ASSERT_OK(coord_client_register(pb, &moved, T_MS, NULL, &err));
    heartbeat(pb, &s, &ins, &rereg);
    ASSERT_EQ(ins, COORD_NO_INSTRUCTION);
    ASSERT_OK(coord_client_leave(pb, T_MS, &err));

    /* Replaced after its predecessor left: a fresh registration, told the same. */
    coord_client *pc = join(co, stage_reg("job-r1-stage0-0", 0, 0, 3, 7003, 10), NULL);
    heartbeat(pc, &s, &ins, &rereg);
    ASSERT_EQ(ins, 2);

    /* Another peer of stage 0 never moved: nothing for it. */
    coord_client *pd = join(co, stage_reg("job-r1-stage0-1", 0, 0, 3, 7004, 10), NULL);
    heartbeat(pd, &s, &ins, &rereg);
    ASSERT_EQ(ins, COORD_NO_INSTRUCTION);

    coord_client_close(pa);
    coord_client_close(pb);
    coord_client_close(pc);
    coord_client_close(pd);
    coordinator_stop(co);
}

/* A member that heartbeats every interval from its own thread. */
typedef struct beater {
    coord_client *c;
    int interval_ms;
    atomic_int stop;
    int failures, reregistrations, beats;
    char last_error[256];
    pthread_t th;
} beater;

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

static void beater_start(beater *b, coord_client *c, int interval_ms)
{
    memset(b, 0, sizeof *b);
    b->c = c;
    b->interval_ms = interval_ms;
    ASSERT_OK(pthread_create(&b->th, NULL, beat_main, b));
}

static void beater_stop(beater *b)
{
    atomic_store(&b->stop, 1);
    pthread_join(b->th, NULL);
    if (b->failures) TEST_FAIL("%d heartbeats failed, last: %s", b->failures, b->last_error);
    ASSERT_EQ(b->reregistrations, 0);
    ASSERT(b->beats > 0);
}

TEST_T(coordinator_peer_expires, 10)
{
    const uint32_t hb = 50, expire = 250;
    coordinator *co = start_at(2, hb, expire, 0, 0);
    coord_registered live, dead;
    coord_client *pl = join(co, stage_reg("live", 0, 0, 4, 7001, 5), &live);
    double t_reg = now_ms();
    coord_client *pd = join(co, stage_reg("dead", 1, 4, 8, 7002, 9), &dead);
    ASSERT_EQ(live.heartbeat_ms, hb);
    ASSERT_EQ(live.expire_ms, expire);
    beater b;
    beater_start(&b, pl, (int)hb);

    /* Still there before its time... */
    ASSERT_EQ(list_peers(pl, 1, NULL), 1);
    /* ...gone after it, and only it. */
    double gone = 0;
    while (!gone) {
        if (list_peers(pl, 1, NULL) == 0) gone = now_ms();
        else if (now_ms() - t_reg > 3000) TEST_FAIL("the silent peer never expired");
        else sleep_ms(10);
    }
    ASSERT(gone - t_reg >= expire);
    ASSERT_EQ(list_peers(pl, 0, NULL), 1);

    json_t *j = get_status(co);
    ASSERT_EQ(jint(j, "peer_expirations"), 1);
    json_t *stages = json_object_get(j, "stages");
    ASSERT_EQ(jint(json_array_get(stages, 0), "peers"), 1);
    ASSERT_EQ(jint(json_array_get(stages, 1), "peers"), 0);
    ASSERT_NEAR(jnum(json_array_get(stages, 1), "throughput"), 0, 0);
    json_t *members = json_object_get(j, "members");
    ASSERT_EQ(json_array_size(members), 1);
    ASSERT_EQ(jint(json_array_get(members, 0), "id"), live.peer_id);
    json_decref(j);
    char *m = get_metrics(co);
    has_line(m, "cirrus_peer_expirations_total 1");
    has_line(m, "cirrus_peers{stage=\"1\"} 0");
    free(m);

    /* The expired peer learns it at its next heartbeat and comes back under a new id. */
    int rereg = 0;
    coord_stats s = {.loss = NAN};
    heartbeat(pd, &s, NULL, &rereg);
    ASSERT_EQ(rereg, 1);
    ASSERT(coord_client_peer_id(pd) != dead.peer_id);
    ASSERT_EQ(list_peers(pl, 1, NULL), 1);

    beater_stop(&b);
    coord_client_close(pl);
    coord_client_close(pd);
    coordinator_stop(co);
}

TEST_T(coordinator_restart_recovers_membership, 15)
{
    int fds = count_fds();
    coordinator *co = start_at(2, 100, 0, 0, 0);
    int port = coordinator_port(co);
    uint64_t epoch1 = coordinator_epoch(co);
    ASSERT(epoch1 != 0 && epoch1 < (1ull << 53));
    coord_client *m[3];
    coord_registered id[3];
    m[0] = join(co, stage_reg("p0", 0, 0, 4, 7001, 1), &id[0]);
    m[1] = join(co, stage_reg("p1", 0, 0, 4, 7002, 2), &id[1]);
    m[2] = join(co, stage_reg("p2", 1, 4, 8, 7003, 3), &id[2]);
    coord_client *cl = join(co, client_reg("trainer"), NULL);
    coord_stats s = {.loss = NAN};
    for (int i = 0; i < 3; i++) heartbeat(m[i], &s, NULL, NULL);

    coordinator_stop(co);
    /* While it is down, heartbeats fail promptly with an error, not a hang. */
    cirrus_error err = {0};
    double t0 = now_ms();
    ASSERT(coord_client_heartbeat(m[0], &s, 500, NULL, NULL, &err) != 0);
    ASSERT_LT(now_ms() - t0, 1000);

    /* A new coordinator on the same port: nothing of the old membership... */
    co = start_at(2, 100, 0, port, 0);
    ASSERT_EQ(coordinator_port(co), port);
    uint64_t epoch2 = coordinator_epoch(co);
    ASSERT(epoch2 != epoch1);
    ASSERT_EQ(list_peers(m[0], COORD_ALL_STAGES, NULL), 0);

    /* ...until each member's next heartbeat: unknown peer -> re-register. */
    for (int i = 0; i < 3; i++) {
        int rereg = 0;
        heartbeat(m[i], &s, NULL, &rereg);
        ASSERT_EQ(rereg, 1);
        ASSERT_EQ(coord_client_epoch(m[i]), epoch2);
        /* The next one is plain again. */
        heartbeat(m[i], &s, NULL, &rereg);
        ASSERT_EQ(rereg, 0);
    }
    coord_report rep = {.step = 5, .loss = 2.0f, .tokens_per_s = 10, .mb_retried = 1};
    int rereg = 0;
    ASSERT_OK(coord_client_report(cl, &rep, T_MS, &rereg, &err));
    ASSERT_EQ(rereg, 1);

    coord_peer_info *p;
    size_t n = list_peers(m[0], COORD_ALL_STAGES, &p);
    ASSERT_EQ(n, 3);
    const char *names[3] = {"p0", "p1", "p2"};
    for (int i = 0; i < 3; i++) {
        const coord_peer_info *e = by_id(p, n, coord_client_peer_id(m[i]));
        ASSERT(e != NULL);
        ASSERT(!strcmp(e->name, names[i]));
        ASSERT_EQ(e->stage, i < 2 ? 0 : 1);
        ASSERT_EQ(e->port, 7001 + i);
    }
    free(p);
    json_t *j = get_status(co);
    ASSERT_EQ(jint(j, "epoch"), (json_int_t)epoch2);
    ASSERT_EQ(jint(j, "clients"), 1);
    ASSERT_EQ(jint(j, "step"), 5);
    json_decref(j);

    for (int i = 0; i < 3; i++) coord_client_close(m[i]);
    coord_client_close(cl);
    coordinator_stop(co);
    ASSERT_EQ(count_fds(), fds);
}

/* ---- HTTP ---- */

/* Two stages: peers a (10.5 -> measured 12.5) and b (20.25) on stage 0, d (7) on stage 1,
 * and one client that reported twice (its totals reset in between: it restarted). */
static coordinator *populated(coord_client *m[4])
{
    coordinator *co = start_at(2, 1000, 0, 0, 12345);
    m[0] = join(co, stage_reg("peer-a", 0, 0, 4, 7001, 10.5), NULL);
    m[1] = join(co, stage_reg("peer-b", 0, 0, 4, 7002, 20.25), NULL);
    m[2] = join(co, stage_reg("peer-d", 1, 4, 8, 7003, 7), NULL);
    m[3] = join(co, client_reg("trainer-0"), NULL);
    coord_stats s = {.samples = 64, .step = 41, .loss = NAN, .tokens_per_s = 800,
                     .fwd_throughput = 12.5, .bwd_throughput = 5};
    heartbeat(m[0], &s, NULL, NULL);
    cirrus_error err = {0};
    coord_report r1 = {.step = 40, .loss = 3.0f, .tokens_per_s = 900, .mb_retried = 3,
                       .mb_lost = 1};
    ASSERT_OK(coord_client_report(m[3], &r1, T_MS, NULL, &err));
    coord_report r2 = {.step = 42, .loss = 2.5f, .tokens_per_s = 1000, .mb_retried = 2,
                       .mb_lost = 0};
    ASSERT_OK(coord_client_report(m[3], &r2, T_MS, NULL, &err));
    return co;
}

static void depopulate(coordinator *co, coord_client *m[4])
{
    for (int i = 0; i < 4; i++) coord_client_close(m[i]);
    coordinator_stop(co);
}

TEST_T(coordinator_status_json, 10)
{
    coord_client *m[4];
    coordinator *co = populated(m);
    json_t *j = get_status(co);
    ASSERT(json_is_object(j));
    ASSERT(!strcmp(json_string_value(json_object_get(j, "job_id")), JOB));
    ASSERT_EQ(jint(j, "epoch"), 12345);
    double up = jnum(j, "uptime_s");
    ASSERT(up >= 0 && up < 60);
    ASSERT_EQ(jint(j, "step"), 42);
    ASSERT_NEAR(jnum(j, "loss"), 2.5, 0);
    ASSERT_NEAR(jnum(j, "tokens_per_s"), 1000, 0);
    ASSERT_EQ(jint(j, "n_stages"), 2);
    json_t *st = json_object_get(j, "stages");
    ASSERT_EQ(json_array_size(st), 2);
    ASSERT_EQ(jint(json_array_get(st, 0), "stage"), 0);
    ASSERT_EQ(jint(json_array_get(st, 0), "peers"), 2);
    ASSERT_NEAR(jnum(json_array_get(st, 0), "throughput"), 12.5 + 20.25, 0);
    ASSERT_EQ(jint(json_array_get(st, 1), "stage"), 1);
    ASSERT_EQ(jint(json_array_get(st, 1), "peers"), 1);
    ASSERT_NEAR(jnum(json_array_get(st, 1), "throughput"), 7, 0);
    ASSERT_EQ(jint(j, "clients"), 1);
    ASSERT_EQ(jint(j, "microbatches_retried"), 3 + 2); /* the restart kept the first 3 */
    ASSERT_EQ(jint(j, "microbatches_lost"), 1 + 0);
    ASSERT_EQ(jint(j, "peer_expirations"), 0);
    ASSERT_EQ(jint(j, "registrations"), 4);
    json_t *ms = json_object_get(j, "members");
    ASSERT_EQ(json_array_size(ms), 4);
    json_t *a = json_array_get(ms, 0);
    ASSERT(!strcmp(json_string_value(json_object_get(a, "name")), "peer-a"));
    ASSERT(!strcmp(json_string_value(json_object_get(a, "role")), "stage"));
    ASSERT(!strcmp(json_string_value(json_object_get(a, "addr")), "127.0.0.1:7001"));
    ASSERT_EQ(jint(a, "stage"), 0);
    json_t *layers = json_object_get(a, "layers");
    ASSERT_EQ(json_array_size(layers), 2);
    ASSERT_EQ(json_integer_value(json_array_get(layers, 0)), 0);
    ASSERT_EQ(json_integer_value(json_array_get(layers, 1)), 4);
    ASSERT_NEAR(jnum(a, "throughput"), 12.5, 0);
    ASSERT_EQ(jint(a, "samples"), 64);
    ASSERT_EQ(jint(a, "step"), 41);
    ASSERT(json_is_null(json_object_get(a, "loss"))); /* NaN is not JSON */
    json_t *c = json_array_get(ms, 3);
    ASSERT(!strcmp(json_string_value(json_object_get(c, "role")), "client"));
    ASSERT(json_object_get(c, "stage") == NULL);
    json_decref(j);
    depopulate(co, m);
}

TEST_T(coordinator_metrics_text, 10)
{
    coord_client *m[4];
    coordinator *co = populated(m);
    char *t = get_metrics(co);
    static const char *lines[] = {
        "# HELP cirrus_peers Live stage peers per stage.",
        "# TYPE cirrus_peers gauge",
        "cirrus_peers{stage=\"0\"} 2",
        "cirrus_peers{stage=\"1\"} 1",
        "# TYPE cirrus_stage_throughput_samples_per_second gauge",
        "cirrus_stage_throughput_samples_per_second{stage=\"0\"} 32.75",
        "cirrus_stage_throughput_samples_per_second{stage=\"1\"} 7",
        "# TYPE cirrus_step gauge",
        "cirrus_step 42",
        "# TYPE cirrus_loss gauge",
        "cirrus_loss 2.5",
        "cirrus_tokens_per_second 1000",
        "cirrus_clients 1",
        "# TYPE cirrus_microbatches_retried_total counter",
        "cirrus_microbatches_retried_total 5",
        "cirrus_microbatches_lost_total 1",
        "# TYPE cirrus_peer_expirations_total counter",
        "cirrus_peer_expirations_total 0",
        "cirrus_registrations_total 4",
        "cirrus_coordinator_epoch 12345",
        "cirrus_stages 2",
    };
    for (size_t i = 0; i < sizeof lines / sizeof *lines; i++) has_line(t, lines[i]);
    /* Every sample belongs to a family announced by HELP and TYPE lines before it. */
    char *save = NULL, *copy = strdup(t);
    ASSERT(copy != NULL);
    for (char *line = strtok_r(copy, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        if (line[0] == '#') continue;
        char name[128], help[160], type[160];
        ASSERT_EQ(sscanf(line, "%127[a-z_]", name), 1);
        snprintf(help, sizeof help, "# HELP %s ", name);
        snprintf(type, sizeof type, "# TYPE %s ", name);
        const char *at = strstr(t, line), *h = strstr(t, help), *ty = strstr(t, type);
        if (!h || !ty || h > at || ty > at) TEST_FAIL("'%s' has no HELP/TYPE before it", line);
    }
    free(copy);
    ASSERT(t[strlen(t) - 1] == '\n');
    free(t);
    depopulate(co, m);
}

TEST_T(coordinator_http_errors, 10)
{
    coordinator *co = start(1);
    int port = coordinator_http_port(co);
    http_reply r;
    http_req(port, "GET", "/nope", &r);
    ASSERT_EQ(r.status, 404);
    free(r.body);
    http_req(port, "GET", "/", &r);
    ASSERT_EQ(r.status, 404);
    free(r.body);
    http_req(port, "GET", "/status/extra", &r);
    ASSERT_EQ(r.status, 404);
    free(r.body);
    http_req(port, "POST", "/status", &r);
    ASSERT_EQ(r.status, 405);
    ASSERT(has_header(&r, "\r\nAllow: GET, HEAD"));
    free(r.body);
    http_req(port, "DELETE", "/metrics", &r);
    ASSERT_EQ(r.status, 405);
    free(r.body);
    http_req(port, "PUT", "/nope", &r);
    ASSERT_EQ(r.status, 405);
    free(r.body);
    /* HEAD is GET without the body; a query string does not change the path. */
    http_req(port, "HEAD", "/metrics", &r);
    ASSERT_EQ(r.status, 200);
    ASSERT_EQ(r.body_len, 0);
    free(r.body);
    http_req(port, "GET", "/status?pretty=1", &r);
    ASSERT_EQ(r.status, 200);
    free(r.body);
    /* The peer protocol is unaffected. */
    coord_client *c = join(co, stage_reg("p", 0, 0, 8, 7001, 1), NULL);
    coord_client_close(c);
    coordinator_stop(co);
}

/* ---- abuse: malformed requests drop their own connection only ---- */

static void put_register(wire_writer *w, uint16_t role, uint32_t stage, const char *name)
{
    wire_put_u16(w, role);
    wire_put_u32(w, stage);
    wire_put_u32(w, 0);
    wire_put_u32(w, 4);
    wire_put_str(w, name);
    wire_put_str(w, "127.0.0.1");
    wire_put_u16(w, 7009);
    wire_put_f64(w, 1.0);
}

TEST_T(coordinator_malformed_requests_drop_one_connection, 15)
{
    coordinator *co = start_at(2, 50, 500, 0, 0);
    int port = coordinator_port(co);
    coord_registered good;
    coord_client *g = join(co, stage_reg("good", 0, 0, 4, 7001, 3), &good);
    beater b;
    beater_start(&b, g, 50);

    wire_writer w;
    /* Stage index out of range. */
    wire_writer_init(&w, 1024);
    put_register(&w, COORD_ROLE_STAGE, 7, "bad-stage");
    expect_refused(port, COORD_REGISTER, w.data, w.len, "stage index 7 is outside 0..1");
    /* Truncated: the same message cut anywhere. */
    for (size_t cut = 0; cut < w.len; cut += 5)
        expect_refused(port, COORD_REGISTER, w.data, cut, "truncated REGISTER");
    /* Trailing bytes. */
    wire_put_u32(&w, 0);
    expect_refused(port, COORD_REGISTER, w.data, w.len, "trailing bytes");
    wire_writer_free(&w);

    /* Overlong name. */
    char longname[101];
    memset(longname, 'n', 100);
    longname[100] = '\0';
    wire_writer_init(&w, 1024);
    put_register(&w, COORD_ROLE_STAGE, 0, longname);
    expect_refused(port, COORD_REGISTER, w.data, w.len, "name is 100 bytes, longer than the 63");
    wire_writer_free(&w);

    /* A name with characters outside the set, a bad role, an empty layer range. */
    wire_writer_init(&w, 1024);
    put_register(&w, COORD_ROLE_STAGE, 0, "a\"b");
    expect_refused(port, COORD_REGISTER, w.data, w.len, "name");
    wire_writer_free(&w);
    wire_writer_init(&w, 1024);
    put_register(&w, 9, 0, "x");
    expect_refused(port, COORD_REGISTER, w.data, w.len, "role 9");
    wire_writer_free(&w);
    wire_writer_init(&w, 1024);
    wire_put_u16(&w, COORD_ROLE_STAGE);
    wire_put_u32(&w, 0);
    wire_put_u32(&w, 4);
    wire_put_u32(&w, 4);
    wire_put_str(&w, "x");
    wire_put_str(&w, "127.0.0.1");
    wire_put_u16(&w, 7009);
    wire_put_f64(&w, 1.0);
    expect_refused(port, COORD_REGISTER, w.data, w.len, "layer range [4, 4)");
    wire_writer_free(&w);
    /* Layers beyond the model's 8. */
    wire_writer_init(&w, 1024);
    wire_put_u16(&w, COORD_ROLE_STAGE);
    wire_put_u32(&w, 1);
    wire_put_u32(&w, 4);
    wire_put_u32(&w, 9);
    wire_put_str(&w, "x");
    wire_put_str(&w, "127.0.0.1");
    wire_put_u16(&w, 7009);
    wire_put_f64(&w, 1.0);
    expect_refused(port, COORD_REGISTER, w.data, w.len, "exceeds the 8 layers");
    wire_writer_free(&w);
    /* A throughput that is not a rate. */
    wire_writer_init(&w, 1024);
    wire_put_u16(&w, COORD_ROLE_STAGE);
    wire_put_u32(&w, 1);
    wire_put_u32(&w, 4);
    wire_put_u32(&w, 8);
    wire_put_str(&w, "x");
    wire_put_str(&w, "127.0.0.1");
    wire_put_u16(&w, 7009);
    wire_put_f64(&w, NAN);
    expect_refused(port, COORD_REGISTER, w.data, w.len, "throughput");
    wire_writer_free(&w);

    /* Other messages: a short heartbeat, a PEERS stage out of range, an unknown type. */
    uint8_t junk[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    expect_refused(port, COORD_HEARTBEAT, junk, sizeof junk, "truncated HEARTBEAT");
    wire_writer_init(&w, 64);
    wire_put_u32(&w, 2);
    expect_refused(port, COORD_PEERS, w.data, w.len, "PEERS stage index 2");
    wire_writer_free(&w);
    expect_refused(port, 40, NULL, 0, "unknown request type 40");
    /* A request above the coordinator's 4 KiB limit is a framing error: dropped unanswered. */
    {
        net_conn *c = raw_connect(port);
        uint8_t *big = calloc(1, 8192);
        ASSERT(big != NULL);
        ASSERT_OK(net_send_frame(c, COORD_REGISTER, 1, big, 8192, T_MS));
        free(big);
        assert_dropped(c);
        net_close(c);
    }
    /* Garbage instead of a frame: dropped unanswered. */
    {
        net_conn *c = raw_connect(port);
        int fd = net_fd(c);
        uint8_t garbage[32];
        memset(garbage, 0xAB, sizeof garbage);
        ASSERT_EQ(send(fd, garbage, sizeof garbage, MSG_NOSIGNAL), (ssize_t)sizeof garbage);
        assert_dropped(c);
        net_close(c);
    }

    /* An unknown peer is not malformed: answered ENOENT, and the connection stays. */
    {
        net_conn *c = raw_connect(port);
        wire_writer_init(&w, 128);
        coord_stats s = {.loss = NAN};
        coord_put_heartbeat(&w, coordinator_epoch(co), 4242, &s);
        int code = 0;
        char msg[256];
        ASSERT_EQ(raw_call(c, COORD_HEARTBEAT, w.data, w.len, &code, msg), WIRE_ERROR);
        ASSERT_EQ(code, CIRRUS_ENOENT);
        ASSERT(strstr(msg, "unknown peer 4242") != NULL);
        wire_writer_free(&w);
        wire_writer_init(&w, 128);
        coord_put_heartbeat(&w, coordinator_epoch(co) + 1, good.peer_id, &s);
        ASSERT_EQ(raw_call(c, COORD_HEARTBEAT, w.data, w.len, &code, msg), WIRE_ERROR);
        ASSERT_EQ(code, CIRRUS_ENOENT);
        ASSERT(strstr(msg, "epoch") != NULL);
        wire_writer_free(&w);
        ASSERT_EQ(raw_call(c, WIRE_PING, NULL, 0, &code, msg), WIRE_PONG);
        net_close(c);
    }

    /* The client API refuses what the coordinator would refuse, without sending it. */
    coord_client *x = client_at(port);
    coord_registration bad = stage_reg("x", 0, 0, 4, 0, 1);
    cirrus_error err = {0};
    ASSERT_EQ(coord_client_register(x, &bad, T_MS, NULL, &err), CIRRUS_EINVAL);
    coord_client_close(x);
    /* A wrong job id is refused at the handshake. */
    coord_client *wrong = NULL;
    ASSERT_OK(coord_client_open("127.0.0.1", port, "other-job", &wrong, &err));
    coord_registration ok = stage_reg("y", 0, 0, 4, 7005, 1);
    ASSERT_EQ(coord_client_register(wrong, &ok, T_MS, NULL, &err), CIRRUS_EMISMATCH);
    coord_client_close(wrong);

    /* Through all of it the good peer kept heartbeating on its connection, and nobody
     * else got in. */
    sleep_ms(120);
    beater_stop(&b);
    coord_peer_info *p;
    ASSERT_EQ(list_peers(g, COORD_ALL_STAGES, &p), 1);
    ASSERT_EQ(p[0].id, good.peer_id);
    free(p);
    coord_snapshot snap;
    ASSERT_OK(coordinator_snapshot(co, &snap));
    ASSERT_EQ(snap.registrations, 1);
    ASSERT_EQ(snap.expirations, 0);
    coord_snapshot_free(&snap);
    coord_client_close(g);
    coordinator_stop(co);
}

/* ---- the decoders on their own ---- */

TEST_T(coordinator_proto_round_trip, 5)
{
    coord_registration r = stage_reg("peer-7", 3, 2, 6, 65535, 123.5), back;
    wire_writer w;
    wire_writer_init(&w, 1024);
    coord_put_registration(&w, &r);
    cirrus_error err = {0};
    ASSERT_OK(coord_get_registration(w.data, w.len, &back, &err));
    ASSERT_EQ(back.role, COORD_ROLE_STAGE);
    ASSERT_EQ(back.stage, 3);
    ASSERT_EQ(back.l0, 2);
    ASSERT_EQ(back.l1, 6);
    ASSERT_EQ(back.port, 65535);
    ASSERT(!strcmp(back.name, "peer-7"));
    ASSERT(!strcmp(back.host, "127.0.0.1"));
    ASSERT_NEAR(back.throughput, 123.5, 0);
    /* Every truncation fails. */
    for (size_t cut = 0; cut < w.len; cut++)
        ASSERT_EQ(coord_get_registration(w.data, cut, &back, &err), CIRRUS_ECORRUPT);
    wire_writer_free(&w);

    coord_stats s = {.samples = 1, .step = 2, .loss = NAN, .tokens_per_s = 3,
                     .fwd_throughput = 4, .bwd_throughput = 5}, s2;
    uint64_t epoch;
    uint32_t id;
    wire_writer_init(&w, 1024);
    coord_put_heartbeat(&w, 77, 9, &s);
    ASSERT_OK(coord_get_heartbeat(w.data, w.len, &epoch, &id, &s2, &err));
    ASSERT_EQ(epoch, 77);
    ASSERT_EQ(id, 9);
    ASSERT(isnan(s2.loss));
    ASSERT_NEAR(s2.bwd_throughput, 5, 0);
    wire_writer_free(&w);
    s.fwd_throughput = -1;
    wire_writer_init(&w, 1024);
    coord_put_heartbeat(&w, 77, 9, &s);
    ASSERT_EQ(coord_get_heartbeat(w.data, w.len, &epoch, &id, &s2, &err), CIRRUS_ECORRUPT);
    wire_writer_free(&w);

    ASSERT(coord_name_ok(""));
    ASSERT(!coord_host_ok(""));
    ASSERT(coord_host_ok("fe80::1"));
    ASSERT(!coord_name_ok("a b"));
    ASSERT(!coord_name_ok("a\nb"));
}

/* ---- the step barrier (STEP_SYNC) ---- */

static coord_step_sync step_req(uint8_t op, uint64_t step, uint32_t index, uint32_t n_clients,
                                uint32_t microbatches, double loss_sum, uint64_t redo_seen)
{
    return (coord_step_sync){.op = op, .step = step, .client_index = index,
                             .n_clients = n_clients, .microbatches = microbatches,
                             .loss_sum = loss_sum, .redo_seen = redo_seen};
}

static coord_step_sync redo_req(uint64_t step, uint32_t stage, const char *addr)
{
    coord_step_sync q = step_req(COORD_STEP_REDO, step, 0, 1, 0, 0, 0);
    q.stage = stage;
    snprintf(q.addr, sizeof q.addr, "%s", addr);
    return q;
}

static coord_step_state step_sync(coord_client *c, coord_step_sync q)
{
    coord_step_state st;
    cirrus_error err = {0};
    if (coord_client_step_sync(c, &q, T_MS, &st, &err)) TEST_FAIL("step sync: %s", err.msg);
    return st;
}

static coord_step_state arrive(coord_client *c, uint64_t step, uint32_t index, uint32_t n,
                               uint32_t mb, double loss, uint64_t redo_seen)
{
    return step_sync(c, step_req(COORD_STEP_ARRIVE, step, index, n, mb, loss, redo_seen));
}

/* Two clients of one job: arrivals counted and summed per step; APPLIED moves the applied
 * step; the leader arriving at t says t - 1 was applied; a follower's arrival says nothing
 * about it. No registration is needed. */
TEST_T(coordinator_step_barrier_counts, 10)
{
    coordinator *co = start(2);
    coord_client *lead = client_at(coordinator_port(co));
    coord_client *follow = client_at(coordinator_port(co));

    coord_step_state st = arrive(lead, 1, 0, 2, 3, 6.5, 0);
    ASSERT_EQ(st.arrived, 1);
    ASSERT_EQ(st.microbatches, 3);
    ASSERT_NEAR(st.loss_sum, 6.5, 0);
    ASSERT_EQ(st.applied_step, 0);
    ASSERT_EQ(st.latest_notice, 0);
    ASSERT_EQ(st.n_notices, 0);
    st = arrive(follow, 1, 1, 2, 5, 1.25, 0);
    ASSERT_EQ(st.arrived, 2);
    ASSERT_EQ(st.microbatches, 8);
    ASSERT_NEAR(st.loss_sum, 7.75, 0);
    ASSERT_EQ(st.applied_step, 0);

    /* Re-arriving replaces the slot rather than adding to it. */
    st = arrive(follow, 1, 1, 2, 4, 1.0, 0);
    ASSERT_EQ(st.arrived, 2);
    ASSERT_EQ(st.microbatches, 7);
    ASSERT_NEAR(st.loss_sum, 7.5, 0);

    /* APPLIED records no arrival; any client may ask for the state by it. */
    st = step_sync(lead, step_req(COORD_STEP_APPLIED, 1, 0, 2, 0, 0, 0));
    ASSERT_EQ(st.applied_step, 1);
    ASSERT_EQ(st.arrived, 2);
    ASSERT_EQ(st.microbatches, 7);
    /* An older APPLIED does not move it back. */
    st = step_sync(follow, step_req(COORD_STEP_APPLIED, 1, 1, 2, 0, 0, 0));
    ASSERT_EQ(st.applied_step, 1);

    /* Step 2: only the follower so far; nothing of step 1 is counted there. */
    st = arrive(follow, 2, 1, 2, 6, 2.0, 0);
    ASSERT_EQ(st.arrived, 1);
    ASSERT_EQ(st.microbatches, 6);
    ASSERT_NEAR(st.loss_sum, 2.0, 0);
    ASSERT_EQ(st.applied_step, 1);

    /* The leader at step 3: step 2 was applied even though its APPLIED never came. */
    st = arrive(lead, 3, 0, 2, 1, 0.5, 0);
    ASSERT_EQ(st.applied_step, 2);
    ASSERT_EQ(st.arrived, 1);
    ASSERT_EQ(st.microbatches, 1);
    /* A follower far ahead implies nothing. */
    st = arrive(follow, 9, 1, 2, 1, 0.5, 0);
    ASSERT_EQ(st.applied_step, 2);
    ASSERT_EQ(st.arrived, 1);
    /* The leader's slot left step 1: step 1 now counts neither. */
    st = step_sync(lead, step_req(COORD_STEP_APPLIED, 1, 0, 2, 0, 0, 0));
    ASSERT_EQ(st.arrived, 0);
    ASSERT_EQ(st.microbatches, 0);
    ASSERT_NEAR(st.loss_sum, 0, 0);
    ASSERT_EQ(st.applied_step, 2);

    coord_client_close(lead);
    coord_client_close(follow);
    coordinator_stop(co);
}

/* The loss is summed in client index order, whatever the arrival order, so every client
 * computes the same mean bit for bit: 1e16 + -1e16 + 1 is exactly 1 in that order, while
 * the arrival order (1 + -1e16 + 1e16) loses the 1. */
TEST_T(coordinator_step_barrier_sums_in_client_order, 10)
{
    coordinator *co = start(1);
    coord_client *c = client_at(coordinator_port(co));
    arrive(c, 7, 2, 3, 1, 1.0, 0);
    arrive(c, 7, 1, 3, 1, -1e16, 0);
    coord_step_state st = arrive(c, 7, 0, 3, 1, 1e16, 0);
    ASSERT_EQ(st.arrived, 3);
    ASSERT_EQ(st.microbatches, 3);
    ASSERT(st.loss_sum == 1.0);
    ASSERT(1.0 + -1e16 + 1e16 != 1.0); /* the test means something */
    coord_client_close(c);
    coordinator_stop(co);
}

/* A REDO notice for step t un-counts every client that has not acted on it: each is
 * listed the notice until it arrives again with redo_seen >= its id. Notices of other
 * steps are not listed; many are listed 16 at a time, oldest first; only the newest 64
 * are remembered. */
TEST_T(coordinator_step_barrier_redo, 10)
{
    coordinator *co = start(2);
    coord_client *lead = client_at(coordinator_port(co));
    coord_client *follow = client_at(coordinator_port(co));
    coord_client *peer = client_at(coordinator_port(co)); /* whoever saw the loss */

    /* A notice of step 3 first: it must not show at step 4. */
    coord_step_state st = step_sync(peer, redo_req(3, 0, "127.0.0.1:4000"));
    ASSERT_EQ(st.latest_notice, 1);
    ASSERT_EQ(st.n_notices, 1);
    ASSERT_EQ(st.notices[0].id, 1);

    arrive(lead, 4, 0, 2, 2, 2.0, 0);
    st = arrive(follow, 4, 1, 2, 3, 3.0, 0);
    ASSERT_EQ(st.arrived, 2);
    ASSERT_EQ(st.latest_notice, 0);
    ASSERT_EQ(st.n_notices, 0);

    st = step_sync(peer, redo_req(4, 1, "127.0.0.1:5000"));
    const uint64_t id = st.latest_notice;
    ASSERT_EQ(id, 2);
    ASSERT_EQ(st.n_notices, 1);
    ASSERT_EQ(st.notices[0].id, id);
    ASSERT_EQ(st.notices[0].stage, 1);
    ASSERT(!strcmp(st.notices[0].addr, "127.0.0.1:5000"));
    ASSERT_EQ(st.arrived, 0); /* neither has seen it */
    ASSERT_EQ(st.microbatches, 0);
    ASSERT_NEAR(st.loss_sum, 0, 0);

    /* The follower, not knowing yet, arrives again: it is told, and not counted. */
    st = arrive(follow, 4, 1, 2, 3, 3.0, 0);
    ASSERT_EQ(st.arrived, 0);
    ASSERT_EQ(st.latest_notice, id);
    ASSERT_EQ(st.n_notices, 1);
    ASSERT_EQ(st.notices[0].id, id);
    ASSERT_EQ(st.notices[0].stage, 1);
    ASSERT(!strcmp(st.notices[0].addr, "127.0.0.1:5000"));
    /* It redid its share and arrives having seen the notice: counted, nothing listed. */
    st = arrive(follow, 4, 1, 2, 4, 3.5, id);
    ASSERT_EQ(st.arrived, 1);
    ASSERT_EQ(st.microbatches, 4);
    ASSERT_NEAR(st.loss_sum, 3.5, 0);
    ASSERT_EQ(st.latest_notice, id);
    ASSERT_EQ(st.n_notices, 0);
    st = arrive(lead, 4, 0, 2, 2, 2.5, id);
    ASSERT_EQ(st.arrived, 2);
    ASSERT_EQ(st.microbatches, 6);
    ASSERT_NEAR(st.loss_sum, 6.0, 0);

    /* Step 3's notice is still listed at step 3 only. */
    st = step_sync(peer, step_req(COORD_STEP_APPLIED, 3, 0, 2, 0, 0, 0));
    ASSERT_EQ(st.latest_notice, 1);
    ASSERT_EQ(st.n_notices, 1);
    ASSERT_EQ(st.notices[0].id, 1);
    ASSERT(!strcmp(st.notices[0].addr, "127.0.0.1:4000"));

    /* 20 notices at step 5 (ids 3..22): 16 at a time, oldest first. */
    for (int k = 0; k < 20; k++) st = step_sync(peer, redo_req(5, (uint32_t)(k % 2), "h:1"));
    ASSERT_EQ(st.latest_notice, 22);
    ASSERT_EQ(st.n_notices, COORD_MAX_NOTICES);
    ASSERT_EQ(st.notices[0].id, 3);
    ASSERT_EQ(st.notices[COORD_MAX_NOTICES - 1].id, 18);
    st = arrive(lead, 5, 0, 2, 1, 1.0, 18);
    ASSERT_EQ(st.arrived, 0); /* 22 is newer than 18 */
    ASSERT_EQ(st.n_notices, 4);
    ASSERT_EQ(st.notices[0].id, 19);
    ASSERT_EQ(st.notices[3].id, 22);
    ASSERT_EQ(st.notices[3].stage, 1);
    st = arrive(lead, 5, 0, 2, 1, 1.0, 22);
    ASSERT_EQ(st.arrived, 1);
    ASSERT_EQ(st.n_notices, 0);

    /* 64 more notices elsewhere push step 3's out of memory. */
    for (int k = 0; k < COORD_NOTICE_KEEP; k++) step_sync(peer, redo_req(6, 0, "h:1"));
    st = step_sync(peer, step_req(COORD_STEP_APPLIED, 3, 0, 2, 0, 0, 0));
    ASSERT_EQ(st.latest_notice, 0);
    ASSERT_EQ(st.n_notices, 0);
    st = step_sync(peer, step_req(COORD_STEP_APPLIED, 6, 0, 2, 0, 0, 0));
    ASSERT_EQ(st.latest_notice, 22 + COORD_NOTICE_KEEP);
    ASSERT_EQ(st.notices[0].id, 23);

    coord_client_close(lead);
    coord_client_close(follow);
    coord_client_close(peer);
    coordinator_stop(co);
}

/* A restarted coordinator has forgotten its notices, but its ids must not start over: a
 * follower that acted on notice k skips ids <= k, so a notice the leader re-posts must get
 * a larger id. The leader's REDO carries the newest id it posted and a client's ARRIVE the
 * newest it acted on; the restarted coordinator numbers past both. */
TEST_T(coordinator_step_notice_ids_survive_restart, 10)
{
    coordinator *co = start(2);
    coord_client *lead = client_at(coordinator_port(co));
    for (int k = 0; k < 3; k++) step_sync(lead, redo_req(8, 1, "127.0.0.1:5000"));
    coord_step_state st = arrive(lead, 8, 0, 2, 2, 2.0, 3);
    ASSERT_EQ(st.latest_notice, 3);
    coord_client_close(lead);
    coordinator_stop(co);

    co = start(2); /* the restart: nothing remembered */
    lead = client_at(coordinator_port(co));
    coord_client *follow = client_at(coordinator_port(co));
    /* The follower acted on notice 3 before the restart; its arrival says so. */
    st = arrive(follow, 8, 1, 2, 3, 3.0, 3);
    ASSERT_EQ(st.latest_notice, 0); /* forgotten: the leader must see it is gone */
    ASSERT_EQ(st.arrived, 1);
    /* The leader re-posts: id 4, listed to the follower, which is no longer counted. */
    coord_step_sync q = redo_req(8, 1, "127.0.0.1:5000");
    q.redo_seen = 3;
    st = step_sync(lead, q);
    ASSERT_EQ(st.latest_notice, 4);
    st = arrive(follow, 8, 1, 2, 3, 3.0, 3);
    ASSERT_EQ(st.arrived, 0);
    ASSERT_EQ(st.n_notices, 1);
    ASSERT_EQ(st.notices[0].id, 4);
    ASSERT(!strcmp(st.notices[0].addr, "127.0.0.1:5000"));

    /* A client that saw more than the leader said (ids jump to 10): the next notice is 11,
     * and the ids skipped list nothing. */
    arrive(follow, 9, 1, 2, 3, 3.0, 10);
    st = step_sync(lead, redo_req(9, 0, "127.0.0.1:4000"));
    ASSERT_EQ(st.latest_notice, 11);
    ASSERT_EQ(st.n_notices, 1);
    ASSERT_EQ(st.notices[0].id, 11);
    coord_client_close(lead);
    coord_client_close(follow);
    coordinator_stop(co);
}

typedef struct held_arrive {
    coord_client *c;
    coord_step_sync q;
    coord_step_state st;
    double ms; /* how long the answer took */
} held_arrive;

static void *held_arrive_main(void *arg)
{
    held_arrive *h = arg;
    double t0 = now_ms();
    h->st = step_sync(h->c, h->q);
    h->ms = now_ms() - t0;
    return NULL;
}

/* Send an ARRIVE held up to 2 s from a thread of its own, then wait 300 ms: the caller
 * then makes the change it waits for, and held_join checks it was answered then. */
static void held_start(held_arrive *h, pthread_t *th, coord_client *c, coord_step_sync q)
{
    *h = (held_arrive){.c = c, .q = q};
    h->q.wait_ms = 2000;
    ASSERT(pthread_create(th, NULL, held_arrive_main, h) == 0);
    sleep_ms(300);
}

static void held_join(held_arrive *h, pthread_t th)
{
    pthread_join(th, NULL);
    if (h->ms < 250 || h->ms >= 1000) TEST_FAIL("answered after %.0f ms, not ~300", h->ms);
}

/* An ARRIVE with wait_ms is answered when what its client waits for is there, not before
 * and not much after: the leader's once every client is counted, a follower's once the
 * step is applied or a notice for it is posted; with nothing happening, after wait_ms.
 * Only an ARRIVE may wait, and at most COORD_STEP_WAIT_MAX_MS. */
TEST_T(coordinator_step_barrier_holds_arrivals, 15)
{
    coordinator *co = start(2);
    coord_client *lead = client_at(coordinator_port(co));
    coord_client *follow = client_at(coordinator_port(co));
    coord_client *other = client_at(coordinator_port(co));

    /* The leader waits for the follower, which comes 300 ms later. */
    held_arrive h;
    pthread_t th;
    held_start(&h, &th, lead, step_req(COORD_STEP_ARRIVE, 1, 0, 2, 2, 1.0, 0));
    arrive(follow, 1, 1, 2, 3, 2.0, 0);
    held_join(&h, th);
    ASSERT_EQ(h.st.arrived, 2);
    ASSERT_EQ(h.st.microbatches, 5);

    /* The follower waits for APPLIED, 300 ms later. */
    held_start(&h, &th, follow, step_req(COORD_STEP_ARRIVE, 1, 1, 2, 3, 2.0, 0));
    step_sync(lead, step_req(COORD_STEP_APPLIED, 1, 0, 2, 0, 0, 0));
    held_join(&h, th);
    ASSERT_EQ(h.st.applied_step, 1);

    /* At step 2 the follower waits; a notice posted 300 ms later wakes it, listed. */
    held_start(&h, &th, follow, step_req(COORD_STEP_ARRIVE, 2, 1, 2, 3, 2.0, 0));
    step_sync(other, redo_req(2, 1, "127.0.0.1:5000"));
    held_join(&h, th);
    ASSERT_EQ(h.st.n_notices, 1);

    /* Already there: answered at once. Nothing coming: answered after wait_ms. */
    h = (held_arrive){.c = follow, .q = step_req(COORD_STEP_ARRIVE, 1, 1, 2, 3, 2.0, 0)};
    h.q.wait_ms = 2000;
    held_arrive_main(&h);
    ASSERT(h.ms < 200);
    h = (held_arrive){.c = lead, .q = step_req(COORD_STEP_ARRIVE, 3, 0, 2, 2, 1.0, 0)};
    h.q.wait_ms = 400;
    held_arrive_main(&h);
    ASSERT_EQ(h.st.arrived, 1);
    ASSERT(h.ms >= 350 && h.ms < 1500);

    coord_client_close(lead);
    coord_client_close(follow);
    coord_client_close(other);
    coordinator_stop(co);

    /* The checks: an APPLIED that asks to wait, and too long a wait, are malformed. */
    coord_step_sync bad = step_req(COORD_STEP_APPLIED, 1, 0, 1, 0, 0, 0);
    bad.wait_ms = 10;
    wire_writer w;
    wire_writer_init(&w, 256);
    coord_put_step_sync(&w, &bad);
    coord_step_sync back;
    cirrus_error err = {0};
    ASSERT_EQ(coord_get_step_sync(w.data, w.len, &back, &err), CIRRUS_ECORRUPT);
    ASSERT(strstr(err.msg, "only an ARRIVE may wait"));
    wire_writer_free(&w);
    bad = step_req(COORD_STEP_ARRIVE, 1, 0, 1, 0, 0, 0);
    bad.wait_ms = COORD_STEP_WAIT_MAX_MS + 1;
    wire_writer_init(&w, 256);
    coord_put_step_sync(&w, &bad);
    ASSERT_EQ(coord_get_step_sync(w.data, w.len, &back, &err), CIRRUS_ECORRUPT);
    wire_writer_free(&w);
}

/* Encode q into w (reset first). */
static void put_step(wire_writer *w, coord_step_sync q)
{
    wire_writer_free(w);
    wire_writer_init(w, 1024);
    coord_put_step_sync(w, &q);
}

/* Send a STEP_SYNC on a raw connection; return the reply type (ERROR fills code, msg). */
static int raw_step(net_conn *c, coord_step_sync q, int *code, char msg[256])
{
    wire_writer w;
    wire_writer_init(&w, 1024);
    coord_put_step_sync(&w, &q);
    int type = raw_call(c, COORD_STEP_SYNC, w.data, w.len, code, msg);
    wire_writer_free(&w);
    return type;
}

/* Mistakes (a client count that differs from the job's, a stage the coordinator does not
 * have) are answered CIRRUS_EINVAL on a connection that stays; malformed requests are
 * CIRRUS_ECORRUPT and drop only their own connection. */
TEST_T(coordinator_step_barrier_bad_input, 15)
{
    coordinator *co = start(2);
    int port = coordinator_port(co);
    coord_client *lead = client_at(port);
    arrive(lead, 1, 0, 2, 1, 1.0, 0);

    /* Through the client: the codes come back as such. */
    coord_step_state st;
    cirrus_error err = {0};
    coord_step_sync q = step_req(COORD_STEP_ARRIVE, 1, 1, 3, 1, 1.0, 0);
    ASSERT_EQ(coord_client_step_sync(lead, &q, T_MS, &st, &err), CIRRUS_EINVAL);
    if (!strstr(err.msg, "n_clients 3 differs from the job's 2")) TEST_FAIL("%s", err.msg);
    q = redo_req(1, 2, "127.0.0.1:5000");
    ASSERT_EQ(coord_client_step_sync(lead, &q, T_MS, &st, &err), CIRRUS_EINVAL);
    if (!strstr(err.msg, "stage 2 is outside 0..1")) TEST_FAIL("%s", err.msg);
    /* What the coordinator would refuse as malformed is refused here, unsent. */
    q = step_req(9, 1, 0, 2, 1, 1.0, 0);
    ASSERT_EQ(coord_client_step_sync(lead, &q, T_MS, &st, &err), CIRRUS_EINVAL);
    ASSERT(strstr(err.msg, "op 9") != NULL);
    st = arrive(lead, 1, 0, 2, 1, 1.0, 0);
    ASSERT_EQ(st.arrived, 1); /* nothing of the refused requests was recorded */

    /* On one raw connection: refused, and the same connection answers the next request. */
    net_conn *g = raw_connect(port);
    int code = 0;
    char msg[256] = "";
    ASSERT_EQ(raw_step(g, step_req(COORD_STEP_ARRIVE, 1, 1, 3, 1, 1.0, 0), &code, msg),
              WIRE_ERROR);
    ASSERT_EQ(code, CIRRUS_EINVAL);
    ASSERT(strstr(msg, "n_clients 3 differs from the job's 2") != NULL);
    ASSERT_EQ(raw_step(g, redo_req(1, 2, "127.0.0.1:5000"), &code, msg), WIRE_ERROR);
    ASSERT_EQ(code, CIRRUS_EINVAL);
    ASSERT_EQ(raw_step(g, step_req(COORD_STEP_ARRIVE, 1, 1, 2, 2, 0.5, 0), &code, msg),
              COORD_STEP_SYNC_OK);

    /* Malformed: ERROR(ECORRUPT) naming the field, that connection dropped. */
    wire_writer w;
    wire_writer_init(&w, 16);
    put_step(&w, step_req(9, 1, 0, 2, 1, 1.0, 0));
    expect_refused(port, COORD_STEP_SYNC, w.data, w.len, "op 9");
    put_step(&w, step_req(0, 1, 0, 2, 1, 1.0, 0));
    expect_refused(port, COORD_STEP_SYNC, w.data, w.len, "op 0");
    put_step(&w, step_req(COORD_STEP_ARRIVE, 0, 0, 2, 1, 1.0, 0));
    expect_refused(port, COORD_STEP_SYNC, w.data, w.len, "step 0");
    put_step(&w, step_req(COORD_STEP_ARRIVE, 1, 2, 2, 1, 1.0, 0));
    expect_refused(port, COORD_STEP_SYNC, w.data, w.len, "client_index 2 is not below");
    put_step(&w, step_req(COORD_STEP_ARRIVE, 1, 0, 0, 1, 1.0, 0));
    expect_refused(port, COORD_STEP_SYNC, w.data, w.len, "n_clients 0 is outside 1..64");
    put_step(&w, step_req(COORD_STEP_ARRIVE, 1, 0, 65, 1, 1.0, 0));
    expect_refused(port, COORD_STEP_SYNC, w.data, w.len, "n_clients 65");
    put_step(&w, step_req(COORD_STEP_ARRIVE, 1, 0, 2, 1, NAN, 0));
    expect_refused(port, COORD_STEP_SYNC, w.data, w.len, "loss_sum");
    put_step(&w, step_req(COORD_STEP_ARRIVE, 1, 0, 2, 1, -INFINITY, 0));
    expect_refused(port, COORD_STEP_SYNC, w.data, w.len, "loss_sum");
    put_step(&w, redo_req(1, 0, ""));
    expect_refused(port, COORD_STEP_SYNC, w.data, w.len, "REDO without an addr");
    put_step(&w, redo_req(1, 0, "a b:1"));
    expect_refused(port, COORD_STEP_SYNC, w.data, w.len, "addr");
    q = step_req(COORD_STEP_ARRIVE, 1, 0, 2, 1, 1.0, 0);
    snprintf(q.addr, sizeof q.addr, "127.0.0.1:5000");
    put_step(&w, q);
    expect_refused(port, COORD_STEP_SYNC, w.data, w.len, "only REDO names one");
    put_step(&w, redo_req(1, 0, "127.0.0.1:5000"));
    for (size_t cut = 0; cut < w.len; cut += 7)
        expect_refused(port, COORD_STEP_SYNC, w.data, cut, "truncated STEP_SYNC");
    wire_put_u32(&w, 0);
    expect_refused(port, COORD_STEP_SYNC, w.data, w.len, "trailing bytes");
    wire_writer_free(&w);

    /* Meanwhile the good connection and the client kept being served, and nothing of the
     * malformed requests was recorded. */
    ASSERT_EQ(raw_step(g, step_req(COORD_STEP_APPLIED, 1, 1, 2, 0, 0, 0), &code, msg),
              COORD_STEP_SYNC_OK);
    net_close(g);
    st = arrive(lead, 1, 0, 2, 1, 1.0, 0);
    ASSERT_EQ(st.arrived, 2);
    ASSERT_EQ(st.microbatches, 3);
    ASSERT_NEAR(st.loss_sum, 1.5, 0);
    ASSERT_EQ(st.latest_notice, 0);
    ASSERT_EQ(st.applied_step, 1); /* the raw connection's APPLIED */
    coord_client_close(lead);
    coordinator_stop(co);
}

/* Decode a STEP_SYNC; it must fail with ECORRUPT and a message holding `what`. */
static void step_refused(coord_step_sync q, const char *what)
{
    wire_writer w;
    wire_writer_init(&w, 1024);
    coord_put_step_sync(&w, &q);
    coord_step_sync back;
    cirrus_error err = {0};
    ASSERT_EQ(coord_get_step_sync(w.data, w.len, &back, &err), CIRRUS_ECORRUPT);
    if (!strstr(err.msg, what)) TEST_FAIL("error '%s' does not say '%s'", err.msg, what);
    wire_writer_free(&w);
}

/* Decode a STEP_SYNC_OK; it must fail with ECORRUPT and a message holding `what`. */
static void state_refused(const coord_step_state *st, const char *what)
{
    wire_writer w;
    wire_writer_init(&w, 1 << 16);
    coord_put_step_state(&w, st);
    coord_step_state back;
    cirrus_error err = {0};
    ASSERT_EQ(coord_get_step_state(w.data, w.len, &back, &err), CIRRUS_ECORRUPT);
    if (!strstr(err.msg, what)) TEST_FAIL("error '%s' does not say '%s'", err.msg, what);
    wire_writer_free(&w);
}

static coord_step_state sample_state(void)
{
    coord_step_state st = {.applied_step = 41, .arrived = 3, .microbatches = 24,
                           .loss_sum = 77.125, .latest_notice = 9, .n_notices = 3};
    const uint64_t ids[3] = {4, 7, 9};
    for (int i = 0; i < 3; i++) {
        st.notices[i].id = ids[i];
        st.notices[i].stage = (uint32_t)i;
        snprintf(st.notices[i].addr, sizeof st.notices[i].addr, "10.0.0.%d:70%02d", i + 1, i);
    }
    return st;
}

TEST_T(coordinator_step_proto_round_trip, 5)
{
    /* Request: every op, every truncation refused (but that of the optional wait_ms as a
     * whole: a request without it waits 0 ms), trailing bytes refused. */
    coord_step_sync reqs[3] = {step_req(COORD_STEP_ARRIVE, 12, 3, 64, 7, -2.5, 5),
                               step_req(COORD_STEP_APPLIED, 1, 0, 1, 0, 0, 0),
                               redo_req(0xffffffffffull, 1023, "host-a.example:65535")};
    reqs[0].wait_ms = COORD_STEP_WAIT_MAX_MS;
    for (int k = 0; k < 3; k++) {
        wire_writer w;
        wire_writer_init(&w, 1024);
        coord_put_step_sync(&w, &reqs[k]);
        coord_step_sync back;
        cirrus_error err = {0};
        ASSERT_OK(coord_get_step_sync(w.data, w.len, &back, &err));
        ASSERT_EQ(back.op, reqs[k].op);
        ASSERT_EQ(back.step, reqs[k].step);
        ASSERT_EQ(back.client_index, reqs[k].client_index);
        ASSERT_EQ(back.n_clients, reqs[k].n_clients);
        ASSERT_EQ(back.microbatches, reqs[k].microbatches);
        ASSERT(back.loss_sum == reqs[k].loss_sum);
        ASSERT_EQ(back.redo_seen, reqs[k].redo_seen);
        ASSERT_EQ(back.stage, reqs[k].stage);
        ASSERT(!strcmp(back.addr, reqs[k].addr));
        ASSERT_EQ(back.wait_ms, reqs[k].wait_ms);
        for (size_t cut = 0; cut < w.len; cut++) {
            int rc = coord_get_step_sync(w.data, cut, &back, &err);
            if (cut == w.len - 4) {
                ASSERT_OK(rc);
                ASSERT_EQ(back.wait_ms, 0);
            } else {
                ASSERT_EQ(rc, CIRRUS_ECORRUPT);
                ASSERT(strstr(err.msg, cut < w.len - 4 ? "truncated STEP_SYNC" : "trailing"));
            }
        }
        wire_put_bytes(&w, "x", 1);
        ASSERT_EQ(coord_get_step_sync(w.data, w.len, &back, &err), CIRRUS_ECORRUPT);
        ASSERT(strstr(err.msg, "trailing") != NULL);
        wire_writer_free(&w);
    }
    step_refused(step_req(9, 1, 0, 2, 1, 1.0, 0), "op 9");
    step_refused(step_req(COORD_STEP_ARRIVE, 1, 2, 2, 1, 1.0, 0), "client_index 2");
    step_refused(step_req(COORD_STEP_ARRIVE, 1, 0, 2, 1, NAN, 0), "loss_sum");
    step_refused(step_req(COORD_STEP_APPLIED, 0, 0, 2, 0, 0, 0), "step 0");
    step_refused(step_req(COORD_STEP_APPLIED, 1, 0, 65, 0, 0, 0), "n_clients 65");
    step_refused(redo_req(1, 0, ""), "without an addr");
    step_refused(redo_req(1, 0, "a\"b"), "addr");
    /* An addr longer than 63 bytes is refused at the length, before it is copied. */
    {
        wire_writer w;
        wire_writer_init(&w, 1024);
        coord_step_sync q = redo_req(1, 0, "h:1");
        coord_put_step_sync(&w, &q);
        w.len -= 4 + 2 + 3; /* drop wait_ms and the addr, and write a long addr */
        char longaddr[101];
        memset(longaddr, 'a', 100);
        longaddr[100] = '\0';
        wire_put_str(&w, longaddr);
        coord_step_sync back;
        cirrus_error err = {0};
        ASSERT_EQ(coord_get_step_sync(w.data, w.len, &back, &err), CIRRUS_ECORRUPT);
        ASSERT(strstr(err.msg, "addr is 100 bytes") != NULL);
        wire_writer_free(&w);
    }

    /* Reply: round trip, every truncation refused. */
    coord_step_state st = sample_state(), back;
    wire_writer w;
    wire_writer_init(&w, 1 << 16);
    coord_put_step_state(&w, &st);
    cirrus_error err = {0};
    ASSERT_OK(coord_get_step_state(w.data, w.len, &back, &err));
    ASSERT_EQ(back.applied_step, 41);
    ASSERT_EQ(back.arrived, 3);
    ASSERT_EQ(back.microbatches, 24);
    ASSERT(back.loss_sum == 77.125);
    ASSERT_EQ(back.latest_notice, 9);
    ASSERT_EQ(back.n_notices, 3);
    for (int i = 0; i < 3; i++) {
        ASSERT_EQ(back.notices[i].id, st.notices[i].id);
        ASSERT_EQ(back.notices[i].stage, st.notices[i].stage);
        ASSERT(!strcmp(back.notices[i].addr, st.notices[i].addr));
    }
    for (size_t cut = 0; cut < w.len; cut++)
        ASSERT_EQ(coord_get_step_state(w.data, cut, &back, &err), CIRRUS_ECORRUPT);
    wire_put_bytes(&w, "x", 1);
    ASSERT_EQ(coord_get_step_state(w.data, w.len, &back, &err), CIRRUS_ECORRUPT);
    wire_writer_free(&w);
    /* An empty state, and an infinite sum (finite losses can overflow), are fine. */
    coord_step_state empty = {0};
    wire_writer_init(&w, 1024);
    coord_put_step_state(&w, &empty);
    ASSERT_OK(coord_get_step_state(w.data, w.len, &back, &err));
    ASSERT_EQ(w.len, 36);
    wire_writer_free(&w);
    st = sample_state();
    st.loss_sum = INFINITY;
    wire_writer_init(&w, 1 << 16);
    coord_put_step_state(&w, &st);
    ASSERT_OK(coord_get_step_state(w.data, w.len, &back, &err));
    wire_writer_free(&w);

    /* Every field checked. */
    st = sample_state();
    st.n_notices = COORD_MAX_NOTICES + 1;
    state_refused(&st, "lists 17 notices");
    st = sample_state();
    st.loss_sum = NAN;
    state_refused(&st, "loss_sum is NaN");
    st = sample_state();
    st.arrived = COORD_MAX_CLIENTS + 1;
    state_refused(&st, "arrived 65");
    st = sample_state();
    st.arrived = 0;
    state_refused(&st, "of no client");
    st = sample_state();
    st.notices[1].id = 4; /* not after notice 0 */
    state_refused(&st, "notice 1 id 4");
    st = sample_state();
    st.latest_notice = 8; /* notice 2 (id 9) is newer than the latest */
    state_refused(&st, "notice 2 id 9");
    st = sample_state();
    st.notices[0].id = 0;
    state_refused(&st, "notice 0 id 0");
    st = sample_state();
    st.notices[2].stage = COORD_MAX_STAGES;
    state_refused(&st, "notice 2 stage 1024");
    st = sample_state();
    st.notices[1].addr[0] = '\0';
    state_refused(&st, "notice 1 addr");
    st = sample_state();
    snprintf(st.notices[0].addr, sizeof st.notices[0].addr, "x y");
    state_refused(&st, "notice 0 addr");
}

/* ---- the public entry ---- */

typedef struct run_job {
    coordinator_options o;
    volatile sig_atomic_t stop;
    int rc;
    cirrus_error err;
} run_job;

static void *run_main(void *arg)
{
    run_job *j = arg;
    j->rc = coordinator_run(&j->o, &j->stop, &j->err);
    return NULL;
}

static int free_port(void)
{
    int fd, port;
    cirrus_error err = {0};
    ASSERT_OK(net_listen("127.0.0.1", 0, &fd, &port, &err));
    close(fd);
    return port;
}

TEST_T(coordinator_run_serves_until_stopped, 10)
{
    run_job j = {.o = {.job_id = JOB, .host = "127.0.0.1", .port = free_port(),
                       .http_port = free_port(), .n_stages = 3, .heartbeat_ms = 100}};
    pthread_t th;
    ASSERT_OK(pthread_create(&th, NULL, run_main, &j));
    /* It is up once it answers. */
    coord_client *c = client_at(j.o.port);
    coord_registration r = stage_reg("p", 2, 0, 1, 7001, 1);
    cirrus_error err = {0};
    double t0 = now_ms();
    while (coord_client_register(c, &r, T_MS, NULL, &err)) {
        if (now_ms() - t0 > T_MS) TEST_FAIL("coordinator_run never answered: %s", err.msg);
        sleep_ms(10);
    }
    http_reply h;
    http_req(j.o.http_port, "GET", "/metrics", &h);
    ASSERT_EQ(h.status, 200);
    has_line(h.body, "cirrus_peers{stage=\"2\"} 1");
    has_line(h.body, "cirrus_stages 3");
    free(h.body);
    __atomic_store_n(&j.stop, 1, __ATOMIC_RELAXED);
    pthread_join(th, NULL);
    ASSERT_OK(j.rc);
    coord_client_close(c);

    /* Bad options are refused with a message. */
    run_job bad = {.o = {.job_id = JOB, .n_stages = 0}};
    ASSERT_EQ(coordinator_run(&bad.o, &bad.stop, &bad.err), CIRRUS_EINVAL);
    ASSERT(strstr(bad.err.msg, "stage count") != NULL);
}

/* Capacity in forward units per busy second for one forward and one backward per sample:
 * a backward counts as WIRING_BACKWARD_COST (2.5) forwards. */
TEST_T(coordinator_capacity_from_stats, 5)
{
    coord_stats s = {.fwd_throughput = 10, .bwd_throughput = 4};
    ASSERT_NEAR(coord_stats_capacity(&s), 3.5 / (0.1 + 0.25), 1e-12); /* 10: as charged */
    s.bwd_throughput = 0; /* a peer that measures forwards only */
    ASSERT_NEAR(coord_stats_capacity(&s), 10, 0);
    s.fwd_throughput = 0;
    ASSERT_NEAR(coord_stats_capacity(&s), 0, 0);
}

/* Every period the coordinator feeds the policy its live stage peers: three peers of equal
 * capacity on stage 0 and one on stage 1 (of equal depth) -> exactly one stage-0 peer is
 * told to move to stage 1; once it registered there (2, 2), nothing moves again, however
 * many periods pass. /status and /metrics count the move. */
TEST_T(coordinator_rebalances_unbalanced_stages, 15)
{
    coordinator_options o = {.job_id = JOB, .host = "127.0.0.1", .http_port = 0, .n_stages = 2,
                             .n_layer = 8, .heartbeat_ms = 1000, .rebalance_period_ms = 200};
    coordinator *co = NULL;
    cirrus_error err = {0};
    if (coordinator_start(&o, &co, &err)) TEST_FAIL("coordinator_start: %s", err.msg);
    enum { NP = 4 };
    static const char *names[NP] = {"a", "b", "c", "d"};
    coord_client *m[NP];
    coord_registered id[NP];
    for (int i = 0; i < NP; i++)
        m[i] = join(co, stage_reg(names[i], i < 3 ? 0 : 1, i < 3 ? 0 : 4, i < 3 ? 4 : 8,
                                  (uint16_t)(7001 + i), 10), &id[i]);
    coord_stats s = {.loss = NAN, .fwd_throughput = 10, .bwd_throughput = 4}; /* capacity 10 */
    uint32_t ins[NP];
    int mover = -1;
    for (double t0 = now_ms(); mover < 0 && now_ms() - t0 < 3000; sleep_ms(50))
        for (int i = 0; i < NP; i++) {
            heartbeat(m[i], &s, &ins[i], NULL);
            if (ins[i] != COORD_NO_INSTRUCTION) mover = i;
        }
    ASSERT(mover >= 0 && mover < 3);
    ASSERT_EQ(ins[mover], 1);
    coord_snapshot snap;
    ASSERT_OK(coordinator_snapshot(co, &snap));
    ASSERT_EQ(snap.moves, 1);
    ASSERT_EQ(snap.n_recent, 1);
    ASSERT_EQ(snap.recent[0].peer_id, id[mover].peer_id);
    ASSERT_EQ(snap.recent[0].from_stage, 0);
    ASSERT_EQ(snap.recent[0].to_stage, 1);
    ASSERT_NEAR(snap.recent[0].min_before, 10, 1e-9);
    ASSERT_NEAR(snap.recent[0].min_after, 20, 1e-9);
    ASSERT_NEAR(snap.stage_capacity[0], 30, 1e-9);
    coord_snapshot_free(&snap);

    /* It moves: registers at stage 1 under the same name. Then 2, 2 stays put. */
    coord_registration moved = stage_reg(names[mover], 1, 4, 8, (uint16_t)(7001 + mover), 10);
    ASSERT_OK(coord_client_register(m[mover], &moved, T_MS, NULL, &err));
    for (double t0 = now_ms(); now_ms() - t0 < 1500; sleep_ms(50))
        for (int i = 0; i < NP; i++) {
            heartbeat(m[i], &s, &ins[i], NULL);
            ASSERT_EQ(ins[i], COORD_NO_INSTRUCTION);
        }
    json_t *j = get_status(co);
    json_t *rb = json_object_get(j, "rebalance");
    ASSERT_EQ(jint(rb, "moves"), 1);
    ASSERT_EQ(jint(rb, "withdrawn"), 0);
    ASSERT_NEAR(jnum(rb, "period_s"), 0.2, 1e-12);
    json_t *recent = json_object_get(rb, "recent");
    ASSERT_EQ(json_array_size(recent), 1);
    ASSERT_EQ(jint(json_array_get(recent, 0), "peer"), id[mover].peer_id);
    ASSERT_EQ(jint(json_array_get(recent, 0), "to"), 1);
    json_t *st = json_object_get(j, "stages");
    ASSERT_EQ(jint(json_array_get(st, 0), "peers"), 2);
    ASSERT_EQ(jint(json_array_get(st, 1), "peers"), 2);
    ASSERT_NEAR(jnum(json_array_get(st, 1), "capacity"), 20, 1e-9);
    json_t *me = json_array_get(json_object_get(j, "members"), (size_t)mover);
    ASSERT(json_is_null(json_object_get(me, "moving_to")));
    ASSERT_NEAR(jnum(me, "capacity"), 10, 1e-9);
    json_decref(j);
    char *t = get_metrics(co);
    has_line(t, "cirrus_rebalance_moves_total 1");
    has_line(t, "cirrus_stage_capacity{stage=\"1\"} 20");
    free(t);
    for (int i = 0; i < NP; i++) coord_client_close(m[i]);
    coordinator_stop(co);
}
