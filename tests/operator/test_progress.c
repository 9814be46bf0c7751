/* progress: the gateways' /status parsed and judged (right job, types, finite, non-negative),
 * --resolve values checked, the status's step / loss / tokensPerSecond built from the
 * regions' figures, the ProgressCurrent condition and regions[].progressTime on fixed clocks
 * (answers ageing past progress_stale_s, first answers awaited, a restarted operator, a
 * gateway not ready, another job's answers), and the reader thread against a scripted
 * gateway on loopback reached through --resolve: figures published and announced (with the
 * time they were read, again when they did not change), another job's status ignored, a hung
 * gateway neither blocking the caller nor the shutdown. No cluster needed
 * (`operator-tests progress`). */
#include <math.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "../../operator/jobstatus.h"
#include "../../operator/progress.h"
#include "../unit/test.h"
#include "kube_test_util.h"

#define UID "6f1c2a9e-0000-4000-8000-000000000001"

static int parse(const char *body, progress_result *r)
{
    cirrus_error err = {0};
    int rc = progress_parse_status(body, strlen(body), UID, r, &err);
    if (rc && !err.msg[0]) TEST_FAIL("no message for rc %d on %s", rc, body);
    return rc;
}

TEST(progress_parse_valid)
{
    progress_result r;
    ASSERT_OK(parse("{\"job_id\":\"" UID "\",\"epoch\":3,\"step\":2279,\"loss\":2.5,"
                    "\"tokens_per_s\":2842.1,\"stages\":[{\"stage\":0,\"peers\":1}],"
                    "\"members\":[]}",
                    &r));
    ASSERT_EQ(r.step, 2279);
    ASSERT_NEAR(r.loss, 2.5, 0);
    ASSERT_NEAR(r.tokens_per_s, 2842.1, 1e-9);
    /* Before any client reported: step 0, loss and rate null (the gateway's NaN). */
    ASSERT_OK(parse("{\"job_id\":\"" UID "\",\"step\":0,\"loss\":null,\"tokens_per_s\":null}", &r));
    ASSERT_EQ(r.step, 0);
    ASSERT(isnan(r.loss));
    ASSERT(isnan(r.tokens_per_s));
    /* Integers where reals are expected are numbers too. */
    ASSERT_OK(parse("{\"job_id\":\"" UID "\",\"step\":7,\"loss\":3,\"tokens_per_s\":0}", &r));
    ASSERT_NEAR(r.loss, 3, 0);
    ASSERT_NEAR(r.tokens_per_s, 0, 0);
}

TEST(progress_parse_wrong_job)
{
    progress_result r = {.step = 42, .loss = 1, .tokens_per_s = 1};
    ASSERT_EQ(parse("{\"job_id\":\"wrong\",\"step\":5,\"loss\":1,\"tokens_per_s\":1}", &r),
              CIRRUS_EMISMATCH);
    ASSERT_EQ(r.step, 42); /* untouched */
    ASSERT_EQ(parse("{\"job_id\":\"" UID "-2\",\"step\":5,\"loss\":1,\"tokens_per_s\":1}", &r),
              CIRRUS_EMISMATCH);
    cirrus_error err;
    const char *b = "{\"job_id\":\"x\",\"step\":1,\"loss\":1,\"tokens_per_s\":1}";
    ASSERT_EQ(progress_parse_status(b, strlen(b), NULL, &r, &err), CIRRUS_EMISMATCH);
}

TEST(progress_parse_invalid)
{
    static const char *const bad[] = {
        "",
        "garbage",
        "{\"job_id\":\"" UID "\",\"step\":5",                          /* truncated */
        "[1,2,3]",
        "\"" UID "\"",
        "null",
        "{}",
        "{\"step\":5,\"loss\":1,\"tokens_per_s\":1}",                  /* no job_id */
        "{\"job_id\":7,\"step\":5,\"loss\":1,\"tokens_per_s\":1}",     /* job_id not a string */
        "{\"job_id\":\"" UID "\",\"loss\":1,\"tokens_per_s\":1}",      /* no step */
        "{\"job_id\":\"" UID "\",\"step\":5,\"tokens_per_s\":1}",      /* no loss */
        "{\"job_id\":\"" UID "\",\"step\":5,\"loss\":1}",              /* no tokens_per_s */
        "{\"job_id\":\"" UID "\",\"step\":\"5\",\"loss\":1,\"tokens_per_s\":1}",
        "{\"job_id\":\"" UID "\",\"step\":5.5,\"loss\":1,\"tokens_per_s\":1}",
        "{\"job_id\":\"" UID "\",\"step\":null,\"loss\":1,\"tokens_per_s\":1}",
        "{\"job_id\":\"" UID "\",\"step\":-1,\"loss\":1,\"tokens_per_s\":1}",
        "{\"job_id\":\"" UID "\",\"step\":5,\"loss\":-0.5,\"tokens_per_s\":1}",
        "{\"job_id\":\"" UID "\",\"step\":5,\"loss\":1,\"tokens_per_s\":-3}",
        "{\"job_id\":\"" UID "\",\"step\":5,\"loss\":\"2.5\",\"tokens_per_s\":1}",
        "{\"job_id\":\"" UID "\",\"step\":5,\"loss\":true,\"tokens_per_s\":1}",
        "{\"job_id\":\"" UID "\",\"step\":5,\"loss\":NaN,\"tokens_per_s\":1}",
        "{\"job_id\":\"" UID "\",\"step\":5,\"loss\":1e999,\"tokens_per_s\":1}",
        "{\"job_id\":\"" UID "\",\"step\":5,\"loss\":1,\"tokens_per_s\":Infinity}",
        "{\"job_id\":\"" UID "\",\"step\":99999999999999999999,\"loss\":1,\"tokens_per_s\":1}",
        "{\"job_id\":\"" UID "\",\"job_id\":\"" UID "\",\"step\":5,\"loss\":1,\"tokens_per_s\":1}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        progress_result r = {.step = 42, .loss = 1, .tokens_per_s = 1};
        int rc = parse(bad[i], &r);
        if (rc != CIRRUS_ECORRUPT) TEST_FAIL("'%s': rc %d, wanted CIRRUS_ECORRUPT", bad[i], rc);
        ASSERT_EQ(r.step, 42);
    }
    /* Not NUL-terminated: only len bytes are read. */
    progress_result r;
    const char *b = "{\"job_id\":\"" UID "\",\"step\":1,\"loss\":1,\"tokens_per_s\":1}xyz";
    cirrus_error err;
    ASSERT_OK(progress_parse_status(b, strlen(b) - 3, UID, &r, &err));
    ASSERT_EQ(progress_parse_status(b, 0, UID, &r, &err), CIRRUS_ECORRUPT);
}

/* The "outer" object of a gateway that takes outer steps across regions. */
#define BASE "\"job_id\":\"" UID "\",\"step\":40,\"loss\":2.5,\"tokens_per_s\":10"
#define OUTER(step, sent, received)                                                          \
    "{" BASE ",\"outer\":{\"step\":" step ",\"digest\":\"00112233aabbccdd\","              \
    "\"wan_bytes_sent\":" sent ",\"wan_bytes_received\":" received                           \
    ",\"payload_bytes_sent\":900,\"digest_mismatches\":0,\"last_sync_unix_s\":1795309200.5," \
    "\"last_sync_duration_s\":0.25,\"codec\":\"q8\",\"sync_every\":100,"                   \
    "\"links\":[{\"region\":\"r2\",\"up\":true,\"last_error\":\"\"}]}}"

TEST(progress_parse_outer)
{
    progress_result r;
    ASSERT_OK(parse(OUTER("12", "1000", "2000"), &r));
    ASSERT(r.has_outer && !r.outer_ignored);
    ASSERT_EQ(r.outer.step, 12);
    ASSERT_EQ(r.outer.wan_bytes, 3000);
    ASSERT_EQ(r.step, 40);
    /* Before the gateway has the global parameters: step -1, nothing sent yet. */
    ASSERT_OK(parse(OUTER("-1", "0", "0"), &r));
    ASSERT(r.has_outer);
    ASSERT_EQ(r.outer.step, -1);
    ASSERT_EQ(r.outer.wan_bytes, 0);
    /* The largest sum that fits. */
    ASSERT_OK(parse(OUTER("7", "9223372036854775000", "807"), &r));
    ASSERT_EQ(r.outer.wan_bytes, INT64_MAX);
    /* Only what is read is checked: the other members may change. */
    ASSERT_OK(parse("{" BASE ",\"outer\":{\"step\":3,\"wan_bytes_sent\":1,"
                    "\"wan_bytes_received\":2,\"links\":\"later\"}}",
                    &r));
    ASSERT(r.has_outer && r.outer.step == 3 && r.outer.wan_bytes == 3);
    /* Absent, or null: a gateway without outer steps (a job of one region). */
    ASSERT_OK(parse("{" BASE "}", &r));
    ASSERT(!r.has_outer && !r.outer_ignored);
    ASSERT_OK(parse("{" BASE ",\"outer\":null}", &r));
    ASSERT(!r.has_outer && !r.outer_ignored);
    /* Malformed: the outer figures are ignored, not trusted; the rest of the answer counts. */
    static const char *const bad[] = {
        OUTER("\"12\"", "1000", "2000"),       /* step not a number */
        OUTER("12.5", "1000", "2000"),         /* nor an integer */
        OUTER("null", "1000", "2000"),
        OUTER("-2", "1000", "2000"),           /* below -1 */
        OUTER("true", "1000", "2000"),
        OUTER("12", "-1", "2000"),             /* negative byte counts */
        OUTER("12", "1000", "-5"),
        OUTER("12", "1000.5", "2000"),
        OUTER("12", "\"1000\"", "2000"),
        OUTER("12", "null", "2000"),
        OUTER("12", "1e3", "2000"),
        OUTER("12", "9223372036854775807", "1"), /* the sum overflows */
        "{" BASE ",\"outer\":{\"wan_bytes_sent\":1,\"wan_bytes_received\":2}}",
        "{" BASE ",\"outer\":{\"step\":1,\"wan_bytes_received\":2}}",
        "{" BASE ",\"outer\":{\"step\":1,\"wan_bytes_sent\":2}}",
        "{" BASE ",\"outer\":{}}",
        "{" BASE ",\"outer\":\"yes\"}",
        "{" BASE ",\"outer\":[1,2,3]}",
        "{" BASE ",\"outer\":7}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        memset(&r, 0, sizeof r);
        r.has_outer = 1;
        if (parse(bad[i], &r)) TEST_FAIL("'%s' refused as a whole", bad[i]);
        if (r.has_outer || !r.outer_ignored || strncmp(r.outer_ignored, "outer", 5))
            TEST_FAIL("'%s': has_outer %d, ignored '%s'", bad[i], r.has_outer,
                      r.outer_ignored ? r.outer_ignored : "(none)");
        ASSERT_EQ(r.step, 40);
        ASSERT_NEAR(r.loss, 2.5, 0);
    }
    /* Where the answer itself is invalid, a valid outer object does not save it. */
    ASSERT_EQ(parse("{\"job_id\":\"" UID "\",\"step\":-1,\"loss\":1,\"tokens_per_s\":1,"
                    "\"outer\":{\"step\":1,\"wan_bytes_sent\":1,\"wan_bytes_received\":1}}",
                    &r),
              CIRRUS_ECORRUPT);
}

TEST(progress_resolve_values)
{
    cirrus_error err;
    ASSERT_OK(progress_check_resolve("job-r1-gw.ns.svc:7480:127.0.0.1", &err));
    ASSERT_OK(progress_check_resolve("a:7480:10.0.0.1,b.ns.svc:80:[::1],c:1:2001:db8::1", &err));
    static const char *const bad[] = {
        "", "host", "host:7480", ":7480:127.0.0.1", "h:0:127.0.0.1", "h:65536:127.0.0.1",
        "h:x:127.0.0.1", "h:7480:", "h:7480:nothost", "h:7480:1.2.3", "h:7480:[1.2.3.4]",
        "h:7480:127.0.0.1,", "h:7480:127.0.0.1,other", "h h:7480:127.0.0.1",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        if (progress_check_resolve(bad[i], &err) != CIRRUS_EINVAL)
            TEST_FAIL("--resolve '%s' accepted", bad[i]);
    progress *p = NULL;
    const char *vals[] = {"a:1:127.0.0.1", "b:1:nope"};
    progress_options o = {.period_s = 0, .resolve = vals, .n_resolve = 2};
    ASSERT_EQ(progress_new(&o, &p, &err), CIRRUS_EINVAL);
    ASSERT(!p);
    ASSERT(strstr(err.msg, "nope"));
}

/* ---- the status's figures ------------------------------------------------------------------- */

static void region(job_observed *o, const char *name)
{
    region_observed *r = &o->regions[o->n_regions++];
    memset(r, 0, sizeof *r);
    r->name = name;
    r->n_stages = 1;
    r->replicas = 1;
    r->min = 1;
    r->ready[0] = 1;
    r->gateway_ready = 1;
    r->clients = 1;
    r->loss = r->tokens_per_s = NAN;
}

static void figures(region_observed *r, int64_t step, double loss, double tps)
{
    r->has_progress = 1;
    r->step = step;
    r->loss = loss;
    r->tokens_per_s = tps;
}

static const json_t *region_of(const json_t *st, int i)
{
    return json_array_get(json_object_get(st, "regions"), (size_t)i);
}

TEST(progress_status_figures)
{
    job_observed o = {.backoff_limit = 4, .generation = 1};
    region(&o, "r1");
    region(&o, "r2");
    region(&o, "r3");
    /* No figures anywhere: none written (a merge patch keeps what was there). */
    json_t *st = jobstatus_build(&o, NULL, "2026-11-22T01:00:00Z");
    ASSERT(!json_object_get(st, "step") && !json_object_get(st, "loss") &&
           !json_object_get(st, "tokensPerSecond"));
    ASSERT(!json_object_get(region_of(st, 0), "step"));
    json_decref(st);
    /* r1 and r2 answered; r3 has not yet: least step, mean loss, summed rate over the two. */
    figures(&o.regions[0], 300, 2.0, 1000.0);
    figures(&o.regions[1], 280, 3.0, 500.25);
    json_t *a = jobstatus_build(&o, NULL, "2026-11-22T01:00:00Z");
    ASSERT_EQ(json_integer_value(json_object_get(a, "step")), 280);
    ASSERT_NEAR(json_real_value(json_object_get(a, "loss")), 2.5, 1e-12);
    ASSERT_NEAR(json_real_value(json_object_get(a, "tokensPerSecond")), 1500.25, 1e-9);
    ASSERT_EQ(json_integer_value(json_object_get(region_of(a, 0), "step")), 300);
    ASSERT_NEAR(json_real_value(json_object_get(region_of(a, 1), "loss")), 3.0, 0);
    ASSERT_NEAR(json_real_value(json_object_get(region_of(a, 1), "tokensPerSecond")), 500.25, 0);
    ASSERT(!json_object_get(region_of(a, 2), "step"));
    /* Six significant digits. */
    figures(&o.regions[0], 300, 2.29877042770385, 2842.10860942380);
    json_t *b = jobstatus_build(&o, a, "2026-11-22T01:00:00Z");
    ASSERT_NEAR(json_real_value(json_object_get(region_of(b, 0), "loss")), 2.29877, 0);
    ASSERT_NEAR(json_real_value(json_object_get(region_of(b, 0), "tokensPerSecond")), 2842.11, 0);
    ASSERT(jobstatus_changed(a, b));
    /* The same figures again: nothing to write. */
    json_t *b2 = jobstatus_build(&o, b, "2026-11-22T01:00:10Z");
    ASSERT(!jobstatus_changed(b, b2));
    /* New figures: a write. */
    figures(&o.regions[1], 281, 3.0, 500.25);
    json_t *c = jobstatus_build(&o, b2, "2026-11-22T01:00:20Z");
    ASSERT(jobstatus_changed(b2, c));
    ASSERT_EQ(json_integer_value(json_object_get(c, "step")), 281);
    /* A restarted operator knows no figures yet: each region keeps the old status's, and so
     * does the job's (nothing to write). */
    job_observed fresh = o;
    for (int i = 0; i < fresh.n_regions; i++) fresh.regions[i].has_progress = 0;
    json_t *d = jobstatus_build(&fresh, c, "2026-11-22T01:00:30Z");
    ASSERT(!jobstatus_changed(c, d));
    ASSERT_EQ(json_integer_value(json_object_get(region_of(d, 1), "step")), 281);
    ASSERT_EQ(json_integer_value(json_object_get(d, "step")), 281);
    /* Only r1 answers again, at a step below r2's kept one; r3 now at step 0 with no loss
     * and no rate yet (a restarted gateway): the job is at step 0, r3 adds nothing to the
     * loss or the rate. */
    fresh.regions[0].has_progress = 1;
    figures(&fresh.regions[2], 0, NAN, NAN);
    json_t *e = jobstatus_build(&fresh, d, "2026-11-22T01:00:40Z");
    ASSERT_EQ(json_integer_value(json_object_get(e, "step")), 0);
    ASSERT_NEAR(json_real_value(json_object_get(e, "loss")), (2.29877 + 3.0) / 2, 1e-5);
    ASSERT(!json_object_get(region_of(e, 2), "loss"));
    /* Figures with a step but no loss anywhere: loss removed (null in the patch). */
    job_observed bare = {.backoff_limit = 4, .generation = 1};
    region(&bare, "r1");
    figures(&bare.regions[0], 0, NAN, NAN);
    json_t *f = jobstatus_build(&bare, e, "2026-11-22T01:00:50Z");
    ASSERT_EQ(json_integer_value(json_object_get(f, "step")), 0);
    ASSERT(json_is_null(json_object_get(f, "loss")));
    ASSERT(json_is_null(json_object_get(f, "tokensPerSecond")));
    ASSERT(jobstatus_changed(e, f));
    json_t *stored = json_deep_copy(f); /* as the API server keeps it: nulls removed */
    json_object_del(stored, "loss");
    json_object_del(stored, "tokensPerSecond");
    json_t *g = jobstatus_build(&bare, stored, "2026-11-22T01:01:00Z");
    ASSERT(!jobstatus_changed(stored, g));
    /* The API server gives whole-number reals back as integers (0.0 as 0, 3.0 as 3): the
     * same figures, nothing to write. */
    figures(&bare.regions[0], 5, 3.0, 0.0);
    json_t *h = jobstatus_build(&bare, g, "2026-11-22T01:01:10Z");
    ASSERT(jobstatus_changed(g, h));
    json_error_t je;
    char *text = json_dumps(h, JSON_COMPACT);
    ASSERT(text && strstr(text, "\"tokensPerSecond\":0.0"));
    json_t *served = json_loads(text, 0, &je);
    free(text);
    json_t *r0 = json_array_get(json_object_get(served, "regions"), 0);
    json_object_set_new(r0, "loss", json_integer(3));
    json_object_set_new(r0, "tokensPerSecond", json_integer(0));
    json_object_set_new(served, "loss", json_integer(3));
    json_object_set_new(served, "tokensPerSecond", json_integer(0));
    json_t *h2 = jobstatus_build(&bare, served, "2026-11-22T01:01:20Z");
    ASSERT(!jobstatus_changed(served, h2));
    figures(&bare.regions[0], 5, 3.5, 0.0);
    json_t *h3 = jobstatus_build(&bare, served, "2026-11-22T01:01:30Z");
    ASSERT(jobstatus_changed(served, h3));
    json_t *all[] = {a, b, b2, c, d, e, f, stored, g, h, served, h2, h3};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) json_decref(all[i]);
}

static void outer(region_observed *r, int64_t step, int64_t wan_bytes)
{
    r->has_outer = 1;
    r->outer_step = step;
    r->wan_bytes = wan_bytes;
}

static long long int_of(const json_t *o, const char *key)
{
    const json_t *v = json_object_get(o, key);
    if (!json_is_integer(v)) TEST_FAIL("%s is not an integer", key);
    return (long long)json_integer_value(v);
}

TEST(progress_status_outer)
{
    job_observed o = {.backoff_limit = 4, .generation = 1};
    region(&o, "r1");
    region(&o, "r2");
    region(&o, "r3");
    for (int i = 0; i < 3; i++) figures(&o.regions[i], 100, 2.0, 10.0);
    /* No outer figures (a job of one region, gateways not yet answering with them): none. */
    json_t *a = jobstatus_build(&o, NULL, "2026-11-22T01:00:00Z");
    ASSERT(!json_object_get(a, "outerStep") && !json_object_get(a, "wanBytes"));
    ASSERT(!json_object_get(region_of(a, 0), "outerStep"));
    /* r1 and r2 report; r3 has none yet: the least outer step, the bytes summed. */
    outer(&o.regions[0], 5, 1000);
    outer(&o.regions[1], 4, 2500);
    json_t *b = jobstatus_build(&o, a, "2026-11-22T01:00:10Z");
    ASSERT(jobstatus_changed(a, b));
    ASSERT_EQ(int_of(region_of(b, 0), "outerStep"), 5);
    ASSERT_EQ(int_of(region_of(b, 0), "wanBytes"), 1000);
    ASSERT_EQ(int_of(region_of(b, 1), "outerStep"), 4);
    ASSERT(!json_object_get(region_of(b, 2), "outerStep"));
    ASSERT(!json_object_get(region_of(b, 2), "wanBytes"));
    ASSERT_EQ(int_of(b, "outerStep"), 4);
    ASSERT_EQ(int_of(b, "wanBytes"), 3500);
    json_t *b2 = jobstatus_build(&o, b, "2026-11-22T01:00:20Z");
    ASSERT(!jobstatus_changed(b, b2));
    /* Bytes moving are news; r3's gateway starts without global parameters (step -1): the
     * job has not taken part in any outer step everywhere yet. */
    outer(&o.regions[0], 5, 1200);
    outer(&o.regions[2], -1, 0);
    json_t *c = jobstatus_build(&o, b2, "2026-11-22T01:00:30Z");
    ASSERT(jobstatus_changed(b2, c));
    ASSERT_EQ(int_of(region_of(c, 2), "outerStep"), -1);
    ASSERT_EQ(int_of(c, "outerStep"), -1);
    ASSERT_EQ(int_of(c, "wanBytes"), 3700);
    /* A restarted operator knows nothing yet: the old status's figures stay, as the step's. */
    job_observed fresh = o;
    for (int i = 0; i < 3; i++) fresh.regions[i].has_progress = fresh.regions[i].has_outer = 0;
    json_t *d = jobstatus_build(&fresh, c, "2026-11-22T01:00:40Z");
    ASSERT(!jobstatus_changed(c, d));
    ASSERT_EQ(int_of(region_of(d, 0), "wanBytes"), 1200);
    ASSERT_EQ(int_of(d, "outerStep"), -1);
    /* An answer whose outer object was ignored (has_outer 0) keeps the region's last ones. */
    fresh.regions[0].has_progress = 1;
    json_t *e = jobstatus_build(&fresh, d, "2026-11-22T01:00:50Z");
    ASSERT_EQ(int_of(region_of(e, 0), "outerStep"), 5);
    ASSERT_EQ(int_of(region_of(e, 0), "wanBytes"), 1200);
    /* Outer figures without a valid answer around them are not taken. */
    fresh.regions[1].has_progress = 0;
    outer(&fresh.regions[1], 99, 99);
    json_t *f = jobstatus_build(&fresh, e, "2026-11-22T01:01:00Z");
    ASSERT_EQ(int_of(region_of(f, 1), "outerStep"), 4);
    /* An old status with values the schema refuses (edited by hand): not copied. */
    json_t *old = json_deep_copy(f);
    json_t *r0 = json_array_get(json_object_get(old, "regions"), 1);
    json_object_set_new(r0, "outerStep", json_integer(-7));
    json_t *r2 = json_array_get(json_object_get(old, "regions"), 2);
    json_object_set_new(r2, "wanBytes", json_string("lots"));
    json_t *g = jobstatus_build(&fresh, old, "2026-11-22T01:01:10Z");
    ASSERT(!json_object_get(region_of(g, 1), "outerStep"));
    ASSERT(!json_object_get(region_of(g, 1), "wanBytes"));
    ASSERT_EQ(int_of(region_of(g, 2), "outerStep"), -1);
    ASSERT(!json_object_get(region_of(g, 2), "wanBytes"));
    /* The job's bytes saturate instead of overflowing. */
    outer(&o.regions[0], 9, INT64_MAX - 10);
    outer(&o.regions[1], 9, 100);
    outer(&o.regions[2], 9, 100);
    json_t *h = jobstatus_build(&o, NULL, "2026-11-22T01:01:20Z");
    ASSERT_EQ(int_of(h, "wanBytes"), INT64_MAX);
    ASSERT_EQ(int_of(h, "outerStep"), 9);
    json_t *all[] = {a, b, b2, c, d, e, f, old, g, h};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) json_decref(all[i]);
}

/* ---- ProgressCurrent and progressTime, on fixed clocks -------------------------------------- */

#define T0 1795309200 /* 2026-11-22T01:00:00Z */

static const char *at(int64_t offset_s)
{
    static char buf[8][32];
    static int k;
    char *b = buf[k++ % 8];
    jobstatus_format_time(T0 + offset_s, b, sizeof buf[0]);
    return b;
}

static const char *pcond(const json_t *st, const char *field)
{
    size_t i;
    json_t *c;
    json_array_foreach(json_object_get(st, "conditions"), i, c)
    {
        if (!strcmp(json_string_value(json_object_get(c, "type")), "ProgressCurrent"))
            return json_string_value(json_object_get(c, field));
    }
    return NULL;
}

/* The condition's status, reason and message equal these. */
#define ASSERT_PCOND(st, status, reason, message)                                           \
    do {                                                                                   \
        const char *s_ = pcond(st, "status"), *r_ = pcond(st, "reason"),                   \
                   *m_ = pcond(st, "message");                                             \
        if (!s_ || !r_ || !m_ || strcmp(s_, status) || strcmp(r_, reason) ||             \
            strcmp(m_, message))                                                           \
            TEST_FAIL("ProgressCurrent: wanted %s %s '%s', got %s %s '%s'", status, reason,  \
                      message, s_ ? s_ : "-", r_ ? r_ : "-", m_ ? m_ : "-");                 \
    } while (0)

#define ANSWERING "every region's gateway answered within the last 33 s"

static void answered(region_observed *r, int64_t step, double loss, int64_t read_at)
{
    figures(r, step, loss, 100.0);
    r->progress_time = T0 + read_at;
    r->failing = NULL;
}

static const char *progress_time(const json_t *st, int i)
{
    return json_string_value(json_object_get(region_of(st, i), "progressTime"));
}

TEST(progress_time_format)
{
    char b[32];
    jobstatus_format_time(T0, b, sizeof b);
    ASSERT(!strcmp(b, "2026-11-22T01:00:00Z"));
    ASSERT_EQ(jobstatus_parse_time("2026-11-22T01:00:00Z"), T0);
    ASSERT_EQ(jobstatus_parse_time("2026-11-22T01:00:07.250Z"), T0 + 7);
    ASSERT_EQ(jobstatus_parse_time("1970-01-01T00:00:00Z"), 0);
    static const char *const bad[] = {"", "2026-11-22", "2026-11-22T01:00:00",
                                      "2026-11-22T01:00:00+02:00", "2026-11-22T01:00:00Zx",
                                      "yesterday"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        if (jobstatus_parse_time(bad[i]) != -1) TEST_FAIL("'%s' parsed", bad[i]);
    ASSERT_EQ(jobstatus_parse_time(NULL), -1);
    /* 3 periods + the read's 2 s limit + 1 s; none when not reading. */
    ASSERT_EQ(progress_stale_s(NULL), 0);
    progress *p = NULL;
    cirrus_error err;
    progress_options o = {.period_s = 0};
    ASSERT_OK(progress_new(&o, &p, &err));
    ASSERT_EQ(progress_stale_s(p), 0);
    progress_free(p);
    o.period_s = 10;
    ASSERT_OK(progress_new(&o, &p, &err));
    ASSERT_EQ(progress_stale_s(p), 33);
    progress_free(p);
}

TEST(progress_current_condition)
{
    /* Two regions read every 10 s: an answer older than 33 s is stale. */
    job_observed o = {.backoff_limit = 4, .generation = 2, .progress_stale_s = 33};
    region(&o, "r1");
    region(&o, "r2");
    region_observed *r1 = &o.regions[0], *r2 = &o.regions[1];
    r1->watched_since = r2->watched_since = T0;
    /* Read since T0, no answer yet: Unknown; due when the first answers are overdue. */
    json_t *a = jobstatus_build(&o, NULL, at(0));
    ASSERT(!strcmp(json_string_value(json_object_get(a, "phase")), "Running"));
    ASSERT_PCOND(a, "Unknown", "NoAnswerYet",
                 "waiting for a first /status from regions r1, r2");
    ASSERT(!strcmp(pcond(a, "lastTransitionTime"), at(0)));
    ASSERT(!progress_time(a, 0) && !progress_time(a, 1));
    ASSERT_EQ(jobstatus_progress_due(&o, a, at(0)), T0 + 34);
    /* r1 answers, r2's reads fail: still Unknown (r2 has until T0+33), r2's cause named. */
    answered(r1, 100, 3.5, 1);
    r2->failing = "unreachable";
    json_t *b = jobstatus_build(&o, a, at(1));
    ASSERT_PCOND(b, "Unknown", "NoAnswerYet",
                 "waiting for a first /status from region r2 (unreachable)");
    ASSERT(!strcmp(pcond(b, "lastTransitionTime"), at(0)));
    ASSERT(!strcmp(progress_time(b, 0), "2026-11-22T01:00:01Z"));
    /* Both answered: True, since T0+2. */
    answered(r2, 90, 3.7, 2);
    json_t *c = jobstatus_build(&o, b, at(2));
    ASSERT_PCOND(c, "True", "GatewaysAnswering", ANSWERING);
    ASSERT(!strcmp(pcond(c, "lastTransitionTime"), at(2)));
    ASSERT(!strcmp(progress_time(c, 1), "2026-11-22T01:00:02Z"));
    ASSERT_EQ(jobstatus_progress_due(&o, c, at(2)), T0 + 1 + 34); /* r1's answer ages first */
    /* r1's gateway stops answering; r2 goes on. At T0+34 r1's answer is 33 s old: still
     * current (two missed reads of three are tolerated); nothing to write but r2's news. */
    r1->failing = "unreachable";
    answered(r2, 95, 3.6, 30);
    json_t *d = jobstatus_build(&o, c, at(34));
    ASSERT_PCOND(d, "True", "GatewaysAnswering", ANSWERING);
    ASSERT(!strcmp(pcond(d, "lastTransitionTime"), at(2)));
    ASSERT_EQ(jobstatus_progress_due(&o, d, at(34)), T0 + 35);
    /* One second later it is stale: False, naming r1, its last answer and why; r1's figures
     * and progressTime stay as they were. */
    json_t *e = jobstatus_build(&o, d, at(35));
    ASSERT_PCOND(e, "False", "GatewayUnreachable",
                 "no valid /status for over 33 s from region r1 "
                 "(last answer 2026-11-22T01:00:01Z; unreachable)");
    ASSERT(!strcmp(pcond(e, "lastTransitionTime"), at(35)));
    ASSERT(jobstatus_changed(d, e));
    ASSERT_EQ(json_integer_value(json_object_get(region_of(e, 0), "step")), 100);
    ASSERT_NEAR(json_real_value(json_object_get(region_of(e, 0), "loss")), 3.5, 0);
    ASSERT(!strcmp(progress_time(e, 0), "2026-11-22T01:00:01Z"));
    ASSERT_EQ(json_integer_value(json_object_get(e, "step")), 95);
    /* Nothing new for a long while: the message holds no age, so nothing to write; only r2's
     * answer can still age (r1 is stale already). */
    json_t *e2 = jobstatus_build(&o, e, at(50));
    ASSERT(!jobstatus_changed(e, e2));
    ASSERT_EQ(jobstatus_progress_due(&o, e, at(35)), T0 + 30 + 34);
    /* Both stale, r2 failing otherwise: both named. */
    r2->failing = "invalid /status";
    json_t *e3 = jobstatus_build(&o, e2, at(100));
    ASSERT_PCOND(e3, "False", "GatewayUnreachable",
                 "no valid /status for over 33 s from regions "
                 "r1 (last answer 2026-11-22T01:00:01Z; unreachable), "
                 "r2 (last answer 2026-11-22T01:00:30Z; invalid /status)");
    ASSERT(!strcmp(pcond(e3, "lastTransitionTime"), at(35)));
    ASSERT_EQ(jobstatus_progress_due(&o, e3, at(100)), 0);
    /* The gateways answer again: True. */
    answered(r1, 120, 3.4, 101);
    answered(r2, 110, 3.5, 101);
    json_t *f = jobstatus_build(&o, e3, at(101));
    ASSERT_PCOND(f, "True", "GatewaysAnswering", ANSWERING);
    ASSERT(!strcmp(pcond(f, "lastTransitionTime"), at(101)));
    ASSERT(!strcmp(progress_time(f, 0), at(101)));

    /* A restarted operator (or a new leader) knows no answer: the status's progressTime
     * counts. r2's (T0+101) is current at T0+120; r1's is kept at T0+101 too but its gateway
     * was registered again at T0+119: fresh. At T0+140 r1 has not answered this process:
     * it has until 33 s after it began reading it (T0+119), so Unknown, not False. */
    job_observed fresh = o;
    for (int i = 0; i < 2; i++) {
        fresh.regions[i].has_progress = 0;
        fresh.regions[i].progress_time = 0;
        fresh.regions[i].failing = NULL;
        fresh.regions[i].watched_since = T0 + 119;
    }
    json_t *g = jobstatus_build(&fresh, f, at(120));
    ASSERT_PCOND(g, "True", "GatewaysAnswering", ANSWERING);
    ASSERT(!jobstatus_changed(f, g));
    ASSERT(!strcmp(progress_time(g, 0), at(101)));
    fresh.regions[1].has_progress = 1;
    fresh.regions[1].progress_time = T0 + 140;
    json_t *h = jobstatus_build(&fresh, g, at(140));
    ASSERT_PCOND(h, "Unknown", "NoAnswerYet", "waiting for a first /status from region r1");
    ASSERT_EQ(jobstatus_progress_due(&fresh, h, at(140)), T0 + 119 + 34);
    json_t *h2 = jobstatus_build(&fresh, h, at(153));
    ASSERT_PCOND(h2, "False", "GatewayUnreachable",
                 "no valid /status for over 33 s from region r1 "
                 "(last answer 2026-11-22T01:01:41Z)");

    /* r2's gateway pod is not ready (not read) while r1 answers: r2's figures go stale from
     * its last answer, and the message says why. */
    job_observed deg = o;
    answered(&deg.regions[0], 130, 3.3, 160);
    deg.regions[1].ready[0] = 0;
    deg.regions[1].gateway_ready = 0;
    deg.regions[1].has_progress = 0;
    deg.regions[1].watched_since = 0;
    deg.regions[1].failing = NULL;
    json_t *i1 = jobstatus_build(&deg, f, at(160));
    ASSERT(!strcmp(json_string_value(json_object_get(i1, "phase")), "Degraded"));
    ASSERT_PCOND(i1, "False", "GatewayUnreachable",
                 "no valid /status for over 33 s from region r2 "
                 "(last answer 2026-11-22T01:01:41Z; gateway not ready)");
    ASSERT_EQ(json_integer_value(json_object_get(region_of(i1, 1), "step")), 110);

    /* A region never read and never answered (its gateway never ready): nothing to go stale,
     * Unknown; nothing due. */
    job_observed never = {.backoff_limit = 4, .generation = 1, .progress_stale_s = 33};
    region(&never, "r1");
    region(&never, "r2");
    never.regions[0].watched_since = T0;
    answered(&never.regions[0], 5, 4.0, 1);
    never.regions[1].gateway_ready = 0;
    json_t *j = jobstatus_build(&never, NULL, at(500));
    ASSERT(!strcmp(json_string_value(json_object_get(j, "phase")), "Degraded"));
    /* r1's answer at T0+1 is long stale too. */
    ASSERT_PCOND(j, "False", "GatewayUnreachable",
                 "no valid /status for over 33 s from region r1 "
                 "(last answer 2026-11-22T01:00:01Z)");
    answered(&never.regions[0], 6, 4.0, 499);
    json_t *j2 = jobstatus_build(&never, j, at(500));
    ASSERT_PCOND(j2, "Unknown", "NoAnswerYet",
                 "waiting for a first /status from region r2 (gateway not ready)");
    ASSERT_EQ(jobstatus_progress_due(&never, j2, at(500)), T0 + 499 + 34);

    /* A gateway that answers for another job is read but never answers validly. */
    job_observed other = {.backoff_limit = 4, .generation = 1, .progress_stale_s = 6};
    region(&other, "r1");
    other.regions[0].watched_since = T0;
    other.regions[0].failing = "another job's /status";
    json_t *k = jobstatus_build(&other, NULL, at(6));
    ASSERT_PCOND(k, "Unknown", "NoAnswerYet",
                 "waiting for a first /status from region r1 (another job's /status)");
    ASSERT_EQ(jobstatus_progress_due(&other, k, at(6)), T0 + 7);
    json_t *k2 = jobstatus_build(&other, k, at(7));
    ASSERT_PCOND(k2, "False", "GatewayUnreachable",
                 "no valid /status for over 6 s from region r1 "
                 "(no answer; another job's /status)");

    /* Not running: Unknown, nothing due; not reading (period 0): Unknown. */
    job_observed stopped = o;
    stopped.suspended = 1;
    json_t *l = jobstatus_build(&stopped, f, at(200));
    ASSERT_PCOND(l, "Unknown", "NotRunning",
                 "the job is Suspended: its gateways are stopped, the figures are the last read");
    ASSERT_EQ(jobstatus_progress_due(&stopped, l, at(200)), 0);
    ASSERT(!strcmp(progress_time(l, 0), at(101))); /* kept */
    job_observed unread = o;
    unread.progress_stale_s = 0;
    json_t *m = jobstatus_build(&unread, f, at(200));
    ASSERT_PCOND(m, "Unknown", "ProgressNotRead",
                 "the operator does not read the gateways' /status (--progress-period-s 0)");
    ASSERT_EQ(jobstatus_progress_due(&unread, m, at(200)), 0);
    json_t *all[] = {a, b, c, d, e, e2, e3, f, g, h, h2, i1, j, j2, k, k2, l, m};
    for (size_t n = 0; n < sizeof all / sizeof *all; n++) json_decref(all[n]);
}

/* ---- the reader thread against a scripted gateway ----------------------------------------- */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int drained;
static char drained_key[PROGRESS_KEY_MAX];
static void on_key(void *ctx, const char *key)
{
    (void)ctx;
    drained++;
    snprintf(drained_key, sizeof drained_key, "%s", key);
}

/* Wait until progress_get answers with step `step` (or -1: anything), at most timeout_s. */
static int wait_step(progress *p, const char *region, int64_t step, double timeout_s,
                     progress_result *out)
{
    double end = now_s() + timeout_s;
    while (now_s() < end) {
        if (progress_get(p, UID, region, out) && (step < 0 || out->step == step)) return 1;
        struct timespec ts = {0, 20 * 1000000L};
        nanosleep(&ts, NULL);
    }
    return 0;
}

TEST_T(progress_reader_thread, 60)
{
    static const char ok1[] =
        "{\"job_id\":\"" UID "\",\"step\":10,\"loss\":4.5,\"tokens_per_s\":100}";
    static const char wrong[] =
        "{\"job_id\":\"another-job\",\"step\":99,\"loss\":0.1,\"tokens_per_s\":9}";
    static const char ok2[] =
        "{\"job_id\":\"" UID "\",\"step\":20,\"loss\":4.0,\"tokens_per_s\":120}";
    tk_fake *f = tk_fake_new();
    tk_fake_route(f, "GET /status HTTP/1.1", 200, NULL, ok1, 0);
    tk_fake_route(f, "GET /status HTTP/1.1", 200, NULL, wrong, 0);
    tk_fake_route(f, "GET /status HTTP/1.1", 200, NULL, ok2, 0);
    tk_fake_route(f, "GET /status HTTP/1.1", 200, NULL, "{\"job_id\":", 1); /* hangs */
    tk_fake_route(f, "GET /status HTTP/1.1", 200, NULL, "{", 1);               /* hangs */
    int port = tk_fake_run(f);
    char resolve[128], url[128];
    snprintf(resolve, sizeof resolve, "job-r1-gw.ns.svc:%d:127.0.0.1", port);
    snprintf(url, sizeof url, "http://job-r1-gw.ns.svc:%d/status", port);
    const char *vals[] = {resolve};
    progress *p = NULL;
    cirrus_error err;
    progress_options o = {.period_s = 1, .resolve = vals, .n_resolve = 1};
    ASSERT_OK(progress_new(&o, &p, &err));
    progress_result r;
    ASSERT(!progress_get(p, UID, "r1", &r));
    /* A region whose gateway is not there (nothing listens on port 1): only errors. */
    progress_target t[] = {{"r1", url}, {"r2", "http://127.0.0.1:1/status"}};
    ASSERT_OK(progress_watch(p, "ns/job", UID, 2, t));
    /* A new job is read at once, through --resolve. */
    double t0 = now_s();
    int64_t wall0 = (int64_t)time(NULL);
    ASSERT(wait_step(p, "r1", 10, 5, &r));
    ASSERT_LT(now_s() - t0, 0.9);
    ASSERT_NEAR(r.loss, 4.5, 0);
    ASSERT_NEAR(r.tokens_per_s, 100, 0);
    ASSERT(wall0 <= r.read_s && r.read_s <= (int64_t)time(NULL));
    ASSERT(!progress_get(p, UID, "r2", &r));
    /* Both were read in the same round: r2's failure is known with r1's answer. */
    progress_region pr;
    progress_region_get(p, UID, "r1", &pr);
    ASSERT(pr.watched && pr.answered && !pr.failing && pr.res.step == 10);
    ASSERT(wall0 <= pr.watched_s && pr.watched_s <= pr.res.read_s);
    progress_region_get(p, UID, "r2", &pr);
    ASSERT(pr.watched && !pr.answered && pr.failing && !strcmp(pr.failing, "unreachable"));
    progress_region_get(p, UID, "r3", &pr);
    ASSERT(!pr.watched && !pr.answered && !pr.failing);
    drained = 0;
    progress_drain(p, on_key, NULL);
    ASSERT_EQ(drained, 1);
    ASSERT(!strcmp(drained_key, "ns/job"));
    progress_drain(p, on_key, NULL);
    ASSERT_EQ(drained, 1); /* announced once */
    /* Next period: another job's status, ignored (the figures stay) and named as the cause;
     * then ours again. */
    double w0 = now_s();
    while (tk_fake_served(f) < 2 && now_s() - w0 < 5) {
        struct timespec ts = {0, 20 * 1000000L};
        nanosleep(&ts, NULL);
    }
    int named = 0;
    while (!named && now_s() - w0 < 5) {
        progress_region_get(p, UID, "r1", &pr);
        named = pr.failing && !strcmp(pr.failing, "another job's /status");
        if (pr.res.step == 20) break; /* the next read came first: too late to see it */
    }
    ASSERT(named);
    ASSERT_EQ(pr.res.step, 10);
    ASSERT(wait_step(p, "r1", 20, 5, &r));
    ASSERT_NEAR(r.loss, 4.0, 0);
    ASSERT(!progress_get(p, "another-job", "r1", &r));
    progress_drain(p, on_key, NULL);
    ASSERT_EQ(drained, 2);
    ASSERT_EQ(tk_fake_served(f), 3);
    /* Then the gateway hangs mid-answer: the caller's calls stay immediate while the read
     * waits for its 2 s limit, and the figures stay. */
    while (tk_fake_served(f) < 4) {
        struct timespec ts = {0, 20 * 1000000L};
        nanosleep(&ts, NULL);
    }
    double c0 = now_s();
    for (int i = 0; i < 100; i++) {
        ASSERT(progress_get(p, UID, "r1", &r));
        ASSERT_OK(progress_watch(p, "ns/job", UID, 2, t));
        progress_drain(p, on_key, NULL);
    }
    ASSERT_LT(now_s() - c0, 0.5); /* never waits for the hung read (2 s) */
    ASSERT_EQ(r.step, 20);
    /* The hung read ends at its 2 s limit, and its round with it. */
    progress_stats st;
    progress_get_stats(p, &st);
    uint64_t rounds = st.rounds;
    while (st.rounds == rounds && now_s() - c0 < 10) progress_get_stats(p, &st);
    ASSERT_LT(now_s() - c0, 8.0); /* 2 s, and slack for a loaded machine (valgrind) */
    ASSERT_LT(1.5, now_s() - c0);
    ASSERT_EQ(st.wrong_job, 1);
    ASSERT_EQ(st.ok, 2);
    ASSERT_EQ(st.invalid, 0);
    ASSERT(st.errors >= 5); /* r2 four times, the hung read */
    ASSERT(progress_get(p, UID, "r1", &r) && r.step == 20);
    /* Regions forgotten with their job; a re-registered job is a new one, read at once. */
    progress_forget(p, "ns/job");
    ASSERT(!progress_get(p, UID, "r1", &r));
    ASSERT_OK(progress_watch(p, "ns/job", UID, 1, t));
    while (tk_fake_served(f) < 5) {
        struct timespec ts = {0, 20 * 1000000L};
        nanosleep(&ts, NULL);
    }
    /* Shutdown while a read hangs: progress_free returns within a moment. */
    double s0 = now_s();
    progress_free(p);
    ASSERT_LT(now_s() - s0, 0.5);
    tk_fake_stop(f);
}

/* The same figures again are news too: their read time moves (progressTime), and the job is
 * announced; when the gateway then fails, the figures and their time stay. */
TEST_T(progress_same_figures, 30)
{
    static const char ok1[] =
        "{\"job_id\":\"" UID "\",\"step\":10,\"loss\":4.5,\"tokens_per_s\":100}";
    tk_fake *f = tk_fake_new();
    tk_fake_route(f, "GET /status HTTP/1.1", 200, NULL, ok1, 0);
    tk_fake_route(f, "GET /status HTTP/1.1", 200, NULL, ok1, 0);
    /* then HTTP 500 ("no route") for ever */
    int port = tk_fake_run(f);
    char url[128];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/status", port);
    progress *p = NULL;
    cirrus_error err;
    progress_options o = {.period_s = 1};
    ASSERT_OK(progress_new(&o, &p, &err));
    progress_target t[] = {{"r1", url}};
    ASSERT_OK(progress_watch(p, "ns/job", UID, 1, t));
    progress_result r;
    ASSERT(wait_step(p, "r1", 10, 5, &r));
    int64_t first = r.read_s;
    drained = 0;
    progress_drain(p, on_key, NULL);
    ASSERT_EQ(drained, 1);
    double w0 = now_s();
    while (tk_fake_served(f) < 2 && now_s() - w0 < 5) {
        struct timespec ts = {0, 20 * 1000000L};
        nanosleep(&ts, NULL);
    }
    progress_result r2 = r;
    while (r2.read_s == first && now_s() - w0 < 5) ASSERT(progress_get(p, UID, "r1", &r2));
    ASSERT_LT(first, r2.read_s); /* read a period (1 s) later */
    ASSERT_EQ(r2.step, 10);
    progress_drain(p, on_key, NULL);
    ASSERT_EQ(drained, 2);
    /* The third read gets HTTP 500: unreachable, and the second answer stays. That it fails
     * is news (the condition says how); the same failure again is not. */
    progress_region pr = {0};
    while (!pr.failing && now_s() - w0 < 8) progress_region_get(p, UID, "r1", &pr);
    ASSERT(pr.failing && !strcmp(pr.failing, "unreachable"));
    ASSERT(pr.answered && pr.res.step == 10 && pr.res.read_s == r2.read_s);
    progress_drain(p, on_key, NULL);
    ASSERT_EQ(drained, 3);
    progress_stats st;
    progress_get_stats(p, &st);
    while (st.errors < 2 && now_s() - w0 < 8) progress_get_stats(p, &st);
    ASSERT_EQ(st.errors, 2);
    progress_drain(p, on_key, NULL);
    ASSERT_EQ(drained, 3);
    progress_free(p);
    tk_fake_stop(f);
}

/* The reader keeps an answer's outer figures with it, and drops them (only them) when the
 * next answer's outer object is malformed. */
TEST_T(progress_reader_outer, 30)
{
    static const char ok1[] = OUTER("3", "10", "20");
    static const char bad[] = "{\"job_id\":\"" UID "\",\"step\":41,\"loss\":2.5,"
                              "\"tokens_per_s\":10,\"outer\":{\"step\":4,"
                              "\"wan_bytes_sent\":-1,\"wan_bytes_received\":20}}";
    tk_fake *f = tk_fake_new();
    tk_fake_route(f, "GET /status HTTP/1.1", 200, NULL, ok1, 0);
    tk_fake_route(f, "GET /status HTTP/1.1", 200, NULL, bad, 0);
    int port = tk_fake_run(f);
    char url[128];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/status", port);
    progress *p = NULL;
    cirrus_error err;
    progress_options o = {.period_s = 1};
    ASSERT_OK(progress_new(&o, &p, &err));
    progress_target t[] = {{"r1", url}};
    ASSERT_OK(progress_watch(p, "ns/job", UID, 1, t));
    progress_result r;
    ASSERT(wait_step(p, "r1", 40, 5, &r));
    ASSERT(r.has_outer && r.outer.step == 3 && r.outer.wan_bytes == 30);
    ASSERT(wait_step(p, "r1", 41, 5, &r));
    ASSERT(!r.has_outer && r.outer_ignored && strstr(r.outer_ignored, "wan_bytes_sent"));
    progress_stats st;
    progress_get_stats(p, &st);
    ASSERT_EQ(st.invalid, 0); /* the answer counted */
    progress_free(p);
    tk_fake_stop(f);
}

TEST(progress_disabled)
{
    progress *p = NULL;
    cirrus_error err;
    progress_options o = {.period_s = 0};
    ASSERT_OK(progress_new(&o, &p, &err));
    progress_target t[] = {{"r1", "http://127.0.0.1:1/status"}};
    ASSERT_OK(progress_watch(p, "ns/job", UID, 1, t));
    progress_result r;
    ASSERT(!progress_get(p, UID, "r1", &r));
    progress_drain(p, on_key, NULL);
    progress_free(p);
    /* NULL is "no reader" for the controller. */
    ASSERT(!progress_get(NULL, UID, "r1", &r));
    ASSERT_OK(progress_watch(NULL, "ns/job", UID, 1, t));
    progress_forget(NULL, "ns/job");
    progress_drain(NULL, on_key, NULL);
    progress_free(NULL);
}
