#include "podstate.h"

#include <stdio.h>
#include <string.h>

/* Pod status reasons the kubelet and node controllers set when the node, not the program,
 * ended the pod. */
static const char *const preempt_reasons[] = {"Evicted",  "Preempting",   "NodeLost",
                                              "Shutdown", "NodeShutdown", "Terminated",
                                              "UnexpectedAdmissionError"};

static const char *str_at(const json_t *o, const char *a, const char *b)
{
    const json_t *v = json_object_get(o, a);
    if (b) v = json_object_get(v, b);
    return json_string_value(v);
}

static void set_why(char *why, size_t n, const char *fmt, const char *s, long code)
{
    if (!why || !n) return;
    if (s)
        snprintf(why, n, fmt, s);
    else
        snprintf(why, n, fmt, code);
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
 * is known to have terminated. *oom: one was killed by the OOM killer. */
static long exit_code(const json_t *status, int *oom)
{
    long code = -1;
    *oom = 0;
    size_t i;
    const json_t *cs;
    json_array_foreach(json_object_get(status, "containerStatuses"), i, cs)
    {
        const json_t *term = json_object_get(json_object_get(cs, "state"), "terminated");
        if (!term) term = json_object_get(json_object_get(cs, "lastState"), "terminated");
        const json_t *ec = json_object_get(term, "exitCode");
        const char *r = json_string_value(json_object_get(term, "reason"));
        if (r && !strcmp(r, "OOMKilled")) *oom = 1;
        if (!json_is_integer(ec)) continue;
        long v = (long)json_integer_value(ec);
        if (v != 0) return v;
        code = 0;
    }
    return code;
}

/* A pod that ended in phase Failed: the node's doing or the program's? */
static enum pod_state classify_failed(const json_t *status, char *why, size_t n)
{
    const char *reason = str_at(status, "reason", NULL);
    for (size_t i = 0; reason && i < sizeof preempt_reasons / sizeof *preempt_reasons; i++) {
        if (!strcmp(reason, preempt_reasons[i])) {
            set_why(why, n, "%s", reason, 0);
            return POD_PREEMPTED;
        }
    }
    const json_t *dt = true_condition(status, "DisruptionTarget");
    if (dt) {
        const char *r = str_at(dt, "reason", NULL);
        set_why(why, n, "DisruptionTarget: %s", r ? r : "unknown", 0);
        return POD_PREEMPTED;
    }
    int oom;
    long code = exit_code(status, &oom);
    if (oom) {
        /* Out of memory is the job's own doing (its model or batch does not fit the limits
         * it asked for): replacing the pod forever would never help. */
        set_why(why, n, "%s", "OOMKilled", 0);
        return POD_FAILED;
    }
    if (code >= 128 || code < 0) {
        /* Killed by a signal (SIGKILL from the OOM killer or a node shutting down, SIGTERM
         * from an eviction), or no container record at all: the node failed the pod. */
        if (code < 0)
            set_why(why, n, "%s", reason ? reason : "no exit code", 0);
        else
            set_why(why, n, "exit %ld", NULL, code);
        return POD_PREEMPTED;
    }
    set_why(why, n, "exit %ld", NULL, code);
    /* Phase Failed with every container at 0: something outside the program stopped it. */
    return code == 0 ? POD_PREEMPTED : POD_FAILED;
}

enum pod_state pod_state_of(const json_t *pod, char *why, size_t why_size)
{
    if (why && why_size) why[0] = 0;
    if (str_at(pod, "metadata", "deletionTimestamp")) return POD_TERMINATING;
    const json_t *status = json_object_get(pod, "status");
    const char *phase = str_at(status, "phase", NULL);
    if (!phase) phase = "Pending";
    if (!strcmp(phase, "Succeeded")) return POD_SUCCEEDED;
    if (!strcmp(phase, "Failed")) return classify_failed(status, why, why_size);
    if (!strcmp(phase, "Running"))
        return true_condition(status, "Ready") ? POD_READY : POD_RUNNING;
    const json_t *sched = false_condition(status, "PodScheduled");
    const char *r = sched ? str_at(sched, "reason", NULL) : NULL;
    if (r && !strcmp(r, "Unschedulable")) return POD_UNSCHEDULABLE;
    return POD_PENDING;
}

int pod_state_ended(enum pod_state s)
{
    return s == POD_SUCCEEDED || s == POD_PREEMPTED || s == POD_FAILED;
}

const char *pod_state_name(enum pod_state s)
{
    static const char *const names[] = {"Pending",   "Unschedulable", "Running",
                                        "Ready",     "Succeeded",     "Preempted",
                                        "Failed",    "Terminating"};
    return (unsigned)s < sizeof names / sizeof *names ? names[s] : "Unknown";
}
