/* http_status: the coordinator's HTTP face, served by libmicrohttpd on its own thread.
 *
 *   GET /status   JSON: step, loss, tokens/s, peers and throughput per stage, microbatch
 *                 totals, epoch, uptime, and every live member
 *   GET /metrics  Prometheus text exposition format 0.0.4, HELP and TYPE for every family
 *
 * HEAD is answered like GET without the body; any other method gets 405 (Allow: GET,
 * HEAD), any other path 404. Each request renders a fresh coordinator_snapshot.
 */
#ifndef CIRRUS_HTTP_STATUS_H
#define CIRRUS_HTTP_STATUS_H

#include "coordinator.h"

typedef struct http_status http_status;

/* Serve on host:port (0: a free port, reported in *bound_port). */
int http_status_start(coordinator *co, const char *host, int port, http_status **out,
                      int *bound_port, cirrus_error *err);
void http_status_stop(http_status *h);

/* The bodies, malloc'd (NULL when out of memory). */
char *http_status_json(const coord_snapshot *s);
char *http_status_metrics(const coord_snapshot *s);

#endif
