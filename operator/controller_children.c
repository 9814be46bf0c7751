/* controller_children: a job's children other than its pods (controller_internal.h): the
 * job Secret, holding a per-job CA and every region's gateway certificate (made once and
 * never regenerated under running gateways), the regions' gateway Services and, with
 * spec.gangScheduling, their gang PodGroups. */
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/certs.h"
#include "controller_internal.h"

static char *base64(const char *s)
{
    size_t n = strlen(s);
    char *out = malloc(4 * ((n + 2) / 3) + 1);
    if (out) EVP_EncodeBlock((unsigned char *)out, (const unsigned char *)s, (int)n);
    return out;
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

int ctl_ensure_secret(controller *ctl, const json_t *job, job_mem *m, const json_t *skeleton,
                      int recheck, cirrus_error *err)
{
    const char *name = meta_str(skeleton, "name");
    char path[PATH_MAX_LEN], coll[PATH_MAX_LEN];
    /* A copy's Secret comes from its home cluster (controller_members.c), where the job's
     * CA signed its gateways' certificates: none is made here. */
    if (ctl_is_copy(job)) return 0;
    if (m->secret_ok && !recheck) return 0;
    if (child_path(path, job, "secrets", name) || child_path(coll, job, "secrets", NULL))
        return cirrus_fail(err, CIRRUS_EINVAL, "secret path too long");
    /* Certificates must never be regenerated under running gateways: ask before making. */
    int rc = kube_get(ctl->client, path, NULL, err);
    if (!rc) m->secret_ok = 1;
    if (rc != CIRRUS_ENOENT) return rc;
    m->secret_ok = 0;
    rc = ctl_job_exists(ctl, job, err);
    if (rc <= 0) return rc;
    json_t *secret = json_deep_copy(skeleton);
    rc = secret ? fill_secret(job, secret, err) : cirrus_fail(err, CIRRUS_ENOMEM, "out of memory");
    if (!rc) rc = kube_create(ctl->client, coll, secret, NULL, err);
    json_decref(secret);
    if (rc == CIRRUS_ECONFLICT) rc = 0; /* AlreadyExists: someone made it meanwhile */
    else if (!rc)
        ctl_event(ctl, job, 0, "CertificatesIssued", "job CA and gateway certificates in %s",
                  name);
    if (!rc) m->secret_ok = 1;
    return rc;
}

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
