/* server: the coordinator's peer-protocol server — the accept loop (which also expires
 * members and runs the rebalancer on time), a thread per connection, and the table that
 * dispatches each request. See coord_internal.h. */
#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <unistd.h>

#include "../../../common/log.h"
#include "../../net/conn.h"
#include "../proto/rpc.h"
#include "coord_internal.h"

/* ---- requests: the dispatch table ---- */

int coord_malformed(outcome *oc)
{
    oc->drop = 1;
    return oc->err.code = CIRRUS_ECORRUPT;
}

static int serve(coordinator *co, const wire_header *h, const uint8_t *p, wire_writer *reply,
                 outcome *oc)
{
    switch (h->type) {
    case COORD_REGISTER: return coord_members_register(co, p, h->payload_len, reply, oc);
    case COORD_HEARTBEAT: return coord_members_heartbeat(co, p, h->payload_len, reply, oc);
    case COORD_CLIENT_REPORT: return coord_members_report(co, p, h->payload_len, reply, oc);
    case COORD_PEERS: return coord_members_peers(co, p, h->payload_len, reply, oc);
    case COORD_LEAVE: return coord_members_leave(co, p, h->payload_len, oc);
    case COORD_STEP_SYNC: return coord_barrier_step_sync(co, p, h->payload_len, reply, oc);
    case WIRE_PING:
        if (h->payload_len == 0) return 0;
        cirrus_fail(&oc->err, CIRRUS_ECORRUPT, "PING with a %u-byte payload", h->payload_len);
        return coord_malformed(oc);
    default:
        if (co->o.ext_handler && h->type >= COORD_EXT_FIRST && h->type <= COORD_EXT_LAST &&
            !(h->type & 1))
            return co->o.ext_handler(co->o.ext_ctx, h->type, p, h->payload_len, reply,
                                     &oc->drop, &oc->err);
        cirrus_fail(&oc->err, CIRRUS_ECORRUPT, "unknown request type %u", h->type);
        return coord_malformed(oc);
    }
}

static uint16_t reply_type(uint16_t type)
{
    return type == WIRE_PING ? WIRE_PONG : (uint16_t)(type + 1);
}

/* ---- connections ---- */

typedef struct conn_job {
    coordinator *co;
    net_conn *c;
} conn_job;

static void *conn_main(void *arg)
{
    conn_job *job = arg;
    coordinator *co = job->co;
    net_conn *c = job->c;
    free(job);
    cirrus_error err = {0};
    uint16_t role;
    uint32_t hello_id;
    net_set_max_payload(c, co->o.ext_handler && co->o.ext_request_limit > COORD_REQUEST_LIMIT
                               ? co->o.ext_request_limit
                               : COORD_REQUEST_LIMIT);
    if (net_hello_server(c, co->job_id, &role, &hello_id, COORD_IO_TIMEOUT_MS, &err)) {
        log_warn("dropped %s: %s", net_peer_name(c), err.msg);
        goto out;
    }
    int64_t idle_until = clock_now_ms() + co->o.idle_ms;
    while (!atomic_load(&co->stopping)) {
        /* Wait for the first byte of a frame here, not inside net_recv_frame: a receive
         * that timed out mid-frame would leave the stream at an unknown position. */
        struct pollfd pfd = {.fd = net_fd(c), .events = POLLIN};
        int pr = poll(&pfd, 1, COORD_POLL_MS);
        if (pr < 0 && errno != EINTR) break;
        if (pr <= 0) {
            if (clock_now_ms() > idle_until) {
                log_info("closing %s: idle for %u ms", net_peer_name(c), co->o.idle_ms);
                break;
            }
            continue;
        }
        wire_header h;
        const uint8_t *p;
        int rc = net_recv_frame(c, &h, &p, COORD_IO_TIMEOUT_MS, &err);
        if (rc == CIRRUS_ECLOSED) break;
        if (rc) {
            log_warn("dropped %s: %s", net_peer_name(c), err.msg);
            break;
        }
        idle_until = clock_now_ms() + co->o.idle_ms;
        wire_writer reply;
        wire_writer_init(&reply, COORD_REPLY_LIMIT);
        outcome oc = {0};
        rc = serve(co, &h, p, &reply, &oc);
        if (!rc && reply.failed) rc = cirrus_fail(&oc.err, CIRRUS_ENOMEM, "reply too large");
        if (rc) {
            if (oc.drop) log_warn("dropped %s: %s", net_peer_name(c), oc.err.msg);
            rpc_refuse(c, h.request_id, rc, oc.err.msg, COORD_IO_TIMEOUT_MS);
            wire_writer_free(&reply);
            if (oc.drop) break;
            continue;
        }
        rc = net_send_frame(c, reply_type(h.type), h.request_id, reply.data, (uint32_t)reply.len,
                            COORD_IO_TIMEOUT_MS);
        wire_writer_free(&reply);
        if (rc) break;
    }
out:
    net_close(c);
    pthread_mutex_lock(&co->mu);
    co->conns--;
    pthread_cond_broadcast(&co->conn_ended);
    pthread_mutex_unlock(&co->mu);
    return NULL;
}

static void spawn_conn(coordinator *co, net_conn *c)
{
    pthread_mutex_lock(&co->mu);
    int full = co->conns >= co->max_conns;
    if (!full) co->conns++;
    pthread_mutex_unlock(&co->mu);
    if (full) {
        log_warn("refused %s: %u connections open", net_peer_name(c), co->max_conns);
        net_close(c);
        return;
    }
    conn_job *job = malloc(sizeof *job);
    pthread_attr_t attr;
    pthread_t th;
    int ok = 0;
    if (job && pthread_attr_init(&attr) == 0) {
        *job = (conn_job){co, c};
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        pthread_attr_setstacksize(&attr, COORD_THREAD_STACK);
        ok = pthread_create(&th, &attr, conn_main, job) == 0;
        pthread_attr_destroy(&attr);
    }
    if (ok) return;
    log_warn("refused %s: cannot start a thread", net_peer_name(c));
    free(job);
    net_close(c);
    pthread_mutex_lock(&co->mu);
    co->conns--;
    pthread_cond_broadcast(&co->conn_ended);
    pthread_mutex_unlock(&co->mu);
}

static void *accept_main(void *arg)
{
    coordinator *co = arg;
    while (!atomic_load(&co->stopping)) {
        net_conn *c = NULL;
        cirrus_error err = {0};
        int rc = net_accept(co->lfd, COORD_POLL_MS, &c, &err);
        if (rc == 0) spawn_conn(co, c);
        else if (rc != CIRRUS_ETIMEDOUT) {
            log_warn("accept: %s", err.msg);
            usleep(50 * 1000); /* e.g. out of descriptors: do not spin */
        }
        /* Expire on time even when nobody is asking; rebalance when a period is over. */
        pthread_mutex_lock(&co->mu);
        int64_t now = clock_now_ms();
        coord_members_reap(co, now);
        coord_moves_rebalance(co, now);
        pthread_mutex_unlock(&co->mu);
    }
    return NULL;
}

int coord_server_start(coordinator *co, cirrus_error *err)
{
    if (pthread_create(&co->acceptor, NULL, accept_main, co) != 0)
        return cirrus_fail(err, CIRRUS_ENOMEM, "cannot start the accept thread");
    co->acceptor_started = 1;
    return 0;
}

void coord_server_stop(coordinator *co)
{
    atomic_store(&co->stopping, 1);
    if (co->acceptor_started) pthread_join(co->acceptor, NULL);
    /* Connection threads see the flag within COORD_POLL_MS (or once their request is
     * answered); they own the table's lock while they work, so wait for all of them. */
    pthread_mutex_lock(&co->mu);
    while (co->conns > 0) pthread_cond_wait(&co->conn_ended, &co->mu);
    pthread_mutex_unlock(&co->mu);
}
