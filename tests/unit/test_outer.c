/* The outer optimizer and the outer sync's messages (region side and WAN). */
#include <string.h>

#include "../../trainer/gateway/fragments.h"
#include "../../trainer/gateway/outer_msg.h"
#include "../../trainer/gateway/sync_params.h"
#include "../../trainer/gateway/wan_msg.h"
#include "../../trainer/optim/outer.h"
#include "test.h"

/* Nesterov as torch.optim.SGD(nesterov=True), step by step in double. */
TEST(outer_step_is_nesterov_momentum)
{
    const outer_options o = {0.7f, 0.9f};
    float theta[3] = {1.0f, -2.0f, 0.5f}, mom[3] = {0};
    double t[3] = {1.0, -2.0, 0.5}, m[3] = {0};
    const float deltas[2][3] = {{0.1f, -0.2f, 0.0f}, {0.3f, 0.1f, -0.05f}};
    for (int round = 0; round < 2; round++) {
        outer_step(&o, theta, mom, deltas[round], 3);
        for (int i = 0; i < 3; i++) {
            m[i] = 0.9 * m[i] + deltas[round][i];
            t[i] -= 0.7 * (deltas[round][i] + 0.9 * m[i]);
            ASSERT_NEAR(theta[i], t[i], 1e-6);
            ASSERT_NEAR(mom[i], m[i], 1e-6);
        }
    }
}

/* lr 1, momentum 0 takes the region's parameters back (plain averaging of one). */
TEST(outer_step_lr1_without_momentum_is_averaging)
{
    const outer_options o = {1.0f, 0.0f};
    float theta[2] = {1.0f, 3.0f};
    const float region[2] = {1.5f, 2.0f};
    float delta[2] = {theta[0] - region[0], theta[1] - region[1]};
    outer_step(&o, theta, NULL, delta, 2);
    ASSERT(theta[0] == 1.5f && theta[1] == 2.0f);
}

TEST(outer_msg_push_pull_round_trip_and_bounds)
{
    float x[5] = {1, 2, 3, 4, 5};
    wire_writer w;
    wire_writer_init(&w, 1 << 20);
    const outer_push q = {.fragment = 1, .round = 3, .inner_step = 30, .at = 35, .tokens = 640,
                          .n_params = 10, .offset = 5, .count = 5};
    outer_msg_put_push(&w, &q, x);
    wire_reader r;
    outer_push g;
    wire_reader_init(&r, w.data, w.len);
    ASSERT_EQ(outer_msg_peek_fragment(&r), 1);
    ASSERT_EQ(r.pos, 0); /* peeking consumes nothing */
    ASSERT_OK(outer_msg_get_push(&r, 10, &g));
    ASSERT_EQ(g.fragment, 1);
    ASSERT_EQ(g.round, 3);
    ASSERT_EQ(g.inner_step, 30);
    ASSERT_EQ(g.at, 35);
    ASSERT_EQ(g.tokens, 640);
    ASSERT(memcmp(g.floats, x, sizeof x) == 0);
    wire_reader_init(&r, w.data, w.len);
    ASSERT(outer_msg_get_push(&r, 9, &g) != 0); /* another model */
    for (size_t cut = 0; cut < w.len; cut++) { /* every truncation refused */
        wire_reader_init(&r, w.data, cut);
        ASSERT(outer_msg_get_push(&r, 10, &g) != 0);
    }
    wire_writer_free(&w);
    /* a slice past the end */
    wire_writer_init(&w, 1 << 20);
    const outer_pull bad = {0, 1, 8, 5};
    outer_msg_put_pull(&w, &bad);
    outer_pull p;
    wire_reader_init(&r, w.data, w.len);
    ASSERT(outer_msg_get_pull(&r, 10, &p) != 0);
    wire_reader_init(&r, w.data, w.len);
    ASSERT_OK(outer_msg_get_pull(&r, 13, &p));
    wire_writer_free(&w);
    /* PULL_OK, ready and not */
    wire_writer_init(&w, 1 << 20);
    const outer_schedule sched = {.at = 70, .stride = 2, .next_stride = 4};
    const outer_pull_ok a = {.done = 2, .digest = 0xabc, .wan_bytes = 99, .ready = 1,
                             .region = 2, .regions = 3, .fragments = 4, .sched = sched};
    outer_msg_put_pull_ok(&w, &a, x, 5);
    outer_pull_ok b;
    wire_reader_init(&r, w.data, w.len);
    ASSERT_OK(outer_msg_get_pull_ok(&r, 5, &b));
    ASSERT(b.ready && b.done == 2 && b.digest == 0xabc && b.wan_bytes == 99);
    ASSERT(b.region == 2 && b.regions == 3 && b.fragments == 4);
    ASSERT(b.sched.at == 70 && b.sched.stride == 2 && b.sched.next_stride == 4);
    ASSERT(memcmp(b.floats, x, sizeof x) == 0);
    wire_reader_init(&r, w.data, w.len);
    ASSERT(outer_msg_get_pull_ok(&r, 4, &b) != 0);
    wire_writer_free(&w);
    /* a region index outside the region count, no fragment or too many, a stride that is
     * no power of two, none or too wide: refused (the first case as it is: accepted) */
    const outer_schedule start = OUTER_SCHEDULE_START;
    const outer_pull_ok fine = {.done = 2, .region = 0, .regions = 3, .fragments = 1,
                                .sched = start};
    wire_writer_init(&w, 64);
    outer_msg_put_pull_ok(&w, &fine, NULL, 0);
    wire_reader_init(&r, w.data, w.len);
    ASSERT_OK(outer_msg_get_pull_ok(&r, 0, &b));
    wire_writer_free(&w);
    const outer_pull_ok outside[] = {
        {.done = 2, .region = 3, .regions = 3, .fragments = 1, .sched = start},
        {.done = 2, .region = 0, .regions = 3, .fragments = 0, .sched = start},
        {.done = 2, .region = 0, .regions = 3, .fragments = OUTER_MAX_FRAGMENTS + 1,
         .sched = start},
        {.done = 2, .region = 0, .regions = 3, .fragments = 1, .sched = {0, 3, 1}},
        {.done = 2, .region = 0, .regions = 3, .fragments = 1, .sched = {0, 1, 0}},
        {.done = 2, .region = 0, .regions = 3, .fragments = 1,
         .sched = {0, 1, OUTER_MAX_STRIDE * 2}}};
    for (size_t i = 0; i < sizeof outside / sizeof outside[0]; i++) {
        wire_writer_init(&w, 64);
        outer_msg_put_pull_ok(&w, &outside[i], NULL, 0);
        wire_reader_init(&r, w.data, w.len);
        ASSERT(outer_msg_get_pull_ok(&r, 0, &b) != 0);
        wire_writer_free(&w);
    }
    /* too short to name a fragment */
    const uint8_t one = 0;
    wire_reader_init(&r, &one, 1);
    ASSERT_EQ(outer_msg_peek_fragment(&r), -1);
}

TEST(fragments_cover_the_parameters_once_and_push_at_distinct_steps)
{
    /* The ranges tile [0, m) in order, near-equal, for awkward m and every P. */
    const uint64_t ms[] = {1, 7, 8, 1000003, (uint64_t)1 << 40};
    for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++)
        for (int p = 1; p <= OUTER_MAX_FRAGMENTS; p++) {
            if ((uint64_t)p > ms[i]) continue;
            uint64_t at = 0;
            for (int f = 0; f < p; f++) {
                uint64_t lo, hi;
                outer_fragment_range(ms[i], p, f, &lo, &hi);
                ASSERT_EQ(lo, at);
                ASSERT(hi > lo && hi - lo <= ms[i] / (uint64_t)p + 1);
                at = hi;
            }
            ASSERT_EQ(at, ms[i]);
        }
    /* Leads: the last fragment pushes at multiples of H, the others before it, all apart. */
    ASSERT_EQ(outer_fragment_lead(50, 1, 0), 0);
    ASSERT_EQ(outer_fragment_lead(50, 2, 0), 25);
    ASSERT_EQ(outer_fragment_lead(50, 2, 1), 0);
    ASSERT_EQ(outer_fragment_lead(10, 4, 0), 7);
    ASSERT_EQ(outer_fragment_lead(10, 4, 1), 5);
    ASSERT_EQ(outer_fragment_lead(10, 4, 2), 2);
    ASSERT_EQ(outer_fragment_lead(4, 4, 0), 3);
    for (int h = OUTER_MAX_FRAGMENTS; h < 40; h++)
        for (int p = 1; p <= OUTER_MAX_FRAGMENTS; p++)
            for (int f = 0; f + 1 < p; f++)
                ASSERT(outer_fragment_lead(h, p, f) > outer_fragment_lead(h, p, f + 1) &&
                       outer_fragment_lead(h, p, f) < (uint64_t)h);
    /* One fragment: its digest is the state's own; several: a digest of them, in order. */
    const uint64_t d[2] = {5, 9}, e[2] = {9, 5};
    ASSERT_EQ(outer_fragments_digest(d, 1), 5);
    ASSERT(outer_fragments_digest(d, 2) != outer_fragments_digest(e, 2));
}

TEST(sync_params_slice_selects_the_packed_range)
{
    /* Spans {0,4} {10,3} {20,5} (12 floats): [2, 9) is 2..3, 10..12, 20..21. */
    gpt_span spans[3] = {{0, 4}, {10, 3}, {20, 5}};
    const sync_params all = {spans, 3, 12};
    sync_params s;
    cirrus_error err = {0};
    ASSERT_OK(sync_params_slice(&all, 2, 9, &s, &err));
    ASSERT_EQ(s.count, 7);
    ASSERT_EQ(s.n_spans, 3);
    ASSERT(s.spans[0].offset == 2 && s.spans[0].count == 2);
    ASSERT(s.spans[1].offset == 10 && s.spans[1].count == 3);
    ASSERT(s.spans[2].offset == 20 && s.spans[2].count == 2);
    float model[25], packed[12], back[25];
    for (int i = 0; i < 25; i++) model[i] = (float)i;
    sync_params_pack(&s, model, packed);
    ASSERT(packed[0] == 2 && packed[2] == 10 && packed[5] == 20 && packed[6] == 21);
    memset(back, 0, sizeof back);
    sync_params_unpack(&s, packed, back);
    ASSERT(back[3] == 3 && back[12] == 12 && back[21] == 21 && back[4] == 0 && back[22] == 0);
    sync_params_free(&s);
    ASSERT(sync_params_slice(&all, 5, 5, &s, &err) == CIRRUS_EINVAL); /* empty */
    ASSERT(sync_params_slice(&all, 0, 13, &s, &err) == CIRRUS_EINVAL); /* past the end */
}

TEST(wan_msg_join_part_done_round_trip_and_refusals)
{
    wire_writer w;
    wire_reader r;
    wire_writer_init(&w, 1 << 20);
    wan_join j = {.index = 1, .n_regions = 2, .n_params = 1000, .round = 4, .digest = 7,
                  .fragment = 2, .n_fragments = 3};
    strcpy(j.region, "eu-west");
    wan_msg_put_join(&w, &j);
    wan_join g;
    wire_reader_init(&r, w.data, w.len);
    ASSERT_OK(wan_msg_get_join(&r, &g));
    ASSERT(strcmp(g.region, "eu-west") == 0 && g.index == 1 && g.round == 4 && g.digest == 7);
    ASSERT(g.fragment == 2 && g.n_fragments == 3);
    wire_writer_free(&w);
    /* a fragment outside the fragment count, or a count outside 1..OUTER_MAX_FRAGMENTS */
    const uint32_t frags[][2] = {{3, 3}, {0, 0}, {0, OUTER_MAX_FRAGMENTS + 1}};
    for (size_t i = 0; i < sizeof frags / sizeof frags[0]; i++) {
        wan_join b = j;
        b.fragment = frags[i][0];
        b.n_fragments = frags[i][1];
        wire_writer_init(&w, 1 << 10);
        wan_msg_put_join(&w, &b);
        wire_reader_init(&r, w.data, w.len);
        ASSERT(wan_msg_get_join(&r, &g) != 0);
        wire_writer_free(&w);
    }
    j.fragment = 0;
    j.n_fragments = 1;
    j.index = 2; /* index past the region count */
    wire_writer_init(&w, 1 << 20);
    wan_msg_put_join(&w, &j);
    wire_reader_init(&r, w.data, w.len);
    ASSERT(wan_msg_get_join(&r, &g) != 0);
    wire_writer_free(&w);
    strcpy(j.region, "bad name");
    j.index = 0;
    wire_writer_init(&w, 1 << 20);
    wan_msg_put_join(&w, &j);
    wire_reader_init(&r, w.data, w.len);
    ASSERT(wan_msg_get_join(&r, &g) != 0);
    wire_writer_free(&w);

    uint8_t bytes[100];
    memset(bytes, 7, sizeof bytes);
    const wan_part p = {.round = 2, .total = 150, .offset = 50, .bytes = bytes, .len = 100};
    wire_writer_init(&w, 1 << 20);
    wan_msg_put_part(&w, &p);
    wan_part gp;
    wire_reader_init(&r, w.data, w.len);
    ASSERT_OK(wan_msg_get_part(&r, 1000, &gp));
    ASSERT(gp.len == 100 && gp.offset == 50 && gp.bytes[99] == 7);
    wire_reader_init(&r, w.data, w.len);
    ASSERT(wan_msg_get_part(&r, 149, &gp) != 0); /* total over the cap */
    wire_writer_free(&w);
    const wan_part past = {.round = 2, .total = 120, .offset = 50, .bytes = bytes, .len = 100};
    wire_writer_init(&w, 1 << 20);
    wan_msg_put_part(&w, &past);
    wire_reader_init(&r, w.data, w.len);
    ASSERT(wan_msg_get_part(&r, 1000, &gp) != 0); /* runs past its total */
    wire_writer_free(&w);

    wan_done d = {.round = 3, .tokens = 10, .prev_digest = 5, .total = 150, .hash = 9,
                  .at = 300, .wish = 8};
    wire_writer_init(&w, 1 << 20);
    wan_msg_put_done(&w, &d);
    wan_done gd;
    wire_reader_init(&r, w.data, w.len);
    ASSERT_OK(wan_msg_get_done(&r, 1000, &gd));
    ASSERT(gd.round == 3 && gd.hash == 9 && gd.total == 150 && gd.at == 300 && gd.wish == 8);
    wire_reader_init(&r, w.data, w.len - 1);
    ASSERT(wan_msg_get_done(&r, 1000, &gd) != 0);
    wire_writer_free(&w);
    d.wish = 6; /* no stride a gateway may wish for */
    wire_writer_init(&w, 64);
    wan_msg_put_done(&w, &d);
    wire_reader_init(&r, w.data, w.len);
    ASSERT(wan_msg_get_done(&r, 1000, &gd) != 0);
    wire_writer_free(&w);
}

/* HAVE (where a cut message stands) and its answer: fields kept, a total over the cap and
 * an answer claiming more bytes than the message has refused. */
TEST(wan_msg_have_round_trip_and_refusals)
{
    wire_writer w;
    wire_reader r;
    uint64_t round, total, got, hash;
    wire_writer_init(&w, 64);
    wan_msg_put_have(&w, 7, 3000);
    wire_reader_init(&r, w.data, w.len);
    ASSERT_OK(wan_msg_get_have(&r, 3000, &round, &total));
    ASSERT(round == 7 && total == 3000);
    wire_reader_init(&r, w.data, w.len);
    ASSERT(wan_msg_get_have(&r, 2999, &round, &total) != 0); /* over the largest message */
    wire_reader_init(&r, w.data, w.len - 1);
    ASSERT(wan_msg_get_have(&r, 3000, &round, &total) != 0); /* short */
    wire_writer_free(&w);
    wire_writer_init(&w, 64);
    wan_msg_put_have_ok(&w, 1024, 0xabcdef);
    wire_reader_init(&r, w.data, w.len);
    ASSERT_OK(wan_msg_get_have_ok(&r, 3000, &got, &hash));
    ASSERT(got == 1024 && hash == 0xabcdef);
    wire_reader_init(&r, w.data, w.len);
    ASSERT(wan_msg_get_have_ok(&r, 1023, &got, &hash) != 0); /* more than the message */
    wire_writer_free(&w);
}

#include "../../trainer/gateway/adapt.h"

/* The codec follows the link: a fast link sends fp32; 20 -> 2 Mbit/s compresses harder;
 * back to 20 backs off again; a boundary rate does not flip it. */
TEST(adapt_follows_the_link)
{
    char why[256];
    const uint64_t n = 1000000;           /* 4 MB in fp32 */
    const double window = 10.0;           /* s between syncs */
    int r = adapt_choose(0, n, 1e9 / 8, window, why, sizeof why);
    ASSERT_EQ(r, 0);                      /* 1 Gbit/s: fp32 fits */
    r = adapt_choose(r, n, 20e6 / 8, window, why, sizeof why);
    ASSERT(adapt_bytes(r, n) / (20e6 / 8) <= ADAPT_BUDGET * window);
    const int at20 = r;
    r = adapt_choose(r, n, 2e6 / 8, window, why, sizeof why);
    ASSERT(r > at20);                     /* compressed harder */
    ASSERT(adapt_bytes(r, n) / (2e6 / 8) <= ADAPT_BUDGET * window);
    ASSERT(strstr(why, "compressing harder") != NULL);
    r = adapt_choose(r, n, 20e6 / 8, window, why, sizeof why);
    ASSERT(r <= at20 + 1 && r < ADAPT_RUNGS - 1); /* backed off */
    /* Hysteresis: a rate where the denser rung just fits the budget but not the back-off
     * budget keeps the current one. */
    const int cur = 3;
    const double rate = adapt_bytes(cur - 1, n) / (0.7 * window);
    ASSERT_EQ(adapt_choose(cur, n, rate, window, why, sizeof why), cur);
    /* Nothing fits: the sparsest rung, and the reason says it does not fit either (the
     * stride, adapt_stride, spaces the syncs out). */
    r = adapt_choose(0, n, 100, window, why, sizeof why);
    ASSERT_EQ(r, ADAPT_RUNGS - 1);
    ASSERT(strstr(why, "even it needs") != NULL);
    /* Not measured yet: stay. */
    ASSERT_EQ(adapt_choose(2, n, 0, window, why, sizeof why), 2);
}

/* One reading into an estimate that stood at `Bps` (no run of faster readings yet). */
static double rate_after(double Bps, uint64_t bytes, double seconds)
{
    adapt_rate est = {.Bps = Bps};
    adapt_rate_update(&est, bytes, seconds);
    return est.Bps;
}

/* The rate estimate: slower at once, faster half way from a large message, hardly at all
 * from a message a link's queue swallows whole (a 3 KB top-k message in 1 ms on a 1 Mbit/s
 * link once sent the next sync as fp16, 75 times the bytes). */
TEST(adapt_rate_trusts_large_messages)
{
    const double link = 1e6 / 8; /* 1 Mbit/s */
    ASSERT_NEAR(rate_after(0, 500000, 4.0), link, 1e-6);        /* first reading */
    ASSERT_NEAR(rate_after(2 * link, 500000, 4.0), link, 1e-6); /* slower: at once */
    /* Faster from a large message: half way. */
    ASSERT_NEAR(rate_after(link, 1 << 20, (1 << 20) / (3 * link)), 2 * link, 1e-6);
    /* A quarter of the trusted size: an eighth of the way. */
    ASSERT_NEAR(rate_after(link, (uint64_t)(ADAPT_RATE_TRUST_BYTES / 4),
                           ADAPT_RATE_TRUST_BYTES / 4 / (9 * link)),
                2 * link, 1e-6);
    /* A 3 KB message in 1 ms reads 24 times the link: one moves the estimate by an eighth
     * (it used to move it 12-fold)... */
    adapt_rate est = {.Bps = link};
    adapt_rate_update(&est, 3000, 0.001);
    ASSERT(est.Bps > link && est.Bps < 1.15 * link);
    /* ...a run of them raises it round by round (a recovered link is found again), but
     * slowly: ten leave it under 3 times the link (too short to time, they make no run). */
    for (int i = 0; i < 9; i++) adapt_rate_update(&est, 3000, 0.001);
    ASSERT(est.Bps > 1.5 * link && est.Bps < 3 * link);
    /* Nothing measured: unchanged. */
    ASSERT_EQ(rate_after(link, 0, 1.0), link);
    ASSERT_EQ(rate_after(link, 1000, 0), link);
}

/* A sparse codec's small messages on a link that recovered from 2 to 20 Mbit/s (90 KB in
 * 36 ms each: a wide-area test's figures): the third in a row lifts the estimate to the
 * least of the three; a slower reading between them starts the run again. Each alone moves
 * it by a sixth (it took five rounds, and on a loaded machine more than eight, to back off). */
TEST(adapt_rate_run_of_timed_readings)
{
    const double slow = 2e6 / 8, fast = 20e6 / 8;
    adapt_rate est = {.Bps = slow};
    adapt_rate_update(&est, 90000, 90000 / fast);
    adapt_rate_update(&est, 90000, 90000 / (0.9 * fast));
    ASSERT(est.Bps < 0.5 * fast);
    adapt_rate_update(&est, 90000, 90000 / fast);
    ASSERT_NEAR(est.Bps, 0.9 * fast, 1e-6);
    /* A slower reading breaks the run: two fast ones after it are not enough... */
    adapt_rate_update(&est, 90000, 90000 / slow);
    ASSERT_NEAR(est.Bps, slow, 1e-6);
    adapt_rate_update(&est, 90000, 90000 / fast);
    adapt_rate_update(&est, 90000, 90000 / fast);
    ASSERT(est.Bps < 0.5 * fast);
    /* ...a third is. */
    adapt_rate_update(&est, 90000, 90000 / fast);
    ASSERT_NEAR(est.Bps, fast, 1e-6);
    /* Readings too short to time (10 ms) make no run however many. */
    adapt_rate short_est = {.Bps = slow};
    for (int i = 0; i < 3; i++) adapt_rate_update(&short_est, 25000, 0.010);
    ASSERT(short_est.Bps < 0.5 * fast);
}

#include "../../trainer/gateway/sync_params.h"

/* --sync-params: the spans each spec selects, and pack/unpack round trips. */
TEST(sync_params_select_tensors)
{
    gpt_config cfg;
    ASSERT_OK(gpt_config_preset(&cfg, "tiny", NULL));
    const size_t n = gpt_num_params(&cfg);
    const size_t nt = gpt_num_tensors(&cfg);
    gpt_tensor_info *t = malloc(nt * sizeof *t);
    gpt_tensor_table(&cfg, t);
    size_t embed = 0, block0 = 0, final = 0;
    for (size_t i = 0; i < nt; i++) {
        if (!strcmp(t[i].name, "wte") || !strcmp(t[i].name, "wpe")) embed += t[i].numel;
        else if (t[i].layer == 0) block0 += t[i].numel;
        else if (t[i].layer < 0) final += t[i].numel;
    }
    sync_params sp;
    ASSERT_OK(sync_params_parse("all", &cfg, &sp, NULL));
    ASSERT_EQ(sp.count, n);
    ASSERT_EQ(sp.n_spans, 1); /* adjacent tensors merge */
    sync_params_free(&sp);
    ASSERT_OK(sync_params_parse("no-embed", &cfg, &sp, NULL));
    ASSERT_EQ(sp.count, n - embed);
    sync_params_free(&sp);
    ASSERT_OK(sync_params_parse("every:4", &cfg, &sp, NULL)); /* tiny: 4 layers */
    ASSERT_EQ(sp.count, block0 + final);
    float *model = malloc(n * sizeof(float)), *packed = malloc(sp.count * sizeof(float));
    for (size_t i = 0; i < n; i++) model[i] = (float)i;
    sync_params_pack(&sp, model, packed);
    for (size_t i = 0; i < sp.count; i++) packed[i] = -packed[i];
    sync_params_unpack(&sp, packed, model);
    size_t negated = 0;
    for (size_t i = 0; i < n; i++) negated += model[i] < 0;
    ASSERT_EQ(negated, sp.count); /* element 0 (wte's first) is not selected */
    sync_params_free(&sp);
    cirrus_error err = {0};
    ASSERT(sync_params_parse("every:0", &cfg, &sp, &err) == CIRRUS_EINVAL);
    ASSERT(sync_params_parse("every:5", &cfg, &sp, &err) == CIRRUS_EINVAL);
    ASSERT(sync_params_parse("some", &cfg, &sp, &err) == CIRRUS_EINVAL);
    ASSERT(strstr(err.msg, "--sync-params") != NULL);
    free(model);
    free(packed);
    free(t);
}
