/* kube_buf: a growable byte buffer with a mandatory size cap (curl's dynbuf idea).
 *
 * HTTP responses and watch streams come from the network: an append that would pass the cap
 * fails cleanly instead of growing without bound. The content is always NUL-terminated so
 * it can be handed to string functions and jansson directly.
 */
#ifndef CIRRUS_KUBE_BUF_H
#define CIRRUS_KUBE_BUF_H

#include <stddef.h>

typedef struct kube_buf {
    char *data; /* NUL-terminated; NULL until the first append */
    size_t len;
    size_t alloc;
    size_t cap; /* hard limit on len */
} kube_buf;

void kube_buf_init(kube_buf *b, size_t cap);
/* 0, CIRRUS_ENOMEM, or CIRRUS_ETRUNC when len + n would pass the cap (b is unchanged). */
int kube_buf_append(kube_buf *b, const void *p, size_t n);
/* Drop the first n bytes (consumed watch lines). */
void kube_buf_consume(kube_buf *b, size_t n);
void kube_buf_reset(kube_buf *b);
void kube_buf_free(kube_buf *b);

#endif
