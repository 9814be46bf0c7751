/* desired: see desired.h. */
#include "desired.h"

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/model_presets.h"
#include "../common/role_args.h"
#include "desired_args.h"
#include "desired_cpu.h"

#define DEFAULT_REGION_LABEL "topology.kubernetes.io/region"
#define SECRET_SUFFIX "-pki"

/* The model presets (common/model_presets.h, shared with the trainer). */
static const struct {
    const char *name;
    int layers, width, heads, context;
} presets[] = {
#define PRESET(name, layers, width, heads, context) {#name, layers, width, heads, context},
    CIRRUS_MODEL_PRESETS(PRESET)
#undef PRESET
};

/* ---- names ---- */

/* A DNS-1035 label: [a-z]([-a-z0-9]*[a-z0-9])?, at most 63 characters. */
static int is_dns1035(const char *s)
{
    size_t n = strlen(s);
    if (n < 1 || n > CIRRUS_NAME_MAX || s[0] < 'a' || s[0] > 'z' || s[n - 1] == '-') return 0;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= '0' && s[i] <= '9') || s[i] == '-'))
            return 0;
    return 1;
}

/* A DNS-1123 label: [a-z0-9]([-a-z0-9]*[a-z0-9])?, at most 63 characters. */
static int is_dns1123(const char *s)
{
    size_t n = strlen(s);
    if (n < 1 || n > CIRRUS_NAME_MAX || s[0] == '-' || s[n - 1] == '-') return 0;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= '0' && s[i] <= '9') || s[i] == '-'))
            return 0;
    return 1;
}

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
    if (!is_dns1035(tmp))
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

int desired_name_secret(char *buf, size_t size, const char *job, cirrus_error *err)
{
    return make_name(buf, size, err, "%s" SECRET_SUFFIX, job);
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
 * none, fp16, q8, lowbit:2, lowbit:4 or topk:DENSITY[:8|:16], each optionally followed by
 * +zstd, DENSITY a decimal in (0, 1]: 0*\.[0-9]*[1-9][0-9]* or 0*1(\.0+)?. */
static int codec_valid(const char *spec)
{
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

static int read_job(const json_t *job, job_view *v, const json_t **regions, cirrus_error *err)
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
    if (!is_dns1035(v->name))
        return cirrus_fail(err, CIRRUS_EINVAL,
                           "metadata.name '%s' must be a DNS label (lowercase letters, digits "
                           "and '-', starting with a letter)",
                           v->name);
    if (!is_dns1123(v->ns))
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
    const json_t *susp = json_object_get(spec, "suspend");
    if (susp && !json_is_null(susp) && !json_is_boolean(susp))
        return cirrus_fail(err, CIRRUS_EINVAL, "spec.suspend must be a boolean");
    v->suspend = json_is_true(susp);
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
        (rc = get_num(o, "outerLearningRate", "spec.gateway", 0, 1, 10, 0, 0.7, &v->outer_lr,
                      err)) ||
        (rc = get_num(o, "outerMomentum", "spec.gateway", 0, 0, DESIRED_MAX_OUTER_MOMENTUM, 0,
                      0.9, &v->outer_momentum, err)))
        return rc;
    /* The older CRD's name of the lossless codec. */
    if (!strcmp(v->codec, "fp32")) v->codec = "none";
    if (!codec_valid(v->codec))
        return cirrus_fail(err, CIRRUS_EINVAL,
                           "spec.gateway.codec '%s' is not none, fp16, q8, topk:DENSITY[:8|:16] "
                           "(DENSITY in (0, 1]) or lowbit:2|4, optionally followed by +zstd",
                           v->codec);
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
    return 0;
}

static int read_region(const job_view *v, const json_t *regions, size_t k, region_view *r,
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
    if (!is_dns1123(r->name))
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
    if ((rc = get_int(reg, "clients", path, 0, 256, 1, &x, err))) return rc;
    r->clients = (int)x;

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
    json_object_set_new(json_object_get(pod, "metadata"), "annotations",
                        json_pack("{s:s}", CIRRUS_ANNOT_SPEC_HASH, hash));
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

static int build_service(const job_view *v, const region_view *r, const char *gw,
                         desired_job *d, cirrus_error *err)
{
    json_t *svc = object_new(v, "v1", "Service", gw,
                             labels_new(v, r->name, CIRRUS_ROLE_GATEWAY, -1, -1));
    json_t *spec = json_pack(
        "{s:s, s:{s:s, s:s, s:s}, s:[{s:s, s:s, s:i, s:s}, {s:s, s:s, s:i, s:s}]}", "type",
        v->service_type, "selector", CIRRUS_LABEL_JOB, v->name, CIRRUS_LABEL_REGION, r->name,
        CIRRUS_LABEL_ROLE, CIRRUS_ROLE_GATEWAY, "ports", "name", "coord", "protocol", "TCP",
        "port", (int)v->gw_port, "targetPort", "coord", "name", "http", "protocol", "TCP",
        "port", ROLE_PORT_HTTP, "targetPort", "http");
    /* With several regions, the other regions' gateways reach this one on "wan". */
    if (spec && desired_outer(v) &&
        json_array_append_new(json_object_get(spec, "ports"),
                              json_pack("{s:s, s:s, s:i, s:s}", "name", "wan", "protocol",
                                        "TCP", "port", (int)v->wan_port, "targetPort", "wan"))) {
        json_decref(spec);
        spec = NULL;
    }
    if (!svc || !spec) {
        json_decref(svc);
        json_decref(spec);
        return cirrus_fail(err, CIRRUS_ENOMEM, "building service %s: out of memory", gw);
    }
    if (v->svc_annotations)
        json_object_set_new(json_object_get(svc, "metadata"), "annotations",
                            json_deep_copy(v->svc_annotations));
    json_object_set_new(svc, "spec", spec);
    return json_object_set_new(d->services, gw, svc) ? CIRRUS_ENOMEM : 0;
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
    snprintf(coord, sizeof coord, "%s.%s.svc:%lld", gw, v->ns, v->gw_port);
    if ((rc = build_gateway(v, r, gw, secret, d, err))) return rc;
    for (int s = 0; s < v->stages; s++)
        for (int i = 0; i < r->replicas; i++)
            if ((rc = build_peer(v, r, coord, s, i, d, err))) return rc;
    for (int i = 0; i < r->clients; i++)
        if ((rc = build_client(v, r, coord, i, d, err))) return rc;
    return 0;
}

int desired_build(const json_t *job, desired_job *out, cirrus_error *err)
{
    memset(out, 0, sizeof *out);
    job_view v;
    const json_t *regions = NULL;
    int rc = read_job(job, &v, &regions, err);
    if (rc) return rc;
    char secret[CIRRUS_NAME_MAX + 1];
    if ((rc = desired_name_secret(secret, sizeof secret, v.name, err))) return rc;
    desired_job d = {json_object(), json_object(),
                     object_new(&v, "v1", "Secret", secret, labels_new(&v, NULL, NULL, -1, -1))};
    if (!d.pods || !d.services || !d.secret) {
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
        rc = read_region(&v, regions, k, &r, err);
        if (rc) break;
        pods += 1 + (long long)v.stages * r.replicas + r.clients;
        v.region_names[k] = r.name; /* every gateway lists every region's */
        /* A region's outer step is taken by its one client (trainer/cmd/client.c refuses
         * --sync-every with --clients > 1), and a region without one has no inner steps. */
        if (desired_outer(&v) && r.clients != 1)
            rc = cirrus_fail(err, CIRRUS_EINVAL,
                             "spec.regions[%zu].clients is %d: with more than one region "
                             "every region must have exactly 1 client (several clients per "
                             "region cannot yet take part in outer steps)",
                             k, r.clients);
    }
    if (!rc && pods > DESIRED_MAX_PODS)
        rc = cirrus_fail(err, CIRRUS_EINVAL,
                         "the job asks for %lld Pods (a gateway, stages x peers.replicas peers "
                         "and clients per region); at most %d",
                         pods, DESIRED_MAX_PODS);
    for (size_t k = 0; k < json_array_size(regions) && !rc; k++) {
        region_view r;
        rc = read_region(&v, regions, k, &r, err);
        if (!rc) rc = build_region(&v, &r, secret, &d, err);
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
    json_decref(d->secret);
    d->pods = d->services = d->secret = NULL;
}

json_t *desired_gateway_dns_names(const json_t *job, const char *region)
{
    const json_t *meta = json_object_get(job, "metadata");
    const char *name = json_string_value(json_object_get(meta, "name"));
    const char *ns = json_string_value(json_object_get(meta, "namespace"));
    char gw[CIRRUS_NAME_MAX + 1];
    if (!name || !ns || !region || !is_dns1035(name) || !is_dns1123(ns) || !is_dns1123(region) ||
        desired_name_gateway(gw, sizeof gw, name, region, NULL))
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
