/* stage_peer: see stage_peer.h. This file owns the peer: its set-up and tear-down, the
 * accept loop and a thread per connection, which reads each request, has it served under
 * the lock (serve.c) and answers it. */
#include "stage_peer.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../../common/log.h"
#include "../proto/rpc.h"
#include "peer_internal.h"

typedef struct conn_job {
    peer *p;
    net_conn *c;
} conn_job;

static void *conn_main(void *arg)
{
    conn_job *job = arg;
    peer *p = job->p;
    net_conn *c = job->c;
    free(job);
    cirrus_error err = {0};
    uint16_t role;
    uint32_t peer_id;
    if (net_hello_server(c, p->opt->job_id, &role, &peer_id, 5000, &err)) {
        log_warn("dropped %s: %s", net_peer_name(c), err.msg);
        goto out;
    }
    net_set_max_payload(c, PEER_REPLY_LIMIT);
    pthread_mutex_lock(&p->mu);
    const uint32_t gen = p->gen; /* the stage this connection was opened for */
    pthread_mutex_unlock(&p->mu);
    while (!*p->stop) {
        /* Wait for a frame's first byte here, not inside net_recv_frame: a receive that
         * timed out part-way through a large frame (a slow sender, a loaded machine) would
         * leave the stream inside its payload. */
        if (!net_pending(c)) {
            struct pollfd pfd = {.fd = net_fd(c), .events = POLLIN};
            int pr = poll(&pfd, 1, 1000);
            if (pr < 0 && errno != EINTR) break;
            if (pr <= 0) continue; /* idle: look at the stop flag again */
        }
        wire_header h;
        const uint8_t *payload;
        int rc = net_recv_frame(c, &h, &payload, PEER_IO_TIMEOUT_MS, &err);
        if (rc == CIRRUS_ECLOSED) break;
        if (rc) {
            log_warn("dropped %s: %s", net_peer_name(c), err.msg);
            break;
        }
        wire_writer reply;
        wire_writer_init(&reply, PEER_REPLY_LIMIT);
        const char *why = NULL;
        pthread_mutex_lock(&p->mu);
        rc = peer_serve(p, gen, &h, payload, &reply, &why);
        pthread_mutex_unlock(&p->mu);
        if (!rc && reply.failed) {
            rc = CIRRUS_ENOMEM;
            why = "reply too large";
        }
        if (rc && rc != CIRRUS_ECORRUPT) {
            /* A valid request that could not be done (a ring member vanished, a donor was
             * unreachable): say so and keep serving this client. */
            log_warn("refused %s: %s (request type %u)", net_peer_name(c), why, h.type);
            wire_writer_free(&reply);
            rpc_refuse(c, h.request_id, rc, why, 1000);
            continue;
        }
        if (rc) { /* malformed: this connection is not speaking our protocol */
            log_warn("dropped %s: %s (request type %u)", net_peer_name(c), why, h.type);
            rpc_refuse(c, h.request_id, rc, why, 1000);
            wire_writer_free(&reply);
            break;
        }
        rc = net_send_frame(c, (uint16_t)(h.type + 1), h.request_id, reply.data,
                            (uint32_t)reply.len, PEER_IO_TIMEOUT_MS);
        wire_writer_free(&reply);
        if (rc) break;
    }
out:
    net_close(c);
    pthread_mutex_lock(&p->mu);
    p->active--;
    pthread_mutex_unlock(&p->mu);
    return NULL;
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
    collective_free(p->ring);
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
    log_info("serving layers [%d, %d) of %d", p.l0, p.l1, o->model.n_layer);
    pthread_t heartbeat;
    int heartbeating =
        o->coord_host && pthread_create(&heartbeat, NULL, peer_heartbeat_main, &p) == 0;
    const int max_conns = o->max_conns > 0 ? o->max_conns : STAGE_PEER_DEFAULT_CONNS;
    uint64_t refused = 0;
    while (!*stop) {
        net_conn *c = NULL;
        cirrus_error aerr;
        int arc = net_accept(o->listen_fd, 200, &c, &aerr);
        if (arc == CIRRUS_ETIMEDOUT) continue;
        if (arc) {
            log_warn("accept: %s", aerr.msg);
            continue;
        }
        /* A connection over the cap is closed at once: a flood costs no thread, and a
         * silent one holds its slot for the handshake's deadline at most (conn_main). */
        pthread_mutex_lock(&p.mu);
        const int full = p.active >= max_conns;
        if (!full) p.active++;
        pthread_mutex_unlock(&p.mu);
        if (full) {
            refused++;
            if ((refused & (refused - 1)) == 0) /* the 1st, 2nd, 4th, 8th...: no log flood */
                log_warn("refused %s: %d connections open, the most this peer serves "
                         "(%llu refused so far)", net_peer_name(c), max_conns,
                         (unsigned long long)refused);
            net_close(c);
            continue;
        }
        conn_job *job = malloc(sizeof *job);
        pthread_t th;
        if (!job) {
            net_close(c);
            pthread_mutex_lock(&p.mu);
            p.active--;
            pthread_mutex_unlock(&p.mu);
            continue;
        }
        *job = (conn_job){&p, c};
        if (pthread_create(&th, NULL, conn_main, job) != 0) {
            net_close(c);
            free(job);
            pthread_mutex_lock(&p.mu);
            p.active--;
            pthread_mutex_unlock(&p.mu);
            continue;
        }
        pthread_detach(th);
    }
    if (heartbeating) pthread_join(heartbeat, NULL);
    /* Connection threads notice the stop flag within a second; wait for them. */
    for (;;) {
        pthread_mutex_lock(&p.mu);
        int active = p.active;
        pthread_mutex_unlock(&p.mu);
        if (!active) break;
        usleep(10000);
    }
    if (p.backwards)
        log_info("served %llu backwards, %llu of them without kept activations (%d slots)",
                 (unsigned long long)p.backwards, (unsigned long long)p.recomputed, p.n_slots);
out:
    peer_teardown(&p);
    pthread_mutex_destroy(&p.mu);
    return rc;
}
