/* controller: the SwarmJob reconcile loop.
 *
 * Informers keep caches of the SwarmJobs and of the Pods, Services and Secrets the operator
 * owns (selected by the app.kubernetes.io/managed-by label); any change to one of them
 * queues its job's key on a rate-limited work queue. Reconciling a job makes the cluster
 * match desired.h's manifests, region by region:
 *   - the job Secret with a per-job CA and every region's gateway certificate (made once;
 *     certificates are never regenerated under running gateways),
 *   - each region's gateway Service,
 *   - every pod, created by server-side apply under its fixed name. A pod that ended is
 *     classified (podstate.h), counted as a preemption or a failure, deleted and re-created
 *     under the same name, alone: the other pods are untouched (in-place replacement).
 * then writes the status subresource (jobstatus.h) and an Event for each transition.
 *
 * Training progress: for each job that runs (not suspended, not finished) the controller
 * registers its regions' ready gateways with the progress reader (progress.h), which reads
 * their /status on its own thread; a job with news (an answer, a gateway starting to fail)
 * is queued again, and its reconcile writes the figures (step, loss, tokensPerSecond,
 * progressTime) and the ProgressCurrent condition with the rest of the status. As that
 * condition also changes with time alone (an answer growing stale), the reconcile queues the
 * job again for the second it would (jobstatus_progress_due).
 *
 * Counters of preemptions and failures live in the status; the controller keeps them in
 * memory while it runs (the cache may lag its own writes) and starts from the status after
 * a restart. A pod that vanished while the operator was down is re-created but not counted.
 *
 * Single-threaded: everything runs from the kube_client's event loop (the progress reader's
 * thread only publishes results under its own lock).
 */
#ifndef CIRRUS_CONTROLLER_H
#define CIRRUS_CONTROLLER_H

#include <stdint.h>

#include "../common/cerr.h"
#include "kube/client.h"
#include "metrics.h"
#include "progress.h"

#define CONTROLLER_FIELD_MANAGER "cirrus-operator"
#define CONTROLLER_CERT_DAYS 3650

typedef struct controller_options {
    const char *watch_namespace; /* NULL or "": every namespace */
    const char *identity;        /* this replica's name, for Events */
    op_metrics *metrics;         /* may be NULL */
    /* Whether this replica may act now (the Lease); NULL: always. Checked before each key
     * and each write. */
    int (*leading)(void *ctx);
    void *leading_ctx;
    progress *progress;          /* reads the gateways' /status; NULL: no training figures */
    /* This cluster's name as the copies of its jobs in member clusters name it
     * (spec.home.cluster, their regions' cluster): --cluster-name, "home" by default. */
    const char *cluster_name;
} controller_options;

typedef struct controller controller;

int controller_new(kube_client *c, const controller_options *o, controller **out,
                   cirrus_error *err);
void controller_free(controller *ctl);

/* Every cache has been listed once: reconciling now sees the whole cluster. */
int controller_synced(const controller *ctl);
/* Reconcile the keys that are ready (at most max_keys, and no more once PROCESS_BUDGET_MS has
 * passed, so that the caller polls: the Lease is renewed from there). Returns how many ran. */
int controller_process(controller *ctl, int max_keys);
/* Milliseconds until a delayed key is due: 0 now, -1 none. */
int64_t controller_next_ms(controller *ctl);
/* Nothing left to account for now: no key is due, no job pod is terminating (its end is
 * counted once it is gone), and, when node `own_node` (the caller's; NULL: unknown) is
 * cordoned, no job pod is left on it (a drain evicts them with the caller, not before it).
 * A replica shutting down waits for this (main.c). */
int controller_settled(controller *ctl, const char *own_node);

typedef struct controller_stats {
    uint64_t reconciles, errors;
    uint64_t pods_created, pods_deleted, preemptions, failures, status_writes, events;
} controller_stats;
void controller_get_stats(const controller *ctl, controller_stats *st);

/* Queue every job, for a replica that has just become leader; with forget, first forget
 * what was remembered between reconciles (counters re-read from the statuses), which may
 * predate another leader's work. A leader that won its own lease back with nobody leading
 * in between keeps its memory (forget 0): it holds preemptions counted but not yet
 * written, and its cache's statuses may lag its own last writes. */
void controller_resync(controller *ctl, int forget);

/* This replica stopped leading: stop reading the gateways (the leader reads them). */
void controller_standby(controller *ctl);

/* Drop every watch and resume from resume_rv (NULL: the last seen). With an expired
 * resourceVersion this forces the 410 -> re-list path; the operator does it on SIGUSR1. */
void controller_rewatch(controller *ctl, const char *resume_rv);

#endif
