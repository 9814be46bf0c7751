/* The verb helpers and path/key utilities declared in client.h: thin wrappers that fix the
 * method, content type and query of kube_request for each kind of call. */
#include "client.h"

#include <curl/curl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int kube_get(kube_client *c, const char *path, json_t **out, cirrus_error *err)
{
    return kube_request(c, "GET", path, NULL, NULL, NULL, out, err);
}

int kube_create(kube_client *c, const char *collection_path, const json_t *obj, json_t **out,
                cirrus_error *err)
{
    return kube_request(c, "POST", collection_path, obj, NULL, NULL, out, err);
}

int kube_update(kube_client *c, const char *path, const json_t *obj, json_t **out,
                cirrus_error *err)
{
    return kube_request(c, "PUT", path, obj, NULL, NULL, out, err);
}

/* path plus a suffix, or CIRRUS_EINVAL when it does not fit. */
static int path_with(char *buf, size_t size, const char *path, const char *suffix,
                     cirrus_error *err)
{
    if ((size_t)snprintf(buf, size, "%s%s", path, suffix) >= size)
        return cirrus_fail(err, CIRRUS_EINVAL, "path too long: %s", path);
    return 0;
}

int kube_update_status(kube_client *c, const char *path, const json_t *obj, json_t **out,
                       cirrus_error *err)
{
    char p[2048];
    int rc = path_with(p, sizeof p, path, "/status", err);
    return rc ? rc : kube_request(c, "PUT", p, obj, NULL, NULL, out, err);
}

int kube_patch_merge(kube_client *c, const char *path, const json_t *patch, json_t **out,
                     cirrus_error *err)
{
    return kube_request(c, "PATCH", path, patch, KUBE_CT_MERGE_PATCH, NULL, out, err);
}

int kube_apply_path(char *buf, size_t size, const char *path, const char *field_manager,
                    cirrus_error *err)
{
    if (!field_manager || !*field_manager)
        return cirrus_fail(err, CIRRUS_EINVAL, "server-side apply needs a field manager");
    char *fm = curl_easy_escape(NULL, field_manager, 0);
    if (!fm) return cirrus_fail(err, CIRRUS_ENOMEM, "out of memory");
    char q[512];
    snprintf(q, sizeof q, "%cfieldManager=%s&force=true", strchr(path, '?') ? '&' : '?', fm);
    curl_free(fm);
    return path_with(buf, size, path, q, err);
}

int kube_apply(kube_client *c, const char *path, const json_t *obj, const char *field_manager,
               json_t **out, cirrus_error *err)
{
    char p[2048];
    int rc = kube_apply_path(p, sizeof p, path, field_manager, err);
    /* JSON is YAML, so the object goes as is under the apply content type. */
    return rc ? rc : kube_request(c, "PATCH", p, obj, KUBE_CT_APPLY_PATCH, NULL, out, err);
}

int kube_delete(kube_client *c, const char *path, const json_t *options, cirrus_error *err)
{
    return kube_request(c, "DELETE", path, options, NULL, NULL, NULL, err);
}

static int bad_part(const char *s)
{
    return !*s || strpbrk(s, "/?%#&") != NULL;
}

int kube_path(char *buf, size_t size, const char *api, const char *ns, const char *resource,
              const char *name)
{
    if (!api || !*api || !resource || bad_part(resource) || (ns && bad_part(ns)) ||
        (name && bad_part(name)))
        return CIRRUS_EINVAL;
    int n = snprintf(buf, size, "/%s%s%s/%s%s%s", api, ns ? "/namespaces/" : "", ns ? ns : "",
                     resource, name ? "/" : "", name ? name : "");
    return n < 0 || (size_t)n >= size ? CIRRUS_EINVAL : 0;
}

int kube_object_key(const json_t *obj, char *buf, size_t size)
{
    const json_t *md = json_object_get(obj, "metadata");
    const char *ns = json_string_value(json_object_get(md, "namespace"));
    const char *name = json_string_value(json_object_get(md, "name"));
    if (!name || !*name) return CIRRUS_EINVAL;
    int n = ns && *ns ? snprintf(buf, size, "%s/%s", ns, name) : snprintf(buf, size, "%s", name);
    return n < 0 || (size_t)n >= size ? CIRRUS_EINVAL : 0;
}
