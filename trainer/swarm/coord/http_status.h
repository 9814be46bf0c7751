/* http_status: a region coordinator's HTTP face, served by common/http_server on its own
 * thread.
 *
 *   GET /status   JSON: step, loss, tokens/s, peers and throughput per stage, microbatch
 *                 totals, epoch, uptime, and every live member
 *   GET /metrics  Prometheus text exposition format 0.0.4, HELP and TYPE for every family
 *
 * HEAD is answered like GET without the body; any other method gets 405 (Allow: GET,
 * HEAD), any other path 404. Each request renders a fresh snapshot, taken by the function
 * it was started with: this module knows the snapshot (snapshot.h), not the coordinator.
 */
#ifndef CIRRUS_HTTP_STATUS_H
#define CIRRUS_HTTP_STATUS_H

#include "../../../common/cerr.h"
#include "snapshot.h"

typedef struct http_status http_status;

/* Fill *out with the current state (0), or a negative code; called per request from the
 * HTTP thread. The server frees what it filled with coord_snapshot_free. */
typedef int (*http_status_snapshot_fn)(void *ctx, coord_snapshot *out);

/* Serve on host:port (0: a free port, reported in *bound_port). */
int http_status_start(const char *host, int port, http_status_snapshot_fn snapshot, void *ctx,
                      http_status **out, int *bound_port, cirrus_error *err);
void http_status_stop(http_status *h);

/* The bodies, malloc'd (NULL when out of memory). */
char *http_status_json(const coord_snapshot *s);
char *http_status_metrics(const coord_snapshot *s);

#endif
