/* Tests of trainer/swarm/proto/stage_msg and rpc: every stage message body decodes to what
 * was encoded, with the documented byte layout; every truncated, oversized or trailing
 * body is refused with CIRRUS_ECORRUPT; and the one mapping of WIRE_ERROR, over a real
 * loopback connection. */
#include <stddef.h>
#include <string.h>
#include <unistd.h>

#include "../../trainer/net/conn.h"
#include "../../trainer/swarm/proto/rpc.h"
#include "../../trainer/swarm/proto/stage_msg.h"
#include "test.h"

#define T_MS 5000

/* A decoder under test: 0 or an error for the payload [p, p + n). */
typedef int (*decode_fn)(const uint8_t *p, size_t n, void *ctx);

/* The whole body decodes; every prefix of it (but `ok_cut`, a body whose optional tail is
 * left out; SIZE_MAX: none) and the body with a byte more are CIRRUS_ECORRUPT. Ends with
 * the whole body decoded into ctx. */
static void check_cuts(const wire_writer *w, decode_fn dec, void *ctx, size_t ok_cut)
{
    ASSERT(!w->failed);
    ASSERT_OK(dec(w->data, w->len, ctx));
    for (size_t cut = 0; cut < w->len; cut++)
        if (cut != ok_cut) ASSERT_EQ(dec(w->data, cut, ctx), CIRRUS_ECORRUPT);
    uint8_t *more = malloc(w->len + 1);
    ASSERT(more != NULL);
    memcpy(more, w->data, w->len);
    more[w->len] = 0x5a;
    ASSERT_EQ(dec(more, w->len + 1, ctx), CIRRUS_ECORRUPT);
    free(more);
    ASSERT_OK(dec(w->data, w->len, ctx)); /* what the caller checks next */
}

/* ---- FORWARD / BACKWARD ---- */

#define MB_B 2
#define MB_T 5
#define MB_C 4
#define MB_N (MB_B * MB_T)

typedef struct mb_case {
    uint16_t type;
    stage_mb_dest d;
    stage_microbatch got;
} mb_case;

static int dec_mb(const uint8_t *p, size_t n, void *ctx)
{
    mb_case *c = ctx;
    wire_reader r;
    wire_reader_init(&r, p, n);
    return stage_msg_get_microbatch(&r, c->type, &c->d, &c->got);
}

TEST(stage_msg_microbatch_round_trip)
{
    int32_t tok[MB_N], tgt[MB_N], tok_out[MB_N], tgt_out[MB_N];
    float hid[MB_N * MB_C], gout[MB_N * MB_C], hid_out[MB_N * MB_C], gout_out[MB_N * MB_C];
    for (int i = 0; i < MB_N; i++) tok[i] = (i * 37) % 256, tgt[i] = (i * 11 + 3) % 256;
    for (int i = 0; i < MB_N * MB_C; i++) hid[i] = 0.25f * (float)i - 3.0f, gout[i] = -0.5f * (float)i;
    const stage_mb_dest base = {.max_B = MB_B, .max_T = MB_T, .C = MB_C, .tokens = tok_out,
                                .targets = tgt_out, .hidden = hid_out, .grad_out = gout_out};
    /* first and last stage in one: tokens and targets; a middle stage's BACKWARD:
     * activations and their gradient; the last stage's BACKWARD: activations, targets. */
    for (int which = 0; which < 3; which++) {
        mb_case c = {.d = base};
        stage_microbatch m = {.id = 0x0102030405060708ull + (uint64_t)which, .B = MB_B,
                              .T = MB_T, .keep = which == 0, .codec = STAGE_CODEC_NONE};
        if (which == 0) {
            c.type = STAGE_FORWARD;
            c.d.first = c.d.last = 1;
            m.tokens = tok, m.targets = tgt, m.has_targets = 1;
        } else if (which == 1) {
            c.type = STAGE_BACKWARD;
            m.hidden = hid, m.grad_out = gout;
        } else {
            c.type = STAGE_BACKWARD;
            c.d.last = 1;
            m.hidden = hid, m.targets = tgt, m.has_targets = 1;
        }
        wire_writer w;
        wire_writer_init(&w, 1 << 20);
        stage_msg_put_microbatch(&w, &m, MB_C);
        /* The documented layout: u64 id, u32 B, u32 T, u8 keep, codec, has_targets, 0. */
        ASSERT(w.len > STAGE_MB_HEAD_SIZE);
        uint64_t id;
        uint32_t B, T;
        memcpy(&id, w.data, 8);
        memcpy(&B, w.data + 8, 4);
        memcpy(&T, w.data + 12, 4);
        ASSERT(id == m.id);
        ASSERT_EQ(B, MB_B);
        ASSERT_EQ(T, MB_T);
        ASSERT_EQ(w.data[16], m.keep);
        ASSERT_EQ(w.data[17], STAGE_CODEC_NONE);
        ASSERT_EQ(w.data[18], m.has_targets);
        ASSERT_EQ(w.data[19], 0);
        const size_t want = STAGE_MB_HEAD_SIZE + (which == 0 ? 2 * MB_N
                                                  : which == 1 ? 2 * MB_N * MB_C * 4
                                                               : MB_N * MB_C * 4 + MB_N);
        ASSERT_EQ(w.len, want);
        check_cuts(&w, dec_mb, &c, SIZE_MAX);
        ASSERT(c.got.id == m.id);
        ASSERT_EQ(c.got.keep, m.keep);
        ASSERT_EQ(c.got.has_targets, m.has_targets);
        if (which == 0) {
            ASSERT(c.got.tokens == tok_out && c.got.hidden == NULL && c.got.grad_out == NULL);
            ASSERT(!memcmp(tok_out, tok, sizeof tok) && !memcmp(tgt_out, tgt, sizeof tgt));
        } else {
            ASSERT(c.got.tokens == NULL && c.got.hidden == hid_out);
            ASSERT(!memcmp(hid_out, hid, sizeof hid));
        }
        if (which == 1) {
            ASSERT(c.got.grad_out == gout_out && c.got.targets == NULL);
            ASSERT(!memcmp(gout_out, gout, sizeof gout));
        }
        if (which == 2) ASSERT(c.got.targets == tgt_out && !memcmp(tgt_out, tgt, sizeof tgt));
        wire_writer_free(&w);
    }
}

TEST(stage_msg_microbatch_refused)
{
    int32_t tok[4 * MB_N] = {0}, tok_out[MB_N], tgt_out[MB_N]; /* room for a B or T too big */
    float hid_out[MB_N * MB_C], gout_out[MB_N * MB_C];
    const stage_mb_dest first = {.max_B = MB_B, .max_T = MB_T, .C = MB_C, .first = 1,
                                 .tokens = tok_out, .targets = tgt_out, .hidden = hid_out,
                                 .grad_out = gout_out};
    const stage_microbatch ok = {.id = 1, .B = MB_B, .T = MB_T, .tokens = tok};
    for (int k = 0; k < 8; k++) {
        stage_microbatch m = ok;
        mb_case c = {.type = STAGE_FORWARD, .d = first};
        uint8_t flag3 = 0;
        switch (k) {
        case 0: m.B = MB_B + 1; break;                 /* over the peer's microbatch */
        case 1: m.T = MB_T + 1; break;
        case 2: m.B = 0; break;
        case 3: m.codec = 2; break;                    /* no such codec */
        case 4: m.has_targets = 1; m.targets = tok; break; /* targets, not the last stage */
        case 5: flag3 = 1; break;                      /* the reserved byte */
        case 6: c.type = STAGE_BACKWARD; c.d.last = 1; break; /* a last BACKWARD, no targets */
        case 7: c.type = STAGE_RESET; break;           /* not a microbatch */
        }
        wire_writer w;
        wire_writer_init(&w, 1 << 20);
        stage_msg_put_microbatch(&w, &m, MB_C);
        if (flag3) w.data[19] = 1;
        ASSERT_EQ(dec_mb(w.data, w.len, &c), CIRRUS_ECORRUPT);
        wire_writer_free(&w);
    }
}

TEST(stage_msg_acts_q8_and_raw)
{
    float x[256], y[256];
    for (int i = 0; i < 256; i++) x[i] = (float)(i % 17) - 8.0f;
    for (int codec = 0; codec <= 1; codec++) {
        wire_writer w;
        wire_writer_init(&w, 1 << 20);
        stage_msg_put_acts(&w, x, 256, codec);
        wire_reader r;
        wire_reader_init(&r, w.data, w.len);
        ASSERT_OK(stage_msg_get_acts(&r, y, 256, codec));
        for (int i = 0; i < 256; i++) ASSERT_NEAR(y[i], x[i], codec ? 0.07 : 0.0);
        wire_reader_init(&r, w.data, w.len - 1);
        ASSERT_EQ(stage_msg_get_acts(&r, y, 256, codec), CIRRUS_ECORRUPT);
        wire_reader_init(&r, w.data, w.len);
        ASSERT_EQ(stage_msg_get_acts(&r, y, 255, codec), CIRRUS_ECORRUPT); /* trailing */
        wire_writer_free(&w);
    }
    /* q8 refuses a non-finite activation rather than send it. */
    x[3] = NAN;
    wire_writer w;
    wire_writer_init(&w, 1 << 20);
    stage_msg_put_acts(&w, x, 256, STAGE_CODEC_Q8);
    ASSERT(w.failed);
    wire_writer_free(&w);
}

/* ---- the small bodies ---- */

static int dec_loss(const uint8_t *p, size_t n, void *ctx)
{
    wire_reader r;
    wire_reader_init(&r, p, n);
    return stage_msg_get_loss(&r, ctx);
}

static int dec_avg_ok(const uint8_t *p, size_t n, void *ctx)
{
    wire_reader r;
    wire_reader_init(&r, p, n);
    return stage_msg_get_average_ok(&r, ctx);
}

static int dec_step(const uint8_t *p, size_t n, void *ctx)
{
    wire_reader r;
    wire_reader_init(&r, p, n);
    return stage_msg_get_step(&r, ctx);
}

static int dec_sync(const uint8_t *p, size_t n, void *ctx)
{
    wire_reader r;
    wire_reader_init(&r, p, n);
    return stage_msg_get_sync(&r, ctx);
}

static int dec_tied(const uint8_t *p, size_t n, void *ctx)
{
    wire_reader r;
    const float *g;
    wire_reader_init(&r, p, n);
    int rc = stage_msg_get_tied(&r, 6, &g);
    if (!rc) memcpy(ctx, g, 6 * sizeof(float));
    return rc;
}

TEST(stage_msg_small_bodies_round_trip)
{
    wire_writer w;
    float loss = 0;
    wire_writer_init(&w, 64);
    stage_msg_put_loss(&w, 2.75f);
    ASSERT_EQ(w.len, 4);
    check_cuts(&w, dec_loss, &loss, SIZE_MAX);
    ASSERT(loss == 2.75f);
    wire_writer_free(&w);

    uint32_t mb = 0;
    wire_writer_init(&w, 64);
    stage_msg_put_average_ok(&w, 77);
    check_cuts(&w, dec_avg_ok, &mb, SIZE_MAX);
    ASSERT_EQ(mb, 77);
    wire_writer_free(&w);

    const stage_step st = {.lr = 3e-4f, .grad_scale = 0.125f, .step = 42, .sumsq = 17.5};
    stage_step back;
    wire_writer_init(&w, 64);
    stage_msg_put_step(&w, &st);
    ASSERT_EQ(w.len, 24); /* f32, f32, u64, f64 */
    check_cuts(&w, dec_step, &back, SIZE_MAX);
    ASSERT(back.lr == st.lr && back.grad_scale == st.grad_scale && back.sumsq == st.sumsq);
    ASSERT_EQ(back.step, 42);
    wire_writer_free(&w);
    const stage_step bad[] = {{.lr = 1, .grad_scale = 1, .step = 0},
                              {.lr = -1, .grad_scale = 1, .step = 1},
                              {.lr = 1, .grad_scale = 0, .step = 1},
                              {.lr = NAN, .grad_scale = 1, .step = 1},
                              {.lr = 1, .grad_scale = 1, .step = 1, .sumsq = -1}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        wire_writer_init(&w, 64);
        stage_msg_put_step(&w, &bad[i]);
        ASSERT_EQ(dec_step(w.data, w.len, &back), CIRRUS_ECORRUPT);
        wire_writer_free(&w);
    }

    char donor[STAGE_ADDR_MAX];
    wire_writer_init(&w, 512);
    stage_msg_put_sync(&w, "10.1.2.3:7001");
    check_cuts(&w, dec_sync, donor, SIZE_MAX);
    ASSERT(!strcmp(donor, "10.1.2.3:7001"));
    wire_writer_free(&w);
    char long_addr[STAGE_ADDR_MAX + 8];
    memset(long_addr, 'a', sizeof long_addr - 1);
    long_addr[sizeof long_addr - 1] = '\0';
    wire_writer_init(&w, 1024);
    stage_msg_put_sync(&w, long_addr); /* longer than any address a peer takes */
    ASSERT_EQ(dec_sync(w.data, w.len, donor), CIRRUS_ECORRUPT);
    wire_writer_free(&w);

    const float g[6] = {1, -2, 3.5f, 0, 1e-3f, -7};
    float gb[6];
    wire_writer_init(&w, 64);
    stage_msg_put_tied(&w, g, 6);
    check_cuts(&w, dec_tied, gb, SIZE_MAX);
    ASSERT(!memcmp(g, gb, sizeof g));
    wire_writer_free(&w);

    wire_reader r;
    wire_reader_init(&r, NULL, 0);
    ASSERT_OK(stage_msg_get_empty(&r));
    wire_reader_init(&r, "x", 1);
    ASSERT_EQ(stage_msg_get_empty(&r), CIRRUS_ECORRUPT);
}

static int dec_info(const uint8_t *p, size_t n, void *ctx)
{
    wire_reader r;
    wire_reader_init(&r, p, n);
    return stage_msg_get_info(&r, ctx);
}

TEST(stage_msg_info_round_trip)
{
    const stage_info in = {.l0 = 2, .l1 = 5, .n_layer = 6, .n_embd = 64, .n_head = 4,
                           .seq_len = 128, .n_params = 123456789, .steps = STAGE_STEPS_UNKNOWN,
                           .ring = "127.0.0.1:9100"};
    stage_info back;
    wire_writer w;
    wire_writer_init(&w, 1024);
    stage_msg_put_info(&w, &in);
    ASSERT_EQ(w.len, 6 * 4 + 2 * 8 + 2 + strlen(in.ring));
    uint32_t v[6];
    memcpy(v, w.data, sizeof v); /* the six u32 first, in the documented order */
    ASSERT(v[0] == 2 && v[1] == 5 && v[2] == 6 && v[3] == 64 && v[4] == 4 && v[5] == 128);
    check_cuts(&w, dec_info, &back, SIZE_MAX);
    ASSERT(!memcmp(&back, &in, offsetof(stage_info, ring)));
    ASSERT(!strcmp(back.ring, in.ring));
    wire_writer_free(&w);
    /* No ring address: an empty string. */
    stage_info none = in;
    none.ring[0] = '\0';
    wire_writer_init(&w, 1024);
    stage_msg_put_info(&w, &none);
    check_cuts(&w, dec_info, &back, SIZE_MAX);
    ASSERT_EQ(back.ring[0], '\0');
    wire_writer_free(&w);
}

static int dec_avg(const uint8_t *p, size_t n, void *ctx)
{
    wire_reader r;
    wire_reader_init(&r, p, n);
    return stage_msg_get_average(&r, ctx);
}

TEST(stage_msg_average_round_trip_and_caps)
{
    static stage_average a, back;
    memset(&a, 0, sizeof a);
    a.round = 9;
    a.n = 3;
    a.ring_ms = 2500;
    strcpy(a.addrs[0], "127.0.0.1:9000");
    strcpy(a.addrs[1], "127.0.0.1:9001");
    strcpy(a.addrs[2], "[::1]:9002");
    wire_writer w;
    wire_writer_init(&w, 64 * 1024);
    stage_msg_put_average(&w, &a);
    /* ring_ms is optional: a body without it is taken with the default. */
    check_cuts(&w, dec_avg, &back, w.len - 4);
    ASSERT(back.round == 9 && back.n == 3 && back.ring_ms == 2500);
    for (int i = 0; i < 3; i++) ASSERT(!strcmp(back.addrs[i], a.addrs[i]));
    ASSERT_OK(dec_avg(w.data, w.len - 4, &back));
    ASSERT_EQ(back.ring_ms, STAGE_RING_MS_DEFAULT);
    wire_writer_free(&w);
    /* Round 0, no members, more members than a ring takes, ring_ms 0 or over the cap. */
    for (int k = 0; k < 5; k++) {
        stage_average b = a;
        if (k == 0) b.round = 0;
        if (k == 1) b.n = 0;
        if (k == 3) b.ring_ms = 0;
        if (k == 4) b.ring_ms = STAGE_RING_MS_MAX + 1;
        wire_writer_init(&w, 64 * 1024);
        stage_msg_put_average(&w, &b);
        if (k == 2) { /* n patched past the cap, the members there */
            uint32_t n = STAGE_AVERAGE_MAX_MEMBERS + 1;
            memcpy(w.data + 8, &n, 4);
        }
        ASSERT_EQ(dec_avg(w.data, w.len, &back), CIRRUS_ECORRUPT);
        wire_writer_free(&w);
    }
}

static int dec_sumsq(const uint8_t *p, size_t n, void *ctx)
{
    wire_reader r;
    stage_sumsq_part *parts;
    uint32_t k;
    wire_reader_init(&r, p, n);
    int rc = stage_msg_get_sumsq(&r, &parts, &k);
    if (!rc) {
        memcpy(ctx, parts, sizeof *parts * k);
        free(parts);
    }
    return rc;
}

TEST(stage_msg_sumsq_round_trip_and_caps)
{
    const stage_sumsq_part parts[3] = {{0, 1.5}, {4096, 0.0}, {1u << 30, 1e9}};
    stage_sumsq_part back[3];
    wire_writer w;
    wire_writer_init(&w, 1024);
    stage_msg_put_sumsq(&w, parts, 3);
    ASSERT_EQ(w.len, 4 + 3 * 16);
    check_cuts(&w, dec_sumsq, back, SIZE_MAX);
    for (int i = 0; i < 3; i++)
        ASSERT(back[i].offset == parts[i].offset && back[i].sumsq == parts[i].sumsq);
    /* A count the payload cannot hold is refused before anything is allocated. */
    uint32_t huge = 0xffffffffu;
    memcpy(w.data, &huge, 4);
    ASSERT_EQ(dec_sumsq(w.data, w.len, back), CIRRUS_ECORRUPT);
    wire_writer_free(&w);
    /* None at all: fine, nothing allocated. */
    wire_reader r;
    stage_sumsq_part *none = (stage_sumsq_part *)1;
    uint32_t k = 9;
    wire_writer_init(&w, 64);
    stage_msg_put_sumsq(&w, NULL, 0);
    wire_reader_init(&r, w.data, w.len);
    ASSERT_OK(stage_msg_get_sumsq(&r, &none, &k));
    ASSERT(none == NULL && k == 0);
    wire_writer_free(&w);
}

typedef struct state_case {
    uint64_t total, count;
    stage_state_get q;
    stage_state_slice sl;
} state_case;

static int dec_state_get(const uint8_t *p, size_t n, void *ctx)
{
    state_case *c = ctx;
    wire_reader r;
    wire_reader_init(&r, p, n);
    return stage_msg_get_state_get(&r, c->total, &c->q);
}

static int dec_state_slice(const uint8_t *p, size_t n, void *ctx)
{
    state_case *c = ctx;
    wire_reader r;
    wire_reader_init(&r, p, n);
    return stage_msg_get_state_slice(&r, c->count, &c->sl);
}

TEST(stage_msg_state_round_trip_and_caps)
{
    state_case c = {.total = 3 * 1000};
    wire_writer w;
    const stage_state_get q = {.offset = 1000, .count = 1500};
    wire_writer_init(&w, 64);
    stage_msg_put_state_get(&w, &q);
    ASSERT_EQ(w.len, 16);
    /* An empty request is the whole state: the cut at 0 decodes. */
    check_cuts(&w, dec_state_get, &c, 0);
    ASSERT(c.q.offset == 1000 && c.q.count == 1500);
    ASSERT_OK(dec_state_get(w.data, 0, &c));
    ASSERT(c.q.offset == 0 && c.q.count == 3000);
    wire_writer_free(&w);
    const stage_state_get bad[] = {{3001, 0}, {2000, 1001}, {0, UINT64_MAX}};
    for (int i = 0; i < 3; i++) {
        wire_writer_init(&w, 64);
        stage_msg_put_state_get(&w, &bad[i]);
        ASSERT_EQ(dec_state_get(w.data, w.len, &c), CIRRUS_ECORRUPT);
        wire_writer_free(&w);
    }
    c.total = 3 * STAGE_STATE_SLICE;
    const stage_state_get big = {0, STAGE_STATE_SLICE + 1}; /* over a frame's slice */
    wire_writer_init(&w, 64);
    stage_msg_put_state_get(&w, &big);
    ASSERT_EQ(dec_state_get(w.data, w.len, &c), CIRRUS_ECORRUPT);
    wire_writer_free(&w);
    /* Nor everything at once when everything is over the slice (found by fuzz_swarm_msg). */
    ASSERT_EQ(dec_state_get(NULL, 0, &c), CIRRUS_ECORRUPT);

    const float f[5] = {1, 2, 3, 4, 5};
    c.count = 5;
    wire_writer_init(&w, 1024);
    stage_msg_put_state_head(&w, 17, 1000, NULL, 0);
    stage_msg_put_state_floats(&w, f, 5);
    check_cuts(&w, dec_state_slice, &c, SIZE_MAX);
    ASSERT(c.sl.steps == 17 && c.sl.n == 1000 && c.sl.n_origins == 0 &&
           !memcmp(c.sl.floats, f, sizeof f));
    wire_writer_free(&w);
    /* The donor's moments origins travel with every slice, by increasing segment, each
     * from in [1, steps]. */
    const stage_origin o[2] = {{3, 12}, {40, 17}};
    wire_writer_init(&w, 1024);
    stage_msg_put_state_head(&w, 17, 1000, o, 2);
    stage_msg_put_state_floats(&w, f, 5);
    check_cuts(&w, dec_state_slice, &c, SIZE_MAX);
    ASSERT_EQ(c.sl.n_origins, 2);
    const stage_origin o0 = stage_msg_origin_at(&c.sl, 0), o1 = stage_msg_origin_at(&c.sl, 1);
    ASSERT(o0.segment == 3 && o0.from == 12 && o1.segment == 40 && o1.from == 17);
    ASSERT(!memcmp(c.sl.floats, f, sizeof f));
    wire_writer_free(&w);
    const stage_origin wrong[][2] = {{{3, 12}, {3, 13}},  /* a segment twice */
                                   {{40, 12}, {3, 13}}, /* out of order */
                                   {{3, 0}, {40, 13}},  /* from 0 */
                                   {{3, 12}, {40, 18}}}; /* from past the donor's step */
    for (size_t i = 0; i < sizeof wrong / sizeof wrong[0]; i++) {
        wire_writer_init(&w, 1024);
        stage_msg_put_state_head(&w, 17, 1000, wrong[i], 2);
        stage_msg_put_state_floats(&w, f, 5);
        ASSERT_EQ(dec_state_slice(w.data, w.len, &c), CIRRUS_ECORRUPT);
        wire_writer_free(&w);
    }
}

/* ---- rpc ---- */

/* PARAMS_SET addresses the n parameters, STATE_SET the whole 3n state; both refuse a
 * slice outside that, an n other than the receiver's, and a short payload. */
TEST(stage_msg_params_and_state_set_bounds)
{
    const float f[4] = {1, 2, 3, 4};
    const struct {
        uint64_t n, offset, count;
        int params_ok, state_ok;
    } cases[] = {
        {100, 0, 4, 1, 1},     {100, 96, 4, 1, 1},  {100, 97, 4, 0, 1},
        {100, 296, 4, 0, 1},   {100, 297, 4, 0, 0}, {99, 0, 4, 0, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const stage_params_set q = {.steps = 7, .n = cases[i].n, .offset = cases[i].offset,
                                    .count = cases[i].count};
        wire_writer w;
        wire_reader r;
        stage_params_set got;
        wire_writer_init(&w, 64);
        stage_msg_put_params_set(&w, &q, f);
        wire_reader_init(&r, w.data, w.len);
        ASSERT_EQ(stage_msg_get_params_set(&r, 100, &got) == 0, cases[i].params_ok);
        wire_reader_init(&r, w.data, w.len);
        ASSERT_EQ(stage_msg_get_state_set(&r, 100, &got) == 0, cases[i].state_ok);
        if (cases[i].state_ok) {
            ASSERT(got.steps == 7 && got.offset == cases[i].offset && got.count == 4);
            ASSERT(memcmp(got.floats, f, sizeof f) == 0);
        }
        wire_reader_init(&r, w.data, w.len - 1); /* a float short */
        ASSERT_EQ(stage_msg_get_state_set(&r, 100, &got), CIRRUS_ECORRUPT);
        wire_writer_free(&w);
    }
}

TEST(rpc_error_mapping)
{
    /* Refusals keep the codes that describe the request or the peer's state... */
    const int pass[] = {CIRRUS_EINVAL, CIRRUS_ENOMEM, CIRRUS_EMISMATCH, CIRRUS_ENOENT,
                        CIRRUS_ECONFLICT, CIRRUS_EGONE};
    for (size_t i = 0; i < sizeof pass / sizeof pass[0]; i++) {
        ASSERT_EQ(rpc_error_code(pass[i]), pass[i]);
        ASSERT(!rpc_is_fault(rpc_error_code(pass[i])));
    }
    /* ...and never read as a failure of this end's connection. */
    const int32_t other[] = {CIRRUS_EIO, CIRRUS_ECLOSED, CIRRUS_ETIMEDOUT, CIRRUS_ETRUNC,
                             CIRRUS_ECORRUPT, 0, 5, -12, -1000, INT32_MIN};
    for (size_t i = 0; i < sizeof other / sizeof other[0]; i++) {
        ASSERT_EQ(rpc_error_code(other[i]), CIRRUS_EINVAL);
        ASSERT(!rpc_is_fault(rpc_error_code(other[i])));
    }
    ASSERT(rpc_is_fault(CIRRUS_ECLOSED) && rpc_is_fault(CIRRUS_ECORRUPT));
    /* The body: i32 code, str message; the message made printable. */
    wire_writer w;
    wire_reader r;
    int code;
    char msg[64];
    wire_writer_init(&w, 1024);
    rpc_put_error(&w, CIRRUS_EGONE, "moved\x01 away");
    wire_reader_init(&r, w.data, w.len);
    ASSERT_OK(rpc_get_error(&r, &code, msg, sizeof msg));
    ASSERT_EQ(code, CIRRUS_EGONE);
    ASSERT(!strcmp(msg, "moved? away"));
    for (size_t cut = 0; cut < w.len; cut++) {
        wire_reader_init(&r, w.data, cut);
        ASSERT_EQ(rpc_get_error(&r, &code, msg, sizeof msg), CIRRUS_ECORRUPT);
    }
    wire_writer_free(&w);
}

/* One request answered by `answer_type` with `answer_id` and body `body`, over loopback. */
static int one_call(uint16_t answer_type, uint64_t answer_id, const wire_writer *body,
                    wire_reader *reply, cirrus_error *err)
{
    int lfd, port;
    net_conn *cli, *srv;
    ASSERT_OK(net_listen("127.0.0.1", 0, &lfd, &port, err));
    ASSERT_OK(net_connect("127.0.0.1", port, T_MS, &cli, err));
    ASSERT_OK(net_accept(lfd, T_MS, &srv, err));
    wire_writer req;
    wire_writer_init(&req, 64);
    stage_msg_put_sync(&req, "127.0.0.1:1");
    ASSERT_OK(rpc_send(cli, STAGE_SYNC, 7, &req, T_MS, "peer", err));
    wire_header h;
    const uint8_t *p;
    ASSERT_OK(net_recv_frame(srv, &h, &p, T_MS, err));
    ASSERT(h.type == STAGE_SYNC && h.request_id == 7 && h.payload_len == req.len);
    ASSERT(!memcmp(p, req.data, req.len));
    ASSERT_OK(net_send_frame(srv, answer_type, answer_id, body->data, (uint32_t)body->len,
                             T_MS));
    int rc = rpc_await(cli, STAGE_SYNC, 7, T_MS, "peer", reply, err);
    /* The reply stays readable until the next receive on cli: copy what the test needs. */
    static uint8_t copy[256];
    if (!rc && reply->len) {
        ASSERT(reply->len <= sizeof copy);
        memcpy(copy, reply->data, reply->len);
        wire_reader_init(reply, copy, reply->len);
    }
    wire_writer_free(&req);
    net_close(cli);
    net_close(srv);
    close(lfd);
    return rc;
}

TEST(rpc_call_reply_and_refusals)
{
    cirrus_error err = {0};
    wire_reader r;
    wire_writer w;
    wire_writer_init(&w, 256);
    ASSERT_OK(one_call(STAGE_SYNC_OK, 7, &w, &r, &err));
    ASSERT_EQ(r.len, 0);
    /* A ring member vanished: the peer refuses with EIO, which is not a fault here. */
    rpc_put_error(&w, CIRRUS_EIO, "gradient averaging failed");
    ASSERT_EQ(one_call(WIRE_ERROR, 7, &w, &r, &err), CIRRUS_EINVAL);
    ASSERT_EQ(err.code, CIRRUS_EINVAL);
    ASSERT(strstr(err.msg, "peer refused: gradient averaging failed") != NULL);
    wire_writer_free(&w);
    wire_writer_init(&w, 256);
    rpc_put_error(&w, STAGE_MOVED, "moving");
    ASSERT_EQ(one_call(WIRE_ERROR, 7, &w, &r, &err), STAGE_MOVED);
    /* An answer to another request, or of another type, is a broken stream. */
    ASSERT_EQ(one_call(WIRE_ERROR, 8, &w, &r, &err), CIRRUS_ECORRUPT);
    ASSERT_EQ(one_call(STAGE_INFO_OK, 7, &w, &r, &err), CIRRUS_ECORRUPT);
    wire_writer_free(&w);
    /* A writer that failed is not sent. */
    wire_writer_init(&w, 2);
    wire_put_u64(&w, 1);
    ASSERT(w.failed);
    ASSERT_EQ(rpc_send(NULL, STAGE_SYNC, 1, &w, T_MS, "peer", &err), CIRRUS_ENOMEM);
    wire_writer_free(&w);
}
