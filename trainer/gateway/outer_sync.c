/* outer_sync: see outer_sync.h. This file holds the global state, the region's requests
 * and the rounds; wan_link.c the connections to the other gateways. */
#include "outer_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <xxhash.h>

#include "../../common/log.h"
#include "outer_msg.h"

int64_t outer_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static double wall_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* The digest of the global state: XXH3-64 of the parameters, then the momentum. */
static uint64_t state_digest(const float *theta, const float *mom, uint64_t n)
{
    XXH3_state_t *st = XXH3_createState();
    if (!st) return 0;
    XXH3_64bits_reset(st);
    XXH3_64bits_update(st, theta, n * sizeof(float));
    XXH3_64bits_update(st, mom, n * sizeof(float));
    uint64_t d = XXH3_64bits_digest(st);
    XXH3_freeState(st);
    return d;
}

/* ---- the region's requests ---- */

/* PUSH: the region's parameters, in order, slice by slice. A slice at offset 0 starts the
 * push again (the client retried). Round 0 is the initial state: adopted if this gateway
 * has none, else ignored (a client that restarted: it pulls the global state next). */
static int serve_push(outer_sync *os, wire_reader *r, int *drop, cirrus_error *err)
{
    outer_push q;
    if (outer_msg_get_push(r, os->n, &q)) {
        *drop = 1;
        return cirrus_fail(err, CIRRUS_ECORRUPT, "malformed outer PUSH");
    }
    pthread_mutex_lock(&os->mu);
    int rc = 0;
    const uint64_t next = (uint64_t)(os->round + 1);
    if (q.round != 0 && (os->round < 0 || q.round != next || os->push_ready)) {
        rc = cirrus_fail(err, CIRRUS_EINVAL, "outer round %llu pushed while the gateway is at "
                         "round %lld%s", (unsigned long long)q.round, (long long)os->round,
                         os->push_ready ? " with a round in progress" : "");
    } else if (q.round == 0 && os->round >= 0) {
        /* keep the global state this gateway has */
    } else if (q.offset != (q.offset == 0 ? 0 : os->push_got) || (q.offset && q.round != os->push_round)) {
        rc = cirrus_fail(err, CIRRUS_EINVAL, "outer PUSH slice at %llu, expected %llu",
                         (unsigned long long)q.offset, (unsigned long long)os->push_got);
    } else {
        if (q.offset == 0) {
            os->push_round = q.round;
            os->push_got = 0;
            os->push_tokens = q.tokens;
        }
        memcpy(os->region + q.offset, q.floats, q.count * sizeof(float));
        os->push_got = q.offset + q.count;
        if (os->push_got == os->n) {
            if (q.round == 0) {
                memcpy(os->theta, os->region, os->n * sizeof(float));
                memset(os->mom, 0, os->n * sizeof(float));
                os->round = 0;
                os->digest = state_digest(os->theta, os->mom, os->n);
                log_info("outer: initial parameters adopted (%llu floats, digest %016llx)",
                         (unsigned long long)os->n, (unsigned long long)os->digest);
            } else {
                os->push_ready = 1;
                os->push_time = wall_s();
            }
            os->push_got = 0;
            pthread_cond_broadcast(&os->changed);
        }
    }
    pthread_mutex_unlock(&os->mu);
    return rc;
}

static int serve_pull(outer_sync *os, wire_reader *r, wire_writer *reply, int *drop,
                      cirrus_error *err)
{
    outer_pull q;
    if (outer_msg_get_pull(r, os->n, &q)) {
        *drop = 1;
        return cirrus_fail(err, CIRRUS_ECORRUPT, "malformed outer PULL");
    }
    pthread_mutex_lock(&os->mu);
    const outer_pull_ok a = {.done = os->round < 0 ? 0 : (uint64_t)os->round,
                             .digest = os->digest,
                             .wan_bytes = os->wan_sent + os->wan_received,
                             .ready = os->round >= 0 && (uint64_t)os->round >= q.round};
    outer_msg_put_pull_ok(reply, &a, os->theta + q.offset, q.count);
    pthread_mutex_unlock(&os->mu);
    return 0;
}

int outer_sync_serve(void *ctx, uint16_t type, const uint8_t *p, size_t n, wire_writer *reply,
                     int *drop, cirrus_error *err)
{
    outer_sync *os = ctx;
    wire_reader r;
    wire_reader_init(&r, p, n);
    switch (type) {
    case OUTER_PUSH: return serve_push(os, &r, drop, err);
    case OUTER_PULL: return serve_pull(os, &r, reply, drop, err);
    default:
        *drop = 1;
        return cirrus_fail(err, CIRRUS_ECORRUPT, "unknown outer request type %u", type);
    }
}

/* ---- rounds ---- */

typedef struct send_job {
    outer_sync *os;
    int j;
    uint64_t round, len, tokens, prev_digest;
    const uint8_t *msg;
    int64_t deadline;
    int rc;
} send_job;

static void *send_main(void *arg)
{
    send_job *sj = arg;
    cirrus_error err = {0};
    sj->rc = wan_link_send(sj->os, sj->j, sj->round, sj->msg, sj->len, sj->tokens,
                           sj->prev_digest, sj->deadline, &err);
    if (sj->rc && !atomic_load(&sj->os->stopping))
        log_warn("outer round %llu: region %s did not take our delta: %s",
                 (unsigned long long)sj->round, sj->os->names[sj->j], err.msg);
    return NULL;
}

/* Whether every region's message of round k is here. Under mu. */
static int round_complete(const outer_sync *os, uint64_t k)
{
    for (int r = 0; r < os->o.n_regions; r++) {
        const round_slot *sl = &os->slot[k & 1][r];
        if (sl->round != k || !sl->complete) return 0;
    }
    return 1;
}

/* Decode every region's message of round k in region order, weighted by its tokens, into
 * avg; then the outer step. Under mu (the messages and the state). */
static int finish_round(outer_sync *os, uint64_t k, float *avg, float *dec, cirrus_error *err)
{
    double tokens = 0.0;
    for (int r = 0; r < os->o.n_regions; r++) tokens += (double)os->slot[k & 1][r].tokens;
    memset(avg, 0, os->n * sizeof(float));
    int mismatch = 0;
    for (int r = 0; r < os->o.n_regions; r++) {
        round_slot *sl = &os->slot[k & 1][r];
        if (sl->prev_digest != os->digest) mismatch = 1;
        int rc = wan_decode(sl->bytes, sl->total, dec, os->n, err);
        if (rc) return rc;
        /* Equal weights when no tokens were reported (every region alike). */
        const float w = tokens > 0 ? (float)((double)sl->tokens / tokens)
                                   : 1.0f / (float)os->o.n_regions;
        for (uint64_t i = 0; i < os->n; i++) avg[i] += w * dec[i];
    }
    if (mismatch) {
        os->mismatches++;
        log_error("outer round %llu: a region's global state differs from ours (digest "
                  "%016llx here)", (unsigned long long)k, (unsigned long long)os->digest);
    }
    outer_step(&os->o.opt, os->theta, os->mom, avg, os->n);
    os->digest_prev = os->digest;
    os->digest = state_digest(os->theta, os->mom, os->n);
    os->round = (int64_t)k;
    return 0;
}

static void *worker_main(void *arg)
{
    outer_sync *os = arg;
    const size_t n = os->n;
    float *delta = malloc(n * sizeof(float)), *residual = calloc(n, sizeof(float));
    float *avg = malloc(n * sizeof(float)), *dec = malloc(n * sizeof(float));
    if (!delta || !residual || !avg || !dec) {
        log_error("outer: out of memory for %zu parameters", n);
        goto out;
    }
    pthread_mutex_lock(&os->mu);
    while (!atomic_load(&os->stopping)) {
        if (!os->push_ready) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += 100 * 1000000L;
            if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
            pthread_cond_timedwait(&os->changed, &os->mu, &ts);
            continue;
        }
        const uint64_t k = (uint64_t)os->round + 1;
        const int64_t t0 = outer_now_ms();
        for (size_t i = 0; i < n; i++) delta[i] = os->theta[i] - os->region[i];
        const uint64_t tokens = os->push_tokens, prev_digest = os->digest;
        pthread_mutex_unlock(&os->mu);

        /* Encode with error feedback; the message goes into our own slot, decoded later
         * like every other region's. */
        cirrus_error err = {0};
        const size_t cap = wan_encode_bound(n, &os->o.codec);
        uint8_t *msg = malloc(cap);
        size_t len = 0;
        int rc = msg ? wan_encode(&os->o.codec, delta, residual, n, msg, cap, &len, &err)
                     : cirrus_fail(&err, CIRRUS_ENOMEM, "out of memory for the message");
        if (rc) {
            log_error("outer round %llu: %s", (unsigned long long)k, err.msg);
            free(msg);
            pthread_mutex_lock(&os->mu);
            os->push_ready = 0; /* the client sees no progress and times out */
            continue;
        }
        const int64_t deadline = outer_now_ms() + os->o.round_timeout_ms;
        send_job jobs[WAN_MAX_REGIONS];
        pthread_t th[WAN_MAX_REGIONS];
        int started[WAN_MAX_REGIONS] = {0};
        for (int j = 0; j < os->o.n_regions; j++) {
            if (j == os->o.region_index) continue;
            jobs[j] = (send_job){os, j, k, len, tokens, prev_digest, msg, deadline, 0};
            started[j] = pthread_create(&th[j], NULL, send_main, &jobs[j]) == 0;
            if (!started[j]) send_main(&jobs[j]);
        }
        pthread_mutex_lock(&os->mu);
        round_slot *own = &os->slot[k & 1][os->o.region_index];
        free(own->bytes);
        *own = (round_slot){.round = k, .bytes = msg, .total = len, .got = len,
                            .tokens = tokens, .prev_digest = prev_digest, .complete = 1};
        pthread_cond_broadcast(&os->changed);
        pthread_mutex_unlock(&os->mu);
        for (int j = 0; j < os->o.n_regions; j++)
            if (started[j]) pthread_join(th[j], NULL);

        pthread_mutex_lock(&os->mu);
        while (!atomic_load(&os->stopping) && !round_complete(os, k)) {
            if (outer_now_ms() > deadline) break;
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += 100 * 1000000L;
            if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
            pthread_cond_timedwait(&os->changed, &os->mu, &ts);
        }
        if (atomic_load(&os->stopping)) break;
        if (!round_complete(os, k)) {
            /* Lost regions are not yet left out: the round stays open, the client waits. */
            log_warn("outer round %llu: not every region's delta arrived within %d ms",
                     (unsigned long long)k, os->o.round_timeout_ms);
            continue;
        }
        if ((rc = finish_round(os, k, avg, dec, &err))) {
            log_error("outer round %llu: %s", (unsigned long long)k, err.msg);
            continue;
        }
        os->push_ready = 0;
        os->last_sync_s = wall_s();
        os->last_duration_s = os->last_sync_s - os->push_time;
        log_info("outer round %llu done in %.2f s (%lld ms on the WAN): digest %016llx, "
                 "%zu-byte delta, WAN bytes %llu sent, %llu received",
                 (unsigned long long)k, os->last_duration_s, (long long)(outer_now_ms() - t0),
                 (unsigned long long)os->digest, len, (unsigned long long)os->wan_sent,
                 (unsigned long long)os->wan_received);
        pthread_cond_broadcast(&os->changed);
    }
    pthread_mutex_unlock(&os->mu);
out:
    free(delta);
    free(residual);
    free(avg);
    free(dec);
    return NULL;
}

/* ---- life ---- */

int outer_sync_start(const outer_sync_options *o, outer_sync **out, cirrus_error *err)
{
    *out = NULL;
    if (o->n_regions < 1 || o->n_regions > WAN_MAX_REGIONS || o->region_index < 0 ||
        o->region_index >= o->n_regions)
        return cirrus_fail(err, CIRRUS_EINVAL, "region %d of %d: at most %d regions",
                           o->region_index, o->n_regions, WAN_MAX_REGIONS);
    if (!o->job || strlen(o->job) > WIRE_JOB_ID_MAX || o->n_params == 0)
        return cirrus_fail(err, CIRRUS_EINVAL, "outer sync: a job id and a model are needed");
    outer_sync *os = calloc(1, sizeof *os);
    if (!os) return cirrus_fail(err, CIRRUS_ENOMEM, "out of memory for the outer sync");
    os->o = *o;
    snprintf(os->job, sizeof os->job, "%s", o->job);
    os->o.job = os->job;
    for (int r = 0; r < o->n_regions; r++) {
        if (strlen(o->region_names[r]) > WAN_REGION_MAX ||
            strlen(o->wan_addrs[r]) >= sizeof os->addrs[r]) {
            free(os);
            return cirrus_fail(err, CIRRUS_EINVAL, "region %d: name or address too long", r);
        }
        snprintf(os->names[r], sizeof os->names[r], "%s", o->region_names[r]);
        snprintf(os->addrs[r], sizeof os->addrs[r], "%s", o->wan_addrs[r]);
    }
    if (os->o.round_timeout_ms <= 0) os->o.round_timeout_ms = 600000;
    os->n = o->n_params;
    /* Any codec's message for n floats fits the plain fp32 one with zstd's worst case. */
    const wan_codec_params widest = {.id = WAN_CODEC_NONE, .zstd = 1};
    os->max_message = wan_encode_bound(os->n, &widest);
    os->round = -1;
    os->lfd = o->listen_fd;
    pthread_mutex_init(&os->mu, NULL);
    pthread_cond_init(&os->changed, NULL);
    os->theta = malloc(os->n * sizeof(float));
    os->mom = calloc(os->n, sizeof(float));
    os->region = malloc(os->n * sizeof(float));
    int rc = os->theta && os->mom && os->region
                 ? 0
                 : cirrus_fail(err, CIRRUS_ENOMEM, "out of memory for %llu parameters",
                               (unsigned long long)os->n);
    if (!rc) rc = wan_link_start(os, err);
    /* One region alone runs its rounds too (on its own delta): the same code path. */
    if (!rc) {
        if (pthread_create(&os->worker, NULL, worker_main, os) == 0) os->worker_started = 1;
        else rc = cirrus_fail(err, CIRRUS_ENOMEM, "cannot start the outer sync thread");
    }
    if (rc) {
        outer_sync_stop(os);
        return rc;
    }
    *out = os;
    return 0;
}

void outer_sync_stop(outer_sync *os)
{
    if (!os) return;
    atomic_store(&os->stopping, 1);
    pthread_mutex_lock(&os->mu);
    pthread_cond_broadcast(&os->changed);
    pthread_mutex_unlock(&os->mu);
    if (os->worker_started) pthread_join(os->worker, NULL);
    wan_link_stop(os);
    for (int p = 0; p < 2; p++)
        for (int r = 0; r < WAN_MAX_REGIONS; r++) free(os->slot[p][r].bytes);
    free(os->theta);
    free(os->mom);
    free(os->region);
    pthread_cond_destroy(&os->changed);
    pthread_mutex_destroy(&os->mu);
    free(os);
}

int outer_sync_view(void *ctx, coord_outer_view *v)
{
    outer_sync *os = ctx;
    memset(v, 0, sizeof *v);
    wan_codec_format(&os->o.codec, v->codec, sizeof v->codec);
    v->sync_every = (uint32_t)os->o.sync_every;
    pthread_mutex_lock(&os->mu);
    v->step = os->round;
    v->digest = os->digest;
    v->wan_sent = os->wan_sent;
    v->wan_received = os->wan_received;
    v->payload_sent = os->payload_sent;
    v->digest_mismatches = os->mismatches;
    v->last_sync_unix_s = os->last_sync_s;
    v->last_duration_s = os->last_duration_s;
    for (int r = 0; r < os->o.n_regions && v->n_links < COORD_OUTER_LINKS; r++) {
        if (r == os->o.region_index) continue;
        uint32_t i = v->n_links++;
        snprintf(v->links[i].region, sizeof v->links[i].region, "%s", os->names[r]);
        v->links[i].up = os->peer[r].up;
        snprintf(v->links[i].last_error, sizeof v->links[i].last_error, "%s",
                 os->peer[r].last_error);
    }
    pthread_mutex_unlock(&os->mu);
    return 0;
}

void outer_sync_get_status(outer_sync *os, outer_sync_status *st)
{
    pthread_mutex_lock(&os->mu);
    *st = (outer_sync_status){.round = os->round, .digest = os->digest,
                              .wan_sent = os->wan_sent, .wan_received = os->wan_received,
                              .payload_sent = os->payload_sent,
                              .digest_mismatches = os->mismatches,
                              .last_sync_s = os->last_sync_s,
                              .last_duration_s = os->last_duration_s};
    for (int r = 0; r < os->o.n_regions; r++) st->links_up += os->peer[r].up;
    pthread_mutex_unlock(&os->mu);
}
