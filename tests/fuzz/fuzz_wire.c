/* fuzz_wire: the frame header decoder and the bounds-checked payload reader
 * (trainer/net/wire.c), as a receiver meets them on a TCP connection.
 *
 * Input: a 32-byte frame header, one byte n, n reader operations, then the payload.
 * Invariants:
 *   header: a decoded header has magic/version right, flags 0, type in 1..255 and
 *     payload_len within the receiver's limit (checked under the hard cap and a small
 *     limit); re-encoding its fields gives back the same 32 bytes exactly when the
 *     checksum over the payload is right (wire_checksum_ok), and decodes to the same fields.
 *   reader: the cursor never passes the end; once failed it stays failed and every getter
 *     returns zero/NULL; every value read equals the little-endian bytes at its offset;
 *     a string read has no NUL and fits its buffer; writing the values read back with the
 *     wire_writer reproduces the bytes consumed (encode(decode(b)) == b), and reading the
 *     writer's output gives the same values (decode(encode(x)) == x).
 */
#include "fuzz.h"

#include "../../common/le.h"
#include "../../trainer/net/wire.h"

#define MAX_OPS 64

typedef struct value {
    int op;
    uint64_t u;
    const uint8_t *bytes;
    size_t n;
    char str[300];
} value;

static void check_header(const uint8_t *hdr, const uint8_t *payload, size_t payload_len,
                         uint32_t limit)
{
    wire_header h;
    cirrus_error err;
    if (wire_header_decode(hdr, limit, &h, &err) != 0) return;
    FUZZ_CHECK(le_get(hdr, 4) == WIRE_MAGIC && le_get(hdr + 4, 2) == WIRE_VERSION, "accepted bad magic/version");
    FUZZ_CHECK(h.flags == 0, "accepted flags 0x%x", h.flags);
    FUZZ_CHECK(h.type >= 1 && h.type <= WIRE_TYPE_MAX, "accepted type %u", h.type);
    FUZZ_CHECK(h.payload_len <= limit && h.payload_len <= WIRE_MAX_PAYLOAD,
               "payload_len %u over the limit %u", h.payload_len, limit);
    if (h.payload_len != payload_len) return;
    uint8_t again[WIRE_HEADER_SIZE];
    wire_header_encode(again, h.type, h.request_id, payload, h.payload_len);
    int same = memcmp(again, hdr, WIRE_HEADER_SIZE) == 0;
    int ok = wire_checksum_ok(hdr, payload, h.payload_len);
    FUZZ_CHECK(same == ok, "checksum_ok %d but re-encoding %s", ok, same ? "matches" : "differs");
    wire_header h2;
    FUZZ_CHECK(wire_header_decode(again, limit, &h2, &err) == 0, "re-encoded header refused: %s", err.msg);
    FUZZ_CHECK(h2.type == h.type && h2.request_id == h.request_id &&
                   h2.payload_len == h.payload_len && h2.flags == 0,
               "re-encoded header decodes differently");
    FUZZ_CHECK(wire_checksum_ok(again, payload, h.payload_len), "own checksum refused");
}

/* Run op on r; returns 1 and fills v when the read succeeded. */
static int run_op(wire_reader *r, int op, value *v)
{
    size_t before = r->pos;
    int was_failed = r->failed;
    v->op = op % 7;
    v->u = 0;
    v->bytes = NULL;
    v->n = 0;
    switch (v->op) {
    case 0: v->u = wire_get_u16(r); break;
    case 1: v->u = wire_get_u32(r); break;
    case 2: v->u = wire_get_u64(r); break;
    case 3: {
        float f = wire_get_f32(r);
        uint32_t b;
        memcpy(&b, &f, 4);
        v->u = b;
        break;
    }
    case 4: {
        double d = wire_get_f64(r);
        memcpy(&v->u, &d, 8);
        break;
    }
    case 5:
        v->n = (size_t)(op / 7) * 3; /* 0..108 bytes */
        v->bytes = wire_get_bytes(r, v->n);
        FUZZ_CHECK(!v->bytes == !!r->failed, "get_bytes returned %p with failed=%d",
                   (const void *)v->bytes, r->failed);
        break;
    default: {
        size_t out_size = 1 + (size_t)(op / 7) * 8; /* 1..289 */
        int rc = wire_get_str(r, v->str, out_size);
        FUZZ_CHECK((rc == 0) == !r->failed, "get_str rc %d with failed=%d", rc, r->failed);
        if (rc == 0) {
            v->n = strlen(v->str);
            FUZZ_CHECK(v->n < out_size, "string of %zu bytes in a %zu-byte buffer", v->n, out_size);
            FUZZ_CHECK(v->n == r->pos - before - 2, "string length differs from the bytes consumed");
            FUZZ_CHECK(memcmp(v->str, r->data + before + 2, v->n) == 0, "string differs from its bytes");
        } else {
            FUZZ_CHECK(v->str[0] == '\0', "refused string leaves '%s'", v->str);
        }
        break;
    }
    }
    FUZZ_CHECK(r->pos <= r->len, "cursor %zu past the end %zu", r->pos, r->len);
    if (was_failed) {
        FUZZ_CHECK(r->failed && r->pos == before && v->u == 0 && !v->bytes,
                   "a failed reader moved or returned data");
        return 0;
    }
    if (r->failed) {
        FUZZ_CHECK(v->u == 0, "a failing getter returned %llu", (unsigned long long)v->u);
        return 0;
    }
    static const int width[5] = {2, 4, 8, 4, 8};
    if (v->op < 5) {
        FUZZ_CHECK(r->pos - before == (size_t)width[v->op], "getter consumed %zu bytes", r->pos - before);
        FUZZ_CHECK(v->u == le_get(r->data + before, width[v->op]), "value differs from its bytes");
    } else if (v->op == 5) {
        FUZZ_CHECK(r->pos - before == v->n, "get_bytes consumed %zu of %zu", r->pos - before, v->n);
    }
    return 1;
}

static void put_value(wire_writer *w, const value *v)
{
    switch (v->op) {
    case 0: wire_put_u16(w, (uint16_t)v->u); break;
    case 1: wire_put_u32(w, (uint32_t)v->u); break;
    case 2: wire_put_u64(w, v->u); break;
    case 3: {
        uint32_t b = (uint32_t)v->u;
        float f;
        memcpy(&f, &b, 4);
        wire_put_f32(w, f);
        break;
    }
    case 4: {
        double d;
        memcpy(&d, &v->u, 8);
        wire_put_f64(w, d);
        break;
    }
    case 5: wire_put_bytes(w, v->bytes, v->n); break;
    default: wire_put_str(w, v->str); break;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < WIRE_HEADER_SIZE + 1) return 0;
    const uint8_t *hdr = data;
    size_t n_ops = data[WIRE_HEADER_SIZE] % (MAX_OPS + 1);
    if (size < WIRE_HEADER_SIZE + 1 + n_ops) return 0;
    const uint8_t *ops = data + WIRE_HEADER_SIZE + 1;
    const uint8_t *payload = ops + n_ops;
    size_t payload_len = size - WIRE_HEADER_SIZE - 1 - n_ops;

    check_header(hdr, payload, payload_len, WIRE_MAX_PAYLOAD);
    check_header(hdr, payload, payload_len, 64);

    wire_reader r;
    wire_reader_init(&r, payload_len ? payload : NULL, payload_len);
    static value vals[MAX_OPS];
    int n_ok = 0;
    size_t consumed = 0; /* by the reads that succeeded (a failing one may have taken a
                            string's length first) */
    for (size_t i = 0; i < n_ops; i++)
        if (run_op(&r, ops[i], &vals[n_ok])) {
            n_ok++;
            consumed = r.pos;
        }
    int done = wire_reader_done(&r);
    FUZZ_CHECK((done == 0) == (!r.failed && r.pos == r.len), "reader_done %d", done);

    /* Write the values back: the same bytes as were consumed. */
    wire_writer w;
    wire_writer_init(&w, consumed);
    for (int i = 0; i < n_ok; i++) put_value(&w, &vals[i]);
    FUZZ_CHECK(!w.failed, "writer refused %zu bytes within its limit", consumed);
    FUZZ_CHECK(w.len == consumed && (consumed == 0 || !memcmp(w.data, payload, consumed)),
               "re-encoded %zu bytes differ from the %zu consumed", w.len, consumed);
    /* And read them again: the same values. */
    wire_reader r2;
    wire_reader_init(&r2, w.data, w.len);
    for (int i = 0; i < n_ok; i++) {
        value again;
        int op = vals[i].op + 7 * (vals[i].op == 5 ? (int)(vals[i].n / 3) : 36);
        FUZZ_CHECK(run_op(&r2, op, &again), "re-reading value %d failed", i);
        FUZZ_CHECK(again.u == vals[i].u && again.n == vals[i].n, "value %d differs after a round trip", i);
        if (vals[i].op == 6) FUZZ_CHECK(!strcmp(again.str, vals[i].str), "string %d differs", i);
    }
    FUZZ_CHECK(wire_reader_done(&r2) == 0, "round trip left bytes");
    /* The writer's cap: one byte more than the limit allows is refused. */
    static const uint8_t one[1];
    wire_put_bytes(&w, one, 1);
    FUZZ_CHECK(w.failed && w.len == consumed, "writer grew past its limit");
    wire_writer_free(&w);
    return 0;
}
