/* schedule: see schedule.h. */
#include "schedule.h"

#include "../../common/cerr.h"

int outer_stride_valid(uint32_t stride)
{
    return stride >= 1 && stride <= OUTER_MAX_STRIDE && (stride & (stride - 1)) == 0;
}

int outer_schedule_push_due(const outer_schedule *s, uint64_t every, uint64_t at)
{
    const uint64_t span = (uint64_t)s->stride * every;
    return span > 0 && at > s->at && (at - s->at) % span == 0;
}

uint64_t outer_schedule_round(const outer_schedule *s, uint64_t done, uint64_t every,
                              uint64_t at)
{
    const uint64_t span = (uint64_t)s->stride * every;
    if (span == 0 || at <= s->at) return done;
    return done + (at - s->at + span - 1) / span;
}

uint64_t outer_schedule_result_due(const outer_schedule *s, uint64_t every, uint64_t pushed)
{
    return pushed + (uint64_t)s->next_stride * every;
}

void outer_schedule_advance(outer_schedule *s, const uint64_t *at, const uint32_t *wish, int n)
{
    /* The earliest push clock past the last round's: every region pushes a round at the
     * same clock but the last step's (off the grid, and the run's end), so this is the
     * grid point; and one message's clock cannot hold the job's schedule ahead of the
     * others' (a clock from the network is used for nothing else). */
    uint64_t earliest = 0;
    uint32_t widest = 1;
    for (int i = 0; i < n; i++) {
        if (at[i] > s->at && (!earliest || at[i] < earliest)) earliest = at[i];
        widest = wish[i] > widest ? wish[i] : widest;
    }
    if (earliest) s->at = earliest;
    s->stride = s->next_stride;
    s->next_stride = outer_stride_valid(widest) ? widest : OUTER_MAX_STRIDE;
}

void outer_schedule_put(wire_writer *w, const outer_schedule *s)
{
    wire_put_u64(w, s->at);
    wire_put_u32(w, s->stride);
    wire_put_u32(w, s->next_stride);
}

int outer_schedule_get(wire_reader *r, outer_schedule *s)
{
    s->at = wire_get_u64(r);
    s->stride = wire_get_u32(r);
    s->next_stride = wire_get_u32(r);
    return r->failed || !outer_stride_valid(s->stride) || !outer_stride_valid(s->next_stride)
               ? CIRRUS_ECORRUPT : 0;
}
