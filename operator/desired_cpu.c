/* desired_cpu: see desired_cpu.h. */
#include "desired_cpu.h"

#include <stdlib.h>
#include <string.h>

/* The compute threads a container's CPU allows: its cpu limit, else its request, as a
 * Kubernetes quantity ("2", "1500m", 0.5), rounded down, at least 1; 0 when neither is set.
 * Several of a job's processes share a node's cores: one that starts a thread per core it
 * sees, spinning while it waits (OpenMP's defaults), takes the others' time (measured on
 * real nodes: a job at 0.15x the tokens/s of the same processes run by `local`). */
int desired_cpu_threads(const json_t *resources)
{
    const json_t *q = json_object_get(json_object_get(resources, "limits"), "cpu");
    if (!q) q = json_object_get(json_object_get(resources, "requests"), "cpu");
    double v;
    if (json_is_number(q)) {
        v = json_number_value(q);
    } else if (json_is_string(q)) {
        char *end;
        v = strtod(json_string_value(q), &end);
        if (!strcmp(end, "m")) v /= 1000.0;
        else if (!strcmp(end, "u")) v /= 1e6;
        else if (!strcmp(end, "n")) v /= 1e9;
        else if (!strcmp(end, "k")) v *= 1e3;
        else if (*end) v = 1; /* another suffix for a CPU count: not worth a guess */
    } else {
        return 0;
    }
    if (!(v >= 1)) return 1; /* also NaN */
    return v > 256 ? 256 : (int)v;
}
