#include "client.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../common/clock.h"
#include "../../common/log.h"
#include "xfer.h"

/* client-go's limits for Retry-After handling (rest.Request maxRetries); the per-wait cap
 * keeps one request from parking the event loop for long. */
#define RETRY_MAX 10
#define RETRY_WAIT_MAX_MS 10000
/* All of one request's waits together: client-go's retries park one worker, ours the whole
 * event loop, which renews the Lease (10 s renew deadline). Half of that: past it the caller's
 * own backoff (the work queue's, the Lease's retry period, the informer's) takes over. */
#define RETRY_BUDGET_MS 5000
#define USER_AGENT "cirrus-operator/0.1"

struct kube_ticker {
    kube_ticker *next;
    kube_client *client;
    kube_tick_fn fn;
    void *ctx;
    int64_t due_ms; /* -1: not scheduled */
    int zombie;
};

struct kube_client {
    kube_config *cfg;
    CURLM *multi;
    long timeout_ms;
    struct kube_stream *streams;
    kube_ticker *tickers;
    int depth;   /* > 0 while kube_client_poll delivers events */
    int pending; /* stream data or completions arrived outside kube_client_poll's wait */
    kube_client_stats stats;
};

int64_t kube_now_ms(void) { return clock_now_ms(); }

int kube_client_new(kube_config *cfg, kube_client **out, cirrus_error *err)
{
    static int global_done;
    *out = NULL;
    if (!global_done) {
        /* Not thread-safe by libcurl's design; the operator calls it before any thread. */
        if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
            return cirrus_fail(err, CIRRUS_EIO, "curl_global_init failed");
        global_done = 1;
    }
    kube_client *c = calloc(1, sizeof *c);
    if (!c) return cirrus_fail(err, CIRRUS_ENOMEM, "kube client: out of memory");
    c->cfg = cfg;
    c->timeout_ms = KUBE_REQUEST_TIMEOUT_MS;
    c->multi = curl_multi_init();
    if (!c->multi) {
        free(c);
        return cirrus_fail(err, CIRRUS_ENOMEM, "curl_multi_init failed");
    }
    /* Multiplex every watch and request over one HTTP/2 connection where the server allows
     * (kube-apiserver does); HTTP/1.1 still gets a pool of keep-alive connections. */
    curl_multi_setopt(c->multi, CURLMOPT_PIPELINING, (long)CURLPIPE_MULTIPLEX);
    *out = c;
    return 0;
}

void kube_client_free(kube_client *c)
{
    if (!c) return;
    while (c->tickers) {
        kube_ticker *t = c->tickers;
        c->tickers = t->next;
        free(t);
    }
    for (struct kube_stream *s = c->streams; s; s = s->next)
        if (!s->zombie)
            log_warn("kube: client freed with a live watch (free watches and informers first)");
    while (c->streams) {
        struct kube_stream *s = c->streams;
        c->streams = s->next;
        if (s->zombie) s->free(s);
    }
    curl_multi_cleanup(c->multi);
    free(c);
}

kube_config *kube_client_config(kube_client *c) { return c->cfg; }
void kube_client_set_timeout_ms(kube_client *c, long timeout_ms) { c->timeout_ms = timeout_ms; }
void kube_client_get_stats(const kube_client *c, kube_client_stats *st) { *st = c->stats; }

/* ---- transfers ------------------------------------------------------------------------- */

static size_t on_write(char *p, size_t size, size_t n, void *ud)
{
    struct kube_xfer *x = ud;
    if (x->is_stream) x->client->pending = 1;
    if (x->drop_ok_body) {
        long http = 0;
        curl_easy_getinfo(x->easy, CURLINFO_RESPONSE_CODE, &http);
        if (http >= 200 && http < 300) return size * n; /* nobody reads it */
    }
    if (kube_buf_append(&x->in, p, size * n)) {
        x->overflow = 1;
        return 0; /* abort the transfer: CURLE_WRITE_ERROR */
    }
    return size * n;
}

static int add_header(struct kube_xfer *x, const char *h)
{
    struct curl_slist *l = curl_slist_append(x->headers, h);
    if (!l) return CIRRUS_ENOMEM;
    x->headers = l;
    return 0;
}

int kube_xfer_init(kube_client *c, struct kube_xfer *x, const char *method, const char *path,
                   const char *body, const char *content_type, size_t cap, long timeout_ms,
                   cirrus_error *err)
{
    kube_config *cfg = c->cfg;
    memset(x, 0, sizeof *x);
    x->client = c;
    kube_buf_init(&x->in, cap);
    size_t url_len = strlen(kube_config_server(cfg)) + strlen(path) + 1;
    char *url = malloc(url_len);
    x->easy = curl_easy_init();
    if (!url || !x->easy) goto nomem;
    snprintf(url, url_len, "%s%s", kube_config_server(cfg), path);
    if (body && !(x->body = strdup(body))) goto nomem;

    CURL *e = x->easy;
    curl_easy_setopt(e, CURLOPT_URL, url);
    curl_easy_setopt(e, CURLOPT_PRIVATE, (char *)x);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_ERRORBUFFER, x->errbuf);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_write);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, x);
    curl_easy_setopt(e, CURLOPT_USERAGENT, USER_AGENT);
    /* Large lists compress well; the cap applies to the decompressed bytes. */
    curl_easy_setopt(e, CURLOPT_ACCEPT_ENCODING, "gzip");
    /* Wait for a connection that can multiplex rather than open a second one. */
    curl_easy_setopt(e, CURLOPT_PIPEWAIT, 1L);
    /* client-go's dialer: 30 s keep-alive probes find dead peers under a silent watch. */
    curl_easy_setopt(e, CURLOPT_TCP_KEEPALIVE, 1L);
    curl_easy_setopt(e, CURLOPT_TCP_KEEPIDLE, 30L);
    curl_easy_setopt(e, CURLOPT_TCP_KEEPINTVL, 30L);
    curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, 10000L);
    if (timeout_ms > 0) curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, timeout_ms);

    size_t len;
    const void *pem;
    /* CURL_BLOB_COPY: libcurl keeps its own copy, so a rotated config cannot pull bytes
     * from under a running transfer. */
    if ((pem = kube_config_ca(cfg, &len))) {
        struct curl_blob b = {(void *)pem, len, CURL_BLOB_COPY};
        curl_easy_setopt(e, CURLOPT_CAINFO_BLOB, &b);
    }
    if ((pem = kube_config_client_cert(cfg, &len))) {
        struct curl_blob b = {(void *)pem, len, CURL_BLOB_COPY};
        curl_easy_setopt(e, CURLOPT_SSLCERT_BLOB, &b);
        curl_easy_setopt(e, CURLOPT_SSLCERTTYPE, "PEM");
    }
    if ((pem = kube_config_client_key(cfg, &len))) {
        struct curl_blob b = {(void *)pem, len, CURL_BLOB_COPY};
        curl_easy_setopt(e, CURLOPT_SSLKEY_BLOB, &b);
        curl_easy_setopt(e, CURLOPT_SSLKEYTYPE, "PEM");
    }
    if (kube_config_insecure(cfg)) {
        curl_easy_setopt(e, CURLOPT_SSL_VERIFYPEER, 0L);
        curl_easy_setopt(e, CURLOPT_SSL_VERIFYHOST, 0L);
    }

    if (strcmp(method, "GET") && strcmp(method, "POST"))
        curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, method);
    if (x->body) {
        curl_easy_setopt(e, CURLOPT_POSTFIELDS, x->body);
        curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)strlen(x->body));
    } else if (!strcmp(method, "POST")) {
        curl_easy_setopt(e, CURLOPT_POSTFIELDS, "");
    }

    char h[64 + 4096];
    const char *token = kube_config_token(cfg, kube_now_ms());
    if (token) {
        if (strlen(token) > 4096) {
            free(url);
            kube_xfer_cleanup(x);
            return cirrus_fail(err, CIRRUS_EINVAL, "bearer token longer than 4096 bytes");
        }
        snprintf(h, sizeof h, "Authorization: Bearer %s", token);
        if (add_header(x, h)) goto nomem;
    }
    snprintf(h, sizeof h, "Content-Type: %s", content_type ? content_type : KUBE_CT_JSON);
    /* "Expect:" stops libcurl's 100-continue round trip before large HTTP/1.1 bodies. */
    if (add_header(x, "Accept: application/json") || (x->body && add_header(x, h)) ||
        add_header(x, "Expect:"))
        goto nomem;
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, x->headers);
    free(url);
    return 0;
nomem:
    free(url);
    kube_xfer_cleanup(x);
    return cirrus_fail(err, CIRRUS_ENOMEM, "%s %s: out of memory", method, path);
}

int kube_xfer_start(struct kube_xfer *x, cirrus_error *err)
{
    CURLMcode mc = curl_multi_add_handle(x->client->multi, x->easy);
    if (mc != CURLM_OK)
        return cirrus_fail(err, CIRRUS_EIO, "curl_multi_add_handle: %s", curl_multi_strerror(mc));
    x->added = 1;
    return 0;
}

void kube_xfer_cleanup(struct kube_xfer *x)
{
    if (x->easy) {
        if (x->added) curl_multi_remove_handle(x->client->multi, x->easy);
        curl_easy_cleanup(x->easy);
    }
    x->easy = NULL;
    x->added = 0;
    curl_slist_free_all(x->headers);
    x->headers = NULL;
    free(x->body);
    x->body = NULL;
    kube_buf_free(&x->in);
}

long kube_xfer_http_status(const struct kube_xfer *x)
{
    long code = 0;
    curl_easy_getinfo(x->easy, CURLINFO_RESPONSE_CODE, &code);
    return code;
}

int kube_http_error(long s)
{
    if (s >= 200 && s < 300) return 0;
    switch (s) {
    case 404: return CIRRUS_ENOENT;
    case 409: return CIRRUS_ECONFLICT;
    case 410: return CIRRUS_EGONE;
    case 400:
    case 422: return CIRRUS_EINVAL;
    case 408:
    case 504: return CIRRUS_ETIMEDOUT;
    default: return CIRRUS_EIO;
    }
}

const char *kube_status_reason(const json_t *status)
{
    const char *r = json_string_value(json_object_get(status, "reason"));
    return r ? r : "";
}

const char *kube_status_message(const json_t *status)
{
    const char *m = json_string_value(json_object_get(status, "message"));
    return m ? m : "";
}

int kube_xfer_error(const struct kube_xfer *x, const char *method, const char *path,
                    const json_t *status_obj, long http, cirrus_error *err)
{
    if (x->overflow)
        return cirrus_fail(err, CIRRUS_ETRUNC, "%s %s: response larger than %zu bytes", method,
                           path, x->in.cap);
    if (x->result != CURLE_OK) {
        const char *why = x->errbuf[0] ? x->errbuf : curl_easy_strerror(x->result);
        int code = x->result == CURLE_OPERATION_TIMEDOUT ? CIRRUS_ETIMEDOUT : CIRRUS_EIO;
        return cirrus_fail(err, code, "%s %s: %s", method, path, why);
    }
    int code = kube_http_error(http);
    const char *msg = kube_status_message(status_obj);
    if (*msg) return cirrus_fail(err, code, "%s", msg); /* what kubectl shows */
    /* Not a Status (a proxy, a wrong URL): show the start of the body. */
    return cirrus_fail(err, code, "%s %s: HTTP %ld: %.120s", method, path, http,
                       x->in.data ? x->in.data : "");
}

/* ---- the event loop -------------------------------------------------------------------- */

/* Record completions on their transfers; owners act on them (requests at once, watches in
 * kube_client_poll). */
static void drain(kube_client *c)
{
    CURLMsg *m;
    int left;
    while ((m = curl_multi_info_read(c->multi, &left))) {
        if (m->msg != CURLMSG_DONE) continue;
        char *p = NULL;
        curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, &p);
        struct kube_xfer *x = (struct kube_xfer *)p;
        if (!x) continue;
        x->done = 1;
        x->result = m->data.result;
        long nc = 0;
        curl_easy_getinfo(m->easy_handle, CURLINFO_NUM_CONNECTS, &nc);
        c->stats.connects += (uint64_t)nc;
        c->stats.transfers++;
        if (x->is_stream) c->pending = 1;
    }
}

static void drive(kube_client *c, int wait_ms)
{
    int running;
    if (wait_ms > 0) curl_multi_poll(c->multi, NULL, 0, wait_ms, NULL);
    curl_multi_perform(c->multi, &running);
    drain(c);
}

/* Run x to completion on the multi handle; other transfers progress meanwhile. */
static void run_sync(kube_client *c, struct kube_xfer *x)
{
    drive(c, 0);
    while (!x->done) drive(c, 1000);
}

/* Wait ms while keeping every other transfer moving. */
static void wait_driving(kube_client *c, int64_t ms)
{
    int64_t end = kube_now_ms() + ms;
    for (int64_t now = kube_now_ms(); now < end; now = kube_now_ms())
        drive(c, (int)(end - now));
}

int kube_request(kube_client *c, const char *method, const char *path, const json_t *body,
                 const char *content_type, long *http_status, json_t **response,
                 cirrus_error *err)
{
    char *text = NULL;
    json_t *resp = NULL;
    long http = 0;
    int rc = 0;
    if (http_status) *http_status = 0;
    if (response) *response = NULL;
    if (body && !(text = json_dumps(body, JSON_COMPACT | JSON_ENCODE_ANY)))
        return cirrus_fail(err, CIRRUS_ENOMEM, "%s %s: cannot encode the body", method, path);
    int64_t waited_ms = 0;
    for (int attempt = 0;; attempt++) {
        struct kube_xfer x;
        rc = kube_xfer_init(c, &x, method, path, text, content_type, KUBE_RESPONSE_MAX,
                            c->timeout_ms, err);
        x.drop_ok_body = !response;
        if (!rc) rc = kube_xfer_start(&x, err);
        if (rc) {
            kube_xfer_cleanup(&x);
            break;
        }
        run_sync(c, &x);
        http = x.result == CURLE_OK ? kube_xfer_http_status(&x) : 0;
        curl_off_t retry_after = 0;
        curl_easy_getinfo(x.easy, CURLINFO_RETRY_AFTER, &retry_after);
        json_decref(resp);
        resp = NULL;
        if (x.result == CURLE_OK && x.in.len > 0 && (response || http >= 300)) {
            json_error_t je;
            resp = json_loadb(x.in.data, x.in.len, 0, &je);
            if (!resp && http < 300)
                rc = cirrus_fail(err, CIRRUS_ECORRUPT, "%s %s: invalid JSON response: %s",
                                 method, path, je.text);
        }
        if (x.result != CURLE_OK || http >= 300) rc = kube_xfer_error(&x, method, path, resp, http, err);
        kube_xfer_cleanup(&x);
        /* The server asked us to come back later and did not act on the request. */
        int retry = http == 429 || (http >= 500 && retry_after > 0);
        if (!retry || attempt == RETRY_MAX) break;
        int64_t wait_ms = retry_after > 0 ? (int64_t)retry_after * 1000 : 1000;
        if (wait_ms > RETRY_WAIT_MAX_MS) wait_ms = RETRY_WAIT_MAX_MS;
        /* Retries park the whole event loop: stop once they would outlast one request's
         * timeout or the retry budget and let the caller's own backoff take over. */
        if (waited_ms + wait_ms > c->timeout_ms || waited_ms + wait_ms > RETRY_BUDGET_MS) break;
        waited_ms += wait_ms;
        c->stats.retries++;
        wait_driving(c, wait_ms);
    }
    free(text);
    if (http_status) *http_status = http;
    if (response)
        *response = resp;
    else
        json_decref(resp);
    return rc;
}

/* kube_request_all's calls, all in flight at once. */
static void request_batch(kube_client *c, kube_call *calls, size_t n)
{
    struct kube_xfer *x = calloc(n ? n : 1, sizeof *x);
    char **text = calloc(n ? n : 1, sizeof *text);
    for (size_t i = 0; i < n; i++) {
        kube_call *k = &calls[i];
        k->rc = 0;
        k->http_status = 0;
        k->response = NULL;
        k->err.msg[0] = 0;
        if (!x || !text) {
            k->rc = cirrus_fail(&k->err, CIRRUS_ENOMEM, "%s %s: out of memory", k->method, k->path);
            continue;
        }
        if (k->body && !(text[i] = json_dumps(k->body, JSON_COMPACT | JSON_ENCODE_ANY))) {
            k->rc = cirrus_fail(&k->err, CIRRUS_ENOMEM, "%s %s: cannot encode the body",
                                k->method, k->path);
            continue;
        }
        k->rc = kube_xfer_init(c, &x[i], k->method, k->path, text[i], k->content_type,
                               KUBE_RESPONSE_MAX, c->timeout_ms, &k->err);
        x[i].drop_ok_body = !k->want_response;
        if (!k->rc) k->rc = kube_xfer_start(&x[i], &k->err);
        if (k->rc) x[i].done = 1;
    }
    for (size_t i = 0; x && text && i < n; i++) run_sync(c, &x[i]); /* all move meanwhile */
    for (size_t i = 0; x && text && i < n; i++) {
        kube_call *k = &calls[i];
        if (k->rc) {
            kube_xfer_cleanup(&x[i]);
            continue;
        }
        long http = x[i].result == CURLE_OK ? kube_xfer_http_status(&x[i]) : 0;
        k->http_status = http;
        curl_off_t retry_after = 0;
        curl_easy_getinfo(x[i].easy, CURLINFO_RETRY_AFTER, &retry_after);
        json_t *resp = NULL;
        if (x[i].result == CURLE_OK && x[i].in.len > 0 && (k->want_response || http >= 300)) {
            json_error_t je;
            resp = json_loadb(x[i].in.data, x[i].in.len, 0, &je);
            if (!resp && http < 300)
                k->rc = cirrus_fail(&k->err, CIRRUS_ECORRUPT, "%s %s: invalid JSON response: %s",
                                    k->method, k->path, je.text);
        }
        if (x[i].result != CURLE_OK || http >= 300)
            k->rc = kube_xfer_error(&x[i], k->method, k->path, resp, http, &k->err);
        kube_xfer_cleanup(&x[i]);
        if (http == 429 || (http >= 500 && retry_after > 0)) { /* the server did not act */
            json_decref(resp);
            resp = NULL;
            k->rc = kube_request(c, k->method, k->path, k->body, k->content_type,
                                 &k->http_status, k->want_response ? &resp : NULL, &k->err);
        }
        if (k->want_response && !k->rc)
            k->response = resp;
        else
            json_decref(resp);
    }
    for (size_t i = 0; text && i < n; i++) free(text[i]);
    free(text);
    free(x);
}

void kube_request_all(kube_client *c, kube_call *calls, size_t n)
{
    /* A few dozen at a time: each transfer in flight holds a libcurl handle with its
     * buffers, and a burst of Events (hundreds in a mass creation) all at once was a
     * megabyte of the operator's peak memory for no faster an answer (they share one
     * HTTP/2 connection). */
    for (size_t i = 0; i < n; i += KUBE_CALLS_AT_ONCE)
        request_batch(c, calls + i, n - i < KUBE_CALLS_AT_ONCE ? n - i : KUBE_CALLS_AT_ONCE);
}

int kube_client_poll(kube_client *c, int timeout_ms)
{
    if (c->depth) return CIRRUS_EINVAL;
    int64_t now = kube_now_ms();
    int64_t wait = timeout_ms < 0 ? 0 : timeout_ms;
    for (kube_ticker *t = c->tickers; t; t = t->next)
        if (!t->zombie && t->due_ms >= 0 && t->due_ms - now < wait)
            wait = t->due_ms > now ? t->due_ms - now : 0;
    if (c->pending) wait = 0; /* something arrived while nobody was looking */
    drive(c, (int)wait);
    /* Cleared after our own drive: only what handlers' requests bring in during delivery
     * (for a stream already visited) makes the next poll skip its wait. */
    c->pending = 0;

    c->depth++;
    for (struct kube_stream *s = c->streams; s; s = s->next)
        if (!s->zombie) s->dispatch(s);
    now = kube_now_ms();
    for (kube_ticker *t = c->tickers; t; t = t->next) {
        if (t->zombie || t->due_ms < 0 || t->due_ms > now) continue;
        t->due_ms = -1;
        t->fn(t->ctx, now);
    }
    c->depth--;

    /* Free what handlers removed during delivery. */
    for (struct kube_stream **sp = &c->streams; *sp;) {
        struct kube_stream *s = *sp;
        if (s->zombie) {
            *sp = s->next;
            s->free(s);
        } else {
            sp = &s->next;
        }
    }
    for (kube_ticker **tp = &c->tickers; *tp;) {
        kube_ticker *t = *tp;
        if (t->zombie) {
            *tp = t->next;
            free(t);
        } else {
            tp = &t->next;
        }
    }
    return 0;
}

void kube_client_add_stream(kube_client *c, struct kube_stream *s)
{
    s->zombie = 0;
    s->next = c->streams;
    c->streams = s;
}

void kube_client_remove_stream(kube_client *c, struct kube_stream *s)
{
    s->zombie = 1;
    if (c->depth) return; /* the sweep at the end of kube_client_poll frees it */
    for (struct kube_stream **sp = &c->streams; *sp; sp = &(*sp)->next)
        if (*sp == s) {
            *sp = s->next;
            break;
        }
    s->free(s);
}

kube_ticker *kube_ticker_new(kube_client *c, kube_tick_fn fn, void *ctx)
{
    kube_ticker *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    t->client = c;
    t->fn = fn;
    t->ctx = ctx;
    t->due_ms = -1;
    t->next = c->tickers;
    c->tickers = t;
    return t;
}

void kube_ticker_schedule(kube_ticker *t, int64_t due_ms) { t->due_ms = due_ms; }

void kube_ticker_free(kube_ticker *t)
{
    if (!t) return;
    kube_client *c = t->client;
    t->zombie = 1;
    if (c->depth) return;
    for (kube_ticker **tp = &c->tickers; *tp; tp = &(*tp)->next)
        if (*tp == t) {
            *tp = t->next;
            break;
        }
    free(t);
}
