/* kube_config: where the API server is and how to authenticate to it.
 *
 * Two sources, as client-go: a kubeconfig file (current context -> cluster server and CA,
 * user client certificate/key or bearer token) and the in-cluster service account
 * (KUBERNETES_SERVICE_HOST/PORT, token and ca.crt under
 * /var/run/secrets/kubernetes.io/serviceaccount). Certificates and keys are kept in memory
 * as PEM and handed to libcurl as blobs: no temporary files holding private keys. Token
 * files (in-cluster, kubeconfig tokenFile) are re-read at most once a minute because
 * projected service-account tokens rotate under a running process.
 */
#ifndef CIRRUS_KUBE_CONFIG_H
#define CIRRUS_KUBE_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "../../common/cerr.h"

typedef struct kube_config kube_config;

#define KUBE_SA_DIR "/var/run/secrets/kubernetes.io/serviceaccount"
/* How often a token file is re-read (client-go's cached file token source). */
#define KUBE_TOKEN_RELOAD_MS 60000

/* Resolve like controller-runtime: kubeconfig_flag if set, else $KUBECONFIG, else the
 * in-cluster config when KUBERNETES_SERVICE_HOST is set, else ~/.kube/config. */
int kube_config_load(const char *kubeconfig_flag, kube_config **out, cirrus_error *err);

/* paths: one file or a ':'-separated list merged as kubectl does (the first file naming a
 * cluster/user/context wins; missing files in a list are skipped). context: NULL for
 * current-context. Relative file paths inside a kubeconfig are relative to its directory. */
int kube_config_from_kubeconfig(const char *paths, const char *context, kube_config **out,
                                cirrus_error *err);

/* A kubeconfig given as text (e.g. a Secret's value), its current context: only inline
 * credentials (certificate-authority-data, client-*-data, token); a file path in it is
 * refused, so that no one who can write the text makes this process read its files.
 * source names it in messages and kube_config_source ("secret NS/NAME key K"). */
int kube_config_from_data(const char *text, size_t len, const char *source, kube_config **out,
                          cirrus_error *err);

/* secrets_dir: NULL for KUBE_SA_DIR (tests point it at a scratch directory). */
int kube_config_in_cluster(const char *secrets_dir, kube_config **out, cirrus_error *err);

void kube_config_free(kube_config *cfg);

/* "https://host:port", no trailing slash. */
const char *kube_config_server(const kube_config *cfg);
/* The context's namespace (kubeconfig) or the pod's (in-cluster); "default" if unset. */
const char *kube_config_namespace(const kube_config *cfg);
/* What was loaded, for the start-up log line: "kubeconfig PATH context NAME", "in-cluster". */
const char *kube_config_source(const kube_config *cfg);
int kube_config_insecure(const kube_config *cfg);

/* PEM bytes (not NUL-terminated) for CURLOPT_CAINFO_BLOB / SSLCERT_BLOB / SSLKEY_BLOB;
 * NULL (and *len 0) when not configured. */
const void *kube_config_ca(const kube_config *cfg, size_t *len);
const void *kube_config_client_cert(const kube_config *cfg, size_t *len);
const void *kube_config_client_key(const kube_config *cfg, size_t *len);

/* The bearer token to send at monotonic time now_ms, or NULL for none. A token file is
 * re-read when KUBE_TOKEN_RELOAD_MS have passed since the last read; if that read fails the
 * previous token is kept (and a warning logged): the old token usually still works. */
const char *kube_config_token(kube_config *cfg, int64_t now_ms);

/* Base64 (standard alphabet, whitespace ignored) to bytes: *out is malloc'd, *out_len set. */
int kube_base64_decode(const char *in, size_t in_len, unsigned char **out, size_t *out_len,
                       cirrus_error *err);

#endif
