/* kube_client against the real API server: create/get/update/conflict/patch/delete of a
 * ConfigMap, server-side apply, Status messages, the status subresource, connection reuse;
 * and, against a scripted server, the 429 retry and its 5 s budget, and an HTTP 410. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../operator/kube/client.h"
#include "../../operator/kube/watch.h"
#include "../unit/test.h"
#include "kube_test_util.h"


static const char *rv_of(const json_t *o)
{
    return json_string_value(json_object_get(json_object_get(o, "metadata"), "resourceVersion"));
}

static const char *data_of(const json_t *o, const char *k)
{
    return json_string_value(json_object_get(json_object_get(o, "data"), k));
}

TEST(kube_request_configmap_crud)
{
    kube_config *cfg;
    kube_client *c = tk_client(&cfg);
    char ns[64], coll[256], path[320];
    cirrus_error err;
    tk_namespace(c, "crud", ns, sizeof ns);
    ASSERT_OK(kube_path(coll, sizeof coll, "api/v1", ns, "configmaps", NULL));
    ASSERT_OK(kube_path(path, sizeof path, "api/v1", ns, "configmaps", "c1"));

    /* create */
    json_t *cm = tk_configmap(ns, "c1", "k", "v1"), *created = NULL, *got = NULL;
    long http = 0;
    ASSERT_OK(kube_request(c, "POST", coll, cm, NULL, &http, &created, &err));
    ASSERT_EQ(http, 201);
    ASSERT(rv_of(created) && json_object_get(json_object_get(created, "metadata"), "uid"));
    /* create again: 409 AlreadyExists */
    json_t *status = NULL;
    ASSERT_EQ(kube_request(c, "POST", coll, cm, NULL, &http, &status, &err), CIRRUS_ECONFLICT);
    ASSERT_EQ(http, 409);
    ASSERT(!strcmp(kube_status_reason(status), "AlreadyExists"));
    ASSERT(!strcmp(err.msg, "configmaps \"c1\" already exists"));
    json_decref(status);

    /* get */
    ASSERT_OK(kube_get(c, path, &got, &err));
    ASSERT(!strcmp(data_of(got, "k"), "v1"));
    ASSERT(!strcmp(rv_of(got), rv_of(created)));

    /* update with the current resourceVersion */
    json_object_set_new(json_object_get(got, "data"), "k", json_string("v2"));
    json_t *updated = NULL;
    ASSERT_OK(kube_update(c, path, got, &updated, &err));
    ASSERT(!strcmp(data_of(updated, "k"), "v2"));
    ASSERT(strcmp(rv_of(updated), rv_of(created)));

    /* update with the stale one: 409 Conflict, told apart from AlreadyExists by reason */
    json_object_set_new(json_object_get(got, "data"), "k", json_string("v3"));
    ASSERT_EQ(kube_request(c, "PUT", path, got, NULL, &http, &status, &err), CIRRUS_ECONFLICT);
    ASSERT_EQ(http, 409);
    ASSERT(!strcmp(kube_status_reason(status), "Conflict"));
    if (!strstr(err.msg, "the object has been modified")) TEST_FAIL("message: %s", err.msg);
    json_decref(status);

    /* merge patch needs no resourceVersion */
    json_t *patch = json_pack("{s:{s:s}}", "data", "k2", "p"), *patched = NULL;
    ASSERT_OK(kube_patch_merge(c, path, patch, &patched, &err));
    ASSERT(!strcmp(data_of(patched, "k"), "v2") && !strcmp(data_of(patched, "k2"), "p"));

    /* delete; then 404 for get and delete */
    ASSERT_OK(kube_delete(c, path, NULL, &err));
    ASSERT_EQ(kube_get(c, path, NULL, &err), CIRRUS_ENOENT);
    ASSERT(!strcmp(err.msg, "configmaps \"c1\" not found"));
    ASSERT_EQ(kube_delete(c, path, NULL, &err), CIRRUS_ENOENT);

    json_decref(cm);
    json_decref(created);
    json_decref(got);
    json_decref(updated);
    json_decref(patch);
    json_decref(patched);
    tk_client_free(c, cfg);
}

static const json_t *manager_entry(const json_t *obj, const char *manager)
{
    size_t i;
    json_t *mf;
    json_array_foreach(json_object_get(json_object_get(obj, "metadata"), "managedFields"), i, mf)
    {
        const char *m = json_string_value(json_object_get(mf, "manager"));
        if (m && !strcmp(m, manager)) return mf;
    }
    return NULL;
}

TEST(kube_apply_idempotent)
{
    kube_config *cfg;
    kube_client *c = tk_client(&cfg);
    char ns[64], path[320];
    cirrus_error err;
    tk_namespace(c, "apply", ns, sizeof ns);
    ASSERT_OK(kube_path(path, sizeof path, "api/v1", ns, "configmaps", "applied"));
    json_t *cm = tk_configmap(ns, "applied", "k", "v"), *a1 = NULL, *a2 = NULL, *a3 = NULL;
    ASSERT_OK(kube_apply(c, path, cm, "cirrus-test", &a1, &err)); /* creates */
    ASSERT_OK(kube_apply(c, path, cm, "cirrus-test", &a2, &err)); /* no change */
    ASSERT(!strcmp(rv_of(a1), rv_of(a2)));
    const json_t *mf = manager_entry(a2, "cirrus-test");
    ASSERT(mf);
    ASSERT(!strcmp(json_string_value(json_object_get(mf, "operation")), "Apply"));
    /* A change of intent is applied; force=true takes fields another manager owns. */
    json_t *patch = json_pack("{s:{s:s}}", "data", "k", "by-kubectl");
    ASSERT_OK(kube_patch_merge(c, path, patch, NULL, &err));
    ASSERT_OK(kube_apply(c, path, cm, "cirrus-test", &a3, &err));
    ASSERT(!strcmp(data_of(a3, "k"), "v"));
    ASSERT(strcmp(rv_of(a3), rv_of(a2)));
    ASSERT_EQ(kube_apply(c, path, cm, "", NULL, &err), CIRRUS_EINVAL);
    json_decref(cm);
    json_decref(patch);
    json_decref(a1);
    json_decref(a2);
    json_decref(a3);
    tk_client_free(c, cfg);
}

/* kube_request_all: server-side applies side by side, one of them refused (an invalid
 * name): each call gets its own result, the others are made, their responses returned. */
TEST(kube_request_all_side_by_side)
{
    kube_config *cfg;
    kube_client *c = tk_client(&cfg);
    char ns[64], path[5][320], apply[5][400];
    cirrus_error err;
    tk_namespace(c, "many", ns, sizeof ns);
    const char *names[5] = {"m0", "m1", "Not_Valid", "m3", "m4"};
    json_t *cms[5];
    kube_call calls[5];
    for (int i = 0; i < 5; i++) {
        cms[i] = tk_configmap(ns, names[i], "k", names[i]);
        ASSERT_OK(kube_path(path[i], sizeof path[i], "api/v1", ns, "configmaps",
                            i == 2 ? "not-valid" : names[i]));
        ASSERT_OK(kube_apply_path(apply[i], sizeof apply[i], path[i], "cirrus-test", &err));
        calls[i] = (kube_call){.method = "PATCH", .path = apply[i], .body = cms[i],
                               .content_type = KUBE_CT_APPLY_PATCH, .want_response = i != 4};
    }
    kube_client_stats before, after;
    kube_client_get_stats(c, &before);
    kube_request_all(c, calls, 5);
    kube_client_get_stats(c, &after);
    ASSERT_EQ(after.transfers - before.transfers, 5);
    for (int i = 0; i < 5; i++) {
        if (i == 2) {
            ASSERT(calls[i].rc != 0 && calls[i].err.msg[0]);
            ASSERT(!calls[i].response);
            continue;
        }
        if (calls[i].rc) TEST_FAIL("call %d: %s", i, calls[i].err.msg);
        if (i == 4) {
            ASSERT(!calls[i].response); /* not asked for */
        } else {
            ASSERT(!strcmp(data_of(calls[i].response, "k"), names[i]));
            json_decref(calls[i].response);
        }
        json_t *got = NULL;
        ASSERT_OK(kube_get(c, path[i], &got, &err));
        json_decref(got);
    }
    for (int i = 0; i < 5; i++) json_decref(cms[i]);
    kube_request_all(c, calls, 0); /* nothing to do */
    tk_client_free(c, cfg);
}

TEST(kube_status_error_message)
{
    kube_config *cfg;
    kube_client *c = tk_client(&cfg);
    char ns[64], coll[256];
    cirrus_error err;
    tk_namespace(c, "status", ns, sizeof ns);
    ASSERT_OK(kube_path(coll, sizeof coll, "api/v1", ns, "configmaps", NULL));
    json_t *cm = tk_configmap(ns, "Bad_Name", "k", "v"), *status = NULL;
    long http;
    ASSERT_EQ(kube_request(c, "POST", coll, cm, NULL, &http, &status, &err), CIRRUS_EINVAL);
    ASSERT_EQ(http, 422);
    ASSERT(!strcmp(kube_status_reason(status), "Invalid"));
    const char *want = "ConfigMap \"Bad_Name\" is invalid: metadata.name: Invalid value: \"Bad_Name\"";
    if (strncmp(err.msg, want, strlen(want))) TEST_FAIL("message: %s", err.msg);
    json_decref(cm);
    json_decref(status);
    /* Not JSON at all (a 400 from a bad body): still one line naming the problem. */
    json_t *bad = json_string("not an object");
    ASSERT_EQ(kube_create(c, coll, bad, NULL, &err), CIRRUS_EINVAL);
    ASSERT(err.msg[0]);
    json_decref(bad);
    tk_client_free(c, cfg);
}

TEST(kube_update_status_subresource)
{
    kube_config *cfg;
    kube_client *c = tk_client(&cfg);
    char ns[64], group[128], coll[256], path[320];
    cirrus_error err;
    tk_crd(c, "status", group, sizeof group);
    tk_namespace(c, "substatus", ns, sizeof ns);
    char api[160];
    snprintf(api, sizeof api, "apis/%s/v1", group);
    ASSERT_OK(kube_path(coll, sizeof coll, api, ns, "probes", NULL));
    ASSERT_OK(kube_path(path, sizeof path, api, ns, "probes", "p1"));
    char av[160];
    snprintf(av, sizeof av, "%s/v1", group);
    json_t *p = json_pack("{s:s, s:s, s:{s:s}, s:{s:i}}", "apiVersion", av, "kind", "Probe",
                          "metadata", "name", "p1", "spec", "a", 1),
           *created = NULL, *after = NULL;
    ASSERT_OK(kube_create(c, coll, p, &created, &err));
    /* Through /status the status changes and the spec is ignored. */
    json_object_set_new(created, "status", json_pack("{s:s}", "phase", "Running"));
    json_object_set_new(json_object_get(created, "spec"), "a", json_integer(2));
    ASSERT_OK(kube_update_status(c, path, created, &after, &err));
    ASSERT(!strcmp(json_string_value(json_object_get(json_object_get(after, "status"), "phase")), "Running"));
    ASSERT_EQ(json_integer_value(json_object_get(json_object_get(after, "spec"), "a")), 1);
    /* Stale resourceVersion on /status: the same 409. */
    ASSERT_EQ(kube_update_status(c, path, created, NULL, &err), CIRRUS_ECONFLICT);
    json_decref(p);
    json_decref(created);
    json_decref(after);
    tk_client_free(c, cfg);
}

/* One multi handle, keep-alive (HTTP/2 here): 20 requests, at most 2 connections. */
TEST(kube_connection_reuse)
{
    kube_config *cfg;
    kube_client *c = tk_client(&cfg);
    cirrus_error err;
    kube_client_stats st;
    int64_t t0 = kube_now_ms();
    for (int i = 0; i < 20; i++) ASSERT_OK(kube_get(c, "/api/v1/namespaces/default", NULL, &err));
    int64_t t1 = kube_now_ms();
    kube_client_get_stats(c, &st);
    ASSERT_EQ(st.transfers, 20);
    fprintf(stderr, "  20 GETs: %llu connection(s), %lld ms\n", (unsigned long long)st.connects,
            (long long)(t1 - t0));
    ASSERT(st.connects >= 1 && st.connects <= 2);

    /* For contrast: a client per request pays a connection (and TLS handshake) each time. */
    int64_t t2 = kube_now_ms();
    for (int i = 0; i < 20; i++) {
        kube_client *one;
        ASSERT_OK(kube_client_new(cfg, &one, &err));
        ASSERT_OK(kube_get(one, "/api/v1/namespaces/default", NULL, &err));
        kube_client_stats s1;
        kube_client_get_stats(one, &s1);
        ASSERT_EQ(s1.connects, 1);
        kube_client_free(one);
    }
    fprintf(stderr, "  20 GETs with a new connection each: %lld ms\n",
            (long long)(kube_now_ms() - t2));
    tk_client_free(c, cfg);
}

/* ---- against a scripted server ---------------------------------------------------------- */

/* The server keeps answering 429 with Retry-After 2: the request waits 2 + 2 s, then gives
 * up rather than wait a third time past its 5 s budget (the loop renews the Lease). */
TEST(kube_request_429_budget)
{
    tk_fake *f = tk_fake_new();
    for (int i = 0; i < 4; i++)
        tk_fake_route(f, "GET /api/v1/namespaces/fake/configmaps/x", 429, "Retry-After: 2\r\n",
                      "{\"kind\":\"Status\",\"code\":429,\"reason\":\"TooManyRequests\","
                      "\"message\":\"too many requests\"}", 0);
    kube_config *cfg = tk_fake_config(tk_fake_run(f));
    kube_client *c;
    cirrus_error err;
    ASSERT_OK(kube_client_new(cfg, &c, &err));
    int64_t t0 = kube_now_ms();
    ASSERT_EQ(kube_get(c, "/api/v1/namespaces/fake/configmaps/x", NULL, &err), CIRRUS_EIO);
    int64_t dt = kube_now_ms() - t0;
    ASSERT(dt >= 4000 && dt < 5000 + 2000); /* two waits of 2 s, not a third */
    ASSERT(!strcmp(err.msg, "too many requests"));
    kube_client_stats st;
    kube_client_get_stats(c, &st);
    ASSERT_EQ(st.retries, 2);
    ASSERT_EQ(tk_fake_served(f), 3);
    kube_client_free(c);
    kube_config_free(cfg);
    tk_fake_stop(f);
}

TEST(kube_request_retries_429)
{
    tk_fake *f = tk_fake_new();
    tk_fake_route(f, "GET /api/v1/namespaces/fake/configmaps/x", 429, "Retry-After: 1\r\n",
                  "{\"kind\":\"Status\",\"code\":429,\"reason\":\"TooManyRequests\","
                  "\"message\":\"storage is (re)initializing\"}", 0);
    tk_fake_route(f, "GET /api/v1/namespaces/fake/configmaps/x", 200, NULL,
                  "{\"kind\":\"ConfigMap\",\"metadata\":{\"name\":\"x\"}}", 0);
    tk_fake_route(f, "GET /api/v1/namespaces/fake/configmaps/y", 410, NULL,
                  "{\"kind\":\"Status\",\"code\":410,\"reason\":\"Expired\","
                  "\"message\":\"The provided continue parameter is too old\"}", 0);
    kube_config *cfg = tk_fake_config(tk_fake_run(f));
    kube_client *c;
    cirrus_error err;
    json_t *obj = NULL;
    ASSERT_OK(kube_client_new(cfg, &c, &err));
    int64_t t0 = kube_now_ms();
    if (kube_get(c, "/api/v1/namespaces/fake/configmaps/x", &obj, &err)) TEST_FAIL("%s", err.msg);
    int64_t dt = kube_now_ms() - t0;
    ASSERT(dt >= 1000 && dt < 3000); /* waited Retry-After */
    ASSERT(!strcmp(json_string_value(json_object_get(json_object_get(obj, "metadata"), "name")), "x"));
    kube_client_stats st;
    kube_client_get_stats(c, &st);
    ASSERT_EQ(st.retries, 1);
    ASSERT_EQ(kube_get(c, "/api/v1/namespaces/fake/configmaps/y", NULL, &err), CIRRUS_EGONE);
    ASSERT(!strcmp(err.msg, "The provided continue parameter is too old"));
    ASSERT_EQ(tk_fake_served(f), 3);
    json_decref(obj);
    kube_client_free(c);
    kube_config_free(cfg);
    tk_fake_stop(f);
}

TEST(kube_request_response_cap_and_paths)
{
    char p[64];
    ASSERT_OK(kube_path(p, sizeof p, "api/v1", NULL, "namespaces", "x"));
    ASSERT(!strcmp(p, "/api/v1/namespaces/x"));
    ASSERT_OK(kube_path(p, sizeof p, "apis/cirrus.dev/v1", "ns", "swarmjobs", NULL));
    ASSERT(!strcmp(p, "/apis/cirrus.dev/v1/namespaces/ns/swarmjobs"));
    ASSERT_EQ(kube_path(p, sizeof p, "api/v1", "a/b", "pods", NULL), CIRRUS_EINVAL);
    ASSERT_EQ(kube_path(p, sizeof p, "api/v1", "ns", "pods", "x?y"), CIRRUS_EINVAL);
    ASSERT_EQ(kube_path(p, 10, "api/v1", "ns", "pods", "x"), CIRRUS_EINVAL);
    json_t *o = json_pack("{s:{s:s, s:s}}", "metadata", "namespace", "n", "name", "x");
    ASSERT_OK(kube_object_key(o, p, sizeof p));
    ASSERT(!strcmp(p, "n/x"));
    json_decref(o);
    o = json_pack("{s:{s:s}}", "metadata", "name", "node1");
    ASSERT_OK(kube_object_key(o, p, sizeof p));
    ASSERT(!strcmp(p, "node1"));
    json_decref(o);
    ASSERT_EQ(kube_http_error(201), 0);
    ASSERT_EQ(kube_http_error(409), CIRRUS_ECONFLICT);
    ASSERT_EQ(kube_http_error(410), CIRRUS_EGONE);
    ASSERT_EQ(kube_http_error(403), CIRRUS_EIO);
}
