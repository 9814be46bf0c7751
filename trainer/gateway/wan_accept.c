/* wan_accept: the receiving side of a lane's WAN connections (see wan_link.c): the first
 * lane's acceptor, which takes every lane's connections, and one receiver thread per
 * connection, which keeps the messages (PART, DONE), answers where a cut message stands
 * (HAVE) and serves state fetches (STATE). */
#include "wan_link_internal.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <xxhash.h>

#include "../../common/log.h"
#include "../swarm/proto/rpc.h"

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
    outer_schedule snap_sched;
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
    /* A gap: bytes before it are missing (cannot happen on one stream). A PART that
     * overlaps what arrived: a sender resuming from what HAVE said while its cut connection
     * still delivered a little more; the same bytes (DONE's hash checks the whole), of which
     * only those past got are new. */
    if (p->offset > sl->got || p->offset + p->len <= sl->got) return 0;
    const uint64_t skip = sl->got - p->offset;
    memcpy(sl->bytes + sl->got, p->bytes + skip, p->len - skip);
    sl->got += p->len - skip;
    sl->progress_ms = net_now_ms();
    return 0;
}

/* HAVE: how much of region `from`'s message of `round` (total bytes) is here, and its
 * hash, for a sender resuming it on a new connection. Under mu. */
static void have_part(outer_lane *os, int from, uint64_t round, uint64_t total, uint64_t *got,
                      uint64_t *hash)
{
    const round_slot *sl = &os->slot[round & 1][from];
    *got = 0;
    *hash = 0;
    if (sl->round != round || sl->total != total || !sl->bytes) return;
    *got = sl->got;
    *hash = XXH3_64bits(sl->bytes, sl->got);
}

/* DONE: the message must be whole and hash right; then the round holds it, and
 * *receive_ms says how long it took to arrive, its DONE having reached the kernel at
 * done_ms. Under mu. */
static int take_done(outer_lane *os, int from, const wan_done *d, int64_t done_ms,
                     uint64_t *receive_ms, cirrus_error *err)
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
    sl->at = d->at;
    sl->wish = d->wish;
    sl->complete = 1;
    const int64_t took = done_ms - sl->first_ms;
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
        rv->snap_sched = os->sched;
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
    wan_msg_put_state_ok(&w, (uint64_t)rv->snap_round, rv->snap_digest, &rv->snap_sched,
                         rv->snap + off, count);
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
    if (!rc) rc = wan_check_join(os, &j, os->o.tls ? cert_region : NULL, err);
    if (!rc) wan_note_round(os, (int)j.index, j.round);
    if (rc) {
        if (rc != CIRRUS_ECORRUPT && rc != CIRRUS_ECLOSED && rc != CIRRUS_ETIMEDOUT)
            rpc_refuse(rv->c, 0, rc, err->msg, 1000);
        return rc;
    }
    wire_writer w;
    wire_writer_init(&w, 512);
    wan_join me = wan_my_join(os);
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

/* When the connection's latest bytes reached the kernel: now, less the time TCP_INFO says
 * has passed since. On a loaded machine this thread may get a CPU well after a message's
 * last bytes came in, and that wait is no part of the link's rate (a 0.1 s wait made an
 * 85 KB message at 2 Mbit/s read as 75% of the link). Now, where TCP_INFO has no answer. */
int64_t wan_last_arrival_ms(int fd)
{
    struct tcp_info ti;
    socklen_t len = sizeof ti;
    const int64_t now = net_now_ms();
    if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) ||
        len < offsetof(struct tcp_info, tcpi_last_data_recv) + sizeof ti.tcpi_last_data_recv ||
        ti.tcpi_last_data_recv > 60000)
        return now;
    return now - (int64_t)ti.tcpi_last_data_recv;
}

static void *receive_main(void *arg)
{
    receiver *rv = arg;
    cirrus_error err = {0};
    net_set_max_payload(rv->c, WAN_PART_BYTES + 256);
    wan_keep_alive(rv->c);
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
                     : take_done(os, rv->from, &d, wan_last_arrival_ms(net_fd(rv->c)),
                                 &receive_ms, &err);
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
        } else if (h.type == WAN_HAVE) {
            uint64_t round, total, got = 0, hash = 0;
            rc = wan_msg_get_have(&r, os->max_message, &round, &total)
                     ? cirrus_fail(&err, CIRRUS_ECORRUPT, "malformed HAVE") : 0;
            if (!rc) {
                have_part(os, rv->from, round, total, &got, &hash);
                pthread_mutex_unlock(&os->mu);
                wire_writer w;
                wire_writer_init(&w, 16);
                wan_msg_put_have_ok(&w, got, hash);
                rc = net_send_frame(rv->c, WAN_HAVE_OK, h.request_id, w.data, (uint32_t)w.len,
                                    WAN_IO_TIMEOUT_MS);
                wire_writer_free(&w);
                pthread_mutex_lock(&os->mu);
            }
        } else if (h.type == WAN_STATE) {
            rc = serve_state(os, rv, &h, &r, &err); /* unlocks and locks mu */
        } else {
            rc = cirrus_fail(&err, CIRRUS_ECORRUPT, "unexpected frame type %u", h.type);
        }
        wan_count_bytes(os, rv->c, &rv->seen_sent, &rv->seen_recv);
        pthread_mutex_unlock(&os->mu);
        if (rc) {
            atomic_fetch_add(&os->dropped, 1);
            log_warn_sampled(log_kind(&os->drops_seen, err.msg),
                             "outer: dropped the WAN connection from region %s: %s",
                             os->names[rv->from], err.msg);
        }
    }
    pthread_mutex_lock(&os->mu);
    wan_count_bytes(os, rv->c, &rv->seen_sent, &rv->seen_recv);
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
