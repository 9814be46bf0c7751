/* outer_client: the region's leader client taking part in the outer steps across regions.
 *
 * At the inner steps the global state's schedule names (every `every` inner steps, or a
 * stride of that the gateways agreed on: gateway/schedule.h), between two steps (with
 * several clients, while the followers are held at the step barrier: step_share.h), the
 * leader gathers the region's parameters
 * from its stage peers, PUSHes them to its gateway (gateway/outer_msg.h, over the
 * coordinator connection), waits for the gateway to complete the outer round with the
 * other regions, PULLs the new global parameters and installs them on every peer of every
 * stage (pipeline_set_params); AdamW's moments stay on the peers. With a delay, the region
 * goes on training while the round crosses the WAN, and takes the result as soon as it is
 * in from `delay` inner steps later on, waiting for it only when the next outer step is due
 * (Streaming DiLoCo's overlap, one-step-delayed outer updates). At the start it pushes the
 * initial parameters (round 0: the gateway adopts them, or keeps the global state it
 * already has, which the region then takes).
 */
#ifndef CIRRUS_OUTER_CLIENT_H
#define CIRRUS_OUTER_CLIENT_H

#include <signal.h>
#include <stdint.h>

#include "../../../common/cerr.h"
#include "../proto/coord_msg.h"
#include "pipeline.h"

typedef struct outer_client outer_client;

/* every >= 1 inner steps per outer step. delay (0 .. every - 1): inner steps the region
 * trains on at least while its round runs on the WAN (0: it waits); the global parameters
 * are then merged, once in, with the progress made meanwhile (theta = global + theta_now -
 * theta_pushed).
 * sync_params (gateway/sync_params.h; NULL: all): which parameters the outer steps
 * synchronise, the same spec as the gateway's. final_step: the run's last step, always an outer step, which waits for its round. timeout_ms: how long
 * a round may take; stop (may be NULL): once set, a round still waited for is abandoned. */
int outer_client_open(pipeline *p, coord_client *cc, const gpt_config *cfg, int every,
                      int delay, const char *sync_params, uint64_t final_step, int timeout_ms,
                      const volatile sig_atomic_t *stop, outer_client **out,
                      cirrus_error *err);
void outer_client_close(outer_client *oc);

/* The region's index among the job's regions and their number, as its gateway said at
 * outer_client_open: the region trains on that shard of every global batch (train_options
 * data_rank, data_world), so that the regions' pseudo-gradients come from disjoint data. */
int outer_client_data_shard(outer_client *oc, int *rank, int *world, cirrus_error *err);

/* The same for a follower client of the region (it takes no outer steps: the leader does,
 * step_share.h), asked of the gateway at cc alone. */
int outer_client_region(coord_client *cc, int timeout_ms, const volatile sig_atomic_t *stop,
                        int *region, int *regions, cirrus_error *err);

/* Round 0, before the first step: the region takes the latest global parameters. With
 * hold_install (a leader whose other clients may already run their share of the first step
 * on the peers, which refuse new parameters mid-step), they are installed only after that
 * step, in the first outer_client_after_step, which the leader runs while the followers
 * are held (step_share_lead): with the step's progress on top, or not at all where the
 * region had them already. */
int outer_client_begin(outer_client *oc, int hold_install, cirrus_error *err);
/* After inner step `step` (tokens: trained on since the last call): the outer step, when
 * step is a multiple of every. */
int outer_client_after_step(outer_client *oc, uint64_t step, uint64_t tokens,
                            cirrus_error *err);

/* A stage of the region lost every peer, and replacements joined (pipeline_abandon_step):
 * the region takes the global parameters of the latest outer step (waiting for the round
 * it pushed, if one runs) on every stage, the synchronised ones at least; the survivors
 * keep their AdamW moments and the rest of their parameters, the replacements start with
 * fresh moments (and their seed's values for parameters the outer steps leave regional).
 * Training goes on at the same inner step: the region loses what it trained since that
 * outer step, not more. */
int outer_client_restore(outer_client *oc, cirrus_error *err);

/* The inner step the job's global state stands for: that of the latest outer step the
 * region has heard of (outer step k is pushed at inner step k x every; the run's last at
 * final_step). Above the region's step when the region (re)started or was cut off while the
 * others went on. */
uint64_t outer_client_job_step(const outer_client *oc);
/* The region joins the job where it is: every peer takes the global parameters it holds now
 * (installed by the last round) at outer_client_job_step(), with its own moments; the
 * caller moves its data there too. A region that lost every pod (its zone reclaimed) or was
 * cut off for many outer steps so trains on with the others instead of redoing their steps. */
int outer_client_join_job(outer_client *oc, cirrus_error *err);

/* For progress lines: the latest outer step the region took part in, and the gateway's
 * WAN bytes (both directions) as it last said. */
void outer_client_progress(const outer_client *oc, uint64_t *outer_step, uint64_t *wan_bytes,
                           uint64_t *digest);

#endif
