/* jobstatus: a SwarmJob's status from what the operator observed of its pods.
 *
 * The controller counts, per region, the ready peers of every stage, the pods waiting for a
 * node, the gateway's readiness, the clients' progress and the preemptions and failures so
 * far; jobstatus_build() turns that into the status subresource: phase, conditions (with
 * lastTransitionTime kept while a condition's status does not change), per-region figures
 * and the printer-column strings. Pure: the clock is passed in, so it is unit-tested.
 *
 * Training progress (progress.h, read from the gateways' /status): per region step, loss
 * and tokensPerSecond as its gateway last reported them; once the region's client 0 has
 * finished, step and loss are the ones its own summary gives (has_summary), with
 * validationLoss; a region with neither known to this process keeps the figures the old
 * status shows for it. The job's .status.step is the
 * least step of the regions that have one (the job is as far as its slowest region), .loss
 * the mean of their losses and .tokensPerSecond the sum of their rates. With no region
 * figures at all the three are left out (a merge patch keeps what the status had).
 *
 * Outer steps across regions (a job of several regions; the gateways' /status "outer"):
 * per region outerStep (-1 before its gateway has the global parameters) and wanBytes (sent
 * plus received over the WAN), kept from the old status like the figures above while none
 * is known; the job's .status.outerStep is the least of the regions' (the outer steps are
 * global: a region behind has not taken part in the later ones yet) and .wanBytes their sum
 * (saturating). Left out when no region has an outerStep (a job of one region has none).
 *
 * Whether those figures are current: per region progressTime, when its gateway last gave a
 * valid answer (RFC 3339; kept from the old status like the figures), and the condition
 * ProgressCurrent, evaluated against job_observed.progress_stale_s (progress_stale_s(): a
 * region's answer older than that is stale) while the job is Running or Degraded:
 *   True    GatewaysAnswering   every region answered within the last progress_stale_s;
 *   False   GatewayUnreachable  some region's latest answer is older, or it never answered
 *                               in progress_stale_s of being read; the message names each
 *                               such region, its last answer and why its reads fail;
 *   Unknown NoAnswerYet         no region stale, but some has not answered yet: read for
 *                               less than progress_stale_s (a new job, a new leader, a
 *                               gateway ready again) or never read at all (gateway not ready);
 *   Unknown NotRunning          the job is not Running or Degraded (no gateway is read);
 *   Unknown ProgressNotRead     the operator does not read the gateways (period 0).
 * The figures themselves stay as they were: stale figures are still the latest known. The
 * message names the regions and times, never an age, so that it does not change (and cause a
 * write) while nothing happens; jobstatus_progress_due() says when time alone will change
 * the condition, for the controller to look again then.
 *
 * The scale subresource (spec.peersPerStage): status.peersPerStage is the fewest peer pods any
 * stage of any region has (region_observed.peers; a stage being scaled up counts its new pods
 * from their creation, as a Deployment's status.replicas does), status.selector the label
 * selector of the job's peer pods, by which a HorizontalPodAutoscaler reads their metrics.
 *
 * Phases: Failed once failures exceed runPolicy.backoffLimit, a pod matched a FailJob rule of
 * runPolicy.podFailurePolicy or runPolicy.activeDeadlineSeconds has passed since the job
 * started, and Succeeded once every client
 * finished (both final); Suspended while spec.suspend; Running when every region has its
 * gateway and at least peers.min ready peers in every stage; Degraded when training can go
 * on (some region has a ready gateway and a ready peer in every stage) or had started, but
 * not every region is at strength; Created before that.
 */
#ifndef CIRRUS_JOBSTATUS_H
#define CIRRUS_JOBSTATUS_H

#include <stdint.h>

#include <jansson.h>

#define JOBSTATUS_MAX_REGIONS 64
#define JOBSTATUS_MAX_STAGES 64

typedef struct region_observed {
    const char *name;
    int n_stages, replicas, min;          /* from the spec */
    int ready[JOBSTATUS_MAX_STAGES];      /* ready peer pods per stage, by their stage label */
    int peers[JOBSTATUS_MAX_STAGES];      /* wanted peer pods per stage that exist (any state
                                           * but ended or terminating), by their stage label */
    int unschedulable;                    /* pods pending for want of a node */
    int gateway_ready;
    int clients, clients_succeeded;
    int success_ignored;                  /* spec.successPolicy.targetRegions names regions,
                                           * and not this one: its clients do not count */
    int64_t preemptions, failures;        /* totals since the job started */
    /* The gateway's latest valid /status (progress.h); has_progress 0: none. loss and
     * tokens_per_s NAN when the gateway has none yet. */
    int has_progress;
    int64_t step;
    double loss, tokens_per_s;
    /* How the region's client 0 said it ended, from its finished pod (podstate.h:
     * pod_client_summary); has_summary 0: none. Its figures are final: they replace the
     * gateway's (whose last answer may predate the last steps, and which is gone once the
     * job succeeded) as the region's step, loss and validationLoss. NAN: none. */
    int has_summary;
    int64_t summary_step;
    double summary_loss, summary_val_loss;
    /* For ProgressCurrent: when that answer was read (Unix seconds; 0: none known to this
     * process, and the old status's progressTime counts), since when this process reads the
     * gateway (Unix seconds; 0: it does not, e.g. the gateway is not ready) and how its reads
     * fail now (NULL: they do not; progress_region.failing). */
    int64_t progress_time, watched_since;
    const char *failing;
    /* The outer steps across regions from that answer (progress_result.has_outer and
     * .outer); has_outer 0: none known (the old status's outerStep and wanBytes stay). */
    int has_outer;
    int64_t outer_step; /* >= -1; -1: the gateway has no outer step yet */
    int64_t wan_bytes;  /* >= 0 */
    /* The live peers of each stage by that answer (progress_result.stage_peers: by the
     * stage each serves now, which rebalancing changes; pods keep the stage label they were
     * made with). While the answer is fresh (ProgressCurrent's rule) jobstatus_build counts
     * these as the stage's ready peers instead of ready[]. has_live 0: none. */
    int has_live;
    int live[JOBSTATUS_MAX_STAGES];
    /* Regions in several clusters: where other clusters reach its gateway (NULL: unknown or
     * not needed); the member cluster that runs it (NULL: this one), in which case every
     * figure above is the one the member's copy of the job reports, and cluster_unreachable
     * says that the member did not answer (the figures are then the last known). */
    const char *endpoint, *cluster;
    int cluster_unreachable;
} region_observed;

typedef struct job_observed {
    const char *name; /* metadata.name, for status.selector (NULL: left out) */
    int n_regions;
    region_observed regions[JOBSTATUS_MAX_REGIONS];
    int64_t backoff_limit;
    /* spec.successPolicy.operator: Any (1): the job Succeeded once every client of one
     * target region has; All (0): once every client of every target region has. */
    int success_any;
    int suspended;
    int deadline_exceeded; /* runPolicy.activeDeadlineSeconds has passed since startTime */
    /* A pod matched a FailJob rule of runPolicy.podFailurePolicy: the Failed condition's
     * message (reason PodFailurePolicy, kept while the job stays Failed); NULL: none. */
    const char *policy_failure;
    int64_t generation;
    int progress_stale_s;  /* progress_stale_s(); 0: the gateways are not read */
    /* Why not everything the spec asks for could be made, for the Created condition (False
     * with this reason and message; NULL reason: True, ObjectsCreated): "InvalidSpec" (the
     * spec passed the CRD's rules but desired_build refused it, e.g. a pod name over 63
     * characters) or "PodCreateFailed" (the API server refused a pod: admission, quota,
     * an invalid field; or it could not be reached), the message in the refuser's words. */
    const char *not_created_reason, *not_created_message;
    /* The first pod found stuck before its container runs (podstate.h: pod_waiting_error),
     * for the PodsStarted condition (False with the kubelet's reason and "pod NAME: its
     * message"); stuck_reason empty: none is. */
    char stuck_reason[64], stuck_message[512];
    /* A job with member clusters (spec.clusters): the ClustersReachable condition, False
     * (MemberUnreachable) with this message naming each cluster that did not answer and why;
     * NULL: every one did. */
    int has_members;
    const char *members_unreachable;
    const char *members_reason; /* its reason: MemberUnreachable (default), MemberConfigInvalid */
    /* A copy in a member cluster: the home job's final phase (spec.home.phase,
     * "Succeeded" or "Failed"), which the copy takes; NULL: none yet. */
    const char *home_phase;
    int is_copy; /* a copy (spec.home): the home judges success, backoff and deadline */
} job_observed;

enum job_phase { PHASE_CREATED, PHASE_RUNNING, PHASE_DEGRADED, PHASE_SUSPENDED,
                 PHASE_SUCCEEDED, PHASE_FAILED };

/* spec.successPolicy into obs (success_any, each region's success_ignored), once obs's
 * regions are filled from the spec. Unset or malformed fields (the CRD refuses them) read
 * as the default: All, every region. */
void jobstatus_read_success_policy(const json_t *spec, job_observed *obs);
/* Whether region r of obs has finished: it runs clients and every one Succeeded. */
int jobstatus_region_finished(const region_observed *r);

/* The phase for obs, given the phase in the current status (NULL or "" if none): final
 * phases stay final. */
enum job_phase jobstatus_phase(const job_observed *obs, const char *old_phase,
                               int started_before);
const char *jobstatus_phase_name(enum job_phase p);
int jobstatus_phase_final(enum job_phase p);

/* The new status object. old_status: the job's current status (may be NULL); now: an
 * RFC 3339 UTC time ("2026-11-22T01:02:03Z") used for transitions. A new reference. */
json_t *jobstatus_build(const job_observed *obs, const json_t *old_status, const char *now);

/* True when writing new_status over old would change anything but lastTransitionTime (a
 * write that changes nothing would still wake every watcher). Only new_status's fields are
 * compared (a field left out of a merge patch is kept), and a null one (removed) counts only
 * when old has the field. */
int jobstatus_changed(const json_t *old, const json_t *new_status);

/* The Unix second at which time alone changes the ProgressCurrent condition of status, the
 * status jobstatus_build() made from obs at now (a region's figures go stale, a first answer
 * becomes overdue); 0 when nothing is due. */
int64_t jobstatus_progress_due(const job_observed *obs, const json_t *status, const char *now);

/* The condition of this type in a status object (NULL: none). */
const json_t *jobstatus_condition(const json_t *status, const char *type);

/* "2026-11-22T01:02:03Z" for the current time. */
void jobstatus_now(char *buf, size_t n);
/* The same for Unix second t. */
void jobstatus_format_time(int64_t t, char *buf, size_t n);
/* An RFC 3339 UTC time as those ("...Z", a fraction of a second ignored) in Unix seconds,
 * or -1. */
int64_t jobstatus_parse_time(const char *s);

#endif
