/* fuzz_flags: the command-line parser (common/flags.c) every cirrus-trainer subcommand and
 * cirrus-operator use; in a pod its arguments come from a manifest the operator writes
 * from a SwarmJob spec.
 *
 * Input: NUL-separated arguments (at most 32). Parsed into a table with one flag of every
 * type and bounds like the real tables'. Invariants:
 *   an accepted command line leaves every number within its flag's bounds (ints, floats
 *   finite), a u64 given as text without a minus sign, strings and list items non-empty and
 *   at most FLAG_LIST_MAX of them, `seen` set exactly for the flags named;
 *   decode(encode(x)) == x: the values printed back as "--name=value" parse to the same values.
 */
#include "fuzz.h"

#include <math.h>

#include "../../common/flags.h"

#define MAX_ARGS 32

typedef struct values {
    int i;
    uint64_t u;
    float f;
    const char *s;
    int b;
    flag_str_list l;
} values;

static void table(flag_spec *t, values *v)
{
    flag_spec spec[] = {
        {"steps", FLAG_INT, &v->i, -5, 1000000, "an int", 0},
        {"seed", FLAG_U64, &v->u, 0, 0, "a u64", 0},
        {"lr", FLAG_FLOAT, &v->f, 0, 1, "a float", 0},
        {"job", FLAG_STR, &v->s, 0, 0, "a string", 0},
        {"verbose", FLAG_BOOL, &v->b, 0, 1, "a bool", 0},
        {"peer", FLAG_STR_LIST, &v->l, 0, 0, "a list", 0},
    };
    memcpy(t, spec, sizeof spec);
}
#define N_FLAGS 6

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *buf = malloc(size + 1);
    if (!buf) abort();
    memcpy(buf, data, size);
    buf[size] = '\0';
    char *argv[MAX_ARGS];
    int argc = 0;
    for (size_t at = 0; at < size && argc < MAX_ARGS; at += strlen(buf + at) + 1)
        argv[argc++] = buf + at;

    flag_spec t[N_FLAGS];
    values v = {7, 9, 0.5f, "x", 0, {{0}, 0}};
    table(t, &v);
    cirrus_error err;
    int rc = flags_parse(t, N_FLAGS, argc, argv, &err);
    FUZZ_CHECK(rc == 0 || rc == CIRRUS_EINVAL, "flags_parse returned %d", rc);
    if (rc != 0) {
        free(buf);
        return 0;
    }
    FUZZ_CHECK(v.i >= -5 && v.i <= 1000000, "--steps %d out of bounds", v.i);
    FUZZ_CHECK(isfinite(v.f) && v.f >= 0 && v.f <= 1, "--lr %g out of bounds", v.f);
    FUZZ_CHECK(v.s && *v.s, "--job empty");
    FUZZ_CHECK(v.b == 0 || v.b == 1, "--verbose %d", v.b);
    FUZZ_CHECK(v.l.n >= 0 && v.l.n <= FLAG_LIST_MAX, "--peer given %d times", v.l.n);
    for (int k = 0; k < v.l.n; k++) FUZZ_CHECK(v.l.items[k] && *v.l.items[k], "empty --peer item");
    /* Walk the arguments as the parser must have: every flag named is seen, every other
     * is not; the text of the last --seed must not be negative. */
    int named[N_FLAGS] = {0};
    const char *seed_text = NULL;
    for (int a = 0; a < argc; a++) {
        const char *name = argv[a] + 2, *eq = strchr(name, '=');
        size_t len = eq ? (size_t)(eq - name) : strlen(name);
        int k = 0;
        while (k < N_FLAGS && !(strlen(t[k].name) == len && !strncmp(t[k].name, name, len))) k++;
        FUZZ_CHECK(!strncmp(argv[a], "--", 2) && k < N_FLAGS, "accepted argument '%s'", argv[a]);
        named[k] = 1;
        const char *val = eq ? eq + 1 : NULL;
        if (t[k].type != FLAG_BOOL && !eq) val = argv[++a];
        if (t[k].type == FLAG_U64) seed_text = val;
    }
    for (int k = 0; k < N_FLAGS; k++)
        FUZZ_CHECK(t[k].seen == named[k], "--%s seen=%d but named=%d", t[k].name, t[k].seen, named[k]);
    FUZZ_CHECK(!seed_text || !strchr(seed_text, '-'), "--seed '%s' accepted as %llu", seed_text,
               (unsigned long long)v.u);

    /* Round trip. */
    char text[5][64], *argv2[5 + 2 * FLAG_LIST_MAX + 2];
    int argc2 = 0;
    snprintf(text[0], sizeof text[0], "--steps=%d", v.i);
    snprintf(text[1], sizeof text[1], "--seed=%llu", (unsigned long long)v.u);
    snprintf(text[2], sizeof text[2], "--lr=%.9g", v.f);
    snprintf(text[3], sizeof text[3], "--verbose=%s", v.b ? "true" : "false");
    for (int k = 0; k < 4; k++) argv2[argc2++] = text[k];
    argv2[argc2++] = "--job";
    argv2[argc2++] = (char *)v.s;
    for (int k = 0; k < v.l.n; k++) {
        argv2[argc2++] = "--peer";
        argv2[argc2++] = (char *)v.l.items[k];
    }
    values w = {0, 0, 0, NULL, 0, {{0}, 0}};
    flag_spec t2[N_FLAGS];
    table(t2, &w);
    rc = flags_parse(t2, N_FLAGS, argc2, argv2, &err);
    FUZZ_CHECK(rc == 0, "printed values refused: %s", err.msg);
    FUZZ_CHECK(w.i == v.i && w.u == v.u && w.f == v.f && !strcmp(w.s, v.s) && w.b == v.b &&
                   w.l.n == v.l.n,
               "values differ after a round trip");
    for (int k = 0; k < v.l.n; k++) FUZZ_CHECK(!strcmp(w.l.items[k], v.l.items[k]), "--peer %d differs", k);
    free(buf);
    return 0;
}
