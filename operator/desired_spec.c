/* desired_spec: reading a SwarmJob's spec into job_view / region_view (desired_args.h), every
 * field checked against its bounds with a message naming it: the CRD's rules, again, for
 * objects an older CRD admitted (desired.h: desired_build). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/model_presets.h"
#include "../common/role_args.h"
#include "desired.h"
#include "desired_args.h"

#define DEFAULT_REGION_LABEL "topology.kubernetes.io/region"

/* The model presets (common/model_presets.h, shared with the trainer). */
static const struct {
    const char *name;
    int layers, width, heads, context;
} presets[] = {
#define PRESET(name, layers, width, heads, context) {#name, layers, width, heads, context},
    CIRRUS_MODEL_PRESETS(PRESET)
#undef PRESET
};

/* A DNS-1035 label: [a-z]([-a-z0-9]*[a-z0-9])?, at most 63 characters. */
int desired_is_dns1035(const char *s)
{
    size_t n = strlen(s);
    if (n < 1 || n > CIRRUS_NAME_MAX || s[0] < 'a' || s[0] > 'z' || s[n - 1] == '-') return 0;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= '0' && s[i] <= '9') || s[i] == '-'))
            return 0;
    return 1;
}

/* A DNS-1123 label: [a-z0-9]([-a-z0-9]*[a-z0-9])?, at most 63 characters. */
int desired_is_dns1123(const char *s)
{
    size_t n = strlen(s);
    if (n < 1 || n > CIRRUS_NAME_MAX || s[0] == '-' || s[n - 1] == '-') return 0;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= '0' && s[i] <= '9') || s[i] == '-'))
            return 0;
    return 1;
}

int desired_managed_here(const json_t *job)
{
    const json_t *by = json_object_get(json_object_get(job, "spec"), "managedBy");
    return !by || json_is_null(by) ||
           (json_is_string(by) && !strcmp(json_string_value(by), CIRRUS_CONTROLLER_NAME));
}

static int peer_count(const json_t *v)
{
    return json_is_integer(v) && json_integer_value(v) >= 1 && json_integer_value(v) <= 256
               ? (int)json_integer_value(v)
               : 0;
}

int desired_peers_per_stage(const json_t *spec, const json_t *region)
{
    int n = peer_count(json_object_get(spec, "peersPerStage"));
    if (!n) n = peer_count(json_object_get(json_object_get(region, "peers"), "replicas"));
    return n ? n : 2;
}

/* ---- reading the SwarmJob ---- */

/* Optional member of type `type` (JSON_OBJECT...): *out NULL when absent or null. */
static int get_typed(const json_t *parent, const char *key, const char *path, json_type type,
                     const char *what, const json_t **out, cirrus_error *err)
{
    const json_t *v = parent ? json_object_get(parent, key) : NULL;
    *out = NULL;
    if (!v || json_is_null(v)) return 0;
    if (json_typeof(v) != type)
        return cirrus_fail(err, CIRRUS_EINVAL, "%s%s%s must be %s", path, *path ? "." : "",
                           key, what);
    *out = v;
    return 0;
}

static int get_obj(const json_t *parent, const char *key, const char *path, const json_t **out,
                   cirrus_error *err)
{
    return get_typed(parent, key, path, JSON_OBJECT, "an object", out, err);
}

static int get_arr(const json_t *parent, const char *key, const char *path, const json_t **out,
                   cirrus_error *err)
{
    return get_typed(parent, key, path, JSON_ARRAY, "an array", out, err);
}

/* Optional string; def when absent. Empty strings are refused when nonempty is set. */
static int get_str(const json_t *parent, const char *key, const char *path, const char *def,
                   int nonempty, const char **out, cirrus_error *err)
{
    const json_t *v;
    int rc = get_typed(parent, key, path, JSON_STRING, "a string", &v, err);
    if (rc) return rc;
    *out = v ? json_string_value(v) : def;
    if (v && nonempty && !**out)
        return cirrus_fail(err, CIRRUS_EINVAL, "%s%s%s must not be empty", path,
                           *path ? "." : "", key);
    return 0;
}

static int req_str(const json_t *parent, const char *key, const char *path, const char **out,
                   cirrus_error *err)
{
    int rc = get_str(parent, key, path, NULL, 1, out, err);
    if (!rc && !*out)
        rc = cirrus_fail(err, CIRRUS_EINVAL, "%s%s%s is required", path, *path ? "." : "", key);
    return rc;
}

/* Optional integer in [lo, hi]; def when absent. */
static int get_int(const json_t *parent, const char *key, const char *path, long long lo,
                   long long hi, long long def, long long *out, cirrus_error *err)
{
    const json_t *v = parent ? json_object_get(parent, key) : NULL;
    *out = def;
    if (!v || json_is_null(v)) return 0;
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi)
        return cirrus_fail(err, CIRRUS_EINVAL, "%s.%s must be an integer in [%lld, %lld]", path,
                           key, lo, hi);
    *out = (long long)json_integer_value(v);
    return 0;
}

/* Optional number in [lo, hi] (lo excluded when lo_open, hi when hi_open); def when
 * absent. */
static int get_num(const json_t *parent, const char *key, const char *path, double lo,
                   int lo_open, double hi, int hi_open, double def, double *out,
                   cirrus_error *err)
{
    const json_t *v = parent ? json_object_get(parent, key) : NULL;
    *out = def;
    if (!v || json_is_null(v)) return 0;
    double d = json_is_number(v) ? json_number_value(v) : NAN;
    if (!(lo_open ? d > lo : d >= lo) || !(hi_open ? d < hi : d <= hi)) /* NAN fails */
        return cirrus_fail(err, CIRRUS_EINVAL, "%s.%s must be a number in %c%g, %g%c", path, key,
                           lo_open ? '(' : '[', lo, hi, hi_open ? ')' : ']');
    *out = d;
    return 0;
}

/* A WAN codec spec as the CRD's pattern takes it (and the trainer's wan_codec_parse):
 * auto (the gateways choose per outer step: gateway/adapt.h), or none, fp16, q8, lowbit:2,
 * lowbit:4 or topk:DENSITY[:8|:16], each optionally followed by +zstd, DENSITY a decimal in
 * (0, 1]: 0*\.[0-9]*[1-9][0-9]* or 0*1(\.0+)?. */
static int codec_valid(const char *spec)
{
    if (!strcmp(spec, "auto")) return 1;
    char buf[64];
    size_t n = strlen(spec);
    if (n >= sizeof buf) return 0;
    memcpy(buf, spec, n + 1);
    if (n > 5 && !strcmp(buf + n - 5, "+zstd")) buf[n - 5] = '\0';
    static const char *const plain[] = {"none", "fp16", "q8", "lowbit:2", "lowbit:4"};
    for (size_t i = 0; i < sizeof plain / sizeof *plain; i++)
        if (!strcmp(buf, plain[i])) return 1;
    if (strncmp(buf, "topk:", 5)) return 0;
    char *p = buf + 5, *bits = strchr(p, ':');
    if (bits) {
        *bits++ = '\0';
        if (strcmp(bits, "8") && strcmp(bits, "16")) return 0;
    }
    p += strspn(p, "0");
    if (*p == '1') { /* 1, 1.0, ... */
        if (*++p != '.') return !*p;
        size_t zeros = strspn(++p, "0");
        return zeros && !p[zeros];
    }
    if (*p++ != '.') return 0;
    size_t digits = strspn(p, "0123456789");
    if (!digits || p[digits]) return 0;
    return strspn(p, "0") < digits; /* not all zeros */
}

static int read_model(const json_t *spec, job_view *v, cirrus_error *err)
{
    const json_t *model;
    int rc = get_obj(spec, "model", "spec", &model, err);
    if (!rc) rc = get_str(model, "preset", "spec.model", "tiny", 1, &v->preset, err);
    if (!rc) rc = get_int(model, "layers", "spec.model", 1, 1024, 0, &v->layers, err);
    if (!rc) rc = get_int(model, "width", "spec.model", 1, 16384, 0, &v->width, err);
    if (!rc) rc = get_int(model, "heads", "spec.model", 1, 16384, 0, &v->heads, err);
    if (!rc) rc = get_int(model, "context", "spec.model", 1, 65536, 0, &v->context, err);
    if (rc) return rc;
    int p = -1;
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++)
        if (strcmp(presets[i].name, v->preset) == 0) p = (int)i;
    if (p < 0)
        return cirrus_fail(err, CIRRUS_EINVAL,
                           "spec.model.preset '%s' is unknown (known: tiny, small, medium)",
                           v->preset);
    v->n_layer = v->layers ? (int)v->layers : presets[p].layers;
    v->n_context = v->context ? (int)v->context : presets[p].context;
    long long width = v->width ? v->width : presets[p].width;
    long long heads = v->heads ? v->heads : presets[p].heads;
    if (width % heads)
        return cirrus_fail(err, CIRRUS_EINVAL,
                           "spec.model.heads (%lld) must divide spec.model.width (%lld)", heads,
                           width);
    return 0;
}

/* spec.successPolicy: operator All or Any; targetRegions, if set, names regions of the job
 * that run clients (a region without clients could never finish), each once. Checked here
 * too, as the CRD does: the object may come from an older CRD. */
static int check_success_policy(const json_t *spec, const json_t *regions, cirrus_error *err)
{
    const json_t *sp, *targets;
    const char *op;
    int rc = get_obj(spec, "successPolicy", "spec", &sp, err);
    if (!rc) rc = get_str(sp, "operator", "spec.successPolicy", "All", 1, &op, err);
    if (!rc) rc = get_arr(sp, "targetRegions", "spec.successPolicy", &targets, err);
    if (rc) return rc;
    if (strcmp(op, "All") && strcmp(op, "Any"))
        return cirrus_fail(err, CIRRUS_EINVAL, "spec.successPolicy.operator '%s' is not All or "
                           "Any", op);
    size_t k, i;
    const json_t *t, *r;
    json_array_foreach(targets, k, t)
    {
        const char *name = json_string_value(t), *why = "no region of the job has that name";
        json_array_foreach(regions, i, r)
        {
            const char *region = json_string_value(json_object_get(r, "name"));
            const json_t *clients = json_object_get(r, "clients");
            if (name && region && !strcmp(name, region))
                why = !clients || json_integer_value(clients) > 0
                          ? NULL
                          : "that region runs no clients, so it never finishes";
        }
        for (size_t j = 0; j < k && name && !why; j++)
            if (json_equal(t, json_array_get(targets, j))) why = "named twice";
        if (!name || why)
            return cirrus_fail(err, CIRRUS_EINVAL, "spec.successPolicy.targetRegions[%zu]: %s",
                               k, name ? why : "not a string");
    }
    return 0;
}

static int desired_cluster_listed(const job_view *v, const char *name)
{
    size_t i;
    const json_t *c;
    json_array_foreach(v->clusters, i, c)
    {
        const char *n = json_string_value(json_object_get(c, "name"));
        if (n && !strcmp(n, name)) return 1;
    }
    return 0;
}

int desired_endpoint_valid(const char *s)
{
    const char *colon = s ? strrchr(s, ':') : NULL;
    if (!colon || colon == s || colon - s > 255) return 0;
    size_t digits = strspn(colon + 1, "0123456789");
    if (digits < 1 || digits > 5 || colon[1 + digits] || atol(colon + 1) < 1 ||
        atol(colon + 1) > 65535)
        return 0;
    size_t host = (size_t)(colon - s);
    if (s[0] == '[') /* an IPv6 address */
        return host > 2 && s[host - 1] == ']' &&
               strspn(s + 1, "0123456789abcdefABCDEF:.") == host - 2;
    return strspn(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-") == host;
}

/* spec.home: set on the copy of a job that a home cluster's operator wrote here
 * (controller_members.c): the job's identity is the home job's uid. */
static int read_home(const json_t *spec, job_view *v, cirrus_error *err)
{
    const json_t *home, *c;
    size_t i;
    int rc = get_arr(spec, "clusters", "spec", &v->clusters, err);
    json_array_foreach(v->clusters, i, c)
    {
        const char *name = json_string_value(json_object_get(c, "name"));
        const json_t *sec = json_object_get(c, "kubeconfigSecret");
        if (rc) break;
        if (!name || !desired_is_dns1123(name))
            rc = cirrus_fail(err, CIRRUS_EINVAL, "spec.clusters[%zu].name must be a DNS label", i);
        else if (!json_is_string(json_object_get(sec, "name")))
            rc = cirrus_fail(err, CIRRUS_EINVAL,
                             "spec.clusters[%zu].kubeconfigSecret.name is required", i);
    }
    if (!rc) rc = get_obj(spec, "home", "spec", &home, err);
    if (rc || !home) return rc;
    const char *uid;
    if ((rc = req_str(home, "uid", "spec.home", &uid, err)) ||
        (rc = req_str(home, "cluster", "spec.home", &v->home_cluster, err)))
        return rc;
    if (!*uid || strlen(uid) > 64 || strpbrk(uid, " \t\r\n,="))
        return cirrus_fail(err, CIRRUS_EINVAL, "spec.home.uid '%s' is not a job uid", uid);
    if (!desired_is_dns1123(v->home_cluster))
        return cirrus_fail(err, CIRRUS_EINVAL, "spec.home.cluster '%s' is not a DNS label",
                           v->home_cluster);
    const json_t *clusters = json_object_get(spec, "clusters");
    if (json_array_size(clusters))
        return cirrus_fail(err, CIRRUS_EINVAL,
                           "spec.clusters must be empty in a copy (spec.home is set)");
    v->job_id = uid;
    return 0;
}

int desired_read_job(const json_t *job, job_view *v, const json_t **regions, cirrus_error *err)
{
    memset(v, 0, sizeof *v);
    if (!json_is_object(job)) return cirrus_fail(err, CIRRUS_EINVAL, "SwarmJob: not an object");
    const json_t *meta, *spec, *o;
    long long x;
    int rc = get_obj(job, "metadata", "", &meta, err);
    if (!rc && !meta) rc = cirrus_fail(err, CIRRUS_EINVAL, "metadata is required");
    if (!rc) rc = req_str(meta, "name", "metadata", &v->name, err);
    if (!rc) rc = req_str(meta, "namespace", "metadata", &v->ns, err);
    if (!rc) rc = req_str(meta, "uid", "metadata", &v->uid, err);
    if (rc) return rc;
    v->job_id = v->uid;
    if (!desired_is_dns1035(v->name))
        return cirrus_fail(err, CIRRUS_EINVAL,
                           "metadata.name '%s' must be a DNS label (lowercase letters, digits "
                           "and '-', starting with a letter)",
                           v->name);
    if (!desired_is_dns1123(v->ns))
        return cirrus_fail(err, CIRRUS_EINVAL, "metadata.namespace '%s' is not a DNS label",
                           v->ns);
    rc = get_obj(job, "spec", "", &spec, err);
    if (!rc && !spec) rc = cirrus_fail(err, CIRRUS_EINVAL, "spec is required");
    if (!rc) rc = req_str(spec, "image", "spec", &v->image, err);
    if (!rc) rc = get_str(spec, "imagePullPolicy", "spec", "IfNotPresent", 1, &v->pull_policy, err);
    if (!rc) rc = get_arr(spec, "imagePullSecrets", "spec", &v->pull_secrets, err);
    if (!rc) rc = get_int(spec, "steps", "spec", 1, 1000000000, DESIRED_DEFAULT_STEPS, &v->steps,
                             err);
    if (rc) return rc;
    const json_t *gang = json_object_get(spec, "gangScheduling");
    if (gang && !json_is_null(gang) && !json_is_boolean(gang))
        return cirrus_fail(err, CIRRUS_EINVAL, "spec.gangScheduling must be a boolean");
    v->gang = json_is_true(gang);
    const json_t *queue = json_object_get(json_object_get(meta, "labels"), DESIRED_KUEUE_QUEUE);
    if (queue && (!json_is_string(queue) || !desired_is_dns1123(json_string_value(queue))))
        return cirrus_fail(err, CIRRUS_EINVAL, "metadata.labels[%s] must be a DNS label",
                           DESIRED_KUEUE_QUEUE);
    v->queue_name = json_string_value(queue);
    const json_t *susp = json_object_get(spec, "suspend");
    if (susp && !json_is_null(susp) && !json_is_boolean(susp))
        return cirrus_fail(err, CIRRUS_EINVAL, "spec.suspend must be a boolean");
    v->suspend = json_is_true(susp);
    if ((rc = read_home(spec, v, err))) return rc;
    if ((rc = read_model(spec, v, err))) return rc;

    if ((rc = get_obj(spec, "pipeline", "spec", &o, err)) ||
        (rc = get_int(o, "stages", "spec.pipeline", 1, 64, 1, &x, err)))
        return rc;
    v->stages = (int)x;
    if ((rc = get_int(spec, "peersPerStage", "spec", 1, 256, 0, &x, err))) return rc;
    v->peers_per_stage = (int)x;
    if (v->stages > v->n_layer)
        return cirrus_fail(err, CIRRUS_EINVAL,
                           "spec.pipeline.stages (%d) exceeds the model's %d layers", v->stages,
                           v->n_layer);

    if ((rc = get_obj(spec, "data", "spec", &o, err)) ||
        (rc = get_int(o, "batchSize", "spec.data", 1, 65536, 8, &v->batch, err)) ||
        (rc = get_int(o, "sequenceLength", "spec.data", 1, 65536, 0, &v->seq, err)) ||
        (rc = get_int(o, "seed", "spec.data", 0, INT64_MAX, 1337, &v->seed, err)) ||
        (rc = get_str(o, "path", "spec.data", NULL, 1, &v->data_path, err)) ||
        (rc = get_str(o, "claimName", "spec.data", NULL, 1, &v->data_claim, err)))
        return rc;
    if (v->seq > v->n_context)
        return cirrus_fail(err, CIRRUS_EINVAL,
                           "spec.data.sequenceLength (%lld) exceeds the model's context (%d)",
                           v->seq, v->n_context);

    const json_t *vol = NULL;
    if ((rc = get_obj(spec, "checkpoint", "spec", &o, err)) ||
        (rc = get_int(o, "every", "spec.checkpoint", 1, 1000000000, 100, &v->ckpt_every, err)) ||
        (rc = get_obj(o, "volume", "spec.checkpoint", &vol, err)))
        return rc;
    if (vol && ((rc = req_str(vol, "claimName", "spec.checkpoint.volume", &v->ckpt_claim, err)) ||
                (rc = get_str(vol, "subPath", "spec.checkpoint.volume", NULL, 1,
                              &v->ckpt_subpath, err))))
        return rc;

    if ((rc = get_obj(spec, "gateway", "spec", &o, err)) ||
        (rc = get_str(o, "serviceType", "spec.gateway", "ClusterIP", 1, &v->service_type, err)) ||
        (rc = get_int(o, "port", "spec.gateway", 1, 65535, ROLE_PORT_COORDINATOR, &v->gw_port,
                      err)) ||
        (rc = get_obj(o, "serviceAnnotations", "spec.gateway", &v->svc_annotations, err)) ||
        (rc = get_int(o, "syncEvery", "spec.gateway", 1, 1000000, 100, &v->sync_every, err)) ||
        (rc = get_int(o, "wanPort", "spec.gateway", 1, 65535, DESIRED_DEFAULT_WAN_PORT,
                      &v->wan_port, err)) ||
        (rc = get_str(o, "codec", "spec.gateway", "q8", 1, &v->codec, err)) ||
        (rc = get_int(o, "fragments", "spec.gateway", 1, DESIRED_MAX_FRAGMENTS, 1, &v->fragments,
                      err)) ||
        (rc = get_num(o, "outerLearningRate", "spec.gateway", 0, 1, 10, 0, 0.7, &v->outer_lr,
                      err)) ||
        (rc = get_num(o, "outerMomentum", "spec.gateway", 0, 0, DESIRED_MAX_OUTER_MOMENTUM, 0,
                      0.9, &v->outer_momentum, err)))
        return rc;
    /* The older CRD's name of the lossless codec. */
    if (!strcmp(v->codec, "fp32")) v->codec = "none";
    if (!codec_valid(v->codec))
        return cirrus_fail(err, CIRRUS_EINVAL,
                           "spec.gateway.codec '%s' is not auto, or none, fp16, q8, "
                           "topk:DENSITY[:8|:16] (DENSITY in (0, 1]) or lowbit:2|4, optionally "
                           "followed by +zstd",
                           v->codec);
    if (v->fragments > v->sync_every)
        return cirrus_fail(err, CIRRUS_EINVAL,
                           "spec.gateway.fragments (%lld) must not exceed spec.gateway.syncEvery "
                           "(%lld): each fragment syncs at an inner step of its own",
                           v->fragments, v->sync_every);
    /* The gateway's Service has the ports coord (port), http and wan; its container listens
     * on ROLE_PORT_COORDINATOR, ROLE_PORT_HTTP and wanPort. */
    if (v->gw_port == ROLE_PORT_HTTP)
        return cirrus_fail(err, CIRRUS_EINVAL,
                           "spec.gateway.port must not be %d (the gateway's HTTP port)",
                           ROLE_PORT_HTTP);
    if (v->wan_port == v->gw_port || v->wan_port == ROLE_PORT_COORDINATOR ||
        v->wan_port == ROLE_PORT_HTTP)
        return cirrus_fail(err, CIRRUS_EINVAL,
                           "spec.gateway.wanPort (%lld) must differ from spec.gateway.port "
                           "(%lld) and the gateway's own ports %d and %d",
                           v->wan_port, v->gw_port, ROLE_PORT_COORDINATOR, ROLE_PORT_HTTP);

    if ((rc = get_arr(spec, "regions", "spec", regions, err))) return rc;
    if (!*regions || json_array_size(*regions) == 0)
        return cirrus_fail(err, CIRRUS_EINVAL, "spec.regions must list at least one region");
    /* The CRD's maxItems, checked here too: the object may come from an older CRD. */
    if (json_array_size(*regions) > DESIRED_MAX_REGIONS)
        return cirrus_fail(err, CIRRUS_EINVAL, "spec.regions lists %zu regions; at most %d",
                           json_array_size(*regions), DESIRED_MAX_REGIONS);
    v->n_regions = (int)json_array_size(*regions);
    return check_success_policy(spec, *regions, err);
}

int desired_read_region(const job_view *v, const json_t *regions, size_t k, region_view *r,
                       cirrus_error *err)
{
    char path[64], sub[96];
    const json_t *reg = json_array_get(regions, k), *o;
    long long x;
    memset(r, 0, sizeof *r);
    snprintf(path, sizeof path, "spec.regions[%zu]", k);
    if (!json_is_object(reg)) return cirrus_fail(err, CIRRUS_EINVAL, "%s must be an object", path);
    int rc = req_str(reg, "name", path, &r->name, err);
    if (rc) return rc;
    if (!desired_is_dns1123(r->name))
        return cirrus_fail(err, CIRRUS_EINVAL,
                           "%s.name '%s' must be a DNS label (lowercase letters, digits and "
                           "'-', starting and ending with a letter or digit)",
                           path, r->name);
    for (size_t j = 0; j < k; j++) {
        const char *other = json_string_value(json_object_get(json_array_get(regions, j), "name"));
        if (other && strcmp(other, r->name) == 0)
            return cirrus_fail(err, CIRRUS_EINVAL, "%s.name '%s' is also spec.regions[%zu]'s",
                               path, r->name, j);
    }
    snprintf(sub, sizeof sub, "%s.peers", path);
    if ((rc = get_obj(reg, "peers", path, &o, err)) ||
        (rc = get_int(o, "replicas", sub, 1, 256, 2, &x, err)))
        return rc;
    r->replicas = (int)x;
    /* The most peers a stage may have: the operator makes replicas per stage, and the
     * gateway's rebalancing moves no peer into a stage that has max (desired_args.c). */
    if ((rc = get_int(o, "max", sub, 1, 256, r->replicas, &x, err))) return rc;
    if (x < r->replicas)
        return cirrus_fail(err, CIRRUS_EINVAL, "%s.max (%lld) must be >= %s.replicas (%d)", sub,
                           x, sub, r->replicas);
    r->max = (int)x;
    /* spec.peersPerStage (what `kubectl scale` and an autoscaler set) replaces the region's
     * replicas, within its min..max (max unset: no bound). max, the gateway's rebalancing
     * cap, stays the region's own: scaling changes no gateway (its Pod is not replaced). */
    long long min;
    if ((rc = get_int(o, "min", sub, 1, 256, 1, &min, err))) return rc;
    r->min = (int)min;
    if (v->peers_per_stage) {
        if (v->peers_per_stage < min)
            return cirrus_fail(err, CIRRUS_EINVAL, "spec.peersPerStage (%d) is below %s.min (%lld)",
                               v->peers_per_stage, sub, min);
        const json_t *max = json_object_get(o, "max");
        if (json_is_integer(max) && v->peers_per_stage > json_integer_value(max))
            return cirrus_fail(err, CIRRUS_EINVAL, "spec.peersPerStage (%d) exceeds %s.max (%lld)",
                               v->peers_per_stage, sub, (long long)json_integer_value(max));
        r->replicas = v->peers_per_stage;
    }
    if ((rc = get_int(reg, "clients", path, 0, ROLE_MAX_CLIENTS, 1, &x, err))) return rc;
    r->clients = (int)x;
    if ((rc = get_str(reg, "cluster", path, NULL, 1, &r->cluster, err)) ||
        (rc = get_str(reg, "endpoint", path, NULL, 1, &r->endpoint, err)))
        return rc;
    if (r->endpoint && !desired_endpoint_valid(r->endpoint))
        return cirrus_fail(err, CIRRUS_EINVAL, "%s.endpoint '%s' is not HOST:PORT", path,
                           r->endpoint);
    if (r->cluster) {
        if (!desired_is_dns1123(r->cluster))
            return cirrus_fail(err, CIRRUS_EINVAL, "%s.cluster '%s' is not a DNS label", path,
                               r->cluster);
        /* A copy names the clusters of the other regions as the home operator does; a home
         * job, only clusters it can reach. */
        if (!v->home_cluster && !desired_cluster_listed(v, r->cluster))
            return cirrus_fail(err, CIRRUS_EINVAL,
                               "%s.cluster '%s' is not a name in spec.clusters", path,
                               r->cluster);
    }

    snprintf(sub, sizeof sub, "%s.placement", path);
    if ((rc = get_obj(reg, "placement", path, &o, err)) ||
        (rc = get_str(o, "regionLabel", sub, DEFAULT_REGION_LABEL, 1, &r->region_label, err)) ||
        (rc = get_obj(o, "nodeSelector", sub, &r->node_selector, err)) ||
        (rc = get_obj(o, "affinity", sub, &r->affinity, err)) ||
        (rc = get_arr(o, "tolerations", sub, &r->tolerations, err)) ||
        (rc = get_str(o, "priorityClassName", sub, NULL, 1, &r->priority_class, err)))
        return rc;
    const char *key;
    const json_t *val;
    json_object_foreach((json_t *)r->node_selector, key, val) {
        if (!json_is_string(val))
            return cirrus_fail(err, CIRRUS_EINVAL, "%s.nodeSelector[\"%s\"] must be a string",
                               sub, key);
        if (strcmp(key, r->region_label) == 0 && strcmp(json_string_value(val), r->name) != 0)
            return cirrus_fail(err, CIRRUS_EINVAL,
                               "%s.nodeSelector selects %s=%s, another region than '%s'", sub,
                               key, json_string_value(val), r->name);
    }

    snprintf(sub, sizeof sub, "%s.resources", path);
    if ((rc = get_obj(reg, "resources", path, &o, err)) ||
        (rc = get_obj(o, "peer", sub, &r->res_peer, err)) ||
        (rc = get_obj(o, "client", sub, &r->res_client, err)) ||
        (rc = get_obj(o, "gateway", sub, &r->res_gateway, err)))
        return rc;
    return 0;
}
