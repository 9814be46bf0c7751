/* coord_msg: coordinator message encoding, decoding and the member-side client. See
 * coord_msg.h and docs/PROTOCOL.md. */
#include "coord_msg.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../../net/conn.h"
#include "../policy/wiring.h"
#include "rpc.h"

/* ---- validation helpers ---- */

static int name_char_ok(unsigned char ch)
{
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
           ch == '.' || ch == '_' || ch == ':' || ch == '-';
}

static int chars_ok(const char *s, size_t min, size_t max)
{
    size_t n = s ? strlen(s) : 0;
    if (n < min || n > max) return 0;
    for (size_t i = 0; i < n; i++)
        if (!name_char_ok((unsigned char)s[i])) return 0;
    return 1;
}

int coord_name_ok(const char *s) { return chars_ok(s, 0, COORD_NAME_MAX); }
int coord_host_ok(const char *s) { return chars_ok(s, 1, COORD_HOST_MAX); }

/* Untrusted text for a message: at most 40 bytes, non-printable bytes shown as '?'. */
static const char *shown(char out[48], const char *s)
{
    size_t i = 0;
    for (; s[i] && i < 40; i++)
        out[i] = (unsigned char)s[i] >= 0x20 && (unsigned char)s[i] < 0x7f ? s[i] : '?';
    out[i] = '\0';
    if (s[i]) strcpy(out + i, "...");
    return out;
}

static int rate_ok(double v) { return isfinite(v) && v >= 0; }

/* A u16-length string field into out[size], with a message naming the field when it is
 * too long or holds a NUL byte. A missing field only latches the reader (reported as a
 * truncated message by the caller). */
static int get_str_field(wire_reader *r, char *out, size_t size, const char *msg,
                         const char *field, cirrus_error *err)
{
    out[0] = '\0';
    size_t n = wire_get_u16(r);
    if (r->failed) return 0;
    if (n >= size) {
        r->failed = 1;
        return cirrus_fail(err, CIRRUS_ECORRUPT, "%s %s is %zu bytes, longer than the %zu allowed",
                           msg, field, n, size - 1);
    }
    const char *p = wire_get_bytes(r, n);
    if (!p) return 0;
    if (memchr(p, '\0', n)) {
        r->failed = 1;
        return cirrus_fail(err, CIRRUS_ECORRUPT, "%s %s holds a NUL byte", msg, field);
    }
    memcpy(out, p, n);
    out[n] = '\0';
    return 0;
}

/* After reading a whole message: truncated, trailing bytes, or fine. */
static int finish(const wire_reader *r, const char *msg, cirrus_error *err)
{
    if (r->failed)
        return cirrus_fail(err, CIRRUS_ECORRUPT, "truncated %s (%zu bytes)", msg, r->len);
    if (r->pos != r->len)
        return cirrus_fail(err, CIRRUS_ECORRUPT, "%s has %zu trailing bytes", msg,
                           r->len - r->pos);
    return 0;
}

/* ---- REGISTER ---- */

void coord_put_registration(wire_writer *w, const coord_registration *r)
{
    wire_put_u16(w, r->role);
    wire_put_u32(w, r->stage);
    wire_put_u32(w, r->l0);
    wire_put_u32(w, r->l1);
    wire_put_str(w, r->name);
    wire_put_str(w, r->host);
    wire_put_u16(w, r->port);
    wire_put_f64(w, r->throughput);
}

/* What a registration says about itself, whoever receives it. */
static int registration_ok(const coord_registration *r, cirrus_error *err)
{
    char s[48];
    if (!coord_name_ok(r->name))
        return cirrus_fail(err, CIRRUS_ECORRUPT,
                           "REGISTER name '%s' is not 0..%d bytes of [A-Za-z0-9._:-]",
                           shown(s, r->name), COORD_NAME_MAX);
    if (!rate_ok(r->throughput))
        return cirrus_fail(err, CIRRUS_ECORRUPT, "REGISTER throughput %g is not a rate",
                           r->throughput);
    if (r->role == COORD_ROLE_STAGE) {
        if (r->stage == COORD_NO_STAGE)
            return cirrus_fail(err, CIRRUS_ECORRUPT, "REGISTER of a stage peer without a stage");
        if (r->l0 >= r->l1 || r->l1 > COORD_MAX_LAYERS)
            return cirrus_fail(err, CIRRUS_ECORRUPT, "REGISTER layer range [%u, %u) is invalid",
                               r->l0, r->l1);
        if (!coord_host_ok(r->host))
            return cirrus_fail(err, CIRRUS_ECORRUPT, "REGISTER host '%s' is not a host name",
                               shown(s, r->host));
        if (r->port == 0)
            return cirrus_fail(err, CIRRUS_ECORRUPT, "REGISTER of a stage peer with port 0");
        return 0;
    }
    if (r->role == COORD_ROLE_CLIENT) {
        if (r->stage != COORD_NO_STAGE || r->l0 || r->l1)
            return cirrus_fail(err, CIRRUS_ECORRUPT,
                               "REGISTER of a client with stage %u, layers [%u, %u)", r->stage,
                               r->l0, r->l1);
        if (r->host[0] && !coord_host_ok(r->host))
            return cirrus_fail(err, CIRRUS_ECORRUPT, "REGISTER host '%s' is not a host name",
                               shown(s, r->host));
        return 0;
    }
    return cirrus_fail(err, CIRRUS_ECORRUPT,
                       "REGISTER role %u is neither %d (stage peer) nor %d (client)", r->role,
                       COORD_ROLE_STAGE, COORD_ROLE_CLIENT);
}

int coord_get_registration(const void *p, size_t n, coord_registration *r, cirrus_error *err)
{
    wire_reader rd;
    wire_reader_init(&rd, p, n);
    memset(r, 0, sizeof *r);
    r->role = wire_get_u16(&rd);
    r->stage = wire_get_u32(&rd);
    r->l0 = wire_get_u32(&rd);
    r->l1 = wire_get_u32(&rd);
    int rc;
    if ((rc = get_str_field(&rd, r->name, sizeof r->name, "REGISTER", "name", err))) return rc;
    if ((rc = get_str_field(&rd, r->host, sizeof r->host, "REGISTER", "host", err))) return rc;
    r->port = wire_get_u16(&rd);
    r->throughput = wire_get_f64(&rd);
    if ((rc = finish(&rd, "REGISTER", err))) return rc;
    return registration_ok(r, err);
}

/* ---- HEARTBEAT and CLIENT_REPORT ---- */

void coord_put_heartbeat(wire_writer *w, uint64_t epoch, uint32_t peer_id, const coord_stats *s)
{
    wire_put_u64(w, epoch);
    wire_put_u32(w, peer_id);
    wire_put_u64(w, s->samples);
    wire_put_u64(w, s->step);
    wire_put_f32(w, s->loss);
    wire_put_f64(w, s->tokens_per_s);
    wire_put_f64(w, s->fwd_throughput);
    wire_put_f64(w, s->bwd_throughput);
}

int coord_get_heartbeat(const void *p, size_t n, uint64_t *epoch, uint32_t *peer_id,
                        coord_stats *s, cirrus_error *err)
{
    wire_reader r;
    wire_reader_init(&r, p, n);
    *epoch = wire_get_u64(&r);
    *peer_id = wire_get_u32(&r);
    s->samples = wire_get_u64(&r);
    s->step = wire_get_u64(&r);
    s->loss = wire_get_f32(&r);
    s->tokens_per_s = wire_get_f64(&r);
    s->fwd_throughput = wire_get_f64(&r);
    s->bwd_throughput = wire_get_f64(&r);
    int rc = finish(&r, "HEARTBEAT", err);
    if (rc) return rc;
    if (isinf(s->loss))
        return cirrus_fail(err, CIRRUS_ECORRUPT, "HEARTBEAT loss is infinite");
    if (!rate_ok(s->tokens_per_s) || !rate_ok(s->fwd_throughput) || !rate_ok(s->bwd_throughput))
        return cirrus_fail(err, CIRRUS_ECORRUPT, "HEARTBEAT rates (%g, %g, %g) are not rates",
                           s->tokens_per_s, s->fwd_throughput, s->bwd_throughput);
    return 0;
}

void coord_put_report(wire_writer *w, uint64_t epoch, uint32_t peer_id, const coord_report *r)
{
    wire_put_u64(w, epoch);
    wire_put_u32(w, peer_id);
    wire_put_u64(w, r->step);
    wire_put_f32(w, r->loss);
    wire_put_f64(w, r->tokens_per_s);
    wire_put_u64(w, r->mb_retried);
    wire_put_u64(w, r->mb_lost);
}

int coord_get_report(const void *p, size_t n, uint64_t *epoch, uint32_t *peer_id,
                     coord_report *rep, cirrus_error *err)
{
    wire_reader r;
    wire_reader_init(&r, p, n);
    *epoch = wire_get_u64(&r);
    *peer_id = wire_get_u32(&r);
    rep->step = wire_get_u64(&r);
    rep->loss = wire_get_f32(&r);
    rep->tokens_per_s = wire_get_f64(&r);
    rep->mb_retried = wire_get_u64(&r);
    rep->mb_lost = wire_get_u64(&r);
    int rc = finish(&r, "CLIENT_REPORT", err);
    if (rc) return rc;
    if (isinf(rep->loss))
        return cirrus_fail(err, CIRRUS_ECORRUPT, "CLIENT_REPORT loss is infinite");
    if (!rate_ok(rep->tokens_per_s))
        return cirrus_fail(err, CIRRUS_ECORRUPT, "CLIENT_REPORT tokens/s %g is not a rate",
                           rep->tokens_per_s);
    return 0;
}

double coord_stats_capacity(const coord_stats *s)
{
    const double f = s->fwd_throughput, b = s->bwd_throughput;
    if (!(f > 0)) return 0.0;
    if (!(b > 0)) return f;
    return (1.0 + WIRING_BACKWARD_COST) / (1.0 / f + 1.0 / b);
}

/* ---- STEP_SYNC and STEP_SYNC_OK ---- */

/* The wire has no u8 helper: one raw byte. */
static void put_u8(wire_writer *w, uint8_t v) { wire_put_bytes(w, &v, 1); }

static uint8_t get_u8(wire_reader *r)
{
    const uint8_t *p = wire_get_bytes(r, 1);
    return p ? p[0] : 0;
}

void coord_put_step_sync(wire_writer *w, const coord_step_sync *s)
{
    put_u8(w, s->op);
    wire_put_u64(w, s->step);
    wire_put_u32(w, s->client_index);
    wire_put_u32(w, s->n_clients);
    wire_put_u32(w, s->microbatches);
    wire_put_f64(w, s->loss_sum);
    wire_put_u64(w, s->redo_seen);
    wire_put_u32(w, s->stage);
    wire_put_str(w, s->addr);
    wire_put_u32(w, s->wait_ms);
}

/* A REDO names the peer that lost the work; the other ops name none, so an address there
 * is a confused sender rather than something to ignore. */
static int step_addr_ok(const coord_step_sync *s, cirrus_error *err)
{
    char b[48];
    if (!coord_name_ok(s->addr))
        return cirrus_fail(err, CIRRUS_ECORRUPT,
                           "STEP_SYNC addr '%s' is not 0..%d bytes of [A-Za-z0-9._:-]",
                           shown(b, s->addr), COORD_NAME_MAX);
    if (s->op == COORD_STEP_REDO && !s->addr[0])
        return cirrus_fail(err, CIRRUS_ECORRUPT, "STEP_SYNC REDO without an addr");
    if (s->op != COORD_STEP_REDO && s->addr[0])
        return cirrus_fail(err, CIRRUS_ECORRUPT, "STEP_SYNC op %u with addr '%s' (only REDO "
                           "names one)", s->op, shown(b, s->addr));
    return 0;
}

/* What a STEP_SYNC says about itself, whoever receives it. */
static int step_sync_ok(const coord_step_sync *s, cirrus_error *err)
{
    if (s->op < COORD_STEP_ARRIVE || s->op > COORD_STEP_REDO)
        return cirrus_fail(err, CIRRUS_ECORRUPT, "STEP_SYNC op %u is not %d (arrive), %d "
                           "(applied) or %d (redo)", s->op, COORD_STEP_ARRIVE,
                           COORD_STEP_APPLIED, COORD_STEP_REDO);
    if (s->step == 0)
        return cirrus_fail(err, CIRRUS_ECORRUPT, "STEP_SYNC step 0 (steps start at 1)");
    if (s->n_clients < 1 || s->n_clients > COORD_MAX_CLIENTS)
        return cirrus_fail(err, CIRRUS_ECORRUPT, "STEP_SYNC n_clients %u is outside 1..%d",
                           s->n_clients, COORD_MAX_CLIENTS);
    if (s->client_index >= s->n_clients)
        return cirrus_fail(err, CIRRUS_ECORRUPT, "STEP_SYNC client_index %u is not below "
                           "n_clients %u", s->client_index, s->n_clients);
    if (!isfinite(s->loss_sum))
        return cirrus_fail(err, CIRRUS_ECORRUPT, "STEP_SYNC loss_sum %g is not finite",
                           s->loss_sum);
    if (s->wait_ms > COORD_STEP_WAIT_MAX_MS || (s->wait_ms && s->op != COORD_STEP_ARRIVE))
        return cirrus_fail(err, CIRRUS_ECORRUPT, "STEP_SYNC wait_ms %u (op %u): only an "
                           "ARRIVE may wait, at most %d ms", s->wait_ms, s->op,
                           COORD_STEP_WAIT_MAX_MS);
    /* The REDO stage is the coordinator's to check (against its n_stages): a stage it
     * does not have is a mistake, answered CIRRUS_EINVAL, not a broken stream. */
    return step_addr_ok(s, err);
}

int coord_get_step_sync(const void *p, size_t n, coord_step_sync *s, cirrus_error *err)
{
    wire_reader r;
    wire_reader_init(&r, p, n);
    memset(s, 0, sizeof *s);
    s->op = get_u8(&r);
    s->step = wire_get_u64(&r);
    s->client_index = wire_get_u32(&r);
    s->n_clients = wire_get_u32(&r);
    s->microbatches = wire_get_u32(&r);
    s->loss_sum = wire_get_f64(&r);
    s->redo_seen = wire_get_u64(&r);
    s->stage = wire_get_u32(&r);
    int rc;
    if ((rc = get_str_field(&r, s->addr, sizeof s->addr, "STEP_SYNC", "addr", err))) return rc;
    if (r.len - r.pos >= 4) s->wait_ms = wire_get_u32(&r); /* optional: 0 when absent */
    if ((rc = finish(&r, "STEP_SYNC", err))) return rc;
    return step_sync_ok(s, err);
}

void coord_put_step_state(wire_writer *w, const coord_step_state *st)
{
    wire_put_u64(w, st->applied_step);
    wire_put_u32(w, st->arrived);
    wire_put_u32(w, st->microbatches);
    wire_put_f64(w, st->loss_sum);
    wire_put_u64(w, st->latest_notice);
    wire_put_u32(w, st->n_notices);
    for (uint32_t i = 0; i < st->n_notices && i < COORD_MAX_NOTICES; i++) {
        wire_put_u64(w, st->notices[i].id);
        wire_put_u32(w, st->notices[i].stage);
        wire_put_str(w, st->notices[i].addr);
    }
}

/* One notice of a STEP_SYNC_OK: ids grow along the list and none is newer than the
 * step's latest notice (the coordinator lists them oldest first). */
static int get_notice(wire_reader *r, uint32_t i, uint64_t prev_id, uint64_t latest,
                      coord_step_notice *nt, cirrus_error *err)
{
    char b[48];
    nt->id = wire_get_u64(r);
    nt->stage = wire_get_u32(r);
    int rc = get_str_field(r, nt->addr, sizeof nt->addr, "STEP_SYNC_OK", "notice addr", err);
    if (rc || r->failed) return rc;
    if (nt->id <= prev_id || nt->id > latest)
        return cirrus_fail(err, CIRRUS_ECORRUPT, "STEP_SYNC_OK notice %u id %llu is not in "
                           "%llu..%llu", i, (unsigned long long)nt->id,
                           (unsigned long long)prev_id + 1, (unsigned long long)latest);
    if (nt->stage >= COORD_MAX_STAGES && nt->stage != COORD_ALL_STAGES)
        return cirrus_fail(err, CIRRUS_ECORRUPT, "STEP_SYNC_OK notice %u stage %u is outside "
                           "0..%d", i, nt->stage, COORD_MAX_STAGES - 1);
    if (!nt->addr[0] || !coord_name_ok(nt->addr))
        return cirrus_fail(err, CIRRUS_ECORRUPT, "STEP_SYNC_OK notice %u addr '%s' is not "
                           "1..%d bytes of [A-Za-z0-9._:-]", i, shown(b, nt->addr),
                           COORD_NAME_MAX);
    return 0;
}

/* The counters of a STEP_SYNC_OK. A sum of finite losses may overflow to an infinity but
 * is never NaN; nothing counted means nothing summed. */
static int step_counts_ok(const coord_step_state *st, cirrus_error *err)
{
    if (st->arrived > COORD_MAX_CLIENTS)
        return cirrus_fail(err, CIRRUS_ECORRUPT, "STEP_SYNC_OK arrived %u is above %d",
                           st->arrived, COORD_MAX_CLIENTS);
    if (isnan(st->loss_sum))
        return cirrus_fail(err, CIRRUS_ECORRUPT, "STEP_SYNC_OK loss_sum is NaN");
    if (st->arrived == 0 && (st->microbatches || st->loss_sum != 0))
        return cirrus_fail(err, CIRRUS_ECORRUPT, "STEP_SYNC_OK sums %u microbatches, loss %g "
                           "of no client", st->microbatches, st->loss_sum);
    if (st->n_notices > COORD_MAX_NOTICES)
        return cirrus_fail(err, CIRRUS_ECORRUPT, "STEP_SYNC_OK lists %u notices, more than "
                           "the %d allowed", st->n_notices, COORD_MAX_NOTICES);
    return 0;
}

int coord_get_step_state(const void *p, size_t n, coord_step_state *st, cirrus_error *err)
{
    wire_reader r;
    wire_reader_init(&r, p, n);
    memset(st, 0, sizeof *st);
    st->applied_step = wire_get_u64(&r);
    st->arrived = wire_get_u32(&r);
    st->microbatches = wire_get_u32(&r);
    st->loss_sum = wire_get_f64(&r);
    st->latest_notice = wire_get_u64(&r);
    st->n_notices = wire_get_u32(&r);
    int rc;
    if (r.failed) return finish(&r, "STEP_SYNC_OK", err);
    if ((rc = step_counts_ok(st, err))) return rc;
    for (uint32_t i = 0; i < st->n_notices && !r.failed; i++) {
        uint64_t prev = i ? st->notices[i - 1].id : 0;
        if ((rc = get_notice(&r, i, prev, st->latest_notice, &st->notices[i], err))) return rc;
    }
    return finish(&r, "STEP_SYNC_OK", err);
}

/* ---- PEERS_OK entries ---- */

void coord_put_peer_info(wire_writer *w, const coord_peer_info *pi)
{
    wire_put_u32(w, pi->id);
    wire_put_u32(w, pi->stage);
    wire_put_u32(w, pi->l0);
    wire_put_u32(w, pi->l1);
    wire_put_str(w, pi->name);
    wire_put_str(w, pi->host);
    wire_put_u16(w, pi->port);
    wire_put_f64(w, pi->throughput);
}

int coord_get_peer_info(wire_reader *r, coord_peer_info *pi)
{
    memset(pi, 0, sizeof *pi);
    pi->id = wire_get_u32(r);
    pi->stage = wire_get_u32(r);
    pi->l0 = wire_get_u32(r);
    pi->l1 = wire_get_u32(r);
    if (wire_get_str(r, pi->name, sizeof pi->name) || wire_get_str(r, pi->host, sizeof pi->host))
        return CIRRUS_ECORRUPT;
    pi->port = wire_get_u16(r);
    pi->throughput = wire_get_f64(r);
    if (r->failed || !coord_name_ok(pi->name) || !coord_host_ok(pi->host) || pi->port == 0 ||
        pi->l0 >= pi->l1 || !rate_ok(pi->throughput))
        return CIRRUS_ECORRUPT;
    return 0;
}

/* ---- the client ---- */

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
};

static int64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Milliseconds left before deadline (-1: none); 0 once it passed. */
static int left_ms(int64_t deadline)
{
    if (deadline < 0) return -1;
    int64_t d = deadline - mono_ms();
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
    int rc = call(c, type, req, timeout_ms < 0 ? -1 : mono_ms() + timeout_ms, reply, reply_len,
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
    if (registration_ok(reg, &e))
        return cirrus_fail(err, CIRRUS_EINVAL, "%s", e.msg);
    int64_t deadline = timeout_ms < 0 ? -1 : mono_ms() + timeout_ms;
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
    int64_t deadline = timeout_ms < 0 ? -1 : mono_ms() + timeout_ms;
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
    pthread_mutex_unlock(&c->mu);
    return rc;
}

int coord_client_peers(coord_client *c, uint32_t stage, int timeout_ms,
                       coord_peer_info **peers, size_t *n_out, uint32_t *n_stages,
                       cirrus_error *err)
{
    *peers = NULL;
    *n_out = 0;
    int64_t deadline = timeout_ms < 0 ? -1 : mono_ms() + timeout_ms;
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
    if (step_sync_ok(req, &e)) return cirrus_fail(err, CIRRUS_EINVAL, "%s", e.msg);
    int64_t deadline = timeout_ms < 0 ? -1 : mono_ms() + timeout_ms;
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
    int64_t deadline = timeout_ms < 0 ? -1 : mono_ms() + timeout_ms;
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
