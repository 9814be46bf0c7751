/* Tests of trainer/net/wire: the header's exact byte layout, every way a header is refused,
 * the checksum, and the bounds and latching of wire_writer / wire_reader. */
#include <stdint.h>
#include <string.h>
#include <xxhash.h>

#include "../../trainer/net/wire.h"
#include "test.h"

static void put_le(uint8_t *p, uint64_t v, int n)
{
    for (int i = 0; i < n; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* A header for a 3-byte payload with every field distinct, so a swapped field shows. */
static const uint8_t payload3[3] = {0xAA, 0xBB, 0xCC};

static void encode_sample(uint8_t hdr[WIRE_HEADER_SIZE])
{
    wire_header_encode(hdr, 0x0083, 0x1122334455667788ULL, payload3, sizeof payload3);
}

/* Re-checksum a header edited by a test, so only the edited field is wrong. */
static void reseal(uint8_t hdr[WIRE_HEADER_SIZE], const void *payload, size_t n)
{
    uint8_t buf[WIRE_HEADER_SIZE + 64];
    ASSERT(n <= 64);
    memcpy(buf, hdr, 24);
    if (n) memcpy(buf + 24, payload, n);
    put_le(hdr + 24, XXH3_64bits(buf, 24 + n), 8);
}

static void expect_refused(const uint8_t hdr[WIRE_HEADER_SIZE], uint32_t max, const char *what)
{
    wire_header h;
    cirrus_error err = {0};
    ASSERT_EQ(wire_header_decode(hdr, max, &h, &err), CIRRUS_ECORRUPT);
    ASSERT_EQ(err.code, CIRRUS_ECORRUPT);
    if (!strstr(err.msg, what)) TEST_FAIL("message '%s' does not name '%s'", err.msg, what);
}

TEST_T(wire_header_round_trip, 5)
{
    uint8_t hdr[WIRE_HEADER_SIZE];
    encode_sample(hdr);
    wire_header h;
    cirrus_error err = {0};
    ASSERT_OK(wire_header_decode(hdr, 1000, &h, &err));
    ASSERT_EQ(h.type, 0x0083);
    ASSERT(h.request_id == 0x1122334455667788ULL);
    ASSERT_EQ(h.payload_len, 3);
    ASSERT_EQ(h.flags, 0);
    ASSERT(wire_checksum_ok(hdr, payload3, 3));

    /* An empty payload, with NULL as its pointer, is a valid frame too. */
    wire_header_encode(hdr, WIRE_PING, 0, NULL, 0);
    ASSERT_OK(wire_header_decode(hdr, 0, &h, &err));
    ASSERT_EQ(h.payload_len, 0);
    ASSERT(wire_checksum_ok(hdr, NULL, 0));
}

TEST_T(wire_header_offsets_match_the_spec, 5)
{
    uint8_t hdr[WIRE_HEADER_SIZE];
    encode_sample(hdr);
    static const uint8_t expect[24] = {
        'C', 'R', 'R', 'S',                             /*  0 magic */
        0x01, 0x00,                                     /*  4 version 1 */
        0x83, 0x00,                                     /*  6 type 0x0083 */
        0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11, /*  8 request id */
        0x03, 0x00, 0x00, 0x00,                         /* 16 payload_len 3 */
        0x00, 0x00, 0x00, 0x00,                         /* 20 flags */
    };
    for (int i = 0; i < 24; i++)
        if (hdr[i] != expect[i])
            TEST_FAIL("byte %d is 0x%02x, expected 0x%02x", i, hdr[i], expect[i]);
    ASSERT(memcmp(hdr, "CRRS", 4) == 0);
    /* The checksum, computed here one-shot over the concatenation (the code streams). */
    uint8_t buf[27];
    memcpy(buf, hdr, 24);
    memcpy(buf + 24, payload3, 3);
    uint64_t sum = XXH3_64bits(buf, sizeof buf);
    for (int i = 0; i < 8; i++) ASSERT_EQ(hdr[24 + i], (uint8_t)(sum >> (8 * i)));
}

TEST_T(wire_header_refusals, 5)
{
    uint8_t hdr[WIRE_HEADER_SIZE];

    encode_sample(hdr);
    hdr[0] = 'X';
    reseal(hdr, payload3, 3);
    expect_refused(hdr, 1000, "magic");

    encode_sample(hdr);
    put_le(hdr + 4, 2, 2);
    reseal(hdr, payload3, 3);
    expect_refused(hdr, 1000, "version 2");

    encode_sample(hdr);
    put_le(hdr + 20, 0x100, 4);
    reseal(hdr, payload3, 3);
    expect_refused(hdr, 1000, "flags");

    encode_sample(hdr);
    put_le(hdr + 6, 0, 2);
    expect_refused(hdr, 1000, "type 0");
    put_le(hdr + 6, WIRE_TYPE_MAX + 1, 2);
    expect_refused(hdr, 1000, "type 256");

    /* payload_len: the receiver's limit is inclusive, and never above WIRE_MAX_PAYLOAD. */
    wire_header h;
    cirrus_error err = {0};
    wire_header_encode(hdr, WIRE_PING, 7, NULL, 0);
    put_le(hdr + 16, 2147483648u, 4);
    expect_refused(hdr, 64u << 20, "frame of 2147483648 bytes exceeds the 67108864-byte limit");
    expect_refused(hdr, UINT32_MAX, "exceeds the 268435456-byte limit");
    put_le(hdr + 16, 1001, 4);
    expect_refused(hdr, 1000, "frame of 1001 bytes exceeds the 1000-byte limit");
    put_le(hdr + 16, 1000, 4);
    ASSERT_OK(wire_header_decode(hdr, 1000, &h, &err));
    put_le(hdr + 16, WIRE_MAX_PAYLOAD, 4);
    ASSERT_OK(wire_header_decode(hdr, UINT32_MAX, &h, &err));
}

TEST_T(wire_checksum_detects_every_flipped_bit, 5)
{
    uint8_t payload[64], hdr[WIRE_HEADER_SIZE];
    for (int i = 0; i < 64; i++) payload[i] = (uint8_t)(i * 37 + 1);
    wire_header_encode(hdr, WIRE_PING, 42, payload, sizeof payload);
    ASSERT(wire_checksum_ok(hdr, payload, sizeof payload));
    for (int bit = 0; bit < 64 * 8; bit++) {
        payload[bit / 8] ^= (uint8_t)(1u << (bit % 8));
        if (wire_checksum_ok(hdr, payload, sizeof payload)) TEST_FAIL("payload bit %d", bit);
        payload[bit / 8] ^= (uint8_t)(1u << (bit % 8));
    }
    /* Every header bit is covered too: the fields [0, 24) and the checksum itself. */
    for (int bit = 0; bit < WIRE_HEADER_SIZE * 8; bit++) {
        hdr[bit / 8] ^= (uint8_t)(1u << (bit % 8));
        if (wire_checksum_ok(hdr, payload, sizeof payload)) TEST_FAIL("header bit %d", bit);
        hdr[bit / 8] ^= (uint8_t)(1u << (bit % 8));
    }
    /* A payload cut short is a different frame. */
    ASSERT(!wire_checksum_ok(hdr, payload, sizeof payload - 1));
}

TEST_T(wire_writer_reader_round_trip, 5)
{
    wire_writer w;
    wire_writer_init(&w, 1 << 20);
    float nan_payload;
    uint32_t nan_bits = 0x7FC01234u;
    memcpy(&nan_payload, &nan_bits, 4);
    wire_put_u16(&w, 0xBEEF);
    wire_put_u32(&w, 0xDEADBEEFu);
    wire_put_u64(&w, 0x0123456789ABCDEFULL);
    wire_put_f32(&w, -1.5f);
    wire_put_f32(&w, nan_payload);
    wire_put_f64(&w, 3.141592653589793);
    wire_put_str(&w, "job-7");
    wire_put_str(&w, "");
    wire_put_bytes(&w, "xyz", 3);
    wire_put_bytes(&w, NULL, 0);
    ASSERT_EQ(w.failed, 0);
    ASSERT_EQ(w.len, 2 + 4 + 8 + 4 + 4 + 8 + (2 + 5) + 2 + 3);
    /* Little-endian on the wire, whatever the host. */
    ASSERT_EQ(w.data[0], 0xEF);
    ASSERT_EQ(w.data[1], 0xBE);
    ASSERT_EQ(w.data[2], 0xEF);
    ASSERT_EQ(w.data[5], 0xDE);
    ASSERT_EQ(w.data[6], 0xEF);
    ASSERT_EQ(w.data[13], 0x01);

    wire_reader r;
    wire_reader_init(&r, w.data, w.len);
    ASSERT_EQ(wire_get_u16(&r), 0xBEEF);
    ASSERT_EQ(wire_get_u32(&r), 0xDEADBEEFu);
    ASSERT(wire_get_u64(&r) == 0x0123456789ABCDEFULL);
    ASSERT(wire_get_f32(&r) == -1.5f);
    float f = wire_get_f32(&r);
    uint32_t bits;
    memcpy(&bits, &f, 4);
    ASSERT_EQ(bits, nan_bits);
    ASSERT(wire_get_f64(&r) == 3.141592653589793);
    char s[16];
    ASSERT_OK(wire_get_str(&r, s, sizeof s));
    ASSERT(strcmp(s, "job-7") == 0);
    ASSERT_OK(wire_get_str(&r, s, sizeof s));
    ASSERT(s[0] == '\0');
    const uint8_t *b = wire_get_bytes(&r, 3);
    ASSERT(b && memcmp(b, "xyz", 3) == 0);
    ASSERT_OK(wire_reader_done(&r));
    wire_writer_free(&w);
    ASSERT(w.data == NULL);
}

TEST_T(wire_writer_limit_latches, 5)
{
    wire_writer w;
    wire_writer_init(&w, 10);
    wire_put_u64(&w, 1);
    ASSERT_EQ(w.failed, 0);
    wire_put_u32(&w, 2); /* 12 > 10 */
    ASSERT_EQ(w.failed, 1);
    ASSERT_EQ(w.len, 8);
    wire_put_u16(&w, 3); /* would fit, but the writer has failed */
    ASSERT_EQ(w.len, 8);
    ASSERT(w.cap <= 10);
    wire_writer_free(&w);

    /* Growth by many small appends up to exactly the limit, never past it. */
    wire_writer_init(&w, 100000);
    for (int i = 0; i < 25000; i++) wire_put_u32(&w, (uint32_t)i);
    ASSERT_EQ(w.failed, 0);
    ASSERT_EQ(w.len, 100000);
    ASSERT(w.cap <= 100000);
    ASSERT_EQ(w.data[4 * 24999], 24999 & 0xFF);
    wire_put_bytes(&w, "x", 1);
    ASSERT_EQ(w.failed, 1);
    wire_writer_free(&w);

    /* Strings: over 65535 bytes fails (no partial length prefix); over the limit fails. */
    char *big = malloc(65537);
    ASSERT(big != NULL);
    memset(big, 'a', 65536);
    big[65536] = '\0';
    wire_writer_init(&w, 1 << 20);
    wire_put_str(&w, big);
    ASSERT_EQ(w.failed, 1);
    ASSERT_EQ(w.len, 0);
    wire_writer_free(&w);
    big[65535] = '\0';
    wire_writer_init(&w, 1 << 20);
    wire_put_str(&w, big);
    ASSERT_EQ(w.failed, 0);
    ASSERT_EQ(w.len, 65537);
    wire_writer_free(&w);
    wire_writer_init(&w, 6);
    wire_put_str(&w, "hello");
    ASSERT_EQ(w.failed, 1);
    ASSERT_EQ(w.len, 0);
    wire_writer_free(&w);
    free(big);
}

TEST_T(wire_reader_bounds_and_latching, 5)
{
    const uint8_t data[7] = {1, 2, 3, 4, 5, 6, 7};
    wire_reader r;
    wire_reader_init(&r, data, 3);
    ASSERT_EQ(wire_get_u32(&r), 0); /* 4 > 3 */
    ASSERT_EQ(r.failed, 1);
    ASSERT_EQ(wire_get_u16(&r), 0); /* would fit, but the reader has failed */
    ASSERT(wire_get_bytes(&r, 1) == NULL);
    ASSERT(wire_get_f64(&r) == 0.0);
    ASSERT(wire_reader_done(&r) != 0);

    wire_reader_init(&r, data, 7);
    ASSERT_EQ(wire_get_u32(&r), 0x04030201);
    ASSERT_EQ(wire_get_u16(&r), 0x0605);
    ASSERT(wire_reader_done(&r) != 0); /* one byte left over */
    ASSERT(wire_get_bytes(&r, 2) == NULL);
    ASSERT_EQ(wire_get_u64(&r), 0);
    ASSERT(wire_reader_done(&r) != 0);

    /* A huge count from the network cannot overflow the bounds check. */
    wire_reader_init(&r, data, 7);
    wire_get_u16(&r);
    ASSERT(wire_get_bytes(&r, SIZE_MAX) == NULL);
    ASSERT_EQ(r.failed, 1);

    /* An empty payload: reading nothing is fine, reading anything is not. */
    wire_reader_init(&r, NULL, 0);
    ASSERT_OK(wire_reader_done(&r));
    ASSERT(wire_get_bytes(&r, 0) != NULL);
    ASSERT_OK(wire_reader_done(&r));
    ASSERT_EQ(wire_get_u16(&r), 0);
    ASSERT(wire_reader_done(&r) != 0);
}

TEST_T(wire_reader_strings, 5)
{
    wire_writer w;
    wire_writer_init(&w, 1024);
    wire_put_str(&w, "abcdefg"); /* 7 bytes: needs an 8-byte out */
    ASSERT_EQ(w.failed, 0);
    char out[8];
    wire_reader r;

    wire_reader_init(&r, w.data, w.len);
    ASSERT_OK(wire_get_str(&r, out, 8));
    ASSERT(strcmp(out, "abcdefg") == 0);

    wire_reader_init(&r, w.data, w.len);
    ASSERT_EQ(wire_get_str(&r, out, 7), CIRRUS_ECORRUPT); /* too long for out */
    ASSERT_EQ(out[0], '\0');
    ASSERT_EQ(r.failed, 1);
    ASSERT_EQ(wire_get_u16(&r), 0);

    /* The length prefix promises more than there is. */
    wire_reader_init(&r, w.data, w.len - 1);
    ASSERT_EQ(wire_get_str(&r, out, sizeof out), CIRRUS_ETRUNC);
    ASSERT_EQ(r.failed, 1);
    wire_writer_free(&w);

    /* An embedded NUL would make the C string differ from the bytes sent. */
    const uint8_t nul[] = {3, 0, 'a', 0, 'b'};
    wire_reader_init(&r, nul, sizeof nul);
    ASSERT_EQ(wire_get_str(&r, out, sizeof out), CIRRUS_ECORRUPT);

    /* A length prefix of 65535 with 2 bytes behind it. */
    const uint8_t lie[] = {0xFF, 0xFF, 'a', 'b'};
    wire_reader_init(&r, lie, sizeof lie);
    ASSERT_EQ(wire_get_str(&r, out, sizeof out), CIRRUS_ETRUNC);
}
