/* wan_msg: see wan_msg.h. */
#include "wan_msg.h"

#include <string.h>

#include "../../common/cerr.h"
#include "../../common/names.h"
#include "fragments.h"

void wan_msg_put_join(wire_writer *w, const wan_join *j)
{
    wire_put_str(w, j->region);
    wire_put_u32(w, j->index);
    wire_put_u32(w, j->n_regions);
    wire_put_u64(w, j->n_params);
    wire_put_u64(w, j->round);
    wire_put_u64(w, j->digest);
    wire_put_u32(w, j->fragment);
    wire_put_u32(w, j->n_fragments);
}

int wan_msg_get_join(wire_reader *r, wan_join *j)
{
    if (wire_get_str(r, j->region, sizeof j->region)) return CIRRUS_ECORRUPT;
    j->index = wire_get_u32(r);
    j->n_regions = wire_get_u32(r);
    j->n_params = wire_get_u64(r);
    j->round = wire_get_u64(r);
    j->digest = wire_get_u64(r);
    j->fragment = wire_get_u32(r);
    j->n_fragments = wire_get_u32(r);
    if (wire_reader_done(r) || !name_chars_ok(j->region, 1, WAN_REGION_MAX, "._-") ||
        j->n_regions < 1 || j->n_regions > WAN_MAX_REGIONS || j->index >= j->n_regions ||
        j->n_fragments < 1 || j->n_fragments > OUTER_MAX_FRAGMENTS ||
        j->fragment >= j->n_fragments)
        return CIRRUS_ECORRUPT;
    return 0;
}

void wan_msg_put_part(wire_writer *w, const wan_part *p)
{
    wire_put_u64(w, p->round);
    wire_put_u64(w, p->total);
    wire_put_u64(w, p->offset);
    wire_put_bytes(w, p->bytes, (size_t)p->len);
}

int wan_msg_get_part(wire_reader *r, uint64_t max_total, wan_part *p)
{
    p->round = wire_get_u64(r);
    p->total = wire_get_u64(r);
    p->offset = wire_get_u64(r);
    if (r->failed) return CIRRUS_ECORRUPT;
    p->len = r->len - r->pos;
    p->bytes = wire_get_bytes(r, (size_t)p->len);
    if (!p->bytes && p->len) return CIRRUS_ECORRUPT;
    if (wire_reader_done(r) || p->total > max_total || p->offset > p->total ||
        p->len > p->total - p->offset || p->len > WAN_PART_BYTES)
        return CIRRUS_ECORRUPT;
    return 0;
}

void wan_msg_put_done(wire_writer *w, const wan_done *d)
{
    wire_put_u64(w, d->round);
    wire_put_u64(w, d->tokens);
    wire_put_u64(w, d->prev_digest);
    wire_put_u64(w, d->total);
    wire_put_u64(w, d->hash);
    wire_put_u64(w, d->at);
    wire_put_u32(w, d->wish);
}

int wan_msg_get_done(wire_reader *r, uint64_t max_total, wan_done *d)
{
    d->round = wire_get_u64(r);
    d->tokens = wire_get_u64(r);
    d->prev_digest = wire_get_u64(r);
    d->total = wire_get_u64(r);
    d->hash = wire_get_u64(r);
    d->at = wire_get_u64(r);
    d->wish = wire_get_u32(r);
    return wire_reader_done(r) || d->total > max_total || d->round == 0 ||
                   !outer_stride_valid(d->wish)
               ? CIRRUS_ECORRUPT : 0;
}

void wan_msg_put_done_ok(wire_writer *w, uint64_t round, uint64_t receive_ms)
{
    wire_put_u64(w, round);
    wire_put_u64(w, receive_ms);
}

int wan_msg_get_done_ok(wire_reader *r, uint64_t *round, uint64_t *receive_ms)
{
    *round = wire_get_u64(r);
    *receive_ms = wire_get_u64(r);
    return wire_reader_done(r) ? CIRRUS_ECORRUPT : 0;
}

void wan_msg_put_state(wire_writer *w, uint64_t offset, uint64_t count)
{
    wire_put_u64(w, offset);
    wire_put_u64(w, count);
}

int wan_msg_get_state(wire_reader *r, uint64_t n, uint64_t *offset, uint64_t *count)
{
    *offset = wire_get_u64(r);
    *count = wire_get_u64(r);
    if (wire_reader_done(r) || n > UINT64_MAX / 2 || *offset > 2 * n || *count > 2 * n - *offset ||
        *count > WAN_STATE_SLICE)
        return CIRRUS_ECORRUPT;
    return 0;
}

void wan_msg_put_state_ok(wire_writer *w, uint64_t round, uint64_t digest,
                          const outer_schedule *sched, const float *x, uint64_t count)
{
    wire_put_u64(w, round);
    wire_put_u64(w, digest);
    outer_schedule_put(w, sched);
    wire_put_bytes(w, x, (size_t)count * sizeof(float));
}

int wan_msg_get_state_ok(wire_reader *r, uint64_t count, wan_state_slice *s)
{
    s->round = wire_get_u64(r);
    s->digest = wire_get_u64(r);
    s->floats = NULL;
    if (outer_schedule_get(r, &s->sched)) return CIRRUS_ECORRUPT;
    s->floats = count <= WAN_STATE_SLICE ? wire_get_bytes(r, (size_t)count * sizeof(float)) : NULL;
    return !s->floats || wire_reader_done(r) ? CIRRUS_ECORRUPT : 0;
}

void wan_msg_put_have(wire_writer *w, uint64_t round, uint64_t total)
{
    wire_put_u64(w, round);
    wire_put_u64(w, total);
}

int wan_msg_get_have(wire_reader *r, uint64_t max_total, uint64_t *round, uint64_t *total)
{
    *round = wire_get_u64(r);
    *total = wire_get_u64(r);
    return wire_reader_done(r) || *total > max_total ? CIRRUS_ECORRUPT : 0;
}

void wan_msg_put_have_ok(wire_writer *w, uint64_t got, uint64_t hash)
{
    wire_put_u64(w, got);
    wire_put_u64(w, hash);
}

int wan_msg_get_have_ok(wire_reader *r, uint64_t total, uint64_t *got, uint64_t *hash)
{
    *got = wire_get_u64(r);
    *hash = wire_get_u64(r);
    return wire_reader_done(r) || *got > total ? CIRRUS_ECORRUPT : 0;
}
