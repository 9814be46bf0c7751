/* controller_children: a job's children other than its pods and its Secret
 * (controller_internal.h; the Secret: controller_pki.c): the regions' gateway Services and,
 * with spec.gangScheduling, their gang PodGroups. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "controller_internal.h"

/* ---- services ----------------------------------------------------------------------------- */

int ctl_ensure_services(controller *ctl, const json_t *job, const json_t *services,
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
        int ex = ctl_job_exists(ctl, job, err);
        if (ex <= 0) return ex;
        if (child_path(path, job, "services", name))
            return cirrus_fail(err, CIRRUS_EINVAL, "service path too long");
        int rc = kube_apply(ctl->client, path, svc, CONTROLLER_FIELD_MANAGER, NULL, err);
        if (rc) return rc;
    }
    if (applied_gen == generation) return 0;
    /* A Service of the job's no longer wanted (a WAN Service after gateway.serviceType went
     * back to ClusterIP): deleted, once per generation like the applies. */
    const char *key;
    const json_t *have;
    json_object_foreach((json_t *)kube_informer_objects(ctl->services), key, have)
    {
        const char *job_label = label(have, CIRRUS_LABEL_JOB), *n = meta_str(have, "name");
        char path[PATH_MAX_LEN];
        if (!job_label || strcmp(job_label, meta_str(job, "name")) || !n ||
            strcmp(meta_str(have, "namespace") ? meta_str(have, "namespace") : "",
                   meta_str(job, "namespace")) ||
            json_object_get(services, n) || child_path(path, job, "services", n))
            continue;
        int rc = kube_delete(ctl->client, path, NULL, err);
        if (rc && rc != CIRRUS_ENOENT) return rc;
        ctl_event(ctl, job, 0, "ServiceDeleted", "service %s is no longer wanted", n);
    }
    return 0;
}

/* ---- gang PodGroups (spec.gangScheduling) --------------------------------------------------- */

static int64_t gang_min(const json_t *pod_group)
{
    return int_at(json_object_get(json_object_get(pod_group, "spec"), "schedulingPolicy"),
                  "gang", "minCount", -1);
}

/* Make region's PodGroup `want` at path in coll. Under the API server's 404 for the
 * collection: the API is not served. */
static int make_pod_group(controller *ctl, const char *coll, const json_t *want,
                          cirrus_error *err)
{
    int rc = kube_create(ctl->client, coll, want, NULL, err);
    if (rc == CIRRUS_ENOENT)
        return cirrus_fail(err, CIRRUS_ENOENT, "the API server does not serve %s %s: "
                           "spec.gangScheduling needs Kubernetes's gang scheduling (the "
                           "GenericWorkload and GangScheduling feature gates, that API "
                           "version enabled)",
                           DESIRED_POD_GROUP_API, DESIRED_POD_GROUP_RESOURCE);
    return rc == CIRRUS_ECONFLICT ? 0 : rc; /* AlreadyExists: made meanwhile */
}

int ctl_ensure_pod_groups(controller *ctl, const json_t *job, job_mem *m, const json_t *groups,
                          cirrus_error *err)
{
    const int64_t generation = int_at(job, "metadata", "generation", 0);
    if (json_object_size(groups) == 0 || m->pod_groups_gen == generation) return 0;
    int pending = 0; /* a group on its way out: looked at again on every reconcile */
    const char *name;
    json_t *want;
    json_object_foreach((json_t *)groups, name, want)
    {
        char path[PATH_MAX_LEN], coll[PATH_MAX_LEN];
        if (kube_path(path, sizeof path, "apis/" DESIRED_POD_GROUP_API, meta_str(job, "namespace"),
                      DESIRED_POD_GROUP_RESOURCE, name) ||
            kube_path(coll, sizeof coll, "apis/" DESIRED_POD_GROUP_API, meta_str(job, "namespace"),
                      DESIRED_POD_GROUP_RESOURCE, NULL))
            return cirrus_fail(err, CIRRUS_EINVAL, "PodGroup path too long");
        json_t *have = NULL;
        int rc = kube_get(ctl->client, path, &have, err);
        if (!rc && meta_str(have, "deletionTimestamp")) {
            /* Its protection finalizer keeps it while a pod names it. */
            pending = 1;
        } else if (!rc && gang_min(have) != gang_min(want)) {
            /* A new peers.min. A gang's size cannot change in place, and a PodGroup goes
             * only once no pod names it (its finalizer): the region's running pods keep the
             * old one, and the new size is made once they are gone (the job suspended, or
             * every pod of the region replaced), a reconcile after. */
            json_t *pre = json_pack("{s:{s:s}}", "preconditions", "uid", meta_str(have, "uid"));
            rc = kube_delete(ctl->client, path, pre, err);
            json_decref(pre);
            if (!rc || rc == CIRRUS_ENOENT)
                ctl_event(ctl, job, 0, "PodGroupResized", "PodGroup %s: gang minCount %lld -> "
                          "%lld once no pod names the old one (the region's pods replaced, or "
                          "the job suspended)",
                          name, (long long)gang_min(have), (long long)gang_min(want));
            pending = 1;
            rc = rc == CIRRUS_ENOENT ? 0 : rc;
        } else if (rc == CIRRUS_ENOENT) {
            int ex = ctl_job_exists(ctl, job, err);
            if (ex <= 0) {
                json_decref(have);
                return ex;
            }
            rc = make_pod_group(ctl, coll, want, err);
        }
        json_decref(have);
        if (rc) {
            cirrus_error why = *err;
            return cirrus_fail(err, rc, "PodGroup %s: %s", name, why.msg);
        }
    }
    if (!pending) m->pod_groups_gen = generation;
    return 0;
}
