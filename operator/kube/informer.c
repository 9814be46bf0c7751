#include "informer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <curl/curl.h>

#include "../../common/log.h"
#include "backoff.h"
#include "watch.h"

#define KEY_MAX 512

struct kube_informer {
    kube_client *client;
    char *path, *query;
    int page_limit;
    kube_informer_config h; /* handlers and ctx (path/query point at our copies) */
    json_t *cache;          /* key -> object (compact: its JSON text, a string) */
    json_t *parsed;         /* compact: key -> object parsed for a get, until released */
    char rv[128];
    int need_list, synced;
    kube_watch *watch;
    int64_t watch_started_ms;
    uint64_t watch_events; /* events on the current watch, bookmarks included */
    kube_ticker *ticker;
    kube_backoff backoff;
    kube_informer_stats stats;
};

static const char *rv_of(const json_t *obj)
{
    const char *rv =
        json_string_value(json_object_get(json_object_get(obj, "metadata"), "resourceVersion"));
    return rv ? rv : "";
}

static void retry_later(kube_informer *inf, int64_t now)
{
    inf->stats.errors++;
    kube_ticker_schedule(inf->ticker, now + kube_backoff_next(&inf->backoff, now));
}

/* ---- the cache ---------------------------------------------------------------------------- */

/* What the cache holds for obj: obj itself, or in a compact informer its compact JSON text
 * (jansson holds an object of ~60 values in ~10x the bytes of its text). A new reference. */
static json_t *to_cache(const kube_informer *inf, json_t *obj)
{
    if (!inf->h.compact) return json_incref(obj);
    char *text = json_dumps(obj, JSON_COMPACT);
    json_t *s = text ? json_stringn_nocheck(text, strlen(text)) : NULL;
    free(text);
    return s;
}

/* The object a cache value stands for: borrowed (not compact), or a new reference parsed
 * from its text (compact); NULL if absent or unparsable. */
static json_t *from_cache(const kube_informer *inf, json_t *v)
{
    if (!v || !inf->h.compact) return json_incref(v);
    return json_loadb(json_string_value(v), json_string_length(v), 0, NULL);
}

static void cache_set(kube_informer *inf, json_t *cache, const char *key, json_t *obj)
{
    json_t *v = to_cache(inf, obj);
    if (v) json_object_set_new(cache, key, v);
    if (inf->parsed) json_object_del(inf->parsed, key);
}

/* ---- list ------------------------------------------------------------------------------ */

/* Replace the cache with a fresh list and tell the handlers what changed since the cache
 * was last current: the part of "misses nothing" a watch cannot provide. */
static void replace(kube_informer *inf, json_t *items)
{
    json_t *old_cache = inf->cache;
    json_t *cache = json_object();
    size_t i;
    json_t *obj;
    char key[KEY_MAX];
    if (!cache) return;
    /* (list_all transformed the items already.) */
    json_array_foreach(items, i, obj)
    {
        if (kube_object_key(obj, key, sizeof key) == 0) cache_set(inf, cache, key, obj);
    }
    inf->cache = cache;
    json_object_clear(inf->parsed);
    json_array_foreach(items, i, obj)
    {
        if (kube_object_key(obj, key, sizeof key)) continue;
        json_t *old = from_cache(inf, json_object_get(old_cache, key));
        if (!old) {
            if (inf->h.on_add) inf->h.on_add(inf->h.ctx, obj);
        } else if (strcmp(rv_of(old), rv_of(obj))) {
            if (inf->h.on_update) inf->h.on_update(inf->h.ctx, old, obj);
        }
        json_decref(old);
    }
    const char *k;
    json_object_foreach(old_cache, k, obj)
    {
        if (json_object_get(cache, k) || !inf->h.on_delete) continue;
        json_t *gone = from_cache(inf, obj);
        if (gone) inf->h.on_delete(inf->h.ctx, gone);
        json_decref(gone);
    }
    json_decref(old_cache);
}

/* LIST every page into one array; 0 with *items and the list's resourceVersion set. */
static int list_all(kube_informer *inf, json_t **items_out, cirrus_error *err)
{
    json_t *items = json_array();
    char *cont = NULL;
    int rc = 0;
    if (!items) return cirrus_fail(err, CIRRUS_ENOMEM, "out of memory");
    for (;;) {
        size_t n = strlen(inf->path) + (inf->query ? strlen(inf->query) : 0) +
                   (cont ? strlen(cont) : 0) + 64;
        char *url = malloc(n);
        if (!url) {
            rc = cirrus_fail(err, CIRRUS_ENOMEM, "out of memory");
            break;
        }
        snprintf(url, n, "%s?limit=%d%s%s%s%s", inf->path, inf->page_limit,
                 cont ? "&continue=" : "", cont ? cont : "", inf->query ? "&" : "",
                 inf->query ? inf->query : "");
        json_t *page = NULL;
        rc = kube_get(inf->client, url, &page, err);
        free(url);
        curl_free(cont);
        cont = NULL;
        if (rc) break;
        json_t *md = json_object_get(page, "metadata");
        json_t *page_items = json_object_get(page, "items");
        const char *rv = json_string_value(json_object_get(md, "resourceVersion"));
        const char *c = json_string_value(json_object_get(md, "continue"));
        if (!rv || (page_items && !json_is_array(page_items))) {
            json_decref(page);
            rc = cirrus_fail(err, CIRRUS_ECORRUPT, "LIST %s: not a list", inf->path);
            break;
        }
        /* Every page carries the resourceVersion of the first: the snapshot's. */
        snprintf(inf->rv, sizeof inf->rv, "%s", rv);
        /* Pruned page by page: a re-list of thousands of objects never holds them whole. */
        size_t i;
        json_t *obj;
        json_array_foreach(page_items, i, obj)
        {
            if (inf->h.transform) inf->h.transform(obj);
        }
        if (page_items) json_array_extend(items, page_items);
        if (c && *c) cont = curl_easy_escape(NULL, c, 0);
        json_decref(page);
        if (!cont) break;
    }
    curl_free(cont);
    if (rc) {
        json_decref(items);
        return rc;
    }
    *items_out = items;
    return 0;
}

/* ---- watch ----------------------------------------------------------------------------- */

static void on_event(void *ctx, kube_watch *w, enum kube_event_type type, json_t *obj)
{
    kube_informer *inf = ctx;
    char key[KEY_MAX];
    snprintf(inf->rv, sizeof inf->rv, "%s", kube_watch_resource_version(w));
    inf->watch_events++;
    if (type == KUBE_EVENT_BOOKMARK) return; /* only moves the resourceVersion */
    if (inf->h.transform) inf->h.transform(obj);
    if (kube_object_key(obj, key, sizeof key)) {
        log_warn("kube: %s: watch event for an object without a name", inf->path);
        return;
    }
    json_t *old = from_cache(inf, json_object_get(inf->cache, key));
    if (type == KUBE_EVENT_DELETED) {
        if (old) {
            json_object_del(inf->cache, key);
            if (inf->parsed) json_object_del(inf->parsed, key);
            if (inf->h.on_delete) inf->h.on_delete(inf->h.ctx, obj);
        }
    } else {
        cache_set(inf, inf->cache, key, obj);
        if (!old) {
            if (inf->h.on_add) inf->h.on_add(inf->h.ctx, obj);
        } else if (strcmp(rv_of(old), rv_of(obj))) {
            if (inf->h.on_update) inf->h.on_update(inf->h.ctx, old, obj);
        }
    }
    json_decref(old);
}

static void on_end(void *ctx, kube_watch *w, int status, const cirrus_error *err)
{
    kube_informer *inf = ctx;
    int64_t now = kube_now_ms();
    kube_watch_free(w);
    inf->watch = NULL;
    if (status == 0 && (inf->watch_events || now - inf->watch_started_ms >= 1000)) {
        kube_ticker_schedule(inf->ticker, now); /* timeoutSeconds passed: re-watch at once */
        return;
    }
    if (status == 0) {
        /* client-go's "very short watch": a server or proxy closing watches at once would
         * otherwise have us reconnecting in a tight loop. */
        log_warn("kube: %s: watch closed at once with no events", inf->path);
    } else if (status == CIRRUS_EGONE) {
        inf->stats.gone++;
        inf->need_list = 1;
        log_info("kube: %s: resourceVersion %s expired, re-listing", inf->path, inf->rv);
    } else {
        log_warn("kube: %s: watch failed: %s", inf->path, err ? err->msg : cirrus_strerror(status));
    }
    retry_later(inf, now);
}

static void start_watch(kube_informer *inf, int64_t now)
{
    cirrus_error err;
    int rc = kube_watch_start(inf->client, inf->path, inf->query, inf->rv, 0, on_event, on_end,
                              inf, &inf->watch, &err);
    if (rc) {
        log_warn("kube: %s: cannot start a watch: %s", inf->path, err.msg);
        retry_later(inf, now);
        return;
    }
    inf->stats.watches++;
    inf->watch_started_ms = now;
    inf->watch_events = 0;
}

static void tick(void *ctx, int64_t now)
{
    kube_informer *inf = ctx;
    if (inf->watch) return;
    if (inf->need_list) {
        json_t *items = NULL;
        cirrus_error err;
        int rc = list_all(inf, &items, &err);
        if (rc) {
            log_warn("kube: LIST %s: %s", inf->path, err.msg);
            retry_later(inf, now);
            return;
        }
        inf->need_list = 0;
        inf->stats.lists++;
        replace(inf, items);
        json_decref(items);
        inf->synced = 1;
    }
    start_watch(inf, kube_now_ms());
}

/* ---- public ---------------------------------------------------------------------------- */

int kube_informer_new(kube_client *c, const kube_informer_config *cfg, kube_informer **out,
                      cirrus_error *err)
{
    *out = NULL;
    if (!cfg->path || cfg->path[0] != '/' || strchr(cfg->path, '?'))
        return cirrus_fail(err, CIRRUS_EINVAL, "informer: path must start with / and have no query");
    kube_informer *inf = calloc(1, sizeof *inf);
    if (!inf) return cirrus_fail(err, CIRRUS_ENOMEM, "out of memory");
    inf->client = c;
    inf->h = *cfg;
    inf->page_limit = cfg->page_limit > 0 ? cfg->page_limit : KUBE_LIST_PAGE;
    inf->path = strdup(cfg->path);
    inf->query = cfg->query && *cfg->query ? strdup(cfg->query) : NULL;
    inf->cache = json_object();
    inf->parsed = cfg->compact ? json_object() : NULL;
    inf->ticker = kube_ticker_new(c, tick, inf);
    inf->need_list = 1;
    kube_backoff_init(&inf->backoff, 0);
    if (!inf->path || (cfg->query && *cfg->query && !inf->query) || !inf->cache || !inf->ticker ||
        (cfg->compact && !inf->parsed)) {
        kube_informer_free(inf);
        return cirrus_fail(err, CIRRUS_ENOMEM, "out of memory");
    }
    inf->h.path = inf->path;
    inf->h.query = inf->query;
    kube_ticker_schedule(inf->ticker, kube_now_ms());
    *out = inf;
    return 0;
}

void kube_informer_free(kube_informer *inf)
{
    if (!inf) return;
    kube_watch_free(inf->watch);
    kube_ticker_free(inf->ticker);
    json_decref(inf->cache);
    json_decref(inf->parsed);
    free(inf->path);
    free(inf->query);
    free(inf);
}

int kube_informer_has_synced(const kube_informer *inf) { return inf->synced; }
const json_t *kube_informer_get(const kube_informer *inf, const char *key)
{
    json_t *v = json_object_get(inf->cache, key);
    if (!inf->h.compact || !v) return v;
    json_t *obj = json_object_get(inf->parsed, key);
    if (obj) return obj;
    obj = from_cache(inf, v);
    /* The parsed objects are the informer's until kube_informer_release: a get does not
     * change what is cached, only what is kept parsed of it. */
    if (obj && json_object_set_new(((kube_informer *)inf)->parsed, key, obj)) return NULL;
    return obj;
}

void kube_informer_release(const kube_informer *inf)
{
    if (inf->parsed) json_object_clear(((kube_informer *)inf)->parsed);
}
const json_t *kube_informer_objects(const kube_informer *inf) { return inf->cache; }
const char *kube_informer_resource_version(const kube_informer *inf) { return inf->rv; }
void kube_informer_get_stats(const kube_informer *inf, kube_informer_stats *st) { *st = inf->stats; }

void kube_informer_disconnect(kube_informer *inf, const char *resume_rv)
{
    int64_t now = kube_now_ms();
    if (inf->watch) {
        kube_watch_free(inf->watch);
        inf->watch = NULL;
    }
    if (resume_rv) snprintf(inf->rv, sizeof inf->rv, "%s", resume_rv);
    kube_ticker_schedule(inf->ticker, now + kube_backoff_next(&inf->backoff, now));
}
