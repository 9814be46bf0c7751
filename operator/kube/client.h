/* kube_client: synchronous Kubernetes API requests and the event loop that drives watches.
 *
 * One libcurl multi handle per client owns the connection pool, so every request and every
 * watch reuses the same keep-alive (with HTTP/2: multiplexed) connections instead of paying
 * a TLS handshake per call (kubernetes-client/c's mistake). Synchronous requests run their
 * transfer on that multi handle too; while one waits, watch streams keep buffering, but
 * their events are only delivered from kube_client_poll(), never from inside libcurl, so
 * handlers may issue requests themselves.
 *
 * Errors: 0 on 2xx; otherwise a negative cirrus_status with the API server's Status message
 * in err (e.g. 'configmaps "x" already exists'): CIRRUS_ENOENT (404), CIRRUS_ECONFLICT
 * (409: stale resourceVersion, or AlreadyExists: check kube_status_reason), CIRRUS_EGONE
 * (410), CIRRUS_EINVAL (400, 422 Invalid), CIRRUS_ETIMEDOUT, CIRRUS_EIO (anything else,
 * including 401/403 and transport errors). 429 Too Many Requests and 5xx with Retry-After
 * are retried as client-go does (up to 10 times, waiting Retry-After), but waiting no
 * longer in all than 5 s (nor the request timeout): the wait holds up the whole event loop,
 * which renews the Lease, so past that the caller's own backoff takes over.
 *
 * Not thread-safe: one event loop owns a client.
 */
#ifndef CIRRUS_KUBE_CLIENT_H
#define CIRRUS_KUBE_CLIENT_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "../../common/cerr.h"
#include "config.h"

typedef struct kube_client kube_client;

/* Hard cap on one response body (and on the unread part of a watch stream). */
#define KUBE_RESPONSE_MAX ((size_t)64 << 20)
/* Default total time for one synchronous request; watches have their own. */
#define KUBE_REQUEST_TIMEOUT_MS 30000

#define KUBE_CT_JSON "application/json"
#define KUBE_CT_MERGE_PATCH "application/merge-patch+json"
#define KUBE_CT_APPLY_PATCH "application/apply-patch+yaml"

typedef struct kube_client_stats {
    uint64_t transfers; /* finished transfers: requests, retries and watches */
    uint64_t connects;  /* new TCP connections opened (sum of CURLINFO_NUM_CONNECTS) */
    uint64_t retries;   /* requests repeated after 429 / Retry-After */
} kube_client_stats;

/* cfg is borrowed and must outlive the client. */
int kube_client_new(kube_config *cfg, kube_client **out, cirrus_error *err);
void kube_client_free(kube_client *c);
kube_config *kube_client_config(kube_client *c);
void kube_client_set_timeout_ms(kube_client *c, long timeout_ms);
void kube_client_get_stats(const kube_client *c, kube_client_stats *st);

/* One request. path starts with '/' and may carry a query ("/api/v1/namespaces?limit=5").
 * body: sent as compact JSON (NULL: none). content_type: NULL for application/json.
 * http_status, response: optional; *response receives the parsed body (a new reference,
 * also on errors when the server sent a Status), or NULL when the body was empty or not
 * JSON. */
int kube_request(kube_client *c, const char *method, const char *path, const json_t *body,
                 const char *content_type, long *http_status, json_t **response,
                 cirrus_error *err);

/* Helpers over kube_request; out (optional) receives the object the server returned. */
int kube_get(kube_client *c, const char *path, json_t **out, cirrus_error *err);
int kube_create(kube_client *c, const char *collection_path, const json_t *obj, json_t **out,
                cirrus_error *err);
/* PUT: obj must carry metadata.resourceVersion; a stale one gives CIRRUS_ECONFLICT. */
int kube_update(kube_client *c, const char *path, const json_t *obj, json_t **out,
                cirrus_error *err);
/* PUT to path + "/status": the status subresource (spec changes are ignored there). */
int kube_update_status(kube_client *c, const char *path, const json_t *obj, json_t **out,
                       cirrus_error *err);
/* JSON merge patch (RFC 7386): works for custom resources, unlike strategic merge. */
int kube_patch_merge(kube_client *c, const char *path, const json_t *patch, json_t **out,
                     cirrus_error *err);
/* Server-side apply of obj (full intent: apiVersion, kind, metadata.name) as field_manager,
 * forcing ownership of conflicting fields (controllers own what they apply). */
int kube_apply(kube_client *c, const char *path, const json_t *obj, const char *field_manager,
               json_t **out, cirrus_error *err);
/* The PATCH path kube_apply sends to for path (the field manager and force in its query),
 * for a server-side apply among kube_request_all's calls. */
int kube_apply_path(char *buf, size_t size, const char *path, const char *field_manager,
                    cirrus_error *err);
/* options: a DeleteOptions body (e.g. {"propagationPolicy":"Foreground"}) or NULL.
 * A missing object gives CIRRUS_ENOENT, which callers cleaning up usually ignore. */
int kube_delete(kube_client *c, const char *path, const json_t *options, cirrus_error *err);

/* "/api/v1/namespaces/NS/RESOURCE/NAME" and friends. api: "api/v1" or "apis/GROUP/VERSION";
 * ns and name may be NULL (cluster-scoped, collection). CIRRUS_EINVAL if it does not fit
 * or a part contains '/', '?' or '%'. */
int kube_path(char *buf, size_t size, const char *api, const char *ns, const char *resource,
              const char *name);
/* "namespace/name" (or "name" when cluster-scoped): the informer cache and workqueue key. */
int kube_object_key(const json_t *obj, char *buf, size_t size);
/* Several requests side by side: each of calls[0..n) (method, path, body, content_type in;
 * rc, err, http_status, response out, as kube_request would give them) runs on the
 * client's connections at once, KUBE_CALLS_AT_ONCE at a time (HTTP/2 streams: one round
 * trip for those instead of one each), and this returns when all are done. A call the server answers 429 (or 5xx with Retry-After) is then
 * repeated alone with kube_request's retries. response is left NULL unless want_response. */
typedef struct kube_call {
    const char *method, *path, *content_type;
    const json_t *body;
    int want_response;
    int rc;
    cirrus_error err;
    long http_status; /* the answer's (0: none came: a transport error or a timeout) */
    json_t *response; /* a new reference when want_response and the answer was JSON */
} kube_call;
#define KUBE_CALLS_AT_ONCE 32
void kube_request_all(kube_client *c, kube_call *calls, size_t n);

/* Fields of an API Status object; "" when absent. */
const char *kube_status_reason(const json_t *status);
const char *kube_status_message(const json_t *status);
/* HTTP status to cirrus_status as described above (2xx: 0). */
int kube_http_error(long http_status);

/* Drive every transfer on the client: wait at most timeout_ms for network activity or a due
 * ticker, then deliver watch events and run due tickers. Returns 0, or CIRRUS_EINVAL when
 * called from inside a handler (not re-entrant). */
int kube_client_poll(kube_client *c, int timeout_ms);

/* Tickers: timers run by kube_client_poll for modules built on the client (informer
 * re-list/re-watch, leader election renewals). */
typedef struct kube_ticker kube_ticker;
typedef void (*kube_tick_fn)(void *ctx, int64_t now_ms);
kube_ticker *kube_ticker_new(kube_client *c, kube_tick_fn fn, void *ctx);
/* Run once at monotonic due_ms (kube_now_ms clock); -1 cancels. */
void kube_ticker_schedule(kube_ticker *t, int64_t due_ms);
void kube_ticker_free(kube_ticker *t);

/* Monotonic milliseconds. */
int64_t kube_now_ms(void);

#endif
