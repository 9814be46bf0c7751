#include "yamljson.h"

#include <stdlib.h>
#include <string.h>

#include <yaml.h>

/* Deeper nesting than this is not a kubeconfig: refuse it rather than recurse without end. */
#define YAML_MAX_DEPTH 64

/* One open container and, for a mapping, the key waiting for its value. */
struct frame {
    json_t *node;
    char *key;
};

static json_t *scalar_value(const yaml_event_t *ev)
{
    const char *v = (const char *)ev->data.scalar.value;
    size_t n = ev->data.scalar.length;
    if (ev->data.scalar.style == YAML_PLAIN_SCALAR_STYLE) {
        if (!strcmp(v, "true") || !strcmp(v, "True") || !strcmp(v, "TRUE")) return json_true();
        if (!strcmp(v, "false") || !strcmp(v, "False") || !strcmp(v, "FALSE"))
            return json_false();
        if (n == 0 || !strcmp(v, "~") || !strcmp(v, "null") || !strcmp(v, "Null") ||
            !strcmp(v, "NULL"))
            return json_null();
        size_t i = (v[0] == '-' || v[0] == '+') ? 1 : 0;
        if (i < n && n - i <= 18) {
            size_t j = i;
            while (j < n && v[j] >= '0' && v[j] <= '9') j++;
            if (j == n) return json_integer(strtoll(v, NULL, 10));
        }
    }
    return json_stringn(v, n);
}

/* Attach a finished value to the container on top of the stack (steals value). */
static int attach(struct frame *top, json_t *value, json_t **root)
{
    if (!top) {
        *root = value;
        return 0;
    }
    if (json_is_array(top->node)) return json_array_append_new(top->node, value);
    if (!top->key) {
        /* A mapping key: only scalars are valid kubeconfig keys. */
        if (!json_is_string(value)) {
            json_decref(value);
            return -1;
        }
        top->key = strdup(json_string_value(value));
        json_decref(value);
        return top->key ? 0 : -1;
    }
    int rc = json_object_set_new(top->node, top->key, value);
    free(top->key);
    top->key = NULL;
    return rc;
}

int kube_yaml_parse(const char *text, size_t len, const char *name, json_t **out,
                    cirrus_error *err)
{
    yaml_parser_t parser;
    yaml_event_t ev;
    struct frame stack[YAML_MAX_DEPTH];
    int depth = 0, rc = 0, done = 0;
    json_t *root = NULL;

    *out = NULL;
    if (!yaml_parser_initialize(&parser)) return cirrus_fail(err, CIRRUS_ENOMEM, "%s: yaml", name);
    yaml_parser_set_input_string(&parser, (const unsigned char *)text, len);
    while (!done) {
        if (!yaml_parser_parse(&parser, &ev)) {
            rc = cirrus_fail(err, CIRRUS_ECORRUPT, "%s:%zu:%zu: %s", name,
                             parser.problem_mark.line + 1, parser.problem_mark.column + 1,
                             parser.problem ? parser.problem : "invalid YAML");
            goto out;
        }
        struct frame *top = depth ? &stack[depth - 1] : NULL;
        size_t line = ev.start_mark.line + 1;
        switch (ev.type) {
        case YAML_SCALAR_EVENT: {
            json_t *v = scalar_value(&ev);
            if (!v || attach(top, v, &root)) {
                rc = cirrus_fail(err, CIRRUS_ECORRUPT, "%s:%zu: bad scalar or key", name, line);
            }
            break;
        }
        case YAML_SEQUENCE_START_EVENT:
        case YAML_MAPPING_START_EVENT:
            if (depth == YAML_MAX_DEPTH) {
                rc = cirrus_fail(err, CIRRUS_ECORRUPT, "%s:%zu: nested too deep", name, line);
                break;
            }
            if (top && json_is_object(top->node) && !top->key) {
                rc = cirrus_fail(err, CIRRUS_ECORRUPT, "%s:%zu: non-scalar key", name, line);
                break;
            }
            stack[depth].node = ev.type == YAML_MAPPING_START_EVENT ? json_object() : json_array();
            stack[depth].key = NULL;
            if (!stack[depth].node) rc = cirrus_fail(err, CIRRUS_ENOMEM, "%s: yaml", name);
            else depth++;
            break;
        case YAML_SEQUENCE_END_EVENT:
        case YAML_MAPPING_END_EVENT: {
            struct frame f = stack[--depth];
            free(f.key);
            if (attach(depth ? &stack[depth - 1] : NULL, f.node, &root))
                rc = cirrus_fail(err, CIRRUS_ECORRUPT, "%s:%zu: bad key", name, line);
            break;
        }
        case YAML_ALIAS_EVENT:
            rc = cirrus_fail(err, CIRRUS_ECORRUPT, "%s:%zu: YAML aliases are not supported",
                             name, line);
            break;
        case YAML_DOCUMENT_END_EVENT:
        case YAML_STREAM_END_EVENT:
            done = 1; /* the first document only */
            break;
        default:
            break;
        }
        yaml_event_delete(&ev);
        if (rc) goto out;
    }
    *out = root ? root : json_null();
    root = NULL;
out:
    while (depth > 0) {
        depth--;
        free(stack[depth].key);
        json_decref(stack[depth].node);
    }
    json_decref(root);
    yaml_parser_delete(&parser);
    return rc;
}
