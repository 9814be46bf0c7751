/* Tests of trainer/ckpt/checkpoint: round trips, and every way a file can be refused without
 * touching the caller's buffers. */
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../../trainer/ckpt/checkpoint.h"
#include "test.h"

#define SENTINEL 0xA5u
#define ASSERT_STR_EQ(a, b)                                                      \
    do {                                                                         \
        if (strcmp((a), (b)) != 0) TEST_FAIL("%s == %s: '%s' != '%s'", #a, #b, (a), (b)); \
    } while (0)
#define HDR 152 /* the header's bytes (checkpoint.c) */

/* A small model's state, filled from a seed; every bit pattern is significant, including
 * -0.0, subnormals, infinities and a NaN with a payload, so "bit-exact" means bit-exact. */
typedef struct state {
    ckpt_meta meta;
    float *p, *m, *v;
} state;

static gpt_config small_cfg(void)
{
    gpt_config cfg = {.n_layer = 2, .n_embd = 16, .n_head = 2, .seq_len = 8, .vocab = 256};
    return cfg;
}

static void state_fill(state *s, uint64_t seed, gpt_span span)
{
    s->meta.cfg = small_cfg();
    s->meta.step = 1000 + seed;
    s->meta.data_pos.epoch = 3 + seed;
    s->meta.data_pos.cursor = 12345 + seed;
    s->meta.rng_state = 0xFEDCBA9876543210ULL ^ seed;
    s->meta.seed = seed;
    s->meta.span = span;
    float *arrays[3];
    for (int a = 0; a < 3; a++) arrays[a] = malloc(span.count * sizeof(float));
    s->p = arrays[0], s->m = arrays[1], s->v = arrays[2];
    uint64_t x = seed * 0x9E3779B97F4A7C15ULL + 1;
    for (int a = 0; a < 3; a++) {
        ASSERT(arrays[a] != NULL);
        for (size_t i = 0; i < span.count; i++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            uint32_t bits = (uint32_t)x;
            memcpy(&arrays[a][i], &bits, 4);
        }
        uint32_t special[] = {0x80000000u, 0x00000001u, 0x7F800000u, 0x7FC01234u};
        for (int k = 0; k < 4; k++) memcpy(&arrays[a][k], &special[k], 4);
    }
}

static void state_free(state *s)
{
    free(s->p), free(s->m), free(s->v);
}

static gpt_span whole(void)
{
    gpt_config cfg = small_cfg();
    gpt_span span = {0, gpt_num_params(&cfg)};
    return span;
}

/* Caller buffers filled with a sentinel, so a load that fails can be shown to change none. */
static void buffers_sentinel(state *b, size_t count)
{
    memset(&b->meta, SENTINEL, sizeof b->meta);
    b->p = malloc(count * sizeof(float));
    b->m = malloc(count * sizeof(float));
    b->v = malloc(count * sizeof(float));
    ASSERT(b->p && b->m && b->v);
    memset(b->p, SENTINEL, count * sizeof(float));
    memset(b->m, SENTINEL, count * sizeof(float));
    memset(b->v, SENTINEL, count * sizeof(float));
}

static void assert_untouched(const state *b, size_t count)
{
    const unsigned char *ptrs[4] = {(const void *)b->p, (const void *)b->m,
                                    (const void *)b->v, (const void *)&b->meta};
    size_t lens[4] = {count * sizeof(float), count * sizeof(float), count * sizeof(float),
                      sizeof b->meta};
    for (int a = 0; a < 4; a++)
        for (size_t i = 0; i < lens[a]; i++)
            if (ptrs[a][i] != SENTINEL) TEST_FAIL("buffer %d byte %zu was written", a, i);
}

static void assert_same_state(const state *a, const state *b)
{
    size_t n = a->meta.span.count * sizeof(float);
    ASSERT_EQ(b->meta.span.count, a->meta.span.count);
    ASSERT_EQ(b->meta.span.offset, a->meta.span.offset);
    ASSERT(memcmp(&a->meta.cfg, &b->meta.cfg, sizeof a->meta.cfg) == 0);
    ASSERT_EQ(b->meta.step, a->meta.step);
    ASSERT_EQ(b->meta.data_pos.epoch, a->meta.data_pos.epoch);
    ASSERT_EQ(b->meta.data_pos.cursor, a->meta.data_pos.cursor);
    ASSERT(b->meta.rng_state == a->meta.rng_state);
    ASSERT_EQ(b->meta.seed, a->meta.seed);
    ASSERT(memcmp(a->p, b->p, n) == 0);
    ASSERT(memcmp(a->m, b->m, n) == 0);
    ASSERT(memcmp(a->v, b->v, n) == 0);
}

static void ckpt_file(char *buf, size_t cap, const char *name)
{
    snprintf(buf, cap, "%s/ck/%s", test_tmpdir(), name);
}

static const char *ck_dir(void)
{
    static char dir[512];
    snprintf(dir, sizeof dir, "%s/ck", test_tmpdir());
    return dir;
}

static unsigned char *read_all(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    ASSERT(f != NULL);
    fseek(f, 0, SEEK_END);
    *len = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *buf = malloc(*len ? *len : 1);
    ASSERT(buf != NULL);
    ASSERT_EQ(fread(buf, 1, *len, f), *len);
    fclose(f);
    return buf;
}

static void write_all(const char *path, const unsigned char *buf, size_t len)
{
    FILE *f = fopen(path, "wb");
    ASSERT(f != NULL);
    ASSERT_EQ(fwrite(buf, 1, len, f), len);
    ASSERT_EQ(fclose(f), 0);
}

#define ANY_ERROR 1

/* Load the current file expecting failure with `code` (or any failure for ANY_ERROR) and a
 * message containing msg_part; the buffers must stay as they were. */
static void expect_refused(int code, const char *msg_part)
{
    gpt_config cfg = small_cfg();
    gpt_span span = whole();
    state b;
    cirrus_error err = {0};
    buffers_sentinel(&b, span.count);
    int rc = ckpt_load(ck_dir(), &cfg, &span, &b.meta, b.p, b.m, b.v, &err);
    if (code == ANY_ERROR ? rc >= 0 : rc != code) TEST_FAIL("ckpt_load returned %d (%s), want %d", rc, err.msg, code);
    if (msg_part && !strstr(err.msg, msg_part))
        TEST_FAIL("message '%s' lacks '%s'", err.msg, msg_part);
    assert_untouched(&b, span.count);
    state_free(&b);
}

TEST(ckpt_round_trip_bit_exact)
{
    state s, b;
    cirrus_error err = {0};
    gpt_span span = whole();
    state_fill(&s, 1, span);
    /* The directory (two levels) does not exist yet: save creates it. */
    ASSERT_OK(ckpt_save(ck_dir(), &s.meta, s.p, s.m, s.v, &err));
    ckpt_meta m;
    ASSERT_OK(ckpt_read_meta(ck_dir(), &m, &err));
    state_fill(&b, 2, span); /* different contents, same sizes */
    b.meta = m;
    gpt_config cfg = small_cfg();
    ASSERT_OK(ckpt_load(ck_dir(), &cfg, &span, &b.meta, b.p, b.m, b.v, &err));
    assert_same_state(&s, &b);
    /* Without an expected config, meta (from read_meta) gives the buffer size. */
    memset(b.p, 0, span.count * sizeof(float));
    b.meta = m;
    ASSERT_OK(ckpt_load(ck_dir(), NULL, NULL, &b.meta, b.p, b.m, b.v, &err));
    assert_same_state(&s, &b);
    /* Sampling loads parameters only. */
    memset(b.p, 0, span.count * sizeof(float));
    ASSERT_OK(ckpt_load(ck_dir(), &cfg, &span, &b.meta, b.p, NULL, NULL, &err));
    ASSERT(memcmp(s.p, b.p, span.count * sizeof(float)) == 0);
    char path[512];
    struct stat st;
    ckpt_file(path, sizeof path, "cirrus.ckpt.tmp");
    ASSERT(stat(path, &st) != 0); /* no temp file left behind */
    state_free(&s), state_free(&b);
}

TEST(ckpt_stage_span_round_trip)
{
    gpt_span all = whole(), span = {all.count / 3, all.count / 2};
    state s, b;
    cirrus_error err = {0};
    gpt_config cfg = small_cfg();
    state_fill(&s, 5, span);
    ASSERT_OK(ckpt_save(ck_dir(), &s.meta, s.p, s.m, s.v, &err));
    buffers_sentinel(&b, span.count);
    ASSERT_OK(ckpt_load(ck_dir(), &cfg, &span, &b.meta, b.p, b.m, b.v, &err));
    assert_same_state(&s, &b);
    /* The same model but another stage's span is a mismatch, not a silent partial load. */
    state c;
    buffers_sentinel(&c, all.count);
    ASSERT_EQ(ckpt_load(ck_dir(), &cfg, &all, &c.meta, c.p, c.m, c.v, &err), CIRRUS_EMISMATCH);
    assert_untouched(&c, all.count);
    /* A span outside the model is refused at save time. */
    s.meta.span.offset = all.count - 1;
    ASSERT_EQ(ckpt_save(ck_dir(), &s.meta, s.p, s.m, s.v, &err), CIRRUS_EINVAL);
    ASSERT_EQ(ckpt_save(ck_dir(), &s.meta, s.p, NULL, s.v, &err), CIRRUS_EINVAL);
    state_free(&s), state_free(&b), state_free(&c);
}

TEST(ckpt_config_mismatch_leaves_buffers)
{
    state s, b;
    cirrus_error err = {0};
    state_fill(&s, 1, whole());
    ASSERT_OK(ckpt_save(ck_dir(), &s.meta, s.p, s.m, s.v, &err));
    gpt_config other = small_cfg();
    other.n_embd = 32;
    gpt_span span = {0, gpt_num_params(&other)};
    buffers_sentinel(&b, span.count);
    ASSERT_EQ(ckpt_load(ck_dir(), &other, &span, &b.meta, b.p, b.m, b.v, &err),
              CIRRUS_EMISMATCH);
    ASSERT_EQ(err.code, CIRRUS_EMISMATCH);
    if (!strstr(err.msg, "n_embd 16, model has 32")) TEST_FAIL("message: %s", err.msg);
    assert_untouched(&b, span.count);
    /* A difference that leaves the size alone (heads) is caught too. */
    other = small_cfg();
    other.n_head = 4;
    ASSERT_EQ(ckpt_load(ck_dir(), &other, NULL, &b.meta, b.p, b.m, b.v, &err),
              CIRRUS_EMISMATCH);
    ASSERT(strstr(err.msg, "n_head") != NULL);
    assert_untouched(&b, span.count);
    state_free(&s), state_free(&b);
}

static size_t save_state(state *s, uint64_t seed, unsigned char **bytes)
{
    cirrus_error err = {0};
    char path[512];
    size_t len;
    state_fill(s, seed, whole());
    ASSERT_OK(ckpt_save(ck_dir(), &s->meta, s->p, s->m, s->v, &err));
    ckpt_file(path, sizeof path, "cirrus.ckpt");
    *bytes = read_all(path, &len);
    ASSERT_EQ(len, HDR + 12 * s->meta.span.count + 4); /* header, 3 arrays, CRC */
    return len;
}

static void load_ok(const state *want)
{
    gpt_config cfg = small_cfg();
    gpt_span span = whole();
    cirrus_error err = {0};
    state b;
    buffers_sentinel(&b, span.count);
    if (ckpt_load(ck_dir(), &cfg, &span, &b.meta, b.p, b.m, b.v, &err) != 0)
        TEST_FAIL("ckpt_load: %s", err.msg);
    assert_same_state(want, &b);
    state_free(&b);
}

TEST(ckpt_flipped_payload_byte_is_corrupt)
{
    state s;
    unsigned char *orig;
    char path[512];
    size_t len = save_state(&s, 1, &orig), n = s.meta.span.count * 4, payload = HDR;
    ckpt_file(path, sizeof path, "cirrus.ckpt");
    /* The first, a middle and the last byte of each array, and the trailer itself. */
    size_t where[] = {payload, payload + n / 2, payload + n - 1, payload + n,
                      payload + n + 13, payload + 2 * n - 1, payload + 2 * n,
                      payload + 2 * n + 7, payload + 3 * n - 1, len - 4, len - 1};
    for (size_t i = 0; i < sizeof where / sizeof where[0]; i++) {
        orig[where[i]] ^= 0x10;
        write_all(path, orig, len);
        expect_refused(CIRRUS_ECORRUPT, "checksum mismatch");
        orig[where[i]] ^= 0x01; /* a second, different flip of the same byte */
        write_all(path, orig, len);
        expect_refused(CIRRUS_ECORRUPT, "checksum mismatch");
        orig[where[i]] ^= 0x11;
    }
    write_all(path, orig, len);
    load_ok(&s); /* the restored file loads again: the failures above were the flips */
    free(orig);
    state_free(&s);
}

TEST(ckpt_flipped_header_byte_is_refused)
{
    state s;
    unsigned char *orig;
    char path[512];
    size_t len = save_state(&s, 3, &orig);
    ckpt_file(path, sizeof path, "cirrus.ckpt");
    for (size_t i = 0; i < HDR; i++) {
        orig[i] ^= 0x10;
        write_all(path, orig, len);
        expect_refused(ANY_ERROR, "checkpoint");
        orig[i] ^= 0x10;
    }
    /* Fields only the checksum protects are reported as exactly that: step, RNG, seed, the
     * job id's bytes. */
    size_t checksum_only[] = {32, 39, 56, 64, 71, 88, 120, 150};
    for (size_t i = 0; i < sizeof checksum_only / sizeof checksum_only[0]; i++) {
        orig[checksum_only[i]] ^= 0x10;
        write_all(path, orig, len);
        expect_refused(CIRRUS_ECORRUPT, "checksum mismatch");
        orig[checksum_only[i]] ^= 0x10;
    }
    free(orig);
    state_free(&s);
}

TEST(ckpt_truncated_is_refused)
{
    state s;
    unsigned char *orig;
    char path[512];
    size_t len = save_state(&s, 1, &orig);
    ckpt_file(path, sizeof path, "cirrus.ckpt");
    /* Empty, inside the magic, inside the header, inside each array, without the trailer,
     * one byte short. */
    size_t n = s.meta.span.count * 4;
    size_t cuts[] = {0, 5, 10, 40, 87, 88, HDR - 1, HDR, HDR + n / 2, HDR + 2 * n + 3, len - 4,
                     len - 1};
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        write_all(path, orig, cuts[i]);
        expect_refused(CIRRUS_ETRUNC, "truncated");
    }
    /* Bytes after the trailer are refused as well: the header fixes the size. */
    unsigned char *longer = malloc(len + 1);
    memcpy(longer, orig, len);
    longer[len] = 0;
    write_all(path, longer, len + 1);
    expect_refused(CIRRUS_ECORRUPT, "trailing");
    free(longer);
    free(orig);
    state_free(&s);
}

TEST(ckpt_wrong_magic_and_future_version)
{
    state s;
    unsigned char *orig;
    char path[512];
    size_t len = save_state(&s, 1, &orig);
    ckpt_file(path, sizeof path, "cirrus.ckpt");
    ASSERT(memcmp(orig, "CIRRUSCK", 8) == 0);
    ASSERT_EQ(orig[8], CKPT_VERSION); /* version: u32 little-endian after the magic */
    orig[0] = 'X';
    write_all(path, orig, len);
    expect_refused(CIRRUS_ECORRUPT, "magic");
    orig[0] = 'C';
    orig[8] = CKPT_VERSION + 1;
    write_all(path, orig, len);
    expect_refused(CIRRUS_ECORRUPT, "version 2");
    orig[8] = CKPT_VERSION;
    orig[11] = 0x80; /* a version from the far future, and its sign bit set */
    write_all(path, orig, len);
    expect_refused(CIRRUS_ECORRUPT, "version");
    free(orig);
    state_free(&s);
}

TEST(ckpt_missing_is_enoent)
{
    char want[600];
    cirrus_error err = {0};
    ckpt_meta m;
    snprintf(want, sizeof want, "checkpoint %s/cirrus.ckpt: not found", ck_dir());
    expect_refused(CIRRUS_ENOENT, want);
    ASSERT_EQ(ckpt_read_meta(ck_dir(), &m, &err), CIRRUS_ENOENT);
    ASSERT(strstr(err.msg, want) != NULL);
}

/* Save `s` in a child that crashes after `after` bytes of the temp file; it must exit 99. */
static void crashing_save(const state *s, unsigned long long after)
{
    fflush(NULL);
    pid_t pid = fork();
    ASSERT(pid >= 0);
    if (pid == 0) {
        char num[32];
        cirrus_error err = {0};
        snprintf(num, sizeof num, "%llu", after);
        setenv("CIRRUS_CKPT_CRASH_AFTER_BYTES", num, 1);
        ckpt_save(ck_dir(), &s->meta, s->p, s->m, s->v, &err);
        _exit(1); /* the hook did not fire */
    }
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT(WIFEXITED(status));
    ASSERT_EQ(WEXITSTATUS(status), 99);
}

TEST(ckpt_crash_during_save_keeps_old)
{
    state old_s, new_s;
    unsigned char *bytes;
    char tmp[512];
    cirrus_error err = {0};
    struct stat st;
    size_t len = save_state(&old_s, 1, &bytes);
    state_fill(&new_s, 2, whole());
    new_s.meta.step = 999999;
    ckpt_file(tmp, sizeof tmp, "cirrus.ckpt.tmp");
    unsigned long long afters[] = {0, 1, 50, HDR, HDR + 4 * 100, len / 2, len - 4, len - 1, len,
                                   (unsigned long long)len * 10};
    for (size_t i = 0; i < sizeof afters / sizeof afters[0]; i++) {
        crashing_save(&new_s, afters[i]);
        ASSERT_EQ(stat(tmp, &st), 0); /* the crash left its half-written temp file */
        size_t want = afters[i] < len ? (size_t)afters[i] : len;
        ASSERT_EQ(st.st_size, want);
        load_ok(&old_s);
    }
    /* The leftover temp file does not get in the way of the next save. */
    ASSERT_OK(ckpt_save(ck_dir(), &new_s.meta, new_s.p, new_s.m, new_s.v, &err));
    ASSERT(stat(tmp, &st) != 0);
    load_ok(&new_s);
    free(bytes);
    state_free(&old_s), state_free(&new_s);
}

TEST(ckpt_read_meta_before_allocating)
{
    state s;
    unsigned char *bytes;
    cirrus_error err = {0};
    ckpt_meta m;
    save_state(&s, 7, &bytes);
    memset(&m, SENTINEL, sizeof m);
    ASSERT_OK(ckpt_read_meta(ck_dir(), &m, &err));
    ASSERT(memcmp(&m.cfg, &s.meta.cfg, sizeof m.cfg) == 0);
    ASSERT_EQ(m.step, s.meta.step);
    ASSERT_EQ(m.span.count, gpt_num_params(&m.cfg));
    /* With no expected config, a meta that claims other buffer sizes is refused. */
    state b;
    buffers_sentinel(&b, m.span.count);
    b.meta = m;
    b.meta.span.count = m.span.count - 1;
    ASSERT_EQ(ckpt_load(ck_dir(), NULL, NULL, &b.meta, b.p, b.m, b.v, &err),
              CIRRUS_EMISMATCH);
    ASSERT_EQ(b.meta.span.count, m.span.count - 1);
    free(bytes);
    state_free(&s), state_free(&b);
}

/* A load for a resume: the newest complete checkpoint, of this job. */
static int load_newest(const char *job, state *b, char *used, cirrus_error *skipped,
                       cirrus_error *err)
{
    gpt_config cfg = small_cfg();
    buffers_sentinel(b, whole().count);
    return ckpt_load_newest(ck_dir(), &cfg, job, &b->meta, b->p, b->m, b->v, used, 600,
                            skipped, err);
}

TEST(ckpt_job_is_kept_and_checked)
{
    state s, b;
    cirrus_error err = {0}, skipped;
    char used[600], want[700];
    state_fill(&s, 4, whole());
    snprintf(s.meta.job, sizeof s.meta.job, "%s", "job-a");
    ASSERT_OK(ckpt_save(ck_dir(), &s.meta, s.p, s.m, s.v, &err));
    /* Another job's checkpoint: refused, nothing written, the file named. */
    ASSERT_EQ(load_newest("job-b", &b, used, &skipped, &err), CIRRUS_EMISMATCH);
    snprintf(want, sizeof want, "checkpoint %s/cirrus.ckpt belongs to job 'job-a', not to "
             "this job 'job-b'", ck_dir());
    ASSERT_STR_EQ(err.msg, want);
    assert_untouched(&b, whole().count);
    state_free(&b);
    /* This job's, or with no job asked (train --resume): loaded, with its job. */
    ASSERT_OK(load_newest("job-a", &b, used, &skipped, &err));
    assert_same_state(&s, &b);
    ASSERT_STR_EQ(b.meta.job, "job-a");
    ASSERT_STR_EQ(skipped.msg, "");
    state_free(&b);
    ASSERT_OK(load_newest(NULL, &b, used, &skipped, &err));
    state_free(&b);
    /* A job id longer than the header holds is refused when saving. */
    memset(s.meta.job, 'x', sizeof s.meta.job);
    ASSERT_EQ(ckpt_save(ck_dir(), &s.meta, s.p, s.m, s.v, &err), CIRRUS_EINVAL);
    ASSERT(strstr(err.msg, "job id over 63 bytes") != NULL);
    state_free(&s);
}

TEST(ckpt_damaged_newest_falls_back_to_previous)
{
    state s1, s2, b;
    unsigned char *bytes;
    size_t len;
    char path[512], prev[512], used[600], want[700];
    cirrus_error err = {0}, skipped;
    ckpt_file(path, sizeof path, "cirrus.ckpt");
    ckpt_file(prev, sizeof prev, "cirrus.ckpt.prev");
    state_fill(&s1, 5, whole());
    state_fill(&s2, 6, whole());
    s1.meta.seed = s2.meta.seed; /* the same run at two steps */
    ASSERT_OK(ckpt_save(ck_dir(), &s1.meta, s1.p, s1.m, s1.v, &err));
    ASSERT_OK(ckpt_save(ck_dir(), &s2.meta, s2.p, s2.m, s2.v, &err));
    /* The newest is loaded while it is whole. */
    ASSERT_OK(load_newest(NULL, &b, used, &skipped, &err));
    assert_same_state(&s2, &b);
    ASSERT_STR_EQ(used, path);
    state_free(&b);
    /* Damaged (a flipped payload bit): refused, named, and the previous one loaded. */
    bytes = read_all(path, &len);
    bytes[len / 2] ^= 0x04;
    write_all(path, bytes, len);
    ASSERT_OK(load_newest(NULL, &b, used, &skipped, &err));
    assert_same_state(&s1, &b);
    ASSERT_STR_EQ(used, prev);
    snprintf(want, sizeof want, "checkpoint %s: checksum mismatch", path);
    ASSERT_STR_EQ(skipped.msg, want);
    state_free(&b);
    /* Cut short: the same. */
    write_all(path, bytes, len / 3);
    ASSERT_OK(load_newest(NULL, &b, used, &skipped, &err));
    assert_same_state(&s1, &b);
    ASSERT(strstr(skipped.msg, "truncated") != NULL);
    state_free(&b);
    /* Missing (a crash between save's two renames): the previous one, nothing to tell. */
    ASSERT_EQ(unlink(path), 0);
    ASSERT_OK(load_newest(NULL, &b, used, &skipped, &err));
    assert_same_state(&s1, &b);
    ASSERT_STR_EQ(skipped.msg, "");
    state_free(&b);
    /* Both damaged: the previous one's failure, nothing written. */
    write_all(path, bytes, len / 3);
    write_all(prev, bytes, 10);
    ASSERT_EQ(load_newest(NULL, &b, used, &skipped, &err), CIRRUS_ETRUNC);
    ASSERT(strstr(err.msg, prev) != NULL);
    assert_untouched(&b, whole().count);
    state_free(&b);
    /* Neither there: ENOENT, a new run. */
    unlink(path);
    unlink(prev);
    ASSERT_EQ(load_newest(NULL, &b, used, &skipped, &err), CIRRUS_ENOENT);
    state_free(&b);
    free(bytes);
    state_free(&s1), state_free(&s2);
}

TEST(ckpt_newest_of_another_shape_is_not_passed_over)
{
    state s1, b;
    cirrus_error err = {0}, skipped;
    char used[600];
    state_fill(&s1, 7, whole());
    ASSERT_OK(ckpt_save(ck_dir(), &s1.meta, s1.p, s1.m, s1.v, &err));
    ASSERT_OK(ckpt_save(ck_dir(), &s1.meta, s1.p, s1.m, s1.v, &err));
    gpt_config other = small_cfg();
    other.n_embd = 32;
    buffers_sentinel(&b, gpt_num_params(&other));
    /* A whole file of another model is that, not damage: no fallback to the previous. */
    ASSERT_EQ(ckpt_load_newest(ck_dir(), &other, NULL, &b.meta, b.p, b.m, b.v, used,
                               sizeof used, &skipped, &err),
              CIRRUS_EMISMATCH);
    ASSERT(strstr(err.msg, "has n_embd 16, model has 32") != NULL);
    ASSERT_STR_EQ(skipped.msg, "");
    assert_untouched(&b, gpt_num_params(&other));
    state_free(&b);
    state_free(&s1);
}
