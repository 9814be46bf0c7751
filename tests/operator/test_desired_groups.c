/* desired: a region's group — spec.gangScheduling's PodGroup and the pods that name it, and
 * the Kueue queue and pod-group labels a queued job's pods carry (`operator-tests desired`). */
#include <string.h>

#include "../../operator/desired.h"
#include "../unit/test.h"
#include "desired_fixture.h"

static const char *label_of(const json_t *obj, const char *key)
{
    return str_at(json_object_get(json_object_get(obj, "metadata"), "labels"), key);
}

static const char *annotation_of(const json_t *obj, const char *key)
{
    return str_at(json_object_get(json_object_get(obj, "metadata"), "annotations"), key);
}

static const char *group_of(const json_t *pod)
{
    return str_at(json_object_get(json_object_get(pod, "spec"), "schedulingGroup"),
                  "podGroupName");
}

/* gangScheduling: one PodGroup per region, gang minCount = the gateway, peers.min peers of
 * every stage and the clients; every pod names its region's; none without, or while
 * suspended. */
TEST(desired_gang_pod_groups)
{
    json_t *job = sample_job();
    desired_job d;
    cirrus_error err = {0};
    if (desired_build(job, &d, &err)) TEST_FAIL("desired_build: %s", err.msg);
    ASSERT_EQ(json_object_size(d.pod_groups), 0);
    ASSERT(group_of(pod(&d, "tiny-bible-r1-s0-0")) == NULL);
    const char *plain_hash = hash_of(pod(&d, "tiny-bible-r1-s0-0"));
    char before[17];
    snprintf(before, sizeof before, "%s", plain_hash);
    desired_job_free(&d);

    json_object_set_new(spec_of(job), "gangScheduling", json_true());
    if (desired_build(job, &d, &err)) TEST_FAIL("desired_build: %s", err.msg);
    ASSERT_EQ(json_object_size(d.pod_groups), 2);
    const json_t *g1 = json_object_get(d.pod_groups, "tiny-bible-r1");
    ASSERT(g1 != NULL);
    assert_str(str_at(g1, "apiVersion"), DESIRED_POD_GROUP_API, "PodGroup apiVersion");
    assert_str(str_at(g1, "kind"), "PodGroup", "PodGroup kind");
    assert_str(label_of(g1, CIRRUS_LABEL_REGION), "r1", "PodGroup region label");
    const json_t *owner = json_array_get(
        json_object_get(json_object_get(g1, "metadata"), "ownerReferences"), 0);
    assert_str(str_at(owner, "kind"), "SwarmJob", "PodGroup owner");
    /* The sample: 2 stages, r1 peers.min 1, 1 client. */
    ASSERT_EQ(json_integer_value(json_object_get(
                  json_object_get(json_object_get(json_object_get(g1, "spec"),
                                                  "schedulingPolicy"),
                                  "gang"),
                  "minCount")),
              desired_gang_min(2, 1, 1));
    ASSERT_EQ(desired_gang_min(2, 1, 1), 4);
    assert_str(group_of(pod(&d, "tiny-bible-r1-gw")), "tiny-bible-r1", "gateway's group");
    assert_str(group_of(pod(&d, "tiny-bible-r1-s1-1")), "tiny-bible-r1", "peer's group");
    assert_str(group_of(pod(&d, "tiny-bible-r2-c0")), "tiny-bible-r2", "client's group");
    /* The group is part of the pod's spec: turning the gang on replaces the pods. */
    ASSERT(strcmp(hash_of(pod(&d, "tiny-bible-r1-s0-0")), before) != 0);
    desired_job_free(&d);

    json_object_set_new(spec_of(job), "suspend", json_true());
    if (desired_build(job, &d, &err)) TEST_FAIL("desired_build: %s", err.msg);
    ASSERT_EQ(json_object_size(d.pod_groups), 0); /* nothing to schedule */
    desired_job_free(&d);

    json_object_set_new(spec_of(job), "gangScheduling", json_string("yes"));
    expect_invalid(job, "spec.gangScheduling must be a boolean");
}

/* A job labelled with a Kueue LocalQueue: its pods carry the queue, their region's pod
 * group and its size; the label must be a DNS label. */
TEST(desired_kueue_labels)
{
    json_t *job = sample_job();
    json_object_set_new(json_object_get(job, "metadata"), "labels",
                        json_pack("{s:s}", DESIRED_KUEUE_QUEUE, "team-a"));
    desired_job d;
    cirrus_error err = {0};
    if (desired_build(job, &d, &err)) TEST_FAIL("desired_build: %s", err.msg);
    const json_t *peer = pod(&d, "tiny-bible-r2-s1-0");
    assert_str(label_of(peer, DESIRED_KUEUE_QUEUE), "team-a", "queue label");
    assert_str(label_of(peer, DESIRED_KUEUE_GROUP), "tiny-bible-r2", "pod group label");
    /* r2: a gateway, 2 stages x 2 peers, a client. */
    assert_str(annotation_of(peer, DESIRED_KUEUE_GROUP_COUNT), "6", "pod group size");
    assert_str(label_of(pod(&d, "tiny-bible-r1-gw"), DESIRED_KUEUE_GROUP), "tiny-bible-r1",
               "the gateway's pod group");
    ASSERT(annotation_of(peer, CIRRUS_ANNOT_SPEC_HASH) != NULL);
    ASSERT(group_of(peer) == NULL); /* Kueue alone: no gang PodGroup */
    desired_job_free(&d);

    json_object_set_new(json_object_get(json_object_get(job, "metadata"), "labels"),
                        DESIRED_KUEUE_QUEUE, json_string("Team A"));
    expect_invalid(job, "metadata.labels[kueue.x-k8s.io/queue-name] must be a DNS label");
}
