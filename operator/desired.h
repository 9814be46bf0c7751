/* desired: the desired state of a SwarmJob, the pure half of the operator's reconcile.
 *
 * From a SwarmJob object (JSON as the API server returns it, CRD defaults applied; missing
 * defaults are applied here too) desired_build() makes the manifests of every child object:
 * per region a gateway Pod and its Service, peers.replicas stage-peer Pods per pipeline
 * stage and `clients` client Pods; one Secret skeleton for the job's PKI. No network: the
 * controller diffs these against the cluster and creates, replaces or deletes.
 *
 * Every object carries apiVersion, kind, metadata.name/namespace, the labels below and an
 * ownerReference to the SwarmJob (controller, blockOwnerDeletion). Pods are restartPolicy
 * Never: the controller replaces a Pod itself (same name) when it ended, or when its
 * CIRRUS_ANNOT_SPEC_HASH differs from the desired one (Pod specs are immutable).
 *
 * With more than one region the gateways take outer steps across regions (spec.gateway:
 * syncEvery, codec, outerLearningRate, outerMomentum) over their WAN endpoints (wanPort, the
 * Service's and the container's port "wan"), authenticated by the job Secret's certificates;
 * every region then runs clients, which get --sync-every too (client 0 takes the region's
 * outer steps, the others read their data shard from the gateway). A job of one region
 * trains with no outer steps: none of those flags or ports.
 *
 * Suspended jobs (spec.suspend) have no desired Pods: `pods` is empty, Services and the
 * Secret stay.
 */
#ifndef CIRRUS_OPERATOR_DESIRED_H
#define CIRRUS_OPERATOR_DESIRED_H

#include <stddef.h>

#include <jansson.h>

#include "../common/cerr.h"

#define CIRRUS_API_VERSION "cirrus.dev/v1alpha1"
#define CIRRUS_KIND "SwarmJob"

#define CIRRUS_LABEL_JOB "cirrus.dev/job"       /* metadata.name of the SwarmJob */
#define CIRRUS_LABEL_REGION "cirrus.dev/region" /* regions[].name (not on the Secret) */
#define CIRRUS_LABEL_ROLE "cirrus.dev/role"     /* gateway | peer | client (Pods, Service) */
#define CIRRUS_LABEL_STAGE "cirrus.dev/stage"   /* peers: their stage, "0".. */
#define CIRRUS_LABEL_INDEX "cirrus.dev/index"   /* peers: i within the stage; clients: i */
#define CIRRUS_LABEL_APP_NAME "app.kubernetes.io/name"             /* "cirrus" */
#define CIRRUS_LABEL_MANAGED_BY "app.kubernetes.io/managed-by"     /* "cirrus-operator" */
/* Hash of the Pod's spec as built (16 hex digits, FNV-1a 64 of the spec's JSON with sorted
 * keys): the controller replaces a Pod whose hash differs from the desired Pod's. */
#define CIRRUS_ANNOT_SPEC_HASH "cirrus.dev/spec-hash"

/* Kueue (kueue.sigs.k8s.io): a SwarmJob labelled with a LocalQueue's name has its pods
 * labelled so too, and each region's pods form one Kueue pod group (its name, and how many
 * pods it has), which Kueue's pod integration admits as a whole. */
#define DESIRED_KUEUE_QUEUE "kueue.x-k8s.io/queue-name"
#define DESIRED_KUEUE_GROUP "kueue.x-k8s.io/pod-group-name"
#define DESIRED_KUEUE_GROUP_COUNT "kueue.x-k8s.io/pod-group-total-count"

/* spec.gangScheduling: each region's pods name a PodGroup of Kubernetes's gang scheduling
 * (KEP-4671; scheduling.k8s.io/v1alpha2 in 1.36, behind the GenericWorkload and
 * GangScheduling feature gates) in spec.schedulingGroup, whose minCount is what the region
 * trains with: its gateway, peers.min peers per stage and its clients. The scheduler binds
 * none of them until that many can be bound together; peers past peers.min are scheduled
 * one by one after (the gang is the minimum, not the maximum). */
#define DESIRED_POD_GROUP_API "scheduling.k8s.io/v1alpha2"
#define DESIRED_POD_GROUP_RESOURCE "podgroups"

/* Every Pod's one container (the trainer). */
#define CIRRUS_CONTAINER "trainer"

#define CIRRUS_ROLE_GATEWAY "gateway"
#define CIRRUS_ROLE_PEER "peer"
#define CIRRUS_ROLE_CLIENT "client"

/* Where the Pods see their volumes. */
#define CIRRUS_TLS_DIR "/etc/cirrus/tls"   /* gateway: ca.crt, tls.crt, tls.key */
#define CIRRUS_DATA_DIR "/data"            /* clients: data.claimName, read-only */
#define CIRRUS_CKPT_DIR "/checkpoints"     /* clients: checkpoint.volume (else an emptyDir) */

/* Every Pod meets the `restricted` Pod Security Standard, so namespaces enforcing it admit
 * them: it runs as this user and group (the image's, Dockerfile: useradd --uid 65532), with
 * fsGroup the same so a checkpoint volume is writable, RuntimeDefault seccomp, no privilege
 * escalation, no capabilities; and without the namespace's ServiceAccount token (the trainer
 * never calls the API server). */
#define DESIRED_RUN_AS 65532

/* Caps on what a SwarmJob may ask for, refused by desired_build: the CRD's maxItems for
 * spec.regions, and Pods per job (gateways, peers and clients of every region together),
 * which the CRD cannot bound (each count has its own maximum, their product does not). */
#define DESIRED_MAX_REGIONS 16
#define DESIRED_MAX_PODS 4096

/* spec.gateway.wanPort's default: where a region's gateway listens for the other regions'
 * gateways (its container port and Service port "wan"), with more than one region. */
#define DESIRED_DEFAULT_WAN_PORT 7443
/* spec.steps's default (the CRD's): the optimizer steps each region's client 0 takes. */
#define DESIRED_DEFAULT_STEPS 1000
/* The largest spec.gateway.outerMomentum (the CRD's maximum; the trainer's --outer-momentum
 * takes at most 0.999). */
#define DESIRED_MAX_OUTER_MOMENTUM 0.999
/* The most spec.gateway.fragments (the CRD's maximum; the trainer's OUTER_MAX_FRAGMENTS). */
#define DESIRED_MAX_FRAGMENTS 8

/* Longest object name built here (a DNS label). */
#define CIRRUS_NAME_MAX 63

typedef struct desired_job {
    json_t *pods;     /* object: pod name -> Pod manifest */
    json_t *services; /* object: service name -> Service manifest */
    json_t *pod_groups; /* object: name -> PodGroup manifest (spec.gangScheduling; a
                         * region's is "<job>-<region>"); empty without, or while
                         * suspended */
    json_t *secret;   /* the job Secret's manifest WITHOUT data (name, labels, owner, type
                       * Opaque); the controller fills data: "ca.crt" and, per region R,
                       * "R.crt" and "R.key" (the gateway Pods mount these: a gateway Pod
                       * does not start until its keys exist) */
    /* Why the gateway Pods are left out ("": they are not): a region another cluster runs
     * has no known endpoint yet (or, set by the controller, the Secret cannot serve them
     * yet: controller_pki.c); waiting_reason: the Created condition's reason for it (NULL:
     * WaitingForEndpoints). */
    char waiting[160];
    const char *waiting_reason;
} desired_job;

/* Build the desired children of job. 0, or CIRRUS_EINVAL with a message naming the field
 * for anything malformed or missing (metadata.uid/name/namespace, spec.image,
 * spec.regions...) or a child name that is not a DNS label of at most 63 characters;
 * CIRRUS_ENOMEM. On failure *out is left empty (all NULL). */
int desired_build(const json_t *job, desired_job *out, cirrus_error *err);
void desired_job_free(desired_job *d);

/* The DNS names the region's gateway certificate must carry: NAME, NAME.NS, NAME.NS.svc,
 * NAME.NS.svc.cluster.local for its Service NAME. A new array of strings; NULL when the
 * job's metadata.name/namespace or the region name are missing or make an invalid name. */
json_t *desired_gateway_dns_names(const json_t *job, const char *region);

/* Regions in several clusters (docs/ARCHITECTURE.md). A region with spec.regions[].cluster
 * runs in another cluster: nothing is built for it here, and this cluster's gateways reach
 * it at its endpoint (regions[].endpoint, else the job status's regions[].endpoint, which
 * the controller fills in). In a home job (spec.clusters) the controller writes a copy of
 * the job into each member cluster; the copy carries spec.home (the home cluster's name and
 * the home job's uid, which is the job's identity on the WAN: every pod's --job). */
#define DESIRED_FINALIZER_MEMBERS "cirrus.dev/member-copies"
/* Set "true" on a home job being deleted whose member cluster is gone for good: the
 * finalizer is removed without deleting the copies there. */
#define DESIRED_ANNOT_ABANDON_COPIES "cirrus.dev/abandon-member-copies"
/* A region endpoint, "HOST:PORT": a DNS name or IPv4 address, or an IPv6 one in brackets;
 * port 1..65535. */
int desired_endpoint_valid(const char *s);

/* spec.managedBy's value for jobs this operator reconciles (also what an unset field means).
 * Another value names another controller (e.g. Kueue's MultiKueue, which copies the job to a
 * worker cluster and mirrors its status back): the operator then makes nothing for the job
 * and writes none of its status. The CRD makes the field immutable. */
#define CIRRUS_CONTROLLER_NAME "cirrus.dev/swarmjob-controller"

/* Whether this operator reconciles job (its spec.managedBy is unset or CIRRUS_CONTROLLER_NAME). */
int desired_managed_here(const json_t *job);

/* Peers per stage the job asks of a region (an element of spec.regions): spec.peersPerStage
 * when set (the scale subresource, which `kubectl scale` and a HorizontalPodAutoscaler
 * write), else the region's peers.replicas; 2 (the CRD's default) when neither is an
 * integer in [1, 256]. desired_build checks both against the region's peers.min..max. */
int desired_peers_per_stage(const json_t *spec, const json_t *region);

/* Child names into buf (at least CIRRUS_NAME_MAX + 1 bytes): "<job>-<region>-gw" (the
 * gateway Pod and its Service), "<job>-<region>-s<stage>-<i>" (stage peers),
 * "<job>-<region>-c<i>" (clients), "<job>-pki" (the Secret). 0, or CIRRUS_EINVAL (with a
 * message) when the result is not a DNS-1035 label of at most 63 characters. */
int desired_name_gateway(char *buf, size_t size, const char *job, const char *region,
                         cirrus_error *err);
/* "<job>-<region>-wan": with several regions and gateway.serviceType NodePort or
 * LoadBalancer, the Service of that type that exposes the gateway's WAN port alone. */
int desired_name_wan_service(char *buf, size_t size, const char *job, const char *region,
                             cirrus_error *err);
int desired_name_peer(char *buf, size_t size, const char *job, const char *region, int stage,
                      int index, cirrus_error *err);
int desired_name_client(char *buf, size_t size, const char *job, const char *region, int index,
                        cirrus_error *err);
int desired_name_secret(char *buf, size_t size, const char *job, cirrus_error *err);
/* A region's group: its gang PodGroup and its Kueue pod group, "<job>-<region>". */
int desired_name_group(char *buf, size_t size, const char *job, const char *region,
                       cirrus_error *err);
/* The gang's minCount of a region of `stages` stages, peers.min `min` and `clients`
 * clients: its gateway, min peers of every stage and its clients. */
static inline int desired_gang_min(int stages, int min, int clients)
{
    return 1 + stages * min + clients;
}

#endif
