/* fuzz_swarmjob: the operator's reading of a SwarmJob as the API server returns it:
 * desired_build (operator/desired.c: spec to child manifests), desired_gateway_dns_names,
 * and jobstatus_build / jobstatus_changed / jobstatus_progress_due (operator/jobstatus.c),
 * which read the job's old .status.
 *
 * Input: a SwarmJob as JSON. Invariants:
 *   desired_build: a refused job leaves the output empty; an accepted one has child names
 *     that are DNS labels of at most 63 characters, every Pod and Service labelled with the
 *     job, at most 16 regions and bounded Pods per region (the CRD's caps);
 *   jobstatus: the status built from the job's old status is an object with a phase, its
 *     regions and conditions; writing it again over itself is no change
 *     (jobstatus_changed(s, s) == 0); the progress deadline is 0 or in the future;
 *   the job JSON is not modified.
 */
#include "fuzz.h"

#include <jansson.h>

#include "../../operator/desired.h"
#include "../../operator/jobstatus.h"

#define NOW "2026-11-22T01:02:03Z"

static int dns_label(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > CIRRUS_NAME_MAX || s[0] == '-' || s[n - 1] == '-') return 0;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= '0' && s[i] <= '9') || s[i] == '-')) return 0;
    return 1;
}

static void check_children(const json_t *set, const char *job)
{
    const char *name;
    json_t *obj;
    json_object_foreach((json_t *)set, name, obj) {
        FUZZ_CHECK(dns_label(name), "child name '%s'", name);
        const json_t *meta = json_object_get(obj, "metadata");
        FUZZ_CHECK(!strcmp(json_string_value(json_object_get(meta, "name")), name), "name differs");
        const char *lj = json_string_value(json_object_get(json_object_get(meta, "labels"), CIRRUS_LABEL_JOB));
        FUZZ_CHECK(lj && !strcmp(lj, job), "child %s not labelled with its job", name);
    }
}

/* A job_observed from the spec's regions, with figures from the input's length. */
static void observe(const json_t *job, size_t salt, job_observed *obs)
{
    memset(obs, 0, sizeof *obs);
    const json_t *regions = json_object_get(json_object_get(job, "spec"), "regions");
    size_t i;
    const json_t *r;
    json_array_foreach(regions, i, r) {
        if (obs->n_regions == JOBSTATUS_MAX_REGIONS) break;
        const char *name = json_string_value(json_object_get(r, "name"));
        if (!name) continue;
        region_observed *ro = &obs->regions[obs->n_regions++];
        ro->name = name;
        ro->n_stages = 1 + (int)(salt % 4);
        ro->replicas = 2;
        ro->min = 1;
        for (int s = 0; s < ro->n_stages; s++) ro->ready[s] = (int)((salt >> s) % 3);
        ro->gateway_ready = (int)(salt & 1);
        ro->has_progress = (int)((salt >> 1) & 1);
        ro->step = (int64_t)salt;
        ro->loss = 2.5;
        ro->tokens_per_s = 1000.0;
        ro->progress_time = ro->has_progress ? 1795222900 : 0;
        ro->watched_since = (salt & 4) ? 1795222800 : 0;
        ro->failing = (salt & 8) ? "unreachable" : NULL;
    }
    obs->backoff_limit = 3;
    obs->suspended = (int)((salt >> 4) & 1);
    obs->generation = 2;
    obs->progress_stale_s = (salt & 32) ? 33 : 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    json_t *job = json_loadb((const char *)data, size, 0, NULL);
    if (!job) return 0;
    json_t *copy = json_deep_copy(job);
    desired_job d;
    cirrus_error err;
    if (desired_build(job, &d, &err) != 0) {
        FUZZ_CHECK(!d.pods && !d.services && !d.secret, "refused job left children");
    } else {
        const char *name = json_string_value(json_object_get(json_object_get(job, "metadata"), "name"));
        check_children(d.pods, name);
        check_children(d.services, name);
        size_t n_regions = json_array_size(json_object_get(json_object_get(job, "spec"), "regions"));
        FUZZ_CHECK(n_regions >= 1 && n_regions <= 16, "%zu regions accepted", n_regions);
        FUZZ_CHECK(json_object_size(d.pods) <= DESIRED_MAX_PODS, "%zu pods", json_object_size(d.pods));
        size_t i;
        const json_t *r;
        json_array_foreach(json_object_get(json_object_get(job, "spec"), "regions"), i, r) {
            json_t *names = desired_gateway_dns_names(job, json_string_value(json_object_get(r, "name")));
            FUZZ_CHECK(names && json_array_size(names) == 4, "no DNS names for an accepted region");
            json_decref(names);
        }
        desired_job_free(&d);
    }
    (void)desired_managed_here(job);
    json_t *dn = desired_gateway_dns_names(job, "r");
    json_decref(dn);

    job_observed obs;
    observe(job, size, &obs);
    const json_t *old = json_object_get(job, "status");
    json_t *st = jobstatus_build(&obs, old, NOW);
    FUZZ_CHECK(json_is_object(st), "no status");
    FUZZ_CHECK(json_string_value(json_object_get(st, "phase")), "status without phase");
    FUZZ_CHECK(json_is_array(json_object_get(st, "conditions")), "status without conditions");
    FUZZ_CHECK(json_array_size(json_object_get(st, "regions")) == (size_t)obs.n_regions, "regions lost");
    FUZZ_CHECK(!jobstatus_changed(st, st), "a status differs from itself");
    (void)jobstatus_changed(old, st);
    int64_t due = jobstatus_progress_due(&obs, st, NOW);
    FUZZ_CHECK(due == 0 || due > jobstatus_parse_time(NOW), "progress due at %lld, in the past", (long long)due);
    const char *pt = json_string_value(json_object_get(json_array_get(json_object_get(old, "regions"), 0), "progressTime"));
    int64_t t = jobstatus_parse_time(pt);
    if (t >= 0) {
        char buf[64];
        jobstatus_format_time(t, buf, sizeof buf);
        FUZZ_CHECK(jobstatus_parse_time(buf) == t, "time %s does not round-trip", buf);
    }
    json_decref(st);
    FUZZ_CHECK(json_equal(job, copy), "the job was modified");
    json_decref(copy);
    json_decref(job);
    return 0;
}
