#include "controller.h"

#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../common/certs.h"
#include "../common/log.h"
#include "../common/role_args.h"
#include "desired.h"
#include "jobstatus.h"
#include "kube/informer.h"
#include "kube/workqueue.h"
#include "podstate.h"

#define KEY_MAX 512
/* A requeue is at most an hour away (TTLs and deadlines far off are re-checked then). */
#define REQUEUE_MAX_MS 3600000LL
#define PATH_MAX_LEN 512
#define SWARMJOB_API "apis/cirrus.dev/v1alpha1"
/* Only what this operator made: its label is on every child (desired.h). */
#define CHILD_SELECTOR "labelSelector=app.kubernetes.io%2Fmanaged-by%3Dcirrus-operator"

/* What the controller remembers of one job between reconciles. */
typedef struct job_mem {
    char key[KEY_MAX];
    char uid[64];
    json_t *counts; /* region -> {"preemptions": n, "failures": n} */
    json_t *seen;   /* pod name -> {"uid": s, "counted": bool}: pods known to have existed */
    char phase[16]; /* the phase last written, for transition events */
    int64_t services_gen; /* the job generation whose Services were last applied (0: none) */
    struct job_mem *next;
} job_mem;

struct controller {
    kube_client *client;
    controller_options opt;
    char identity[128];
    kube_informer *jobs, *pods, *services, *secrets, *nodes;
    json_t *gone_nodes; /* node name -> true: deleted nodes whose pods are lost */
    kube_workqueue *queue;
    job_mem *mems;
    controller_stats stats;
    int job_confirmed; /* this reconcile: -1 not asked yet, 0 the job is gone, 1 it exists */
};

/* ---- small helpers ------------------------------------------------------------------------ */

static const char *meta_str(const json_t *o, const char *field)
{
    return json_string_value(json_object_get(json_object_get(o, "metadata"), field));
}

static const char *label(const json_t *o, const char *name)
{
    return json_string_value(
        json_object_get(json_object_get(json_object_get(o, "metadata"), "labels"), name));
}

static const char *annotation(const json_t *o, const char *name)
{
    return json_string_value(
        json_object_get(json_object_get(json_object_get(o, "metadata"), "annotations"), name));
}

static json_int_t int_at(const json_t *o, const char *a, const char *b, json_int_t dflt)
{
    const json_t *v = json_object_get(o, a);
    if (b) v = json_object_get(v, b);
    return json_is_integer(v) ? json_integer_value(v) : dflt;
}

static void enqueue(controller *ctl, const char *key)
{
    if (kube_workqueue_add(ctl->queue, key)) log_warn("out of memory queueing %s", key);
}

static char *base64(const char *s)
{
    size_t n = strlen(s);
    char *out = malloc(4 * ((n + 2) / 3) + 1);
    if (out) EVP_EncodeBlock((unsigned char *)out, (const unsigned char *)s, (int)n);
    return out;
}

static int child_path(char *buf, const json_t *job, const char *resource, const char *name)
{
    return kube_path(buf, PATH_MAX_LEN, "api/v1", meta_str(job, "namespace"), resource, name);
}

/* Leadership is re-checked before every write: a reconcile can outlast the renew deadline,
 * and a replica that lost the lease must not act beside its successor. */
static int leading(const controller *ctl)
{
    return !ctl->opt.leading || ctl->opt.leading(ctl->opt.leading_ctx);
}

/* ---- informer handlers: every change queues the job it belongs to ------------------------- */

static void job_changed(void *ctx, const json_t *obj)
{
    char key[KEY_MAX];
    if (kube_object_key(obj, key, sizeof key) == 0) enqueue(ctx, key);
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
    if (snprintf(key, sizeof key, "%s/%s", ns, job) < (int)sizeof key) enqueue(ctx, key);
}

static void child_updated(void *ctx, const json_t *old_obj, const json_t *new_obj)
{
    (void)old_obj;
    child_changed(ctx, new_obj);
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
    json_object_foreach_safe(ctl->gone_nodes, tmp, gone, v)
    {
        int used = 0;
        json_object_foreach((json_t *)kube_informer_objects(ctl->pods), key, pod)
        {
            const char *on =
                json_string_value(json_object_get(json_object_get(pod, "spec"), "nodeName"));
            if (on && !strcmp(on, gone)) used = 1;
        }
        if (!used) json_object_del(ctl->gone_nodes, gone);
    }
    json_object_set_new(ctl->gone_nodes, name, json_true());
    json_object_foreach((json_t *)kube_informer_objects(ctl->pods), key, pod)
    {
        const char *on = json_string_value(json_object_get(json_object_get(pod, "spec"), "nodeName"));
        if (on && !strcmp(on, name)) child_changed(ctl, pod);
    }
}

static void node_added(void *ctx, const json_t *node)
{
    controller *ctl = ctx;
    const char *name = meta_str(node, "name");
    if (name) json_object_del(ctl->gone_nodes, name); /* a new node under an old name */
}

/* ---- per-job memory ----------------------------------------------------------------------- */

static void mem_reset(job_mem *m, const json_t *job)
{
    json_decref(m->counts);
    json_decref(m->seen);
    m->counts = json_object();
    m->seen = json_object();
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

static job_mem *mem_get(controller *ctl, const char *key, const json_t *job)
{
    job_mem *m;
    for (m = ctl->mems; m; m = m->next)
        if (!strcmp(m->key, key)) break;
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

static void mem_forget(controller *ctl, const char *key)
{
    for (job_mem **p = &ctl->mems; *p; p = &(*p)->next) {
        if (strcmp((*p)->key, key)) continue;
        job_mem *m = *p;
        *p = m->next;
        json_decref(m->counts);
        json_decref(m->seen);
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

/* ---- events -------------------------------------------------------------------------------- */

static void event(controller *ctl, const json_t *job, int warning, const char *reason,
                  const char *fmt, ...) __attribute__((format(printf, 5, 6)));

static void event(controller *ctl, const json_t *job, int warning, const char *reason,
                  const char *fmt, ...)
{
    char msg[512], now[32], path[PATH_MAX_LEN], gen[128];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    jobstatus_now(now, sizeof now);
    snprintf(gen, sizeof gen, "%s.", meta_str(job, "name"));
    if (child_path(path, job, "events", NULL)) return;
    json_t *ev = json_pack(
        "{s:s, s:s, s:{s:s, s:s}, s:{s:s, s:s, s:s, s:s, s:s}, s:s, s:s, s:s, s:s, s:s, s:i,"
        " s:{s:s}, s:s, s:s}",
        "apiVersion", "v1", "kind", "Event", "metadata", "generateName", gen, "namespace",
        meta_str(job, "namespace"), "involvedObject", "apiVersion", CIRRUS_API_VERSION, "kind",
        CIRRUS_KIND, "name", meta_str(job, "name"), "namespace", meta_str(job, "namespace"),
        "uid", meta_str(job, "uid"), "reason", reason, "message", msg, "type",
        warning ? "Warning" : "Normal", "firstTimestamp", now, "lastTimestamp", now, "count", 1,
        "source", "component", "cirrus-operator", "reportingComponent", "cirrus-operator",
        "reportingInstance", ctl->identity);
    cirrus_error err = {0};
    if (!ev || kube_create(ctl->client, path, ev, NULL, &err))
        log_warn("event %s for %s not recorded: %s", reason, meta_str(job, "name"),
                 ev ? err.msg : "out of memory");
    else
        ctl->stats.events++;
    json_decref(ev);
    log_info("%s/%s: %s: %s", meta_str(job, "namespace"), meta_str(job, "name"), reason, msg);
}

/* Before creating anything for a job: does it still exist? The cache can lag a deletion by
 * seconds (a re-list in progress), and children made for a deleted job are deleted again by
 * the garbage collector, then made again, over and over. One GET per reconcile that creates
 * something. 1: it exists; 0: it is gone or going; negative: the GET failed. */
static int job_exists(controller *ctl, const json_t *job, cirrus_error *err)
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

/* ---- the job Secret: a CA and every region's gateway certificate -------------------------- */

static int fill_secret(const json_t *job, json_t *secret, cirrus_error *err)
{
    certs_pair ca = {0};
    int rc = certs_make_ca(meta_str(job, "name"), CONTROLLER_CERT_DAYS, &ca, err);
    json_t *data = json_object();
    char *b = rc ? NULL : base64(ca.cert_pem);
    if (!rc && !b) rc = cirrus_fail(err, CIRRUS_ENOMEM, "out of memory");
    if (!rc) json_object_set_new(data, "ca.crt", json_string(b));
    free(b);
    size_t i;
    const json_t *r;
    json_array_foreach(json_object_get(json_object_get(job, "spec"), "regions"), i, r)
    {
        if (rc) break;
        const char *region = json_string_value(json_object_get(r, "name"));
        json_t *dns = desired_gateway_dns_names(job, region);
        const char *names[8];
        size_t n = 0;
        for (; dns && n < json_array_size(dns) && n < 8; n++)
            names[n] = json_string_value(json_array_get(dns, n));
        certs_pair leaf = {0};
        /* The leaf names its job and region (URI SAN cirrus://<job>/<region>), which the
         * gateways check on every WAN connection: the job as the pods know it (--job is
         * the job's uid, unique where names are reused). */
        rc = n ? certs_make_leaf(&ca, meta_str(job, "uid"), region, names[0], names, n,
                                 CONTROLLER_CERT_DAYS, &leaf, err)
               : cirrus_fail(err, CIRRUS_EINVAL, "no DNS names for region %s", region);
        json_decref(dns);
        char crt[96], key[96];
        snprintf(crt, sizeof crt, "%s.crt", region);
        snprintf(key, sizeof key, "%s.key", region);
        char *bc = rc ? NULL : base64(leaf.cert_pem), *bk = rc ? NULL : base64(leaf.key_pem);
        if (!rc && (!bc || !bk)) rc = cirrus_fail(err, CIRRUS_ENOMEM, "out of memory");
        if (!rc) {
            json_object_set_new(data, crt, json_string(bc));
            json_object_set_new(data, key, json_string(bk));
        }
        free(bc);
        free(bk);
        certs_pair_free(&leaf);
    }
    certs_pair_free(&ca);
    if (rc)
        json_decref(data);
    else
        json_object_set_new(secret, "data", data);
    return rc;
}

static int ensure_secret(controller *ctl, const json_t *job, const json_t *skeleton,
                         cirrus_error *err)
{
    const char *name = meta_str(skeleton, "name");
    char key[KEY_MAX], path[PATH_MAX_LEN], coll[PATH_MAX_LEN];
    snprintf(key, sizeof key, "%s/%s", meta_str(job, "namespace"), name);
    if (kube_informer_get(ctl->secrets, key)) return 0;
    if (child_path(path, job, "secrets", name) || child_path(coll, job, "secrets", NULL))
        return cirrus_fail(err, CIRRUS_EINVAL, "secret path too long");
    /* The cache may not have caught up with our own create: certificates must never be
     * regenerated under running gateways, so ask the API server before making new ones. */
    int rc = kube_get(ctl->client, path, NULL, err);
    if (rc != CIRRUS_ENOENT) return rc;
    rc = job_exists(ctl, job, err);
    if (rc <= 0) return rc;
    json_t *secret = json_deep_copy(skeleton);
    rc = secret ? fill_secret(job, secret, err) : cirrus_fail(err, CIRRUS_ENOMEM, "out of memory");
    if (!rc) rc = kube_create(ctl->client, coll, secret, NULL, err);
    json_decref(secret);
    if (rc == CIRRUS_ECONFLICT) return 0; /* AlreadyExists: someone made it meanwhile */
    if (!rc) event(ctl, job, 0, "CertificatesIssued", "job CA and gateway certificates in %s", name);
    return rc;
}

/* ---- services ----------------------------------------------------------------------------- */

static int ensure_services(controller *ctl, const json_t *job, const json_t *services,
                           int64_t applied_gen, cirrus_error *err)
{
    int64_t generation = int_at(job, "metadata", "generation", 0);
    const char *name;
    json_t *svc;
    json_object_foreach((json_t *)services, name, svc)
    {
        char key[KEY_MAX], path[PATH_MAX_LEN];
        snprintf(key, sizeof key, "%s/%s", meta_str(job, "namespace"), name);
        /* Applied when missing, and once per generation of the job (and after a restart): a
         * changed port, type or annotation must reach the Service that the new pods'
         * --coordinator points at. An unchanged apply writes nothing. */
        if (kube_informer_get(ctl->services, key) && applied_gen == generation) continue;
        int ex = job_exists(ctl, job, err);
        if (ex <= 0) return ex;
        if (child_path(path, job, "services", name))
            return cirrus_fail(err, CIRRUS_EINVAL, "service path too long");
        int rc = kube_apply(ctl->client, path, svc, CONTROLLER_FIELD_MANAGER, NULL, err);
        if (rc) return rc;
    }
    return 0;
}

/* ---- pods ------------------------------------------------------------------------------------ */

/* Delete one pod, but only the incarnation we looked at (uid precondition): after a stale
 * cache or a leadership change, a replacement made meanwhile under the same name survives. */
static int delete_pod(controller *ctl, const json_t *job, const char *name, const char *uid,
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

/* Remember pod `name` as uid. observed: seen in the cache (not only created by us: a pod we
 * just created may not be in the cache yet, and must not look deleted). counted: its end
 * was accounted for, or we deleted it ourselves. Flags only ever go from 0 to 1 for a uid. */
static void mark_seen(job_mem *m, const char *name, const char *uid, int observed, int counted)
{
    json_t *s = json_object_get(m->seen, name);
    const char *old_uid = json_string_value(json_object_get(s, "uid"));
    if (s && old_uid && !strcmp(old_uid, uid)) {
        if (observed) json_object_set_new(s, "observed", json_true());
        if (counted) json_object_set_new(s, "counted", json_true());
        return;
    }
    json_object_set_new(m->seen, name, json_pack("{s:s, s:b, s:b}", "uid", uid, "observed",
                                                 observed, "counted", counted));
}

static region_observed *region_obs(job_observed *obs, const char *name)
{
    for (int i = 0; name && i < obs->n_regions; i++)
        if (!strcmp(obs->regions[i].name, name)) return &obs->regions[i];
    return NULL;
}

/* Fill obs's spec part from the job. */
static void observe_spec(const json_t *job, job_observed *obs)
{
    const json_t *spec = json_object_get(job, "spec");
    memset(obs, 0, sizeof *obs);
    obs->generation = int_at(job, "metadata", "generation", 0);
    obs->backoff_limit = int_at(spec, "runPolicy", "backoffLimit", 6);
    obs->suspended = json_is_true(json_object_get(spec, "suspend"));
    int stages = (int)int_at(spec, "pipeline", "stages", 1);
    if (stages > JOBSTATUS_MAX_STAGES) stages = JOBSTATUS_MAX_STAGES;
    size_t i;
    const json_t *r;
    json_array_foreach(json_object_get(spec, "regions"), i, r)
    {
        if (obs->n_regions == JOBSTATUS_MAX_REGIONS) break;
        region_observed *ro = &obs->regions[obs->n_regions++];
        ro->name = json_string_value(json_object_get(r, "name"));
        if (!ro->name) ro->name = "";
        ro->n_stages = stages;
        ro->replicas = (int)int_at(r, "peers", "replicas", 1);
        ro->min = (int)int_at(r, "peers", "min", 1);
        ro->clients = (int)int_at(r, "clients", NULL, 0);
    }
}

enum pod_action { KEEP_POD, DELETE_POD, FORCE_DELETE_POD };

/* One observed pod of the job: fold it into obs, count its end once (preemption or failure),
 * and say whether it must go: ended (to be re-created), no longer wanted, or built from an
 * older spec. No requests here except Events: deletions wait until the counts are written
 * to the status, so a count is never lost with the pod that showed it. */
static enum pod_action observe_pod(controller *ctl, const json_t *job, job_mem *m,
                                   const json_t *pod, const json_t *want, job_observed *obs)
{
    const char *name = meta_str(pod, "name"), *uid = meta_str(pod, "uid");
    const char *region = label(pod, CIRRUS_LABEL_REGION), *role = label(pod, CIRRUS_LABEL_ROLE);
    if (!name || !uid) return KEEP_POD;
    const json_t *seen = json_object_get(m->seen, name);
    const char *seen_uid = json_string_value(json_object_get(seen, "uid"));
    int counted = seen_uid && !strcmp(seen_uid, uid) &&
                  json_is_true(json_object_get(seen, "counted"));
    mark_seen(m, name, uid, 1, 0);
    char why[128];
    enum pod_state st = pod_state_of(pod, why, sizeof why);
    const char *node =
        json_string_value(json_object_get(json_object_get(pod, "spec"), "nodeName"));
    int node_gone = node && json_object_get(ctl->gone_nodes, node);
    if (node_gone && !pod_state_ended(st)) {
        st = POD_PREEMPTED;
        snprintf(why, sizeof why, "node %s deleted", node);
    }
    region_observed *ro = region_obs(obs, region);
    int is_client = role && !strcmp(role, CIRRUS_ROLE_CLIENT);
    if (ro && st == POD_UNSCHEDULABLE) ro->unschedulable++;
    if (ro && is_client && st == POD_SUCCEEDED) ro->clients_succeeded++;
    if (ro && st == POD_READY && role) {
        if (!strcmp(role, CIRRUS_ROLE_GATEWAY)) ro->gateway_ready = 1;
        const char *stage = label(pod, CIRRUS_LABEL_STAGE);
        if (!strcmp(role, CIRRUS_ROLE_PEER) && stage) {
            int s = atoi(stage);
            if (s >= 0 && s < ro->n_stages) ro->ready[s]++;
        }
    }
    if (st == POD_TERMINATING) return KEEP_POD;
    if (!want) { /* scaled down, or a region/stage no longer in the spec */
        mark_seen(m, name, uid, 1, 1);
        return DELETE_POD;
    }
    if (st == POD_SUCCEEDED && is_client) return KEEP_POD; /* done; kept for its logs */
    if (pod_state_ended(st) && !counted) {
        if (st == POD_FAILED || st == POD_PREEMPTED) {
            count(ctl, m, region, st == POD_FAILED);
            event(ctl, job, 1, st == POD_FAILED ? "PodFailed" : "PodPreempted", "pod %s %s (%s)",
                  name, st == POD_FAILED ? "failed" : "was preempted", why);
        }
        mark_seen(m, name, uid, 1, 1);
    }
    /* No kubelet will confirm a graceful deletion on a node that is gone: force it. */
    if (pod_state_ended(st)) return node_gone ? FORCE_DELETE_POD : DELETE_POD;
    const char *have_hash = annotation(pod, CIRRUS_ANNOT_SPEC_HASH);
    const char *want_hash = annotation(want, CIRRUS_ANNOT_SPEC_HASH);
    if (want_hash && (!have_hash || strcmp(have_hash, want_hash))) {
        mark_seen(m, name, uid, 1, 1); /* our own deletion: not a preemption */
        return DELETE_POD;
    }
    return KEEP_POD;
}

/* A desired pod that does not exist (any more): count it if it vanished under us, then
 * create it under the same name. */
static int create_pod(controller *ctl, const json_t *job, job_mem *m, const char *name,
                      const json_t *want, cirrus_error *err)
{
    const json_t *seen = json_object_get(m->seen, name);
    if (seen && json_is_true(json_object_get(seen, "observed")) &&
        !json_is_true(json_object_get(seen, "counted"))) {
        /* It existed, nobody here deleted it and it did not end by itself: deleted by a
         * person or by the node's loss (pod GC). That is a preemption. */
        const char *region = label(want, CIRRUS_LABEL_REGION);
        count(ctl, m, region, 0);
        event(ctl, job, 1, "PodPreempted", "pod %s was deleted; replacing it in place", name);
    }
    json_object_del(m->seen, name);
    char path[PATH_MAX_LEN];
    if (child_path(path, job, "pods", name))
        return cirrus_fail(err, CIRRUS_EINVAL, "pod path too long");
    json_t *out = NULL;
    int rc = kube_apply(ctl->client, path, want, CONTROLLER_FIELD_MANAGER, &out, err);
    if (!rc) {
        ctl->stats.pods_created++;
        if (meta_str(out, "uid")) mark_seen(m, name, meta_str(out, "uid"), 0, 0);
    }
    json_decref(out);
    return rc;
}

/* ---- status ----------------------------------------------------------------------------------- */

static void apply_counts(job_observed *obs, const job_mem *m)
{
    for (int i = 0; i < obs->n_regions; i++) {
        const json_t *c = json_object_get(m->counts, obs->regions[i].name);
        obs->regions[i].preemptions = int_at(c, "preemptions", NULL, 0);
        obs->regions[i].failures = int_at(c, "failures", NULL, 0);
    }
}

/* ---- training progress ---------------------------------------------------------------------- */

/* Read the /status of the job's ready gateways from now on (none once it is stopped), at
 * the Service desired.c names for the region, on the port it gives the gateway's HTTP. */
static void watch_progress(controller *ctl, const json_t *job, const char *key,
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
        if (!r->gateway_ready || desired_name_gateway(gw, sizeof gw, name, r->name, NULL))
            continue;
        int len = snprintf(urls[n], sizeof urls[n], "http://%s.%s.svc:%d/status", gw, ns,
                           ROLE_PORT_HTTP);
        if (len < 0 || len >= (int)sizeof urls[n]) continue;
        t[n].region = r->name;
        t[n].url = urls[n];
        n++;
    }
    if (progress_watch(p, key, meta_str(job, "uid"), n, t))
        log_warn("%s: out of memory registering its gateways' /status", key);
}

/* The gateways' latest figures into obs, with what tells whether they are current. */
static void apply_progress(controller *ctl, const json_t *job, job_observed *obs)
{
    const char *uid = meta_str(job, "uid");
    obs->progress_stale_s = progress_stale_s(ctl->opt.progress);
    for (int i = 0; i < obs->n_regions; i++) {
        region_observed *r = &obs->regions[i];
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
        }
        r->watched_since = pr.watched ? pr.watched_s : 0;
        r->failing = pr.failing;
    }
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

static void progress_arrived(void *ctx, const char *key) { enqueue(ctx, key); }

/* Write the status if it changed. *progress_ms: when to look again because ProgressCurrent
 * will change with time alone (an answer growing stale: no read announces that), 0: no
 * need. */
static int write_status(controller *ctl, const json_t *job, job_mem *m, const job_observed *obs,
                        int64_t *progress_ms, cirrus_error *err)
{
    char now[32], path[PATH_MAX_LEN];
    jobstatus_now(now, sizeof now);
    const json_t *old = json_object_get(job, "status");
    json_t *st = jobstatus_build(obs, old, now);
    if (!st) return cirrus_fail(err, CIRRUS_ENOMEM, "out of memory");
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
        event(ctl, job, bad, phase, "phase %s -> %s (ready peers %s, regions %s)",
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

/* runPolicy.ttlSecondsAfterFinished: delete a finished job once it has passed. Returns the
 * milliseconds until it is due (0: deleted or none). */
static int64_t expire_finished(controller *ctl, const json_t *job, cirrus_error *err, int *rc)
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
        json_t *opt = json_pack("{s:s}", "propagationPolicy", "Background");
        *rc = kube_delete(ctl->client, path, opt, err);
        if (*rc == CIRRUS_ENOENT) *rc = 0;
        json_decref(opt);
        if (!*rc) log_info("%s: deleted %lld s after it finished (ttlSecondsAfterFinished)",
                           meta_str(job, "name"), (long long)ttl);
    }
    return 0;
}

/* runPolicy.activeDeadlineSeconds, counted from status.startTime (as a Job counts it): marks
 * obs when it has passed; else returns the milliseconds left (0: no deadline or not started). */
static int64_t active_deadline(const json_t *job, job_observed *obs)
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

/* ---- reconcile ------------------------------------------------------------------------------- */

static int reconcile(controller *ctl, const char *key, int64_t *requeue_ms, cirrus_error *err)
{
    *requeue_ms = 0;
    const json_t *job = kube_informer_get(ctl->jobs, key);
    if (!job) {
        mem_forget(ctl, key); /* deleted: the garbage collector removes its children */
        progress_forget(ctl->opt.progress, key);
        return 0;
    }
    if (meta_str(job, "deletionTimestamp")) {
        progress_forget(ctl->opt.progress, key);
        return 0;
    }
    json_incref((json_t *)job); /* requests below run the event loop's transfers, not its
                                   handlers, but hold it anyway */
    job_mem *m = mem_get(ctl, key, job);
    ctl->job_confirmed = -1;
    desired_job d = {0};
    int rc = m ? 0 : cirrus_fail(err, CIRRUS_ENOMEM, "out of memory");
    if (!rc && desired_build(job, &d, err)) {
        /* The API server validated the spec; what still fails here (e.g. names too long
         * once combined) will not fix itself by retrying. */
        event(ctl, job, 1, "InvalidSpec", "%s", err->msg);
        json_decref((json_t *)job);
        return 0;
    }
    if (!m) {
        desired_job_free(&d);
        json_decref((json_t *)job);
        return rc;
    }
    job_observed obs;
    observe_spec(job, &obs);
    int64_t deadline_ms = active_deadline(job, &obs);
    const char *old_phase = json_string_value(json_object_get(json_object_get(job, "status"), "phase"));
    enum job_phase phase = jobstatus_phase(&obs, old_phase, 0);
    /* Before the pods: a final phase reached earlier stays; Failed from counts is decided
     * after accounting below. */
    if (!rc) rc = ensure_secret(ctl, job, d.secret, err);
    if (!rc) rc = ensure_services(ctl, job, d.services, m->services_gen, err);
    if (!rc) m->services_gen = int_at(job, "metadata", "generation", 0);
    /* Observed pods of this job (the informer caches every pod the operator manages). */
    const char *pkey;
    const json_t *pod;
    const char *ns = meta_str(job, "namespace"), *jname = meta_str(job, "name");
    json_t *have = json_object();
    json_object_foreach((json_t *)kube_informer_objects(ctl->pods), pkey, pod)
    {
        const char *pns = meta_str(pod, "namespace"), *pj = label(pod, CIRRUS_LABEL_JOB);
        if (pns && pj && !strcmp(pns, ns) && !strcmp(pj, jname))
            json_object_set(have, meta_str(pod, "name"), (json_t *)pod);
    }
    apply_counts(&obs, m);
    json_t *doomed = json_object(); /* pod name -> {"uid", "force", "ended"} */
    const char *pname;
    json_object_foreach(have, pname, pod)
    {
        enum pod_action a = observe_pod(ctl, job, m, pod, json_object_get(d.pods, pname), &obs);
        if (a != KEEP_POD)
            json_object_set_new(doomed, pname,
                                json_pack("{s:s, s:b, s:b}", "uid", meta_str(pod, "uid"),
                                          "force", a == FORCE_DELETE_POD, "ended",
                                          pod_state_ended(pod_state_of(pod, NULL, 0))));
    }
    apply_counts(&obs, m);
    phase = jobstatus_phase(&obs, old_phase, 0);
    int final = jobstatus_phase_final(phase), stop = obs.suspended || final;
    if (stop) {
        /* Nothing runs while suspended or once the job is over, except clients that finished. */
        json_object_foreach(have, pname, pod)
        {
            const char *role = label(pod, CIRRUS_LABEL_ROLE);
            enum pod_state st = pod_state_of(pod, NULL, 0);
            if (pod_state_ended(st) || st == POD_TERMINATING) continue;
            if (phase == PHASE_SUCCEEDED && role && !strcmp(role, CIRRUS_ROLE_CLIENT)) continue;
            mark_seen(m, pname, meta_str(pod, "uid") ? meta_str(pod, "uid") : "", 1, 1);
            json_object_set_new(doomed, pname, json_pack("{s:s, s:b, s:b}", "uid",
                                                         meta_str(pod, "uid"), "force", 0,
                                                         "ended", 0));
        }
    }
    /* Create what is missing; one pod the API refuses does not hold up the others. */
    const json_t *want;
    int first = 0;
    cirrus_error first_err = {0};
    json_object_foreach(d.pods, pname, want)
    {
        if (rc || stop || !leading(ctl)) break;
        if (json_object_get(have, pname)) continue;
        int ex = job_exists(ctl, job, err);
        if (ex < 0 && !first) {
            first = ex;
            first_err = *err;
        }
        if (ex <= 0) break;
        int prc = create_pod(ctl, job, m, pname, want, err);
        if (prc && !first) {
            first = prc;
            first_err = *err;
        }
    }
    watch_progress(ctl, job, key, &obs, stop);
    apply_progress(ctl, job, &obs);
    /* The counts reach the status before the pods that showed them are deleted. */
    int64_t progress_ms = 0;
    if (!rc && leading(ctl)) rc = write_status(ctl, job, m, &obs, &progress_ms, err);
    json_t *gone;
    json_object_foreach(doomed, pname, gone)
    {
        if (rc || !leading(ctl)) break;
        /* Once the job is over, ended pods stay for their logs (Kubeflow's cleanPodPolicy
         * Running); before, an ended pod is deleted and re-created under its name. */
        if (final && json_is_true(json_object_get(gone, "ended"))) continue;
        int prc = delete_pod(ctl, job, pname, json_string_value(json_object_get(gone, "uid")),
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
    if (!rc && !leading(ctl)) *requeue_ms = 1000; /* finish when leading again */
    json_decref(have);
    if (!rc && final) *requeue_ms = expire_finished(ctl, job, err, &rc);
    else if (!rc && !*requeue_ms)
        *requeue_ms = deadline_ms > 0 && (!progress_ms || deadline_ms < progress_ms)
                          ? deadline_ms
                          : progress_ms;
    if (*requeue_ms > REQUEUE_MAX_MS) *requeue_ms = REQUEUE_MAX_MS;
    desired_job_free(&d);
    json_decref((json_t *)job);
    return rc;
}

/* ---- public API -------------------------------------------------------------------------------- */

static int informer(controller *ctl, const char *path, const char *query, int is_job,
                    kube_informer **out, cirrus_error *err)
{
    kube_informer_config ic = {
        .path = path,
        .query = query,
        .on_add = is_job ? job_changed : child_changed,
        .on_update = is_job ? job_updated : child_updated,
        .on_delete = is_job ? job_changed : child_changed,
        .ctx = ctl,
    };
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
    snprintf(ctl->identity, sizeof ctl->identity, "%s", o->identity ? o->identity : "cirrus-operator");
    ctl->queue = kube_workqueue_new(NULL, NULL);
    ctl->gone_nodes = json_object();
    const char *ns = o->watch_namespace && *o->watch_namespace ? o->watch_namespace : NULL;
    char jobs[PATH_MAX_LEN], pods[PATH_MAX_LEN], svcs[PATH_MAX_LEN], secrets[PATH_MAX_LEN];
    int rc = ctl->queue ? 0 : cirrus_fail(err, CIRRUS_ENOMEM, "out of memory");
    if (!rc && (kube_path(jobs, sizeof jobs, SWARMJOB_API, ns, "swarmjobs", NULL) ||
                kube_path(pods, sizeof pods, "api/v1", ns, "pods", NULL) ||
                kube_path(svcs, sizeof svcs, "api/v1", ns, "services", NULL) ||
                kube_path(secrets, sizeof secrets, "api/v1", ns, "secrets", NULL)))
        rc = cirrus_fail(err, CIRRUS_EINVAL, "bad namespace %s", ns);
    if (!rc) rc = informer(ctl, jobs, NULL, 1, &ctl->jobs, err);
    if (!rc) rc = informer(ctl, pods, CHILD_SELECTOR, 0, &ctl->pods, err);
    if (!rc) rc = informer(ctl, svcs, CHILD_SELECTOR, 0, &ctl->services, err);
    if (!rc) rc = informer(ctl, secrets, CHILD_SELECTOR, 0, &ctl->secrets, err);
    if (!rc) {
        kube_informer_config nc = {.path = "/api/v1/nodes", .on_add = node_added,
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
    kube_informer_free(ctl->jobs);
    kube_informer_free(ctl->pods);
    kube_informer_free(ctl->services);
    kube_informer_free(ctl->secrets);
    kube_informer_free(ctl->nodes);
    json_decref(ctl->gone_nodes);
    kube_workqueue_free(ctl->queue);
    while (ctl->mems) mem_forget(ctl, ctl->mems->key);
    free(ctl);
}

int controller_synced(const controller *ctl)
{
    return kube_informer_has_synced(ctl->jobs) && kube_informer_has_synced(ctl->pods) &&
           kube_informer_has_synced(ctl->services) && kube_informer_has_synced(ctl->secrets) &&
           kube_informer_has_synced(ctl->nodes);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int controller_process(controller *ctl, int max_keys)
{
    int ran = 0;
    const char *k;
    if (!controller_synced(ctl)) return 0;
    /* Jobs with new training figures: reconciled (and their status written) like any other. */
    if (leading(ctl)) progress_drain(ctl->opt.progress, progress_arrived, ctl);
    while (ran < max_keys && leading(ctl) && kube_workqueue_get(ctl->queue, &k) == 1) {
        char key[KEY_MAX];
        snprintf(key, sizeof key, "%s", k);
        cirrus_error err = {0};
        int64_t requeue_ms = 0;
        double t0 = now_s();
        int rc = reconcile(ctl, key, &requeue_ms, &err);
        double dt = now_s() - t0;
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
    return ran;
}

int64_t controller_next_ms(controller *ctl)
{
    int64_t ns = kube_workqueue_next_ready_ns(ctl->queue);
    return ns < 0 ? -1 : (ns + 999999) / 1000000;
}

void controller_get_stats(const controller *ctl, controller_stats *st) { *st = ctl->stats; }

void controller_resync(controller *ctl)
{
    while (ctl->mems) mem_forget(ctl, ctl->mems->key);
    const char *key;
    const json_t *job;
    json_object_foreach((json_t *)kube_informer_objects(ctl->jobs), key, job) enqueue(ctl, key);
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
    kube_informer_disconnect(ctl->secrets, resume_rv);
    kube_informer_disconnect(ctl->nodes, resume_rv);
}
