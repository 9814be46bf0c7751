/* coordinator: membership by registration and heartbeats, served over the wire protocol.
 * See coordinator.h; the messages are in proto/coord_msg.h, HTTP in http_status.c. */
#include "coordinator.h"

#include <errno.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../../../common/log.h"
#include "../../../common/rng.h"
#include "../../net/conn.h"
#include "http_status.h"
#include "../policy/rebalance.h"

#define COORD_IO_TIMEOUT_MS 5000 /* a frame that started arriving, or a reply, must finish */
#define COORD_POLL_MS 100        /* how often idle threads look at the stop flag */
#define COORD_CONN_SLACK 64      /* connections allowed beyond one per table slot */
#define COORD_THREAD_STACK (256u << 10)

typedef struct member {
    uint32_t id;
    coord_registration reg;
    coord_stats stats;
    int has_stats;
    coord_report report;
    int has_report;
    int64_t last_seen_ms;
    uint32_t instruction;
    int64_t instructed_ms; /* when the instruction was given */
} member;

/* A stage peer that moved (it re-registered at the stage it was told to move to), by name.
 * A peer's name outlives its process where names are stable (the operator names each peer
 * after its Pod, which a replacement keeps): a replaced peer that comes back at its
 * original stage is told to move again at once, rather than the swarm waiting a
 * rebalancing period to find the same imbalance. */
typedef struct moved_peer {
    char name[COORD_NAME_MAX + 1];
    uint32_t stage;
} moved_peer;

/* One client's latest ARRIVE at the step barrier. */
typedef struct step_slot {
    uint64_t step; /* 0: never arrived */
    uint32_t microbatches;
    double loss_sum;
    uint64_t redo_seen;
} step_slot;

typedef struct step_notice {
    uint64_t id, step;
    uint32_t stage;
    char addr[COORD_NAME_MAX + 1];
} step_notice;

/* The step barrier of the job's pipeline clients (STEP_SYNC). Not tied to registrations:
 * clients that reconnect or re-register keep their slots. */
typedef struct step_barrier {
    uint32_t n_clients; /* 0 until the first ARRIVE */
    uint64_t applied_step;
    step_slot slots[COORD_MAX_CLIENTS];
    step_notice notices[COORD_NOTICE_KEEP]; /* a ring: notice id k at (k - 1) % size */
    uint64_t next_notice;                   /* the id the next REDO gets; from 1 */
    uint64_t posted;                        /* notices recorded by this coordinator */
} step_barrier;

struct coordinator {
    coordinator_options o; /* defaults filled in; job_id and host point at the copies below */
    char job_id[WIRE_JOB_ID_MAX + 1];
    char host[COORD_HOST_MAX + 1];
    uint64_t epoch;
    int64_t start_ms;
    int lfd, port, http_port;
    http_status *http;
    pthread_t acceptor;
    int acceptor_started;
    atomic_int stopping;
    uint32_t max_conns;

    pthread_mutex_t mu; /* everything below */
    pthread_cond_t conn_ended;
    pthread_cond_t barrier_changed; /* on CLOCK_MONOTONIC; broadcast on every barrier change */
    uint32_t conns;
    member *members; /* [max_peers], sorted by id (ids only grow; removal keeps order) */
    size_t n_members;
    uint32_t next_id;
    uint64_t step, expirations, registrations;
    uint64_t retired_retried, retired_lost; /* totals of clients no longer in the table */
    double loss;
    int loss_from_client;
    /* rebalancing (NULL rb: off) */
    rebalance_state *rb;
    int64_t next_rebalance_ms;
    uint32_t *rb_ids;      /* [max_peers] the peers the policy was fed last period */
    size_t n_rb_ids;
    uint64_t moves, withdrawn;
    coord_move recent[COORD_RECENT_MOVES]; /* a ring: the latest at (n_moves - 1) % size */
    moved_peer *moved; /* [max_peers] a ring: the stage each moved peer (by name) went to */
    size_t n_moved;    /* entries ever written; the latest at (n_moved - 1) % max_peers */
    step_barrier barrier;
};

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* A fresh epoch: different across restarts (clock, pid, a counter), 53 bits so JSON
 * readers keep it exact, never 0. */
static uint64_t fresh_epoch(void)
{
    static atomic_uint_fast64_t counter;
    struct timespec rt, mt;
    clock_gettime(CLOCK_REALTIME, &rt);
    clock_gettime(CLOCK_MONOTONIC, &mt);
    rng_state r;
    rng_seed(&r, ((uint64_t)rt.tv_sec * 1000000000u + (uint64_t)rt.tv_nsec) ^
                     ((uint64_t)getpid() << 32) ^ (uint64_t)mt.tv_nsec ^
                     (atomic_fetch_add(&counter, 1) * 0x9E3779B97F4A7C15ull));
    uint64_t e = rng_next(&r) & ((1ull << 53) - 1);
    return e ? e : 1;
}

/* ---- the membership table (callers hold co->mu) ---- */

static member *find_member(coordinator *co, uint32_t id)
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

static moved_peer *find_moved(coordinator *co, const char *name)
{
    size_t kept = co->n_moved < co->o.max_peers ? co->n_moved : co->o.max_peers;
    for (size_t i = 0; i < kept; i++)
        if (!strcmp(co->moved[i].name, name)) return &co->moved[i];
    return NULL;
}

/* Remember where a named stage peer moved (the oldest entry goes when the table is full). */
static void remember_move(coordinator *co, const char *name, uint32_t stage)
{
    moved_peer *mv = find_moved(co, name);
    if (!mv) mv = &co->moved[co->n_moved++ % co->o.max_peers];
    snprintf(mv->name, sizeof mv->name, "%s", name);
    mv->stage = stage;
}

static void reap_expired(coordinator *co, int64_t now)
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

static void member_info(const member *m, coord_peer_info *pi)
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

/* A request's outcome: 0 and a reply payload, or a code and message for WIRE_ERROR;
 * `drop` when the request was malformed (the connection's stream is not to be trusted). */
typedef struct outcome {
    int drop;
    cirrus_error err;
} outcome;

static int unknown_peer(coordinator *co, outcome *oc, uint64_t epoch, uint32_t id)
{
    if (epoch != co->epoch)
        return cirrus_fail(&oc->err, CIRRUS_ENOENT,
                           "unknown peer %u: epoch %llu is not the coordinator's %llu; register "
                           "again", id, (unsigned long long)epoch, (unsigned long long)co->epoch);
    return cirrus_fail(&oc->err, CIRRUS_ENOENT, "unknown peer %u (expired or never registered); "
                       "register again", id);
}

static int malformed(outcome *oc)
{
    oc->drop = 1;
    return oc->err.code = CIRRUS_ECORRUPT;
}

static int on_register(coordinator *co, const uint8_t *p, uint32_t n, wire_writer *reply,
                       outcome *oc)
{
    coord_registration r;
    if (coord_get_registration(p, n, &r, &oc->err)) return malformed(oc);
    if (r.role == COORD_ROLE_STAGE && r.stage >= co->o.n_stages) {
        cirrus_fail(&oc->err, CIRRUS_ECORRUPT, "REGISTER stage index %u is outside 0..%u",
                    r.stage, co->o.n_stages - 1);
        return malformed(oc);
    }
    if (r.role == COORD_ROLE_STAGE && co->o.n_layer && r.l1 > co->o.n_layer) {
        cirrus_fail(&oc->err, CIRRUS_ECORRUPT, "REGISTER layer range [%u, %u) exceeds the %u "
                    "layers of the model", r.l0, r.l1, co->o.n_layer);
        return malformed(oc);
    }
    int64_t now = now_ms();
    int rc = 0;
    pthread_mutex_lock(&co->mu);
    reap_expired(co, now);
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
        if (r.name[0]) remember_move(co, r.name, r.stage);
    }
    moved_peer *mv = r.role == COORD_ROLE_STAGE && r.name[0] &&
                             m->instruction == COORD_NO_INSTRUCTION
                         ? find_moved(co, r.name)
                         : NULL;
    if (mv && mv->stage != r.stage && mv->stage < co->o.n_stages) {
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
    reap_expired(co, now);
    member *m = find_member(co, id);
    if (epoch != co->epoch || !m) {
        *rc = unknown_peer(co, oc, epoch, id);
        return NULL;
    }
    return m;
}

static int on_heartbeat(coordinator *co, const uint8_t *p, uint32_t n, wire_writer *reply,
                        outcome *oc)
{
    uint64_t epoch;
    uint32_t id;
    coord_stats s;
    if (coord_get_heartbeat(p, n, &epoch, &id, &s, &oc->err)) return malformed(oc);
    int64_t now = now_ms();
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

static int on_report(coordinator *co, const uint8_t *p, uint32_t n, wire_writer *reply,
                     outcome *oc)
{
    uint64_t epoch;
    uint32_t id;
    coord_report rep;
    if (coord_get_report(p, n, &epoch, &id, &rep, &oc->err)) return malformed(oc);
    int64_t now = now_ms();
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

static int on_peers(coordinator *co, const uint8_t *p, uint32_t n, wire_writer *reply,
                    outcome *oc)
{
    wire_reader r;
    wire_reader_init(&r, p, n);
    uint32_t stage = wire_get_u32(&r);
    if (wire_reader_done(&r)) {
        cirrus_fail(&oc->err, CIRRUS_ECORRUPT, "PEERS is %u bytes, not 4", n);
        return malformed(oc);
    }
    if (stage != COORD_ALL_STAGES && stage >= co->o.n_stages) {
        cirrus_fail(&oc->err, CIRRUS_ECORRUPT, "PEERS stage index %u is outside 0..%u", stage,
                    co->o.n_stages - 1);
        return malformed(oc);
    }
    pthread_mutex_lock(&co->mu);
    reap_expired(co, now_ms());
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
        member_info(m, &pi);
        coord_put_peer_info(reply, &pi);
    }
    pthread_mutex_unlock(&co->mu);
    return 0;
}

static int on_leave(coordinator *co, const uint8_t *p, uint32_t n, outcome *oc)
{
    wire_reader r;
    wire_reader_init(&r, p, n);
    uint64_t epoch = wire_get_u64(&r);
    uint32_t id = wire_get_u32(&r);
    if (wire_reader_done(&r)) {
        cirrus_fail(&oc->err, CIRRUS_ECORRUPT, "LEAVE is %u bytes, not 12", n);
        return malformed(oc);
    }
    int rc = 0;
    pthread_mutex_lock(&co->mu);
    member *m = find_member(co, id);
    if (epoch != co->epoch || !m) {
        rc = unknown_peer(co, oc, epoch, id);
    } else {
        log_info("peer %u '%s' left", id, m->reg.name);
        remove_member(co, m);
    }
    pthread_mutex_unlock(&co->mu);
    return rc;
}

/* ---- the step barrier (callers hold co->mu) ---- */

/* Notice ids only grow, across restarts of the coordinator too: a client that acted on
 * notice k before a restart skips every id <= k, so a notice re-posted to a restarted
 * coordinator must get a larger id. Every call carries the newest id its client has seen
 * (the leader's: the newest it posted), and the next id is kept above all of them. */
static void notice_ids_after(step_barrier *b, uint64_t seen)
{
    if (seen >= b->next_notice) b->next_notice = seen + 1;
}

static int step_arrive(coordinator *co, const coord_step_sync *q, outcome *oc)
{
    step_barrier *b = &co->barrier;
    /* A different count is another job's (or a misconfigured) client: refuse it rather
     * than let it reshape the barrier under the others. */
    if (b->n_clients && q->n_clients != b->n_clients)
        return cirrus_fail(&oc->err, CIRRUS_EINVAL, "n_clients %u differs from the job's %u",
                           q->n_clients, b->n_clients);
    b->n_clients = q->n_clients;
    notice_ids_after(b, q->redo_seen);
    b->slots[q->client_index] = (step_slot){.step = q->step, .microbatches = q->microbatches,
                                            .loss_sum = q->loss_sum,
                                            .redo_seen = q->redo_seen};
    /* The leader arrives at t only once t - 1 was applied: this survives a lost APPLIED. */
    if (q->client_index == 0 && q->step - 1 > b->applied_step) b->applied_step = q->step - 1;
    return 0;
}

static void step_applied(coordinator *co, uint64_t step)
{
    if (step > co->barrier.applied_step) co->barrier.applied_step = step;
}

static void step_redo(coordinator *co, const coord_step_sync *q)
{
    step_barrier *b = &co->barrier;
    notice_ids_after(b, q->redo_seen);
    step_notice *nt = &b->notices[(b->next_notice - 1) % COORD_NOTICE_KEEP];
    *nt = (step_notice){.id = b->next_notice++, .step = q->step, .stage = q->stage};
    b->posted++;
    memcpy(nt->addr, q->addr, sizeof nt->addr);
    log_info("step %llu: REDO notice %llu for stage %u peer %s",
             (unsigned long long)q->step, (unsigned long long)nt->id, q->stage, q->addr);
}

/* The oldest notice id still in the ring. */
static uint64_t oldest_notice(const step_barrier *b)
{
    return b->next_notice > COORD_NOTICE_KEEP ? b->next_notice - COORD_NOTICE_KEEP : 1;
}

static const step_notice *notice_at(const step_barrier *b, uint64_t id)
{
    return &b->notices[(id - 1) % COORD_NOTICE_KEEP];
}

/* Step t's notices: the newest id, and the ones after redo_seen, oldest first (the first
 * COORD_MAX_NOTICES: a client that acts on them and asks again gets the rest). */
static void step_notices(const step_barrier *b, uint64_t t, uint64_t redo_seen,
                         coord_step_state *st)
{
    for (uint64_t id = oldest_notice(b); id < b->next_notice; id++) {
        const step_notice *nt = notice_at(b, id);
        if (nt->id != id || nt->step != t) continue; /* ids skipped by notice_ids_after */
        st->latest_notice = id;
        if (id <= redo_seen || st->n_notices == COORD_MAX_NOTICES) continue;
        coord_step_notice *out = &st->notices[st->n_notices++];
        out->id = id;
        out->stage = nt->stage;
        memcpy(out->addr, nt->addr, sizeof out->addr);
    }
}

/* The clients counted at step t: arrived there after acting on its latest notice. Sums in
 * client order so every reader of the same state gets the same loss bit for bit. */
static void step_count(const step_barrier *b, uint64_t t, coord_step_state *st)
{
    uint64_t mb = 0;
    for (uint32_t i = 0; i < COORD_MAX_CLIENTS; i++) {
        const step_slot *s = &b->slots[i];
        if (s->step != t || s->redo_seen < st->latest_notice) continue;
        st->arrived++;
        mb += s->microbatches;
        st->loss_sum += s->loss_sum;
    }
    st->microbatches = mb > UINT32_MAX ? UINT32_MAX : (uint32_t)mb;
}

static void step_state(const step_barrier *b, uint64_t t, uint64_t redo_seen,
                       coord_step_state *st)
{
    memset(st, 0, sizeof *st);
    st->applied_step = b->applied_step;
    step_notices(b, t, redo_seen, st);
    step_count(b, t, st);
}

/* What an ARRIVE with wait_ms waits for: the leader (client 0), every client counted at t;
 * a follower, t applied or a notice it has not acted on. */
static int step_awaited(const coord_step_sync *q, const coord_step_state *st)
{
    if (q->client_index == 0) return st->arrived >= q->n_clients;
    return st->applied_step >= q->step || st->n_notices > 0;
}

/* Hold an ARRIVE's answer (co->mu held) until what it waits for is there, its wait_ms is
 * up or the coordinator stops; *st is the state then. The clients wait at the barrier this
 * way instead of polling it: an answer goes out as soon as the change it waits for is
 * made (every barrier change broadcasts barrier_changed), and no request is made in
 * between. Waits in slices of COORD_POLL_MS to see the stop flag. */
static void step_hold(coordinator *co, const coord_step_sync *q, coord_step_state *st)
{
    struct timespec end;
    clock_gettime(CLOCK_MONOTONIC, &end);
    const int64_t end_ns = (int64_t)end.tv_sec * 1000000000 + end.tv_nsec +
                           (int64_t)q->wait_ms * 1000000;
    while (!step_awaited(q, st) && !atomic_load(&co->stopping)) {
        struct timespec now;
        clock_gettime(CLOCK_MONOTONIC, &now);
        int64_t now_ns = (int64_t)now.tv_sec * 1000000000 + now.tv_nsec;
        if (now_ns >= end_ns) break;
        int64_t until = now_ns + (int64_t)COORD_POLL_MS * 1000000;
        if (until > end_ns) until = end_ns;
        struct timespec ts = {.tv_sec = until / 1000000000, .tv_nsec = until % 1000000000};
        pthread_cond_timedwait(&co->barrier_changed, &co->mu, &ts);
        step_state(&co->barrier, q->step, q->redo_seen, st);
    }
}

static int on_step_sync(coordinator *co, const uint8_t *p, uint32_t n, wire_writer *reply,
                        outcome *oc)
{
    coord_step_sync q;
    if (coord_get_step_sync(p, n, &q, &oc->err)) return malformed(oc);
    if (q.op == COORD_STEP_REDO && q.stage >= co->o.n_stages && q.stage != COORD_ALL_STAGES)
        return cirrus_fail(&oc->err, CIRRUS_EINVAL, "STEP_SYNC REDO stage %u is outside 0..%u",
                           q.stage, co->o.n_stages - 1);
    int rc = 0;
    pthread_mutex_lock(&co->mu);
    if (co->o.test_exit_after_redo && co->barrier.posted) {
        log_warn("exiting with a REDO notice posted (--test-exit-after-redo)");
        _exit(137);
    }
    if (q.op == COORD_STEP_ARRIVE) rc = step_arrive(co, &q, oc);
    else if (q.op == COORD_STEP_APPLIED) step_applied(co, q.step);
    else step_redo(co, &q);
    if (!rc) {
        pthread_cond_broadcast(&co->barrier_changed);
        coord_step_state st;
        step_state(&co->barrier, q.step, q.redo_seen, &st);
        if (q.wait_ms) step_hold(co, &q, &st);
        coord_put_step_state(reply, &st);
    }
    pthread_mutex_unlock(&co->mu);
    return rc;
}

static int serve(coordinator *co, const wire_header *h, const uint8_t *p, wire_writer *reply,
                 outcome *oc)
{
    switch (h->type) {
    case COORD_REGISTER: return on_register(co, p, h->payload_len, reply, oc);
    case COORD_HEARTBEAT: return on_heartbeat(co, p, h->payload_len, reply, oc);
    case COORD_CLIENT_REPORT: return on_report(co, p, h->payload_len, reply, oc);
    case COORD_PEERS: return on_peers(co, p, h->payload_len, reply, oc);
    case COORD_LEAVE: return on_leave(co, p, h->payload_len, oc);
    case COORD_STEP_SYNC: return on_step_sync(co, p, h->payload_len, reply, oc);
    case WIRE_PING:
        if (h->payload_len == 0) return 0;
        cirrus_fail(&oc->err, CIRRUS_ECORRUPT, "PING with a %u-byte payload", h->payload_len);
        return malformed(oc);
    default:
        cirrus_fail(&oc->err, CIRRUS_ECORRUPT, "unknown request type %u", h->type);
        return malformed(oc);
    }
}

static uint16_t reply_type(uint16_t type)
{
    return type == WIRE_PING ? WIRE_PONG : (uint16_t)(type + 1);
}

static void send_error(net_conn *c, uint64_t request_id, int code, const char *msg)
{
    wire_writer w;
    wire_writer_init(&w, 512);
    wire_put_u32(&w, (uint32_t)code);
    wire_put_str(&w, msg);
    if (!w.failed)
        net_send_frame(c, WIRE_ERROR, request_id, w.data, (uint32_t)w.len, COORD_IO_TIMEOUT_MS);
    wire_writer_free(&w);
}

/* ---- rebalancing (callers hold co->mu) ---- */

static int is_stage_peer(const member *m)
{
    return m->reg.role == COORD_ROLE_STAGE;
}

/* The policy forgets the peers that are no longer members. */
static void rebalance_forget_gone(coordinator *co)
{
    for (size_t i = 0; i < co->n_rb_ids; i++) {
        const member *m = find_member(co, co->rb_ids[i]);
        if (!m || !is_stage_peer(m)) rebalance_peer_remove(co->rb, co->rb_ids[i]);
    }
    co->n_rb_ids = 0;
}

/* An instruction not carried out in time is withdrawn (the peer cannot move: no donor, an
 * old binary); the policy then sees the peer where it registered. */
static void withdraw_stale(coordinator *co, member *m, int64_t now)
{
    const int64_t limit = (int64_t)co->o.rebalance_period_ms * COORD_MOVE_WITHDRAW;
    const int64_t after = limit > COORD_MOVE_WITHDRAW_MIN_MS ? limit : COORD_MOVE_WITHDRAW_MIN_MS;
    if (m->instruction == COORD_NO_INSTRUCTION || now - m->instructed_ms <= after) return;
    log_warn("rebalance: peer %u '%s' did not move to stage %u within %lld s; instruction "
             "withdrawn", m->id, m->reg.name, m->instruction, (long long)(after / 1000));
    m->instruction = COORD_NO_INSTRUCTION;
    co->withdrawn++;
}

/* Every live stage peer, at its stage (or the one it is moving to: its capacity there is
 * not known yet) with its capacity, and each stage's work from its layer count. */
static int rebalance_feed(coordinator *co, int64_t now)
{
    for (size_t i = 0; i < co->n_members; i++) /* first: forgotten next period whatever fails */
        if (is_stage_peer(&co->members[i])) co->rb_ids[co->n_rb_ids++] = co->members[i].id;
    for (size_t i = 0; i < co->n_members; i++) {
        member *m = &co->members[i];
        if (!is_stage_peer(m)) continue;
        withdraw_stale(co, m, now);
        const int moving = m->instruction != COORD_NO_INSTRUCTION;
        const uint32_t stage = moving ? m->instruction : m->reg.stage;
        const double cap = moving || !m->has_stats ? 0.0 : coord_stats_capacity(&m->stats);
        rebalance_stage_work(co->rb, (int)m->reg.stage, (double)(m->reg.l1 - m->reg.l0));
        int rc = rebalance_peer_set(co->rb, m->id, (int)stage, cap);
        if (rc) return rc;
    }
    return 0;
}

static void record_move(coordinator *co, const rebalance_move *mv, int64_t now)
{
    coord_move *r = &co->recent[co->moves % COORD_RECENT_MOVES];
    *r = (coord_move){.peer_id = mv->peer_id, .from_stage = (uint32_t)mv->from_stage,
                      .to_stage = (uint32_t)mv->to_stage, .min_before = mv->min_before,
                      .min_after = mv->min_after, .period = rebalance_period(co->rb),
                      .at_s = (now - co->start_ms) / 1000.0};
    co->moves++;
}

/* The moves the policy accepts this period (each lowers its estimate of what is left to
 * gain, so a few at most), each told to its peer. */
static void rebalance_moves(coordinator *co, int64_t now)
{
    for (uint32_t i = 0; i < co->o.n_stages; i++) {
        rebalance_move mv;
        int rc = rebalance_decide(co->rb, &mv);
        if (rc < 0) log_warn("rebalance: no decision this period: %s", cirrus_strerror(rc));
        if (rc != 1) return;
        member *m = find_member(co, mv.peer_id);
        if (!m || rebalance_apply(co->rb, &mv)) return; /* not reached: fed just now */
        m->instruction = (uint32_t)mv.to_stage;
        m->instructed_ms = now;
        record_move(co, &mv, now);
        log_info("rebalance: peer %u '%s' moves from stage %d to stage %d: minimum stage "
                 "capacity %.1f -> %.1f (estimated, forward units/s)", mv.peer_id,
                 m->reg.name, mv.from_stage, mv.to_stage, mv.min_before, mv.min_after);
    }
}

/* One period of the rebalancer, when it is due. */
static void maybe_rebalance(coordinator *co, int64_t now)
{
    if (!co->rb || now < co->next_rebalance_ms) return;
    co->next_rebalance_ms = now + co->o.rebalance_period_ms;
    rebalance_forget_gone(co);
    int rc = rebalance_feed(co, now);
    if (rc) log_warn("rebalance: no decision this period: %s", cirrus_strerror(rc));
    else rebalance_moves(co, now);
    rebalance_next_period(co->rb);
}

/* ---- connections ---- */

typedef struct conn_job {
    coordinator *co;
    net_conn *c;
} conn_job;

static void *conn_main(void *arg)
{
    conn_job *job = arg;
    coordinator *co = job->co;
    net_conn *c = job->c;
    free(job);
    cirrus_error err = {0};
    uint16_t role;
    uint32_t hello_id;
    net_set_max_payload(c, COORD_REQUEST_LIMIT);
    if (net_hello_server(c, co->job_id, &role, &hello_id, COORD_IO_TIMEOUT_MS, &err)) {
        log_warn("dropped %s: %s", net_peer_name(c), err.msg);
        goto out;
    }
    int64_t idle_until = now_ms() + co->o.idle_ms;
    while (!atomic_load(&co->stopping)) {
        /* Wait for the first byte of a frame here, not inside net_recv_frame: a receive
         * that timed out mid-frame would leave the stream at an unknown position. */
        struct pollfd pfd = {.fd = net_fd(c), .events = POLLIN};
        int pr = poll(&pfd, 1, COORD_POLL_MS);
        if (pr < 0 && errno != EINTR) break;
        if (pr <= 0) {
            if (now_ms() > idle_until) {
                log_info("closing %s: idle for %u ms", net_peer_name(c), co->o.idle_ms);
                break;
            }
            continue;
        }
        wire_header h;
        const uint8_t *p;
        int rc = net_recv_frame(c, &h, &p, COORD_IO_TIMEOUT_MS, &err);
        if (rc == CIRRUS_ECLOSED) break;
        if (rc) {
            log_warn("dropped %s: %s", net_peer_name(c), err.msg);
            break;
        }
        idle_until = now_ms() + co->o.idle_ms;
        wire_writer reply;
        wire_writer_init(&reply, COORD_REPLY_LIMIT);
        outcome oc = {0};
        rc = serve(co, &h, p, &reply, &oc);
        if (!rc && reply.failed) rc = cirrus_fail(&oc.err, CIRRUS_ENOMEM, "reply too large");
        if (rc) {
            if (oc.drop) log_warn("dropped %s: %s", net_peer_name(c), oc.err.msg);
            send_error(c, h.request_id, rc, oc.err.msg);
            wire_writer_free(&reply);
            if (oc.drop) break;
            continue;
        }
        rc = net_send_frame(c, reply_type(h.type), h.request_id, reply.data, (uint32_t)reply.len,
                            COORD_IO_TIMEOUT_MS);
        wire_writer_free(&reply);
        if (rc) break;
    }
out:
    net_close(c);
    pthread_mutex_lock(&co->mu);
    co->conns--;
    pthread_cond_broadcast(&co->conn_ended);
    pthread_mutex_unlock(&co->mu);
    return NULL;
}

static void spawn_conn(coordinator *co, net_conn *c)
{
    pthread_mutex_lock(&co->mu);
    int full = co->conns >= co->max_conns;
    if (!full) co->conns++;
    pthread_mutex_unlock(&co->mu);
    if (full) {
        log_warn("refused %s: %u connections open", net_peer_name(c), co->max_conns);
        net_close(c);
        return;
    }
    conn_job *job = malloc(sizeof *job);
    pthread_attr_t attr;
    pthread_t th;
    int ok = 0;
    if (job && pthread_attr_init(&attr) == 0) {
        *job = (conn_job){co, c};
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        pthread_attr_setstacksize(&attr, COORD_THREAD_STACK);
        ok = pthread_create(&th, &attr, conn_main, job) == 0;
        pthread_attr_destroy(&attr);
    }
    if (ok) return;
    log_warn("refused %s: cannot start a thread", net_peer_name(c));
    free(job);
    net_close(c);
    pthread_mutex_lock(&co->mu);
    co->conns--;
    pthread_cond_broadcast(&co->conn_ended);
    pthread_mutex_unlock(&co->mu);
}

static void *accept_main(void *arg)
{
    coordinator *co = arg;
    while (!atomic_load(&co->stopping)) {
        net_conn *c = NULL;
        cirrus_error err = {0};
        int rc = net_accept(co->lfd, COORD_POLL_MS, &c, &err);
        if (rc == 0) spawn_conn(co, c);
        else if (rc != CIRRUS_ETIMEDOUT) {
            log_warn("accept: %s", err.msg);
            usleep(50 * 1000); /* e.g. out of descriptors: do not spin */
        }
        /* Expire on time even when nobody is asking; rebalance when a period is over. */
        pthread_mutex_lock(&co->mu);
        int64_t now = now_ms();
        reap_expired(co, now);
        maybe_rebalance(co, now);
        pthread_mutex_unlock(&co->mu);
    }
    return NULL;
}

/* ---- life cycle ---- */

static int check_options(const coordinator_options *o, coordinator_options *f, cirrus_error *err)
{
    *f = *o;
    if (!o->job_id || !*o->job_id || strlen(o->job_id) > WIRE_JOB_ID_MAX)
        return cirrus_fail(err, CIRRUS_EINVAL, "job id must be 1..%d bytes", WIRE_JOB_ID_MAX);
    if (o->host && strlen(o->host) > COORD_HOST_MAX)
        return cirrus_fail(err, CIRRUS_EINVAL, "host is longer than %d bytes", COORD_HOST_MAX);
    if (o->n_stages < 1 || o->n_stages > COORD_MAX_STAGES)
        return cirrus_fail(err, CIRRUS_EINVAL, "stage count %u is outside 1..%d", o->n_stages,
                           COORD_MAX_STAGES);
    if (o->n_layer > COORD_MAX_LAYERS)
        return cirrus_fail(err, CIRRUS_EINVAL, "layer count %u is above %d", o->n_layer,
                           COORD_MAX_LAYERS);
    if (o->port < 0 || o->port > 65535)
        return cirrus_fail(err, CIRRUS_EINVAL, "port %d is outside 0..65535", o->port);
    if (o->http_port < -1 || o->http_port > 65535)
        return cirrus_fail(err, CIRRUS_EINVAL, "HTTP port %d is outside 0..65535", o->http_port);
    if (!f->heartbeat_ms) f->heartbeat_ms = COORD_DEFAULT_HEARTBEAT_MS;
    if (f->heartbeat_ms > 3600 * 1000)
        return cirrus_fail(err, CIRRUS_EINVAL, "heartbeat interval %u ms is above an hour",
                           f->heartbeat_ms);
    if (!f->expire_ms) f->expire_ms = 3 * f->heartbeat_ms;
    if (f->expire_ms < f->heartbeat_ms)
        return cirrus_fail(err, CIRRUS_EINVAL, "expiry %u ms is shorter than the %u ms heartbeat "
                           "interval", f->expire_ms, f->heartbeat_ms);
    if (!f->max_peers) f->max_peers = COORD_DEFAULT_MAX_PEERS;
    if (f->max_peers > COORD_MAX_PEERS)
        return cirrus_fail(err, CIRRUS_EINVAL, "max peers %u is above %d", f->max_peers,
                           COORD_MAX_PEERS);
    if (!f->idle_ms) f->idle_ms = f->expire_ms > 15000 ? 4 * f->expire_ms : 60000;
    if (!f->epoch) f->epoch = fresh_epoch();
    if (f->rebalance_period_ms > 24u * 3600 * 1000)
        return cirrus_fail(err, CIRRUS_EINVAL, "rebalancing period %u ms is above a day",
                           f->rebalance_period_ms);
    return 0;
}

int coordinator_start(const coordinator_options *o, coordinator **out, cirrus_error *err)
{
    *out = NULL;
    coordinator_options f;
    int rc = check_options(o, &f, err);
    if (rc) return rc;
    coordinator *co = calloc(1, sizeof *co);
    if (!co) return cirrus_fail(err, CIRRUS_ENOMEM, "out of memory for the coordinator");
    co->o = f;
    snprintf(co->job_id, sizeof co->job_id, "%s", f.job_id);
    snprintf(co->host, sizeof co->host, "%s", f.host ? f.host : "");
    co->o.job_id = co->job_id;
    co->o.host = co->host;
    co->epoch = f.epoch;
    co->start_ms = now_ms();
    co->lfd = -1;
    co->http_port = -1;
    co->max_conns = f.max_peers + COORD_CONN_SLACK;
    co->next_id = 1;
    co->loss = NAN;
    co->barrier.next_notice = 1;
    atomic_init(&co->stopping, 0);
    pthread_mutex_init(&co->mu, NULL);
    pthread_cond_init(&co->conn_ended, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&co->barrier_changed, &ca);
    pthread_condattr_destroy(&ca);
    co->members = calloc(f.max_peers, sizeof *co->members);
    co->moved = calloc(f.max_peers, sizeof *co->moved);
    if (!co->members || !co->moved) {
        rc = cirrus_fail(err, CIRRUS_ENOMEM, "out of memory for %u members", f.max_peers);
        goto fail;
    }
    if (f.rebalance_period_ms) {
        co->rb = rebalance_create((int)f.n_stages, NULL);
        co->rb_ids = calloc(f.max_peers, sizeof *co->rb_ids);
        /* The first period starts now: peers measure their capacity meanwhile. */
        co->next_rebalance_ms = co->start_ms + f.rebalance_period_ms;
        if (!co->rb || !co->rb_ids) {
            rc = cirrus_fail(err, CIRRUS_ENOMEM, "out of memory for the rebalancer");
            goto fail;
        }
    }
    if ((rc = net_listen(co->host, f.port, &co->lfd, &co->port, err))) goto fail;
    if (f.http_port >= 0 &&
        (rc = http_status_start(co, co->host, f.http_port, &co->http, &co->http_port, err)))
        goto fail;
    if (pthread_create(&co->acceptor, NULL, accept_main, co) != 0) {
        rc = cirrus_fail(err, CIRRUS_ENOMEM, "cannot start the accept thread");
        goto fail;
    }
    co->acceptor_started = 1;
    *out = co;
    return 0;
fail:
    coordinator_stop(co);
    return rc;
}

void coordinator_stop(coordinator *co)
{
    if (!co) return;
    atomic_store(&co->stopping, 1);
    if (co->acceptor_started) pthread_join(co->acceptor, NULL);
    /* Connection threads see the flag within COORD_POLL_MS (or once their request is
     * answered); they own the table's lock while they work, so wait for all of them. */
    pthread_mutex_lock(&co->mu);
    while (co->conns > 0) pthread_cond_wait(&co->conn_ended, &co->mu);
    pthread_mutex_unlock(&co->mu);
    if (co->http) http_status_stop(co->http);
    if (co->lfd >= 0) close(co->lfd);
    pthread_cond_destroy(&co->conn_ended);
    pthread_cond_destroy(&co->barrier_changed);
    pthread_mutex_destroy(&co->mu);
    free(co->members);
    free(co->moved);
    rebalance_destroy(co->rb);
    free(co->rb_ids);
    free(co);
}

int coordinator_port(const coordinator *co) { return co->port; }
int coordinator_http_port(const coordinator *co) { return co->http ? co->http_port : -1; }
uint64_t coordinator_epoch(const coordinator *co) { return co->epoch; }

int coordinator_set_instruction(coordinator *co, uint32_t peer_id, uint32_t stage)
{
    if (stage != COORD_NO_INSTRUCTION && stage >= co->o.n_stages) return CIRRUS_EINVAL;
    pthread_mutex_lock(&co->mu);
    member *m = find_member(co, peer_id);
    int rc = m && m->reg.role == COORD_ROLE_STAGE ? 0 : CIRRUS_ENOENT;
    if (!rc) {
        m->instruction = stage;
        m->instructed_ms = now_ms();
    }
    pthread_mutex_unlock(&co->mu);
    return rc;
}

int coordinator_snapshot(coordinator *co, coord_snapshot *s)
{
    memset(s, 0, sizeof *s);
    int64_t now = now_ms();
    pthread_mutex_lock(&co->mu);
    reap_expired(co, now);
    s->stage_peers = calloc(co->o.n_stages, sizeof *s->stage_peers);
    s->stage_throughput = calloc(co->o.n_stages, sizeof *s->stage_throughput);
    s->stage_capacity = calloc(co->o.n_stages, sizeof *s->stage_capacity);
    s->members = calloc(co->n_members ? co->n_members : 1, sizeof *s->members);
    if (!s->stage_peers || !s->stage_throughput || !s->stage_capacity || !s->members) {
        pthread_mutex_unlock(&co->mu);
        coord_snapshot_free(s);
        return CIRRUS_ENOMEM;
    }
    memcpy(s->job_id, co->job_id, sizeof s->job_id);
    s->epoch = co->epoch;
    s->uptime_s = (now - co->start_ms) / 1000.0;
    s->n_stages = co->o.n_stages;
    s->step = co->step;
    s->loss = co->loss;
    s->expirations = co->expirations;
    s->registrations = co->registrations;
    s->mb_retried = co->retired_retried;
    s->mb_lost = co->retired_lost;
    s->n_members = co->n_members;
    s->rebalance_period_s = co->o.rebalance_period_ms / 1000.0;
    s->moves = co->moves;
    s->withdrawn = co->withdrawn;
    s->n_recent = co->moves < COORD_RECENT_MOVES ? (size_t)co->moves : COORD_RECENT_MOVES;
    for (size_t i = 0; i < s->n_recent; i++) /* oldest first */
        s->recent[i] = co->recent[(co->moves - s->n_recent + i) % COORD_RECENT_MOVES];
    for (size_t i = 0; i < co->n_members; i++) {
        const member *m = &co->members[i];
        coord_member_view *v = &s->members[i];
        member_info(m, &v->info);
        v->role = m->reg.role;
        v->stats = m->stats;
        v->last_seen_s = (now - m->last_seen_ms) / 1000.0;
        v->moving_to = m->instruction;
        if (m->reg.role == COORD_ROLE_STAGE) {
            v->capacity = m->has_stats ? coord_stats_capacity(&m->stats) : 0.0;
            s->stage_peers[m->reg.stage]++;
            s->stage_throughput[m->reg.stage] += v->info.throughput;
            s->stage_capacity[m->reg.stage] += v->capacity;
            continue;
        }
        s->n_clients++;
        if (m->has_report) {
            s->tokens_per_s += m->report.tokens_per_s;
            s->mb_retried += m->report.mb_retried;
            s->mb_lost += m->report.mb_lost;
        }
    }
    pthread_mutex_unlock(&co->mu);
    return 0;
}

void coord_snapshot_free(coord_snapshot *s)
{
    free(s->stage_peers);
    free(s->stage_throughput);
    free(s->stage_capacity);
    free(s->members);
    memset(s, 0, sizeof *s);
}

int coordinator_run(const coordinator_options *o, volatile sig_atomic_t *stop,
                    cirrus_error *err)
{
    coordinator *co;
    int rc = coordinator_start(o, &co, err);
    if (rc) return rc;
    log_info("coordinator of job %s: %u stages, epoch %llu, peers on port %d, HTTP on port %d, "
             "heartbeat %u ms, expiry %u ms, rebalancing %s", co->job_id, co->o.n_stages,
             (unsigned long long)co->epoch, co->port, coordinator_http_port(co),
             co->o.heartbeat_ms, co->o.expire_ms, co->rb ? "on" : "off");
    /* An atomic read: the flag is set by a signal handler, or by another thread. */
    while (!__atomic_load_n(stop, __ATOMIC_RELAXED)) {
        struct timespec ts = {0, COORD_POLL_MS * 1000000L};
        nanosleep(&ts, NULL);
    }
    log_info("coordinator stopping");
    coordinator_stop(co);
    return 0;
}
