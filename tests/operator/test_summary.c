/* Client summaries: the line `cirrus-trainer client --summary-file` writes, read back from a
 * finished client pod's termination message (podstate.c), and what it does to the status
 * (jobstatus.c): a good message's figures replace the gateway's last ones; a malformed,
 * out-of-range or oversized one is refused as a whole, naming what is wrong. */
#include <math.h>
#include <string.h>

#include <jansson.h>

#include "../../common/role_args.h"
#include "../../operator/jobstatus.h"
#include "../../operator/podstate.h"
#include "../unit/test.h"

static int parse(const char *msg, client_summary *s, cirrus_error *err)
{
    return client_summary_parse(msg, strlen(msg), 300, s, err);
}

TEST(summary_parse_good)
{
    client_summary s;
    cirrus_error err = {0};
    /* What the trainer writes (tests/cli checks that side), with its newline. */
    ASSERT_OK(parse("{\"step\":300,\"loss\":1.875,\"val_loss\":2.25,\"tokens\":76800}\n", &s,
                    &err));
    ASSERT_EQ(s.step, 300);
    ASSERT_NEAR(s.loss, 1.875, 0);
    ASSERT_NEAR(s.val_loss, 2.25, 0);
    ASSERT_EQ(s.tokens, 76800);
    /* No validation loss (a follower), or none at all (a loss that was not finite): null. */
    ASSERT_OK(parse("{\"step\":0,\"loss\":null,\"val_loss\":null,\"tokens\":0}", &s, &err));
    ASSERT_EQ(s.step, 0);
    ASSERT(isnan(s.loss) && isnan(s.val_loss));
    ASSERT_OK(parse("{\"step\":7,\"tokens\":1}", &s, &err)); /* absent: none */
    ASSERT(isnan(s.loss) && isnan(s.val_loss));
    /* A newer trainer's extra member is not read, and does not spoil the rest. */
    ASSERT_OK(parse("{\"step\":5,\"loss\":3,\"val_loss\":4,\"tokens\":9,\"seconds\":1.5}", &s,
                    &err));
    ASSERT_EQ(s.step, 5);
    ASSERT_NEAR(s.loss, 3, 0);
}

/* Each bad message: refused (CIRRUS_ECORRUPT), err naming what is wrong, *out untouched. */
static void refused(const char *msg, const char *why)
{
    client_summary s = {.step = -42};
    cirrus_error err = {0};
    int rc = parse(msg, &s, &err);
    if (rc != CIRRUS_ECORRUPT || !strstr(err.msg, why) || s.step != -42)
        TEST_FAIL("'%s': rc %d, '%s' (want '%s')", msg, rc, err.msg, why);
}

TEST(summary_parse_malformed)
{
    refused("", "empty");
    refused("step 300", "not JSON");
    refused("{\"step\":300,\"tokens\":1", "not JSON");
    refused("{\"step\":300,\"tokens\":1} {}", "not JSON"); /* one object, nothing after */
    refused("[300]", "not a JSON object");
    refused("\"done\"", "not JSON"); /* a bare value: an object or array expected */
    refused("{\"step\":300,\"step\":3,\"tokens\":1}", "not JSON"); /* duplicate member */
    refused("{\"loss\":1,\"tokens\":1}", "step is not an integer");
    refused("{\"step\":\"300\",\"tokens\":1}", "step is not an integer");
    refused("{\"step\":300.0,\"tokens\":1}", "step is not an integer");
    refused("{\"step\":300}", "tokens is not an integer >= 0");
    refused("{\"step\":300,\"tokens\":1.5}", "tokens is not an integer >= 0");
    refused("{\"step\":300,\"loss\":\"low\",\"tokens\":1}", "loss is not a number or null");
    refused("{\"step\":300,\"val_loss\":true,\"tokens\":1}", "val_loss is not a number or null");
}

TEST(summary_parse_out_of_range)
{
    refused("{\"step\":-1,\"tokens\":1}", "step -1 is not in [0, 300] (spec.steps)");
    refused("{\"step\":301,\"tokens\":1}", "step 301 is not in [0, 300]");
    refused("{\"step\":99999999999999999999,\"tokens\":1}", "not JSON"); /* past int64 */
    refused("{\"step\":3,\"tokens\":-5}", "tokens is not an integer >= 0");
    refused("{\"step\":3,\"loss\":-0.5,\"tokens\":1}", "loss -0.5 is not a finite number >= 0");
    refused("{\"step\":3,\"val_loss\":-1,\"tokens\":1}", "val_loss -1 is not a finite number");
    refused("{\"step\":3,\"loss\":1e999,\"tokens\":1}", "not JSON"); /* jansson: overflow */
    client_summary s;
    cirrus_error err = {0};
    const char *last = "{\"step\":3,\"tokens\":1}"; /* the last step of 3 */
    ASSERT_OK(client_summary_parse(last, strlen(last), 3, &s, &err));
}

TEST(summary_parse_oversized)
{
    /* A valid object padded to Kubernetes's limit may have been cut short there: refused
     * by its size, before parsing; one byte less is read. */
    char msg[ROLE_SUMMARY_MAX + 1];
    const char *head = "{\"step\":3,\"tokens\":1,\"pad\":\"";
    size_t n = strlen(head);
    memcpy(msg, head, n);
    memset(msg + n, 'x', ROLE_SUMMARY_MAX - n - 2);
    memcpy(msg + ROLE_SUMMARY_MAX - 2, "\"}", 3);
    ASSERT_EQ(strlen(msg), ROLE_SUMMARY_MAX);
    client_summary s;
    cirrus_error err = {0};
    ASSERT_EQ(client_summary_parse(msg, strlen(msg), 300, &s, &err), CIRRUS_ECORRUPT);
    ASSERT(strstr(err.msg, "4096 bytes, at Kubernetes's limit"));
    memmove(msg + n, msg + n + 1, strlen(msg + n)); /* one 'x' fewer */
    ASSERT_OK(client_summary_parse(msg, strlen(msg), 300, &s, &err));
    ASSERT_EQ(s.step, 3);
}

/* A client pod: phase Succeeded, the trainer container terminated with EXIT and MESSAGE
 * (NULL: no message member). */
static json_t *client_pod(const char *container, int exit_code, const char *message)
{
    json_t *term = json_pack("{s:i, s:s}", "exitCode", exit_code, "reason", "Completed");
    if (message) json_object_set_new(term, "message", json_string(message));
    return json_pack("{s:{s:s, s:[{s:s, s:{s:o}}]}}", "status", "phase", "Succeeded",
                     "containerStatuses", "name", container, "state", "terminated", term);
}

TEST(summary_from_pod)
{
    client_summary s;
    cirrus_error err = {0};
    json_t *pod =
        client_pod("trainer", 0, "{\"step\":300,\"loss\":1.5,\"val_loss\":1.75,\"tokens\":9}\n");
    ASSERT_EQ(pod_client_summary(pod, 300, &s, &err), 1);
    ASSERT_EQ(s.step, 300);
    ASSERT_NEAR(s.val_loss, 1.75, 0);
    json_decref(pod);
    /* Not exit 0: not a finished run, nothing read (whatever the message says). */
    pod = client_pod("trainer", 1, "{\"step\":300,\"tokens\":9}");
    ASSERT_EQ(pod_client_summary(pod, 300, &s, &err), 0);
    json_decref(pod);
    /* Another container's message is not the trainer's. */
    pod = client_pod("sidecar", 0, "{\"step\":300,\"tokens\":9}");
    ASSERT_EQ(pod_client_summary(pod, 300, &s, &err), 0);
    json_decref(pod);
    /* Still running (no terminated state): nothing yet. */
    pod = json_loads("{\"status\":{\"phase\":\"Running\",\"containerStatuses\":[{\"name\":"
                     "\"trainer\",\"state\":{\"running\":{}}}]}}", 0, NULL);
    ASSERT_EQ(pod_client_summary(pod, 300, &s, &err), 0);
    json_decref(pod);
    /* Exit 0 without a message, or with one that does not parse: refused, saying why. */
    pod = client_pod("trainer", 0, NULL);
    ASSERT_EQ(pod_client_summary(pod, 300, &s, &err), CIRRUS_ECORRUPT);
    ASSERT(strstr(err.msg, "without a termination message"));
    json_decref(pod);
    pod = client_pod("trainer", 0, "{\"step\":301,\"tokens\":9}");
    ASSERT_EQ(pod_client_summary(pod, 300, &s, &err), CIRRUS_ECORRUPT);
    ASSERT(strstr(err.msg, "step 301"));
    json_decref(pod);
}

static const json_t *region0(const json_t *st)
{
    return json_array_get(json_object_get(st, "regions"), 0);
}

/* The defect this fixes: a job of 300 steps whose gateway was last read at step 295 showed
 * step 295 once Succeeded. With client 0's summary, the region and the job show 300 and
 * its final losses; the rate is the gateway's last. */
TEST(summary_replaces_stale_gateway_figures)
{
    job_observed o = {.backoff_limit = 6, .generation = 1, .n_regions = 1};
    region_observed *r = &o.regions[0];
    r->name = "r1";
    r->n_stages = 1;
    r->replicas = r->min = 1;
    r->clients = r->clients_succeeded = 1;
    r->has_progress = 1;
    r->step = 295;
    r->loss = 2.5;
    r->tokens_per_s = 1000;
    json_t *stale = jobstatus_build(&o, NULL, "2026-11-22T01:00:00Z");
    ASSERT_EQ(json_integer_value(json_object_get(stale, "step")), 295);
    ASSERT(!json_object_get(region0(stale), "validationLoss"));
    r->has_summary = 1;
    r->summary_step = 300;
    r->summary_loss = 1.875;
    r->summary_val_loss = 2.25;
    json_t *st = jobstatus_build(&o, stale, "2026-11-22T01:00:10Z");
    ASSERT(!strcmp(json_string_value(json_object_get(st, "phase")), "Succeeded"));
    ASSERT(jobstatus_changed(stale, st));
    ASSERT_EQ(json_integer_value(json_object_get(region0(st), "step")), 300);
    ASSERT_NEAR(json_number_value(json_object_get(region0(st), "loss")), 1.875, 0);
    ASSERT_NEAR(json_number_value(json_object_get(region0(st), "validationLoss")), 2.25, 0);
    ASSERT_NEAR(json_number_value(json_object_get(region0(st), "tokensPerSecond")), 1000, 0);
    ASSERT_EQ(json_integer_value(json_object_get(st, "step")), 300);
    ASSERT_NEAR(json_number_value(json_object_get(st, "loss")), 1.875, 0);
    /* The gateways are no longer read, the pod is gone: the status keeps the final figures. */
    r->has_summary = r->has_progress = 0;
    json_t *kept = jobstatus_build(&o, st, "2026-11-22T02:00:00Z");
    ASSERT(!jobstatus_changed(st, kept));
    ASSERT_EQ(json_integer_value(json_object_get(region0(kept), "step")), 300);
    ASSERT_NEAR(json_number_value(json_object_get(region0(kept), "validationLoss")), 2.25, 0);
    /* A summary with no losses (null: a client that replaced a finished one ran no step)
     * leaves out a loss of an earlier step rather than pair it with the final step... */
    r->has_summary = 1;
    r->summary_loss = r->summary_val_loss = NAN;
    json_t *none = jobstatus_build(&o, stale, "2026-11-22T02:00:01Z");
    ASSERT_EQ(json_integer_value(json_object_get(region0(none), "step")), 300);
    ASSERT(!json_object_get(region0(none), "loss") &&
           !json_object_get(region0(none), "validationLoss"));
    ASSERT(json_is_null(json_object_get(none, "loss")));
    /* ...and keeps one reported for the final step itself: the status's, or the gateway's. */
    json_t *same = jobstatus_build(&o, kept, "2026-11-22T02:00:02Z");
    ASSERT_NEAR(json_number_value(json_object_get(region0(same), "loss")), 1.875, 0);
    ASSERT_NEAR(json_number_value(json_object_get(same, "loss")), 1.875, 0);
    r->has_progress = 1;
    r->step = 300;
    r->loss = 1.5;
    json_t *gw = jobstatus_build(&o, stale, "2026-11-22T02:00:03Z");
    ASSERT_NEAR(json_number_value(json_object_get(region0(gw), "loss")), 1.5, 0);
    json_decref(same);
    json_decref(gw);
    json_decref(stale);
    json_decref(st);
    json_decref(kept);
    json_decref(none);
}
