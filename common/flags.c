/* flags: see flags.h. */
#include "flags.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int parse_number(const flag_spec *f, const char *text, cirrus_error *err)
{
    char *end = NULL;
    errno = 0;
    if (f->type == FLAG_U64) { /* full 64-bit range: no detour through double */
        /* Digits only: strtoull skips leading blanks and takes a sign, so " -1" would be
         * 2^64 - 1. */
        unsigned long long u = strtoull(text, &end, 10);
        if (!isdigit((unsigned char)text[0]) || errno || end == text || *end != '\0')
            return cirrus_fail(err, CIRRUS_EINVAL, "--%s: '%s' is not a valid number", f->name,
                               text);
        *(uint64_t *)f->dst = (uint64_t)u;
        return 0;
    }
    double v;
    if (f->type == FLAG_FLOAT)
        v = strtod(text, &end);
    else
        v = (double)strtoll(text, &end, 10);
    if (errno || end == text || *end != '\0' || !isfinite(v))
        return cirrus_fail(err, CIRRUS_EINVAL, "--%s: '%s' is not a valid number", f->name,
                           text);
    if (v < f->min || v > f->max)
        return cirrus_fail(err, CIRRUS_EINVAL, "--%s must be in [%g, %g], got %s", f->name,
                           f->min, f->max, text);
    switch (f->type) {
    case FLAG_INT: *(int *)f->dst = (int)v; break;
    case FLAG_FLOAT: *(float *)f->dst = (float)v; break;
    default: break;
    }
    return 0;
}

/* A boolean's value after '=': true/1 or false/0. */
static int parse_bool(const flag_spec *f, const char *val, cirrus_error *err)
{
    if (!strcmp(val, "true") || !strcmp(val, "1")) *(int *)f->dst = 1;
    else if (!strcmp(val, "false") || !strcmp(val, "0")) *(int *)f->dst = 0;
    else return cirrus_fail(err, CIRRUS_EINVAL, "--%s: '%s' is not true or false", f->name, val);
    return 0;
}

int flags_parse(flag_spec *flags, int n, int argc, char **argv, cirrus_error *err)
{
    for (int i = 0; i < argc; i++) {
        const char *arg = argv[i];
        if (strncmp(arg, "--", 2) != 0)
            return cirrus_fail(err, CIRRUS_EINVAL, "unexpected argument '%s'", arg);
        const char *name = arg + 2, *eq = strchr(name, '=');
        const size_t len = eq ? (size_t)(eq - name) : strlen(name);
        flag_spec *f = NULL;
        for (int k = 0; k < n; k++)
            if (strlen(flags[k].name) == len && strncmp(flags[k].name, name, len) == 0)
                f = &flags[k];
        if (!f)
            return cirrus_fail(err, CIRRUS_EINVAL, "unknown flag '--%.*s'", (int)len, name);
        f->seen = 1;
        if (f->type == FLAG_BOOL) {
            if (eq) {
                int rc = parse_bool(f, eq + 1, err);
                if (rc) return rc;
            } else {
                *(int *)f->dst = 1;
            }
            continue;
        }
        if (!eq && i + 1 >= argc)
            return cirrus_fail(err, CIRRUS_EINVAL, "--%s needs a value", f->name);
        const char *val = eq ? eq + 1 : argv[++i];
        if (f->type == FLAG_STR || f->type == FLAG_STR_LIST) {
            if (!*val)
                return cirrus_fail(err, CIRRUS_EINVAL, "--%s needs a non-empty value", f->name);
            if (f->type == FLAG_STR) {
                *(const char **)f->dst = val;
                continue;
            }
            flag_str_list *l = f->dst;
            if (l->n == FLAG_LIST_MAX)
                return cirrus_fail(err, CIRRUS_EINVAL, "--%s given more than %d times", f->name,
                                   FLAG_LIST_MAX);
            l->items[l->n++] = val;
        } else {
            if (f->type == FLAG_U64 && val[0] == '-')
                return cirrus_fail(err, CIRRUS_EINVAL, "--%s must not be negative", f->name);
            int rc = parse_number(f, val, err);
            if (rc) return rc;
        }
    }
    return 0;
}

void flags_usage(const flag_spec *flags, int n)
{
    for (int k = 0; k < n; k++) {
        char left[48];
        snprintf(left, sizeof left, "--%s%s", flags[k].name,
                 flags[k].type == FLAG_BOOL ? "" : " X");
        fprintf(stderr, "  %-22s %s\n", left, flags[k].help);
    }
}

int flags_seen(const flag_spec *flags, int n, const char *name)
{
    for (int k = 0; k < n; k++)
        if (strcmp(flags[k].name, name) == 0) return flags[k].seen;
    return 0;
}
