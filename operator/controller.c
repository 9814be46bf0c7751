/* controller: the reconcile loop itself (controller.h): informer handlers that queue a job's
 * key, reconcile() that makes one job's children match desired.h and writes its status, and
 * the public API. The pods, the other children and the status have
 * their own files (controller_internal.h says which). */
#include "controller.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../common/clock.h"
#include "../common/log.h"
#include "../common/role_args.h"
#include "cache_slim.h"
#include "controller_internal.h"
#include "podstate.h"

void ctl_enqueue(controller *ctl, const char *key)
{
    if (kube_workqueue_add(ctl->queue, key)) log_warn("out of memory queueing %s", key);
}

/* ---- informer handlers: every change queues the job it belongs to ------------------------- */

static void job_changed(void *ctx, const json_t *obj)
{
    char key[KEY_MAX];
    if (kube_object_key(obj, key, sizeof key) == 0) ctl_enqueue(ctx, key);
}

static void job_updated(void *ctx, const json_t *old_obj, const json_t *new_obj)
{
    (void)old_obj;
    job_changed(ctx, new_obj);
}

static void child_changed(void *ctx, const json_t *obj)
{
    const char *ns = meta_str(obj, "namespace"), *job = label(obj, CIRRUS_LABEL_JOB);
    char key[KEY_MAX];
    if (!ns || !job) return;
    if (snprintf(key, sizeof key, "%s/%s", ns, job) < (int)sizeof key) ctl_enqueue(ctx, key);
}

static void child_updated(void *ctx, const json_t *old_obj, const json_t *new_obj)
{
    (void)old_obj;
    child_changed(ctx, new_obj);
}

/* The key of pod's job in pods_by_job ("ns/job"), 0; -1 if it has none. */
static int job_key_of(const json_t *pod, char *key, size_t n)
{
    const char *ns = meta_str(pod, "namespace"), *job = label(pod, CIRRUS_LABEL_JOB);
    return ns && job && snprintf(key, n, "%s/%s", ns, job) < (int)n ? 0 : -1;
}

static void index_pod(controller *ctl, const json_t *pod, int present)
{
    char key[KEY_MAX];
    const char *name = meta_str(pod, "name");
    if (!name || job_key_of(pod, key, sizeof key)) return;
    json_t *set = json_object_get(ctl->pods_by_job, key);
    if (present) {
        if (!set) json_object_set_new(ctl->pods_by_job, key, set = json_object());
        json_object_set_new(set, name, json_true());
    } else if (set) {
        json_object_del(set, name);
        if (!json_object_size(set)) json_object_del(ctl->pods_by_job, key);
    }
}

/* What the cache showed of a pod, for the job's memory (ctl_pod_cached). */
static void pod_cached(controller *ctl, const json_t *pod)
{
    char key[KEY_MAX];
    if (!job_key_of(pod, key, sizeof key)) ctl_pod_cached(ctl, key, pod);
}

static void pod_added(void *ctx, const json_t *pod)
{
    index_pod(ctx, pod, 1);
    pod_cached(ctx, pod);
    child_changed(ctx, pod);
}

static void pod_updated(void *ctx, const json_t *old_pod, const json_t *pod)
{
    char a[KEY_MAX], b[KEY_MAX];
    /* Someone relabelled it to another job: it is that job's now. */
    if (!job_key_of(old_pod, a, sizeof a) && (job_key_of(pod, b, sizeof b) || strcmp(a, b))) {
        index_pod(ctx, old_pod, 0);
        child_changed(ctx, old_pod);
    }
    index_pod(ctx, pod, 1);
    pod_cached(ctx, pod);
    child_changed(ctx, pod);
}

static void pod_deleted(void *ctx, const json_t *pod)
{
    index_pod(ctx, pod, 0);
    pod_cached(ctx, pod);
    child_changed(ctx, pod);
}

/* A deleted node's pods will never run again, but pod GC only removes them after 40 s: the
 * operator replaces them at once (on a spot pool, the node object going is how the cloud
 * says the VM was reclaimed). */
static void node_deleted(void *ctx, const json_t *node)
{
    controller *ctl = ctx;
    const char *name = meta_str(node, "name"), *key;
    const json_t *pod;
    if (!name) return;
    /* Forget nodes whose pods are all gone: the set stays as small as the losses in flight. */
    const char *gone;
    json_t *v;
    void *tmp;
    json_t *used = json_object(); /* nodes that pods are on */
    const json_t *mark;
    char needle[320];
    snprintf(needle, sizeof needle, "\"nodeName\":\"%s\"", name);
    json_object_foreach((json_t *)kube_informer_objects(ctl->pods), key, mark)
    {
        /* The cache holds pods as text: only those on a gone node are parsed. */
        const char *text = json_string_value(mark);
        if (text && json_object_size(ctl->gone_nodes) == 0 && !strstr(text, needle)) continue;
        pod = kube_informer_get(ctl->pods, key);
        const char *on =
            json_string_value(json_object_get(json_object_get(pod, "spec"), "nodeName"));
        if (on && used) json_object_set_new(used, on, json_true());
        if (on && !strcmp(on, name)) child_changed(ctl, pod);
        kube_informer_release(ctl->pods); /* one pod parsed at a time */
    }
    json_object_foreach_safe(ctl->gone_nodes, tmp, gone, v)
    {
        if (used && !json_object_get(used, gone)) json_object_del(ctl->gone_nodes, gone);
    }
    json_decref(used);
    json_object_set_new(ctl->gone_nodes, name, json_true());
}

static void node_added(void *ctx, const json_t *node)
{
    controller *ctl = ctx;
    const char *name = meta_str(node, "name");
    if (name) json_object_del(ctl->gone_nodes, name); /* a new node under an old name */
}

/* ---- events -------------------------------------------------------------------------------- */

/* Before creating anything for a job: does it still exist? The cache can lag a deletion by
 * seconds (a re-list in progress), and children made for a deleted job are deleted again by
 * the garbage collector, then made again, over and over. One GET per reconcile that creates
 * something. 1: it exists; 0: it is gone or going; negative: the GET failed. */
int ctl_job_exists(controller *ctl, const json_t *job, cirrus_error *err)
{
    if (ctl->job_confirmed >= 0) return ctl->job_confirmed;
    char path[PATH_MAX_LEN];
    int rc = kube_path(path, sizeof path, SWARMJOB_API, meta_str(job, "namespace"), "swarmjobs",
                       meta_str(job, "name"));
    if (rc) return cirrus_fail(err, rc, "job path too long");
    json_t *cur = NULL;
    rc = kube_get(ctl->client, path, &cur, err);
    if (rc && rc != CIRRUS_ENOENT) {
        json_decref(cur);
        return rc;
    }
    const char *uid = rc ? NULL : meta_str(cur, "uid");
    ctl->job_confirmed = uid && meta_str(job, "uid") && !strcmp(uid, meta_str(job, "uid")) &&
                         !meta_str(cur, "deletionTimestamp");
    json_decref(cur);
    return ctl->job_confirmed;
}

/* ---- reconcile ------------------------------------------------------------------------------- */

/* Whether the job's status has condition `type` with this reason and message. */
static int condition_says(const json_t *job, const char *type, const char *reason,
                          const char *message)
{
    const json_t *c = jobstatus_condition(json_object_get(job, "status"), type);
    const char *r = json_string_value(json_object_get(c, "reason"));
    const char *msg = json_string_value(json_object_get(c, "message"));
    return r && msg && !strcmp(r, reason) && !strcmp(msg, message);
}

/* A spec desired_build refused (err): an Event, and the status says so (Created False,
 * InvalidSpec, err's message). Nothing is created or deleted. */
static int invalid_spec(controller *ctl, const json_t *job, job_mem *m, cirrus_error *err)
{
    char msg[sizeof err->msg];
    snprintf(msg, sizeof msg, "%s", err->msg);
    if (!m || !leading(ctl)) return 0;
    /* The Event once per refusal, not on every resync. */
    if (!condition_says(job, "Created", "InvalidSpec", msg))
        ctl_event(ctl, job, 1, "InvalidSpec", "%s", msg);
    job_observed obs;
    ctl_observe_spec(job, &obs);
    ctl_apply_counts(&obs, m);
    obs.not_created_reason = "InvalidSpec";
    obs.not_created_message = msg;
    int64_t progress_ms;
    return ctl_write_status(ctl, job, m, &obs, &progress_ms, err);
}

static int reconcile(controller *ctl, const char *key, int64_t *requeue_ms, cirrus_error *err)
{
    *requeue_ms = 0;
    const json_t *job = kube_informer_get(ctl->jobs, key);
    if (!job) {
        ctl_mem_forget(ctl, key); /* deleted: the garbage collector removes its children */
        progress_forget(ctl->opt.progress, key);
        return 0;
    }
    /* Being deleted, or another controller's (spec.managedBy): nothing to do here, but
     * for a job with member clusters, deleting its copies there (the finalizer). */
    if (meta_str(job, "deletionTimestamp") || !desired_managed_here(job)) {
        progress_forget(ctl->opt.progress, key);
        if (!meta_str(job, "deletionTimestamp") || !desired_managed_here(job)) return 0;
        json_incref((json_t *)job);
        int rc = ctl_release_members(ctl, job, requeue_ms, err);
        json_decref((json_t *)job);
        return rc;
    }
    json_incref((json_t *)job); /* requests below run the event loop's transfers, not its
                                   handlers, but hold it anyway */
    job_mem *m = ctl_mem_get(ctl, key, job);
    ctl->job_confirmed = -1;
    desired_job d = {0};
    int rc = m ? 0 : cirrus_fail(err, CIRRUS_ENOMEM, "out of memory");
    failpolicy policy = {0};
    if (!rc && (desired_build(job, &d, err) ||
                failpolicy_from_spec(json_object_get(job, "spec"), &policy, err))) {
        /* The API server validated the spec; what still fails here (e.g. names too long
         * once combined) will not fix itself by retrying: said once in an Event and for as
         * long as it lasts in the Created condition. */
        rc = invalid_spec(ctl, job, m, err);
        desired_job_free(&d);
        json_decref((json_t *)job);
        return rc;
    }
    if (!m) {
        desired_job_free(&d);
        json_decref((json_t *)job);
        return rc;
    }
    job_observed obs;
    ctl_observe_spec(job, &obs);
    int64_t deadline_ms = ctl_active_deadline(job, &obs);
    const char *old_phase = json_string_value(json_object_get(json_object_get(job, "status"), "phase"));
    enum job_phase phase = jobstatus_phase(&obs, old_phase, 0);
    /* Before the pods: a final phase reached earlier stays; Failed from counts is decided
     * after accounting below. */
    const int secret_known = m->secret_ok;
    /* The finalizer before anything in a member cluster is made. */
    if (!rc) rc = ctl_members_finalizer(ctl, job, err);
    if (!rc) rc = ctl_ensure_secret(ctl, job, m, d.secret, 0, err);
    if (!rc) ctl_gate_gateways(job, m, &d);
    if (!rc) rc = ctl_ensure_services(ctl, job, d.services, m->services_gen, err);
    if (!rc) m->services_gen = int_at(job, "metadata", "generation", 0);
    /* Without its gang's PodGroup a region's pods are not made: scheduled one by one, they
     * would break the all-or-nothing the spec asks for. */
    cirrus_error groups_err = {0};
    const int groups_rc = rc || obs.suspended ? 0
                          : ctl_ensure_pod_groups(ctl, job, m, d.pod_groups, &groups_err);
    /* Observed pods of this job (the informer caches every pod the operator manages;
     * pods_by_job names this job's). */
    const char *pkey;
    const json_t *pod;
    const char *ns = meta_str(job, "namespace");
    json_t *have = json_object();
    const json_t *mark;
    json_object_foreach(json_object_get(ctl->pods_by_job, key), pkey, mark)
    {
        char pod_key[KEY_MAX];
        snprintf(pod_key, sizeof pod_key, "%s/%s", ns, pkey);
        if ((pod = kube_informer_get(ctl->pods, pod_key)))
            json_object_set(have, pkey, (json_t *)pod);
    }
    ctl_apply_counts(&obs, m);
    json_t *doomed = json_object(); /* pod name -> {"uid", "force", "ended"} */
    json_t *rolling = json_object(); /* peers built from an older spec: pod name -> pod */
    const char *pname;
    json_object_foreach(have, pname, pod)
    {
        const json_t *want = json_object_get(d.pods, pname);
        /* A gateway left out only because another cluster's endpoint is not known right now
         * (desired_job.waiting) stays as it runs: it was made with that endpoint. */
        const char *role = label(pod, CIRRUS_LABEL_ROLE);
        if (!want && d.waiting[0] && role && !strcmp(role, CIRRUS_ROLE_GATEWAY)) want = pod;
        enum pod_action a = ctl_observe_pod(ctl, job, m, &policy, pod, want, &obs);
        if (a == ROLL_POD)
            json_object_set(rolling, pname, (json_t *)pod);
        else if (a != KEEP_POD)
            json_object_set_new(doomed, pname,
                                json_pack("{s:s, s:b, s:b}", "uid", meta_str(pod, "uid"),
                                          "force", a == FORCE_DELETE_POD, "ended",
                                          pod_state_ended(pod_state_of(pod, NULL, 0))));
    }
    ctl_roll_stages(ctl, job, m, rolling, have, d.pods, doomed);
    json_decref(rolling);
    ctl_apply_counts(&obs, m);
    phase = jobstatus_phase(&obs, old_phase, 0);
    int final = jobstatus_phase_final(phase), stop = obs.suspended || final;
    if (stop) {
        /* Nothing runs while suspended or once the job is over, except clients that finished
         * (under successPolicy Any, the other regions' clients still training stop too: the
         * job is over without them). */
        json_object_foreach(have, pname, pod)
        {
            const char *role = label(pod, CIRRUS_LABEL_ROLE);
            enum pod_state st = pod_state_of(pod, NULL, 0);
            if (pod_state_ended(st) || st == POD_TERMINATING) continue;
            if (phase == PHASE_SUCCEEDED && !obs.success_any && role &&
                !strcmp(role, CIRRUS_ROLE_CLIENT))
                continue;
            ctl_mark_seen(m, pname, meta_str(pod, "uid") ? meta_str(pod, "uid") : "", 1, 1);
            json_object_set_new(doomed, pname, json_pack("{s:s, s:b, s:b}", "uid",
                                                         meta_str(pod, "uid"), "force", 0,
                                                         "ended", 0));
        }
    }
    /* Create what is missing, in batches side by side (1, 2, 4, ... CREATE_BATCH_MAX while
     * all goes well): one pod the API refuses does not hold up the others, but after three
     * batches with refusals (a quota, an admission webhook saying no to all) the rest wait
     * for the retry instead of costing a request each. */
    int first = 0;
    cirrus_error first_err = {0};
    char refused[sizeof err->msg + CIRRUS_NAME_MAX + 8];
    const int64_t create_until = clock_now_ms() + CREATE_BUDGET_MS;
    int more = 0; /* pods left to create for want of time: run again at once */
    const char *names[CREATE_BATCH_MAX];
    const json_t *wants[CREATE_BATCH_MAX];
    int rcs[CREATE_BATCH_MAX];
    cirrus_error errs[CREATE_BATCH_MAX];
    size_t batch = 1;
    int refused_batches = 0, secret_rechecked = 0;
    if (groups_rc) {
        first = groups_rc;
        first_err = groups_err;
        obs.not_created_reason = "PodGroupFailed";
        obs.not_created_message = groups_err.msg;
    } else if (d.waiting[0]) {
        obs.not_created_reason = d.waiting_reason ? d.waiting_reason : "WaitingForEndpoints";
        obs.not_created_message = d.waiting;
    }
    void *it = json_object_iter(d.pods);
    while (!rc && !groups_rc && !stop && leading(ctl) && refused_batches < 3) {
        size_t n = 0;
        for (; it && n < batch; it = json_object_iter_next(d.pods, it))
            if (!json_object_get(have, json_object_iter_key(it))) {
                names[n] = json_object_iter_key(it);
                wants[n++] = json_object_iter_value(it);
            }
        if (!n) break;
        if (clock_now_ms() > create_until) {
            more = 1;
            break;
        }
        int ex = ctl_job_exists(ctl, job, err);
        if (ex < 0 && !first) {
            first = ex;
            first_err = *err;
        }
        if (ex <= 0) break;
        /* The pods mount the Secret: if it was only remembered, ask once more (deleted by
         * someone meanwhile, it is made again before pods wait on it). */
        if (secret_known && !secret_rechecked++) {
            int src = ctl_ensure_secret(ctl, job, m, d.secret, 1, err);
            if (src) {
                if (!first) {
                    first = src;
                    first_err = *err;
                }
                break;
            }
        }
        ctl_create_pods(ctl, job, m, names, wants, n, rcs, errs);
        int all_made = 1;
        for (size_t i = 0; i < n; i++) {
            if (!rcs[i]) continue;
            all_made = 0;
            if (!first) {
                first = rcs[i];
                first_err = errs[i];
            }
            /* The first refusal shows in the Created condition until a reconcile makes them
             * all. */
            if (!obs.not_created_reason) {
                snprintf(refused, sizeof refused, "pod %s: %s", names[i], errs[i].msg);
                obs.not_created_reason = "PodCreateFailed";
                obs.not_created_message = refused;
            }
        }
        if (all_made) {
            batch = batch * 2 > CREATE_BATCH_MAX ? CREATE_BATCH_MAX : batch * 2;
        } else {
            batch = 1;
            refused_batches++;
        }
    }
    /* Pods found gone while creating them are preemptions counted just now: in this status
     * write, not the next one (a leader handing over may not make another). */
    ctl_apply_counts(&obs, m);
    ctl_watch_progress(ctl, job, key, &obs, stop);
    ctl_apply_progress(ctl, job, &obs);
    /* Regions in several clusters: the endpoints of this cluster's, and at home the
     * members' regions from their copies. */
    ctl_local_endpoints(ctl, job, m, &obs);
    const int64_t members_ms = rc ? 0 : ctl_sync_members(ctl, job, m, &obs);
    /* The counts reach the status before the pods that showed them are deleted. */
    int64_t progress_ms = 0;
    if (!rc && leading(ctl)) rc = ctl_write_status(ctl, job, m, &obs, &progress_ms, err);
    json_t *gone;
    json_object_foreach(doomed, pname, gone)
    {
        if (rc || !leading(ctl)) break;
        /* Once the job is over, ended pods stay for their logs (Kubeflow's cleanPodPolicy
         * Running); before, an ended pod is deleted and re-created under its name. */
        if (final && json_is_true(json_object_get(gone, "ended"))) continue;
        int prc =
            ctl_delete_pod(ctl, job, pname, json_string_value(json_object_get(gone, "uid")),
                           json_is_true(json_object_get(gone, "force")), err);
        if (prc && !first) {
            first = prc;
            first_err = *err;
        }
    }
    json_decref(doomed);
    if (!rc && first) {
        rc = first;
        *err = first_err;
    }
    if (!rc && more) *requeue_ms = 1;
    if (!rc && !leading(ctl)) *requeue_ms = 1000; /* finish when leading again */
    /* Pods made and not cached yet: normally their watch event brings the job back; with
     * the pod watch down, only asking again does (a pod made, then deleted unseen). */
    const int unseen = !rc && !stop && ctl_pods_unseen(m, have, d.pods);
    json_decref(have);
    if (!rc && final) *requeue_ms = ctl_expire_finished(ctl, job, err, &rc);
    else if (!rc && !*requeue_ms)
        *requeue_ms = deadline_ms > 0 && (!progress_ms || deadline_ms < progress_ms)
                          ? deadline_ms
                          : progress_ms;
    if (unseen && (!*requeue_ms || *requeue_ms > UNSEEN_RECHECK_MS))
        *requeue_ms = UNSEEN_RECHECK_MS;
    if (members_ms && (!*requeue_ms || *requeue_ms > members_ms)) *requeue_ms = members_ms;
    if (m->secret_pending && (!*requeue_ms || *requeue_ms > SECRET_PENDING_RECHECK_MS))
        *requeue_ms = SECRET_PENDING_RECHECK_MS;
    if (*requeue_ms > REQUEUE_MAX_MS) *requeue_ms = REQUEUE_MAX_MS;
    desired_job_free(&d);
    failpolicy_free(&policy);
    json_decref((json_t *)job);
    return rc;
}

/* ---- public API -------------------------------------------------------------------------------- */

/* What an informer watches: its handlers. */
enum watched { WATCH_JOBS, WATCH_PODS, WATCH_CHILDREN /* the other children */ };

static int informer(controller *ctl, const char *path, const char *query, enum watched w,
                    kube_informer **out, cirrus_error *err)
{
    kube_informer_config ic = {.path = path, .query = query, .ctx = ctl};
    if (w == WATCH_JOBS) {
        /* Kept as text too (parsed once per reconcile): a SwarmJob's jansson objects were
         * most of the operator's own memory after the pods (docs/BENCHMARKS.md). */
        ic.compact = 1;
        ic.transform = cache_slim_job;
        ic.on_add = ic.on_delete = job_changed;
        ic.on_update = job_updated;
    } else if (w == WATCH_PODS) {
        /* Thousands of pods: kept as text, ~1 KB each instead of ~9 KB of jansson objects
         * (docs/BENCHMARKS.md), parsed when a reconcile asks for its job's. */
        ic.compact = 1;
        ic.transform = cache_slim_pod;
        ic.on_add = pod_added;
        ic.on_update = pod_updated;
        ic.on_delete = pod_deleted;
    } else {
        ic.transform = cache_slim_to_metadata;
        ic.on_add = ic.on_delete = child_changed;
        ic.on_update = child_updated;
    }
    return kube_informer_new(ctl->client, &ic, out, err);
}

int controller_new(kube_client *c, const controller_options *o, controller **out,
                   cirrus_error *err)
{
    *out = NULL;
    controller *ctl = calloc(1, sizeof *ctl);
    if (!ctl) return cirrus_fail(err, CIRRUS_ENOMEM, "out of memory");
    ctl->client = c;
    ctl->opt = *o;
    if (!ctl->opt.cluster_name || !*ctl->opt.cluster_name) ctl->opt.cluster_name = "home";
    snprintf(ctl->identity, sizeof ctl->identity, "%s", o->identity ? o->identity : "cirrus-operator");
    ctl->queue = kube_workqueue_new(NULL, NULL);
    ctl->gone_nodes = json_object();
    ctl->pods_by_job = json_object();
    ctl->events = json_array();
    const char *ns = o->watch_namespace && *o->watch_namespace ? o->watch_namespace : NULL;
    char jobs[PATH_MAX_LEN], pods[PATH_MAX_LEN], svcs[PATH_MAX_LEN];
    int rc = ctl->queue && ctl->gone_nodes && ctl->pods_by_job && ctl->events
                 ? 0
                 : cirrus_fail(err, CIRRUS_ENOMEM, "out of memory");
    if (!rc && (kube_path(jobs, sizeof jobs, SWARMJOB_API, ns, "swarmjobs", NULL) ||
                kube_path(pods, sizeof pods, "api/v1", ns, "pods", NULL) ||
                kube_path(svcs, sizeof svcs, "api/v1", ns, "services", NULL)))
        rc = cirrus_fail(err, CIRRUS_EINVAL, "bad namespace %s", ns);
    if (!rc) rc = informer(ctl, jobs, NULL, WATCH_JOBS, &ctl->jobs, err);
    if (!rc) rc = informer(ctl, pods, CHILD_SELECTOR, WATCH_PODS, &ctl->pods, err);
    if (!rc) rc = informer(ctl, svcs, CHILD_SELECTOR, WATCH_CHILDREN, &ctl->services, err);
    if (!rc) {
        kube_informer_config nc = {.path = "/api/v1/nodes", .transform = cache_slim_node,
                                   .on_add = node_added,
                                   .on_delete = node_deleted, .ctx = ctl};
        rc = kube_informer_new(c, &nc, &ctl->nodes, err);
    }
    if (rc) {
        controller_free(ctl);
        return rc;
    }
    *out = ctl;
    return 0;
}

void controller_free(controller *ctl)
{
    if (!ctl) return;
    ctl_flush_events(ctl);
    json_decref(ctl->events);
    kube_informer_free(ctl->jobs);
    kube_informer_free(ctl->pods);
    kube_informer_free(ctl->services);
    kube_informer_free(ctl->nodes);
    json_decref(ctl->gone_nodes);
    json_decref(ctl->pods_by_job);
    kube_workqueue_free(ctl->queue);
    ctl_members_free(ctl);
    while (ctl->mems) ctl_mem_forget(ctl, ctl->mems->key);
    free(ctl);
}

int controller_synced(const controller *ctl)
{
    return kube_informer_has_synced(ctl->jobs) && kube_informer_has_synced(ctl->pods) &&
           kube_informer_has_synced(ctl->services) &&
           kube_informer_has_synced(ctl->nodes);
}

int controller_process(controller *ctl, int max_keys)
{
    int ran = 0;
    const char *k;
    if (!controller_synced(ctl)) return 0;
    /* Jobs with new training figures: reconciled (and their status written) like any other. */
    if (leading(ctl)) progress_drain(ctl->opt.progress, ctl_progress_arrived, ctl);
    const int64_t until = clock_now_ms() + PROCESS_BUDGET_MS;
    while (ran < max_keys && leading(ctl) && (!ran || clock_now_ms() < until) &&
           kube_workqueue_get(ctl->queue, &k) == 1) {
        char key[KEY_MAX];
        snprintf(key, sizeof key, "%s", k);
        cirrus_error err = {0};
        int64_t requeue_ms = 0;
        double t0 = clock_now_s();
        int rc = reconcile(ctl, key, &requeue_ms, &err);
        kube_informer_release(ctl->pods); /* the pods it parsed (kept ones are its own refs) */
        ctl_flush_events(ctl); /* the reconcile's Events, side by side */
        kube_informer_release(ctl->jobs); /* and its job, parsed from the cache's text */
        double dt = clock_now_s() - t0;
        ctl->stats.reconciles++;
        enum op_result res = OP_RESULT_SUCCESS;
        if (rc) {
            ctl->stats.errors++;
            res = OP_RESULT_ERROR;
            int64_t delay = 0;
            kube_workqueue_add_rate_limited(ctl->queue, key, &delay);
            log_warn("reconcile %s: %s (retry in %lld ms)", key, err.msg,
                     (long long)(delay / 1000000));
        } else {
            kube_workqueue_forget(ctl->queue, key);
            if (requeue_ms > 0) {
                res = OP_RESULT_REQUEUE_AFTER;
                kube_workqueue_add_after(ctl->queue, key, requeue_ms * 1000000);
            }
        }
        kube_workqueue_done(ctl->queue, key);
        op_metrics_reconciled(ctl->opt.metrics, res, dt);
        ran++;
    }
    kube_workqueue_stats qs;
    kube_workqueue_get_stats(ctl->queue, &qs);
    op_metrics_queue(ctl->opt.metrics, qs.depth, qs.adds, qs.retries);
    op_metrics_pods(ctl->opt.metrics, ctl->stats.pods_created, ctl->stats.preemptions,
                    ctl->stats.failures);
    kube_client_stats cs;
    kube_client_get_stats(ctl->client, &cs);
    op_metrics_api(ctl->opt.metrics, cs.transfers, cs.retries);
    return ran;
}

int64_t controller_next_ms(controller *ctl)
{
    int64_t ns = kube_workqueue_next_ready_ns(ctl->queue);
    return ns < 0 ? -1 : (ns + 999999) / 1000000;
}

int controller_settled(controller *ctl, const char *own_node)
{
    if (kube_workqueue_next_ready_ns(ctl->queue) == 0) return 0;
    const json_t *node = own_node ? kube_informer_get(ctl->nodes, own_node) : NULL;
    const int drained = json_is_true(json_object_get(json_object_get(node, "spec"), "unschedulable"));
    const char *key;
    const json_t *mark;
    int settled = 1;
    json_object_foreach((json_t *)kube_informer_objects(ctl->pods), key, mark)
    {
        const json_t *pod = kube_informer_get(ctl->pods, key);
        const char *on = json_string_value(json_object_get(json_object_get(pod, "spec"), "nodeName"));
        if (json_object_get(json_object_get(pod, "metadata"), "deletionTimestamp") ||
            (drained && on && !strcmp(on, own_node)))
            settled = 0;
        kube_informer_release(ctl->pods);
        if (!settled) break;
    }
    return settled;
}

void controller_get_stats(const controller *ctl, controller_stats *st) { *st = ctl->stats; }

void controller_resync(controller *ctl, int forget)
{
    while (forget && ctl->mems) ctl_mem_forget(ctl, ctl->mems->key);
    const char *key;
    const json_t *job;
    json_object_foreach((json_t *)kube_informer_objects(ctl->jobs), key, job)
        ctl_enqueue(ctl, key);
}

void controller_standby(controller *ctl)
{
    if (ctl) progress_clear(ctl->opt.progress);
}

void controller_rewatch(controller *ctl, const char *resume_rv)
{
    kube_informer_disconnect(ctl->jobs, resume_rv);
    kube_informer_disconnect(ctl->pods, resume_rv);
    kube_informer_disconnect(ctl->services, resume_rv);
    kube_informer_disconnect(ctl->nodes, resume_rv);
}
