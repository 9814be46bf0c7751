/* stage_peer: a process serving one pipeline stage to clients over the wire protocol.
 *
 * It builds the whole model from the job's seed (so every peer of every stage starts from
 * the same weights), keeps the layers [l0, l1) it serves, and answers forward / stateless
 * backward requests, gradient averaging with the other peers of its stage (a TCP ring
 * all-reduce), the tied-embedding gradient exchange, gradient sums and optimizer steps
 * (proto/stage_msg.h). One thread per connection; requests are served one at a time
 * under a lock (the model is one). A malformed request drops that connection only.
 *
 * Rebalancing: a heartbeat may tell the peer to move to another stage. It leaves between
 * steps (after a STEP or RESET, when it holds no gradients; after STAGE_PEER_MOVE_WAIT_S
 * regardless), refuses every request from then on with STAGE_MOVED, takes the layers,
 * parameters and optimizer state of a live peer of the new stage (INFO, STATE_GET; the
 * coordinator names them), and registers again at the new stage. Connections opened
 * before the move stay refused: clients drop the peer there and admit it at its new
 * stage. A failed move (no donor reachable) leaves it at its old stage.
 */
#ifndef CIRRUS_STAGE_PEER_H
#define CIRRUS_STAGE_PEER_H

#include <signal.h>
#include <stdint.h>

#include "../../model/gpt.h"
#include "../../optim/adamw.h"

typedef struct stage_peer_options {
    const char *job_id;
    gpt_config model;
    int l0, l1;            /* layers served */
    int max_B, max_T;      /* largest microbatch accepted */
    uint64_t seed;         /* the job's seed: identical initial weights everywhere */
    adamw_config adam;     /* betas, eps, decay; the learning rate comes with each STEP */
    int listen_fd;         /* a listening socket */
    /* Gradient averaging with the other peers of the stage: ring_addr ("host:port") is
     * where they reach this peer, ring_listen_fd the socket listening there. Who takes
     * part in a round is named by the client with each AVERAGE, so the ring follows the
     * membership. NULL ring_addr: this peer cannot average (it serves alone). */
    const char *ring_addr;
    int ring_listen_fd;
    /* The region's coordinator (NULL: none): the peer registers as stage_index, serving at
     * advertise_host:advertise_port, and heartbeats its counters. */
    const char *coord_host;
    int coord_port;
    int stage_index;
    const char *advertise_host;
    int advertise_port;
    /* Its name at the coordinator (a valid name, coord_name_ok); NULL or "": one made of the
     * stage, host and port. A stable name (the Pod's) lets a replacement be recognised. */
    const char *name;
    /* Tests and benchmarks: after each forward and backward the peer sleeps (slowdown - 1)
     * times its compute time, so it is `slowdown` times slower as a whole (<= 1: none). */
    double slowdown;
    /* The sleep follows the compute's CPU time, not its wall time: a peer F times slower
     * however loaded the machine (rebalancing tests on a shared 2-core machine). */
    int slowdown_cpu;
    /* Activation slots: the forwards whose activations are kept for their backward. With
     * several microbatches in flight, forwards of other microbatches come between a
     * forward and its backward; with too few slots the backward recomputes the forward.
     * 0: STAGE_PEER_DEFAULT_SLOTS. */
    int act_slots;
    /* The most connections served at once (a thread each); one more is closed as soon as
     * it is accepted. Clients, the stage's other peers copying state and the coordinator's
     * probes need a handful: the cap bounds what a flood of connections costs. 0:
     * STAGE_PEER_DEFAULT_CONNS. */
    int max_conns;
} stage_peer_options;

#define STAGE_PEER_DEFAULT_SLOTS 4
#define STAGE_PEER_MOVE_WAIT_S 30.0 /* longest wait for a step's end before moving anyway */
#define STAGE_PEER_MOVE_RETRY_S 5   /* after a failed move, the instruction waits this long */
#define STAGE_PEER_MAX_SLOTS 64
#define STAGE_PEER_DEFAULT_CONNS 128
#define STAGE_PEER_MAX_CONNS 4096

/* Serve until *stop becomes non-zero. Returns 0, or an error from set-up. */
int stage_peer_run(const stage_peer_options *o, volatile sig_atomic_t *stop,
                   cirrus_error *err);

#endif
