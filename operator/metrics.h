/* metrics: the operator's Prometheus metrics and health endpoints.
 *
 *   GET /metrics  text format 0.0.4: controller-runtime's family names (reconcile totals by
 *                 result, errors, a reconcile-time histogram, work-queue depth/adds/retries,
 *                 leader_election_master_status) so existing dashboards work, plus Cirrus's
 *                 own (pods created, preemptions, failures, reads of the gateways' /status
 *                 by outcome)
 *   GET /healthz  200 while the event loop turns: 500 once it has not come round for
 *                 OP_HEALTHZ_STALL_MS (a wedged request, a deadlock), so that the liveness
 *                 probe restarts a process that only looks alive
 *   GET /readyz   200 once the caches have synced (or while standing by as a non-leader)
 *
 * Served by common/http_server. The event loop writes, the HTTP thread reads: one mutex.
 */
#ifndef CIRRUS_OP_METRICS_H
#define CIRRUS_OP_METRICS_H

#include <stdint.h>

#include "../common/cerr.h"

typedef struct op_metrics op_metrics;

enum op_result { OP_RESULT_SUCCESS, OP_RESULT_ERROR, OP_RESULT_REQUEUE_AFTER, OP_RESULT_N };

op_metrics *op_metrics_new(void);
void op_metrics_free(op_metrics *m); /* stops the server too */

void op_metrics_reconciled(op_metrics *m, enum op_result r, double seconds);
void op_metrics_queue(op_metrics *m, uint64_t depth, uint64_t adds, uint64_t retries);
void op_metrics_leader(op_metrics *m, int is_leader);
/* Called every turn of the event loop: the caches' state for /readyz, and the time of the
 * turn for /healthz. */
void op_metrics_ready(op_metrics *m, int ready);

/* Longest a turn of the loop may take before /healthz fails: one synchronous request's
 * 30 s limit and its 429 retries (at most as long again), with room to spare. */
#define OP_HEALTHZ_STALL_MS 90000
/* Whether a loop last seen turning at last_turn_ms (monotonic; 0: not yet) is healthy at
 * now_ms. Pure, for the unit tests. */
int op_metrics_loop_healthy(int64_t last_turn_ms, int64_t now_ms);
void op_metrics_pods(op_metrics *m, uint64_t created, uint64_t preemptions, uint64_t failures);
/* The Kubernetes client's finished transfers (requests, 429 retries and watches: what the
 * operator costs the API server) and its 429 retries, both totals. */
void op_metrics_api(op_metrics *m, uint64_t transfers, uint64_t retries);

/* One read of a gateway's /status (progress.h): answered; failed (connect, timeout, HTTP
 * error); not a valid status; the status of another job. Called from the progress thread. */
enum op_scrape { OP_SCRAPE_OK, OP_SCRAPE_ERROR, OP_SCRAPE_INVALID, OP_SCRAPE_WRONG_JOB, OP_SCRAPE_N };
void op_metrics_scrape(op_metrics *m, enum op_scrape r);

/* The /metrics body, malloc'd. */
char *op_metrics_render(op_metrics *m);

/* Serve on port (0: a free one, returned in *bound). */
int op_metrics_serve(op_metrics *m, int port, int *bound, cirrus_error *err);

#endif
