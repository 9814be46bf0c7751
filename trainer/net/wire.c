#include "wire.h"

#include <stdlib.h>
#include <string.h>

#include "../../common/le.h"

/* The static-linking API gives XXH3_state_t a complete type, so a checksum needs no heap
 * allocation (and wire_header_encode, which cannot fail, stays that way). */
#define XXH_STATIC_LINKING_ONLY
/* Inlined so XXH3 is compiled for this CPU (-march), not the library's generic build. */
#define XXH_INLINE_ALL
#include <xxhash.h>

/* Header offsets; the table in wire.h and docs/PROTOCOL.md is the authority. */
enum {
    OFF_MAGIC = 0,
    OFF_VERSION = 4,
    OFF_TYPE = 6,
    OFF_REQUEST_ID = 8,
    OFF_PAYLOAD_LEN = 16,
    OFF_FLAGS = 20,
    OFF_CHECKSUM = 24, /* the checksum covers every byte before this one */
};

_Static_assert(OFF_CHECKSUM + 8 == WIRE_HEADER_SIZE, "the header is 32 bytes");
_Static_assert(sizeof(float) == 4 && sizeof(double) == 8, "IEEE-754 binary32/binary64");

/* XXH3-64 of header bytes [0, 24) followed by the payload, streamed so the payload is never
 * copied next to the header. */
static uint64_t frame_checksum(const uint8_t *header, const void *payload, uint32_t len)
{
    XXH3_state_t st;
    XXH3_INITSTATE(&st);
    XXH3_64bits_reset(&st);
    XXH3_64bits_update(&st, header, OFF_CHECKSUM);
    if (len > 0) XXH3_64bits_update(&st, payload, len);
    return XXH3_64bits_digest(&st);
}

void wire_header_encode(uint8_t out[WIRE_HEADER_SIZE], uint16_t type, uint64_t request_id,
                        const void *payload, uint32_t payload_len)
{
    le_put(out + OFF_MAGIC, WIRE_MAGIC, 4);
    le_put(out + OFF_VERSION, WIRE_VERSION, 2);
    le_put(out + OFF_TYPE, type, 2);
    le_put(out + OFF_REQUEST_ID, request_id, 8);
    le_put(out + OFF_PAYLOAD_LEN, payload_len, 4);
    le_put(out + OFF_FLAGS, 0, 4);
    le_put(out + OFF_CHECKSUM, frame_checksum(out, payload, payload_len), 8);
}

int wire_header_decode(const uint8_t in[WIRE_HEADER_SIZE], uint32_t max_payload,
                       wire_header *h, cirrus_error *err)
{
    uint32_t magic = (uint32_t)le_get(in + OFF_MAGIC, 4);
    uint16_t version = (uint16_t)le_get(in + OFF_VERSION, 2);
    h->type = (uint16_t)le_get(in + OFF_TYPE, 2);
    h->request_id = le_get(in + OFF_REQUEST_ID, 8);
    h->payload_len = (uint32_t)le_get(in + OFF_PAYLOAD_LEN, 4);
    h->flags = (uint32_t)le_get(in + OFF_FLAGS, 4);
    h->checksum = le_get(in + OFF_CHECKSUM, 8);
    if (max_payload > WIRE_MAX_PAYLOAD) max_payload = WIRE_MAX_PAYLOAD;

    if (magic != WIRE_MAGIC)
        return cirrus_fail(err, CIRRUS_ECORRUPT,
                           "bad frame magic 0x%08x (expected 0x%08x \"CRRS\"): not a Cirrus peer",
                           magic, WIRE_MAGIC);
    if (version != WIRE_VERSION)
        return cirrus_fail(err, CIRRUS_ECORRUPT,
                           "unsupported frame version %u (this build speaks version %d)",
                           version, WIRE_VERSION);
    if (h->flags != 0)
        return cirrus_fail(err, CIRRUS_ECORRUPT,
                           "frame flags 0x%08x set: flags are reserved and must be 0 in version %d",
                           h->flags, WIRE_VERSION);
    /* Dispatchers index tables by type, so a type outside 1..255 is refused here, once. */
    if (h->type == 0 || h->type > WIRE_TYPE_MAX)
        return cirrus_fail(err, CIRRUS_ECORRUPT, "frame type %u is outside 1..%d", h->type,
                           WIRE_TYPE_MAX);
    if (h->payload_len > max_payload)
        return cirrus_fail(err, CIRRUS_ECORRUPT, "frame of %u bytes exceeds the %u-byte limit",
                           h->payload_len, max_payload);
    return 0;
}

int wire_checksum_ok(const uint8_t header[WIRE_HEADER_SIZE], const void *payload,
                     uint32_t payload_len)
{
    return frame_checksum(header, payload, payload_len) == le_get(header + OFF_CHECKSUM, 8);
}

/* ---- wire_writer ---- */

void wire_writer_init(wire_writer *w, size_t limit)
{
    w->data = NULL;
    w->len = w->cap = 0;
    w->limit = limit;
    w->failed = 0;
}

void wire_writer_free(wire_writer *w)
{
    free(w->data);
    w->data = NULL;
    w->len = w->cap = 0;
}

/* Room for n more bytes, or NULL (and the writer latched failed) when the hard limit or
 * memory runs out; doubling keeps appends amortised O(1). */
static uint8_t *writer_room(wire_writer *w, size_t n)
{
    if (w->failed) return NULL;
    if (n > w->limit - w->len) {
        w->failed = 1;
        return NULL;
    }
    if (n > w->cap - w->len) {
        size_t cap = w->cap ? w->cap : 64;
        while (cap - w->len < n) cap = cap > w->limit / 2 ? w->limit : cap * 2;
        if (cap > w->limit) cap = w->limit;
        uint8_t *p = realloc(w->data, cap);
        if (!p) {
            w->failed = 1;
            return NULL;
        }
        w->data = p;
        w->cap = cap;
    }
    uint8_t *at = w->data + w->len;
    w->len += n;
    return at;
}

static void writer_put_le(wire_writer *w, uint64_t v, int n)
{
    uint8_t *p = writer_room(w, (size_t)n);
    if (p) le_put(p, v, n);
}

void wire_put_u16(wire_writer *w, uint16_t v) { writer_put_le(w, v, 2); }
void wire_put_u32(wire_writer *w, uint32_t v) { writer_put_le(w, v, 4); }
void wire_put_u64(wire_writer *w, uint64_t v) { writer_put_le(w, v, 8); }

void wire_put_f32(wire_writer *w, float v)
{
    uint32_t bits;
    memcpy(&bits, &v, 4);
    writer_put_le(w, bits, 4);
}

void wire_put_f64(wire_writer *w, double v)
{
    uint64_t bits;
    memcpy(&bits, &v, 8);
    writer_put_le(w, bits, 8);
}

void wire_put_bytes(wire_writer *w, const void *p, size_t n)
{
    if (n == 0) return;
    uint8_t *at = writer_room(w, n);
    if (at) memcpy(at, p, n);
}

void wire_put_str(wire_writer *w, const char *s)
{
    size_t n = s ? strlen(s) : 0;
    if (!s || n > UINT16_MAX) {
        w->failed = 1;
        return;
    }
    /* Reserve length and bytes together so a failure leaves no dangling length prefix. */
    uint8_t *at = writer_room(w, 2 + n);
    if (!at) return;
    le_put(at, n, 2);
    memcpy(at + 2, s, n);
}

/* ---- wire_reader ---- */

void wire_reader_init(wire_reader *r, const void *data, size_t len)
{
    r->data = data;
    r->len = data ? len : 0;
    r->pos = 0;
    r->failed = 0;
}

/* The next n bytes, or NULL (and the reader latched failed) if fewer remain. */
static const uint8_t *reader_take(wire_reader *r, size_t n)
{
    static const uint8_t empty[1];
    if (r->failed || n > r->len - r->pos) {
        r->failed = 1;
        return NULL;
    }
    /* data may be NULL for an empty payload; never form NULL + 0. */
    const uint8_t *at = r->data ? r->data + r->pos : empty;
    r->pos += n;
    return at;
}

static uint64_t reader_get_le(wire_reader *r, int n)
{
    const uint8_t *p = reader_take(r, (size_t)n);
    return p ? le_get(p, n) : 0;
}

uint16_t wire_get_u16(wire_reader *r) { return (uint16_t)reader_get_le(r, 2); }
uint32_t wire_get_u32(wire_reader *r) { return (uint32_t)reader_get_le(r, 4); }
uint64_t wire_get_u64(wire_reader *r) { return reader_get_le(r, 8); }

float wire_get_f32(wire_reader *r)
{
    uint32_t bits = (uint32_t)reader_get_le(r, 4);
    float v;
    memcpy(&v, &bits, 4);
    return v;
}

double wire_get_f64(wire_reader *r)
{
    uint64_t bits = reader_get_le(r, 8);
    double v;
    memcpy(&v, &bits, 8);
    return v;
}

const void *wire_get_bytes(wire_reader *r, size_t n)
{
    return reader_take(r, n);
}

int wire_get_str(wire_reader *r, char *out, size_t out_size)
{
    if (out && out_size > 0) out[0] = '\0';
    size_t n = wire_get_u16(r);
    const uint8_t *p = reader_take(r, n);
    if (!p) return CIRRUS_ETRUNC;
    /* An embedded NUL would make the C string differ from what was sent (a job id "a\0b"
     * would compare equal to "a"), so it is malformed, like a string too long for out. */
    if (!out || n >= out_size || memchr(p, '\0', n)) {
        r->failed = 1;
        return CIRRUS_ECORRUPT;
    }
    memcpy(out, p, n);
    out[n] = '\0';
    return 0;
}

int wire_reader_done(const wire_reader *r)
{
    if (r->failed) return CIRRUS_ECORRUPT;
    return r->pos == r->len ? 0 : CIRRUS_ECORRUPT;
}
