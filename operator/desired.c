/* desired: see desired.h. */
#include "desired.h"

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/role_args.h"
#include "desired_args.h"
#include "desired_cpu.h"

#define SECRET_SUFFIX "-pki"

/* ---- names ---- */

static int make_name(char *buf, size_t size, cirrus_error *err, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int make_name(char *buf, size_t size, cirrus_error *err, const char *fmt, ...)
{
    char tmp[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof tmp)
        return cirrus_fail(err, CIRRUS_EINVAL, "object name '%.64s...' is too long", tmp);
    if (n > CIRRUS_NAME_MAX)
        return cirrus_fail(err, CIRRUS_EINVAL,
                           "object name '%s' is %d characters, more than %d (shorten "
                           "metadata.name or the region's name)",
                           tmp, n, CIRRUS_NAME_MAX);
    if (!desired_is_dns1035(tmp))
        return cirrus_fail(err, CIRRUS_EINVAL,
                           "object name '%s' is not a DNS label (lowercase letters, digits "
                           "and '-', starting with a letter)",
                           tmp);
    if ((size_t)n >= size)
        return cirrus_fail(err, CIRRUS_EINVAL, "object name '%s': buffer too small", tmp);
    memcpy(buf, tmp, (size_t)n + 1);
    return 0;
}

int desired_name_gateway(char *buf, size_t size, const char *job, const char *region,
                         cirrus_error *err)
{
    return make_name(buf, size, err, "%s-%s-gw", job, region);
}

int desired_name_wan_service(char *buf, size_t size, const char *job, const char *region,
                             cirrus_error *err)
{
    return make_name(buf, size, err, "%s-%s-wan", job, region);
}

int desired_name_peer(char *buf, size_t size, const char *job, const char *region, int stage,
                      int index, cirrus_error *err)
{
    return make_name(buf, size, err, "%s-%s-s%d-%d", job, region, stage, index);
}

int desired_name_client(char *buf, size_t size, const char *job, const char *region, int index,
                        cirrus_error *err)
{
    return make_name(buf, size, err, "%s-%s-c%d", job, region, index);
}

int desired_name_group(char *buf, size_t size, const char *job, const char *region,
                       cirrus_error *err)
{
    return make_name(buf, size, err, "%s-%s", job, region);
}

int desired_name_secret(char *buf, size_t size, const char *job, cirrus_error *err)
{
    return make_name(buf, size, err, "%s" SECRET_SUFFIX, job);
}

/* ---- building ---- */

static uint64_t fnv1a64(const char *s)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++) {
        h ^= (unsigned char)*s;
        h *= 0x100000001b3ull;
    }
    return h;
}

static json_t *labels_new(const job_view *v, const char *region, const char *role, int stage,
                          int index)
{
    json_t *l = json_pack("{s:s, s:s, s:s}", CIRRUS_LABEL_APP_NAME, "cirrus",
                          CIRRUS_LABEL_MANAGED_BY, "cirrus-operator", CIRRUS_LABEL_JOB, v->name);
    if (!l) return NULL;
    if (region) json_object_set_new(l, CIRRUS_LABEL_REGION, json_string(region));
    if (role) json_object_set_new(l, CIRRUS_LABEL_ROLE, json_string(role));
    char num[16];
    if (stage >= 0) {
        snprintf(num, sizeof num, "%d", stage);
        json_object_set_new(l, CIRRUS_LABEL_STAGE, json_string(num));
    }
    if (index >= 0) {
        snprintf(num, sizeof num, "%d", index);
        json_object_set_new(l, CIRRUS_LABEL_INDEX, json_string(num));
    }
    return l;
}

/* An object's apiVersion, kind and metadata (labels stolen). */
static json_t *object_new(const job_view *v, const char *api, const char *kind,
                          const char *name, json_t *labels)
{
    return json_pack("{s:s, s:s, s:{s:s, s:s, s:o, s:[{s:s, s:s, s:s, s:s, s:b, s:b}]}}",
                     "apiVersion", api, "kind", kind, "metadata", "name", name, "namespace",
                     v->ns, "labels", labels, "ownerReferences", "apiVersion",
                     CIRRUS_API_VERSION, "kind", CIRRUS_KIND, "name", v->name, "uid", v->uid,
                     "controller", 1, "blockOwnerDeletion", 1);
}

static json_t *port_new(const char *name, int port)
{
    return json_pack("{s:s, s:i, s:s}", "name", name, "containerPort", port, "protocol", "TCP");
}

/* The container: role's command and args (stolen), env, resources (copied), the restricted
 * Pod Security Standard's container part (desired.h); ports, mounts and the probe are added
 * by the caller. */
static json_t *container_new(const job_view *v, const char *role, json_t *args,
                             const json_t *resources)
{
    json_t *c = json_pack(
        "{s:s, s:s, s:s, s:[s, s], s:o, s:[{s:s, s:{s:{s:s}}}, {s:s, s:{s:{s:s}}}]}", "name",
        CIRRUS_CONTAINER, "image", v->image, "imagePullPolicy", v->pull_policy, "command",
        ROLE_TRAINER_BIN, role, "args", args, "env", "name", "POD_IP", "valueFrom", "fieldRef",
        "fieldPath", "status.podIP", "name", "POD_NAME", "valueFrom", "fieldRef", "fieldPath",
        "metadata.name");
    if (c && resources) json_object_set_new(c, "resources", json_deep_copy(resources));
    /* As many compute threads as the CPU it was given, sleeping while they wait. */
    json_t *env = c ? json_object_get(c, "env") : NULL;
    const int threads = desired_cpu_threads(resources);
    if (env && threads > 0) {
        char n[16];
        snprintf(n, sizeof n, "%d", threads);
        json_array_append_new(env, json_pack("{s:s, s:s}", "name", "OMP_NUM_THREADS", "value", n));
    }
    if (env)
        json_array_append_new(env, json_pack("{s:s, s:s}", "name", "OMP_WAIT_POLICY", "value",
                                             "passive"));
    /* A container that fails without writing its termination message (a crash: its
     * backtrace, common/crash.c) leaves its log's tail there, for the PodFailed Event. */
    if (c)
        json_object_set_new(c, "terminationMessagePolicy",
                            json_string("FallbackToLogsOnError"));
    if (c)
        json_object_set_new(c, "securityContext",
                            json_pack("{s:b, s:{s:[s]}}", "allowPrivilegeEscalation", 0,
                                      "capabilities", "drop", "ALL"));
    return c;
}

/* Region r's pods: the gateway, stages x replicas peers, the clients. */
static int region_pods(const job_view *v, const region_view *r)
{
    return 1 + v->stages * r->replicas + r->clients;
}

/* The region's group (spec.gangScheduling, Kueue) on pod: spec.schedulingGroup names the
 * gang's PodGroup; Kueue's queue and pod-group labels, and the group's size. */
static int pod_in_group(const job_view *v, const region_view *r, json_t *pod, json_t *spec,
                        cirrus_error *err)
{
    if (!v->gang && !v->queue_name) return 0;
    char group[CIRRUS_NAME_MAX + 1];
    int rc = desired_name_group(group, sizeof group, v->name, r->name, err);
    if (rc) return rc;
    if (v->gang)
        json_object_set_new(spec, "schedulingGroup", json_pack("{s:s}", "podGroupName", group));
    if (v->queue_name) {
        json_t *meta = json_object_get(pod, "metadata");
        json_t *labels = json_object_get(meta, "labels");
        json_object_set_new(labels, DESIRED_KUEUE_QUEUE, json_string(v->queue_name));
        json_object_set_new(labels, DESIRED_KUEUE_GROUP, json_string(group));
    }
    return 0;
}

/* The Pod around container c (stolen); volumes (stolen, may be NULL). */
static json_t *pod_new(const job_view *v, const region_view *r, const char *name,
                       json_t *labels, json_t *c, json_t *volumes, cirrus_error *err)
{
    json_t *pod = object_new(v, "v1", "Pod", name, labels);
    json_t *spec = json_pack(
        "{s:s, s:i, s:[o], s:b, s:{s:b, s:i, s:i, s:i, s:{s:s}}}", "restartPolicy", "Never",
        "terminationGracePeriodSeconds", 10, "containers", c, "automountServiceAccountToken", 0,
        "securityContext", "runAsNonRoot", 1, "runAsUser", DESIRED_RUN_AS, "runAsGroup",
        DESIRED_RUN_AS, "fsGroup", DESIRED_RUN_AS, "seccompProfile", "type", "RuntimeDefault");
    json_t *sel = r->node_selector ? json_deep_copy(r->node_selector) : json_object();
    if (!pod || !spec || !sel) {
        json_decref(pod);
        json_decref(spec);
        json_decref(sel);
        json_decref(volumes);
        cirrus_fail(err, CIRRUS_ENOMEM, "building pod %s: out of memory", name);
        return NULL;
    }
    json_object_set_new(sel, r->region_label, json_string(r->name));
    json_object_set_new(spec, "nodeSelector", sel);
    if (r->affinity) json_object_set_new(spec, "affinity", json_deep_copy(r->affinity));
    if (r->tolerations) json_object_set_new(spec, "tolerations", json_deep_copy(r->tolerations));
    if (r->priority_class)
        json_object_set_new(spec, "priorityClassName", json_string(r->priority_class));
    if (v->pull_secrets)
        json_object_set_new(spec, "imagePullSecrets", json_deep_copy(v->pull_secrets));
    if (volumes) json_object_set_new(spec, "volumes", volumes);
    if (pod_in_group(v, r, pod, spec, err)) {
        json_decref(pod);
        json_decref(spec);
        return NULL;
    }

    char *text = json_dumps(spec, JSON_SORT_KEYS | JSON_COMPACT);
    if (!text) {
        json_decref(pod);
        json_decref(spec);
        cirrus_fail(err, CIRRUS_ENOMEM, "building pod %s: out of memory", name);
        return NULL;
    }
    char hash[17];
    snprintf(hash, sizeof hash, "%016llx", (unsigned long long)fnv1a64(text));
    free(text);
    json_t *annotations = json_pack("{s:s}", CIRRUS_ANNOT_SPEC_HASH, hash);
    if (annotations && v->queue_name) {
        char count[16];
        snprintf(count, sizeof count, "%d", region_pods(v, r));
        json_object_set_new(annotations, DESIRED_KUEUE_GROUP_COUNT, json_string(count));
    }
    json_object_set_new(json_object_get(pod, "metadata"), "annotations", annotations);
    json_object_set_new(pod, "spec", spec);
    return pod;
}

static int add_pod(desired_job *d, const char *name, json_t *pod)
{
    if (!pod) return CIRRUS_ENOMEM; /* pod_new filled err */
    return json_object_set_new(d->pods, name, pod) ? CIRRUS_ENOMEM : 0;
}

static int build_gateway(const job_view *v, const region_view *r, const char *gw,
                         const char *secret, desired_job *d, cirrus_error *err)
{
    json_t *args = desired_args_gateway(v, r);
    if (!args) return cirrus_fail(err, CIRRUS_ENOMEM, "building pod %s: out of memory", gw);
    json_t *c = container_new(v, ROLE_GATEWAY, args, r->res_gateway);
    if (c) {
        json_t *ports = json_pack("[o, o]", port_new("coord", ROLE_PORT_COORDINATOR),
                                  port_new("http", ROLE_PORT_HTTP));
        /* With several regions the gateways reach each other here (its Service's "wan"). */
        if (ports && desired_outer(v))
            json_array_append_new(ports, port_new("wan", (int)v->wan_port));
        json_object_set_new(c, "ports", ports);
        json_object_set_new(c, "volumeMounts",
                            json_pack("[{s:s, s:s, s:b}]", "name", "tls", "mountPath",
                                      CIRRUS_TLS_DIR, "readOnly", 1));
        json_object_set_new(c, "readinessProbe",
                            json_pack("{s:{s:s, s:i}, s:i, s:i}", "httpGet", "path", "/status",
                                      "port", ROLE_PORT_HTTP, "periodSeconds", 5,
                                      "failureThreshold", 3));
    }
    char crt[96], key[96];
    snprintf(crt, sizeof crt, "%s.crt", r->name);
    snprintf(key, sizeof key, "%s.key", r->name);
    json_t *vols = json_pack("[{s:s, s:{s:s, s:[{s:s, s:s}, {s:s, s:s}, {s:s, s:s}]}}]", "name",
                             "tls", "secret", "secretName", secret, "items", "key", "ca.crt",
                             "path", "ca.crt", "key", crt, "path", "tls.crt", "key", key,
                             "path", "tls.key");
    if (!c || !vols) {
        json_decref(c);
        json_decref(vols);
        return cirrus_fail(err, CIRRUS_ENOMEM, "building pod %s: out of memory", gw);
    }
    return add_pod(d, gw, pod_new(v, r, gw, labels_new(v, r->name, CIRRUS_ROLE_GATEWAY, -1, -1),
                                  c, vols, err));
}

static int build_peer(const job_view *v, const region_view *r, const char *coord, int s, int i,
                      desired_job *d, cirrus_error *err)
{
    char name[CIRRUS_NAME_MAX + 1];
    int l0, l1, rc = desired_name_peer(name, sizeof name, v->name, r->name, s, i, err);
    if (rc) return rc;
    if (role_stage_layers(v->n_layer, v->stages, s, &l0, &l1))
        return cirrus_fail(err, CIRRUS_EINVAL, "cannot cut %d layers into %d stages",
                           v->n_layer, v->stages);
    json_t *args = desired_args_peer(v, coord, s, l0, l1);
    if (!args) return cirrus_fail(err, CIRRUS_ENOMEM, "building pod %s: out of memory", name);
    json_t *c = container_new(v, ROLE_STAGE, args, r->res_peer);
    if (!c) return cirrus_fail(err, CIRRUS_ENOMEM, "building pod %s: out of memory", name);
    json_object_set_new(c, "ports", json_pack("[o, o]", port_new("stage", ROLE_PORT_STAGE),
                                              port_new("ring", ROLE_PORT_RING)));
    return add_pod(d, name,
                   pod_new(v, r, name, labels_new(v, r->name, CIRRUS_ROLE_PEER, s, i), c, NULL,
                           err));
}

static int build_client(const job_view *v, const region_view *r, const char *coord, int i,
                        desired_job *d, cirrus_error *err)
{
    char name[CIRRUS_NAME_MAX + 1];
    int rc = desired_name_client(name, sizeof name, v->name, r->name, i, err);
    if (rc) return rc;
    json_t *args = desired_args_client(v, r, coord, i);
    if (!args) return cirrus_fail(err, CIRRUS_ENOMEM, "building pod %s: out of memory", name);
    json_t *c = container_new(v, ROLE_CLIENT, args, r->res_client);
    json_t *vols = json_array(), *mounts = json_array();
    if (!c || !vols || !mounts) {
        json_decref(c);
        json_decref(vols);
        json_decref(mounts);
        return cirrus_fail(err, CIRRUS_ENOMEM, "building pod %s: out of memory", name);
    }
    if (v->data_claim) {
        json_array_append_new(vols, json_pack("{s:s, s:{s:s, s:b}}", "name", "data",
                                              "persistentVolumeClaim", "claimName",
                                              v->data_claim, "readOnly", 1));
        json_array_append_new(mounts, json_pack("{s:s, s:s, s:b}", "name", "data", "mountPath",
                                                CIRRUS_DATA_DIR, "readOnly", 1));
    }
    if (v->ckpt_claim)
        json_array_append_new(vols, json_pack("{s:s, s:{s:s}}", "name", "checkpoints",
                                              "persistentVolumeClaim", "claimName",
                                              v->ckpt_claim));
    else
        json_array_append_new(vols, json_pack("{s:s, s:{}}", "name", "checkpoints", "emptyDir"));
    json_t *m = json_pack("{s:s, s:s}", "name", "checkpoints", "mountPath", CIRRUS_CKPT_DIR);
    if (m && v->ckpt_subpath) json_object_set_new(m, "subPath", json_string(v->ckpt_subpath));
    json_array_append_new(mounts, m);
    json_object_set_new(c, "volumeMounts", mounts);
    /* The client's --summary-file: read back as the finished Pod's termination message. */
    json_object_set_new(c, "terminationMessagePath", json_string(ROLE_TERMINATION_LOG));
    return add_pod(d, name,
                   pod_new(v, r, name, labels_new(v, r->name, CIRRUS_ROLE_CLIENT, -1, i), c,
                           vols, err));
}

/* One Service of region r's gateway: name, its type and ports (a JSON array). */
static int add_service(const job_view *v, const region_view *r, const char *name,
                       const char *type, json_t *ports, int annotate, desired_job *d,
                       cirrus_error *err)
{
    json_t *svc = object_new(v, "v1", "Service", name,
                             labels_new(v, r->name, CIRRUS_ROLE_GATEWAY, -1, -1));
    json_t *spec = ports ? json_pack("{s:s, s:{s:s, s:s, s:s}, s:o}", "type", type, "selector",
                                     CIRRUS_LABEL_JOB, v->name, CIRRUS_LABEL_REGION, r->name,
                                     CIRRUS_LABEL_ROLE, CIRRUS_ROLE_GATEWAY, "ports", ports)
                         : NULL;
    if (!svc || !spec) {
        json_decref(svc);
        json_decref(spec);
        return cirrus_fail(err, CIRRUS_ENOMEM, "building service %s: out of memory", name);
    }
    if (annotate && v->svc_annotations)
        json_object_set_new(json_object_get(svc, "metadata"), "annotations",
                            json_deep_copy(v->svc_annotations));
    json_object_set_new(svc, "spec", spec);
    return json_object_set_new(d->services, name, svc) ? CIRRUS_ENOMEM : 0;
}

/* Region r's gateway Service gw, inside the cluster: the coordinator port (peers, clients),
 * HTTP (/status) and, with several regions, the WAN port, by which regions of the same
 * cluster reach each other. With several regions and gateway.serviceType NodePort or
 * LoadBalancer, a second Service of that type exposes the WAN port alone to other
 * clusters: the coordinator admits any peer that reaches it, and must not be reachable
 * on every node's address. */
static int build_service(const job_view *v, const region_view *r, const char *gw,
                         desired_job *d, cirrus_error *err)
{
    const int wan_svc = desired_outer(v) && strcmp(v->service_type, "ClusterIP");
    json_t *ports = json_pack("[{s:s, s:s, s:i, s:s}, {s:s, s:s, s:i, s:s}]", "name", "coord",
                              "protocol", "TCP", "port", (int)v->gw_port, "targetPort", "coord",
                              "name", "http", "protocol", "TCP", "port", ROLE_PORT_HTTP,
                              "targetPort", "http");
    json_t *wan = json_pack("{s:s, s:s, s:i, s:s}", "name", "wan", "protocol", "TCP", "port",
                            (int)v->wan_port, "targetPort", "wan");
    if (ports && wan && desired_outer(v)) json_array_append(ports, wan);
    int rc = add_service(v, r, gw, "ClusterIP", ports, !wan_svc, d, err);
    char name[CIRRUS_NAME_MAX + 1];
    if (!rc && wan_svc && !(rc = desired_name_wan_service(name, sizeof name, v->name, r->name, err)))
        rc = add_service(v, r, name, v->service_type, wan ? json_pack("[O]", wan) : NULL, 1, d,
                         err);
    json_decref(wan);
    return rc;
}

/* spec.gangScheduling: region r's PodGroup, a gang of what the region trains with. */
static int build_pod_group(const job_view *v, const region_view *r, desired_job *d,
                           cirrus_error *err)
{
    char name[CIRRUS_NAME_MAX + 1];
    int rc = desired_name_group(name, sizeof name, v->name, r->name, err);
    if (rc) return rc;
    json_t *pg = object_new(v, DESIRED_POD_GROUP_API, "PodGroup", name,
                            labels_new(v, r->name, NULL, -1, -1));
    json_t *spec = json_pack("{s:{s:{s:i}}}", "schedulingPolicy", "gang", "minCount",
                             desired_gang_min(v->stages, r->min, r->clients));
    if (!pg || !spec || json_object_set_new(pg, "spec", spec) ||
        json_object_set_new(d->pod_groups, name, pg)) {
        json_decref(pg);
        return cirrus_fail(err, CIRRUS_ENOMEM, "building PodGroup %s: out of memory", name);
    }
    return 0;
}

static int build_region(const job_view *v, const region_view *r, const char *secret,
                        desired_job *d, cirrus_error *err)
{
    char gw[CIRRUS_NAME_MAX + 1], coord[CIRRUS_NAME_MAX + 300];
    int rc = desired_name_gateway(gw, sizeof gw, v->name, r->name, err);
    if (rc) return rc;
    /* Check every name, suspended or not: a name that cannot exist is an error either way. */
    char name[CIRRUS_NAME_MAX + 1];
    if ((r->clients > 0 &&
         (rc = desired_name_client(name, sizeof name, v->name, r->name, r->clients - 1, err))) ||
        (rc = desired_name_peer(name, sizeof name, v->name, r->name, v->stages - 1,
                                r->replicas - 1, err)))
        return rc;
    if ((rc = build_service(v, r, gw, d, err))) return rc;
    if (v->suspend) return 0;
    if (v->gang && (rc = build_pod_group(v, r, d, err))) return rc;
    snprintf(coord, sizeof coord, "%s.%s.svc:%lld", gw, v->ns, v->gw_port);
    /* A gateway lists every region's gateway for good (its args): none is made before the
     * regions that other clusters run have endpoints. Its peers and clients are made and
     * wait for it. */
    if (!d->waiting[0] && (rc = build_gateway(v, r, gw, secret, d, err))) return rc;
    for (int s = 0; s < v->stages; s++)
        for (int i = 0; i < r->replicas; i++)
            if ((rc = build_peer(v, r, coord, s, i, d, err))) return rc;
    for (int i = 0; i < r->clients; i++)
        if ((rc = build_client(v, r, coord, i, d, err))) return rc;
    return 0;
}

/* Where the other clusters reach region's gateway as the job's status says (the operator
 * resolved it from its Service, or learned it from the cluster that runs it); NULL: not
 * known, or not HOST:PORT. */
static const char *status_endpoint(const json_t *job, const char *region)
{
    size_t i;
    const json_t *r;
    json_array_foreach(json_object_get(json_object_get(job, "status"), "regions"), i, r)
    {
        const char *name = json_string_value(json_object_get(r, "name"));
        const char *ep = json_string_value(json_object_get(r, "endpoint"));
        if (name && !strcmp(name, region)) return desired_endpoint_valid(ep) ? ep : NULL;
    }
    return NULL;
}

int desired_build(const json_t *job, desired_job *out, cirrus_error *err)
{
    memset(out, 0, sizeof *out);
    job_view v;
    const json_t *regions = NULL;
    int rc = desired_read_job(job, &v, &regions, err);
    if (rc) return rc;
    char secret[CIRRUS_NAME_MAX + 1];
    if ((rc = desired_name_secret(secret, sizeof secret, v.name, err))) return rc;
    desired_job d = {json_object(), json_object(), json_object(),
                     object_new(&v, "v1", "Secret", secret, labels_new(&v, NULL, NULL, -1, -1)),
                     "", NULL};
    if (!d.pods || !d.services || !d.pod_groups || !d.secret) {
        desired_job_free(&d);
        return cirrus_fail(err, CIRRUS_ENOMEM, "out of memory");
    }
    json_object_set_new(d.secret, "type", json_string("Opaque"));
    /* Every field is within its bounds, but their product may not be: 16 regions of 64
     * stages of 256 peers are 262144 Pods, which would take the operator seconds and
     * gigabytes to build (and the cluster far more to run). Refused before building. */
    long long pods = 0;
    for (size_t k = 0; k < json_array_size(regions) && !rc; k++) {
        region_view r;
        rc = desired_read_region(&v, regions, k, &r, err);
        if (rc) break;
        pods += 1 + (long long)v.stages * r.replicas + r.clients;
        v.region_names[k] = r.name; /* every gateway lists every region's */
        v.region_cluster[k] = r.cluster;
        v.region_endpoint[k] = r.endpoint ? r.endpoint : status_endpoint(job, r.name);
        if (r.cluster && !v.region_endpoint[k] && !d.waiting[0])
            snprintf(d.waiting, sizeof d.waiting,
                     "waiting for the endpoint of region %s's gateway (cluster %s)", r.name,
                     r.cluster);
        /* A region's outer steps are taken by its client 0 (the others wait at the step
         * barrier meanwhile), and a region without clients has no inner steps. */
        if (desired_outer(&v) && r.clients < 1)
            rc = cirrus_fail(err, CIRRUS_EINVAL,
                             "spec.regions[%zu].clients is %d: with more than one region "
                             "every region must run clients (a region without one takes no "
                             "inner steps to synchronise)",
                             k, r.clients);
    }
    if (!rc && pods > DESIRED_MAX_PODS)
        rc = cirrus_fail(err, CIRRUS_EINVAL,
                         "the job asks for %lld Pods (a gateway, stages x peers.replicas peers "
                         "and clients per region); at most %d",
                         pods, DESIRED_MAX_PODS);
    for (size_t k = 0; k < json_array_size(regions) && !rc; k++) {
        region_view r;
        rc = desired_read_region(&v, regions, k, &r, err);
        if (!rc && !r.cluster) rc = build_region(&v, &r, secret, &d, err);
    }
    if (rc) {
        if (rc == CIRRUS_ENOMEM && (!err || err->code != CIRRUS_ENOMEM))
            cirrus_fail(err, CIRRUS_ENOMEM, "out of memory");
        desired_job_free(&d);
        return rc;
    }
    *out = d;
    return 0;
}

void desired_job_free(desired_job *d)
{
    if (!d) return;
    json_decref(d->pods);
    json_decref(d->services);
    json_decref(d->pod_groups);
    json_decref(d->secret);
    d->pods = d->services = d->pod_groups = d->secret = NULL;
}

json_t *desired_gateway_dns_names(const json_t *job, const char *region)
{
    const json_t *meta = json_object_get(job, "metadata");
    const char *name = json_string_value(json_object_get(meta, "name"));
    const char *ns = json_string_value(json_object_get(meta, "namespace"));
    char gw[CIRRUS_NAME_MAX + 1];
    if (!name || !ns || !region || !desired_is_dns1035(name) || !desired_is_dns1123(ns) ||
        !desired_is_dns1123(region) || desired_name_gateway(gw, sizeof gw, name, region, NULL))
        return NULL;
    char buf[CIRRUS_NAME_MAX * 2 + 32];
    json_t *names = json_array();
    if (!names) return NULL;
    int bad = json_array_append_new(names, json_string(gw));
    snprintf(buf, sizeof buf, "%s.%s", gw, ns);
    bad |= json_array_append_new(names, json_string(buf));
    snprintf(buf, sizeof buf, "%s.%s.svc", gw, ns);
    bad |= json_array_append_new(names, json_string(buf));
    snprintf(buf, sizeof buf, "%s.%s.svc.cluster.local", gw, ns);
    bad |= json_array_append_new(names, json_string(buf));
    if (bad) {
        json_decref(names);
        return NULL;
    }
    return names;
}
