#include "checkpoint.h"

#include "../../common/le.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

/* Byte layout of the fixed header (all little-endian; see checkpoint.h):
 *    0  magic "CIRRUSCK"           8 bytes
 *    8  format version             u32
 *   12  n_layer n_embd n_head seq_len vocab   u32 each
 *   32  step                       u64
 *   40  data epoch, data cursor    u64 each
 *   56  rng_state                  u64
 *   64  seed                       u64
 *   72  span offset, span count    u64 each
 *   88  job id                     64 bytes, NUL-padded (at most CKPT_JOB_MAX bytes)
 *  152  payload: params, adam_m, adam_v as IEEE-754 binary32 bit patterns
 * Fields are encoded one by one so the file does not depend on the host's struct padding or
 * byte order. */
#define CKPT_MAGIC "CIRRUSCK"
#define CKPT_HDR_SIZE 152
#define CKPT_JOB_OFF 88
#define CKPT_TRAILER_SIZE 4
#define CKPT_CHUNK_FLOATS 16384 /* 64 KiB staging buffer for encoding and decoding */
#define CKPT_CRASH_ENV "CIRRUS_CKPT_CRASH_AFTER_BYTES"

_Static_assert(sizeof(float) == 4, "checkpoints store floats as 32-bit IEEE-754");

static void ckpt_encode_header(uint8_t *h, const ckpt_meta *m)
{
    const int cfg[5] = {m->cfg.n_layer, m->cfg.n_embd, m->cfg.n_head, m->cfg.seq_len,
                        m->cfg.vocab};
    const uint64_t u64[7] = {m->step, m->data_pos.epoch, m->data_pos.cursor, m->rng_state,
                             m->seed, m->span.offset, m->span.count};
    memcpy(h, CKPT_MAGIC, 8);
    le_put(h + 8, CKPT_VERSION, 4);
    for (int i = 0; i < 5; i++) le_put(h + 12 + 4 * i, (uint32_t)cfg[i], 4);
    for (int i = 0; i < 7; i++) le_put(h + 32 + 8 * i, u64[i], 8);
    memset(h + CKPT_JOB_OFF, 0, CKPT_JOB_MAX + 1);
    memcpy(h + CKPT_JOB_OFF, m->job, strnlen(m->job, CKPT_JOB_MAX));
}

/* Config fields are stored unsigned; anything above INT_MAX cannot come from a valid
 * config, so it is mapped to -1 and rejected by gpt_config_validate(). */
static int ckpt_get_int(const uint8_t *p)
{
    uint64_t v = le_get(p, 4);
    return v > (uint64_t)INT_MAX ? -1 : (int)v;
}

/* The config must be valid and the span must lie within its parameter buffer; that bounds
 * every allocation and read that follows by the size of a model the config describes.
 * `code` says whose fault a failure is: the caller's (save) or the file's (load). */
static int ckpt_check_layout(const gpt_config *cfg, uint64_t off, uint64_t count,
                             const char *path, int code, cirrus_error *err)
{
    cirrus_error cerr = {0};
    if (gpt_config_validate(cfg, &cerr) != 0)
        return cirrus_fail(err, code, "checkpoint %s: invalid model config: %s", path,
                           cerr.msg);
    uint64_t n_params = (uint64_t)gpt_num_params(cfg);
    if (count == 0 || off > n_params || count > n_params - off)
        return cirrus_fail(err, code,
                           "checkpoint %s: span [%llu, +%llu) is outside the model's %llu "
                           "parameters",
                           path, (unsigned long long)off, (unsigned long long)count,
                           (unsigned long long)n_params);
    return 0;
}

/* Decode and check a header already known to carry the magic and our version. */
static int ckpt_decode_header(const uint8_t *h, const char *path, ckpt_meta *m,
                              cirrus_error *err)
{
    uint64_t u[7];
    for (int i = 0; i < 7; i++) u[i] = le_get(h + 32 + 8 * i, 8);
    memset(m, 0, sizeof *m);
    m->cfg = (gpt_config){ckpt_get_int(h + 12), ckpt_get_int(h + 16), ckpt_get_int(h + 20),
                          ckpt_get_int(h + 24), ckpt_get_int(h + 28)};
    m->step = u[0];
    m->data_pos = (data_position){u[1], u[2]};
    m->rng_state = u[3];
    m->seed = u[4];
    int rc = ckpt_check_layout(&m->cfg, u[5], u[6], path, CIRRUS_ECORRUPT, err);
    m->span = (gpt_span){(size_t)u[5], (size_t)u[6]};
    /* The job field is NUL-padded: its last byte is always 0, so it is a string. */
    memcpy(m->job, h + CKPT_JOB_OFF, CKPT_JOB_MAX + 1);
    if (!rc && m->job[CKPT_JOB_MAX] != '\0')
        rc = cirrus_fail(err, CIRRUS_ECORRUPT, "checkpoint %s: job id not terminated", path);
    return rc;
}

static uint64_t ckpt_file_size(size_t count)
{
    return CKPT_HDR_SIZE + 3 * (uint64_t)count * sizeof(float) + CKPT_TRAILER_SIZE;
}

static int ckpt_path(char *buf, size_t cap, const char *dir, const char *name,
                     cirrus_error *err)
{
    int n = snprintf(buf, cap, "%s/%s", dir, name);
    if (n < 0 || (size_t)n >= cap)
        return cirrus_fail(err, CIRRUS_EINVAL, "checkpoint directory %s: path too long", dir);
    return 0;
}

/* ---- saving ---- */

/* Writes to the temp file, counting bytes for the crash hook. TEST HOOK: when the
 * environment sets CIRRUS_CKPT_CRASH_AFTER_BYTES=N, ckpt_save writes exactly N bytes of the
 * temp file (all of it if N is larger), flushes them to the kernel and calls _exit(99)
 * before the rename, simulating a crash mid-save. Only tests set it. */
typedef struct ckpt_writer {
    FILE *f;
    uint64_t written;
    int crash_armed;
    uint64_t crash_at;
} ckpt_writer;

static void ckpt_crash_now(ckpt_writer *w)
{
    fflush(w->f);
    _exit(99);
}

static int ckpt_write(ckpt_writer *w, const void *p, size_t n)
{
    if (w->crash_armed && w->written + n >= w->crash_at) {
        size_t part = (size_t)(w->crash_at - w->written);
        if (part) (void)!fwrite(p, 1, part, w->f);
        ckpt_crash_now(w);
    }
    if (fwrite(p, 1, n, w->f) != n) return -1;
    w->written += n;
    return 0;
}

/* Encode one float array little-endian, feeding the CRC with exactly the bytes written. */
static int ckpt_write_floats(ckpt_writer *w, const float *src, size_t count, uLong *crc,
                             uint8_t *stage)
{
    for (size_t i = 0; i < count; i += CKPT_CHUNK_FLOATS) {
        size_t n = count - i < CKPT_CHUNK_FLOATS ? count - i : CKPT_CHUNK_FLOATS;
        for (size_t j = 0; j < n; j++) {
            uint32_t bits;
            memcpy(&bits, &src[i + j], 4);
            le_put(stage + 4 * j, bits, 4);
        }
        *crc = crc32(*crc, stage, (uInt)(4 * n));
        if (ckpt_write(w, stage, 4 * n) != 0) return -1;
    }
    return 0;
}

/* mkdir -p: the trainer's --ckpt-dir may name a directory tree that does not exist yet. */
static int ckpt_mkdirs(const char *dir, cirrus_error *err)
{
    char buf[PATH_MAX];
    size_t len = strlen(dir);
    if (len == 0 || len >= sizeof buf)
        return cirrus_fail(err, CIRRUS_EINVAL, "checkpoint directory '%s': bad path", dir);
    memcpy(buf, dir, len + 1);
    for (size_t i = 1; i <= len; i++) {
        if (buf[i] != '/' && buf[i] != '\0') continue;
        char c = buf[i];
        buf[i] = '\0';
        if (mkdir(buf, 0777) != 0 && errno != EEXIST)
            return cirrus_fail(err, CIRRUS_EIO, "checkpoint directory %s: cannot create: %s",
                               buf, strerror(errno));
        buf[i] = c;
    }
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        return cirrus_fail(err, CIRRUS_EIO, "checkpoint directory %s: not a directory", dir);
    return 0;
}

int ckpt_save(const char *dir, const ckpt_meta *meta, const float *params,
              const float *adam_m, const float *adam_v, cirrus_error *err)
{
    int rc = 0, fd = -1, renamed = 0;
    char path[PATH_MAX], tmp[PATH_MAX], prev[PATH_MAX];
    uint8_t *stage = NULL;
    ckpt_writer w = {0};
    if (!dir || !meta || !params || !adam_m || !adam_v)
        return cirrus_fail(err, CIRRUS_EINVAL, "checkpoint save: missing argument");
    if ((rc = ckpt_path(path, sizeof path, dir, CKPT_FILE, err)) != 0 ||
        (rc = ckpt_path(tmp, sizeof tmp, dir, CKPT_FILE ".tmp", err)) != 0)
        return rc;
    if ((rc = ckpt_check_layout(&meta->cfg, meta->span.offset, meta->span.count, path,
                                CIRRUS_EINVAL, err)) != 0)
        return rc;
    if (strnlen(meta->job, sizeof meta->job) > CKPT_JOB_MAX)
        return cirrus_fail(err, CIRRUS_EINVAL, "checkpoint %s: job id over %d bytes", path,
                           CKPT_JOB_MAX);
    if ((rc = ckpt_path(prev, sizeof prev, dir, CKPT_PREV_FILE, err)) != 0) return rc;
    if ((rc = ckpt_mkdirs(dir, err)) != 0) return rc;

    const char *crash = getenv(CKPT_CRASH_ENV);
    if (crash && *crash) {
        char *end;
        unsigned long long n = strtoull(crash, &end, 10);
        w.crash_armed = *end == '\0';
        w.crash_at = n;
    }
    stage = malloc(4 * CKPT_CHUNK_FLOATS);
    if (!stage) {
        rc = cirrus_fail(err, CIRRUS_ENOMEM, "checkpoint %s: out of memory", path);
        goto out;
    }
    /* O_TRUNC: a temp file left by a crashed save is simply overwritten. */
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0 || !(w.f = fdopen(fd, "wb"))) {
        rc = cirrus_fail(err, CIRRUS_EIO, "checkpoint %s: cannot create: %s", tmp,
                         strerror(errno));
        goto out;
    }
    fd = -1; /* owned by w.f now */
    uint8_t hdr[CKPT_HDR_SIZE], trailer[CKPT_TRAILER_SIZE];
    ckpt_encode_header(hdr, meta);
    uLong crc = crc32(crc32(0L, Z_NULL, 0), hdr, CKPT_HDR_SIZE);
    const float *arrays[3] = {params, adam_m, adam_v};
    int bad = ckpt_write(&w, hdr, CKPT_HDR_SIZE) != 0;
    for (int a = 0; a < 3 && !bad; a++)
        bad = ckpt_write_floats(&w, arrays[a], meta->span.count, &crc, stage) != 0;
    le_put(trailer, (uint32_t)crc, 4);
    if (!bad) bad = ckpt_write(&w, trailer, CKPT_TRAILER_SIZE) != 0;
    if (!bad && w.crash_armed) ckpt_crash_now(&w); /* N was past the end of the file */
    /* The data must be on disk before the rename makes it the checkpoint; otherwise a
     * power cut could leave a renamed but empty file. */
    if (bad || fflush(w.f) != 0 || fsync(fileno(w.f)) != 0) {
        rc = cirrus_fail(err, CIRRUS_EIO, "checkpoint %s: write failed: %s", tmp,
                         strerror(errno));
        goto out;
    }
    FILE *f = w.f;
    w.f = NULL;
    /* The old checkpoint becomes the previous one (replacing the one before): if the new
     * one is damaged later (a disk, a partial copy), a resume falls back to it. A crash
     * between the two renames leaves only the previous and the temp file, and the
     * previous is loaded (ckpt_load_newest). */
    if (fclose(f) != 0 || (rename(path, prev) != 0 && errno != ENOENT) ||
        rename(tmp, path) != 0) {
        rc = cirrus_fail(err, CIRRUS_EIO, "checkpoint %s: cannot replace with %s: %s", path,
                         tmp, strerror(errno));
        goto out;
    }
    renamed = 1;
    /* fsync the directory so the rename itself survives a crash. Some filesystems cannot
     * fsync a directory (EINVAL); the rename is still atomic there, so that is not fatal. */
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0 || (fsync(dfd) != 0 && errno != EINVAL))
        rc = cirrus_fail(err, CIRRUS_EIO, "checkpoint directory %s: fsync failed: %s", dir,
                         strerror(errno));
    if (dfd >= 0) close(dfd);
out:
    if (w.f) fclose(w.f);
    if (fd >= 0) close(fd);
    if (rc != 0 && !renamed) unlink(tmp);
    free(stage);
    return rc;
}

/* ---- loading ---- */

/* Open DIR/name, read, check and decode its header into m (raw bytes in hdr, for the
 * checksum) and check the file size against the span the header declares. On success
 * *out is positioned at the payload. */
static int ckpt_open(const char *dir, const char *name, char *path, size_t cap, FILE **out,
                     ckpt_meta *m, uint8_t *hdr, cirrus_error *err)
{
    int rc = 0;
    FILE *f = NULL;
    struct stat st;
    *out = NULL;
    if (!dir) return cirrus_fail(err, CIRRUS_EINVAL, "checkpoint: no directory given");
    if ((rc = ckpt_path(path, cap, dir, name, err)) != 0) return rc;
    f = fopen(path, "rb");
    if (!f) {
        if (errno == ENOENT)
            return cirrus_fail(err, CIRRUS_ENOENT, "checkpoint %s: not found", path);
        return cirrus_fail(err, CIRRUS_EIO, "checkpoint %s: cannot open: %s", path,
                           strerror(errno));
    }
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
        rc = cirrus_fail(err, CIRRUS_EIO, "checkpoint %s: not a regular file", path);
        goto out;
    }
    uint64_t size = (uint64_t)st.st_size;
    size_t got = fread(hdr, 1, CKPT_HDR_SIZE, f);
    if (got < 8 || memcmp(hdr, CKPT_MAGIC, 8) != 0) {
        rc = got < 8 ? cirrus_fail(err, CIRRUS_ETRUNC, "checkpoint %s: truncated (%llu bytes)",
                                   path, (unsigned long long)size)
                     : cirrus_fail(err, CIRRUS_ECORRUPT,
                                   "checkpoint %s: not a Cirrus checkpoint (bad magic)", path);
        goto out;
    }
    if (got >= 12 && le_get(hdr + 8, 4) != CKPT_VERSION) {
        rc = cirrus_fail(err, CIRRUS_ECORRUPT,
                         "checkpoint %s: format version %u is not supported (this build "
                         "reads version %d)",
                         path, (unsigned)le_get(hdr + 8, 4), CKPT_VERSION);
        goto out;
    }
    if (got < CKPT_HDR_SIZE) {
        rc = cirrus_fail(err, CIRRUS_ETRUNC, "checkpoint %s: truncated inside the header "
                         "(%llu bytes)", path, (unsigned long long)size);
        goto out;
    }
    if ((rc = ckpt_decode_header(hdr, path, m, err)) != 0) goto out;
    uint64_t want = ckpt_file_size(m->span.count);
    if (size != want) {
        rc = cirrus_fail(err, size < want ? CIRRUS_ETRUNC : CIRRUS_ECORRUPT,
                         "checkpoint %s: %s (%llu bytes, header implies %llu)", path,
                         size < want ? "truncated" : "trailing bytes after the trailer",
                         (unsigned long long)size, (unsigned long long)want);
        goto out;
    }
    *out = f;
    f = NULL;
out:
    if (f) fclose(f);
    return rc;
}

int ckpt_read_meta(const char *dir, ckpt_meta *meta, cirrus_error *err)
{
    char path[PATH_MAX];
    uint8_t hdr[CKPT_HDR_SIZE];
    ckpt_meta m;
    FILE *f = NULL;
    if (!meta) return cirrus_fail(err, CIRRUS_EINVAL, "checkpoint: no meta to fill");
    /* Header only: the checksum is verified by ckpt_load, which reads the whole file. */
    int rc = ckpt_open(dir, CKPT_FILE, path, sizeof path, &f, &m, hdr, err);
    if (f) fclose(f);
    if (rc == 0) *meta = m;
    return rc;
}

/* First config field that differs, for a message the user can act on. */
static int ckpt_config_diff(const char *path, const gpt_config *have, const gpt_config *want,
                            cirrus_error *err)
{
#define CKPT_CMP(field)                                                                    \
    if (have->field != want->field)                                                        \
        return cirrus_fail(err, CIRRUS_EMISMATCH, "checkpoint %s has " #field " %d, model " \
                           "has %d", path, have->field, want->field);
    CKPT_CMP(n_layer) CKPT_CMP(n_embd) CKPT_CMP(n_head) CKPT_CMP(seq_len) CKPT_CMP(vocab)
#undef CKPT_CMP
    return 0;
}

/* ckpt_load of DIR/name; a job that is not NULL must be the one the file names. */
static int ckpt_load_file(const char *dir, const char *name, const gpt_config *expect,
                          const gpt_span *expect_span, const char *job, ckpt_meta *meta,
                          float *params, float *adam_m, float *adam_v, cirrus_error *err)
{
    int rc = 0, mismatch = 0;
    char path[PATH_MAX];
    uint8_t hdr[CKPT_HDR_SIZE], *stage = NULL;
    float *tmp[3] = {NULL, NULL, NULL};
    float *dst[3] = {params, adam_m, adam_v};
    cirrus_error why = {0};
    ckpt_meta m;
    FILE *f = NULL;
    if (!params || (!meta && !expect))
        return cirrus_fail(err, CIRRUS_EINVAL, "checkpoint load: missing argument");
    /* The span the caller's buffers were sized for: expect_span if given, else the whole
     * expected model, else meta->span as filled in by ckpt_read_meta(). */
    gpt_span want = expect_span ? *expect_span
                    : expect    ? (gpt_span){0, gpt_num_params(expect)}
                                : meta->span;
    if ((rc = ckpt_open(dir, name, path, sizeof path, &f, &m, hdr, err)) != 0) goto out;
    if (expect) mismatch = ckpt_config_diff(path, &m.cfg, expect, &why) != 0;
    if (!mismatch && job && strcmp(m.job, job) != 0)
        mismatch = cirrus_fail(&why, CIRRUS_EMISMATCH, "checkpoint %s belongs to job '%s', "
                               "not to this job '%s'", path, m.job, job) != 0;
    if (!mismatch && (m.span.offset != want.offset || m.span.count != want.count))
        mismatch = cirrus_fail(&why, CIRRUS_EMISMATCH,
                               "checkpoint %s stores parameters [%zu, +%zu), expected "
                               "[%zu, +%zu)",
                               path, m.span.offset, m.span.count, want.offset, want.count) != 0;
    /* On a mismatch the payload is still read (into nothing) so that a damaged header is
     * reported as corruption rather than as a confusing config difference. */
    size_t count = m.span.count;
    int nomem = !(stage = malloc(4 * CKPT_CHUNK_FLOATS));
    for (int a = 0; a < 3 && !nomem && !mismatch; a++)
        nomem = dst[a] && !(tmp[a] = malloc(count * sizeof(float)));
    if (nomem) {
        rc = cirrus_fail(err, CIRRUS_ENOMEM, "checkpoint %s: cannot allocate %zu floats",
                         path, count);
        goto out;
    }
    uLong crc = crc32(crc32(0L, Z_NULL, 0), hdr, CKPT_HDR_SIZE);
    for (int a = 0; a < 3; a++) {
        for (size_t i = 0; i < count; i += CKPT_CHUNK_FLOATS) {
            size_t n = count - i < CKPT_CHUNK_FLOATS ? count - i : CKPT_CHUNK_FLOATS;
            if (fread(stage, 4, n, f) != n) {
                rc = cirrus_fail(err, CIRRUS_EIO, "checkpoint %s: read failed", path);
                goto out;
            }
            crc = crc32(crc, stage, (uInt)(4 * n));
            for (size_t j = 0; tmp[a] && j < n; j++) {
                uint32_t bits = (uint32_t)le_get(stage + 4 * j, 4);
                memcpy(&tmp[a][i + j], &bits, 4);
            }
        }
    }
    uint8_t trailer[CKPT_TRAILER_SIZE];
    if (fread(trailer, 1, CKPT_TRAILER_SIZE, f) != CKPT_TRAILER_SIZE) {
        rc = cirrus_fail(err, CIRRUS_EIO, "checkpoint %s: read failed", path);
        goto out;
    }
    if (le_get(trailer, 4) != (uint32_t)crc) {
        rc = cirrus_fail(err, CIRRUS_ECORRUPT, "checkpoint %s: checksum mismatch", path);
        goto out;
    }
    if (mismatch) {
        rc = cirrus_fail(err, why.code, "%s", why.msg);
        goto out;
    }
    /* Every check passed: only now do the caller's buffers change. */
    for (int a = 0; a < 3; a++)
        if (dst[a]) memcpy(dst[a], tmp[a], count * sizeof(float));
    if (meta) *meta = m;
out:
    for (int a = 0; a < 3; a++) free(tmp[a]);
    free(stage);
    if (f) fclose(f);
    return rc;
}

int ckpt_load(const char *dir, const gpt_config *expect, const gpt_span *expect_span,
              ckpt_meta *meta, float *params, float *adam_m, float *adam_v,
              cirrus_error *err)
{
    return ckpt_load_file(dir, CKPT_FILE, expect, expect_span, NULL, meta, params, adam_m,
                          adam_v, err);
}

/* A file that cannot be what it claims (cut short, bits changed, unreadable): its
 * predecessor may still be whole. A mismatch is a whole file of something else. */
static int ckpt_damaged(int rc)
{
    return rc == CIRRUS_ECORRUPT || rc == CIRRUS_ETRUNC || rc == CIRRUS_EIO;
}

int ckpt_load_newest(const char *dir, const gpt_config *expect, const char *job,
                     ckpt_meta *meta, float *params, float *adam_m, float *adam_v,
                     char *used, size_t used_cap, cirrus_error *skipped, cirrus_error *err)
{
    if (skipped) *skipped = (cirrus_error){0};
    if (!expect) return cirrus_fail(err, CIRRUS_EINVAL, "checkpoint load: no model given");
    const char *names[2] = {CKPT_FILE, CKPT_PREV_FILE};
    cirrus_error newest = {0};
    int rc = 0;
    for (int i = 0; i < 2; i++) {
        cirrus_error e = {0};
        rc = ckpt_load_file(dir, names[i], expect, NULL, job, meta, params, adam_m, adam_v,
                            &e);
        if (rc == 0) {
            if (used) snprintf(used, used_cap, "%s/%s", dir, names[i]);
            return 0;
        }
        if (i == 0) newest = e;
        if (i == 0 && rc == CIRRUS_ENOENT) continue; /* a crash between the renames */
        if (i == 0 && ckpt_damaged(rc)) {
            if (skipped) *skipped = e;
            continue;
        }
        /* The previous one missing: the newest's failure is the one to tell. */
        if (i == 1 && rc == CIRRUS_ENOENT) return cirrus_fail(err, newest.code, "%s", newest.msg);
        return cirrus_fail(err, e.code, "%s", e.msg);
    }
    return rc;
}
