/* fuzz_kubeconfig: the operator's kubeconfig loader (operator/kube/config.c) and the YAML
 * reader under it (operator/kube/yamljson.c), fed kubeconfig files.
 *
 * Input: the bytes of a kubeconfig, written to a scratch directory that also holds a CA,
 * a client certificate and key and a token file the config may name by relative path
 * (inputs naming device or proc files are skipped: reading those says nothing about the
 * parser). Invariants:
 *   yaml: a document that parses re-parses from its own JSON (which is YAML) to an equal
 *     tree when libyaml reads that back; nesting never passes the 64-level cap;
 *   base64: decode(encode(x)) == x for what kube_base64_decode accepts, and it never yields
 *     more than 3 bytes per 4 characters;
 *   config: a refused file yields no config; an accepted one has an http(s) server without
 *     a trailing '/', a non-empty namespace, a token without line breaks, a client
 *     certificate exactly when it has a key, and PEM credentials.
 */
#include "fuzz.h"

#include <jansson.h>
#include <openssl/evp.h>

#include "../../operator/kube/config.h"
#include "../../operator/kube/yamljson.h"

static const char pem[] = "-----BEGIN CERTIFICATE-----\nMIIBszCCAVmgAwIBAgIUXjx0\n-----END CERTIFICATE-----\n";

static int depth(const json_t *j)
{
    int d = 0;
    size_t i;
    const char *k;
    json_t *v;
    if (json_is_array(j))
        json_array_foreach(j, i, v) { int e = depth(v); d = e > d ? e : d; }
    else if (json_is_object(j))
        json_object_foreach((json_t *)j, k, v) { int e = depth(v); d = e > d ? e : d; }
    else
        return 0;
    return d + 1;
}

static void check_yaml(const char *text, size_t len)
{
    json_t *doc;
    cirrus_error err;
    if (kube_yaml_parse(text, len, "fuzz", &doc, &err) != 0) {
        FUZZ_CHECK(doc == NULL, "refused YAML yields a tree");
        return;
    }
    FUZZ_CHECK(doc != NULL, "accepted YAML yields no tree");
    FUZZ_CHECK(depth(doc) <= 64, "nesting %d past the cap", depth(doc));
    char *again = json_dumps(doc, JSON_ENCODE_ANY | JSON_COMPACT);
    json_t *doc2;
    if (again && kube_yaml_parse(again, strlen(again), "again", &doc2, &err) == 0) {
        FUZZ_CHECK(json_equal(doc, doc2), "YAML -> JSON -> YAML changed the tree: %s", again);
        json_decref(doc2);
    }
    free(again);
    json_decref(doc);
}

static void check_base64(const char *text, size_t len)
{
    unsigned char *bin;
    size_t n;
    cirrus_error err;
    if (kube_base64_decode(text, len, &bin, &n, &err) != 0) return;
    size_t chars = 0;
    for (size_t i = 0; i < len; i++) chars += !strchr(" \t\n\v\f\r", text[i]);
    FUZZ_CHECK(n <= chars / 4 * 3, "%zu bytes from %zu characters", n, chars);
    unsigned char *enc = malloc(4 * (n / 3 + 1) + 1), *bin2;
    if (!enc) abort();
    int m = EVP_EncodeBlock(enc, bin, (int)n);
    size_t n2;
    FUZZ_CHECK(kube_base64_decode((const char *)enc, (size_t)m, &bin2, &n2, &err) == 0, "own encoding refused");
    FUZZ_CHECK(n2 == n && (n == 0 || !memcmp(bin, bin2, n)), "base64 round trip differs");
    free(bin2);
    free(enc);
    free(bin);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *text = (const char *)data;
    check_yaml(text, size);
    check_base64(text, size);
    if (memmem(data, size, "/dev", 4) || memmem(data, size, "/proc", 5) || memmem(data, size, "/sys", 4))
        return 0;
    const char *dir = fuzz_scratch_dir();
    static int fixtures;
    if (!fixtures) {
        fuzz_write_file(dir, "ca.crt", pem, sizeof pem - 1);
        fuzz_write_file(dir, "client.crt", pem, sizeof pem - 1);
        fuzz_write_file(dir, "client.key", pem, sizeof pem - 1);
        fuzz_write_file(dir, "token", "abc.def.ghi\n", 12);
        fixtures = 1;
    }
    fuzz_write_file(dir, "config", data, size);
    char path[8192];
    snprintf(path, sizeof path, "%s/config", dir);
    kube_config *cfg = (kube_config *)1;
    cirrus_error err;
    if (kube_config_from_kubeconfig(path, NULL, &cfg, &err) != 0) {
        FUZZ_CHECK(cfg == NULL, "refused kubeconfig yields a config");
        return 0;
    }
    const char *server = kube_config_server(cfg);
    size_t sl = strlen(server);
    FUZZ_CHECK(!strncmp(server, "https://", 8) || !strncmp(server, "http://", 7), "server %s", server);
    FUZZ_CHECK(sl == 0 || server[sl - 1] != '/', "server %s ends in '/'", server);
    FUZZ_CHECK(*kube_config_namespace(cfg), "empty namespace");
    const char *tok = kube_config_token(cfg, 0);
    FUZZ_CHECK(!tok || !strpbrk(tok, "\r\n"), "token with a line break");
    size_t ca, cert, key;
    const void *pca = kube_config_ca(cfg, &ca), *pcert = kube_config_client_cert(cfg, &cert),
               *pkey = kube_config_client_key(cfg, &key);
    FUZZ_CHECK(!pcert == !pkey, "certificate without key or key without certificate");
    FUZZ_CHECK(!pca || memmem(pca, ca, "-----BEGIN", 10), "CA not PEM");
    FUZZ_CHECK(!pcert || memmem(pcert, cert, "-----BEGIN", 10), "certificate not PEM");
    FUZZ_CHECK(!pkey || memmem(pkey, key, "-----BEGIN", 10), "key not PEM");
    kube_config_free(cfg);
    return 0;
}
