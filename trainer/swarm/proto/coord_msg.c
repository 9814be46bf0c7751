/* coord_msg: coordinator message encoding and decoding, and what each message says about
 * itself; the member side of the conversation is coord_client.c. See coord_msg.h and
 * docs/PROTOCOL.md. */
#include "coord_msg.h"

#include <math.h>
#include <string.h>

#include "../../../common/names.h"
#include "../policy/wiring.h"

/* ---- validation helpers ---- */

int coord_name_ok(const char *s) { return name_chars_ok(s, 0, COORD_NAME_MAX, "._:-"); }
int coord_host_ok(const char *s) { return name_chars_ok(s, 1, COORD_HOST_MAX, "._:-"); }

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

int coord_registration_ok(const coord_registration *r, cirrus_error *err)
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
    return coord_registration_ok(r, err);
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

int coord_step_sync_ok(const coord_step_sync *s, cirrus_error *err)
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
    return coord_step_sync_ok(s, err);
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
