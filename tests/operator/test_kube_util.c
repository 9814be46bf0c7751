/* Helpers shared by the kube tests (declared in each test file, as test.h declares no
 * more): a client for the test cluster ($KUBECONFIG, set by tests/operator/run.sh),
 * scratch namespaces and CRDs deleted when the test exits, polling with a deadline, and a
 * tiny scripted HTTP/1.1 server for the answers a real API server will not give on demand
 * (HTTP 410 on a watch, 429 with Retry-After). */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "../../operator/kube/client.h"
#include "../../operator/kube/config.h"
#include "../unit/test.h"
#include "kube_test_util.h"

/* ---- the real cluster ------------------------------------------------------------------ */

kube_client *tk_client(kube_config **cfg_out)
{
    const char *kc = getenv("KUBECONFIG");
    if (!kc || !*kc) TEST_FAIL("KUBECONFIG is not set: run these tests with make test-operator");
    kube_config *cfg;
    kube_client *c;
    cirrus_error err;
    if (kube_config_from_kubeconfig(kc, NULL, &cfg, &err)) TEST_FAIL("kubeconfig: %s", err.msg);
    if (kube_client_new(cfg, &c, &err)) TEST_FAIL("client: %s", err.msg);
    *cfg_out = cfg;
    return c;
}

void tk_client_free(kube_client *c, kube_config *cfg)
{
    kube_client_free(c);
    kube_config_free(cfg);
}

/* Paths to DELETE when the test process exits (an ASSERT exits too). */
static char cleanup_paths[8][320];
static int n_cleanup;

static void cleanup(void)
{
    if (!n_cleanup) return;
    kube_config *cfg;
    kube_client *c;
    if (kube_config_from_kubeconfig(getenv("KUBECONFIG"), NULL, &cfg, NULL)) return;
    if (kube_client_new(cfg, &c, NULL) == 0) {
        for (int i = n_cleanup - 1; i >= 0; i--) kube_delete(c, cleanup_paths[i], NULL, NULL);
        kube_client_free(c);
    }
    kube_config_free(cfg);
    n_cleanup = 0;
}

static void on_exit_delete(const char *path)
{
    if (n_cleanup == 0) atexit(cleanup);
    if (n_cleanup < 8) snprintf(cleanup_paths[n_cleanup++], sizeof cleanup_paths[0], "%s", path);
}

/* A fresh namespace "kt-PREFIX-PID", deleted at exit. */
void tk_namespace(kube_client *c, const char *prefix, char *ns, size_t n)
{
    snprintf(ns, n, "kt-%s-%d", prefix, (int)getpid());
    json_t *obj = json_pack("{s:s, s:s, s:{s:s}}", "apiVersion", "v1", "kind", "Namespace",
                            "metadata", "name", ns);
    cirrus_error err;
    if (kube_create(c, "/api/v1/namespaces", obj, NULL, &err)) TEST_FAIL("namespace %s: %s", ns, err.msg);
    json_decref(obj);
    char path[256];
    snprintf(path, sizeof path, "/api/v1/namespaces/%s", ns);
    on_exit_delete(path);
}

json_t *tk_configmap(const char *ns, const char *name, const char *key, const char *value)
{
    return json_pack("{s:s, s:s, s:{s:s, s:s, s:{s:s}}, s:{s:s}}", "apiVersion", "v1", "kind",
                     "ConfigMap", "metadata", "name", name, "namespace", ns, "labels",
                     "cirrus-test", "yes", "data", key, value);
}

/* Poll the client until done(ctx) or timeout_ms; returns done's last value. */
int tk_poll_until(kube_client *c, int (*done)(void *), void *ctx, int timeout_ms)
{
    int64_t end = kube_now_ms() + timeout_ms;
    while (!done(ctx)) {
        if (kube_now_ms() >= end) return 0;
        if (kube_client_poll(c, 100)) TEST_FAIL("kube_client_poll failed");
    }
    return 1;
}

/* A namespaced CRD "probes.GROUP" (GROUP = "tPID-TAG.kubetest.cirrus.dev") with a status
 * subresource, Established and served; deleted at exit. A fresh CRD also has a fresh watch
 * cache, which is what makes resourceVersion "1" too old for it. */
void tk_crd(kube_client *c, const char *tag, char *group, size_t n)
{
    snprintf(group, n, "t%d-%s.kubetest.cirrus.dev", (int)getpid(), tag);
    char name[256], path[320];
    snprintf(name, sizeof name, "probes.%s", group);
    json_t *crd = json_pack(
        "{s:s, s:s, s:{s:s}, s:{s:s, s:s, s:{s:s, s:s, s:s}, s:[{s:s, s:b, s:b, s:{s:{}},"
        " s:{s:{s:s, s:b}}}]}}",
        "apiVersion", "apiextensions.k8s.io/v1", "kind", "CustomResourceDefinition", "metadata",
        "name", name, "spec", "group", group, "scope", "Namespaced", "names", "plural", "probes",
        "singular", "probe", "kind", "Probe", "versions", "name", "v1", "served", 1, "storage", 1,
        "subresources", "status", "schema", "openAPIV3Schema", "type", "object",
        "x-kubernetes-preserve-unknown-fields", 1);
    if (!crd) TEST_FAIL("json_pack CRD");
    cirrus_error err;
    if (kube_create(c, "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd, NULL, &err))
        TEST_FAIL("CRD %s: %s", name, err.msg);
    json_decref(crd);
    snprintf(path, sizeof path, "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/%s", name);
    on_exit_delete(path);
    /* Established, then served: the first LIST may answer 429 while the storage initialises
     * (kube_request retries that). */
    int64_t end = kube_now_ms() + 15000;
    for (;;) {
        json_t *obj = NULL;
        int established = 0;
        if (kube_get(c, path, &obj, &err) == 0) {
            size_t i;
            json_t *cond;
            json_array_foreach(json_object_get(json_object_get(obj, "status"), "conditions"), i, cond)
            {
                const char *t = json_string_value(json_object_get(cond, "type"));
                const char *s = json_string_value(json_object_get(cond, "status"));
                if (t && s && !strcmp(t, "Established") && !strcmp(s, "True")) established = 1;
            }
        }
        json_decref(obj);
        if (established) break;
        if (kube_now_ms() > end) TEST_FAIL("CRD %s not Established", name);
        usleep(100000);
    }
    snprintf(path, sizeof path, "/apis/%s/v1/probes", group);
    while (kube_get(c, path, NULL, &err)) {
        if (kube_now_ms() > end) TEST_FAIL("GET %s: %s", path, err.msg);
        usleep(100000);
    }
}

/* ---- a scripted HTTP/1.1 server -------------------------------------------------------- */

typedef struct tk_route {
    const char *match;   /* must occur in the request line */
    int status;
    const char *headers; /* extra header lines, each ending in \r\n, or NULL */
    const char *body;
    int hold;            /* keep the connection open after the body (a live watch) */
} tk_route;

typedef struct tk_fake {
    int fd, port, stop;
    tk_route routes[16];
    int n_routes, next;
    int held[16], n_held;
    char error[512];
    pthread_mutex_t lock; /* next and error: read by the test's thread */
    pthread_t thread;
} tk_fake;

static void fake_serve(tk_fake *f, int fd)
{
    char req[8192];
    size_t len = 0;
    while (len < sizeof req - 1) {
        struct pollfd p = {fd, POLLIN, 0};
        if (poll(&p, 1, 2000) <= 0) break;
        ssize_t n = read(fd, req + len, sizeof req - 1 - len);
        if (n <= 0) break;
        len += (size_t)n;
        req[len] = '\0';
        if (strstr(req, "\r\n\r\n")) break;
    }
    req[len] = '\0';
    char *eol = strstr(req, "\r\n");
    if (eol) *eol = '\0';
    pthread_mutex_lock(&f->lock);
    const tk_route *r = f->next < f->n_routes ? &f->routes[f->next] : NULL;
    if (r && !strstr(req, r->match)) {
        if (!f->error[0])
            snprintf(f->error, sizeof f->error, "request %d: wanted '%.100s', got '%.300s'", f->next,
                     r->match, req);
        r = NULL;
    }
    if (r) f->next++;
    pthread_mutex_unlock(&f->lock);
    char head[1024];
    const char *body = r ? r->body : "{\"kind\":\"Status\",\"code\":500,\"message\":\"no route\"}";
    int status = r ? r->status : 500;
    if (r && r->hold)
        snprintf(head, sizeof head,
                 "HTTP/1.1 %d X\r\nContent-Type: application/json\r\nConnection: close\r\n%s\r\n",
                 status, r->headers ? r->headers : "");
    else
        snprintf(head, sizeof head,
                 "HTTP/1.1 %d X\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n"
                 "Connection: close\r\n%s\r\n",
                 status, strlen(body), r && r->headers ? r->headers : "");
    if (write(fd, head, strlen(head)) < 0 || write(fd, body, strlen(body)) < 0) {
        /* the client went away: nothing to do */
    }
    if (r && r->hold && f->n_held < 16)
        f->held[f->n_held++] = fd;
    else
        close(fd);
}

static void *fake_main(void *arg)
{
    tk_fake *f = arg;
    while (!__atomic_load_n(&f->stop, __ATOMIC_ACQUIRE)) {
        struct pollfd p = {f->fd, POLLIN, 0};
        if (poll(&p, 1, 50) <= 0) continue;
        int c = accept(f->fd, NULL, NULL);
        if (c >= 0) fake_serve(f, c);
    }
    return NULL;
}

/* Answers are given in the order they were added: tk_fake_new, tk_fake_route..., then
 * tk_fake_run. Strings are borrowed. */
tk_fake *tk_fake_new(void)
{
    tk_fake *f = calloc(1, sizeof *f);
    if (!f) TEST_FAIL("out of memory");
    pthread_mutex_init(&f->lock, NULL);
    return f;
}

void tk_fake_route(tk_fake *f, const char *match, int status, const char *headers,
                   const char *body, int hold)
{
    if (f->n_routes == 16) TEST_FAIL("too many routes");
    f->routes[f->n_routes++] = (tk_route){match, status, headers, body, hold};
}

/* Start serving; returns the port. */
int tk_fake_run(tk_fake *f)
{
    struct sockaddr_in a = {0};
    socklen_t al = sizeof a;
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    f->fd = socket(AF_INET, SOCK_STREAM, 0);
    if (f->fd < 0 || bind(f->fd, (struct sockaddr *)&a, sizeof a) || listen(f->fd, 16) ||
        getsockname(f->fd, (struct sockaddr *)&a, &al))
        TEST_FAIL("fake server socket");
    f->port = ntohs(a.sin_port);
    if (pthread_create(&f->thread, NULL, fake_main, f)) TEST_FAIL("fake server thread");
    return f->port;
}

/* How many scripted answers were given; the first mismatch, if any, fails the test. */
int tk_fake_served(tk_fake *f)
{
    pthread_mutex_lock(&f->lock);
    int n = f->next;
    char error[512];
    snprintf(error, sizeof error, "%s", f->error);
    pthread_mutex_unlock(&f->lock);
    if (error[0]) TEST_FAIL("fake server: %s", error);
    return n;
}

void tk_fake_stop(tk_fake *f)
{
    __atomic_store_n(&f->stop, 1, __ATOMIC_RELEASE);
    pthread_join(f->thread, NULL);
    for (int i = 0; i < f->n_held; i++) close(f->held[i]);
    close(f->fd);
    pthread_mutex_destroy(&f->lock);
    free(f);
}

/* A kubeconfig for http://127.0.0.1:PORT, written to the test's scratch dir, loaded. */
kube_config *tk_fake_config(int port)
{
    char path[512];
    snprintf(path, sizeof path, "%s/fake-kubeconfig", test_tmpdir());
    FILE *fp = fopen(path, "w");
    if (!fp) TEST_FAIL("cannot write %s", path);
    fprintf(fp,
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n"
            "    server: http://127.0.0.1:%d\ncontexts:\n- name: fake\n  context:\n"
            "    cluster: fake\n    namespace: fake\ncurrent-context: fake\n",
            port);
    fclose(fp);
    kube_config *cfg;
    cirrus_error err;
    if (kube_config_from_kubeconfig(path, NULL, &cfg, &err)) TEST_FAIL("fake kubeconfig: %s", err.msg);
    return cfg;
}
