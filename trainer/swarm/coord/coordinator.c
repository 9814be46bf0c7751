/* coordinator: the owner of a region coordinator — its options, start and stop, the
 * snapshot of its state, and the role's loop. See coordinator.h; the modules it is made of
 * are listed in coord_internal.h, the messages in proto/coord_msg.h. */
#include "coordinator.h"

#include <math.h>
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
#include "coord_internal.h"

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
    if (f->max_conns > COORD_MAX_CONNS)
        return cirrus_fail(err, CIRRUS_EINVAL, "max connections %u is above %d", f->max_conns,
                           COORD_MAX_CONNS);
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

/* http_status asks for a snapshot through this, so it needs no coordinator.h. */
static int snapshot_for_http(void *ctx, coord_snapshot *out)
{
    return coordinator_snapshot(ctx, out);
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
    co->start_ms = clock_now_ms();
    co->lfd = -1;
    co->http_port = -1;
    co->max_conns = f.max_conns ? f.max_conns : COORD_DEFAULT_MAX_CONNS;
    co->next_id = 1;
    co->loss = NAN;
    co->barrier.next_notice = 1;
    atomic_init(&co->stopping, 0);
    pthread_mutex_init(&co->mu, NULL);
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
        rebalance_config rc_cfg = rebalance_config_default();
        /* More than the table holds is no bound at all. */
        rc_cfg.max_peers = f.max_stage_peers > COORD_MAX_PEERS ? 0 : (int)f.max_stage_peers;
        co->rb = rebalance_new((int)f.n_stages, &rc_cfg);
        co->rb_ids = calloc(f.max_peers, sizeof *co->rb_ids);
        /* Looked at from now on; the first period starts with the job's first step
         * (coord_moves_rebalance): peers measure their capacity meanwhile. */
        co->next_rebalance_ms = co->start_ms + f.rebalance_period_ms;
        if (!co->rb || !co->rb_ids) {
            rc = cirrus_fail(err, CIRRUS_ENOMEM, "out of memory for the rebalancer");
            goto fail;
        }
    }
    if ((rc = net_listen(co->host, f.port, &co->lfd, &co->port, err))) goto fail;
    if (f.http_port >= 0 &&
        (rc = http_status_start(co->host, f.http_port, snapshot_for_http, co, &co->http,
                                &co->http_port, err)))
        goto fail;
    if ((rc = coord_server_start(co, err))) goto fail;
    *out = co;
    return 0;
fail:
    coordinator_stop(co);
    return rc;
}

void coordinator_stop(coordinator *co)
{
    if (!co) return;
    coord_server_stop(co);
    if (co->http) http_status_stop(co->http);
    if (co->lfd >= 0) close(co->lfd);
    pthread_cond_destroy(&co->barrier_changed);
    pthread_mutex_destroy(&co->mu);
    free(co->members);
    free(co->moved);
    rebalance_free(co->rb);
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
    member *m = coord_members_find(co, peer_id);
    int rc = m && m->reg.role == COORD_ROLE_STAGE ? 0 : CIRRUS_ENOENT;
    if (!rc) {
        m->instruction = stage;
        m->instructed_ms = clock_now_ms();
    }
    pthread_mutex_unlock(&co->mu);
    return rc;
}

int coordinator_snapshot(coordinator *co, coord_snapshot *s)
{
    memset(s, 0, sizeof *s);
    /* Outside the coordinator's lock: the extension has its own. */
    if (co->o.ext_status) s->has_outer = co->o.ext_status(co->o.ext_ctx, &s->outer) == 0;
    int64_t now = clock_now_ms();
    pthread_mutex_lock(&co->mu);
    coord_members_reap(co, now);
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
        coord_members_info(m, &v->info);
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
