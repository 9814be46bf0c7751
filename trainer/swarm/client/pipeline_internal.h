/* pipeline_internal: the pipeline client's state, shared by its modules (pipeline.c: the
 * requests, the engine, the step and membership; pipeline_state.c: the model's state
 * gathered from and installed on the stage peers). Nothing outside swarm/client/ includes
 * it: pipeline.h is the interface. */
#ifndef CIRRUS_PIPELINE_INTERNAL_H
#define CIRRUS_PIPELINE_INTERNAL_H

#include "../../net/conn.h"
#include "../policy/deadline.h"
#include "../policy/wiring.h"
#include "../proto/rpc.h"
#include "../proto/stage_msg.h"
#include "pipeline.h"

#define PIPE_REPLY_LIMIT (256u << 20)

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
    pipeline_lost_fn on_lost;
    void *on_lost_ctx;
};

/* Request -> reply with peer k of stage s, under the pipeline's timeout. */
int pipe_call_peer(pipeline *p, int s, int k, uint16_t type, const wire_writer *w,
                   wire_reader *r, cirrus_error *err);
/* The first live peer of stage s (for requests that are not routed work); -1 if none. */
int pipe_any_live_peer(const pipeline *p, int s);
/* Drop peer k of stage s after a transport failure (why); see pipeline.c. */
int pipe_peer_failed(pipeline *p, int s, int k, const cirrus_error *why, cirrus_error *err);
/* Whether rc means the peer is gone for this client (a fault, or it moved). */
int pipe_is_peer_fault(int rc);

#endif
