#include "jobstatus.h"

#include "desired.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char *const phase_names[] = {"Created",   "Running",   "Degraded",
                                          "Suspended", "Succeeded", "Failed"};

const char *jobstatus_phase_name(enum job_phase p) { return phase_names[p]; }

int jobstatus_phase_final(enum job_phase p) { return p == PHASE_SUCCEEDED || p == PHASE_FAILED; }

/* Every stage has at least `need` ready peers and the gateway is ready. */
static int region_at(const region_observed *r, int need)
{
    if (!r->gateway_ready) return 0;
    for (int s = 0; s < r->n_stages; s++)
        if (r->ready[s] < need) return 0;
    return 1;
}

static int64_t total_failures(const job_observed *obs)
{
    int64_t f = 0;
    for (int i = 0; i < obs->n_regions; i++) f += obs->regions[i].failures;
    return f;
}

void jobstatus_read_success_policy(const json_t *spec, job_observed *obs)
{
    const json_t *sp = json_object_get(spec, "successPolicy");
    const char *op = json_string_value(json_object_get(sp, "operator"));
    const json_t *targets = json_object_get(sp, "targetRegions");
    obs->success_any = op && !strcmp(op, "Any");
    for (int i = 0; i < obs->n_regions; i++) {
        region_observed *r = &obs->regions[i];
        r->success_ignored = json_array_size(targets) > 0;
        size_t k;
        const json_t *t;
        json_array_foreach(targets, k, t)
        {
            const char *name = json_string_value(t);
            if (name && !strcmp(name, r->name)) r->success_ignored = 0;
        }
    }
}

int jobstatus_region_finished(const region_observed *r)
{
    return r->clients > 0 && r->clients_succeeded >= r->clients;
}

/* spec.successPolicy met: every target region that runs clients finished (All; at least
 * one runs some), or one of them did (Any). */
static int success_policy_met(const job_observed *obs)
{
    int running = 0, finished = 0;
    for (int i = 0; i < obs->n_regions; i++) {
        const region_observed *r = &obs->regions[i];
        if (r->success_ignored || r->clients <= 0) continue;
        running++;
        finished += jobstatus_region_finished(r);
    }
    return running > 0 && (obs->success_any ? finished > 0 : finished == running);
}

/* The Succeeded condition's message: which regions' clients finished. */
static void success_message(const job_observed *obs, char *buf, size_t n)
{
    int all = 1, any = 0;
    for (int i = 0; i < obs->n_regions; i++) {
        const int done = jobstatus_region_finished(&obs->regions[i]);
        if (obs->regions[i].clients > 0 && !done) all = 0;
        any |= done;
    }
    if (all || !any) { /* !any: the finished clients' pods are gone since */
        snprintf(buf, n, "every client finished its steps");
        return;
    }
    size_t used = (size_t)snprintf(buf, n, "every client of region");
    const char *sep = " ";
    for (int i = 0; i < obs->n_regions && used < n; i++) {
        if (!jobstatus_region_finished(&obs->regions[i])) continue;
        used += (size_t)snprintf(buf + used, n - used, "%s%s", sep, obs->regions[i].name);
        sep = ", ";
    }
    if (used < n)
        snprintf(buf + used, n - used, " finished its steps (successPolicy %s)",
                 obs->success_any ? "Any" : "All");
}

enum job_phase jobstatus_phase(const job_observed *obs, const char *old_phase,
                               int started_before)
{
    if (old_phase && !strcmp(old_phase, "Failed")) return PHASE_FAILED;
    if (old_phase && !strcmp(old_phase, "Succeeded")) return PHASE_SUCCEEDED;
    if (obs->home_phase) return strcmp(obs->home_phase, "Failed") ? PHASE_SUCCEEDED : PHASE_FAILED;
    /* A copy holds some of the job's regions: whether the job succeeded, or failed by its
     * count of failures or its deadline, is the home's to say (spec.home.phase), judged
     * over every region; a FailJob rule matched here fails it at once (the home takes it
     * from the copy's status). */
    if (obs->policy_failure ||
        (!obs->is_copy && (total_failures(obs) > obs->backoff_limit || obs->deadline_exceeded)))
        return PHASE_FAILED;
    if (!obs->is_copy && success_policy_met(obs)) return PHASE_SUCCEEDED;
    if (obs->suspended) return PHASE_SUSPENDED;
    int full = obs->n_regions > 0, any = 0;
    for (int i = 0; i < obs->n_regions; i++) {
        const region_observed *r = &obs->regions[i];
        if (!region_at(r, r->min > 0 ? r->min : 1)) full = 0;
        if (region_at(r, 1)) any = 1;
    }
    if (full) return PHASE_RUNNING;
    if (any || started_before) return PHASE_DEGRADED;
    return PHASE_CREATED;
}

/* Why the job is not at full strength: the first region and stage short of peers.min. */
static void degraded_message(const job_observed *obs, char *buf, size_t n)
{
    snprintf(buf, n, "all regions at strength");
    for (int i = 0; i < obs->n_regions; i++) {
        const region_observed *r = &obs->regions[i];
        if (!r->gateway_ready) {
            snprintf(buf, n, "region %s: gateway not ready", r->name);
            return;
        }
        for (int s = 0; s < r->n_stages; s++) {
            int need = r->min > 0 ? r->min : 1;
            if (r->ready[s] < need) {
                snprintf(buf, n, "region %s stage %d: %d ready peers, fewer than min %d%s",
                         r->name, s, r->ready[s], need,
                         r->unschedulable ? " (pods wait for nodes)" : "");
                return;
            }
        }
    }
}

const json_t *jobstatus_condition(const json_t *status, const char *type)
{
    size_t i;
    const json_t *c;
    json_array_foreach(json_object_get(status, "conditions"), i, c)
    {
        const char *t = json_string_value(json_object_get(c, "type"));
        if (t && !strcmp(t, type)) return c;
    }
    return NULL;
}

enum { COND_FALSE, COND_TRUE, COND_UNKNOWN };

/* status: COND_TRUE (or any true value but COND_UNKNOWN), COND_FALSE or COND_UNKNOWN. */
static void add_condition(json_t *conds, const json_t *old_status, const char *type, int status,
                          const char *reason, const char *message, const char *now,
                          int64_t generation)
{
    const char *st = status == COND_UNKNOWN ? "Unknown" : status ? "True" : "False";
    const json_t *old = jobstatus_condition(old_status, type);
    const char *old_st = json_string_value(json_object_get(old, "status"));
    const char *since = now;
    if (old_st && !strcmp(old_st, st)) {
        const char *t = json_string_value(json_object_get(old, "lastTransitionTime"));
        if (t) since = t;
    }
    json_array_append_new(conds, json_pack("{s:s, s:s, s:s, s:s, s:s, s:I}", "type", type,
                                           "status", st, "reason", reason, "message", message,
                                           "lastTransitionTime", since, "observedGeneration",
                                           (json_int_t)generation));
}

static const json_t *old_region(const json_t *old_status, const char *name)
{
    size_t i;
    const json_t *r;
    json_array_foreach(json_object_get(old_status, "regions"), i, r)
    {
        const char *n = json_string_value(json_object_get(r, "name"));
        if (n && name && !strcmp(n, name)) return r;
    }
    return NULL;
}

/* ---- ProgressCurrent ------------------------------------------------------------------------ */

enum freshness { FRESH, AWAITING, STALE };

/* When region r last answered: this process's answer, else the old status's progressTime
 * (a restarted operator, a region whose gateway was not ready a while); 0: never. */
static int64_t last_answer(const region_observed *r, const json_t *old_r)
{
    if (r->has_progress && r->progress_time > 0) return r->progress_time;
    int64_t t = jobstatus_parse_time(json_string_value(json_object_get(old_r, "progressTime")));
    return t > 0 ? t : 0;
}

/* Region r's figures at now; *due: the second that changes by time alone (0: never). A
 * region read for less than stale_s (a new job, a new leader, a gateway ready again) has
 * that long to answer before its figures count as stale; one never answered and not read
 * (its gateway never ready) has nothing to go stale yet. */
static enum freshness freshness(const region_observed *r, const json_t *old_r, int64_t now,
                                int stale_s, int64_t *due)
{
    int64_t last = last_answer(r, old_r);
    *due = 0;
    if (last > 0 && now - last <= stale_s) {
        *due = last + stale_s + 1;
        return FRESH;
    }
    if (r->watched_since > 0 && now - r->watched_since <= stale_s) {
        *due = r->watched_since + stale_s + 1;
        return AWAITING;
    }
    return !last && !r->watched_since ? AWAITING : STALE;
}

/* Append printf-style text to buf (n bytes), truncating. */
static void appendf(char *buf, size_t n, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void appendf(char *buf, size_t n, const char *fmt, ...)
{
    size_t len = strlen(buf);
    if (len + 1 >= n) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + len, n - len, fmt, ap);
    va_end(ap);
}

/* "r1 (last answer 2026-11-22T01:00:00Z; unreachable)": what the user needs to tell why,
 * and nothing that changes while nothing happens (no age). */
static void describe_region(char *buf, size_t n, const region_observed *r, const json_t *old_r,
                            int with_last)
{
    int64_t last = last_answer(r, old_r);
    const char *why = !r->watched_since ? "gateway not ready" : r->failing;
    char t[32] = "";
    if (with_last) {
        if (last > 0) {
            jobstatus_format_time(last, t, sizeof t);
            appendf(buf, n, "%s (last answer %s%s%s)", r->name, t, why ? "; " : "",
                    why ? why : "");
        } else {
            appendf(buf, n, "%s (no answer%s%s)", r->name, why ? "; " : "", why ? why : "");
        }
    } else {
        appendf(buf, n, why ? "%s (%s)" : "%s", r->name, why);
    }
}

#define PROGRESS_MSG_MAX 2048

static void progress_condition(json_t *c, const job_observed *obs, enum job_phase ph,
                               const json_t *old_status, const char *now)
{
    const char *type = "ProgressCurrent";
    int64_t g = obs->generation, t = jobstatus_parse_time(now);
    char msg[PROGRESS_MSG_MAX];
    if (ph != PHASE_RUNNING && ph != PHASE_DEGRADED) {
        snprintf(msg, sizeof msg, "the job is %s: %s", phase_names[ph],
                 ph == PHASE_CREATED ? "no region trains yet"
                                     : "its gateways are stopped, the figures are the last read");
        add_condition(c, old_status, type, COND_UNKNOWN, "NotRunning", msg, now, g);
        return;
    }
    if (obs->progress_stale_s <= 0 || t < 0) {
        add_condition(c, old_status, type, COND_UNKNOWN, "ProgressNotRead",
                      "the operator does not read the gateways' /status (--progress-period-s 0)",
                      now, g);
        return;
    }
    enum freshness f[JOBSTATUS_MAX_REGIONS];
    int n_stale = 0, n_awaiting = 0;
    for (int i = 0; i < obs->n_regions; i++) {
        int64_t due;
        f[i] = freshness(&obs->regions[i], old_region(old_status, obs->regions[i].name), t,
                         obs->progress_stale_s, &due);
        n_stale += f[i] == STALE;
        n_awaiting += f[i] == AWAITING;
    }
    if (!n_stale && !n_awaiting) {
        snprintf(msg, sizeof msg, "every region's gateway answered within the last %d s",
                 obs->progress_stale_s);
        add_condition(c, old_status, type, COND_TRUE, "GatewaysAnswering", msg, now, g);
        return;
    }
    /* Stale regions make it False; only with none are the awaited ones worth a mention. */
    enum freshness named = n_stale ? STALE : AWAITING;
    int n = n_stale ? n_stale : n_awaiting, k = 0;
    if (n_stale)
        snprintf(msg, sizeof msg, "no valid /status for over %d s from region%s ",
                 obs->progress_stale_s, n > 1 ? "s" : "");
    else
        snprintf(msg, sizeof msg, "waiting for a first /status from region%s ", n > 1 ? "s" : "");
    for (int i = 0; i < obs->n_regions; i++) {
        if (f[i] != named) continue;
        if (k++) appendf(msg, sizeof msg, ", ");
        describe_region(msg, sizeof msg, &obs->regions[i],
                        old_region(old_status, obs->regions[i].name), n_stale > 0);
    }
    if (n_stale)
        add_condition(c, old_status, type, COND_FALSE, "GatewayUnreachable", msg, now, g);
    else
        add_condition(c, old_status, type, COND_UNKNOWN, "NoAnswerYet", msg, now, g);
}

int64_t jobstatus_progress_due(const job_observed *obs, const json_t *status, const char *now)
{
    const char *phase = json_string_value(json_object_get(status, "phase"));
    int64_t t = jobstatus_parse_time(now), first = 0;
    if (obs->progress_stale_s <= 0 || t < 0 || !phase ||
        (strcmp(phase, "Running") && strcmp(phase, "Degraded")))
        return 0;
    for (int i = 0; i < obs->n_regions; i++) {
        int64_t due;
        freshness(&obs->regions[i], old_region(status, obs->regions[i].name), t,
                  obs->progress_stale_s, &due);
        if (due > 0 && (!first || due < first)) first = due;
    }
    return first;
}

/* ---- the conditions ------------------------------------------------------------------------ */

static json_t *conditions(const job_observed *obs, enum job_phase ph, const json_t *old_status,
                          const char *now)
{
    json_t *c = json_array();
    char msg[512];
    int64_t g = obs->generation;
    int64_t fails = total_failures(obs);
    add_condition(c, old_status, "Created", !obs->not_created_reason,
                  obs->not_created_reason ? obs->not_created_reason : "ObjectsCreated",
                  obs->not_created_reason && obs->not_created_message
                      ? obs->not_created_message
                      : "gateways, peers and clients created",
                  now, g);
    add_condition(c, old_status, "PodsStarted", !obs->stuck_reason[0],
                  obs->stuck_reason[0] ? obs->stuck_reason : "ContainersStarting",
                  obs->stuck_reason[0] ? obs->stuck_message
                                       : "no pod's container is stuck before it runs",
                  now, g);
    int running = ph == PHASE_RUNNING || ph == PHASE_DEGRADED;
    add_condition(c, old_status, "Running", running, running ? "PipelineReady" : phase_names[ph],
                  running ? "every stage of a region has a ready peer"
                          : "not every stage of any region has a ready peer",
                  now, g);
    degraded_message(obs, msg, sizeof msg);
    add_condition(c, old_status, "Degraded", ph == PHASE_DEGRADED,
                  ph == PHASE_DEGRADED ? "BelowMinPeers" : "AtStrength", msg, now, g);
    add_condition(c, old_status, "Suspended", ph == PHASE_SUSPENDED,
                  ph == PHASE_SUSPENDED ? "Suspended" : "NotSuspended",
                  ph == PHASE_SUSPENDED ? "spec.suspend is true: pods deleted"
                                        : "spec.suspend is false",
                  now, g);
    if (ph == PHASE_SUCCEEDED) success_message(obs, msg, sizeof msg);
    add_condition(c, old_status, "Succeeded", ph == PHASE_SUCCEEDED,
                  ph == PHASE_SUCCEEDED ? "ClientsFinished" : "NotFinished",
                  ph == PHASE_SUCCEEDED ? msg : "clients still training", now, g);
    /* A FailJob rule's verdict: from this reconcile, else as the status already says it (a
     * new leader or a restarted operator no longer knows the pod that matched). */
    const json_t *old_failed = jobstatus_condition(old_status, "Failed");
    const char *old_reason = json_string_value(json_object_get(old_failed, "reason"));
    const char *policy_msg = obs->policy_failure;
    if (!policy_msg && ph == PHASE_FAILED && old_reason && !strcmp(old_reason, "PodFailurePolicy"))
        policy_msg = json_string_value(json_object_get(old_failed, "message"));
    int by_policy = ph == PHASE_FAILED && policy_msg;
    int by_deadline = ph == PHASE_FAILED && !by_policy && obs->deadline_exceeded &&
                      fails <= obs->backoff_limit;
    if (by_policy)
        snprintf(msg, sizeof msg, "%s", policy_msg);
    else if (by_deadline)
        snprintf(msg, sizeof msg, "runPolicy.activeDeadlineSeconds passed since the job started");
    else
        snprintf(msg, sizeof msg, "%lld pod failures, backoffLimit %lld", (long long)fails,
                 (long long)obs->backoff_limit);
    const char *reason = ph != PHASE_FAILED ? "WithinBackoffLimit"
                         : by_policy        ? "PodFailurePolicy"
                         : by_deadline      ? "DeadlineExceeded"
                                            : "BackoffLimitExceeded";
    add_condition(c, old_status, "Failed", ph == PHASE_FAILED, reason, msg, now, g);
    progress_condition(c, obs, ph, old_status, now);
    if (obs->has_members)
        add_condition(c, old_status, "ClustersReachable", !obs->members_unreachable,
                      obs->members_unreachable
                          ? (obs->members_reason ? obs->members_reason : "MemberUnreachable")
                          : "MembersAnswering",
                      obs->members_unreachable ? obs->members_unreachable
                                               : "every member cluster answered",
                      now, g);
    return c;
}

/* Six significant digits: enough for a loss or a rate, and `kubectl get` stays readable. */
static json_t *rounded(double v)
{
    char buf[32];
    snprintf(buf, sizeof buf, "%.6g", v);
    return json_real(strtod(buf, NULL));
}

/* A finite number >= 0 as a status figure (rounded), or nothing. */
static void set_figure(json_t *ro, const char *key, double v)
{
    if (isfinite(v) && v >= 0) json_object_set_new(ro, key, rounded(v));
}

/* A region's step, loss, validationLoss, tokensPerSecond and progressTime: from its client
 * 0's summary once it finished (the final figures; the rate is the gateway's last), else
 * from its gateway, else as the old status had them (a write without them would drop them:
 * a merge patch replaces the regions array). */
static void region_progress(json_t *ro, const region_observed *r, const json_t *old_r)
{
    int64_t last = last_answer(r, old_r);
    if (last > 0) {
        char t[32];
        jobstatus_format_time(last, t, sizeof t);
        json_object_set_new(ro, "progressTime", json_string(t));
    }
    const json_t *step = json_object_get(old_r, "step"), *loss = json_object_get(old_r, "loss");
    const json_t *tps = json_object_get(old_r, "tokensPerSecond");
    const json_t *val = json_object_get(old_r, "validationLoss");
    if (r->has_summary) {
        json_object_set_new(ro, "step", json_integer(r->summary_step > 0 ? r->summary_step : 0));
        /* A client that replaced one which had finished the training ran no step itself:
         * its summary has no loss. A loss reported for that same step (by the gateway, or
         * kept in the status) stands; one of an earlier step is left out. */
        if (isfinite(r->summary_loss))
            set_figure(ro, "loss", r->summary_loss);
        else if (r->has_progress && (int64_t)r->step == r->summary_step)
            set_figure(ro, "loss", r->loss);
        else if (json_is_number(loss) && json_is_integer(step) &&
                 json_integer_value(step) == r->summary_step)
            json_object_set_new(ro, "loss", json_deep_copy(loss));
        set_figure(ro, "validationLoss", r->summary_val_loss);
        if (r->has_progress)
            set_figure(ro, "tokensPerSecond", r->tokens_per_s);
        else if (json_is_number(tps))
            json_object_set_new(ro, "tokensPerSecond", json_deep_copy(tps));
        return;
    }
    if (r->has_progress) {
        json_object_set_new(ro, "step", json_integer((json_int_t)(r->step > 0 ? r->step : 0)));
        set_figure(ro, "loss", r->loss);
        set_figure(ro, "tokensPerSecond", r->tokens_per_s);
        return;
    }
    if (!json_is_integer(step) || json_integer_value(step) < 0) return;
    json_object_set_new(ro, "step", json_integer(json_integer_value(step)));
    if (json_is_number(loss)) json_object_set_new(ro, "loss", json_deep_copy(loss));
    if (json_is_number(val)) json_object_set_new(ro, "validationLoss", json_deep_copy(val));
    if (json_is_number(tps)) json_object_set_new(ro, "tokensPerSecond", json_deep_copy(tps));
}

/* A region's outerStep and wanBytes: from its gateway's latest answer, else as the old
 * status had them (valid ones only). */
static void region_outer(json_t *ro, const region_observed *r, const json_t *old_r)
{
    if (r->has_progress && r->has_outer && r->outer_step >= -1 && r->wan_bytes >= 0) {
        json_object_set_new(ro, "outerStep", json_integer((json_int_t)r->outer_step));
        json_object_set_new(ro, "wanBytes", json_integer((json_int_t)r->wan_bytes));
        return;
    }
    const json_t *step = json_object_get(old_r, "outerStep");
    const json_t *bytes = json_object_get(old_r, "wanBytes");
    if (!json_is_integer(step) || json_integer_value(step) < -1) return;
    json_object_set_new(ro, "outerStep", json_integer(json_integer_value(step)));
    if (json_is_integer(bytes) && json_integer_value(bytes) >= 0)
        json_object_set_new(ro, "wanBytes", json_integer(json_integer_value(bytes)));
}

static json_t *regions(const job_observed *obs, const json_t *old_status)
{
    json_t *a = json_array();
    for (int i = 0; i < obs->n_regions; i++) {
        const region_observed *r = &obs->regions[i];
        json_t *ready = json_array();
        for (int s = 0; s < r->n_stages; s++) json_array_append_new(ready, json_integer(r->ready[s]));
        json_t *ro = json_pack("{s:s, s:o, s:i, s:I, s:I, s:b}", "name", r->name,
                               "readyPeersPerStage", ready, "pendingPods", r->unschedulable,
                               "preemptions", (json_int_t)r->preemptions, "failures",
                               (json_int_t)r->failures, "gatewayReady", r->gateway_ready);
        if (ro) json_object_set_new(ro, "clientsSucceeded", json_integer(r->clients_succeeded));
        /* An endpoint not known this time (a Service not read, a member not answering) is
         * the one the status had: the gateways were made with it. */
        const char *ep = r->endpoint ? r->endpoint
                                     : json_string_value(json_object_get(
                                           old_region(old_status, r->name), "endpoint"));
        if (ro && ep) json_object_set_new(ro, "endpoint", json_string(ep));
        if (ro && r->cluster) {
            json_object_set_new(ro, "cluster", json_string(r->cluster));
            json_object_set_new(ro, "clusterReachable", json_boolean(!r->cluster_unreachable));
        }
        if (ro) region_progress(ro, r, old_region(old_status, r->name));
        if (ro) region_outer(ro, r, old_region(old_status, r->name));
        json_array_append_new(a, ro);
    }
    return a;
}

/* The job's figures from its regions': least step, mean loss, summed tokens per second.
 * Left out when no region has a step; loss or tokensPerSecond null (removed) when no region
 * with a step has one. */
static void job_progress(json_t *st)
{
    int n_step = 0, n_loss = 0, n_tps = 0;
    json_int_t step = 0;
    double loss = 0, tps = 0;
    size_t i;
    const json_t *r;
    json_array_foreach(json_object_get(st, "regions"), i, r)
    {
        const json_t *s = json_object_get(r, "step");
        if (!json_is_integer(s)) continue;
        if (!n_step++ || json_integer_value(s) < step) step = json_integer_value(s);
        const json_t *l = json_object_get(r, "loss"), *t = json_object_get(r, "tokensPerSecond");
        if (json_is_number(l)) {
            loss += json_number_value(l);
            n_loss++;
        }
        if (json_is_number(t)) {
            tps += json_number_value(t);
            n_tps++;
        }
    }
    if (!n_step) return;
    json_object_set_new(st, "step", json_integer(step));
    json_object_set_new(st, "loss", n_loss ? rounded(loss / n_loss) : json_null());
    json_object_set_new(st, "tokensPerSecond", n_tps ? rounded(tps) : json_null());
}

/* The job's outer figures from its regions': least outerStep, summed wanBytes (saturating at
 * INT64_MAX). Left out when no region has an outerStep. */
static void job_outer(json_t *st)
{
    int n = 0;
    json_int_t step = 0, bytes = 0;
    size_t i;
    const json_t *r;
    json_array_foreach(json_object_get(st, "regions"), i, r)
    {
        const json_t *s = json_object_get(r, "outerStep"), *b = json_object_get(r, "wanBytes");
        if (!json_is_integer(s)) continue;
        if (!n++ || json_integer_value(s) < step) step = json_integer_value(s);
        if (json_is_integer(b) && json_integer_value(b) > 0)
            bytes = json_integer_value(b) > INT64_MAX - bytes ? INT64_MAX
                                                              : bytes + json_integer_value(b);
    }
    if (!n) return;
    json_object_set_new(st, "outerStep", json_integer(step));
    json_object_set_new(st, "wanBytes", json_integer(bytes));
}

static json_t *build(const job_observed *obs, const json_t *old_status, const char *now);

/* obs with each region's ready peers as they stand at now: the gateway's live count while
 * its answer is fresh (freshness(), as ProgressCurrent judges it), else the pods' count. */
static void live_counts(job_observed *obs, const json_t *old_status, int64_t now)
{
    for (int i = 0; i < obs->n_regions && obs->progress_stale_s > 0 && now >= 0; i++) {
        region_observed *r = &obs->regions[i];
        int64_t due;
        if (r->has_live && r->progress_time > 0 &&
            freshness(r, old_region(old_status, r->name), now, obs->progress_stale_s, &due) == FRESH)
            memcpy(r->ready, r->live, (size_t)r->n_stages * sizeof r->ready[0]);
    }
}

json_t *jobstatus_build(const job_observed *obs_in, const json_t *old_status, const char *now)
{
    /* On the heap: a job's observations are tens of KiB. */
    job_observed *obs = malloc(sizeof *obs);
    if (!obs) return NULL;
    *obs = *obs_in;
    live_counts(obs, old_status, jobstatus_parse_time(now));
    json_t *st = build(obs, old_status, now);
    free(obs);
    return st;
}

static json_t *build(const job_observed *obs, const json_t *old_status, const char *now)
{
    const char *old_phase = json_string_value(json_object_get(old_status, "phase"));
    const char *start = json_string_value(json_object_get(old_status, "startTime"));
    const char *done = json_string_value(json_object_get(old_status, "completionTime"));
    /* Degraded, not Created, once it has run: losing every peer later is a degradation. */
    int ran = old_phase && (!strcmp(old_phase, "Running") || !strcmp(old_phase, "Degraded"));
    enum job_phase ph = jobstatus_phase(obs, old_phase, ran);
    int ready_regions = 0, ready = 0, desired = 0;
    for (int i = 0; i < obs->n_regions; i++) {
        const region_observed *r = &obs->regions[i];
        ready_regions += region_at(r, 1);
        desired += r->replicas * r->n_stages;
        for (int s = 0; s < r->n_stages; s++) ready += r->ready[s];
    }
    /* The scale subresource's status.replicas: the fewest peers of any stage. */
    int fewest = -1;
    for (int i = 0; i < obs->n_regions; i++)
        for (int s = 0; s < obs->regions[i].n_stages; s++)
            if (fewest < 0 || obs->regions[i].peers[s] < fewest) fewest = obs->regions[i].peers[s];
    char rr[32], rp[32];
    snprintf(rr, sizeof rr, "%d/%d", ready_regions, obs->n_regions);
    snprintf(rp, sizeof rp, "%d/%d", ready, desired);
    json_t *st = json_pack("{s:s, s:I, s:o, s:o, s:s, s:s}", "phase", phase_names[ph],
                           "observedGeneration", (json_int_t)obs->generation, "conditions",
                           conditions(obs, ph, old_status, now), "regions",
                           regions(obs, old_status),
                           "readyRegions", rr, "readyPeers", rp);
    if (!st) return NULL;
    json_object_set_new(st, "peersPerStage", json_integer(fewest < 0 ? 0 : fewest));
    if (obs->name) {
        char sel[320];
        snprintf(sel, sizeof sel, "%s=%s,%s=%s", CIRRUS_LABEL_JOB, obs->name, CIRRUS_LABEL_ROLE,
                 CIRRUS_ROLE_PEER);
        json_object_set_new(st, "selector", json_string(sel));
    }
    /* startTime: when pods were first made, as a Job's; cleared while suspended so that
     * runPolicy.activeDeadlineSeconds counts running time only (null removes it in a merge
     * patch). */
    if (obs->suspended && !jobstatus_phase_final(ph))
        json_object_set_new(st, "startTime", json_null());
    else
        json_object_set_new(st, "startTime", json_string(start ? start : now));
    if (done)
        json_object_set_new(st, "completionTime", json_string(done));
    else if (jobstatus_phase_final(ph))
        json_object_set_new(st, "completionTime", json_string(now));
    job_progress(st);
    job_outer(st);
    return st;
}

/* Copy of a conditions array with every lastTransitionTime removed. */
static json_t *without_times(const json_t *conds)
{
    json_t *c = json_deep_copy(conds);
    size_t i;
    json_t *cond;
    json_array_foreach(c, i, cond) json_object_del(cond, "lastTransitionTime");
    return c;
}

/* json_equal, except that numbers compare by value: the API server stores numbers, not
 * their spelling, and gives a real that is a whole number (tokensPerSecond 0.0) back as an
 * integer (0); a type-strict comparison would write the same status again and again. */
static int same(const json_t *a, const json_t *b)
{
    if (json_is_number(a) && json_is_number(b)) {
        if (json_is_integer(a) && json_is_integer(b))
            return json_integer_value(a) == json_integer_value(b);
        return json_number_value(a) == json_number_value(b);
    }
    if (json_is_object(a) && json_is_object(b)) {
        if (json_object_size(a) != json_object_size(b)) return 0;
        const char *key;
        const json_t *v;
        json_object_foreach((json_t *)a, key, v)
        {
            const json_t *w = json_object_get(b, key);
            if (!w || !same(v, w)) return 0;
        }
        return 1;
    }
    if (json_is_array(a) && json_is_array(b)) {
        if (json_array_size(a) != json_array_size(b)) return 0;
        for (size_t i = 0; i < json_array_size(a); i++)
            if (!same(json_array_get(a, i), json_array_get(b, i))) return 0;
        return 1;
    }
    return json_equal(a, b);
}

int jobstatus_changed(const json_t *old, const json_t *new_status)
{
    if (!new_status) return 0;
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)new_status, key, v)
    {
        json_t *o = json_object_get(old, key);
        if (json_is_null(v) && (!o || json_is_null(o))) continue; /* removing what is absent */
        if (!o) return 1;
        if (!strcmp(key, "conditions")) {
            json_t *x = without_times(o), *y = without_times(v);
            int differ = !same(x, y);
            json_decref(x);
            json_decref(y);
            if (differ) return 1;
        } else if (!same(o, v)) {
            return 1;
        }
    }
    return 0;
}

void jobstatus_now(char *buf, size_t n) { jobstatus_format_time((int64_t)time(NULL), buf, n); }

void jobstatus_format_time(int64_t t, char *buf, size_t n)
{
    time_t tt = (time_t)t;
    struct tm tm;
    gmtime_r(&tt, &tm);
    strftime(buf, n, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

int64_t jobstatus_parse_time(const char *s)
{
    struct tm tm = {0};
    const char *end = s ? strptime(s, "%Y-%m-%dT%H:%M:%S", &tm) : NULL;
    if (!end) return -1;
    if (*end == '.')
        for (end++; *end >= '0' && *end <= '9'; end++) {}
    if (strcmp(end, "Z")) return -1;
    return (int64_t)timegm(&tm);
}
