/* wan_link: the outer sync's connections to the other gateways (see wan_msg.h).
 *
 * Each gateway sends on connections it opened and receives on connections it accepted, so
 * every connection carries one direction of messages and its own replies: a receiver never
 * waits on a sender and the other way round. A connection is TLS 1.3 with the job's
 * certificates (the other end must present a certificate of this job's CA naming the
 * region it claims) unless the gateway runs --wan-insecure; either way the sync code below
 * speaks frames over a net_conn and never asks which.
 *
 * This file: what both sides share, and the sending side (a lane's connections to the other
 * regions, its messages, state fetches); wan_accept.c: the receiving side.
 */
#include "adapt.h"
#include "wan_link_internal.h"

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

/* Bytes this connection moved since last counted, added to the totals. Under mu. */
void wan_count_bytes(outer_lane *os, net_conn *c, uint64_t *seen_sent, uint64_t *seen_recv)
{
    uint64_t s = 0, r = 0;
    net_conn_bytes(c, &s, &r);
    os->wan_sent += s - *seen_sent;
    os->wan_received += r - *seen_recv;
    atomic_fetch_add(&os->group->wan_bytes, (s - *seen_sent) + (r - *seen_recv));
    *seen_sent = s;
    *seen_recv = r;
}

wan_join wan_my_join(outer_lane *os)
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
int wan_check_join(outer_lane *os, const wan_join *j, const char *cert_region,
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
void wan_keep_alive(net_conn *c)
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
void wan_note_round(outer_lane *os, int j, uint64_t round)
{
    pthread_mutex_lock(&os->mu);
    os->peer[j].round_seen = round == WAN_NO_ROUND ? -1 : (int64_t)round;
    os->peer[j].absent = 0;
    pthread_mutex_unlock(&os->mu);
}

/* ---- the sending side ---- */

/* pe->out changes only under mu (wan_link_interrupt shuts its socket down from another
 * thread); it is used without mu by the one thread that sends to region j. */
static void sender_drop(outer_lane *os, int j, const cirrus_error *why)
{
    wan_peer *pe = &os->peer[j];
    pthread_mutex_lock(&os->mu);
    net_conn *c = pe->out;
    if (c) wan_count_bytes(os, c, &pe->out_sent, &pe->out_received);
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
    wan_keep_alive(c);
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
    wan_join me = wan_my_join(os), them;
    wan_msg_put_join(&w, &me);
    wire_reader r;
    if (!rc) rc = rpc_call(pe->out, WAN_JOIN, 1, &w, WAN_HANDSHAKE_MS, os->names[j], &r, err);
    wire_writer_free(&w);
    if (!rc && wan_msg_get_join(&r, &them))
        rc = cirrus_fail(err, CIRRUS_ECORRUPT, "malformed JOIN_OK");
    if (!rc && them.index != (uint32_t)j)
        rc = cirrus_fail(err, CIRRUS_EMISMATCH, "the gateway at %s is region %u, not %d",
                         os->addrs[j], them.index, j);
    if (!rc) rc = wan_check_join(os, &them, os->o.tls ? cert_region : NULL, err);
    if (rc) return rc;
    wan_note_round(os, j, them.round);
    net_set_max_payload(pe->out, (uint32_t)(WAN_STATE_SLICE * sizeof(float) + 64));
    pthread_mutex_lock(&os->mu);
    pe->up = 1;
    pe->last_error[0] = '\0';
    pthread_mutex_unlock(&os->mu);
    log_info("outer: WAN link to region %s (%s) up%s", os->names[j], os->addrs[j],
             os->o.tls ? ", TLS 1.3, certificate checked" : ", plaintext (--wan-insecure)");
    return 0;
}

/* Where a message cut short on an earlier connection resumes: the bytes region j holds of
 * it (HAVE), when they are this message's first bytes; 0 (the whole message again) when it
 * holds none, another message's (a gateway restarted and encoded the round anew), or the
 * question fails. */
static uint64_t resume_offset(outer_lane *os, int j, uint64_t round, const uint8_t *msg,
                              uint64_t len)
{
    wire_writer w;
    wire_writer_init(&w, 32);
    wan_msg_put_have(&w, round, len);
    wire_reader r;
    cirrus_error err = {0};
    uint64_t got = 0, hash = 0;
    int rc = rpc_call(os->peer[j].out, WAN_HAVE, round, &w, WAN_IO_TIMEOUT_MS, os->names[j],
                      &r, &err);
    wire_writer_free(&w);
    if (rc || wan_msg_get_have_ok(&r, len, &got, &hash) || got == 0) return 0;
    if (XXH3_64bits(msg, got) != hash) {
        log_warn("outer round %llu: region %s holds %llu bytes of another message of this "
                 "round: sending ours whole", (unsigned long long)round, os->names[j],
                 (unsigned long long)got);
        return 0;
    }
    log_info("outer round %llu: the message to region %s resumes at byte %llu of %llu",
             (unsigned long long)round, os->names[j], (unsigned long long)got,
             (unsigned long long)len);
    return got;
}

/* One attempt: the message as PARTs from byte `from`, then DONE and its answer
 * (*receive_ms: how long the receiver saw the message arrive; 0: it had it already). */
static int send_once(outer_lane *os, int j, uint64_t round, const uint8_t *msg, uint64_t len,
                     uint64_t from, const wan_send_meta *meta, uint64_t *receive_ms,
                     cirrus_error *err)
{
    net_conn *c = os->peer[j].out;
    int rc = 0;
    for (uint64_t off = from; !rc && (off < len || off == 0);) {
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
    os->payload_sent += len - from;
    wan_count_bytes(os, c, &os->peer[j].out_sent, &os->peer[j].out_received);
    pthread_mutex_unlock(&os->mu);
    wire_writer w;
    wire_writer_init(&w, 64);
    const wan_done d = {.round = round, .tokens = meta->tokens, .prev_digest = meta->prev_digest,
                        .total = len, .hash = XXH3_64bits(msg, len), .at = meta->at,
                        .wish = meta->wish};
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
                  const wan_send_meta *meta, int64_t deadline_ms, cirrus_error *err)
{
    int backoff_ms = 100, cut = 0;
    for (;;) {
        int rc = os->peer[j].out ? 0 : sender_connect(os, j, err);
        const int64_t t0 = net_now_ms();
        uint64_t receive_ms = 0;
        /* After a cut, the receiver may hold the message's first bytes already. */
        const uint64_t from = !rc && cut ? resume_offset(os, j, round, msg, len) : 0;
        if (!rc)
            rc = send_once(os, j, round, msg, len, from, meta, &receive_ms, err);
        if (!rc) {
            /* What the link carried: the message over the time the receiver saw it arrive
             * (the acknowledgement's way back queues behind the other direction's message
             * and is no part of this link's rate); the whole exchange when the receiver had
             * it already, or when this attempt resumed a message begun before a cut (the
             * receiver's time counts from its first byte), and never less; into the
             * estimate as adapt_rate_update says. */
            const double whole = (net_now_ms() - t0 + 1) / 1000.0;
            const double s = receive_ms > 0 && receive_ms / 1000.0 < whole && from == 0
                                 ? receive_ms / 1000.0 : whole;
            const uint64_t carried = len - from;
            const double rate = (double)carried / s;
            pthread_mutex_lock(&os->mu);
            wan_peer *pe = &os->peer[j];
            adapt_rate_update(&pe->rate, carried, s);
            pe->last_bytes = carried;
            pe->last_send_s = s;
            pthread_mutex_unlock(&os->mu);
            log_info("outer round %llu: %llu-byte message to region %s in %.3f s (%.2f Mbit/s; "
                     "acknowledged after %.3f s)%s", (unsigned long long)round,
                     (unsigned long long)carried, os->names[j], s, rate * 8e-6, whole,
                     from ? ", the rest of one cut short" : "");
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
        cut |= !behind;
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
                         float *theta, float *mom, int64_t *round, outer_schedule *sched,
                         uint64_t *digest, cirrus_error *err)
{
    /* A slice must cross within the frame timeout: on a slow link (1 Mbit/s: 4 MiB take 34 s)
     * ask for what the link to j carried in a third of it, and for a quarter as much after
     * a slice that timed out (the rate may be unknown, or the link slower now). */
    uint64_t slice = WAN_STATE_SLICE;
    pthread_mutex_lock(&os->mu);
    const double rate = os->peer[j].rate.Bps;
    pthread_mutex_unlock(&os->mu);
    if (rate > 0 && rate * (WAN_IO_TIMEOUT_MS / 3000.0) / sizeof(float) < (double)slice)
        slice = (uint64_t)(rate * (WAN_IO_TIMEOUT_MS / 3000.0) / sizeof(float));
    if (slice < WAN_STATE_SLICE_MIN) slice = WAN_STATE_SLICE_MIN;
    for (int attempt = 0;; attempt++) {
        int rc = os->peer[j].out ? 0 : sender_connect(os, j, err);
        uint64_t r0 = 0, d0 = 0;
        outer_schedule s0 = OUTER_SCHEDULE_START;
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
            if (!rc && off == 0) r0 = sl.round, d0 = sl.digest, s0 = sl.sched;
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
        if (!rc && outer_state_digest(theta, mom, os->n, &s0) != d0)
            rc = cirrus_fail(err, CIRRUS_ECORRUPT, "the state does not match its digest");
        if (!rc) {
            *round = (int64_t)r0;
            *sched = s0;
            *digest = d0;
            return 0;
        }
        if (rc != CIRRUS_ECONFLICT && rc != CIRRUS_ENOENT) sender_drop(os, j, err);
        if (rc == CIRRUS_ETIMEDOUT && slice / 4 >= WAN_STATE_SLICE_MIN) slice /= 4;
        if (atomic_load(&os->stopping) || net_now_ms() + 200 > deadline_ms) return rc;
        usleep(attempt < 10 ? 100 * 1000 : 500 * 1000);
    }
}
