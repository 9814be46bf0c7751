/* Tests of trainer/swarm/wiring: work shares follow measured throughput, the backward
 * price, newcomers, bans, exclusions, the EMA's bias correction, round robin, and a queueing
 * simulation of one slow peer where least-loaded wiring must beat round robin. */
#include <stdint.h>
#include <string.h>

#include "../../common/cerr.h"
#include "../../common/rng.h"
#include "../../trainer/swarm/policy/wiring.h"
#include "test.h"

static wiring *make(enum wiring_policy pol, int n_peers, uint64_t seed)
{
    wiring *w = wiring_new(1, pol, seed);
    ASSERT(w != NULL);
    for (int i = 0; i < n_peers; i++) ASSERT_OK(wiring_peer_add(w, 0, (uint32_t)i));
    return w;
}

static uint32_t pick(wiring *w, enum wiring_kind kind, uint32_t exclude)
{
    uint32_t id = WIRING_NONE;
    ASSERT_OK(wiring_choose(w, 0, kind, 1.0, exclude, &id));
    return id;
}

/* Peers of true speed 1, 1 and 3 samples/s, latencies with 10% noise: the least-loaded
 * clock must hand out work in proportion to speed. */
TEST(wiring_shares_follow_throughput)
{
    const double rate[3] = {1, 1, 3};
    wiring *w = make(WIRING_LEAST_LOADED, 3, 7);
    rng_state r;
    rng_seed(&r, 11);
    long count[3] = {0};
    const int N = 10000;
    for (int i = 0; i < N; i++) {
        uint32_t id = pick(w, WIRING_FORWARD, WIRING_NONE);
        count[id]++;
        double sec = (1.0 / rate[id]) * (1.0 + 0.1 * rng_normal(&r));
        ASSERT_OK(wiring_report(w, 0, id, WIRING_FORWARD, 1.0, sec > 0 ? sec : 1e-3, WIRING_OK));
    }
    fprintf(stderr, "  shares: %.4f %.4f %.4f (want 0.2 0.2 0.6)\n", (double)count[0] / N,
            (double)count[1] / N, (double)count[2] / N);
    ASSERT_NEAR((double)count[0] / N, 0.2, 0.05);
    ASSERT_NEAR((double)count[1] / N, 0.2, 0.05);
    ASSERT_NEAR((double)count[2] / N, 0.6, 0.05);
    ASSERT_NEAR(wiring_throughput(w, 0, 2), 3.0, 0.3);
    wiring_free(w);
}

TEST(wiring_backward_costs_2_5x)
{
    wiring *w = make(WIRING_LEAST_LOADED, 1, 1);
    /* 8 samples in 2 s: 4 samples/s. */
    ASSERT_OK(wiring_report(w, 0, 0, WIRING_FORWARD, 8, 2.0, WIRING_OK));
    wiring_peer_stats ps;
    ASSERT_OK(wiring_peer_stats_get(w, 0, 0, &ps));
    double c0 = ps.vclock;
    uint32_t id;
    ASSERT_OK(wiring_choose(w, 0, WIRING_FORWARD, 4, WIRING_NONE, &id));
    ASSERT_OK(wiring_peer_stats_get(w, 0, 0, &ps));
    ASSERT_NEAR(ps.vclock - c0, 1.0, 1e-12); /* 4 samples at 4/s */
    c0 = ps.vclock;
    ASSERT_OK(wiring_choose(w, 0, WIRING_BACKWARD, 4, WIRING_NONE, &id));
    ASSERT_OK(wiring_peer_stats_get(w, 0, 0, &ps));
    ASSERT_NEAR(ps.vclock - c0, 2.5, 1e-12);
    /* A backward's measured time is normalised: 4 samples backward in 2.5 s is the same
     * 4 samples/s, so the estimate does not move. */
    ASSERT_OK(wiring_report(w, 0, 0, WIRING_BACKWARD, 4, 2.5, WIRING_OK));
    ASSERT_NEAR(wiring_throughput(w, 0, 0), 4.0, 1e-12);
    wiring_free(w);
}

TEST(wiring_new_peer_tried_at_once)
{
    wiring *w = make(WIRING_LEAST_LOADED, 3, 3);
    for (int i = 0; i < 300; i++) {
        uint32_t id = pick(w, WIRING_FORWARD, WIRING_NONE);
        ASSERT_OK(wiring_report(w, 0, id, WIRING_FORWARD, 1, 0.5 + 0.25 * id, WIRING_OK));
    }
    ASSERT_OK(wiring_peer_add(w, 0, 42));
    ASSERT_EQ(pick(w, WIRING_FORWARD, WIRING_NONE), 42);
    /* Excluded on its first chance, it is still first in line for the next task. */
    ASSERT_OK(wiring_peer_add(w, 0, 43));
    ASSERT(pick(w, WIRING_FORWARD, 43) != 43);
    ASSERT_EQ(pick(w, WIRING_FORWARD, WIRING_NONE), 43);
    /* A newcomer is priced like a typical measured peer until it reports. */
    wiring_peer_stats ps;
    ASSERT_OK(wiring_peer_stats_get(w, 0, 42, &ps));
    ASSERT_EQ(ps.n_measured, 0);
    ASSERT_EQ(wiring_throughput(w, 0, 42), 0);
    wiring_free(w);
}

/* Real latencies are milliseconds, far from the 1 s per sample an unmeasured stage is priced
 * at: the clocks charged before the first measurement must be rescaled, or the peer picked
 * first is left idle for about a thousand tasks (seen with two equal stage peers: 486
 * requests against 2). */
TEST(wiring_first_price_rescaled_to_measurements)
{
    wiring *w = make(WIRING_LEAST_LOADED, 2, 9);
    long count[2] = {0};
    for (int i = 0; i < 200; i++) {
        uint32_t id = pick(w, WIRING_FORWARD, WIRING_NONE);
        count[id]++;
        ASSERT_OK(wiring_report(w, 0, id, WIRING_FORWARD, 1.0, 0.002, WIRING_OK));
    }
    ASSERT(count[0] >= 95 && count[1] >= 95);
    /* All measured peers gone: a newcomer is priced as they were, so it takes its share at
     * once instead of being charged 1 s per sample. */
    ASSERT_OK(wiring_peer_remove(w, 0, 0));
    ASSERT_OK(wiring_peer_remove(w, 0, 1));
    ASSERT_OK(wiring_peer_add(w, 0, 2));
    ASSERT_OK(wiring_peer_add(w, 0, 3));
    long later[4] = {0};
    for (int i = 0; i < 100; i++) {
        uint32_t id = pick(w, WIRING_FORWARD, WIRING_NONE);
        later[id]++;
        ASSERT_OK(wiring_report(w, 0, id, WIRING_FORWARD, 1.0, 0.002, WIRING_OK));
    }
    ASSERT(later[2] >= 45 && later[3] >= 45);
    wiring_free(w);
}

TEST(wiring_refresh_keeps_clock)
{
    wiring *w = make(WIRING_LEAST_LOADED, 2, 5);
    ASSERT_OK(wiring_report(w, 0, 0, WIRING_FORWARD, 1, 1.0, WIRING_OK));
    ASSERT_OK(wiring_report(w, 0, 1, WIRING_FORWARD, 1, 1.0, WIRING_OK));
    for (int i = 0; i < 10; i++) pick(w, WIRING_FORWARD, WIRING_NONE);
    wiring_peer_stats before, after;
    ASSERT_OK(wiring_peer_stats_get(w, 0, 1, &before));
    ASSERT_OK(wiring_peer_add(w, 0, 1)); /* the periodic re-announcement */
    ASSERT_OK(wiring_peer_stats_get(w, 0, 1, &after));
    ASSERT_EQ(memcmp(&before, &after, sizeof before), 0);
    wiring_free(w);
}

TEST(wiring_banned_until_readded)
{
    wiring *w = make(WIRING_LEAST_LOADED, 3, 9);
    ASSERT_OK(wiring_report(w, 0, 1, WIRING_FORWARD, 1, 0.1, WIRING_ERROR));
    for (int i = 0; i < 1000; i++) ASSERT(pick(w, WIRING_FORWARD, WIRING_NONE) != 1);
    wiring_stage_stats ss;
    ASSERT_OK(wiring_stage_stats_get(w, 0, &ss));
    ASSERT_EQ(ss.n_peers, 3);
    ASSERT_EQ(ss.n_eligible, 2);
    ASSERT_EQ(ss.errors, 1);
    ASSERT_OK(wiring_peer_add(w, 0, 1)); /* re-registers: un-banned, at the front */
    ASSERT_EQ(pick(w, WIRING_FORWARD, WIRING_NONE), 1);
    wiring_peer_stats ps;
    ASSERT_OK(wiring_peer_stats_get(w, 0, 1, &ps));
    ASSERT_EQ(ps.banned, 0);
    /* Round robin honours bans too. */
    wiring *rr = make(WIRING_ROUND_ROBIN, 3, 9);
    ASSERT_OK(wiring_report(rr, 0, 0, WIRING_FORWARD, 1, 0.1, WIRING_ERROR));
    for (int i = 0; i < 10; i++) ASSERT_EQ(pick(rr, WIRING_FORWARD, WIRING_NONE), 1 + i % 2);
    wiring_free(rr);
    wiring_free(w);
}

TEST(wiring_timeout_not_banned)
{
    wiring *w = make(WIRING_LEAST_LOADED, 2, 4);
    ASSERT_OK(wiring_report(w, 0, 0, WIRING_FORWARD, 1, 1.0, WIRING_OK));
    ASSERT_OK(wiring_report(w, 0, 1, WIRING_FORWARD, 1, 1.0, WIRING_OK));
    ASSERT_OK(wiring_report(w, 0, 0, WIRING_FORWARD, 1, 30.0, WIRING_TIMEOUT));
    wiring_peer_stats ps;
    ASSERT_OK(wiring_peer_stats_get(w, 0, 0, &ps));
    ASSERT_EQ(ps.banned, 0);
    ASSERT_EQ(ps.timeouts, 1);
    ASSERT_LT(ps.throughput, 0.5); /* the wait counts as a (lower bound of its) cost */
    int seen0 = 0;
    for (int i = 0; i < 100; i++) seen0 += pick(w, WIRING_FORWARD, WIRING_NONE) == 0;
    ASSERT(seen0 > 0 && seen0 < 50);
    wiring_free(w);
}

TEST(wiring_exclude_and_enoent)
{
    wiring *w = make(WIRING_LEAST_LOADED, 2, 2);
    for (int i = 0; i < 100; i++) ASSERT_EQ(pick(w, WIRING_FORWARD, 0), 1);
    uint32_t id = 77;
    ASSERT_OK(wiring_report(w, 0, 0, WIRING_FORWARD, 1, 1, WIRING_ERROR));
    ASSERT_EQ(wiring_choose(w, 0, WIRING_FORWARD, 1, 1, &id), CIRRUS_ENOENT); /* 0 banned */
    ASSERT_OK(wiring_report(w, 0, 1, WIRING_FORWARD, 1, 1, WIRING_ERROR));
    ASSERT_EQ(wiring_choose(w, 0, WIRING_FORWARD, 1, WIRING_NONE, &id), CIRRUS_ENOENT);
    ASSERT_EQ(id, 77);
    ASSERT_OK(wiring_peer_remove(w, 0, 0));
    ASSERT_OK(wiring_peer_remove(w, 0, 1));
    ASSERT_EQ(wiring_peer_remove(w, 0, 1), CIRRUS_ENOENT);
    ASSERT_EQ(wiring_choose(w, 0, WIRING_FORWARD, 1, WIRING_NONE, &id), CIRRUS_ENOENT);
    ASSERT_EQ(wiring_report(w, 0, 1, WIRING_FORWARD, 1, 1, WIRING_OK), CIRRUS_ENOENT);
    /* Bad arguments. */
    ASSERT_EQ(wiring_choose(w, 1, WIRING_FORWARD, 1, WIRING_NONE, &id), CIRRUS_EINVAL);
    ASSERT_EQ(wiring_choose(w, 0, WIRING_FORWARD, 0, WIRING_NONE, &id), CIRRUS_EINVAL);
    ASSERT_EQ(wiring_choose(w, 0, WIRING_FORWARD, NAN, WIRING_NONE, &id), CIRRUS_EINVAL);
    ASSERT_EQ(wiring_peer_add(w, 0, WIRING_NONE), CIRRUS_EINVAL);
    ASSERT_EQ(wiring_peer_add(w, -1, 3), CIRRUS_EINVAL);
    ASSERT_OK(wiring_peer_add(w, 0, 3));
    ASSERT_EQ(wiring_report(w, 0, 3, WIRING_FORWARD, 1, -1, WIRING_OK), CIRRUS_EINVAL);
    ASSERT_EQ(wiring_report(w, 0, 3, WIRING_FORWARD, 1, NAN, WIRING_OK), CIRRUS_EINVAL);
    ASSERT(wiring_new(0, WIRING_LEAST_LOADED, 1) == NULL);
    wiring_free(w);
    wiring_free(NULL);
}

TEST(wiring_ema_bias_correction)
{
    wiring *w = make(WIRING_LEAST_LOADED, 1, 1);
    ASSERT_OK(wiring_report(w, 0, 0, WIRING_FORWARD, 10, 1.0, WIRING_OK));
    ASSERT(wiring_throughput(w, 0, 0) == 10.0); /* exactly; an uncorrected EMA says 1 */
    /* Second measurement, 20 samples/s (0.05 s/sample): the corrected EMA of seconds per
     * sample is (0.09 * 0.1 + 0.1 * 0.05) / (1 - 0.81). */
    ASSERT_OK(wiring_report(w, 0, 0, WIRING_FORWARD, 10, 0.5, WIRING_OK));
    double spp = (0.9 * 0.1 * 0.1 + 0.1 * 0.05) / (1 - 0.81);
    ASSERT_NEAR(wiring_throughput(w, 0, 0), 1.0 / spp, 1e-9);
    /* Many measurements forget the start: converges to the new speed. */
    for (int i = 0; i < 300; i++)
        ASSERT_OK(wiring_report(w, 0, 0, WIRING_FORWARD, 10, 2.0, WIRING_OK));
    ASSERT_NEAR(wiring_throughput(w, 0, 0), 5.0, 1e-6);
    wiring_free(w);
}

TEST(wiring_round_robin_cycles)
{
    wiring *w = make(WIRING_ROUND_ROBIN, 4, 1);
    /* Speeds are ignored: a fast measurement does not change the order. */
    ASSERT_OK(wiring_report(w, 0, 3, WIRING_FORWARD, 100, 0.01, WIRING_OK));
    for (int i = 0; i < 40; i++) ASSERT_EQ(pick(w, i % 3 ? WIRING_FORWARD : WIRING_BACKWARD,
                                                WIRING_NONE), i % 4);
    /* Exclusion skips one turn; removal keeps the order of the others. */
    ASSERT_EQ(pick(w, WIRING_FORWARD, 0), 1);
    ASSERT_EQ(pick(w, WIRING_FORWARD, WIRING_NONE), 2);
    ASSERT_OK(wiring_peer_remove(w, 0, 3));
    for (int i = 0; i < 9; i++) ASSERT_EQ(pick(w, WIRING_FORWARD, WIRING_NONE), i % 3);
    wiring_free(w);
}

TEST(wiring_same_seed_same_choices)
{
    wiring *a = make(WIRING_LEAST_LOADED, 5, 99), *b = make(WIRING_LEAST_LOADED, 5, 99);
    for (int i = 0; i < 500; i++) {
        uint32_t x = pick(a, WIRING_FORWARD, WIRING_NONE), y = pick(b, WIRING_FORWARD, WIRING_NONE);
        ASSERT_EQ(x, y);
        if (i % 3 == 0) {
            ASSERT_OK(wiring_report(a, 0, x, WIRING_FORWARD, 1, 1.0, WIRING_OK));
            ASSERT_OK(wiring_report(b, 0, y, WIRING_FORWARD, 1, 1.0, WIRING_OK));
        }
    }
    wiring_free(a);
    wiring_free(b);
}

/* A closed-loop client keeps `window` microbatches in flight on one stage. Each peer is a
 * FIFO server of its own rate; the client measures request to response (queueing included,
 * as in the reference), reports it, and sends the next task. Returns the simulated time at
 * which the last of n tasks completes. */
static double simulate(enum wiring_policy pol, const double *rate, int n_peers, int n_tasks,
                       int window, long *count)
{
    wiring *w = make(pol, n_peers, 1234);
    enum { MAXW = 64 };
    double done_at[MAXW], sent_at[MAXW], free_at[16] = {0};
    uint32_t who[MAXW];
    int busy = 0, sent = 0;
    double now = 0, end = 0;
    ASSERT(window <= MAXW && n_peers <= 16);
    while (sent < n_tasks || busy > 0) {
        while (busy < window && sent < n_tasks) {
            uint32_t id = pick(w, WIRING_FORWARD, WIRING_NONE);
            double start = free_at[id] > now ? free_at[id] : now;
            free_at[id] = start + 1.0 / rate[id];
            done_at[busy] = free_at[id], sent_at[busy] = now, who[busy] = id;
            busy++, sent++;
            if (count) count[id]++;
        }
        int k = 0;
        for (int i = 1; i < busy; i++)
            if (done_at[i] < done_at[k]) k = i;
        now = done_at[k];
        end = now;
        ASSERT_OK(wiring_report(w, 0, who[k], WIRING_FORWARD, 1, now - sent_at[k], WIRING_OK));
        busy--;
        done_at[k] = done_at[busy], sent_at[k] = sent_at[busy], who[k] = who[busy];
    }
    wiring_free(w);
    return end;
}

TEST(wiring_beats_round_robin_with_a_slow_peer)
{
    const double rate[3] = {3, 3, 1}; /* one peer 3x slower */
    const int N = 3000;
    const int windows[3] = {3, 6, 12};
    for (int i = 0; i < 3; i++) {
        long c[3] = {0};
        double t_ll = simulate(WIRING_LEAST_LOADED, rate, 3, N, windows[i], c);
        double t_rr = simulate(WIRING_ROUND_ROBIN, rate, 3, N, windows[i], NULL);
        fprintf(stderr,
                "  window %2d: least-loaded %.1f s, round-robin %.1f s, speed-up %.2fx"
                " (shares %.3f %.3f %.3f; ideal %.2f s)\n",
                windows[i], t_ll, t_rr, t_rr / t_ll, (double)c[0] / N, (double)c[1] / N,
                (double)c[2] / N, N / 7.0);
        ASSERT(t_rr / t_ll >= 1.3);
    }
}
