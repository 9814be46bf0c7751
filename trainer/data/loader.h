/* loader: a byte corpus split into train/validation, read as (input, target) windows.
 *
 * A split of length n is cut into windows of T+1 bytes starting every T bytes. Each epoch
 * visits the train windows in an order shuffled by (seed, epoch); validation windows are
 * read in file order. One *global* batch is world*B consecutive windows of that order, and
 * rank r of world w reads windows [r*B, (r+1)*B) of it, so the ranks read disjoint data and
 * together read exactly what a single process with batch world*B would. The position
 * (epoch, cursor in windows) can be reported and restored, so a resumed run reads the same
 * bytes an uninterrupted one would.
 */
#ifndef CIRRUS_LOADER_H
#define CIRRUS_LOADER_H

#include <stddef.h>
#include <stdint.h>

#include "../../common/cerr.h"

typedef struct data_corpus {
    uint8_t *bytes;
    size_t len;       /* whole file */
    size_t train_len; /* [0, train_len) trains, [train_len, len) validates */
} data_corpus;

enum data_split { DATA_TRAIN = 0, DATA_VAL = 1 };

typedef struct data_position {
    uint64_t epoch;
    uint64_t cursor; /* windows of the epoch's order consumed by all ranks together */
} data_position;

typedef struct data_loader data_loader;

/* Read a whole text file; the last val_fraction (0 < f < 1) of it is the validation split.
 * Fails with a message naming the path if it is missing, unreadable or too small. */
int data_corpus_load(data_corpus *c, const char *path, double val_fraction,
                     cirrus_error *err);
void data_corpus_free(data_corpus *c);

/* A loader over one split for batch B x T, as rank `rank` of `world`. Fails if the split
 * holds fewer than world*B windows. */
int data_loader_new(data_loader **out, const data_corpus *c, enum data_split split,
                       int B, int T, int rank, int world, uint64_t seed, cirrus_error *err);
void data_loader_free(data_loader *l);

/* Fill inputs and targets (B*T each, row-major (B,T)) with this rank's next batch. */
void data_loader_next(data_loader *l, int32_t *inputs, int32_t *targets);

data_position data_loader_tell(const data_loader *l);
int data_loader_seek(data_loader *l, data_position pos, cirrus_error *err);
/* Number of global batches in one epoch of this split. */
uint64_t data_loader_batches_per_epoch(const data_loader *l);

#endif
