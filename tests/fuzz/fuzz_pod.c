/* fuzz_pod: the operator's reading of a Pod as the API server returns it
 * (operator/podstate.c: pod_state_of), which decides whether a pod was preempted or
 * failed and so whether it counts toward the job's backoff limit.
 *
 * Input: a Pod as JSON. Invariants: the state is one of the eight, with a name; the reason
 * is NUL-terminated within its buffer, also for buffers of 0, 1 and 8 bytes; the state does
 * not depend on whether or how large a reason buffer is given; a pod with a
 * deletionTimestamp is Terminating; the pod JSON is not modified (compared with a copy).
 */
#include "fuzz.h"

#include <jansson.h>

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
    FUZZ_CHECK(json_equal(pod, copy), "pod_state_of modified the pod");
    json_decref(copy);
    json_decref(pod);
    return 0;
}
