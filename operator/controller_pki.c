/* controller_pki: a job's PKI (controller_internal.h; docs/ARCHITECTURE.md, "Regions in
 * several clusters"): the job Secret, with the job's CA and its gateways' keys and
 * certificates, made once and never re-keyed under running gateways.
 *
 * A job in one cluster: its Secret gets the CA's certificate and every region's gateway key
 * and certificate at once, and the CA's key is dropped: nobody can issue another
 * certificate for the job later.
 *
 * Regions in several clusters: no private key crosses a cluster boundary. The home makes
 * the CA and its own regions' keys; it keeps the CA's key in its Secret (ca.key) for as long
 * as the job lives, because a member may have to ask again (its copy, and with it its
 * Secret, deleted and made anew). A member's operator makes its regions' keys in the copy's
 * Secret, each with a certificate request (R.csr, certs_make_request), and shows the
 * requests not yet answered in the copy's status (certificateRequests). At its next poll
 * the home signs each request of a region that member runs (the identity is the home's,
 * cirrus://UID/R with the region's Service names; what the request asks for is not read),
 * keeps the certificate in its own Secret (R.crt, no key) and writes it, and the CA's
 * certificate, into the copy's spec.home; the member's operator adds them to its Secret,
 * and only then makes that region's gateway. A certificate is only ever added for the key
 * it certifies (certs_request_matches), so a stale one is never mounted.
 */
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/certs.h"
#include "../common/log.h"
#include "controller_internal.h"

static char *base64(const char *s)
{
    size_t n = strlen(s);
    char *out = malloc(4 * ((n + 2) / 3) + 1);
    if (out) EVP_EncodeBlock((unsigned char *)out, (const unsigned char *)s, (int)n);
    return out;
}

/* The PEM under key in a Secret's data (base64), NUL-terminated and malloc'd; NULL when
 * absent or not base64. */
static char *pem_at(const json_t *data, const char *key)
{
    const char *b64 = json_string_value(json_object_get(data, key));
    unsigned char *bin = NULL;
    size_t len = 0;
    cirrus_error ignored = {0};
    if (!b64 || kube_base64_decode(b64, strlen(b64), &bin, &len, &ignored)) return NULL;
    bin[len] = '\0'; /* kube_base64_decode leaves room for it */
    return (char *)bin;
}

static int set_pem(json_t *data, const char *key, const char *pem, cirrus_error *err)
{
    char *b = base64(pem);
    if (!b || json_object_set_new(data, key, json_string(b))) {
        free(b);
        return cirrus_fail(err, CIRRUS_ENOMEM, "out of memory");
    }
    free(b);
    return 0;
}

/* "REGION.EXT", a key of the Secret's data (regions are DNS labels: they fit; one that
 * does not names no key). */
static void key_name(char *buf, size_t size, const char *region, const char *ext)
{
    if (snprintf(buf, size, "%s.%s", region, ext) >= (int)size) buf[0] = '\0';
}

/* ---- the Secret's contents ----------------------------------------------------------------- */

/* Region's gateway DNS names (at most GATEWAY_NAMES_MAX) into names, pointing into *dns,
 * which the caller releases; the count, 0 where the job names none. */
#define GATEWAY_NAMES_MAX 8
static size_t gateway_names(const json_t *job, const char *region, json_t **dns,
                            const char *names[GATEWAY_NAMES_MAX])
{
    *dns = desired_gateway_dns_names(job, region);
    size_t n = 0;
    for (; *dns && n < json_array_size(*dns) && n < GATEWAY_NAMES_MAX; n++)
        names[n] = json_string_value(json_array_get(*dns, n));
    return n;
}

/* Region's gateway key and certificate, issued by ca, into data. */
static int add_leaf(const json_t *job, const certs_pair *ca, const char *region, json_t *data,
                    cirrus_error *err)
{
    json_t *dns;
    const char *names[GATEWAY_NAMES_MAX];
    const size_t n = gateway_names(job, region, &dns, names);
    certs_pair leaf = {0};
    /* The leaf names its job and region (URI SAN cirrus://<job>/<region>), which the
     * gateways check on every WAN connection: the job as the pods know it (--job is the
     * job's uid, unique where names are reused). */
    int rc = n ? certs_make_leaf(ca, meta_str(job, "uid"), region, names[0], names, n,
                                 CONTROLLER_CERT_DAYS, &leaf, err)
               : cirrus_fail(err, CIRRUS_EINVAL, "no DNS names for region %s", region);
    json_decref(dns);
    char crt[96], key[96];
    key_name(crt, sizeof crt, region, "crt");
    key_name(key, sizeof key, region, "key");
    if (!rc) rc = set_pem(data, crt, leaf.cert_pem, err);
    if (!rc) rc = set_pem(data, key, leaf.key_pem, err);
    certs_pair_free(&leaf);
    return rc;
}

/* A home job's Secret: the CA's certificate, and a key and certificate for each region
 * this cluster runs; with member clusters also the CA's key (see the top). */
static json_t *home_data(const json_t *job, cirrus_error *err)
{
    certs_pair ca = {0};
    json_t *data = json_object();
    int rc = data ? certs_make_ca(meta_str(job, "name"), CONTROLLER_CERT_DAYS, &ca, err)
                  : cirrus_fail(err, CIRRUS_ENOMEM, "out of memory");
    if (!rc) rc = set_pem(data, "ca.crt", ca.cert_pem, err);
    if (!rc && ctl_has_members(job)) rc = set_pem(data, "ca.key", ca.key_pem, err);
    size_t i;
    const json_t *r;
    json_array_foreach(json_object_get(json_object_get(job, "spec"), "regions"), i, r)
    {
        if (rc) break;
        if (json_object_get(r, "cluster")) continue; /* its key is made where it runs */
        rc = add_leaf(job, &ca, json_string_value(json_object_get(r, "name")), data, err);
    }
    certs_pair_free(&ca);
    if (rc) {
        json_decref(data);
        return NULL;
    }
    return data;
}

/* A copy's Secret: a key and a certificate request for each region this cluster runs (the
 * copy's regions without a cluster). */
static json_t *copy_data(const json_t *job, cirrus_error *err)
{
    json_t *data = json_object();
    int rc = data ? 0 : cirrus_fail(err, CIRRUS_ENOMEM, "out of memory");
    size_t i;
    const json_t *r;
    json_array_foreach(json_object_get(json_object_get(job, "spec"), "regions"), i, r)
    {
        const char *region = json_string_value(json_object_get(r, "name"));
        if (rc || json_object_get(r, "cluster") || !region) continue;
        certs_pair req = {0};
        char csr[96], key[96];
        key_name(csr, sizeof csr, region, "csr");
        key_name(key, sizeof key, region, "key");
        rc = certs_make_request(region, &req, err);
        if (!rc) rc = set_pem(data, csr, req.cert_pem, err);
        if (!rc) rc = set_pem(data, key, req.key_pem, err);
        certs_pair_free(&req);
    }
    if (rc) {
        json_decref(data);
        return NULL;
    }
    return data;
}

/* What m keeps of the Secret's data: only for jobs spanning clusters (the home signs with
 * it, a copy compares certificates with it); a job in one cluster keeps nothing. */
static void remember(job_mem *m, const json_t *job, const json_t *data)
{
    json_decref(m->pki);
    m->pki = NULL;
    if (data && (ctl_is_copy(job) || ctl_has_members(job))) m->pki = json_deep_copy(data);
}

static int secret_path(const json_t *job, const char *name, char *path, char *coll,
                       cirrus_error *err)
{
    if (child_path(path, job, "secrets", name) || (coll && child_path(coll, job, "secrets", NULL)))
        return cirrus_fail(err, CIRRUS_EINVAL, "secret path too long");
    return 0;
}

/* Whether obj's controller is the job of that uid. */
static int owned_by(const json_t *obj, const char *uid)
{
    size_t i;
    const json_t *o;
    json_array_foreach(json_object_get(json_object_get(obj, "metadata"), "ownerReferences"), i, o)
    {
        const char *u = json_string_value(json_object_get(o, "uid"));
        if (u && uid && !strcmp(u, uid)) return 1;
    }
    return 0;
}

/* The certificates the home wrote into the copy's spec.home for this cluster's regions,
 * added to its Secret where they certify its keys (a merge patch of data alone). */
static int take_certificates(controller *ctl, const json_t *job, job_mem *m, const char *path,
                             cirrus_error *err)
{
    const json_t *home = json_object_get(json_object_get(job, "spec"), "home");
    const json_t *certs = json_object_get(home, "certificates");
    const char *ca = json_string_value(json_object_get(home, "caCertificate"));
    json_t *add = json_object();
    int rc = add ? 0 : cirrus_fail(err, CIRRUS_ENOMEM, "out of memory");
    const char *region;
    const json_t *v;
    json_object_foreach((json_t *)certs, region, v)
    {
        char crt[96], csr[96];
        key_name(crt, sizeof crt, region, "crt");
        key_name(csr, sizeof csr, region, "csr");
        const char *pem = json_string_value(v);
        char *have = pem_at(m->pki, crt);
        const int known = have && pem && !strcmp(have, pem); /* every reconcile after */
        free(have);
        if (known || !pem || !ca) continue;
        char *req = pem_at(m->pki, csr);
        cirrus_error why = {0};
        const int fresh = req && certs_request_matches(pem, req, &why) == 1;
        free(req);
        if (!rc && fresh) rc = set_pem(add, crt, pem, err);
    }
    if (!rc && json_object_size(add)) {
        rc = set_pem(add, "ca.crt", ca, err);
        json_t *patch = rc ? NULL : json_pack("{s:O}", "data", add);
        if (!rc) rc = patch ? kube_patch_merge(ctl->client, path, patch, NULL, err)
                            : cirrus_fail(err, CIRRUS_ENOMEM, "out of memory");
        json_decref(patch);
        if (!rc) {
            json_object_update(m->pki, add);
            ctl_event(ctl, job, 0, "CertificatesIssued",
                      "gateway certificates from home cluster %s added to secret %s",
                      json_string_value(json_object_get(home, "cluster")),
                      strrchr(path, '/') + 1);
        }
    }
    json_decref(add);
    return rc;
}

int ctl_ensure_secret(controller *ctl, const json_t *job, job_mem *m, const json_t *skeleton,
                      int recheck, cirrus_error *err)
{
    const char *name = meta_str(skeleton, "name");
    char path[PATH_MAX_LEN], coll[PATH_MAX_LEN];
    const int copy = ctl_is_copy(job);
    int rc = secret_path(job, name, path, coll, err);
    if (rc) return rc;
    m->secret_pending = 0;
    if (!(m->secret_ok && !recheck)) {
        /* Certificates must never be regenerated under running gateways: ask before making. */
        json_t *have = NULL;
        rc = kube_get(ctl->client, path, &have, err);
        if (!rc && !owned_by(have, meta_str(job, "uid"))) {
            /* An earlier job's of the same name (a copy deleted and made again), which the
             * garbage collector has not removed yet: its keys name another job. Nothing
             * mounts it; asked again shortly. */
            json_decref(have);
            remember(m, job, NULL);
            m->secret_ok = 0;
            m->secret_pending = 1;
            return 0;
        }
        if (!rc) remember(m, job, json_object_get(have, "data"));
        json_decref(have);
        m->secret_ok = !rc;
        if (rc && rc != CIRRUS_ENOENT) return rc;
    }
    if (!m->secret_ok) {
        rc = ctl_job_exists(ctl, job, err);
        if (rc <= 0) return rc;
        json_t *secret = json_deep_copy(skeleton);
        json_t *data = !secret ? NULL : copy ? copy_data(job, err) : home_data(job, err);
        rc = !secret ? cirrus_fail(err, CIRRUS_ENOMEM, "out of memory")
             : !data ? (err->code ? err->code : CIRRUS_ENOMEM)
                     : 0;
        if (!rc) json_object_set(secret, "data", data);
        if (!rc) rc = kube_create(ctl->client, coll, secret, NULL, err);
        json_decref(secret);
        if (!rc) {
            remember(m, job, data);
            ctl_event(ctl, job, 0, copy ? "CertificatesRequested" : "CertificatesIssued",
                      copy ? "gateway keys and certificate requests in %s"
                           : "job CA and gateway certificates in %s",
                      name);
        }
        json_decref(data);
        if (rc == CIRRUS_ECONFLICT) { /* AlreadyExists: someone made it meanwhile */
            json_t *have = NULL;
            rc = kube_get(ctl->client, path, &have, err);
            if (!rc) remember(m, job, json_object_get(have, "data"));
            json_decref(have);
        }
        if (rc) return rc;
        m->secret_ok = 1;
    }
    return copy && m->pki ? take_certificates(ctl, job, m, path, err) : 0;
}

/* ---- across clusters ------------------------------------------------------------------------ */

json_t *ctl_copy_cert_requests(const json_t *job, const job_mem *m)
{
    if (!ctl_is_copy(job) || !m->pki) return NULL;
    json_t *out = json_object();
    const char *key;
    const json_t *v;
    json_object_foreach((json_t *)m->pki, key, v)
    {
        const size_t n = strlen(key);
        if (!out || n < 5 || strcmp(key + n - 4, ".csr")) continue;
        char region[96], crt[96];
        snprintf(region, sizeof region, "%.*s", (int)(n - 4), key);
        key_name(crt, sizeof crt, region, "crt");
        if (json_object_get(m->pki, crt)) continue; /* answered */
        char *pem = pem_at(m->pki, key);
        if (pem) json_object_set_new(out, region, json_string(pem));
        free(pem);
    }
    return out;
}

void ctl_gate_gateways(const json_t *job, const job_mem *m, desired_job *d)
{
    const int copy = ctl_is_copy(job);
    if (!copy && !m->secret_pending) return;
    const char *pname;
    json_t *pod;
    void *tmp;
    json_object_foreach_safe(d->pods, tmp, pname, pod)
    {
        const json_t *labels = json_object_get(json_object_get(pod, "metadata"), "labels");
        const char *role = json_string_value(json_object_get(labels, CIRRUS_LABEL_ROLE));
        const char *region = json_string_value(json_object_get(labels, CIRRUS_LABEL_REGION));
        if (!role || strcmp(role, CIRRUS_ROLE_GATEWAY) || !region) continue;
        char crt[96];
        key_name(crt, sizeof crt, region, "crt");
        if (!m->secret_pending && m->pki && json_object_get(m->pki, crt)) continue;
        if (!d->waiting[0] && m->secret_pending) {
            snprintf(d->waiting, sizeof d->waiting,
                     "waiting for an earlier job's Secret of this name to be removed");
            d->waiting_reason = "WaitingForSecret";
        } else if (!d->waiting[0]) {
            snprintf(d->waiting, sizeof d->waiting,
                     "waiting for region %s's gateway certificate (its request is signed in "
                     "the home cluster)",
                     region);
            d->waiting_reason = "WaitingForCertificate";
        }
        json_object_del(d->pods, pname);
    }
}

/* The Secret of a home job with member clusters, as m knows it (read once). */
static int home_pki(controller *ctl, const json_t *job, job_mem *m, cirrus_error *err)
{
    if (m->pki) return 0;
    char name[CIRRUS_NAME_MAX + 1], path[PATH_MAX_LEN];
    json_t *have = NULL;
    int rc = desired_name_secret(name, sizeof name, meta_str(job, "name"), err);
    if (!rc) rc = secret_path(job, name, path, NULL, err);
    if (!rc) rc = kube_get(ctl->client, path, &have, err);
    if (!rc) remember(m, job, json_object_get(have, "data"));
    json_decref(have);
    return rc;
}

/* Region's request signed with the job's CA, the certificate into the home Secret. */
static int sign_one(controller *ctl, const json_t *job, job_mem *m, const char *region,
                    const char *csr, cirrus_error *err)
{
    certs_pair ca = {pem_at(m->pki, "ca.crt"), pem_at(m->pki, "ca.key")};
    json_t *dns;
    const char *names[GATEWAY_NAMES_MAX];
    const size_t n = gateway_names(job, region, &dns, names);
    char *cert = NULL, crt[96], name[CIRRUS_NAME_MAX + 1], path[PATH_MAX_LEN];
    int rc = ca.cert_pem && ca.key_pem
                 ? 0
                 : cirrus_fail(err, CIRRUS_EINVAL, "the job Secret keeps no CA key (made by an "
                               "operator that did not keep it): region %s's request cannot be "
                               "signed", region);
    if (!rc && !n) rc = cirrus_fail(err, CIRRUS_EINVAL, "no DNS names for region %s", region);
    if (!rc)
        rc = certs_sign_request(&ca, csr, meta_str(job, "uid"), region, names[0], names, n,
                                CONTROLLER_CERT_DAYS, &cert, err);
    json_decref(dns);
    certs_pair_free(&ca);
    key_name(crt, sizeof crt, region, "crt");
    json_t *add = json_object();
    if (!rc) rc = add ? set_pem(add, crt, cert, err) : cirrus_fail(err, CIRRUS_ENOMEM, "oom");
    if (!rc) rc = desired_name_secret(name, sizeof name, meta_str(job, "name"), err);
    if (!rc) rc = secret_path(job, name, path, NULL, err);
    json_t *patch = rc ? NULL : json_pack("{s:O}", "data", add);
    if (!rc) rc = patch ? kube_patch_merge(ctl->client, path, patch, NULL, err)
                        : cirrus_fail(err, CIRRUS_ENOMEM, "out of memory");
    if (!rc) json_object_update(m->pki, add);
    json_decref(patch);
    json_decref(add);
    free(cert);
    return rc;
}

int ctl_issue_member_certs(controller *ctl, const json_t *job, job_mem *m, const char *member,
                           cirrus_error *err)
{
    const json_t *reqs =
        json_object_get(json_object_get(m->member_status, member), "certificateRequests");
    if (!json_object_size(reqs)) return 0;
    int rc = home_pki(ctl, job, m, err);
    const char *region;
    const json_t *v;
    json_object_foreach((json_t *)reqs, region, v)
    {
        if (rc) break;
        /* Only a region that member runs: a copy cannot ask for another cluster's. */
        const char *cl = json_string_value(json_object_get(
            ctl_spec_region(json_object_get(job, "spec"), region), "cluster"));
        const char *csr = json_string_value(v);
        char crt[96];
        key_name(crt, sizeof crt, region, "crt");
        char *have = pem_at(m->pki, crt);
        cirrus_error why = {0};
        const int answered = have && csr && certs_request_matches(have, csr, &why) == 1;
        free(have);
        if (answered) continue; /* in the copy's spec already, or at the next apply */
        if (!cl || strcmp(cl, member) || !csr) {
            log_warn("%s: cluster %s asks for a certificate of region %s, which it does not run",
                     m->key, member, region);
            continue;
        }
        /* A request that does not verify is the member's to make again: said, not retried
         * into a failure of the whole poll. */
        if ((rc = sign_one(ctl, job, m, region, csr, &why))) {
            if (rc == CIRRUS_EINVAL) {
                log_warn("%s: region %s's certificate request refused: %s", m->key, region,
                         why.msg);
                rc = 0;
            } else {
                *err = why;
            }
            continue;
        }
        ctl_event(ctl, job, 0, "CertificateIssued",
                  "gateway certificate of region %s (cluster %s) signed from its request",
                  region, member);
    }
    return rc;
}

void ctl_copy_pki(const json_t *job, const job_mem *m, const char *member, json_t *home)
{
    if (!m->pki) return;
    char *ca = pem_at(m->pki, "ca.crt");
    json_t *certs = json_object();
    size_t i;
    const json_t *r;
    json_array_foreach(json_object_get(json_object_get(job, "spec"), "regions"), i, r)
    {
        const char *cl = json_string_value(json_object_get(r, "cluster"));
        const char *region = json_string_value(json_object_get(r, "name"));
        char crt[96];
        if (!cl || strcmp(cl, member) || !region || !certs) continue;
        key_name(crt, sizeof crt, region, "crt");
        char *pem = pem_at(m->pki, crt);
        if (pem) json_object_set_new(certs, region, json_string(pem));
        free(pem);
    }
    if (ca && json_object_size(certs)) {
        json_object_set_new(home, "caCertificate", json_string(ca));
        json_object_set_new(home, "certificates", certs);
    } else {
        json_decref(certs);
    }
    free(ca);
}
