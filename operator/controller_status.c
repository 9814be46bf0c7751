/* controller_status: what the reconcile loop writes to a job's status subresource, and when it
 * must look at the job again with nothing having changed (controller_internal.h): the
 * gateways' training figures (read by progress.h's thread), the status write with its phase
 * Events, runPolicy.activeDeadlineSeconds and ttlSecondsAfterFinished. */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "../common/log.h"
#include "../common/role_args.h"
#include "controller_internal.h"
#include "podstate.h"

/* ---- training progress ---------------------------------------------------------------------- */

/* Read the /status of the job's ready gateways from now on (none once it is stopped), at
 * the Service desired.c names for the region, on the port it gives the gateway's HTTP. */
void ctl_watch_progress(controller *ctl, const json_t *job, const char *key,
                        const job_observed *obs, int stop)
{
    progress *p = ctl->opt.progress;
    if (!p || !leading(ctl)) return;
    char urls[JOBSTATUS_MAX_REGIONS][PROGRESS_URL_MAX];
    progress_target t[JOBSTATUS_MAX_REGIONS];
    const char *name = meta_str(job, "name"), *ns = meta_str(job, "namespace");
    int n = 0;
    for (int i = 0; i < obs->n_regions && !stop && name && ns; i++) {
        const region_observed *r = &obs->regions[i];
        char gw[CIRRUS_NAME_MAX + 1];
        /* Another cluster's region: its own operator reads its gateway. */
        if (r->cluster || !r->gateway_ready || desired_name_gateway(gw, sizeof gw, name, r->name, NULL))
            continue;
        int len = snprintf(urls[n], sizeof urls[n], "http://%s.%s.svc:%d/status", gw, ns,
                           ROLE_PORT_HTTP);
        if (len < 0 || len >= (int)sizeof urls[n]) continue;
        t[n].region = r->name;
        t[n].url = urls[n];
        n++;
    }
    /* A copy's gateways answer with the home job's uid, the job's identity everywhere. */
    if (progress_watch(p, key, ctl_job_identity(job), n, t))
        log_warn("%s: out of memory registering its gateways' /status", key);
}

/* The gateways' latest figures into obs, with what tells whether they are current. */
void ctl_apply_progress(controller *ctl, const json_t *job, job_observed *obs)
{
    const char *uid = ctl_job_identity(job);
    obs->progress_stale_s = progress_stale_s(ctl->opt.progress);
    for (int i = 0; i < obs->n_regions; i++) {
        region_observed *r = &obs->regions[i];
        if (r->cluster) continue; /* folded from its cluster (ctl_sync_members) */
        progress_region pr;
        progress_region_get(ctl->opt.progress, uid, r->name, &pr);
        r->has_progress = pr.answered;
        if (r->has_progress) {
            r->step = pr.res.step;
            r->loss = pr.res.loss;
            r->tokens_per_s = pr.res.tokens_per_s;
            r->progress_time = pr.res.read_s;
            r->has_outer = pr.res.has_outer;
            r->outer_step = pr.res.outer.step;
            r->wan_bytes = pr.res.outer.wan_bytes;
            r->has_live = pr.res.has_stages && pr.res.n_stages == r->n_stages;
            if (r->has_live) memcpy(r->live, pr.res.stage_peers, (size_t)r->n_stages * sizeof(int));
        }
        r->watched_since = pr.watched ? pr.watched_s : 0;
        r->failing = pr.failing;
    }
}

/* A region's client 0 finished (pod): how it says training ended, from its termination
 * message, into ro; its figures are final, the gateway's last answer may not be. A message
 * that does not pass podstate.c's checks is not trusted: the status keeps the gateway's
 * figures, and the log says why, once per pod (the pod is kept, and seen at every
 * reconcile, until the job is deleted). */
void ctl_apply_summary(const json_t *job, job_mem *m, const json_t *pod, region_observed *ro)
{
    client_summary s;
    cirrus_error err = {0};
    int64_t steps = int_at(json_object_get(job, "spec"), "steps", NULL, DESIRED_DEFAULT_STEPS);
    int rc = pod_client_summary(pod, steps, &s, &err);
    if (rc == 1) {
        ro->has_summary = 1;
        ro->summary_step = s.step;
        ro->summary_loss = s.loss;
        ro->summary_val_loss = s.val_loss;
        return;
    }
    pod_seen seen;
    if (rc == 0 || !ctl_seen_get(m, meta_str(pod, "name"), &seen) || seen.summary_warned) return;
    ctl_seen_warned(m, meta_str(pod, "name"));
    log_warn("%s: pod %s finished, its summary ignored (the status keeps the gateway's "
             "figures): %s", m->key, meta_str(pod, "name"), err.msg);
}

/* Milliseconds from now until Unix second t has begun (and a little more, so that the clock
 * read then is surely at t); at least 1. */
static int64_t ms_until(int64_t t)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    int64_t ms = t * 1000 - ((int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000) + 50;
    return ms > 0 ? ms : 1;
}

void ctl_progress_arrived(void *ctx, const char *key) { ctl_enqueue(ctx, key); }

/* Write the status if it changed. *progress_ms: when to look again because ProgressCurrent
 * will change with time alone (an answer growing stale: no read announces that), 0: no
 * need. */
int ctl_write_status(controller *ctl, const json_t *job, job_mem *m, const job_observed *obs,
                     int64_t *progress_ms, cirrus_error *err)
{
    char now[32], path[PATH_MAX_LEN];
    jobstatus_now(now, sizeof now);
    const json_t *old = json_object_get(job, "status");
    json_t *st = jobstatus_build(obs, old, now);
    if (!st) return cirrus_fail(err, CIRRUS_ENOMEM, "out of memory");
    /* A copy's gateway certificate requests, for its home to sign (controller_pki.c); null
     * removes them once answered. */
    json_t *reqs = ctl_copy_cert_requests(job, m);
    if (json_object_size(reqs))
        json_object_set(st, "certificateRequests", reqs);
    else if (json_object_get(old, "certificateRequests"))
        json_object_set_new(st, "certificateRequests", json_null());
    json_decref(reqs);
    int64_t due = jobstatus_progress_due(obs, st, now);
    *progress_ms = due > 0 ? ms_until(due) : 0;
    const char *phase = json_string_value(json_object_get(st, "phase"));
    int rc = 0;
    if (jobstatus_changed(old, st)) {
        json_t *patch = json_pack("{s:O}", "status", st);
        rc = kube_path(path, sizeof path, SWARMJOB_API, meta_str(job, "namespace"), "swarmjobs",
                       meta_str(job, "name"));
        if (!rc) {
            strncat(path, "/status", sizeof path - strlen(path) - 1);
            rc = kube_patch_merge(ctl->client, path, patch, NULL, err);
        } else {
            cirrus_fail(err, rc, "job path too long");
        }
        json_decref(patch);
        if (!rc) ctl->stats.status_writes++;
        if (rc == CIRRUS_ENOENT) rc = 0; /* deleted meanwhile */
    }
    if (!rc && phase && strcmp(phase, m->phase)) {
        int bad = !strcmp(phase, "Failed") || !strcmp(phase, "Degraded");
        ctl_event(ctl, job, bad, phase, "phase %s -> %s (ready peers %s, regions %s)",
                  m->phase[0] ? m->phase : "none", phase,
                  json_string_value(json_object_get(st, "readyPeers")),
                  json_string_value(json_object_get(st, "readyRegions")));
        snprintf(m->phase, sizeof m->phase, "%s", phase);
    }
    json_decref(st);
    return rc;
}

/* Seconds since an RFC 3339 UTC time, or -1. */
static double seconds_since(const char *t)
{
    int64_t s = jobstatus_parse_time(t);
    if (s < 0) return -1;
    return difftime(time(NULL), (time_t)s);
}

/* runPolicy.ttlSecondsAfterFinished: delete a finished job once it has passed (the RBAC grants
 * delete on swarmjobs for this alone). Only the job we looked at: a uid precondition, so a
 * job re-created under the same name while the cache lagged is not deleted in its place.
 * Returns the milliseconds until it is due (0: deleted or none). */
int64_t ctl_expire_finished(controller *ctl, const json_t *job, cirrus_error *err, int *rc)
{
    json_int_t ttl = int_at(json_object_get(job, "spec"), "runPolicy", "ttlSecondsAfterFinished",
                            -1);
    const char *done = json_string_value(
        json_object_get(json_object_get(job, "status"), "completionTime"));
    double age = seconds_since(done);
    if (ttl < 0 || age < 0) return 0;
    if (age < (double)ttl) return (int64_t)(((double)ttl - age) * 1000) + 100;
    char path[PATH_MAX_LEN];
    if (kube_path(path, sizeof path, SWARMJOB_API, meta_str(job, "namespace"), "swarmjobs",
                  meta_str(job, "name")) == 0) {
        const char *uid = meta_str(job, "uid");
        json_t *opt = json_pack("{s:s, s:{s:s}}", "propagationPolicy", "Background",
                                "preconditions", "uid", uid ? uid : "");
        *rc = opt ? kube_delete(ctl->client, path, opt, err)
                  : cirrus_fail(err, CIRRUS_ENOMEM, "out of memory");
        /* Gone already, or another job now has the name (409: its uid differs). */
        if (*rc == CIRRUS_ENOENT || *rc == CIRRUS_ECONFLICT) *rc = 0;
        json_decref(opt);
        if (!*rc) log_info("%s: deleted %lld s after it finished (ttlSecondsAfterFinished)",
                           meta_str(job, "name"), (long long)ttl);
    }
    return 0;
}

/* runPolicy.activeDeadlineSeconds, counted from status.startTime (as a Job counts it): marks
 * obs when it has passed; else returns the milliseconds left (0: no deadline or not started). */
int64_t ctl_active_deadline(const json_t *job, job_observed *obs)
{
    json_int_t limit = int_at(json_object_get(job, "spec"), "runPolicy", "activeDeadlineSeconds",
                              -1);
    double age = seconds_since(
        json_string_value(json_object_get(json_object_get(job, "status"), "startTime")));
    if (limit <= 0 || age < 0) return 0;
    if (age >= (double)limit) {
        obs->deadline_exceeded = 1;
        return 0;
    }
    return (int64_t)(((double)limit - age) * 1000) + 100;
}
