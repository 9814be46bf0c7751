/* Tests of trainer/swarm/rebalance: it moves toward the bottleneck only for a clear gain,
 * keeps every stage's minimum, moves a peer at most once a period, scales throughput by
 * stage work, and -- simulated over 20 periods from lopsided starts, with noisy estimates --
 * converges to the best assignment without ever reversing a move. */
#include <stdint.h>
#include <string.h>

#include "../../common/cerr.h"
#include "../../common/rng.h"
#include "../../trainer/swarm/policy/rebalance.h"
#include "test.h"

static rebalance_state *make(int n_stages, double min_gain, int min_peers, int hold)
{
    rebalance_config c = rebalance_config_default();
    if (min_gain >= 0) c.min_gain = min_gain;
    if (min_peers >= 0) c.min_peers = min_peers;
    if (hold >= 0) c.hold_periods = hold;
    rebalance_state *s = rebalance_new(n_stages, &c);
    ASSERT(s != NULL);
    return s;
}

static void put(rebalance_state *s, uint32_t id, int stage, double tput)
{
    ASSERT_OK(rebalance_peer_set(s, id, stage, tput));
}

TEST(rebalance_moves_to_bottleneck)
{
    rebalance_state *s = make(2, -1, -1, -1);
    for (uint32_t i = 0; i < 3; i++) put(s, i, 0, 1.0);
    put(s, 3, 1, 1.0);
    rebalance_move m;
    ASSERT_EQ(rebalance_decide(s, &m), 1);
    ASSERT_EQ(m.from_stage, 0);
    ASSERT_EQ(m.to_stage, 1);
    ASSERT(m.peer_id <= 2);
    ASSERT_NEAR(m.min_before, 1.0, 1e-12);
    ASSERT_NEAR(m.min_after, 2.0, 1e-12);
    ASSERT_OK(rebalance_apply(s, &m));
    int n;
    double t;
    ASSERT_OK(rebalance_stage_info(s, 1, &n, &t));
    ASSERT_EQ(n, 2);
    ASSERT_NEAR(t, 2.0, 1e-12);
    rebalance_next_period(s);
    ASSERT_EQ(rebalance_decide(s, &m), 0); /* 2-2: balanced */
    rebalance_free(s);
}

TEST(rebalance_balanced_no_move)
{
    rebalance_state *s = make(3, -1, -1, -1);
    for (uint32_t i = 0; i < 6; i++) put(s, i, (int)(i % 3), 1.0 + 0.01 * i);
    rebalance_move m;
    ASSERT_EQ(rebalance_decide(s, &m), 0);
    /* Unmeasured peers count as their stage's average: still balanced. */
    put(s, 0, 0, 0);
    ASSERT_EQ(rebalance_decide(s, &m), 0);
    rebalance_free(s);
}

TEST(rebalance_small_gain_no_move)
{
    /* 3.1 vs 2.0 samples/s: the best move (either way) reaches 2.1, +5%. */
    rebalance_state *s = make(2, -1, -1, -1);
    put(s, 0, 0, 1), put(s, 1, 0, 1), put(s, 2, 0, 1), put(s, 3, 0, 0.1);
    put(s, 4, 1, 1), put(s, 5, 1, 1);
    rebalance_move m;
    ASSERT_EQ(rebalance_decide(s, &m), 0);
    rebalance_free(s);
    /* With a 4% margin it moves -- the slow peer, which leaves the donor best provided. */
    s = make(2, 0.04, -1, -1);
    put(s, 0, 0, 1), put(s, 1, 0, 1), put(s, 2, 0, 1), put(s, 3, 0, 0.1);
    put(s, 4, 1, 1), put(s, 5, 1, 1);
    ASSERT_EQ(rebalance_decide(s, &m), 1);
    ASSERT_EQ(m.peer_id, 3);
    ASSERT_NEAR(m.min_after, 2.1, 1e-9);
    rebalance_free(s);
}

TEST(rebalance_peer_moves_once_per_period)
{
    /* hold 0: only the once-a-period rule for peers, no stage hysteresis. */
    rebalance_state *s = make(3, -1, -1, 0);
    put(s, 1, 2, 5), put(s, 3, 2, 5); /* X = 1, S = 3 on stage 2 */
    put(s, 2, 0, 1);                  /* P = 2 on stage 0, the bottleneck */
    put(s, 4, 1, 10);                 /* R = 4 alone on stage 1 */
    rebalance_move m;
    ASSERT_EQ(rebalance_decide(s, &m), 1);
    ASSERT_EQ(m.peer_id, 1); /* X and S tie; the lower id */
    ASSERT_EQ(m.to_stage, 0);
    ASSERT_OK(rebalance_apply(s, &m));
    /* Same period, new estimates: stage 1 now starves; X and P (both 5 on stage 0) would
     * tie, and X has the lower id, but X already moved this period. */
    put(s, 2, 0, 5), put(s, 4, 1, 1);
    ASSERT_EQ(rebalance_decide(s, &m), 1);
    ASSERT_EQ(m.peer_id, 2);
    rebalance_next_period(s);
    ASSERT_EQ(rebalance_decide(s, &m), 1);
    ASSERT_EQ(m.peer_id, 1);
    ASSERT_EQ(m.from_stage, 0);
    ASSERT_EQ(m.to_stage, 1);
    rebalance_free(s);
}

TEST(rebalance_min_peers_floor)
{
    /* {5, 5} vs {0.5, 0.5}: moving a 5 would help hugely, but stage 0 must keep 2. */
    rebalance_state *s = make(2, -1, 2, -1);
    put(s, 0, 0, 5), put(s, 1, 0, 5), put(s, 2, 1, 0.5), put(s, 3, 1, 0.5);
    rebalance_move m;
    ASSERT_EQ(rebalance_decide(s, &m), 0);
    rebalance_free(s);
    s = make(2, -1, 1, -1);
    put(s, 0, 0, 5), put(s, 1, 0, 5), put(s, 2, 1, 0.5), put(s, 3, 1, 0.5);
    ASSERT_EQ(rebalance_decide(s, &m), 1);
    ASSERT_EQ(m.from_stage, 0);
    rebalance_free(s);
    /* A stage that lost its last peer is filled first, from a stage that can spare one. */
    s = make(3, -1, 1, -1);
    put(s, 0, 0, 1), put(s, 1, 1, 1), put(s, 2, 1, 1);
    ASSERT_EQ(rebalance_decide(s, &m), 1);
    ASSERT_EQ(m.from_stage, 1);
    ASSERT_EQ(m.to_stage, 2);
    rebalance_free(s);
}

/* max_peers (the operator's peers.max): no stage is given a peer when it has that many,
 * even while it is still the bottleneck; without the bound the same swarm piles peers onto
 * the slow stage. */
static int settle(int max_peers)
{
    rebalance_config c = rebalance_config_default();
    c.hold_periods = 0;
    c.max_peers = max_peers;
    rebalance_state *s = rebalance_new(2, &c);
    ASSERT(s != NULL);
    for (uint32_t i = 0; i < 6; i++) put(s, i, 0, 1.0);
    put(s, 6, 1, 0.2); /* stage 1: one slow peer */
    rebalance_move m;
    for (int period = 0; period < 20; period++) {
        while (rebalance_decide(s, &m) == 1) ASSERT_OK(rebalance_apply(s, &m));
        rebalance_next_period(s);
    }
    int n;
    double t;
    ASSERT_OK(rebalance_stage_info(s, 1, &n, &t));
    rebalance_free(s);
    return n;
}

TEST(rebalance_max_peers_bound)
{
    ASSERT_EQ(settle(2), 2);
    ASSERT_EQ(settle(3), 3);
    ASSERT(settle(0) > 3);
    rebalance_config c = rebalance_config_default();
    c.max_peers = -1;
    ASSERT(rebalance_new(2, &c) == NULL);
}

TEST(rebalance_scales_by_stage_work)
{
    /* Stage 1 does twice the work per sample: a 2 samples/s peer of stage 0 is worth 1
     * there. */
    rebalance_state *s = make(2, -1, -1, -1);
    ASSERT_OK(rebalance_stage_work(s, 1, 2.0));
    put(s, 0, 0, 2), put(s, 1, 0, 2), put(s, 2, 0, 2), put(s, 3, 1, 1);
    rebalance_move m;
    ASSERT_EQ(rebalance_decide(s, &m), 1);
    ASSERT_NEAR(m.min_after, 2.0, 1e-12); /* 4 vs 1 + 1 */
    ASSERT_OK(rebalance_apply(s, &m));
    double t;
    ASSERT_OK(rebalance_stage_info(s, 1, NULL, &t));
    ASSERT_NEAR(t, 2.0, 1e-12);
    rebalance_next_period(s);
    ASSERT_EQ(rebalance_decide(s, &m), 0); /* 2 vs 3 would be no better */
    rebalance_free(s);
}

TEST(rebalance_reverse_needs_more)
{
    rebalance_state *s = make(2, -1, -1, 0);
    put(s, 1, 0, 1), put(s, 2, 0, 1), put(s, 3, 0, 1), put(s, 4, 1, 1);
    rebalance_move m;
    ASSERT_EQ(rebalance_decide(s, &m), 1);
    uint32_t x = m.peer_id;
    ASSERT_OK(rebalance_apply(s, &m));
    rebalance_next_period(s);
    /* Estimates drift: stage 0 now {1}, stage 1 {x: 1, 4: 1.15}. Sending x back would give
     * +15%: enough for a first move, not for a reversal (25%). */
    uint32_t other = x == 1 ? 2 : 1;
    ASSERT_OK(rebalance_peer_remove(s, x == 3 ? 2 : 3));
    put(s, other, 0, 1), put(s, 4, 1, 1.15);
    ASSERT_EQ(rebalance_decide(s, &m), 0);
    put(s, 4, 1, 1.3); /* +30%: a real change, x may go back */
    ASSERT_EQ(rebalance_decide(s, &m), 1);
    ASSERT_EQ(m.peer_id, x);
    rebalance_free(s);
}

TEST(rebalance_rejects_bad_input)
{
    rebalance_state *s = make(2, -1, -1, -1);
    rebalance_move m = {.peer_id = 9, .from_stage = 0, .to_stage = 1};
    ASSERT_EQ(rebalance_apply(s, &m), CIRRUS_ENOENT);
    put(s, 9, 1, 1);
    ASSERT_EQ(rebalance_apply(s, &m), CIRRUS_EINVAL); /* stale: it is on stage 1 */
    ASSERT_EQ(rebalance_peer_set(s, 1, 2, 1), CIRRUS_EINVAL);
    ASSERT_EQ(rebalance_peer_set(s, 1, 0, NAN), CIRRUS_EINVAL);
    ASSERT_EQ(rebalance_peer_remove(s, 77), CIRRUS_ENOENT);
    ASSERT_EQ(rebalance_stage_work(s, 0, 0), CIRRUS_EINVAL);
    ASSERT(rebalance_new(0, NULL) == NULL);
    rebalance_config c = rebalance_config_default();
    c.min_gain = -1;
    ASSERT(rebalance_new(2, &c) == NULL);
    ASSERT_EQ(rebalance_decide(s, &m), 0); /* one empty stage, one lone peer: nothing */
    rebalance_free(s);
    rebalance_free(NULL);
}

/* ---- simulation: lopsided starts, noisy estimates, one decision per period ---- */

enum { MAXP = 16, MAXS = 4, PERIODS = 20 };

/* The best achievable minimum stage throughput, by trying every assignment. */
static double best_min(const double *tput, int n, int n_stages, int min_peers)
{
    int assign[MAXP] = {0};
    double best = 0;
    for (;;) {
        double t[MAXS] = {0};
        int cnt[MAXS] = {0};
        for (int i = 0; i < n; i++) t[assign[i]] += tput[i], cnt[assign[i]]++;
        double mn = INFINITY;
        int ok = 1;
        for (int k = 0; k < n_stages; k++) mn = fmin(mn, t[k]), ok &= cnt[k] >= min_peers;
        if (ok && mn > best) best = mn;
        int i = 0;
        while (i < n && ++assign[i] == n_stages) assign[i++] = 0;
        if (i == n) return best;
    }
}

/* Runs PERIODS periods; returns the number of moves, *last the period of the last one. */
static int simulate(int n_stages, int n, const double *tput, const int *start, double noise,
                    uint64_t seed, int *last)
{
    rebalance_state *s = make(n_stages, -1, -1, -1);
    rng_state r;
    rng_seed(&r, seed);
    int stage[MAXP], left[MAXP][MAXS] = {{0}}, moved_pair[MAXS][MAXS] = {{0}};
    memcpy(stage, start, (size_t)n * sizeof *stage);
    int moves = 0, last_move_period = -1;
    for (int p = 0; p < PERIODS; p++) {
        for (int i = 0; i < n; i++)
            put(s, (uint32_t)i, stage[i], tput[i] * (1 + noise * (2 * rng_uniform(&r) - 1)));
        rebalance_move m;
        int rc = rebalance_decide(s, &m);
        ASSERT(rc == 0 || rc == 1);
        if (rc == 1) {
            int id = (int)m.peer_id;
            ASSERT_EQ(m.from_stage, stage[id]);
            /* No thrash: no peer returns where it came from, no flow between two stages
             * ever reverses. */
            ASSERT(!left[id][m.to_stage]);
            ASSERT(!moved_pair[m.to_stage][m.from_stage]);
            left[id][m.from_stage] = 1;
            moved_pair[m.from_stage][m.to_stage] = 1;
            ASSERT_OK(rebalance_apply(s, &m));
            stage[id] = m.to_stage;
            moves++, last_move_period = p;
        }
        rebalance_next_period(s);
    }
    double t[MAXS] = {0}, mn = INFINITY;
    for (int i = 0; i < n; i++) t[stage[i]] += tput[i];
    for (int k = 0; k < n_stages; k++) mn = fmin(mn, t[k]);
    ASSERT_NEAR(mn, best_min(tput, n, n_stages, 1), 1e-9); /* the best assignment */
    ASSERT(last_move_period < PERIODS - 5);                  /* settled, not wandering */
    rebalance_free(s);
    *last = last_move_period;
    return moves;
}

typedef struct scenario {
    const char *name;
    int n_stages, n;
    const double *tput;
    const int *start;
} scenario;

TEST(rebalance_converges_without_thrash)
{
    const double eq[8] = {1, 1, 1, 1, 1, 1, 1, 1};
    const int s40[4] = {0, 0, 0, 0};
    const int s8000[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    const int s62[8] = {0, 0, 0, 0, 0, 0, 1, 2};
    /* Unequal peers: 4 + 2 + 2 + 4 x 1 = 12 samples/s over 3 stages, best minimum 4. */
    const double het[7] = {4, 2, 2, 1, 1, 1, 1};
    const int h0[7] = {0, 0, 0, 0, 0, 0, 0};
    const int h1[7] = {1, 1, 1, 1, 1, 0, 2};
    const scenario sc[5] = {{"4-0 equal", 2, 4, eq, s40},
                            {"8-0-0-0 equal", 4, 8, eq, s8000},
                            {"6-1-1 equal", 3, 8, eq, s62},
                            {"7-0-0 unequal", 3, 7, het, h0},
                            {"1-5-1 unequal", 3, 7, het, h1}};
    /* Estimates noisy by +-5% each period: half the 10% margin. */
    for (int k = 0; k < 5; k++) {
        int min_moves = 1 << 30, max_moves = 0, max_last = -1;
        for (uint64_t seed = 1; seed <= 20; seed++) {
            int last, moves = simulate(sc[k].n_stages, sc[k].n, sc[k].tput, sc[k].start, 0.05,
                                       seed, &last);
            min_moves = moves < min_moves ? moves : min_moves;
            max_moves = moves > max_moves ? moves : max_moves;
            max_last = last > max_last ? last : max_last;
        }
        fprintf(stderr, "  %-14s 20 runs: best assignment reached, %d-%d moves, none reversed,"
                " last move by period %d of %d\n", sc[k].name, min_moves, max_moves, max_last,
                PERIODS);
    }
}
