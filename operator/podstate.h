/* podstate: what one of a SwarmJob's pods is doing, read from its status.
 *
 * The operator replaces its pods itself (restartPolicy Never). A pod that ended in phase
 * Failed is POD_FAILED, whatever ended it: whether that was a preemption (replaced, never
 * counted toward runPolicy.backoffLimit), a failure (counted) or the end of the job is the
 * job's runPolicy.podFailurePolicy's to say (failpolicy.h), from proof such as the
 * DisruptionTarget condition, never guessed from an exit code (a crash by signal is not a
 * preemption). Volcano counts evictions as retries and ends jobs Failed after enough spot
 * reclaims (#2560); Cirrus does not.
 *
 * Pure functions of the Pod JSON: no I/O, unit-tested on hand-written pods.
 */
#ifndef CIRRUS_PODSTATE_H
#define CIRRUS_PODSTATE_H

#include <jansson.h>

enum pod_state {
    POD_PENDING = 0,      /* not running yet (scheduling, pulling, starting) */
    POD_UNSCHEDULABLE,    /* pending for want of a node: PodScheduled False, Unschedulable */
    POD_RUNNING,          /* running but not Ready */
    POD_READY,            /* running and Ready */
    POD_SUCCEEDED,        /* every container exited 0 */
    POD_FAILED,           /* phase Failed: judged by the job's podFailurePolicy */
    POD_TERMINATING,      /* deletionTimestamp set: wait until it is gone */
};

/* The state of pod, and for failed pods a short description for events and logs ("exit
 * 139", "OOMKilled, exit 137", "Evicted, no exit code", "DisruptionTarget:
 * PreemptionByScheduler, exit 143", ...) copied into why (may be NULL). */
enum pod_state pod_state_of(const json_t *pod, char *why, size_t why_size);

/* Ended: a replacement may be created once the old pod is deleted. */
int pod_state_ended(enum pod_state s);
const char *pod_state_name(enum pod_state s);

#endif
