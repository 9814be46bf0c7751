/* cirrus-trainer: the Cirrus training binary.
 *
 *   cirrus-trainer train   train a model in one process
 *   cirrus-trainer sample  generate text from a checkpoint
 *   cirrus-trainer bench   training throughput vs the sgemm ceiling
 *   cirrus-trainer bench-collective   all-reduce bandwidth of the TCP ring
 *   cirrus-trainer stage | client | local | gateway   SWARM roles (cmd/roles.h)
 *
 * Exit codes: 0 success, 1 runtime failure, 2 bad input (flags, files, checkpoints).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../common/crash.h"
#include "../../common/log.h"
#include "../bench.h"
#include "../bench_collective.h"
#include "../model/cpu/blas_kernel.h"
#include "../model/cpu/denormals.h"
#include "../ckpt/checkpoint.h"
#include "cli.h"
#include "../../common/flags.h"
#include "../model/gpt.h"
#include "../sample.h"
#include "roles.h"
#include "wan_roles.h"
#include "../train.h"

static int cmd_train(int argc, char **argv)
{
    train_options o;
    train_options_defaults(&o);
    o.data = cli_default_data();
    model_flags mf = {.preset = "tiny"};
    const char *backend = "cpu";
    int help = 0;
    flag_spec flags[] = {
        MODEL_FLAGS(mf),
        TRAIN_FLAGS(o),
        CKPT_FLAGS(o),
        BACKEND_FLAG(backend),
        {"resume", FLAG_BOOL, &o.resume, 0, 0, "continue from the checkpoint in --ckpt", 0},
        {"help", FLAG_BOOL, &help, 0, 0, "show this help", 0},
    };
    cirrus_error err = {0};
    if (flags_parse(flags, NFLAGS(flags), argc, argv, &err)) return cli_fail_input("train", &err);
    if (help) {
        fprintf(stderr, "usage: cirrus-trainer train [flags]\n");
        flags_usage(flags, NFLAGS(flags));
        return 0;
    }
    if (cli_model_from_flags(&mf, &o.model, &err)) return cli_fail_input("train", &err);
    if (o.resume && !o.ckpt_dir) {
        cirrus_fail(&err, CIRRUS_EINVAL, "--resume needs --ckpt DIR");
        return cli_fail_input("train", &err);
    }
    if (cli_select_backend(backend, &err)) return cli_fail_input("train", &err);
    return cli_run_training("train", &o, NULL);
}

static int cmd_sample(int argc, char **argv)
{
    const char *dir = NULL, *prompt = "", *backend = "cpu";
    int tokens = 200, help = 0;
    float temperature = 0.8f;
    uint64_t seed = 1;
    flag_spec flags[] = {
        {"ckpt", FLAG_STR, &dir, 0, 0, "checkpoint directory (required)", 0},
        {"prompt", FLAG_STR, &prompt, 0, 0, "text to continue", 0},
        {"tokens", FLAG_INT, &tokens, 0, 1e6, "bytes to generate (default 200)", 0},
        {"temperature", FLAG_FLOAT, &temperature, 0, 100, "0 = greedy (default 0.8)", 0},
        {"seed", FLAG_U64, &seed, 0, 0, "sampling seed", 0},
        BACKEND_FLAG(backend),
        {"help", FLAG_BOOL, &help, 0, 0, "show this help", 0},
    };
    cirrus_error err = {0};
    if (flags_parse(flags, NFLAGS(flags), argc, argv, &err)) return cli_fail_input("sample", &err);
    if (help) {
        fprintf(stderr, "usage: cirrus-trainer sample --ckpt DIR [flags]\n");
        flags_usage(flags, NFLAGS(flags));
        return 0;
    }
    if (!dir) {
        cirrus_fail(&err, CIRRUS_EINVAL, "--ckpt DIR is required");
        return cli_fail_input("sample", &err);
    }
    if (cli_select_backend(backend, &err)) return cli_fail_input("sample", &err);
    ckpt_meta meta;
    if (ckpt_read_meta(dir, &meta, &err)) return cli_fail_input("sample", &err);
    gpt_model m;
    if (gpt_model_init(&m, &meta.cfg, &err)) return cli_fail_input("sample", &err);
    gpt_span all = {0, m.n_params};
    if (ckpt_load(dir, &meta.cfg, &all, &meta, m.params, NULL, NULL, &err)) {
        gpt_model_free(&m);
        return cli_fail_input("sample", &err);
    }
    int rc = sample_generate(&m, prompt, tokens, temperature, seed, stdout, &err);
    gpt_model_free(&m);
    if (rc) {
        fprintf(stderr, "cirrus-trainer sample: %s\n", err.msg);
        return 1;
    }
    return 0;
}

static int cmd_bench(int argc, char **argv)
{
    model_flags mf = {.preset = "small"};
    const char *backend = "cpu";
    int batch = 8, seq = 0, steps = 10, json = 0, help = 0;
    flag_spec flags[] = {
        MODEL_FLAGS(mf),
        {"batch", FLAG_INT, &batch, 1, 65536, "sequences per step (default 8)", 0},
        {"seq", FLAG_INT, &seq, 1, 65536, "tokens per sequence (default: the context)", 0},
        {"steps", FLAG_INT, &steps, 1, 1e6, "timed steps (default 10)", 0},
        {"json", FLAG_BOOL, &json, 0, 0, "print one JSON object", 0},
        BACKEND_FLAG(backend),
        {"help", FLAG_BOOL, &help, 0, 0, "show this help", 0},
    };
    cirrus_error err = {0};
    if (flags_parse(flags, NFLAGS(flags), argc, argv, &err)) return cli_fail_input("bench", &err);
    if (help) {
        fprintf(stderr, "usage: cirrus-trainer bench [flags]\n");
        flags_usage(flags, NFLAGS(flags));
        return 0;
    }
    gpt_config cfg;
    if (cli_model_from_flags(&mf, &cfg, &err)) return cli_fail_input("bench", &err);
    if (cli_select_backend(backend, &err)) return cli_fail_input("bench", &err);
    /* The ceiling's library: OpenBLAS's kernel on the CPU, cuBLAS on the GPU. */
    const char *blas = strcmp(backend, "cpu") == 0 ? blas_kernel_name() : "cuBLAS";
    if (!seq) seq = cfg.seq_len;
    if (seq > cfg.seq_len) {
        cirrus_fail(&err, CIRRUS_EINVAL, "--seq %d exceeds the context %d", seq, cfg.seq_len);
        return cli_fail_input("bench", &err);
    }
    bench_result r;
    if (bench_train(&cfg, batch, seq, steps, &r, &err)) {
        fprintf(stderr, "cirrus-trainer bench: %s\n", err.msg);
        return 1;
    }
    double ratio = r.sgemm_gflops > 0 ? r.model_gflops / r.sgemm_gflops : 0.0;
    if (json)
        printf("{\"backend\":\"%s\",\"blas_kernel\":\"%s\",\"layers\":%d,\"width\":%d,"
               "\"heads\":%d,\"batch\":%d,\"seq\":%d,"
               "\"params\":%zu,\"tokens_per_s\":%.1f,\"model_gflops\":%.2f,"
               "\"sgemm_gflops\":%.2f,\"tiled_sgemm_gflops\":%.2f,\"ratio\":%.3f}\n",
               backend, blas, cfg.n_layer, cfg.n_embd, cfg.n_head, batch, seq, gpt_num_params(&cfg),
               r.tokens_per_s, r.model_gflops, r.sgemm_gflops, r.tiled_gflops, ratio);
    else
        printf("model %dL x %d (%d heads, %zu params), batch %d x %d: %.0f tokens/s, "
               "%.1f model GFLOP/s; sgemm on the same shapes %.1f GFLOP/s (%s), in fixed tiles "
               "%.1f; ratio %.2f\n",
               cfg.n_layer, cfg.n_embd, cfg.n_head, gpt_num_params(&cfg), batch, seq,
               r.tokens_per_s, r.model_gflops, r.sgemm_gflops, blas,
               r.tiled_gflops, ratio);
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
        return cli_fail_input("bench-collective", &err);
    if (help) {
        fprintf(stderr, "usage: cirrus-trainer bench-collective [flags]\n");
        flags_usage(flags, NFLAGS(flags));
        return 0;
    }
    bench_collective_options o = {.world = ranks, .min_bytes = (size_t)min_mb << 20,
                                  .max_bytes = (size_t)max_mb << 20,
                                  .chunk_bytes = (size_t)chunk_kb << 10, .json = json};
    int rc = bench_collective(&o, &err);
    if (rc == CIRRUS_EINVAL) return cli_fail_input("bench-collective", &err);
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
            "  stage   serve layers of the model to pipeline clients (SWARM peer)\n"
            "  client  train through a pipeline of stage peers\n"
            "  local   a pipeline region on loopback: stage processes and a client\n"
            "  gateway the region's gateway: its coordinator (membership, /status, /metrics)\n"
            "          and, with --sync-every, outer steps with the other regions' gateways\n"
            "  certs   a job's CA and its regions' gateway certificates, as files\n"
            "Run 'cirrus-trainer COMMAND --help' for the flags of a command.\n");
}

int main(int argc, char **argv)
{
    blas_kernel_ensure(argv);
    log_set_role("trainer");
    if (argc < 2) {
        fprintf(stderr, "cirrus-trainer: no command given (train, sample, local, ...; see "
                        "'cirrus-trainer help')\n");
        return EXIT_BAD_INPUT;
    }
    const char *cmd = argv[1];
    /* The commands that run the model's kernels flush subnormals (denormals.h: they made
     * GEMMs ever slower as training went on). The gateway's codecs and outer optimizer,
     * the client's merges and the certificates keep IEEE arithmetic, for whose edge cases
     * they are specified and tested (tests/unit/test_codec.c, test_wan_codec.c). */
    if (!strcmp(cmd, "train") || !strcmp(cmd, "stage") || !strcmp(cmd, "bench") ||
        !strcmp(cmd, "sample"))
        cpu_flush_denormals();
#ifndef __SANITIZE_ADDRESS__ /* the sanitizers report crashes their own way */
    static char what[64];
    snprintf(what, sizeof what, "cirrus-trainer %s", cmd);
    crash_handler_install(what);
#endif
    if (strcmp(cmd, "train") == 0) return cmd_train(argc - 2, argv + 2);
    if (strcmp(cmd, "sample") == 0) return cmd_sample(argc - 2, argv + 2);
    if (strcmp(cmd, "bench") == 0) return cmd_bench(argc - 2, argv + 2);
    if (strcmp(cmd, "bench-collective") == 0) return cmd_bench_collective(argc - 2, argv + 2);
    if (strcmp(cmd, "stage") == 0) return roles_cmd_stage(argc - 2, argv + 2);
    if (strcmp(cmd, "client") == 0) return roles_cmd_client(argc - 2, argv + 2);
    if (strcmp(cmd, "local") == 0) return roles_cmd_local(argc - 2, argv + 2);
    if (strcmp(cmd, "gateway") == 0) return roles_cmd_gateway(argc - 2, argv + 2);
    if (strcmp(cmd, "certs") == 0) return roles_cmd_certs(argc - 2, argv + 2);
    if (strcmp(cmd, "help") == 0 || strcmp(cmd, "--help") == 0) {
        usage();
        return 0;
    }
    fprintf(stderr, "cirrus-trainer: unknown command '%s' (train, sample, bench)\n", cmd);
    return EXIT_BAD_INPUT;
}
