#include "loader.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../../common/rng.h"

struct data_loader {
    const uint8_t *base; /* first byte of the split; borrowed from the corpus */
    size_t n_windows;    /* windows of T+1 bytes starting every T bytes */
    int B, T, rank, world;
    int shuffle;         /* train splits are shuffled per epoch, validation is not */
    uint64_t seed;
    uint64_t epoch, cursor;
    uint64_t order_epoch; /* epoch that `order` currently holds */
    size_t *order;        /* window visiting order of order_epoch (NULL when !shuffle) */
};

/* The epoch's order: a Fisher-Yates shuffle seeded by (seed, epoch) alone, so any epoch's
 * order can be rebuilt from scratch after a seek. */
static void loader_build_order(data_loader *l, uint64_t epoch)
{
    size_t n = l->n_windows;
    for (size_t i = 0; i < n; i++) l->order[i] = i;
    rng_state r;
    rng_seed(&r, rng_derive(l->seed, epoch));
    for (size_t i = n - 1; i > 0; i--) {
        size_t j = (size_t)rng_below(&r, (uint64_t)i + 1);
        size_t t = l->order[i];
        l->order[i] = l->order[j];
        l->order[j] = t;
    }
    l->order_epoch = epoch;
}

/* Move to the next epoch when the rest of this one cannot fill a global batch, so that
 * tell() always names the position of the batch that will really be read next. */
static void loader_settle(data_loader *l)
{
    uint64_t global = (uint64_t)l->world * (uint64_t)l->B;
    if (l->n_windows - l->cursor < global) {
        l->epoch++;
        l->cursor = 0;
    }
    if (l->shuffle && l->order_epoch != l->epoch) loader_build_order(l, l->epoch);
}

int data_corpus_load(data_corpus *c, const char *path, double val_fraction,
                     cirrus_error *err)
{
    int rc = 0;
    FILE *f = NULL;
    uint8_t *bytes = NULL;
    if (!c || !path) return cirrus_fail(err, CIRRUS_EINVAL, "corpus: no path given");
    memset(c, 0, sizeof *c);
    /* Written as a negated range so that NaN is rejected too. */
    if (!(val_fraction > 0.0 && val_fraction < 1.0)) {
        rc = cirrus_fail(err, CIRRUS_EINVAL,
                         "corpus %s: validation fraction %g is not in (0, 1)", path,
                         val_fraction);
        goto out;
    }
    f = fopen(path, "rb");
    if (!f) {
        int e = errno;
        if (e == ENOENT)
            rc = cirrus_fail(err, CIRRUS_ENOENT, "corpus %s: no such file", path);
        else
            rc = cirrus_fail(err, CIRRUS_EIO, "corpus %s: cannot open: %s", path,
                             strerror(e));
        goto out;
    }
    /* fstat, not fseek/ftell: on a directory the latter "succeed" with a size of 2^63. */
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
        rc = cirrus_fail(err, CIRRUS_EIO, "corpus %s: not a regular file", path);
        goto out;
    }
    size_t len = (size_t)st.st_size;
    if (len == 0) {
        rc = cirrus_fail(err, CIRRUS_EINVAL, "corpus %s: file is empty", path);
        goto out;
    }
    size_t val_len = (size_t)((double)len * val_fraction);
    /* Each split needs at least one window of 2 bytes (T = 1) to be usable at all. */
    if (val_len < 2 || len - val_len < 2) {
        rc = cirrus_fail(err, CIRRUS_EINVAL,
                         "corpus %s: %zu bytes is too small to split with validation "
                         "fraction %g",
                         path, len, val_fraction);
        goto out;
    }
    bytes = malloc(len);
    if (!bytes) {
        rc = cirrus_fail(err, CIRRUS_ENOMEM, "corpus %s: cannot allocate %zu bytes", path,
                         len);
        goto out;
    }
    if (fread(bytes, 1, len, f) != len) {
        rc = cirrus_fail(err, CIRRUS_EIO, "corpus %s: read failed or file changed size",
                         path);
        goto out;
    }
    c->bytes = bytes;
    c->len = len;
    c->train_len = len - val_len;
    bytes = NULL;
out:
    free(bytes);
    if (f) fclose(f);
    return rc;
}

void data_corpus_free(data_corpus *c)
{
    if (!c) return;
    free(c->bytes);
    memset(c, 0, sizeof *c);
}

int data_loader_new(data_loader **out, const data_corpus *c, enum data_split split,
                       int B, int T, int rank, int world, uint64_t seed, cirrus_error *err)
{
    int rc = 0;
    data_loader *l = NULL;
    if (!out) return cirrus_fail(err, CIRRUS_EINVAL, "loader: no output handle");
    *out = NULL;
    if (!c || !c->bytes || c->train_len > c->len) {
        rc = cirrus_fail(err, CIRRUS_EINVAL, "loader: corpus is not loaded");
        goto out;
    }
    if (split != DATA_TRAIN && split != DATA_VAL) {
        rc = cirrus_fail(err, CIRRUS_EINVAL, "loader: unknown split %d", (int)split);
        goto out;
    }
    if (B <= 0 || T <= 0) {
        rc = cirrus_fail(err, CIRRUS_EINVAL, "loader: batch %d x context %d must be positive",
                         B, T);
        goto out;
    }
    if (world <= 0 || rank < 0 || rank >= world) {
        rc = cirrus_fail(err, CIRRUS_EINVAL, "loader: rank %d is not in a world of %d", rank,
                         world);
        goto out;
    }
    size_t base = split == DATA_TRAIN ? 0 : c->train_len;
    size_t n = split == DATA_TRAIN ? c->train_len : c->len - c->train_len;
    /* Windows start at 0, T, 2T, ... and need T+1 bytes: k*T + T + 1 <= n. */
    size_t n_windows = n > 0 ? (n - 1) / (size_t)T : 0;
    uint64_t global = (uint64_t)world * (uint64_t)B;
    if ((uint64_t)n_windows < global) {
        rc = cirrus_fail(err, CIRRUS_EINVAL,
                         "loader: %s split of %zu bytes holds %zu windows of %d+1 bytes, "
                         "fewer than world %d x batch %d",
                         split == DATA_TRAIN ? "train" : "validation", n, n_windows, T,
                         world, B);
        goto out;
    }
    l = calloc(1, sizeof *l);
    if (!l) {
        rc = cirrus_fail(err, CIRRUS_ENOMEM, "loader: out of memory");
        goto out;
    }
    l->base = c->bytes + base;
    l->n_windows = n_windows;
    l->B = B;
    l->T = T;
    l->rank = rank;
    l->world = world;
    l->seed = seed;
    l->shuffle = split == DATA_TRAIN;
    if (l->shuffle) {
        if (n_windows > SIZE_MAX / sizeof *l->order ||
            !(l->order = malloc(n_windows * sizeof *l->order))) {
            rc = cirrus_fail(err, CIRRUS_ENOMEM, "loader: cannot allocate order of %zu windows",
                             n_windows);
            goto out;
        }
        loader_build_order(l, 0);
    }
    *out = l;
    l = NULL;
out:
    data_loader_free(l);
    return rc;
}

void data_loader_free(data_loader *l)
{
    if (!l) return;
    free(l->order);
    free(l);
}

void data_loader_next(data_loader *l, int32_t *inputs, int32_t *targets)
{
    int B = l->B, T = l->T;
    uint64_t first = l->cursor + (uint64_t)l->rank * (uint64_t)B;
    for (int b = 0; b < B; b++) {
        size_t k = (size_t)first + (size_t)b;
        size_t w = l->shuffle ? l->order[k] : k;
        const uint8_t *p = l->base + w * (size_t)T;
        int32_t *in = inputs + (size_t)b * (size_t)T;
        int32_t *tg = targets + (size_t)b * (size_t)T;
        for (int t = 0; t < T; t++) {
            in[t] = p[t];
            tg[t] = p[t + 1];
        }
    }
    /* Every rank advances by the whole global batch: the cursor counts all ranks' windows. */
    l->cursor += (uint64_t)l->world * (uint64_t)B;
    loader_settle(l);
}

data_position data_loader_tell(const data_loader *l)
{
    data_position pos = {l->epoch, l->cursor};
    return pos;
}

int data_loader_seek(data_loader *l, data_position pos, cirrus_error *err)
{
    if (!l) return cirrus_fail(err, CIRRUS_EINVAL, "loader: seek on no loader");
    if (pos.cursor > (uint64_t)l->n_windows)
        return cirrus_fail(err, CIRRUS_EINVAL,
                           "loader: position cursor %llu is past the %zu windows of an epoch",
                           (unsigned long long)pos.cursor, l->n_windows);
    if (pos.epoch == UINT64_MAX)
        return cirrus_fail(err, CIRRUS_EINVAL, "loader: position epoch %llu is out of range",
                           (unsigned long long)pos.epoch);
    /* A cursor that is not a multiple of world*B is allowed: a run may resume with another
     * world size, and the cursor counts windows, not batches. */
    l->epoch = pos.epoch;
    l->cursor = pos.cursor;
    loader_settle(l);
    return 0;
}

uint64_t data_loader_batches_per_epoch(const data_loader *l)
{
    return (uint64_t)l->n_windows / ((uint64_t)l->world * (uint64_t)l->B);
}
