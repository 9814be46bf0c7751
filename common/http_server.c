/* http_server: the libmicrohttpd plumbing behind every HTTP endpoint. See http_server.h. */
#include "http_server.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <microhttpd.h>

#include "log.h"

#define HTTP_DEFAULT_CONNECTION_LIMIT 64
#define HTTP_DEFAULT_TIMEOUT_S 10
/* A scraper or the operator's reader holds one or two connections: a flood from one
 * address takes no more than this of the limit (more are closed on accept). */
#define HTTP_PER_IP_LIMIT 8
/* Each connection's buffer for the request and the response's headers (MHD's default is
 * 32 KiB): our requests are one-line GETs, and bodies are sent from their own buffers. */
#define HTTP_MEMORY_LIMIT (8u << 10)

struct http_server {
    const http_route *routes;
    size_t n_routes;
    void *ctx;
    struct MHD_Daemon *daemon;
    atomic_ullong logged; /* MHD messages (mhd_log) */
};

void http_reply_text(http_reply *r, unsigned status, const char *text)
{
    r->status = status;
    r->content_type = HTTP_TEXT_TYPE;
    free(r->body);
    r->body = strdup(text);
}

/* Queue a reply; takes the body. A NULL body is answered 500 from a static text, since
 * there is no memory for anything else. */
static enum MHD_Result respond(struct MHD_Connection *conn, http_reply *rep, int allow)
{
    static const char oom[] = "out of memory\n";
    struct MHD_Response *r;
    unsigned status = rep->status;
    const char *type = rep->content_type;
    if (rep->body) {
        r = MHD_create_response_from_buffer(strlen(rep->body), rep->body,
                                            MHD_RESPMEM_MUST_FREE);
    } else {
        status = MHD_HTTP_INTERNAL_SERVER_ERROR;
        type = HTTP_TEXT_TYPE;
        r = MHD_create_response_from_buffer(sizeof oom - 1, (void *)oom, MHD_RESPMEM_PERSISTENT);
    }
    if (!r) {
        free(rep->body);
        return MHD_NO; /* MHD closes the connection */
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
    if (allow) MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, "GET, HEAD");
    enum MHD_Result ret = MHD_queue_response(conn, status, r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version,
                                  const char *upload_data, size_t *upload_data_size,
                                  void **req_cls)
{
    (void)version;
    (void)upload_data;
    (void)upload_data_size;
    (void)req_cls;
    http_server *s = cls;
    http_reply rep = {MHD_HTTP_OK, HTTP_TEXT_TYPE, NULL};
    /* Answered on the first call, before any request body is read: none is wanted. */
    if (strcmp(method, MHD_HTTP_METHOD_GET) && strcmp(method, MHD_HTTP_METHOD_HEAD)) {
        http_reply_text(&rep, MHD_HTTP_METHOD_NOT_ALLOWED, "method not allowed\n");
        return respond(conn, &rep, 1);
    }
    for (size_t i = 0; i < s->n_routes; i++) {
        if (strcmp(url, s->routes[i].path)) continue;
        s->routes[i].handler(s->ctx, &rep);
        return respond(conn, &rep, 0);
    }
    http_reply_text(&rep, MHD_HTTP_NOT_FOUND, "not found\n");
    return respond(conn, &rep, 0);
}

/* MHD's messages are mostly about connections (refused at a limit, closed early): a flood
 * repeats them, so they are sampled. */
static void mhd_log(void *cls, const char *fmt, va_list ap)
{
    http_server *s = cls;
    char line[512];
    vsnprintf(line, sizeof line, fmt, ap);
    size_t n = strlen(line);
    while (n && line[n - 1] == '\n') line[--n] = '\0';
    log_warn_sampled(&s->logged, "http: %s", line);
}

int http_server_start(const http_server_options *o, http_server **out, int *bound_port,
                      cirrus_error *err)
{
    *out = NULL;
    if (o->listen_fd < 0 && (o->port < 0 || o->port > 65535))
        return cirrus_fail(err, CIRRUS_EINVAL, "HTTP port %d is outside 0..65535", o->port);
    http_server *s = calloc(1, sizeof *s);
    if (!s) return cirrus_fail(err, CIRRUS_ENOMEM, "out of memory for the HTTP server");
    s->routes = o->routes;
    s->n_routes = o->n_routes;
    s->ctx = o->ctx;
    unsigned limit = o->connection_limit ? o->connection_limit : HTTP_DEFAULT_CONNECTION_LIMIT;
    unsigned timeout = o->timeout_s ? o->timeout_s : HTTP_DEFAULT_TIMEOUT_S;
    const unsigned flags = MHD_USE_AUTO_INTERNAL_THREAD | MHD_USE_ERROR_LOG;
    if (o->listen_fd >= 0)
        /* MHD closes a socket it was handed in MHD_stop_daemon. */
        s->daemon = MHD_start_daemon(flags, 0, NULL, NULL, on_request, s,
                                     MHD_OPTION_EXTERNAL_LOGGER, mhd_log, s,
                                     MHD_OPTION_LISTEN_SOCKET, o->listen_fd,
                                     MHD_OPTION_CONNECTION_LIMIT, limit,
                                     MHD_OPTION_CONNECTION_TIMEOUT, timeout,
                                     MHD_OPTION_PER_IP_CONNECTION_LIMIT, HTTP_PER_IP_LIMIT,
                                     MHD_OPTION_CONNECTION_MEMORY_LIMIT, HTTP_MEMORY_LIMIT,
                                     MHD_OPTION_END);
    else
        s->daemon = MHD_start_daemon(flags, (uint16_t)o->port, NULL, NULL, on_request, s,
                                     MHD_OPTION_EXTERNAL_LOGGER, mhd_log, s,
                                     MHD_OPTION_CONNECTION_LIMIT, limit,
                                     MHD_OPTION_CONNECTION_TIMEOUT, timeout,
                                     MHD_OPTION_PER_IP_CONNECTION_LIMIT, HTTP_PER_IP_LIMIT,
                                     MHD_OPTION_CONNECTION_MEMORY_LIMIT, HTTP_MEMORY_LIMIT,
                                     MHD_OPTION_END);
    if (!s->daemon) {
        /* Whether a failed start closed a socket it was handed is not documented: it is
         * left open rather than risk closing a descriptor another thread has been given
         * since. */
        free(s);
        return cirrus_fail(err, CIRRUS_EIO, "cannot start the HTTP server on port %d (in use?)",
                           o->port);
    }
    if (bound_port) {
        const union MHD_DaemonInfo *info = MHD_get_daemon_info(s->daemon, MHD_DAEMON_INFO_BIND_PORT);
        *bound_port = info && info->port ? info->port : o->port;
    }
    *out = s;
    return 0;
}

void http_server_stop(http_server *s)
{
    if (!s) return;
    MHD_stop_daemon(s->daemon);
    free(s);
}
