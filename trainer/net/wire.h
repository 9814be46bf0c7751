/* wire: the one framed binary protocol every Cirrus role speaks over TCP.
 *
 * A frame is a 32-byte little-endian header followed by payload_len bytes:
 *
 *   off size field
 *     0    4 magic        "CRRS" (0x53525243 read as a little-endian u32)
 *     4    2 version      WIRE_VERSION
 *     6    2 type         enum wire_type
 *     8    8 request_id   chosen by the requester, echoed by the reply
 *    16    4 payload_len  <= the receiver's limit (at most WIRE_MAX_PAYLOAD)
 *    20    4 flags        reserved, must be 0 in version 1
 *    24    8 checksum     XXH3-64 of header bytes [0, 24) followed by the payload
 *
 * The first frame on every connection is WIRE_HELLO from the connecting side, carrying the
 * job id; the accepting side answers WIRE_HELLO_OK or drops the connection. A frame with a
 * wrong magic, version, flags, checksum, an oversized length, or a truncated body is a
 * protocol error: the receiver drops that connection only. See docs/PROTOCOL.md.
 *
 * Payloads are built and parsed with wire_writer / wire_reader, which bounds-check every
 * field, so no length, count or index from the network is used before it is checked.
 */
#ifndef CIRRUS_WIRE_H
#define CIRRUS_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "../../common/cerr.h"

#define WIRE_MAGIC 0x53525243u
#define WIRE_VERSION 1
#define WIRE_HEADER_SIZE 32
#define WIRE_MAX_PAYLOAD (256u << 20) /* hard ceiling; receivers may set a lower limit */
#define WIRE_JOB_ID_MAX 63

enum wire_type {
    WIRE_HELLO = 1,    /* u16 role, u32 peer_id, str job_id */
    WIRE_HELLO_OK = 2, /* empty */
    WIRE_ERROR = 3,    /* i32 code, str message */
    WIRE_PING = 4,     /* empty; answered by WIRE_PONG with the same request id */
    WIRE_PONG = 5,
    /* 16..63: coordinator; 64..127: stage peers; 128..191: collectives (see their modules) */
    WIRE_TYPE_MAX = 255,
};

typedef struct wire_header {
    uint16_t type;
    uint64_t request_id;
    uint32_t payload_len;
    uint32_t flags;
    uint64_t checksum;
} wire_header;

/* Encode a header for (type, request_id, payload) including its checksum. */
void wire_header_encode(uint8_t out[WIRE_HEADER_SIZE], uint16_t type, uint64_t request_id,
                        const void *payload, uint32_t payload_len);
/* Decode and validate magic, version, flags and payload_len <= max_payload. The checksum
 * is checked separately, once the payload has arrived: wire_checksum_ok(). */
int wire_header_decode(const uint8_t in[WIRE_HEADER_SIZE], uint32_t max_payload,
                       wire_header *h, cirrus_error *err);
int wire_checksum_ok(const uint8_t header[WIRE_HEADER_SIZE], const void *payload,
                     uint32_t payload_len);

/* ---- payload building and parsing ---- */

/* A growable byte buffer with a hard cap: appends past the cap fail (and latch an error)
 * instead of growing without bound. */
typedef struct wire_writer {
    uint8_t *data;
    size_t len, cap, limit;
    int failed;
} wire_writer;

void wire_writer_init(wire_writer *w, size_t limit);
void wire_writer_free(wire_writer *w);
void wire_put_u16(wire_writer *w, uint16_t v);
void wire_put_u32(wire_writer *w, uint32_t v);
void wire_put_u64(wire_writer *w, uint64_t v);
void wire_put_f32(wire_writer *w, float v);
void wire_put_f64(wire_writer *w, double v);
void wire_put_bytes(wire_writer *w, const void *p, size_t n);
/* u16 length + bytes; strings longer than 65535 bytes fail. */
void wire_put_str(wire_writer *w, const char *s);

/* A read cursor over a received payload. Every getter checks the remaining length; after
 * the first failure all getters fail and return zeros, so a parser can read a whole
 * message and check `failed` once. */
typedef struct wire_reader {
    const uint8_t *data;
    size_t len, pos;
    int failed;
} wire_reader;

void wire_reader_init(wire_reader *r, const void *data, size_t len);
uint16_t wire_get_u16(wire_reader *r);
uint32_t wire_get_u32(wire_reader *r);
uint64_t wire_get_u64(wire_reader *r);
float wire_get_f32(wire_reader *r);
double wire_get_f64(wire_reader *r);
/* Pointer to the next n bytes (not copied), or NULL if fewer remain. */
const void *wire_get_bytes(wire_reader *r, size_t n);
/* Copy a u16-length string into out (NUL-terminated); fails if it does not fit. */
int wire_get_str(wire_reader *r, char *out, size_t out_size);
/* 0 if the whole payload was consumed without error. */
int wire_reader_done(const wire_reader *r);

#endif
