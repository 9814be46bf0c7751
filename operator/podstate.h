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

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "../common/cerr.h"

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

/* Whether a pod that has not ended is stuck before its container runs: a container waiting
 * for a reason the kubelet gives for an error it will not get over by itself (ErrImagePull,
 * ImagePullBackOff, ErrImageNeverPull, InvalidImageName, CreateContainerConfigError,
 * CreateContainerError, RunContainerError). Then 1, with the reason and the kubelet's
 * message copied out; 0 for a pod starting normally (ContainerCreating, PodInitializing). */
int pod_waiting_error(const json_t *pod, char *reason, size_t reason_size, char *message,
                      size_t message_size);

/* How a client said it ended: the one line of JSON `cirrus-trainer client --summary-file`
 * writes (common/role_args.h), which the kubelet keeps as the container's termination
 * message. */
typedef struct client_summary {
    int64_t step;    /* 0 to the job's spec.steps */
    double loss;     /* the last training loss: finite and >= 0, or NAN: none */
    double val_loss; /* the final validation loss: finite and >= 0, or NAN: none */
    int64_t tokens;  /* >= 0: tokens trained on by the client's last run */
} client_summary;

/* Parse a termination message (len bytes) as a client summary. 0; CIRRUS_ECORRUPT (err, may be
 * NULL, names the field) when it is ROLE_SUMMARY_MAX bytes or more (what the kubelet keeps
 * at most, so it may be cut short), not a JSON object, has a member twice, or step is not an
 * integer in [0, max_step], loss or val_loss not a finite number >= 0 or null, tokens not an
 * integer >= 0. Other members are not read (a newer trainer may add some). Nothing in the
 * message is trusted until all of it passed: *out is written only on success. */
int client_summary_parse(const char *msg, size_t len, int64_t max_step, client_summary *out,
                         cirrus_error *err);

/* The summary of client pod `pod` whose trainer container terminated with exit code 0: 1 and
 * *out; 0 when that container has not terminated with exit 0 (nothing to read yet, or a
 * failed run, whose figures are not final); CIRRUS_ECORRUPT with err when it did but its
 * message is missing or does not parse (client_summary_parse). */
int pod_client_summary(const json_t *pod, int64_t max_step, client_summary *out,
                       cirrus_error *err);

/* Ended: a replacement may be created once the old pod is deleted. */
int pod_state_ended(enum pod_state s);
const char *pod_state_name(enum pod_state s);

#endif
