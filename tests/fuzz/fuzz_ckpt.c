/* fuzz_ckpt: the checkpoint loader (trainer/ckpt/checkpoint.c), header and payload, fed
 * checkpoint files as a restarted trainer finds them on disk.
 *
 * Input: the bytes of DIR/cirrus.ckpt. Invariants:
 *   a rejected file changes nothing: ckpt_read_meta leaves *meta as it was, ckpt_load
 *     leaves the three buffers and *meta as they were (filled with a marker beforehand),
 *     also when the caller expects another config or span;
 *   an accepted header is a valid config whose span lies inside its parameter buffer, and
 *     the file is exactly as long as the header says (so nothing is read past it);
 *   decode(encode(x)) == x: a loaded checkpoint saved again is the same file, byte for byte.
 */
#include "fuzz.h"

#include "../../trainer/ckpt/checkpoint.h"

#define MARK 0xa5

static int all_marked(const void *p, size_t n)
{
    const unsigned char *c = p;
    for (size_t i = 0; i < n; i++)
        if (c[i] != MARK) return 0;
    return 1;
}

static float *marked_floats(size_t n)
{
    float *p = malloc((n ? n : 1) * sizeof(float));
    if (!p) abort();
    memset(p, MARK, (n ? n : 1) * sizeof(float));
    return p;
}

/* ckpt_load with expectations; on failure nothing may change. Returns its rc. */
static int load_checked(const char *dir, const gpt_config *expect, const gpt_span *span,
                        size_t count, ckpt_meta *out, float **bufs)
{
    ckpt_meta meta;
    memset(&meta, MARK, sizeof meta);
    if (!expect) meta.span = *span; /* the span the buffers were sized for */
    ckpt_meta before = meta;
    float *p = marked_floats(count), *m = marked_floats(count), *v = marked_floats(count);
    cirrus_error err;
    int rc = ckpt_load(dir, expect, expect ? span : NULL, &meta, p, m, v, &err);
    if (rc != 0) {
        FUZZ_CHECK(!memcmp(&meta, &before, sizeof meta), "a refused checkpoint changed meta (%s)", err.msg);
        FUZZ_CHECK(all_marked(p, count * sizeof(float)) && all_marked(m, count * sizeof(float)) &&
                       all_marked(v, count * sizeof(float)),
                   "a refused checkpoint changed the buffers (%s)", err.msg);
        free(p);
        free(m);
        free(v);
        return rc;
    }
    *out = meta;
    bufs[0] = p;
    bufs[1] = m;
    bufs[2] = v;
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *dir = fuzz_scratch_dir();
    fuzz_write_file(dir, CKPT_FILE, data, size);

    ckpt_meta meta, untouched;
    memset(&meta, MARK, sizeof meta);
    untouched = meta;
    cirrus_error err;
    int rc = ckpt_read_meta(dir, &meta, &err);
    if (rc != 0) {
        FUZZ_CHECK(!memcmp(&meta, &untouched, sizeof meta), "a refused header changed meta (%s)", err.msg);
        /* A loader that expects the smallest model must refuse it too, touching nothing. */
        gpt_config tiny = {1, 4, 1, 4, GPT_VOCAB};
        gpt_span span = {0, gpt_num_params(&tiny)};
        ckpt_meta got;
        float *bufs[3];
        FUZZ_CHECK(load_checked(dir, &tiny, &span, span.count, &got, bufs) != 0,
                   "ckpt_load accepted what ckpt_read_meta refused");
        return 0;
    }
    FUZZ_CHECK(gpt_config_validate(&meta.cfg, &err) == 0, "accepted an invalid config: %s", err.msg);
    size_t n_params = gpt_num_params(&meta.cfg);
    FUZZ_CHECK(meta.span.count > 0 && meta.span.offset <= n_params &&
                   meta.span.count <= n_params - meta.span.offset,
               "span [%zu, +%zu) outside %zu parameters", meta.span.offset, meta.span.count, n_params);
    /* The header (152 bytes in format 2, with the job id), three arrays, the checksum. */
    FUZZ_CHECK(size == 152 + 12 * (uint64_t)meta.span.count + 4, "file of %zu bytes accepted for %zu floats",
               size, meta.span.count);
    size_t count = meta.span.count;

    /* Expecting another span: refused, nothing changed. */
    gpt_span other = {meta.span.offset, count - 1};
    ckpt_meta got;
    float *bufs[3];
    if (count > 1) {
        int r = load_checked(dir, &meta.cfg, &other, count, &got, bufs);
        FUZZ_CHECK(r != 0, "loaded a span the caller did not expect");
    }
    /* Loading as sized by ckpt_read_meta. */
    if (load_checked(dir, NULL, &meta.span, count, &got, bufs) != 0) return 0;
    FUZZ_CHECK(!memcmp(&got.cfg, &meta.cfg, sizeof got.cfg) && got.span.count == count &&
                   got.span.offset == meta.span.offset && got.step == meta.step &&
                   got.seed == meta.seed && got.rng_state == meta.rng_state,
               "ckpt_load's meta differs from ckpt_read_meta's");
    /* Saved again: the same bytes. */
    char out_dir[8192];
    snprintf(out_dir, sizeof out_dir, "%s/again", dir);
    FUZZ_CHECK(ckpt_save(out_dir, &got, bufs[0], bufs[1], bufs[2], &err) == 0, "re-save failed: %s", err.msg);
    size_t len;
    unsigned char *again = fuzz_read_file(out_dir, CKPT_FILE, &len);
    FUZZ_CHECK(again && len == size && !memcmp(again, data, size), "re-saved checkpoint differs");
    free(again);
    for (int a = 0; a < 3; a++) free(bufs[a]);
    return 0;
}
