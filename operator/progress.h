/* progress: training progress (step, loss, tokens/s, outer steps) read from the region
 * gateways.
 *
 * Every region's gateway serves `GET /status` (trainer/swarm/coord/http_status.c): JSON with the
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
 * number >= 0 or null (none yet). Its "outer" object (a job of several regions: the outer
 * step and the WAN bytes) is read when present and valid, and ignored otherwise. Anything else keeps the last valid answer, is logged and
 * announces the job (progress_drain) when a gateway starts failing (or fails in another way:
 * unreachable, invalid, another job's), is logged when it answers again, and is counted in
 * the operator's /metrics.
 *
 * A job's gateways are read together, at most once per period. Every valid answer is
 * stamped with the wall-clock second it was read (the status's regions[].progressTime) and
 * announces its job, even with the same figures: the job's status is written at most once
 * per period, and its progressTime shows the gateway still answers while training stalls.
 * resolve entries ("HOST:PORT:ADDRESS", as curl's --resolve) pin host names to addresses
 * for these requests only.
 *
 * Staleness (the SwarmJob's ProgressCurrent condition, jobstatus.h): a region's figures are
 * current while its latest valid answer is at most progress_stale_s() old: three periods,
 * plus a read's time limit, plus 1 s because the times are kept in whole seconds. Three,
 * because one or two reads in a row failing is routine (a gateway process restarting, a
 * read on a loaded node running into its 2 s limit) and must not flap the condition, while
 * a third in a row says something is wrong; and the user learns of it within about three
 * periods (33 s at the default 10 s).
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

#define PROGRESS_STALE_PERIODS 3
#define PROGRESS_MAX_STAGES 64 /* a SwarmJob's most stages (the CRD's bound) */

/* The gateway's outer steps across regions (its /status "outer" object, present only when
 * the gateway runs them: a job of several regions). */
typedef struct progress_outer {
    int64_t step;      /* >= -1: the outer steps done; -1: none yet (no global parameters) */
    int64_t wan_bytes; /* >= 0: bytes the gateway sent plus received over the WAN */
} progress_outer;

typedef struct progress_result {
    int64_t step;        /* >= 0 */
    double loss;         /* finite and >= 0, or NAN: none reported yet */
    double tokens_per_s; /* finite and >= 0, or NAN: none reported yet */
    int64_t read_s;      /* when it was read, Unix seconds (the reader sets it; parsing: 0) */
    int has_outer;       /* 1: outer holds the answer's "outer" object; 0: it had none, or
                          * one not trusted (outer_ignored says why) */
    progress_outer outer;
    const char *outer_ignored; /* NULL, or a static string: why "outer" was not trusted */
    /* The live peers of each stage as the coordinator sees them (its "stages" array: by the
     * stage a peer serves now, which rebalancing changes, not the stage its pod was made
     * for); has_stages 0: absent or not trusted (stages_ignored says why). */
    int has_stages;
    int n_stages; /* <= PROGRESS_MAX_STAGES */
    int stage_peers[PROGRESS_MAX_STAGES];
    const char *stages_ignored;
} progress_result;

/* Parse a gateway's /status body (len bytes) into out. 0; CIRRUS_EMISMATCH when its job_id
 * is not job_id; CIRRUS_ECORRUPT when it is not JSON, not an object, or a field is missing,
 * of the wrong type, not finite or negative. err (may be NULL) says which.
 *
 * The "outer" object is optional (absent or null: has_outer 0). When present its step must
 * be an integer >= -1, and wan_bytes_sent and wan_bytes_received integers >= 0 whose sum
 * fits in int64; otherwise the object is ignored as a whole (has_outer 0, outer_ignored
 * naming the field) and the rest of the answer still counts: the outer figures are an
 * addition a gateway may get wrong without making its step and loss untrue. Its other
 * members are not read. The "stages" array likewise: optional, at most PROGRESS_MAX_STAGES
 * objects whose "stage" is their index and "peers" an integer in [0, INT_MAX]; anything
 * else leaves has_stages 0 with stages_ignored saying why. */
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

/* From now on read these n gateways for job `key` ("namespace/name") whose identity is uid
 * (its metadata.uid, or in a copy the home job's: ctl_job_identity), replacing the job's earlier targets: a region no longer listed (or listed with
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

/* What the reader knows of one region of a job: enough to tell whether its figures are
 * current (jobstatus.h's ProgressCurrent). */
typedef struct progress_region {
    int watched;           /* its gateway is read (registered with progress_watch) */
    int64_t watched_s;     /* since when, Unix seconds */
    int answered;          /* res is its latest valid answer (res.read_s: when) */
    progress_result res;
    const char *failing;   /* NULL, or how its latest read failed: "unreachable" (no
                              connection, a timeout, an HTTP error), "invalid /status",
                              "another job's /status" */
} progress_region;

/* *out for region of the job with this uid (all zero when it is not watched). */
void progress_region_get(progress *p, const char *uid, const char *region,
                         progress_region *out);

/* Seconds after which a region's latest answer is stale: PROGRESS_STALE_PERIODS periods +
 * the read's 2 s limit + 1 s (whole seconds). 0 when the gateways are not read (p NULL,
 * period 0). */
int progress_stale_s(const progress *p);

/* Call fn(ctx, key) once for each job whose figures changed since the last call (fn runs
 * without the lock held). */
void progress_drain(progress *p, void (*fn)(void *ctx, const char *key), void *ctx);

typedef struct progress_stats {
    uint64_t rounds, ok, errors, invalid, wrong_job;
} progress_stats;
void progress_get_stats(progress *p, progress_stats *st);

#endif
