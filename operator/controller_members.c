/* controller_members: a SwarmJob whose regions run in several clusters (controller_internal.h;
 * docs/ARCHITECTURE.md, "Regions in several clusters").
 *
 * The home operator (the cluster where the job was applied, spec.clusters naming the
 * others) keeps, in each member cluster, a copy of the job that holds spec.home, with the
 * certificates the home signed for that cluster's gateways from their requests
 * (controller_pki.c: no private key crosses clusters). The member's own operator reconciles
 * the copy's pods as any job's (desired.c builds nothing for regions that other clusters
 * run) and reports its regions, with their gateways' endpoints, and its certificate
 * requests in the copy's status; the home operator folds those into
 * the home job's status, writes every region's endpoint into every copy, so that each
 * gateway can list all of them, and the whole job's status into the copy's status.home.
 *
 * Nothing watches across clusters: the home polls each member every MEMBER_POLL_MS while
 * the job exists (one server-side apply of the copy, whose answer carries the copy's
 * status), with MEMBER_TIMEOUT_MS per request so that an unreachable member holds up the
 * event loop briefly. No ownerReference crosses clusters: the home job carries the
 * finalizer DESIRED_FINALIZER_MEMBERS, and deleting it deletes the copies first (the
 * member's garbage collector then removes their pods and Secret, which the copy owns).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/clock.h"
#include "../common/log.h"
#include "controller_internal.h"

/* One member cluster's API, made from the kubeconfig in a home Secret and made anew when
 * that Secret changes (its resourceVersion). */
struct member_conn {
    char key[KEY_MAX]; /* "ns/secret/key" */
    char rv[64];
    kube_config *cfg;
    kube_client *client;
    /* After a failed request the member is left alone until retry_ms (monotonic), its last
     * error standing for it meanwhile: a member that does not answer costs the event loop
     * one request timeout per backoff period, not one per job per poll. */
    int fails;
    int64_t retry_ms;
    cirrus_error last;
    struct member_conn *next;
};

#define MEMBER_BACKOFF_MAX_MS 60000

#define COPY_FIELD_MANAGER "cirrus-home"

void ctl_members_free(controller *ctl)
{
    while (ctl->members) {
        member_conn *c = ctl->members;
        ctl->members = c->next;
        kube_client_free(c->client);
        kube_config_free(c->cfg);
        free(c);
    }
}

int ctl_is_copy(const json_t *job)
{
    return json_is_object(json_object_get(json_object_get(job, "spec"), "home"));
}

const char *ctl_job_identity(const json_t *job)
{
    const char *home = ctl_is_copy(job)
        ? json_string_value(json_object_get(json_object_get(json_object_get(job, "spec"), "home"), "uid"))
        : NULL;
    return home ? home : meta_str(job, "uid");
}

int ctl_has_members(const json_t *job)
{
    return json_array_size(json_object_get(json_object_get(job, "spec"), "clusters")) > 0;
}

/* The element of array whose "name" is name (spec.regions, status.regions); NULL: none. */
static json_t *named(const json_t *array, const char *name)
{
    size_t i;
    json_t *e;
    json_array_foreach(array, i, e)
    {
        const char *n = json_string_value(json_object_get(e, "name"));
        if (n && name && !strcmp(n, name)) return e;
    }
    return NULL;
}

json_t *ctl_spec_region(const json_t *spec, const char *name)
{
    return named(json_object_get(spec, "regions"), name);
}

/* ---- this cluster's regions: where the other clusters reach their gateways --------------- */

/* The address other clusters reach node at: its ExternalIP, else its InternalIP. */
static const char *node_address(const json_t *node)
{
    const char *internal = NULL;
    size_t i;
    const json_t *a;
    json_array_foreach(json_object_get(json_object_get(node, "status"), "addresses"), i, a)
    {
        const char *type = json_string_value(json_object_get(a, "type"));
        const char *addr = json_string_value(json_object_get(a, "address"));
        if (!type || !addr) continue;
        if (!strcmp(type, "ExternalIP")) return addr;
        if (!strcmp(type, "InternalIP") && !internal) internal = addr;
    }
    return internal;
}

/* Of the nodes labelled label=region, the one with the least name that has an address: the
 * same node from one reconcile to the next while it exists, so the endpoint (which every
 * gateway's arguments carry) does not change without cause. */
static const char *region_node_address(controller *ctl, const char *label_key,
                                       const char *region)
{
    const char *best_name = NULL, *best = NULL, *key;
    const json_t *node;
    json_object_foreach((json_t *)kube_informer_objects(ctl->nodes), key, node)
    {
        const char *v = label(node, label_key), *addr = node_address(node);
        if (!v || strcmp(v, region) || !addr || meta_str(node, "deletionTimestamp")) continue;
        if (!best_name || strcmp(key, best_name) < 0) {
            best_name = key;
            best = addr;
        }
    }
    return best;
}

/* The endpoint of this cluster's region r from its WAN Service (svc, as the API server
 * has it): a load balancer's address and the Service's WAN port, or a node's address and
 * the WAN port's node port. 0 and *out set, or 1 when it has none (yet). */
static int service_endpoint(controller *ctl, const json_t *svc, const json_t *r, char *out,
                            size_t n)
{
    const json_t *spec = json_object_get(svc, "spec"), *p;
    const char *type = json_string_value(json_object_get(spec, "type"));
    json_int_t port = 0, node_port = 0;
    size_t i;
    json_array_foreach(json_object_get(spec, "ports"), i, p)
    {
        const char *name = json_string_value(json_object_get(p, "name"));
        if (!name || strcmp(name, "wan")) continue;
        port = json_integer_value(json_object_get(p, "port"));
        node_port = json_integer_value(json_object_get(p, "nodePort"));
    }
    if (!type || !port) return 1;
    if (!strcmp(type, "LoadBalancer")) {
        const json_t *ing = json_array_get(
            json_object_get(json_object_get(json_object_get(svc, "status"), "loadBalancer"),
                            "ingress"),
            0);
        const char *host = json_string_value(json_object_get(ing, "ip"));
        if (!host) host = json_string_value(json_object_get(ing, "hostname"));
        if (host) {
            snprintf(out, n, strchr(host, ':') ? "[%s]:%lld" : "%s:%lld", host,
                     (long long)port);
            return !desired_endpoint_valid(out);
        }
        /* No load balancer address yet: its node port works meanwhile on most providers,
         * but an endpoint that changes later rolls every gateway; wait for the address. */
        return 1;
    }
    if (!strcmp(type, "NodePort") && node_port) {
        const char *lk = json_string_value(
            json_object_get(json_object_get(r, "placement"), "regionLabel"));
        const char *addr = region_node_address(ctl, lk ? lk : "topology.kubernetes.io/region",
                                               json_string_value(json_object_get(r, "name")));
        if (!addr) return 1;
        snprintf(out, n, strchr(addr, ':') ? "[%s]:%lld" : "%s:%lld", addr,
                 (long long)node_port);
        return !desired_endpoint_valid(out);
    }
    return 1;
}

void ctl_local_endpoints(controller *ctl, const json_t *job, job_mem *m, job_observed *obs)
{
    const json_t *spec = json_object_get(job, "spec");
    if (!ctl_is_copy(job) && !ctl_has_members(job)) return;
    if (!m->endpoints) m->endpoints = json_object();
    for (int i = 0; i < obs->n_regions && m->endpoints; i++) {
        region_observed *ro = &obs->regions[i];
        const json_t *r = ctl_spec_region(spec, ro->name);
        const char *given = json_string_value(json_object_get(r, "endpoint"));
        if (given) {
            ro->endpoint = given;
            continue;
        }
        if (ro->cluster || json_object_get(r, "cluster")) continue;
        char gw[CIRRUS_NAME_MAX + 1], path[PATH_MAX_LEN], ep[300];
        json_t *svc = NULL;
        cirrus_error err;
        if (desired_name_wan_service(gw, sizeof gw, meta_str(job, "name"), ro->name, NULL) ||
            child_path(path, job, "services", gw))
            continue;
        if (!kube_get(ctl->client, path, &svc, &err) && !service_endpoint(ctl, svc, r, ep, sizeof ep))
            json_object_set_new(m->endpoints, ro->name, json_string(ep));
        json_decref(svc);
        /* Kept while the Service cannot be read: the gateways were built with it (after a
         * restart, the one the status shows). */
        ro->endpoint = json_string_value(json_object_get(m->endpoints, ro->name));
        if (!ro->endpoint)
            ro->endpoint = json_string_value(json_object_get(
                named(json_object_get(json_object_get(job, "status"), "regions"), ro->name),
                "endpoint"));
    }
}

/* ---- the home: reaching the members ------------------------------------------------------ */

/* A request's error without the request ("PATCH /apis/...?...: " first): what went wrong is
 * the part a reader of the condition needs. */
static const char *request_error(const char *msg)
{
    static const char *const methods[] = {"GET ", "PATCH ", "POST ", "PUT ", "DELETE "};
    for (size_t i = 0; i < sizeof methods / sizeof methods[0]; i++) {
        const char *rest = strncmp(msg, methods[i], strlen(methods[i])) ? NULL : strstr(msg, ": ");
        if (rest) return rest + 2;
    }
    return msg;
}

/* The key of spec.clusters entry c's connection: "ns/secret/key". */
static void member_key(const json_t *job, const json_t *c, char *key, size_t n)
{
    const json_t *ref = json_object_get(c, "kubeconfigSecret");
    const char *sname = json_string_value(json_object_get(ref, "name"));
    const char *skey = json_string_value(json_object_get(ref, "key"));
    snprintf(key, n, "%s/%s/%s", meta_str(job, "namespace"), sname ? sname : "",
             skey ? skey : "kubeconfig");
}

/* The connection made earlier for entry c, if any. */
static member_conn *member_cached(controller *ctl, const json_t *job, const json_t *c)
{
    char key[KEY_MAX];
    member_key(job, c, key, sizeof key);
    member_conn *mc = ctl->members;
    while (mc && strcmp(mc->key, key)) mc = mc->next;
    return mc;
}

/* The connection to the member cluster that spec.clusters entry c names, made from its
 * kubeconfig Secret (read afresh at every poll: a rotated credential is taken at once). */
static member_conn *member_get(controller *ctl, const json_t *job, const json_t *c,
                               cirrus_error *err)
{
    const json_t *ref = json_object_get(c, "kubeconfigSecret");
    const char *sname = json_string_value(json_object_get(ref, "name"));
    const char *skey = json_string_value(json_object_get(ref, "key"));
    if (!skey) skey = "kubeconfig";
    char key[KEY_MAX], path[PATH_MAX_LEN], source[KEY_MAX + 32];
    member_key(job, c, key, sizeof key);
    snprintf(source, sizeof source, "secret %s", key);
    if (!sname || child_path(path, job, "secrets", sname)) {
        cirrus_fail(err, CIRRUS_EINVAL, "kubeconfigSecret.name missing or invalid");
        return NULL;
    }
    json_t *secret = NULL;
    int rc = kube_get(ctl->client, path, &secret, err);
    if (rc) {
        cirrus_error e = *err;
        cirrus_fail(err, rc, "secret %s/%s: %s", meta_str(job, "namespace"), sname,
                    request_error(e.msg));
        json_decref(secret);
        return NULL;
    }
    char rv[64];
    snprintf(rv, sizeof rv, "%s", meta_str(secret, "resourceVersion") ? meta_str(secret, "resourceVersion") : "");
    member_conn *mc = member_cached(ctl, job, c);
    if (mc && rv[0] && !strcmp(mc->rv, rv)) {
        json_decref(secret);
        return mc;
    }
    const char *b64 = json_string_value(json_object_get(json_object_get(secret, "data"), skey));
    unsigned char *text = NULL;
    size_t len = 0;
    kube_config *cfg = NULL;
    kube_client *client = NULL;
    if (!b64)
        rc = cirrus_fail(err, CIRRUS_EINVAL, "%s: no such key in the Secret", source);
    else if ((rc = kube_base64_decode(b64, strlen(b64), &text, &len, err)) == 0 &&
             (rc = kube_config_from_data((const char *)text, len, source, &cfg, err)) == 0)
        rc = kube_client_new(cfg, &client, err);
    free(text);
    json_decref(secret);
    if (rc) {
        kube_config_free(cfg);
        return NULL;
    }
    kube_client_set_timeout_ms(client, MEMBER_TIMEOUT_MS);
    if (!mc) {
        mc = calloc(1, sizeof *mc);
        if (!mc) {
            kube_client_free(client);
            kube_config_free(cfg);
            cirrus_fail(err, CIRRUS_ENOMEM, "out of memory");
            return NULL;
        }
        snprintf(mc->key, sizeof mc->key, "%s", key);
        mc->next = ctl->members;
        ctl->members = mc;
    } else {
        kube_client_free(mc->client);
        kube_config_free(mc->cfg);
    }
    mc->cfg = cfg;
    mc->client = client;
    snprintf(mc->rv, sizeof mc->rv, "%s", rv);
    log_info("%s/%s: member cluster %s at %s", meta_str(job, "namespace"), meta_str(job, "name"),
             json_string_value(json_object_get(c, "name")), kube_config_server(cfg));
    return mc;
}

/* The copy of job for member cluster `member`: the home job's spec with spec.home (this
 * cluster's name, the job's uid and, once the job ended, its final phase), no
 * spec.clusters, and every region placed as the member sees it: its own regions without a
 * cluster, the others in theirs (this one's under the home cluster's name), each with its
 * endpoint where known. The lifetime clocks (TTL, deadline) stay with the home job. */
static json_t *copy_of(controller *ctl, const json_t *job, const job_mem *m,
                       const job_observed *obs, const char *member)
{
    json_t *spec = json_deep_copy(json_object_get(job, "spec"));
    if (!spec) return NULL;
    json_object_del(spec, "clusters");
    json_t *rp = json_object_get(spec, "runPolicy");
    json_object_del(rp, "ttlSecondsAfterFinished");
    json_object_del(rp, "activeDeadlineSeconds");
    size_t i;
    json_t *r;
    json_array_foreach(json_object_get(spec, "regions"), i, r)
    {
        const char *cl = json_string_value(json_object_get(r, "cluster"));
        const char *name = json_string_value(json_object_get(r, "name"));
        if (cl && !strcmp(cl, member)) {
            json_object_del(r, "cluster");
            continue;
        }
        if (!cl) json_object_set_new(r, "cluster", json_string(ctl->opt.cluster_name));
        for (int k = 0; k < obs->n_regions && name; k++)
            if (!strcmp(obs->regions[k].name, name) && obs->regions[k].endpoint &&
                !json_object_get(r, "endpoint"))
                json_object_set_new(r, "endpoint", json_string(obs->regions[k].endpoint));
    }
    const char *phase = json_string_value(json_object_get(json_object_get(job, "status"), "phase"));
    json_t *home = json_pack("{s:s, s:s}", "cluster", ctl->opt.cluster_name, "uid",
                             meta_str(job, "uid"));
    if (home && phase && (!strcmp(phase, "Succeeded") || !strcmp(phase, "Failed")))
        json_object_set_new(home, "phase", json_string(phase));
    if (home) ctl_copy_pki(job, m, member, home); /* the certificates signed for it */
    json_object_set_new(spec, "home", home);
    return json_pack("{s:s, s:s, s:{s:s, s:s, s:{s:s}}, s:o}", "apiVersion", CIRRUS_API_VERSION,
                     "kind", CIRRUS_KIND, "metadata", "name", meta_str(job, "name"), "namespace",
                     meta_str(job, "namespace"), "labels", "cirrus.dev/home-cluster",
                     ctl->opt.cluster_name, "spec", spec);
}

/* A member's region entry (the copy's status.regions[]) into ro. */
static void fold_region(region_observed *ro, const json_t *e)
{
    const json_t *ready = json_object_get(e, "readyPeersPerStage");
    for (int s = 0; s < ro->n_stages; s++) {
        json_int_t v = json_integer_value(json_array_get(ready, (size_t)s));
        ro->ready[s] = ro->peers[s] = v < 0 ? 0 : v > 65536 ? 65536 : (int)v;
    }
    ro->unschedulable = (int)json_integer_value(json_object_get(e, "pendingPods"));
    ro->gateway_ready = json_is_true(json_object_get(e, "gatewayReady"));
    ro->preemptions = json_integer_value(json_object_get(e, "preemptions"));
    ro->failures = json_integer_value(json_object_get(e, "failures"));
    ro->clients_succeeded = (int)json_integer_value(json_object_get(e, "clientsSucceeded"));
    if (json_string_value(json_object_get(e, "endpoint")))
        ro->endpoint = json_string_value(json_object_get(e, "endpoint"));
    const json_t *step = json_object_get(e, "step"), *loss = json_object_get(e, "loss");
    const json_t *tps = json_object_get(e, "tokensPerSecond");
    const json_t *val = json_object_get(e, "validationLoss");
    if (json_is_integer(step)) {
        ro->has_progress = 1;
        ro->step = json_integer_value(step);
        ro->loss = json_is_number(loss) ? json_number_value(loss) : NAN;
        ro->tokens_per_s = json_is_number(tps) ? json_number_value(tps) : NAN;
        int64_t t = jobstatus_parse_time(json_string_value(json_object_get(e, "progressTime")));
        ro->progress_time = ro->watched_since = t > 0 ? t : 0;
        const json_t *os = json_object_get(e, "outerStep"), *wb = json_object_get(e, "wanBytes");
        ro->has_outer = json_is_integer(os);
        ro->outer_step = json_integer_value(os);
        ro->wan_bytes = json_integer_value(wb);
        if (json_is_number(val)) {
            ro->has_summary = 1;
            ro->summary_step = ro->step;
            ro->summary_loss = ro->loss;
            ro->summary_val_loss = json_number_value(val);
        }
    }
}

static const json_t *status_region(const json_t *status, const char *name)
{
    return named(json_object_get(status, "regions"), name);
}

/* The regions of member `member` in obs from status (the copy's, or the home job's own
 * last one when the member did not answer: unreachable). */
static void fold_member(job_observed *obs, const json_t *spec, const char *member,
                        const json_t *status, int unreachable)
{
    for (int i = 0; i < obs->n_regions; i++) {
        region_observed *ro = &obs->regions[i];
        const char *cl =
            json_string_value(json_object_get(ctl_spec_region(spec, ro->name), "cluster"));
        if (!cl || strcmp(cl, member)) continue;
        const json_t *e = status_region(status, ro->name);
        if (e) fold_region(ro, e);
        ro->cluster_unreachable = unreachable;
    }
}

/* The whole job as the home status has it (its phase, the job's figures and every region's)
 * in the copy's status.home, so that each cluster's status shows the whole job: written
 * when it differs from what the copy has (copy_status), by merge patch of that field alone
 * (the member's operator writes the rest of the copy's status). */
static int publish_whole_job(member_conn *mc, const json_t *job, const char *path,
                             const json_t *copy_status, cirrus_error *err)
{
    static const char *const fields[] = {"phase",  "readyRegions", "readyPeers",
                                         "step",   "loss",         "tokensPerSecond",
                                         "outerStep", "wanBytes",  "regions"};
    const json_t *st = json_object_get(job, "status");
    const json_t *have = json_object_get(copy_status, "home");
    json_t *whole = json_object(), *patch_home = json_object();
    for (size_t i = 0; whole && patch_home && i < sizeof fields / sizeof fields[0]; i++) {
        json_t *v = json_object_get(st, fields[i]);
        if (v) {
            json_object_set(whole, fields[i], v);
            json_object_set(patch_home, fields[i], v);
        } else if (json_object_get(have, fields[i])) {
            /* Gone from the home status: removed from the copy's too (merge patch null). */
            json_object_set_new(patch_home, fields[i], json_null());
        }
    }
    int rc = 0;
    if (!whole || !patch_home)
        rc = cirrus_fail(err, CIRRUS_ENOMEM, "out of memory");
    else if (json_object_size(whole) && !json_equal(whole, have)) {
        json_t *patch = json_pack("{s:{s:O}}", "status", "home", patch_home);
        char spath[PATH_MAX_LEN + 8];
        snprintf(spath, sizeof spath, "%s/status", path);
        rc = patch ? kube_patch_merge(mc->client, spath, patch, NULL, err)
                   : cirrus_fail(err, CIRRUS_ENOMEM, "out of memory");
        json_decref(patch);
    }
    json_decref(whole);
    json_decref(patch_home);
    return rc;
}

/* Member cluster c of the home job: its certificate requests signed, its copy applied, its
 * regions' status into m->member_status (kept: obs borrows from it). */
static int sync_member(controller *ctl, const json_t *job, job_mem *m, const job_observed *obs,
                       const json_t *c, int *config_bad, cirrus_error *err)
{
    const char *member = json_string_value(json_object_get(c, "name"));
    member_conn *mc = member_get(ctl, job, c, err);
    if (!mc) {
        /* The Secret missing or its kubeconfig unusable: the user's to mend (an error of the
         * home API itself, e.g. a timeout, is not). */
        int rc = err->code ? err->code : CIRRUS_EIO;
        if (rc == CIRRUS_ENOENT || rc == CIRRUS_EINVAL || rc == CIRRUS_ECORRUPT) *config_bad = 1;
        return rc;
    }
    if (mc->retry_ms && kube_now_ms() < mc->retry_ms) {
        *err = mc->last;
        return err->code ? err->code : CIRRUS_EIO;
    }
    char path[PATH_MAX_LEN];
    int rc = kube_path(path, sizeof path, SWARMJOB_API, meta_str(job, "namespace"), "swarmjobs",
                       meta_str(job, "name"));
    /* The requests its copy's last status showed, signed before the copy is applied, so
     * that the certificates go with it. */
    cirrus_error ierr = {0}; /* the home API's error, not the member's: said, not counted */
    if (!rc && ctl_issue_member_certs(ctl, job, m, member, &ierr))
        log_warn("%s: cluster %s: certificate requests not signed: %s", m->key, member,
                 request_error(ierr.msg));
    json_t *copy = rc ? NULL : copy_of(ctl, job, m, obs, member), *out = NULL;
    if (!rc && !copy) rc = cirrus_fail(err, CIRRUS_ENOMEM, "out of memory");
    if (!rc) rc = kube_apply(mc->client, path, copy, COPY_FIELD_MANAGER, &out, err);
    json_decref(copy);
    const json_t *home = json_object_get(json_object_get(out, "spec"), "home");
    const char *uid = json_string_value(json_object_get(home, "uid"));
    /* A job of that name that is not this job's copy (made by hand, or the copy of an
     * earlier job of the same name still being deleted): not ours to take over. */
    if (!rc && (!uid || strcmp(uid, meta_str(job, "uid"))))
        rc = cirrus_fail(err, CIRRUS_ECONFLICT,
                         "swarmjob %s there is not this job's copy (spec.home.uid %s)",
                         meta_str(job, "name"), uid ? uid : "unset");
    if (!rc) {
        json_t *st = json_object_get(out, "status");
        json_object_set_new(m->member_status, member, st ? json_incref(st) : json_object());
        /* The member answered: a refused status write (its rights lack swarmjobs/status)
         * is said in the log, not taken for the member being unreachable. */
        cirrus_error perr = {0};
        if (publish_whole_job(mc, job, path, st, &perr))
            log_warn("%s: cluster %s: status.home of the copy not written: %s", m->key, member,
                     request_error(perr.msg));
    }
    json_decref(out);
    if (rc && rc != CIRRUS_ECONFLICT && rc != CIRRUS_ENOMEM) {
        /* The member did not answer (or refused): left alone for a while. */
        mc->fails++;
        int64_t wait = (int64_t)MEMBER_POLL_MS << (mc->fails < 4 ? mc->fails - 1 : 3);
        mc->retry_ms = kube_now_ms() + (wait > MEMBER_BACKOFF_MAX_MS ? MEMBER_BACKOFF_MAX_MS : wait);
        mc->last = *err;
    } else if (!rc) {
        mc->fails = 0;
        mc->retry_ms = 0;
    }
    return rc;
}

int64_t ctl_sync_members(controller *ctl, const json_t *job, job_mem *m, job_observed *obs)
{
    if (!ctl_has_members(job)) return 0;
    const json_t *spec = json_object_get(job, "spec");
    if (!m->member_status) m->member_status = json_object();
    obs->has_members = 1;
    /* Every member region's endpoint as last known, before any copy is written: a copy
     * lists the regions of the members after it too. */
    /* The statuses they come from are kept until the next poll (m->member_status_prev):
     * this poll replaces m->member_status's, and obs points into them until the status
     * is written. */
    json_decref(m->member_status_prev);
    m->member_status_prev = json_copy(m->member_status);
    for (int i = 0; i < obs->n_regions; i++) {
        region_observed *ro = &obs->regions[i];
        if (!ro->cluster || ro->endpoint) continue;
        const json_t *e =
            status_region(json_object_get(m->member_status_prev, ro->cluster), ro->name);
        if (!e) e = status_region(json_object_get(job, "status"), ro->name);
        ro->endpoint = json_string_value(json_object_get(e, "endpoint"));
    }
    char before[sizeof m->members_unreachable];
    snprintf(before, sizeof before, "%s", m->members_unreachable);
    m->members_unreachable[0] = 0;
    int config_bad = 0;
    size_t i, len = 0;
    const json_t *c;
    json_array_foreach(json_object_get(spec, "clusters"), i, c)
    {
        const char *member = json_string_value(json_object_get(c, "name"));
        if (!member) continue;
        cirrus_error err = {0};
        int rc = leading(ctl) && m->member_status
                     ? sync_member(ctl, job, m, obs, c, &config_bad, &err)
                     : 0;
        if (rc) {
            int n = snprintf(m->members_unreachable + len, sizeof m->members_unreachable - len,
                             "%scluster %s: %s", len ? "; " : "", member, request_error(err.msg));
            if (n > 0) len += (size_t)n < sizeof m->members_unreachable - len
                                  ? (size_t)n
                                  : sizeof m->members_unreachable - len - 1;
            fold_member(obs, spec, member, json_object_get(job, "status"), 1);
        } else {
            const json_t *st = json_object_get(m->member_status, member);
            fold_member(obs, spec, member, st, 0);
            /* A FailJob rule matched in the member failed its copy: the job fails. */
            const json_t *f = jobstatus_condition(st, "Failed");
            const char *reason = json_string_value(json_object_get(f, "reason"));
            if (!obs->policy_failure && reason && !strcmp(reason, "PodFailurePolicy") &&
                json_string_value(json_object_get(f, "status")) &&
                !strcmp(json_string_value(json_object_get(f, "status")), "True")) {
                snprintf(m->members_failjob, sizeof m->members_failjob, "cluster %s: %s",
                         member, json_string_value(json_object_get(f, "message"))
                                     ? json_string_value(json_object_get(f, "message"))
                                     : "a FailJob rule matched");
                obs->policy_failure = m->members_failjob;
            }
        }
    }
    obs->members_unreachable = len ? m->members_unreachable : NULL;
    /* A Secret or kubeconfig at fault is the user's to mend; anything else (refused,
     * timed out, a 5xx) the member's or the network's. */
    obs->members_reason = config_bad ? "MemberConfigInvalid" : "MemberUnreachable";
    if (len && strcmp(before, m->members_unreachable))
        log_warn("%s: %s", m->key, m->members_unreachable);
    else if (!len && before[0])
        log_info("%s: every member cluster answers again", m->key);
    return MEMBER_POLL_MS;
}

/* ---- the home job's finalizer ---------------------------------------------------------- */

static int has_finalizer(const json_t *job)
{
    size_t i;
    const json_t *f;
    json_array_foreach(json_object_get(json_object_get(job, "metadata"), "finalizers"), i, f)
        if (json_string_value(f) && !strcmp(json_string_value(f), DESIRED_FINALIZER_MEMBERS))
            return 1;
    return 0;
}

/* The job's finalizers with ours added (add) or removed, by merge patch with the
 * resourceVersion it was read at (a stale one is refused and the reconcile retried). */
static int patch_finalizer(controller *ctl, const json_t *job, int add, cirrus_error *err)
{
    json_t *list = json_array();
    size_t i;
    const json_t *f;
    json_array_foreach(json_object_get(json_object_get(job, "metadata"), "finalizers"), i, f)
        if (!json_string_value(f) || strcmp(json_string_value(f), DESIRED_FINALIZER_MEMBERS))
            json_array_append(list, (json_t *)f);
    if (add) json_array_append_new(list, json_string(DESIRED_FINALIZER_MEMBERS));
    json_t *patch = json_pack("{s:{s:o, s:s}}", "metadata", "finalizers", list,
                              "resourceVersion", meta_str(job, "resourceVersion"));
    char path[PATH_MAX_LEN];
    int rc = patch ? kube_path(path, sizeof path, SWARMJOB_API, meta_str(job, "namespace"),
                               "swarmjobs", meta_str(job, "name"))
                   : cirrus_fail(err, CIRRUS_ENOMEM, "out of memory");
    if (!rc) rc = kube_patch_merge(ctl->client, path, patch, NULL, err);
    json_decref(patch);
    return rc;
}

int ctl_members_finalizer(controller *ctl, const json_t *job, cirrus_error *err)
{
    if (!ctl_has_members(job) || has_finalizer(job) || !leading(ctl)) return 0;
    return patch_finalizer(ctl, job, 1, err);
}

int ctl_release_members(controller *ctl, const json_t *job, int64_t *requeue_ms,
                        cirrus_error *err)
{
    if (!has_finalizer(job) || !leading(ctl)) return 0;
    char path[PATH_MAX_LEN];
    int rc = kube_path(path, sizeof path, SWARMJOB_API, meta_str(job, "namespace"), "swarmjobs",
                       meta_str(job, "name"));
    if (rc) return cirrus_fail(err, rc, "job path too long");
    size_t i;
    const json_t *c;
    /* The way out when a member is gone for good: the copies there are left to whoever
     * runs that cluster. */
    const char *abandon = annotation(job, DESIRED_ANNOT_ABANDON_COPIES);
    if (abandon && !strcmp(abandon, "true")) {
        ctl_event(ctl, job, 1, "CopiesAbandoned",
                  "%s is true: copies in member clusters are left where they are",
                  DESIRED_ANNOT_ABANDON_COPIES);
        return patch_finalizer(ctl, job, 0, err);
    }
    json_array_foreach(json_object_get(json_object_get(job, "spec"), "clusters"), i, c)
    {
        const char *member = json_string_value(json_object_get(c, "name"));
        member_conn *mc = member_get(ctl, job, c, err);
        if (!mc && (err->code == CIRRUS_ENOENT || err->code == CIRRUS_EINVAL ||
                    err->code == CIRRUS_ECORRUPT)) {
            /* The kubeconfig Secret is gone (deleted with the job's namespace, or by the
             * same `kubectl delete -f`): the connection made from it while it existed
             * still serves; without one the copy cannot be reached, and is left. */
            mc = member_cached(ctl, job, c);
            if (!mc) {
                ctl_event(ctl, job, 1, "CopyLeft",
                          "cluster %s: the copy there is left (no way to reach the cluster: %s)",
                          member, err->msg);
                continue;
            }
        }
        json_t *copy = NULL;
        int grc = mc ? kube_get(mc->client, path, &copy, err) : CIRRUS_EIO;
        const char *uid = json_string_value(
            json_object_get(json_object_get(json_object_get(copy, "spec"), "home"), "uid"));
        if (!grc && uid && !strcmp(uid, meta_str(job, "uid"))) {
            json_t *opts = json_pack("{s:s, s:{s:s}}", "propagationPolicy", "Background",
                                     "preconditions", "uid", meta_str(copy, "uid"));
            grc = kube_delete(mc->client, path, opts, err);
            json_decref(opts);
            if (grc == CIRRUS_ENOENT) grc = 0;
            if (!grc)
                ctl_event(ctl, job, 0, "CopyDeleted", "the copy in cluster %s deleted", member);
        } else if (grc == CIRRUS_ENOENT || !grc) {
            grc = 0; /* gone already, or not ours */
        }
        json_decref(copy);
        if (grc) {
            /* Kept until the member answers: its pods would otherwise train on, unowned. */
            ctl_event(ctl, job, 1, "MemberUnreachable",
                      "cluster %s: cannot delete the job's copy there: %s", member, err->msg);
            *requeue_ms = MEMBER_POLL_MS;
            return 0;
        }
    }
    return patch_finalizer(ctl, job, 0, err);
}
