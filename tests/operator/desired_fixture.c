/* desired_fixture: see desired_fixture.h. */
#include "desired_fixture.h"

#include <stdio.h>
#include <string.h>

#include "../../common/role_args.h"
#include "../unit/test.h"

json_t *sample_job(void)
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

json_t *spec_of(json_t *job)
{
    return json_object_get(job, "spec");
}

const char *str_at(const json_t *obj, const char *key)
{
    return json_string_value(json_object_get(obj, key));
}

/* A container's args joined by spaces (a buffer). */
const char *args_of(const json_t *pod)
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
const char *arg_of(const json_t *pod, const char *flag)
{
    const json_t *spec = json_object_get(pod, "spec");
    const json_t *c = json_array_get(json_object_get(spec, "containers"), 0);
    const json_t *args = json_object_get(c, "args");
    for (size_t i = 0; i + 1 < json_array_size(args); i++)
        if (strcmp(json_string_value(json_array_get(args, i)), flag) == 0)
            return json_string_value(json_array_get(args, i + 1));
    return NULL;
}

void assert_str(const char *got, const char *want, const char *what)
{
    if (!got || strcmp(got, want) != 0)
        TEST_FAIL("%s: got '%s', want '%s'", what, got ? got : "(null)", want);
}

void check_meta(const json_t *obj, const char *kind, const char *name, const char *region,
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

const json_t *pod(const desired_job *d, const char *name)
{
    const json_t *p = json_object_get(d->pods, name);
    if (!p) TEST_FAIL("no pod %s", name);
    return p;
}

const json_t *container(const json_t *p)
{
    return json_array_get(json_object_get(json_object_get(p, "spec"), "containers"), 0);
}

const char *hash_of(const json_t *p)
{
    return str_at(json_object_get(json_object_get(p, "metadata"), "annotations"),
                  CIRRUS_ANNOT_SPEC_HASH);
}

/* desired_build fails with CIRRUS_EINVAL and a message containing `field`. */
void expect_invalid(json_t *job, const char *field)
{
    desired_job d = {(json_t *)1, (json_t *)1, (json_t *)1, (json_t *)1, "", NULL};
    cirrus_error err = {0};
    int rc = desired_build(job, &d, &err);
    if (rc != CIRRUS_EINVAL) TEST_FAIL("%s: desired_build returned %d, want EINVAL", field, rc);
    if (!strstr(err.msg, field)) TEST_FAIL("message '%s' does not name %s", err.msg, field);
    ASSERT(!d.pods && !d.services && !d.pod_groups && !d.secret);
    json_decref(job);
}

json_t *gateway_spec(json_t *job)
{
    return json_object_get(spec_of(job), "gateway");
}

/* A port named `name` in a container's ports ("containerPort") or a Service's ("port"): its
 * number, or -1. */
long long port_named(const json_t *ports, const char *name, const char *field)
{
    size_t i;
    const json_t *p;
    json_array_foreach(ports, i, p) if (!strcmp(str_at(p, "name"), name))
        return (long long)json_integer_value(json_object_get(p, field));
    return -1;
}
