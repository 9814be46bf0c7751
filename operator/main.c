/* cirrus-operator: reconciles SwarmJobs (controller.h) from one event loop.
 *
 * With --leader-elect, replicas share a Lease and only the holder reconciles; the others keep
 * their caches warm so a successor starts at once. A leader that loses the lease (another
 * took it, or renewals failed for renewDeadline, e.g. while the API server restarts) stops
 * reconciling at once and stands again as a candidate; when it leads again it forgets what
 * it remembered and re-reads every job, as a fresh process would. (client-go exits instead
 * and leaves the restart to the kubelet; staying up keeps the caches warm.)
 * The elector runs in a thread of its own with its own client (kube_lease_start), so a request
 * of the loop's answered late does not starve the renewals; it tells the loop of a term begun
 * or ended between two turns (kube_lease_dispatch).
 * SIGTERM releases the lease so a successor takes over without waiting for it to expire.
 * SIGUSR1 drops every watch and resumes from resourceVersion 1: where the server no longer
 * keeps that history the answer is 410 and the caches re-list; where it does, the history
 * is replayed. Either way the caches end current: a way to refresh them without a restart.
 *
 * Training progress (step, loss, tokens/s in the jobs' status) is read from the region
 * gateways' /status on a thread of its own (progress.h) every --progress-period-s seconds,
 * by the leader only; --resolve pins a gateway's host name to an address for those reads.
 * Flags are spelled "--name value" or "--name=value".
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../common/flags.h"
#include "../common/crash.h"
#include "../common/log.h"
#include "controller.h"
#include "desired.h"
#include "kube/config.h"
#include "kube/lease.h"
#include "metrics.h"
#include "progress.h"

#define EXIT_BAD_INPUT 2
#define LOOP_WAIT_MS 200
/* Shutting down while leading: at most this long to account for the job pods still going:
 * longer than their 30 s grace period (a pod may use all of it), shorter than the operator
 * pod's own (45 s in the chart and manifests). */
#define SHUTDOWN_SETTLE_S 35

static volatile sig_atomic_t stop_requested, rewatch_requested;

static void on_stop(int sig)
{
    (void)sig;
    stop_requested = 1;
}

static void on_rewatch(int sig)
{
    (void)sig;
    rewatch_requested = 1;
}

typedef struct run_state {
    op_metrics *metrics;
    controller *ctl;
    kube_lease *lease;
} run_state;

static void started_leading(void *ctx)
{
    run_state *rs = ctx;
    op_metrics_leader(rs->metrics, 1);
    /* Won back with nobody leading in between (the loop was held past the renew deadline):
     * what it remembers is still the latest, and forgetting it would lose the preemptions
     * it counted but had not written yet. */
    int resumed = rs->lease && kube_lease_resumed(rs->lease);
    if (resumed) log_info("leading again, nobody led meanwhile: what was counted is kept");
    if (rs->ctl) controller_resync(rs->ctl, !resumed);
}

static void stopped_leading(void *ctx)
{
    run_state *rs = ctx;
    op_metrics_leader(rs->metrics, 0);
    if (rs->ctl) controller_standby(rs->ctl);
    log_warn("not leading any more: reconciling stops until the lease is won again");
}

/* May this replica act now? (controller_options.leading) */
static int lease_held(void *ctx)
{
    kube_lease *lease = ctx;
    return !lease || kube_lease_is_leader(lease);
}

static const char *env_or(const char *name, const char *dflt)
{
    const char *v = getenv(name);
    return v && *v ? v : dflt;
}

int main(int argc, char **argv)
{
    const char *kubeconfig = NULL, *ns = NULL, *identity = NULL, *cluster_name = "home";
    const char *lease_ns = env_or("POD_NAMESPACE", "cirrus-system");
    const char *lease_name = env_or("CIRRUS_LEASE_NAME", "cirrus-operator");
    flag_str_list resolves = {.n = 0};
    int leader_elect = 0, metrics_port = 8080, help = 0, progress_period_s = 10;
    flag_spec flags[] = {
        {"kubeconfig", FLAG_STR, &kubeconfig, 0, 0,
         "kubeconfig file (default: $KUBECONFIG, in-cluster, ~/.kube/config)", 0},
        {"namespace", FLAG_STR, &ns, 0, 0, "watch only this namespace (default: all)", 0},
        {"leader-elect", FLAG_BOOL, &leader_elect, 0, 0,
         "reconcile only while holding the Lease (run several replicas)", 0},
        {"lease-namespace", FLAG_STR, &lease_ns, 0, 0,
         "the Lease's namespace (default: $POD_NAMESPACE or cirrus-system)", 0},
        {"lease-name", FLAG_STR, &lease_name, 0, 0,
         "the Lease's name (default: $CIRRUS_LEASE_NAME or cirrus-operator)", 0},
        {"identity", FLAG_STR, &identity, 0, 0, "this replica's name (default: $POD_NAME)", 0},
        {"metrics-port", FLAG_INT, &metrics_port, -1, 65535,
         "port for /metrics, /healthz, /readyz (0: any free port, -1: none)", 0},
        {"progress-period-s", FLAG_INT, &progress_period_s, 0, 86400,
         "seconds between reads of each running job's gateway /status, for the status's "
         "step, loss and tokens/s (0: never; default 10)",
         0},
        {"resolve", FLAG_STR_LIST, &resolves, 0, 0,
         "HOST:PORT:ADDRESS: reach HOST:PORT at ADDRESS when reading a gateway's /status "
         "(as curl --resolve; repeatable, or comma-separated)",
         0},
        {"cluster-name", FLAG_STR, &cluster_name, 0, 0,
         "this cluster's name in the copies of its jobs that span clusters (their "
         "spec.home.cluster; default: home)",
         0},
        {"help", FLAG_BOOL, &help, 0, 0, "show this help", 0},
    };
    cirrus_error err = {0};
    log_set_role("operator");
    crash_handler_install("cirrus-operator");
    int bad = flags_parse(flags, NFLAGS(flags), argc - 1, argv + 1, &err);
    for (int i = 0; i < resolves.n && !bad; i++) bad = progress_check_resolve(resolves.items[i], &err);
    if (!bad && (!*cluster_name || strlen(cluster_name) > 63 ||
                 strspn(cluster_name, "abcdefghijklmnopqrstuvwxyz0123456789-") !=
                     strlen(cluster_name) ||
                 cluster_name[0] == '-' || cluster_name[strlen(cluster_name) - 1] == '-'))
        bad = cirrus_fail(&err, CIRRUS_EINVAL, "--cluster-name '%s' is not a DNS label",
                          cluster_name);
    if (bad) {
        fprintf(stderr, "cirrus-operator: %s\n", err.msg);
        return EXIT_BAD_INPUT;
    }
    if (help) {
        fprintf(stderr, "usage: cirrus-operator [flags]  (--name value or --name=value)\n");
        flags_usage(flags, NFLAGS(flags));
        return 0;
    }
    char host_id[128];
    if (!identity) {
        char host[64] = "cirrus-operator";
        gethostname(host, sizeof host - 1);
        snprintf(host_id, sizeof host_id, "%s-%d", host, (int)getpid());
        identity = env_or("POD_NAME", host_id);
    }
    kube_config *cfg = NULL;
    if (kube_config_load(kubeconfig, &cfg, &err)) {
        fprintf(stderr, "cirrus-operator: %s\n", err.msg);
        return EXIT_BAD_INPUT;
    }
    int rc = 1;
    kube_client *client = NULL;
    controller *ctl = NULL;
    kube_lease *lease = NULL;
    progress *prog = NULL;
    run_state rs = {op_metrics_new(), NULL, NULL};
    if (!rs.metrics || kube_client_new(cfg, &client, &err)) goto out;
    /* After kube_client_new (libcurl's global set-up happens before any thread starts). */
    progress_options po = {.period_s = progress_period_s, .resolve = resolves.items,
                           .n_resolve = resolves.n, .metrics = rs.metrics};
    if (progress_new(&po, &prog, &err)) goto out;
    if (metrics_port >= 0) {
        int bound = 0;
        if (op_metrics_serve(rs.metrics, metrics_port, &bound, &err)) goto out;
        log_info("metrics on :%d (/metrics, /healthz, /readyz)", bound);
    }
    /* Before any thread of ours does I/O on its own (the elector's): SIGPIPE ignored. */
    signal(SIGTERM, on_stop);
    signal(SIGINT, on_stop);
    signal(SIGUSR1, on_rewatch);
    signal(SIGPIPE, SIG_IGN);
    if (leader_elect) {
        kube_lease_config lc = {.ns = lease_ns, .name = lease_name, .identity = identity,
                                .on_started_leading = started_leading,
                                .on_stopped_leading = stopped_leading, .ctx = &rs};
        /* In its own thread with its own client: a request of the loop's answered late
         * (up to the 30 s timeout) must not cost the lease (10 s renew deadline). */
        if (kube_lease_start(kubeconfig, &lc, &lease, &err)) goto out;
        rs.lease = lease;
    } else {
        op_metrics_leader(rs.metrics, 1);
    }
    controller_options co = {.watch_namespace = ns, .identity = identity, .metrics = rs.metrics,
                             .leading = lease_held, .leading_ctx = lease, .progress = prog,
                             .cluster_name = cluster_name};
    if (controller_new(client, &co, &ctl, &err)) goto out;
    rs.ctl = ctl;
    log_info("%s as %s: watching %s (API server %s)", leader_elect ? "electing" : "running",
             identity, ns ? ns : "all namespaces", kube_config_server(cfg));
    if (progress_period_s > 0)
        log_info("reading the gateways' /status every %d s%s", progress_period_s,
                 resolves.n ? " (with --resolve)" : "");
    else
        log_info("not reading the gateways' /status (--progress-period-s 0)");
    int was_synced = 0;
    while (!stop_requested) {
        /* Only a replica that works its queue may wake for it: a standby (or one whose caches
         * are still listing) would otherwise spin on keys it will not take. */
        int active = lease_held(lease) && controller_synced(ctl);
        int64_t next = active ? controller_next_ms(ctl) : -1;
        int wait = next >= 0 && next < LOOP_WAIT_MS ? (int)next : LOOP_WAIT_MS;
        kube_client_poll(client, wait);
        if (lease) kube_lease_dispatch(lease);
        if (rewatch_requested) {
            rewatch_requested = 0;
            log_info("SIGUSR1: dropping every watch; resuming from resourceVersion 1");
            controller_rewatch(ctl, "1");
        }
        int synced = controller_synced(ctl);
        if (synced && !was_synced) log_info("caches synced");
        was_synced = synced;
        op_metrics_ready(rs.metrics, synced);
        if (lease_held(lease)) controller_process(ctl, 32);
    }
    /* A node drain evicts this pod together with the job pods on its node (in no set order:
     * this one may go first). Their ends are counted (preemptions, failures) by the replica
     * that sees them go, and a successor cannot know pods that were gone before it started:
     * so the leader works on, holding the lease, until none of them is terminating, none is
     * left on its node if that node is cordoned, and nothing is queued (or the time is up),
     * then hands over. */
    if (lease_held(lease) && controller_synced(ctl)) {
        const time_t until = time(NULL) + SHUTDOWN_SETTLE_S;
        int settled;
        const char *node = getenv("NODE_NAME"); /* the Deployment's downward API */
        while (!(settled = controller_settled(ctl, node && *node ? node : NULL)) &&
               time(NULL) < until && lease_held(lease)) {
            kube_client_poll(client, LOOP_WAIT_MS);
            if (lease) kube_lease_dispatch(lease);
            controller_process(ctl, 32);
        }
        log_info("stopping: %s", settled ? "every job pod that went is accounted for"
                                          : "job pods still terminating; the next leader "
                                            "counts those it sees go");
    }
    rc = 0;
    if (lease) { /* it knows whether it holds the Lease, told to this loop or not */
        cirrus_error rerr;
        if (kube_lease_release(lease, &rerr)) log_warn("lease not released: %s", rerr.msg);
    }
    controller_stats st;
    controller_get_stats(ctl, &st);
    log_info("stopping: %llu reconciles, %llu pods created, %llu preemptions, %llu failures",
             (unsigned long long)st.reconciles, (unsigned long long)st.pods_created,
             (unsigned long long)st.preemptions, (unsigned long long)st.failures);
out:
    if (rc && err.msg[0]) fprintf(stderr, "cirrus-operator: %s\n", err.msg);
    kube_lease_free(lease);
    controller_free(ctl);
    progress_free(prog); /* joins its thread */
    op_metrics_free(rs.metrics);
    kube_client_free(client);
    kube_config_free(cfg);
    return rc;
}
