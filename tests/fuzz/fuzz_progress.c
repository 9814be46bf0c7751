/* fuzz_progress: the gateway /status reader (operator/progress.c), fed response bodies as a
 * region gateway (or anything listening at its address) returns them, and the --resolve
 * checker on the same bytes.
 *
 * Invariants: a refused body leaves the result untouched (filled with a marker first);
 * an accepted one is the job asked for, with step >= 0 and loss and tokens_per_s each a
 * finite number >= 0 or NaN (none yet), read_s 0; the same body for another job is
 * CIRRUS_EMISMATCH; per-stage peer counts, when trusted, are at most 64 and each >= 0;
 * decode(encode(x)) == x: the result written back as JSON parses to the same figures and
 * stage counts. An accepted --resolve value has HOST:PORT:ADDRESS entries only.
 */
#include "fuzz.h"

#include <jansson.h>
#include <math.h>

#include "../../operator/progress.h"

#define JOB "0d4a7f3e-5b1c-4e2a-9f6d-2c8b1a3e4f50"

static int same_double(double a, double b) { return (isnan(a) && isnan(b)) || a == b; }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *body = (const char *)data;
    progress_result r;
    memset(&r, 0xa5, sizeof r);
    progress_result before = r;
    cirrus_error err;
    int rc = progress_parse_status(body, size, JOB, &r, &err);
    if (rc != 0) {
        FUZZ_CHECK(rc == CIRRUS_ECORRUPT || rc == CIRRUS_EMISMATCH, "rc %d", rc);
        FUZZ_CHECK(!memcmp(&r, &before, sizeof r), "a refused /status changed the result (%s)", err.msg);
    } else {
        FUZZ_CHECK(r.step >= 0, "step %lld", (long long)r.step);
        FUZZ_CHECK(isnan(r.loss) || (isfinite(r.loss) && r.loss >= 0), "loss %g", r.loss);
        FUZZ_CHECK(isnan(r.tokens_per_s) || (isfinite(r.tokens_per_s) && r.tokens_per_s >= 0),
                   "tokens_per_s %g", r.tokens_per_s);
        FUZZ_CHECK(r.read_s == 0, "read_s %lld", (long long)r.read_s);
        FUZZ_CHECK(!r.has_stages || (r.n_stages >= 0 && r.n_stages <= PROGRESS_MAX_STAGES && !r.stages_ignored),
                   "has_stages %d with %d stages", r.has_stages, r.n_stages);
        for (int i = 0; r.has_stages && i < r.n_stages; i++)
            FUZZ_CHECK(r.stage_peers[i] >= 0, "stage %d: %d peers", i, r.stage_peers[i]);
        progress_result other;
        FUZZ_CHECK(progress_parse_status(body, size, "another-job", &other, &err) == CIRRUS_EMISMATCH,
                   "accepted for another job");
        json_t *o = json_pack("{s:s, s:I, s:o, s:o}", "job_id", JOB, "step", (json_int_t)r.step,
                              "loss", isnan(r.loss) ? json_null() : json_real(r.loss),
                              "tokens_per_s", isnan(r.tokens_per_s) ? json_null() : json_real(r.tokens_per_s));
        json_t *stages = r.has_stages ? json_array() : NULL;
        for (int i = 0; stages && i < r.n_stages; i++)
            json_array_append_new(stages, json_pack("{s:i, s:i}", "stage", i, "peers", r.stage_peers[i]));
        if (o && stages) json_object_set_new(o, "stages", stages);
        char *text = o ? json_dumps(o, JSON_COMPACT) : NULL;
        FUZZ_CHECK(text, "cannot re-encode");
        progress_result r2;
        FUZZ_CHECK(progress_parse_status(text, strlen(text), JOB, &r2, &err) == 0, "re-encoded refused: %s", err.msg);
        FUZZ_CHECK(r2.step == r.step && same_double(r2.loss, r.loss) &&
                       same_double(r2.tokens_per_s, r.tokens_per_s) && r2.has_stages == r.has_stages &&
                       (!r.has_stages || (r2.n_stages == r.n_stages &&
                                          !memcmp(r2.stage_peers, r.stage_peers, (size_t)r.n_stages * sizeof(int)))),
                   "figures differ after a round trip");
        free(text);
        json_decref(o);
    }
    /* The same bytes as a --resolve value. */
    char *s = malloc(size + 1);
    if (!s) abort();
    memcpy(s, data, size);
    s[size] = '\0';
    if (progress_check_resolve(s, &err) == 0) {
        FUZZ_CHECK(*s && !strpbrk(s, " \t\r\n/"), "accepted '%s'", s);
        for (char *e = s; e; e = strchr(e, ',') ? strchr(e, ',') + 1 : NULL) {
            char *c1 = strchr(e, ':');
            FUZZ_CHECK(c1 && c1 != e && strchr(c1 + 1, ':'), "entry without HOST:PORT:ADDRESS in '%s'", s);
        }
    }
    free(s);
    return 0;
}
