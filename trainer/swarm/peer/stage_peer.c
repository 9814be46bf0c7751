/* stage_peer: see stage_peer.h. This file owns the peer: its set-up and tear-down, and its
 * server (proto/rpc_server.c: a thread per connection), whose requests are served under
 * the peer's lock by serve.c. */
#include "stage_peer.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../../common/log.h"
#include "../../model/ops.h"
#include "../proto/rpc_server.h"
#include "peer_internal.h"

/* ---- connections: proto/rpc_server.c's loop ---- */

/* A connection serves the stage the peer had when it was opened (its tag). */
static void conn_opened(void *ctx, rpc_server_conn *sc)
{
    peer *p = ctx;
    pthread_mutex_lock(&p->mu);
    sc->tag = p->gen;
    pthread_mutex_unlock(&p->mu);
}

static int conn_request(void *ctx, rpc_server_conn *sc, const wire_header *h,
                        const uint8_t *payload, wire_writer *reply, int *drop, cirrus_error *err)
{
    peer *p = ctx;
    const char *why = NULL;
    pthread_mutex_lock(&p->mu);
    int rc = peer_serve(p, (uint32_t)sc->tag, h, payload, reply, &why);
    pthread_mutex_unlock(&p->mu);
    if (!rc) return 0;
    cirrus_fail(err, rc, "%s", why ? why : cirrus_strerror(rc));
    /* Malformed: this connection is not speaking our protocol. Anything else is a valid
     * request that could not be done (a ring member vanished, a donor was unreachable):
     * say so and keep serving this client. */
    *drop = rc == CIRRUS_ECORRUPT;
    if (!*drop)
        log_warn("refused %s: %s (request type %u)", net_peer_name(sc->c), err->msg, h->type);
    return rc;
}

static int peer_setup(peer *p, const stage_peer_options *o, cirrus_error *err)
{
    int rc;
    if ((rc = gpt_model_init(&p->model, &o->model, err))) return rc;
    gpt_model_seed(&p->model, o->seed);
    p->n_slots = o->act_slots > 0 ? o->act_slots : STAGE_PEER_DEFAULT_SLOTS;
    if (p->n_slots > STAGE_PEER_MAX_SLOTS)
        return cirrus_fail(err, CIRRUS_EINVAL, "%d activation slots: at most %d", p->n_slots,
                           STAGE_PEER_MAX_SLOTS);
    p->C = (size_t)o->model.n_embd;
    p->V = (size_t)o->model.vocab;
    p->N = (size_t)o->max_B * o->max_T;
    p->stage = o->stage_index;
    p->move_to = -1;
    /* Its name at the coordinator stays the one it started with, also after a move:
     * registering again under it keeps the peer's id (and clears the instruction). */
    if (o->name && o->name[0])
        snprintf(p->name, sizeof p->name, "%s", o->name);
    else
        snprintf(p->name, sizeof p->name, "stage%d-%s-%d", o->stage_index,
                 o->advertise_host ? o->advertise_host : "", o->advertise_port);
    stage_kit kit;
    if ((rc = peer_kit_build(p, o->l0, o->l1, &kit, err))) return rc;
    peer_kit_swap(p, &kit); /* kit now holds the empty start: nothing to free */
    size_t width = p->C > p->V ? p->C : p->V;
    p->tokens = malloc(sizeof(int32_t) * p->N);
    p->targets = malloc(sizeof(int32_t) * p->N);
    p->in = malloc(sizeof(float) * p->N * width);
    p->out = malloc(sizeof(float) * p->N * width);
    p->grad = malloc(sizeof(float) * p->N * width);
    if (!p->tokens || !p->targets || !p->in || !p->out || !p->grad)
        return cirrus_fail(err, CIRRUS_ENOMEM, "cannot allocate stage buffers");
    return 0;
}

static void peer_teardown(peer *p)
{
    peer_drop_rings(p);
    free(p->tokens);
    free(p->targets);
    free(p->in);
    free(p->out);
    free(p->grad);
    stage_kit kit = {0};
    peer_kit_swap(p, &kit); /* the peer's kit, to free */
    peer_kit_free(&kit);
    gpt_model_free(&p->model);
}

int stage_peer_run(const stage_peer_options *o, volatile sig_atomic_t *stop, cirrus_error *err)
{
    peer p = {.opt = o, .stop = stop};
    pthread_mutex_init(&p.mu, NULL);
    int rc = peer_setup(&p, o, err);
    if (rc) goto out;
    log_info("serving layers [%d, %d) of %d on the %s backend", p.l0, p.l1, o->model.n_layer,
             p.model.ops->name);
    const rpc_server_options so = {
        .what = "stage peer",
        .listen_fd = o->listen_fd,
        .job_id = o->job_id,
        .hello_timeout_ms = PEER_HELLO_TIMEOUT_MS,
        .io_timeout_ms = PEER_IO_TIMEOUT_MS,
        .max_payload = PEER_REPLY_LIMIT,
        .reply_limit = PEER_REPLY_LIMIT,
        .max_conns = o->max_conns > 0 ? o->max_conns : STAGE_PEER_DEFAULT_CONNS,
        .poll_ms = PEER_POLL_MS,
        .ctx = &p,
        .opened = conn_opened,
        .handle = conn_request,
    };
    rpc_server *server = NULL;
    rc = rpc_server_start(&so, &server, err);
    pthread_t heartbeat;
    int heartbeating = !rc && o->coord_host &&
                       pthread_create(&heartbeat, NULL, peer_heartbeat_main, &p) == 0;
    while (!rc && !*stop) {
        struct timespec ts = {0, PEER_POLL_MS * 1000000L};
        nanosleep(&ts, NULL);
    }
    rpc_server_stop(server); /* waits for every connection thread */
    if (heartbeating) pthread_join(heartbeat, NULL);
    if (p.backwards)
        log_info("served %llu backwards, %llu of them without kept activations (%d slots)",
                 (unsigned long long)p.backwards, (unsigned long long)p.recomputed, p.n_slots);
out:
    peer_teardown(&p);
    pthread_mutex_destroy(&p.mu);
    return rc;
}
