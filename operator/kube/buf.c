#include "buf.h"

#include <stdlib.h>
#include <string.h>

#include "../../common/cerr.h"

void kube_buf_init(kube_buf *b, size_t cap)
{
    b->data = NULL;
    b->len = b->alloc = 0;
    b->cap = cap;
}

int kube_buf_append(kube_buf *b, const void *p, size_t n)
{
    if (n > b->cap - b->len) return CIRRUS_ETRUNC;
    if (b->len + n + 1 > b->alloc) {
        /* Double, so a long stream of small appends costs O(n) copies in all. */
        size_t want = b->alloc ? b->alloc : 4096;
        while (want < b->len + n + 1) want *= 2;
        if (want > b->cap + 1) want = b->cap + 1;
        char *d = realloc(b->data, want);
        if (!d) return CIRRUS_ENOMEM;
        b->data = d;
        b->alloc = want;
    }
    if (n) memcpy(b->data + b->len, p, n);
    b->len += n;
    b->data[b->len] = '\0';
    return 0;
}

void kube_buf_consume(kube_buf *b, size_t n)
{
    if (n >= b->len) {
        b->len = 0;
    } else {
        memmove(b->data, b->data + n, b->len - n);
        b->len -= n;
    }
    if (b->data) b->data[b->len] = '\0';
}

void kube_buf_reset(kube_buf *b)
{
    b->len = 0;
    if (b->data) b->data[0] = '\0';
}

void kube_buf_free(kube_buf *b)
{
    free(b->data);
    kube_buf_init(b, b->cap);
}
