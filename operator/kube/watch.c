#include "watch.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../../common/rng.h"
#include "xfer.h"

struct kube_watch {
    struct kube_stream stream; /* first: the client's list holds &w->stream */
    kube_client *client;
    struct kube_xfer x;
    char *path; /* for messages */
    char rv[128];
    kube_watch_event_fn on_event;
    kube_watch_end_fn on_end;
    void *ctx;
    int ended;
};

int kube_watch_random_timeout_s(void)
{
    static rng_state rng;
    static int seeded;
    if (!seeded) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        rng_seed(&rng, (uint64_t)ts.tv_nsec ^ ((uint64_t)getpid() << 32));
        seeded = 1;
    }
    /* client-go: minWatchTimeout * (1 + rand), minWatchTimeout = 5 min, so watches of many
     * clients do not all expire together. */
    return 300 + (int)rng_below(&rng, 300);
}

int kube_watch_parse_event(const char *line, size_t len, enum kube_event_type *type,
                           json_t **object, cirrus_error *err)
{
    json_error_t je;
    *object = NULL;
    json_t *ev = json_loadb(line, len, 0, &je);
    if (!ev) return cirrus_fail(err, CIRRUS_ECORRUPT, "watch event: %s", je.text);
    const char *t = json_string_value(json_object_get(ev, "type"));
    json_t *obj = json_object_get(ev, "object");
    int rc = 0;
    if (!t || !json_is_object(obj)) {
        rc = cirrus_fail(err, CIRRUS_ECORRUPT, "watch event without type or object");
    } else if (!strcmp(t, "ADDED")) {
        *type = KUBE_EVENT_ADDED;
    } else if (!strcmp(t, "MODIFIED")) {
        *type = KUBE_EVENT_MODIFIED;
    } else if (!strcmp(t, "DELETED")) {
        *type = KUBE_EVENT_DELETED;
    } else if (!strcmp(t, "BOOKMARK")) {
        *type = KUBE_EVENT_BOOKMARK;
    } else if (!strcmp(t, "ERROR")) {
        *type = KUBE_EVENT_ERROR;
    } else {
        rc = cirrus_fail(err, CIRRUS_ECORRUPT, "watch event of unknown type %.40s", t);
    }
    if (!rc) *object = json_incref(obj);
    json_decref(ev);
    return rc;
}

int kube_watch_error_status(const json_t *status, cirrus_error *err)
{
    json_int_t code = json_integer_value(json_object_get(status, "code"));
    const char *msg = kube_status_message(status);
    int rc = code ? kube_http_error((long)code) : CIRRUS_EIO;
    if (!rc) rc = CIRRUS_EIO; /* an ERROR event is never a success */
    return cirrus_fail(err, rc, "watch: %s (code %lld)", *msg ? msg : "error event",
                       (long long)code);
}

/* Deliver the end once, with the transfer already off the multi handle. */
static void watch_end(kube_watch *w, int status, const cirrus_error *err)
{
    if (w->ended) return;
    w->ended = 1;
    kube_xfer_cleanup(&w->x);
    w->on_end(w->ctx, w, status, err);
}

/* One complete line: returns 1 when the watch ended (ERROR event or bad data). */
static int handle_line(kube_watch *w, const char *line, size_t len)
{
    while (len && (line[len - 1] == '\r' || line[len - 1] == ' ')) len--;
    if (len == 0) return 0;
    enum kube_event_type type;
    json_t *obj;
    cirrus_error err;
    int rc = kube_watch_parse_event(line, len, &type, &obj, &err);
    if (rc) {
        /* A stream we cannot read is a broken stream: end it, the owner resumes from the
         * last good resourceVersion. */
        watch_end(w, rc, &err);
        return 1;
    }
    if (type == KUBE_EVENT_ERROR) {
        rc = kube_watch_error_status(obj, &err);
        json_decref(obj);
        watch_end(w, rc, &err);
        return 1;
    }
    const char *rv =
        json_string_value(json_object_get(json_object_get(obj, "metadata"), "resourceVersion"));
    if (rv) snprintf(w->rv, sizeof w->rv, "%s", rv);
    w->on_event(w->ctx, w, type, obj);
    json_decref(obj);
    return 0;
}

static void watch_dispatch(struct kube_stream *s)
{
    kube_watch *w = (kube_watch *)s;
    if (w->ended) return;
    long http = kube_xfer_http_status(&w->x);
    if (http == 200) {
        /* Walk the lines by offset and compact once at the end: a burst of ten thousand
         * events is not ten thousand memmoves. Handlers may run requests that append to
         * (and realloc) the buffer, so nothing holds a pointer across a handler; each line
         * is parsed before its handler runs. */
        size_t off = 0;
        while (!w->ended && !w->stream.zombie && off < w->x.in.len) {
            const char *start = w->x.in.data + off;
            const char *nl = memchr(start, '\n', w->x.in.len - off);
            if (!nl) break;
            size_t n = (size_t)(nl - start);
            off += n + 1;
            handle_line(w, start, n);
        }
        if (!w->ended && !w->stream.zombie) kube_buf_consume(&w->x.in, off);
    }
    if (w->ended || w->stream.zombie || !w->x.done) return;

    cirrus_error err;
    if (w->x.result != CURLE_OK || http == 0) {
        watch_end(w, kube_xfer_error(&w->x, "WATCH", w->path, NULL, http, &err), &err);
    } else if (http == 200) {
        /* The server closes a watch at timeoutSeconds; a last line may lack its newline. */
        if (w->x.in.len && handle_line(w, w->x.in.data, w->x.in.len)) return;
        watch_end(w, 0, NULL);
    } else {
        json_t *status = json_loadb(w->x.in.data ? w->x.in.data : "", w->x.in.len, 0, NULL);
        int rc = kube_xfer_error(&w->x, "WATCH", w->path, status, http, &err);
        json_decref(status);
        watch_end(w, rc, &err);
    }
}

static void watch_free(struct kube_stream *s)
{
    kube_watch *w = (kube_watch *)s;
    kube_xfer_cleanup(&w->x);
    free(w->path);
    free(w);
}

int kube_watch_start(kube_client *c, const char *path, const char *extra_query,
                     const char *resource_version, int timeout_s, kube_watch_event_fn on_event,
                     kube_watch_end_fn on_end, void *ctx, kube_watch **out, cirrus_error *err)
{
    *out = NULL;
    if (path[0] != '/' || strchr(path, '?'))
        return cirrus_fail(err, CIRRUS_EINVAL, "watch %s: want a collection path without a query", path);
    if (timeout_s <= 0) timeout_s = kube_watch_random_timeout_s();
    char *rv = curl_easy_escape(NULL, resource_version ? resource_version : "", 0);
    if (!rv) return cirrus_fail(err, CIRRUS_ENOMEM, "out of memory");
    size_t n = strlen(path) + strlen(rv) + (extra_query ? strlen(extra_query) : 0) + 128;
    char *url = malloc(n);
    kube_watch *w = calloc(1, sizeof *w);
    int rc = 0;
    if (!url || !w || !(w->path = strdup(path))) {
        rc = cirrus_fail(err, CIRRUS_ENOMEM, "out of memory");
        goto out;
    }
    snprintf(url, n, "%s?watch=1&allowWatchBookmarks=true&timeoutSeconds=%d%s%s%s%s", path,
             timeout_s, *rv ? "&resourceVersion=" : "", rv, extra_query ? "&" : "",
             extra_query ? extra_query : "");
    w->client = c;
    w->on_event = on_event;
    w->on_end = on_end;
    w->ctx = ctx;
    snprintf(w->rv, sizeof w->rv, "%s", resource_version ? resource_version : "");
    w->stream.dispatch = watch_dispatch;
    w->stream.free = watch_free;
    /* The server ends the watch at timeoutSeconds; a transfer still open a minute later
     * is talking to a dead peer. */
    rc = kube_xfer_init(c, &w->x, "GET", url, NULL, NULL, KUBE_RESPONSE_MAX,
                        (long)(timeout_s + 60) * 1000, err);
    if (rc) goto out;
    w->x.is_stream = 1;
    rc = kube_xfer_start(&w->x, err);
    if (rc) goto out;
    kube_client_add_stream(c, &w->stream);
    *out = w;
out:
    curl_free(rv);
    free(url);
    if (rc && w) watch_free(&w->stream);
    return rc;
}

void kube_watch_free(kube_watch *w)
{
    if (!w) return;
    w->ended = 1;
    kube_xfer_cleanup(&w->x); /* off the multi handle now: no more data for it */
    kube_client_remove_stream(w->client, &w->stream);
}

const char *kube_watch_resource_version(const kube_watch *w) { return w->rv; }
