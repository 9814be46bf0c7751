/* kube_config: the admin kubeconfig of the test cluster (client certificate), token
 * kubeconfigs and the in-cluster layout built in a scratch dir with a real service-account
 * token, token rotation, and the errors a user would see. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../../operator/kube/client.h"
#include "../../operator/kube/config.h"
#include "../../operator/kube/yamljson.h"
#include "../unit/test.h"
#include "kube_test_util.h"


static char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) TEST_FAIL("cannot open %s", path);
    char *buf = malloc(1 << 20);
    *len = fread(buf, 1, (1 << 20) - 1, f);
    buf[*len] = '\0';
    fclose(f);
    return buf;
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    if (!f) TEST_FAIL("cannot write %s", path);
    fputs(text, f);
    fclose(f);
}

/* The apiserver's version through a client on cfg: proves the credentials work. */
static void expect_version(kube_config *cfg)
{
    kube_client *c;
    cirrus_error err;
    json_t *v = NULL;
    ASSERT_OK(kube_client_new(cfg, &c, &err));
    if (kube_get(c, "/version", &v, &err)) TEST_FAIL("GET /version: %s", err.msg);
    const char *want = getenv("CIRRUS_K8S_VERSION");
    const char *got = json_string_value(json_object_get(v, "gitVersion"));
    ASSERT(got);
    if (want && strcmp(got, want)) TEST_FAIL("gitVersion %s, want %s", got, want);
    json_decref(v);
    kube_client_free(c);
}

TEST(kube_config_admin_kubeconfig)
{
    const char *kc = getenv("KUBECONFIG");
    if (!kc) TEST_FAIL("KUBECONFIG is not set: run with make test-operator");
    kube_config *cfg;
    cirrus_error err;
    if (kube_config_from_kubeconfig(kc, NULL, &cfg, &err)) TEST_FAIL("%s", err.msg);
    const char *api = getenv("CIRRUS_APISERVER");
    if (api) ASSERT(!strcmp(kube_config_server(cfg), api));
    ASSERT(!strcmp(kube_config_namespace(cfg), "default"));
    ASSERT(strstr(kube_config_source(cfg), kc));
    size_t ca_len, cert_len, key_len;
    const char *ca = kube_config_ca(cfg, &ca_len);
    const char *cert = kube_config_client_cert(cfg, &cert_len);
    const char *key = kube_config_client_key(cfg, &key_len);
    ASSERT(ca && cert && key);
    ASSERT(memmem(cert, cert_len, "-----BEGIN CERTIFICATE-----", 27));
    ASSERT(memmem(key, key_len, "PRIVATE KEY-----", 16));
    ASSERT(kube_config_token(cfg, 0) == NULL);
    /* certificate-authority-data decodes to exactly the CA file the cluster wrote. */
    const char *ca_file = getenv("CIRRUS_CA_FILE");
    if (ca_file) {
        size_t n;
        char *want = slurp(ca_file, &n);
        ASSERT_EQ(ca_len, n);
        ASSERT(memcmp(ca, want, n) == 0);
        free(want);
    }
    expect_version(cfg);
    kube_config_free(cfg);
}

/* A ServiceAccount token from the TokenRequest API (what `kubectl create token` does). */
static char *sa_token(kube_client *c, const char *ns)
{
    char path[256];
    cirrus_error err;
    json_t *sa = json_pack("{s:s, s:s, s:{s:s}}", "apiVersion", "v1", "kind", "ServiceAccount",
                           "metadata", "name", "reader");
    snprintf(path, sizeof path, "/api/v1/namespaces/%s/serviceaccounts", ns);
    if (kube_create(c, path, sa, NULL, &err)) TEST_FAIL("ServiceAccount: %s", err.msg);
    json_decref(sa);
    json_t *tr = json_pack("{s:s, s:s, s:{s:I}}", "apiVersion", "authentication.k8s.io/v1",
                           "kind", "TokenRequest", "spec", "expirationSeconds", (json_int_t)3600);
    json_t *out = NULL;
    snprintf(path, sizeof path, "/api/v1/namespaces/%s/serviceaccounts/reader/token", ns);
    if (kube_create(c, path, tr, &out, &err)) TEST_FAIL("TokenRequest: %s", err.msg);
    char *tok = strdup(json_string_value(json_object_get(json_object_get(out, "status"), "token")));
    json_decref(tr);
    json_decref(out);
    return tok;
}

TEST(kube_config_token_kubeconfig)
{
    kube_config *admin_cfg;
    kube_client *admin = tk_client(&admin_cfg);
    char ns[64], path[512], text[8192];
    tk_namespace(admin, "token", ns, sizeof ns);
    char *tok = sa_token(admin, ns);
    const char *dir = test_tmpdir();

    /* CA by relative file path, token inline. */
    size_t ca_len;
    const char *ca = kube_config_ca(admin_cfg, &ca_len);
    snprintf(path, sizeof path, "%s/ca.crt", dir);
    FILE *f = fopen(path, "wb");
    fwrite(ca, 1, ca_len, f);
    fclose(f);
    snprintf(text, sizeof text,
             "apiVersion: v1\nkind: Config\ncurrent-context: sa\nclusters:\n"
             "- name: c\n  cluster:\n    server: \"%s/\"\n    certificate-authority: ca.crt\n"
             "users:\n- name: reader\n  user:\n    token: %s\n"
             "contexts:\n- name: sa\n  context: {cluster: c, user: reader, namespace: %s}\n",
             kube_config_server(admin_cfg), tok, ns);
    snprintf(path, sizeof path, "%s/token-kubeconfig", dir);
    write_file(path, text);
    kube_config *cfg;
    cirrus_error err;
    if (kube_config_from_kubeconfig(path, NULL, &cfg, &err)) TEST_FAIL("%s", err.msg);
    ASSERT(!strcmp(kube_config_namespace(cfg), ns));
    ASSERT(!strcmp(kube_config_server(cfg), kube_config_server(admin_cfg))); /* '/' trimmed */
    ASSERT(!strcmp(kube_config_token(cfg, 0), tok));
    ASSERT(kube_config_client_cert(cfg, &ca_len) == NULL);
    expect_version(cfg);
    /* The token authenticates as the ServiceAccount, which RBAC does not let list secrets:
     * the Status message comes through. */
    kube_client *c;
    ASSERT_OK(kube_client_new(cfg, &c, &err));
    long http = 0;
    char sec[256];
    snprintf(sec, sizeof sec, "/api/v1/namespaces/%s/secrets", ns);
    int rc = kube_request(c, "GET", sec, NULL, NULL, &http, NULL, &err);
    ASSERT_EQ(rc, CIRRUS_EIO);
    ASSERT_EQ(http, 403);
    if (!strstr(err.msg, "system:serviceaccount:") || !strstr(err.msg, "forbidden"))
        TEST_FAIL("unexpected message: %s", err.msg);
    kube_client_free(c);
    kube_config_free(cfg);

    /* tokenFile (relative), and a KUBECONFIG list whose first file is missing. */
    snprintf(path, sizeof path, "%s/tok", dir);
    snprintf(text, sizeof text, "%s\n", tok);
    write_file(path, text);
    snprintf(text, sizeof text,
             "apiVersion: v1\nkind: Config\ncurrent-context: sa\nclusters:\n"
             "- name: c\n  cluster:\n    server: %s\n    certificate-authority: ca.crt\n"
             "users:\n- name: reader\n  user:\n    tokenFile: tok\n"
             "contexts:\n- name: sa\n  context:\n    cluster: c\n    user: reader\n",
             kube_config_server(admin_cfg));
    snprintf(path, sizeof path, "%s/tokenfile-kubeconfig", dir);
    write_file(path, text);
    char list[1200];
    snprintf(list, sizeof list, "%s/missing:%s", dir, path);
    if (kube_config_from_kubeconfig(list, NULL, &cfg, &err)) TEST_FAIL("%s", err.msg);
    ASSERT(!strcmp(kube_config_namespace(cfg), "default"));
    ASSERT(!strcmp(kube_config_token(cfg, 0), tok));
    expect_version(cfg);
    kube_config_free(cfg);
    free(tok);
    tk_client_free(admin, admin_cfg);
}

TEST(kube_config_in_cluster)
{
    kube_config *admin_cfg;
    kube_client *admin = tk_client(&admin_cfg);
    char ns[64], path[512];
    tk_namespace(admin, "incluster", ns, sizeof ns);
    char *tok = sa_token(admin, ns);
    const char *dir = test_tmpdir();
    size_t ca_len;
    const char *ca = kube_config_ca(admin_cfg, &ca_len);
    snprintf(path, sizeof path, "%s/ca.crt", dir);
    FILE *f = fopen(path, "wb");
    fwrite(ca, 1, ca_len, f);
    fclose(f);
    snprintf(path, sizeof path, "%s/token", dir);
    write_file(path, tok);
    snprintf(path, sizeof path, "%s/namespace", dir);
    write_file(path, ns);

    kube_config *cfg;
    cirrus_error err;
    unsetenv("KUBERNETES_SERVICE_HOST");
    ASSERT_EQ(kube_config_in_cluster(dir, &cfg, &err), CIRRUS_EINVAL);
    /* The service address as a pod sees it: here, the test apiserver's. */
    const char *server = kube_config_server(admin_cfg); /* https://127.0.0.1:PORT */
    const char *colon = strrchr(server, ':');
    setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1", 1);
    setenv("KUBERNETES_SERVICE_PORT", colon + 1, 1);
    if (kube_config_in_cluster(dir, &cfg, &err)) TEST_FAIL("%s", err.msg);
    ASSERT(!strcmp(kube_config_server(cfg), server));
    ASSERT(!strcmp(kube_config_namespace(cfg), ns));
    ASSERT(!strcmp(kube_config_source(cfg), "in-cluster"));
    expect_version(cfg);

    /* Rotation: the file is re-read once KUBE_TOKEN_RELOAD_MS have passed, not before. */
    /* Later than any read so far (expect_version's requests read it at the real clock). */
    int64_t t0 = kube_now_ms() + 10 * KUBE_TOKEN_RELOAD_MS;
    ASSERT(!strcmp(kube_config_token(cfg, t0), tok));
    snprintf(path, sizeof path, "%s/token", dir);
    write_file(path, "rotated-token\n");
    ASSERT(!strcmp(kube_config_token(cfg, t0 + KUBE_TOKEN_RELOAD_MS - 1), tok));
    ASSERT(!strcmp(kube_config_token(cfg, t0 + KUBE_TOKEN_RELOAD_MS), "rotated-token"));
    /* A failed re-read keeps the last token. */
    unlink(path);
    ASSERT(!strcmp(kube_config_token(cfg, t0 + 3 * KUBE_TOKEN_RELOAD_MS), "rotated-token"));
    kube_config_free(cfg);

    /* kube_config_load prefers --kubeconfig, then $KUBECONFIG, then in-cluster. */
    const char *kc = getenv("KUBECONFIG");
    char saved[1024];
    snprintf(saved, sizeof saved, "%s", kc);
    ASSERT_OK(kube_config_load(saved, &cfg, &err));
    ASSERT(strstr(kube_config_source(cfg), "kubeconfig"));
    kube_config_free(cfg);
    snprintf(path, sizeof path, "%s/token", dir);
    write_file(path, tok);
    unsetenv("KUBECONFIG");
    /* Without a flag or KUBECONFIG, KUBERNETES_SERVICE_HOST selects the in-cluster config
     * (whose real secrets dir this machine lacks). */
    int a = kube_config_load(NULL, &cfg, &err);
    if (a == 0) kube_config_free(cfg);
    int b = kube_config_in_cluster(NULL, &cfg, &err);
    if (b == 0) kube_config_free(cfg);
    ASSERT_EQ(a, b);
    setenv("KUBECONFIG", saved, 1);
    free(tok);
    tk_client_free(admin, admin_cfg);
}

TEST(kube_config_errors)
{
    cirrus_error err;
    kube_config *cfg;
    char path[512];
    const char *dir = test_tmpdir();
    snprintf(path, sizeof path, "%s/bad", dir);

    write_file(path, "apiVersion: v1\nclusters:\n  - name: [unclosed\n");
    ASSERT_EQ(kube_config_from_kubeconfig(path, NULL, &cfg, &err), CIRRUS_ECORRUPT);
    if (!strstr(err.msg, path) || !strstr(err.msg, ":4:")) TEST_FAIL("message: %s", err.msg);

    write_file(path, "current-context: nope\ncontexts: []\n");
    ASSERT_EQ(kube_config_from_kubeconfig(path, NULL, &cfg, &err), CIRRUS_EINVAL);
    ASSERT(strstr(err.msg, "context nope not found"));

    write_file(path, "current-context: x\ncontexts:\n- name: x\n  context: {cluster: c, user: u}\n"
                     "clusters:\n- name: c\n  cluster: {server: 'https://h:1'}\n"
                     "users:\n- name: u\n  user:\n    exec: {command: aws}\n");
    ASSERT_EQ(kube_config_from_kubeconfig(path, NULL, &cfg, &err), CIRRUS_EINVAL);
    ASSERT(strstr(err.msg, "exec"));

    write_file(path, "current-context: x\ncontexts:\n- name: x\n  context: {cluster: c, user: u}\n"
                     "clusters:\n- name: c\n  cluster: {server: 'https://h:1'}\n"
                     "users:\n- name: u\n  user:\n    client-certificate-data: bm90IHBlbQ==\n"
                     "    client-key-data: bm90IHBlbQ==\n");
    ASSERT_EQ(kube_config_from_kubeconfig(path, NULL, &cfg, &err), CIRRUS_ECORRUPT);
    ASSERT(strstr(err.msg, "client-certificate-data: not PEM"));

    write_file(path, "current-context: x\ncontexts:\n- name: x\n  context: {cluster: c}\n"
                     "clusters:\n- name: c\n  cluster: {server: 'ftp://h', insecure-skip-tls-verify: true}\n");
    ASSERT_EQ(kube_config_from_kubeconfig(path, NULL, &cfg, &err), CIRRUS_EINVAL);
    ASSERT(strstr(err.msg, "not an http(s) URL"));

    /* A URL with no host (the trailing '/' stripped used to leave "http:"; fuzz_kubeconfig). */
    const char *hostless[] = {"http://", "https:///", "https:////x"};
    for (int i = 0; i < 3; i++) {
        char doc[512];
        snprintf(doc, sizeof doc, "current-context: x\ncontexts:\n- name: x\n  context: {cluster: c}\n"
                 "clusters:\n- name: c\n  cluster: {server: '%s', insecure-skip-tls-verify: true}\n",
                 hostless[i]);
        write_file(path, doc);
        ASSERT_EQ(kube_config_from_kubeconfig(path, NULL, &cfg, &err), CIRRUS_EINVAL);
        if (!strstr(err.msg, "no host")) TEST_FAIL("%s: %s", hostless[i], err.msg);
    }
    write_file(path, "current-context: x\ncontexts:\n- name: x\n  context: {cluster: c}\n"
                     "clusters:\n- name: c\n  cluster: {server: 'https://h:1//', insecure-skip-tls-verify: true}\n");
    ASSERT_OK(kube_config_from_kubeconfig(path, NULL, &cfg, &err));
    ASSERT(!strcmp(kube_config_server(cfg), "https://h:1"));
    kube_config_free(cfg);

    /* Anchors and aliases are refused. */
    write_file(path, "a: &x {b: 1}\nc: *x\n");
    ASSERT_EQ(kube_config_from_kubeconfig(path, NULL, &cfg, &err), CIRRUS_ECORRUPT);
    ASSERT(strstr(err.msg, "aliases"));

    snprintf(path, sizeof path, "%s/does-not-exist", dir);
    ASSERT_EQ(kube_config_from_kubeconfig(path, NULL, &cfg, &err), CIRRUS_ENOENT);

    unsetenv("KUBERNETES_SERVICE_HOST");
    ASSERT_EQ(kube_config_in_cluster(dir, &cfg, &err), CIRRUS_EINVAL);
    ASSERT(strstr(err.msg, "KUBERNETES_SERVICE_HOST"));
}

TEST(kube_config_yaml_and_base64)
{
    const char *y = "a: 1\nb: 'quoted'\nc: [true, false, null, ~, -7, 12x]\nd:\n  e: \"2\"\n";
    json_t *j;
    cirrus_error err;
    ASSERT_OK(kube_yaml_parse(y, strlen(y), "t", &j, &err));
    char *s = json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS);
    if (strcmp(s, "{\"a\":1,\"b\":\"quoted\",\"c\":[true,false,null,null,-7,\"12x\"],\"d\":{\"e\":\"2\"}}"))
        TEST_FAIL("got %s", s);
    free(s);
    json_decref(j);
    ASSERT_OK(kube_yaml_parse("", 0, "t", &j, &err));
    ASSERT(json_is_null(j));
    json_decref(j);

    unsigned char *out;
    size_t n;
    ASSERT_OK(kube_base64_decode("aGVsbG8=", 8, &out, &n, &err));
    ASSERT_EQ(n, 5);
    ASSERT(!memcmp(out, "hello", 5));
    free(out);
    ASSERT_OK(kube_base64_decode("aGVs\nbG8h", 9, &out, &n, &err));
    ASSERT_EQ(n, 6);
    ASSERT(!memcmp(out, "hello!", 6));
    free(out);
    ASSERT_OK(kube_base64_decode("aGk=", 4, &out, &n, &err));
    ASSERT_EQ(n, 2);
    free(out);
    ASSERT_EQ(kube_base64_decode("abc", 3, &out, &n, &err), CIRRUS_ECORRUPT);
    ASSERT_EQ(kube_base64_decode("ab$=", 4, &out, &n, &err), CIRRUS_ECORRUPT);
}

/* A kubeconfig given as text (a member cluster's, from a Secret): inline credentials work;
 * a file path (the CA, a client certificate, a token file) is refused, naming the field. */
TEST(kube_config_from_data_inline_only)
{
    cirrus_error err;
    kube_config *cfg;
    const char *ok = "current-context: x\ncontexts:\n- name: x\n  context: {cluster: c, user: u}\n"
                     "clusters:\n- name: c\n  cluster: {server: 'https://east.example:6443/'}\n"
                     "users:\n- name: u\n  user: {token: abc}\n";
    ASSERT_OK(kube_config_from_data(ok, strlen(ok), "secret ns/east/kubeconfig", &cfg, &err));
    if (strcmp(kube_config_server(cfg), "https://east.example:6443"))
        TEST_FAIL("server %s", kube_config_server(cfg));
    const char *tok = kube_config_token(cfg, 0);
    if (!tok || strcmp(tok, "abc")) TEST_FAIL("token %s", tok ? tok : "(none)");
    kube_config_free(cfg);

    const char *files[] = {
        "current-context: x\ncontexts:\n- name: x\n  context: {cluster: c}\n"
        "clusters:\n- name: c\n  cluster: {server: 'https://h:1', certificate-authority: /etc/shadow}\n",
        "current-context: x\ncontexts:\n- name: x\n  context: {cluster: c, user: u}\n"
        "clusters:\n- name: c\n  cluster: {server: 'https://h:1'}\n"
        "users:\n- name: u\n  user: {client-certificate: a.crt, client-key: a.key}\n",
        "current-context: x\ncontexts:\n- name: x\n  context: {cluster: c, user: u}\n"
        "clusters:\n- name: c\n  cluster: {server: 'https://h:1'}\n"
        "users:\n- name: u\n  user: {tokenFile: /var/run/token}\n",
    };
    const char *field[] = {"certificate-authority", "client-certificate", "tokenFile"};
    for (int i = 0; i < 3; i++) {
        ASSERT_EQ(kube_config_from_data(files[i], strlen(files[i]), "s", &cfg, &err),
                  CIRRUS_EINVAL);
        if (!strstr(err.msg, field[i]) || !strstr(err.msg, "inline"))
            TEST_FAIL("case %d: message: %s", i, err.msg);
    }
    ASSERT_EQ(kube_config_from_data("- a\n", 4, "s", &cfg, &err), CIRRUS_ECORRUPT);
}
