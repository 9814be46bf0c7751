/* podstate and jobstatus: pods classified from hand-written statuses (a failed pod is never
 * guessed to be a preemption), and the phase / conditions / per-region figures a SwarmJob's status gets. */
#include <string.h>

#include <jansson.h>

#include "../../operator/cache_slim.h"
#include "../../operator/jobstatus.h"
#include "../../operator/podstate.h"
#include "../unit/test.h"

/* The pod's state, and the same from what the operator's cache keeps of it (cache_slim.h:
 * a field podstate.c reads but the cache drops would make them differ). */
static enum pod_state state_of(const char *json, char *why, size_t n)
{
    json_t *pod = json_loads(json, 0, NULL);
    if (!pod) return (enum pod_state)-1;
    enum pod_state s = pod_state_of(pod, why, n);
    json_t *slim = json_deep_copy(pod);
    cache_slim_pod(slim);
    char slim_why[512] = "";
    if (pod_state_of(slim, why ? slim_why : NULL, why ? sizeof slim_why : 0) != s ||
        (why && strcmp(why, slim_why)))
        TEST_FAIL("the cache's slimmed pod is classified otherwise: %s", json);
    char r1[64], r2[64], m1[400], m2[400];
    int w1 = pod_waiting_error(pod, r1, sizeof r1, m1, sizeof m1);
    if (w1 != pod_waiting_error(slim, r2, sizeof r2, m2, sizeof m2) ||
        (w1 && (strcmp(r1, r2) || strcmp(m1, m2))))
        TEST_FAIL("the cache's slimmed pod waits otherwise: %s", json);
    json_decref(slim);
    json_decref(pod);
    return s;
}

TEST(podstate_lifecycle)
{
    char why[64];
    ASSERT_EQ(state_of("{}", why, sizeof why), POD_PENDING);
    ASSERT_EQ(state_of("{\"status\":{\"phase\":\"Pending\",\"conditions\":[{\"type\":"
                       "\"PodScheduled\",\"status\":\"False\",\"reason\":\"Unschedulable\"}]}}",
                       why, sizeof why),
              POD_UNSCHEDULABLE);
    ASSERT_EQ(state_of("{\"status\":{\"phase\":\"Running\"}}", why, sizeof why), POD_RUNNING);
    ASSERT_EQ(state_of("{\"status\":{\"phase\":\"Running\",\"conditions\":[{\"type\":\"Ready\","
                       "\"status\":\"True\"}]}}",
                       why, sizeof why),
              POD_READY);
    ASSERT_EQ(state_of("{\"metadata\":{\"deletionTimestamp\":\"2026-11-22T00:00:00Z\"},"
                       "\"status\":{\"phase\":\"Running\"}}",
                       why, sizeof why),
              POD_TERMINATING);
    ASSERT_EQ(state_of("{\"status\":{\"phase\":\"Succeeded\"}}", why, sizeof why), POD_SUCCEEDED);
}

static const char *failed_with(int code)
{
    static char buf[256];
    snprintf(buf, sizeof buf,
             "{\"status\":{\"phase\":\"Failed\",\"containerStatuses\":[{\"name\":\"trainer\","
             "\"state\":{\"terminated\":{\"exitCode\":%d}}}]}}",
             code);
    return buf;
}

/* A crashed container's termination message is its log's tail (FallbackToLogsOnError)
 * with common/crash.c's report: the signal and the offsets of Cirrus's own frames reach the
 * reason, libc's frames and the rest of the log do not. */
TEST(podstate_crash_report_in_reason)
{
    char why[384];
    const char *pod =
        "{\"status\":{\"phase\":\"Failed\",\"containerStatuses\":[{\"name\":\"trainer\","
        "\"state\":{\"terminated\":{\"exitCode\":139,\"message\":\"[client] info: step 100\\n"
        "\\ncirrus-trainer client: crashed with SIGSEGV; backtrace (addr2line -e the binary "
        "resolves the offsets):\\n/usr/local/bin/cirrus-trainer(+0x41019)[0x55d3cdf6e019]\\n"
        "/lib/x86_64-linux-gnu/libc.so.6(poll+0x10)[0x7f1623421230]\\n"
        "/usr/local/bin/cirrus-trainer(+0x5d4bb)[0x55d3cdf8a4bb]\\n\"}}}]}}";
    ASSERT_EQ(state_of(pod, why, sizeof why), POD_FAILED);
    ASSERT(!strcmp(why, "exit 139 crashed with SIGSEGV at +0x41019 +0x5d4bb"));
    /* A failed container whose log holds no crash report: the exit code alone. */
    const char *plain =
        "{\"status\":{\"phase\":\"Failed\",\"containerStatuses\":[{\"name\":\"trainer\","
        "\"state\":{\"terminated\":{\"exitCode\":1,\"message\":\"stage 1 has no live peer "
        "(+0x12)\"}}}]}}";
    ASSERT_EQ(state_of(plain, why, sizeof why), POD_FAILED);
    ASSERT(!strcmp(why, "exit 1"));
}

/* A pod that ended in phase Failed is POD_FAILED whatever ended it: whether that was a
 * preemption is the podFailurePolicy's to say (test_failpolicy.c), never guessed here from a
 * signal number or a missing exit code. */
TEST(podstate_failed_is_never_guessed_preempted)
{
    char why[96];
    ASSERT_EQ(state_of(failed_with(1), why, sizeof why), POD_FAILED);
    ASSERT(!strcmp(why, "exit 1"));
    ASSERT_EQ(state_of(failed_with(139), why, sizeof why), POD_FAILED);
    ASSERT(!strcmp(why, "exit 139"));
    ASSERT_EQ(state_of(failed_with(0), why, sizeof why), POD_FAILED);
    ASSERT_EQ(state_of("{\"status\":{\"phase\":\"Failed\"}}", why, sizeof why), POD_FAILED);
    ASSERT(!strcmp(why, "no exit code"));
    ASSERT_EQ(state_of("{\"status\":{\"phase\":\"Failed\",\"reason\":\"Evicted\"}}", why,
                       sizeof why),
              POD_FAILED);
    ASSERT(!strcmp(why, "Evicted, no exit code"));
    ASSERT_EQ(state_of("{\"status\":{\"phase\":\"Failed\",\"conditions\":[{\"type\":"
                       "\"DisruptionTarget\",\"status\":\"True\",\"reason\":"
                       "\"PreemptionByScheduler\"}],\"containerStatuses\":[{\"state\":{"
                       "\"terminated\":{\"exitCode\":143}}}]}}",
                       why, sizeof why),
              POD_FAILED);
    ASSERT(!strcmp(why, "DisruptionTarget: PreemptionByScheduler, exit 143"));
    ASSERT_EQ(state_of("{\"status\":{\"phase\":\"Failed\",\"containerStatuses\":[{\"state\":{"
                       "\"terminated\":{\"exitCode\":137,\"reason\":\"OOMKilled\"}}}]}}",
                       why, sizeof why),
              POD_FAILED);
    ASSERT(!strcmp(why, "OOMKilled, exit 137"));
    ASSERT(pod_state_ended(POD_FAILED) && pod_state_ended(POD_SUCCEEDED) &&
           !pod_state_ended(POD_TERMINATING) && !pod_state_ended(POD_READY));
}

static void region(job_observed *o, const char *name, int ready0, int ready1, int gw)
{
    region_observed *r = &o->regions[o->n_regions++];
    memset(r, 0, sizeof *r);
    r->name = name;
    r->n_stages = 2;
    r->replicas = 2;
    r->min = 1;
    r->ready[0] = ready0;
    r->ready[1] = ready1;
    r->gateway_ready = gw;
    r->clients = 1;
}

TEST(jobstatus_phases)
{
    job_observed o = {.backoff_limit = 2, .generation = 3};
    region(&o, "r1", 2, 2, 1);
    region(&o, "r2", 0, 0, 0);
    ASSERT_EQ(jobstatus_phase(&o, NULL, 0), PHASE_DEGRADED); /* r1 can train */
    o.regions[1].ready[0] = o.regions[1].ready[1] = 1;
    o.regions[1].gateway_ready = 1;
    ASSERT_EQ(jobstatus_phase(&o, "Degraded", 1), PHASE_RUNNING);
    o.regions[0].ready[1] = 0;
    o.regions[1].ready[1] = 0;
    ASSERT_EQ(jobstatus_phase(&o, "Running", 0), PHASE_CREATED);
    ASSERT_EQ(jobstatus_phase(&o, "Running", 1), PHASE_DEGRADED); /* had started */
    o.regions[0].failures = 2;
    ASSERT_EQ(jobstatus_phase(&o, "Running", 1), PHASE_DEGRADED); /* at the limit, not past */
    o.regions[1].preemptions = 50; /* never counts */
    ASSERT_EQ(jobstatus_phase(&o, "Running", 1), PHASE_DEGRADED);
    o.regions[1].failures = 1;
    ASSERT_EQ(jobstatus_phase(&o, "Running", 1), PHASE_FAILED);
    o.regions[1].failures = 0;
    o.regions[0].clients_succeeded = o.regions[1].clients_succeeded = 1;
    ASSERT_EQ(jobstatus_phase(&o, "Running", 1), PHASE_SUCCEEDED);
    o.regions[0].clients_succeeded = 0;
    ASSERT_EQ(jobstatus_phase(&o, "Succeeded", 1), PHASE_SUCCEEDED); /* final stays final */
    ASSERT_EQ(jobstatus_phase(&o, "Failed", 1), PHASE_FAILED);
    o.suspended = 1;
    ASSERT_EQ(jobstatus_phase(&o, "Running", 1), PHASE_SUSPENDED);
    o.suspended = 0;
    o.deadline_exceeded = 1;
    ASSERT_EQ(jobstatus_phase(&o, "Running", 1), PHASE_FAILED);
    json_t *st = jobstatus_build(&o, NULL, "2026-11-22T01:00:00Z");
    json_t *conds = json_object_get(st, "conditions");
    size_t i;
    json_t *c;
    int seen = 0;
    json_array_foreach(conds, i, c)
    {
        if (strcmp(json_string_value(json_object_get(c, "type")), "Failed")) continue;
        ASSERT(!strcmp(json_string_value(json_object_get(c, "reason")), "DeadlineExceeded"));
        seen = 1;
    }
    ASSERT(seen);
    json_decref(st);
}

/* spec.successPolicy: All (every target region's clients finished) and Any (one target
 * region's), targets from the spec, and the Succeeded condition's message. */
TEST(jobstatus_success_policy)
{
    job_observed o = {.backoff_limit = 2};
    region(&o, "r1", 2, 2, 1);
    region(&o, "r2", 2, 2, 1);
    region(&o, "r3", 2, 2, 1);
    o.regions[2].clients = 0; /* a region of peers only never finishes, and never counts */
    json_error_t e;
    json_t *spec = json_loads("{}", 0, &e);
    jobstatus_read_success_policy(spec, &o);
    ASSERT(!o.success_any && !o.regions[0].success_ignored && !o.regions[2].success_ignored);
    o.regions[0].clients_succeeded = 1;
    ASSERT_EQ(jobstatus_phase(&o, "Running", 1), PHASE_RUNNING); /* All: r2 still trains */
    o.regions[1].clients_succeeded = 1;
    ASSERT_EQ(jobstatus_phase(&o, "Running", 1), PHASE_SUCCEEDED);
    json_decref(spec);

    o.regions[0].clients_succeeded = o.regions[1].clients_succeeded = 0;
    spec = json_loads("{\"successPolicy\":{\"operator\":\"Any\"}}", 0, &e);
    jobstatus_read_success_policy(spec, &o);
    ASSERT(o.success_any);
    ASSERT_EQ(jobstatus_phase(&o, "Running", 1), PHASE_RUNNING);
    o.regions[1].clients_succeeded = 1;
    ASSERT_EQ(jobstatus_phase(&o, "Running", 1), PHASE_SUCCEEDED); /* r2 alone is enough */
    json_t *st = jobstatus_build(&o, NULL, "2026-11-28T10:00:00Z");
    const char *msg = NULL;
    size_t i;
    json_t *c;
    json_array_foreach(json_object_get(st, "conditions"), i, c)
    {
        if (!strcmp(json_string_value(json_object_get(c, "type")), "Succeeded"))
            msg = json_string_value(json_object_get(c, "message"));
    }
    ASSERT(msg && !strcmp(msg, "every client of region r2 finished its steps (successPolicy Any)"));
    json_decref(st);
    json_decref(spec);

    /* Targets: only r1 counts, whatever the others did. */
    spec = json_loads("{\"successPolicy\":{\"operator\":\"All\",\"targetRegions\":[\"r1\"]}}",
                      0, &e);
    jobstatus_read_success_policy(spec, &o);
    ASSERT(!o.regions[0].success_ignored && o.regions[1].success_ignored &&
           o.regions[2].success_ignored);
    ASSERT_EQ(jobstatus_phase(&o, "Running", 1), PHASE_RUNNING); /* r2 finished: not a target */
    o.regions[0].clients_succeeded = 1;
    ASSERT_EQ(jobstatus_phase(&o, "Running", 1), PHASE_SUCCEEDED);
    json_decref(spec);
}

static const char *cond(const json_t *st, const char *type, const char *field)
{
    size_t i;
    json_t *c;
    json_array_foreach(json_object_get(st, "conditions"), i, c)
    {
        if (!strcmp(json_string_value(json_object_get(c, "type")), type))
            return json_string_value(json_object_get(c, field));
    }
    return NULL;
}

TEST(jobstatus_build_and_transitions)
{
    job_observed o = {.backoff_limit = 4, .generation = 7};
    region(&o, "r1", 2, 2, 1);
    region(&o, "r2", 1, 0, 1);
    o.regions[1].unschedulable = 2;
    o.regions[0].preemptions = 3;
    json_t *st = jobstatus_build(&o, NULL, "2026-11-22T01:00:00Z");
    ASSERT(st);
    ASSERT(!strcmp(json_string_value(json_object_get(st, "phase")), "Degraded"));
    ASSERT(!strcmp(json_string_value(json_object_get(st, "readyPeers")), "5/8"));
    ASSERT(!strcmp(json_string_value(json_object_get(st, "readyRegions")), "1/2"));
    ASSERT_EQ(json_integer_value(json_object_get(st, "observedGeneration")), 7);
    ASSERT(!strcmp(json_string_value(json_object_get(st, "startTime")), "2026-11-22T01:00:00Z"));
    /* Pods made, none ready yet, never ran: Created (not Degraded), though startTime is set. */
    job_observed fresh = o;
    for (int i = 0; i < fresh.n_regions; i++) {
        fresh.regions[i].gateway_ready = 0;
        fresh.regions[i].ready[0] = fresh.regions[i].ready[1] = 0;
    }
    json_t *created = jobstatus_build(&fresh, st, "2026-11-22T01:00:00Z");
    json_object_set_new(created, "phase", json_string("Created"));
    json_t *created2 = jobstatus_build(&fresh, created, "2026-11-22T01:00:01Z");
    ASSERT(!strcmp(json_string_value(json_object_get(created2, "phase")), "Created"));
    json_decref(created);
    json_decref(created2);
    json_t *r2 = json_array_get(json_object_get(st, "regions"), 1);
    ASSERT_EQ(json_integer_value(json_object_get(r2, "pendingPods")), 2);
    ASSERT_EQ(json_integer_value(json_array_get(json_object_get(r2, "readyPeersPerStage"), 1)), 0);
    ASSERT_EQ(json_integer_value(json_object_get(json_array_get(json_object_get(st, "regions"), 0),
                                                 "preemptions")),
              3);
    ASSERT(!strcmp(cond(st, "Degraded", "status"), "True"));
    ASSERT(strstr(cond(st, "Degraded", "message"), "region r2 stage 1"));
    ASSERT(strstr(cond(st, "Degraded", "message"), "wait for nodes"));
    ASSERT(!strcmp(cond(st, "Running", "status"), "True"));
    /* Same observations later: nothing changed but the clock, so no write is needed and the
     * transition times stay. */
    json_object_set_new(st, "step", json_integer(120)); /* written by someone else */
    json_t *again = jobstatus_build(&o, st, "2026-11-22T02:00:00Z");
    ASSERT(!jobstatus_changed(st, again));
    ASSERT(!strcmp(cond(again, "Degraded", "lastTransitionTime"), "2026-11-22T01:00:00Z"));
    ASSERT(!json_object_get(again, "step")); /* not the operator's: never in its patch */
    /* r2 recovers: Degraded flips, with the new time; startTime stays. */
    o.regions[1].ready[1] = 1;
    json_t *later = jobstatus_build(&o, again, "2026-11-22T03:00:00Z");
    ASSERT(jobstatus_changed(again, later));
    ASSERT(!strcmp(json_string_value(json_object_get(later, "phase")), "Running"));
    ASSERT(!strcmp(cond(later, "Degraded", "status"), "False"));
    ASSERT(!strcmp(cond(later, "Degraded", "lastTransitionTime"), "2026-11-22T03:00:00Z"));
    ASSERT(!strcmp(cond(later, "Running", "lastTransitionTime"), "2026-11-22T01:00:00Z"));
    ASSERT(!strcmp(json_string_value(json_object_get(later, "startTime")), "2026-11-22T01:00:00Z"));
    ASSERT(!json_object_get(later, "completionTime"));
    /* Suspended: startTime is removed (null in the merge patch), so the deadline counts
     * running time only; a second identical build changes nothing. */
    o.suspended = 1;
    json_t *susp = jobstatus_build(&o, later, "2026-11-22T04:00:00Z");
    ASSERT(json_is_null(json_object_get(susp, "startTime")));
    ASSERT(jobstatus_changed(later, susp));
    json_object_del(susp, "startTime"); /* as the server stores it */
    json_t *susp2 = jobstatus_build(&o, susp, "2026-11-22T04:00:01Z");
    ASSERT(!jobstatus_changed(susp, susp2));
    json_decref(susp);
    json_decref(susp2);
    json_decref(st);
    json_decref(again);
    json_decref(later);
}

/* A pod stuck before its container runs (a wrong image, a missing Secret) is named in the
 * PodsStarted condition with the kubelet's reason and message; a pod starting normally, or
 * one that ended, is not. */
TEST(podstate_stuck_before_running)
{
    char reason[64], message[400];
    json_t *pull = json_loads(
        "{\"metadata\":{\"name\":\"j-r1-s0-0\"},\"status\":{\"phase\":\"Pending\","
        "\"containerStatuses\":[{\"name\":\"trainer\",\"state\":{\"waiting\":{\"reason\":"
        "\"ErrImageNeverPull\",\"message\":\"Container image \\\"cirrus:v9\\\" is not present "
        "with pull policy of Never\"}}}]}}",
        0, NULL);
    json_t *slim = json_deep_copy(pull);
    cache_slim_pod(slim);
    ASSERT(pod_waiting_error(slim, reason, sizeof reason, message, sizeof message));
    json_decref(slim);
    ASSERT(pod_waiting_error(pull, reason, sizeof reason, message, sizeof message));
    ASSERT(!strcmp(reason, "ErrImageNeverPull"));
    ASSERT(strstr(message, "cirrus:v9"));
    json_t *creating = json_loads(
        "{\"status\":{\"phase\":\"Pending\",\"containerStatuses\":[{\"name\":\"trainer\","
        "\"state\":{\"waiting\":{\"reason\":\"ContainerCreating\"}}}]}}",
        0, NULL);
    ASSERT(!pod_waiting_error(creating, reason, sizeof reason, message, sizeof message));
    json_t *gone = json_deep_copy(pull);
    json_object_set_new(json_object_get(gone, "status"), "phase", json_string("Failed"));
    ASSERT(!pod_waiting_error(gone, reason, sizeof reason, message, sizeof message));
    /* In the status: False with the reason, True again once none is stuck. */
    job_observed o = {.backoff_limit = 4, .generation = 1};
    region(&o, "r1", 1, 0, 1);
    snprintf(o.stuck_reason, sizeof o.stuck_reason, "ErrImageNeverPull");
    snprintf(o.stuck_message, sizeof o.stuck_message, "pod j-r1-s0-0: %s", message);
    json_t *st = jobstatus_build(&o, NULL, "2026-11-22T01:00:00Z");
    ASSERT(!strcmp(cond(st, "PodsStarted", "status"), "False"));
    ASSERT(!strcmp(cond(st, "PodsStarted", "reason"), "ErrImageNeverPull"));
    ASSERT(strstr(cond(st, "PodsStarted", "message"), "pod j-r1-s0-0: Container image"));
    o.stuck_reason[0] = 0;
    json_t *ok = jobstatus_build(&o, st, "2026-11-22T01:00:05Z");
    ASSERT(!strcmp(cond(ok, "PodsStarted", "status"), "True"));
    json_decref(pull);
    json_decref(creating);
    json_decref(gone);
    json_decref(st);
    json_decref(ok);
}

/* The scale subresource's status: peersPerStage is the fewest peer pods of any stage of any
 * region (pods made but not ready count, as in a Deployment's status.replicas), selector the
 * job's peer pods. */
TEST(jobstatus_scale_status)
{
    job_observed o = {.backoff_limit = 4, .generation = 1, .name = "big"};
    region(&o, "r1", 2, 2, 1);
    region(&o, "r2", 1, 0, 1);
    o.regions[0].peers[0] = o.regions[0].peers[1] = 3;
    o.regions[1].peers[0] = 3;
    o.regions[1].peers[1] = 2;
    json_t *st = jobstatus_build(&o, NULL, "2026-11-22T01:00:00Z");
    ASSERT_EQ(json_integer_value(json_object_get(st, "peersPerStage")), 2);
    ASSERT(!strcmp(json_string_value(json_object_get(st, "selector")),
                   "cirrus.dev/job=big,cirrus.dev/role=peer"));
    json_decref(st);
    o.n_regions = 0; /* nothing observed yet */
    o.name = NULL;
    st = jobstatus_build(&o, NULL, "2026-11-22T01:00:00Z");
    ASSERT_EQ(json_integer_value(json_object_get(st, "peersPerStage")), 0);
    ASSERT(!json_object_get(st, "selector"));
    json_decref(st);
}
