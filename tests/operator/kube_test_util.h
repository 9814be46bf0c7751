/* kube_test_util: helpers shared by the operator's client tests (test_kube_util.c): a
 * client for the test control plane, scratch namespaces and CRDs cleaned up at exit,
 * polling, and a scripted HTTP server for responses the real API server will not give. */
#ifndef CIRRUS_KUBE_TEST_UTIL_H
#define CIRRUS_KUBE_TEST_UTIL_H

#include <jansson.h>
#include <stddef.h>

#include "../../operator/kube/client.h"
#include "../../operator/kube/config.h"

kube_client *tk_client(kube_config **cfg_out);
void tk_client_free(kube_client *c, kube_config *cfg);
void tk_namespace(kube_client *c, const char *prefix, char *ns, size_t n);
json_t *tk_configmap(const char *ns, const char *name, const char *key, const char *value);
int tk_poll_until(kube_client *c, int (*done)(void *), void *ctx, int timeout_ms);
void tk_crd(kube_client *c, const char *tag, char *group, size_t n);

typedef struct tk_fake tk_fake;
tk_fake *tk_fake_new(void);
void tk_fake_route(tk_fake *f, const char *match, int status, const char *headers,
                   const char *body, int hold);
int tk_fake_run(tk_fake *f);
int tk_fake_served(tk_fake *f);
void tk_fake_stop(tk_fake *f);
kube_config *tk_fake_config(int port);

#endif
