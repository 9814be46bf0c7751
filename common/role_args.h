/* role_args: the command lines of the trainer roles the operator launches, in one place.
 *
 * The operator builds `cirrus-trainer ROLE --FLAG VALUE ...` for its Pods from these names and
 * the trainer's flag tables (trainer/cmd/stage.c, client.c, local.c, gateway.c) parse the
 * same names, so a renamed flag cannot silently break the Pods. Flag names are bare ("job");
 * ROLE_ARG(ROLE_FLAG_JOB) is the command-line spelling ("--job"), a string literal like the
 * names themselves.
 */
#ifndef CIRRUS_ROLE_ARGS_H
#define CIRRUS_ROLE_ARGS_H

/* The trainer's executable (on PATH in the image) and the roles' subcommands. */
#define ROLE_TRAINER_BIN "cirrus-trainer"
#define ROLE_STAGE "stage"     /* a stage peer: serves layers [l0, l1) of the model */
#define ROLE_CLIENT "client"   /* trains through the region's pipeline of stage peers */
#define ROLE_GATEWAY "gateway" /* the region's coordinator (membership, /status, /metrics) */

#define ROLE_ARG(flag) "--" flag

/* Flags (the trainer's names; which role takes which is noted). */
#define ROLE_FLAG_JOB "job"                 /* all: job id (the SwarmJob's metadata.uid) */
#define ROLE_FLAG_SERVE "serve"             /* stage: layers served, "L0:L1" */
#define ROLE_FLAG_LISTEN "listen"           /* stage, gateway: HOST:PORT to listen on */
#define ROLE_FLAG_LISTEN_FD "listen-fd"     /* stage: an inherited listening socket */
#define ROLE_FLAG_ADVERTISE "advertise"     /* stage: host clients reach the peer at */
#define ROLE_FLAG_COORDINATOR "coordinator" /* stage, client: the gateway, HOST:PORT */
#define ROLE_FLAG_STAGE_INDEX "stage-index" /* stage: its stage, 0-based */
#define ROLE_FLAG_NAME "name"               /* stage: its name at the coordinator (the Pod's) */
#define ROLE_FLAG_RING_ADDR "ring-addr"     /* stage: HOST:PORT for the stage's gradient ring */
#define ROLE_FLAG_RING_FD "ring-fd"         /* stage: inherited socket listening at ring-addr */
#define ROLE_FLAG_HTTP_PORT "http-port"     /* gateway: /status and /metrics port */
#define ROLE_FLAG_HEARTBEAT_MS "heartbeat-ms" /* gateway: members' heartbeat interval */
#define ROLE_FLAG_REBALANCE_PERIOD_S "rebalance-period-s" /* gateway: seconds between
                                                     rebalancing decisions; 0: never */
#define ROLE_FLAG_STAGES "stages"           /* gateway: stage count; client: peer addresses */
#define ROLE_FLAG_MODEL "model"             /* stage, client: preset (tiny, small, medium) */
#define ROLE_FLAG_LAYERS "layers"           /* stage, client: override; gateway: layer count */
#define ROLE_FLAG_WIDTH "width"             /* stage, client: overrides of the preset */
#define ROLE_FLAG_HEADS "heads"
#define ROLE_FLAG_CONTEXT "context"
#define ROLE_FLAG_BATCH "batch"             /* client: sequences/step; stage: largest microbatch */
#define ROLE_FLAG_SEQ "seq"                 /* stage, client: tokens per sequence */
#define ROLE_FLAG_SEED "seed"               /* stage, client: the job's seed */
#define ROLE_FLAG_STEPS "steps"             /* client: optimizer steps */
#define ROLE_FLAG_DATA "data"               /* client: training text file */
#define ROLE_FLAG_MICROBATCH "microbatch"   /* client: sequences per microbatch */
#define ROLE_FLAG_CLIENTS "clients"         /* client: the region's clients, sharing each step */
#define ROLE_MAX_CLIENTS 64                 /*   at most (the coordinator's step barrier) */
#define ROLE_FLAG_CLIENT_INDEX "client-index" /* client: which of them, 0-based (0 steps) */
#define ROLE_FLAG_ACT_COMPRESS "act-compress" /* client: activation codec */
/* The outer steps between regions (trainer/cmd/wan_roles.h, gateway.c, client.c). */
#define ROLE_FLAG_SYNC_EVERY "sync-every"     /* gateway, client: inner steps per outer step */
#define ROLE_FLAG_REGION "region"             /* gateway, client: its region */
#define ROLE_FLAG_REGIONS "regions"           /* gateway: NAME=HOST:PORT,... every region's */
#define ROLE_FLAG_WAN_LISTEN "wan-listen"     /* gateway: HOST:PORT of its WAN endpoint */
#define ROLE_FLAG_TLS_DIR "tls-dir"           /* gateway: ca.crt, tls.crt, tls.key */
#define ROLE_FLAG_CODEC "codec"               /* gateway: the WAN codec (wan_codec_parse) */
#define ROLE_FLAG_OUTER_LR "outer-lr"         /* gateway: outer learning rate */
#define ROLE_FLAG_OUTER_MOMENTUM "outer-momentum" /* gateway: outer Nesterov momentum */
#define ROLE_FLAG_FRAGMENTS "fragments"       /* gateway: staggered fragments of the outer sync */
#define ROLE_FLAG_CKPT "ckpt"                 /* client (0 only): checkpoint directory */
#define ROLE_FLAG_CKPT_EVERY "ckpt-every"     /* client: steps between checkpoints */
#define ROLE_FLAG_MAX_CONNECTIONS "max-connections" /* gateway, stage: connections served
                                                      * at once (docs/SECURITY.md) */
#define ROLE_FLAG_MAX_STAGE_PEERS "max-stage-peers" /* gateway: most peers rebalancing
                                                     * leaves in a stage (0: no bound) */
/* How a client ended, for the operator: `--summary-file PATH` makes the client write, once
 * its run ended with exit 0 (all its steps, or stopped by SIGTERM after a step: S says which),
 * one line of JSON to PATH:
 *   {"step":S,"loss":L,"val_loss":V,"tokens":N}
 * S the steps taken in all (an integer >= 0), L the last training loss and V the final
 * validation loss (finite numbers >= 0, or null: none), N the tokens trained on in this run
 * (an integer >= 0). The operator passes ROLE_TERMINATION_LOG, the Pod's default
 * terminationMessagePath, and reads the line back from the finished Pod's
 * containerStatuses[].state.terminated.message (operator/podstate.h: pod_client_summary):
 * the final figures, which its last read of the gateway's /status may predate. */
#define ROLE_FLAG_SUMMARY_FILE "summary-file"       /* client: where the line goes */
#define ROLE_TERMINATION_LOG "/dev/termination-log" /* the kubelet reads it when it ends */
#define ROLE_SUMMARY_MAX 4096 /* bytes: Kubernetes keeps no more of a termination message */

/* Ports the roles listen on in a Pod. */
#define ROLE_PORT_COORDINATOR 7400 /* gateway: peers and clients register here */
#define ROLE_PORT_HTTP 7480        /* gateway: /status, /metrics */
#define ROLE_PORT_STAGE 7500       /* stage: clients' microbatches */
#define ROLE_PORT_RING 7501        /* stage: gradient averaging with the stage's other peers */

/* The layers [*l0, *l1) of stage `stage` when n_layer layers are cut into n_stages stages as
 * evenly as possible: l0 = stage * n_layer / n_stages (integer division), exactly as
 * `cirrus-trainer local` cuts them. Returns 0, or -1 (CIRRUS_EINVAL) when n_stages < 1,
 * n_stages > n_layer or stage is outside [0, n_stages). */
int role_stage_layers(int n_layer, int n_stages, int stage, int *l0, int *l1);

#endif
