#include "podstate.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "../common/role_args.h"
#include "desired.h"

static const char *str_at(const json_t *o, const char *a, const char *b)
{
    const json_t *v = json_object_get(o, a);
    if (b) v = json_object_get(v, b);
    return json_string_value(v);
}

/* The condition of type `type` whose status is "True", or NULL. */
static const json_t *true_condition(const json_t *status, const char *type)
{
    size_t i;
    const json_t *c;
    json_array_foreach(json_object_get(status, "conditions"), i, c)
    {
        const char *t = str_at(c, "type", NULL), *s = str_at(c, "status", NULL);
        if (t && s && !strcmp(t, type) && !strcmp(s, "True")) return c;
    }
    return NULL;
}

static const json_t *false_condition(const json_t *status, const char *type)
{
    size_t i;
    const json_t *c;
    json_array_foreach(json_object_get(status, "conditions"), i, c)
    {
        const char *t = str_at(c, "type", NULL), *s = str_at(c, "status", NULL);
        if (t && s && !strcmp(t, type) && !strcmp(s, "False")) return c;
    }
    return NULL;
}

/* The first non-zero exit code among terminated containers; 0 if all exited 0; -1 if none
 * is known to have terminated. *oom: that container was killed by the OOM killer; *term:
 * the failed container's terminated state (NULL if none). */
static long exit_code(const json_t *status, int *oom, const json_t **term_out)
{
    long code = -1;
    *oom = 0;
    *term_out = NULL;
    size_t i;
    const json_t *cs;
    json_array_foreach(json_object_get(status, "containerStatuses"), i, cs)
    {
        const json_t *term = json_object_get(json_object_get(cs, "state"), "terminated");
        if (!term) term = json_object_get(json_object_get(cs, "lastState"), "terminated");
        const json_t *ec = json_object_get(term, "exitCode");
        if (!json_is_integer(ec)) continue;
        long v = (long)json_integer_value(ec);
        if (v != 0) {
            const char *r = json_string_value(json_object_get(term, "reason"));
            *oom = r && !strcmp(r, "OOMKilled");
            *term_out = term;
            return v;
        }
        code = 0;
    }
    return code;
}

/* A crash report in a termination message (the log's tail, terminationMessagePolicy
 * FallbackToLogsOnError; common/crash.c writes it): " crashed with SIGSEGV at +0x41019
 * +0x5d4bb ...", the offsets of the frames in Cirrus's own binary, which addr2line turns
 * into lines of the image's build. Empty when the message holds no crash report. */
static void describe_crash(const json_t *term, char *out, size_t n)
{
    out[0] = 0;
    const char *msg = json_string_value(json_object_get(term, "message"));
    const char *at = msg ? strstr(msg, "crashed with SIG") : NULL;
    if (!at) return;
    at += strlen("crashed with ");
    size_t sig = strspn(at, "ABCDEFGHIJKLMNOPQRSTUVWXYZ");
    int used = snprintf(out, n, " crashed with %.*s at", (int)(sig < 12 ? sig : 12), at);
    int frames = 0;
    /* Each frame line: BINARY(+0xOFFSET)[0xADDRESS]; only the frames of cirrus binaries. */
    for (const char *line = strchr(at, '\n'); line && used > 0 && (size_t)used < n;
         line = strchr(line + 1, '\n')) {
        const char *end = strchr(line + 1, '\n');
        const char *off = strstr(line + 1, "(+0x");
        if (!off || (end && off > end)) continue;
        const char *bin = strstr(line + 1, "cirrus-");
        if (!bin || bin > off) continue;
        size_t hex = strspn(off + 4, "0123456789abcdef");
        if (hex == 0 || hex > 16) continue;
        used += snprintf(out + used, n - (size_t)used, " +0x%.*s", (int)hex, off + 4);
        if (++frames == 12) break;
    }
    if (!frames) snprintf(out, n, " crashed with %.*s", (int)(sig < 12 ? sig : 12), at);
}

/* What a pod that ended in phase Failed shows of why, for Events and logs: the disruption
 * Kubernetes recorded, the pod's reason, the exit code. Only words: whether it was a
 * preemption is the job's podFailurePolicy's to say (failpolicy.h), never guessed here. */
static void describe_failed(const json_t *status, char *why, size_t n)
{
    if (!why || !n) return;
    const json_t *dt = true_condition(status, "DisruptionTarget");
    const char *reason = str_at(status, "reason", NULL);
    int oom;
    const json_t *term;
    long code = exit_code(status, &oom, &term);
    char exit_part[256] = "", crash[200];
    describe_crash(term, crash, sizeof crash);
    if (code >= 0)
        snprintf(exit_part, sizeof exit_part, "%sexit %ld%s", oom ? "OOMKilled, " : "", code,
                 crash);
    else snprintf(exit_part, sizeof exit_part, "no exit code");
    if (dt) {
        const char *r = str_at(dt, "reason", NULL);
        snprintf(why, n, "DisruptionTarget: %s, %s", r ? r : "unknown", exit_part);
    } else if (reason) {
        snprintf(why, n, "%s, %s", reason, exit_part);
    } else {
        snprintf(why, n, "%s", exit_part);
    }
}

enum pod_state pod_state_of(const json_t *pod, char *why, size_t why_size)
{
    if (why && why_size) why[0] = 0;
    if (str_at(pod, "metadata", "deletionTimestamp")) return POD_TERMINATING;
    const json_t *status = json_object_get(pod, "status");
    const char *phase = str_at(status, "phase", NULL);
    if (!phase) phase = "Pending";
    if (!strcmp(phase, "Succeeded")) return POD_SUCCEEDED;
    if (!strcmp(phase, "Failed")) {
        describe_failed(status, why, why_size);
        return POD_FAILED;
    }
    if (!strcmp(phase, "Running"))
        return true_condition(status, "Ready") ? POD_READY : POD_RUNNING;
    const json_t *sched = false_condition(status, "PodScheduled");
    const char *r = sched ? str_at(sched, "reason", NULL) : NULL;
    if (r && !strcmp(r, "Unschedulable")) return POD_UNSCHEDULABLE;
    return POD_PENDING;
}

int pod_waiting_error(const json_t *pod, char *reason, size_t reason_size, char *message,
                      size_t message_size)
{
    static const char *const errors[] = {"ErrImagePull",       "ImagePullBackOff",
                                         "ErrImageNeverPull",  "InvalidImageName",
                                         "CreateContainerConfigError", "CreateContainerError",
                                         "RunContainerError"};
    const json_t *status = json_object_get(pod, "status");
    const char *phase = str_at(status, "phase", NULL);
    if (str_at(pod, "metadata", "deletionTimestamp") ||
        (phase && (!strcmp(phase, "Succeeded") || !strcmp(phase, "Failed"))))
        return 0;
    size_t i;
    const json_t *cs;
    json_array_foreach(json_object_get(status, "containerStatuses"), i, cs)
    {
        const json_t *w = json_object_get(json_object_get(cs, "state"), "waiting");
        const char *r = str_at(w, "reason", NULL);
        for (size_t k = 0; r && k < sizeof errors / sizeof errors[0]; k++) {
            if (strcmp(r, errors[k])) continue;
            const char *m = str_at(w, "message", NULL);
            snprintf(reason, reason_size, "%s", r);
            snprintf(message, message_size, "%s", m ? m : "(no message)");
            return 1;
        }
    }
    return 0;
}

int pod_state_ended(enum pod_state s)
{
    return s == POD_SUCCEEDED || s == POD_FAILED;
}

const char *pod_state_name(enum pod_state s)
{
    static const char *const names[] = {"Pending", "Unschedulable", "Running", "Ready",
                                        "Succeeded", "Failed",      "Terminating"};
    return (unsigned)s < sizeof names / sizeof *names ? names[s] : "Unknown";
}

/* ---- client summaries ------------------------------------------------------------------------ */

/* Member `key` of o: a finite number >= 0 into *v, or null / absent: NAN. */
static int loss_or_null(const json_t *o, const char *key, double *v, cirrus_error *err)
{
    const json_t *x = json_object_get(o, key);
    *v = NAN;
    if (!x || json_is_null(x)) return 0;
    if (!json_is_number(x))
        return cirrus_fail(err, CIRRUS_ECORRUPT, "summary %s is not a number or null", key);
    double d = json_number_value(x);
    if (!isfinite(d) || d < 0)
        return cirrus_fail(err, CIRRUS_ECORRUPT, "summary %s %g is not a finite number >= 0",
                           key, d);
    *v = d;
    return 0;
}

int client_summary_parse(const char *msg, size_t len, int64_t max_step, client_summary *out,
                         cirrus_error *err)
{
    if (!msg || !len) return cirrus_fail(err, CIRRUS_ECORRUPT, "the summary is empty");
    if (len >= ROLE_SUMMARY_MAX)
        return cirrus_fail(err, CIRRUS_ECORRUPT,
                           "the summary is %zu bytes, at Kubernetes's limit of %d (cut short?)",
                           len, ROLE_SUMMARY_MAX);
    json_error_t je;
    json_t *o = json_loadb(msg, len, JSON_REJECT_DUPLICATES, &je);
    if (!o) return cirrus_fail(err, CIRRUS_ECORRUPT, "the summary is not JSON: %s", je.text);
    client_summary s = {0};
    const json_t *step = json_object_get(o, "step"), *tokens = json_object_get(o, "tokens");
    int rc = 0;
    if (!json_is_object(o))
        rc = cirrus_fail(err, CIRRUS_ECORRUPT, "the summary is not a JSON object");
    else if (!json_is_integer(step))
        rc = cirrus_fail(err, CIRRUS_ECORRUPT, "summary step is not an integer");
    else if (json_integer_value(step) < 0 || json_integer_value(step) > max_step)
        rc = cirrus_fail(err, CIRRUS_ECORRUPT, "summary step %lld is not in [0, %lld] (spec.steps)",
                         (long long)json_integer_value(step), (long long)max_step);
    else if (!json_is_integer(tokens) || json_integer_value(tokens) < 0)
        rc = cirrus_fail(err, CIRRUS_ECORRUPT, "summary tokens is not an integer >= 0");
    if (!rc) rc = loss_or_null(o, "loss", &s.loss, err);
    if (!rc) rc = loss_or_null(o, "val_loss", &s.val_loss, err);
    if (!rc) {
        s.step = (int64_t)json_integer_value(step);
        s.tokens = (int64_t)json_integer_value(tokens);
        *out = s;
    }
    json_decref(o);
    return rc;
}

int pod_client_summary(const json_t *pod, int64_t max_step, client_summary *out,
                       cirrus_error *err)
{
    size_t i;
    const json_t *cs;
    json_array_foreach(json_object_get(json_object_get(pod, "status"), "containerStatuses"), i, cs)
    {
        const char *name = str_at(cs, "name", NULL);
        if (!name || strcmp(name, CIRRUS_CONTAINER)) continue;
        const json_t *term = json_object_get(json_object_get(cs, "state"), "terminated");
        const json_t *code = json_object_get(term, "exitCode");
        if (!json_is_integer(code) || json_integer_value(code) != 0) return 0;
        const json_t *msg = json_object_get(term, "message");
        if (!json_is_string(msg) || !json_string_length(msg))
            return cirrus_fail(err, CIRRUS_ECORRUPT, "it exited 0 without a termination message");
        return client_summary_parse(json_string_value(msg), json_string_length(msg), max_step,
                                    out, err)
                   ? CIRRUS_ECORRUPT
                   : 1;
    }
    return 0;
}
