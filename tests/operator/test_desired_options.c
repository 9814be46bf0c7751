/* desired, the spec's options (every optional field reaching the manifests) and the specs
 * desired_build refuses with a message naming the field (`operator-tests desired`). */
#include <string.h>

#include "../../common/role_args.h"
#include "../../operator/desired.h"
#include "../unit/test.h"
#include "desired_fixture.h"

TEST(desired_options)
{
    /* Model overrides, sequence length, data claim and path, checkpoint claim, pull secrets,
     * affinity, priority class, service type and annotations, gateway port. */
    json_t *job = sample_job(), *spec = spec_of(job);
    json_object_set_new(spec, "model", json_pack("{s:s, s:i, s:i, s:i, s:i}", "preset", "small",
                                                 "layers", 5, "width", 256, "heads", 8,
                                                 "context", 64));
    json_object_set_new(spec, "pipeline", json_pack("{s:i}", "stages", 3));
    json_object_set_new(spec, "data", json_pack("{s:i, s:i, s:i, s:s, s:s}", "batchSize", 4,
                                                "sequenceLength", 32, "seed", 7, "path",
                                                "/corpora/kjv.txt", "claimName", "corpus"));
    json_object_set_new(spec, "checkpoint",
                        json_pack("{s:i, s:{s:s, s:s}}", "every", 10, "volume", "claimName",
                                  "ckpts", "subPath", "job1"));
    json_object_set_new(spec, "imagePullSecrets", json_pack("[{s:s}]", "name", "regcred"));
    json_object_set_new(spec, "gateway", json_pack("{s:s, s:i, s:{s:s}}", "serviceType",
                                                   "LoadBalancer", "port", 8400,
                                                   "serviceAnnotations", "lb", "internal"));
    json_t *r1 = json_array_get(json_object_get(spec, "regions"), 0);
    json_t *pl = json_object_get(r1, "placement");
    json_object_set_new(pl, "regionLabel", json_string("example.com/zone"));
    json_object_set_new(pl, "priorityClassName", json_string("spot-low"));
    json_object_set_new(pl, "affinity", json_pack("{s:{}}", "podAntiAffinity"));
    json_object_set_new(json_object_get(r1, "peers"), "replicas", json_integer(1));
    json_object_set_new(r1, "resources",
                        json_pack("{s:{s:{s:s}}, s:{s:{s:i}}}", "client", "limits", "cpu", "1",
                                  "gateway", "requests", "cpu", 1));

    desired_job d;
    cirrus_error err = {0};
    if (desired_build(job, &d, &err)) TEST_FAIL("desired_build: %s", err.msg);
    /* r1: gw + 3 stages x 1 + 1 client; r2: gw + 3 x 2 + 1. */
    ASSERT_EQ(json_object_size(d.pods), 5 + 8);
    const json_t *gw = pod(&d, "tiny-bible-r1-gw");
    assert_str(arg_of(gw, "--layers"), "5", "gw --layers");
    assert_str(arg_of(gw, "--stages"), "3", "gw --stages");
    ASSERT_EQ(json_integer_value(json_object_get(
                  json_object_get(json_object_get(container(gw), "resources"), "requests"), "cpu")),
              1);
    const json_t *gspec = json_object_get(gw, "spec");
    const json_t *sel = json_object_get(gspec, "nodeSelector");
    assert_str(str_at(sel, "example.com/zone"), "r1", "custom region label");
    ASSERT(!json_object_get(sel, "topology.kubernetes.io/region"));
    assert_str(str_at(gspec, "priorityClassName"), "spot-low", "priorityClassName");
    ASSERT(json_is_object(json_object_get(json_object_get(gspec, "affinity"), "podAntiAffinity")));
    assert_str(str_at(json_array_get(json_object_get(gspec, "imagePullSecrets"), 0), "name"),
               "regcred", "imagePullSecrets");
    /* r2 has none of r1's placement. */
    const json_t *g2 = json_object_get(pod(&d, "tiny-bible-r2-gw"), "spec");
    ASSERT(!json_object_get(g2, "priorityClassName") && !json_object_get(g2, "affinity"));
    assert_str(str_at(json_object_get(g2, "nodeSelector"), "topology.kubernetes.io/region"), "r2",
               "r2 region label");

    /* 5 layers in 3 stages: 0:1, 1:3, 3:5. */
    assert_str(arg_of(pod(&d, "tiny-bible-r1-s0-0"), "--serve"), "0:1", "serve s0");
    assert_str(arg_of(pod(&d, "tiny-bible-r1-s1-0"), "--serve"), "1:3", "serve s1");
    const json_t *p = pod(&d, "tiny-bible-r2-s2-1");
    assert_str(arg_of(p, "--serve"), "3:5", "serve s2");
    assert_str(arg_of(p, "--model"), "small", "--model");
    assert_str(arg_of(p, "--layers"), "5", "--layers");
    assert_str(arg_of(p, "--width"), "256", "--width");
    assert_str(arg_of(p, "--heads"), "8", "--heads");
    assert_str(arg_of(p, "--context"), "64", "--context");
    assert_str(arg_of(p, "--batch"), "4", "--batch");
    assert_str(arg_of(p, "--seq"), "32", "--seq");
    assert_str(arg_of(p, "--seed"), "7", "--seed");
    assert_str(arg_of(p, "--coordinator"), "tiny-bible-r2-gw.train.svc:8400", "--coordinator");
    ASSERT(!json_object_get(json_object_get(p, "spec"), "volumes"));

    const json_t *c = pod(&d, "tiny-bible-r1-c0");
    assert_str(arg_of(c, "--data"), "/data/corpora/kjv.txt", "--data in the claim");
    ASSERT(!arg_of(c, "--clients") && !arg_of(c, "--client-index"));
    assert_str(arg_of(c, "--seq"), "32", "client --seq");
    assert_str(arg_of(c, "--layers"), "5", "client --layers");
    assert_str(str_at(json_object_get(json_object_get(container(c), "resources"), "limits"),
                      "cpu"),
               "1", "client limits");
    /* Threads from the CPU: the client's limit "1", the gateway's request 1 (a number). */
    assert_str(str_at(json_array_get(json_object_get(container(c), "env"), 2), "value"), "1",
               "client OMP_NUM_THREADS");
    assert_str(str_at(json_array_get(json_object_get(container(gw), "env"), 2), "value"), "1",
               "gateway OMP_NUM_THREADS");
    const json_t *vols = json_object_get(json_object_get(c, "spec"), "volumes");
    const json_t *mounts = json_object_get(container(c), "volumeMounts");
    ASSERT_EQ(json_array_size(vols), 2);
    ASSERT_EQ(json_array_size(mounts), 2);
    const json_t *dv = json_object_get(json_array_get(vols, 0), "persistentVolumeClaim");
    assert_str(str_at(dv, "claimName"), "corpus", "data claim");
    ASSERT(json_is_true(json_object_get(dv, "readOnly")));
    assert_str(str_at(json_array_get(mounts, 0), "mountPath"), "/data", "data mount");
    ASSERT(json_is_true(json_object_get(json_array_get(mounts, 0), "readOnly")));
    assert_str(str_at(json_object_get(json_array_get(vols, 1), "persistentVolumeClaim"),
                      "claimName"),
               "ckpts", "checkpoint claim");
    assert_str(str_at(json_array_get(mounts, 1), "mountPath"), "/checkpoints", "ckpt mount");
    assert_str(str_at(json_array_get(mounts, 1), "subPath"), "job1", "ckpt subPath");

    /* The gateway Service (the coordinator on port) stays inside the cluster; serviceType
     * and its annotations go to the Service that exposes the WAN port alone. */
    const json_t *svc = json_object_get(d.services, "tiny-bible-r1-gw");
    assert_str(str_at(json_object_get(svc, "spec"), "type"), "ClusterIP", "gateway Service");
    ASSERT_EQ(json_integer_value(json_object_get(
                  json_array_get(json_object_get(json_object_get(svc, "spec"), "ports"), 0),
                  "port")),
              8400);
    ASSERT(!json_object_get(json_object_get(svc, "metadata"), "annotations"));
    const json_t *wan = json_object_get(d.services, "tiny-bible-r1-wan");
    assert_str(str_at(json_object_get(wan, "spec"), "type"), "LoadBalancer", "serviceType");
    ASSERT_EQ(json_array_size(json_object_get(json_object_get(wan, "spec"), "ports")), 1);
    assert_str(str_at(json_object_get(json_object_get(wan, "metadata"), "annotations"), "lb"),
               "internal", "service annotations");
    desired_job_free(&d);

    /* A path without a claim is inside the image, as given. */
    json_object_del(json_object_get(spec, "data"), "claimName");
    ASSERT_OK(desired_build(job, &d, &err));
    assert_str(arg_of(pod(&d, "tiny-bible-r1-c0"), "--data"), "/corpora/kjv.txt", "--data");
    ASSERT_EQ(json_array_size(json_object_get(json_object_get(pod(&d, "tiny-bible-r1-c0"), "spec"),
                                              "volumes")),
              1);
    desired_job_free(&d);

    /* One region with two clients: they share each step, each told how many and which it
     * is. */
    json_array_remove(json_object_get(spec, "regions"), 1);
    json_object_set_new(r1, "clients", json_integer(2));
    if (desired_build(job, &d, &err)) TEST_FAIL("desired_build: %s", err.msg);
    ASSERT_EQ(json_object_size(d.pods), 6);
    c = pod(&d, "tiny-bible-r1-c1");
    assert_str(arg_of(c, "--clients"), "2", "client --clients");
    assert_str(arg_of(c, "--client-index"), "1", "client --client-index");
    assert_str(arg_of(pod(&d, "tiny-bible-r1-c0"), "--client-index"), "0", "c0 --client-index");
    ASSERT(!arg_of(c, "--sync-every"));
    desired_job_free(&d);
    json_decref(job);
}

/* issue 13, defect 3: checkpoint.every and peers.max were accepted and ignored. Client 0 of
 * each region (the one that steps, the only one the trainer lets write checkpoints) gets
 * --ckpt in the checkpoint mount, a folder per region, and --ckpt-every checkpoint.every
 * (default 100); the gateway gets --max-stage-peers peers.max (unset: peers.replicas), and
 * the operator makes replicas peers per stage, never max. */
TEST(desired_checkpoint_and_max_peers)
{
    json_t *job = sample_job();
    json_array_remove(json_object_get(spec_of(job), "regions"), 1);
    json_t *r1 = json_array_get(json_object_get(spec_of(job), "regions"), 0);
    json_object_set_new(r1, "clients", json_integer(3));
    json_object_set_new(json_object_get(r1, "peers"), "max", json_integer(7));
    json_object_set_new(json_object_get(r1, "peers"), "replicas", json_integer(3));
    desired_job d;
    cirrus_error err = {0};
    if (desired_build(job, &d, &err)) TEST_FAIL("desired_build: %s", err.msg);
    assert_str(arg_of(pod(&d, "tiny-bible-r1-c0"), "--ckpt"), "/checkpoints/r1", "c0 --ckpt");
    assert_str(arg_of(pod(&d, "tiny-bible-r1-c0"), "--ckpt-every"), "200", "c0 --ckpt-every");
    ASSERT(!arg_of(pod(&d, "tiny-bible-r1-c1"), "--ckpt"));
    ASSERT(!arg_of(pod(&d, "tiny-bible-r1-c2"), "--ckpt-every"));
    /* --ckpt is inside the checkpoint volume's mount. */
    const json_t *c = container(pod(&d, "tiny-bible-r1-c0"));
    const json_t *mnt;
    size_t i;
    int in_mount = 0;
    json_array_foreach(json_object_get(c, "volumeMounts"), i, mnt)
    {
        if (!strcmp(str_at(mnt, "name"), "checkpoints") &&
            !strncmp(arg_of(pod(&d, "tiny-bible-r1-c0"), "--ckpt"), str_at(mnt, "mountPath"),
                     strlen(str_at(mnt, "mountPath"))))
            in_mount = 1;
    }
    ASSERT(in_mount);
    assert_str(arg_of(pod(&d, "tiny-bible-r1-gw"), "--max-stage-peers"), "7", "gateway max");
    ASSERT(pod(&d, "tiny-bible-r1-s1-2") && !json_object_get(d.pods, "tiny-bible-r1-s1-3"));
    ASSERT_EQ(json_object_size(d.pods), 1 + 2 * 3 + 3);
    desired_job_free(&d);
    /* Unset: checkpoint.every 100, peers.max = replicas. */
    json_object_del(spec_of(job), "checkpoint");
    json_object_del(json_object_get(r1, "peers"), "max");
    if (desired_build(job, &d, &err)) TEST_FAIL("desired_build: %s", err.msg);
    assert_str(arg_of(pod(&d, "tiny-bible-r1-c0"), "--ckpt-every"), "100", "default every");
    assert_str(arg_of(pod(&d, "tiny-bible-r1-gw"), "--max-stage-peers"), "3", "max = replicas");
    desired_job_free(&d);
    json_decref(job);
}

/* issue 13, scale subresource: spec.peersPerStage replaces every region's peers.replicas,
 * within each region's peers.min..max; the gateways' rebalancing cap (peers.max, else
 * peers.replicas) does not follow it, so a scaled job keeps its gateway Pods (same spec hash)
 * and its existing peers. */
TEST(desired_peers_per_stage_scales_every_region)
{
    json_t *job = sample_job(), *regions = json_object_get(spec_of(job), "regions");
    json_t *r1 = json_array_get(regions, 0);
    desired_job before, after;
    cirrus_error err = {0};
    if (desired_build(job, &before, &err)) TEST_FAIL("desired_build: %s", err.msg);
    ASSERT(!json_object_get(before.pods, "tiny-bible-r1-s0-2"));
    json_object_set_new(spec_of(job), "peersPerStage", json_integer(4));
    if (desired_build(job, &after, &err)) TEST_FAIL("desired_build: %s", err.msg);
    ASSERT(pod(&after, "tiny-bible-r1-s1-3") && pod(&after, "tiny-bible-r2-s1-3"));
    ASSERT(!json_object_get(after.pods, "tiny-bible-r1-s0-4"));
    ASSERT_EQ(desired_peers_per_stage(spec_of(job), r1), 4);
    const char *same[] = {"tiny-bible-r1-gw", "tiny-bible-r2-gw", "tiny-bible-r1-s0-0",
                          "tiny-bible-r2-c0"};
    for (size_t i = 0; i < sizeof same / sizeof same[0]; i++)
        assert_str(str_at(json_object_get(json_object_get(pod(&after, same[i]), "metadata"),
                                          "annotations"),
                          CIRRUS_ANNOT_SPEC_HASH),
                   str_at(json_object_get(json_object_get(pod(&before, same[i]), "metadata"),
                                          "annotations"),
                          CIRRUS_ANNOT_SPEC_HASH),
                   same[i]);
    assert_str(arg_of(pod(&after, "tiny-bible-r1-gw"), "--max-stage-peers"), "4", "r1 cap");
    assert_str(arg_of(pod(&after, "tiny-bible-r2-gw"), "--max-stage-peers"), "2", "r2 cap");
    desired_job_free(&before);
    desired_job_free(&after);
    /* Scaled down to 1: one peer per stage. */
    json_object_set_new(spec_of(job), "peersPerStage", json_integer(1));
    if (desired_build(job, &after, &err)) TEST_FAIL("desired_build: %s", err.msg);
    ASSERT(pod(&after, "tiny-bible-r1-s1-0") && !json_object_get(after.pods, "tiny-bible-r1-s1-1"));
    desired_job_free(&after);
    /* Outside a region's bounds: refused, naming the field and the bound. */
    json_object_set_new(spec_of(job), "peersPerStage", json_integer(5));
    expect_invalid(json_deep_copy(job), "spec.peersPerStage (5) exceeds spec.regions[0].peers.max (4)");
    json_object_set_new(json_object_get(r1, "peers"), "min", json_integer(2));
    json_object_set_new(spec_of(job), "peersPerStage", json_integer(1));
    expect_invalid(json_deep_copy(job), "spec.peersPerStage (1) is below spec.regions[0].peers.min (2)");
    json_object_set_new(spec_of(job), "peersPerStage", json_integer(0));
    expect_invalid(json_deep_copy(job), "spec.peersPerStage");
    /* Unset: each region's own replicas. */
    json_object_del(spec_of(job), "peersPerStage");
    ASSERT_EQ(desired_peers_per_stage(spec_of(job), r1), 2);
    json_decref(job);
}

/* spec.managedBy: unset or Cirrus's own name is this operator's job; anything else is not. */
TEST(desired_managed_here)
{
    json_t *job = sample_job();
    ASSERT(desired_managed_here(job));
    json_object_set_new(spec_of(job), "managedBy", json_string(CIRRUS_CONTROLLER_NAME));
    ASSERT(desired_managed_here(job));
    json_object_set_new(spec_of(job), "managedBy", json_string("kueue.x-k8s.io/multikueue"));
    ASSERT(!desired_managed_here(job));
    json_object_set_new(spec_of(job), "managedBy", json_integer(1)); /* never ours to guess */
    ASSERT(!desired_managed_here(job));
    json_decref(job);
}

TEST(desired_errors)
{
    json_t *j;
    /* Metadata. */
    j = sample_job();
    json_object_del(json_object_get(j, "metadata"), "uid");
    expect_invalid(j, "metadata.uid");
    j = sample_job();
    json_object_del(json_object_get(j, "metadata"), "namespace");
    expect_invalid(j, "metadata.namespace");
    j = sample_job();
    json_object_set_new(json_object_get(j, "metadata"), "name", json_integer(3));
    expect_invalid(j, "metadata.name");
    j = sample_job();
    json_object_set_new(json_object_get(j, "metadata"), "name", json_string("Tiny_Bible"));
    expect_invalid(j, "metadata.name");
    j = sample_job();
    json_object_del(j, "metadata");
    expect_invalid(j, "metadata");
    /* Spec. */
    j = sample_job();
    json_object_del(j, "spec");
    expect_invalid(j, "spec");
    j = sample_job();
    json_object_del(spec_of(j), "image");
    expect_invalid(j, "spec.image");
    j = sample_job();
    json_object_del(spec_of(j), "regions");
    expect_invalid(j, "spec.regions");
    j = sample_job();
    json_object_set_new(spec_of(j), "regions", json_array());
    expect_invalid(j, "spec.regions");
    j = sample_job();
    json_object_set_new(spec_of(j), "model", json_pack("{s:s}", "preset", "huge"));
    expect_invalid(j, "spec.model.preset");
    j = sample_job();
    json_object_set_new(spec_of(j), "pipeline", json_pack("{s:i}", "stages", 5));
    expect_invalid(j, "spec.pipeline.stages");
    j = sample_job();
    json_object_set_new(spec_of(j), "steps", json_string("many"));
    expect_invalid(j, "spec.steps");
    /* successPolicy: the CRD's rules, checked again. */
    j = sample_job();
    json_object_set_new(spec_of(j), "successPolicy", json_pack("{s:s}", "operator", "Some"));
    expect_invalid(j, "spec.successPolicy.operator 'Some' is not All or Any");
    j = sample_job();
    json_object_set_new(spec_of(j), "successPolicy", json_pack("{s:[s]}", "targetRegions", "r9"));
    expect_invalid(j, "spec.successPolicy.targetRegions[0]: no region of the job has that name");
    j = sample_job();
    json_object_set_new(spec_of(j), "successPolicy",
                        json_pack("{s:[s,s]}", "targetRegions", "r2", "r2"));
    expect_invalid(j, "spec.successPolicy.targetRegions[1]: named twice");
    j = sample_job();
    json_object_set_new(json_array_get(json_object_get(spec_of(j), "regions"), 1), "clients",
                        json_integer(0));
    json_object_set_new(spec_of(j), "successPolicy", json_pack("{s:[s]}", "targetRegions", "r2"));
    expect_invalid(j, "spec.successPolicy.targetRegions[0]: that region runs no clients");
    j = sample_job();
    json_object_set_new(spec_of(j), "successPolicy",
                        json_pack("{s:s, s:[s]}", "operator", "Any", "targetRegions", "r2"));
    desired_job ok_job;
    cirrus_error why = {0};
    if (desired_build(j, &ok_job, &why)) TEST_FAIL("a valid successPolicy refused: %s", why.msg);
    desired_job_free(&ok_job);
    json_decref(j);
    /* An object the CRD's rules did not check (an older CRD): never more than max. */
    j = sample_job();
    json_object_set_new(json_object_get(json_array_get(json_object_get(spec_of(j), "regions"), 0),
                                        "peers"),
                        "max", json_integer(1));
    expect_invalid(j, "spec.regions[0].peers.max (1) must be >= spec.regions[0].peers.replicas (2)");
    j = sample_job();
    json_object_set_new(spec_of(j), "checkpoint", json_pack("{s:i}", "every", 0));
    expect_invalid(j, "spec.checkpoint.every");
    j = sample_job();
    json_object_set_new(spec_of(j), "data", json_pack("{s:i}", "sequenceLength", 129));
    expect_invalid(j, "spec.data.sequenceLength");
    /* Regions: bad names, duplicates, malformed fields. */
    const char *bad[] = {"R1", "-r1", "r1-", "r_1", "", "r1.x"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        j = sample_job();
        json_object_set_new(json_array_get(json_object_get(spec_of(j), "regions"), 1), "name",
                            json_string(bad[i]));
        expect_invalid(j, "spec.regions[1].name");
    }
    j = sample_job();
    json_object_set_new(json_array_get(json_object_get(spec_of(j), "regions"), 1), "name",
                        json_string("r1"));
    expect_invalid(j, "spec.regions[1].name");
    j = sample_job();
    json_object_del(json_array_get(json_object_get(spec_of(j), "regions"), 0), "name");
    expect_invalid(j, "spec.regions[0].name");
    j = sample_job();
    json_object_set_new(json_object_get(json_array_get(json_object_get(spec_of(j), "regions"), 0),
                                        "peers"),
                        "replicas", json_integer(0));
    expect_invalid(j, "spec.regions[0].peers.replicas");
    j = sample_job();
    json_object_set_new(json_object_get(json_array_get(json_object_get(spec_of(j), "regions"), 0),
                                        "placement"),
                        "nodeSelector", json_pack("{s:s}", "topology.kubernetes.io/region", "r2"));
    expect_invalid(j, "spec.regions[0].placement.nodeSelector");
    j = sample_job();
    json_object_set_new(json_object_get(json_array_get(json_object_get(spec_of(j), "regions"), 0),
                                        "placement"),
                        "tolerations", json_object());
    expect_invalid(j, "spec.regions[0].placement.tolerations");
    /* Too long: 35 + 1 + 24 + "-s0-0" = 65 characters for a peer. */
    j = sample_job();
    json_object_set_new(json_object_get(j, "metadata"), "name",
                        json_string("a2345678901234567890123456789012345"));
    json_object_set_new(json_array_get(json_object_get(spec_of(j), "regions"), 1), "name",
                        json_string("r23456789012345678901234"));
    expect_invalid(j, "more than 63");
    j = sample_job();
    json_object_set_new(json_array_get(json_object_get(spec_of(j), "regions"), 0), "name",
                        json_string("r234567890123456789012345678901234567890123456789012345678"));
    expect_invalid(j, "more than 63");
    expect_invalid(json_string("not a job"), "not an object");

    /* The name helpers on their own. */
    char buf[CIRRUS_NAME_MAX + 1];
    cirrus_error err = {0};
    ASSERT_OK(desired_name_peer(buf, sizeof buf, "job", "eu-west", 12, 3, &err));
    assert_str(buf, "job-eu-west-s12-3", "peer name");
    ASSERT_OK(desired_name_client(buf, sizeof buf, "job", "eu-west", 0, &err));
    assert_str(buf, "job-eu-west-c0", "client name");
    ASSERT_OK(desired_name_secret(buf, sizeof buf, "job", &err));
    assert_str(buf, "job-pki", "secret name");
    ASSERT_EQ(desired_name_gateway(buf, sizeof buf, "1job", "r1", &err), CIRRUS_EINVAL);
    json_t *no_ns = json_pack("{s:{s:s}}", "metadata", "name", "x");
    ASSERT(desired_gateway_dns_names(no_ns, "r1") == NULL);
    json_decref(no_ns);
}
