/* kube_watch: one Kubernetes watch stream on the client's shared multi handle.
 *
 * GET PATH?watch=1&resourceVersion=RV&allowWatchBookmarks=true&timeoutSeconds=N streams
 * newline-delimited JSON events. Each watch is one easy handle on the client's multi
 * handle, so many watches progress in one event loop (kube_client_poll) over shared
 * connections. Events are delivered in order from kube_client_poll. The watch remembers
 * the resourceVersion of the last event (BOOKMARKs included: they exist to advance it).
 *
 * A watch ends once: the server closed it (timeoutSeconds, status 0), the resourceVersion
 * is too old (HTTP 410 or an in-stream ERROR event with code 410: CIRRUS_EGONE, re-list),
 * or another error. Reconnecting, backing off and re-listing are the informer's job.
 */
#ifndef CIRRUS_KUBE_WATCH_H
#define CIRRUS_KUBE_WATCH_H

#include <jansson.h>

#include "../../common/cerr.h"
#include "client.h"

typedef struct kube_watch kube_watch;

enum kube_event_type {
    KUBE_EVENT_ADDED,
    KUBE_EVENT_MODIFIED,
    KUBE_EVENT_DELETED,
    KUBE_EVENT_BOOKMARK, /* object carries only metadata.resourceVersion */
    KUBE_EVENT_ERROR,    /* object is a Status; ends the watch */
};

/* object is borrowed: json_incref it to keep it past the call. */
typedef void (*kube_watch_event_fn)(void *ctx, kube_watch *w, enum kube_event_type type,
                                    json_t *object);
/* status: 0 (closed by the server), CIRRUS_EGONE, or another negative cirrus_status with
 * err describing it. The callback may kube_watch_free(w). */
typedef void (*kube_watch_end_fn)(void *ctx, kube_watch *w, int status, const cirrus_error *err);

/* The client-go watch timeout: uniform in [300, 600) seconds. */
int kube_watch_random_timeout_s(void);

/* Start watching the collection at path (no query) from resource_version (NULL or "": the
 * server's choice, which starts with synthetic ADDED events for everything). extra_query:
 * more parameters, already escaped ("labelSelector=app%3Dx"), or NULL. timeout_s <= 0:
 * kube_watch_random_timeout_s(). */
int kube_watch_start(kube_client *c, const char *path, const char *extra_query,
                     const char *resource_version, int timeout_s, kube_watch_event_fn on_event,
                     kube_watch_end_fn on_end, void *ctx, kube_watch **out, cirrus_error *err);

/* Stop (if still running) and free; safe from the watch's own callbacks. */
void kube_watch_free(kube_watch *w);

/* The resourceVersion of the last event seen ("" before any). */
const char *kube_watch_resource_version(const kube_watch *w);

/* Parse one stream line into its type and object (a new reference). Exposed for tests:
 * recorded lines of the API server's output, ERROR 410 included. */
int kube_watch_parse_event(const char *line, size_t len, enum kube_event_type *type,
                           json_t **object, cirrus_error *err);

/* The cirrus_status for an ERROR event's Status object (410 -> CIRRUS_EGONE), with its
 * message in err. */
int kube_watch_error_status(const json_t *status, cirrus_error *err);

#endif
