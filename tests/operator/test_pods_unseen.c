/* ctl_pods_unseen: which jobs the controller must look at again without a watch event (a pod
 * it made and never saw cached can come and go while the pod watch is down). */
#include <stdio.h>
#include <string.h>

#include <jansson.h>

#include "../../operator/controller_internal.h"
#include "../unit/test.h"

TEST(pods_unseen_only_made_and_never_cached)
{
    job_mem m = {.seen = json_object()};
    json_t *desired = json_pack("{s:{}, s:{}, s:{}}", "j-r1-gw", "j-r1-s0-0", "j-r1-c0");
    json_t *have = json_pack("{s:{}}", "j-r1-gw");
    ASSERT(desired && have && m.seen);
    ASSERT(!ctl_pods_unseen(&m, have, desired)); /* nothing made here */

    ctl_mark_seen(&m, "j-r1-s0-0", "uid-1", 0, 0); /* made, not cached yet */
    ASSERT(ctl_pods_unseen(&m, have, desired));
    ctl_mark_seen(&m, "j-r1-s0-0", "", 0, 0); /* a create whose answer was lost */
    ASSERT(ctl_pods_unseen(&m, have, desired));

    json_object_set_new(have, "j-r1-s0-0", json_object()); /* the cache shows it */
    ASSERT(!ctl_pods_unseen(&m, have, desired));
    json_object_del(have, "j-r1-s0-0");
    ctl_mark_seen(&m, "j-r1-s0-0", "uid-2", 1, 0); /* seen once: its deletion is an event */
    ASSERT(!ctl_pods_unseen(&m, have, desired));
    ctl_mark_seen(&m, "j-r1-c0", "uid-3", 0, 1); /* deleted by us, counted */
    ASSERT(!ctl_pods_unseen(&m, have, desired));
    ctl_mark_seen(&m, "old-r9-s0-0", "uid-4", 0, 0); /* made, no longer desired */
    ASSERT(!ctl_pods_unseen(&m, have, desired));

    json_decref(desired);
    json_decref(have);
    json_decref(m.seen);
}

/* A job's memory as ctl_mem_get makes it, under key "ns/j", for a controller of its own. */
static void mem_init(controller *ctl, job_mem *m)
{
    *m = (job_mem){.seen = json_object(), .gone = json_object(), .counts = json_object()};
    snprintf(m->key, sizeof m->key, "ns/j");
    ctl->mems = m;
}

static void mem_free(job_mem *m)
{
    json_decref(m->seen);
    json_decref(m->gone);
    json_decref(m->counts);
}

static json_t *client_pod(const char *uid)
{
    return json_pack("{s:{s:s, s:s, s:s, s:{s:s, s:s, s:s}}, s:{s:s}}", "metadata", "name",
                     "j-r1-c0", "namespace", "ns", "uid", uid, "labels", CIRRUS_LABEL_JOB, "j",
                     CIRRUS_LABEL_REGION, "r1", CIRRUS_LABEL_ROLE, CIRRUS_ROLE_CLIENT, "status",
                     "phase", "Running");
}

static const char *seen_uid(const job_mem *m)
{
    pod_seen s;
    ctl_seen_get(m, "j-r1-c0", &s);
    return s.uid;
}

static int seen_observed(const job_mem *m)
{
    pod_seen s;
    return ctl_seen_get(m, "j-r1-c0", &s) && s.observed;
}

/* A create answered past the timeout (uid "") or cut short (UID_MADE): its pod's ADDED and
 * DELETED events, arriving together before the next reconcile, say it existed, so its
 * absence then is a preemption, not a create that never happened (faults_test.sh
 * FAULTS_SEED=387118728 counted 13 for 14). */
TEST(pods_cached_learns_a_create_answered_late)
{
    controller ctl = {0};
    job_mem m;
    mem_init(&ctl, &m);
    json_t *desired = json_pack("{s:{}}", "j-r1-c0"), *have = json_object();
    json_t *pod = client_pod("uid-1");
    ASSERT(desired && have && pod);
    const char *lost[] = {"", UID_MADE};
    for (int i = 0; i < 2; i++) {
        ctl_mark_seen(&m, "j-r1-c0", lost[i], 0, 0);
        ctl_pod_cached(&ctl, "ns/other", pod); /* another job's: not this one */
        ASSERT(!seen_observed(&m));
        ctl_pod_cached(&ctl, "ns/j", pod); /* the DELETED event, say */
        ASSERT(seen_uid(&m) && !strcmp(seen_uid(&m), "uid-1") && seen_observed(&m));
        ASSERT(!ctl_pods_unseen(&m, have, desired)); /* gone now: counted, not asked */
        json_object_del(m.seen, "j-r1-c0");
    }
    ctl_mark_seen(&m, "j-r1-c0", "uid-1", 0, 0); /* answered: the event only confirms it */
    ctl_pod_cached(&ctl, "ns/j", pod);
    ASSERT(seen_observed(&m));
    json_decref(pod);
    json_decref(desired);
    json_decref(have);
    mem_free(&m);
}

/* A watch resumed from before a pod's end replays it (ADDED, and the DELETED only later if
 * the watch is cut in between) after its deletion was counted (found gone by asking) and
 * its successor made: the old incarnation must not be taken for the current pod, or its
 * end is counted twice (an over-count) and the successor's uid forgotten. */
TEST(pods_stale_incarnation_not_taken_for_current)
{
    controller ctl = {0};
    job_mem m;
    mem_init(&ctl, &m);
    json_t *job = json_pack("{s:{s:s, s:s, s:s}, s:{s:[{s:s, s:{s:i, s:i}, s:i}]}}", "metadata",
                            "name", "j", "namespace", "ns", "uid", "job-uid", "spec", "regions",
                            "name", "r1", "peers", "replicas", 1, "min", 1, "clients", 1);
    json_t *old = client_pod("uid-old"), *want = json_object();
    ASSERT(job && old && want);
    failpolicy policy = {0};
    job_observed obs;
    ctl_observe_spec(job, &obs);

    ctl_mark_seen(&m, "j-r1-c0", "uid-new", 0, 0); /* the successor, made, not cached yet */
    ctl_pod_cached(&ctl, "ns/j", old);
    ASSERT(!strcmp(seen_uid(&m), "uid-new") && !seen_observed(&m));
    ASSERT_EQ(ctl_observe_pod(&ctl, job, &m, &policy, old, want, &obs), KEEP_POD);
    ASSERT(!strcmp(seen_uid(&m), "uid-new") && !seen_observed(&m));

    /* The successor's create answer lost too: the old uid is known as gone. */
    ctl_mark_seen(&m, "j-r1-c0", "", 0, 0);
    json_object_set_new(m.gone, "j-r1-c0", json_pack("[s]", "uid-old"));
    ctl_pod_cached(&ctl, "ns/j", old);
    ASSERT_EQ(ctl_observe_pod(&ctl, job, &m, &policy, old, want, &obs), KEEP_POD);
    ASSERT(!strcmp(seen_uid(&m), "") && !seen_observed(&m));
    json_t *cur = client_pod("uid-new");
    ctl_pod_cached(&ctl, "ns/j", cur); /* the successor itself */
    ASSERT(!strcmp(seen_uid(&m), "uid-new") && seen_observed(&m));

    json_decref(cur);
    json_decref(old);
    json_decref(want);
    json_decref(job);
    mem_free(&m);
}
