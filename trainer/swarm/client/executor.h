/* executor: the training loop's executor (train.h) over a pipeline of stage peers.
 *
 * train.c runs the same loop whether the model lives in its process or on remote stage
 * peers; this module is the second case. Each step's batch is cut into microbatches that
 * the pipeline drives through the stages; with several clients sharing each step, this
 * client runs a contiguous run of them and meets the others at the coordinator's step
 * barrier (step_share.h), and only client 0, the leader, runs the optimizer step, the
 * outer steps across regions (before it lets the others go on) and the validation passes. Between steps it admits the peers the coordinator lists and the
 * pipeline lacks, and after each step it reports progress to the coordinator.
 *
 * A stage that loses every peer loses its state with them. The region's only client then
 * waits for replacements (the coordinator lists them) and restores the model: across
 * regions from the gateway's global parameters (outer_client_restore), else train.c rolls
 * it back to the newest checkpoint. With several clients the lost stage ends the run (the
 * clients, restarted, resume from the checkpoint).
 *
 * It neither connects nor parses anything: the caller hands it a connected pipeline and,
 * optionally, a coordinator client, both of which outlive it.
 */
#ifndef CIRRUS_EXECUTOR_H
#define CIRRUS_EXECUTOR_H

#include <signal.h>
#include <stdint.h>

#include "../../../common/cerr.h"
#include "../../train.h"
#include "../proto/coord_msg.h"
#include "pipeline.h"

typedef struct pipeline_executor pipeline_executor;

typedef struct pipeline_executor_options {
    int micro;           /* sequences per microbatch; it must divide every step's batch */
    coord_client *coord; /* the region's coordinator; NULL: none to report to or admit from */
    /* This client is `index` of `n_clients` sharing each step (1: it runs every
     * microbatch and steps alone; more need coord, where they meet). */
    int index, n_clients;
    /* Tests only: exit (137) half-way through this step's share, as a preempted pod
     * would (0: never). */
    uint64_t exit_mid_step;
    /* > 0: an outer step across regions every this many inner steps (or a stride of them:
     * gateway/schedule.h), through the coordinator's gateway (outer_client.h), taken by
     * client 0; a follower only learns its region's data shard there. 0: none. */
    int sync_every;
    int sync_timeout_ms;   /* how long an outer step may take; 0: 10 minutes */
    int sync_delay;        /* inner steps trained while an outer step runs (0: wait) */
    const char *sync_params; /* which parameters are synchronised (NULL: all) */
    uint64_t final_step;   /* the run's last step (it waits for its outer step) */
    const char *region;    /* the region's name on progress lines (NULL: not shown) */
    /* Non-zero once the run is asked to end: an outer step still waiting for the other
     * regions is abandoned (the region keeps its own parameters). NULL: never. */
    const volatile sig_atomic_t *stop;
    /* Seconds to wait for a replacement when a stage has lost every peer (the region's
     * only client, with coord); 0: 600. */
    int replace_wait_s;
} pipeline_executor_options;

/* An executor over p (which it borrows, with o->coord) into *out, and the train_executor
 * that runs training through it into *ex, valid until pipeline_executor_close(). */
int pipeline_executor_open(pipeline *p, const pipeline_executor_options *o,
                           pipeline_executor **out, train_executor *ex, cirrus_error *err);
void pipeline_executor_close(pipeline_executor *e);
/* The shard of the data the region trains on: its gateway's region index and region count
 * with outer steps (outer_client_data_shard), 0 of 1 without. */
int pipeline_executor_data_shard(pipeline_executor *e, int *rank, int *world,
                                 cirrus_error *err);

#endif
