/* controller_pods: the pods of a job, as the reconcile loop sees them (controller_internal.h).
 *
 * What was seen of each pod (its uid, whether its end was already counted) and the
 * per-region preemption and failure counters live in the job's memory (job_mem), because
 * the cache lags the operator's own writes: a pod it just created may not be cached yet, one
 * it deleted may still be. observe_pod() decides what one pod means and whether it must go;
 * create_pod() and delete_pod() are the only pod writes. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/log.h"
#include "../common/role_args.h"
#include "controller_internal.h"
#include "failpolicy.h"
#include "podstate.h"

/* ---- per-job memory ----------------------------------------------------------------------- */

/* Everything a job's memory holds, released (the fields left dangling: reset or free next). */
static void mem_release(job_mem *m)
{
    json_decref(m->counts);
    json_decref(m->seen);
    json_decref(m->gone);
    json_decref(m->endpoints);
    json_decref(m->member_status);
    json_decref(m->pki);
    json_decref(m->member_status_prev);
}

static void mem_reset(job_mem *m, const json_t *job)
{
    mem_release(m);
    m->endpoints = m->member_status = m->pki = m->member_status_prev = NULL;
    m->counts = json_object();
    m->seen = json_object();
    m->gone = json_object();
    m->fail_job[0] = 0;
    m->secret_ok = m->secret_pending = 0; /* a new job of the name: its own Secret */
    snprintf(m->uid, sizeof m->uid, "%s", meta_str(job, "uid") ? meta_str(job, "uid") : "");
    const json_t *st = json_object_get(job, "status");
    const char *ph = json_string_value(json_object_get(st, "phase"));
    snprintf(m->phase, sizeof m->phase, "%s", ph ? ph : "");
    /* Counters survive operator restarts through the status. */
    size_t i;
    const json_t *r;
    json_array_foreach(json_object_get(st, "regions"), i, r)
    {
        const char *name = json_string_value(json_object_get(r, "name"));
        if (name)
            json_object_set_new(m->counts, name,
                                json_pack("{s:I, s:I}", "preemptions",
                                          int_at(r, "preemptions", NULL, 0), "failures",
                                          int_at(r, "failures", NULL, 0)));
    }
}

/* The memory of the job whose key is key; NULL when none is kept. */
static job_mem *mem_find(controller *ctl, const char *key)
{
    job_mem *m = ctl->mems;
    while (m && strcmp(m->key, key)) m = m->next;
    return m;
}

job_mem *ctl_mem_get(controller *ctl, const char *key, const json_t *job)
{
    job_mem *m = mem_find(ctl, key);
    if (!m) {
        m = calloc(1, sizeof *m);
        if (!m) return NULL;
        snprintf(m->key, sizeof m->key, "%s", key);
        m->next = ctl->mems;
        ctl->mems = m;
        mem_reset(m, job);
    } else if (strcmp(m->uid, meta_str(job, "uid") ? meta_str(job, "uid") : "")) {
        mem_reset(m, job); /* deleted and re-created under the same name */
    }
    return m;
}

void ctl_mem_forget(controller *ctl, const char *key)
{
    for (job_mem **p = &ctl->mems; *p; p = &(*p)->next) {
        if (strcmp((*p)->key, key)) continue;
        job_mem *m = *p;
        *p = m->next;
        mem_release(m);
        free(m);
        return;
    }
}

static void count(controller *ctl, job_mem *m, const char *region, int failure)
{
    if (!region) return;
    json_t *c = json_object_get(m->counts, region);
    if (!c) {
        c = json_pack("{s:I, s:I}", "preemptions", (json_int_t)0, "failures", (json_int_t)0);
        json_object_set_new(m->counts, region, c);
    }
    const char *field = failure ? "failures" : "preemptions";
    json_object_set_new(c, field, json_integer(int_at(c, field, NULL, 0) + 1));
    if (failure)
        ctl->stats.failures++;
    else
        ctl->stats.preemptions++;
}

/* ---- pods ------------------------------------------------------------------------------------ */

/* Delete one pod, but only the incarnation we looked at (uid precondition): after a stale
 * cache or a leadership change, a replacement made meanwhile under the same name survives. */
int ctl_delete_pod(controller *ctl, const json_t *job, const char *name, const char *uid,
                   int force, cirrus_error *err)
{
    char path[PATH_MAX_LEN];
    if (child_path(path, job, "pods", name))
        return cirrus_fail(err, CIRRUS_EINVAL, "pod path too long");
    json_t *opt = json_pack("{s:{s:s}}", "preconditions", "uid", uid ? uid : "");
    if (opt && force) json_object_set_new(opt, "gracePeriodSeconds", json_integer(0));
    int rc = opt ? kube_delete(ctl->client, path, opt, err)
                 : cirrus_fail(err, CIRRUS_ENOMEM, "out of memory");
    json_decref(opt);
    if (rc == CIRRUS_ENOENT || rc == CIRRUS_ECONFLICT) rc = 0; /* gone, or already replaced */
    if (!rc) ctl->stats.pods_deleted++;
    return rc;
}

/* A record is one string, not a JSON object: three flag characters ('1' or '0': observed,
 * counted, summary warned), then the uid. A JSON object of three members per pod (a hash
 * table and its pairs) was hundreds of bytes a pod; with this and the other changes of
 * commit b06d2d6 the operator's own memory with 1,000 jobs fell from 87.0 to 74.0 MiB
 * (docs/BENCHMARKS.md). */
enum { SEEN_OBSERVED, SEEN_COUNTED, SEEN_WARNED, SEEN_FLAGS };

int ctl_seen_get(const job_mem *m, const char *name, pod_seen *out)
{
    *out = (pod_seen){0};
    const char *s = json_string_value(json_object_get(m->seen, name));
    if (!s || strlen(s) < SEEN_FLAGS) return 0;
    out->observed = s[SEEN_OBSERVED] == '1';
    out->counted = s[SEEN_COUNTED] == '1';
    out->summary_warned = s[SEEN_WARNED] == '1';
    out->uid = s + SEEN_FLAGS;
    return 1;
}

static void seen_set(job_mem *m, const char *name, const char *uid, int observed, int counted,
                     int warned)
{
    /* In the order of the SEEN_ indices; uid copied before the old record is replaced. */
    json_object_set_new(m->seen, name, json_sprintf("%c%c%c%s", observed ? '1' : '0',
                                                    counted ? '1' : '0', warned ? '1' : '0', uid));
}

/* Remember pod `name` as uid. observed: seen in the cache (not only created by us: a pod we
 * just created may not be in the cache yet, and must not look deleted). counted: its end
 * was accounted for, or we deleted it ourselves. Flags only ever go from 0 to 1 for a uid. */
void ctl_mark_seen(job_mem *m, const char *name, const char *uid, int observed, int counted)
{
    pod_seen s;
    if (ctl_seen_get(m, name, &s) && !strcmp(s.uid, uid)) {
        if ((observed && !s.observed) || (counted && !s.counted))
            seen_set(m, name, uid, observed || s.observed, counted || s.counted,
                     s.summary_warned);
        return;
    }
    seen_set(m, name, uid, observed, counted, 0);
}

void ctl_seen_warned(job_mem *m, const char *name)
{
    pod_seen s;
    if (!ctl_seen_get(m, name, &s) || s.summary_warned) return;
    seen_set(m, name, s.uid, s.observed, s.counted, 1);
}

/* Incarnations kept per pod name in job_mem.gone: more than can come and go under one name
 * while a watch is down (each needs a create, a start and a deletion). */
#define GONE_KEPT 16

/* Whether the cache's pod `uid` under `name` is an older incarnation than the one remembered:
 * one whose end was accounted for here already, or any but the one made here last and not
 * cached yet (only this process makes pods under these names, and only once the last one is
 * gone). A watch resumed from before such a pod ended replays it as if it were there:
 * taken for the current pod, its end would be counted a second time (an over-count), and
 * the current pod's uid forgotten. */
/* A pod's real uid: not "" (perhaps made) nor UID_MADE (made, its uid unknown). */
static int uid_known(const char *uid)
{
    return uid && *uid && strcmp(uid, UID_MADE);
}

static int stale_incarnation(const job_mem *m, const char *name, const char *uid)
{
    size_t i;
    const json_t *u;
    json_array_foreach(json_object_get(m->gone, name), i, u)
    {
        if (json_string_value(u) && !strcmp(json_string_value(u), uid)) return 1;
    }
    pod_seen s;
    ctl_seen_get(m, name, &s);
    return uid_known(s.uid) && strcmp(s.uid, uid) && !s.observed;
}

/* Forget name's incarnation before making the next one: its uid, when known, joins gone. */
static void retire(job_mem *m, const char *name)
{
    pod_seen s;
    ctl_seen_get(m, name, &s);
    if (uid_known(s.uid)) {
        json_t *list = json_object_get(m->gone, name);
        if (!list) json_object_set_new(m->gone, name, list = json_array());
        json_array_append_new(list, json_string(s.uid));
        if (json_array_size(list) > GONE_KEPT) json_array_remove(list, 0);
    }
    json_object_del(m->seen, name);
}

void ctl_pod_cached(controller *ctl, const char *job_key, const json_t *pod)
{
    const char *name = meta_str(pod, "name"), *uid = meta_str(pod, "uid");
    job_mem *m = mem_find(ctl, job_key);
    if (!m || !name || !uid) return;
    pod_seen s;
    if (!ctl_seen_get(m, name, &s) || s.observed || s.counted || stale_incarnation(m, name, uid))
        return;
    ctl_mark_seen(m, name, uid, 1, 0);
}

static region_observed *region_obs(job_observed *obs, const char *name)
{
    for (int i = 0; name && i < obs->n_regions; i++)
        if (!strcmp(obs->regions[i].name, name)) return &obs->regions[i];
    return NULL;
}

/* Fill obs's spec part from the job. */
void ctl_observe_spec(const json_t *job, job_observed *obs)
{
    const json_t *spec = json_object_get(job, "spec");
    memset(obs, 0, sizeof *obs);
    obs->name = meta_str(job, "name");
    obs->generation = int_at(job, "metadata", "generation", 0);
    obs->backoff_limit = int_at(spec, "runPolicy", "backoffLimit", 6);
    obs->suspended = json_is_true(json_object_get(spec, "suspend"));
    int stages = (int)int_at(spec, "pipeline", "stages", 1);
    if (stages > JOBSTATUS_MAX_STAGES) stages = JOBSTATUS_MAX_STAGES;
    size_t i;
    const json_t *r;
    /* A copy (spec.home) observes its own regions only: the home job has the whole. */
    const int copy = json_is_object(json_object_get(spec, "home"));
    obs->is_copy = copy;
    const char *home_phase = json_string_value(
        json_object_get(json_object_get(spec, "home"), "phase"));
    obs->home_phase = home_phase && (!strcmp(home_phase, "Succeeded") ||
                                     !strcmp(home_phase, "Failed"))
                          ? home_phase
                          : NULL;
    json_array_foreach(json_object_get(spec, "regions"), i, r)
    {
        if (obs->n_regions == JOBSTATUS_MAX_REGIONS) break;
        const char *cluster = json_string_value(json_object_get(r, "cluster"));
        if (copy && cluster) continue;
        region_observed *ro = &obs->regions[obs->n_regions++];
        ro->cluster = cluster;
        ro->name = json_string_value(json_object_get(r, "name"));
        if (!ro->name) ro->name = "";
        ro->n_stages = stages;
        ro->replicas = desired_peers_per_stage(spec, r);
        ro->min = (int)int_at(r, "peers", "min", 1);
        ro->clients = (int)int_at(r, "clients", NULL, 0);
    }
    jobstatus_read_success_policy(spec, obs);
}

/* One observed pod of the job: fold it into obs, judge its end once (a preemption or a
 * failure, by the job's podFailurePolicy; a FailJob rule fails the job), and say whether it
 * must go: ended (to be re-created), no longer wanted, or built from an older spec. No
 * requests here except Events: deletions wait until the counts are written to the status,
 * so a count is never lost with the pod that showed it. */
enum pod_action ctl_observe_pod(controller *ctl, const json_t *job, job_mem *m,
                                const failpolicy *policy, const json_t *pod,
                                const json_t *want, job_observed *obs)
{
    const char *name = meta_str(pod, "name"), *uid = meta_str(pod, "uid");
    const char *region = label(pod, CIRRUS_LABEL_REGION), *role = label(pod, CIRRUS_LABEL_ROLE);
    if (!name || !uid) return KEEP_POD;
    /* A replay of a pod already gone: not this job's pod any more, whatever it shows. */
    if (stale_incarnation(m, name, uid)) return KEEP_POD;
    pod_seen seen;
    int counted = ctl_seen_get(m, name, &seen) && !strcmp(seen.uid, uid) && seen.counted;
    ctl_mark_seen(m, name, uid, 1, 0);
    char why[384];
    enum pod_state st = pod_state_of(pod, why, sizeof why);
    const char *node =
        json_string_value(json_object_get(json_object_get(pod, "spec"), "nodeName"));
    /* A pod on a deleted node is lost with it: proof of a preemption the rules need not
     * judge (it has no exit of its own). */
    int node_gone = node && json_object_get(ctl->gone_nodes, node);
    if (node_gone && !pod_state_ended(st)) {
        st = POD_FAILED;
        snprintf(why, sizeof why, "node %s deleted", node);
    }
    region_observed *ro = region_obs(obs, region);
    int is_client = role && !strcmp(role, CIRRUS_ROLE_CLIENT);
    if (ro && st == POD_UNSCHEDULABLE) ro->unschedulable++;
    char reason[64], message[400];
    if (!obs->stuck_reason[0] &&
        pod_waiting_error(pod, reason, sizeof reason, message, sizeof message)) {
        snprintf(obs->stuck_reason, sizeof obs->stuck_reason, "%s", reason);
        snprintf(obs->stuck_message, sizeof obs->stuck_message, "pod %s: %s", name, message);
    }
    if (ro && is_client && st == POD_SUCCEEDED) ro->clients_succeeded++;
    const char *index = label(pod, CIRRUS_LABEL_INDEX);
    if (ro && is_client && st == POD_SUCCEEDED && index && !strcmp(index, "0"))
        ctl_apply_summary(job, m, pod, ro); /* client 0 takes the steps: its figures */
    if (ro && st == POD_READY && role) {
        if (!strcmp(role, CIRRUS_ROLE_GATEWAY)) ro->gateway_ready = 1;
        const char *stage = label(pod, CIRRUS_LABEL_STAGE);
        if (!strcmp(role, CIRRUS_ROLE_PEER) && stage) {
            int s = atoi(stage);
            if (s >= 0 && s < ro->n_stages) ro->ready[s]++;
        }
    }
    if (ro && want && role && !strcmp(role, CIRRUS_ROLE_PEER) && !pod_state_ended(st) &&
        st != POD_TERMINATING) {
        const char *stage = label(pod, CIRRUS_LABEL_STAGE);
        int s = stage ? atoi(stage) : -1;
        if (s >= 0 && s < ro->n_stages) ro->peers[s]++;
    }
    if (st == POD_TERMINATING) return KEEP_POD;
    if (!want) { /* scaled down, or a region/stage no longer in the spec */
        ctl_mark_seen(m, name, uid, 1, 1);
        return DELETE_POD;
    }
    if (st == POD_SUCCEEDED && is_client) return KEEP_POD; /* done; kept for its logs */
    if (st == POD_FAILED && !counted) {
        int rule = -1;
        failpolicy_action a =
            node_gone ? FAILPOLICY_IGNORE : failpolicy_judge(policy, pod, &rule);
        char by[96];
        if (node_gone)
            snprintf(by, sizeof by, "its node is gone");
        else if (rule < 0)
            snprintf(by, sizeof by, "no rule of runPolicy.podFailurePolicy matched");
        else
            snprintf(by, sizeof by, "runPolicy.podFailurePolicy.rules[%d]: %s", rule,
                     failpolicy_action_name(a));
        count(ctl, m, region, a != FAILPOLICY_IGNORE);
        if (a == FAILPOLICY_FAIL_JOB && !m->fail_job[0])
            snprintf(m->fail_job, sizeof m->fail_job, "pod %s failed (%s): %s", name, why, by);
        ctl_event(ctl, job, 1, a == FAILPOLICY_IGNORE ? "PodPreempted" : "PodFailed",
                  "pod %s %s (%s; %s)", name,
                  a == FAILPOLICY_IGNORE ? "was preempted"
                  : a == FAILPOLICY_COUNT ? "failed, counted toward runPolicy.backoffLimit"
                                          : "failed, failing the job",
                  why, by);
    }
    if (pod_state_ended(st) && !counted) ctl_mark_seen(m, name, uid, 1, 1);
    /* No kubelet will confirm a graceful deletion on a node that is gone: force it. */
    if (pod_state_ended(st)) return node_gone ? FORCE_DELETE_POD : DELETE_POD;
    const char *have_hash = annotation(pod, CIRRUS_ANNOT_SPEC_HASH);
    const char *want_hash = annotation(want, CIRRUS_ANNOT_SPEC_HASH);
    if (want_hash && (!have_hash || strcmp(have_hash, want_hash))) {
        if (role && !strcmp(role, CIRRUS_ROLE_PEER)) return ROLL_POD;
        ctl_mark_seen(m, name, uid, 1, 1); /* our own deletion: not a preemption */
        return DELETE_POD;
    }
    return KEEP_POD;
}

/* Whether this process already decided pod's end (it deleted it, or counted how it ended):
 * the informer's copy may not show the deletion yet. */
static int end_decided(const job_mem *m, const char *name, const json_t *pod)
{
    pod_seen s;
    return ctl_seen_get(m, name, &s) && meta_str(pod, "uid") &&
           !strcmp(s.uid, meta_str(pod, "uid")) && s.counted;
}

/* Whether every desired peer of stage `stage` of region `region` exists, is Ready and is
 * not going: terminating, doomed in this reconcile, or deleted by an earlier one whose
 * deletion the informer has not shown yet (else a stale cache would let a second peer of
 * the stage go, and repeat the first one's Event). */
static int stage_all_ready(const job_mem *m, const json_t *have, const json_t *desired,
                           const json_t *doomed, const char *region, const char *stage)
{
    const char *name;
    const json_t *want;
    json_object_foreach((json_t *)desired, name, want)
    {
        const char *r = label(want, CIRRUS_LABEL_REGION), *s = label(want, CIRRUS_LABEL_STAGE);
        const char *role = label(want, CIRRUS_LABEL_ROLE);
        if (!r || !s || !role || strcmp(role, CIRRUS_ROLE_PEER) || strcmp(r, region) ||
            strcmp(s, stage))
            continue;
        const json_t *pod = json_object_get(have, name);
        if (!pod || json_object_get(doomed, name) || end_decided(m, name, pod) ||
            pod_state_of(pod, NULL, 0) != POD_READY)
            return 0;
    }
    return 1;
}

void ctl_roll_stages(controller *ctl, const json_t *job, job_mem *m, const json_t *rolling,
                     const json_t *have, const json_t *desired, json_t *doomed)
{
    const char *name;
    const json_t *pod;
    json_object_foreach((json_t *)rolling, name, pod)
    {
        const char *region = label(pod, CIRRUS_LABEL_REGION), *stage = label(pod, CIRRUS_LABEL_STAGE);
        const char *uid = meta_str(pod, "uid");
        if (!region || !stage || !uid) continue;
        /* A stage still replacing one (or short of a peer) waits: its next pod goes on a
         * later reconcile, which the replacement's becoming Ready brings. */
        if (!stage_all_ready(m, have, desired, doomed, region, stage)) continue;
        ctl_mark_seen(m, name, uid, 1, 1); /* our own deletion: not a preemption */
        json_object_set_new(doomed, name,
                            json_pack("{s:s, s:b, s:b}", "uid", uid, "force", 0, "ended", 0));
        ctl_event(ctl, job, 0, "RollingUpdate",
                  "pod %s replaced for the new spec (stage %s of region %s: one peer at a time)",
                  name, stage, region);
    }
}

/* Of the desired pods names[0..n) missing from the cache, those this process created and
 * never saw there (observed 0, counted 0): either the cache has not caught up with the
 * creation yet, or the pod came and went while the pod watch was down (cut, 410 and a
 * re-list, the loop held up) and nobody will ever tell us. Asked of the API server side by
 * side: found[i] = 1 it exists (not to be made again), 0 it is gone (a preemption), 2 it is
 * absent but was never known to exist (a create whose answer was lost), or rcs[i] the
 * error (it waits for the retry). Costs what re-applying them did before: one request
 * each. */
enum { NOT_ASKED = -1, GONE = 0, EXISTS = 1, NEVER_KNOWN = 2 };
static void confirm_unseen(controller *ctl, const json_t *job, job_mem *m,
                           const char *const *names, size_t n, int *found, int *rcs,
                           cirrus_error *errs)
{
    kube_call calls[CREATE_BATCH_MAX];
    size_t at[CREATE_BATCH_MAX];
    char paths[CREATE_BATCH_MAX][PATH_MAX_LEN];
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        found[i] = NOT_ASKED;
        pod_seen seen;
        if (!ctl_seen_get(m, names[i], &seen) || seen.observed || seen.counted) continue;
        if (child_path(paths[k], job, "pods", names[i])) continue; /* refused below */
        calls[k] = (kube_call){.method = "GET", .path = paths[k], .want_response = 1};
        at[k++] = i;
    }
    if (!k) return;
    kube_request_all(ctl->client, calls, k);
    for (size_t c = 0; c < k; c++) {
        const size_t i = at[c];
        pod_seen seen;
        ctl_seen_get(m, names[i], &seen);
        const char *uid = seen.uid;
        const char *got = meta_str(calls[c].response, "uid");
        if (!calls[c].rc) {
            found[i] = EXISTS;
            /* A create whose answer was lost did make it: now its uid is known. */
            if (uid && (!*uid || !strcmp(uid, UID_MADE)) && got)
                ctl_mark_seen(m, names[i], got, 0, 0);
        } else if (calls[c].rc == CIRRUS_ENOENT) {
            /* Gone: a preemption if it was ever made (its uid known, or UID_MADE). */
            found[i] = uid && *uid ? GONE : NEVER_KNOWN;
        } else {
            rcs[i] = calls[c].rc;
            errs[i] = calls[c].err;
        }
        json_decref(calls[c].response);
    }
}

int ctl_pods_unseen(const job_mem *m, const json_t *have, const json_t *desired)
{
    const char *name;
    const json_t *rec;
    json_object_foreach((json_t *)m->seen, name, rec)
    {
        pod_seen seen;
        if (!ctl_seen_get(m, name, &seen) || seen.observed || seen.counted) continue;
        if (json_object_get(desired, name) && !json_object_get(have, name)) return 1;
    }
    return 0;
}

/* Desired pods that do not exist (any more): count each that vanished under us, then create
 * them under the same names, side by side. */
void ctl_create_pods(controller *ctl, const json_t *job, job_mem *m, const char *const *names,
                     const json_t *const *wants, size_t n, int *rcs, cirrus_error *errs)
{
    kube_call calls[CREATE_BATCH_MAX];
    size_t at[CREATE_BATCH_MAX]; /* calls[c] creates names[at[c]] */
    char paths[CREATE_BATCH_MAX][PATH_MAX_LEN];
    int found[CREATE_BATCH_MAX];
    size_t k = 0;
    if (n > CREATE_BATCH_MAX) n = CREATE_BATCH_MAX;
    for (size_t i = 0; i < n; i++) rcs[i] = 0;
    confirm_unseen(ctl, job, m, names, n, found, rcs, errs);
    for (size_t i = 0; i < n; i++) {
        const char *name = names[i];
        if (rcs[i] || found[i] == EXISTS) continue; /* unknown yet, or only not cached yet */
        pod_seen seen;
        const int was_seen = ctl_seen_get(m, name, &seen);
        if (found[i] == GONE ||
            (found[i] == NOT_ASKED && was_seen && seen.observed && !seen.counted)) {
            /* It existed, nobody here deleted it and it did not end by itself: deleted by a
             * person or by the node's loss (pod GC). That is a preemption. */
            const char *region = label(wants[i], CIRRUS_LABEL_REGION);
            count(ctl, m, region, 0);
            ctl_event(ctl, job, 1, "PodPreempted", "pod %s was deleted; replacing it in place",
                      name);
        }
        retire(m, name);
        char path[PATH_MAX_LEN];
        rcs[i] = child_path(path, job, "pods", name)
                     ? cirrus_fail(&errs[i], CIRRUS_EINVAL, "pod path too long")
                     : kube_apply_path(paths[k], sizeof paths[k], path, CONTROLLER_FIELD_MANAGER,
                                       &errs[i]);
        if (rcs[i]) continue; /* left out of the requests */
        calls[k] = (kube_call){.method = "PATCH", .path = paths[k], .body = wants[i],
                               .content_type = KUBE_CT_APPLY_PATCH, .want_response = 1};
        at[k++] = i;
    }
    kube_request_all(ctl->client, calls, k);
    for (size_t c = 0; c < k; c++) {
        const size_t i = at[c];
        rcs[i] = calls[c].rc;
        if (rcs[i]) {
            errs[i] = calls[c].err;
            /* Made with its answer cut short (a 2xx whose body did not parse: it exists,
             * its uid unknown, UID_MADE), or perhaps made (no answer: a timeout, a cut
             * connection; a 5xx: uid ""): the next reconcile asks whether it exists before
             * making it again, so that a pod made here and deleted before the cache showed
             * it is still counted, always when it was surely made. A refusal (4xx) made
             * nothing. */
            long http = calls[c].http_status;
            if (http >= 200 && http < 300) ctl_mark_seen(m, names[i], UID_MADE, 0, 0);
            else if (http == 0 || http >= 500) ctl_mark_seen(m, names[i], "", 0, 0);
        } else {
            ctl->stats.pods_created++;
            const char *uid = meta_str(calls[c].response, "uid");
            if (uid) ctl_mark_seen(m, names[i], uid, 0, 0);
        }
        json_decref(calls[c].response);
    }
}

/* The remembered counts into obs, for the status. */
void ctl_apply_counts(job_observed *obs, const job_mem *m)
{
    for (int i = 0; i < obs->n_regions; i++) {
        const json_t *c = json_object_get(m->counts, obs->regions[i].name);
        obs->regions[i].preemptions = int_at(c, "preemptions", NULL, 0);
        obs->regions[i].failures = int_at(c, "failures", NULL, 0);
    }
    obs->policy_failure = m->fail_job[0] ? m->fail_job : NULL;
}
