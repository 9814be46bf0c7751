/* wiring: which peer of a stage gets the next microbatch (SWARM's stochastic wiring).
 *
 * Per stage, a least-loaded virtual-clock scheduler over that stage's peers, as in the
 * SWARM reference code (docs seeds.md, "Stochastic wiring"): every peer has a virtual
 * finish time; a task goes to the peer with the smallest one (random tie-break), whose clock
 * then advances by task_size / throughput. Throughput is an EMA (alpha 0.1, Adam-style bias
 * correction) of what the client measured from request to response, so network and
 * queueing count. A backward is charged 2.5x a forward. A new peer enters at the current
 * minimum so it is tried at once. On error a peer is banned until it re-registers; a timeout
 * only records a failure (seeds.md, "Fault handling").
 *
 * A plain round-robin policy sits behind the same wiring_choose() so the benchmark can
 * compare the two on the same peers.
 *
 * Pure bookkeeping: no I/O, no clock reads (the caller measures seconds), no threads (one
 * client thread owns a wiring; wrap it in a lock to share). Deterministic for a given seed
 * and call sequence. Defines: wiring (opaque), its policy/kind/outcome enums, per-peer and
 * per-stage statistics.
 */
#ifndef CIRRUS_WIRING_H
#define CIRRUS_WIRING_H

#include <stdint.h>

#include "../../../common/cerr.h"

typedef struct wiring wiring;

enum wiring_policy {
    WIRING_LEAST_LOADED = 0, /* virtual clocks weighted by measured throughput */
    WIRING_ROUND_ROBIN = 1,  /* every eligible peer in turn, speed ignored (baseline) */
};

enum wiring_kind { WIRING_FORWARD = 0, WIRING_BACKWARD = 1 };

enum wiring_outcome {
    WIRING_OK = 0,      /* the peer answered: its latency updates the throughput EMA */
    WIRING_TIMEOUT = 1, /* no answer in time: a failure is counted, the peer stays eligible */
    WIRING_ERROR = 2,   /* the peer answered with an error: banned until re-added */
};

/* "No peer": the exclude argument when nothing failed. Not a valid peer id. */
#define WIRING_NONE UINT32_MAX
/* From the reference code: EMA weight of the newest measurement, and the cost of a
 * backward (recompute + grad) in forward units. */
#define WIRING_EMA_ALPHA 0.1
#define WIRING_BACKWARD_COST 2.5

typedef struct wiring_peer_stats {
    double throughput;   /* samples/s (forward units), bias-corrected EMA; 0 until measured */
    double vclock;       /* virtual finish time, in seconds of estimated work */
    uint32_t n_measured; /* OK reports (and timeouts) folded into the EMA since (re)added */
    int banned;          /* 1 after an ERROR, until wiring_peer_add() again */
    uint64_t chosen, completed, timeouts, errors;
} wiring_peer_stats;

typedef struct wiring_stage_stats {
    int n_peers;       /* registered, banned included */
    int n_eligible;    /* not banned */
    int n_measured;    /* eligible with at least one measurement */
    double throughput; /* sum over eligible peers (unmeasured ones at the stage's prior) */
    uint64_t chosen, completed, timeouts, errors;
} wiring_stage_stats;

/* NULL if n_stages < 1 or on allocation failure. seed makes tie-breaks reproducible; each
 * stage draws from its own sub-stream (rng_derive(seed, stage)). */
wiring *wiring_new(int n_stages, enum wiring_policy policy, uint64_t seed);
void wiring_free(wiring *w);

/* Register peer_id on stage. A new peer starts at the stage's current minimum virtual time
 * (tried at once). Adding a peer that is already registered and not banned changes nothing
 * (peer lists are re-announced periodically; a refresh must not reset its clock); adding a
 * banned peer un-bans it as a fresh registration (new clock, EMA forgotten).
 * CIRRUS_EINVAL: bad stage or peer_id == WIRING_NONE; CIRRUS_ENOMEM. */
int wiring_peer_add(wiring *w, int stage, uint32_t peer_id);
/* Forget the peer (it left). CIRRUS_ENOENT if it was not registered. */
int wiring_peer_remove(wiring *w, int stage, uint32_t peer_id);

/* Pick the peer for one task of task_size samples (> 0) and charge it. exclude_id is a
 * peer that must not be chosen (the one that just failed this task), or WIRING_NONE.
 * CIRRUS_ENOENT when no peer is eligible (none registered, all banned or excluded). */
int wiring_choose(wiring *w, int stage, enum wiring_kind kind, double task_size,
                  uint32_t exclude_id, uint32_t *peer_id);
/* Report how a task sent to peer_id ended: seconds from request to response (OK), or
 * waited until giving up (TIMEOUT). kind and task_size are those passed to choose(); a
 * backward's time is divided by WIRING_BACKWARD_COST so the EMA stays in forward units.
 * CIRRUS_ENOENT if the peer was removed meanwhile (harmless); CIRRUS_EINVAL on bad values. */
int wiring_report(wiring *w, int stage, uint32_t peer_id, enum wiring_kind kind,
                  double task_size, double seconds, enum wiring_outcome outcome);

/* Estimated samples/s (forward units); 0 if unknown or not yet measured. */
double wiring_throughput(const wiring *w, int stage, uint32_t peer_id);
int wiring_peer_stats_get(const wiring *w, int stage, uint32_t peer_id,
                          wiring_peer_stats *out);
/* Totals of one stage: what rebalancing reads (sum of its peers' throughputs). */
int wiring_stage_stats_get(const wiring *w, int stage, wiring_stage_stats *out);

#endif
