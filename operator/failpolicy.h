/* failpolicy: spec.runPolicy.podFailurePolicy, what a pod that ended in phase Failed means
 * for the job: a preemption (replaced, never counted toward backoffLimit), a failure (counted)
 * or the end of the job.
 *
 * In the style of the Job API's podFailurePolicy (and JobSet's failurePolicy rules): an
 * ordered list of rules, the first whose matcher fits the pod decides, and a pod no rule
 * fits is a failure (Count). A rule has an action (Ignore, Count, FailJob) and exactly one
 * matcher:
 *   onExitCodes      {containerName?, operator In|NotIn, values}: some container (of that
 *                    name) terminated with a non-zero exit code in / not in values (exit 0
 *                    never matches, as in the Job API);
 *   onPodConditions  [{type, status}]: the pod has one of these conditions (status default
 *                    "True"), e.g. DisruptionTarget, which Kubernetes sets on every pod it
 *                    ends from outside (preemption, eviction, taint, pod GC, node shutdown);
 *   onPodReasons     [reason]: the pod's status.reason is one of these (the kubelet's
 *                    "Evicted" and the node controllers' reasons, which carry no condition).
 *
 * The defaults (FAILPOLICY_DEFAULT_RULES, the same as the CRD's default, which a unit test
 * checks) make a preemption something proven: the DisruptionTarget condition or a node's
 * reason. An exit code is never taken for proof (issue 13: a crash by signal, SIGSEGV 139 or
 * SIGILL 132 from an image built for a newer CPU, counted as a preemption and the job looped
 * forever). A pod that vanished (deleted by someone else) or whose node was deleted has no
 * exit to judge: the controller counts it as a preemption without asking the rules.
 *
 * Pure: no I/O, unit-tested on hand-written pods.
 */
#ifndef CIRRUS_FAILPOLICY_H
#define CIRRUS_FAILPOLICY_H

#include <stddef.h>

#include <jansson.h>

#include "../common/cerr.h"

/* The Job API's limits, which the CRD has too. */
#define FAILPOLICY_MAX_RULES 20
#define FAILPOLICY_MAX_VALUES 255
#define FAILPOLICY_MAX_PATTERNS 20

/* The rules used when the spec has none at all (an object stored under an older CRD: the
 * CRD's default gives every other object these). */
#define FAILPOLICY_DEFAULT_RULES                                                              \
    "[{\"action\":\"Ignore\",\"onPodConditions\":[{\"type\":\"DisruptionTarget\","           \
    "\"status\":\"True\"}]},"                                                                 \
    "{\"action\":\"Ignore\",\"onPodReasons\":[\"Evicted\",\"Preempting\",\"NodeLost\","      \
    "\"Shutdown\",\"NodeShutdown\",\"Terminated\",\"UnexpectedAdmissionError\"]}]"

typedef enum failpolicy_action {
    FAILPOLICY_COUNT = 0, /* a failure: counted toward runPolicy.backoffLimit, replaced */
    FAILPOLICY_IGNORE,    /* a preemption: replaced, counted in preemptions only */
    FAILPOLICY_FAIL_JOB,  /* the job is Failed at once */
} failpolicy_action;

/* A job's rules (a reference of its own to a JSON array). */
typedef struct failpolicy {
    json_t *rules;
} failpolicy;

/* The rules of job spec (spec.runPolicy.podFailurePolicy.rules, else the defaults), checked
 * as the CRD checks them: 0, or CIRRUS_EINVAL with a message naming the field (an object the
 * API server did not validate, e.g. stored under an older CRD); CIRRUS_ENOMEM. */
int failpolicy_from_spec(const json_t *spec, failpolicy *out, cirrus_error *err);
void failpolicy_free(failpolicy *p);

/* What a pod in phase Failed means. *rule: the index of the rule that decided, -1 when none
 * matched (Count). */
failpolicy_action failpolicy_judge(const failpolicy *p, const json_t *pod, int *rule);
const char *failpolicy_action_name(failpolicy_action a);

#endif
