/* snapshot: a consistent copy of a region coordinator's state — the job's totals, each
 * stage's peers, throughput and capacity, the rebalancer's recent moves and every live
 * member — taken under the coordinator's lock (coordinator_snapshot) and read without it.
 *
 * Its own header so that what renders a snapshot (http_status.h) needs only this, not the
 * coordinator.
 */
#ifndef CIRRUS_COORD_SNAPSHOT_H
#define CIRRUS_COORD_SNAPSHOT_H

#include <stddef.h>
#include <stdint.h>

#include "../proto/coord_msg.h"

#define COORD_RECENT_MOVES 32 /* moves kept for /status */

typedef struct coord_member_view {
    coord_peer_info info;   /* id, stage, layers, name, host, port, current throughput */
    uint16_t role;
    coord_stats stats;      /* the last heartbeat (zeros and NaN loss before one) */
    double last_seen_s;     /* seconds since the last heartbeat or registration */
    double capacity;        /* coord_stats_capacity of the last heartbeat; 0: unknown */
    uint32_t moving_to;     /* the stage it was told to move to; COORD_NO_INSTRUCTION */
} coord_member_view;

/* One move the rebalancer decided. */
typedef struct coord_move {
    uint32_t peer_id, from_stage, to_stage;
    double min_before, min_after; /* estimated minimum stage capacity, forward units/s */
    int64_t period;               /* the rebalancing period it was decided in (from 0) */
    double at_s;                  /* coordinator uptime then */
} coord_move;

/* The gateway's outer sync across regions, as /status and /metrics show it (filled by the
 * coordinator's extension: coordinator_options.ext_status). */
#define COORD_OUTER_LINKS 16
#define COORD_OUTER_FRAGMENTS 8 /* the gateway's OUTER_MAX_FRAGMENTS */
typedef struct coord_outer_view {
    int64_t step;                 /* latest outer step; -1: no global parameters yet */
    uint64_t digest;              /* of the global parameters and momentum after it */
    uint64_t wan_sent, wan_received; /* bytes on the WAN sockets, TLS records included */
    uint64_t payload_sent;        /* pseudo-gradient message bytes sent */
    uint64_t digest_mismatches;   /* rounds in which another region's digest differed */
    uint64_t wan_refused;         /* WAN connections refused at accept or in the handshake */
    uint64_t wan_dropped;         /* WAN connections dropped after it (a bad frame) */
    double last_sync_unix_s;      /* when the last outer step completed; 0: never */
    double last_duration_s;       /* from the region's push to the new global parameters */
    char codec[48];               /* the first fragment's (and the only one's without) */
    char codec_reason[200];       /* why this codec (--codec auto: the link and window) */
    uint32_t sync_every;
    uint32_t stride;              /* the widest fragment's: syncs are stride x sync_every
                                   * inner steps apart now (1 unless even the sparsest codec
                                   * did not fit the window; gateway/schedule.h) */
    /* Each fragment's lane (--fragments; 1 without): its own outer step, codec choice and
     * window (--codec auto: the region's compute time between two of its syncs). */
    uint32_t n_fragments;
    struct {
        int64_t step;
        char codec[48];
        char codec_reason[200];
        double window_s;          /* 0: not measured yet */
        uint32_t stride;          /* its next round is stride x sync_every steps after the last */
    } fragments[COORD_OUTER_FRAGMENTS];
    uint32_t n_links;
    struct {
        char region[64];
        int up;
        char last_error[256];
        double rate_Bps;          /* what sending to it carried (EWMA); 0: not measured */
        uint64_t last_bytes;      /* the last message sent to it, and how long it took */
        double last_send_s;       /*   from its first byte to its acknowledgement */
    } links[COORD_OUTER_LINKS];
} coord_outer_view;

typedef struct coord_snapshot {
    char job_id[WIRE_JOB_ID_MAX + 1];
    uint64_t epoch;
    double uptime_s;
    uint32_t n_stages;
    uint64_t step;          /* the highest step any member reported in this epoch */
    double loss;            /* the latest client-reported loss (else a heartbeat's); NaN */
    double tokens_per_s;    /* sum of the live clients' last reports */
    uint64_t mb_retried, mb_lost; /* totals over all clients, past ones included */
    uint64_t expirations, registrations;
    uint32_t *stage_peers;  /* [n_stages] live stage peers */
    double *stage_throughput; /* [n_stages] sum of their throughput, samples/s */
    double *stage_capacity; /* [n_stages] sum of their capacity, forward units/s */
    double rebalance_period_s;    /* 0: off */
    uint64_t moves, withdrawn;    /* rebalancing moves decided, instructions withdrawn */
    size_t n_recent;
    coord_move recent[COORD_RECENT_MOVES]; /* the latest moves, oldest first */
    size_t n_clients;
    size_t n_members;
    coord_member_view *members; /* [n_members], by id */
    int has_outer;              /* the gateway runs outer steps across regions */
    coord_outer_view outer;
} coord_snapshot;

/* Free the arrays of a filled snapshot and zero it (a zeroed one is fine too). */
void coord_snapshot_free(coord_snapshot *s);

#endif
