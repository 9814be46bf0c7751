/* http_status: /status (JSON, built with jansson) and /metrics (Prometheus text 0.0.4),
 * served by common/http_server. See http_status.h. */
#include "http_status.h"

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "../../../common/http_server.h"
#include "../../net/conn.h"

/* Connections are cheap here (one epoll thread, HTTP_MEMORY_LIMIT each): room for many
 * sources at 8 each (common/http_server.c) before a legitimate reader waits. */
#define HTTP_CONNECTION_LIMIT 1024
#define HTTP_CONNECTION_TIMEOUT_S 10
#define HTTP_BODY_LIMIT (64u << 20) /* a /metrics or /status body never grows past this */

struct http_status {
    http_status_snapshot_fn snapshot;
    void *ctx;
    http_server *server;
};

/* ---- /status ---- */

/* Ownership as in jansson's *_set_new: v is stolen; a NULL v (failed allocation) marks
 * the document bad instead of silently leaving a field out. */
static void put(json_t *o, const char *key, json_t *v, int *bad)
{
    if (!v || json_object_set_new(o, key, v)) *bad = 1;
}

static void append(json_t *a, json_t *v, int *bad)
{
    if (!v || json_array_append_new(a, v)) *bad = 1;
}

/* JSON has no NaN or infinity: those become null. */
static json_t *real_or_null(double v)
{
    return isfinite(v) ? json_real(v) : json_null();
}

static json_t *count(uint64_t v)
{
    return json_integer(v > INT64_MAX ? INT64_MAX : (json_int_t)v);
}

static json_t *member_json(const coord_member_view *m, int *bad)
{
    json_t *o = json_object();
    if (!o) {
        *bad = 1;
        return NULL;
    }
    const coord_peer_info *pi = &m->info;
    int stage = m->role == COORD_ROLE_STAGE;
    put(o, "id", count(pi->id), bad);
    put(o, "name", json_string(pi->name), bad);
    put(o, "role", json_string(stage ? "stage" : "client"), bad);
    if (stage) {
        char addr[COORD_HOST_MAX + 16];
        /* An IPv6 literal needs brackets before the port. */
        snprintf(addr, sizeof addr, strchr(pi->host, ':') ? "[%s]:%u" : "%s:%u", pi->host,
                 pi->port);
        put(o, "stage", count(pi->stage), bad);
        put(o, "layers", json_pack("[II]", (json_int_t)pi->l0, (json_int_t)pi->l1), bad);
        put(o, "addr", json_string(addr), bad);
        put(o, "throughput", real_or_null(pi->throughput), bad);
        put(o, "capacity", real_or_null(m->capacity), bad);
        put(o, "moving_to", m->moving_to == COORD_NO_INSTRUCTION ? json_null()
                                                                 : count(m->moving_to), bad);
    }
    put(o, "samples", count(m->stats.samples), bad);
    put(o, "step", count(m->stats.step), bad);
    put(o, "loss", real_or_null(m->stats.loss), bad);
    put(o, "tokens_per_s", real_or_null(m->stats.tokens_per_s), bad);
    put(o, "fwd_throughput", real_or_null(m->stats.fwd_throughput), bad);
    put(o, "bwd_throughput", real_or_null(m->stats.bwd_throughput), bad);
    put(o, "last_seen_s", real_or_null(m->last_seen_s), bad);
    return o;
}

/* A new object and the array it will hold; NULL (and *bad set) when either fails. */
static json_t *object_and_array(json_t **array, int *bad)
{
    json_t *o = json_object();
    *array = json_array();
    if (o && *array) return o;
    json_decref(o);
    json_decref(*array);
    *bad = 1;
    return NULL;
}

/* {"period_s", "moves", "withdrawn", "recent": [{peer, from, to, min_before, min_after,
 * period, at_s}, ...]}: the rebalancer's work, the latest moves oldest first. */
static json_t *rebalance_json(const coord_snapshot *s, int *bad)
{
    json_t *recent, *o = object_and_array(&recent, bad);
    if (!o) return NULL;
    put(o, "period_s", real_or_null(s->rebalance_period_s), bad);
    put(o, "moves", count(s->moves), bad);
    put(o, "withdrawn", count(s->withdrawn), bad);
    for (size_t i = 0; i < s->n_recent; i++) {
        const coord_move *m = &s->recent[i];
        append(recent, json_pack("{s:I,s:I,s:I,s:o,s:o,s:I,s:o}", "peer", (json_int_t)m->peer_id,
                                 "from", (json_int_t)m->from_stage, "to",
                                 (json_int_t)m->to_stage, "min_before",
                                 real_or_null(m->min_before), "min_after",
                                 real_or_null(m->min_after), "period", (json_int_t)m->period,
                                 "at_s", real_or_null(m->at_s)),
               bad);
    }
    put(o, "recent", recent, bad);
    return o;
}

/* {"step", "digest", "wan_bytes_sent", ..., "links": [{region, up, last_error}]}: the
 * gateway's outer sync across regions. */
static json_t *outer_json(const coord_outer_view *v, int *bad)
{
    json_t *links, *o = object_and_array(&links, bad);
    if (!o) return NULL;
    char digest[17];
    snprintf(digest, sizeof digest, "%016llx", (unsigned long long)v->digest);
    put(o, "step", json_integer(v->step), bad);
    put(o, "digest", json_string(digest), bad);
    put(o, "wan_bytes_sent", count(v->wan_sent), bad);
    put(o, "wan_bytes_received", count(v->wan_received), bad);
    put(o, "payload_bytes_sent", count(v->payload_sent), bad);
    put(o, "digest_mismatches", count(v->digest_mismatches), bad);
    put(o, "wan_connections_refused", count(v->wan_refused), bad);
    put(o, "wan_connections_dropped", count(v->wan_dropped), bad);
    put(o, "last_sync_unix_s", v->last_sync_unix_s > 0 ? json_real(v->last_sync_unix_s) : json_null(),
        bad);
    put(o, "last_sync_duration_s",
        v->last_sync_unix_s > 0 ? real_or_null(v->last_duration_s) : json_null(), bad);
    put(o, "codec", json_string(v->codec), bad);
    put(o, "codec_reason", json_string(v->codec_reason), bad);
    put(o, "sync_every", count(v->sync_every), bad);
    put(o, "stride", count(v->stride), bad);
    json_t *frags = json_array();
    for (uint32_t f = 0; frags && f < v->n_fragments && f < COORD_OUTER_FRAGMENTS; f++)
        append(frags, json_pack("{s:I,s:I,s:s,s:s,s:o,s:I}", "fragment", (json_int_t)f, "step",
                                (json_int_t)v->fragments[f].step, "codec",
                                v->fragments[f].codec, "codec_reason",
                                v->fragments[f].codec_reason, "window_s",
                                v->fragments[f].window_s > 0 ? json_real(v->fragments[f].window_s)
                                                             : json_null(),
                                "stride", (json_int_t)v->fragments[f].stride),
               bad);
    put(o, "fragments", frags, bad);
    for (uint32_t i = 0; i < v->n_links && i < COORD_OUTER_LINKS; i++)
        append(links, json_pack("{s:s,s:b,s:s,s:f,s:I,s:f}", "region", v->links[i].region, "up",
                                v->links[i].up, "last_error", v->links[i].last_error,
                                "rate_mbit_s", v->links[i].rate_Bps * 8e-6, "last_message_bytes",
                                (json_int_t)v->links[i].last_bytes, "last_message_s",
                                v->links[i].last_send_s),
               bad);
    put(o, "links", links, bad);
    return o;
}

char *http_status_json(const coord_snapshot *s)
{
    int bad = 0;
    json_t *o = json_object(), *stages = json_array(), *members = json_array();
    char *out = NULL;
    if (!o || !stages || !members) goto out;
    put(o, "job_id", json_string(s->job_id), &bad);
    put(o, "epoch", count(s->epoch), &bad);
    put(o, "uptime_s", real_or_null(s->uptime_s), &bad);
    put(o, "step", count(s->step), &bad);
    put(o, "loss", real_or_null(s->loss), &bad);
    put(o, "tokens_per_s", real_or_null(s->tokens_per_s), &bad);
    put(o, "n_stages", count(s->n_stages), &bad);
    for (uint32_t i = 0; i < s->n_stages; i++) {
        json_t *st = json_object();
        if (st) {
            put(st, "stage", count(i), &bad);
            put(st, "peers", count(s->stage_peers[i]), &bad);
            put(st, "throughput", real_or_null(s->stage_throughput[i]), &bad);
            put(st, "capacity", real_or_null(s->stage_capacity[i]), &bad);
        }
        append(stages, st, &bad);
    }
    put(o, "stages", json_incref(stages), &bad);
    put(o, "clients", count(s->n_clients), &bad);
    put(o, "microbatches_retried", count(s->mb_retried), &bad);
    put(o, "microbatches_lost", count(s->mb_lost), &bad);
    put(o, "peer_expirations", count(s->expirations), &bad);
    put(o, "registrations", count(s->registrations), &bad);
    put(o, "rebalance", rebalance_json(s, &bad), &bad);
    for (size_t i = 0; i < s->n_members; i++)
        append(members, member_json(&s->members[i], &bad), &bad);
    put(o, "members", json_incref(members), &bad);
    if (s->has_outer) put(o, "outer", outer_json(&s->outer, &bad), &bad);
    if (!bad) out = json_dumps(o, JSON_INDENT(2));
out:
    json_decref(o);
    json_decref(stages);
    json_decref(members);
    return out;
}

/* ---- /metrics ---- */

/* A growable text buffer with a hard cap; the first failure latches. */
typedef struct text {
    char *p;
    size_t len, cap;
    int failed;
} text;

static void tprintf(text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void tprintf(text *t, const char *fmt, ...)
{
    for (int tries = 0; !t->failed && tries < 2; tries++) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(t->p ? t->p + t->len : NULL, t->p ? t->cap - t->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0) break;
        if (t->p && (size_t)n < t->cap - t->len) {
            t->len += (size_t)n;
            return;
        }
        size_t want = t->len + (size_t)n + 1, cap = t->cap ? t->cap : 4096;
        while (cap < want) cap *= 2;
        if (cap > HTTP_BODY_LIMIT) break;
        char *q = realloc(t->p, cap);
        if (!q) break;
        t->p = q;
        t->cap = cap;
    }
    t->failed = 1;
}

/* A sample value: the shortest of %.15g / %.17g that reads back exactly; NaN and the
 * infinities as the exposition format spells them. */
static const char *value(char buf[32], double v)
{
    if (isnan(v)) return "NaN";
    if (isinf(v)) return v > 0 ? "+Inf" : "-Inf";
    snprintf(buf, 32, "%.15g", v);
    if (strtod(buf, NULL) != v) snprintf(buf, 32, "%.17g", v);
    return buf;
}

static void family(text *t, const char *name, const char *type, const char *help)
{
    tprintf(t, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* The outer sync's series (region names are [A-Za-z0-9._-]: no label escaping needed). */
static void outer_metrics(text *t, const coord_outer_view *v)
{
    char b[32];
    family(t, "cirrus_outer_step", "gauge",
           "Latest outer step across regions (-1 before the global parameters).");
    tprintf(t, "cirrus_outer_step %lld\n", (long long)v->step);
    family(t, "cirrus_outer_sync_stride", "gauge",
           "Outer syncs are this many times --sync-every inner steps apart now (the widest "
           "fragment; above 1 when even the sparsest codec does not fit the window).");
    tprintf(t, "cirrus_outer_sync_stride %u\n", v->stride);
    family(t, "cirrus_wan_bytes_sent_total", "counter",
           "Bytes sent on the WAN connections to other regions' gateways, TLS included.");
    tprintf(t, "cirrus_wan_bytes_sent_total %llu\n", (unsigned long long)v->wan_sent);
    family(t, "cirrus_wan_bytes_received_total", "counter",
           "Bytes received on the WAN connections from other regions' gateways, TLS included.");
    tprintf(t, "cirrus_wan_bytes_received_total %llu\n", (unsigned long long)v->wan_received);
    family(t, "cirrus_outer_payload_bytes_sent_total", "counter",
           "Encoded pseudo-gradient bytes sent to other regions.");
    tprintf(t, "cirrus_outer_payload_bytes_sent_total %llu\n",
            (unsigned long long)v->payload_sent);
    family(t, "cirrus_outer_digest_mismatches_total", "counter",
           "Outer steps in which another region's global state differed from this one's.");
    tprintf(t, "cirrus_outer_digest_mismatches_total %llu\n",
            (unsigned long long)v->digest_mismatches);
    family(t, "cirrus_wan_connections_refused_total", "counter",
           "WAN connections refused at accept or in their TLS/JOIN handshake.");
    tprintf(t, "cirrus_wan_connections_refused_total %llu\n", (unsigned long long)v->wan_refused);
    family(t, "cirrus_wan_connections_dropped_total", "counter",
           "WAN connections of a joined region dropped for a bad frame.");
    tprintf(t, "cirrus_wan_connections_dropped_total %llu\n", (unsigned long long)v->wan_dropped);
    family(t, "cirrus_outer_last_sync_timestamp_seconds", "gauge",
           "When the last outer step completed (Unix time; 0: never).");
    tprintf(t, "cirrus_outer_last_sync_timestamp_seconds %s\n", value(b, v->last_sync_unix_s));
    family(t, "cirrus_outer_last_sync_duration_seconds", "gauge",
           "Seconds from the region's parameters to the new global ones, last outer step.");
    tprintf(t, "cirrus_outer_last_sync_duration_seconds %s\n", value(b, v->last_duration_s));
    family(t, "cirrus_wan_link_up", "gauge", "Whether the link to another region is up.");
    for (uint32_t i = 0; i < v->n_links && i < COORD_OUTER_LINKS; i++)
        tprintf(t, "cirrus_wan_link_up{region=\"%s\"} %d\n", v->links[i].region,
                v->links[i].up);
    family(t, "cirrus_wan_link_rate_bytes_per_second", "gauge",
           "What sending the outer messages to another region carried (moving average).");
    for (uint32_t i = 0; i < v->n_links && i < COORD_OUTER_LINKS; i++)
        tprintf(t, "cirrus_wan_link_rate_bytes_per_second{region=\"%s\"} %s\n",
                v->links[i].region, value(b, v->links[i].rate_Bps));
}

char *http_status_metrics(const coord_snapshot *s)
{
    text t = {0};
    char b[32];
    family(&t, "cirrus_coordinator_epoch", "gauge",
           "Epoch of this coordinator instance; changes when it restarts.");
    tprintf(&t, "cirrus_coordinator_epoch %llu\n", (unsigned long long)s->epoch);
    family(&t, "cirrus_uptime_seconds", "gauge", "Seconds since the coordinator started.");
    tprintf(&t, "cirrus_uptime_seconds %s\n", value(b, s->uptime_s));
    family(&t, "cirrus_stages", "gauge", "Pipeline stages of the job.");
    tprintf(&t, "cirrus_stages %u\n", s->n_stages);
    family(&t, "cirrus_peers", "gauge", "Live stage peers per stage.");
    for (uint32_t i = 0; i < s->n_stages; i++)
        tprintf(&t, "cirrus_peers{stage=\"%u\"} %u\n", i, s->stage_peers[i]);
    family(&t, "cirrus_stage_throughput_samples_per_second", "gauge",
           "Sum of the live peers' throughput per stage, in samples per second.");
    for (uint32_t i = 0; i < s->n_stages; i++)
        tprintf(&t, "cirrus_stage_throughput_samples_per_second{stage=\"%u\"} %s\n", i,
                value(b, s->stage_throughput[i]));
    family(&t, "cirrus_stage_capacity", "gauge",
           "Sum of the live peers' capacity per stage, in forward units per busy second.");
    for (uint32_t i = 0; i < s->n_stages; i++)
        tprintf(&t, "cirrus_stage_capacity{stage=\"%u\"} %s\n", i,
                value(b, s->stage_capacity[i]));
    family(&t, "cirrus_clients", "gauge", "Live pipeline clients.");
    tprintf(&t, "cirrus_clients %zu\n", s->n_clients);
    family(&t, "cirrus_step", "gauge", "Highest training step reported.");
    tprintf(&t, "cirrus_step %llu\n", (unsigned long long)s->step);
    family(&t, "cirrus_loss", "gauge", "Latest training loss reported (NaN before any).");
    tprintf(&t, "cirrus_loss %s\n", value(b, s->loss));
    family(&t, "cirrus_tokens_per_second", "gauge", "Sum of the live clients' tokens per second.");
    tprintf(&t, "cirrus_tokens_per_second %s\n", value(b, s->tokens_per_s));
    family(&t, "cirrus_microbatches_retried_total", "counter",
           "Microbatches the clients sent again after a peer failed or timed out.");
    tprintf(&t, "cirrus_microbatches_retried_total %llu\n", (unsigned long long)s->mb_retried);
    family(&t, "cirrus_microbatches_lost_total", "counter",
           "Microbatches the clients gave up on.");
    tprintf(&t, "cirrus_microbatches_lost_total %llu\n", (unsigned long long)s->mb_lost);
    family(&t, "cirrus_peer_expirations_total", "counter",
           "Members dropped for missing their heartbeats.");
    tprintf(&t, "cirrus_peer_expirations_total %llu\n", (unsigned long long)s->expirations);
    family(&t, "cirrus_registrations_total", "counter",
           "Registrations, re-registrations included.");
    tprintf(&t, "cirrus_registrations_total %llu\n", (unsigned long long)s->registrations);
    family(&t, "cirrus_rebalance_moves_total", "counter",
           "Stage peers the rebalancer told to move to another stage.");
    tprintf(&t, "cirrus_rebalance_moves_total %llu\n", (unsigned long long)s->moves);
    family(&t, "cirrus_rebalance_withdrawn_total", "counter",
           "Move instructions withdrawn because the peer did not move in time.");
    tprintf(&t, "cirrus_rebalance_withdrawn_total %llu\n", (unsigned long long)s->withdrawn);
    if (s->has_outer) outer_metrics(&t, &s->outer);
    if (t.failed) {
        free(t.p);
        return NULL;
    }
    return t.p;
}

/* ---- the server ---- */

static void render(http_status *h, http_reply *r, int json)
{
    coord_snapshot s;
    if (h->snapshot(h->ctx, &s)) {
        r->status = 500; /* the body stays NULL: "out of memory" */
        return;
    }
    r->body = json ? http_status_json(&s) : http_status_metrics(&s);
    r->content_type = json ? HTTP_JSON_TYPE : HTTP_PROMETHEUS_TYPE;
    coord_snapshot_free(&s);
}

static void on_status(void *ctx, http_reply *r) { render(ctx, r, 1); }
static void on_metrics(void *ctx, http_reply *r) { render(ctx, r, 0); }

static const http_route routes[] = {{"/status", on_status}, {"/metrics", on_metrics}};

int http_status_start(const char *host, int port, http_status_snapshot_fn snapshot, void *ctx,
                      http_status **out, int *bound_port, cirrus_error *err)
{
    *out = NULL;
    http_status *h = calloc(1, sizeof *h);
    if (!h) return cirrus_fail(err, CIRRUS_ENOMEM, "out of memory for the HTTP server");
    h->snapshot = snapshot;
    h->ctx = ctx;
    /* Bind with net_listen (host resolution, SO_REUSEADDR, port 0) and hand the socket to
     * the server, which closes it when it stops. */
    int fd = -1, p = 0, rc = net_listen(host, port, &fd, &p, err);
    if (rc) {
        free(h);
        return rc;
    }
    http_server_options o = {.routes = routes, .n_routes = sizeof routes / sizeof *routes,
                             .ctx = h, .listen_fd = fd, .port = p,
                             .connection_limit = HTTP_CONNECTION_LIMIT,
                             .timeout_s = HTTP_CONNECTION_TIMEOUT_S};
    if ((rc = http_server_start(&o, &h->server, NULL, err))) {
        free(h);
        return rc;
    }
    if (bound_port) *bound_port = p;
    *out = h;
    return 0;
}

void http_status_stop(http_status *h)
{
    if (!h) return;
    http_server_stop(h->server);
    free(h);
}
