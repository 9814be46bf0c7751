/* fuzz_wan_msg: the bodies of the messages between the gateways of a job's regions
 * (trainer/gateway/wan_msg.c: JOIN and JOIN_OK, PART, DONE, DONE_OK, STATE, STATE_OK, HAVE,
 * HAVE_OK) and
 * between a region's leader client and its gateway (trainer/gateway/outer_msg.c: PUSH,
 * PULL, PULL_OK), as their receivers meet them.
 *
 * Input: byte 0 selects the decoder, bytes 1-8 are the little-endian u64 its caller
 * supplies (the model's n: PUSH, PULL and STATE take it as it is, PART, DONE and HAVE the
 * largest message a gateway may send for it, wan_encode_bound(n, none+zstd), as
 * outer_sync.c computes it; the count asked for: STATE_OK, PULL_OK; the message's size:
 * HAVE_OK), the rest is the
 * frame's payload. Invariants:
 *   the verdict is that of the format in the headers, recomputed here from the bytes:
 *     exact length, every documented cap (offset + count within n or 2n, count within
 *     the slice, len <= WAN_PART_BYTES and offset + len <= total <= the message cap,
 *     round >= 1 in DONE, n_params == n, ready and pushed 0/1, region [A-Za-z0-9._-]{1,63},
 *     index < n_regions <= 16, strides (DONE's wish, the schedule of STATE_OK and PULL_OK)
 *     powers of two up to 16);
 *   accepted: every field equals its bytes, pointers point at their bytes inside the
 *     payload, the caps hold; put(get(x)) reproduces the payload byte for byte (every
 *     format here is canonical: fixed-width fields, a u16-length string), and
 *     get(put(get(x))) gives the same fields.
 */
#include "fuzz.h"

#include "../../common/cerr.h"
#include "../../common/le.h"
#include "../../trainer/gateway/fragments.h"
#include "../../trainer/gateway/outer_msg.h"
#include "../../trainer/gateway/wan_codec.h"
#include "../../trainer/gateway/wan_msg.h"

enum {
    M_JOIN, M_PART, M_DONE, M_DONE_OK, M_STATE, M_STATE_OK, M_PUSH, M_PULL, M_PULL_OK, M_HAVE,
    M_HAVE_OK, M_COUNT
};

typedef struct decoded {
    int rc;
    wan_join join;
    wan_part part;
    wan_done done;
    uint64_t u0, u1; /* DONE_OK's round and receive ms; STATE's offset and count; HAVE's
                      * round and total; HAVE_OK's got and hash */
    wan_state_slice slice;
    outer_push push;
    outer_pull pull;
    outer_pull_ok pull_ok;
} decoded;

static int region_ok(const uint8_t *s, size_t n)
{
    if (n < 1 || n > WAN_REGION_MAX) return 0;
    for (size_t i = 0; i < n; i++) {
        uint8_t c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-'))
            return 0;
    }
    return 1;
}

/* The largest message a gateway takes in PART/DONE for n parameters (outer_sync.c). */
static uint64_t max_message(uint64_t n)
{
    const wan_codec_params widest = {.id = WAN_CODEC_NONE, .zstd = 1};
    return wan_encode_bound((size_t)n, &widest);
}

/* A stride as the format allows it (schedule.h): 1, 2, 4, 8 or 16. */
static int stride_ok(uint64_t v)
{
    return v == 1 || v == 2 || v == 4 || v == 8 || v == 16;
}

/* Whether the format accepts the payload b[0..len), from the bytes alone. */
static int spec_accepts(int sel, uint64_t arg, const uint8_t *b, size_t len)
{
    switch (sel) {
    case M_JOIN: {
        if (len < 2) return 0;
        size_t s = le_get(b, 2);
        if (len != 2 + s + 40 || !region_ok(b + 2, s)) return 0;
        uint64_t index = le_get(b + 2 + s, 4), n_regions = le_get(b + 6 + s, 4);
        uint64_t fragment = le_get(b + 34 + s, 4), n_fragments = le_get(b + 38 + s, 4);
        return n_regions >= 1 && n_regions <= WAN_MAX_REGIONS && index < n_regions &&
               n_fragments >= 1 && n_fragments <= OUTER_MAX_FRAGMENTS && fragment < n_fragments;
    }
    case M_PART: {
        if (len < 24) return 0;
        uint64_t total = le_get(b + 8, 8), offset = le_get(b + 16, 8), blen = len - 24;
        return total <= max_message(arg) && offset <= total && blen <= total - offset &&
               blen <= WAN_PART_BYTES;
    }
    case M_DONE:
        return len == 52 && le_get(b, 8) != 0 && le_get(b + 24, 8) <= max_message(arg) &&
               stride_ok(le_get(b + 48, 4));
    case M_DONE_OK: return len == 16;
    case M_STATE: {
        if (len != 16 || arg > UINT64_MAX / 2) return 0;
        uint64_t offset = le_get(b, 8), count = le_get(b + 8, 8);
        return offset <= 2 * arg && count <= 2 * arg - offset && count <= WAN_STATE_SLICE;
    }
    case M_STATE_OK:
        return arg <= WAN_STATE_SLICE && len == 32 + 4 * arg && stride_ok(le_get(b + 24, 4)) &&
               stride_ok(le_get(b + 28, 4));
    case M_HAVE: return len == 16 && le_get(b + 8, 8) <= max_message(arg);
    case M_HAVE_OK: return len == 16 && le_get(b, 8) <= arg;
    case M_PUSH: {
        if (len < 62) return 0;
        uint64_t n_params = le_get(b + 38, 8), offset = le_get(b + 46, 8), count = le_get(b + 54, 8);
        return n_params == arg && offset <= arg && count <= arg - offset && count <= OUTER_SLICE &&
               len == 62 + 4 * count;
    }
    case M_PULL: {
        if (len != 26) return 0;
        uint64_t offset = le_get(b + 10, 8), count = le_get(b + 18, 8);
        return offset <= arg && count <= arg - offset && count <= OUTER_SLICE;
    }
    default: /* M_PULL_OK */
        if (len < 48 || b[24] > 1 || b[25] > 1 || arg > OUTER_SLICE) return 0;
        if (le_get(b + 28, 2) < 1 || le_get(b + 26, 2) >= le_get(b + 28, 2)) return 0;
        if (le_get(b + 30, 2) < 1 || le_get(b + 30, 2) > OUTER_MAX_FRAGMENTS) return 0;
        if (!stride_ok(le_get(b + 40, 4)) || !stride_ok(le_get(b + 44, 4))) return 0;
        return len == 48 + (b[24] ? 4 * arg : 0);
    }
}

static decoded decode(int sel, uint64_t arg, const uint8_t *b, size_t len)
{
    decoded d;
    memset(&d, 0, sizeof d);
    wire_reader r;
    wire_reader_init(&r, b, len);
    switch (sel) {
    case M_JOIN: d.rc = wan_msg_get_join(&r, &d.join); break;
    case M_PART: d.rc = wan_msg_get_part(&r, max_message(arg), &d.part); break;
    case M_DONE: d.rc = wan_msg_get_done(&r, max_message(arg), &d.done); break;
    case M_DONE_OK: d.rc = wan_msg_get_done_ok(&r, &d.u0, &d.u1); break;
    case M_STATE: d.rc = wan_msg_get_state(&r, arg, &d.u0, &d.u1); break;
    case M_STATE_OK: d.rc = wan_msg_get_state_ok(&r, arg, &d.slice); break;
    case M_HAVE: d.rc = wan_msg_get_have(&r, max_message(arg), &d.u0, &d.u1); break;
    case M_HAVE_OK: d.rc = wan_msg_get_have_ok(&r, arg, &d.u0, &d.u1); break;
    case M_PUSH: d.rc = outer_msg_get_push(&r, arg, &d.push); break;
    case M_PULL: d.rc = outer_msg_get_pull(&r, arg, &d.pull); break;
    default: d.rc = outer_msg_get_pull_ok(&r, arg, &d.pull_ok); break;
    }
    FUZZ_CHECK(d.rc == 0 || d.rc == CIRRUS_ECORRUPT, "decoder %d returned %d", sel, d.rc);
    FUZZ_CHECK(r.pos <= r.len, "reader at %zu past the end %zu", r.pos, r.len);
    if (d.rc == 0) FUZZ_CHECK(wire_reader_done(&r) == 0, "decoder %d accepted with bytes left", sel);
    return d;
}

/* Fields == their bytes, pointers at their bytes, and the caps. */
static void check_fields(int sel, uint64_t arg, const decoded *d, const uint8_t *b, size_t len)
{
    switch (sel) {
    case M_JOIN: {
        size_t s = strlen(d->join.region);
        FUZZ_CHECK(region_ok((const uint8_t *)d->join.region, s), "region '%s' accepted", d->join.region);
        FUZZ_CHECK(s == le_get(b, 2) && memcmp(d->join.region, b + 2, s) == 0, "region differs from its bytes");
        FUZZ_CHECK(d->join.n_regions >= 1 && d->join.n_regions <= WAN_MAX_REGIONS &&
                       d->join.index < d->join.n_regions,
                   "index %u of %u regions accepted", d->join.index, d->join.n_regions);
        const uint8_t *f = b + 2 + s;
        FUZZ_CHECK(d->join.index == le_get(f, 4) && d->join.n_regions == le_get(f + 4, 4) &&
                       d->join.n_params == le_get(f + 8, 8) && d->join.round == le_get(f + 16, 8) &&
                       d->join.digest == le_get(f + 24, 8) && d->join.fragment == le_get(f + 32, 4) &&
                       d->join.n_fragments == le_get(f + 36, 4),
                   "JOIN fields differ from their bytes");
        FUZZ_CHECK(d->join.n_fragments >= 1 && d->join.n_fragments <= OUTER_MAX_FRAGMENTS &&
                       d->join.fragment < d->join.n_fragments,
                   "fragment %u of %u accepted", d->join.fragment, d->join.n_fragments);
        break;
    }
    case M_PART:
        FUZZ_CHECK(d->part.round == le_get(b, 8) && d->part.total == le_get(b + 8, 8) &&
                       d->part.offset == le_get(b + 16, 8),
                   "PART fields differ from their bytes");
        FUZZ_CHECK(d->part.bytes == b + 24 && d->part.len == len - 24, "PART bytes not the payload's rest");
        FUZZ_CHECK(d->part.len <= WAN_PART_BYTES && d->part.offset <= d->part.total &&
                       d->part.len <= d->part.total - d->part.offset && d->part.total <= max_message(arg),
                   "PART offset %llu + len %llu past total %llu (cap %llu)",
                   (unsigned long long)d->part.offset, (unsigned long long)d->part.len,
                   (unsigned long long)d->part.total, (unsigned long long)max_message(arg));
        break;
    case M_DONE:
        FUZZ_CHECK(d->done.round == le_get(b, 8) && d->done.tokens == le_get(b + 8, 8) &&
                       d->done.prev_digest == le_get(b + 16, 8) && d->done.total == le_get(b + 24, 8) &&
                       d->done.hash == le_get(b + 32, 8) && d->done.at == le_get(b + 40, 8) &&
                       d->done.wish == le_get(b + 48, 4) && len == 52,
                   "DONE fields differ from their bytes");
        FUZZ_CHECK(d->done.round >= 1 && d->done.total <= max_message(arg), "DONE round %llu total %llu",
                   (unsigned long long)d->done.round, (unsigned long long)d->done.total);
        FUZZ_CHECK(outer_stride_valid(d->done.wish), "DONE stride wish %u", d->done.wish);
        break;
    case M_DONE_OK:
        FUZZ_CHECK(d->u0 == le_get(b, 8) && d->u1 == le_get(b + 8, 8), "DONE_OK fields differ");
        break;
    case M_STATE:
        FUZZ_CHECK(d->u0 == le_get(b, 8) && d->u1 == le_get(b + 8, 8), "STATE fields differ");
        FUZZ_CHECK(arg <= UINT64_MAX / 2 && d->u0 + d->u1 <= 2 * arg && d->u1 <= WAN_STATE_SLICE,
                   "STATE slice [%llu, +%llu) of 2 x %llu", (unsigned long long)d->u0,
                   (unsigned long long)d->u1, (unsigned long long)arg);
        break;
    case M_STATE_OK:
        FUZZ_CHECK(d->slice.round == le_get(b, 8) && d->slice.digest == le_get(b + 8, 8) &&
                       d->slice.sched.at == le_get(b + 16, 8) &&
                       d->slice.sched.stride == le_get(b + 24, 4) &&
                       d->slice.sched.next_stride == le_get(b + 28, 4),
                   "STATE_OK fields differ");
        FUZZ_CHECK(outer_stride_valid(d->slice.sched.stride) &&
                       outer_stride_valid(d->slice.sched.next_stride),
                   "STATE_OK strides %u, %u", d->slice.sched.stride, d->slice.sched.next_stride);
        FUZZ_CHECK(arg <= WAN_STATE_SLICE && d->slice.floats == b + 32 && len == 32 + 4 * arg,
                   "STATE_OK floats not the %llu at the payload's end", (unsigned long long)arg);
        break;
    case M_HAVE:
        FUZZ_CHECK(d->u0 == le_get(b, 8) && d->u1 == le_get(b + 8, 8), "HAVE fields differ");
        FUZZ_CHECK(d->u1 <= max_message(arg), "HAVE total %llu over the cap %llu",
                   (unsigned long long)d->u1, (unsigned long long)max_message(arg));
        break;
    case M_HAVE_OK:
        FUZZ_CHECK(d->u0 == le_get(b, 8) && d->u1 == le_get(b + 8, 8), "HAVE_OK fields differ");
        FUZZ_CHECK(d->u0 <= arg, "HAVE_OK got %llu of a %llu-byte message", (unsigned long long)d->u0,
                   (unsigned long long)arg);
        break;
    case M_PUSH: {
        const outer_push *q = &d->push;
        FUZZ_CHECK(q->fragment == le_get(b, 2) && q->round == le_get(b + 2, 8) &&
                       q->inner_step == le_get(b + 10, 8) && q->at == le_get(b + 18, 8) &&
                       q->tokens == le_get(b + 26, 8) && q->compute_ms == le_get(b + 34, 4) &&
                       q->n_params == le_get(b + 38, 8) && q->offset == le_get(b + 46, 8) &&
                       q->count == le_get(b + 54, 8),
                   "PUSH fields differ");
        FUZZ_CHECK(q->n_params == arg && q->offset + q->count <= arg && q->count <= OUTER_SLICE &&
                       q->floats == b + 62 && len == 62 + 4 * q->count,
                   "PUSH slice [%llu, +%llu) of %llu, floats at %td of %zu", (unsigned long long)q->offset,
                   (unsigned long long)q->count, (unsigned long long)arg, q->floats - b, len);
        break;
    }
    case M_PULL:
        FUZZ_CHECK(d->pull.fragment == le_get(b, 2) && d->pull.round == le_get(b + 2, 8) &&
                       d->pull.offset == le_get(b + 10, 8) && d->pull.count == le_get(b + 18, 8),
                   "PULL fields differ");
        FUZZ_CHECK(d->pull.offset + d->pull.count <= arg && d->pull.count <= OUTER_SLICE, "PULL slice past n");
        break;
    default: {
        const outer_pull_ok *a = &d->pull_ok;
        FUZZ_CHECK(a->done == le_get(b, 8) && a->digest == le_get(b + 8, 8) && a->wan_bytes == le_get(b + 16, 8) &&
                       a->ready == b[24] && a->pushed == b[25] && a->region == le_get(b + 26, 2) &&
                       a->regions == le_get(b + 28, 2) && a->fragments == le_get(b + 30, 2) &&
                       a->sched.at == le_get(b + 32, 8) && a->sched.stride == le_get(b + 40, 4) &&
                       a->sched.next_stride == le_get(b + 44, 4),
                   "PULL_OK fields differ");
        FUZZ_CHECK(outer_stride_valid(a->sched.stride) && outer_stride_valid(a->sched.next_stride),
                   "PULL_OK strides %u, %u", a->sched.stride, a->sched.next_stride);
        FUZZ_CHECK(a->fragments >= 1 && a->fragments <= OUTER_MAX_FRAGMENTS, "PULL_OK %u fragments",
                   a->fragments);
        FUZZ_CHECK(a->ready <= 1 && a->pushed <= 1 && arg <= OUTER_SLICE, "PULL_OK ready %u pushed %u count %llu",
                   a->ready, a->pushed, (unsigned long long)arg);
        FUZZ_CHECK(a->region < a->regions, "PULL_OK region %u of %u", a->region, a->regions);
        FUZZ_CHECK(a->ready ? a->floats == b + 48 && len == 48 + 4 * arg : !a->floats && len == 48,
                   "PULL_OK floats %td, ready %u, %zu bytes", a->floats ? a->floats - b : -1, a->ready, len);
    }
    }
}

/* A copy of count floats from unaligned bytes, so the put functions get a real float *. */
static float *floats_of(const uint8_t *p, uint64_t count)
{
    float *x = malloc(count ? count * sizeof(float) : 1);
    if (!x) abort();
    if (count) memcpy(x, p, count * sizeof(float));
    return x;
}

static void encode(int sel, uint64_t arg, const decoded *d, wire_writer *w)
{
    float *x = NULL;
    switch (sel) {
    case M_JOIN: wan_msg_put_join(w, &d->join); break;
    case M_PART: wan_msg_put_part(w, &d->part); break;
    case M_DONE: wan_msg_put_done(w, &d->done); break;
    case M_DONE_OK: wan_msg_put_done_ok(w, d->u0, d->u1); break;
    case M_STATE: wan_msg_put_state(w, d->u0, d->u1); break;
    case M_STATE_OK:
        x = floats_of(d->slice.floats, arg);
        wan_msg_put_state_ok(w, d->slice.round, d->slice.digest, &d->slice.sched, x, arg);
        break;
    case M_HAVE: wan_msg_put_have(w, d->u0, d->u1); break;
    case M_HAVE_OK: wan_msg_put_have_ok(w, d->u0, d->u1); break;
    case M_PUSH:
        x = floats_of(d->push.floats, d->push.count);
        outer_msg_put_push(w, &d->push, x);
        break;
    case M_PULL: outer_msg_put_pull(w, &d->pull); break;
    default:
        if (d->pull_ok.ready) x = floats_of(d->pull_ok.floats, arg);
        outer_msg_put_pull_ok(w, &d->pull_ok, x, arg);
    }
    free(x);
}

/* The fields of two decodes of the same bytes at b1 and b2 are the same. */
static int same_fields(int sel, const decoded *a, const uint8_t *b1, const decoded *b, const uint8_t *b2)
{
    switch (sel) {
    case M_JOIN:
        return !strcmp(a->join.region, b->join.region) && a->join.index == b->join.index &&
               a->join.n_regions == b->join.n_regions && a->join.n_params == b->join.n_params &&
               a->join.round == b->join.round && a->join.digest == b->join.digest;
    case M_PART:
        return a->part.round == b->part.round && a->part.total == b->part.total &&
               a->part.offset == b->part.offset && a->part.len == b->part.len &&
               a->part.bytes - b1 == b->part.bytes - b2;
    case M_DONE:
        return a->done.round == b->done.round && a->done.tokens == b->done.tokens &&
               a->done.prev_digest == b->done.prev_digest && a->done.total == b->done.total &&
               a->done.hash == b->done.hash && a->done.at == b->done.at &&
               a->done.wish == b->done.wish;
    case M_DONE_OK:
    case M_STATE:
    case M_HAVE:
    case M_HAVE_OK: return a->u0 == b->u0 && a->u1 == b->u1;
    case M_STATE_OK:
        return a->slice.round == b->slice.round && a->slice.digest == b->slice.digest &&
               !memcmp(&a->slice.sched, &b->slice.sched, sizeof a->slice.sched) &&
               a->slice.floats - b1 == b->slice.floats - b2;
    case M_PUSH:
        return a->push.round == b->push.round && a->push.inner_step == b->push.inner_step &&
               a->push.at == b->push.at && a->push.tokens == b->push.tokens &&
               a->push.compute_ms == b->push.compute_ms && a->push.n_params == b->push.n_params &&
               a->push.offset == b->push.offset && a->push.count == b->push.count &&
               a->push.floats - b1 == b->push.floats - b2;
    case M_PULL: return !memcmp(&a->pull, &b->pull, sizeof a->pull);
    default:
        return a->pull_ok.done == b->pull_ok.done && a->pull_ok.digest == b->pull_ok.digest &&
               a->pull_ok.wan_bytes == b->pull_ok.wan_bytes && a->pull_ok.ready == b->pull_ok.ready &&
               a->pull_ok.pushed == b->pull_ok.pushed && a->pull_ok.region == b->pull_ok.region &&
               a->pull_ok.regions == b->pull_ok.regions &&
               !memcmp(&a->pull_ok.sched, &b->pull_ok.sched, sizeof a->pull_ok.sched) &&
               (a->pull_ok.floats ? a->pull_ok.floats - b1 : -1) == (b->pull_ok.floats ? b->pull_ok.floats - b2 : -1);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 9) return 0;
    const int sel = data[0] % M_COUNT;
    const uint64_t arg = le_get(data + 1, 8);
    const uint8_t *b = data + 9;
    const size_t len = size - 9;

    decoded d = decode(sel, arg, b, len);
    int want = spec_accepts(sel, arg, b, len);
    FUZZ_CHECK((d.rc == 0) == want, "decoder %d %s a payload of %zu bytes the format %s (arg %llu)", sel,
               d.rc ? "refused" : "accepted", len, want ? "accepts" : "refuses", (unsigned long long)arg);
    if (d.rc) return 0;
    check_fields(sel, arg, &d, b, len);

    wire_writer w;
    wire_writer_init(&w, len);
    encode(sel, arg, &d, &w);
    FUZZ_CHECK(!w.failed, "writer refused %zu bytes", len);
    FUZZ_CHECK(w.len == len && (len == 0 || memcmp(w.data, b, len) == 0),
               "decoder %d: put(get(x)) is %zu bytes, not the %zu of x", sel, w.len, len);
    decoded again = decode(sel, arg, w.data, w.len);
    FUZZ_CHECK(again.rc == 0, "decoder %d refuses its own encoding", sel);
    FUZZ_CHECK(same_fields(sel, &d, b, &again, w.data), "decoder %d: get(put(get(x))) != get(x)", sel);
    wire_writer_free(&w);
    return 0;
}
