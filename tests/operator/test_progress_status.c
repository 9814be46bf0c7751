/* progress, in the status: the status's step / loss / tokensPerSecond and outer figures built
 * from the regions' figures, the ProgressCurrent condition and regions[].progressTime on
 * fixed clocks (answers ageing past progress_stale_s, first answers awaited, a restarted
 * operator, a gateway not ready, another job's answers). Pure: no reader, no cluster
 * (`operator-tests progress`). */
#include <math.h>
#include <string.h>

#include <jansson.h>

#include "../../operator/jobstatus.h"
#include "../../operator/progress.h"
#include "../unit/test.h"

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

/* ---- readyPeersPerStage: the gateway's live count while its answer is fresh -------------------- */

TEST(progress_ready_peers_from_the_gateway_while_fresh)
{
    job_observed o = {.backoff_limit = 4, .generation = 1, .progress_stale_s = 6};
    region(&o, "r1");
    region_observed *r = &o.regions[0];
    r->n_stages = 2;
    r->replicas = 2;
    r->ready[0] = 2, r->ready[1] = 2; /* four Ready pods by their stage labels */
    figures(r, 50, 2.0, 100.0);
    r->progress_time = jobstatus_parse_time("2026-11-22T01:00:00Z");
    /* The gateway moved a peer of stage 1 to stage 0, and one of stage 1's is gone. */
    r->has_live = 1;
    r->live[0] = 3, r->live[1] = 0;
    json_t *st = jobstatus_build(&o, NULL, "2026-11-22T01:00:06Z"); /* fresh: 6 s old */
    const json_t *per = json_object_get(region_of(st, 0), "readyPeersPerStage");
    ASSERT(json_integer_value(json_array_get(per, 0)) == 3 && json_integer_value(json_array_get(per, 1)) == 0);
    ASSERT(!strcmp(json_string_value(json_object_get(st, "readyPeers")), "3/4"));
    /* A stage the moves emptied: the region no longer has every stage served. */
    ASSERT(!strcmp(json_string_value(json_object_get(st, "phase")), "Created"));
    json_decref(st);
    st = jobstatus_build(&o, NULL, "2026-11-22T01:00:07Z"); /* stale: the pods' count again */
    per = json_object_get(region_of(st, 0), "readyPeersPerStage");
    ASSERT(json_integer_value(json_array_get(per, 0)) == 2 && json_integer_value(json_array_get(per, 1)) == 2);
    ASSERT(!strcmp(json_string_value(json_object_get(st, "readyPeers")), "4/4"));
    json_decref(st);
    /* Without live counts (a gateway of another layout, or none): the pods' count. */
    r->has_live = 0;
    st = jobstatus_build(&o, NULL, "2026-11-22T01:00:01Z");
    ASSERT(!strcmp(json_string_value(json_object_get(st, "readyPeers")), "4/4"));
    json_decref(st);
}

static const json_t *condition_of(const json_t *st, const char *type)
{
    size_t i;
    const json_t *c;
    json_array_foreach(json_object_get(st, "conditions"), i, c)
        if (!strcmp(json_string_value(json_object_get(c, "type")), type)) return c;
    return NULL;
}

/* Regions in several clusters: a member's region shows its cluster, whether that cluster
 * answered and its endpoint; ClustersReachable appears on home jobs only; a copy takes the
 * home job's final phase. */
TEST(progress_status_member_regions)
{
    job_observed o = {.backoff_limit = 4, .generation = 1};
    region(&o, "r1");
    region(&o, "r2");
    json_t *plain = jobstatus_build(&o, NULL, "2026-11-22T01:00:00Z");
    ASSERT(!condition_of(plain, "ClustersReachable"));
    ASSERT(!json_object_get(region_of(plain, 1), "cluster"));
    ASSERT_EQ(json_integer_value(json_object_get(region_of(plain, 1), "clientsSucceeded")), 0);
    o.has_members = 1;
    o.regions[0].endpoint = "192.0.2.1:30001";
    o.regions[1].cluster = "east";
    o.regions[1].endpoint = "198.51.100.2:30002";
    o.regions[1].clients_succeeded = 1;
    json_t *a = jobstatus_build(&o, plain, "2026-11-22T01:00:10Z");
    ASSERT(jobstatus_changed(plain, a));
    ASSERT(!strcmp(json_string_value(json_object_get(region_of(a, 0), "endpoint")),
                   "192.0.2.1:30001"));
    ASSERT(!json_object_get(region_of(a, 0), "cluster"));
    ASSERT(!strcmp(json_string_value(json_object_get(region_of(a, 1), "cluster")), "east"));
    ASSERT(json_is_true(json_object_get(region_of(a, 1), "clusterReachable")));
    ASSERT_EQ(json_integer_value(json_object_get(region_of(a, 1), "clientsSucceeded")), 1);
    const json_t *c = condition_of(a, "ClustersReachable");
    ASSERT(c && !strcmp(json_string_value(json_object_get(c, "status")), "True"));
    o.regions[1].cluster_unreachable = 1;
    o.members_unreachable = "cluster east: connection refused";
    json_t *b = jobstatus_build(&o, a, "2026-11-22T01:00:20Z");
    c = condition_of(b, "ClustersReachable");
    ASSERT(c && !strcmp(json_string_value(json_object_get(c, "status")), "False"));
    ASSERT(!strcmp(json_string_value(json_object_get(c, "reason")), "MemberUnreachable"));
    ASSERT(strstr(json_string_value(json_object_get(c, "message")), "cluster east"));
    ASSERT(json_is_false(json_object_get(region_of(b, 1), "clusterReachable")));
    /* An endpoint not known this time is the one the status had (the gateways use it). */
    o.regions[1].endpoint = NULL;
    json_t *kept = jobstatus_build(&o, b, "2026-11-22T01:00:30Z");
    ASSERT(!strcmp(json_string_value(json_object_get(region_of(kept, 1), "endpoint")),
                   "198.51.100.2:30002"));
    json_decref(kept);
    /* A copy takes the home job's final phase, whatever its own regions show: its clients
     * all finished, or its failures past the limit, are the home's to judge over the job. */
    job_observed copy = {.backoff_limit = 4, .generation = 1, .is_copy = 1};
    region(&copy, "r2");
    copy.regions[0].clients_succeeded = 1;
    copy.regions[0].failures = 9;
    ASSERT_EQ(jobstatus_phase(&copy, "Running", 1), PHASE_RUNNING);
    copy.policy_failure = "pod r2-c0: exit code 42 (FailJob)";
    ASSERT_EQ(jobstatus_phase(&copy, "Running", 1), PHASE_FAILED);
    copy.policy_failure = NULL;
    copy.home_phase = "Succeeded";
    ASSERT_EQ(jobstatus_phase(&copy, "Running", 1), PHASE_SUCCEEDED);
    copy.home_phase = "Failed";
    ASSERT_EQ(jobstatus_phase(&copy, "Running", 1), PHASE_FAILED);
    json_decref(plain);
    json_decref(a);
    json_decref(b);
}
