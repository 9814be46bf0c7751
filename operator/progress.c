/* progress: see progress.h. */
#include "progress.h"

#include <arpa/inet.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <curl/curl.h>
#include <jansson.h>

#include "../common/clock.h"
#include "../common/log.h"
#include "kube/buf.h"

#define USER_AGENT "cirrus-operator/0.1"
#define POLL_MS 100 /* how soon a transfer in flight notices progress_free */

/* ---- parsing ------------------------------------------------------------------------------ */

/* A finite number >= 0, or null (NAN). 0, or CIRRUS_ECORRUPT naming the field. */
static int nonneg_or_null(const json_t *o, const char *field, double *out, cirrus_error *err)
{
    const json_t *v = json_object_get(o, field);
    if (!v) return cirrus_fail(err, CIRRUS_ECORRUPT, "/status has no %s", field);
    if (json_is_null(v)) {
        *out = NAN;
        return 0;
    }
    if (!json_is_number(v))
        return cirrus_fail(err, CIRRUS_ECORRUPT, "/status %s is not a number", field);
    double d = json_number_value(v);
    if (!isfinite(d) || d < 0)
        return cirrus_fail(err, CIRRUS_ECORRUPT, "/status %s is %g: not a finite number >= 0",
                           field, d);
    *out = d;
    return 0;
}

/* An integer member of o in [lo, INT64_MAX]: 1 and *out, or 0. */
static int int_at_least(const json_t *o, const char *field, int64_t lo, int64_t *out)
{
    const json_t *v = json_object_get(o, field);
    if (!json_is_integer(v) || json_integer_value(v) < lo) return 0;
    *out = (int64_t)json_integer_value(v);
    return 1;
}

/* The optional "outer" object into r: has_outer 1 when it is there and valid; absent (or
 * null) leaves has_outer 0; anything malformed leaves it 0 too, with outer_ignored saying
 * why (a static string). */
static void parse_outer(const json_t *o, progress_result *r)
{
    const json_t *v = json_object_get(o, "outer");
    int64_t step = 0, sent = 0, received = 0;
    if (!v || json_is_null(v)) return;
    if (!json_is_object(v))
        r->outer_ignored = "outer is not an object";
    else if (!int_at_least(v, "step", -1, &step))
        r->outer_ignored = "outer.step is not an integer >= -1";
    else if (!int_at_least(v, "wan_bytes_sent", 0, &sent))
        r->outer_ignored = "outer.wan_bytes_sent is not an integer >= 0";
    else if (!int_at_least(v, "wan_bytes_received", 0, &received))
        r->outer_ignored = "outer.wan_bytes_received is not an integer >= 0";
    else if (sent > INT64_MAX - received)
        r->outer_ignored = "outer.wan_bytes_sent + wan_bytes_received overflows";
    if (r->outer_ignored) return;
    r->has_outer = 1;
    r->outer.step = step;
    r->outer.wan_bytes = sent + received;
}

/* The optional "stages" array into r (progress.h): has_stages 1 when it is there and valid. */
static void parse_stages(const json_t *o, progress_result *r)
{
    const json_t *v = json_object_get(o, "stages");
    if (!v || json_is_null(v)) return;
    if (!json_is_array(v) || json_array_size(v) > PROGRESS_MAX_STAGES) {
        r->stages_ignored = "stages is not an array of at most 64 stages";
        return;
    }
    int counts[PROGRESS_MAX_STAGES];
    for (size_t i = 0; i < json_array_size(v); i++) {
        const json_t *st = json_array_get(v, i);
        int64_t index = -1, peers = -1;
        if (!json_is_object(st) || !int_at_least(st, "stage", 0, &index) || index != (int64_t)i ||
            !int_at_least(st, "peers", 0, &peers) || peers > INT_MAX) {
            r->stages_ignored = "stages[] is not {stage: its index, peers: an integer >= 0}";
            return;
        }
        counts[i] = (int)peers;
    }
    r->has_stages = 1;
    r->n_stages = (int)json_array_size(v);
    memcpy(r->stage_peers, counts, (size_t)r->n_stages * sizeof counts[0]);
}

int progress_parse_status(const char *body, size_t len, const char *job_id, progress_result *out,
                          cirrus_error *err)
{
    if (!body || !len) return cirrus_fail(err, CIRRUS_ECORRUPT, "/status is empty");
    json_error_t je;
    json_t *o = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
    if (!o) return cirrus_fail(err, CIRRUS_ECORRUPT, "/status is not JSON: %s", je.text);
    int rc = 0;
    progress_result r = {.loss = NAN, .tokens_per_s = NAN};
    const char *job = json_string_value(json_object_get(o, "job_id"));
    const json_t *step = json_object_get(o, "step");
    if (!json_is_object(o))
        rc = cirrus_fail(err, CIRRUS_ECORRUPT, "/status is not a JSON object");
    else if (!job)
        rc = cirrus_fail(err, CIRRUS_ECORRUPT, "/status has no job_id string");
    else if (!job_id || strcmp(job, job_id))
        rc = cirrus_fail(err, CIRRUS_EMISMATCH, "/status is job %.64s's, not %.64s's", job,
                         job_id ? job_id : "(none)");
    else if (!json_is_integer(step))
        rc = cirrus_fail(err, CIRRUS_ECORRUPT, "/status has no integer step");
    else if (json_integer_value(step) < 0)
        rc = cirrus_fail(err, CIRRUS_ECORRUPT, "/status step %lld is negative",
                         (long long)json_integer_value(step));
    if (!rc) {
        r.step = (int64_t)json_integer_value(step);
        rc = nonneg_or_null(o, "loss", &r.loss, err);
    }
    if (!rc) rc = nonneg_or_null(o, "tokens_per_s", &r.tokens_per_s, err);
    if (!rc) parse_outer(o, &r);
    if (!rc) parse_stages(o, &r);
    json_decref(o);
    if (!rc) *out = r;
    return rc;
}

/* ---- --resolve ---------------------------------------------------------------------------- */

static int check_entry(const char *e, size_t n, cirrus_error *err)
{
    char buf[512];
    if (n == 0 || n >= sizeof buf)
        return cirrus_fail(err, CIRRUS_EINVAL, "--resolve: bad entry '%.*s'",
                           (int)(n < 200 ? n : 200), e);
    memcpy(buf, e, n);
    buf[n] = '\0';
    char *c1 = strchr(buf, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
    if (!c1 || !c2 || c1 == buf || strpbrk(buf, " \t\r\n/") ||
        memchr(buf, '[', (size_t)(c1 - buf)))
        return cirrus_fail(err, CIRRUS_EINVAL, "--resolve: '%s' is not HOST:PORT:ADDRESS", buf);
    *c1 = *c2 = '\0';
    char *end = NULL;
    long port = strtol(c1 + 1, &end, 10);
    if (!c1[1] || *end || port < 1 || port > 65535)
        return cirrus_fail(err, CIRRUS_EINVAL, "--resolve: port '%s' of %s is not 1..65535",
                           c1 + 1, buf);
    char *addr = c2 + 1;
    size_t al = strlen(addr);
    unsigned char tmp[16];
    if (al > 2 && addr[0] == '[' && addr[al - 1] == ']') {
        addr[al - 1] = '\0';
        if (inet_pton(AF_INET6, addr + 1, tmp) == 1) return 0;
    } else if (inet_pton(AF_INET, addr, tmp) == 1 || inet_pton(AF_INET6, addr, tmp) == 1) {
        return 0;
    }
    return cirrus_fail(err, CIRRUS_EINVAL,
                       "--resolve: '%s' (for %s) is not an IPv4 or IPv6 address", c2 + 1, buf);
}

int progress_check_resolve(const char *value, cirrus_error *err)
{
    if (!value || !*value) return cirrus_fail(err, CIRRUS_EINVAL, "--resolve: empty value");
    for (const char *p = value;;) {
        const char *comma = strchr(p, ',');
        size_t n = comma ? (size_t)(comma - p) : strlen(p);
        int rc = check_entry(p, n, err);
        if (rc) return rc;
        if (!comma) return 0;
        p = comma + 1;
    }
}

/* Append value's entries to *list. */
static int add_resolve(struct curl_slist **list, const char *value, cirrus_error *err)
{
    int rc = progress_check_resolve(value, err);
    for (const char *p = value; !rc;) {
        const char *comma = strchr(p, ',');
        size_t n = comma ? (size_t)(comma - p) : strlen(p);
        char buf[512];
        memcpy(buf, p, n);
        buf[n] = '\0';
        struct curl_slist *l = curl_slist_append(*list, buf);
        if (!l) return cirrus_fail(err, CIRRUS_ENOMEM, "out of memory");
        *list = l;
        if (!comma) break;
        p = comma + 1;
    }
    return rc;
}

/* ---- the worker ------------------------------------------------------------------------------ */

typedef struct target {
    char key[PROGRESS_KEY_MAX];
    char uid[PROGRESS_UID_MAX];
    char region[PROGRESS_REGION_MAX];
    char url[PROGRESS_URL_MAX];
    int64_t due_ms;   /* next read */
    int64_t watched_s; /* registered at: Unix seconds */
    int has;          /* res is valid */
    progress_result res;
    int dirty;        /* news since the last progress_drain: an answer, a new way to fail */
    int failing;      /* 0, or the op_scrape kind its reads fail with (logged once a kind) */
} target;

struct progress {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int stop;        /* under mu; read atomically by transfers in flight */
    int period_s;
    int started;     /* the worker thread runs */
    int curl_inited;
    pthread_t thread;
    target *t;
    size_t n, cap;
    struct curl_slist *resolve;
    op_metrics *metrics;
    progress_stats stats;
};

/* One read of one gateway, copied out of the target list so that the list may change
 * while it runs. */
typedef struct scrape {
    char key[PROGRESS_KEY_MAX], uid[PROGRESS_UID_MAX], region[PROGRESS_REGION_MAX];
    char url[PROGRESS_URL_MAX];
    CURL *easy;
    kube_buf body;
    int overflow;
    CURLcode result;
    long http;
    int64_t done_s; /* when it finished: Unix seconds */
    char errbuf[CURL_ERROR_SIZE];
    /* the outcome */
    int rc;
    progress_result res;
    cirrus_error err;
} scrape;

static int64_t now_ms(void) { return clock_now_ms(); }

static int stopping(progress *p) { return __atomic_load_n(&p->stop, __ATOMIC_ACQUIRE); }

static size_t on_write(char *data, size_t size, size_t n, void *ud)
{
    scrape *s = ud;
    if (kube_buf_append(&s->body, data, size * n)) {
        s->overflow = 1;
        return 0; /* CURLE_WRITE_ERROR */
    }
    return size * n;
}

static int scrape_start(progress *p, CURLM *multi, scrape *s)
{
    CURL *e = curl_easy_init();
    if (!e) return CIRRUS_ENOMEM;
    curl_easy_setopt(e, CURLOPT_URL, s->url);
    curl_easy_setopt(e, CURLOPT_PRIVATE, (char *)s);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_ERRORBUFFER, s->errbuf);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_write);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, s);
    curl_easy_setopt(e, CURLOPT_USERAGENT, USER_AGENT);
    curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, PROGRESS_CONNECT_TIMEOUT_MS);
    curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, PROGRESS_TIMEOUT_MS);
    /* In-cluster traffic: never through a proxy named in the environment. */
    curl_easy_setopt(e, CURLOPT_PROXY, "");
    curl_easy_setopt(e, CURLOPT_FOLLOWLOCATION, 0L);
    if (p->resolve) curl_easy_setopt(e, CURLOPT_RESOLVE, p->resolve);
    if (curl_multi_add_handle(multi, e) != CURLM_OK) {
        curl_easy_cleanup(e);
        return CIRRUS_ENOMEM;
    }
    s->easy = e;
    return 0;
}

/* Judge a finished read (no lock held). */
static void scrape_judge(scrape *s)
{
    if (s->result != CURLE_OK) {
        s->rc = cirrus_fail(&s->err, CIRRUS_EIO, "%s",
                            s->overflow ? "/status larger than 4 MiB"
                            : s->errbuf[0] ? s->errbuf
                                           : curl_easy_strerror(s->result));
    } else if (s->http != 200) {
        s->rc = cirrus_fail(&s->err, CIRRUS_EIO, "HTTP %ld", s->http);
    } else {
        s->rc = progress_parse_status(s->body.data, s->body.len, s->uid, &s->res, &s->err);
    }
}

/* Read every scrape, at most PROGRESS_PARALLEL at once. */
static void scrape_all(progress *p, CURLM *multi, scrape *s, size_t n)
{
    size_t next = 0;
    int running = 0;
    for (;;) {
        while (running < PROGRESS_PARALLEL && next < n && !stopping(p)) {
            scrape *x = &s[next++];
            if (scrape_start(p, multi, x)) {
                x->rc = cirrus_fail(&x->err, CIRRUS_ENOMEM, "out of memory");
                continue;
            }
            running++;
        }
        if (!running || stopping(p)) break;
        int still = 0;
        curl_multi_perform(multi, &still);
        CURLMsg *m;
        int left;
        while ((m = curl_multi_info_read(multi, &left))) {
            if (m->msg != CURLMSG_DONE) continue;
            scrape *x = NULL;
            CURL *e = m->easy_handle;
            CURLcode res = m->data.result; /* m is invalid once the handle is removed */
            curl_easy_getinfo(e, CURLINFO_PRIVATE, (char **)&x);
            x->result = res;
            curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &x->http);
            x->done_s = (int64_t)time(NULL);
            curl_multi_remove_handle(multi, e);
            curl_easy_cleanup(e);
            x->easy = NULL;
            running--;
            scrape_judge(x);
        }
        if (running) curl_multi_poll(multi, NULL, 0, POLL_MS, NULL);
    }
    for (size_t i = 0; i < n; i++) { /* abandoned on shutdown */
        if (!s[i].easy) continue;
        curl_multi_remove_handle(multi, s[i].easy);
        curl_easy_cleanup(s[i].easy);
        s[i].easy = NULL;
        s[i].rc = cirrus_fail(&s[i].err, CIRRUS_ECLOSED, "stopping");
    }
}

static target *find(progress *p, const char *key, const char *uid, const char *region,
                    const char *url)
{
    for (size_t i = 0; i < p->n; i++) {
        target *t = &p->t[i];
        if (!strcmp(t->key, key) && !strcmp(t->uid, uid) && !strcmp(t->region, region) &&
            (!url || !strcmp(t->url, url)))
            return t;
    }
    return NULL;
}

/* Fold finished reads into the targets they were made for (under mu). */
static void publish(progress *p, scrape *s, size_t n)
{
    p->stats.rounds++;
    for (size_t i = 0; i < n; i++) {
        scrape *x = &s[i];
        if (x->rc == CIRRUS_ECLOSED) continue; /* shutting down */
        enum op_scrape kind = x->rc == 0                  ? OP_SCRAPE_OK
                              : x->rc == CIRRUS_EMISMATCH ? OP_SCRAPE_WRONG_JOB
                              : x->rc == CIRRUS_ECORRUPT  ? OP_SCRAPE_INVALID
                                                          : OP_SCRAPE_ERROR;
        switch (kind) {
        case OP_SCRAPE_OK: p->stats.ok++; break;
        case OP_SCRAPE_WRONG_JOB: p->stats.wrong_job++; break;
        case OP_SCRAPE_INVALID: p->stats.invalid++; break;
        default: p->stats.errors++; break;
        }
        op_metrics_scrape(p->metrics, kind);
        target *t = find(p, x->key, x->uid, x->region, x->url);
        if (!t) continue; /* forgotten meanwhile */
        if (x->rc) {
            /* A gateway that starts failing, or fails in another way, is news too: the
             * ProgressCurrent condition says how it fails. The same failure again is not. */
            if (t->failing != (int)kind) {
                log_warn("progress: %s region %s: %s: %s%s", t->key, t->region, t->url,
                         x->err.msg,
                         kind == OP_SCRAPE_WRONG_JOB ? " (a stale or wrong endpoint): ignored"
                                                     : "; the status keeps the last figures");
                t->dirty = 1;
            }
            t->failing = (int)kind;
            continue;
        }
        if (t->failing)
            log_info("progress: %s region %s: %s answers again (step %lld)", t->key, t->region,
                     t->url, (long long)x->res.step);
        t->failing = 0;
        /* An outer object not trusted is logged when that starts (or its reason changes);
         * the rest of the answer counts. */
        if (x->res.outer_ignored && x->res.outer_ignored != t->res.outer_ignored)
            log_warn("progress: %s region %s: %s: %s: its outer figures are ignored", t->key,
                     t->region, t->url, x->res.outer_ignored);
        /* New figures or not, the answer is news: its time is the status's progressTime,
         * which tells the user the gateway still answers (at most a write per period). */
        t->res = x->res;
        t->res.read_s = x->done_s;
        t->has = 1;
        t->dirty = 1;
    }
}

static void *worker(void *arg)
{
    progress *p = arg;
    CURLM *multi = curl_multi_init();
    if (!multi) {
        log_error("progress: curl_multi_init failed: gateways' /status not read");
        return NULL;
    }
    pthread_mutex_lock(&p->mu);
    while (!p->stop) {
        int64_t now = now_ms(), next = -1;
        size_t due = 0;
        for (size_t i = 0; i < p->n; i++) {
            if (p->t[i].due_ms <= now)
                due++;
            else if (next < 0 || p->t[i].due_ms < next)
                next = p->t[i].due_ms;
        }
        /* PROGRESS_PARALLEL of them at a time (the rest are still due at the next turn):
         * a scrape is 2.6 KB, and one for every due target of 1,000 jobs at once was
         * megabytes the process kept. */
        if (due > PROGRESS_PARALLEL) due = PROGRESS_PARALLEL;
        scrape *s = due ? calloc(due, sizeof *s) : NULL;
        if (!s) {
            /* Nothing due (or no memory: try again in a second). */
            int64_t wake = next >= 0 ? next : now + 1000;
            if (due) wake = now + 1000;
            struct timespec ts = {(time_t)(wake / 1000), (long)(wake % 1000) * 1000000L};
            pthread_cond_timedwait(&p->cv, &p->mu, &ts);
            continue;
        }
        size_t k = 0;
        for (size_t i = 0; i < p->n && k < due; i++) {
            target *t = &p->t[i];
            if (t->due_ms > now) continue;
            scrape *x = &s[k++];
            memcpy(x->key, t->key, sizeof x->key);
            memcpy(x->uid, t->uid, sizeof x->uid);
            memcpy(x->region, t->region, sizeof x->region);
            memcpy(x->url, t->url, sizeof x->url);
            kube_buf_init(&x->body, PROGRESS_BODY_MAX);
            t->due_ms = now + (int64_t)p->period_s * 1000;
        }
        pthread_mutex_unlock(&p->mu);
        scrape_all(p, multi, s, k);
        pthread_mutex_lock(&p->mu);
        publish(p, s, k);
        for (size_t i = 0; i < k; i++) kube_buf_free(&s[i].body);
        free(s);
    }
    pthread_mutex_unlock(&p->mu);
    curl_multi_cleanup(multi);
    return NULL;
}

/* ---- the API --------------------------------------------------------------------------------- */

int progress_new(const progress_options *o, progress **out, cirrus_error *err)
{
    *out = NULL;
    if (o->period_s < 0) return cirrus_fail(err, CIRRUS_EINVAL, "progress period must be >= 0");
    progress *p = calloc(1, sizeof *p);
    if (!p) return cirrus_fail(err, CIRRUS_ENOMEM, "out of memory");
    p->period_s = o->period_s;
    p->metrics = o->metrics;
    pthread_mutex_init(&p->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&p->cv, &ca);
    pthread_condattr_destroy(&ca);
    int rc = 0;
    for (int i = 0; i < o->n_resolve && !rc; i++) rc = add_resolve(&p->resolve, o->resolve[i], err);
    if (!rc && p->period_s > 0) {
        /* Reference-counted (and thread-safe since libcurl 7.84); balanced in progress_free. */
        if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
            rc = cirrus_fail(err, CIRRUS_EIO, "curl_global_init failed");
        else
            p->curl_inited = 1;
        if (!rc && pthread_create(&p->thread, NULL, worker, p))
            rc = cirrus_fail(err, CIRRUS_EIO, "cannot start the progress thread");
        if (!rc) p->started = 1;
    }
    if (rc) {
        progress_free(p);
        return rc;
    }
    *out = p;
    return 0;
}

void progress_free(progress *p)
{
    if (!p) return;
    if (p->started) {
        pthread_mutex_lock(&p->mu);
        __atomic_store_n(&p->stop, 1, __ATOMIC_RELEASE);
        pthread_cond_signal(&p->cv);
        pthread_mutex_unlock(&p->mu);
        pthread_join(p->thread, NULL);
    }
    if (p->curl_inited) curl_global_cleanup();
    curl_slist_free_all(p->resolve);
    free(p->t);
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
    free(p);
}

static void remove_at(progress *p, size_t i)
{
    memmove(&p->t[i], &p->t[i + 1], (p->n - i - 1) * sizeof *p->t);
    p->n--;
}

static int fits(const char *s, size_t max) { return s && strlen(s) < max; }

int progress_watch(progress *p, const char *key, const char *uid, int n,
                   const progress_target *tg)
{
    if (!p || !p->started || !fits(key, PROGRESS_KEY_MAX)) return 0;
    if (!fits(uid, PROGRESS_UID_MAX)) n = 0;
    pthread_mutex_lock(&p->mu);
    /* Drop what is no longer wanted; remember the job's schedule. */
    int64_t job_due = -1;
    for (size_t i = p->n; i-- > 0;) {
        target *t = &p->t[i];
        if (strcmp(t->key, key)) continue;
        int keep = 0;
        for (int k = 0; k < n && !keep; k++)
            keep = !strcmp(t->uid, uid) && !strcmp(t->region, tg[k].region) &&
                   !strcmp(t->url, tg[k].url);
        if (keep) {
            job_due = t->due_ms;
        } else {
            remove_at(p, i);
        }
    }
    int rc = 0, wake = 0;
    for (int k = 0; k < n; k++) {
        if (!fits(tg[k].region, PROGRESS_REGION_MAX) || !fits(tg[k].url, PROGRESS_URL_MAX) ||
            find(p, key, uid, tg[k].region, tg[k].url))
            continue;
        if (p->n == p->cap) {
            size_t cap = p->cap ? p->cap * 2 : 16;
            target *t = realloc(p->t, cap * sizeof *t);
            if (!t) {
                rc = CIRRUS_ENOMEM;
                break;
            }
            p->t = t;
            p->cap = cap;
        }
        target *t = &p->t[p->n++];
        memset(t, 0, sizeof *t);
        snprintf(t->key, sizeof t->key, "%s", key);
        snprintf(t->uid, sizeof t->uid, "%s", uid);
        snprintf(t->region, sizeof t->region, "%s", tg[k].region);
        snprintf(t->url, sizeof t->url, "%s", tg[k].url);
        t->res = (progress_result){.loss = NAN, .tokens_per_s = NAN};
        t->watched_s = (int64_t)time(NULL);
        if (job_due < 0) {
            job_due = now_ms();
            wake = 1;
        }
        t->due_ms = job_due;
    }
    if (wake) pthread_cond_signal(&p->cv);
    pthread_mutex_unlock(&p->mu);
    return rc;
}

void progress_forget(progress *p, const char *key) { progress_watch(p, key, NULL, 0, NULL); }

void progress_clear(progress *p)
{
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->n = 0;
    pthread_mutex_unlock(&p->mu);
}

/* How a read fails, in words for the status (ProgressCurrent's message). */
static const char *failing_name(int kind)
{
    switch (kind) {
    case OP_SCRAPE_ERROR: return "unreachable";
    case OP_SCRAPE_INVALID: return "invalid /status";
    case OP_SCRAPE_WRONG_JOB: return "another job's /status";
    default: return NULL;
    }
}

void progress_region_get(progress *p, const char *uid, const char *region, progress_region *out)
{
    memset(out, 0, sizeof *out);
    out->res = (progress_result){.loss = NAN, .tokens_per_s = NAN};
    if (!p || !uid || !region) return;
    pthread_mutex_lock(&p->mu);
    for (size_t i = 0; i < p->n; i++) {
        const target *t = &p->t[i];
        if (strcmp(t->uid, uid) || strcmp(t->region, region)) continue;
        out->watched = 1;
        out->watched_s = t->watched_s;
        out->answered = t->has;
        if (t->has) out->res = t->res;
        out->failing = failing_name(t->failing);
        break;
    }
    pthread_mutex_unlock(&p->mu);
}

int progress_get(progress *p, const char *uid, const char *region, progress_result *out)
{
    progress_region r;
    progress_region_get(p, uid, region, &r);
    if (r.answered) *out = r.res;
    return r.answered;
}

int progress_stale_s(const progress *p)
{
    if (!p || !p->started || p->period_s <= 0) return 0;
    return PROGRESS_STALE_PERIODS * p->period_s + (int)(PROGRESS_TIMEOUT_MS / 1000) + 1;
}

void progress_drain(progress *p, void (*fn)(void *ctx, const char *key), void *ctx)
{
    if (!p) return;
    char(*keys)[PROGRESS_KEY_MAX] = NULL;
    size_t nk = 0;
    pthread_mutex_lock(&p->mu);
    size_t dirty = 0;
    for (size_t i = 0; i < p->n; i++) dirty += p->t[i].dirty;
    if (dirty) keys = malloc(dirty * sizeof *keys);
    for (size_t i = 0; keys && i < p->n; i++) {
        target *t = &p->t[i];
        if (!t->dirty) continue;
        t->dirty = 0;
        int seen = 0;
        for (size_t k = 0; k < nk && !seen; k++) seen = !strcmp(keys[k], t->key);
        if (!seen) memcpy(keys[nk++], t->key, PROGRESS_KEY_MAX);
    }
    pthread_mutex_unlock(&p->mu);
    for (size_t k = 0; k < nk; k++) fn(ctx, keys[k]);
    free(keys);
}

void progress_get_stats(progress *p, progress_stats *st)
{
    pthread_mutex_lock(&p->mu);
    *st = p->stats;
    pthread_mutex_unlock(&p->mu);
}
