/* desired_args: the `cirrus-trainer ROLE ...` command lines of a SwarmJob's Pods, a part of
 * desired.c (internal to it and desired_spec.c, pure like them).
 *
 * Defines what the Pods need of the spec (job_view, region_view: desired_spec.c reads them,
 * with the CRD's defaults applied) and builds each role's args from them: the gateway (with
 * several regions also its end of the WAN: outer steps, the other regions' gateways, the
 * job's certificates), a stage peer and a client. Flag names come from common/role_args.h,
 * the ones the trainer's flag tables parse.
 */
#ifndef CIRRUS_OPERATOR_DESIRED_ARGS_H
#define CIRRUS_OPERATOR_DESIRED_ARGS_H

#include <jansson.h>

#include "desired.h"


/* What the Pods need of the spec, defaults applied. Pointers borrow from the job. */
typedef struct job_view {
    const char *name, *ns, *uid;
    const char *image, *pull_policy;
    const json_t *pull_secrets; /* array or NULL */
    long long steps;
    const char *preset;
    long long layers, width, heads, context; /* 0: not overridden */
    int n_layer, n_context, stages, suspend;
    int peers_per_stage; /* spec.peersPerStage (the scale subresource); 0: unset */
    int gang;            /* spec.gangScheduling: a gang PodGroup per region */
    /* The job's kueue.x-k8s.io/queue-name label (NULL: none): passed to the pods, each
     * region's pods made one Kueue pod group. */
    const char *queue_name;
    long long batch, seq, seed; /* seq 0: unset */
    const char *data_path, *data_claim;
    const char *ckpt_claim, *ckpt_subpath;
    long long ckpt_every; /* spec.checkpoint.every */
    const char *service_type;
    long long gw_port;
    const json_t *svc_annotations;
    /* The gateways' outer steps (spec.gateway), used with more than one region only. */
    long long sync_every, wan_port, fragments;
    const char *codec; /* a spec wan_codec_parse takes */
    double outer_lr, outer_momentum;
    /* Every region's name, in the spec's order (desired_build fills it before building). */
    int n_regions;
    const char *region_names[DESIRED_MAX_REGIONS];
    /* Regions in several clusters (desired.h). job_id: the job's identity on the WAN (every
     * pod's --job, the certificates' URI): spec.home.uid in a copy, else metadata.uid.
     * home_cluster: spec.home.cluster, NULL unless this is a copy. Per region, in the spec's
     * order (desired_build fills them): the cluster that runs it (NULL: this one) and where
     * the other clusters reach its gateway (NULL: not known yet; used for remote regions). */
    const char *job_id, *home_cluster;
    const json_t *clusters; /* spec.clusters (array or NULL): the member clusters */
    const char *region_cluster[DESIRED_MAX_REGIONS], *region_endpoint[DESIRED_MAX_REGIONS];
} job_view;

typedef struct region_view {
    const char *name;
    int replicas; /* peers per stage: spec.peersPerStage, else peers.replicas */
    int min;      /* peers.min: the fewest per stage the region trains with */
    int max;      /* peers.max (peers.replicas when unset), the gateway's rebalancing cap */
    int clients;
    const char *cluster;  /* regions[].cluster: the cluster that runs it; NULL: this one */
    const char *endpoint; /* regions[].endpoint ("host:port"); NULL: unset */
    const char *region_label, *priority_class;
    const json_t *node_selector, *affinity, *tolerations;
    const json_t *res_peer, *res_client, *res_gateway;
} region_view;

/* desired_spec.c: job into *v (metadata, model, pipeline, data, checkpoint, gateway; *regions
 * the spec's array, v->n_regions its size) and spec.regions[k] into *r. 0, or CIRRUS_EINVAL
 * with a message naming the field. */
int desired_read_job(const json_t *job, job_view *v, const json_t **regions, cirrus_error *err);
int desired_read_region(const job_view *v, const json_t *regions, size_t k, region_view *r,
                        cirrus_error *err);
/* A DNS-1035 label ([a-z]([-a-z0-9]*[a-z0-9])?) / a DNS-1123 label ([a-z0-9]...), at most 63
 * characters. */
int desired_is_dns1035(const char *s);
int desired_is_dns1123(const char *s);

/* Whether the job's gateways run outer steps: with more than one region. */
static inline int desired_outer(const job_view *v) { return v->n_regions > 1; }

/* A new args array for region r's gateway / a peer serving layers [l0, l1) of stage s /
 * client i, registering with the gateway at coord ("HOST:PORT"); NULL when out of memory. */
json_t *desired_args_gateway(const job_view *v, const region_view *r);
json_t *desired_args_peer(const job_view *v, const char *coord, int s, int l0, int l1);
json_t *desired_args_client(const job_view *v, const region_view *r, const char *coord, int i);

#endif
