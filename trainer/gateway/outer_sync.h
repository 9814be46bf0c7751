/* outer_sync: a region's gateway keeping its replica one model with the other regions'
 * (DiLoCo-style outer steps over the WAN).
 *
 * The region's leader client PUSHes its parameters every H inner steps (outer_msg.h, over
 * the coordinator's extension); the gateway forms the pseudo-gradient
 * delta = theta_global - theta_region, compresses it (wan_codec.h, with error feedback:
 * what a codec drops this round is added to the next), sends it to every other region's
 * gateway and receives theirs (wan_msg.h). Once every region's delta of the round is in,
 * each gateway decodes all of them — its own included, from the very bytes it sent —
 * averages them weighted by the tokens each region trained on, in region order, and takes
 * the outer optimizer step (optim/outer.h). Every gateway therefore computes the same
 * float operations on the same bytes in the same order: the global parameters and momentum
 * come out bit-identical everywhere, and a digest of them travels with the next round so
 * that a difference is seen (and logged, and counted) instead of trained on. The client
 * PULLs the new global parameters and installs them on its stage peers.
 *
 * With --fragments P the parameters are cut into P fragments synchronised at staggered
 * times (fragments.h); each is a lane: all of the above, on its own slice of the
 * parameters. The lanes share the WAN port (a connection's JOIN names its fragment), the
 * --wan-mbit pacer and /status; the region's requests name their fragment.
 *
 * Threads: one accepts WAN connections and starts a receiver per connection; one per lane
 * runs its rounds, with a sender per other region while a round's message goes out.
 * Everything a lane shares is under its mutex.
 */
#ifndef CIRRUS_OUTER_SYNC_H
#define CIRRUS_OUTER_SYNC_H

#include <stddef.h>
#include <stdint.h>

#include "../../common/cerr.h"
#include "../net/tls.h"
#include "../net/wire.h"
#include "../optim/outer.h"
#include "../swarm/coord/snapshot.h"
#include "fragments.h"
#include "wan_codec.h"
#include "wan_msg.h"

typedef struct outer_sync_options {
    const char *job;
    int region_index, n_regions;        /* regions are numbered alike in every gateway */
    const char *const *region_names;    /* [n_regions] */
    const char *const *wan_addrs;       /* [n_regions] HOST:PORT of each gateway's WAN port */
    int listen_fd;                      /* >= 0: listen on this bound socket (taken over) */
    uint64_t n_params;                  /* synchronised, all fragments together */
    int fragments;                      /* 1..OUTER_MAX_FRAGMENTS (0: 1) */
    outer_options opt;
    wan_codec_params codec;
    int codec_auto;                     /* choose the codec per round from the links (adapt.h) */
    net_tls_ctx *tls;                   /* NULL: plaintext (--wan-insecure); borrowed */
    int round_timeout_ms;               /* how long a round may wait for the other regions */
    int sync_every;                     /* inner steps per outer step (for /status) */
    double wan_max_Bps;                 /* what all WAN connections may send together, bytes/s
                                         * (sockets' bytes, TLS included; 0: no limit) */
} outer_sync_options;

typedef struct outer_sync outer_sync;

/* Listen (on listen_fd, or on wan_addrs[region_index]), start the threads. */
int outer_sync_start(const outer_sync_options *o, outer_sync **out, cirrus_error *err);
void outer_sync_stop(outer_sync *os);

/* The coordinator extension handler (coordinator_options.ext_handler, ctx = the
 * outer_sync): PUSH and PULL from the region's leader client, each for one fragment. */
int outer_sync_serve(void *ctx, uint16_t type, const uint8_t *p, size_t n, wire_writer *reply,
                     int *drop, cirrus_error *err);

/* The coordinator's status extension (coordinator_options.ext_status, ctx = the
 * outer_sync): the outer sync's part of /status and /metrics. */
int outer_sync_view(void *ctx, coord_outer_view *out);


#endif
