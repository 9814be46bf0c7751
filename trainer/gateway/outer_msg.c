/* outer_msg: see outer_msg.h. */
#include "outer_msg.h"

#include "../../common/cerr.h"
#include "fragments.h"

static int slice_ok(uint64_t n, uint64_t offset, uint64_t count)
{
    return offset <= n && count <= n - offset && count <= OUTER_SLICE;
}

int outer_msg_peek_fragment(const wire_reader *r)
{
    wire_reader peek = *r;
    const uint16_t f = wire_get_u16(&peek);
    return peek.failed ? -1 : f;
}

void outer_msg_put_push(wire_writer *w, const outer_push *q, const float *x)
{
    wire_put_u16(w, q->fragment);
    wire_put_u64(w, q->round);
    wire_put_u64(w, q->inner_step);
    wire_put_u64(w, q->at);
    wire_put_u64(w, q->tokens);
    wire_put_u32(w, q->compute_ms);
    wire_put_u64(w, q->n_params);
    wire_put_u64(w, q->offset);
    wire_put_u64(w, q->count);
    wire_put_bytes(w, x, (size_t)q->count * sizeof(float));
}

int outer_msg_get_push(wire_reader *r, uint64_t n, outer_push *q)
{
    q->fragment = wire_get_u16(r);
    q->round = wire_get_u64(r);
    q->inner_step = wire_get_u64(r);
    q->at = wire_get_u64(r);
    q->tokens = wire_get_u64(r);
    q->compute_ms = wire_get_u32(r);
    q->n_params = wire_get_u64(r);
    q->offset = wire_get_u64(r);
    q->count = wire_get_u64(r);
    q->floats = NULL;
    if (r->failed || q->n_params != n || !slice_ok(n, q->offset, q->count))
        return CIRRUS_ECORRUPT;
    q->floats = wire_get_bytes(r, (size_t)q->count * sizeof(float));
    return !q->floats || wire_reader_done(r) ? CIRRUS_ECORRUPT : 0;
}

void outer_msg_put_pull(wire_writer *w, const outer_pull *q)
{
    wire_put_u16(w, q->fragment);
    wire_put_u64(w, q->round);
    wire_put_u64(w, q->offset);
    wire_put_u64(w, q->count);
}

int outer_msg_get_pull(wire_reader *r, uint64_t n, outer_pull *q)
{
    q->fragment = wire_get_u16(r);
    q->round = wire_get_u64(r);
    q->offset = wire_get_u64(r);
    q->count = wire_get_u64(r);
    return wire_reader_done(r) || !slice_ok(n, q->offset, q->count) ? CIRRUS_ECORRUPT : 0;
}

void outer_msg_put_pull_ok(wire_writer *w, const outer_pull_ok *a, const float *x,
                           uint64_t count)
{
    wire_put_u64(w, a->done);
    wire_put_u64(w, a->digest);
    wire_put_u64(w, a->wan_bytes);
    wire_put_bytes(w, &a->ready, 1);
    wire_put_bytes(w, &a->pushed, 1);
    wire_put_u16(w, a->region);
    wire_put_u16(w, a->regions);
    wire_put_u16(w, a->fragments);
    outer_schedule_put(w, &a->sched);
    if (a->ready && x) wire_put_bytes(w, x, (size_t)count * sizeof(float));
}

int outer_msg_get_pull_ok(wire_reader *r, uint64_t count, outer_pull_ok *a)
{
    a->done = wire_get_u64(r);
    a->digest = wire_get_u64(r);
    a->wan_bytes = wire_get_u64(r);
    const uint8_t *b = wire_get_bytes(r, 1);
    a->floats = NULL;
    const uint8_t *pb = b ? wire_get_bytes(r, 1) : NULL;
    if (!b || *b > 1 || !pb || *pb > 1 || count > OUTER_SLICE) return CIRRUS_ECORRUPT;
    a->ready = *b;
    a->pushed = *pb;
    a->region = wire_get_u16(r);
    a->regions = wire_get_u16(r);
    a->fragments = wire_get_u16(r);
    if (r->failed || a->regions < 1 || a->region >= a->regions || a->fragments < 1 ||
        a->fragments > OUTER_MAX_FRAGMENTS || outer_schedule_get(r, &a->sched))
        return CIRRUS_ECORRUPT;
    if (a->ready && !(a->floats = wire_get_bytes(r, (size_t)count * sizeof(float))))
        return CIRRUS_ECORRUPT;
    return wire_reader_done(r) ? CIRRUS_ECORRUPT : 0;
}
