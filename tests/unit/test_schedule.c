/* When the outer rounds are pushed (gateway/schedule.h) and how far apart a gateway asks
 * for them when even the sparsest codec does not fit its window (adapt_stride). */
#include "../../trainer/gateway/adapt.h"
#include "../../trainer/gateway/schedule.h"
#include "test.h"

/* With stride 1 from the start the schedule is plain --sync-every: a push at every
 * multiple of H, round = clock / H, a run's last step (off the grid) the round after. */
TEST(schedule_with_stride_one_is_every_h_steps)
{
    const uint64_t H = 10;
    outer_schedule s = OUTER_SCHEDULE_START;
    uint64_t done = 0;
    for (uint64_t at = 1; at <= 95; at++) {
        const int due = outer_schedule_push_due(&s, H, at);
        ASSERT_EQ(due, at % H == 0);
        if (!due && at != 95) continue;
        const uint64_t round = outer_schedule_round(&s, done, H, at);
        ASSERT_EQ(round, (at + H - 1) / H);
        ASSERT_EQ(outer_schedule_result_due(&s, H, at), at + H);
        const uint64_t ats[1] = {at};
        const uint32_t wish[1] = {1};
        outer_schedule_advance(&s, ats, wish, 1);
        done = round;
        ASSERT(s.at == at && s.stride == 1 && s.next_stride == 1);
    }
    ASSERT_EQ(done, 10);
}

/* A wish in round k's messages spaces round k + 2 from round k + 1; the largest wish of
 * the round wins; the clock is the latest push's; a region behind the state's clock has
 * no push due and a push there is the state's own round (the job is past it). */
TEST(schedule_strides_are_agreed_one_round_ahead)
{
    const uint64_t H = 10;
    outer_schedule s = OUTER_SCHEDULE_START;
    const uint64_t at1[2] = {10, 10};
    const uint32_t wish1[2] = {1, 4};
    outer_schedule_advance(&s, at1, wish1, 2); /* round 1 done */
    ASSERT(s.at == 10 && s.stride == 1 && s.next_stride == 4);
    ASSERT(outer_schedule_push_due(&s, H, 20));       /* round 2 still H after round 1 */
    ASSERT_EQ(outer_schedule_round(&s, 1, H, 20), 2);
    ASSERT_EQ(outer_schedule_result_due(&s, H, 20), 60); /* round 3 comes 4H later */
    const uint64_t at2[2] = {20, 20};
    const uint32_t wish2[2] = {2, 1};
    outer_schedule_advance(&s, at2, wish2, 2); /* round 2 done */
    ASSERT(s.at == 20 && s.stride == 4 && s.next_stride == 2);
    for (uint64_t at = 21; at < 60; at++) ASSERT(!outer_schedule_push_due(&s, H, at));
    ASSERT(outer_schedule_push_due(&s, H, 60));
    ASSERT_EQ(outer_schedule_round(&s, 2, H, 60), 3);
    ASSERT_EQ(outer_schedule_round(&s, 2, H, 45), 3);  /* the last step, off the grid */
    ASSERT_EQ(outer_schedule_round(&s, 2, H, 100), 4); /* a region catching up */
    ASSERT(!outer_schedule_push_due(&s, H, 20));
    ASSERT(!outer_schedule_push_due(&s, H, 15));
    ASSERT_EQ(outer_schedule_round(&s, 2, H, 15), 2);
    /* The earliest clock past the last round's wins (one region's cannot pull the job's
     * ahead); a wish that is no valid stride is taken as the widest. */
    const uint64_t at3[3] = {90, 60, 20};
    const uint32_t wish3[3] = {1, 1, 1};
    outer_schedule_advance(&s, at3, wish3, 3);
    ASSERT(s.at == 60 && s.stride == 2 && s.next_stride == 1);
    const uint32_t odd[1] = {3};
    outer_schedule_advance(&s, at3, odd, 1);
    ASSERT_EQ(s.next_stride, OUTER_MAX_STRIDE);
    ASSERT(outer_stride_valid(1) && outer_stride_valid(OUTER_MAX_STRIDE));
    ASSERT(!outer_stride_valid(0) && !outer_stride_valid(3) &&
           !outer_stride_valid(OUTER_MAX_STRIDE * 2));
}

/* The schedule on the wire: fields kept; an invalid stride or a short buffer refused. */
TEST(schedule_wire_round_trip_and_refusals)
{
    const outer_schedule s = {.at = 123456789, .stride = 8, .next_stride = 2};
    wire_writer w;
    wire_reader r;
    outer_schedule g;
    wire_writer_init(&w, 32);
    outer_schedule_put(&w, &s);
    wire_reader_init(&r, w.data, w.len);
    ASSERT_OK(outer_schedule_get(&r, &g));
    ASSERT(g.at == s.at && g.stride == 8 && g.next_stride == 2);
    wire_reader_init(&r, w.data, w.len - 1);
    ASSERT(outer_schedule_get(&r, &g) != 0);
    wire_writer_free(&w);
    const outer_schedule bad = {.at = 1, .stride = 5, .next_stride = 1};
    wire_writer_init(&w, 32);
    outer_schedule_put(&w, &bad);
    wire_reader_init(&r, w.data, w.len);
    ASSERT(outer_schedule_get(&r, &g) != 0);
    wire_writer_free(&w);
}

/* The sparsest message fits every H steps: stride 1. A link 5x too slow for it: a stride
 * of 8 (the smallest power of two whose window fits within the budget). Hardly any link:
 * the widest. Recovered: back to 1, but a rate at which the smaller stride fits only the
 * budget, not the back-off budget, keeps the current one. Not measured: stay. */
TEST(adapt_stride_spaces_syncs_only_when_the_sparsest_does_not_fit)
{
    const uint64_t n = 1000000;
    const double base = 2.0; /* s of compute per H steps */
    const double sparsest_s_at_1MBps = adapt_bytes(ADAPT_RUNGS - 1, n) / 1e6;
    const double fits = adapt_bytes(ADAPT_RUNGS - 1, n) / (0.5 * ADAPT_BUDGET * base);
    ASSERT_EQ(adapt_stride(1, n, fits, base, OUTER_MAX_STRIDE), 1);
    const double five_x_slow = adapt_bytes(ADAPT_RUNGS - 1, n) / (5 * ADAPT_BUDGET * base);
    const uint32_t s = adapt_stride(1, n, five_x_slow, base, OUTER_MAX_STRIDE);
    ASSERT_EQ(s, 8);
    ASSERT(adapt_bytes(ADAPT_RUNGS - 1, n) / five_x_slow <= ADAPT_BUDGET * base * s);
    ASSERT_EQ(adapt_stride(1, n, 1.0, base, OUTER_MAX_STRIDE), OUTER_MAX_STRIDE);
    ASSERT_EQ(adapt_stride(s, n, fits * 4, base, OUTER_MAX_STRIDE), 1);
    /* At stride 8, a rate where stride 4 fits within ADAPT_BUDGET but not within
     * ADAPT_BACKOFF_BUDGET stays at 8. */
    const double near = adapt_bytes(ADAPT_RUNGS - 1, n) / (0.7 * base * 4);
    ASSERT_EQ(adapt_stride(8, n, near, base, OUTER_MAX_STRIDE), 8);
    ASSERT_EQ(adapt_stride(1, n, near, base, OUTER_MAX_STRIDE), 4);
    ASSERT_EQ(adapt_stride(4, n, 0, base, OUTER_MAX_STRIDE), 4);
    ASSERT_EQ(adapt_stride(4, n, 1e6, 0, OUTER_MAX_STRIDE), 4);
    /* A bound: rounded down to a power of two (6: 4), the wish and the current within it. */
    ASSERT_EQ(adapt_stride(1, n, 1.0, base, 6), 4);
    ASSERT_EQ(adapt_stride(8, n, 0, base, 4), 4);
    ASSERT_EQ(adapt_stride(1, n, 1.0, base, 0), 1);
    ASSERT(sparsest_s_at_1MBps > 0);
}
