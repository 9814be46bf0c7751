/* pipeline: the client side of a pipeline of stage peers.
 *
 * A client drives each microbatch through the stages in order and keeps every stage's
 * input, so the backward can be sent to the stage with exactly the input its forward saw
 * (stage peers recompute if they no longer hold the activations). After the backward it
 * runs the optimizer step across stages: the tied-embedding gradient exchange, the global
 * gradient norm (per-tensor sums, added in buffer order) and the STEP itself, which makes
 * the result bit-identical to single-process training.
 */
#ifndef CIRRUS_PIPELINE_H
#define CIRRUS_PIPELINE_H

#include <stdint.h>

#include "../../model/gpt.h"
#include "../policy/wiring.h"

#define PIPE_MAX_STAGES 64
#define PIPE_MAX_PEERS 16
#define PIPE_MAX_MICRO 256 /* microbatches per step */

typedef struct pipeline pipeline;

/* Connect to n stages; stage s has peers[s] peers, whose "host:port" addresses come next in
 * addrs (stage-major). Checks that each stage's peers serve the same layers and that the
 * stages cover cfg's model in order. max_B x max_T bounds a microbatch. */
int pipeline_connect(pipeline **out, const char *job_id, int n, const int *peers,
                     const char *const *addrs, const gpt_config *cfg, int max_B, int max_T,
                     int codec, int timeout_ms, cirrus_error *err);
void pipeline_close(pipeline *p);
/* The region's only client takes over the peers (RESET): gradients a previous client left
 * in an unfinished step (it died) would otherwise be summed into this client's first step.
 * Not for one of several clients: it would drop the others' gradients. */
int pipeline_take_over(pipeline *p, cirrus_error *err);

/* Forward + backward of n microbatches of B x T tokens (microbatch i: x + i*B*T, y + i*B*T,
 * id first_id + i), up to the routing's window of them in flight at once; losses[i]
 * receives their mean losses. At each stage the wiring picks a forward's peer (least loaded
 * by measured throughput, or round robin), and the backward returns to it (it holds the
 * activations) unless it died. Gradients accumulate on the peers until pipeline_step(). */
int pipeline_microbatches(pipeline *p, uint64_t first_id, int n, int B, int T,
                          const int32_t *x, const int32_t *y, float *losses, cirrus_error *err);
/* The same for one microbatch. */
int pipeline_microbatch(pipeline *p, uint64_t id, int B, int T, const int32_t *x,
                        const int32_t *y, float *loss, cirrus_error *err);
/* How microbatches are routed: WIRING_LEAST_LOADED (the default) or WIRING_ROUND_ROBIN
 * (each stage's peers in turn, speed ignored), with up to `inflight` microbatches in flight
 * (0, the default: one per live peer); seed breaks the wiring's ties. Between steps only. */
int pipeline_set_routing(pipeline *p, enum wiring_policy policy, int inflight, uint64_t seed,
                         cirrus_error *err);
/* Optimizer step: the peers of each stage sum their gradients, then every stage steps
 * (grad_scale = 1 / microbatches accumulated since the last step). */
int pipeline_step(pipeline *p, float lr, float grad_scale, uint64_t step, cirrus_error *err);

/* ---- several clients ----
 * A step's microbatches are spread over several clients; one of them (the leader) runs
 * the step once all have done their share, the others (followers) end theirs with
 * pipeline_step_skip() once it is applied. A peer lost in a step may hold gradients of any
 * client: every client redoes its own backwards it held, the followers when the leader
 * names the peer (pipeline_peer_reported_lost()). How the clients meet is the caller's
 * business (the region's coordinator, cmd/roles_common.c and swarm/client/executor.c). */

/* Called whenever this client loses a peer: its stage, its address, and whether the
 * stage's gradients were still unsummed (then the other clients must redo theirs). */
typedef void (*pipeline_lost_fn)(void *ctx, int stage, const char *addr, int unsummed);
void pipeline_on_peer_lost(pipeline *p, pipeline_lost_fn fn, void *ctx);

typedef struct pipeline_step_sync {
    int total_mb; /* the step's microbatches over all clients */
    /* Before every attempt to sum stage s's gradients: make the other clients' share whole
     * (they redo what lost peers held; peers they admitted are admitted here). missing:
     * microbatches the stage's peers lacked in the last complete attempt (< 0: they held
     * more than the step has), else 0. Returns 0, an error, or PIPELINE_STEP_RESTARTED when
     * it started the step again (every peer's gradients dropped, every client's share run
     * again): then every stage sums from scratch. */
    int (*settle)(void *ctx, int stage, int missing, cirrus_error *err);
    void *ctx;
} pipeline_step_sync;

#define PIPELINE_STEP_RESTARTED 1

/* Run this client's microbatches of the step again from scratch (after the peers' gradients
 * were dropped: the step restarts); losses[i] receives their losses again. */
int pipeline_redo_step(pipeline *p, float *losses, cirrus_error *err);

/* The leader's step: as pipeline_step(), with the step's microbatches counted over every
 * client. */
int pipeline_step_shared(pipeline *p, float lr, float grad_scale, uint64_t step,
                         const pipeline_step_sync *sync, cirrus_error *err);
/* A follower's step, applied by the leader: drop this step's records. */
void pipeline_step_skip(pipeline *p, uint64_t step);
/* The leader reports peer addr of stage s lost: if this client still has it, it is
 * dropped (not banned) and this client's backwards it held are redone on survivors. */
int pipeline_peer_reported_lost(pipeline *p, int s, const char *addr, cirrus_error *err);
/* A follower admits only peers already at the stage's step (pipeline_join); the leader
 * copies state to the others. */
void pipeline_set_follower(pipeline *p, int follower);
/* After connecting: peers behind the region's step (the most any peer has taken: a peer
 * that replaced a lost one) take the state of one at it (SYNC), or, for a follower, are
 * left out until they are at it. */
int pipeline_align_peers(pipeline *p, cirrus_error *err);
/* A peer that appeared (e.g. listed by the coordinator) joins stage s: one behind the
 * stage's step copies the state of a live peer of the stage (SYNC), between steps and only
 * by a client that is not a follower (else it is left out for now, and this returns 0);
 * one at the stage's step needs no copy and may join during a step. It takes work at once.
 * An address already serving, or one that failed before, is ignored; one still live at
 * another stage moved to s (rebalancing) and leaves that stage first, unbanned (a peer that
 * answered STAGE_MOVED during a step has already been dropped there, unbanned too). */
int pipeline_join(pipeline *p, int s, const char *addr, cirrus_error *err);

typedef struct pipeline_counters {
    uint64_t microbatches; /* forward + backward completed */
    uint64_t retried;      /* requests re-sent to another peer after a failure */
    uint64_t redone;       /* backwards re-run because the peer holding them died */
    uint64_t peers_lost, peers_joined;
} pipeline_counters;

const pipeline_counters *pipeline_get_counters(const pipeline *p);
/* One log line per stage: each live peer's requests served and measured throughput. */
void pipeline_log_routing(const pipeline *p);
int pipeline_stages(const pipeline *p);
const gpt_config *pipeline_config(const pipeline *p);
/* Optimizer steps the stages' peers have taken, as this client knows it. */
uint64_t pipeline_steps_done(const pipeline *p);
/* The first stage with no live peer, or -1: a stage that lost every peer lost its state
 * with them (pipeline_abandon_step). */
int pipeline_empty_stage(const pipeline *p);

/* ---- a stage lost ----
 * When every peer of a stage is gone, the step in progress cannot finish and the stage's
 * parameters and moments are gone too. The region's only client then abandons the step
 * (the other stages' peers drop its gradients), waits for replacements to join
 * (pipeline_join admits them without a copy: there is nothing to copy), and installs a
 * whole model's state on every peer (pipeline_set_state: a checkpoint's, the seed's, or,
 * across regions, the global parameters with the survivors' moments). Until then no
 * microbatch runs. */
int pipeline_abandon_step(pipeline *p, cirrus_error *err);
/* Whether the pipeline waits for a state to install (pipeline_abandon_step). */
int pipeline_restoring(const pipeline *p);
/* While restoring: if every stage has a live peer at the client's step (the stage's peers
 * only timed out, or came back), nothing was lost: the others are aligned to them and the
 * pipeline runs again (0). CIRRUS_ENOENT when some stage's state is gone. */
int pipeline_resume_intact(pipeline *p, cirrus_error *err);
/* While restoring: every stage's state as its peers hold it now, whatever their steps (a
 * stage may have stepped before another failed; a replacement holds its seed's parameters
 * and zero moments). Nothing is written unless every stage answered in full. */
int pipeline_gather_state_as_is(pipeline *p, float *params, float *adam_m, float *adam_v,
                                cirrus_error *err);
/* Stage s now: its live peers, and the sum of their measured throughputs (samples/s; 0
 * before any was measured). */
void pipeline_stage_load(const pipeline *p, int s, int *peers, double *samples_per_s);

/* Between steps: the whole model's parameters and AdamW moments (gpt_num_params() floats
 * each), assembled from one live peer of every stage (STATE_GET), for a checkpoint;
 * *steps receives the optimizer steps the peers have taken. Nothing is written to the
 * buffers unless every stage answered in full. */
int pipeline_gather_state(pipeline *p, float *params, float *adam_m, float *adam_v,
                          uint64_t *steps, cirrus_error *err);

/* Between steps: the whole model's parameters (gpt_num_params() floats) from one live peer
 * of every stage, which must be at the step this client knows (the region's parameters an
 * outer step starts from). Parts may have been written when it fails. */
int pipeline_gather_params(pipeline *p, float *params, cirrus_error *err);
/* Between steps: the whole model's parameters installed on every live peer of every stage
 * (PARAMS_SET); their AdamW moments stay. A peer that fails at the transport is dropped:
 * no peer serves on with other parameters than its stage's. */
int pipeline_set_params(pipeline *p, const float *params, cirrus_error *err);
/* pipeline_gather_params and pipeline_set_params for the floats of the spans alone
 * (offsets into the whole model; an outer step's fragment, gateway/fragments.h), asked of
 * and installed on the stages that hold them (the tied embedding on the first and the
 * last); the rest of params is neither written nor read. */
int pipeline_gather_spans(pipeline *p, const gpt_span *spans, size_t n_spans, float *params,
                          cirrus_error *err);
int pipeline_set_spans(pipeline *p, const gpt_span *spans, size_t n_spans, const float *params,
                       cirrus_error *err);
/* Between steps: the whole model's state (gpt_num_params() floats each of parameters and
 * AdamW moments, as pipeline_gather_state returns it) installed on every live peer of
 * every stage (STATE_SET), which then have taken `steps` optimizer steps: a client
 * resuming from a checkpoint. A peer that fails at the transport is dropped. */
int pipeline_set_state(pipeline *p, const float *params, const float *adam_m,
                       const float *adam_v, uint64_t steps, cirrus_error *err);

/* Forward only: the mean loss of a batch, nothing kept. */
int pipeline_eval(pipeline *p, int B, int T, const int32_t *x, const int32_t *y, float *loss,
                  cirrus_error *err);

#endif
