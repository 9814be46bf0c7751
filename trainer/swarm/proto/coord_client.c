/* coord_client: the member side of the coordinator's protocol (coord_msg.h): one
 * connection, made on demand and remade after a coordinator restart, requests that name
 * the member re-registering by themselves, and every reply checked before it is trusted. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../net/conn.h"
#include "coord_msg.h"
#include "rpc.h"

struct coord_client {
    pthread_mutex_t mu;
    char host[COORD_HOST_MAX + 1];
    char job_id[WIRE_JOB_ID_MAX + 1];
    int port;
    net_conn *conn; /* NULL: connect on the next call */
    uint64_t next_request;
    int registered;
    coord_registration reg;
    coord_registered id;
    coord_report last_report; /* for coord_client_keepalive */
    int64_t reported_ms;      /* when it was sent; 0: none yet */
};

/* Milliseconds left before deadline (-1: none); 0 once it passed. */
static int left_ms(int64_t deadline)
{
    if (deadline < 0) return -1;
    int64_t d = deadline - net_now_ms();
    return d <= 0 ? 0 : d > 1000000000 ? 1000000000 : (int)d;
}

int coord_client_open(const char *host, int port, const char *job_id, coord_client **out,
                      cirrus_error *err)
{
    *out = NULL;
    if (!host || !*host || strlen(host) > COORD_HOST_MAX)
        return cirrus_fail(err, CIRRUS_EINVAL, "coordinator host must be 1..%d bytes",
                           COORD_HOST_MAX);
    if (port <= 0 || port > 65535)
        return cirrus_fail(err, CIRRUS_EINVAL, "coordinator port %d is outside 1..65535", port);
    if (!job_id || !*job_id || strlen(job_id) > WIRE_JOB_ID_MAX)
        return cirrus_fail(err, CIRRUS_EINVAL, "job id must be 1..%d bytes", WIRE_JOB_ID_MAX);
    coord_client *c = calloc(1, sizeof *c);
    if (!c) return cirrus_fail(err, CIRRUS_ENOMEM, "out of memory for a coordinator client");
    pthread_mutex_init(&c->mu, NULL);
    strcpy(c->host, host);
    strcpy(c->job_id, job_id);
    c->port = port;
    c->next_request = 1;
    *out = c;
    return 0;
}

void coord_client_close(coord_client *c)
{
    if (!c) return;
    if (c->conn) net_close(c->conn);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

static void drop_conn(coord_client *c)
{
    if (c->conn) net_close(c->conn);
    c->conn = NULL;
}

/* One attempt of request -> reply on the current connection (connecting first if there is
 * none). *fresh says whether the connection was made by this attempt. */
static int call_once(coord_client *c, uint16_t type, const wire_writer *req, int64_t deadline,
                     const uint8_t **reply, uint32_t *reply_len, int *fresh, cirrus_error *err)
{
    int rc;
    *fresh = 0;
    if (!c->conn) {
        *fresh = 1;
        if ((rc = net_connect(c->host, c->port, left_ms(deadline), &c->conn, err))) {
            c->conn = NULL;
            return rc;
        }
        net_set_max_payload(c->conn, COORD_REPLY_LIMIT);
        uint16_t role = c->registered ? c->reg.role : 0;
        if ((rc = net_hello_client(c->conn, c->job_id, role, c->id.peer_id, left_ms(deadline),
                                   err)))
            goto fail;
    }
    uint64_t rid = c->next_request++;
    char who[COORD_HOST_MAX + 32];
    snprintf(who, sizeof who, "coordinator %s", net_peer_name(c->conn));
    wire_reader r;
    rc = rpc_send(c->conn, type, rid, req, left_ms(deadline), who, err);
    if (!rc) rc = rpc_await(c->conn, type, rid, left_ms(deadline), who, &r, err);
    /* A refusal (rpc.h's one mapping: never a fault code) keeps the connection; the
     * coordinator drops one whose request it found malformed, which the next call finds
     * closed and replaces (call). */
    if (rc && !rpc_is_fault(rc)) return rc;
    if (rc) goto fail;
    *reply = r.data;
    *reply_len = (uint32_t)r.len;
    return 0;
fail:
    drop_conn(c);
    return rc;
}

/* Request -> reply within one deadline. A connection kept from an earlier call may have
 * died since (a restarted coordinator): a send or receive that finds it closed is retried
 * once on a fresh connection. */
static int call(coord_client *c, uint16_t type, const wire_writer *req, int64_t deadline,
                const uint8_t **reply, uint32_t *reply_len, cirrus_error *err)
{
    if (req->failed) return cirrus_fail(err, CIRRUS_EINVAL, "request too large");
    int fresh = 0;
    int rc = call_once(c, type, req, deadline, reply, reply_len, &fresh, err);
    if ((rc == CIRRUS_ECLOSED || rc == CIRRUS_EIO || rc == CIRRUS_ETRUNC) && !fresh &&
        left_ms(deadline) != 0)
        rc = call_once(c, type, req, deadline, reply, reply_len, &fresh, err);
    return rc;
}

int coord_client_ext_call(coord_client *c, uint16_t type, const wire_writer *req,
                          int timeout_ms, const uint8_t **reply, uint32_t *reply_len,
                          cirrus_error *err)
{
    if (type < COORD_EXT_FIRST || type > COORD_EXT_LAST || (type & 1))
        return cirrus_fail(err, CIRRUS_EINVAL, "type %u is not an extension request", type);
    pthread_mutex_lock(&c->mu);
    int rc = call(c, type, req, timeout_ms < 0 ? -1 : net_now_ms() + timeout_ms, reply, reply_len,
                  err);
    pthread_mutex_unlock(&c->mu);
    return rc;
}

static int do_register(coord_client *c, const coord_registration *reg, int64_t deadline,
                       cirrus_error *err)
{
    wire_writer w;
    wire_writer_init(&w, COORD_REQUEST_LIMIT);
    coord_put_registration(&w, reg);
    const uint8_t *p;
    uint32_t n;
    int rc = call(c, COORD_REGISTER, &w, deadline, &p, &n, err);
    wire_writer_free(&w);
    if (rc) return rc;
    wire_reader r;
    wire_reader_init(&r, p, n);
    coord_registered id;
    id.peer_id = wire_get_u32(&r);
    id.heartbeat_ms = wire_get_u32(&r);
    id.expire_ms = wire_get_u32(&r);
    id.epoch = wire_get_u64(&r);
    if (wire_reader_done(&r) || id.peer_id == 0 || id.peer_id == COORD_NO_STAGE ||
        id.heartbeat_ms == 0 || id.expire_ms == 0 || id.epoch == 0) {
        drop_conn(c);
        return cirrus_fail(err, CIRRUS_ECORRUPT, "malformed REGISTER_OK (%u bytes)", n);
    }
    c->reg = *reg;
    c->id = id;
    c->registered = 1;
    return 0;
}

int coord_client_register(coord_client *c, const coord_registration *reg, int timeout_ms,
                          coord_registered *out, cirrus_error *err)
{
    cirrus_error e = {0};
    /* Refuse locally what the coordinator would refuse (and drop the connection for). */
    if (coord_registration_ok(reg, &e))
        return cirrus_fail(err, CIRRUS_EINVAL, "%s", e.msg);
    int64_t deadline = timeout_ms < 0 ? -1 : net_now_ms() + timeout_ms;
    pthread_mutex_lock(&c->mu);
    int rc = do_register(c, reg, deadline, err);
    if (!rc && out) *out = c->id;
    pthread_mutex_unlock(&c->mu);
    return rc;
}

/* Send a request that names this member (HEARTBEAT, CLIENT_REPORT); when the coordinator
 * does not know it, re-register and send it again. */
typedef void (*put_fn)(wire_writer *w, uint64_t epoch, uint32_t peer_id, const void *body);

static int member_call(coord_client *c, uint16_t type, put_fn put, const void *body,
                       int timeout_ms, const uint8_t **reply, uint32_t *reply_len,
                       int *reregistered, cirrus_error *err)
{
    if (reregistered) *reregistered = 0;
    if (!c->registered) return cirrus_fail(err, CIRRUS_EINVAL, "not registered");
    int64_t deadline = timeout_ms < 0 ? -1 : net_now_ms() + timeout_ms;
    int rc = 0;
    for (int attempt = 0; attempt < 2; attempt++) {
        wire_writer w;
        wire_writer_init(&w, COORD_REQUEST_LIMIT);
        put(&w, c->id.epoch, c->id.peer_id, body);
        rc = call(c, type, &w, deadline, reply, reply_len, err);
        wire_writer_free(&w);
        if (rc != CIRRUS_ENOENT || attempt == 1) break;
        /* Unknown peer: the coordinator restarted (new epoch) or let us expire. */
        coord_registration reg = c->reg;
        if ((rc = do_register(c, &reg, deadline, err))) break;
        if (reregistered) *reregistered = 1;
    }
    return rc;
}

static void put_heartbeat(wire_writer *w, uint64_t epoch, uint32_t id, const void *body)
{
    coord_put_heartbeat(w, epoch, id, body);
}

static void put_report(wire_writer *w, uint64_t epoch, uint32_t id, const void *body)
{
    coord_put_report(w, epoch, id, body);
}

int coord_client_heartbeat(coord_client *c, const coord_stats *stats, int timeout_ms,
                           uint32_t *instruction, int *reregistered, cirrus_error *err)
{
    pthread_mutex_lock(&c->mu);
    const uint8_t *p;
    uint32_t n;
    int rc = member_call(c, COORD_HEARTBEAT, put_heartbeat, stats, timeout_ms, &p, &n,
                         reregistered, err);
    if (!rc) {
        wire_reader r;
        wire_reader_init(&r, p, n);
        uint64_t epoch = wire_get_u64(&r);
        uint32_t ins = wire_get_u32(&r);
        if (wire_reader_done(&r)) {
            drop_conn(c);
            rc = cirrus_fail(err, CIRRUS_ECORRUPT, "malformed HEARTBEAT_OK (%u bytes)", n);
        } else if (epoch != c->id.epoch) {
            /* Never sent by a correct coordinator (it refuses a stale epoch): re-register
             * at the next heartbeat rather than trust either side. */
            rc = cirrus_fail(err, CIRRUS_EMISMATCH, "HEARTBEAT_OK for epoch %llu, not %llu",
                             (unsigned long long)epoch, (unsigned long long)c->id.epoch);
            c->id.epoch = 0;
        } else if (instruction) {
            *instruction = ins;
        }
    }
    pthread_mutex_unlock(&c->mu);
    return rc;
}

int coord_client_report(coord_client *c, const coord_report *rep, int timeout_ms,
                        int *reregistered, cirrus_error *err)
{
    pthread_mutex_lock(&c->mu);
    const uint8_t *p;
    uint32_t n;
    int rc = member_call(c, COORD_CLIENT_REPORT, put_report, rep, timeout_ms, &p, &n,
                         reregistered, err);
    if (!rc) {
        wire_reader r;
        wire_reader_init(&r, p, n);
        uint64_t epoch = wire_get_u64(&r);
        if (wire_reader_done(&r) || epoch != c->id.epoch) {
            drop_conn(c);
            rc = cirrus_fail(err, CIRRUS_ECORRUPT, "malformed CLIENT_REPORT_OK (%u bytes)", n);
        }
    }
    if (!rc) {
        c->last_report = *rep;
        c->reported_ms = net_now_ms();
    }
    pthread_mutex_unlock(&c->mu);
    return rc;
}

int coord_client_keepalive(coord_client *c, int timeout_ms, cirrus_error *err)
{
    pthread_mutex_lock(&c->mu);
    const int due = c->reported_ms > 0 && c->registered &&
                    net_now_ms() - c->reported_ms >= (int64_t)c->id.heartbeat_ms;
    const coord_report rep = c->last_report;
    pthread_mutex_unlock(&c->mu);
    return due ? coord_client_report(c, &rep, timeout_ms, NULL, err) : 0;
}

int coord_client_peers(coord_client *c, uint32_t stage, int timeout_ms,
                       coord_peer_info **peers, size_t *n_out, uint32_t *n_stages,
                       cirrus_error *err)
{
    *peers = NULL;
    *n_out = 0;
    int64_t deadline = timeout_ms < 0 ? -1 : net_now_ms() + timeout_ms;
    pthread_mutex_lock(&c->mu);
    wire_writer w;
    wire_writer_init(&w, 16);
    wire_put_u32(&w, stage);
    const uint8_t *p;
    uint32_t len;
    coord_peer_info *list = NULL;
    int rc = call(c, COORD_PEERS, &w, deadline, &p, &len, err);
    wire_writer_free(&w);
    if (rc) goto out;
    wire_reader r;
    wire_reader_init(&r, p, len);
    wire_get_u64(&r); /* epoch */
    uint32_t ns = wire_get_u32(&r);
    uint32_t count = wire_get_u32(&r);
    /* An entry is at least 30 bytes (four u32, two empty strings, port, f64): a count the
     * payload cannot hold is refused before anything is allocated for it. */
    if (r.failed || ns == 0 || ns > COORD_MAX_STAGES || count > (r.len - r.pos) / 30) {
        rc = CIRRUS_ECORRUPT;
    } else if (count > 0 && !(list = calloc(count, sizeof *list))) {
        rc = cirrus_fail(err, CIRRUS_ENOMEM, "out of memory for %u peers", count);
        goto out;
    }
    for (uint32_t i = 0; !rc && i < count; i++) {
        rc = coord_get_peer_info(&r, &list[i]);
        if (!rc && (list[i].stage >= ns || (stage != COORD_ALL_STAGES && list[i].stage != stage)))
            rc = CIRRUS_ECORRUPT;
    }
    if (!rc && wire_reader_done(&r)) rc = CIRRUS_ECORRUPT;
    if (rc) {
        drop_conn(c);
        free(list);
        list = NULL;
        rc = cirrus_fail(err, CIRRUS_ECORRUPT, "malformed PEERS_OK (%u bytes)", len);
        goto out;
    }
    *peers = list;
    *n_out = count;
    if (n_stages) *n_stages = ns;
out:
    pthread_mutex_unlock(&c->mu);
    return rc;
}

int coord_client_step_sync(coord_client *c, const coord_step_sync *req, int timeout_ms,
                           coord_step_state *out, cirrus_error *err)
{
    memset(out, 0, sizeof *out);
    cirrus_error e = {0};
    /* Refuse locally what the coordinator would refuse (and drop the connection for). */
    if (coord_step_sync_ok(req, &e)) return cirrus_fail(err, CIRRUS_EINVAL, "%s", e.msg);
    int64_t deadline = timeout_ms < 0 ? -1 : net_now_ms() + timeout_ms;
    pthread_mutex_lock(&c->mu);
    wire_writer w;
    wire_writer_init(&w, COORD_REQUEST_LIMIT);
    coord_put_step_sync(&w, req);
    const uint8_t *p;
    uint32_t len;
    int rc = call(c, COORD_STEP_SYNC, &w, deadline, &p, &len, err);
    wire_writer_free(&w);
    if (!rc && (rc = coord_get_step_state(p, len, out, err)) == 0 && out->n_notices &&
        out->notices[0].id <= req->redo_seen)
        rc = cirrus_fail(err, CIRRUS_ECORRUPT, "STEP_SYNC_OK lists notice %llu, already seen "
                         "(%llu)", (unsigned long long)out->notices[0].id,
                         (unsigned long long)req->redo_seen);
    if (rc == CIRRUS_ECORRUPT) {
        /* A reply we cannot trust: the stream may be off too. */
        drop_conn(c);
        memset(out, 0, sizeof *out);
    }
    pthread_mutex_unlock(&c->mu);
    return rc;
}

int coord_client_leave(coord_client *c, int timeout_ms, cirrus_error *err)
{
    int64_t deadline = timeout_ms < 0 ? -1 : net_now_ms() + timeout_ms;
    pthread_mutex_lock(&c->mu);
    int rc = 0;
    if (c->registered) {
        wire_writer w;
        wire_writer_init(&w, 16);
        wire_put_u64(&w, c->id.epoch);
        wire_put_u32(&w, c->id.peer_id);
        const uint8_t *p;
        uint32_t n;
        rc = call(c, COORD_LEAVE, &w, deadline, &p, &n, err);
        wire_writer_free(&w);
        if (rc == CIRRUS_ENOENT) rc = 0; /* already gone */
        c->registered = 0;
        memset(&c->id, 0, sizeof c->id);
    }
    pthread_mutex_unlock(&c->mu);
    return rc;
}

uint32_t coord_client_peer_id(coord_client *c)
{
    pthread_mutex_lock(&c->mu);
    uint32_t id = c->registered ? c->id.peer_id : 0;
    pthread_mutex_unlock(&c->mu);
    return id;
}

uint64_t coord_client_epoch(coord_client *c)
{
    pthread_mutex_lock(&c->mu);
    uint64_t e = c->registered ? c->id.epoch : 0;
    pthread_mutex_unlock(&c->mu);
    return e;
}
