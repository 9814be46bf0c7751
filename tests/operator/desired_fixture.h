/* desired_fixture: what the desired tests (test_desired*.c) share: the sample job
 * (manifests/samples/swarmjob.yaml with the CRD's defaults applied by hand) and readers of
 * the manifests desired_build makes. Each fails the calling test (TEST_FAIL) on a missing
 * piece rather than returning NULL where the test needs it. */
#ifndef CIRRUS_DESIRED_FIXTURE_H
#define CIRRUS_DESIRED_FIXTURE_H

#include <jansson.h>

#include "../../operator/desired.h"

/* A fresh copy of the sample job: namespace "train", name "tiny-bible", regions r1 and r2. */
json_t *sample_job(void);
json_t *spec_of(json_t *job);
json_t *gateway_spec(json_t *job);
const char *str_at(const json_t *obj, const char *key);

/* A pod's first container's args joined by spaces (a static buffer). */
const char *args_of(const json_t *pod);
/* The value after "--flag" in a pod's args; NULL when absent. */
const char *arg_of(const json_t *pod, const char *flag);
const json_t *pod(const desired_job *d, const char *name);
const json_t *container(const json_t *pod);
const char *hash_of(const json_t *pod);
/* A port named `name` in a container's ports ("containerPort") or a Service's ("port"): its
 * number, or -1. */
long long port_named(const json_t *ports, const char *name, const char *field);

void assert_str(const char *got, const char *want, const char *what);
/* kind, name, namespace "train", the job's labels (region and role when not NULL) and its
 * controller ownerReference. */
void check_meta(const json_t *obj, const char *kind, const char *name, const char *region,
                const char *role);
/* desired_build refuses job (freed) with CIRRUS_EINVAL and a message naming `field`. */
void expect_invalid(json_t *job, const char *field);

#endif
