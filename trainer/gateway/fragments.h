/* fragments: how the synchronised parameters are cut into fragments that are synchronised
 * at staggered times (Streaming DiLoCo; `--fragments P`).
 *
 * The m floats the outer steps synchronise (sync_params.h, in model order) are cut into P
 * contiguous, near-equal ranges — groups of consecutive layers. Each fragment is an outer
 * sync of its own (its own rounds, global state, momentum and codec choice), and fragment f
 * pushes its round k at inner step k*H - (P-1-f)*H/P: the last fragment at k*H as with
 * one fragment, the others spread evenly before it. So each fragment has the whole H-step
 * window to cross the WAN, but only 1/P of the bytes go at a time: the link is busy
 * evenly instead of in one burst, and a region behind the other by up to most of the
 * window no longer makes the other wait. The gateway and the region's client derive the
 * same ranges and steps from the same P, H and model.
 */
#ifndef CIRRUS_FRAGMENTS_H
#define CIRRUS_FRAGMENTS_H

#include <stdint.h>

#define OUTER_MAX_FRAGMENTS 8

/* Fragment f of P over m floats: [*lo, *hi). */
void outer_fragment_range(uint64_t m, int n_fragments, int f, uint64_t *lo, uint64_t *hi);
/* How many inner steps before each multiple of H fragment f pushes (0 for the last). */
uint64_t outer_fragment_lead(int every, int n_fragments, int f);
/* One digest of the fragments' global states, in order (the fragment's own for one). */
uint64_t outer_fragments_digest(const uint64_t *digests, int n_fragments);

#endif
