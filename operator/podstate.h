/* podstate: what one of a SwarmJob's pods is doing, read from its status.
 *
 * The operator replaces its pods itself (restartPolicy Never), so it must tell a pod lost to
 * the cloud from one whose program failed: preemption (evicted, deleted, node gone, a
 * DisruptionTarget condition, killed by a signal: exit >= 128) is routine on spot capacity
 * and never counts toward runPolicy.backoffLimit; a failure (exit 1..127, or OOMKilled: the
 * job asked for too little memory) does. Volcano
 * counts evictions as retries and ends jobs Failed after enough spot reclaims (#2560);
 * Cirrus does not.
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
    POD_PREEMPTED,        /* ended by the infrastructure: replace, do not count a failure */
    POD_FAILED,           /* ended by its own program (exit 1..127): counts toward backoff */
    POD_TERMINATING,      /* deletionTimestamp set: wait until it is gone */
};

/* The state of pod, and for ended pods a short reason for events and logs ("exit 137",
 * "Evicted", "DisruptionTarget: PreemptionByScheduler", ...) copied into why (may be NULL). */
enum pod_state pod_state_of(const json_t *pod, char *why, size_t why_size);

/* Ended: a replacement may be created once the old pod is deleted. */
int pod_state_ended(enum pod_state s);
const char *pod_state_name(enum pod_state s);

#endif
