/* desired: the children of a SwarmJob (no cluster needed; run with `operator-tests desired`):
 * the sample's pods, Services, Secret and DNS names, the spec hash, and the layer split the
 * stage peers are given. The spec's options and refusals are test_desired_options.c, the
 * outer steps across regions test_desired_outer.c; the sample job is desired_fixture.c. */
#include <string.h>

#include "../../common/role_args.h"
#include "../../operator/desired.h"
#include "../unit/test.h"
#include "desired_fixture.h"

TEST(desired_sample_pods)
{
    json_t *job = sample_job();
    desired_job d;
    cirrus_error err = {0};
    if (desired_build(job, &d, &err)) TEST_FAIL("desired_build: %s", err.msg);
    ASSERT_EQ(json_object_size(d.pods), 12);
    const char *names[] = {"tiny-bible-r1-gw",   "tiny-bible-r1-s0-0", "tiny-bible-r1-s0-1",
                           "tiny-bible-r1-s1-0", "tiny-bible-r1-s1-1", "tiny-bible-r1-c0",
                           "tiny-bible-r2-gw",   "tiny-bible-r2-s0-0", "tiny-bible-r2-s0-1",
                           "tiny-bible-r2-s1-0", "tiny-bible-r2-s1-1", "tiny-bible-r2-c0"};
    for (int i = 0; i < 12; i++) {
        const json_t *p = pod(&d, names[i]);
        const char *region = i < 6 ? "r1" : "r2";
        const char *role = i % 6 == 0 ? "gateway" : i % 6 == 5 ? "client" : "peer";
        check_meta(p, "Pod", names[i], region, role);
        assert_str(str_at(p, "apiVersion"), "v1", "apiVersion");
        const json_t *spec = json_object_get(p, "spec");
        assert_str(str_at(spec, "restartPolicy"), "Never", "restartPolicy");
        ASSERT_EQ(json_integer_value(json_object_get(spec, "terminationGracePeriodSeconds")), 10);
        const json_t *sel = json_object_get(spec, "nodeSelector");
        ASSERT_EQ(json_object_size(sel), 2);
        assert_str(str_at(sel, "cirrus.dev/pool"), "spot", "nodeSelector pool");
        assert_str(str_at(sel, "topology.kubernetes.io/region"), region, "nodeSelector region");
        const json_t *tol = json_object_get(spec, "tolerations");
        ASSERT_EQ(json_array_size(tol), 1);
        assert_str(str_at(json_array_get(tol, 0), "key"), "cirrus.dev/spot", "toleration");
        assert_str(str_at(json_array_get(tol, 0), "effect"), "NoSchedule", "toleration");
        const json_t *c = container(p);
        assert_str(str_at(c, "name"), "trainer", "container name");
        assert_str(str_at(c, "image"), "cirrus:latest", "image");
        assert_str(str_at(c, "imagePullPolicy"), "IfNotPresent", "imagePullPolicy");
        const json_t *cmd = json_object_get(c, "command");
        ASSERT_EQ(json_array_size(cmd), 2);
        assert_str(json_string_value(json_array_get(cmd, 0)), "cirrus-trainer", "command");
        assert_str(json_string_value(json_array_get(cmd, 1)),
                   i % 6 == 0 ? "gateway" : i % 6 == 5 ? "client" : "stage", "command role");
        assert_str(arg_of(p, "--job"), "6f1c2a9e-0000-4000-8000-000000000001", "--job");
        const json_t *env = json_object_get(c, "env");
        /* Compute threads: as many as a CPU request or limit gives (r1's peers request 2
         * CPUs), none said otherwise; never spinning while they wait. */
        const int threads = !strcmp(region, "r1") && !strcmp(role, "peer");
        ASSERT_EQ(json_array_size(env), 3 + (size_t)threads);
        assert_str(str_at(json_array_get(env, 2 + threads), "name"), "OMP_WAIT_POLICY", "env");
        assert_str(str_at(json_array_get(env, 2 + threads), "value"), "passive", "env");
        if (threads) {
            assert_str(str_at(json_array_get(env, 2), "name"), "OMP_NUM_THREADS", "env");
            assert_str(str_at(json_array_get(env, 2), "value"), "2", "r1 peers' threads");
        }
        assert_str(str_at(json_array_get(env, 0), "name"), "POD_IP", "env");
        assert_str(str_at(json_object_get(json_object_get(json_array_get(env, 0), "valueFrom"),
                                          "fieldRef"),
                          "fieldPath"),
                   "status.podIP", "POD_IP fieldRef");
        assert_str(str_at(json_array_get(env, 1), "name"), "POD_NAME", "env");
        assert_str(str_at(json_object_get(json_object_get(json_array_get(env, 1), "valueFrom"),
                                          "fieldRef"),
                          "fieldPath"),
                   "metadata.name", "POD_NAME fieldRef");
        const char *h = hash_of(p);
        ASSERT(h && strlen(h) == 16);
    }

    /* Gateway. */
    const json_t *gw = pod(&d, "tiny-bible-r1-gw");
    assert_str(arg_of(gw, "--listen"), "0.0.0.0:7400", "gw --listen");
    assert_str(arg_of(gw, "--http-port"), "7480", "gw --http-port");
    assert_str(arg_of(gw, "--stages"), "2", "gw --stages");
    assert_str(arg_of(gw, "--layers"), "4", "gw --layers");
    const json_t *c = container(gw);
    const json_t *ports = json_object_get(c, "ports");
    ASSERT_EQ(json_array_size(ports), 3); /* two regions: the WAN's too (desired_outer) */
    assert_str(str_at(json_array_get(ports, 0), "name"), "coord", "port name");
    ASSERT_EQ(json_integer_value(json_object_get(json_array_get(ports, 0), "containerPort")), 7400);
    assert_str(str_at(json_array_get(ports, 1), "name"), "http", "port name");
    ASSERT_EQ(json_integer_value(json_object_get(json_array_get(ports, 1), "containerPort")), 7480);
    const json_t *probe = json_object_get(json_object_get(c, "readinessProbe"), "httpGet");
    assert_str(str_at(probe, "path"), "/status", "probe path");
    ASSERT_EQ(json_integer_value(json_object_get(probe, "port")), 7480);
    const json_t *mount = json_array_get(json_object_get(c, "volumeMounts"), 0);
    assert_str(str_at(mount, "mountPath"), "/etc/cirrus/tls", "tls mount");
    ASSERT(json_is_true(json_object_get(mount, "readOnly")));
    const json_t *vol = json_array_get(json_object_get(json_object_get(gw, "spec"), "volumes"), 0);
    assert_str(str_at(vol, "name"), str_at(mount, "name"), "tls volume name");
    const json_t *sec = json_object_get(vol, "secret");
    assert_str(str_at(sec, "secretName"), "tiny-bible-pki", "secretName");
    const json_t *items = json_object_get(sec, "items");
    ASSERT_EQ(json_array_size(items), 3);
    const char *keys[] = {"ca.crt", "r1.crt", "r1.key"};
    const char *paths[] = {"ca.crt", "tls.crt", "tls.key"};
    for (int i = 0; i < 3; i++) {
        assert_str(str_at(json_array_get(items, (size_t)i), "key"), keys[i], "secret item key");
        assert_str(str_at(json_array_get(items, (size_t)i), "path"), paths[i], "secret item path");
    }
    ASSERT(!json_object_get(c, "resources")); /* r1 sets resources for peers only */

    /* Peers: stage 1 of a 4-layer model in 2 stages serves layers 2:4. */
    const json_t *p = pod(&d, "tiny-bible-r2-s1-1");
    const json_t *l = json_object_get(json_object_get(p, "metadata"), "labels");
    assert_str(str_at(l, CIRRUS_LABEL_STAGE), "1", "stage label");
    assert_str(str_at(l, CIRRUS_LABEL_INDEX), "1", "index label");
    assert_str(arg_of(p, "--serve"), "2:4", "--serve");
    assert_str(arg_of(p, "--stage-index"), "1", "--stage-index");
    assert_str(arg_of(p, "--name"), "$(POD_NAME)", "--name"); /* kept by a replacement */
    assert_str(arg_of(p, "--listen"), "0.0.0.0:7500", "peer --listen");
    assert_str(arg_of(p, "--advertise"), "$(POD_IP)", "--advertise");
    assert_str(arg_of(p, "--ring-addr"), "$(POD_IP):7501", "--ring-addr");
    assert_str(arg_of(p, "--coordinator"), "tiny-bible-r2-gw.train.svc:7400", "--coordinator");
    assert_str(arg_of(p, "--model"), "tiny", "--model");
    assert_str(arg_of(p, "--batch"), "8", "--batch");
    assert_str(arg_of(p, "--seed"), "1337", "--seed");
    ASSERT(!arg_of(p, "--seq"));
    ASSERT(!arg_of(p, "--layers")); /* the preset's */
    ASSERT(!json_object_get(container(p), "resources")); /* r2 sets none */
    assert_str(arg_of(pod(&d, "tiny-bible-r1-s0-1"), "--serve"), "0:2", "--serve stage 0");
    const json_t *res = json_object_get(container(pod(&d, "tiny-bible-r1-s0-0")), "resources");
    assert_str(str_at(json_object_get(res, "requests"), "memory"), "2Gi", "peer requests");
    assert_str(str_at(json_object_get(res, "limits"), "memory"), "4Gi", "peer limits");
    /* Peers of one stage run the same spec. */
    assert_str(hash_of(pod(&d, "tiny-bible-r1-s0-0")), hash_of(pod(&d, "tiny-bible-r1-s0-1")),
               "same-stage hashes");
    ASSERT(strcmp(hash_of(pod(&d, "tiny-bible-r1-s0-0")), hash_of(pod(&d, "tiny-bible-r1-s1-0"))));

    /* Client. */
    p = pod(&d, "tiny-bible-r1-c0");
    assert_str(arg_of(p, "--coordinator"), "tiny-bible-r1-gw.train.svc:7400", "client --coord");
    assert_str(arg_of(p, "--steps"), "3000", "--steps");
    assert_str(arg_of(p, "--model"), "tiny", "client --model");
    assert_str(arg_of(p, "--batch"), "8", "client --batch");
    assert_str(arg_of(p, "--seed"), "1337", "client --seed");
    ASSERT(!arg_of(p, "--data"));
    ASSERT(!arg_of(p, "--serve"));
    ASSERT(!arg_of(p, "--clients")); /* a lone client needs no share */
    /* Its summary goes where the kubelet reads the termination message from, as a file. */
    assert_str(arg_of(p, "--summary-file"), "/dev/termination-log", "client --summary-file");
    assert_str(str_at(container(p), "terminationMessagePath"), "/dev/termination-log",
               "client terminationMessagePath");
    assert_str(str_at(container(p), "terminationMessagePolicy"), "FallbackToLogsOnError",
               "client terminationMessagePolicy");
    ASSERT(!arg_of(pod(&d, "tiny-bible-r1-s0-0"), "--summary-file"));
    l = json_object_get(json_object_get(p, "metadata"), "labels");
    ASSERT(!json_object_get(l, CIRRUS_LABEL_STAGE));
    assert_str(str_at(l, CIRRUS_LABEL_INDEX), "0", "client index label");
    /* No checkpoint volume in the spec: an emptyDir at /checkpoints. */
    vol = json_array_get(json_object_get(json_object_get(p, "spec"), "volumes"), 0);
    ASSERT(json_is_object(json_object_get(vol, "emptyDir")));
    mount = json_array_get(json_object_get(container(p), "volumeMounts"), 0);
    assert_str(str_at(mount, "mountPath"), "/checkpoints", "checkpoint mount");

    desired_job_free(&d);
    json_decref(job);
}

TEST(desired_services_secret_dns)
{
    json_t *job = sample_job();
    desired_job d;
    cirrus_error err = {0};
    if (desired_build(job, &d, &err)) TEST_FAIL("desired_build: %s", err.msg);
    ASSERT_EQ(json_object_size(d.services), 2);
    const char *regions[] = {"r1", "r2"};
    for (int k = 0; k < 2; k++) {
        char name[64];
        snprintf(name, sizeof name, "tiny-bible-%s-gw", regions[k]);
        const json_t *svc = json_object_get(d.services, name);
        if (!svc) TEST_FAIL("no service %s", name);
        check_meta(svc, "Service", name, regions[k], "gateway");
        const json_t *spec = json_object_get(svc, "spec");
        assert_str(str_at(spec, "type"), "ClusterIP", "service type");
        const json_t *sel = json_object_get(spec, "selector");
        ASSERT_EQ(json_object_size(sel), 3);
        /* The selector picks the region's gateway Pod and nothing else. */
        const char *k2;
        const json_t *v2;
        json_object_foreach((json_t *)sel, k2, v2) {
            const json_t *plabels = json_object_get(
                json_object_get(json_object_get(d.pods, name), "metadata"), "labels");
            assert_str(str_at(plabels, k2), json_string_value(v2), "selector matches gw pod");
        }
        assert_str(str_at(sel, CIRRUS_LABEL_ROLE), "gateway", "selector role");
        const json_t *ports = json_object_get(spec, "ports");
        ASSERT_EQ(json_array_size(ports), 3);
        assert_str(str_at(json_array_get(ports, 0), "name"), "coord", "svc port");
        ASSERT_EQ(json_integer_value(json_object_get(json_array_get(ports, 0), "port")), 7400);
        assert_str(str_at(json_array_get(ports, 1), "name"), "http", "svc port");
        ASSERT_EQ(json_integer_value(json_object_get(json_array_get(ports, 1), "port")), 7480);
        /* Two regions: the other region's gateway reaches this one on "wan". */
        assert_str(str_at(json_array_get(ports, 2), "name"), "wan", "svc port");
        assert_str(str_at(json_array_get(ports, 2), "protocol"), "TCP", "svc wan protocol");
        ASSERT_EQ(json_integer_value(json_object_get(json_array_get(ports, 2), "port")), 7443);
        assert_str(str_at(json_array_get(ports, 2), "targetPort"), "wan", "svc wan targetPort");
    }

    check_meta(d.secret, "Secret", "tiny-bible-pki", NULL, NULL);
    assert_str(str_at(d.secret, "type"), "Opaque", "secret type");
    ASSERT(!json_object_get(d.secret, "data"));
    ASSERT(!json_object_get(json_object_get(json_object_get(d.secret, "metadata"), "labels"),
                            CIRRUS_LABEL_REGION));

    json_t *dns = desired_gateway_dns_names(job, "r2");
    ASSERT(dns && json_array_size(dns) == 4);
    const char *want[] = {"tiny-bible-r2-gw", "tiny-bible-r2-gw.train",
                          "tiny-bible-r2-gw.train.svc", "tiny-bible-r2-gw.train.svc.cluster.local"};
    for (int i = 0; i < 4; i++)
        assert_str(json_string_value(json_array_get(dns, (size_t)i)), want[i], "dns name");
    json_decref(dns);
    ASSERT(desired_gateway_dns_names(job, "R2") == NULL);
    ASSERT(desired_gateway_dns_names(job, NULL) == NULL);

    /* Suspended: no Pods, Services and the Secret stay. */
    json_object_set_new(spec_of(job), "suspend", json_true());
    desired_job_free(&d);
    ASSERT_OK(desired_build(job, &d, &err));
    ASSERT_EQ(json_object_size(d.pods), 0);
    ASSERT_EQ(json_object_size(d.services), 2);
    ASSERT(d.secret);
    desired_job_free(&d);
    json_decref(job);
}

TEST(desired_spec_hash)
{
    json_t *job = sample_job();
    desired_job a, b;
    cirrus_error err = {0};
    ASSERT_OK(desired_build(job, &a, &err));
    ASSERT_OK(desired_build(job, &b, &err));
    ASSERT(json_equal(a.pods, b.pods));
    const char *k;
    const json_t *v;
    json_object_foreach(a.pods, k, v)
        assert_str(hash_of(v), hash_of(json_object_get(b.pods, k)), "hash stable");
    desired_job_free(&b);

    /* Key order of the input does not matter (the spec is hashed with sorted keys). */
    json_t *copy = json_object();
    const char *order[] = {"spec", "metadata", "kind", "apiVersion"};
    for (int i = 0; i < 4; i++) json_object_set(copy, order[i], json_object_get(job, order[i]));
    ASSERT_OK(desired_build(copy, &b, &err));
    json_object_foreach(a.pods, k, v)
        assert_str(hash_of(v), hash_of(json_object_get(b.pods, k)), "hash order-independent");
    desired_job_free(&b);
    json_decref(copy);

    /* A new image changes every Pod's hash. */
    json_object_set_new(spec_of(job), "image", json_string("cirrus:v2"));
    ASSERT_OK(desired_build(job, &b, &err));
    json_object_foreach(a.pods, k, v) {
        const char *h = hash_of(json_object_get(b.pods, k));
        if (strcmp(hash_of(v), h) == 0) TEST_FAIL("%s: hash %s unchanged by the image", k, h);
    }
    desired_job_free(&b);
    desired_job_free(&a);
    json_decref(job);
}

/* Every pod meets the restricted Pod Security Standard (podsecurity_test.sh has the API
 * server's own verdict): non-root as the image's user, RuntimeDefault seccomp, no privilege
 * escalation, no capabilities, no ServiceAccount token. */
TEST(desired_pods_restricted)
{
    json_t *job = sample_job();
    desired_job d = {0};
    cirrus_error err = {0};
    ASSERT_OK(desired_build(job, &d, &err));
    ASSERT_EQ(json_object_size(d.pods), 12);
    const char *name;
    const json_t *p;
    json_object_foreach(d.pods, name, p)
    {
        const json_t *spec = json_object_get(p, "spec");
        if (!json_is_false(json_object_get(spec, "automountServiceAccountToken")))
            TEST_FAIL("%s: automountServiceAccountToken is not false", name);
        const json_t *psc = json_object_get(spec, "securityContext");
        ASSERT(json_is_true(json_object_get(psc, "runAsNonRoot")));
        ASSERT_EQ(json_integer_value(json_object_get(psc, "runAsUser")), DESIRED_RUN_AS);
        ASSERT_EQ(json_integer_value(json_object_get(psc, "runAsGroup")), DESIRED_RUN_AS);
        ASSERT_EQ(json_integer_value(json_object_get(psc, "fsGroup")), DESIRED_RUN_AS);
        assert_str(str_at(json_object_get(psc, "seccompProfile"), "type"), "RuntimeDefault",
                   name);
        const json_t *csc = json_object_get(container(p), "securityContext");
        ASSERT(json_is_false(json_object_get(csc, "allowPrivilegeEscalation")));
        const json_t *drop = json_object_get(json_object_get(csc, "capabilities"), "drop");
        ASSERT_EQ(json_array_size(drop), 1);
        assert_str(json_string_value(json_array_get(drop, 0)), "ALL", name);
        ASSERT(!json_object_get(json_object_get(csc, "capabilities"), "add"));
    }
    desired_job_free(&d);
    json_decref(job);
}

/* The split `cirrus-trainer local` makes (trainer/cmd/local.c, roles_cmd_local). */
static void local_split(int n_layer, int n_stages, int s, int *l0, int *l1)
{
    *l0 = s * n_layer / n_stages;
    *l1 = (s + 1) * n_layer / n_stages;
}

TEST(role_stage_layers_like_local)
{
    for (int L = 1; L <= 40; L++)
        for (int S = 1; S <= L && S <= 64; S++) {
            int prev = 0;
            for (int s = 0; s < S; s++) {
                int a, b, la, lb;
                ASSERT_OK(role_stage_layers(L, S, s, &a, &b));
                local_split(L, S, s, &la, &lb);
                ASSERT_EQ(a, la);
                ASSERT_EQ(b, lb);
                ASSERT_EQ(a, prev); /* contiguous, non-empty, covering [0, L) */
                ASSERT(b > a);
                prev = b;
            }
            ASSERT_EQ(prev, L);
        }
    /* Uneven cuts, spelled out. */
    const int cases[][5] = {
        {4, 2, 1, 2, 4}, {4, 3, 0, 0, 1}, {4, 3, 1, 1, 2}, {4, 3, 2, 2, 4},
        {5, 2, 0, 0, 2}, {5, 2, 1, 2, 5}, {6, 4, 1, 1, 3}, {6, 4, 3, 4, 6},
        {1024, 64, 63, 1008, 1024}, {7, 7, 6, 6, 7},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int a, b;
        ASSERT_OK(role_stage_layers(cases[i][0], cases[i][1], cases[i][2], &a, &b));
        if (a != cases[i][3] || b != cases[i][4])
            TEST_FAIL("L=%d S=%d stage %d: %d:%d, want %d:%d", cases[i][0], cases[i][1],
                      cases[i][2], a, b, cases[i][3], cases[i][4]);
    }
    int a, b;
    ASSERT(role_stage_layers(4, 5, 0, &a, &b) != 0);
    ASSERT(role_stage_layers(4, 0, 0, &a, &b) != 0);
    ASSERT(role_stage_layers(4, 2, 2, &a, &b) != 0);
    ASSERT(role_stage_layers(4, 2, -1, &a, &b) != 0);
}
