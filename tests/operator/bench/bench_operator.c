/* bench-operator: what the operator costs and how fast it reacts, against the real control
 * plane with kwok nodes (tests/operator/bench/bench_operator.sh runs it; `make bench-operator`).
 *
 * With an operator already running (its pid and /metrics URL given), in one namespace:
 *   1. create JOBS SwarmJobs (2 regions x (gateway + 2 stages x 4 peers + client) = 20 pods
 *      each) as fast as the API server takes them; time from the first create until every
 *      pod exists, then until every job is Running;
 *   2. SAMPLES times, one at a time: delete a random peer pod (gracePeriodSeconds 0: the
 *      operator's reaction, not the kubelet's shutdown) and time until a pod of the same name
 *      with a new uid exists: p50, p99, max;
 *   3. MASS peer pods of MASS different jobs deleted at once: time until all are replaced;
 *   4. the operator's CPU seconds and peak RSS (/proc), API requests per reconcile and
 *      whether it led throughout (its /metrics: leader_election_master_status sampled every
 *      second, cirrus_operator_api_requests_total, controller_runtime_reconcile_total).
 * Pods are watched with the operator's own informer (operator/kube): a pod's appearance is
 * the watch event's arrival here. Prints a report and one "bench-operator: key=value ..." line.
 * Exits 1 if the run could not complete (a timeout, a refused request, the operator gone).
 */
#include <curl/curl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../../operator/kube/client.h"
#include "../../../operator/kube/config.h"
#include "../../../operator/kube/informer.h"

#define PODS_PER_JOB 20
#define MAX_SAMPLES 10000

static kube_client *kc;
static kube_informer *pods_inf, *jobs_inf;
static const char *ns;
static int operator_pid;
static const char *metrics_url;
static int lost_leadership, metrics_failures;
static double next_metrics_s;

/* What a replacement waits for: a pod named want_name whose uid is not old_uid. */
typedef struct pending {
    char name[128], old_uid[64];
    double deleted_s, replaced_s; /* replaced_s 0: not yet */
} pending;
static pending *waiting;
static int n_waiting;

static double now_s(void) { return (double)kube_now_ms() / 1000.0; }

static const char *meta(const json_t *o, const char *k)
{
    return json_string_value(json_object_get(json_object_get(o, "metadata"), k));
}

static void on_pod(void *ctx, const json_t *pod)
{
    (void)ctx;
    const char *name = meta(pod, "name"), *uid = meta(pod, "uid");
    if (!name || !uid) return;
    for (int i = 0; i < n_waiting; i++)
        if (!waiting[i].replaced_s && !strcmp(waiting[i].name, name) &&
            strcmp(waiting[i].old_uid, uid))
            waiting[i].replaced_s = now_s();
}
static void on_pod_update(void *ctx, const json_t *old, const json_t *pod)
{
    (void)old;
    on_pod(ctx, pod);
}

/* ---- the operator's process and metrics ---- */

typedef struct body {
    char *p;
    size_t n;
} body;

static size_t collect(char *p, size_t sz, size_t n, void *ud)
{
    body *b = ud;
    char *q = realloc(b->p, b->n + sz * n + 1);
    if (!q) return 0;
    memcpy(q + b->n, p, sz * n);
    b->n += sz * n;
    q[b->n] = 0;
    b->p = q;
    return sz * n;
}

/* The sum of every sample of family name (with or without labels); -1 if absent. */
static double metric(const char *text, const char *name)
{
    double sum = -1;
    size_t n = strlen(name);
    for (const char *l = text; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
        if (strncmp(l, name, n) || (l[n] != ' ' && l[n] != '{')) continue;
        const char *v = l[n] == '{' ? strchr(l, '}') : l + n;
        if (!v) continue;
        v = v[0] == '}' ? v + 1 : v;
        sum = (sum < 0 ? 0 : sum) + strtod(v, NULL);
    }
    return sum;
}

/* Reads /metrics; fills what is asked (NULL: not needed). 0, or -1 if unreadable. */
static int read_metrics(double *leader, double *requests, double *reconciles)
{
    CURL *h = curl_easy_init();
    body buf = {0};
    int rc = -1;
    if (h) {
        curl_easy_setopt(h, CURLOPT_URL, metrics_url);
        curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, collect);
        curl_easy_setopt(h, CURLOPT_WRITEDATA, &buf);
        curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 2000L);
        if (curl_easy_perform(h) == CURLE_OK && buf.p) {
            if (leader) *leader = metric(buf.p, "leader_election_master_status");
            if (requests) *requests = metric(buf.p, "cirrus_operator_api_requests_total");
            if (reconciles) *reconciles = metric(buf.p, "controller_runtime_reconcile_total");
            rc = 0;
        }
        curl_easy_cleanup(h);
    }
    free(buf.p);
    return rc;
}

/* CPU seconds (user + system) and peak RSS in MiB of the operator; 0, or -1 if it is gone. */
static int proc_usage(double *cpu_s, double *hwm_mib)
{
    char path[64], line[512];
    snprintf(path, sizeof path, "/proc/%d/stat", operator_pid);
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    unsigned long ut = 0, st = 0;
    int ok = fgets(line, sizeof line, f) != NULL;
    fclose(f);
    const char *p = ok ? strrchr(line, ')') : NULL; /* comm may hold spaces */
    if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) != 2)
        return -1;
    *cpu_s = (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
    snprintf(path, sizeof path, "/proc/%d/status", operator_pid);
    if (!(f = fopen(path, "r"))) return -1;
    *hwm_mib = 0;
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, "VmHWM:", 6)) *hwm_mib = strtod(line + 6, NULL) / 1024.0;
    fclose(f);
    return 0;
}

/* The operator's resident memory now, in MiB: its own (anonymous: heap, stacks) and file
 * pages (the binary and shared libraries, mostly touched at load). 0, or -1 if unreadable. */
static int proc_rss_now(double *anon_mib, double *file_mib)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", operator_pid);
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    *anon_mib = *file_mib = -1;
    while (fgets(line, sizeof line, f)) {
        if (!strncmp(line, "RssAnon:", 8)) *anon_mib = strtod(line + 8, NULL) / 1024.0;
        if (!strncmp(line, "RssFile:", 8)) *file_mib = strtod(line + 8, NULL) / 1024.0;
    }
    fclose(f);
    return *anon_mib < 0 || *file_mib < 0 ? -1 : 0;
}

/* Runs the event loop for up to timeout_s until done() is true; samples leadership each
 * second. 0, or -1 on timeout or when the operator is gone. */
static int wait_for(int (*done)(void), double timeout_s, const char *what)
{
    double end = now_s() + timeout_s;
    while (!done()) {
        if (now_s() > end) {
            fprintf(stderr, "bench-operator: timed out after %.0f s waiting for %s\n", timeout_s,
                    what);
            return -1;
        }
        kube_client_poll(kc, 20);
        if (now_s() >= next_metrics_s) {
            next_metrics_s = now_s() + 1;
            double leader = -1, cpu, hwm;
            if (proc_usage(&cpu, &hwm)) {
                fprintf(stderr, "bench-operator: the operator (pid %d) is gone\n", operator_pid);
                return -1;
            }
            if (read_metrics(&leader, NULL, NULL)) metrics_failures++;
            else if (leader != 1) lost_leadership++;
        }
    }
    return 0;
}

/* ---- the jobs ---- */

static int n_jobs;

static json_t *job_manifest(int i)
{
    char name[32];
    snprintf(name, sizeof name, "b%04d", i);
    json_t *regions = json_array();
    for (int r = 1; r <= 2; r++) {
        char rn[8];
        snprintf(rn, sizeof rn, "r%d", r);
        json_array_append_new(regions, json_pack("{s:s, s:{s:i, s:i}, s:i}", "name", rn, "peers",
                                                 "replicas", 4, "min", 1, "clients", 1));
    }
    return json_pack("{s:s, s:s, s:{s:s}, s:{s:s, s:{s:i}, s:o}}", "apiVersion",
                     "cirrus.dev/v1alpha1", "kind", "SwarmJob", "metadata", "name", name, "spec",
                     "image", "cirrus:latest", "pipeline", "stages", 2, "regions", regions);
}

static int all_pods_exist(void)
{
    return json_object_size(kube_informer_objects(pods_inf)) >= (size_t)n_jobs * PODS_PER_JOB;
}

static int all_jobs_running(void)
{
    int running = 0;
    const char *k;
    const json_t *j;
    json_object_foreach((json_t *)kube_informer_objects(jobs_inf), k, j)
    {
        const char *ph = json_string_value(json_object_get(json_object_get(j, "status"), "phase"));
        running += ph && !strcmp(ph, "Running");
    }
    return running == n_jobs;
}

static int all_replaced(void)
{
    for (int i = 0; i < n_waiting; i++)
        if (!waiting[i].replaced_s) return 0;
    return 1;
}

/* Deletes the peer pod s<stage>-<i> of region r of job j; records it in waiting[]. */
static int delete_peer(int j, int r, int stage, int i)
{
    char name[128], key[256], path[512];
    snprintf(name, sizeof name, "b%04d-r%d-s%d-%d", j, r, stage, i);
    snprintf(key, sizeof key, "%s/%s", ns, name);
    const json_t *pod = kube_informer_get(pods_inf, key);
    if (!pod || !meta(pod, "uid")) return 1; /* being replaced already: pick another */
    pending *p = &waiting[n_waiting];
    snprintf(p->name, sizeof p->name, "%s", name);
    snprintf(p->old_uid, sizeof p->old_uid, "%s", meta(pod, "uid"));
    p->replaced_s = 0;
    cirrus_error err = {0};
    json_t *opts = json_pack("{s:s, s:s, s:i}", "kind", "DeleteOptions", "apiVersion", "v1",
                             "gracePeriodSeconds", 0);
    kube_path(path, sizeof path, "api/v1", ns, "pods", name);
    p->deleted_s = now_s();
    int rc = kube_delete(kc, path, opts, &err);
    json_decref(opts);
    if (rc == CIRRUS_ENOENT) return 1;
    if (rc) {
        fprintf(stderr, "bench-operator: delete %s: %s\n", name, err.msg);
        return -1;
    }
    n_waiting++;
    return 0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double pct(const double *sorted, int n, double p)
{
    int i = (int)ceil(p / 100.0 * n) - 1;
    return sorted[i < 0 ? 0 : i >= n ? n - 1 : i];
}

int main(int argc, char **argv)
{
    const char *kubeconfig = NULL;
    int samples = 100, mass = 100;
    double timeout_s = 900;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--kubeconfig")) kubeconfig = argv[i + 1];
        else if (!strcmp(argv[i], "--namespace")) ns = argv[i + 1];
        else if (!strcmp(argv[i], "--jobs")) n_jobs = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--samples")) samples = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--mass")) mass = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--operator-pid")) operator_pid = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--metrics-url")) metrics_url = argv[i + 1];
        else if (!strcmp(argv[i], "--timeout-s")) timeout_s = atof(argv[i + 1]);
        else {
            fprintf(stderr, "bench-operator: unknown flag %s\n", argv[i]);
            return 2;
        }
    }
    if (!ns || n_jobs < 1 || n_jobs > 9999 || !operator_pid || !metrics_url || samples < 1 ||
        samples > MAX_SAMPLES || mass < 1 || mass > n_jobs) {
        fprintf(stderr, "usage: bench-operator --namespace NS --jobs N (1..9999) --operator-pid P "
                        "--metrics-url URL [--kubeconfig F] [--samples S] [--mass M <= N] "
                        "[--timeout-s T]\n");
        return 2;
    }
    srand(1);
    curl_global_init(CURL_GLOBAL_DEFAULT);
    cirrus_error err = {0};
    kube_config *cfg = NULL;
    char pods_path[256], jobs_path[256];
    snprintf(pods_path, sizeof pods_path, "/api/v1/namespaces/%s/pods", ns);
    snprintf(jobs_path, sizeof jobs_path, "/apis/cirrus.dev/v1alpha1/namespaces/%s/swarmjobs", ns);
    kube_informer_config pc = {.path = pods_path, .on_add = on_pod, .on_update = on_pod_update};
    kube_informer_config jc = {.path = jobs_path};
    waiting = calloc(MAX_SAMPLES + 10000, sizeof *waiting);
    if (!waiting || kube_config_load(kubeconfig, &cfg, &err) || kube_client_new(cfg, &kc, &err) ||
        kube_informer_new(kc, &pc, &pods_inf, &err) || kube_informer_new(kc, &jc, &jobs_inf, &err)) {
        fprintf(stderr, "bench-operator: %s\n", err.msg);
        return 1;
    }
    double cpu0, hwm, req0 = -1, rec0 = -1, leader = -1;
    if (proc_usage(&cpu0, &hwm) || read_metrics(&leader, &req0, &rec0) || req0 < 0 || rec0 < 0) {
        fprintf(stderr, "bench-operator: cannot read the operator's /proc or %s\n", metrics_url);
        return 1;
    }
    while (!kube_informer_has_synced(pods_inf) || !kube_informer_has_synced(jobs_inf))
        kube_client_poll(kc, 20);

    /* 1. create */
    double t0 = now_s();
    for (int i = 0; i < n_jobs; i++) {
        json_t *job = job_manifest(i);
        int rc = kube_create(kc, jobs_path, job, NULL, &err);
        json_decref(job);
        if (rc) {
            fprintf(stderr, "bench-operator: create job %d: %s\n", i, err.msg);
            return 1;
        }
    }
    double t_applied = now_s() - t0;
    if (wait_for(all_pods_exist, timeout_s, "every pod to exist")) return 1;
    double t_created = now_s() - t0;
    if (wait_for(all_jobs_running, timeout_s, "every job to be Running")) return 1;
    double t_running = now_s() - t0, cpu1;
    proc_usage(&cpu1, &hwm);

    /* 2. one at a time */
    double *lat = calloc((size_t)samples, sizeof *lat);
    for (int s = 0; s < samples; s++) {
        n_waiting = 0;
        int rc, tries = 0;
        do
            rc = delete_peer(rand() % n_jobs, 1 + rand() % 2, rand() % 2, rand() % 4);
        while (rc == 1 && ++tries < 1000);
        if (rc == 1) fprintf(stderr, "bench-operator: no peer pod found to delete\n");
        if (rc || wait_for(all_replaced, 60, "a replacement")) return 1;
        lat[s] = waiting[0].replaced_s - waiting[0].deleted_s;
    }
    qsort(lat, (size_t)samples, sizeof *lat, cmp_double);
    double cpu2;
    proc_usage(&cpu2, &hwm);

    /* 3. MASS at once, one peer each of MASS different jobs */
    n_waiting = 0;
    double tm = now_s();
    for (int j = 0; j < mass; j++) {
        int rc, tries = 0;
        do
            rc = delete_peer(j, 1 + rand() % 2, rand() % 2, rand() % 4);
        while (rc == 1 && ++tries < 1000);
        if (rc) {
            fprintf(stderr, "bench-operator: no peer of job %d to delete\n", j);
            return 1;
        }
    }
    double t_sent = now_s() - tm;
    if (wait_for(all_replaced, timeout_s, "the mass replacement")) return 1;
    double t_mass = 0;
    for (int i = 0; i < n_waiting; i++)
        if (waiting[i].replaced_s - tm > t_mass) t_mass = waiting[i].replaced_s - tm;
    double cpu3, req1 = -1, rec1 = -1, anon = -1, file = -1;
    proc_usage(&cpu3, &hwm);
    proc_rss_now(&anon, &file);
    read_metrics(&leader, &req1, &rec1);

    printf("operator benchmark: %d SwarmJobs x 2 regions x 10 pods = %d pods\n", n_jobs,
           n_jobs * PODS_PER_JOB);
    printf("  create: jobs posted in %.2f s; every pod exists %.2f s, every job Running %.2f s "
           "after the first post\n",
           t_applied, t_created, t_running);
    printf("  replacement of one deleted peer (%d samples): p50 %.0f ms, p99 %.0f ms, max %.0f ms\n",
           samples, pct(lat, samples, 50) * 1000, pct(lat, samples, 99) * 1000,
           lat[samples - 1] * 1000);
    printf("  %d peers of %d jobs deleted at once (deletes sent in %.2f s): all replaced %.2f s "
           "after the first delete\n",
           mass, mass, t_sent, t_mass);
    printf("  operator: CPU %.1f s creating, %.1f s for the single replacements, %.1f s for the "
           "mass one; peak RSS %.1f MiB (at the end: %.1f MiB its own, %.1f MiB of the binary "
           "and shared libraries)\n",
           cpu1 - cpu0, cpu2 - cpu1, cpu3 - cpu2, hwm, anon, file);
    double reconciles = rec1 - rec0, requests = req1 - req0;
    printf("  API requests %.0f over %.0f reconciles: %.2f per reconcile\n", requests, reconciles,
           reconciles > 0 ? requests / reconciles : 0);
    printf("  leadership: %s (%d of the per-second samples not leading, %d unreadable)\n",
           lost_leadership ? "LOST" : "held throughout", lost_leadership, metrics_failures);
    printf("bench-operator: jobs=%d pods=%d created_s=%.2f running_s=%.2f p50_ms=%.0f "
           "p99_ms=%.0f mass=%d mass_s=%.2f cpu_s=%.1f rss_mib=%.1f rss_anon_mib=%.1f "
           "rss_file_mib=%.1f req_per_reconcile=%.2f leader_lost=%d\n",
           n_jobs, n_jobs * PODS_PER_JOB, t_created, t_running, pct(lat, samples, 50) * 1000,
           pct(lat, samples, 99) * 1000, mass, t_mass, cpu3 - cpu0, hwm, anon, file,
           reconciles > 0 ? requests / reconciles : 0, lost_leadership);
    free(lat);
    free(waiting);
    kube_informer_free(pods_inf);
    kube_informer_free(jobs_inf);
    kube_client_free(kc);
    curl_global_cleanup();
    return 0;
}
