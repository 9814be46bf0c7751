/* wan_link: the outer sync's connections to the other gateways (see wan_msg.h).
 *
 * Each gateway sends on connections it opened and receives on connections it accepted, so
 * every connection carries one direction of messages and its own replies: a receiver never
 * waits on a sender and the other way round. A connection is TLS 1.3 with the job's
 * certificates (the other end must present a certificate of this job's CA naming the
 * region it claims) unless the gateway runs --wan-insecure; either way the sync code below
 * speaks frames over a net_conn and never asks which.
 */
#include "adapt.h"
#include "outer_internal.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>
#include <xxhash.h>

#include "../../common/log.h"
#include "../swarm/proto/rpc.h"

#define WAN_IO_TIMEOUT_MS 30000   /* a frame that started must finish in this time */
#define WAN_HANDSHAKE_MS 10000    /* TLS + HELLO + JOIN, all of it */
/* One TCP connect attempt: a SYN lost on a cut link is retried by the send loop (with its
 * backoff) rather than waited for, so that a stopping gateway is never held by one. */
#define WAN_CONNECT_MS 2000
#define WAN_POLL_MS 100
/* Who may hold the receivers. The WAN port faces the internet: connections still in their
 * handshake (not yet authenticated) get at most WAN_MAX_HANDSHAKES slots, at most
 * WAN_HANDSHAKES_PER_ADDR from one address, so idle or slow connections cannot take the
 * slots the regions' gateways need; a region's gateway holds at most
 * WAN_RECEIVERS_PER_REGION (its connection and one it left behind when it reconnected:
 * a newer JOIN shuts the oldest down). */
#define WAN_MAX_HANDSHAKES 16
#define WAN_HANDSHAKES_PER_ADDR 4
#define WAN_RECEIVERS_PER_REGION 2
/* ... per lane: a connection serves one fragment. */
#define WAN_MAX_RECEIVERS(lanes) \
    (WAN_MAX_HANDSHAKES + WAN_RECEIVERS_PER_REGION * WAN_MAX_REGIONS * (lanes))

/* Bytes this connection moved since last counted, added to the totals. Under mu. */
static void count_bytes(outer_lane *os, net_conn *c, uint64_t *seen_sent, uint64_t *seen_recv)
{
    uint64_t s = 0, r = 0;
    net_conn_bytes(c, &s, &r);
    os->wan_sent += s - *seen_sent;
    os->wan_received += r - *seen_recv;
    atomic_fetch_add(&os->group->wan_bytes, (s - *seen_sent) + (r - *seen_recv));
    *seen_sent = s;
    *seen_recv = r;
}

static wan_join my_join(outer_lane *os)
{
    wan_join j = {.index = (uint32_t)os->o.region_index, .n_regions = (uint32_t)os->o.n_regions,
                  .n_params = os->n, .fragment = (uint32_t)os->fragment,
                  .n_fragments = (uint32_t)os->group->n_lanes};
    snprintf(j.region, sizeof j.region, "%s", os->names[os->o.region_index]);
    pthread_mutex_lock(&os->mu);
    j.round = os->round < 0 ? WAN_NO_ROUND : (uint64_t)os->round;
    j.digest = os->digest;
    pthread_mutex_unlock(&os->mu);
    return j;
}

/* The other end's JOIN must fit this job's layout: the region it names at the index it
 * names, (with TLS) the region its certificate names, and the same model. */
static int check_join(outer_lane *os, const wan_join *j, const char *cert_region,
                      cirrus_error *err)
{
    if (j->n_regions != (uint32_t)os->o.n_regions || j->index == (uint32_t)os->o.region_index ||
        strcmp(j->region, os->names[j->index]) != 0)
        return cirrus_fail(err, CIRRUS_EMISMATCH, "gateway says it is region '%s' (%u of %u); "
                           "this job has %d regions", j->region, j->index, j->n_regions,
                           os->o.n_regions);
    if (cert_region && strcmp(cert_region, j->region) != 0)
        return cirrus_fail(err, CIRRUS_EMISMATCH, "gateway of region '%s' says it is region "
                           "'%s'", cert_region, j->region);
    if (j->n_fragments != (uint32_t)os->group->n_lanes || j->fragment != (uint32_t)os->fragment)
        return cirrus_fail(err, CIRRUS_EMISMATCH, "region '%s' cuts the parameters into %u "
                           "fragments (this is its fragment %u), this one into %d (fragment %d)",
                           j->region, j->n_fragments, j->fragment, os->group->n_lanes,
                           os->fragment);
    if (j->n_params != os->n)
        return cirrus_fail(err, CIRRUS_EMISMATCH, "region '%s' trains %llu parameters, this "
                           "one %llu", j->region, (unsigned long long)j->n_params,
                           (unsigned long long)os->n);
    pthread_mutex_lock(&os->mu);
    const int differ = os->round == 0 && j->round == 0 && j->digest != os->digest;
    pthread_mutex_unlock(&os->mu);
    if (differ)
        return cirrus_fail(err, CIRRUS_EMISMATCH, "region '%s' starts from other initial "
                           "parameters (digest %016llx, here %016llx): use the same seed and "
                           "model", j->region, (unsigned long long)j->digest,
                           (unsigned long long)os->digest);
    return 0;
}

/* WAN connections live for the whole job and may sit idle between outer steps: TCP
 * keepalive (probes after 30 s of silence, 3 unanswered 10 s apart) finds one a cut left
 * half-open, so neither its receiver slot nor a sender waits on it forever. */
static void keep_alive(net_conn *c)
{
    const int on = 1, idle = 30, intvl = 10, cnt = 3;
    const int fd = net_fd(c);
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof on);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof intvl);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt);
}

/* What region j said of its latest round (JOIN). It is back: the next rounds wait for it
 * again (up to their learned deadline), not just the short grace of an absent region. */
static void note_round(outer_lane *os, int j, uint64_t round)
{
    pthread_mutex_lock(&os->mu);
    os->peer[j].round_seen = round == WAN_NO_ROUND ? -1 : (int64_t)round;
    os->peer[j].absent = 0;
    pthread_mutex_unlock(&os->mu);
}

/* ---- the receiving side ---- */

typedef struct receiver {
    outer_lane *home; /* the acceptor's lane: the receiver's slot */
    outer_lane *os;   /* the lane its JOIN named (home until then) */
    net_conn *c;
    int from; /* the region at the other end, once it JOINed */
    int slot; /* its index in os->rslot */
    uint64_t seen_sent, seen_recv;
    /* The global state a STATE fetch on this connection is served from: copied when the
     * fetch starts (offset 0), so that its slices are of one round however long it takes.
     * On a slow link a fetch can outlast several rounds; served from the live state it
     * would never complete. Freed after its last slice. */
    float *snap; /* theta, then momentum: 2n floats */
    int64_t snap_round;
    uint64_t snap_digest;
} receiver;

/* A PART of region rv->from's message, whose first byte arrived at frame_ms: kept if it
 * continues what has arrived. Under mu. */
static int take_part(outer_lane *os, int from, const wan_part *p, int64_t frame_ms,
                     cirrus_error *err)
{
    const uint64_t base = os->round < 0 ? 0 : (uint64_t)os->round;
    if (p->round <= base) return 0; /* a round done here already: a resend after a cut */
    /* Further ahead: this gateway fell behind and takes the job's state instead; DONE says
     * so to the sender, once, rather than the message being stored or sent again. */
    if (p->round > base + 2) return 0;
    round_slot *sl = &os->slot[p->round & 1][from];
    if (sl->round == p->round && sl->complete) return 0; /* already whole */
    if (p->offset == 0 || sl->round != p->round || sl->total != p->total) {
        if (p->offset != 0) return 0; /* the middle of a message we never saw begin: skip */
        uint8_t *b = realloc(sl->bytes, p->total ? p->total : 1);
        if (!b) return cirrus_fail(err, CIRRUS_ENOMEM, "out of memory for a %llu-byte message",
                                   (unsigned long long)p->total);
        *sl = (round_slot){.round = p->round, .bytes = b, .total = p->total,
                           .first_ms = frame_ms};
    }
    if (p->offset != sl->got) return 0; /* out of order (cannot happen on one stream) */
    memcpy(sl->bytes + sl->got, p->bytes, p->len);
    sl->got += p->len;
    sl->progress_ms = net_now_ms();
    return 0;
}

/* DONE: the message must be whole and hash right; then the round holds it, and
 * *receive_ms says how long it took to arrive. Under mu. */
static int take_done(outer_lane *os, int from, const wan_done *d, uint64_t *receive_ms,
                     cirrus_error *err)
{
    *receive_ms = 0;
    const uint64_t base = os->round < 0 ? 0 : (uint64_t)os->round;
    /* Sending round r, it has completed r - 1. And it is alive: even a message of a round
     * done here (it fell behind and is catching up) means the next round should wait for it
     * up to the learned deadline, or it would miss every round by the absent's short grace
     * and stay one behind to the end. */
    if ((int64_t)d->round - 1 > os->peer[from].round_seen)
        os->peer[from].round_seen = (int64_t)d->round - 1;
    os->peer[from].absent = 0;
    /* The message of our latest round, done here without it (it came too late): the sender
     * must not finish that round with our delta and its own, a result no one else has; it
     * takes ours (WAN_LEFT_OUT). */
    const round_slot *was = &os->slot[base & 1][from];
    if (os->round >= 0 && d->round == base && !(was->round == base && was->complete))
        return cirrus_fail(err, WAN_LEFT_OUT, "outer step %llu was done here without region "
                           "%s's delta: it takes this gateway's result",
                           (unsigned long long)base, os->names[from]);
    /* A message of a round done here and since passed: its sender fell behind (its gateway
     * restarted, its region rejoined) and waits for the others' messages of that round,
     * which were sent long ago or, while it was away, not at all. It takes this gateway's
     * state instead (WAN_LEFT_OUT): the job's, whether or not its delta was in. */
    if (os->round >= 0 && d->round < base)
        return cirrus_fail(err, WAN_LEFT_OUT, "outer step %llu is past here (this gateway is "
                           "at %llu): it takes this gateway's result",
                           (unsigned long long)d->round, (unsigned long long)base);
    if (d->round <= base) return 0;
    if (d->round > base + 2)
        return cirrus_fail(err, CIRRUS_ECONFLICT, "this gateway is at outer step %llu, behind "
                           "%llu: it takes the job's state", (unsigned long long)base,
                           (unsigned long long)d->round);
    round_slot *sl = &os->slot[d->round & 1][from];
    if (sl->round == d->round && sl->complete) return 0;
    if (sl->round != d->round || sl->got != d->total || sl->total != d->total)
        return cirrus_fail(err, CIRRUS_ETRUNC, "round %llu message incomplete (%llu of %llu "
                           "bytes)", (unsigned long long)d->round, (unsigned long long)sl->got,
                           (unsigned long long)d->total);
    if (XXH3_64bits(sl->bytes, sl->total) != d->hash)
        return cirrus_fail(err, CIRRUS_ECORRUPT, "round %llu message hashes wrong",
                           (unsigned long long)d->round);
    sl->tokens = d->tokens;
    sl->prev_digest = d->prev_digest;
    sl->complete = 1;
    const int64_t took = net_now_ms() - sl->first_ms;
    *receive_ms = took > 0 ? (uint64_t)took : 1;
    pthread_cond_broadcast(&os->changed);
    return 0;
}

/* STATE: a slice of our global state (parameters, then momentum), with its round and
 * digest, from the fetch's snapshot. Called and returns under mu; sends outside it. */
static int serve_state(outer_lane *os, receiver *rv, const wire_header *h, wire_reader *r,
                       cirrus_error *err)
{
    net_conn *c = rv->c;
    uint64_t off, count;
    if (wan_msg_get_state(r, os->n, &off, &count))
        return cirrus_fail(err, CIRRUS_ECORRUPT, "malformed STATE");
    if (os->round >= 0 && (off == 0 || !rv->snap)) {
        if (!rv->snap && !(rv->snap = malloc(2 * os->n * sizeof(float))))
            return cirrus_fail(err, CIRRUS_ENOMEM, "out of memory for a state snapshot");
        memcpy(rv->snap, os->theta, os->n * sizeof(float));
        memcpy(rv->snap + os->n, os->mom, os->n * sizeof(float));
        rv->snap_round = os->round;
        rv->snap_digest = os->digest;
    }
    if (os->round < 0) {
        pthread_mutex_unlock(&os->mu);
        rpc_refuse(c, h->request_id, CIRRUS_ENOENT, "this gateway has no global state yet",
                   WAN_IO_TIMEOUT_MS);
        pthread_mutex_lock(&os->mu);
        return 0;
    }
    wire_writer w;
    wire_writer_init(&w, count * sizeof(float) + 64);
    /* theta and momentum are one array in the snapshot: the slice may span both. */
    wan_msg_put_state_ok(&w, (uint64_t)rv->snap_round, rv->snap_digest, rv->snap + off, count);
    pthread_mutex_unlock(&os->mu);
    int rc = w.failed ? cirrus_fail(err, CIRRUS_ENOMEM, "STATE reply too large")
                      : net_send_frame(c, WAN_STATE_OK, h->request_id, w.data, (uint32_t)w.len,
                                       WAN_IO_TIMEOUT_MS);
    wire_writer_free(&w);
    if (off + count == 2 * os->n) { /* the fetch's last slice */
        free(rv->snap);
        rv->snap = NULL;
    }
    pthread_mutex_lock(&os->mu);
    return rc;
}

/* Milliseconds left until deadline (at least 1: the step then times out at once). */
static int left_ms(int64_t deadline)
{
    const int64_t d = deadline - net_now_ms();
    return d < 1 ? 1 : (int)d;
}

/* A JOIN of region j for fragment f on receiver slot `slot`: the slot is the region's from
 * now on; its oldest other connection of that fragment goes when it holds
 * WAN_RECEIVERS_PER_REGION already. os: the acceptor's lane, under its mu. */
static void slot_joined(outer_lane *os, int slot, int j, int f)
{
    int held = 0, oldest = -1;
    for (int i = 0; i < os->n_rslot; i++) {
        const struct receiver_slot *s = &os->rslot[i];
        if (i == slot || !s->c || s->from != j || s->fragment != f) continue;
        held++;
        if (oldest < 0 || s->since_ms < os->rslot[oldest].since_ms) oldest = i;
    }
    if (held >= WAN_RECEIVERS_PER_REGION) {
        log_warn("outer: region %s connected again: its oldest WAN connection (%s) is closed",
                 os->names[j], os->rslot[oldest].addr);
        shutdown(net_fd(os->rslot[oldest].c), SHUT_RDWR); /* its receiver ends */
    }
    os->rslot[slot].from = j;
    os->rslot[slot].fragment = f;
    os->rslot[slot].since_ms = net_now_ms();
}

static int receive_handshake(receiver *rv, cirrus_error *err)
{
    outer_lane *os = rv->home;
    char cert_region[WAN_REGION_MAX + 1] = "";
    /* One deadline for the whole handshake: a peer sending it a byte at a time must not
     * hold a slot for the sum of the steps' timeouts. */
    const int64_t deadline = net_now_ms() + WAN_HANDSHAKE_MS;
    int rc = 0;
    if (os->o.tls)
        rc = net_tls_accept(rv->c, os->o.tls, NULL, cert_region, sizeof cert_region,
                            left_ms(deadline), err);
    uint16_t role = 0;
    uint32_t id = 0;
    if (!rc) rc = net_hello_server(rv->c, os->job, &role, &id, left_ms(deadline), err);
    if (!rc && role != WAN_ROLE_GATEWAY)
        rc = cirrus_fail(err, CIRRUS_EINVAL, "HELLO role %u is not a gateway's", role);
    wire_header h;
    const uint8_t *p = NULL;
    if (!rc) rc = net_recv_frame(rv->c, &h, &p, left_ms(deadline), err);
    wan_join j;
    wire_reader r;
    if (!rc) {
        wire_reader_init(&r, p, h.payload_len);
        if (h.type != WAN_JOIN || wan_msg_get_join(&r, &j))
            rc = cirrus_fail(err, CIRRUS_ECORRUPT, "expected a JOIN");
    }
    if (!rc && j.n_fragments == (uint32_t)os->group->n_lanes) /* check_join checks it */
        os = rv->os = os->group->lane[j.fragment];
    if (!rc) rc = check_join(os, &j, os->o.tls ? cert_region : NULL, err);
    if (!rc) note_round(os, (int)j.index, j.round);
    if (rc) {
        if (rc != CIRRUS_ECORRUPT && rc != CIRRUS_ECLOSED && rc != CIRRUS_ETIMEDOUT)
            rpc_refuse(rv->c, 0, rc, err->msg, 1000);
        return rc;
    }
    wire_writer w;
    wire_writer_init(&w, 512);
    wan_join me = my_join(os);
    wan_msg_put_join(&w, &me);
    rc = net_send_frame(rv->c, WAN_JOIN_OK, h.request_id, w.data, (uint32_t)w.len,
                        WAN_IO_TIMEOUT_MS);
    wire_writer_free(&w);
    rv->from = (int)j.index;
    if (!rc) {
        pthread_mutex_lock(&rv->home->mu);
        slot_joined(rv->home, rv->slot, rv->from, os->fragment);
        pthread_mutex_unlock(&rv->home->mu);
    }
    return rc;
}

/* A connection refused at accept or in its handshake: counted, logged sampled by kind. */
static void refused(outer_lane *os, const char *from, const char *why)
{
    atomic_fetch_add(&os->refused, 1);
    log_warn_sampled(log_kind(&os->refusals_seen, why), "outer: refused WAN connection from %s: %s",
                     from, why);
}

static void *receive_main(void *arg)
{
    receiver *rv = arg;
    cirrus_error err = {0};
    net_set_max_payload(rv->c, WAN_PART_BYTES + 256);
    keep_alive(rv->c);
    int rc = receive_handshake(rv, &err);
    if (rc) refused(rv->home, net_peer_name(rv->c), err.msg);
    outer_lane *const os = rv->os; /* the lane the JOIN named */
    while (!rc && !atomic_load(&os->stopping)) {
        struct pollfd pfd = {.fd = net_fd(rv->c), .events = POLLIN};
        if (!net_pending(rv->c)) { /* TLS may hold a decrypted record already */
            int pr = poll(&pfd, 1, WAN_POLL_MS);
            if (pr < 0 && errno != EINTR) break;
            if (pr <= 0) continue;
        }
        /* The frame's first bytes are here (a message's first PART follows a quiet spell:
         * this is when it began to arrive). */
        const int64_t frame_ms = net_now_ms();
        wire_header h;
        const uint8_t *p;
        if ((rc = net_recv_frame(rv->c, &h, &p, WAN_IO_TIMEOUT_MS, &err))) {
            if (rc != CIRRUS_ECLOSED)
                log_warn("outer: WAN connection from region %s dropped: %s", os->names[rv->from],
                         err.msg);
            break;
        }
        wire_reader r;
        wire_reader_init(&r, p, h.payload_len);
        pthread_mutex_lock(&os->mu);
        if (h.type == WAN_PART) {
            wan_part part;
            rc = wan_msg_get_part(&r, os->max_message, &part)
                     ? cirrus_fail(&err, CIRRUS_ECORRUPT, "malformed PART")
                     : take_part(os, rv->from, &part, frame_ms, &err);
        } else if (h.type == WAN_DONE) {
            wan_done d;
            uint64_t receive_ms = 0;
            rc = wan_msg_get_done(&r, os->max_message, &d)
                     ? cirrus_fail(&err, CIRRUS_ECORRUPT, "malformed DONE")
                     : take_done(os, rv->from, &d, &receive_ms, &err);
            if (rc == 0 || rc == CIRRUS_ETRUNC || rc == CIRRUS_ECONFLICT ||
                rc == WAN_LEFT_OUT) { /* answered */
                pthread_mutex_unlock(&os->mu);
                wire_writer w;
                wire_writer_init(&w, 16);
                wan_msg_put_done_ok(&w, d.round, receive_ms);
                int src = rc ? rpc_refuse(rv->c, h.request_id, rc, err.msg, WAN_IO_TIMEOUT_MS)
                             : net_send_frame(rv->c, WAN_DONE_OK, h.request_id, w.data,
                                              (uint32_t)w.len, WAN_IO_TIMEOUT_MS);
                wire_writer_free(&w);
                rc = rc ? 0 : src; /* a refusal is an answer, not a reason to drop */
                pthread_mutex_lock(&os->mu);
            }
        } else if (h.type == WAN_STATE) {
            rc = serve_state(os, rv, &h, &r, &err); /* unlocks and locks mu */
        } else {
            rc = cirrus_fail(&err, CIRRUS_ECORRUPT, "unexpected frame type %u", h.type);
        }
        count_bytes(os, rv->c, &rv->seen_sent, &rv->seen_recv);
        pthread_mutex_unlock(&os->mu);
        if (rc) {
            atomic_fetch_add(&os->dropped, 1);
            log_warn_sampled(log_kind(&os->drops_seen, err.msg),
                             "outer: dropped the WAN connection from region %s: %s",
                             os->names[rv->from], err.msg);
        }
    }
    pthread_mutex_lock(&os->mu);
    count_bytes(os, rv->c, &rv->seen_sent, &rv->seen_recv);
    pthread_mutex_unlock(&os->mu);
    outer_lane *home = rv->home;
    pthread_mutex_lock(&home->mu);
    home->rslot[rv->slot].c = NULL;
    home->receivers--;
    pthread_cond_broadcast(&home->changed);
    pthread_mutex_unlock(&home->mu);
    net_close(rv->c);
    free(rv->snap);
    free(rv);
    return NULL;
}

static void *accept_main(void *arg)
{
    outer_lane *os = arg;
    while (!atomic_load(&os->stopping)) {
        net_conn *c = NULL;
        cirrus_error err = {0};
        int rc = net_accept(os->lfd, WAN_POLL_MS, &c, &err);
        if (rc == CIRRUS_ETIMEDOUT) continue;
        if (!rc) net_conn_set_pacer(c, os->group->pacer); /* its answers (a state fetch) go up too */
        if (rc) {
            log_warn("outer: accept: %s", err.msg);
            usleep(50 * 1000);
            continue;
        }
        /* The address it came from, without the port. */
        char addr[64];
        snprintf(addr, sizeof addr, "%s", net_peer_name(c));
        char *colon = strrchr(addr, ':');
        if (colon) *colon = '\0';
        pthread_mutex_lock(&os->mu);
        int slot = -1, handshaking = 0, from_addr = 0;
        for (int i = 0; i < os->n_rslot; i++) {
            const struct receiver_slot *s = &os->rslot[i];
            if (!s->c) {
                if (slot < 0) slot = i;
                continue;
            }
            if (s->from >= 0) continue;
            handshaking++;
            from_addr += strcmp(s->addr, addr) == 0;
        }
        const char *why = slot < 0 ? "too many open"
                          : handshaking >= WAN_MAX_HANDSHAKES ? "too many in their handshake"
                          : from_addr >= WAN_HANDSHAKES_PER_ADDR
                              ? "too many in their handshake from that address"
                              : NULL;
        if (!why) {
            os->receivers++;
            os->rslot[slot] = (struct receiver_slot){.c = c, .from = -1, .fragment = -1,
                                                     .since_ms = net_now_ms()};
            snprintf(os->rslot[slot].addr, sizeof os->rslot[slot].addr, "%s", addr);
        }
        pthread_mutex_unlock(&os->mu);
        receiver *rv = why ? NULL : calloc(1, sizeof *rv);
        pthread_t th;
        pthread_attr_t attr;
        int ok = 0;
        if (rv && pthread_attr_init(&attr) == 0) {
            *rv = (receiver){.home = os, .os = os, .c = c, .from = 0, .slot = slot};
            pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
            ok = pthread_create(&th, &attr, receive_main, rv) == 0;
            pthread_attr_destroy(&attr);
        }
        if (ok) continue;
        refused(os, net_peer_name(c), why ? why : "cannot start a thread");
        free(rv);
        if (!why) {
            pthread_mutex_lock(&os->mu);
            os->rslot[slot].c = NULL;
            os->receivers--;
            pthread_mutex_unlock(&os->mu);
        }
        net_close(c);
    }
    return NULL;
}

int wan_link_start(outer_lane *os, cirrus_error *err)
{
    if (os->fragment > 0) return 0; /* the first lane accepts every lane's connections */
    os->n_rslot = WAN_MAX_RECEIVERS(os->group->n_lanes);
    if (!(os->rslot = calloc((size_t)os->n_rslot, sizeof os->rslot[0])))
        return cirrus_fail(err, CIRRUS_ENOMEM, "out of memory for the WAN receivers");
    if (os->lfd < 0) {
        char host[256];
        int port, bound;
        int rc = net_split_hostport(os->addrs[os->o.region_index], host, sizeof host, &port, 1,
                                    err);
        if (!rc) rc = net_listen(host, port, &os->lfd, &bound, err);
        if (rc) return rc;
    }
    if (pthread_create(&os->acceptor, NULL, accept_main, os) != 0)
        return cirrus_fail(err, CIRRUS_ENOMEM, "cannot start the WAN accept thread");
    os->acceptor_started = 1;
    return 0;
}

void wan_link_stop(outer_lane *os)
{
    atomic_store(&os->stopping, 1);
    if (os->acceptor_started) pthread_join(os->acceptor, NULL);
    pthread_mutex_lock(&os->mu);
    while (os->receivers > 0) pthread_cond_wait(&os->changed, &os->mu);
    pthread_mutex_unlock(&os->mu);
    for (int j = 0; j < WAN_MAX_REGIONS; j++)
        if (os->peer[j].out) net_close(os->peer[j].out);
    if (os->lfd >= 0) close(os->lfd);
    os->lfd = -1;
    free(os->rslot);
    os->rslot = NULL;
}

/* ---- the sending side ---- */

/* pe->out changes only under mu (wan_link_interrupt shuts its socket down from another
 * thread); it is used without mu by the one thread that sends to region j. */
static void sender_drop(outer_lane *os, int j, const cirrus_error *why)
{
    wan_peer *pe = &os->peer[j];
    pthread_mutex_lock(&os->mu);
    net_conn *c = pe->out;
    if (c) count_bytes(os, c, &pe->out_sent, &pe->out_received);
    pe->out = NULL;
    pe->up = 0;
    snprintf(pe->last_error, sizeof pe->last_error, "%s", why->msg);
    pthread_mutex_unlock(&os->mu);
    if (c) net_close(c);
}

void wan_link_interrupt(outer_lane *os)
{
    pthread_mutex_lock(&os->mu);
    for (int j = 0; j < WAN_MAX_REGIONS; j++)
        if (os->peer[j].out) shutdown(net_fd(os->peer[j].out), SHUT_RDWR);
    /* A receiver part-way through a frame on a link that was cut would wait out the frame
     * timeout. */
    for (int i = 0; i < os->n_rslot; i++)
        if (os->rslot[i].c) shutdown(net_fd(os->rslot[i].c), SHUT_RDWR);
    pthread_mutex_unlock(&os->mu);
}

static int sender_connect(outer_lane *os, int j, cirrus_error *err)
{
    wan_peer *pe = &os->peer[j];
    char host[256];
    int port;
    net_conn *c = NULL;
    int rc = net_split_hostport(os->addrs[j], host, sizeof host, &port, 0, err);
    if (!rc) rc = net_connect(host, port, WAN_CONNECT_MS, &c, err);
    if (rc) return rc;
    keep_alive(c);
    net_conn_set_pacer(c, os->group->pacer);
    pthread_mutex_lock(&os->mu);
    pe->out = c;
    pthread_mutex_unlock(&os->mu);
    pe->out_sent = pe->out_received = 0;
    char cert_region[WAN_REGION_MAX + 1] = "";
    if (os->o.tls)
        rc = net_tls_connect(pe->out, os->o.tls, os->names[j], cert_region, sizeof cert_region,
                             WAN_HANDSHAKE_MS, err);
    if (!rc)
        rc = net_hello_client(pe->out, os->job, WAN_ROLE_GATEWAY,
                              (uint32_t)os->o.region_index, WAN_HANDSHAKE_MS, err);
    wire_writer w;
    wire_writer_init(&w, 512);
    wan_join me = my_join(os), them;
    wan_msg_put_join(&w, &me);
    wire_reader r;
    if (!rc) rc = rpc_call(pe->out, WAN_JOIN, 1, &w, WAN_HANDSHAKE_MS, os->names[j], &r, err);
    wire_writer_free(&w);
    if (!rc && wan_msg_get_join(&r, &them))
        rc = cirrus_fail(err, CIRRUS_ECORRUPT, "malformed JOIN_OK");
    if (!rc && them.index != (uint32_t)j)
        rc = cirrus_fail(err, CIRRUS_EMISMATCH, "the gateway at %s is region %u, not %d",
                         os->addrs[j], them.index, j);
    if (!rc) rc = check_join(os, &them, os->o.tls ? cert_region : NULL, err);
    if (rc) return rc;
    note_round(os, j, them.round);
    net_set_max_payload(pe->out, (uint32_t)(WAN_STATE_SLICE * sizeof(float) + 64));
    pthread_mutex_lock(&os->mu);
    pe->up = 1;
    pe->last_error[0] = '\0';
    pthread_mutex_unlock(&os->mu);
    log_info("outer: WAN link to region %s (%s) up%s", os->names[j], os->addrs[j],
             os->o.tls ? ", TLS 1.3, certificate checked" : ", plaintext (--wan-insecure)");
    return 0;
}

/* One attempt: the message as PARTs, then DONE and its answer (*receive_ms: how long the
 * receiver saw the message arrive; 0: it had it already). */
static int send_once(outer_lane *os, int j, uint64_t round, const uint8_t *msg, uint64_t len,
                     uint64_t tokens, uint64_t prev_digest, uint64_t *receive_ms,
                     cirrus_error *err)
{
    net_conn *c = os->peer[j].out;
    int rc = 0;
    for (uint64_t off = 0; !rc && (off < len || off == 0);) {
        const uint64_t take = len - off < WAN_PART_BYTES ? len - off : WAN_PART_BYTES;
        wire_writer w;
        wire_writer_init(&w, WAN_PART_BYTES + 64);
        const wan_part part = {.round = round, .total = len, .offset = off, .bytes = msg + off,
                               .len = take};
        wan_msg_put_part(&w, &part);
        rc = net_send_frame(c, WAN_PART, 0, w.data, (uint32_t)w.len, WAN_IO_TIMEOUT_MS);
        wire_writer_free(&w);
        off += take;
        if (atomic_load(&os->stopping)) rc = cirrus_fail(err, CIRRUS_ECLOSED, "stopping");
        if (len == 0) break;
    }
    if (rc)
        return cirrus_fail(err, rc, "sending the delta: %s%s", cirrus_strerror(rc),
                           net_conn_transport(c)->last_error
                               ? net_conn_transport(c)->last_error(c) : "");
    pthread_mutex_lock(&os->mu);
    os->payload_sent += len;
    count_bytes(os, c, &os->peer[j].out_sent, &os->peer[j].out_received);
    pthread_mutex_unlock(&os->mu);
    wire_writer w;
    wire_writer_init(&w, 64);
    const wan_done d = {round, tokens, prev_digest, len, XXH3_64bits(msg, len)};
    wan_msg_put_done(&w, &d);
    wire_reader r;
    rc = rpc_call(c, WAN_DONE, round, &w, WAN_IO_TIMEOUT_MS, os->names[j], &r, err);
    wire_writer_free(&w);
    uint64_t acked;
    if (!rc && (wan_msg_get_done_ok(&r, &acked, receive_ms) || acked != round))
        rc = cirrus_fail(err, CIRRUS_ECORRUPT, "malformed DONE_OK");
    return rc;
}

int wan_link_send(outer_lane *os, int j, uint64_t round, const uint8_t *msg, uint64_t len,
                  uint64_t tokens, uint64_t prev_digest, int64_t deadline_ms, cirrus_error *err)
{
    int backoff_ms = 100;
    for (;;) {
        int rc = os->peer[j].out ? 0 : sender_connect(os, j, err);
        const int64_t t0 = net_now_ms();
        uint64_t receive_ms = 0;
        if (!rc) rc = send_once(os, j, round, msg, len, tokens, prev_digest, &receive_ms, err);
        if (!rc) {
            /* What the link carried: the message over the time the receiver saw it arrive
             * (the acknowledgement's way back queues behind the other direction's message
             * and is no part of this link's rate); the whole exchange when the receiver had
             * it already, and never less; into the estimate as adapt_rate_update says. */
            const double whole = (net_now_ms() - t0 + 1) / 1000.0;
            const double s = receive_ms > 0 && receive_ms / 1000.0 < whole ? receive_ms / 1000.0
                                                                           : whole;
            const double rate = (double)len / s;
            pthread_mutex_lock(&os->mu);
            wan_peer *pe = &os->peer[j];
            pe->rate_Bps = adapt_rate_update(pe->rate_Bps, len, s);
            pe->last_bytes = len;
            pe->last_send_s = s;
            pthread_mutex_unlock(&os->mu);
            log_info("outer round %llu: %llu-byte message to region %s in %.3f s (%.2f Mbit/s; "
                     "acknowledged after %.3f s)", (unsigned long long)round,
                     (unsigned long long)len, os->names[j], s, rate * 8e-6, whole);
            return 0;
        }
        /* The receiver is behind: it is taking the job's state (ours, most likely) and
         * wants this round's message once it has: the same message again, shortly, on the
         * same connection. Refused, it would wait for the message to the round's deadline,
         * miss the round, and fall behind again — one round behind to the end. */
        const int behind = rc == CIRRUS_ECONFLICT;
        /* Any other refusal is final for this round: it refuses what we are. */
        if (!behind && !rpc_is_fault(rc)) return rc;
        if (!behind) sender_drop(os, j, err);
        if (atomic_load(&os->stopping) || net_now_ms() + backoff_ms > deadline_ms) return rc;
        log_warn("outer: WAN link to region %s: %s; again in %d ms", os->names[j], err->msg,
                 backoff_ms);
        usleep((useconds_t)backoff_ms * 1000);
        backoff_ms = backoff_ms * 2 > 5000 ? 5000 : backoff_ms * 2;
    }
}

void wan_link_probe(outer_lane *os, int64_t deadline_ms)
{
    for (int j = 0; j < os->o.n_regions && net_now_ms() < deadline_ms; j++) {
        if (j == os->o.region_index || os->peer[j].out) continue;
        cirrus_error err = {0};
        if (sender_connect(os, j, &err)) sender_drop(os, j, &err);
    }
}

int wan_link_fetch_state(outer_lane *os, int j, int64_t min_round, int64_t deadline_ms,
                         float *theta, float *mom, int64_t *round, uint64_t *digest,
                         cirrus_error *err)
{
    /* A slice must cross within the frame timeout: on a slow link (1 Mbit/s: 4 MiB take 34 s)
     * ask for what the link to j carried in a third of it, and for a quarter as much after
     * a slice that timed out (the rate may be unknown, or the link slower now). */
    uint64_t slice = WAN_STATE_SLICE;
    pthread_mutex_lock(&os->mu);
    const double rate = os->peer[j].rate_Bps;
    pthread_mutex_unlock(&os->mu);
    if (rate > 0 && rate * (WAN_IO_TIMEOUT_MS / 3000.0) / sizeof(float) < (double)slice)
        slice = (uint64_t)(rate * (WAN_IO_TIMEOUT_MS / 3000.0) / sizeof(float));
    if (slice < WAN_STATE_SLICE_MIN) slice = WAN_STATE_SLICE_MIN;
    for (int attempt = 0;; attempt++) {
        int rc = os->peer[j].out ? 0 : sender_connect(os, j, err);
        uint64_t r0 = 0, d0 = 0;
        for (uint64_t off = 0; !rc && off < 2 * os->n;) {
            const uint64_t count = 2 * os->n - off < slice ? 2 * os->n - off : slice;
            wire_writer w;
            wire_reader r;
            wire_writer_init(&w, 32);
            wan_msg_put_state(&w, off, count);
            rc = rpc_call(os->peer[j].out, WAN_STATE, off + 1, &w, WAN_IO_TIMEOUT_MS,
                          os->names[j], &r, err);
            wire_writer_free(&w);
            wan_state_slice sl;
            if (!rc && wan_msg_get_state_ok(&r, count, &sl))
                rc = cirrus_fail(err, CIRRUS_ECORRUPT, "malformed STATE_OK");
            if (!rc && off == 0) r0 = sl.round, d0 = sl.digest;
            if (!rc && (sl.round != r0 || sl.digest != d0))
                rc = cirrus_fail(err, CIRRUS_ECONFLICT, "its state changed during the fetch");
            if (!rc && (int64_t)r0 < min_round)
                rc = cirrus_fail(err, CIRRUS_ECONFLICT, "it is at outer step %llu, not yet %lld",
                                 (unsigned long long)r0, (long long)min_round);
            for (uint64_t i = 0; !rc && i < count; i++) { /* the slice may span both */
                float v;
                memcpy(&v, sl.floats + i * sizeof(float), sizeof v);
                if (off + i < os->n) theta[off + i] = v;
                else mom[off + i - os->n] = v;
            }
            off += count;
        }
        if (!rc && outer_state_digest(theta, mom, os->n) != d0)
            rc = cirrus_fail(err, CIRRUS_ECORRUPT, "the state does not match its digest");
        if (!rc) {
            *round = (int64_t)r0;
            *digest = d0;
            return 0;
        }
        if (rc != CIRRUS_ECONFLICT && rc != CIRRUS_ENOENT) sender_drop(os, j, err);
        if (rc == CIRRUS_ETIMEDOUT && slice / 4 >= WAN_STATE_SLICE_MIN) slice /= 4;
        if (atomic_load(&os->stopping) || net_now_ms() + 200 > deadline_ms) return rc;
        usleep(attempt < 10 ? 100 * 1000 : 500 * 1000);
    }
}
