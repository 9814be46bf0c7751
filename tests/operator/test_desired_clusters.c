/* desired, regions in several clusters: a home job builds nothing for a member's region and
 * lists its gateway at its endpoint once known; a copy builds only its own regions, under
 * the home job's identity; misplaced clusters and endpoints are refused
 * (`operator-tests desired`). */
#include <string.h>

#include "../../operator/desired.h"
#include "../unit/test.h"
#include "desired_fixture.h"

/* The sample job with r2 run by member cluster "east" and NodePort WAN Services. */
static json_t *home_job(void)
{
    json_t *job = sample_job();
    json_t *spec = spec_of(job);
    json_object_set_new(spec, "clusters",
                        json_pack("[{s:s, s:{s:s}}]", "name", "east", "kubeconfigSecret", "name",
                                  "east-kubeconfig"));
    json_object_set_new(json_array_get(json_object_get(spec, "regions"), 1), "cluster",
                        json_string("east"));
    json_object_set_new(gateway_spec(job), "serviceType", json_string("NodePort"));
    return job;
}

static int pods_of_region(const desired_job *d, const char *region)
{
    const char *name;
    const json_t *p;
    int n = 0;
    json_object_foreach(d->pods, name, p)
    {
        const char *r = str_at(json_object_get(json_object_get(p, "metadata"), "labels"),
                               CIRRUS_LABEL_REGION);
        n += r && !strcmp(r, region);
    }
    return n;
}

TEST(desired_clusters_home_waits_for_member_endpoint)
{
    json_t *job = home_job();
    desired_job d;
    cirrus_error err = {0};
    if (desired_build(job, &d, &err)) TEST_FAIL("desired_build: %s", err.msg);
    /* Nothing of r2 here; r1's peers and client, but no gateway: the list it starts with
     * must name r2's endpoint, not known yet. */
    ASSERT_EQ(pods_of_region(&d, "r2"), 0);
    ASSERT(!json_object_get(d.services, "tiny-bible-r2-gw"));
    ASSERT(json_object_get(d.services, "tiny-bible-r1-gw"));
    /* The gateway Service stays inside the cluster; the WAN port alone is a NodePort. */
    assert_str(str_at(json_object_get(json_object_get(d.services, "tiny-bible-r1-gw"), "spec"),
                      "type"),
               "ClusterIP", "the gateway Service's type");
    const json_t *wan = json_object_get(json_object_get(d.services, "tiny-bible-r1-wan"), "spec");
    assert_str(str_at(wan, "type"), "NodePort", "the WAN Service's type");
    ASSERT_EQ(json_array_size(json_object_get(wan, "ports")), 1);
    assert_str(str_at(json_array_get(json_object_get(wan, "ports"), 0), "name"), "wan",
               "the WAN Service's one port");
    ASSERT(!json_object_get(d.services, "tiny-bible-r2-wan"));
    ASSERT(!json_object_get(d.pods, "tiny-bible-r1-gw"));
    ASSERT(json_object_get(d.pods, "tiny-bible-r1-s1-1"));
    ASSERT(json_object_get(d.pods, "tiny-bible-r1-c0"));
    ASSERT(strstr(d.waiting, "region r2") && strstr(d.waiting, "east"));
    desired_job_free(&d);

    /* The endpoint learned from the member (the status): the gateway lists it. */
    json_object_set_new(job, "status",
                        json_pack("{s:[{s:s, s:s}]}", "regions", "name", "r2", "endpoint",
                                  "10.1.2.3:30443"));
    if (desired_build(job, &d, &err)) TEST_FAIL("desired_build: %s", err.msg);
    ASSERT(!d.waiting[0]);
    assert_str(arg_of(pod(&d, "tiny-bible-r1-gw"), "--regions"),
               "r1=tiny-bible-r1-gw.train.svc:7443,r2=10.1.2.3:30443", "r1 --regions");
    assert_str(arg_of(pod(&d, "tiny-bible-r1-gw"), "--job"),
               "6f1c2a9e-0000-4000-8000-000000000001", "--job is the job's uid");
    desired_job_free(&d);

    /* An endpoint in the spec wins over the status's. */
    json_object_set_new(json_array_get(json_object_get(spec_of(job), "regions"), 1), "endpoint",
                        json_string("gw.east.example:443"));
    if (desired_build(job, &d, &err)) TEST_FAIL("desired_build: %s", err.msg);
    assert_str(arg_of(pod(&d, "tiny-bible-r1-gw"), "--regions"),
               "r1=tiny-bible-r1-gw.train.svc:7443,r2=gw.east.example:443", "spec endpoint");
    desired_job_free(&d);
    json_decref(job);
}

TEST(desired_clusters_copy_builds_its_regions_as_the_home_job)
{
    json_t *job = sample_job();
    json_t *spec = spec_of(job);
    json_object_set_new(spec, "home", json_pack("{s:s, s:s}", "cluster", "home", "uid",
                                                "aaaaaaaa-1111-4000-8000-000000000009"));
    json_t *r1 = json_array_get(json_object_get(spec, "regions"), 0);
    json_object_set_new(r1, "cluster", json_string("home"));
    json_object_set_new(r1, "endpoint", json_string("192.0.2.7:31000"));
    desired_job d;
    cirrus_error err = {0};
    if (desired_build(job, &d, &err)) TEST_FAIL("desired_build: %s", err.msg);
    ASSERT_EQ(pods_of_region(&d, "r1"), 0);
    ASSERT_EQ(pods_of_region(&d, "r2"), 1 + 2 * 2 + 1);
    /* Every pod's --job is the home job's uid (the certificates name it); the objects are
     * still owned by this copy. */
    assert_str(arg_of(pod(&d, "tiny-bible-r2-gw"), "--job"),
               "aaaaaaaa-1111-4000-8000-000000000009", "gateway --job");
    assert_str(arg_of(pod(&d, "tiny-bible-r2-c0"), "--job"),
               "aaaaaaaa-1111-4000-8000-000000000009", "client --job");
    assert_str(arg_of(pod(&d, "tiny-bible-r2-s0-0"), "--job"),
               "aaaaaaaa-1111-4000-8000-000000000009", "peer --job");
    const json_t *owner = json_array_get(
        json_object_get(json_object_get(pod(&d, "tiny-bible-r2-gw"), "metadata"),
                        "ownerReferences"),
        0);
    assert_str(str_at(owner, "uid"), "6f1c2a9e-0000-4000-8000-000000000001", "owner uid");
    assert_str(arg_of(pod(&d, "tiny-bible-r2-gw"), "--regions"),
               "r1=192.0.2.7:31000,r2=tiny-bible-r2-gw.train.svc:7443", "r2 --regions");
    desired_job_free(&d);
    json_decref(job);
}

TEST(desired_clusters_refusals)
{
    json_t *job = home_job();
    json_object_set_new(json_array_get(json_object_get(spec_of(job), "regions"), 1), "cluster",
                        json_string("west"));
    expect_invalid(job, "spec.regions[1].cluster 'west' is not a name in spec.clusters");

    const char *bad[] = {"host", "a:b:c", "h:0", "h:65536", "h:12a", ":80", "[::1:80", "a b:1"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        job = home_job();
        json_object_set_new(json_array_get(json_object_get(spec_of(job), "regions"), 1),
                            "endpoint", json_string(bad[i]));
        expect_invalid(job, "spec.regions[1].endpoint");
    }
    ASSERT(desired_endpoint_valid("[2001:db8::1]:7443"));
    ASSERT(desired_endpoint_valid("gw-1.example.com:443"));

    job = home_job();
    json_object_set_new(spec_of(job), "home",
                        json_pack("{s:s, s:s}", "cluster", "home", "uid", "u-1"));
    expect_invalid(job, "spec.clusters must be empty in a copy");

    job = sample_job();
    json_object_set_new(spec_of(job), "home",
                        json_pack("{s:s, s:s}", "cluster", "Home_1", "uid", "u-1"));
    expect_invalid(job, "spec.home.cluster");
}
