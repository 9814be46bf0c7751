/* Leader election against the real API server: acquiring a fresh Lease, a second candidate
 * held off while the leader renews, takeover after the leader stops renewing, release on
 * shutdown, a leader noticing its Lease was taken, and one held up past its renew deadline
 * winning its own Lease back (a resumption); and the elector in a thread of its own keeping
 * the Lease while its caller's loop is held up, telling the caller of every term. Durations are short but the checks
 * are on ordering, with generous timeouts, not on exact timings. */
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include "../../operator/kube/client.h"
#include "../../operator/kube/lease.h"
#include "../unit/test.h"
#include "kube_test_util.h"

#define LEASE_NAME "cirrus-operator"

static char hb[256]; /* kube_lease_holder's buffer */

typedef struct cand {
    kube_config *cfg;
    kube_client *c;
    kube_lease *l;
    int started, stopped;
    int64_t started_ms, stopped_ms;
} cand;

static void on_started(void *ctx)
{
    cand *x = ctx;
    x->started++;
    x->started_ms = kube_now_ms();
}

static void on_stopped(void *ctx)
{
    cand *x = ctx;
    x->stopped++;
    x->stopped_ms = kube_now_ms();
}

static void cand_new(cand *x)
{
    memset(x, 0, sizeof *x);
    x->c = tk_client(&x->cfg);
}

static void cand_run(cand *x, const char *ns, const char *identity, int lease_ms, int renew_ms,
                     int retry_ms)
{
    kube_lease_config cfg = {
        .ns = ns,
        .name = LEASE_NAME,
        .identity = identity,
        .lease_duration_ms = lease_ms,
        .renew_deadline_ms = renew_ms,
        .retry_period_ms = retry_ms,
        .on_started_leading = on_started,
        .on_stopped_leading = on_stopped,
        .ctx = x,
    };
    cirrus_error err;
    if (kube_lease_new(x->c, &cfg, &x->l, &err)) TEST_FAIL("kube_lease_new: %s", err.msg);
}

static void cand_free(cand *x)
{
    kube_lease_free(x->l);
    tk_client_free(x->c, x->cfg);
}

/* Poll every candidate's client in turn until done(ctx) or timeout_ms; check(ctx), if
 * given, must hold after every round. Returns done's last value. */
static int poll_all(cand **cs, int n, int (*done)(void *), void (*check)(void *), void *ctx,
                    int timeout_ms)
{
    int64_t end = kube_now_ms() + timeout_ms;
    for (;;) {
        if (done && done(ctx)) return 1;
        if (kube_now_ms() >= end) return done ? 0 : 1;
        for (int i = 0; i < n; i++)
            if (kube_client_poll(cs[i]->c, 10)) TEST_FAIL("kube_client_poll failed");
        if (check) check(ctx);
    }
}

static int is_leader(void *ctx) { return kube_lease_is_leader(((cand *)ctx)->l); }
static int has_started(void *ctx) { return ((cand *)ctx)->started > 0; }
static int has_stopped(void *ctx) { return ((cand *)ctx)->stopped > 0; }
static int started_twice(void *ctx) { return ((cand *)ctx)->started >= 2; }

static json_t *get_lease(kube_client *c, const char *ns)
{
    char path[256];
    json_t *obj = NULL;
    cirrus_error err;
    snprintf(path, sizeof path, "/apis/coordination.k8s.io/v1/namespaces/%s/leases/%s", ns,
             LEASE_NAME);
    if (kube_get(c, path, &obj, &err)) TEST_FAIL("GET %s: %s", path, err.msg);
    return obj;
}

static const char *spec_str(const json_t *lease, const char *key)
{
    const char *s = json_string_value(json_object_get(json_object_get(lease, "spec"), key));
    return s ? s : "";
}

static long long spec_int(const json_t *lease, const char *key)
{
    json_t *v = json_object_get(json_object_get(lease, "spec"), key);
    if (!json_is_integer(v)) TEST_FAIL("spec.%s is not an integer", key);
    return (long long)json_integer_value(v);
}

/* "2006-01-02T15:04:05.000000Z" */
static int is_micro_time(const char *s)
{
    if (strlen(s) != 27) return 0;
    for (int i = 0; i < 27; i++) {
        char ch = s[i];
        int ok = i == 4 || i == 7 ? ch == '-' : i == 10 ? ch == 'T' : i == 13 || i == 16 ? ch == ':'
                 : i == 19 ? ch == '.' : i == 26 ? ch == 'Z' : ch >= '0' && ch <= '9';
        if (!ok) return 0;
    }
    return 1;
}

/* ---- tests ----------------------------------------------------------------------------- */

TEST(kube_lease_bad_config)
{
    kube_config *kc;
    kube_client *c = tk_client(&kc);
    kube_lease *l = NULL;
    cirrus_error err;
    kube_lease_config cfg = {.ns = "default", .name = "x", .identity = "me",
                             .lease_duration_ms = 1000, .renew_deadline_ms = 1000,
                             .retry_period_ms = 200};
    ASSERT_EQ(kube_lease_new(c, &cfg, &l, &err), CIRRUS_EINVAL);
    cfg.lease_duration_ms = 3000;
    cfg.retry_period_ms = 900; /* 1.2 x 900 > 1000 */
    ASSERT_EQ(kube_lease_new(c, &cfg, &l, &err), CIRRUS_EINVAL);
    cfg.retry_period_ms = 200;
    cfg.identity = "";
    ASSERT_EQ(kube_lease_new(c, &cfg, &l, &err), CIRRUS_EINVAL);
    cfg.identity = "me";
    cfg.name = "a/b";
    ASSERT_EQ(kube_lease_new(c, &cfg, &l, &err), CIRRUS_EINVAL);
    ASSERT(l == NULL);
    tk_client_free(c, kc);
}

TEST(kube_lease_acquire_fresh)
{
    char ns[64];
    cand a;
    cand_new(&a);
    tk_namespace(a.c, "lease", ns, sizeof ns);
    cand_run(&a, ns, "cand-a", 3000, 2000, 250);
    ASSERT(!kube_lease_is_leader(a.l));

    cand *cs[] = {&a};
    ASSERT(poll_all(cs, 1, has_started, NULL, &a, 30000));
    ASSERT(kube_lease_is_leader(a.l));
    ASSERT_EQ(a.started, 1);
    ASSERT_EQ(a.stopped, 0);
    ASSERT(!strcmp(kube_lease_holder(a.l, hb, sizeof hb), "cand-a"));

    json_t *lease = get_lease(a.c, ns);
    ASSERT(!strcmp(spec_str(lease, "holderIdentity"), "cand-a"));
    ASSERT_EQ(spec_int(lease, "leaseDurationSeconds"), 3);
    ASSERT_EQ(spec_int(lease, "leaseTransitions"), 0);
    ASSERT(is_micro_time(spec_str(lease, "acquireTime")));
    ASSERT(is_micro_time(spec_str(lease, "renewTime")));
    char acquired[40], renewed[40];
    snprintf(acquired, sizeof acquired, "%s", spec_str(lease, "acquireTime"));
    snprintf(renewed, sizeof renewed, "%s", spec_str(lease, "renewTime"));
    json_decref(lease);

    /* It keeps renewing: renewTime moves, acquireTime and leaseTransitions stay. */
    poll_all(cs, 1, NULL, NULL, NULL, 1500);
    ASSERT(kube_lease_is_leader(a.l));
    ASSERT_EQ(a.stopped, 0);
    kube_lease_stats st;
    kube_lease_get_stats(a.l, &st);
    ASSERT(st.renewals >= 1);
    ASSERT_EQ(st.acquired, 1);
    lease = get_lease(a.c, ns);
    ASSERT(!strcmp(spec_str(lease, "acquireTime"), acquired));
    ASSERT(strcmp(spec_str(lease, "renewTime"), renewed) > 0); /* same format: sorts by time */
    ASSERT_EQ(spec_int(lease, "leaseTransitions"), 0);
    json_decref(lease);
    cand_free(&a);
}

static cand *g_a, *g_b;

/* While a renews, b never leads and a never stops. */
static void a_keeps_lead(void *ctx)
{
    (void)ctx;
    if (g_b->started) TEST_FAIL("the second candidate acquired a lease that was being renewed");
    if (g_a->stopped) TEST_FAIL("the leader stopped leading while renewing");
}

TEST(kube_lease_takeover)
{
    char ns[64];
    cand a, b;
    cand_new(&a);
    tk_namespace(a.c, "lease", ns, sizeof ns);
    cand_run(&a, ns, "cand-a", 3000, 2000, 250);
    cand *only_a[] = {&a};
    ASSERT(poll_all(only_a, 1, has_started, NULL, &a, 30000));
    cand_new(&b);
    cand_run(&b, ns, "cand-b", 3000, 2000, 250);
    g_a = &a;
    g_b = &b;

    /* Twice the lease duration with both running: b stays a candidate. */
    cand *both[] = {&a, &b};
    poll_all(both, 2, NULL, a_keeps_lead, NULL, 6000);
    ASSERT(kube_lease_is_leader(a.l));
    ASSERT(!kube_lease_is_leader(b.l));
    ASSERT(!strcmp(kube_lease_holder(b.l, hb, sizeof hb), "cand-a"));

    /* a hangs (its client is no longer polled): b takes over once the record has not changed
     * for the lease duration on b's clock. */
    int64_t t_stop = kube_now_ms();
    cand *only_b[] = {&b};
    ASSERT(poll_all(only_b, 1, has_started, NULL, &b, 30000));
    ASSERT(b.started_ms - t_stop >= 3000 / 2);
    ASSERT(kube_lease_is_leader(b.l));
    ASSERT(!kube_lease_is_leader(a.l)); /* past its renew deadline, even before its ticker ran */
    json_t *lease = get_lease(b.c, ns);
    ASSERT(!strcmp(spec_str(lease, "holderIdentity"), "cand-b"));
    ASSERT_EQ(spec_int(lease, "leaseTransitions"), 1);
    json_decref(lease);

    /* a comes back: it stops leading and does not take the lease back while b renews. */
    ASSERT(poll_all(both, 2, has_stopped, NULL, &a, 15000));
    ASSERT_EQ(a.stopped, 1);
    poll_all(both, 2, NULL, NULL, NULL, 1000);
    ASSERT_EQ(a.started, 1);
    ASSERT_EQ(b.stopped, 0);
    ASSERT(kube_lease_is_leader(b.l));
    ASSERT(!strcmp(kube_lease_holder(a.l, hb, sizeof hb), "cand-b"));
    cand_free(&b);
    cand_free(&a);
}

/* A leader held up past its renew deadline with nobody else running stops leading, then wins
 * its own record back: a resumption (the operator keeps its uncommitted counts across it).
 * Another's takeover is not one. */
TEST(kube_lease_resumed)
{
    char ns[64];
    cand a, b;
    cand_new(&a);
    tk_namespace(a.c, "lease", ns, sizeof ns);
    cand_run(&a, ns, "cand-a", 3000, 2000, 250);
    cand *only_a[] = {&a};
    ASSERT(poll_all(only_a, 1, has_started, NULL, &a, 30000));
    ASSERT(!kube_lease_resumed(a.l)); /* it created the Lease */

    usleep(2300 * 1000); /* past the 2 s renew deadline, within the 3 s lease */
    ASSERT(poll_all(only_a, 1, started_twice, NULL, &a, 15000));
    ASSERT_EQ(a.stopped, 1);
    ASSERT(kube_lease_resumed(a.l));
    json_t *lease = get_lease(a.c, ns);
    ASSERT(!strcmp(spec_str(lease, "holderIdentity"), "cand-a"));
    ASSERT_EQ(spec_int(lease, "leaseTransitions"), 0);
    json_decref(lease);

    /* a hangs for good: b takes over, which is no resumption. */
    cand_new(&b);
    cand_run(&b, ns, "cand-b", 3000, 2000, 250);
    cand *only_b[] = {&b};
    ASSERT(poll_all(only_b, 1, has_started, NULL, &b, 30000));
    ASSERT(!kube_lease_resumed(b.l));
    cand_free(&b);
    cand_free(&a);
}

TEST(kube_lease_release)
{
    char ns[64];
    cand a, b;
    /* A long lease: a takeover before it runs out can only come from the release. */
    cand_new(&a);
    tk_namespace(a.c, "lease", ns, sizeof ns);
    cand_run(&a, ns, "cand-a", 10000, 6000, 250);
    cand *only_a[] = {&a};
    ASSERT(poll_all(only_a, 1, has_started, NULL, &a, 30000));
    cand_new(&b);
    cand_run(&b, ns, "cand-b", 10000, 6000, 250);
    g_a = &a;
    g_b = &b;
    cand *both[] = {&a, &b};
    poll_all(both, 2, NULL, a_keeps_lead, NULL, 1000);

    cirrus_error err;
    ASSERT_OK(kube_lease_release(a.l, &err));
    ASSERT(!kube_lease_is_leader(a.l));
    int64_t t_release = kube_now_ms();
    json_t *lease = get_lease(a.c, ns);
    ASSERT(!strcmp(spec_str(lease, "holderIdentity"), ""));
    ASSERT_EQ(spec_int(lease, "leaseDurationSeconds"), 1);
    ASSERT_EQ(spec_int(lease, "leaseTransitions"), 0);
    json_decref(lease);

    ASSERT(poll_all(both, 2, has_started, NULL, &b, 30000));
    ASSERT_LT(b.started_ms - t_release, 10000);
    lease = get_lease(b.c, ns);
    ASSERT(!strcmp(spec_str(lease, "holderIdentity"), "cand-b"));
    ASSERT_EQ(spec_int(lease, "leaseTransitions"), 1);
    ASSERT_EQ(spec_int(lease, "leaseDurationSeconds"), 10);
    json_decref(lease);

    /* Released means idle: a neither tries again nor reports a loss it asked for. */
    poll_all(both, 2, NULL, NULL, NULL, 1000);
    ASSERT_EQ(a.started, 1);
    ASSERT_EQ(a.stopped, 0);
    ASSERT(!kube_lease_is_leader(a.l));
    ASSERT_OK(kube_lease_release(a.l, &err)); /* again: nothing to do */
    ASSERT(kube_lease_is_leader(b.l));
    cand_free(&b);
    cand_free(&a);
}

TEST(kube_lease_stolen)
{
    char ns[64];
    cand a;
    cand_new(&a);
    tk_namespace(a.c, "lease", ns, sizeof ns);
    cand_run(&a, ns, "cand-a", 3000, 2000, 250);
    cand *cs[] = {&a};
    ASSERT(poll_all(cs, 1, has_started, NULL, &a, 30000));
    poll_all(cs, 1, NULL, NULL, NULL, 500);
    ASSERT(is_leader(&a));

    /* Another client writes a different holder (a is not polled meanwhile: no race). */
    cirrus_error err;
    kube_config *tcfg;
    kube_client *thief = tk_client(&tcfg);
    json_t *lease = get_lease(thief, ns);
    json_t *spec = json_object_get(lease, "spec");
    json_object_set_new(spec, "holderIdentity", json_string("thief"));
    char path[256];
    snprintf(path, sizeof path, "/apis/coordination.k8s.io/v1/namespaces/%s/leases/%s", ns,
             LEASE_NAME);
    ASSERT_OK(kube_update(thief, path, lease, NULL, &err));
    json_decref(lease);

    /* a's next renewal conflicts, it re-reads the Lease and sees it lost. */
    ASSERT(poll_all(cs, 1, has_stopped, NULL, &a, 15000));
    ASSERT_EQ(a.stopped, 1);
    ASSERT(a.stopped_ms >= a.started_ms);
    ASSERT(!kube_lease_is_leader(a.l));
    ASSERT(!strcmp(kube_lease_holder(a.l, hb, sizeof hb), "thief"));

    /* The thief never renews: a takes it back once it has expired on a's clock. */
    ASSERT(poll_all(cs, 1, started_twice, NULL, &a, 30000));
    ASSERT(a.started_ms - a.stopped_ms >= 3000 / 2);
    lease = get_lease(thief, ns);
    ASSERT(!strcmp(spec_str(lease, "holderIdentity"), "cand-a"));
    ASSERT_EQ(spec_int(lease, "leaseTransitions"), 1);
    json_decref(lease);
    tk_client_free(thief, tcfg);
    cand_free(&a);
}

/* ---- the elector in its own thread (kube_lease_start) ---------------------------------- */

/* Call kube_lease_dispatch every 10 ms until done(ctx) or timeout_ms. */
static int dispatch_until(cand *x, int (*done)(void *), int timeout_ms)
{
    int64_t end = kube_now_ms() + timeout_ms;
    for (;;) {
        kube_lease_dispatch(x->l);
        if (done(x)) return 1;
        if (kube_now_ms() >= end) return 0;
        usleep(10 * 1000);
    }
}

static kube_lease_stats stats_of(cand *x)
{
    kube_lease_stats st;
    kube_lease_get_stats(x->l, &st);
    return st;
}

static void steal(const char *ns, const char *thief_id)
{
    cirrus_error err;
    kube_config *tcfg;
    kube_client *thief = tk_client(&tcfg);
    json_t *lease = get_lease(thief, ns);
    json_object_set_new(json_object_get(lease, "spec"), "holderIdentity", json_string(thief_id));
    char path[256];
    snprintf(path, sizeof path, "/apis/coordination.k8s.io/v1/namespaces/%s/leases/%s", ns,
             LEASE_NAME);
    ASSERT_OK(kube_update(thief, path, lease, NULL, &err));
    json_decref(lease);
    tk_client_free(thief, tcfg);
}

/* The caller's loop held up (a request of its own answered late) for three renew deadlines:
 * in the ticker mode that costs the lease (kube_lease_resumed above); in its own thread the
 * elector renews meanwhile and the caller still leads, in the same term. A term that ends and
 * another that begins between two dispatches are both told, in order; a stolen Lease is seen;
 * release stops the thread and clears the holder. */
TEST(kube_lease_thread_keeps_lease_while_loop_held)
{
    char ns[64];
    cand a;
    cand_new(&a);
    tk_namespace(a.c, "lease", ns, sizeof ns);
    kube_lease_config cfg = {.ns = ns, .name = LEASE_NAME, .identity = "cand-a",
                             .lease_duration_ms = 3000, .renew_deadline_ms = 2000,
                             .retry_period_ms = 250, .on_started_leading = on_started,
                             .on_stopped_leading = on_stopped, .ctx = &a};
    cirrus_error err;
    ASSERT_OK(kube_lease_start(getenv("KUBECONFIG"), &cfg, &a.l, &err));
    ASSERT(dispatch_until(&a, has_started, 30000));
    ASSERT(kube_lease_is_leader(a.l));
    ASSERT(!kube_lease_resumed(a.l)); /* it created the Lease */

    sleep(6); /* no dispatch, no poll: three renew deadlines */
    ASSERT(kube_lease_is_leader(a.l));
    kube_lease_dispatch(a.l);
    ASSERT_EQ(a.started, 1);
    ASSERT_EQ(a.stopped, 0);
    kube_lease_stats st = stats_of(&a);
    ASSERT_EQ(st.lost, 0);
    ASSERT_EQ(st.acquired, 1);
    ASSERT(st.renewals >= 6000 / 250 / 2); /* it renewed all along (one a retry period) */
    json_t *lease = get_lease(a.c, ns);
    ASSERT(!strcmp(spec_str(lease, "holderIdentity"), "cand-a"));
    ASSERT_EQ(spec_int(lease, "leaseTransitions"), 0);
    json_decref(lease);

    /* Stolen while the caller does not look: the thread sees the thief at its next renewal;
     * at once the caller leads no more, before being told. The thief never renews, so the
     * thread takes the Lease back once it expired; one dispatch then tells both, in order. */
    steal(ns, "thief");
    int64_t end = kube_now_ms() + 30000;
    while (stats_of(&a).lost < 1 && kube_now_ms() < end) usleep(10 * 1000);
    ASSERT_EQ(stats_of(&a).lost, 1);
    ASSERT(!kube_lease_is_leader(a.l));
    while (stats_of(&a).acquired < 2 && kube_now_ms() < end) usleep(10 * 1000);
    ASSERT_EQ(stats_of(&a).acquired, 2);
    ASSERT(!kube_lease_is_leader(a.l)); /* a new term the caller was not told of yet */
    kube_lease_dispatch(a.l);
    ASSERT_EQ(a.stopped, 1);
    ASSERT_EQ(a.started, 2);
    ASSERT(a.stopped_ms <= a.started_ms);
    ASSERT(kube_lease_is_leader(a.l));
    ASSERT(!kube_lease_resumed(a.l)); /* the thief's record: a takeover, no resumption */
    ASSERT(!strcmp(kube_lease_holder(a.l, hb, sizeof hb), "cand-a"));

    ASSERT_OK(kube_lease_release(a.l, &err));
    ASSERT(!kube_lease_is_leader(a.l));
    lease = get_lease(a.c, ns);
    ASSERT(!strcmp(spec_str(lease, "holderIdentity"), ""));
    ASSERT_EQ(spec_int(lease, "leaseTransitions"), 1);
    json_decref(lease);
    kube_lease_dispatch(a.l); /* released: no loss is reported */
    ASSERT_EQ(a.stopped, 1);
    cand_free(&a);
}
