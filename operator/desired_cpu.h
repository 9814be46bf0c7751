/* desired_cpu: how many compute threads a job's container may run, from its resources. */
#ifndef CIRRUS_DESIRED_CPU_H
#define CIRRUS_DESIRED_CPU_H

#include <jansson.h>

/* The container's cpu limit, else its request, as a Kubernetes quantity, rounded down, at
 * least 1; 0 when neither is set (see desired_cpu.c for why it matters). */
int desired_cpu_threads(const json_t *resources);

#endif
