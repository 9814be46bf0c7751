/* desired_args: see desired_args.h. */
#include "desired_args.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "../common/role_args.h"

/* Append "--flag" and value; *bad set when either could not be appended. */
static void arg(json_t *args, int *bad, const char *flag, const char *value)
{
    if (json_array_append_new(args, json_string(flag)) ||
        json_array_append_new(args, json_string(value)))
        *bad = 1;
}

static void argf(json_t *args, int *bad, const char *flag, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void argf(json_t *args, int *bad, const char *flag, const char *fmt, ...)
{
    char buf[1200];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof buf)
        *bad = 1;
    else
        arg(args, bad, flag, buf);
}

/* The args, or NULL (and the array freed) when something could not be appended. */
static json_t *done(json_t *args, int bad)
{
    if (!bad) return args;
    json_decref(args);
    return NULL;
}

/* --model P [--layers N --width N --heads N --context N]: the model's shape (--layers left
 * to the caller unless layers). */
static void shape_args(json_t *args, int *bad, const job_view *v, int layers)
{
    arg(args, bad, ROLE_ARG(ROLE_FLAG_MODEL), v->preset);
    if (layers && v->layers) argf(args, bad, ROLE_ARG(ROLE_FLAG_LAYERS), "%lld", v->layers);
    if (v->width) argf(args, bad, ROLE_ARG(ROLE_FLAG_WIDTH), "%lld", v->width);
    if (v->heads) argf(args, bad, ROLE_ARG(ROLE_FLAG_HEADS), "%lld", v->heads);
    if (v->context) argf(args, bad, ROLE_ARG(ROLE_FLAG_CONTEXT), "%lld", v->context);
}

/* The shape, then --batch B [--seq T] --seed S. */
static void model_args(json_t *args, int *bad, const job_view *v)
{
    shape_args(args, bad, v, 1);
    argf(args, bad, ROLE_ARG(ROLE_FLAG_BATCH), "%lld", v->batch);
    if (v->seq) argf(args, bad, ROLE_ARG(ROLE_FLAG_SEQ), "%lld", v->seq);
    argf(args, bad, ROLE_ARG(ROLE_FLAG_SEED), "%lld", v->seed);
}

/* The gateway's end of the WAN: its region, every region's gateway at its Service (the name
 * desired.c gives it, in the job's namespace) on the WAN port, in the spec's order (the same
 * list for every gateway of the job), the job Secret's files, the codec and the outer
 * optimizer; and the model's shape, whose parameter count the outer steps exchange. */
static void wan_args(json_t *args, int *bad, const job_view *v, const region_view *r)
{
    char list[4096];
    size_t len = 0;
    for (int k = 0; k < v->n_regions && !*bad; k++) {
        char gw[CIRRUS_NAME_MAX + 1];
        if (desired_name_gateway(gw, sizeof gw, v->name, v->region_names[k], NULL)) {
            *bad = 1;
            break;
        }
        /* A region another cluster runs is reached at its endpoint (desired_build makes no
         * gateway before every such endpoint is known). */
        int n = v->region_cluster[k]
                    ? snprintf(list + len, sizeof list - len, "%s%s=%s", k ? "," : "",
                               v->region_names[k],
                               v->region_endpoint[k] ? v->region_endpoint[k] : "")
                    : snprintf(list + len, sizeof list - len, "%s%s=%s.%s.svc:%lld",
                               k ? "," : "", v->region_names[k], gw, v->ns, v->wan_port);
        if (n < 0 || (size_t)n >= sizeof list - len) *bad = 1;
        else len += (size_t)n;
    }
    /* --layers is there already: the layer count, which the coordinator checks peers by. */
    shape_args(args, bad, v, 0);
    argf(args, bad, ROLE_ARG(ROLE_FLAG_SYNC_EVERY), "%lld", v->sync_every);
    arg(args, bad, ROLE_ARG(ROLE_FLAG_REGION), r->name);
    if (!*bad) arg(args, bad, ROLE_ARG(ROLE_FLAG_REGIONS), list);
    argf(args, bad, ROLE_ARG(ROLE_FLAG_WAN_LISTEN), "0.0.0.0:%lld", v->wan_port);
    arg(args, bad, ROLE_ARG(ROLE_FLAG_TLS_DIR), CIRRUS_TLS_DIR);
    arg(args, bad, ROLE_ARG(ROLE_FLAG_CODEC), v->codec);
    argf(args, bad, ROLE_ARG(ROLE_FLAG_FRAGMENTS), "%lld", v->fragments);
    /* %.9g: every float the trainer's flags hold, and 0.7 stays "0.7". */
    argf(args, bad, ROLE_ARG(ROLE_FLAG_OUTER_LR), "%.9g", v->outer_lr);
    argf(args, bad, ROLE_ARG(ROLE_FLAG_OUTER_MOMENTUM), "%.9g", v->outer_momentum);
}

json_t *desired_args_gateway(const job_view *v, const region_view *r)
{
    json_t *args = json_array();
    int bad = !args;
    if (bad) return NULL;
    arg(args, &bad, ROLE_ARG(ROLE_FLAG_JOB), v->job_id);
    argf(args, &bad, ROLE_ARG(ROLE_FLAG_LISTEN), "0.0.0.0:%d", ROLE_PORT_COORDINATOR);
    argf(args, &bad, ROLE_ARG(ROLE_FLAG_HTTP_PORT), "%d", ROLE_PORT_HTTP);
    argf(args, &bad, ROLE_ARG(ROLE_FLAG_STAGES), "%d", v->stages);
    argf(args, &bad, ROLE_ARG(ROLE_FLAG_LAYERS), "%d", v->n_layer);
    /* peers.max: rebalancing moves idle peers to a bottleneck stage, but leaves no stage
     * with more than this (the operator itself makes peers.replicas per stage). */
    argf(args, &bad, ROLE_ARG(ROLE_FLAG_MAX_STAGE_PEERS), "%d", r->max);
    /* The coordinator serves a connection per member (a thread each) and closes more on
     * accept: room for the region's most peers and its clients, and for reconnects. */
    argf(args, &bad, ROLE_ARG(ROLE_FLAG_MAX_CONNECTIONS), "%d",
         v->stages * r->max + r->clients + 64);
    /* One region trains with no outer steps: its gateway is the region's coordinator only. */
    if (desired_outer(v)) wan_args(args, &bad, v, r);
    return done(args, bad);
}

json_t *desired_args_peer(const job_view *v, const char *coord, int s, int l0, int l1)
{
    json_t *args = json_array();
    int bad = !args;
    if (bad) return NULL;
    arg(args, &bad, ROLE_ARG(ROLE_FLAG_JOB), v->job_id);
    argf(args, &bad, ROLE_ARG(ROLE_FLAG_SERVE), "%d:%d", l0, l1);
    argf(args, &bad, ROLE_ARG(ROLE_FLAG_STAGE_INDEX), "%d", s);
    /* Named after its Pod, which a replacement keeps: the gateway recognises a replaced
     * peer that rebalancing had moved and sends it to that stage again. */
    arg(args, &bad, ROLE_ARG(ROLE_FLAG_NAME), "$(POD_NAME)");
    argf(args, &bad, ROLE_ARG(ROLE_FLAG_LISTEN), "0.0.0.0:%d", ROLE_PORT_STAGE);
    arg(args, &bad, ROLE_ARG(ROLE_FLAG_ADVERTISE), "$(POD_IP)");
    argf(args, &bad, ROLE_ARG(ROLE_FLAG_RING_ADDR), "$(POD_IP):%d", ROLE_PORT_RING);
    arg(args, &bad, ROLE_ARG(ROLE_FLAG_COORDINATOR), coord);
    model_args(args, &bad, v);
    return done(args, bad);
}

json_t *desired_args_client(const job_view *v, const region_view *r, const char *coord, int i)
{
    json_t *args = json_array();
    int bad = !args;
    if (bad) return NULL;
    arg(args, &bad, ROLE_ARG(ROLE_FLAG_JOB), v->job_id);
    arg(args, &bad, ROLE_ARG(ROLE_FLAG_COORDINATOR), coord);
    argf(args, &bad, ROLE_ARG(ROLE_FLAG_STEPS), "%lld", v->steps);
    /* How it ended, for the status: the gateway's figures stop short of the last steps. */
    arg(args, &bad, ROLE_ARG(ROLE_FLAG_SUMMARY_FILE), ROLE_TERMINATION_LOG);
    if (r->clients > 1) { /* they share each step's batch; client 0 steps */
        argf(args, &bad, ROLE_ARG(ROLE_FLAG_CLIENTS), "%d", r->clients);
        argf(args, &bad, ROLE_ARG(ROLE_FLAG_CLIENT_INDEX), "%d", i);
    }
    /* Client 0 takes the outer steps through its gateway (--coordinator); the others read
     * the region's data shard from it. */
    if (desired_outer(v)) argf(args, &bad, ROLE_ARG(ROLE_FLAG_SYNC_EVERY), "%lld", v->sync_every);
    /* Client 0 takes the optimizer steps and gathers the model from the stage peers: it
     * writes the region's checkpoints (the trainer refuses --ckpt on the others). A folder
     * per region: regions sharing a checkpoint.volume do not overwrite each other's. */
    if (i == 0) {
        argf(args, &bad, ROLE_ARG(ROLE_FLAG_CKPT), "%s/%s", CIRRUS_CKPT_DIR, r->name);
        argf(args, &bad, ROLE_ARG(ROLE_FLAG_CKPT_EVERY), "%lld", v->ckpt_every);
    }
    model_args(args, &bad, v);
    if (v->data_path && v->data_claim) {
        const char *rel = v->data_path;
        while (*rel == '/') rel++;
        argf(args, &bad, ROLE_ARG(ROLE_FLAG_DATA), "%s/%s", CIRRUS_DATA_DIR, rel);
    } else if (v->data_path) {
        arg(args, &bad, ROLE_ARG(ROLE_FLAG_DATA), v->data_path);
    }
    return done(args, bad);
}
