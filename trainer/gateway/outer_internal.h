/* outer_internal: the outer sync's shared state. The synchronised parameters are cut
 * into fragments (--fragments, Streaming DiLoCo); each is an independent lane of outer
 * steps — its own global state, rounds, codec choice and WAN connections — and the lanes
 * of a gateway share its WAN port, its pacer and its /status (outer_sync.c: the lanes, the
 * region's requests, the group; outer_round.c: a lane's rounds; wan_link.c: a lane's
 * connections to the other gateways, and the shared acceptor). */
#ifndef CIRRUS_OUTER_INTERNAL_H
#define CIRRUS_OUTER_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>

#include "../../common/log.h"
#include "../net/conn.h"
#include "../net/pacer.h"
#include "adapt.h"
#include "outer_sync.h"
#include "schedule.h"

typedef struct outer_lane outer_lane;

#define WAN_ADDR_MAX 279 /* bytes of a gateway's HOST:PORT */

/* One region's message of one round, as it arrives (or, for this region, as sent). */
typedef struct round_slot {
    uint64_t round;      /* 0: empty */
    uint8_t *bytes;
    uint64_t total, got; /* got: bytes received in order */
    uint64_t tokens, prev_digest;
    uint64_t at;         /* the clock its region pushed it at, and the stride its gateway */
    uint32_t wish;       /*   wishes for after the next round (schedule.h) */
    int complete;
    int64_t progress_ms; /* when its last bytes arrived (net_now_ms) */
    int64_t first_ms;    /* when the first byte of its first PART arrived */
} round_slot;

/* This gateway's view of the link to another region. */
typedef struct wan_peer {
    int up;                 /* a connection to it is established (sender side) */
    char last_error[256];
    net_conn *out;          /* the sender's connection; only region j's sender touches it */
    int64_t round_seen;     /* its latest completed round as it last said (-1: unknown) */
    int64_t left_us_out;    /* the latest round it completed without our delta, as it said
                             * refusing our message of that round (-1: none) */
    int absent;             /* it missed the last round: later rounds do not wait for it */
    adapt_rate rate;        /* what sending to it carried (adapt_rate_update) */
    uint64_t last_bytes;    /* the last message sent to it, and the seconds from its first */
    double last_send_s;     /*   byte to its acknowledgement */
    uint64_t out_sent, out_received; /* its byte counters already added to the totals */
} wan_peer;

struct outer_lane {
    outer_sync *group;         /* the gateway's lanes; borrowed */
    int fragment;              /* this lane's index among them */
    char lane_name[48];        /* " (fragment f of P)" in its logs; "" with one lane */
    outer_sync_options o;
    char job[WIRE_JOB_ID_MAX + 1];
    char names[WAN_MAX_REGIONS][WAN_REGION_MAX + 1];
    char addrs[WAN_MAX_REGIONS][WAN_ADDR_MAX + 1];
    uint64_t n;
    size_t max_message;        /* the largest codec message any gateway may send */
    int lfd;
    atomic_int stopping;
    pthread_t acceptor, worker;
    int acceptor_started, worker_started;

    pthread_mutex_t mu;        /* everything below */
    pthread_cond_t changed;    /* a push completed, a message arrived, a round ended */
    int receivers;             /* receiver threads alive */
    /* Their connections (WAN_MAX_RECEIVERS), for stopping and for the limits on who holds
     * them: from, the region that JOINed on it (-1: still in its handshake), since when,
     * and the address it came from. */
    struct receiver_slot {
        net_conn *c;
        int from, fragment;
        int64_t since_ms;
        char addr[64];
    } *rslot;
    int n_rslot;               /* the acceptor's lane (fragment 0) holds every lane's */
    /* Global state: theta and outer momentum after round `round` (-1: none yet), and when
     * the next rounds are pushed; the digest covers all three. */
    float *theta, *mom;
    int64_t round;
    outer_schedule sched;
    uint64_t digest;
    /* The region's push in progress (round push_round at clock push_at; push_got floats in
     * order). */
    float *region;
    uint64_t push_round, push_at, push_got, push_tokens;
    uint32_t push_compute_ms; /* the client's compute since its previous push; 0: unknown */
    int push_ready;            /* a whole push of round + 1 waits for the worker */
    uint64_t client_ahead;     /* a push of this later round was refused: the job is past us */
    uint64_t client_ahead_at;  /*   and the clock it was pushed at */
    double push_time;
    /* Messages of rounds round + 1 and round + 2, by round parity, then region. */
    round_slot slot[2][WAN_MAX_REGIONS];
    wan_peer peer[WAN_MAX_REGIONS];
    /* --codec auto: the ladder's rung, the region's compute time between two syncs, and why.
     * The compute the client measured (push_compute_ms), else the time between pushes less
     * what the region spent blocked on the round before: from its first PULL of a round
     * not ready (wait_since, round wait_round) to the round's end. base_window_s: that per H inner steps (the pushes are a stride of H
     * apart); window_s: the window of the round being sent (base x its stride). */
    int rung;
    double window_s, base_window_s, last_push_s, wait_since;
    uint64_t wait_round;
    char codec_why[200];
    /* Seconds the last rounds waited for the other regions (a ring), for the deadline. */
    double waits[8];
    int n_waits;
    /* counters */
    uint64_t wan_sent, wan_received, payload_sent, mismatches;
    /* WAN connections refused (at accept or in their handshake) and dropped after it (a bad
     * frame), counted and logged sampled by kind (anyone on the internet can flood the
     * port); not under mu. */
    atomic_ullong refused, dropped;
    log_kinds refusals_seen, drops_seen;
    double last_sync_s, last_duration_s;
};

/* The gateway: its lanes, one per fragment of the synchronised parameters. */
struct outer_sync {
    int n_lanes;
    outer_lane *lane[OUTER_MAX_FRAGMENTS];
    net_pacer *pacer;          /* --wan-mbit, shared by every lane's connections */
    atomic_ullong wan_bytes;   /* sent and received on every lane's WAN sockets */
};

/* outer_sync.c */
double outer_wall_s(void);
uint64_t outer_state_digest(const float *theta, const float *mom, uint64_t n,
                            const outer_schedule *sched);

/* outer_round.c: the rounds' thread */
void *outer_round_main(void *arg);

/* wan_link.c */
int wan_link_start(outer_lane *os, cirrus_error *err); /* the acceptor */
void wan_link_stop(outer_lane *os);                    /* waits for receivers */
/* Stopping: the sockets of the sends in progress are shut down, so that no send waits out
 * its deadline on a slow or cut link. */
void wan_link_interrupt(outer_lane *os);
/* Send this region's message of `round` to region j until it is acknowledged, the round's
 * deadline passes or the gateway stops. */
/* What a round's message says besides its bytes: DONE's fields (wan_msg.h). */
typedef struct wan_send_meta {
    uint64_t tokens, prev_digest, at;
    uint32_t wish;
} wan_send_meta;
int wan_link_send(outer_lane *os, int j, uint64_t round, const uint8_t *msg, uint64_t len,
                  const wan_send_meta *meta, int64_t deadline_ms, cirrus_error *err);
/* Connect to every other region not connected (their JOINs update round_seen). */
void wan_link_probe(outer_lane *os, int64_t deadline_ms);
/* Region j's global state of a round >= min_round (asked again until it has one, or the
 * deadline), checked against its digest, into theta and mom (n floats each) and *sched. */
int wan_link_fetch_state(outer_lane *os, int j, int64_t min_round, int64_t deadline_ms,
                         float *theta, float *mom, int64_t *round, outer_schedule *sched,
                         uint64_t *digest, cirrus_error *err);

#endif
