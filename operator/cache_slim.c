/* cache_slim: see cache_slim.h. */
#include "cache_slim.h"

#include <string.h>

static json_t *without_managed_fields(json_t *obj)
{
    json_object_del(json_object_get(obj, "metadata"), "managedFields");
    return obj;
}

static void keep_only(json_t *obj, const char *const *keys, size_t n)
{
    const char *k;
    json_t *v, *tmp;
    json_object_foreach_safe(obj, tmp, k, v)
    {
        size_t i = 0;
        while (i < n && strcmp(k, keys[i])) i++;
        if (i == n) json_object_del(obj, k);
    }
}

void cache_slim_job(json_t *job)
{
    /* kubectl apply's copy of the whole spec: nothing here reads a job's annotations. */
    json_t *annotations = json_object_get(json_object_get(job, "metadata"), "annotations");
    json_object_del(annotations, "kubectl.kubernetes.io/last-applied-configuration");
    without_managed_fields(job);
}

/* keep_only on each object of array arr. */
static void keep_only_each(json_t *arr, const char *const *keys, size_t n)
{
    size_t i;
    json_t *v;
    json_array_foreach(arr, i, v)
    {
        if (json_is_object(v)) keep_only(v, keys, n);
    }
}

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

void cache_slim_pod(json_t *pod)
{
    static const char *const top[] = {"apiVersion", "kind", "metadata", "spec", "status"};
    static const char *const meta[] = {"name", "namespace", "uid", "resourceVersion", "labels",
                                       "annotations", "deletionTimestamp"};
    static const char *const spec[] = {"nodeName"};
    /* podstate.c and failpolicy.c read these, and nothing else, of the status. */
    static const char *const status[] = {"phase", "reason", "message", "conditions",
                                         "containerStatuses"};
    static const char *const cond[] = {"type", "status", "reason", "message"};
    static const char *const cs[] = {"name", "ready", "state", "lastState"};
    keep_only(pod, top, N_OF(top));
    json_t *o;
    if (json_is_object(o = json_object_get(pod, "metadata"))) keep_only(o, meta, N_OF(meta));
    if (json_is_object(o = json_object_get(pod, "spec"))) keep_only(o, spec, N_OF(spec));
    if (json_is_object(o = json_object_get(pod, "status"))) {
        keep_only(o, status, N_OF(status));
        keep_only_each(json_object_get(o, "conditions"), cond, N_OF(cond));
        keep_only_each(json_object_get(o, "containerStatuses"), cs, N_OF(cs));
    }
}

void cache_slim_node(json_t *node)
{
    static const char *const top[] = {"apiVersion", "kind", "metadata", "spec", "status"};
    /* The addresses: a NodePort gateway Service is reached at a node's (controller_members.c). */
    static const char *const status[] = {"addresses"};
    keep_only(without_managed_fields(node), top, N_OF(top));
    json_t *o = json_object_get(node, "status");
    if (json_is_object(o)) keep_only(o, status, N_OF(status));
}

void cache_slim_to_metadata(json_t *obj)
{
    static const char *const top[] = {"apiVersion", "kind", "metadata"};
    keep_only(without_managed_fields(obj), top, N_OF(top));
}
