#include "lease.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../../common/log.h"
#include "../../common/rng.h"

#define LEASE_API "apis/coordination.k8s.io/v1"

/* What the accessors read (published by the elector, copied out whole by read_view). */
struct lease_view {
    int leader, resumed;
    int64_t renew_ok_ms;
    char holder[256];
    kube_lease_stats stats;
    uint64_t last_takeover; /* stats.acquired at the last acquisition not resumed */
};

struct kube_lease {
    kube_client *client;
    char *ns, *name, *identity;
    char path[512], collection[512];
    int lease_ms, renew_ms, retry_ms;
    kube_lease_config h; /* callbacks and ctx (strings point at our copies) */
    kube_ticker *ticker;
    rng_state rng;
    json_t *lease;       /* the Lease as last seen on the server (GET or our own write) */
    int64_t observed_ms; /* local time when that record was first seen */
    int leader, released, failing;
    int resumed; /* the last acquisition took over our own record (kube_lease_resumed) */
    int64_t renew_ok_ms; /* local time the last successful acquire/renew was sent */
    kube_lease_stats stats;

    /* What the accessors read, copied under mu by publish(): in kube_lease_start's mode the
     * fields above belong to the elector's thread and the caller's thread sees only this. */
    pthread_mutex_t mu;
    struct lease_view pub;
    uint64_t last_takeover;

    /* kube_lease_start's mode: the elector's own configuration and client, polled by its own
     * thread; the callbacks run from kube_lease_dispatch on the caller's thread. */
    int threaded, joined;
    kube_config *own_cfg;
    pthread_t thread;
    atomic_int stop;
    int caller_leading;       /* caller's thread only: started dispatched, stopped not yet */
    uint64_t caller_acquired; /* caller's thread only: the acquisition it was told of */
    int caller_resumed;       /* caller's thread only: nobody else led since the term before */
};

/* ---- the record ------------------------------------------------------------------------ */

static const json_t *spec_of(const json_t *lease) { return json_object_get(lease, "spec"); }

static const char *str_field(const json_t *obj, const char *key)
{
    const char *s = json_string_value(json_object_get(obj, key));
    return s ? s : "";
}

static const char *rv_of(const json_t *lease)
{
    return str_field(json_object_get(lease, "metadata"), "resourceVersion");
}

static const char *holder_of(const json_t *lease)
{
    return str_field(spec_of(lease), "holderIdentity");
}

/* MicroTime: "2006-01-02T15:04:05.000000Z". */
static void micro_time(char *buf, size_t n)
{
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    size_t k = strftime(buf, n, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(buf + k, n - k, ".%06uZ", (unsigned)(ts.tv_nsec / 1000) % 1000000u);
}

/* Remember obj (a new reference, stolen) as the Lease on the server; the local clock of a
 * record starts when it is first seen changed. */
static void observe(kube_lease *l, json_t *obj)
{
    if (!obj) return;
    if (!l->lease || strcmp(rv_of(l->lease), rv_of(obj)) ||
        !json_equal(json_object_get(l->lease, "spec"), json_object_get(obj, "spec")))
        l->observed_ms = kube_now_ms();
    json_decref(l->lease);
    l->lease = obj;
}

int64_t kube_lease_record_valid_ms(const json_t *lease, int lease_ms)
{
    json_int_t secs = json_integer_value(json_object_get(spec_of(lease), "leaseDurationSeconds"));
    int64_t rec = secs > 0 && secs < 86400 * 365 ? (int64_t)secs * 1000 : 0;
    return rec > lease_ms ? rec : lease_ms;
}

/* How long the observed record stays valid after it was first seen. */
static int64_t valid_ms(const kube_lease *l) { return kube_lease_record_valid_ms(l->lease, l->lease_ms); }

/* The Lease to write: base (the server's object, metadata and resourceVersion kept) or a new
 * one named ns/name, with the record in spec. */
static json_t *record(const char *ns, const char *name, const json_t *base, const char *holder,
                      int duration_s, const char *acquire_time, json_int_t transitions)
{
    char now[40];
    micro_time(now, sizeof now);
    json_t *obj = base ? json_deep_copy(base)
                       : json_pack("{s:s, s:s, s:{s:s, s:s}}", "apiVersion",
                                   "coordination.k8s.io/v1", "kind", "Lease", "metadata",
                                   "name", name, "namespace", ns);
    if (!obj) return NULL;
    json_t *spec = json_object_get(obj, "spec");
    if (!json_is_object(spec)) {
        spec = json_object();
        if (json_object_set_new(obj, "spec", spec)) {
            json_decref(obj);
            return NULL;
        }
    }
    if (json_object_set_new(spec, "holderIdentity", json_string(holder)) ||
        json_object_set_new(spec, "leaseDurationSeconds", json_integer(duration_s)) ||
        json_object_set_new(spec, "acquireTime", json_string(acquire_time ? acquire_time : now)) ||
        json_object_set_new(spec, "renewTime", json_string(now)) ||
        json_object_set_new(spec, "leaseTransitions", json_integer(transitions))) {
        json_decref(obj);
        return NULL;
    }
    return obj;
}

/* base's leaseTransitions as the server's int32 field can hold it: a missing, negative or
 * non-integer count is 0, and one at the int32 limit stays there (incrementing it would
 * overflow json_int_t at its limit, and the API server refuses counts past int32). */
static json_int_t transitions_of(const json_t *base)
{
    json_int_t t = json_integer_value(json_object_get(spec_of(base), "leaseTransitions"));
    return t < 0 ? 0 : t > INT32_MAX ? INT32_MAX : t;
}

json_t *kube_lease_record(const json_t *base, const char *ns, const char *name,
                          const char *identity, int lease_ms, int release)
{
    json_int_t transitions = transitions_of(base);
    if (release) return record(ns, name, base, "", 1, NULL, transitions);
    /* A renewal keeps acquireTime and leaseTransitions, a takeover sets both anew. */
    const char *acquired = json_string_value(json_object_get(spec_of(base), "acquireTime"));
    int ours = base && !strcmp(holder_of(base), identity);
    return record(ns, name, base, identity, (lease_ms + 999) / 1000, ours ? acquired : NULL,
                  ours || !base || transitions == INT32_MAX ? transitions : transitions + 1);
}

/* Our record over base (NULL: a new Lease). */
static json_t *our_record(const kube_lease *l, const json_t *base)
{
    return kube_lease_record(base, l->ns, l->name, l->identity, l->lease_ms, 0);
}

/* ---- one attempt ----------------------------------------------------------------------- */

static void request_failed(kube_lease *l, const char *what, const cirrus_error *err)
{
    if (l->failing) return; /* one line per failing streak */
    l->failing = 1;
    log_warn("kube: lease %s/%s: %s failed: %s", l->ns, l->name, what, err->msg);
}

static int put(kube_lease *l, json_t *obj)
{
    cirrus_error err = {0};
    json_t *out = NULL;
    if (!obj) return CIRRUS_ENOMEM;
    l->stats.attempts++;
    int rc = kube_update(l->client, l->path, obj, &out, &err);
    json_decref(obj);
    if (rc == 0) {
        observe(l, out);
        return 0;
    }
    json_decref(out);
    /* A conflict is news only to a leader renewing what it wrote (a candidate expects them). */
    if ((rc != CIRRUS_ECONFLICT && rc != CIRRUS_ENOENT) || l->leader)
        request_failed(l, l->leader ? "renewal" : "update", &err);
    return rc;
}

/* client-go's tryAcquireOrRenew: 1 when we hold the Lease now, 0 when someone else does (or
 * won a race), negative on errors. */
static int try_acquire_or_renew(kube_lease *l)
{
    cirrus_error err = {0};
    /* The leader writes over what it last wrote: one request per renewal while all is well. */
    if (l->leader && l->lease && put(l, our_record(l, l->lease)) == 0) return 1;

    json_t *got = NULL;
    l->stats.attempts++;
    int rc = kube_get(l->client, l->path, &got, &err);
    if (rc == CIRRUS_ENOENT) {
        json_decref(got);
        json_t *obj = our_record(l, NULL);
        json_t *out = NULL;
        if (!obj) return CIRRUS_ENOMEM;
        l->stats.attempts++;
        rc = kube_create(l->client, l->collection, obj, &out, &err);
        json_decref(obj);
        if (rc == 0) {
            observe(l, out);
            l->resumed = 0;
            return 1;
        }
        json_decref(out);
        if (rc == CIRRUS_ECONFLICT) return 0; /* created by another candidate first */
        request_failed(l, "create", &err);
        return rc;
    }
    if (rc) {
        json_decref(got);
        request_failed(l, "get", &err);
        return rc;
    }
    observe(l, got);
    const char *holder = holder_of(l->lease);
    if (*holder && strcmp(holder, l->identity) &&
        kube_now_ms() - l->observed_ms < valid_ms(l))
        return 0; /* held by another and not expired on our clock */
    /* Only this identity writes itself as holder: a record still naming us means nobody
     * else has led since we last did. */
    int own = !strcmp(holder, l->identity);
    rc = put(l, our_record(l, l->lease));
    if (rc == CIRRUS_ECONFLICT || rc == CIRRUS_ENOENT) return 0;
    if (!rc) l->resumed = own;
    return rc ? rc : 1;
}

/* ---- what the caller sees -------------------------------------------------------------- */

static void publish(kube_lease *l)
{
    pthread_mutex_lock(&l->mu);
    l->pub.leader = l->leader;
    l->pub.resumed = l->resumed;
    l->pub.renew_ok_ms = l->renew_ok_ms;
    l->pub.stats = l->stats;
    l->pub.last_takeover = l->last_takeover;
    snprintf(l->pub.holder, sizeof l->pub.holder, "%s", holder_of(l->lease));
    pthread_mutex_unlock(&l->mu);
}

static void read_view(const kube_lease *l, struct lease_view *out)
{
    pthread_mutex_t *mu = (pthread_mutex_t *)&l->mu; /* locking is no change to the elector */
    pthread_mutex_lock(mu);
    *out = l->pub;
    pthread_mutex_unlock(mu);
}

/* A transition, told to the callbacks at once when the elector runs on the caller's loop;
 * in its own thread it is only published, and kube_lease_dispatch tells the caller. */
static void notify(kube_lease *l, void (*cb)(void *))
{
    publish(l);
    if (!l->threaded && cb) cb(l->h.ctx);
}

/* ---- the ticker ------------------------------------------------------------------------ */

static int64_t jittered(kube_lease *l)
{
    return l->retry_ms + (int64_t)(KUBE_LEASE_JITTER * rng_uniform(&l->rng) * (double)l->retry_ms);
}

static void stop_leading(kube_lease *l, const char *why)
{
    l->leader = 0;
    l->stats.lost++;
    log_warn("kube: lease %s/%s: %s stopped leading: %s", l->ns, l->name, l->identity, why);
    notify(l, l->h.on_stopped_leading);
}

static void tick_once(kube_lease *l, int64_t now);

static void tick(void *ctx, int64_t now)
{
    kube_lease *l = ctx;
    tick_once(l, now);
    publish(l);
}

static void tick_once(kube_lease *l, int64_t now)
{
    char why[256];
    if (l->released) return;
    if (l->leader && now - l->renew_ok_ms >= l->renew_ms) {
        snprintf(why, sizeof why, "no renewal succeeded for %d ms", l->renew_ms);
        stop_leading(l, why);
        if (!l->released) kube_ticker_schedule(l->ticker, kube_now_ms() + jittered(l));
        return;
    }
    int rc = try_acquire_or_renew(l);
    int64_t after = kube_now_ms();
    if (rc == 1) {
        l->failing = 0;
        l->renew_ok_ms = now;
        if (!l->leader) {
            l->leader = 1;
            l->stats.acquired++;
            if (!l->resumed) l->last_takeover = l->stats.acquired;
            log_info("kube: lease %s/%s: %s acquired the lease (transitions %lld)", l->ns,
                     l->name, l->identity,
                     (long long)json_integer_value(
                         json_object_get(spec_of(l->lease), "leaseTransitions")));
            notify(l, l->h.on_started_leading);
        } else {
            l->stats.renewals++;
        }
        /* A callback may have released the lease. */
        if (!l->released) kube_ticker_schedule(l->ticker, after + l->retry_ms);
        return;
    }
    if (rc == 0) l->failing = 0;
    if (l->leader) {
        const char *holder = holder_of(l->lease);
        if (strcmp(holder, l->identity)) {
            snprintf(why, sizeof why, "the lease is held by \"%.200s\"", holder);
            stop_leading(l, why);
        } else if (after - l->renew_ok_ms >= l->renew_ms) {
            snprintf(why, sizeof why, "no renewal succeeded for %d ms", l->renew_ms);
            stop_leading(l, why);
        } else {
            int64_t next = after + l->retry_ms, deadline = l->renew_ok_ms + l->renew_ms;
            kube_ticker_schedule(l->ticker, next < deadline ? next : deadline);
            return;
        }
    }
    if (!l->released) kube_ticker_schedule(l->ticker, after + jittered(l));
}

/* ---- API ------------------------------------------------------------------------------- */

int kube_lease_new(kube_client *c, const kube_lease_config *cfg, kube_lease **out,
                   cirrus_error *err)
{
    if (!cfg->ns || !*cfg->ns || !cfg->name || !*cfg->name || !cfg->identity || !*cfg->identity)
        return cirrus_fail(err, CIRRUS_EINVAL, "lease: namespace, name and identity are required");
    int lease_ms = cfg->lease_duration_ms > 0 ? cfg->lease_duration_ms : KUBE_LEASE_DURATION_MS;
    int renew_ms = cfg->renew_deadline_ms > 0 ? cfg->renew_deadline_ms : KUBE_LEASE_RENEW_DEADLINE_MS;
    int retry_ms = cfg->retry_period_ms > 0 ? cfg->retry_period_ms : KUBE_LEASE_RETRY_PERIOD_MS;
    if (lease_ms <= renew_ms)
        return cirrus_fail(err, CIRRUS_EINVAL, "lease: lease duration %d ms must exceed renew deadline %d ms",
                           lease_ms, renew_ms);
    if ((double)renew_ms <= KUBE_LEASE_JITTER * retry_ms)
        return cirrus_fail(err, CIRRUS_EINVAL, "lease: renew deadline %d ms must exceed %.1f x retry period %d ms",
                           renew_ms, KUBE_LEASE_JITTER, retry_ms);
    kube_lease *l = calloc(1, sizeof *l);
    if (!l) return cirrus_fail(err, CIRRUS_ENOMEM, "out of memory");
    l->client = c;
    l->lease_ms = lease_ms;
    l->renew_ms = renew_ms;
    l->retry_ms = retry_ms;
    if (kube_path(l->path, sizeof l->path, LEASE_API, cfg->ns, "leases", cfg->name) ||
        kube_path(l->collection, sizeof l->collection, LEASE_API, cfg->ns, "leases", NULL)) {
        free(l);
        return cirrus_fail(err, CIRRUS_EINVAL, "lease: bad namespace or name \"%.100s/%.100s\"",
                           cfg->ns, cfg->name);
    }
    pthread_mutex_init(&l->mu, NULL);
    l->h = *cfg;
    l->ns = strdup(cfg->ns);
    l->name = strdup(cfg->name);
    l->identity = strdup(cfg->identity);
    l->ticker = kube_ticker_new(c, tick, l);
    if (!l->ns || !l->name || !l->identity || !l->ticker) {
        kube_lease_free(l);
        return cirrus_fail(err, CIRRUS_ENOMEM, "out of memory");
    }
    l->h.ns = l->ns;
    l->h.name = l->name;
    l->h.identity = l->identity;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    rng_seed(&l->rng, (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 20) ^
                          ((uint64_t)getpid() << 40) ^ (uint64_t)(uintptr_t)l);
    kube_ticker_schedule(l->ticker, kube_now_ms());
    *out = l;
    return 0;
}

/* ---- in a thread of its own ------------------------------------------------------------ */

static void *elector_main(void *arg)
{
    kube_lease *l = arg;
    /* A short wait: the stop flag is looked at between polls. */
    while (!atomic_load(&l->stop)) kube_client_poll(l->client, 100);
    return NULL;
}

int kube_lease_start(const char *kubeconfig, const kube_lease_config *cfg, kube_lease **out,
                     cirrus_error *err)
{
    kube_config *kc = NULL;
    kube_client *c = NULL;
    kube_lease *l = NULL;
    *out = NULL;
    int rc = kube_config_load(kubeconfig, &kc, err);
    if (!rc) rc = kube_client_new(kc, &c, err);
    if (!rc) rc = kube_lease_new(c, cfg, &l, err);
    if (rc) {
        kube_client_free(c);
        kube_config_free(kc);
        return rc;
    }
    /* One answer held (or refused) leaves time for another try before the renew deadline. */
    kube_client_set_timeout_ms(c, l->renew_ms / 2);
    l->own_cfg = kc;
    l->threaded = 1;
    if (pthread_create(&l->thread, NULL, elector_main, l)) {
        l->joined = 1; /* no thread to join */
        kube_lease_free(l);
        return cirrus_fail(err, CIRRUS_EIO, "lease: cannot start the elector's thread");
    }
    *out = l;
    return 0;
}

static void join(kube_lease *l)
{
    if (!l->threaded || l->joined) return;
    atomic_store(&l->stop, 1);
    pthread_join(l->thread, NULL);
    l->joined = 1;
}

void kube_lease_dispatch(kube_lease *l)
{
    if (!l->threaded) return;
    struct lease_view v;
    read_view(l, &v);
    const int leader = v.leader;
    const uint64_t acquired = v.stats.acquired, last_takeover = v.last_takeover;
    /* The term the caller was told of ended (lost, or lost and won again since). */
    if (l->caller_leading && (!leader || acquired != l->caller_acquired)) {
        l->caller_leading = 0;
        if (l->h.on_stopped_leading) l->h.on_stopped_leading(l->h.ctx);
    }
    if (!l->caller_leading && leader && acquired != l->caller_acquired) {
        /* Resumed for the caller only if every acquisition since the term it knew was one:
         * several terms may have come and gone between two dispatches. */
        l->caller_resumed = l->caller_acquired > 0 && last_takeover <= l->caller_acquired;
        l->caller_leading = 1;
        l->caller_acquired = acquired;
        if (l->h.on_started_leading) l->h.on_started_leading(l->h.ctx);
    }
}

/* ---- accessors ------------------------------------------------------------------------- */

int kube_lease_is_leader(const kube_lease *l)
{
    struct lease_view v;
    read_view(l, &v);
    int leading = v.leader && kube_now_ms() - v.renew_ok_ms < l->renew_ms;
    /* In a thread: only within the term the caller was told of (kube_lease_dispatch). */
    return l->threaded ? leading && l->caller_leading && v.stats.acquired == l->caller_acquired
                       : leading;
}

const char *kube_lease_holder(const kube_lease *l, char *buf, size_t n)
{
    struct lease_view v;
    read_view(l, &v);
    snprintf(buf, n, "%s", v.holder);
    return buf;
}

int kube_lease_resumed(const kube_lease *l)
{
    if (l->threaded) return l->caller_resumed; /* as of the last start it dispatched */
    struct lease_view v;
    read_view(l, &v);
    return v.resumed;
}

void kube_lease_get_stats(const kube_lease *l, kube_lease_stats *st)
{
    struct lease_view v;
    read_view(l, &v);
    *st = v.stats;
}

int kube_lease_release(kube_lease *l, cirrus_error *err)
{
    join(l); /* from here on the caller's thread owns every field */
    int was_leader = l->leader;
    l->released = 1;
    l->leader = 0;
    l->caller_leading = 0;
    kube_ticker_schedule(l->ticker, -1);
    publish(l);
    if (!was_leader || !l->lease) return 0;
    /* No holder, one second: the next candidate to look takes over. */
    json_t *obj = kube_lease_record(l->lease, l->ns, l->name, l->identity, l->lease_ms, 1);
    if (!obj) return cirrus_fail(err, CIRRUS_ENOMEM, "out of memory");
    json_t *out = NULL;
    l->stats.attempts++;
    int rc = kube_update(l->client, l->path, obj, &out, err);
    json_decref(obj);
    if (rc == 0) {
        observe(l, out);
        log_info("kube: lease %s/%s: %s released the lease", l->ns, l->name, l->identity);
    } else {
        json_decref(out);
    }
    publish(l);
    return rc;
}

void kube_lease_free(kube_lease *l)
{
    if (!l) return;
    join(l);
    kube_ticker_free(l->ticker);
    json_decref(l->lease);
    pthread_mutex_destroy(&l->mu);
    free(l->ns);
    free(l->name);
    free(l->identity);
    if (l->threaded) {
        kube_client_free(l->client);
        kube_config_free(l->own_cfg);
    }
    free(l);
}
