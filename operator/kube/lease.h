/* kube_lease: leader election with a coordination.k8s.io/v1 Lease, as client-go's
 * leaderelection package does it.
 *
 * Candidates GET the Lease every retry_period (jittered: period + up to 1.2 x period, client-go
 * JitterFactor 1.2). A missing Lease is created (leaseTransitions 0). A Lease held by another
 * identity is taken over, with a PUT carrying its resourceVersion and leaseTransitions + 1,
 * once its record (holderIdentity, renewTime, ..., resourceVersion) has not changed for the
 * lease duration measured on the LOCAL clock from when this process first saw that record:
 * clocks of different machines are never compared. The lease duration is the longer of ours
 * and the record's leaseDurationSeconds, so a holder configured with a longer lease is never
 * cut short. A Lease with no holder (released) is taken at once; 409 means someone else won.
 *
 * The leader renews every retry_period (PUT renewTime, with the resourceVersion it last wrote;
 * on 409 it re-reads the Lease). If the Lease now names someone else it has lost at once; if
 * no renewal succeeded for renew_deadline it gives up too (renew_deadline < lease_duration:
 * it stops before anyone else may take over). Either way on_stopped_leading runs and the
 * elector becomes a candidate again (on_started_leading may run again later); client-go
 * exits the process at that point, and callers may too.
 *
 * Two ways to run it. kube_lease_new puts the elector on the caller's client: its ticker runs
 * inside that client's kube_client_poll and the callbacks from there. Requests are
 * synchronous, so any request of the caller's that hangs holds the renewals up with it (for
 * up to the request timeout, 30 s, against a 10 s renew deadline). kube_lease_start runs the
 * elector as client-go does, beside the work it guards: its own configuration, client and
 * thread, whose requests time out after half the renew deadline (one held or refused answer
 * leaves time for another try); the caller's loop, however long a request of its own takes,
 * no longer costs the lease. The callbacks then run on the caller's thread, from
 * kube_lease_dispatch, which the caller's loop calls each turn. Callbacks may issue requests
 * on the caller's client but must not free the elector that called them. One line is logged
 * on acquiring and on losing.
 */
#ifndef CIRRUS_KUBE_LEASE_H
#define CIRRUS_KUBE_LEASE_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "../../common/cerr.h"
#include "client.h"

typedef struct kube_lease kube_lease;

#define KUBE_LEASE_DURATION_MS 15000
#define KUBE_LEASE_RENEW_DEADLINE_MS 10000
#define KUBE_LEASE_RETRY_PERIOD_MS 2000
#define KUBE_LEASE_JITTER 1.2

typedef struct kube_lease_config {
    const char *ns, *name; /* the Lease object */
    const char *identity;  /* holderIdentity, e.g. the pod name */
    /* 0: 15000, 10000, 2000. Need lease_duration > renew_deadline > 1.2 x retry_period. */
    int lease_duration_ms, renew_deadline_ms, retry_period_ms;
    void (*on_started_leading)(void *ctx);
    /* Lost the lease or could not renew within renew_deadline: the caller must stop
     * reconciling (client-go exits the process). Not called by kube_lease_release. */
    void (*on_stopped_leading)(void *ctx);
    void *ctx;
} kube_lease_config;

typedef struct kube_lease_stats {
    uint64_t attempts;    /* GETs / creates / PUTs sent */
    uint64_t acquired;    /* times this elector became leader */
    uint64_t renewals;    /* successful renewals */
    uint64_t lost;        /* times on_stopped_leading ran */
} kube_lease_stats;

/* Copies cfg (strings included); c is borrowed and must outlive the elector. The first
 * attempt runs from the next kube_client_poll, via a ticker. CIRRUS_EINVAL for a bad name
 * or durations that do not fit. */
int kube_lease_new(kube_client *c, const kube_lease_config *cfg, kube_lease **out,
                   cirrus_error *err);
/* The elector in a thread of its own, with its own configuration (kubeconfig as for
 * kube_config_load: NULL for the default search) and client; the first attempt starts at
 * once. Nothing but the elector itself is shared between the threads. */
int kube_lease_start(const char *kubeconfig, const kube_lease_config *cfg, kube_lease **out,
                     cirrus_error *err);
/* kube_lease_start's mode: run the callbacks for what changed since the last call, on the
 * calling thread (on_stopped_leading first when a term ended and another began meanwhile).
 * A no-op for kube_lease_new's elector. */
void kube_lease_dispatch(kube_lease *l);
/* True while leader: false also once renew_deadline has passed since the last successful
 * renewal, even before the ticker has run to notice it; for kube_lease_start's elector, only
 * within the term kube_lease_dispatch has told the caller of. */
int kube_lease_is_leader(const kube_lease *l);
/* The holderIdentity last seen on the Lease ("" if none or not seen yet), copied into buf;
 * returns buf. */
const char *kube_lease_holder(const kube_lease *l, char *buf, size_t n);
/* Whether the last acquisition took over a record that still named this identity: nobody
 * else led since this elector last did (e.g. it missed its renew deadline, and won its own
 * lease back). 0 after creating the Lease or a takeover. For kube_lease_start's elector, as
 * of the last term kube_lease_dispatch told of: 1 only if every acquisition since the term
 * before it was such a resumption. */
int kube_lease_resumed(const kube_lease *l);
void kube_lease_get_stats(const kube_lease *l, kube_lease_stats *st);
/* Give the lease up now (on SIGTERM; kube_lease_start's thread is stopped first): if leader, update the Lease with holderIdentity
 * cleared and leaseDurationSeconds 1 so a successor takes over at once (client-go
 * ReleaseOnCancel). The elector then stays idle (it never tries again); free it after.
 * 0 also when not leader; a failed update returns its error (the lease then expires). */
int kube_lease_release(kube_lease *l, cirrus_error *err);
/* The record logic, exposed for tests and fuzzing (no I/O). The Lease an elector writes
 * over base, the Lease as the server returned it (NULL: a new Lease named ns/name):
 * base's metadata kept, spec holding identity for lease_ms (rounded up to seconds), with
 * acquireTime and leaseTransitions kept on a renewal (base held by identity) and set anew
 * (transitions + 1) on a takeover; release: holder "" for 1 second, transitions kept.
 * leaseTransitions is read as an int32 (missing or negative: 0; never incremented past
 * INT32_MAX). A new reference, or NULL when out of memory. */
json_t *kube_lease_record(const json_t *base, const char *ns, const char *name,
                          const char *identity, int lease_ms, int release);
/* How long a record seen on the server stays valid: the longer of its
 * leaseDurationSeconds (when in (0, 1 year)) and lease_ms. */
int64_t kube_lease_record_valid_ms(const json_t *lease, int lease_ms);

/* Frees without releasing (the Lease then expires after lease_duration). */
void kube_lease_free(kube_lease *l);

#endif
