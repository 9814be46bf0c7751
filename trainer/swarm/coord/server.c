/* server: the coordinator's peer-protocol server — the table that dispatches each request,
 * served by proto/rpc_server.c's loop, whose accept thread also expires members and runs
 * the rebalancer on time. See coord_internal.h. */
#include "../proto/rpc_server.h"
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
    default:
        if (co->o.ext_handler && h->type >= COORD_EXT_FIRST && h->type <= COORD_EXT_LAST &&
            !(h->type & 1))
            return co->o.ext_handler(co->o.ext_ctx, h->type, p, h->payload_len, reply,
                                     &oc->drop, &oc->err);
        cirrus_fail(&oc->err, CIRRUS_ECORRUPT, "unknown request type %u", h->type);
        return coord_malformed(oc);
    }
}

/* ---- connections: proto/rpc_server.c's loop ---- */

static int handle(void *ctx, rpc_server_conn *sc, const wire_header *h, const uint8_t *p,
                  wire_writer *reply, int *drop, cirrus_error *err)
{
    (void)sc;
    outcome oc = {0};
    int rc = serve(ctx, h, p, reply, &oc);
    if (rc) {
        *drop = oc.drop;
        *err = oc.err;
    }
    return rc;
}

/* Expire on time even when nobody is asking; rebalance when a period is over. */
static void tick(void *ctx)
{
    coordinator *co = ctx;
    pthread_mutex_lock(&co->mu);
    int64_t now = clock_now_ms();
    coord_members_reap(co, now);
    coord_moves_rebalance(co, now);
    pthread_mutex_unlock(&co->mu);
}

int coord_server_start(coordinator *co, cirrus_error *err)
{
    const rpc_server_options so = {
        .what = "coordinator",
        .listen_fd = co->lfd,
        .job_id = co->job_id,
        .hello_timeout_ms = COORD_IO_TIMEOUT_MS,
        .io_timeout_ms = COORD_IO_TIMEOUT_MS,
        .max_payload = co->o.ext_handler && co->o.ext_request_limit > COORD_REQUEST_LIMIT
                           ? co->o.ext_request_limit
                           : COORD_REQUEST_LIMIT,
        .reply_limit = COORD_REPLY_LIMIT,
        .idle_ms = co->o.idle_ms,
        .max_conns = (int)co->max_conns,
        .max_hellos_per_addr = 16, /* a pod's own members; local regions share 127.0.0.1 */
        .poll_ms = COORD_POLL_MS,
        .stack_bytes = COORD_THREAD_STACK,
        .ctx = co,
        .handle = handle,
        .tick = tick,
    };
    return rpc_server_start(&so, &co->server, err);
}

void coord_server_stop(coordinator *co)
{
    /* Requests waiting at the barrier see the flag and give up; the server then waits for
     * every connection thread (each owns the table's lock while it works). */
    atomic_store(&co->stopping, 1);
    rpc_server_stop(co->server);
    co->server = NULL;
}
