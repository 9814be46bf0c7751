/* kube_watch: recorded API-server lines (ERROR 410, BOOKMARK), a real BOOKMARK, a real
 * expired resourceVersion, an HTTP 410 from a scripted server, and several watches plus
 * requests in one event loop over one connection. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../operator/kube/client.h"
#include "../../operator/kube/watch.h"
#include "../unit/test.h"
#include "kube_test_util.h"


/* What kube-apiserver v1.36 sent for ?watch=1&resourceVersion=1 on a CRD created moments
 * before (HTTP 200, then this line, then the end of the stream). */
static const char recorded_gone[] =
    "{\"type\":\"ERROR\",\"object\":{\"kind\":\"Status\",\"apiVersion\":\"v1\",\"metadata\":{},"
    "\"status\":\"Failure\",\"message\":\"too old resource version: 1 (305)\",\"reason\":"
    "\"Expired\",\"code\":410}}";
static const char recorded_bookmark[] =
    "{\"type\":\"BOOKMARK\",\"object\":{\"kind\":\"ConfigMap\",\"apiVersion\":\"v1\",\"metadata\":"
    "{\"resourceVersion\":\"568\",\"annotations\":{\"k8s.io/initial-events-end\":\"true\"}}}}";

TEST(kube_watch_parse_recorded)
{
    enum kube_event_type t;
    json_t *obj;
    cirrus_error err;
    ASSERT_OK(kube_watch_parse_event(recorded_gone, strlen(recorded_gone), &t, &obj, &err));
    ASSERT_EQ(t, KUBE_EVENT_ERROR);
    ASSERT_EQ(kube_watch_error_status(obj, &err), CIRRUS_EGONE);
    if (!strstr(err.msg, "too old resource version: 1 (305)")) TEST_FAIL("message: %s", err.msg);
    json_decref(obj);

    ASSERT_OK(kube_watch_parse_event(recorded_bookmark, strlen(recorded_bookmark), &t, &obj, &err));
    ASSERT_EQ(t, KUBE_EVENT_BOOKMARK);
    ASSERT(!strcmp(json_string_value(json_object_get(json_object_get(obj, "metadata"), "resourceVersion")), "568"));
    json_decref(obj);

    const char *internal = "{\"type\":\"ERROR\",\"object\":{\"kind\":\"Status\",\"code\":500,\"message\":\"boom\"}}";
    ASSERT_OK(kube_watch_parse_event(internal, strlen(internal), &t, &obj, &err));
    ASSERT_EQ(kube_watch_error_status(obj, &err), CIRRUS_EIO);
    json_decref(obj);

    ASSERT_EQ(kube_watch_parse_event("{\"type\":\"ADDED\"", 15, &t, &obj, &err), CIRRUS_ECORRUPT);
    const char *odd = "{\"type\":\"SHRUG\",\"object\":{}}";
    ASSERT_EQ(kube_watch_parse_event(odd, strlen(odd), &t, &obj, &err), CIRRUS_ECORRUPT);
    const char *noobj = "{\"type\":\"ADDED\",\"object\":3}";
    ASSERT_EQ(kube_watch_parse_event(noobj, strlen(noobj), &t, &obj, &err), CIRRUS_ECORRUPT);

    for (int i = 0; i < 50; i++) {
        int s = kube_watch_random_timeout_s();
        ASSERT(s >= 300 && s < 600);
    }
}

struct rec {
    int added, modified, deleted, bookmarks, ended, status;
    char last_name[128], bookmark_rv[128], end_msg[256];
};

static void rec_event(void *ctx, kube_watch *w, enum kube_event_type type, json_t *obj)
{
    struct rec *r = ctx;
    (void)w;
    const json_t *md = json_object_get(obj, "metadata");
    const char *name = json_string_value(json_object_get(md, "name"));
    switch (type) {
    case KUBE_EVENT_ADDED: r->added++; break;
    case KUBE_EVENT_MODIFIED: r->modified++; break;
    case KUBE_EVENT_DELETED: r->deleted++; break;
    case KUBE_EVENT_BOOKMARK:
        r->bookmarks++;
        snprintf(r->bookmark_rv, sizeof r->bookmark_rv, "%s",
                 json_string_value(json_object_get(md, "resourceVersion")));
        break;
    default: break;
    }
    if (name) snprintf(r->last_name, sizeof r->last_name, "%s", name);
}

static void rec_end(void *ctx, kube_watch *w, int status, const cirrus_error *err)
{
    struct rec *r = ctx;
    (void)w;
    r->ended = 1;
    r->status = status;
    snprintf(r->end_msg, sizeof r->end_msg, "%s", err ? err->msg : "");
}

static int has_bookmark(void *ctx) { return ((struct rec *)ctx)->bookmarks > 0; }
static int has_ended(void *ctx) { return ((struct rec *)ctx)->ended; }
static int added_2(void *ctx) { return ((struct rec *)ctx)->added >= 2; }

/* A real BOOKMARK: with sendInitialEvents the server ends the initial ADDED events with a
 * bookmark at once (periodic ones come only about once a minute). The watch keeps its
 * resourceVersion; later events still arrive on the same stream. */
TEST(kube_watch_bookmark)
{
    kube_config *cfg;
    kube_client *c = tk_client(&cfg);
    char ns[64], coll[256];
    cirrus_error err;
    tk_namespace(c, "bookmark", ns, sizeof ns);
    ASSERT_OK(kube_path(coll, sizeof coll, "api/v1", ns, "configmaps", NULL));
    json_t *cm = tk_configmap(ns, "before", "k", "v");
    ASSERT_OK(kube_create(c, coll, cm, NULL, &err));
    json_decref(cm);
    struct rec r = {0};
    kube_watch *w;
    ASSERT_OK(kube_watch_start(c, coll,
                               "sendInitialEvents=true&resourceVersionMatch=NotOlderThan&"
                               "labelSelector=cirrus-test%3Dyes",
                               NULL, 30, rec_event, rec_end, &r, &w, &err));
    if (!tk_poll_until(c, has_bookmark, &r, 10000)) TEST_FAIL("no BOOKMARK (ended: %s)", r.end_msg);
    ASSERT_EQ(r.added, 1);
    ASSERT(!strcmp(r.last_name, "before"));
    ASSERT(r.bookmark_rv[0]);
    ASSERT(!strcmp(kube_watch_resource_version(w), r.bookmark_rv));
    cm = tk_configmap(ns, "after", "k", "v");
    json_t *created = NULL;
    ASSERT_OK(kube_create(c, coll, cm, &created, &err));
    ASSERT(tk_poll_until(c, added_2, &r, 10000));
    ASSERT(!strcmp(r.last_name, "after"));
    ASSERT(!strcmp(kube_watch_resource_version(w),
                   json_string_value(json_object_get(json_object_get(created, "metadata"), "resourceVersion"))));
    ASSERT(!r.ended);
    json_decref(cm);
    json_decref(created);
    kube_watch_free(w);
    tk_client_free(c, cfg);
}

/* What this API server does with ?watch=1&resourceVersion=1 on a collection whose history
 * starts later: for a fresh CRD (fresh watch cache) it answers HTTP 200 and an in-stream
 * ERROR with code 410; the watch must end with CIRRUS_EGONE. */
TEST(kube_watch_expired_resource_version)
{
    kube_config *cfg;
    kube_client *c = tk_client(&cfg);
    char group[128], coll[256], api[160];
    cirrus_error err;
    tk_crd(c, "gone", group, sizeof group);
    snprintf(api, sizeof api, "apis/%s/v1", group);
    ASSERT_OK(kube_path(coll, sizeof coll, api, NULL, "probes", NULL));
    struct rec r = {0};
    kube_watch *w;
    ASSERT_OK(kube_watch_start(c, coll, NULL, "1", 30, rec_event, rec_end, &r, &w, &err));
    ASSERT(tk_poll_until(c, has_ended, &r, 10000));
    if (r.status != CIRRUS_EGONE) TEST_FAIL("status %d: %s", r.status, r.end_msg);
    if (!strstr(r.end_msg, "too old resource version")) TEST_FAIL("message: %s", r.end_msg);
    ASSERT_EQ(r.added, 0);
    kube_watch_free(w);
    tk_client_free(c, cfg);
}

/* The other form of 410: the HTTP status of the watch request itself. */
TEST(kube_watch_http_410)
{
    tk_fake *f = tk_fake_new();
    tk_fake_route(f, "GET /api/v1/namespaces/fake/configmaps?watch=1&allowWatchBookmarks=true&timeoutSeconds=", 410, NULL,
                  "{\"kind\":\"Status\",\"apiVersion\":\"v1\",\"status\":\"Failure\","
                  "\"message\":\"too old resource version: 7 (42)\",\"reason\":\"Expired\",\"code\":410}",
                  0);
    tk_fake_route(f, "resourceVersion=42", 200, NULL,
                  "{\"type\":\"ADDED\",\"object\":{\"metadata\":{\"name\":\"a\",\"resourceVersion\":\"43\"}}}\n"
                  "{\"type\":\"BOOKMARK\",\"object\":{\"metadata\":{\"resourceVersion\":\"50\"}}}\n"
                  "{\"type\":\"MODIFIED\",\"object\":{\"metadata\":{\"name\":\"a\",\"resourceVersion\":\"51\"}}}",
                  0);
    kube_config *cfg = tk_fake_config(tk_fake_run(f));
    kube_client *c;
    cirrus_error err;
    ASSERT_OK(kube_client_new(cfg, &c, &err));
    struct rec r = {0};
    kube_watch *w;
    ASSERT_OK(kube_watch_start(c, "/api/v1/namespaces/fake/configmaps", NULL, "7", 0, rec_event,
                               rec_end, &r, &w, &err));
    ASSERT(tk_poll_until(c, has_ended, &r, 5000));
    ASSERT_EQ(r.status, CIRRUS_EGONE);
    ASSERT(!strcmp(r.end_msg, "too old resource version: 7 (42)"));
    kube_watch_free(w);

    /* A stream closed by the server ends with status 0; the last line needs no newline. */
    struct rec r2 = {0};
    ASSERT_OK(kube_watch_start(c, "/api/v1/namespaces/fake/configmaps", NULL, "42", 0,
                               rec_event, rec_end, &r2, &w, &err));
    ASSERT(tk_poll_until(c, has_ended, &r2, 5000));
    ASSERT_EQ(r2.status, 0);
    ASSERT_EQ(r2.added, 1);
    ASSERT_EQ(r2.bookmarks, 1);
    ASSERT_EQ(r2.modified, 1);
    ASSERT(!strcmp(kube_watch_resource_version(w), "51"));
    kube_watch_free(w);
    ASSERT_EQ(tk_fake_served(f), 2);
    kube_client_free(c);
    kube_config_free(cfg);
    tk_fake_stop(f);
}

struct two {
    struct rec a, b;
};
static int both_added(void *ctx)
{
    struct two *t = ctx;
    return t->a.added >= 1 && t->b.added >= 1;
}

/* Two watches and synchronous requests progress in one event loop, over one connection. */
TEST(kube_watch_many_in_one_loop)
{
    kube_config *cfg;
    kube_client *c = tk_client(&cfg);
    char ns[64], ns2[80], coll1[256], coll2[256];
    cirrus_error err;
    tk_namespace(c, "multi", ns, sizeof ns);
    snprintf(ns2, sizeof ns2, "%s-b", ns);
    json_t *nsobj = json_pack("{s:{s:s}}", "metadata", "name", ns2);
    ASSERT_OK(kube_create(c, "/api/v1/namespaces", nsobj, NULL, &err));
    json_decref(nsobj);
    ASSERT_OK(kube_path(coll1, sizeof coll1, "api/v1", ns, "configmaps", NULL));
    ASSERT_OK(kube_path(coll2, sizeof coll2, "api/v1", ns2, "configmaps", NULL));
    json_t *list = NULL;
    ASSERT_OK(kube_get(c, coll1, &list, &err));
    char rv[64];
    snprintf(rv, sizeof rv, "%s", json_string_value(json_object_get(json_object_get(list, "metadata"), "resourceVersion")));
    json_decref(list);

    kube_client_stats s0, s1;
    kube_client_get_stats(c, &s0);
    struct two t = {0};
    kube_watch *w1, *w2;
    ASSERT_OK(kube_watch_start(c, coll1, "labelSelector=cirrus-test%3Dyes", rv, 30, rec_event, rec_end, &t.a, &w1, &err));
    ASSERT_OK(kube_watch_start(c, coll2, "labelSelector=cirrus-test%3Dyes", rv, 30, rec_event, rec_end, &t.b, &w2, &err));
    for (int i = 0; i < 10; i++) ASSERT_OK(kube_get(c, "/api/v1/namespaces/default", NULL, &err));
    json_t *cm1 = tk_configmap(ns, "one", "k", "v"), *cm2 = tk_configmap(ns2, "two", "k", "v");
    ASSERT_OK(kube_create(c, coll1, cm1, NULL, &err));
    ASSERT_OK(kube_create(c, coll2, cm2, NULL, &err));
    ASSERT(tk_poll_until(c, both_added, &t, 10000));
    ASSERT(!strcmp(t.a.last_name, "one") && !strcmp(t.b.last_name, "two"));
    kube_client_get_stats(c, &s1);
    fprintf(stderr, "  2 watches + 13 requests: %llu new connection(s)\n",
            (unsigned long long)(s1.connects - s0.connects));
    ASSERT(s1.connects - s0.connects <= 1);
    json_decref(cm1);
    json_decref(cm2);
    kube_watch_free(w1);
    kube_watch_free(w2);
    char p[256];
    snprintf(p, sizeof p, "/api/v1/namespaces/%s", ns2);
    kube_delete(c, p, NULL, NULL);
    tk_client_free(c, cfg);
}
