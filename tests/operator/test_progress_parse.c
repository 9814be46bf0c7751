/* progress, parsing: a gateway's /status body judged (right job, types, finite, non-negative,
 * the outer-step figures of a gateway joined to other regions) and --resolve values checked.
 * The status built from the figures is test_progress_status.c, the reader thread
 * test_progress_reader.c. No cluster needed (`operator-tests progress`). */
#include <math.h>
#include <string.h>

#include <jansson.h>

#include "../../operator/progress.h"
#include "../unit/test.h"
#include "progress_fixture.h"

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

TEST(progress_parse_stages)
{
    progress_result r;
    /* The coordinator's live peers per stage, by the stage each serves now. */
    ASSERT_OK(parse("{" BASE ",\"stages\":[{\"stage\":0,\"peers\":1,\"throughput\":null},"
                    "{\"stage\":1,\"peers\":3}]}",
                    &r));
    ASSERT(r.has_stages && !r.stages_ignored);
    ASSERT_EQ(r.n_stages, 2);
    ASSERT(r.stage_peers[0] == 1 && r.stage_peers[1] == 3);
    ASSERT_OK(parse("{" BASE ",\"stages\":[]}", &r));
    ASSERT(r.has_stages && r.n_stages == 0);
    ASSERT_OK(parse("{" BASE "}", &r));
    ASSERT(!r.has_stages && !r.stages_ignored);
    /* 64 stages is the most a SwarmJob has; 65 are not trusted. */
    char big[8192];
    for (int n = 64; n <= 65; n++) {
        int len = snprintf(big, sizeof big, "{" BASE ",\"stages\":[");
        for (int s = 0; s < n; s++)
            len += snprintf(big + len, sizeof big - (size_t)len, "%s{\"stage\":%d,\"peers\":%d}",
                            s ? "," : "", s, s % 3);
        snprintf(big + len, sizeof big - (size_t)len, "]}");
        ASSERT_OK(parse(big, &r));
        ASSERT_EQ(r.has_stages, n == 64);
        if (n == 64) ASSERT(r.n_stages == 64 && r.stage_peers[63] == 0 && r.stage_peers[62] == 2);
    }
    /* Malformed: the counts are ignored, the rest of the answer counts. */
    static const char *const bad[] = {
        "{" BASE ",\"stages\":[{\"stage\":1,\"peers\":1}]}",          /* not its index */
        "{" BASE ",\"stages\":[{\"stage\":0,\"peers\":-1}]}",         /* negative */
        "{" BASE ",\"stages\":[{\"stage\":0,\"peers\":2147483648}]}", /* over INT_MAX */
        "{" BASE ",\"stages\":[{\"stage\":0,\"peers\":1.5}]}",
        "{" BASE ",\"stages\":[{\"stage\":0}]}",
        "{" BASE ",\"stages\":[{\"peers\":1}]}",
        "{" BASE ",\"stages\":[1]}",
        "{" BASE ",\"stages\":{\"0\":1}}",
        "{" BASE ",\"stages\":2}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        memset(&r, 0, sizeof r);
        r.has_stages = 1;
        if (parse(bad[i], &r)) TEST_FAIL("'%s' refused as a whole", bad[i]);
        if (r.has_stages || !r.stages_ignored)
            TEST_FAIL("'%s': has_stages %d, ignored '%s'", bad[i], r.has_stages,
                      r.stages_ignored ? r.stages_ignored : "(none)");
        ASSERT_EQ(r.step, 40);
    }
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
