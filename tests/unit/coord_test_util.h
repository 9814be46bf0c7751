/* coord_test_util: what the coordinator's tests (test_coord_*.c) share — a coordinator on
 * 127.0.0.1 with free ports, members that register and heartbeat through the client API,
 * HTTP over a plain socket (/status parsed with jansson, /metrics line by line), raw
 * protocol access for abuse, and a member heartbeating from its own thread. Every helper
 * fails the running test on an error. */
#ifndef CIRRUS_COORD_TEST_UTIL_H
#define CIRRUS_COORD_TEST_UTIL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "../../trainer/net/conn.h"
#include "../../trainer/swarm/coord/coordinator.h"

#define JOB "job-coord"
#define T_MS 3000 /* for calls that should succeed: generous, never reached */

double now_ms(void);
void sleep_ms(int ms);
/* Open descriptors, to show that stopping closes every socket the coordinator opened. */
int count_fds(void);

coordinator *start_at(uint32_t n_stages, uint32_t hb_ms, uint32_t expire_ms, int port,
                      uint64_t epoch);
coordinator *start(uint32_t n_stages);
coord_registration stage_reg(const char *name, uint32_t stage, uint32_t l0, uint32_t l1,
                             uint16_t port, double throughput);
coord_registration client_reg(const char *name);
coord_client *client_at(int port);
/* A member: a client handle, registered as r. */
coord_client *join(coordinator *co, coord_registration r, coord_registered *out);
void heartbeat(coord_client *c, const coord_stats *s, uint32_t *instruction, int *rereg);
size_t list_peers(coord_client *c, uint32_t stage, coord_peer_info **out);
const coord_peer_info *by_id(const coord_peer_info *p, size_t n, uint32_t id);

/* ---- HTTP over a plain socket ---- */

typedef struct http_reply {
    int status;
    char head[4096];
    char *body; /* NUL-terminated */
    size_t body_len;
} http_reply;

void http_req(int port, const char *method, const char *path, http_reply *r);
int has_header(const http_reply *r, const char *line);
json_t *get_status(coordinator *co);
char *get_metrics(coordinator *co);
json_int_t jint(json_t *o, const char *key);
double jnum(json_t *o, const char *key);
void has_line(const char *text, const char *line);

/* ---- raw protocol access, for abuse ---- */

net_conn *raw_connect(int port);
/* Send one request; return the reply type. An ERROR reply fills *code and msg. */
int raw_call(net_conn *c, uint16_t type, const void *p, size_t n, int *code, char msg[256]);
/* The coordinator closed this connection: the next receive sees EOF, not a timeout. */
void assert_dropped(net_conn *c);
/* Send a malformed request; it must be answered ERROR(ECORRUPT) naming `what`, then the
 * connection closed. */
void expect_refused(int port, uint16_t type, const void *p, size_t n, const char *what);

/* ---- a member that heartbeats every interval from its own thread ---- */

typedef struct beater {
    coord_client *c;
    int interval_ms;
    atomic_int stop;
    int failures, reregistrations, beats;
    char last_error[256];
    pthread_t th;
} beater;

void beater_start(beater *b, coord_client *c, int interval_ms);
/* Stop it; fails the test if any heartbeat failed or asked to re-register. */
void beater_stop(beater *b);

#endif
