/* kube_yaml: YAML (the first document of a stream) to a jansson tree, with libyaml.
 *
 * kubeconfig files are YAML; turning them into json_t lets the rest of the kube layer read
 * every configuration the same way (json_object_get). Keys are strings; plain scalars
 * true/false, null/~ and decimal integers become JSON booleans, null and integers; all
 * else (quoted scalars included) are strings. Aliases are refused: kubeconfigs do not use
 * them and they are the usual way to blow up a YAML reader.
 */
#ifndef CIRRUS_KUBE_YAMLJSON_H
#define CIRRUS_KUBE_YAMLJSON_H

#include <stddef.h>

#include <jansson.h>

#include "../../common/cerr.h"

/* Parse len bytes of YAML into *out (a new reference; JSON null for an empty document).
 * name (a file name) prefixes error messages, which carry line and column. */
int kube_yaml_parse(const char *text, size_t len, const char *name, json_t **out,
                    cirrus_error *err);

#endif
