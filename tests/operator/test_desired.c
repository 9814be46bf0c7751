/* desired: the children of a SwarmJob (no cluster needed; run with `operator-tests desired`).
 * The job is manifests/samples/swarmjob.yaml with the CRD's defaults applied by hand. */
#include <stdarg.h>
#include <string.h>

#include "../../common/role_args.h"
#include "../../operator/desired.h"
#include "../unit/test.h"

static json_t *sample_job(void)
{
    json_error_t e;
    json_t *j = json_loads(
        "{\"apiVersion\":\"cirrus.dev/v1alpha1\",\"kind\":\"SwarmJob\","
        " \"metadata\":{\"name\":\"tiny-bible\",\"namespace\":\"train\","
        "  \"uid\":\"6f1c2a9e-0000-4000-8000-000000000001\",\"generation\":1},"
        " \"spec\":{\"image\":\"cirrus:latest\",\"imagePullPolicy\":\"IfNotPresent\","
        "  \"suspend\":false,\"steps\":3000,\"model\":{\"preset\":\"tiny\"},"
        "  \"pipeline\":{\"stages\":2},"
        "  \"regions\":["
        "   {\"name\":\"r1\",\"peers\":{\"replicas\":2,\"min\":1,\"max\":4},\"clients\":1,"
        "    \"placement\":{\"regionLabel\":\"topology.kubernetes.io/region\","
        "     \"nodeSelector\":{\"cirrus.dev/pool\":\"spot\"},"
        "     \"tolerations\":[{\"key\":\"cirrus.dev/spot\",\"operator\":\"Exists\","
        "                      \"effect\":\"NoSchedule\"}]},"
        "    \"resources\":{\"peer\":{\"requests\":{\"cpu\":\"2\",\"memory\":\"2Gi\"},"
        "                             \"limits\":{\"memory\":\"4Gi\"}}}},"
        "   {\"name\":\"r2\",\"peers\":{\"replicas\":2,\"min\":1},\"clients\":1,"
        "    \"placement\":{\"regionLabel\":\"topology.kubernetes.io/region\","
        "     \"nodeSelector\":{\"cirrus.dev/pool\":\"spot\"},"
        "     \"tolerations\":[{\"key\":\"cirrus.dev/spot\",\"operator\":\"Exists\","
        "                      \"effect\":\"NoSchedule\"}]}}],"
        "  \"gateway\":{\"codec\":\"q8\",\"syncEvery\":100,\"outerLearningRate\":0.7,"
        "             \"outerMomentum\":0.9,\"wanPort\":7443,\"serviceType\":\"ClusterIP\","
        "             \"port\":7400},"
        "  \"data\":{\"batchSize\":8,\"seed\":1337},"
        "  \"checkpoint\":{\"every\":200},"
        "  \"runPolicy\":{\"backoffLimit\":4,\"ttlSecondsAfterFinished\":86400}}}",
        0, &e);
    if (!j) TEST_FAIL("sample job: %s (line %d)", e.text, e.line);
    return j;
}

static json_t *spec_of(json_t *job)
{
    return json_object_get(job, "spec");
}

static const char *str_at(const json_t *obj, const char *key)
{
    return json_string_value(json_object_get(obj, key));
}

/* A container's args joined by spaces (a static buffer). */
static const char *args_of(const json_t *pod)
{
    static char buf[8192];
    const json_t *spec = json_object_get(pod, "spec");
    const json_t *c = json_array_get(json_object_get(spec, "containers"), 0);
    const json_t *args = json_object_get(c, "args");
    size_t len = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < json_array_size(args); i++)
        len += (size_t)snprintf(buf + len, sizeof buf - len, "%s%s", i ? " " : "",
                                json_string_value(json_array_get(args, i)));
    return buf;
}

/* "--flag" value in a container's args; NULL when absent. */
static const char *arg_of(const json_t *pod, const char *flag)
{
    const json_t *spec = json_object_get(pod, "spec");
    const json_t *c = json_array_get(json_object_get(spec, "containers"), 0);
    const json_t *args = json_object_get(c, "args");
    for (size_t i = 0; i + 1 < json_array_size(args); i++)
        if (strcmp(json_string_value(json_array_get(args, i)), flag) == 0)
            return json_string_value(json_array_get(args, i + 1));
    return NULL;
}

static void assert_str(const char *got, const char *want, const char *what)
{
    if (!got || strcmp(got, want) != 0)
        TEST_FAIL("%s: got '%s', want '%s'", what, got ? got : "(null)", want);
}

static void check_meta(const json_t *obj, const char *kind, const char *name, const char *region,
                       const char *role)
{
    assert_str(str_at(obj, "kind"), kind, "kind");
    const json_t *m = json_object_get(obj, "metadata");
    assert_str(str_at(m, "name"), name, "metadata.name");
    assert_str(str_at(m, "namespace"), "train", "metadata.namespace");
    const json_t *l = json_object_get(m, "labels");
    assert_str(str_at(l, CIRRUS_LABEL_JOB), "tiny-bible", name);
    assert_str(str_at(l, "app.kubernetes.io/name"), "cirrus", name);
    assert_str(str_at(l, "app.kubernetes.io/managed-by"), "cirrus-operator", name);
    if (region) assert_str(str_at(l, CIRRUS_LABEL_REGION), region, name);
    if (role) assert_str(str_at(l, CIRRUS_LABEL_ROLE), role, name);
    const json_t *refs = json_object_get(m, "ownerReferences");
    ASSERT_EQ(json_array_size(refs), 1);
    const json_t *r = json_array_get(refs, 0);
    assert_str(str_at(r, "apiVersion"), "cirrus.dev/v1alpha1", "owner apiVersion");
    assert_str(str_at(r, "kind"), "SwarmJob", "owner kind");
    assert_str(str_at(r, "name"), "tiny-bible", "owner name");
    assert_str(str_at(r, "uid"), "6f1c2a9e-0000-4000-8000-000000000001", "owner uid");
    ASSERT(json_is_true(json_object_get(r, "controller")));
    ASSERT(json_is_true(json_object_get(r, "blockOwnerDeletion")));
}

static const json_t *pod(const desired_job *d, const char *name)
{
    const json_t *p = json_object_get(d->pods, name);
    if (!p) TEST_FAIL("no pod %s", name);
    return p;
}

static const json_t *container(const json_t *p)
{
    return json_array_get(json_object_get(json_object_get(p, "spec"), "containers"), 0);
}

static const char *hash_of(const json_t *p)
{
    return str_at(json_object_get(json_object_get(p, "metadata"), "annotations"),
                  CIRRUS_ANNOT_SPEC_HASH);
}

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
        ASSERT_EQ(json_array_size(env), 2);
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

    const json_t *svc = json_object_get(d.services, "tiny-bible-r1-gw");
    assert_str(str_at(json_object_get(svc, "spec"), "type"), "LoadBalancer", "serviceType");
    ASSERT_EQ(json_integer_value(json_object_get(
                  json_array_get(json_object_get(json_object_get(svc, "spec"), "ports"), 0),
                  "port")),
              8400);
    assert_str(str_at(json_object_get(json_object_get(svc, "metadata"), "annotations"), "lb"),
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
     * is (several clients per region are for jobs of one region: no outer steps). */
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

/* desired_build fails with CIRRUS_EINVAL and a message containing `field`. */
static void expect_invalid(json_t *job, const char *field)
{
    desired_job d = {(json_t *)1, (json_t *)1, (json_t *)1};
    cirrus_error err = {0};
    int rc = desired_build(job, &d, &err);
    if (rc != CIRRUS_EINVAL) TEST_FAIL("%s: desired_build returned %d, want EINVAL", field, rc);
    if (!strstr(err.msg, field)) TEST_FAIL("message '%s' does not name %s", err.msg, field);
    ASSERT(!d.pods && !d.services && !d.secret);
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

/* ---- outer steps across regions ---------------------------------------------------------- */

static json_t *gateway_spec(json_t *job)
{
    return json_object_get(spec_of(job), "gateway");
}

/* A port named `name` in a container's ports ("containerPort") or a Service's ("port"): its
 * number, or -1. */
static long long port_named(const json_t *ports, const char *name, const char *field)
{
    size_t i;
    const json_t *p;
    json_array_foreach(ports, i, p) if (!strcmp(str_at(p, "name"), name))
        return (long long)json_integer_value(json_object_get(p, field));
    return -1;
}

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
               "--http-port 7480 --stages 2 --layers 4 --model tiny --sync-every 100 "
               "--region r1 --regions r1=tiny-bible-r1-gw.train.svc:7443,"
               "r2=tiny-bible-r2-gw.train.svc:7443 --wan-listen 0.0.0.0:7443 "
               "--tls-dir /etc/cirrus/tls --codec q8 --outer-lr 0.7 --outer-momentum 0.9",
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
               "--coordinator tiny-bible-r2-gw.train.svc:7400 --steps 3000 --sync-every 100 "
               "--model tiny --batch 8 --seed 1337",
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
    json_object_set_new(spec_of(job), "model",
                        json_pack("{s:s, s:i, s:i, s:i, s:i}", "preset", "small", "layers", 5,
                                  "width", 256, "heads", 8, "context", 64));
    json_array_append_new(json_object_get(spec_of(job), "regions"),
                          json_pack("{s:s, s:i}", "name", "eu-west-1", "clients", 1));
    if (desired_build(job, &d, &err)) TEST_FAIL("desired_build: %s", err.msg);
    assert_str(args_of(pod(&d, "tiny-bible-eu-west-1-gw")),
               "--job 6f1c2a9e-0000-4000-8000-000000000001 --listen 0.0.0.0:7400 "
               "--http-port 7480 --stages 2 --layers 5 --model small --width 256 --heads 8 "
               "--context 64 --sync-every 25 --region eu-west-1 "
               "--regions r1=tiny-bible-r1-gw.train.svc:9443,r2=tiny-bible-r2-gw.train.svc:9443,"
               "eu-west-1=tiny-bible-eu-west-1-gw.train.svc:9443 --wan-listen 0.0.0.0:9443 "
               "--tls-dir /etc/cirrus/tls --codec topk:0.01:8+zstd --outer-lr 1 "
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
    /* Fields left out (an object from an older CRD): the CRD's defaults. */
    json_object_set_new(spec_of(job), "gateway", json_object());
    ASSERT_OK(desired_build(job, &d, &err));
    const json_t *gp = pod(&d, "tiny-bible-r1-gw");
    assert_str(arg_of(gp, "--sync-every"), "100", "default --sync-every");
    assert_str(arg_of(gp, "--codec"), "q8", "default --codec");
    assert_str(arg_of(gp, "--wan-listen"), "0.0.0.0:7443", "default --wan-listen");
    assert_str(arg_of(gp, "--outer-lr"), "0.7", "default --outer-lr");
    assert_str(arg_of(gp, "--outer-momentum"), "0.9", "default --outer-momentum");
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
               "--http-port 7480 --stages 2 --layers 4",
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
    /* With more than one region every region has exactly one client. */
    int clients[] = {2, 0, 256};
    for (size_t i = 0; i < sizeof clients / sizeof *clients; i++) {
        j = sample_job();
        json_object_set_new(json_array_get(json_object_get(spec_of(j), "regions"), 1), "clients",
                            json_integer(clients[i]));
        expect_invalid(j, "spec.regions[1].clients");
    }
    j = sample_job();
    json_object_set_new(json_array_get(json_object_get(spec_of(j), "regions"), 0), "clients",
                        json_integer(2));
    expect_invalid(j, "several clients per region cannot yet take part in outer steps");
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
                           "outerMomentum", "outerMomentum", "outerMomentum"};
    json_t *value[] = {json_integer(0), json_integer(1000001), json_real(1.5), json_integer(0),
                       json_real(10.5), json_string("0.7"), json_integer(1), json_real(-0.1),
                       json_real(0.9995), json_null()};
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
