/* flags: a small table-driven command-line parser shared by cirrus-operator and every
 * cirrus-trainer subcommand. Each flag names its type, destination and bounds; anything
 * unknown, missing a value, malformed or out of range is refused with a one-line message
 * naming the flag. Values follow as the next argument or after '=' ("--port 80" or
 * "--port=80", as Kubernetes manifests spell them; a boolean takes "=true" or "=false"). */
#ifndef CIRRUS_FLAGS_H
#define CIRRUS_FLAGS_H

#include <stdint.h>

#include "cerr.h"

enum flag_type { FLAG_INT, FLAG_U64, FLAG_FLOAT, FLAG_STR, FLAG_BOOL, FLAG_STR_LIST };

/* The destination of a FLAG_STR_LIST flag: every value given, in order (the flag may be
 * repeated; more than FLAG_LIST_MAX values are refused). */
#define FLAG_LIST_MAX 64
typedef struct flag_str_list {
    const char *items[FLAG_LIST_MAX];
    int n;
} flag_str_list;

typedef struct flag_spec {
    const char *name; /* without the leading "--" */
    enum flag_type type;
    void *dst;        /* int*, uint64_t*, float*, const char**, int* (bool), flag_str_list* */
    double min, max;  /* bounds for numbers (inclusive) */
    const char *help;
    int seen;         /* set by flags_parse */
} flag_spec;

/* The number of entries of a flag table array. */
#define NFLAGS(f) ((int)(sizeof(f) / sizeof((f)[0])))

/* Parse argv[0..argc) (no program or subcommand name) into the table. */
int flags_parse(flag_spec *flags, int n, int argc, char **argv, cirrus_error *err);
/* Print "  --name  help" lines. */
void flags_usage(const flag_spec *flags, int n);
/* Was the flag given on the command line? */
int flags_seen(const flag_spec *flags, int n, const char *name);

#endif
