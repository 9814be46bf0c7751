/* desired, outer steps across regions: the gateways' WAN flags, ports and Services with two
 * regions, none of them with one, and the gateway fields refused (`operator-tests desired`). */
#include <string.h>

#include "../../common/role_args.h"
#include "../../operator/desired.h"
#include "../unit/test.h"
#include "desired_fixture.h"

TEST(desired_outer_two_regions)
{
    json_t *job = sample_job();
    desired_job d;
    cirrus_error err = {0};
    if (desired_build(job, &d, &err)) TEST_FAIL("desired_build: %s", err.msg);
    /* Every gateway lists every region's gateway Service (in the job's namespace) on the WAN
     * port, in the spec's order: the same list for both. */
    assert_str(args_of(pod(&d, "tiny-bible-r1-gw")),
               "--job 6f1c2a9e-0000-4000-8000-000000000001 --listen 0.0.0.0:7400 "
               "--http-port 7480 --stages 2 --layers 4 --max-stage-peers 4 --max-connections 73 --model tiny "
               "--sync-every 100 "
               "--region r1 --regions r1=tiny-bible-r1-gw.train.svc:7443,"
               "r2=tiny-bible-r2-gw.train.svc:7443 --wan-listen 0.0.0.0:7443 "
               "--tls-dir /etc/cirrus/tls --codec q8 --fragments 1 --outer-lr 0.7 "
               "--outer-momentum 0.9",
               "r1 gateway args");
    assert_str(arg_of(pod(&d, "tiny-bible-r2-gw"), "--region"), "r2", "r2 --region");
    assert_str(arg_of(pod(&d, "tiny-bible-r2-gw"), "--regions"),
               arg_of(pod(&d, "tiny-bible-r1-gw"), "--regions"), "the same --regions");
    /* The hosts are the gateway Services desired.c makes, by the same name function. */
    char gw[CIRRUS_NAME_MAX + 1];
    ASSERT_OK(desired_name_gateway(gw, sizeof gw, "tiny-bible", "r2", &err));
    ASSERT(json_object_get(d.services, gw));
    ASSERT(strstr(arg_of(pod(&d, "tiny-bible-r1-gw"), "--regions"), gw));
    /* --tls-dir is where the job Secret's ca.crt, tls.crt and tls.key are mounted. */
    const json_t *c = container(pod(&d, "tiny-bible-r1-gw"));
    assert_str(str_at(json_array_get(json_object_get(c, "volumeMounts"), 0), "mountPath"),
               arg_of(pod(&d, "tiny-bible-r1-gw"), "--tls-dir"), "--tls-dir is the mount");
    ASSERT_EQ(port_named(json_object_get(c, "ports"), "wan", "containerPort"), 7443);
    const json_t *svc = json_object_get(d.services, "tiny-bible-r1-gw");
    ASSERT_EQ(port_named(json_object_get(json_object_get(svc, "spec"), "ports"), "wan", "port"),
              7443);
    /* The region's one client takes the outer steps; peers know nothing of them. */
    assert_str(args_of(pod(&d, "tiny-bible-r2-c0")),
               "--job 6f1c2a9e-0000-4000-8000-000000000001 "
               "--coordinator tiny-bible-r2-gw.train.svc:7400 --steps 3000 "
               "--summary-file /dev/termination-log --sync-every 100 "
               "--ckpt /checkpoints/r2 --ckpt-every 200 --model tiny --batch 8 --seed 1337",
               "r2 client args");
    ASSERT(!arg_of(pod(&d, "tiny-bible-r1-s0-0"), "--sync-every"));
    ASSERT(!arg_of(pod(&d, "tiny-bible-r1-s0-0"), "--codec"));
    desired_job_free(&d);

    /* Other values, a model with overrides (the gateway gets the shape, not the data flags),
     * a third region, and the gateway Service on another port. */
    json_t *g = gateway_spec(job);
    json_object_set_new(g, "syncEvery", json_integer(25));
    json_object_set_new(g, "wanPort", json_integer(9443));
    json_object_set_new(g, "port", json_integer(8400));
    json_object_set_new(g, "codec", json_string("topk:0.01:8+zstd"));
    json_object_set_new(g, "outerLearningRate", json_integer(1));
    json_object_set_new(g, "outerMomentum", json_real(0));
    json_object_set_new(g, "fragments", json_integer(4));
    json_object_set_new(spec_of(job), "model",
                        json_pack("{s:s, s:i, s:i, s:i, s:i}", "preset", "small", "layers", 5,
                                  "width", 256, "heads", 8, "context", 64));
    json_array_append_new(json_object_get(spec_of(job), "regions"),
                          json_pack("{s:s, s:i}", "name", "eu-west-1", "clients", 1));
    if (desired_build(job, &d, &err)) TEST_FAIL("desired_build: %s", err.msg);
    assert_str(args_of(pod(&d, "tiny-bible-eu-west-1-gw")),
               "--job 6f1c2a9e-0000-4000-8000-000000000001 --listen 0.0.0.0:7400 "
               "--http-port 7480 --stages 2 --layers 5 --max-stage-peers 2 --max-connections 69 --model small "
               "--width 256 --heads 8 "
               "--context 64 --sync-every 25 --region eu-west-1 "
               "--regions r1=tiny-bible-r1-gw.train.svc:9443,r2=tiny-bible-r2-gw.train.svc:9443,"
               "eu-west-1=tiny-bible-eu-west-1-gw.train.svc:9443 --wan-listen 0.0.0.0:9443 "
               "--tls-dir /etc/cirrus/tls --codec topk:0.01:8+zstd --fragments 4 --outer-lr 1 "
               "--outer-momentum 0",
               "eu-west-1 gateway args");
    assert_str(arg_of(pod(&d, "tiny-bible-r1-c0"), "--sync-every"), "25", "client --sync-every");
    c = container(pod(&d, "tiny-bible-r2-gw"));
    ASSERT_EQ(port_named(json_object_get(c, "ports"), "wan", "containerPort"), 9443);
    ASSERT_EQ(port_named(json_object_get(c, "ports"), "coord", "containerPort"), 7400);
    const json_t *ports = json_object_get(
        json_object_get(json_object_get(d.services, "tiny-bible-r2-gw"), "spec"), "ports");
    ASSERT_EQ(json_array_size(ports), 3);
    ASSERT_EQ(port_named(ports, "wan", "port"), 9443);
    ASSERT_EQ(port_named(ports, "coord", "port"), 8400);
    desired_job_free(&d);

    /* The older CRD's fp32 is the trainer's none. */
    json_object_set_new(g, "codec", json_string("fp32"));
    ASSERT_OK(desired_build(job, &d, &err));
    assert_str(arg_of(pod(&d, "tiny-bible-r1-gw"), "--codec"), "none", "fp32 is none");
    desired_job_free(&d);
    /* auto: the gateways choose per outer step (and space the steps out when they must). */
    json_object_set_new(g, "codec", json_string("auto"));
    ASSERT_OK(desired_build(job, &d, &err));
    assert_str(arg_of(pod(&d, "tiny-bible-r2-gw"), "--codec"), "auto", "codec auto");
    desired_job_free(&d);
    /* Fields left out (an object from an older CRD): the CRD's defaults. */
    json_object_set_new(spec_of(job), "gateway", json_object());
    ASSERT_OK(desired_build(job, &d, &err));
    const json_t *gp = pod(&d, "tiny-bible-r1-gw");
    assert_str(arg_of(gp, "--sync-every"), "100", "default --sync-every");
    assert_str(arg_of(gp, "--codec"), "q8", "default --codec");
    assert_str(arg_of(gp, "--wan-listen"), "0.0.0.0:7443", "default --wan-listen");
    assert_str(arg_of(gp, "--outer-lr"), "0.7", "default --outer-lr");
    assert_str(arg_of(gp, "--outer-momentum"), "0.9", "default --outer-momentum");
    assert_str(arg_of(gp, "--fragments"), "1", "default --fragments");
    desired_job_free(&d);
    json_decref(job);
}

TEST(desired_outer_one_region)
{
    /* One region trains with no outer steps: none of the WAN's flags or ports, whatever
     * spec.gateway says. */
    json_t *job = sample_job();
    json_array_remove(json_object_get(spec_of(job), "regions"), 1);
    json_object_set_new(gateway_spec(job), "syncEvery", json_integer(7));
    desired_job d;
    cirrus_error err = {0};
    if (desired_build(job, &d, &err)) TEST_FAIL("desired_build: %s", err.msg);
    ASSERT_EQ(json_object_size(d.pods), 6);
    assert_str(args_of(pod(&d, "tiny-bible-r1-gw")),
               "--job 6f1c2a9e-0000-4000-8000-000000000001 --listen 0.0.0.0:7400 "
               "--http-port 7480 --stages 2 --layers 4 --max-stage-peers 4 --max-connections 73",
               "one-region gateway args");
    const json_t *c = container(pod(&d, "tiny-bible-r1-gw"));
    ASSERT_EQ(json_array_size(json_object_get(c, "ports")), 2);
    ASSERT_EQ(port_named(json_object_get(c, "ports"), "wan", "containerPort"), -1);
    const json_t *svc = json_object_get(d.services, "tiny-bible-r1-gw");
    ASSERT_EQ(json_array_size(json_object_get(json_object_get(svc, "spec"), "ports")), 2);
    const json_t *cl = pod(&d, "tiny-bible-r1-c0");
    ASSERT(!arg_of(cl, "--sync-every"));
    assert_str(args_of(cl),
               "--job 6f1c2a9e-0000-4000-8000-000000000001 "
               "--coordinator tiny-bible-r1-gw.train.svc:7400 --steps 3000 "
               "--summary-file /dev/termination-log --ckpt /checkpoints/r1 --ckpt-every 200 "
               "--model tiny --batch 8 --seed 1337",
               "one-region client args");
    /* Several clients are fine with one region. */
    desired_job_free(&d);
    json_object_set_new(json_array_get(json_object_get(spec_of(job), "regions"), 0), "clients",
                        json_integer(3));
    ASSERT_OK(desired_build(job, &d, &err));
    ASSERT(!arg_of(pod(&d, "tiny-bible-r1-c2"), "--sync-every"));
    desired_job_free(&d);
    json_decref(job);
}

TEST(desired_outer_errors)
{
    json_t *j;
    /* With more than one region every region runs clients, 64 at most (the step barrier's). */
    int clients[] = {0, 65};
    for (size_t i = 0; i < sizeof clients / sizeof *clients; i++) {
        j = sample_job();
        json_object_set_new(json_array_get(json_object_get(spec_of(j), "regions"), 1), "clients",
                            json_integer(clients[i]));
        expect_invalid(j, "spec.regions[1].clients");
    }
    /* Two clients in a region: both take --sync-every (client 0 the outer steps, client 1
     * its region's data shard from the gateway), each its place in the step. */
    j = sample_job();
    json_object_set_new(json_array_get(json_object_get(spec_of(j), "regions"), 0), "clients",
                        json_integer(2));
    desired_job two;
    cirrus_error berr = {0};
    if (desired_build(j, &two, &berr)) TEST_FAIL("desired_build: %s", berr.msg);
    for (int i = 0; i < 2; i++) {
        char name[64];
        snprintf(name, sizeof name, "tiny-bible-r1-c%d", i);
        const json_t *cp = pod(&two, name);
        ASSERT(cp != NULL);
        ASSERT(arg_of(cp, "--sync-every") != NULL);
        assert_str(arg_of(cp, "--clients"), "2", "--clients");
        assert_str(arg_of(cp, "--client-index"), i ? "1" : "0", "--client-index");
    }
    desired_job_free(&two);
    json_decref(j);
    /* Ports: the WAN's must differ from the gateway's Service port and its container's
     * coordinator and HTTP ports; the Service port from the HTTP port. */
    long long wan[] = {7400, 7480, 0, 65536};
    for (size_t i = 0; i < sizeof wan / sizeof *wan; i++) {
        j = sample_job();
        json_object_set_new(gateway_spec(j), "wanPort", json_integer(wan[i]));
        expect_invalid(j, "spec.gateway.wanPort");
    }
    j = sample_job();
    json_object_set_new(gateway_spec(j), "port", json_integer(9000));
    json_object_set_new(gateway_spec(j), "wanPort", json_integer(9000));
    expect_invalid(j, "must differ from spec.gateway.port");
    j = sample_job();
    json_object_set_new(gateway_spec(j), "port", json_integer(7480));
    expect_invalid(j, "spec.gateway.port");
    /* The outer steps' numbers. */
    const char *field[] = {"syncEvery", "syncEvery", "syncEvery", "outerLearningRate",
                           "outerLearningRate", "outerLearningRate", "outerMomentum",
                           "outerMomentum", "outerMomentum", "outerMomentum", "fragments",
                           "fragments", "fragments", "fragments"};
    json_t *value[] = {json_integer(0), json_integer(1000001), json_real(1.5), json_integer(0),
                       json_real(10.5), json_string("0.7"), json_integer(1), json_real(-0.1),
                       json_real(0.9995), json_null(), json_integer(0), json_integer(9),
                       json_real(2.5), json_null()};
    for (size_t i = 0; i < sizeof field / sizeof *field; i++) {
        j = sample_job();
        char what[64];
        snprintf(what, sizeof what, "spec.gateway.%s", field[i]);
        if (json_is_null(value[i])) { /* null is "unset": the default, accepted */
            desired_job d;
            cirrus_error err = {0};
            json_object_set_new(gateway_spec(j), field[i], value[i]);
            ASSERT_OK(desired_build(j, &d, &err));
            desired_job_free(&d);
            json_decref(j);
            continue;
        }
        json_object_set_new(gateway_spec(j), field[i], value[i]);
        expect_invalid(j, what);
    }
    /* More fragments than inner steps between outer steps: each needs a step of its own. */
    j = sample_job();
    json_object_set_new(gateway_spec(j), "syncEvery", json_integer(3));
    json_object_set_new(gateway_spec(j), "fragments", json_integer(4));
    expect_invalid(j, "must not exceed spec.gateway.syncEvery");
    /* Codecs: the forms wan_codec_parse takes, and only those. */
    const char *good[] = {"none", "fp16", "q8", "lowbit:2", "lowbit:4", "topk:0.01", "topk:1",
                          "topk:1.0", "topk:01.00", "topk:.5", "topk:00.5", "topk:0.05:16",
                          "topk:0.25:8", "q8+zstd", "none+zstd", "topk:0.001:16+zstd",
                          "lowbit:4+zstd", "topk:0.000001"};
    for (size_t i = 0; i < sizeof good / sizeof *good; i++) {
        j = sample_job();
        json_object_set_new(gateway_spec(j), "codec", json_string(good[i]));
        desired_job d;
        cirrus_error err = {0};
        if (desired_build(j, &d, &err)) TEST_FAIL("codec '%s' refused: %s", good[i], err.msg);
        assert_str(arg_of(pod(&d, "tiny-bible-r1-gw"), "--codec"), good[i], "--codec");
        desired_job_free(&d);
        json_decref(j);
    }
    const char *bad[] = {"", "q4", "zstd", "+zstd", "q8+zstd+zstd", "q8+gzip", "Q8", "fp32+zstd",
                         "lowbit:3", "lowbit", "lowbit:", "topk", "topk:", "topk:0",
                         "topk:1.5", "topk:2", "topk:-0.1", "topk:0.1:4", "topk:0.1:",
                         "topk:1.", "topk:.", "topk:1e", "topk:e-3", "topk:0x1p-3",
                         "topk:nan", "topk:inf", "q8:1", "none ", " q8", "topk:1e-3",
                         "topk:0.0", "topk:0.", "topk:10", "topk:1.01", "topk:00", "topk:1.0.0",
                         "topk:0.5:8:16", "topk:0.5+zstd:8", "topk:+0.5"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        j = sample_job();
        json_object_set_new(gateway_spec(j), "codec", json_string(bad[i]));
        expect_invalid(j, "spec.gateway.codec");
    }
}
