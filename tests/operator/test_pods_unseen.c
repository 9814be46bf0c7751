/* ctl_pods_unseen: which jobs the controller must look at again without a watch event (a pod
 * it made and never saw cached can come and go while the pod watch is down). */
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
