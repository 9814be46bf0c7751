/* progress: training progress (step, loss, tokens/s) read from the region gateways.
 *
 * Every region's gateway serves `GET /status` (trainer/swarm/http_status.c): JSON with the
 * job id, the highest step its clients reported, their latest loss and their tokens per
 * second. The controller registers, per running job, the URL of each region's gateway
 * Service (progress_watch); a worker thread of its own, with its own libcurl multi handle,
 * reads them every period_s seconds (all due gateways in parallel; connect timeout 1 s,
 * 2 s in all) and keeps the latest valid answer per (job uid, region) under a mutex. So a
 * slow or unreachable gateway never blocks the operator's single-threaded event loop: the
 * loop only takes the mutex to copy a result (progress_get) or to learn which jobs got new
 * figures (progress_drain), whose keys it queues for a reconcile that writes the status.
 *
 * An answer counts only if it is a JSON object whose job_id is the SwarmJob's uid (the
 * operator passes the uid as every trainer's --job; a gateway of another job, a stale
 * endpoint, is ignored), with an integer step >= 0 and loss and tokens_per_s each a finite
 * number >= 0 or null (none yet). Anything else keeps the last valid answer, is logged when
 * a gateway starts failing (or fails in another way: unreachable, invalid, another job's)
 * and when it answers again, and is counted in the operator's /metrics.
 *
 * A job's gateways are read together, at most once per period: a job gets new figures, and
 * so a status write, at most once per period. resolve entries ("HOST:PORT:ADDRESS", as
 * curl's --resolve) pin host names to addresses for these requests only.
 */
#ifndef CIRRUS_OPERATOR_PROGRESS_H
#define CIRRUS_OPERATOR_PROGRESS_H

#include <stddef.h>
#include <stdint.h>

#include "../common/cerr.h"
#include "metrics.h"

#define PROGRESS_CONNECT_TIMEOUT_MS 1000L
#define PROGRESS_TIMEOUT_MS 2000L
#define PROGRESS_BODY_MAX (4u << 20) /* a /status body larger than this is refused */
#define PROGRESS_PARALLEL 32         /* gateways read at once */
#define PROGRESS_KEY_MAX 512         /* "namespace/name" */
#define PROGRESS_UID_MAX 128
#define PROGRESS_REGION_MAX 64
#define PROGRESS_URL_MAX 512

typedef struct progress_result {
    int64_t step;        /* >= 0 */
    double loss;         /* finite and >= 0, or NAN: none reported yet */
    double tokens_per_s; /* finite and >= 0, or NAN: none reported yet */
} progress_result;

/* Parse a gateway's /status body (len bytes) into out. 0; CIRRUS_EMISMATCH when its job_id
 * is not job_id; CIRRUS_ECORRUPT when it is not JSON, not an object, or a field is missing,
 * of the wrong type, not finite or negative. err (may be NULL) says which. */
int progress_parse_status(const char *body, size_t len, const char *job_id, progress_result *out,
                          cirrus_error *err);

/* Check one --resolve value: "HOST:PORT:ADDRESS" entries separated by commas, PORT 1..65535,
 * ADDRESS an IPv4 or IPv6 literal (the latter bare or in brackets). 0 or CIRRUS_EINVAL. */
int progress_check_resolve(const char *value, cirrus_error *err);

typedef struct progress_options {
    int period_s;                /* seconds between reads of a job's gateways; 0: never */
    const char *const *resolve;  /* n_resolve --resolve values (each checked as above) */
    int n_resolve;
    op_metrics *metrics;         /* may be NULL */
} progress_options;

typedef struct progress progress;

/* Starts the worker thread when period_s > 0. */
int progress_new(const progress_options *o, progress **out, cirrus_error *err);
/* Stops and joins the worker (a transfer in flight is abandoned within 0.1 s), frees all. */
void progress_free(progress *p);

typedef struct progress_target {
    const char *region; /* regions[].name */
    const char *url;    /* http://GATEWAY-SERVICE.NAMESPACE.svc:PORT/status */
} progress_target;

/* From now on read these n gateways for job `key` ("namespace/name") whose metadata.uid is
 * uid, replacing the job's earlier targets: a region no longer listed (or listed with
 * another URL or uid) is forgotten with its result. n == 0 forgets the job. A job new to
 * this module is read at once; a region added to a known job joins the job's schedule.
 * A no-op when the worker does not run (period_s 0). */
int progress_watch(progress *p, const char *key, const char *uid, int n,
                   const progress_target *t);
void progress_forget(progress *p, const char *key);
/* Forget every job (a replica that stops leading). */
void progress_clear(progress *p);

/* The latest valid answer of region's gateway for the job with this uid: 1 and *out, or 0
 * when there is none. */
int progress_get(progress *p, const char *uid, const char *region, progress_result *out);

/* Call fn(ctx, key) once for each job whose figures changed since the last call (fn runs
 * without the lock held). */
void progress_drain(progress *p, void (*fn)(void *ctx, const char *key), void *ctx);

typedef struct progress_stats {
    uint64_t rounds, ok, errors, invalid, wrong_job;
} progress_stats;
void progress_get_stats(progress *p, progress_stats *st);

#endif
