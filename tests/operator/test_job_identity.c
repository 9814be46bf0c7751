/* ctl_job_identity: the job's identity on the WAN and in its gateways' /status. A copy's
 * gateways run with the home job's uid; a member's operator that judged their /status by the
 * copy's own uid ignored every answer (found on real nodes: tests/nodes/multicluster_e2e.sh). */
#include <string.h>

#include <jansson.h>

#include "../../operator/controller_internal.h"
#include "../unit/test.h"

TEST(job_identity_is_the_home_uid_in_a_copy)
{
    json_t *home = json_pack("{s:{s:s}, s:{}}", "metadata", "uid", "home-uid", "spec");
    json_t *copy = json_pack("{s:{s:s}, s:{s:{s:s, s:s}}}", "metadata", "uid", "copy-uid", "spec",
                             "home", "cluster", "home", "uid", "home-uid");
    json_t *bad = json_pack("{s:{s:s}, s:{s:{s:s}}}", "metadata", "uid", "copy-uid", "spec",
                            "home", "cluster", "home"); /* no spec.home.uid */
    ASSERT(home && copy && bad);
    ASSERT(!strcmp(ctl_job_identity(home), "home-uid"));
    ASSERT(!strcmp(ctl_job_identity(copy), "home-uid"));
    ASSERT(!strcmp(ctl_job_identity(bad), "copy-uid"));
    json_decref(home);
    json_decref(copy);
    json_decref(bad);
}
