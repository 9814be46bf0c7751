/* cirrus-trainer: the Cirrus training binary.
 *
 *   cirrus-trainer train   train a model in one process
 *   cirrus-trainer sample  generate text from a checkpoint
 *   cirrus-trainer bench   training throughput vs the sgemm ceiling
 *   cirrus-trainer bench-collective   all-reduce bandwidth of the TCP ring
 *
 * Exit codes: 0 success, 1 runtime failure, 2 bad input (flags, files, checkpoints).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/log.h"
#include "bench.h"
#include "bench_collective.h"
#include "blas_kernel.h"
#include "ckpt/checkpoint.h"
#include "flags.h"
#include "model/gpt.h"
#include "sample.h"
#include "train.h"

#define EXIT_BAD_INPUT 2
#define NFLAGS(f) ((int)(sizeof(f) / sizeof((f)[0])))

static const char *default_data(void)
{
    const char *env = getenv("CIRRUS_CORPUS");
    return env && *env ? env : "build/data/kjv.txt";
}

static int fail_input(const char *cmd, const cirrus_error *err)
{
    fprintf(stderr, "cirrus-trainer %s: %s\n", cmd, err->msg);
    return EXIT_BAD_INPUT;
}

/* Model shape flags shared by train and bench: a preset, then optional overrides. */
typedef struct model_flags {
    const char *preset;
    int layers, width, heads, context;
} model_flags;

#define MODEL_FLAGS(mf)                                                                       \
    {"model", FLAG_STR, &(mf).preset, 0, 0, "model preset: tiny, small, medium", 0},          \
        {"layers", FLAG_INT, &(mf).layers, 1, 1024, "override the preset's layer count", 0},  \
        {"width", FLAG_INT, &(mf).width, 1, 16384, "override the preset's width", 0},         \
        {"heads", FLAG_INT, &(mf).heads, 1, 16384, "override the preset's head count", 0},    \
        {"context", FLAG_INT, &(mf).context, 1, 65536, "override the preset's context", 0}

static int model_from_flags(const model_flags *mf, gpt_config *cfg, cirrus_error *err)
{
    int rc = gpt_config_preset(cfg, mf->preset, err);
    if (rc) return rc;
    if (mf->layers) cfg->n_layer = mf->layers;
    if (mf->width) cfg->n_embd = mf->width;
    if (mf->heads) cfg->n_head = mf->heads;
    if (mf->context) cfg->seq_len = mf->context;
    return gpt_config_validate(cfg, err);
}

static int cmd_train(int argc, char **argv)
{
    train_options o;
    train_options_defaults(&o);
    o.data = default_data();
    model_flags mf = {.preset = "tiny"};
    int help = 0;
    flag_spec flags[] = {
        MODEL_FLAGS(mf),
        {"steps", FLAG_INT, &o.steps, 1, 1e9, "optimizer steps (default 1000)", 0},
        {"batch", FLAG_INT, &o.batch, 1, 65536, "sequences per step (default 8)", 0},
        {"seq", FLAG_INT, &o.seq, 1, 65536, "tokens per sequence (default: the context)", 0},
        {"lr", FLAG_FLOAT, &o.lr, 1e-9, 10, "peak learning rate (default 3e-3)", 0},
        {"warmup", FLAG_INT, &o.warmup, 0, 1e9, "warmup steps (default 5% of steps)", 0},
        {"data", FLAG_STR, &o.data, 0, 0, "training text file (default: the KJV corpus)", 0},
        {"ckpt", FLAG_STR, &o.ckpt_dir, 0, 0, "checkpoint directory", 0},
        {"ckpt-every", FLAG_INT, &o.ckpt_every, 1, 1e9, "steps between checkpoints", 0},
        {"resume", FLAG_BOOL, &o.resume, 0, 0, "continue from the checkpoint in --ckpt", 0},
        {"seed", FLAG_U64, &o.seed, 0, 0, "random seed (default 1337)", 0},
        {"log-every", FLAG_INT, &o.log_every, 1, 1e9, "steps between progress lines", 0},
        {"eval-every", FLAG_INT, &o.eval_every, 1, 1e9, "steps between validation runs", 0},
        {"metrics", FLAG_STR, &o.metrics, 0, 0, "append per-step JSON lines to this file", 0},
        {"eval-batches", FLAG_INT, &o.eval_batches, 1, 1e6, "validation batches", 0},
        {"json", FLAG_BOOL, &o.json, 0, 0, "one JSON object per line on stdout", 0},
        {"help", FLAG_BOOL, &help, 0, 0, "show this help", 0},
    };
    cirrus_error err = {0};
    if (flags_parse(flags, NFLAGS(flags), argc, argv, &err)) return fail_input("train", &err);
    if (help) {
        fprintf(stderr, "usage: cirrus-trainer train [flags]\n");
        flags_usage(flags, NFLAGS(flags));
        return 0;
    }
    if (model_from_flags(&mf, &o.model, &err)) return fail_input("train", &err);
    if (o.resume && !o.ckpt_dir) {
        cirrus_fail(&err, CIRRUS_EINVAL, "--resume needs --ckpt DIR");
        return fail_input("train", &err);
    }
    if (!o.json)
        printf("cirrus: training %d layers x %d wide (%d heads, %zu params) on %s, "
               "%d steps of %d x %d tokens\n",
               o.model.n_layer, o.model.n_embd, o.model.n_head, gpt_num_params(&o.model),
               o.data, o.steps, o.batch, o.seq ? o.seq : o.model.seq_len);
    train_result res = {0};
    int rc = train_run(&o, &res, &err);
    if (rc == CIRRUS_ENOMEM || rc == CIRRUS_EIO) {
        fprintf(stderr, "cirrus-trainer train: %s\n", err.msg);
        return 1;
    }
    if (rc) return fail_input("train", &err);
    return 0;
}

static int cmd_sample(int argc, char **argv)
{
    const char *dir = NULL, *prompt = "";
    int tokens = 200, help = 0;
    float temperature = 0.8f;
    uint64_t seed = 1;
    flag_spec flags[] = {
        {"ckpt", FLAG_STR, &dir, 0, 0, "checkpoint directory (required)", 0},
        {"prompt", FLAG_STR, &prompt, 0, 0, "text to continue", 0},
        {"tokens", FLAG_INT, &tokens, 0, 1e6, "bytes to generate (default 200)", 0},
        {"temperature", FLAG_FLOAT, &temperature, 0, 100, "0 = greedy (default 0.8)", 0},
        {"seed", FLAG_U64, &seed, 0, 0, "sampling seed", 0},
        {"help", FLAG_BOOL, &help, 0, 0, "show this help", 0},
    };
    cirrus_error err = {0};
    if (flags_parse(flags, NFLAGS(flags), argc, argv, &err)) return fail_input("sample", &err);
    if (help) {
        fprintf(stderr, "usage: cirrus-trainer sample --ckpt DIR [flags]\n");
        flags_usage(flags, NFLAGS(flags));
        return 0;
    }
    if (!dir) {
        cirrus_fail(&err, CIRRUS_EINVAL, "--ckpt DIR is required");
        return fail_input("sample", &err);
    }
    ckpt_meta meta;
    if (ckpt_read_meta(dir, &meta, &err)) return fail_input("sample", &err);
    gpt_model m;
    if (gpt_model_create(&m, &meta.cfg, &err)) return fail_input("sample", &err);
    gpt_span all = {0, m.n_params};
    if (ckpt_load(dir, &meta.cfg, &all, &meta, m.params, NULL, NULL, &err)) {
        gpt_model_destroy(&m);
        return fail_input("sample", &err);
    }
    int rc = sample_generate(&m, prompt, tokens, temperature, seed, stdout, &err);
    gpt_model_destroy(&m);
    if (rc) {
        fprintf(stderr, "cirrus-trainer sample: %s\n", err.msg);
        return 1;
    }
    return 0;
}

static int cmd_bench(int argc, char **argv)
{
    model_flags mf = {.preset = "small"};
    int batch = 8, seq = 0, steps = 10, json = 0, help = 0;
    flag_spec flags[] = {
        MODEL_FLAGS(mf),
        {"batch", FLAG_INT, &batch, 1, 65536, "sequences per step (default 8)", 0},
        {"seq", FLAG_INT, &seq, 1, 65536, "tokens per sequence (default: the context)", 0},
        {"steps", FLAG_INT, &steps, 1, 1e6, "timed steps (default 10)", 0},
        {"json", FLAG_BOOL, &json, 0, 0, "print one JSON object", 0},
        {"help", FLAG_BOOL, &help, 0, 0, "show this help", 0},
    };
    cirrus_error err = {0};
    if (flags_parse(flags, NFLAGS(flags), argc, argv, &err)) return fail_input("bench", &err);
    if (help) {
        fprintf(stderr, "usage: cirrus-trainer bench [flags]\n");
        flags_usage(flags, NFLAGS(flags));
        return 0;
    }
    gpt_config cfg;
    if (model_from_flags(&mf, &cfg, &err)) return fail_input("bench", &err);
    if (!seq) seq = cfg.seq_len;
    if (seq > cfg.seq_len) {
        cirrus_fail(&err, CIRRUS_EINVAL, "--seq %d exceeds the context %d", seq, cfg.seq_len);
        return fail_input("bench", &err);
    }
    bench_result r;
    if (bench_train(&cfg, batch, seq, steps, &r, &err)) {
        fprintf(stderr, "cirrus-trainer bench: %s\n", err.msg);
        return 1;
    }
    double ratio = r.sgemm_gflops > 0 ? r.model_gflops / r.sgemm_gflops : 0.0;
    if (json)
        printf("{\"blas_kernel\":\"%s\",\"layers\":%d,\"width\":%d,\"heads\":%d,\"batch\":%d,\"seq\":%d,"
               "\"params\":%zu,\"tokens_per_s\":%.1f,\"model_gflops\":%.2f,"
               "\"sgemm_gflops\":%.2f,\"ratio\":%.3f}\n",
               blas_kernel_name(), cfg.n_layer, cfg.n_embd, cfg.n_head, batch, seq, gpt_num_params(&cfg),
               r.tokens_per_s, r.model_gflops, r.sgemm_gflops, ratio);
    else
        printf("model %dL x %d (%d heads, %zu params), batch %d x %d: %.0f tokens/s, "
               "%.1f model GFLOP/s; sgemm on the same shapes %.1f GFLOP/s (%s); ratio %.2f\n",
               cfg.n_layer, cfg.n_embd, cfg.n_head, gpt_num_params(&cfg), batch, seq,
               r.tokens_per_s, r.model_gflops, r.sgemm_gflops, blas_kernel_name(), ratio);
    if (!json)
        printf("  per step: forward %.1f ms, backward %.1f ms, optimizer %.1f ms\n",
               r.phase_ms[0], r.phase_ms[1], r.phase_ms[2]);
    return 0;
}

static int cmd_bench_collective(int argc, char **argv)
{
    int ranks = 2, min_mb = 1, max_mb = 256, chunk_kb = 1024, json = 0, help = 0;
    flag_spec flags[] = {
        {"ranks", FLAG_INT, &ranks, 2, 64, "ranks, one process each (default 2)", 0},
        {"min-mb", FLAG_INT, &min_mb, 1, 4096, "smallest message in MiB (default 1)", 0},
        {"max-mb", FLAG_INT, &max_mb, 1, 4096, "largest message in MiB (default 256)", 0},
        {"chunk-kb", FLAG_INT, &chunk_kb, 4, 65536, "ring chunk in KiB (default 1024)", 0},
        {"json", FLAG_BOOL, &json, 0, 0, "one JSON object per size", 0},
        {"help", FLAG_BOOL, &help, 0, 0, "show this help", 0},
    };
    cirrus_error err = {0};
    if (flags_parse(flags, NFLAGS(flags), argc, argv, &err))
        return fail_input("bench-collective", &err);
    if (help) {
        fprintf(stderr, "usage: cirrus-trainer bench-collective [flags]\n");
        flags_usage(flags, NFLAGS(flags));
        return 0;
    }
    bench_collective_options o = {.world = ranks, .min_bytes = (size_t)min_mb << 20,
                                  .max_bytes = (size_t)max_mb << 20,
                                  .chunk_bytes = (size_t)chunk_kb << 10, .json = json};
    int rc = bench_collective(&o, &err);
    if (rc == CIRRUS_EINVAL) return fail_input("bench-collective", &err);
    if (rc) {
        fprintf(stderr, "cirrus-trainer bench-collective: %s\n", err.msg);
        return 1;
    }
    return 0;
}

static void usage(void)
{
    fprintf(stderr,
            "usage: cirrus-trainer COMMAND [flags]\n"
            "commands:\n"
            "  train   train a model in one process\n"
            "  sample  generate text from a checkpoint\n"
            "  bench   training throughput vs the sgemm ceiling\n"
            "  bench-collective  all-reduce bandwidth of the TCP ring\n"
            "Run 'cirrus-trainer COMMAND --help' for the flags of a command.\n");
}

int main(int argc, char **argv)
{
    blas_kernel_ensure(argv);
    log_set_role("trainer");
    if (argc < 2) {
        fprintf(stderr, "cirrus-trainer: no command given (train, sample, bench; see "
                        "'cirrus-trainer help')\n");
        return EXIT_BAD_INPUT;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "train") == 0) return cmd_train(argc - 2, argv + 2);
    if (strcmp(cmd, "sample") == 0) return cmd_sample(argc - 2, argv + 2);
    if (strcmp(cmd, "bench") == 0) return cmd_bench(argc - 2, argv + 2);
    if (strcmp(cmd, "bench-collective") == 0) return cmd_bench_collective(argc - 2, argv + 2);
    if (strcmp(cmd, "help") == 0 || strcmp(cmd, "--help") == 0) {
        usage();
        return 0;
    }
    fprintf(stderr, "cirrus-trainer: unknown command '%s' (train, sample, bench)\n", cmd);
    return EXIT_BAD_INPUT;
}
