/* failpoint: faults a test injects into a real process, in the manner of etcd's gofail or
 * TiKV's fail-rs, so that no option struct and no --help carries a test's knob.
 *
 * CIRRUS_FAILPOINTS="name[=number],..." in a process's environment names the failpoints
 * on in it (read once, at the first question); failpoint_set turns one on from inside (a
 * `local` run's per-region faults, in that region's process). Names in use:
 *   corrupt-after=K    a gateway changes a global parameter after outer step K
 *                      (the digest repair is tested with it: gateway/outer_round.c)
 *   outer-begin-delay-ms=MS  a region's leader client waits MS before it takes the global
 *                      parameters at its first step, so that its followers' share of the
 *                      step is on the peers first (swarm/client/executor.c)
 *   step-min-ms=MS     a pipeline client's step takes at least MS (it sleeps the rest), so
 *                      a test's outer windows (what H steps take) are no shorter on a fast
 *                      machine than on a slow one (swarm/client/executor.c)
 *   stop-before-push=K a region's leader client stops itself (SIGSTOP) just before it
 *                      pushes outer round K, for a test to continue it later (a region
 *                      held up however fast the machine; swarm/client/outer_client.c)
 *   max-sync-stride=S  a gateway wishes its rounds at most S x --sync-every apart (S
 *                      rounded down to a power of two; gateway/adapt.c), so a test's steps
 *                      see the spacing come back on any machine
 *   exit-after-redo    a coordinator exits (137) on the first step-barrier call after a
 *                      REDO notice was posted (swarm/coord/barrier.c)
 *   stall-average-at=S a stage peer hangs stall-average-ms=MS in the gradient averaging
 *                      of step S, once (swarm/peer/averaging.c; `local --stall-peer`)
 */
#ifndef CIRRUS_FAILPOINT_H
#define CIRRUS_FAILPOINT_H

#include <stdint.h>

/* 1 if failpoint `name` is on, with its number (0 when it has none) in *value (optional). */
int failpoint_on(const char *name, uint64_t *value);
/* Turn `name` on in this process with `value`. */
void failpoint_set(const char *name, uint64_t value);

#endif
