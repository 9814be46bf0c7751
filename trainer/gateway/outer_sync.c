/* outer_sync: see outer_sync.h. This file holds the lanes' global state and the region's
 * requests, and the group of lanes a gateway is; outer_round.c a lane's rounds; wan_link.c
 * its connections to the other gateways. */
#include "outer_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <xxhash.h>

#include "../../common/log.h"
#include "adapt.h"
#include "outer_msg.h"


double outer_wall_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* The digest of the global state: XXH3-64 of the parameters, the momentum, then the
 * schedule (one model everywhere includes when it syncs next). */
uint64_t outer_state_digest(const float *theta, const float *mom, uint64_t n,
                            const outer_schedule *sched)
{
    XXH3_state_t *st = XXH3_createState();
    if (!st) return 0;
    XXH3_64bits_reset(st);
    XXH3_64bits_update(st, theta, n * sizeof(float));
    XXH3_64bits_update(st, mom, n * sizeof(float));
    const uint64_t when[3] = {sched->at, sched->stride, sched->next_stride};
    XXH3_64bits_update(st, when, sizeof when);
    uint64_t d = XXH3_64bits_digest(st);
    XXH3_freeState(st);
    return d;
}

/* ---- the region's requests ---- */

/* PUSH: the region's parameters, in order, slice by slice. A slice at offset 0 starts the
 * push again (the client retried). Round 0 is the initial state: adopted if this gateway
 * has none, else ignored (a client that restarted: it pulls the global state next). */
static int serve_push(outer_lane *os, wire_reader *r, int *drop, cirrus_error *err)
{
    outer_push q;
    if (outer_msg_get_push(r, os->n, &q)) {
        *drop = 1;
        return cirrus_fail(err, CIRRUS_ECORRUPT, "malformed outer PUSH");
    }
    pthread_mutex_lock(&os->mu);
    int rc = 0;
    const uint64_t next = (uint64_t)(os->round + 1);
    if (q.round != 0 && os->round >= 0 && q.round <= (uint64_t)os->round) {
        /* This gateway took a later global state from another region (it rejoined or
         * repaired): the region's push is stale; its client takes the global state. */
        rc = cirrus_fail(err, CIRRUS_ECONFLICT, "outer step %llu is past: the gateway is at "
                         "outer step %lld", (unsigned long long)q.round, (long long)os->round);
    } else if (q.round != 0 && os->round < 0) {
        rc = cirrus_fail(err, CIRRUS_ECONFLICT, "outer step %llu: the gateway has no global "
                         "state (it restarted)", (unsigned long long)q.round);
    } else if (q.round > next) {
        /* The region is further than this gateway (it restarted, or fell behind and has
         * not caught up yet: the round thread takes the job's state): ask again. */
        rc = cirrus_fail(err, CIRRUS_ENOENT, "outer step %llu: the gateway is at %lld, "
                         "catching up", (unsigned long long)q.round, (long long)os->round);
        os->client_ahead = q.round;
        os->client_ahead_at = q.at;
        pthread_cond_broadcast(&os->changed);
    } else if (q.round != 0 && (q.round != next || os->push_ready)) {
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
            os->push_at = q.at;
            os->push_got = 0;
            os->push_tokens = q.tokens;
            os->push_compute_ms = q.compute_ms;
        }
        memcpy(os->region + q.offset, q.floats, q.count * sizeof(float));
        os->push_got = q.offset + q.count;
        if (os->push_got == os->n) {
            if (q.round == 0) {
                memcpy(os->theta, os->region, os->n * sizeof(float));
                memset(os->mom, 0, os->n * sizeof(float));
                os->round = 0;
                os->sched = OUTER_SCHEDULE_START;
                os->digest = outer_state_digest(os->theta, os->mom, os->n, &os->sched);
                log_info("outer: initial parameters adopted (%llu floats, digest %016llx)",
                         (unsigned long long)os->n, (unsigned long long)os->digest);
            } else {
                os->push_ready = 1;
                os->push_time = outer_wall_s();
            }
            os->push_got = 0;
            pthread_cond_broadcast(&os->changed);
        }
    }
    pthread_mutex_unlock(&os->mu);
    return rc;
}

static int serve_pull(outer_lane *os, wire_reader *r, wire_writer *reply, int *drop,
                      cirrus_error *err)
{
    outer_pull q;
    if (outer_msg_get_pull(r, os->n, &q)) {
        *drop = 1;
        return cirrus_fail(err, CIRRUS_ECORRUPT, "malformed outer PULL");
    }
    pthread_mutex_lock(&os->mu);
    if (q.round > 0 && (os->round < 0 || (uint64_t)os->round < q.round) &&
        os->wait_round != q.round) {
        os->wait_round = q.round; /* the region waits for this round from now on */
        os->wait_since = outer_wall_s();
    }
    const outer_pull_ok a = {.done = os->round < 0 ? 0 : (uint64_t)os->round,
                             .digest = os->digest,
                             .wan_bytes = atomic_load(&os->group->wan_bytes),
                             .ready = os->round >= 0 && (uint64_t)os->round >= q.round,
                             .pushed = (os->round >= 0 && (uint64_t)os->round >= q.round) ||
                                       (os->push_ready && os->push_round == q.round),
                             .region = (uint16_t)os->o.region_index,
                             .regions = (uint16_t)os->o.n_regions,
                             .fragments = (uint16_t)os->group->n_lanes,
                             .sched = os->sched};
    outer_msg_put_pull_ok(reply, &a, os->theta + q.offset, q.count);
    pthread_mutex_unlock(&os->mu);
    return 0;
}

int outer_sync_serve(void *ctx, uint16_t type, const uint8_t *p, size_t n, wire_writer *reply,
                     int *drop, cirrus_error *err)
{
    outer_sync *g = ctx;
    wire_reader r;
    wire_reader_init(&r, p, n);
    const int f = outer_msg_peek_fragment(&r);
    if (f < 0 || f >= g->n_lanes) {
        *drop = 1;
        return cirrus_fail(err, CIRRUS_ECORRUPT, "outer request for fragment %d of %d", f,
                           g->n_lanes);
    }
    outer_lane *os = g->lane[f];
    switch (type) {
    case OUTER_PUSH: return serve_push(os, &r, drop, err);
    case OUTER_PULL: return serve_pull(os, &r, reply, drop, err);
    default:
        *drop = 1;
        return cirrus_fail(err, CIRRUS_ECORRUPT, "unknown outer request type %u", type);
    }
}

/* ---- a lane's life ---- */

/* Lane f of group g over n floats: its state, not yet its threads. */
static int lane_new(outer_sync *g, const outer_sync_options *o, int f, uint64_t n,
                    outer_lane **out, cirrus_error *err)
{
    outer_lane *os = calloc(1, sizeof *os);
    if (!os) return cirrus_fail(err, CIRRUS_ENOMEM, "out of memory for the outer sync");
    *out = os;
    os->group = g;
    os->fragment = f;
    if (g->n_lanes > 1)
        snprintf(os->lane_name, sizeof os->lane_name, " (fragment %d of %d)", f, g->n_lanes);
    os->o = *o;
    snprintf(os->job, sizeof os->job, "%s", o->job);
    os->o.job = os->job;
    for (int r = 0; r < o->n_regions; r++) os->peer[r].round_seen = os->peer[r].left_us_out = -1;
    for (int r = 0; r < o->n_regions; r++) {
        snprintf(os->names[r], sizeof os->names[r], "%s", o->region_names[r]);
        snprintf(os->addrs[r], sizeof os->addrs[r], "%s", o->wan_addrs[r]);
    }
    os->n = n;
    os->rung = ADAPT_START_RUNG;
    snprintf(os->codec_why, sizeof os->codec_why, "%s", o->codec_auto ? "not measured yet" : "fixed by --codec");
    /* Any codec's message for n floats fits the plain fp32 one with zstd's worst case. */
    const wan_codec_params widest = {.id = WAN_CODEC_NONE, .zstd = 1};
    os->max_message = wan_encode_bound(os->n, &widest);
    os->round = -1;
    os->sched = OUTER_SCHEDULE_START;
    os->lfd = f == 0 ? o->listen_fd : -1;
    pthread_mutex_init(&os->mu, NULL);
    pthread_cond_init(&os->changed, NULL);
    os->theta = malloc(os->n * sizeof(float));
    os->mom = calloc(os->n, sizeof(float));
    os->region = malloc(os->n * sizeof(float));
    if (!os->theta || !os->mom || !os->region)
        return cirrus_fail(err, CIRRUS_ENOMEM, "out of memory for %llu parameters",
                           (unsigned long long)os->n);
    return 0;
}

/* Tell the lane's threads to stop and wake them. */
static void lane_interrupt(outer_lane *os)
{
    atomic_store(&os->stopping, 1);
    pthread_mutex_lock(&os->mu);
    pthread_cond_broadcast(&os->changed);
    pthread_mutex_unlock(&os->mu);
    wan_link_interrupt(os);
}

static void lane_free(outer_lane *os)
{
    if (!os) return;
    for (int p = 0; p < 2; p++)
        for (int r = 0; r < WAN_MAX_REGIONS; r++) free(os->slot[p][r].bytes);
    free(os->theta);
    free(os->mom);
    free(os->region);
    pthread_cond_destroy(&os->changed);
    pthread_mutex_destroy(&os->mu);
    free(os);
}

/* ---- the gateway: its lanes ---- */

int outer_sync_start(const outer_sync_options *o, outer_sync **out, cirrus_error *err)
{
    *out = NULL;
    if (o->n_regions < 1 || o->n_regions > WAN_MAX_REGIONS || o->region_index < 0 ||
        o->region_index >= o->n_regions)
        return cirrus_fail(err, CIRRUS_EINVAL, "region %d of %d: at most %d regions",
                           o->region_index, o->n_regions, WAN_MAX_REGIONS);
    if (!o->job || strlen(o->job) > WIRE_JOB_ID_MAX || o->n_params == 0)
        return cirrus_fail(err, CIRRUS_EINVAL, "outer sync: a job id and a model are needed");
    const int lanes = o->fragments ? o->fragments : 1;
    if (lanes < 1 || lanes > OUTER_MAX_FRAGMENTS || (uint64_t)lanes > o->n_params)
        return cirrus_fail(err, CIRRUS_EINVAL, "--fragments %d: 1 to %d, and at most one per "
                           "synchronised parameter", lanes, OUTER_MAX_FRAGMENTS);
    if (o->sync_every > 0 && o->sync_every < lanes)
        return cirrus_fail(err, CIRRUS_EINVAL, "--fragments %d needs --sync-every %d or more: "
                           "each fragment pushes at an inner step of its own", lanes, lanes);
    for (int r = 0; r < o->n_regions; r++)
        if (strlen(o->region_names[r]) > WAN_REGION_MAX || strlen(o->wan_addrs[r]) > WAN_ADDR_MAX)
            return cirrus_fail(err, CIRRUS_EINVAL, "region %d: name or address too long", r);
    outer_sync *g = calloc(1, sizeof *g);
    if (!g) return cirrus_fail(err, CIRRUS_ENOMEM, "out of memory for the outer sync");
    g->n_lanes = lanes;
    outer_sync_options lo = *o;
    if (lo.round_timeout_ms <= 0) lo.round_timeout_ms = 600000;
    int rc = 0;
    if (o->wan_max_Bps > 0 && !(g->pacer = net_pacer_new(o->wan_max_Bps)))
        rc = cirrus_fail(err, CIRRUS_ENOMEM, "out of memory for the WAN pacer");
    /* Every lane exists before the acceptor starts: a connection's JOIN may name any. */
    for (int f = 0; f < lanes && !rc; f++) {
        uint64_t lo_f, hi_f;
        outer_fragment_range(o->n_params, lanes, f, &lo_f, &hi_f);
        rc = lane_new(g, &lo, f, hi_f - lo_f, &g->lane[f], err);
    }
    if (!rc) rc = wan_link_start(g->lane[0], err);
    /* One region alone runs its rounds too (on its own delta): the same code path. */
    for (int f = 0; f < lanes && !rc; f++) {
        outer_lane *os = g->lane[f];
        if (pthread_create(&os->worker, NULL, outer_round_main, os) == 0) os->worker_started = 1;
        else rc = cirrus_fail(err, CIRRUS_ENOMEM, "cannot start the outer sync thread");
    }
    if (rc) {
        outer_sync_stop(g);
        return rc;
    }
    *out = g;
    return 0;
}

void outer_sync_stop(outer_sync *g)
{
    if (!g) return;
    for (int f = 0; f < g->n_lanes; f++)
        if (g->lane[f]) lane_interrupt(g->lane[f]);
    for (int f = 0; f < g->n_lanes; f++)
        if (g->lane[f] && g->lane[f]->worker_started) pthread_join(g->lane[f]->worker, NULL);
    /* The first lane's receivers may serve any lane: every lane lives until they end. */
    for (int f = 0; f < g->n_lanes; f++)
        if (g->lane[f]) wan_link_stop(g->lane[f]);
    for (int f = 0; f < g->n_lanes; f++) lane_free(g->lane[f]);
    net_pacer_free(g->pacer); /* after every connection is closed */
    free(g);
}

/* The gateway's outer step, as /status says it: the latest every fragment has completed,
 * with one digest of all fragments' states; bytes and counts summed over the lanes; the
 * codec and the links' rates as the first lane sees them (every lane sees the same links),
 * and each lane's own step, codec and window. */
_Static_assert(COORD_OUTER_FRAGMENTS >= OUTER_MAX_FRAGMENTS, "/status shows every lane");

int outer_sync_view(void *ctx, coord_outer_view *v)
{
    outer_sync *g = ctx;
    memset(v, 0, sizeof *v);
    uint64_t digests[OUTER_MAX_FRAGMENTS];
    v->step = INT64_MAX;
    for (int f = 0; f < g->n_lanes; f++) {
        outer_lane *os = g->lane[f];
        pthread_mutex_lock(&os->mu);
        v->sync_every = (uint32_t)os->o.sync_every;
        if (f == 0) {
            wan_codec_format(&os->o.codec, v->codec, sizeof v->codec);
            snprintf(v->codec_reason, sizeof v->codec_reason, "%s", os->codec_why);
        }
        v->step = os->round < v->step ? os->round : v->step;
        if (f < COORD_OUTER_FRAGMENTS) {
            v->fragments[f].step = os->round < 0 ? -1 : os->round;
            wan_codec_format(&os->o.codec, v->fragments[f].codec, sizeof v->fragments[f].codec);
            snprintf(v->fragments[f].codec_reason, sizeof v->fragments[f].codec_reason, "%s",
                     os->codec_why);
            v->fragments[f].window_s = os->window_s;
            v->fragments[f].stride = os->sched.stride;
            v->n_fragments = (uint32_t)f + 1;
        }
        if (os->sched.stride > v->stride) v->stride = os->sched.stride;
        digests[f] = os->digest;
        v->wan_sent += os->wan_sent;
        v->wan_received += os->wan_received;
        v->payload_sent += os->payload_sent;
        v->digest_mismatches += os->mismatches;
        v->wan_refused += atomic_load(&os->refused);
        v->wan_dropped += atomic_load(&os->dropped);
        if (os->last_sync_s > v->last_sync_unix_s) {
            v->last_sync_unix_s = os->last_sync_s;
            v->last_duration_s = os->last_duration_s;
        }
        uint32_t i = 0;
        for (int r = 0; r < os->o.n_regions && i < COORD_OUTER_LINKS; r++) {
            if (r == os->o.region_index) continue;
            if (f == 0) {
                snprintf(v->links[i].region, sizeof v->links[i].region, "%s", os->names[r]);
                v->links[i].up = os->peer[r].up;
                v->links[i].rate_Bps = os->peer[r].rate.Bps;
                v->links[i].last_send_s = os->peer[r].last_send_s;
            }
            /* Up when every lane's connection is; the first error any lane saw. */
            v->links[i].up &= os->peer[r].up;
            if (!v->links[i].last_error[0])
                snprintf(v->links[i].last_error, sizeof v->links[i].last_error, "%s",
                         os->peer[r].last_error);
            v->links[i].last_bytes += os->peer[r].last_bytes;
            i++;
        }
        v->n_links = i;
        pthread_mutex_unlock(&os->mu);
    }
    if (v->step < 0) v->step = -1;
    v->digest = outer_fragments_digest(digests, g->n_lanes);
    return 0;
}
