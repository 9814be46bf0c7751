/* Tests of trainer/data/loader: windows, sharding across ranks, shuffling, positions. */
#include <stdint.h>
#include <string.h>

#include "../../trainer/data/loader.h"
#include "test.h"

/* A synthetic corpus of pseudo-random bytes: with T >= 8 every window's content is unique,
 * so a row read by the loader identifies the window it came from. */
static void write_corpus(const char *path, size_t len, uint64_t seed)
{
    FILE *f = fopen(path, "wb");
    ASSERT(f != NULL);
    uint64_t s = seed;
    for (size_t i = 0; i < len; i++) {
        s = s * 6364136223846793005ULL + 1442695040888963407ULL;
        fputc((int)(s >> 56), f);
    }
    ASSERT_EQ(fclose(f), 0);
}

static void load_corpus(data_corpus *c, size_t len, double val_fraction)
{
    char path[512];
    cirrus_error err = {0};
    snprintf(path, sizeof path, "%s/corpus.txt", test_tmpdir());
    write_corpus(path, len, 42);
    ASSERT_OK(data_corpus_load(c, path, val_fraction, &err));
    ASSERT_EQ(c->len, len);
}

/* Index of the window of the split [base, base+n) whose T+1 bytes equal the row (inputs
 * followed by the last target), or -1. */
static long window_of(const data_corpus *c, size_t base, size_t n, int T, const int32_t *in,
                      const int32_t *tg)
{
    for (size_t k = 0; k * T + T + 1 <= n; k++) {
        const uint8_t *p = c->bytes + base + k * T;
        int same = 1;
        for (int t = 0; t < T && same; t++) same = p[t] == in[t];
        if (same && p[T] == tg[T - 1]) return (long)k;
    }
    return -1;
}

static data_loader *make_loader(const data_corpus *c, enum data_split split, int B, int T,
                                int rank, int world, uint64_t seed)
{
    data_loader *l = NULL;
    cirrus_error err = {0};
    int rc = data_loader_new(&l, c, split, B, T, rank, world, seed, &err);
    if (rc != 0) TEST_FAIL("data_loader_new: %s", err.msg);
    return l;
}

TEST(data_targets_are_inputs_shifted)
{
    data_corpus c;
    load_corpus(&c, 4000, 0.1);
    const int B = 4, T = 16;
    data_loader *l = make_loader(&c, DATA_TRAIN, B, T, 0, 1, 7);
    int32_t in[4 * 16], tg[4 * 16];
    for (int it = 0; it < 10; it++) {
        data_loader_next(l, in, tg);
        for (int b = 0; b < B; b++) {
            for (int t = 0; t + 1 < T; t++) ASSERT_EQ(tg[b * T + t], in[b * T + t + 1]);
            long k = window_of(&c, 0, c.train_len, T, in + b * T, tg + b * T);
            ASSERT(k >= 0); /* a real window of the train split, starting at a multiple of T */
        }
    }
    data_loader_free(l);
    data_corpus_free(&c);
}

/* Ranks read disjoint windows, and rank 0..w-1 concatenated is the world-1 batch of w*B. */
static void check_sharding(int world)
{
    data_corpus c;
    load_corpus(&c, 3000, 0.1);
    const int B = 3, T = 8;
    data_loader *ranks[3], *whole = make_loader(&c, DATA_TRAIN, world * B, T, 0, 1, 99);
    for (int r = 0; r < world; r++) ranks[r] = make_loader(&c, DATA_TRAIN, B, T, r, world, 99);
    uint64_t per_epoch = data_loader_batches_per_epoch(whole);
    ASSERT_EQ(per_epoch, data_loader_batches_per_epoch(ranks[0]));
    ASSERT_EQ(per_epoch, ((c.train_len - 1) / T) / (size_t)(world * B));
    int32_t all_in[9 * 8], all_tg[9 * 8], in[3 * 8], tg[3 * 8];
    /* Two and a half epochs, so the concatenation also holds across epoch boundaries. */
    for (uint64_t it = 0; it < per_epoch * 5 / 2; it++) {
        data_loader_next(whole, all_in, all_tg);
        long seen[9];
        for (int r = 0; r < world; r++) {
            data_loader_next(ranks[r], in, tg);
            ASSERT(memcmp(in, all_in + r * B * T, sizeof in) == 0);
            ASSERT(memcmp(tg, all_tg + r * B * T, sizeof tg) == 0);
            for (int b = 0; b < B; b++) {
                seen[r * B + b] = window_of(&c, 0, c.train_len, T, in + b * T, tg + b * T);
                ASSERT(seen[r * B + b] >= 0);
            }
        }
        for (int i = 0; i < world * B; i++)
            for (int j = 0; j < i; j++) ASSERT(seen[i] != seen[j]);
        data_position a = data_loader_tell(whole), b = data_loader_tell(ranks[world - 1]);
        ASSERT_EQ(a.epoch, b.epoch);
        ASSERT_EQ(a.cursor, b.cursor);
    }
    ASSERT_EQ(data_loader_tell(whole).epoch, 2);
    for (int r = 0; r < world; r++) data_loader_free(ranks[r]);
    data_loader_free(whole);
    data_corpus_free(&c);
}

TEST(data_ranks_disjoint_world2)
{
    check_sharding(2);
}

TEST(data_ranks_disjoint_world3)
{
    check_sharding(3);
}

TEST(data_epoch_visits_each_window_once)
{
    data_corpus c;
    load_corpus(&c, 2000, 0.1);
    const int B = 5, T = 8;
    data_loader *l = make_loader(&c, DATA_TRAIN, B, T, 0, 1, 3);
    size_t n_windows = (c.train_len - 1) / T;
    uint64_t per_epoch = data_loader_batches_per_epoch(l);
    ASSERT_EQ(per_epoch, n_windows / B);
    char *hit = calloc(n_windows, 1);
    int32_t in[5 * 8], tg[5 * 8];
    long first_rows[5];
    for (uint64_t it = 0; it < per_epoch; it++) {
        ASSERT_EQ(data_loader_tell(l).epoch, 0);
        ASSERT_EQ(data_loader_tell(l).cursor, it * B);
        data_loader_next(l, in, tg);
        for (int b = 0; b < B; b++) {
            long k = window_of(&c, 0, c.train_len, T, in + b * T, tg + b * T);
            ASSERT(k >= 0);
            ASSERT_EQ(hit[k], 0);
            hit[k] = 1;
            if (it == 0) first_rows[b] = k;
        }
    }
    /* The leftover windows that cannot fill a batch are skipped: the next epoch starts. */
    ASSERT_EQ(data_loader_tell(l).epoch, 1);
    ASSERT_EQ(data_loader_tell(l).cursor, 0);
    /* Shuffled: the first batch is not simply windows 0..B-1, and epoch 1 has another order. */
    int in_order = 1;
    for (int b = 0; b < B; b++) in_order &= first_rows[b] == b;
    ASSERT(!in_order);
    data_loader_next(l, in, tg);
    int same = 1;
    for (int b = 0; b < B; b++)
        same &= window_of(&c, 0, c.train_len, T, in + b * T, tg + b * T) == first_rows[b];
    ASSERT(!same);
    free(hit);
    data_loader_free(l);
    data_corpus_free(&c);
}

TEST(data_seed_is_deterministic)
{
    data_corpus c;
    load_corpus(&c, 2000, 0.1);
    data_loader *a = make_loader(&c, DATA_TRAIN, 4, 8, 0, 1, 1234);
    data_loader *b = make_loader(&c, DATA_TRAIN, 4, 8, 0, 1, 1234);
    data_loader *d = make_loader(&c, DATA_TRAIN, 4, 8, 0, 1, 1235);
    int32_t ia[32], ta[32], ib[32], tb[32], id[32], td[32];
    int differs = 0;
    for (int it = 0; it < 100; it++) {
        data_loader_next(a, ia, ta);
        data_loader_next(b, ib, tb);
        data_loader_next(d, id, td);
        ASSERT(memcmp(ia, ib, sizeof ia) == 0);
        ASSERT(memcmp(ta, tb, sizeof ta) == 0);
        differs += memcmp(ia, id, sizeof ia) != 0;
    }
    ASSERT(differs > 90); /* another seed gives another order, not the same one shifted */
    data_loader_free(a);
    data_loader_free(b);
    data_loader_free(d);
    data_corpus_free(&c);
}

TEST(data_tell_seek_reproduces_batches)
{
    data_corpus c;
    load_corpus(&c, 2000, 0.1);
    const int B = 4, T = 8;
    data_loader *a = make_loader(&c, DATA_TRAIN, B, T, 1, 2, 5);
    uint64_t per_epoch = data_loader_batches_per_epoch(a);
    int32_t in[32], tg[32], ref_in[64][32], ref_tg[64][32];
    cirrus_error err = {0};
    /* Stop a few batches before the end of epoch 0 and record 2*per_epoch more, so the
     * replay crosses two epoch boundaries. */
    ASSERT(2 * per_epoch <= 64);
    for (uint64_t it = 0; it + 3 < per_epoch; it++) data_loader_next(a, in, tg);
    data_position pos = data_loader_tell(a);
    ASSERT_EQ(pos.epoch, 0);
    for (uint64_t it = 0; it < 2 * per_epoch; it++) data_loader_next(a, ref_in[it], ref_tg[it]);
    ASSERT_EQ(data_loader_tell(a).epoch, 2);

    /* A fresh loader (as after a restart) and the same loader rewound both replay it. */
    data_loader *b = make_loader(&c, DATA_TRAIN, B, T, 1, 2, 5);
    ASSERT_OK(data_loader_seek(b, pos, &err));
    ASSERT_OK(data_loader_seek(a, pos, &err));
    for (uint64_t it = 0; it < 2 * per_epoch; it++) {
        data_loader_next(b, in, tg);
        ASSERT(memcmp(in, ref_in[it], sizeof in) == 0);
        ASSERT(memcmp(tg, ref_tg[it], sizeof tg) == 0);
        data_loader_next(a, in, tg);
        ASSERT(memcmp(in, ref_in[it], sizeof in) == 0);
    }
    /* Seeking straight into epoch 1 gives epoch 1's order without reading epoch 0. */
    data_position e1 = {1, 0};
    data_loader *d = make_loader(&c, DATA_TRAIN, B, T, 1, 2, 5);
    ASSERT_OK(data_loader_seek(d, e1, &err));
    data_loader_next(d, in, tg);
    ASSERT(memcmp(in, ref_in[3], sizeof in) == 0);
    data_loader_free(a);
    data_loader_free(b);
    data_loader_free(d);
    data_corpus_free(&c);
}

TEST(data_val_split_is_tail_in_order)
{
    data_corpus c;
    load_corpus(&c, 1000, 0.25);
    ASSERT_EQ(c.train_len, 750);
    const int B = 2, T = 10;
    data_loader *l = make_loader(&c, DATA_VAL, B, T, 0, 1, 77);
    size_t n_windows = (c.len - c.train_len - 1) / T; /* 24 */
    ASSERT_EQ(data_loader_batches_per_epoch(l), n_windows / B);
    int32_t in[20], tg[20];
    for (size_t it = 0; it < n_windows / B + 2; it++) {
        data_loader_next(l, in, tg);
        for (int b = 0; b < B; b++) {
            size_t k = (it * B + b) % n_windows; /* file order, wrapping each epoch */
            const uint8_t *p = c.bytes + c.train_len + k * T;
            for (int t = 0; t < T; t++) {
                ASSERT_EQ(in[b * T + t], p[t]);
                ASSERT_EQ(tg[b * T + t], p[t + 1]);
            }
        }
    }
    data_loader_free(l);
    data_corpus_free(&c);
}

TEST(data_missing_file_names_path)
{
    data_corpus c;
    cirrus_error err = {0};
    char path[512];
    snprintf(path, sizeof path, "%s/no-such-corpus.txt", test_tmpdir());
    ASSERT_EQ(data_corpus_load(&c, path, 0.1, &err), CIRRUS_ENOENT);
    ASSERT_EQ(err.code, CIRRUS_ENOENT);
    ASSERT(strstr(err.msg, path) != NULL);
}

TEST(data_bad_args_rejected)
{
    data_corpus c;
    data_loader *l = NULL;
    cirrus_error err = {0};
    char path[512];
    load_corpus(&c, 1000, 0.1); /* 900 train bytes: 112 windows of 8+1 */
    ASSERT_EQ(data_loader_new(&l, &c, DATA_TRAIN, 0, 8, 0, 1, 1, &err), CIRRUS_EINVAL);
    ASSERT_EQ(data_loader_new(&l, &c, DATA_TRAIN, 4, 0, 0, 1, 1, &err), CIRRUS_EINVAL);
    ASSERT_EQ(data_loader_new(&l, &c, DATA_TRAIN, -1, 8, 0, 1, 1, &err), CIRRUS_EINVAL);
    ASSERT_EQ(data_loader_new(&l, &c, DATA_TRAIN, 4, 8, -1, 2, 1, &err), CIRRUS_EINVAL);
    ASSERT_EQ(data_loader_new(&l, &c, DATA_TRAIN, 4, 8, 2, 2, 1, &err), CIRRUS_EINVAL);
    ASSERT_EQ(data_loader_new(&l, &c, DATA_TRAIN, 4, 8, 0, 0, 1, &err), CIRRUS_EINVAL);
    ASSERT(strstr(err.msg, "rank") != NULL);
    ASSERT_EQ(data_loader_new(&l, &c, DATA_TRAIN, 113, 8, 0, 1, 1, &err), CIRRUS_EINVAL);
    ASSERT(strstr(err.msg, "windows") != NULL);
    ASSERT_EQ(data_loader_new(&l, &c, DATA_VAL, 4, 8, 0, 4, 1, &err), CIRRUS_EINVAL);
    ASSERT(l == NULL);
    /* Exactly enough windows is fine: 112 = 2 ranks x 56. */
    ASSERT_OK(data_loader_new(&l, &c, DATA_TRAIN, 56, 8, 1, 2, 1, &err));
    ASSERT_EQ(data_loader_batches_per_epoch(l), 1);
    data_position past = {0, 113}, end = {0, 112};
    ASSERT_EQ(data_loader_seek(l, past, &err), CIRRUS_EINVAL);
    ASSERT_OK(data_loader_seek(l, end, &err)); /* the end of epoch 0 is epoch 1's start */
    ASSERT_EQ(data_loader_tell(l).epoch, 1);
    ASSERT_EQ(data_loader_tell(l).cursor, 0);
    data_loader_free(l);
    data_corpus_free(&c);

    snprintf(path, sizeof path, "%s/corpus.txt", test_tmpdir());
    ASSERT_EQ(data_corpus_load(&c, path, 0.0, &err), CIRRUS_EINVAL);
    ASSERT_EQ(data_corpus_load(&c, path, 1.0, &err), CIRRUS_EINVAL);
    ASSERT_EQ(data_corpus_load(&c, path, -0.5, &err), CIRRUS_EINVAL);
    ASSERT_EQ(data_corpus_load(&c, path, NAN, &err), CIRRUS_EINVAL);
    write_corpus(path, 0, 1);
    ASSERT_EQ(data_corpus_load(&c, path, 0.1, &err), CIRRUS_EINVAL);
    ASSERT(strstr(err.msg, path) != NULL);
    ASSERT_EQ(data_corpus_load(&c, test_tmpdir(), 0.1, &err), CIRRUS_EIO); /* a directory */
    ASSERT(strstr(err.msg, test_tmpdir()) != NULL);
    write_corpus(path, 10, 1); /* 10% of 10 bytes is a 1-byte validation split */
    ASSERT_EQ(data_corpus_load(&c, path, 0.1, &err), CIRRUS_EINVAL);
    ASSERT(strstr(err.msg, "too small") != NULL);
}

/* The real corpus, when the Makefile provides it: windows are real text, shifted by one. */
TEST(data_real_corpus_if_present)
{
    const char *path = getenv("CIRRUS_CORPUS");
    if (!path || !*path) return;
    data_corpus c;
    cirrus_error err = {0};
    if (data_corpus_load(&c, path, 0.1, &err) != 0) TEST_FAIL("%s", err.msg);
    ASSERT(c.train_len > c.len / 2 && c.train_len < c.len);
    data_loader *l = make_loader(&c, DATA_TRAIN, 8, 64, 0, 1, 1);
    int32_t in[8 * 64], tg[8 * 64];
    data_loader_next(l, in, tg);
    for (int i = 0; i < 8 * 64; i++) {
        ASSERT(in[i] >= 0 && in[i] < 256);
        if (i % 64 != 63) ASSERT_EQ(tg[i], in[i + 1]);
    }
    data_loader_free(l);
    data_corpus_free(&c);
}
