/* failpolicy: runPolicy.podFailurePolicy judged on hand-written pods (the defaults Ignore only
 * proven preemptions; crashes by signal count; user rules in order; FailJob), the checks an
 * object the API server did not validate gets, the CRD's default being the operator's, and
 * the Failed condition a FailJob verdict gives the status. */
#include <string.h>

#include <jansson.h>

#include "../../operator/cache_slim.h"
#include "../../operator/failpolicy.h"
#include "../../operator/jobstatus.h"
#include "../../operator/kube/yamljson.h"
#include "../unit/test.h"

static json_t *spec_with(const char *rules_json)
{
    json_t *spec = json_loads("{\"runPolicy\":{}}", 0, NULL);
    if (rules_json)
        json_object_set_new(json_object_get(spec, "runPolicy"), "podFailurePolicy",
                            json_pack("{s:o}", "rules", json_loads(rules_json, 0, NULL)));
    return spec;
}

static failpolicy policy_of(const char *rules_json)
{
    json_t *spec = spec_with(rules_json);
    failpolicy p;
    cirrus_error err = {0};
    if (failpolicy_from_spec(spec, &p, &err)) TEST_FAIL("failpolicy_from_spec: %s", err.msg);
    json_decref(spec);
    return p;
}

/* A pod in phase Failed: its trainer container's exit code (-1: none), status.reason (NULL:
 * none) and a True condition of this type (NULL: none). */
static json_t *failed_pod(int code, const char *reason, const char *condition)
{
    json_t *st = json_pack("{s:s}", "phase", "Failed");
    if (code >= 0)
        json_object_set_new(st, "containerStatuses",
                            json_pack("[{s:s, s:{s:{s:i}}}]", "name", "trainer", "state",
                                      "terminated", "exitCode", code));
    if (reason) json_object_set_new(st, "reason", json_string(reason));
    if (condition)
        json_object_set_new(st, "conditions",
                            json_pack("[{s:s, s:s, s:s}]", "type", condition, "status", "True",
                                      "reason", "PreemptionByScheduler"));
    return json_pack("{s:o}", "status", st);
}

static failpolicy_action judge(const failpolicy *p, int code, const char *reason,
                               const char *condition, int *rule)
{
    json_t *pod = failed_pod(code, reason, condition), *slim = json_deep_copy(pod);
    failpolicy_action a = failpolicy_judge(p, pod, rule);
    /* The same judgement from what the operator's cache keeps of the pod (cache_slim.h). */
    int slim_rule = -2;
    cache_slim_pod(slim);
    if (failpolicy_judge(p, slim, &slim_rule) != a || (rule && slim_rule != *rule))
        TEST_FAIL("the cache's slimmed pod is judged otherwise");
    json_decref(slim);
    json_decref(pod);
    return a;
}

/* Issue 13, defect 2: a crash by signal (139, 134, 132, 137) or a pod with no exit code was
 * taken for a preemption and never counted; a crash loop ran forever. */
TEST(failpolicy_defaults_count_crashes_ignore_proven_preemptions)
{
    failpolicy p = policy_of(NULL); /* no podFailurePolicy: the defaults */
    int rule;
    const int crashes[] = {1, 2, 127, 128, 132, 134, 137, 139, 143, 255};
    for (size_t i = 0; i < sizeof crashes / sizeof *crashes; i++) {
        ASSERT_EQ(judge(&p, crashes[i], NULL, NULL, &rule), FAILPOLICY_COUNT);
        ASSERT_EQ(rule, -1);
    }
    ASSERT_EQ(judge(&p, -1, NULL, NULL, &rule), FAILPOLICY_COUNT); /* no exit code */
    ASSERT_EQ(judge(&p, 0, NULL, NULL, &rule), FAILPOLICY_COUNT);  /* Failed, yet exit 0 */
    /* Proof: the DisruptionTarget condition (whatever the exit code), a node's reason. */
    ASSERT_EQ(judge(&p, 143, NULL, "DisruptionTarget", &rule), FAILPOLICY_IGNORE);
    ASSERT_EQ(rule, 0);
    ASSERT_EQ(judge(&p, 1, NULL, "DisruptionTarget", &rule), FAILPOLICY_IGNORE);
    ASSERT_EQ(judge(&p, -1, "Evicted", NULL, &rule), FAILPOLICY_IGNORE);
    ASSERT_EQ(rule, 1);
    ASSERT_EQ(judge(&p, 137, "NodeShutdown", NULL, &rule), FAILPOLICY_IGNORE);
    ASSERT_EQ(judge(&p, -1, "UnexpectedAdmissionError", NULL, &rule), FAILPOLICY_IGNORE);
    ASSERT_EQ(judge(&p, -1, "DeadlineExceeded", NULL, &rule), FAILPOLICY_COUNT);
    /* A condition present but not True proves nothing. */
    json_t *pod = json_loads("{\"status\":{\"phase\":\"Failed\",\"conditions\":[{\"type\":"
                             "\"DisruptionTarget\",\"status\":\"False\"}]}}", 0, NULL);
    ASSERT_EQ(failpolicy_judge(&p, pod, &rule), FAILPOLICY_COUNT);
    json_decref(pod);
    failpolicy_free(&p);
}

TEST(failpolicy_rules_in_order)
{
    failpolicy p = policy_of(
        "[{\"action\":\"FailJob\",\"onExitCodes\":{\"containerName\":\"trainer\","
        "\"operator\":\"In\",\"values\":[132]}},"
        "{\"action\":\"Ignore\",\"onPodConditions\":[{\"type\":\"DisruptionTarget\"}]},"
        "{\"action\":\"Ignore\",\"onExitCodes\":{\"operator\":\"NotIn\",\"values\":[1,2,132]}},"
        "{\"action\":\"Count\",\"onPodReasons\":[\"Evicted\"]}]");
    int rule;
    ASSERT_EQ(judge(&p, 132, NULL, "DisruptionTarget", &rule), FAILPOLICY_FAIL_JOB);
    ASSERT_EQ(rule, 0); /* the first match wins */
    ASSERT_EQ(judge(&p, 1, NULL, "DisruptionTarget", &rule), FAILPOLICY_IGNORE);
    ASSERT_EQ(rule, 1);
    /* Status unset in a pattern means "True". */
    ASSERT_EQ(judge(&p, 137, NULL, NULL, &rule), FAILPOLICY_IGNORE); /* NotIn [1,2,132] */
    ASSERT_EQ(rule, 2);
    ASSERT_EQ(judge(&p, 2, NULL, NULL, &rule), FAILPOLICY_COUNT); /* no rule */
    ASSERT_EQ(rule, -1);
    /* NotIn never matches exit 0 or a missing exit code: the reason rule decides. */
    ASSERT_EQ(judge(&p, -1, "Evicted", NULL, &rule), FAILPOLICY_COUNT);
    ASSERT_EQ(rule, 3);
    ASSERT_EQ(judge(&p, 0, NULL, NULL, &rule), FAILPOLICY_COUNT);
    ASSERT_EQ(rule, -1);
    failpolicy_free(&p);
    /* No rules at all: every failed pod counts, DisruptionTarget or not. */
    p = policy_of("[]");
    ASSERT_EQ(judge(&p, 143, NULL, "DisruptionTarget", &rule), FAILPOLICY_COUNT);
    failpolicy_free(&p);
    /* containerName names another container: the trainer's exit does not match. */
    json_t *pod = json_loads("{\"status\":{\"phase\":\"Failed\",\"containerStatuses\":[{\"name\":"
                             "\"sidecar\",\"state\":{\"terminated\":{\"exitCode\":132}}}]}}",
                             0, NULL);
    p = policy_of("[{\"action\":\"FailJob\",\"onExitCodes\":{\"containerName\":\"trainer\","
                  "\"operator\":\"In\",\"values\":[132]}}]");
    ASSERT_EQ(failpolicy_judge(&p, pod, &rule), FAILPOLICY_COUNT);
    failpolicy_free(&p);
    json_decref(pod);
}

static void refused(const char *rules_json, const char *words)
{
    json_t *spec = spec_with(rules_json);
    failpolicy p = {0};
    cirrus_error err = {0};
    int rc = failpolicy_from_spec(spec, &p, &err);
    json_decref(spec);
    if (rc != CIRRUS_EINVAL) TEST_FAIL("accepted %s", rules_json);
    if (!strstr(err.msg, words)) TEST_FAIL("'%s' does not say '%s'", err.msg, words);
    if (p.rules) TEST_FAIL("rules kept after a refusal");
}

/* What the CRD's rules refuse, refused again for an object the API server did not check. */
TEST(failpolicy_refuses_what_the_crd_refuses)
{
    refused("[{\"action\":\"Retry\",\"onPodReasons\":[\"Evicted\"]}]",
            "rules[0].action must be Ignore, Count or FailJob");
    refused("[{\"action\":\"Ignore\"}]", "rules[0] needs exactly one of");
    refused("[{\"action\":\"Ignore\",\"onPodReasons\":[\"Evicted\"],\"onPodConditions\":"
            "[{\"type\":\"DisruptionTarget\"}]}]",
            "rules[0] needs exactly one of");
    refused("[{\"action\":\"Count\",\"onExitCodes\":{\"operator\":\"In\",\"values\":[0,1]}}]",
            "0 cannot be used with operator In");
    refused("[{\"action\":\"Count\",\"onExitCodes\":{\"operator\":\"Is\",\"values\":[1]}}]",
            "operator must be In or NotIn");
    refused("[{\"action\":\"Count\",\"onExitCodes\":{\"operator\":\"In\",\"values\":[]}}]",
            "must have 1 to 255 exit codes");
    refused("[{\"action\":\"Count\",\"onExitCodes\":{\"operator\":\"In\",\"values\":[256]}}]",
            "values[0] must be an exit code");
    refused("[{\"action\":\"Count\",\"onExitCodes\":{\"containerName\":\"x\",\"operator\":"
            "\"In\",\"values\":[1]}}]",
            "containerName must be \"trainer\"");
    refused("[{\"action\":\"Ignore\",\"onPodConditions\":[{\"status\":\"True\"}]}]",
            "onPodConditions[0].type is required");
    refused("[{\"action\":\"Ignore\",\"onPodConditions\":[{\"type\":\"X\",\"status\":\"Yes\"}]}]",
            "status must be True, False or Unknown");
    refused("[{\"action\":\"Ignore\",\"onPodReasons\":[]}]", "must have 1 to 20 reasons");
    char many[4096] = "[";
    for (int i = 0; i <= FAILPOLICY_MAX_RULES; i++)
        strcat(many, i ? ",{\"action\":\"Count\",\"onPodReasons\":[\"x\"]}"
                       : "{\"action\":\"Count\",\"onPodReasons\":[\"x\"]}");
    strcat(many, "]");
    refused(many, "at most 20 rules");
}

/* The CRD's default rules (what `kubectl get -o yaml` shows a user) are the ones the operator
 * uses for an object without any: one set of defaults, written twice, kept the same here. */
TEST(failpolicy_crd_default_is_the_operators)
{
    char path[512];
    const char *slash = strrchr(__FILE__, '/');
    snprintf(path, sizeof path, "%.*s/../../manifests/00-crd.yaml",
             slash ? (int)(slash - __FILE__) : 1, slash ? __FILE__ : ".");
    FILE *f = fopen(path, "rb");
    if (!f) f = fopen("manifests/00-crd.yaml", "rb");
    ASSERT(f);
    static char text[1 << 20];
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = 0;
    const char *doc = strstr(text, "\napiVersion:"); /* after the generated header */
    ASSERT(doc);
    json_t *crd = NULL;
    cirrus_error err = {0};
    ASSERT_OK(kube_yaml_parse(doc + 1, strlen(doc + 1), "00-crd.yaml", &crd, &err));
    json_t *props = json_object_get(
        json_object_get(json_object_get(json_array_get(json_object_get(json_object_get(crd,
                                                                                       "spec"),
                                                                       "versions"),
                                                       0),
                                        "schema"),
                        "openAPIV3Schema"),
        "properties");
    json_t *pfp = json_object_get(
        json_object_get(json_object_get(json_object_get(json_object_get(props, "spec"),
                                                        "properties"),
                                        "runPolicy"),
                        "properties"),
        "podFailurePolicy");
    json_t *crd_rules = json_object_get(json_object_get(pfp, "default"), "rules");
    ASSERT(crd_rules);
    json_t *ours = json_loads(FAILPOLICY_DEFAULT_RULES, 0, NULL);
    ASSERT(ours);
    if (!json_equal(crd_rules, ours)) {
        char *a = json_dumps(crd_rules, JSON_COMPACT), *b = json_dumps(ours, JSON_COMPACT);
        TEST_FAIL("CRD default %s != FAILPOLICY_DEFAULT_RULES %s", a, b);
    }
    json_decref(ours);
    json_decref(crd);
}

static const json_t *condition(const json_t *status, const char *type)
{
    size_t i;
    const json_t *c;
    json_array_foreach(json_object_get(status, "conditions"), i, c)
    {
        if (!strcmp(json_string_value(json_object_get(c, "type")), type)) return c;
    }
    return NULL;
}

/* A FailJob verdict fails the job with reason PodFailurePolicy, and the status keeps saying
 * so after the verdict itself is forgotten (a new leader reads it from the status). */
TEST(failpolicy_failjob_fails_the_job_and_stays_said)
{
    job_observed o = {.backoff_limit = 6, .generation = 1};
    region_observed *r = &o.regions[o.n_regions++];
    r->name = "r1";
    r->n_stages = 1;
    r->replicas = r->min = 1;
    r->ready[0] = 1;
    r->gateway_ready = 1;
    r->clients = 1;
    r->failures = 1;
    ASSERT_EQ(jobstatus_phase(&o, "Running", 1), PHASE_RUNNING);
    o.policy_failure = "pod j-r1-c0 failed (exit 132): runPolicy.podFailurePolicy.rules[0]: FailJob";
    ASSERT_EQ(jobstatus_phase(&o, "Running", 1), PHASE_FAILED);
    json_t *st = jobstatus_build(&o, NULL, "2026-11-22T01:02:03Z");
    const json_t *f = condition(st, "Failed");
    ASSERT(f && !strcmp(json_string_value(json_object_get(f, "status")), "True"));
    ASSERT(!strcmp(json_string_value(json_object_get(f, "reason")), "PodFailurePolicy"));
    ASSERT(!strcmp(json_string_value(json_object_get(f, "message")), o.policy_failure));
    o.policy_failure = NULL; /* a restarted operator */
    json_t *st2 = jobstatus_build(&o, st, "2026-11-22T01:05:00Z");
    f = condition(st2, "Failed");
    ASSERT(!strcmp(json_string_value(json_object_get(st2, "phase")), "Failed"));
    ASSERT(!strcmp(json_string_value(json_object_get(f, "reason")), "PodFailurePolicy"));
    ASSERT(strstr(json_string_value(json_object_get(f, "message")), "rules[0]: FailJob"));
    json_decref(st);
    json_decref(st2);
}
