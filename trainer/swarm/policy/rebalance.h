/* rebalance: when to move a peer from one pipeline stage to another.
 *
 * A SWARM pipeline runs at the speed of its slowest stage. The paper moves a peer from the
 * least loaded stage to the bottleneck every T seconds; the released code never does
 * (seeds.md, "Rebalancing"). Petals, the closest public implementation, moves only if the
 * swarm's minimum stage throughput improves enough, and its users still report thrash when
 * servers move too eagerly (Petals #389). A move costs minutes (the mover downloads the
 * stage's parameters and optimizer state), so this policy is conservative:
 *
 *  - a move must raise the pipeline's minimum stage throughput, estimated after the move
 *    from per-peer throughputs, by min_gain (default 10%) -- or, when several stages tie at
 *    the bottleneck (within min_gain), must not lower the minimum and must leave fewer
 *    stages at it, the step every real improvement then needs (4-1-1 -> 3-2-1 -> 2-2-2).
 *    Under fixed estimates every accepted move strictly improves (minimum, then number of
 *    bottleneck stages), so no sequence of moves can return to an earlier assignment;
 *  - no stage is left with fewer than min_peers peers, and none is given a peer when it has
 *    max_peers already (the operator's peers.max: a stage's peers share a gradient ring and
 *    a node pool sized for so many);
 *  - a peer moves at most once per hold_periods periods (and never twice in one period);
 *  - hysteresis: for hold_periods periods a stage that received a peer does not give one
 *    and a stage that gave one does not receive; and for reverse_memory periods after
 *    peers moved A -> B, any move B -> A (that peer or another) needs reverse_gain and a
 *    clear gain, so estimates noisy near the margin cannot bounce peers A -> B -> A.
 *    (Estimates should be steadier than about half of min_gain: at +-5% noise per period
 *    the tests' simulations never reverse a move; at +-6%, moves between equally good
 *    assignments start to appear; raise min_gain for noisier swarms);
 *  - a stage below min_peers or with no throughput at all halts the pipeline: filling it
 *    ignores the stage holds (not the per-peer limit).
 *
 * Among acceptable moves: the best stage throughputs after the move in leximin order
 * (highest minimum, then highest second smallest, ...: filling one of two empty stages
 * takes the fastest spare peer), then the donor that stays the most over-provisioned
 * (highest throughput after giving the peer up), then the lowest peer id: deterministic.
 *
 * Usage, once per period: rebalance_peer_set() for every live peer (its current stage and
 * wiring_throughput()), rebalance_peer_remove() for those gone, rebalance_decide(); if it
 * returns 1, start the move and rebalance_apply() it; then rebalance_next_period(). Pure:
 * no I/O, no clock; history (who moved when, from where) lives in the state.
 */
#ifndef CIRRUS_REBALANCE_H
#define CIRRUS_REBALANCE_H

#include <stdint.h>

#include "../../../common/cerr.h"

typedef struct rebalance_config {
    double min_gain;     /* required relative gain of the minimum stage throughput; 0.10 */
    double reverse_gain; /* the same for a move against a recent flow (B -> A after
                          * A -> B); 0.25 */
    int min_peers;       /* peers every stage keeps, >= 0; 1 */
    int max_peers;       /* most peers a stage is given, >= 0; 0: no bound */
    int hold_periods;    /* stage/peer hold in periods, >= 0; 3 */
    int reverse_memory;  /* periods a flow A -> B is remembered, >= 0; 50 */
} rebalance_config;

typedef struct rebalance_move {
    uint32_t peer_id;
    int from_stage, to_stage;
    double min_before, min_after; /* pipeline minimum stage throughput, samples/s */
} rebalance_move;

/* Opaque: per stage, relative work and hold history; per stage pair, the last flow; per
 * peer, stage, throughput and last move; the current period. */
typedef struct rebalance_state rebalance_state;

rebalance_config rebalance_config_default(void);
/* cfg NULL = defaults; 1 <= n_stages <= 4096. NULL on bad arguments or allocation
 * failure. */
rebalance_state *rebalance_new(int n_stages, const rebalance_config *cfg);
void rebalance_free(rebalance_state *s);

/* Relative compute per sample of a stage (default 1 for all). A peer's throughput moves
 * with it scaled by work[from] / work[to]: stages of unequal depth differ in cost. */
int rebalance_stage_work(rebalance_state *s, int stage, double work);
/* Add or update a peer: the stage it serves and its throughput there in samples/s
 * (<= 0: not measured yet, taken as the mean of the measured peers of its stage, else of
 * all measured peers, else 1). A peer that changed stage by itself (re-registered) keeps
 * its move history. CIRRUS_EINVAL on a bad stage or a NaN, CIRRUS_ENOMEM. */
int rebalance_peer_set(rebalance_state *s, uint32_t peer_id, int stage, double throughput);
int rebalance_peer_remove(rebalance_state *s, uint32_t peer_id); /* CIRRUS_ENOENT */

/* 1 and *out filled when a move should be made, 0 when none should, or a negative
 * cirrus_status (CIRRUS_ENOMEM for scratch space, CIRRUS_EINVAL). Changes nothing. */
int rebalance_decide(const rebalance_state *s, rebalance_move *out);
/* Record a move as made: the peer's stage, its throughput (scaled by stage work), and the
 * hold history. CIRRUS_ENOENT for an unknown peer, CIRRUS_EINVAL for a stale move. */
int rebalance_apply(rebalance_state *s, const rebalance_move *m);
void rebalance_next_period(rebalance_state *s);

/* Stage totals as the policy sees them: peers and throughput (samples/s). */
int rebalance_stage_info(const rebalance_state *s, int stage, int *n_peers,
                         double *throughput);
int64_t rebalance_period(const rebalance_state *s);

#endif
