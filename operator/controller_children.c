/* controller_children: a job's children other than its pods (controller_internal.h): the
 * job Secret, holding a per-job CA and every region's gateway certificate (made once and
 * never regenerated under running gateways), and the regions' gateway Services. */
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
    return 0;
}
