/* failpolicy: see failpolicy.h. */
#include "failpolicy.h"

#include <string.h>

#define FIELD "spec.runPolicy.podFailurePolicy"

static const char *str(const json_t *o, const char *k)
{
    return json_string_value(json_object_get(o, k));
}

static int is_one_of(const char *s, const char *const *set, size_t n)
{
    for (size_t i = 0; s && i < n; i++)
        if (!strcmp(s, set[i])) return 1;
    return 0;
}

static const char *const actions[] = {"Count", "Ignore", "FailJob"};
static const char *const statuses[] = {"True", "False", "Unknown"};

static int check_exit_codes(const json_t *m, size_t i, cirrus_error *err)
{
    const char *op = str(m, "operator"), *cn = str(m, "containerName");
    const json_t *values = json_object_get(m, "values");
    if (!json_is_object(m))
        return cirrus_fail(err, CIRRUS_EINVAL, FIELD ".rules[%zu].onExitCodes must be an object", i);
    if (!op || (strcmp(op, "In") && strcmp(op, "NotIn")))
        return cirrus_fail(err, CIRRUS_EINVAL,
                           FIELD ".rules[%zu].onExitCodes.operator must be In or NotIn", i);
    if (json_object_get(m, "containerName") && (!cn || strcmp(cn, "trainer")))
        return cirrus_fail(err, CIRRUS_EINVAL,
                           FIELD ".rules[%zu].onExitCodes.containerName must be \"trainer\" "
                           "(the pods' only container)", i);
    size_t n = json_array_size(values);
    if (!json_is_array(values) || n < 1 || n > FAILPOLICY_MAX_VALUES)
        return cirrus_fail(err, CIRRUS_EINVAL,
                           FIELD ".rules[%zu].onExitCodes.values must have 1 to %d exit codes", i,
                           FAILPOLICY_MAX_VALUES);
    size_t k;
    const json_t *v;
    json_array_foreach(values, k, v)
    {
        json_int_t c = json_integer_value(v);
        if (!json_is_integer(v) || c < 0 || c > 255)
            return cirrus_fail(err, CIRRUS_EINVAL,
                               FIELD ".rules[%zu].onExitCodes.values[%zu] must be an exit code, "
                               "0 to 255", i, k);
        /* Exit 0 is success and never matches: In 0 would be a rule that does nothing. */
        if (c == 0 && !strcmp(op, "In"))
            return cirrus_fail(err, CIRRUS_EINVAL,
                               FIELD ".rules[%zu].onExitCodes: 0 cannot be used with operator In "
                               "(exit 0 is success)", i);
    }
    return 0;
}

static int check_conditions(const json_t *m, size_t i, cirrus_error *err)
{
    size_t n = json_array_size(m), k;
    if (!json_is_array(m) || n < 1 || n > FAILPOLICY_MAX_PATTERNS)
        return cirrus_fail(err, CIRRUS_EINVAL,
                           FIELD ".rules[%zu].onPodConditions must have 1 to %d conditions", i,
                           FAILPOLICY_MAX_PATTERNS);
    const json_t *c;
    json_array_foreach(m, k, c)
    {
        const char *t = str(c, "type");
        if (!t || !*t)
            return cirrus_fail(err, CIRRUS_EINVAL,
                               FIELD ".rules[%zu].onPodConditions[%zu].type is required", i, k);
        if (json_object_get(c, "status") && !is_one_of(str(c, "status"), statuses, 3))
            return cirrus_fail(err, CIRRUS_EINVAL,
                               FIELD ".rules[%zu].onPodConditions[%zu].status must be True, "
                               "False or Unknown", i, k);
    }
    return 0;
}

static int check_reasons(const json_t *m, size_t i, cirrus_error *err)
{
    size_t n = json_array_size(m), k;
    if (!json_is_array(m) || n < 1 || n > FAILPOLICY_MAX_PATTERNS)
        return cirrus_fail(err, CIRRUS_EINVAL,
                           FIELD ".rules[%zu].onPodReasons must have 1 to %d reasons", i,
                           FAILPOLICY_MAX_PATTERNS);
    const json_t *r;
    json_array_foreach(m, k, r)
    {
        if (!json_string_value(r) || !*json_string_value(r))
            return cirrus_fail(err, CIRRUS_EINVAL,
                               FIELD ".rules[%zu].onPodReasons[%zu] must be a non-empty string",
                               i, k);
    }
    return 0;
}

static int check_rules(const json_t *rules, cirrus_error *err)
{
    if (!json_is_array(rules) || json_array_size(rules) > FAILPOLICY_MAX_RULES)
        return cirrus_fail(err, CIRRUS_EINVAL, FIELD ".rules must be a list of at most %d rules",
                           FAILPOLICY_MAX_RULES);
    size_t i;
    const json_t *r;
    json_array_foreach(rules, i, r)
    {
        if (!is_one_of(str(r, "action"), actions, 3))
            return cirrus_fail(err, CIRRUS_EINVAL,
                               FIELD ".rules[%zu].action must be Ignore, Count or FailJob", i);
        const json_t *ec = json_object_get(r, "onExitCodes");
        const json_t *pc = json_object_get(r, "onPodConditions");
        const json_t *pr = json_object_get(r, "onPodReasons");
        if (!!ec + !!pc + !!pr != 1)
            return cirrus_fail(err, CIRRUS_EINVAL,
                               FIELD ".rules[%zu] needs exactly one of onExitCodes, "
                               "onPodConditions, onPodReasons", i);
        int rc = ec ? check_exit_codes(ec, i, err)
                 : pc ? check_conditions(pc, i, err)
                      : check_reasons(pr, i, err);
        if (rc) return rc;
    }
    return 0;
}

int failpolicy_from_spec(const json_t *spec, failpolicy *out, cirrus_error *err)
{
    out->rules = NULL;
    const json_t *pfp = json_object_get(json_object_get(spec, "runPolicy"), "podFailurePolicy");
    json_t *rules;
    if (pfp) {
        if (!json_is_object(pfp) || !json_object_get(pfp, "rules"))
            return cirrus_fail(err, CIRRUS_EINVAL, FIELD " must be an object with rules");
        rules = json_incref(json_object_get(pfp, "rules"));
    } else {
        rules = json_loads(FAILPOLICY_DEFAULT_RULES, 0, NULL);
        if (!rules) return cirrus_fail(err, CIRRUS_ENOMEM, "out of memory");
    }
    int rc = check_rules(rules, err);
    if (rc) {
        json_decref(rules);
        return rc;
    }
    out->rules = rules;
    return 0;
}

void failpolicy_free(failpolicy *p)
{
    json_decref(p->rules);
    p->rules = NULL;
}

/* Some container (named name, if given) terminated with a non-zero exit code that is (In) or
 * is not (NotIn) in values. Only what the container's current state says: these pods never
 * restart a container (restartPolicy Never). */
static int exit_codes_match(const json_t *m, const json_t *status)
{
    const char *name = str(m, "containerName");
    int in = !strcmp(str(m, "operator"), "In");
    size_t i;
    const json_t *cs;
    json_array_foreach(json_object_get(status, "containerStatuses"), i, cs)
    {
        if (name && (!str(cs, "name") || strcmp(name, str(cs, "name")))) continue;
        const json_t *term = json_object_get(json_object_get(cs, "state"), "terminated");
        const json_t *ec = json_object_get(term, "exitCode");
        if (!json_is_integer(ec) || json_integer_value(ec) == 0) continue;
        int found = 0;
        size_t k;
        const json_t *v;
        json_array_foreach(json_object_get(m, "values"), k, v)
        {
            if (json_integer_value(v) == json_integer_value(ec)) found = 1;
        }
        if (found == in) return 1;
    }
    return 0;
}

static int conditions_match(const json_t *patterns, const json_t *status)
{
    size_t i, k;
    const json_t *p, *c;
    json_array_foreach(patterns, i, p)
    {
        const char *want = str(p, "status") ? str(p, "status") : "True";
        json_array_foreach(json_object_get(status, "conditions"), k, c)
        {
            const char *t = str(c, "type"), *s = str(c, "status");
            if (t && s && !strcmp(t, str(p, "type")) && !strcmp(s, want)) return 1;
        }
    }
    return 0;
}

static int reasons_match(const json_t *reasons, const json_t *status)
{
    const char *reason = str(status, "reason");
    size_t i;
    const json_t *r;
    json_array_foreach(reasons, i, r)
    {
        if (reason && !strcmp(reason, json_string_value(r))) return 1;
    }
    return 0;
}

failpolicy_action failpolicy_judge(const failpolicy *p, const json_t *pod, int *rule)
{
    const json_t *status = json_object_get(pod, "status");
    size_t i;
    const json_t *r;
    *rule = -1;
    json_array_foreach(p->rules, i, r)
    {
        const json_t *ec = json_object_get(r, "onExitCodes");
        const json_t *pc = json_object_get(r, "onPodConditions");
        const json_t *pr = json_object_get(r, "onPodReasons");
        int match = ec ? exit_codes_match(ec, status)
                    : pc ? conditions_match(pc, status)
                         : reasons_match(pr, status);
        if (!match) continue;
        *rule = (int)i;
        const char *a = str(r, "action");
        return !strcmp(a, "Ignore")    ? FAILPOLICY_IGNORE
               : !strcmp(a, "FailJob") ? FAILPOLICY_FAIL_JOB
                                       : FAILPOLICY_COUNT;
    }
    return FAILPOLICY_COUNT;
}

const char *failpolicy_action_name(failpolicy_action a)
{
    return (unsigned)a < sizeof actions / sizeof *actions ? actions[a] : "Count";
}
