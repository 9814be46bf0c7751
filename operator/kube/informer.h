/* kube_informer: a local cache of one kind of object kept current by list + watch.
 *
 * LIST (pages of 500 with continue) fills the cache, then a watch from the list's
 * resourceVersion keeps it current. Handlers see every change in order: add, update (old,
 * new), delete. When the watch ends it resumes from the last resourceVersion (BOOKMARKs
 * advance it); 410 Gone means the server no longer has that history, so the informer
 * re-lists and diffs the new list against the cache: objects created, changed or deleted
 * while it was disconnected are delivered as add/update/delete. Nothing is missed, though
 * intermediate states may be. Failures back off 800 ms doubling to 30 s with jitter,
 * reset after 2 healthy minutes (client-go's reflector).
 *
 * Everything runs from kube_client_poll(); handlers may issue requests on the same client
 * but must not free the informer that called them. A LIST runs synchronously inside the
 * poll (other watches buffer meanwhile). resourceVersions are compared for equality only.
 */
#ifndef CIRRUS_KUBE_INFORMER_H
#define CIRRUS_KUBE_INFORMER_H

#include <stdint.h>

#include <jansson.h>

#include "../../common/cerr.h"
#include "client.h"

typedef struct kube_informer kube_informer;

#define KUBE_LIST_PAGE 500

typedef struct kube_informer_config {
    const char *path;   /* the collection: "/api/v1/namespaces/NS/configmaps", "/apis/G/V/R" */
    const char *query;  /* extra escaped parameters ("labelSelector=a%3Db") or NULL */
    int page_limit;     /* objects per LIST page; 0: KUBE_LIST_PAGE */
    /* Called on every object from the server (listed or watched) before it is cached or
     * handed to a handler, to drop what no handler reads (client-go's TransformFunc): the
     * cache is the operator's memory. It must keep metadata's name, namespace and
     * resourceVersion. NULL: objects are cached whole. */
    void (*transform)(json_t *obj);
    /* Cache each object as its compact JSON text, parsed again when asked for
     * (kube_informer_get): about a tenth of the memory of jansson objects, for one parse of
     * a few hundred microseconds' worth per get. For the caches that hold thousands (pods). */
    int compact;
    /* Objects are borrowed for the call (json_incref to keep them). Any may be NULL. */
    void (*on_add)(void *ctx, const json_t *obj);
    void (*on_update)(void *ctx, const json_t *old_obj, const json_t *new_obj);
    void (*on_delete)(void *ctx, const json_t *obj); /* the last state known */
    void *ctx;
} kube_informer_config;

typedef struct kube_informer_stats {
    uint64_t lists;   /* complete LISTs (the first one included) */
    uint64_t watches; /* watches started */
    uint64_t gone;    /* 410s seen (each leads to a re-list) */
    uint64_t errors;  /* failed lists or watches (each backs off) */
} kube_informer_stats;

/* Copies cfg (strings included). The first LIST runs from the next kube_client_poll. */
int kube_informer_new(kube_client *c, const kube_informer_config *cfg, kube_informer **out,
                      cirrus_error *err);
void kube_informer_free(kube_informer *inf);

/* True once the first LIST has been delivered: the cache is a complete view. */
int kube_informer_has_synced(const kube_informer *inf);
/* The cached object for "namespace/name" (or "name"), borrowed; NULL if absent. It stays
 * valid until the informer delivers the next event for it (kube_client_poll) or, in a
 * compact informer, until kube_informer_release (json_incref to keep it longer). */
const json_t *kube_informer_get(const kube_informer *inf, const char *key);
/* A compact informer's objects parsed by kube_informer_get are dropped (the caller is done
 * with what it got: after each reconcile, each scan of the cache). No-op otherwise. */
void kube_informer_release(const kube_informer *inf);
/* The whole cache: a JSON object whose keys are the cached objects' keys. Its values are the
 * objects, or in a compact informer their JSON text: there, use kube_informer_get for each
 * key. Read-only, borrowed. */
const json_t *kube_informer_objects(const kube_informer *inf);
/* The resourceVersion a re-watch would resume from. */
const char *kube_informer_resource_version(const kube_informer *inf);
void kube_informer_get_stats(const kube_informer *inf, kube_informer_stats *st);

/* Drop the watch as a broken connection would and reconnect after the usual backoff,
 * resuming from resume_rv (NULL: the last seen). Tests use an expired resume_rv to force
 * the 410 -> re-list path; operators can use it after a long pause. */
void kube_informer_disconnect(kube_informer *inf, const char *resume_rv);

#endif
