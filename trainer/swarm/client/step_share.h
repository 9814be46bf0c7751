/* step_share: several clients of a region sharing each optimizer step (`client --clients C
 * --client-index I`, `local --clients C`).
 *
 * Every client runs its share of a step's microbatches and ARRIVEs at the coordinator's
 * step barrier (STEP_SYNC, docs/PROTOCOL.md). Client 0, the leader, waits until all have,
 * sums the stages' gradients expecting every microbatch, steps, and says APPLIED; the
 * followers wait for that. A peer the leader loses while its stage is unsummed may hold any
 * client's gradients: the leader posts it (REDO) and waits until every follower has redone
 * its own backwards there and arrived again. If the peers hold more of the step than it
 * has (a client died half-way through its share and its replacement ran it again, or a
 * follower redid a backward it had given up on at a hung peer the leader kept, which did
 * it after all), the leader starts the step again: RESET on every peer, a REDO for all stages, every client
 * reruns its share. The barrier's calls ride out a coordinator restart, and the leader
 * posts again the notices a restarted coordinator no longer has.
 *
 * What the leader does between the optimizer step and APPLIED (the region's outer step
 * across regions: installing the global parameters) happens while the followers are held,
 * so no follower runs the next step on parameters about to change. If the leader then stands
 * at a later step (its region joined the job at the global state's step), APPLIED says that
 * step, and the followers jump there with it.
 */
#ifndef CIRRUS_STEP_SHARE_H
#define CIRRUS_STEP_SHARE_H

#include <signal.h>
#include <stdint.h>

#include "../../../common/cerr.h"
#include "../proto/coord_msg.h"
#include "pipeline.h"
#include "../proto/stage_msg.h"

/* A peer named in a notice: lost during a step whose stage had not summed its gradients
 * yet (stage COORD_ALL_STAGES in `posted`: the step restarted). */
typedef struct share_peer {
    int stage;
    char addr[STAGE_ADDR_MAX];
} share_peer;

/* How client `index` of `n_clients` (2 or more) shares the steps. */
typedef struct step_share_options {
    coord_client *coord;
    int index, n_clients;      /* this client, of how many; client 0 is the leader */
    /* Between steps, the peers the coordinator lists and the client lacks join (the
     * leader admits them mid-step when a stage is short of microbatches). */
    void (*admit)(void *ctx, uint64_t step);
    void *admit_ctx;
    /* Outer steps across regions: the leader takes one before it says APPLIED, so a
     * follower waits that much longer (the round's timeout, in s), and a later step
     * applied means the region joined the job there. 0: no outer steps. */
    double outer_wait_s;
    /* Set when the process is asked to stop (SIGTERM: a pod deleted): the barrier's waits
     * end at once instead of at their deadline (a follower whose leader is gone would wait
     * minutes). NULL: never. */
    const volatile sig_atomic_t *stop;
} step_share_options;

typedef struct step_share {
    pipeline *p;
    step_share_options o;
    uint64_t step;             /* the step being shared */
    int mine;                  /* microbatches of it this client runs */
    double loss_sum;           /* their losses, summed in order */
    uint64_t redo_seen;        /* the newest notice acted on (the leader's: posted) */
    share_peer lost[PIPE_MAX_STAGES * PIPE_MAX_PEERS]; /* the leader's, not yet posted */
    int n_lost;
    /* The leader's notices of this step, to post again should the coordinator restart and
     * forget them (a restart notice supersedes the rest). */
    share_peer posted[PIPE_MAX_STAGES * PIPE_MAX_PEERS];
    int n_posted;
    coord_step_state barrier;  /* the barrier's latest answer */
} step_share;

/* Set up s as o says and hook it to the pipeline: the leader hears of every peer it loses,
 * and the followers become followers. */
void step_share_init(step_share *s, pipeline *p, const step_share_options *o);

/* A new step: this client will run `mine` of its microbatches. */
void step_share_begin(step_share *s, uint64_t step, int mine);

/* Run after the leader's optimizer step, before APPLIED (NULL: nothing). */
typedef int (*step_share_applied_fn)(void *ctx, cirrus_error *err);

/* After this client's share (s->loss_sum set). The leader: wait for every client, sum every
 * stage expecting `microbatches`, take the optimizer step (lr, grad_scale as
 * pipeline_step), run before_applied(ctx), and say APPLIED (of the pipeline's step then:
 * later than the step shared if before_applied moved the region on); *total_loss is the sum
 * of every client's losses. May return PIPELINE_STEP_RESTARTED's outcome as
 * pipeline_step_shared does. */
int step_share_lead(step_share *s, int microbatches, float lr, float grad_scale,
                    step_share_applied_fn before_applied, void *ctx, double *total_loss,
                    cirrus_error *err);

/* A follower: wait until the leader has applied the step, redoing what it is asked to.
 * The pipeline then stands at the step the leader applied: the shared one, or, with outer
 * steps, a later one the leader's region jumped to (pipeline_steps_done tells). */
int step_share_follow(step_share *s, cirrus_error *err);

#endif
