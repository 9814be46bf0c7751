#include "config.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#include <openssl/evp.h>

#include "../../common/log.h"
#include "yamljson.h"

/* Files we read whole: a kubeconfig can hold many clusters; certificates and tokens are
 * a few KiB. The caps keep a wrong path (a device, a log) from eating memory. */
#define KUBECONFIG_MAX (16u << 20)
#define SMALL_FILE_MAX (1u << 20)

struct blob {
    unsigned char *data;
    size_t len;
};

struct kube_config {
    char *server;
    char *ns;
    char *source;
    int insecure;
    struct blob ca, cert, key;
    char *token;       /* current bearer token, or NULL */
    char *token_path;  /* re-read periodically when set */
    int64_t token_read_ms;
    int token_read_once;
};

static int read_file(const char *path, size_t max, unsigned char **out, size_t *out_len,
                     cirrus_error *err)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return cirrus_fail(err, errno == ENOENT ? CIRRUS_ENOENT : CIRRUS_EIO, "%s: %s", path,
                           strerror(errno));
    size_t alloc = 4096, len = 0;
    unsigned char *buf = malloc(alloc + 1);
    int rc = 0;
    if (!buf) {
        rc = cirrus_fail(err, CIRRUS_ENOMEM, "%s: out of memory", path);
        goto out;
    }
    for (;;) {
        if (len == alloc) {
            if (alloc >= max) {
                rc = cirrus_fail(err, CIRRUS_EINVAL, "%s: larger than %zu bytes", path, max);
                goto out;
            }
            alloc *= 2;
            unsigned char *nb = realloc(buf, alloc + 1);
            if (!nb) {
                rc = cirrus_fail(err, CIRRUS_ENOMEM, "%s: out of memory", path);
                goto out;
            }
            buf = nb;
        }
        size_t n = fread(buf + len, 1, alloc - len, f);
        len += n;
        if (n == 0) break;
    }
    if (ferror(f)) rc = cirrus_fail(err, CIRRUS_EIO, "%s: read error", path);
out:
    fclose(f);
    if (rc) {
        free(buf);
        return rc;
    }
    buf[len] = '\0'; /* so text files can be used as strings */
    *out = buf;
    *out_len = len;
    return 0;
}

int kube_base64_decode(const char *in, size_t in_len, unsigned char **out, size_t *out_len,
                       cirrus_error *err)
{
    /* EVP_DecodeBlock wants one unbroken block: drop the line breaks PEM-ish data may have. */
    char *clean = malloc(in_len + 1);
    unsigned char *bin = NULL;
    size_t n = 0;
    if (!clean) return cirrus_fail(err, CIRRUS_ENOMEM, "base64: out of memory");
    for (size_t i = 0; i < in_len; i++)
        if (!isspace((unsigned char)in[i])) clean[n++] = in[i];
    if (n % 4 != 0 || n > (size_t)INT32_MAX) {
        free(clean);
        return cirrus_fail(err, CIRRUS_ECORRUPT, "base64: length %zu is not a multiple of 4", n);
    }
    bin = malloc(n / 4 * 3 + 1);
    if (!bin) {
        free(clean);
        return cirrus_fail(err, CIRRUS_ENOMEM, "base64: out of memory");
    }
    int m = n ? EVP_DecodeBlock(bin, (unsigned char *)clean, (int)n) : 0;
    if (m < 0) {
        free(clean);
        free(bin);
        return cirrus_fail(err, CIRRUS_ECORRUPT, "base64: invalid characters");
    }
    /* EVP_DecodeBlock counts the padding as zero bytes: take them back off. */
    size_t pad = 0;
    if (n && clean[n - 1] == '=') pad++;
    if (n > 1 && clean[n - 2] == '=') pad++;
    free(clean);
    *out = bin;
    *out_len = (size_t)m - pad;
    return 0;
}

static int set_str(char **dst, const char *src, cirrus_error *err)
{
    free(*dst);
    *dst = src ? strdup(src) : NULL;
    if (src && !*dst) return cirrus_fail(err, CIRRUS_ENOMEM, "out of memory");
    return 0;
}

/* A token file holds the token, perhaps with a trailing newline. */
static int load_token_file(kube_config *cfg, cirrus_error *err)
{
    unsigned char *data;
    size_t len;
    int rc = read_file(cfg->token_path, SMALL_FILE_MAX, &data, &len, err);
    if (rc) return rc;
    while (len && isspace(data[len - 1])) data[--len] = '\0';
    if (len == 0 || memchr(data, '\n', len) || memchr(data, '\0', len)) {
        free(data);
        return cirrus_fail(err, CIRRUS_ECORRUPT, "%s: not a bearer token", cfg->token_path);
    }
    free(cfg->token);
    cfg->token = (char *)data;
    return 0;
}

const char *kube_config_token(kube_config *cfg, int64_t now_ms)
{
    if (!cfg->token_path) return cfg->token;
    if (!cfg->token_read_once || now_ms - cfg->token_read_ms >= KUBE_TOKEN_RELOAD_MS) {
        cirrus_error e;
        if (load_token_file(cfg, &e))
            log_warn("kube: re-reading the token: %s (keeping the previous one)", e.msg);
        cfg->token_read_ms = now_ms;
        cfg->token_read_once = 1;
    }
    return cfg->token;
}

/* A PEM credential either inline (base64 in *-data) or in a file (relative to dir). */
static int load_pem(struct blob *b, const json_t *obj, const char *data_key, const char *file_key,
                    const char *dir, cirrus_error *err)
{
    const char *data = json_string_value(json_object_get(obj, data_key));
    const char *file = json_string_value(json_object_get(obj, file_key));
    int rc;
    if (data && *data) {
        cirrus_error e;
        rc = kube_base64_decode(data, strlen(data), &b->data, &b->len, &e);
        if (rc) return cirrus_fail(err, rc, "%s: %s", data_key, e.msg);
    } else if (file && *file) {
        /* dir NULL: a kubeconfig that came as data (kube_config_from_data), which must not
         * make this process read its own files. */
        if (!dir)
            return cirrus_fail(err, CIRRUS_EINVAL,
                               "%s: a file path; only inline credentials (%s) are accepted here",
                               file_key, data_key);
        char path[4096];
        if (file[0] == '/')
            snprintf(path, sizeof path, "%s", file);
        else
            snprintf(path, sizeof path, "%s/%s", dir, file);
        rc = read_file(path, SMALL_FILE_MAX, &b->data, &b->len, err);
        if (rc) return rc;
    } else {
        return 0;
    }
    /* Catch a DER file or a double-encoded value here, with the field's name, instead of
     * as an opaque TLS failure on the first request. */
    if (!memmem(b->data, b->len, "-----BEGIN", 10))
        return cirrus_fail(err, CIRRUS_ECORRUPT, "%s: not PEM", data && *data ? data_key : file);
    return 0;
}

static kube_config *config_new(void)
{
    return calloc(1, sizeof(kube_config));
}

void kube_config_free(kube_config *cfg)
{
    if (!cfg) return;
    free(cfg->server);
    free(cfg->ns);
    free(cfg->source);
    free(cfg->ca.data);
    free(cfg->cert.data);
    if (cfg->key.data) OPENSSL_cleanse(cfg->key.data, cfg->key.len);
    free(cfg->key.data);
    if (cfg->token) OPENSSL_cleanse(cfg->token, strlen(cfg->token));
    free(cfg->token);
    free(cfg->token_path);
    free(cfg);
}

static int set_server(kube_config *cfg, const char *server, cirrus_error *err)
{
    const size_t scheme = !strncmp(server, "https://", 8) ? 8 : !strncmp(server, "http://", 7) ? 7 : 0;
    if (!scheme) return cirrus_fail(err, CIRRUS_EINVAL, "server %s: not an http(s) URL", server);
    /* Request paths are appended to it: no trailing '/', and a host must be left. */
    size_t n = strlen(server);
    while (n > scheme && server[n - 1] == '/') n--;
    if (n == scheme || server[scheme] == '/')
        return cirrus_fail(err, CIRRUS_EINVAL, "server %s: no host", server);
    int rc = set_str(&cfg->server, server, err);
    if (rc) return rc;
    cfg->server[n] = '\0';
    return 0;
}

/* ---- kubeconfig ------------------------------------------------------------------------ */

struct kc_file {
    json_t *doc;
    char *path;
    char *dir;
};

/* The first entry called name in the named list (clusters, users, contexts) across files,
 * and the directory of the file it came from. */
static const json_t *kc_find(struct kc_file *files, int n, const char *list, const char *name,
                             const char **dir)
{
    for (int i = 0; i < n; i++) {
        const json_t *arr = json_object_get(files[i].doc, list);
        size_t j;
        const json_t *e;
        json_array_foreach(arr, j, e)
        {
            const char *en = json_string_value(json_object_get(e, "name"));
            if (en && !strcmp(en, name)) {
                *dir = files[i].dir;
                return e;
            }
        }
    }
    return NULL;
}

static int kc_build(kube_config *cfg, struct kc_file *files, int n, const char *context,
                    cirrus_error *err)
{
    const char *ctx_name = context, *dir = NULL, *cdir = NULL, *udir = NULL;
    for (int i = 0; i < n && !(ctx_name && *ctx_name); i++)
        ctx_name = json_string_value(json_object_get(files[i].doc, "current-context"));
    if (!ctx_name || !*ctx_name)
        return cirrus_fail(err, CIRRUS_EINVAL, "%s: no current-context", files[0].path);
    const json_t *ctx = json_object_get(kc_find(files, n, "contexts", ctx_name, &dir), "context");
    if (!ctx) return cirrus_fail(err, CIRRUS_EINVAL, "%s: context %s not found", files[0].path, ctx_name);
    const char *cluster_name = json_string_value(json_object_get(ctx, "cluster"));
    const char *user_name = json_string_value(json_object_get(ctx, "user"));
    const char *ns = json_string_value(json_object_get(ctx, "namespace"));
    const json_t *cluster =
        cluster_name ? json_object_get(kc_find(files, n, "clusters", cluster_name, &cdir), "cluster")
                     : NULL;
    if (!cluster)
        return cirrus_fail(err, CIRRUS_EINVAL, "context %s: cluster %s not found", ctx_name,
                           cluster_name ? cluster_name : "(none)");
    const char *server = json_string_value(json_object_get(cluster, "server"));
    if (!server) return cirrus_fail(err, CIRRUS_EINVAL, "cluster %s: no server", cluster_name);
    int rc = set_server(cfg, server, err);
    if (!rc) rc = set_str(&cfg->ns, ns && *ns ? ns : "default", err);
    if (!rc) rc = load_pem(&cfg->ca, cluster, "certificate-authority-data", "certificate-authority", cdir, err);
    if (rc) return rc;
    cfg->insecure = json_is_true(json_object_get(cluster, "insecure-skip-tls-verify"));

    const json_t *user = NULL;
    if (user_name && *user_name) {
        user = json_object_get(kc_find(files, n, "users", user_name, &udir), "user");
        if (!user) return cirrus_fail(err, CIRRUS_EINVAL, "context %s: user %s not found", ctx_name, user_name);
    }
    if (user) {
        /* Plugins run programs and basic auth is gone from Kubernetes: say so, rather than
         * fail later with a puzzling 401. */
        if (json_object_get(user, "exec") || json_object_get(user, "auth-provider") ||
            json_object_get(user, "username"))
            return cirrus_fail(err, CIRRUS_EINVAL,
                               "user %s: exec, auth-provider and basic auth are not supported",
                               user_name);
        rc = load_pem(&cfg->cert, user, "client-certificate-data", "client-certificate", udir, err);
        if (!rc) rc = load_pem(&cfg->key, user, "client-key-data", "client-key", udir, err);
        if (rc) return rc;
        if (!cfg->cert.data != !cfg->key.data)
            return cirrus_fail(err, CIRRUS_EINVAL, "user %s: client certificate without key (or key without certificate)", user_name);
        const char *token = json_string_value(json_object_get(user, "token"));
        const char *token_file = json_string_value(json_object_get(user, "tokenFile"));
        if (token && *token) {
            /* It goes into an HTTP header line. */
            if (strpbrk(token, "\r\n"))
                return cirrus_fail(err, CIRRUS_EINVAL, "user %s: token contains a line break", user_name);
            rc = set_str(&cfg->token, token, err);
        } else if (token_file && *token_file) {
            if (!udir)
                return cirrus_fail(err, CIRRUS_EINVAL,
                                   "user %s: tokenFile; only an inline token is accepted here",
                                   user_name);
            char path[4096];
            snprintf(path, sizeof path, "%s%s%s", token_file[0] == '/' ? "" : udir,
                     token_file[0] == '/' ? "" : "/", token_file);
            rc = set_str(&cfg->token_path, path, err);
            if (!rc) rc = load_token_file(cfg, err);
        }
        if (rc) return rc;
    }
    char src[4200];
    snprintf(src, sizeof src, "kubeconfig %s context %s", files[0].path, ctx_name);
    return set_str(&cfg->source, src, err);
}

int kube_config_from_kubeconfig(const char *paths, const char *context, kube_config **out,
                                cirrus_error *err)
{
    enum { MAX_FILES = 16 };
    struct kc_file files[MAX_FILES];
    int n = 0, rc = 0, listed = 0;
    char *list = strdup(paths ? paths : "");
    kube_config *cfg = config_new();
    *out = NULL;
    if (!list || !cfg) {
        rc = cirrus_fail(err, CIRRUS_ENOMEM, "kubeconfig: out of memory");
        goto out;
    }
    int is_list = strchr(list, ':') != NULL;
    char *save = NULL;
    for (char *p = strtok_r(list, ":", &save); p; p = strtok_r(NULL, ":", &save)) {
        listed++;
        if (n == MAX_FILES) {
            rc = cirrus_fail(err, CIRRUS_EINVAL, "kubeconfig: more than %d files", MAX_FILES);
            goto out;
        }
        unsigned char *text;
        size_t len;
        rc = read_file(p, KUBECONFIG_MAX, &text, &len, err);
        if (rc == CIRRUS_ENOENT && is_list) {
            rc = 0; /* kubectl skips missing files in a KUBECONFIG list */
            continue;
        }
        if (rc) goto out;
        json_t *doc;
        rc = kube_yaml_parse((const char *)text, len, p, &doc, err);
        free(text);
        if (rc) goto out;
        if (!json_is_object(doc)) {
            json_decref(doc);
            rc = cirrus_fail(err, CIRRUS_ECORRUPT, "%s: not a kubeconfig (no mapping)", p);
            goto out;
        }
        files[n].doc = doc;
        files[n].path = strdup(p);
        const char *slash = strrchr(p, '/');
        files[n].dir = slash ? strndup(p, (size_t)(slash - p) + (slash == p)) : strdup(".");
        n++;
        if (!files[n - 1].path || !files[n - 1].dir) {
            rc = cirrus_fail(err, CIRRUS_ENOMEM, "kubeconfig: out of memory");
            goto out;
        }
    }
    if (n == 0) {
        rc = cirrus_fail(err, listed ? CIRRUS_ENOENT : CIRRUS_EINVAL, "kubeconfig %s: no such file", paths ? paths : "");
        goto out;
    }
    rc = kc_build(cfg, files, n, context, err);
out:
    for (int i = 0; i < n; i++) {
        json_decref(files[i].doc);
        free(files[i].path);
        free(files[i].dir);
    }
    free(list);
    if (rc) {
        kube_config_free(cfg);
        return rc;
    }
    *out = cfg;
    return 0;
}

int kube_config_from_data(const char *text, size_t len, const char *source, kube_config **out,
                          cirrus_error *err)
{
    *out = NULL;
    if (len > KUBECONFIG_MAX)
        return cirrus_fail(err, CIRRUS_EINVAL, "%s: a kubeconfig of %zu bytes; at most %d", source,
                           len, (int)KUBECONFIG_MAX);
    json_t *doc;
    int rc = kube_yaml_parse(text, len, source, &doc, err);
    if (rc) return rc;
    kube_config *cfg = config_new();
    struct kc_file f = {doc, (char *)source, NULL};
    if (!cfg)
        rc = cirrus_fail(err, CIRRUS_ENOMEM, "kubeconfig: out of memory");
    else if (!json_is_object(doc))
        rc = cirrus_fail(err, CIRRUS_ECORRUPT, "%s: not a kubeconfig (no mapping)", source);
    else
        rc = kc_build(cfg, &f, 1, NULL, err);
    json_decref(doc);
    if (rc) {
        kube_config_free(cfg);
        return rc;
    }
    *out = cfg;
    return 0;
}

/* ---- in-cluster ------------------------------------------------------------------------ */

int kube_config_in_cluster(const char *secrets_dir, kube_config **out, cirrus_error *err)
{
    const char *host = getenv("KUBERNETES_SERVICE_HOST");
    const char *port = getenv("KUBERNETES_SERVICE_PORT");
    const char *dir = secrets_dir ? secrets_dir : KUBE_SA_DIR;
    char buf[4200];
    int rc = 0;
    *out = NULL;
    if (!host || !*host || !port || !*port)
        return cirrus_fail(err, CIRRUS_EINVAL,
                           "not in a cluster: KUBERNETES_SERVICE_HOST/PORT are not set");
    kube_config *cfg = config_new();
    if (!cfg) return cirrus_fail(err, CIRRUS_ENOMEM, "out of memory");
    /* An IPv6 service address needs brackets in a URL. */
    int v6 = strchr(host, ':') != NULL;
    snprintf(buf, sizeof buf, "https://%s%s%s:%s", v6 ? "[" : "", host, v6 ? "]" : "", port);
    rc = set_server(cfg, buf, err);
    if (rc) goto out;
    snprintf(buf, sizeof buf, "%s/ca.crt", dir);
    rc = read_file(buf, SMALL_FILE_MAX, &cfg->ca.data, &cfg->ca.len, err);
    if (rc) goto out;
    snprintf(buf, sizeof buf, "%s/token", dir);
    rc = set_str(&cfg->token_path, buf, err);
    if (!rc) rc = load_token_file(cfg, err);
    if (rc) goto out;
    unsigned char *ns;
    size_t ns_len;
    snprintf(buf, sizeof buf, "%s/namespace", dir);
    if (read_file(buf, 4096, &ns, &ns_len, NULL) == 0) {
        while (ns_len && isspace(ns[ns_len - 1])) ns[--ns_len] = '\0';
        cfg->ns = (char *)ns;
    }
    if (!cfg->ns || !*cfg->ns) rc = set_str(&cfg->ns, "default", err);
    if (!rc) rc = set_str(&cfg->source, "in-cluster", err);
out:
    if (rc) {
        kube_config_free(cfg);
        return rc;
    }
    *out = cfg;
    return 0;
}

int kube_config_load(const char *kubeconfig_flag, kube_config **out, cirrus_error *err)
{
    if (kubeconfig_flag && *kubeconfig_flag)
        return kube_config_from_kubeconfig(kubeconfig_flag, NULL, out, err);
    const char *env = getenv("KUBECONFIG");
    if (env && *env) return kube_config_from_kubeconfig(env, NULL, out, err);
    if (getenv("KUBERNETES_SERVICE_HOST")) return kube_config_in_cluster(NULL, out, err);
    const char *home = getenv("HOME");
    if (!home) return cirrus_fail(err, CIRRUS_EINVAL, "no kubeconfig: set --kubeconfig or KUBECONFIG");
    char path[4096];
    snprintf(path, sizeof path, "%s/.kube/config", home);
    return kube_config_from_kubeconfig(path, NULL, out, err);
}

const char *kube_config_server(const kube_config *cfg) { return cfg->server; }
const char *kube_config_namespace(const kube_config *cfg) { return cfg->ns; }
const char *kube_config_source(const kube_config *cfg) { return cfg->source; }
int kube_config_insecure(const kube_config *cfg) { return cfg->insecure; }

const void *kube_config_ca(const kube_config *cfg, size_t *len)
{
    *len = cfg->ca.len;
    return cfg->ca.data;
}

const void *kube_config_client_cert(const kube_config *cfg, size_t *len)
{
    *len = cfg->cert.len;
    return cfg->cert.data;
}

const void *kube_config_client_key(const kube_config *cfg, size_t *len)
{
    *len = cfg->key.len;
    return cfg->key.data;
}
