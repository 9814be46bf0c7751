/* xfer: what client.c shares with the modules that run their own transfers on the client's
 * multi handle (watch.c). Not part of the public API.
 *
 * A kube_xfer is one HTTP exchange on the shared multi handle. A kube_stream is something
 * kube_client_poll() must visit after network activity (a watch); streams removed while
 * the client is delivering events are only marked and freed when delivery is over, so a
 * handler may stop any watch, its own included.
 */
#ifndef CIRRUS_KUBE_XFER_H
#define CIRRUS_KUBE_XFER_H

#include <curl/curl.h>

#include "buf.h"
#include "client.h"

struct kube_xfer {
    CURL *easy;
    struct curl_slist *headers;
    char *body;            /* request body (owned) */
    kube_buf in;           /* response body, capped */
    kube_client *client;
    int is_stream;         /* belongs to a kube_stream: wake kube_client_poll when it moves */
    int added;             /* on the multi handle */
    int done;              /* libcurl reported CURLMSG_DONE */
    int overflow;          /* the response passed in.cap */
    int drop_ok_body;      /* a 2xx answer's body is not kept (nobody reads it); an error's
                            * Status is */
    CURLcode result;
    char errbuf[CURL_ERROR_SIZE];
};

/* Prepare x for METHOD server+path with headers and TLS from the client's config.
 * timeout_ms: total transfer time (0: none). */
int kube_xfer_init(kube_client *c, struct kube_xfer *x, const char *method, const char *path,
                   const char *body, const char *content_type, size_t cap, long timeout_ms,
                   cirrus_error *err);
int kube_xfer_start(struct kube_xfer *x, cirrus_error *err);
/* Take x off the multi handle (aborting it if still running) and free it. */
void kube_xfer_cleanup(struct kube_xfer *x);
long kube_xfer_http_status(const struct kube_xfer *x);
/* A one-line description of a failed transfer (curl's error or the Status message). */
int kube_xfer_error(const struct kube_xfer *x, const char *method, const char *path,
                    const json_t *status_obj, long http, cirrus_error *err);

struct kube_stream {
    struct kube_stream *next;
    void (*dispatch)(struct kube_stream *s);
    void (*free)(struct kube_stream *s);
    int zombie;
};
void kube_client_add_stream(kube_client *c, struct kube_stream *s);
/* Unlink and destroy s now, or after the current delivery when called from a handler. */
void kube_client_remove_stream(kube_client *c, struct kube_stream *s);

#endif
