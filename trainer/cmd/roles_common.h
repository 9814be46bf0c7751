/* roles_common: what the SWARM subcommands share (stage.c, client.c, local.c, gateway.c).
 *
 * The stop flag their signal handlers set, the activation codec and routing flags, and
 * the pipeline client itself: `client` and `local` both train through stage peers, found
 * on the command line or through the region's coordinator. Internal to cmd/.
 */
#ifndef CIRRUS_ROLES_COMMON_H
#define CIRRUS_ROLES_COMMON_H

#include <signal.h>

#include "../swarm/client/pipeline.h"
#include "../swarm/policy/wiring.h"
#include "cli.h"

/* Set by SIGTERM or SIGINT once roles_catch_signals() ran: a serving role stops. */
extern volatile sig_atomic_t roles_stop_requested;

/* SIGTERM and SIGINT set roles_stop_requested; SIGPIPE is ignored (a peer that went away
 * is an error on its connection, not the end of the process). */
void roles_catch_signals(void);

/* --act-compress: none or q8, into a STAGE_CODEC_*. */
int roles_parse_codec(const char *name, int *codec, cirrus_error *err);

/* The default --microbatch: the largest divisor of batch that cuts it into at least `parts`
 * microbatches (so that `parts` peers, or clients sharing each step, each have one); 1 if
 * batch has fewer sequences than parts. */
int roles_default_microbatch(int batch, int parts);

/* How a client routes microbatches (--routing, --inflight). */
typedef struct routing_flags {
    const char *name;
    enum wiring_policy policy;
    int inflight;
} routing_flags;

/* --routing and --inflight, shared by client and local (a flag table's entries). */
#define ROUTING_FLAGS(rt)                                                                     \
    {"routing", FLAG_STR, &(rt).name, 0, 0,                                                   \
     "which peer of a stage gets a microbatch: wiring (least loaded by measured "            \
     "throughput, default) or rr (round robin, speed ignored)",                               \
     0},                                                                                      \
        {"inflight", FLAG_INT, &(rt).inflight, 0, PIPE_MAX_MICRO,                             \
         "microbatches in flight at once (default 0: one per stage peer)", 0}

/* --routing: wiring or rr, into policy. */
int roles_parse_routing(const char *name, enum wiring_policy *policy, cirrus_error *err);

/* Where the client finds its stage peers: listed on the command line, or discovered. */
typedef struct peer_source {
    int n;                    /* stages; 0: ask the coordinator */
    const int *peers;         /* per stage */
    const char *const *addrs; /* stage-major */
    int wait_s;               /* how long to wait for every stage to have a peer (discovery;
                               * a replacement for a stage's lost peers) */
} peer_source;

/* Which of the region's clients this one is (--clients, --client-index). */
typedef struct client_share {
    int n_clients, index;
    int exit_mid_step; /* tests: --exit-mid-step */
    /* Outer steps across regions: every sync_every inner steps (0: none), through the
     * gateway at `coordinator`; region names the region on progress lines (NULL: none). */
    int sync_every, sync_timeout_s, sync_delay;
    const char *sync_params;
    const char *region;
    const char *summary_file; /* --summary-file (common/role_args.h); NULL: none */
} client_share;

/* A client resumes from its checkpoints on its own (a pod restarted, a job unsuspended):
 * from the newest complete one in --ckpt, if there is one, unless the stage peers are
 * already past it; checkpoints carry the job id, and another job's, another model's or
 * another seed's is refused. Sets o->resume and o->job, and checks the checkpoint now, so
 * that one that cannot be used is refused before processes start: nonzero (the message
 * printed) then. roles_run_client does it too. */
int roles_resume_setup(const char *cmd, train_options *o, const char *job);

/* Train through the stage peers of src as `cirrus-trainer cmd`, reporting to the
 * coordinator at `coordinator` (NULL: none); returns the exit code. */
int roles_run_client(const char *cmd, train_options *o, const char *job, const peer_source *src,
                     int codec, int micro, const char *coordinator, const routing_flags *routing,
                     const client_share *share);

#endif
