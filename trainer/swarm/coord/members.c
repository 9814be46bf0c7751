/* members: the coordinator's membership table — registration, heartbeats, client
 * reports, listing the live stage peers, leaving, epochs and expiry. See coord_internal.h. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "../../../common/log.h"
#include "coord_internal.h"

/* ---- the membership table (callers hold co->mu) ---- */

member *coord_members_find(coordinator *co, uint32_t id)
{
    size_t lo = 0, hi = co->n_members;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (co->members[mid].id == id) return &co->members[mid];
        if (co->members[mid].id < id) lo = mid + 1;
        else hi = mid;
    }
    return NULL;
}

static member *find_by_name(coordinator *co, const char *name)
{
    for (size_t i = 0; i < co->n_members; i++)
        if (!strcmp(co->members[i].reg.name, name)) return &co->members[i];
    return NULL;
}

/* Keep a client's microbatch totals in the coordinator's counters once it is gone, so
 * the exported counters never go down. */
static void retire_report(coordinator *co, member *m)
{
    if (!m->has_report) return;
    co->retired_retried += m->report.mb_retried;
    co->retired_lost += m->report.mb_lost;
    m->has_report = 0;
}

static void remove_member(coordinator *co, member *m)
{
    retire_report(co, m);
    size_t i = (size_t)(m - co->members);
    memmove(&co->members[i], &co->members[i + 1], (co->n_members - i - 1) * sizeof *m);
    co->n_members--;
}

void coord_members_reap(coordinator *co, int64_t now)
{
    for (size_t i = 0; i < co->n_members;) {
        member *m = &co->members[i];
        int64_t silent = now - m->last_seen_ms;
        if (silent <= (int64_t)co->o.expire_ms) {
            i++;
            continue;
        }
        log_info("peer %u '%s' (%s %u) expired after %lld ms without a heartbeat", m->id,
                 m->reg.name, m->reg.role == COORD_ROLE_STAGE ? "stage" : "client",
                 m->reg.role == COORD_ROLE_STAGE ? m->reg.stage : 0, (long long)silent);
        co->expirations++;
        remove_member(co, m);
    }
}

/* The rate a client should expect from a peer: its latest measured forward rate, or what
 * it measured at registration before it served anything. */
static double member_throughput(const member *m)
{
    if (m->has_stats && m->stats.fwd_throughput > 0) return m->stats.fwd_throughput;
    return m->reg.throughput;
}

void coord_members_info(const member *m, coord_peer_info *pi)
{
    pi->id = m->id;
    pi->stage = m->reg.stage;
    pi->l0 = m->reg.l0;
    pi->l1 = m->reg.l1;
    memcpy(pi->name, m->reg.name, sizeof pi->name);
    memcpy(pi->host, m->reg.host, sizeof pi->host);
    pi->port = m->reg.port;
    pi->throughput = member_throughput(m);
}

/* ---- requests ---- */

static int unknown_peer(coordinator *co, outcome *oc, uint64_t epoch, uint32_t id)
{
    if (epoch != co->epoch)
        return cirrus_fail(&oc->err, CIRRUS_ENOENT,
                           "unknown peer %u: epoch %llu is not the coordinator's %llu; register "
                           "again", id, (unsigned long long)epoch, (unsigned long long)co->epoch);
    return cirrus_fail(&oc->err, CIRRUS_ENOENT, "unknown peer %u (expired or never registered); "
                       "register again", id);
}

int coord_members_register(coordinator *co, const uint8_t *p, uint32_t n, wire_writer *reply,
                       outcome *oc)
{
    coord_registration r;
    if (coord_get_registration(p, n, &r, &oc->err)) return coord_malformed(oc);
    if (r.role == COORD_ROLE_STAGE && r.stage >= co->o.n_stages) {
        cirrus_fail(&oc->err, CIRRUS_ECORRUPT, "REGISTER stage index %u is outside 0..%u",
                    r.stage, co->o.n_stages - 1);
        return coord_malformed(oc);
    }
    if (r.role == COORD_ROLE_STAGE && co->o.n_layer && r.l1 > co->o.n_layer) {
        cirrus_fail(&oc->err, CIRRUS_ECORRUPT, "REGISTER layer range [%u, %u) exceeds the %u "
                    "layers of the model", r.l0, r.l1, co->o.n_layer);
        return coord_malformed(oc);
    }
    int64_t now = clock_now_ms();
    int rc = 0;
    pthread_mutex_lock(&co->mu);
    coord_members_reap(co, now);
    member *m = r.name[0] ? find_by_name(co, r.name) : NULL;
    int fresh = !m;
    if (fresh) {
        if (co->n_members == co->o.max_peers) {
            rc = cirrus_fail(&oc->err, CIRRUS_ENOMEM, "membership table is full (%u members)",
                             co->o.max_peers);
            goto out;
        }
        if (co->next_id == COORD_NO_STAGE) {
            rc = cirrus_fail(&oc->err, CIRRUS_ENOMEM, "peer ids of this epoch are exhausted");
            goto out;
        }
        m = &co->members[co->n_members++];
        memset(m, 0, sizeof *m);
        m->id = co->next_id++;
        m->instruction = COORD_NO_INSTRUCTION;
        m->stats.loss = NAN;
    } else if (r.role != COORD_ROLE_CLIENT) {
        retire_report(co, m); /* a client name re-used by a stage peer */
    }
    m->reg = r;
    m->last_seen_ms = now;
    if (m->instruction == r.stage) { /* it moved */
        m->instruction = COORD_NO_INSTRUCTION;
        if (r.name[0]) coord_moves_remember(co, r.name, r.stage);
    }
    moved_peer *mv = r.role == COORD_ROLE_STAGE && r.name[0] &&
                             m->instruction == COORD_NO_INSTRUCTION
                         ? coord_moves_find(co, r.name)
                         : NULL;
    /* Not into a stage that is full meanwhile (max_stage_peers): it stays where it is. */
    if (mv && mv->stage != r.stage && mv->stage < co->o.n_stages &&
        !coord_moves_stage_full(co, mv->stage, m)) {
        /* A replacement of a peer that had moved (registering fresh, or under its
         * predecessor's entry before that expired): it starts where the predecessor was
         * first put; send it where the swarm had moved it. */
        m->instruction = mv->stage;
        m->instructed_ms = now;
        log_info("peer '%s' had moved to stage %u before it was replaced: it is told to move "
                 "there again", r.name, mv->stage);
    }
    co->registrations++;
    wire_put_u32(reply, m->id);
    wire_put_u32(reply, co->o.heartbeat_ms);
    wire_put_u32(reply, co->o.expire_ms);
    wire_put_u64(reply, co->epoch);
    if (r.role == COORD_ROLE_STAGE)
        log_info("%s peer %u '%s': stage %u, layers [%u, %u), %s:%u, %.1f samples/s",
                 fresh ? "registered" : "re-registered", m->id, r.name, r.stage, r.l0, r.l1,
                 r.host, r.port, r.throughput);
    else
        log_info("%s client %u '%s'", fresh ? "registered" : "re-registered", m->id, r.name);
out:
    pthread_mutex_unlock(&co->mu);
    return rc;
}

/* Lock the table, forget the expired, and find the member a HEARTBEAT or CLIENT_REPORT
 * speaks for. NULL (with *rc from unknown_peer) if the epoch is old or the id unknown; the
 * lock is held either way and released by the caller. */
static member *lock_member(coordinator *co, uint64_t epoch, uint32_t id, int64_t now,
                           outcome *oc, int *rc)
{
    pthread_mutex_lock(&co->mu);
    coord_members_reap(co, now);
    member *m = coord_members_find(co, id);
    if (epoch != co->epoch || !m) {
        *rc = unknown_peer(co, oc, epoch, id);
        return NULL;
    }
    return m;
}

int coord_members_heartbeat(coordinator *co, const uint8_t *p, uint32_t n, wire_writer *reply,
                        outcome *oc)
{
    uint64_t epoch;
    uint32_t id;
    coord_stats s;
    if (coord_get_heartbeat(p, n, &epoch, &id, &s, &oc->err)) return coord_malformed(oc);
    int64_t now = clock_now_ms();
    int rc = 0;
    member *m = lock_member(co, epoch, id, now, oc, &rc);
    if (!m) goto out;
    m->stats = s;
    m->has_stats = 1;
    m->last_seen_ms = now;
    if (s.step > co->step) co->step = s.step;
    if (!isnan(s.loss) && !co->loss_from_client) co->loss = s.loss;
    wire_put_u64(reply, co->epoch);
    wire_put_u32(reply, m->instruction);
out:
    pthread_mutex_unlock(&co->mu);
    return rc;
}

int coord_members_report(coordinator *co, const uint8_t *p, uint32_t n, wire_writer *reply,
                     outcome *oc)
{
    uint64_t epoch;
    uint32_t id;
    coord_report rep;
    if (coord_get_report(p, n, &epoch, &id, &rep, &oc->err)) return coord_malformed(oc);
    int64_t now = clock_now_ms();
    int rc = 0;
    member *m = lock_member(co, epoch, id, now, oc, &rc);
    if (!m) goto out;
    if (m->reg.role != COORD_ROLE_CLIENT) {
        rc = cirrus_fail(&oc->err, CIRRUS_EINVAL, "peer %u is a stage peer, not a client", id);
        goto out;
    }
    /* Totals that went down: the client restarted under the same name. */
    if (m->has_report && (rep.mb_retried < m->report.mb_retried ||
                          rep.mb_lost < m->report.mb_lost))
        retire_report(co, m);
    m->report = rep;
    m->has_report = 1;
    m->last_seen_ms = now;
    if (rep.step > co->step) co->step = rep.step;
    if (!isnan(rep.loss)) {
        co->loss = rep.loss;
        co->loss_from_client = 1;
    }
    wire_put_u64(reply, co->epoch);
out:
    pthread_mutex_unlock(&co->mu);
    return rc;
}

int coord_members_peers(coordinator *co, const uint8_t *p, uint32_t n, wire_writer *reply,
                    outcome *oc)
{
    wire_reader r;
    wire_reader_init(&r, p, n);
    uint32_t stage = wire_get_u32(&r);
    if (wire_reader_done(&r)) {
        cirrus_fail(&oc->err, CIRRUS_ECORRUPT, "PEERS is %u bytes, not 4", n);
        return coord_malformed(oc);
    }
    if (stage != COORD_ALL_STAGES && stage >= co->o.n_stages) {
        cirrus_fail(&oc->err, CIRRUS_ECORRUPT, "PEERS stage index %u is outside 0..%u", stage,
                    co->o.n_stages - 1);
        return coord_malformed(oc);
    }
    pthread_mutex_lock(&co->mu);
    coord_members_reap(co, clock_now_ms());
    uint32_t count = 0;
    for (size_t i = 0; i < co->n_members; i++) {
        const member *m = &co->members[i];
        count += m->reg.role == COORD_ROLE_STAGE &&
                 (stage == COORD_ALL_STAGES || m->reg.stage == stage);
    }
    wire_put_u64(reply, co->epoch);
    wire_put_u32(reply, co->o.n_stages);
    wire_put_u32(reply, count);
    for (size_t i = 0; i < co->n_members; i++) {
        const member *m = &co->members[i];
        if (m->reg.role != COORD_ROLE_STAGE ||
            (stage != COORD_ALL_STAGES && m->reg.stage != stage))
            continue;
        coord_peer_info pi;
        coord_members_info(m, &pi);
        coord_put_peer_info(reply, &pi);
    }
    pthread_mutex_unlock(&co->mu);
    return 0;
}

int coord_members_leave(coordinator *co, const uint8_t *p, uint32_t n, outcome *oc)
{
    wire_reader r;
    wire_reader_init(&r, p, n);
    uint64_t epoch = wire_get_u64(&r);
    uint32_t id = wire_get_u32(&r);
    if (wire_reader_done(&r)) {
        cirrus_fail(&oc->err, CIRRUS_ECORRUPT, "LEAVE is %u bytes, not 12", n);
        return coord_malformed(oc);
    }
    int rc = 0;
    pthread_mutex_lock(&co->mu);
    member *m = coord_members_find(co, id);
    if (epoch != co->epoch || !m) {
        rc = unknown_peer(co, oc, epoch, id);
    } else {
        log_info("peer %u '%s' left", id, m->reg.name);
        remove_member(co, m);
    }
    pthread_mutex_unlock(&co->mu);
    return rc;
}
