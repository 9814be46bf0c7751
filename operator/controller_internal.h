/* controller_internal: what the controller's files share, and nothing outside them uses.
 *
 * The reconcile loop (controller.h) is one object spread over four files, each the home of
 * one concern:
 *   controller.c           informers -> work queue -> reconcile(); Events; the public API
 *   controller_pods.c      the pods: what was seen of them, preemption and failure counts,
 *                          which pods go, creating and deleting them
 *   controller_children.c  the job's other children: the Secret (job CA and gateway
 *                          certificates) and the gateway Services
 *   controller_status.c    the status write, the training figures in it (the gateways',
 *                          the finished clients' summaries), and the
 *                          clocks that bring a job back (activeDeadlineSeconds, TTL, a
 *                          progress answer growing stale)
 * Everything runs on the kube_client's event loop thread (controller.h).
 */
#ifndef CIRRUS_CONTROLLER_INTERNAL_H
#define CIRRUS_CONTROLLER_INTERNAL_H

#include <jansson.h>
#include <stdint.h>

#include "../common/cerr.h"
#include "controller.h"
#include "desired.h"
#include "failpolicy.h"
#include "jobstatus.h"
#include "kube/informer.h"
#include "kube/workqueue.h"

#define KEY_MAX 512
/* A requeue is at most an hour away (TTLs and deadlines far off are re-checked then). */
#define REQUEUE_MAX_MS 3600000LL
/* How long the event loop may be away from kube_client_poll, which renews the Lease (its
 * renew deadline is 10 s) and delivers watch events: a reconcile stops creating pods after
 * CREATE_BUDGET_MS and asks to run again at once; controller_process stops taking keys
 * after PROCESS_BUDGET_MS. One pod create is one synchronous request (up to 30 s on a
 * wedged API server): the loop is back within about one request of these budgets. */
#define CREATE_BUDGET_MS 500
/* Pods created side by side at most: a reconcile creates in batches of 1, 2, 4, ... up to
 * this (the Job controller's slow start), stopping at the first batch with a refusal, so
 * that a spec the API server refuses costs one request, not one per pod. */
#define CREATE_BATCH_MAX 32
#define PROCESS_BUDGET_MS 500
/* A job with a pod this process made and its cache never showed is reconciled again this
 * soon (ctl_pods_unseen): while the pod watch is down such a pod can come and go with no
 * event ever saying so, and nothing else would bring the job back. */
#define UNSEEN_RECHECK_MS 5000
/* A job whose Secret's name is still taken by an earlier job's (garbage collection pending)
 * asks again this often. */
#define SECRET_PENDING_RECHECK_MS 1000
#define PATH_MAX_LEN 512
#define SWARMJOB_API "apis/cirrus.dev/v1alpha1"
/* Only what this operator made: its label is on every child (desired.h). */
#define CHILD_SELECTOR "labelSelector=app.kubernetes.io%2Fmanaged-by%3Dcirrus-operator"

/* The uid remembered for a pod surely made whose create answer was cut short: no real uid
 * (those are UUIDs), so the pod's first sighting replaces it. */
#define UID_MADE "made"

/* What the controller remembers of one job between reconciles. */
typedef struct job_mem {
    char key[KEY_MAX];
    char uid[64];
    json_t *counts; /* region -> {"preemptions": n, "failures": n} */
    json_t *seen;   /* pod name -> its record (ctl_seen_get): pods known to have existed */
    /* pod name -> [uid, ...]: the last few incarnations under that name whose end was
     * already accounted for here (ctl_create_pods makes the next one): a watch resumed
     * from before one ended replays it, and it must not be taken for the current pod. */
    json_t *gone;
    char phase[16]; /* the phase last written, for transition events */
    int64_t services_gen; /* the job generation whose Services were last applied (0: none) */
    int64_t pod_groups_gen; /* ... whose gang PodGroups were last made sure of (0: none) */
    int secret_ok;        /* its Secret was found or made (asked again before making pods) */
    int secret_pending;   /* an earlier job's Secret of that name is still there */
    /* Why a FailJob rule of runPolicy.podFailurePolicy failed the job ("": none): kept until
     * the status says Failed (after that the status keeps it). */
    char fail_job[640];
    /* Regions in several clusters (controller_members.c). endpoints: this cluster's
     * regions' gateway endpoints as last resolved (region -> "host:port"). At home:
     * member_status, each member's copy's last status (cluster -> status);
     * members_unreachable, why the last poll failed (the ClustersReachable condition's
     * message). pki: the job Secret's data as last read or written, for a job spanning
     * clusters only (controller_pki.c). */
    json_t *endpoints, *member_status, *pki;
    json_t *member_status_prev; /* the statuses of the poll before, which obs may point into */
    char members_unreachable[1024];
    char members_failjob[700]; /* a member's copy Failed by a FailJob rule: its message */
    struct job_mem *next;
} job_mem;

typedef struct member_conn member_conn;

struct controller {
    kube_client *client;
    controller_options opt;
    char identity[128];
    /* No Secret informer: listing and watching every Secret of the cluster is a right a
     * platform team should not have to grant; a job's Secret is asked for by name instead
     * (ctl_ensure_secret). */
    kube_informer *jobs, *pods, *services, *nodes;
    json_t *gone_nodes; /* node name -> true: deleted nodes whose pods are lost */
    /* Events recorded and not sent yet: [{"path", "event"}] (controller_events.c). */
    json_t *events;
    /* "ns/job" -> {pod name: true}: the cached pods of each job, kept by the pod informer's
     * handlers so that a reconcile visits its own job's pods, not every pod in the cache
     * (with 1,000 jobs that scan was 20,000 pods per reconcile). */
    json_t *pods_by_job;
    kube_workqueue *queue;
    job_mem *mems;
    member_conn *members; /* the member clusters' APIs (controller_members.c) */
    controller_stats stats;
    int job_confirmed; /* this reconcile: -1 not asked yet, 0 the job is gone, 1 it exists */
};

/* ---- small helpers ------------------------------------------------------------------------ */

static inline const char *meta_str(const json_t *o, const char *field)
{
    return json_string_value(json_object_get(json_object_get(o, "metadata"), field));
}

static inline const char *label(const json_t *o, const char *name)
{
    return json_string_value(
        json_object_get(json_object_get(json_object_get(o, "metadata"), "labels"), name));
}

static inline const char *annotation(const json_t *o, const char *name)
{
    return json_string_value(
        json_object_get(json_object_get(json_object_get(o, "metadata"), "annotations"), name));
}

static inline json_int_t int_at(const json_t *o, const char *a, const char *b, json_int_t dflt)
{
    const json_t *v = json_object_get(o, a);
    if (b) v = json_object_get(v, b);
    return json_is_integer(v) ? json_integer_value(v) : dflt;
}

static inline int child_path(char *buf, const json_t *job, const char *resource,
                             const char *name)
{
    return kube_path(buf, PATH_MAX_LEN, "api/v1", meta_str(job, "namespace"), resource, name);
}

/* Leadership is re-checked before every write: a reconcile can outlast the renew deadline,
 * and a replica that lost the lease must not act beside its successor. */
static inline int leading(const controller *ctl)
{
    return !ctl->opt.leading || ctl->opt.leading(ctl->opt.leading_ctx);
}

/* ---- controller.c ---------------------------------------------------------------------------- */

void ctl_enqueue(controller *ctl, const char *key);
/* 1: the job still exists (asked once per reconcile); 0: gone or going; < 0: error. */
int ctl_job_exists(controller *ctl, const json_t *job, cirrus_error *err);

/* ---- controller_events.c --------------------------------------------------------------------- */

/* A Normal (warning 0) or Warning Event on the job, and the same line in the log at once;
 * the Event is sent with the others of the same reconcile (ctl_flush_events). */
void ctl_event(controller *ctl, const json_t *job, int warning, const char *reason,
               const char *fmt, ...) __attribute__((format(printf, 5, 6)));
/* Send the Events recorded since the last flush, side by side (kube_request_all): a
 * reconcile that counts 100 preemptions costs one round trip for their Events, not 100. */
void ctl_flush_events(controller *ctl);

/* ---- controller_pods.c ----------------------------------------------------------------------- */

job_mem *ctl_mem_get(controller *ctl, const char *key, const json_t *job);
void ctl_mem_forget(controller *ctl, const char *key);
void ctl_mark_seen(job_mem *m, const char *name, const char *uid, int observed, int counted);
/* What was seen of pod `name`: its uid ("" or UID_MADE while unknown), whether it was seen
 * in the cache, whether its end was accounted for (or it was deleted here), whether its
 * finished client's summary was found wanting and said so. uid points into the record: valid
 * until the next ctl_mark_seen or ctl_seen_warned of that name. 1, or 0 with *out zeroed
 * when there is none. */
typedef struct pod_seen {
    const char *uid;
    int observed, counted, summary_warned;
} pod_seen;
int ctl_seen_get(const job_mem *m, const char *name, pod_seen *out);
void ctl_seen_warned(job_mem *m, const char *name);
/* The pod cache showed pod (added, changed or deleted) of the job whose key is job_key: a
 * pod made here and not seen cached yet, its uid perhaps unknown (a create answered late or
 * cut short), is known to have existed from now on, so that if it is gone at the next
 * reconcile its deletion counts as a preemption. Its ADDED and DELETED events can come
 * together, between two reconciles, after a create answered past the client's timeout. */
void ctl_pod_cached(controller *ctl, const char *job_key, const json_t *pod);
void ctl_observe_spec(const json_t *job, job_observed *obs);

/* ROLL_POD: a running pod built from an older spec; peers are replaced a stage at a time
 * (ctl_roll_stages), other pods at once (DELETE_POD). */
enum pod_action { KEEP_POD, DELETE_POD, FORCE_DELETE_POD, ROLL_POD };
enum pod_action ctl_observe_pod(controller *ctl, const json_t *job, job_mem *m,
                                const failpolicy *policy, const json_t *pod,
                                const json_t *want, job_observed *obs);
/* Create pods names[0..n) (n <= CREATE_BATCH_MAX) from wants[] by server-side apply, side by
 * side (kube_request_all); a name observed before and gone without being ended or deleted
 * here is counted as a preemption first. One made here (or perhaps made: its answer was
 * lost) but never seen in the cache is looked up first: still there, it is left alone; gone
 * (when its uid was known), it was preempted unseen and is counted. rcs[i], errs[i]: each
 * one's result. */
/* Whether a desired pod (name in desired) missing from the cache (have) is one this process
 * made and never saw there (its seen record neither observed nor counted). */
int ctl_pods_unseen(const job_mem *m, const json_t *have, const json_t *desired);
void ctl_create_pods(controller *ctl, const json_t *job, job_mem *m, const char *const *names,
                     const json_t *const *wants, size_t n, int *rcs, cirrus_error *errs);
int ctl_delete_pod(controller *ctl, const json_t *job, const char *name, const char *uid,
                   int force, cirrus_error *err);
void ctl_apply_counts(job_observed *obs, const job_mem *m);
/* The peer pods that ROLL_POD named (rolling: pod name -> pod), of a job whose pods are
 * `have` and whose desired pods are `desired`: into doomed, at most one per stage of a
 * region, and only where every desired peer of that stage is Ready (none missing, starting
 * or terminating), so a stage keeps its other peers serving while one is replaced. */
void ctl_roll_stages(controller *ctl, const json_t *job, job_mem *m, const json_t *rolling,
                     const json_t *have, const json_t *desired, json_t *doomed);

/* ---- controller_children.c ------------------------------------------------------------------- */

int ctl_ensure_services(controller *ctl, const json_t *job, const json_t *services,
                        int64_t applied_gen, cirrus_error *err);
/* spec.gangScheduling: every region's PodGroup exists with the desired gang size, once per
 * generation of the job (and after a restart): made when missing; deleted when its minCount
 * differs (its policy is immutable), which its finalizer holds until no pod names it, and
 * made anew once gone (asked again on every reconcile meanwhile). The error names the
 * PodGroup, and says so when the API server does not serve the API (gang scheduling is off
 * in the cluster). */
int ctl_ensure_pod_groups(controller *ctl, const json_t *job, job_mem *m, const json_t *groups,
                          cirrus_error *err);

/* ---- controller_pki.c ------------------------------------------------------------------------ */

/* The job's Secret (its CA and gateway keys and certificates), made once: asked of the API
 * server by name unless m says it was there already; recheck: ask anyway (before pods that
 * mount it are made: someone may have deleted it). Never re-keyed while it exists. In a
 * copy, the certificates the home wrote into spec.home are added to it. */
int ctl_ensure_secret(controller *ctl, const json_t *job, job_mem *m, const json_t *skeleton,
                      int recheck, cirrus_error *err);
/* A copy: its regions' certificate requests not answered yet (region -> PEM), for
 * status.certificateRequests; NULL for a job that is not a copy. A new reference. */
json_t *ctl_copy_cert_requests(const json_t *job, const job_mem *m);
/* The gateways that the Secret cannot serve yet left out of d (d->waiting says why): every
 * one while an earlier job's Secret of the name is still there; in a copy, those of
 * regions whose certificate is not in it yet. */
void ctl_gate_gateways(const json_t *job, const job_mem *m, desired_job *d);
/* At home: member's requests (its copy's last status) signed, each certificate kept in
 * the home Secret. A request that does not verify is logged and left. */
int ctl_issue_member_certs(controller *ctl, const json_t *job, job_mem *m, const char *member,
                           cirrus_error *err);
/* At home: the CA's certificate and member's regions' certificates into home, the copy's
 * spec.home (caCertificate, certificates), once any is issued. */
void ctl_copy_pki(const json_t *job, const job_mem *m, const char *member, json_t *home);

/* ---- controller_members.c -------------------------------------------------------------------- */

/* A home job polls its member clusters this often (nothing watches across clusters), and
 * waits this long at most for one member request. */
#define MEMBER_POLL_MS 5000
#define MEMBER_TIMEOUT_MS 5000

/* Whether job is a copy that a home cluster's operator wrote (spec.home), or a home job
 * with member clusters (spec.clusters). */
int ctl_is_copy(const json_t *job);
int ctl_has_members(const json_t *job);
/* The job's identity on the WAN and in its gateways' /status: the home job's uid in a copy
 * (spec.home.uid), else its own. */
const char *ctl_job_identity(const json_t *job);
/* The element of spec.regions named name; NULL: none. */
json_t *ctl_spec_region(const json_t *spec, const char *name);
/* For a job spanning clusters (home or copy): where other clusters reach each of this
 * cluster's regions' gateways (regions[].endpoint, else from its Service), into obs. */
void ctl_local_endpoints(controller *ctl, const json_t *job, job_mem *m, job_observed *obs);
/* At home: every member's copy applied (and its Secret made once), and each member's
 * regions in obs from its copy's status (or, for a member that did not answer, as the job's
 * status last had them, marked unreachable). Returns when to poll again (ms; 0: no
 * members). */
int64_t ctl_sync_members(controller *ctl, const json_t *job, job_mem *m, job_observed *obs);
/* At home: the job carries the finalizer DESIRED_FINALIZER_MEMBERS (added when missing). */
int ctl_members_finalizer(controller *ctl, const json_t *job, cirrus_error *err);
/* A home job being deleted: its copies deleted from every member, then its finalizer
 * removed; a member that does not answer keeps it (*requeue_ms set: asked again). */
int ctl_release_members(controller *ctl, const json_t *job, int64_t *requeue_ms,
                        cirrus_error *err);
void ctl_members_free(controller *ctl);

/* ---- controller_status.c --------------------------------------------------------------------- */

void ctl_watch_progress(controller *ctl, const json_t *job, const char *key,
                        const job_observed *obs, int stop);
void ctl_apply_progress(controller *ctl, const json_t *job, job_observed *obs);
void ctl_apply_summary(const json_t *job, job_mem *m, const json_t *pod, region_observed *ro);
void ctl_progress_arrived(void *ctx, const char *key);
int ctl_write_status(controller *ctl, const json_t *job, job_mem *m, const job_observed *obs,
                     int64_t *progress_ms, cirrus_error *err);
int64_t ctl_expire_finished(controller *ctl, const json_t *job, cirrus_error *err, int *rc);
int64_t ctl_active_deadline(const json_t *job, job_observed *obs);

#endif
