/* rpc_server: the one server loop of a region's wire protocol — accept, HELLO, then
 * request -> reply until the connection ends — shared by the coordinator and the stage
 * peers (rpc.c is the client side).
 *
 * A thread per connection, because a request may take a while under the server's lock
 * (a stage's forward, a barrier) and the others must go on meanwhile. Its costs are
 * bounded, so a flood of connections from anyone on the pod network fills no table:
 *
 *  - at most max_conns connections are served at once; one more is closed as soon as it
 *    is accepted (no thread, no buffer), and refusals and drops are logged at the 1st,
 *    2nd, 4th, 8th... (log_warn_sampled) so a flood does not fill the log either;
 *  - a connection holds its slot without saying HELLO for hello_timeout_ms at most; at most
 *    max_hellos_per_addr such connections come from one address and max_conns / 4 from
 *    all, and past either bound the oldest of them is shut down to make room for the
 *    newcomer: a flood of silent or trickling connections, from one pod or from many,
 *    cycles through those slots in milliseconds while a real client is past HELLO in a
 *    round trip, and never takes the slots of the connections already served;
 *  - a frame begun must arrive within io_timeout_ms (a trickling sender is dropped), and
 *    one larger than max_payload is refused before its payload is read;
 *  - with idle_ms set, a connection that sends nothing that long is closed.
 *
 * PING (empty) is answered PONG by the loop itself; every other request goes to the handler; its reply (type + 1, same id) or its refusal
 * (WIRE_ERROR with the handler's code and message) is sent back. A handler that sets
 * *drop (the request was malformed: the other end does not speak the protocol) has its
 * refusal sent and the connection closed.
 */
#ifndef CIRRUS_RPC_SERVER_H
#define CIRRUS_RPC_SERVER_H

#include <stddef.h>
#include <stdint.h>

#include "../../../common/cerr.h"
#include "../../net/conn.h"
#include "../../net/wire.h"

typedef struct rpc_server rpc_server;

/* One served connection, as its handler sees it. */
typedef struct rpc_server_conn {
    net_conn *c;
    uint16_t role;  /* from the client's HELLO */
    uint32_t id;    /* ditto */
    uint64_t tag;   /* the server's own value for this connection, set by `opened` */
} rpc_server_conn;

typedef struct rpc_server_options {
    const char *what;          /* the server in log lines: "coordinator", "stage peer" */
    int listen_fd;             /* listening; the server never closes it */
    const char *job_id;        /* a HELLO must name it */
    int hello_timeout_ms;      /* from accept to the end of HELLO */
    int io_timeout_ms;         /* a frame begun, or a reply, must finish within it */
    uint32_t max_payload;      /* the largest request accepted */
    uint32_t reply_limit;      /* the largest reply a handler may write */
    uint32_t idle_ms;          /* close a connection silent this long; 0: never */
    int max_conns;             /* served at once */
    int max_hellos_per_addr;   /* before HELLO, from one address; 0: max_conns / 8 within
                                * 4..16 */
    int poll_ms;               /* how often threads look at the stop flag; tick's period */
    size_t stack_bytes;        /* a connection thread's stack; 0: the system's default */
    void *ctx;
    /* After HELLO, on the connection's thread (optional): e.g. sc->tag = what the
     * connection was opened for. */
    void (*opened)(void *ctx, rpc_server_conn *sc);
    /* One request: 0 with the reply written, or a status with err's message (refused,
     * and with *drop set, the connection closed). */
    int (*handle)(void *ctx, rpc_server_conn *sc, const wire_header *h, const uint8_t *payload,
                  wire_writer *reply, int *drop, cirrus_error *err);
    /* Every poll period and after each accept, on the accept thread (optional). */
    void (*tick)(void *ctx);
} rpc_server_options;

/* Start serving o->listen_fd on a thread of its own; o is copied. */
int rpc_server_start(const rpc_server_options *o, rpc_server **out, cirrus_error *err);
/* Stop accepting, shut down the connections before HELLO, wait for every connection thread
 * to notice (within poll_ms or once its request is answered) and free the server. NULL is
 * a no-op. */
void rpc_server_stop(rpc_server *s);

typedef struct rpc_server_counts {
    int open;              /* connections being served */
    int in_hello;          /* of which before their HELLO */
    uint64_t accepted, refused; /* since the start; refused: closed on accept, every slot
                                 * taken */
    uint64_t evicted;           /* before HELLO, shut down to make room */
} rpc_server_counts;
void rpc_server_get_counts(rpc_server *s, rpc_server_counts *out);

#endif
