/* http_server: a small read-only HTTP server on libmicrohttpd, for the endpoints both
 * binaries serve (the coordinator's /status and /metrics, the operator's /metrics,
 * /healthz and /readyz).
 *
 * A server is a table of exact paths, each with a handler that fills in a reply (status,
 * content type, a malloc'd body). GET and HEAD are answered (HEAD without the body); any
 * other method gets 405 with "Allow: GET, HEAD", any other path 404. Every reply carries
 * "Cache-Control: no-store": these are live figures. A handler that leaves the body NULL
 * (out of memory) gets a 500. Handlers run on libmicrohttpd's own thread.
 */
#ifndef CIRRUS_HTTP_SERVER_H
#define CIRRUS_HTTP_SERVER_H

#include <stddef.h>

#include "cerr.h"

#define HTTP_TEXT_TYPE "text/plain; charset=utf-8"
#define HTTP_PROMETHEUS_TYPE "text/plain; version=0.0.4; charset=utf-8"
#define HTTP_JSON_TYPE "application/json"

/* What a handler answers. The server sets status 200 and HTTP_TEXT_TYPE before the call. */
typedef struct http_reply {
    unsigned status;
    const char *content_type; /* a string that outlives the reply (a literal) */
    char *body;               /* malloc'd, NUL-terminated; the server frees it */
} http_reply;

typedef void (*http_handler_fn)(void *ctx, http_reply *reply);

typedef struct http_route {
    const char *path; /* matched exactly, e.g. "/metrics" */
    http_handler_fn handler;
} http_route;

typedef struct http_server_options {
    const http_route *routes; /* [n_routes]; the table must outlive the server */
    size_t n_routes;
    void *ctx;                 /* passed to every handler */
    int listen_fd;             /* >= 0: serve on this listening socket (the server owns it
                                * once started); < 0: bind port on every interface */
    int port;                  /* with listen_fd < 0: 0..65535, 0 = a free port */
    unsigned connection_limit; /* 0: 64 */
    unsigned timeout_s;        /* an idle connection is closed after this; 0: 10 */
} http_server_options;

typedef struct http_server http_server;

/* Start serving on a thread of its own and return. *bound_port (optional) receives the
 * port it listens on. */
int http_server_start(const http_server_options *o, http_server **out, int *bound_port,
                      cirrus_error *err);
/* Stop serving and free (waits for the thread; closes the listening socket). NULL is fine. */
void http_server_stop(http_server *s);

/* Set a reply to a copy of a short text: status and HTTP_TEXT_TYPE (body NULL if out of
 * memory, which the server answers with a 500). */
void http_reply_text(http_reply *r, unsigned status, const char *text);

#endif
