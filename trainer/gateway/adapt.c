/* adapt: see adapt.h. */
#include "adapt.h"

#include <stdio.h>

#include "schedule.h"

static const char *const ladder[ADAPT_RUNGS] = {
    "none", "fp16", "q8", "lowbit:4+zstd", "lowbit:2+zstd", "topk:0.01+zstd",
};

void adapt_rung(int r, wan_codec_params *p)
{
    if (r < 0) r = 0;
    if (r >= ADAPT_RUNGS) r = ADAPT_RUNGS - 1;
    wan_codec_parse(ladder[r], p, NULL); /* the ladder's specs are valid */
}

double adapt_bytes(int r, uint64_t n)
{
    wan_codec_params p;
    adapt_rung(r, &p);
    /* The bound without zstd: what zstd saves on quantised deltas is small and varies. */
    p.zstd = 0;
    const size_t b = wan_encode_bound((size_t)n, &p);
    return b == SIZE_MAX ? 4.0 * (double)n : (double)b;
}

int adapt_choose(int current, uint64_t n, double link_Bps, double window_s, char *why,
                 size_t why_size)
{
    if (current < 0 || current >= ADAPT_RUNGS) current = 0;
    if (link_Bps <= 0 || window_s <= 0) {
        snprintf(why, why_size, "%s: the link's rate or the window is not measured yet",
                 ladder[current]);
        return current;
    }
    int pick = ADAPT_RUNGS - 1;
    for (int r = 0; r < ADAPT_RUNGS; r++) {
        const double budget = r < current ? ADAPT_BACKOFF_BUDGET : ADAPT_BUDGET;
        if (adapt_bytes(r, n) / link_Bps <= budget * window_s) {
            pick = r;
            break;
        }
    }
    const double need = adapt_bytes(pick, n) / link_Bps;
    if (need > ADAPT_BUDGET * window_s)
        snprintf(why, why_size, "%s: even it needs %.2f s of a %.2f s window at %.2f Mbit/s",
                 ladder[pick], need, window_s, link_Bps * 8e-6);
    else
        snprintf(why, why_size, "%s: %.2f s of a %.2f s window at %.2f Mbit/s%s", ladder[pick],
                 need, window_s, link_Bps * 8e-6,
                 pick > current ? " (compressing harder)"
                 : pick < current ? " (backing off)" : "");
    return pick;
}

uint32_t adapt_stride(uint32_t current, uint64_t n, double link_Bps, double base_window_s,
                      uint32_t max_stride)
{
    uint32_t top = 1; /* max_stride rounded down to a power of two, within OUTER_MAX_STRIDE */
    while (top < OUTER_MAX_STRIDE && top * 2 <= max_stride) top *= 2;
    if (!outer_stride_valid(current)) current = 1;
    if (current > top) current = top;
    if (link_Bps <= 0 || base_window_s <= 0) return current;
    const double need = adapt_bytes(ADAPT_RUNGS - 1, n) / link_Bps;
    for (uint32_t s = 1; s < top; s *= 2) {
        const double budget = s < current ? ADAPT_BACKOFF_BUDGET : ADAPT_BUDGET;
        if (need <= budget * base_window_s * s) return s;
    }
    return top;
}

void adapt_rate_update(adapt_rate *est, uint64_t bytes, double seconds)
{
    if (!(seconds > 0) || bytes == 0) return;
    const double rate = (double)bytes / seconds;
    if (est->Bps <= 0 || rate <= est->Bps) {
        est->Bps = rate;
        est->run_n = 0;
        return;
    }
    /* In proportion to the size: a message mostly made of what the link swallows at once
     * counts for little, yet a run of them still raises the estimate, round by round. */
    double f = (double)bytes / ADAPT_RATE_TRUST_BYTES;
    if (f > 1) f = 1;
    est->Bps += 0.5 * f * (rate - est->Bps);
    /* A run of faster readings, each timed long enough not to be rounding: what the link
     * carried again and again. One too short to time breaks no run but adds nothing. */
    if (seconds < ADAPT_RATE_TIMED_S) return;
    if (est->run_n == ADAPT_RATE_RUN) {
        for (int i = 1; i < ADAPT_RATE_RUN; i++) est->run[i - 1] = est->run[i];
        est->run_n--;
    }
    est->run[est->run_n++] = rate;
    if (est->run_n < ADAPT_RATE_RUN) return;
    double least = est->run[0];
    for (int i = 1; i < ADAPT_RATE_RUN; i++)
        if (est->run[i] < least) least = est->run[i];
    if (least > est->Bps) est->Bps = least;
}
