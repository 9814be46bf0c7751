/* fuzz_pod: the operator's reading of a Pod as the API server returns it
 * (operator/podstate.c: pod_state_of) and the judgement of a failed one by the default
 * runPolicy.podFailurePolicy (operator/failpolicy.c: failpolicy_judge), which decide whether
 * a pod was preempted or failed and so whether it counts toward the job's backoff limit.
 *
 * Input: a Pod as JSON. Invariants: the state is one of the seven, with a name; the reason
 * is NUL-terminated within its buffer, also for buffers of 0, 1 and 8 bytes; the state does
 * not depend on whether or how large a reason buffer is given; a pod with a
 * deletionTimestamp is Terminating; the default rules judge any pod to one of their actions,
 * naming the rule that decided (0 or 1) unless none did (-1: Count), and Ignore only pods
 * that carry a proof (a True DisruptionTarget condition or a status.reason); a client
 * summary (podstate.c: pod_client_summary, the termination message of a finished client)
 * is read (1) only from a trainer container that exited 0, with every field in range, and
 * otherwise leaves its output untouched (0, or CIRRUS_ECORRUPT with a reason); the pod JSON
 * is not modified (compared with a copy); and what the operator's cache keeps of the pod
 * (operator/cache_slim.c) gets the same state, reason, judgement and summary.
 */
#include "fuzz.h"

#include <math.h>

#include <jansson.h>

#include "../../operator/cache_slim.h"
#include "../../operator/failpolicy.h"
#include "../../operator/podstate.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    json_t *pod = json_loadb((const char *)data, size, 0, NULL);
    if (!pod) return 0;
    json_t *copy = json_deep_copy(pod);
    char why[128];
    memset(why, 'x', sizeof why);
    enum pod_state s = pod_state_of(pod, why, sizeof why);
    FUZZ_CHECK((unsigned)s <= POD_TERMINATING, "state %d", (int)s);
    FUZZ_CHECK(strcmp(pod_state_name(s), "Unknown"), "state %d has no name", (int)s);
    FUZZ_CHECK(memchr(why, '\0', sizeof why), "reason not terminated");
    FUZZ_CHECK(pod_state_of(pod, NULL, 0) == s, "state differs without a reason buffer");
    char small[8];
    for (size_t n = 0; n <= sizeof small; n += 1 + 6 * (n == 1)) {
        memset(small, 'x', sizeof small);
        FUZZ_CHECK(pod_state_of(pod, small, n) == s, "state differs with a %zu-byte reason", n);
        FUZZ_CHECK(n == 0 || memchr(small, '\0', n), "reason overflows a %zu-byte buffer", n);
        FUZZ_CHECK(n == sizeof small || small[sizeof small - 1] == 'x', "wrote past %zu bytes", n);
        FUZZ_CHECK(n == 0 || !strncmp(small, why, n - 1), "truncated reason differs");
    }
    if (json_string_value(json_object_get(json_object_get(pod, "metadata"), "deletionTimestamp")))
        FUZZ_CHECK(s == POD_TERMINATING, "deleted pod in state %s", pod_state_name(s));
    static failpolicy defaults;
    if (!defaults.rules) {
        cirrus_error err = {0};
        FUZZ_CHECK(!failpolicy_from_spec(NULL, &defaults, &err), "defaults: %s", err.msg);
    }
    int rule = -2;
    failpolicy_action a = failpolicy_judge(&defaults, pod, &rule);
    FUZZ_CHECK(a == FAILPOLICY_COUNT || a == FAILPOLICY_IGNORE, "default action %d", (int)a);
    FUZZ_CHECK(rule >= -1 && rule <= 1, "rule %d", rule);
    FUZZ_CHECK((rule < 0) == (a == FAILPOLICY_COUNT), "rule %d for action %d", rule, (int)a);
    const json_t *status = json_object_get(pod, "status");
    FUZZ_CHECK(a != FAILPOLICY_IGNORE || json_object_get(status, "conditions") ||
                   json_string_value(json_object_get(status, "reason")),
               "ignored without a proof");
    client_summary sum = {.step = -7};
    cirrus_error serr = {0};
    int got = pod_client_summary(pod, 300, &sum, &serr);
    FUZZ_CHECK(got == 1 || got == 0 || got == CIRRUS_ECORRUPT, "summary rc %d", got);
    if (got == 1) {
        FUZZ_CHECK(sum.step >= 0 && sum.step <= 300 && sum.tokens >= 0, "summary step %lld",
                   (long long)sum.step);
        FUZZ_CHECK((isnan(sum.loss) || (isfinite(sum.loss) && sum.loss >= 0)) &&
                       (isnan(sum.val_loss) || (isfinite(sum.val_loss) && sum.val_loss >= 0)),
                   "summary losses %g %g", sum.loss, sum.val_loss);
    } else {
        FUZZ_CHECK(sum.step == -7, "summary written though refused (rc %d)", got);
        FUZZ_CHECK(got == 0 || serr.msg[0], "summary refused without a reason");
    }
    FUZZ_CHECK(json_equal(pod, copy), "pod_state_of, failpolicy_judge or pod_client_summary "
                                      "modified the pod");
    /* What the operator's cache keeps of the pod (cache_slim.h) is classified, judged and
     * summarised as the whole pod is. */
    json_t *slim = json_deep_copy(pod);
    cache_slim_pod(slim);
    char slim_why[128];
    FUZZ_CHECK(pod_state_of(slim, slim_why, sizeof slim_why) == s && !strcmp(slim_why, why),
               "the slimmed pod's state or reason differs");
    int slim_rule = -2;
    FUZZ_CHECK(failpolicy_judge(&defaults, slim, &slim_rule) == a && slim_rule == rule,
               "the slimmed pod is judged otherwise");
    client_summary slim_sum = {.step = -7};
    FUZZ_CHECK(pod_client_summary(slim, 300, &slim_sum, &serr) == got &&
                   (got != 1 || (slim_sum.step == sum.step && slim_sum.tokens == sum.tokens)),
               "the slimmed pod's summary differs");
    json_decref(slim);
    json_decref(copy);
    json_decref(pod);
    return 0;
}
