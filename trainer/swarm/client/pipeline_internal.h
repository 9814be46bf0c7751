/* pipeline_internal: the pipeline client's state, and what each of its modules offers the
 * others. pipeline.h is the interface; nothing outside swarm/client/ includes this file.
 *
 *   pipeline.c          the pipeline as an object: connect, close, routing, read-outs
 *   pipeline_link.c     requests to the stage peers: deadlines, failover, a lost peer
 *   pipeline_engine.c   microbatches in flight: forwards and backwards as queued tasks
 *   pipeline_step.c     the optimizer step: averaging, the tied embedding, the norm, STEP
 *   pipeline_members.c  peers joining, aligned, taken over, reported lost
 *   pipeline_state.c    the model's state gathered from and installed on the peers */
#ifndef CIRRUS_PIPELINE_INTERNAL_H
#define CIRRUS_PIPELINE_INTERNAL_H

#include "../../../common/clock.h"
#include "../../net/conn.h"
#include "../policy/deadline.h"
#include "../policy/wiring.h"
#include "../proto/rpc.h"
#include "../proto/stage_msg.h"
#include "pipeline.h"

#include <time.h>

#define PIPE_REPLY_LIMIT (256u << 20)

/* Peers answer their first requests slowly (memory is touched for the first time); until
 * then they get the caller's full timeout, not the stage's learned deadline. */
#define PIPE_WARM_REQUESTS 8

/* Requests to a peer get at least this many times the latency its measured throughput
 * predicts (the stage's deadline has the same margin over the stage's median). */
#define PIPE_PEER_DEADLINE_RATIO 3.0

typedef struct peer_link {
    net_conn *c;       /* NULL once dead */
    char addr[STAGE_ADDR_MAX];
    char ring[STAGE_ADDR_MAX]; /* its gradient-averaging address */
    uint32_t served;   /* forwards and backwards answered */
    uint32_t wid;      /* its id in the wiring: new for every connection */
} peer_link;

/* The peers serving one stage; slots of dead peers are reused by joining ones. */
typedef struct stage_link {
    int n;             /* slots in use */
    peer_link peer[PIPE_MAX_PEERS];
    int l0, l1;
} stage_link;

/* What a microbatch's backward at one stage needs, kept until the step. */
typedef struct mb_record {
    int32_t *x, *y;          /* tokens and targets (B*T) */
    float **in, **gout;      /* per stage: input activations, gradient of the output */
    int *bw_peer;            /* per stage: the peer whose gradients hold this microbatch */
    int *fw_peer;            /* per stage: the peer that ran its forward (-1: none yet) */
    uint64_t id;
    int B, T;
    float loss;              /* from the last stage's forward */
} mb_record;

typedef struct task task;

struct pipeline {
    int n, codec, timeout_ms, max_B, max_T;
    gpt_config cfg;
    char job_id[WIRE_JOB_ID_MAX + 1];
    stage_link link[PIPE_MAX_STAGES];
    float *acts[PIPE_MAX_STAGES + 1]; /* acts[s]: input of stage s (s >= 1) */
    float *tied;                      /* V*C */
    uint64_t next_id;                 /* request ids */
    uint64_t round;                   /* AVERAGE rounds */
    mb_record mb[PIPE_MAX_MICRO];
    int n_mb;                         /* microbatches in the current step */
    int averaged[PIPE_MAX_STAGES];    /* the stage's gradients are summed for this step */
    pipeline_counters counters;
    /* How long to wait for a forward (0) or backward (1) of each stage before trying
     * another peer: learned from the latencies seen, not guessed. */
    deadline_estimator *deadline[PIPE_MAX_STAGES][2];
    /* How long a stage's gradient averaging round may take: learned from the rounds seen,
     * and sent with each round, so a member that hangs makes the others' ring give up
     * then too; the round is repeated without it. */
    deadline_estimator *avg_deadline[PIPE_MAX_STAGES];
    stage_average avg;                /* the AVERAGE being sent (large: kept off the stack) */
    char dead[PIPE_MAX_STAGES * PIPE_MAX_PEERS][STAGE_ADDR_MAX]; /* never re-admitted */
    int n_dead;
    /* Which peer of a stage serves the next microbatch (swarm/wiring.c): least loaded by
     * measured throughput, or round robin. Holds the live peers only. */
    wiring *wiring;
    enum wiring_policy policy;
    uint32_t next_wid;
    /* Microbatches in flight: the step's records [0, n_mb) are started in order from
     * next_start while fewer than the window are active; tasks are their forwards and
     * backwards, queued or on the wire. */
    int inflight;                     /* the window; 0: one per live peer */
    int next_start, mb_active;
    task *tasks;
    int n_tasks, cap_tasks;
    int in_engine;                    /* inside engine_run: faults queue work, not run it */
    /* Several clients: optimizer steps the peers have taken as this client knows it (a
     * joining peer at that step needs no state copy), whether this client is a follower
     * (another client steps; it admits only peers already at the stage's step), and who
     * hears of the peers it loses (the leader tells the followers). */
    uint64_t steps_done;
    int follower;
    /* A stage lost every peer mid-step (pipeline_abandon_step): no microbatch runs until
     * the whole model's state is installed again (pipeline_set_state); meanwhile peers join
     * any stage without a copy, the state to come being everyone's. */
    int restoring;
    pipeline_lost_fn on_lost;
    void *on_lost_ctx;
};

static inline int pipe_peer_alive(const pipeline *p, int s, int k)
{
    return p->link[s].peer[k].c != NULL;
}

static inline int pipe_alive_count(const pipeline *p, int s)
{
    int n = 0;
    for (int k = 0; k < p->link[s].n; k++) n += pipe_peer_alive(p, s, k);
    return n;
}

/* ---- pipeline_link.c: requests ---- */

/* Send request id of `type` to peer k of stage s, and wait for its answer (type + 1; a
 * refusal comes back with the peer's code as rpc.h maps it, and its message). */
int pipe_send(pipeline *p, int s, int k, uint16_t type, uint64_t id, const wire_writer *w,
              cirrus_error *err);
int pipe_await(pipeline *p, int s, int k, uint16_t type, uint64_t id, wire_reader *r,
               int timeout_ms, cirrus_error *err);
/* Request -> reply with peer k of stage s, under the pipeline's timeout. */
int pipe_call_peer(pipeline *p, int s, int k, uint16_t type, const wire_writer *w,
                   wire_reader *r, cirrus_error *err);
/* Whether a forward or backward to peer k of stage s runs under the stage's learned
 * deadline (the peer is warm and has a live alternative), and that deadline in seconds
 * for B samples. */
int pipe_deadline_learned(const pipeline *p, int s, int k);
double pipe_learned_deadline(const pipeline *p, int s, int k, uint16_t type, int B);
/* What a forward or backward of B samples that took `took` seconds and ended with rc
 * teaches the stage's deadline estimator and the wiring. */
void pipe_observe(pipeline *p, int s, int k, uint16_t type, int B, double took, int learned,
                  int rc);
/* The first live peer of stage s (for requests that are not routed work); -1 if none. */
int pipe_any_live_peer(const pipeline *p, int s);
/* The live peer of stage s the wiring picks for work of `charge` samples (in forward
 * units); -1 if none. */
int pipe_routed_peer(pipeline *p, int s, double charge);
/* Slot k of stage s now holds a new live connection: the wiring tries it at once. */
int pipe_track_peer(pipeline *p, int s, int k);
/* A request on stage s: on `prefer` if alive, else on the peer the wiring picks for
 * `charge` samples (0: any live peer), moving on after transport failures. */
int pipe_on_stage(pipeline *p, int s, int prefer, uint16_t type, int B, double charge,
                  const wire_writer *w, wire_reader *r, int *served, cirrus_error *err);
/* The same request to every live peer of stage s; r receives one reply. */
int pipe_on_all_peers(pipeline *p, int s, uint16_t type, const wire_writer *w, wire_reader *r,
                      int *answered, cirrus_error *err);
/* Drop peer k of stage s after a transport failure (why); see pipeline_link.c. */
int pipe_peer_failed(pipeline *p, int s, int k, const cirrus_error *why, cirrus_error *err);
/* Whether rc means the peer is gone for this client (a fault, or it moved). */
int pipe_is_peer_fault(int rc);

/* ---- pipeline_engine.c: what a lost peer leaves to redo ---- */

/* Backwards whose gradients the lost peer `dead` of stage s held run again on survivors. */
int pipe_redo_backwards_of(pipeline *p, int s, int dead, cirrus_error *err);
/* Tasks queued for, or sent to, the lost peer k of stage s go to other peers. */
int pipe_reassign_tasks_of(pipeline *p, int s, int k, cirrus_error *err);

/* ---- pipeline_members.c ---- */

/* Connect slot k of stage s to addr and check (INFO) that it serves this model from the
 * stage's first layer, ending at *l1 (< 0: any, then set); *steps: its optimizer steps. */
int pipe_connect_peer(pipeline *p, int s, int k, const char *addr, int *l1, uint64_t *steps,
                      cirrus_error *err);

#endif
