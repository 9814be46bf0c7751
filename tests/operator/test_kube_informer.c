/* kube_informer: list + watch of ConfigMaps in a fresh namespace (every change delivered
 * in order), paging, and re-listing after 410 delivering what happened while it was
 * disconnected: against the real API server (in-stream 410) and a scripted one (HTTP 410). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../operator/kube/client.h"
#include "../../operator/kube/informer.h"
#include "../unit/test.h"
#include "kube_test_util.h"


/* Handlers append "add NAME", "update NAME OLDVAL>NEWVAL", "delete NAME" to a log. */
struct log {
    char lines[64][96];
    int n;
    kube_informer *inf;
};

static const char *name_of(const json_t *o)
{
    return json_string_value(json_object_get(json_object_get(o, "metadata"), "name"));
}

static const char *val_of(const json_t *o)
{
    const char *v = json_string_value(json_object_get(json_object_get(o, "data"), "k"));
    return v ? v : "-";
}

static void logf_(struct log *l, const char *a, const char *b)
{
    if (l->n < 64) snprintf(l->lines[l->n++], sizeof l->lines[0], "%s %s", a, b);
}

static void on_add(void *ctx, const json_t *o) { logf_(ctx, "add", name_of(o)); }
static void on_update(void *ctx, const json_t *old, const json_t *new_obj)
{
    char b[80];
    snprintf(b, sizeof b, "%.30s %.20s>%.20s", name_of(new_obj), val_of(old), val_of(new_obj));
    logf_(ctx, "update", b);
}
static void on_delete(void *ctx, const json_t *o) { logf_(ctx, "delete", name_of(o)); }

static void expect_log(struct log *l, const char *const *want, int n)
{
    int ok = l->n == n;
    for (int i = 0; ok && i < n; i++) ok = !strcmp(l->lines[i], want[i]);
    if (ok) return;
    for (int i = 0; i < l->n; i++) fprintf(stderr, "    event %d: %s\n", i, l->lines[i]);
    for (int i = 0; i < n; i++) fprintf(stderr, "    wanted %d: %s\n", i, want[i]);
    TEST_FAIL("events differ");
}

struct wait_n {
    struct log *l;
    int n;
};
static int log_has(void *ctx)
{
    struct wait_n *w = ctx;
    return w->l->n >= w->n;
}
static int synced(void *ctx) { return kube_informer_has_synced(((struct log *)ctx)->inf); }

static void wait_events(kube_client *c, struct log *l, int n)
{
    struct wait_n w = {l, n};
    if (!tk_poll_until(c, log_has, &w, 15000)) {
        for (int i = 0; i < l->n; i++) fprintf(stderr, "    event %d: %s\n", i, l->lines[i]);
        TEST_FAIL("waited for %d events, got %d", n, l->n);
    }
}

static void put(kube_client *c, const char *coll, const char *ns, const char *name, const char *v)
{
    cirrus_error err;
    json_t *cm = tk_configmap(ns, name, "k", v);
    if (kube_create(c, coll, cm, NULL, &err)) TEST_FAIL("create %s: %s", name, err.msg);
    json_decref(cm);
}

/* The same events and cache whether objects are cached as objects or (compact) as text. */
static void configmaps_in_order(int compact)
{
    kube_config *cfg;
    kube_client *c = tk_client(&cfg);
    char ns[64], coll[256], path[320];
    cirrus_error err;
    tk_namespace(c, compact ? "informer-compact" : "informer", ns, sizeof ns);
    ASSERT_OK(kube_path(coll, sizeof coll, "api/v1", ns, "configmaps", NULL));
    put(c, coll, ns, "pre", "0");

    struct log l = {0};
    kube_informer_config ic = {.path = coll, .query = "labelSelector=cirrus-test%3Dyes",
                               .on_add = on_add, .on_update = on_update,
                               .on_delete = on_delete, .ctx = &l, .compact = compact};
    ASSERT_OK(kube_informer_new(c, &ic, &l.inf, &err));
    ASSERT(!kube_informer_has_synced(l.inf));
    ASSERT(tk_poll_until(c, synced, &l, 10000));
    ASSERT(kube_informer_get(l.inf, "x") == NULL);
    char key[128];
    snprintf(key, sizeof key, "%s/pre", ns);
    ASSERT(kube_informer_get(l.inf, key));

    put(c, coll, ns, "c1", "1");
    ASSERT_OK(kube_path(path, sizeof path, "api/v1", ns, "configmaps", "c1"));
    json_t *patch = json_pack("{s:{s:s}}", "data", "k", "2");
    ASSERT_OK(kube_patch_merge(c, path, patch, NULL, &err));
    json_decref(patch);
    ASSERT_OK(kube_delete(c, path, NULL, &err));
    put(c, coll, ns, "c2", "x");
    wait_events(c, &l, 5);
    const char *want[] = {"add pre", "add c1", "update c1 1>2", "delete c1", "add c2"};
    expect_log(&l, want, 5);
    ASSERT_EQ(json_object_size(kube_informer_objects(l.inf)), 2);
    snprintf(key, sizeof key, "%s/c1", ns);
    ASSERT(kube_informer_get(l.inf, key) == NULL);
    snprintf(key, sizeof key, "%s/c2", ns);
    const json_t *c2 = kube_informer_get(l.inf, key);
    ASSERT(c2 && !strcmp(val_of(c2), "x"));
    /* Compact: text in the cache, one parsed object per get until released. */
    ASSERT_EQ(json_is_string(json_object_get(kube_informer_objects(l.inf), key)), compact);
    ASSERT(kube_informer_get(l.inf, key) == c2);
    kube_informer_release(l.inf);
    ASSERT(!strcmp(val_of(kube_informer_get(l.inf, key)), "x"));
    kube_informer_release(l.inf);
    kube_informer_stats st;
    kube_informer_get_stats(l.inf, &st);
    ASSERT_EQ(st.lists, 1);
    ASSERT_EQ(st.watches, 1);
    ASSERT_EQ(st.gone, 0);
    kube_informer_free(l.inf);
    tk_client_free(c, cfg);
}

TEST(kube_informer_configmaps_in_order) { configmaps_in_order(0); }
TEST(kube_informer_compact_same_events) { configmaps_in_order(1); }

/* A transform runs on every object, listed or watched, before the cache and the handlers
 * see it: here it drops metadata.managedFields and a data key, as the controller's slim_*
 * functions drop what reconciling never reads. */
static void drop_secret_and_managed_fields(json_t *obj)
{
    json_object_del(json_object_get(obj, "metadata"), "managedFields");
    json_object_del(json_object_get(obj, "data"), "secret");
}

static void expect_slim(const json_t *obj)
{
    ASSERT(obj);
    ASSERT(!json_object_get(json_object_get(obj, "metadata"), "managedFields"));
    ASSERT(!json_object_get(json_object_get(obj, "data"), "secret"));
    ASSERT(json_object_get(json_object_get(obj, "data"), "k"));
}

static void on_add_slim(void *ctx, const json_t *o)
{
    expect_slim(o);
    on_add(ctx, o);
}

TEST(kube_informer_transform)
{
    kube_config *cfg;
    kube_client *c = tk_client(&cfg);
    char ns[64], coll[256], key[128];
    cirrus_error err;
    tk_namespace(c, "transform", ns, sizeof ns);
    ASSERT_OK(kube_path(coll, sizeof coll, "api/v1", ns, "configmaps", NULL));
    json_t *cm = tk_configmap(ns, "listed", "k", "1");
    json_object_set_new(json_object_get(cm, "data"), "secret", json_string("s"));
    ASSERT_OK(kube_create(c, coll, cm, NULL, &err));
    json_decref(cm);
    struct log l = {0};
    kube_informer_config ic = {.path = coll, .query = "labelSelector=cirrus-test%3Dyes",
                               .transform = drop_secret_and_managed_fields,
                               .on_add = on_add_slim, .ctx = &l};
    ASSERT_OK(kube_informer_new(c, &ic, &l.inf, &err));
    ASSERT(tk_poll_until(c, synced, &l, 10000));
    cm = tk_configmap(ns, "watched", "k", "2");
    json_object_set_new(json_object_get(cm, "data"), "secret", json_string("s"));
    ASSERT_OK(kube_create(c, coll, cm, NULL, &err));
    json_decref(cm);
    wait_events(c, &l, 2);
    snprintf(key, sizeof key, "%s/listed", ns);
    expect_slim(kube_informer_get(l.inf, key));
    snprintf(key, sizeof key, "%s/watched", ns);
    expect_slim(kube_informer_get(l.inf, key));
    kube_informer_free(l.inf);
    tk_client_free(c, cfg);
}

/* LIST in pages (limit 2 here, 500 in production) with continue tokens. */
TEST(kube_informer_paging)
{
    kube_config *cfg;
    kube_client *c = tk_client(&cfg);
    char ns[64], coll[256], name[16];
    cirrus_error err;
    tk_namespace(c, "paging", ns, sizeof ns);
    ASSERT_OK(kube_path(coll, sizeof coll, "api/v1", ns, "configmaps", NULL));
    for (int i = 0; i < 7; i++) {
        snprintf(name, sizeof name, "p%d", i);
        put(c, coll, ns, name, "v");
    }
    struct log l = {0};
    kube_informer_config ic = {.path = coll, .query = "labelSelector=cirrus-test%3Dyes",
                               .page_limit = 2, .on_add = on_add, .ctx = &l};
    ASSERT_OK(kube_informer_new(c, &ic, &l.inf, &err));
    kube_client_stats s0, s1;
    kube_client_get_stats(c, &s0);
    ASSERT(tk_poll_until(c, synced, &l, 10000));
    kube_client_get_stats(c, &s1);
    ASSERT_EQ(l.n, 7);
    ASSERT_EQ(json_object_size(kube_informer_objects(l.inf)), 7);
    ASSERT_EQ(s1.transfers - s0.transfers, 4); /* pages of 2, 2, 2, 1 */
    kube_informer_free(l.inf);
    tk_client_free(c, cfg);
}

static json_t *probe(const char *group, const char *name, const char *v)
{
    char av[160];
    snprintf(av, sizeof av, "%s/v1", group);
    return json_pack("{s:s, s:s, s:{s:s}, s:{s:s}}", "apiVersion", av, "kind", "Probe",
                     "metadata", "name", name, "data", "k", v);
}

static void create_probe(kube_client *c, const char *coll, const char *group, const char *name)
{
    cirrus_error err;
    json_t *o = probe(group, name, "1");
    if (kube_create(c, coll, o, NULL, &err)) TEST_FAIL("create %s: %s", name, err.msg);
    json_decref(o);
}
static int relisted(void *ctx)
{
    struct log *l = ctx;
    kube_informer_stats st;
    kube_informer_get_stats(l->inf, &st);
    return st.lists >= 2 && l->n >= 4;
}

/* The informer loses its watch; meanwhile one object is created, one deleted, one
 * changed. It comes back with a resourceVersion the server has no history for ("1" on a
 * fresh CRD: in-stream ERROR 410), re-lists, and delivers exactly those three changes. */
static void relist_after_410(int compact)
{
    kube_config *cfg;
    kube_client *c = tk_client(&cfg);
    char ns[64], group[128], api[160], coll[256], path[320];
    cirrus_error err;
    tk_crd(c, "relist", group, sizeof group);
    tk_namespace(c, compact ? "relist-compact" : "relist", ns, sizeof ns);
    snprintf(api, sizeof api, "apis/%s/v1", group);
    ASSERT_OK(kube_path(coll, sizeof coll, api, ns, "probes", NULL));
    create_probe(c, coll, group, "a");
    create_probe(c, coll, group, "b");
    create_probe(c, coll, group, "d");

    struct log l = {0};
    kube_informer_config ic = {.path = coll, .on_add = on_add, .on_update = on_update,
                               .on_delete = on_delete, .ctx = &l, .compact = compact};
    ASSERT_OK(kube_informer_new(c, &ic, &l.inf, &err));
    ASSERT(tk_poll_until(c, synced, &l, 10000));
    ASSERT_EQ(l.n, 3);

    /* Disconnected: nothing is polled while these happen. */
    kube_informer_disconnect(l.inf, "1");
    create_probe(c, coll, group, "c");
    ASSERT_OK(kube_path(path, sizeof path, api, ns, "probes", "a"));
    ASSERT_OK(kube_delete(c, path, NULL, &err));
    ASSERT_OK(kube_path(path, sizeof path, api, ns, "probes", "d"));
    json_t *patch = json_pack("{s:{s:s}}", "data", "k", "2");
    ASSERT_OK(kube_patch_merge(c, path, patch, NULL, &err));
    json_decref(patch);

    if (!tk_poll_until(c, relisted, &l, 15000)) TEST_FAIL("no re-list (%d events)", l.n);
    /* In list (name) order, then deletions. */
    const char *want[] = {"add a", "add b", "add d", "add c", "update d 1>2", "delete a"};
    expect_log(&l, want, 6);
    kube_informer_stats st;
    kube_informer_get_stats(l.inf, &st);
    ASSERT_EQ(st.gone, 1);
    ASSERT_EQ(st.lists, 2);
    const json_t *objs = kube_informer_objects(l.inf);
    ASSERT_EQ(json_object_size(objs), 3);
    char key[200];
    snprintf(key, sizeof key, "%s/a", ns);
    ASSERT(!kube_informer_get(l.inf, key));
    snprintf(key, sizeof key, "%s/c", ns);
    ASSERT(kube_informer_get(l.inf, key));

    /* And it watches again from the new list's resourceVersion. */
    create_probe(c, coll, group, "e");
    wait_events(c, &l, 7);
    ASSERT(!strcmp(l.lines[6], "add e"));
    kube_informer_free(l.inf);
    tk_client_free(c, cfg);
}

TEST(kube_informer_relist_after_410) { relist_after_410(0); }
/* The re-list's diff against a cache of text: the same adds, updates (old state parsed
 * back) and deletions. */
TEST(kube_informer_compact_relist_after_410) { relist_after_410(1); }

/* The same through HTTP 410 on the watch request, scripted: list {a, b}; watch -> 410;
 * re-list {b changed, c}; watch delivers d and stays open. */
TEST(kube_informer_http_410_relist)
{
    tk_fake *f = tk_fake_new();
    tk_fake_route(f, "GET /api/v1/namespaces/fake/configmaps?limit=500 ", 200, NULL,
                  "{\"kind\":\"ConfigMapList\",\"metadata\":{\"resourceVersion\":\"10\"},\"items\":["
                  "{\"metadata\":{\"name\":\"a\",\"namespace\":\"fake\",\"resourceVersion\":\"5\"},\"data\":{\"k\":\"1\"}},"
                  "{\"metadata\":{\"name\":\"b\",\"namespace\":\"fake\",\"resourceVersion\":\"6\"},\"data\":{\"k\":\"1\"}}]}",
                  0);
    tk_fake_route(f, "resourceVersion=10 ", 410, NULL,
                  "{\"kind\":\"Status\",\"code\":410,\"reason\":\"Expired\",\"message\":\"too old resource version: 10 (20)\"}",
                  0);
    tk_fake_route(f, "GET /api/v1/namespaces/fake/configmaps?limit=500 ", 200, NULL,
                  "{\"kind\":\"ConfigMapList\",\"metadata\":{\"resourceVersion\":\"30\"},\"items\":["
                  "{\"metadata\":{\"name\":\"b\",\"namespace\":\"fake\",\"resourceVersion\":\"25\"},\"data\":{\"k\":\"2\"}},"
                  "{\"metadata\":{\"name\":\"c\",\"namespace\":\"fake\",\"resourceVersion\":\"26\"},\"data\":{\"k\":\"1\"}}]}",
                  0);
    tk_fake_route(f, "resourceVersion=30 ", 200, NULL,
                  "{\"type\":\"ADDED\",\"object\":{\"metadata\":{\"name\":\"d\",\"namespace\":\"fake\",\"resourceVersion\":\"31\"}}}\n",
                  1);
    kube_config *cfg = tk_fake_config(tk_fake_run(f));
    kube_client *c;
    cirrus_error err;
    ASSERT_OK(kube_client_new(cfg, &c, &err));
    struct log l = {0};
    kube_informer_config ic = {.path = "/api/v1/namespaces/fake/configmaps", .on_add = on_add,
                               .on_update = on_update, .on_delete = on_delete, .ctx = &l};
    ASSERT_OK(kube_informer_new(c, &ic, &l.inf, &err));
    wait_events(c, &l, 6);
    const char *want[] = {"add a", "add b", "update b 1>2", "add c", "delete a", "add d"};
    expect_log(&l, want, 6);
    ASSERT(!strcmp(kube_informer_resource_version(l.inf), "31"));
    kube_informer_stats st;
    kube_informer_get_stats(l.inf, &st);
    ASSERT_EQ(st.gone, 1);
    ASSERT_EQ(st.lists, 2);
    ASSERT_EQ(tk_fake_served(f), 4);
    kube_informer_free(l.inf);
    kube_client_free(c);
    kube_config_free(cfg);
    tk_fake_stop(f);
}

/* A burst: 200 creates, 200 updates, 200 deletes while the informer watches. Every event
 * arrives, each object's in order, and the cache ends empty. */
struct burst {
    int adds, updates, deletes, out_of_order;
    kube_informer *inf;
};
static void b_add(void *ctx, const json_t *o)
{
    struct burst *b = ctx;
    b->adds++;
    if (strcmp(val_of(o), "0")) b->out_of_order++;
}
static void b_update(void *ctx, const json_t *old, const json_t *new_obj)
{
    struct burst *b = ctx;
    b->updates++;
    if (strcmp(val_of(old), "0") || strcmp(val_of(new_obj), "1")) b->out_of_order++;
}
static void b_delete(void *ctx, const json_t *o)
{
    struct burst *b = ctx;
    b->deletes++;
    if (strcmp(val_of(o), "1")) b->out_of_order++;
}
static int b_synced(void *ctx) { return kube_informer_has_synced(((struct burst *)ctx)->inf); }
static int b_done(void *ctx) { return ((struct burst *)ctx)->deletes == 200; }

TEST(kube_informer_burst)
{
    kube_config *cfg;
    kube_client *c = tk_client(&cfg);
    char ns[64], coll[256], path[320], name[32];
    cirrus_error err;
    tk_namespace(c, "burst", ns, sizeof ns);
    ASSERT_OK(kube_path(coll, sizeof coll, "api/v1", ns, "configmaps", NULL));
    struct burst b = {0};
    kube_informer_config ic = {.path = coll, .query = "labelSelector=cirrus-test%3Dyes",
                               .on_add = b_add, .on_update = b_update, .on_delete = b_delete,
                               .ctx = &b};
    ASSERT_OK(kube_informer_new(c, &ic, &b.inf, &err));
    ASSERT(tk_poll_until(c, b_synced, &b, 10000));
    int64_t t0 = kube_now_ms();
    json_t *patch = json_pack("{s:{s:s}}", "data", "k", "1");
    for (int i = 0; i < 200; i++) {
        snprintf(name, sizeof name, "b%03d", i);
        put(c, coll, ns, name, "0");
    }
    for (int i = 0; i < 200; i++) {
        snprintf(name, sizeof name, "b%03d", i);
        ASSERT_OK(kube_path(path, sizeof path, "api/v1", ns, "configmaps", name));
        ASSERT_OK(kube_patch_merge(c, path, patch, NULL, &err));
    }
    for (int i = 0; i < 200; i++) {
        snprintf(name, sizeof name, "b%03d", i);
        ASSERT_OK(kube_path(path, sizeof path, "api/v1", ns, "configmaps", name));
        ASSERT_OK(kube_delete(c, path, NULL, &err));
    }
    int64_t t1 = kube_now_ms();
    if (!tk_poll_until(c, b_done, &b, 15000))
        TEST_FAIL("adds %d updates %d deletes %d", b.adds, b.updates, b.deletes);
    fprintf(stderr, "  600 writes in %lld ms; all events delivered %lld ms after the last\n",
            (long long)(t1 - t0), (long long)(kube_now_ms() - t1));
    ASSERT_EQ(b.adds, 200);
    ASSERT_EQ(b.updates, 200);
    ASSERT_EQ(b.out_of_order, 0);
    ASSERT_EQ(json_object_size(kube_informer_objects(b.inf)), 0);
    json_decref(patch);
    kube_informer_free(b.inf);
    tk_client_free(c, cfg);
}
