#include "metrics.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/clock.h"
#include "../common/http_server.h"

#define CONTROLLER "swarmjob"
/* controller-runtime's reconcile-time buckets (seconds). */
static const double buckets[] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35,
                                 0.4,   0.45, 0.5,   0.6,  0.7, 0.8,  0.9, 1.0,  1.25, 1.5,
                                 1.75,  2.0,  2.5,   3.0,  3.5, 4.0,  4.5, 5,    6,    7,
                                 8,     9,    10,    15,   20,  25,   30,  40,   50,   60};
#define N_BUCKETS (sizeof buckets / sizeof *buckets)

struct op_metrics {
    pthread_mutex_t mu;
    uint64_t results[OP_RESULT_N];
    uint64_t hist[N_BUCKETS]; /* cumulative at render time, per bucket here */
    uint64_t hist_count;
    double hist_sum;
    uint64_t q_depth, q_adds, q_retries;
    int leader, ready;
    int64_t last_turn_ms; /* clock_now_ms() of the loop's latest turn; 0: none yet */
    uint64_t pods_created, preemptions, failures;
    uint64_t api_transfers, api_retries;
    uint64_t scrapes[OP_SCRAPE_N];
    http_server *server;
};

op_metrics *op_metrics_new(void)
{
    op_metrics *m = calloc(1, sizeof *m);
    if (m) pthread_mutex_init(&m->mu, NULL);
    return m;
}

void op_metrics_free(op_metrics *m)
{
    if (!m) return;
    http_server_stop(m->server);
    pthread_mutex_destroy(&m->mu);
    free(m);
}

void op_metrics_reconciled(op_metrics *m, enum op_result r, double seconds)
{
    if (!m) return;
    pthread_mutex_lock(&m->mu);
    m->results[r]++;
    for (size_t i = 0; i < N_BUCKETS; i++) {
        if (seconds <= buckets[i]) {
            m->hist[i]++;
            break;
        }
    }
    m->hist_count++;
    m->hist_sum += seconds;
    pthread_mutex_unlock(&m->mu);
}

void op_metrics_queue(op_metrics *m, uint64_t depth, uint64_t adds, uint64_t retries)
{
    if (!m) return;
    pthread_mutex_lock(&m->mu);
    m->q_depth = depth;
    m->q_adds = adds;
    m->q_retries = retries;
    pthread_mutex_unlock(&m->mu);
}

void op_metrics_leader(op_metrics *m, int is_leader)
{
    if (!m) return;
    pthread_mutex_lock(&m->mu);
    m->leader = is_leader;
    pthread_mutex_unlock(&m->mu);
}

void op_metrics_ready(op_metrics *m, int ready)
{
    if (!m) return;
    pthread_mutex_lock(&m->mu);
    m->ready = ready;
    m->last_turn_ms = clock_now_ms();
    pthread_mutex_unlock(&m->mu);
}

int op_metrics_loop_healthy(int64_t last_turn_ms, int64_t now_ms)
{
    return last_turn_ms == 0 || now_ms - last_turn_ms < OP_HEALTHZ_STALL_MS;
}

void op_metrics_pods(op_metrics *m, uint64_t created, uint64_t preemptions, uint64_t failures)
{
    if (!m) return;
    pthread_mutex_lock(&m->mu);
    m->pods_created = created;
    m->preemptions = preemptions;
    m->failures = failures;
    pthread_mutex_unlock(&m->mu);
}

void op_metrics_api(op_metrics *m, uint64_t transfers, uint64_t retries)
{
    if (!m) return;
    pthread_mutex_lock(&m->mu);
    m->api_transfers = transfers;
    m->api_retries = retries;
    pthread_mutex_unlock(&m->mu);
}

void op_metrics_scrape(op_metrics *m, enum op_scrape r)
{
    if (!m || (unsigned)r >= OP_SCRAPE_N) return;
    pthread_mutex_lock(&m->mu);
    m->scrapes[r]++;
    pthread_mutex_unlock(&m->mu);
}

/* A growing text buffer for the exposition; on allocation failure it stays NULL. */
typedef struct text {
    char *s;
    size_t len, cap;
} text;

__attribute__((format(printf, 2, 3))) static void emit(text *t, const char *fmt, ...)
{
    if (!t->s && t->cap) return; /* failed before */
    va_list ap;
    va_start(ap, fmt);
    char line[512];
    int n = vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n >= sizeof line) n = sizeof line - 1;
    if (t->len + (size_t)n + 1 > t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 4096;
        while (cap < t->len + (size_t)n + 1) cap *= 2;
        char *s = realloc(t->s, cap);
        if (!s) {
            free(t->s);
            t->s = NULL;
            t->cap = 1;
            return;
        }
        t->s = s;
        t->cap = cap;
    }
    memcpy(t->s + t->len, line, (size_t)n + 1);
    t->len += (size_t)n;
}

char *op_metrics_render(op_metrics *m)
{
    static const char *const result_names[] = {"success", "error", "requeue_after"};
    text t = {0};
    pthread_mutex_lock(&m->mu);
    emit(&t, "# HELP controller_runtime_reconcile_total Total number of reconciliations per "
             "controller\n# TYPE controller_runtime_reconcile_total counter\n");
    for (int r = 0; r < OP_RESULT_N; r++)
        emit(&t, "controller_runtime_reconcile_total{controller=\"%s\",result=\"%s\"} %llu\n",
             CONTROLLER, result_names[r], (unsigned long long)m->results[r]);
    emit(&t, "# HELP controller_runtime_reconcile_errors_total Total number of reconciliation "
             "errors per controller\n# TYPE controller_runtime_reconcile_errors_total counter\n"
             "controller_runtime_reconcile_errors_total{controller=\"%s\"} %llu\n",
         CONTROLLER, (unsigned long long)m->results[OP_RESULT_ERROR]);
    emit(&t, "# HELP controller_runtime_reconcile_time_seconds Length of time per reconciliation "
             "per controller\n# TYPE controller_runtime_reconcile_time_seconds histogram\n");
    uint64_t cum = 0;
    for (size_t i = 0; i < N_BUCKETS; i++) {
        cum += m->hist[i];
        emit(&t, "controller_runtime_reconcile_time_seconds_bucket{controller=\"%s\",le=\"%g\"} "
                 "%llu\n",
             CONTROLLER, buckets[i], (unsigned long long)cum);
    }
    emit(&t,
         "controller_runtime_reconcile_time_seconds_bucket{controller=\"%s\",le=\"+Inf\"} %llu\n"
         "controller_runtime_reconcile_time_seconds_sum{controller=\"%s\"} %.6f\n"
         "controller_runtime_reconcile_time_seconds_count{controller=\"%s\"} %llu\n",
         CONTROLLER, (unsigned long long)m->hist_count, CONTROLLER, m->hist_sum, CONTROLLER,
         (unsigned long long)m->hist_count);
    emit(&t, "# HELP workqueue_depth Current depth of workqueue\n# TYPE workqueue_depth gauge\n"
             "workqueue_depth{name=\"%s\"} %llu\n",
         CONTROLLER, (unsigned long long)m->q_depth);
    emit(&t, "# HELP workqueue_adds_total Total number of adds handled by workqueue\n"
             "# TYPE workqueue_adds_total counter\nworkqueue_adds_total{name=\"%s\"} %llu\n",
         CONTROLLER, (unsigned long long)m->q_adds);
    emit(&t, "# HELP workqueue_retries_total Total number of retries handled by workqueue\n"
             "# TYPE workqueue_retries_total counter\nworkqueue_retries_total{name=\"%s\"} %llu\n",
         CONTROLLER, (unsigned long long)m->q_retries);
    emit(&t, "# HELP leader_election_master_status Gauge of if the reporting system is master "
             "of the relevant lease, 0 indicates backup, 1 indicates master.\n"
             "# TYPE leader_election_master_status gauge\n"
             "leader_election_master_status{name=\"cirrus-operator\"} %d\n",
         m->leader);
    emit(&t, "# HELP cirrus_operator_pods_created_total Pods created (first and replacements)\n"
             "# TYPE cirrus_operator_pods_created_total counter\n"
             "cirrus_operator_pods_created_total %llu\n"
             "# HELP cirrus_operator_preemptions_total Pods lost to preemption or node loss\n"
             "# TYPE cirrus_operator_preemptions_total counter\n"
             "cirrus_operator_preemptions_total %llu\n"
             "# HELP cirrus_operator_failures_total Pods whose program failed (exit 1..127)\n"
             "# TYPE cirrus_operator_failures_total counter\n"
             "cirrus_operator_failures_total %llu\n",
         (unsigned long long)m->pods_created, (unsigned long long)m->preemptions,
         (unsigned long long)m->failures);
    emit(&t, "# HELP cirrus_operator_api_requests_total Requests to the API server finished "
             "(watches and retries included)\n"
             "# TYPE cirrus_operator_api_requests_total counter\n"
             "cirrus_operator_api_requests_total %llu\n"
             "# HELP cirrus_operator_api_throttled_total Requests repeated after 429 Too Many "
             "Requests\n"
             "# TYPE cirrus_operator_api_throttled_total counter\n"
             "cirrus_operator_api_throttled_total %llu\n",
         (unsigned long long)m->api_transfers, (unsigned long long)m->api_retries);
    static const char *const scrape_names[] = {"ok", "error", "invalid", "wrong_job"};
    emit(&t, "# HELP cirrus_operator_progress_scrapes_total Reads of the region gateways' "
             "/status by outcome (wrong_job: the status of another job, ignored)\n"
             "# TYPE cirrus_operator_progress_scrapes_total counter\n");
    for (int r = 0; r < OP_SCRAPE_N; r++)
        emit(&t, "cirrus_operator_progress_scrapes_total{result=\"%s\"} %llu\n", scrape_names[r],
             (unsigned long long)m->scrapes[r]);
    pthread_mutex_unlock(&m->mu);
    return t.s;
}

static void on_metrics(void *ctx, http_reply *r)
{
    r->content_type = HTTP_PROMETHEUS_TYPE;
    r->body = op_metrics_render(ctx);
}

static void on_healthz(void *ctx, http_reply *r)
{
    op_metrics *m = ctx;
    pthread_mutex_lock(&m->mu);
    int64_t last = m->last_turn_ms, now = clock_now_ms();
    pthread_mutex_unlock(&m->mu);
    if (op_metrics_loop_healthy(last, now)) {
        http_reply_text(r, 200, "ok\n");
        return;
    }
    char msg[96];
    snprintf(msg, sizeof msg, "event loop stalled for %lld s\n", (long long)((now - last) / 1000));
    http_reply_text(r, 500, msg);
}

static void on_readyz(void *ctx, http_reply *r)
{
    op_metrics *m = ctx;
    pthread_mutex_lock(&m->mu);
    int ready = m->ready;
    pthread_mutex_unlock(&m->mu);
    http_reply_text(r, ready ? 200 : 503, ready ? "ok\n" : "caches not synced\n");
}

static const http_route routes[] = {
    {"/metrics", on_metrics}, {"/healthz", on_healthz}, {"/readyz", on_readyz}};

int op_metrics_serve(op_metrics *m, int port, int *bound, cirrus_error *err)
{
    if (port < 0 || port > 65535)
        return cirrus_fail(err, CIRRUS_EINVAL, "metrics port %d out of range", port);
    http_server_options o = {.routes = routes, .n_routes = sizeof routes / sizeof *routes,
                             .ctx = m, .listen_fd = -1, .port = port, .connection_limit = 32,
                             .timeout_s = 10};
    return http_server_start(&o, &m->server, bound, err);
}
