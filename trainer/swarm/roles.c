/* roles: the SWARM subcommands of cirrus-trainer.
 *
 *   stage   serve layers [l0, l1) of the model to pipeline clients
 *   client  train through a pipeline of stage peers
 *   local   a whole region on loopback: one stage peer process per stage, and a client
 */
#include "roles.h"

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../../common/log.h"
#include "../cli.h"
#include "../net/conn.h"
#include "../optim/adamw.h"
#include "pipeline.h"
#include "stage_peer.h"
#include "stage_proto.h"

#define PIPE_TIMEOUT_MS 60000

static volatile sig_atomic_t stop_requested;

static void on_signal(int sig)
{
    (void)sig;
    stop_requested = 1;
}

static int parse_layers(const char *text, int *l0, int *l1)
{
    char *end;
    long a = strtol(text, &end, 10);
    if (end == text || *end != ':') return CIRRUS_EINVAL;
    const char *second = end + 1;
    long b = strtol(second, &end, 10);
    if (end == second || *end || a < 0 || b <= a || b > 1024) return CIRRUS_EINVAL;
    *l0 = (int)a;
    *l1 = (int)b;
    return 0;
}

int roles_cmd_stage(int argc, char **argv)
{
    model_flags mf = {.preset = "tiny"};
    const char *job = "cirrus", *listen_addr = "127.0.0.1:0", *layers = NULL;
    int listen_fd = -1, batch = 8, seq = 0, help = 0;
    uint64_t seed = 1337;
    flag_spec flags[] = {
        MODEL_FLAGS(mf),
        {"job", FLAG_STR, &job, 0, 0, "job id; clients of other jobs are refused", 0},
        {"serve", FLAG_STR, &layers, 0, 0, "layers served, L0:L1 (required)", 0},
        {"listen", FLAG_STR, &listen_addr, 0, 0, "HOST:PORT to serve on", 0},
        {"listen-fd", FLAG_INT, &listen_fd, 0, 65535, "serve on an inherited socket", 0},
        {"batch", FLAG_INT, &batch, 1, 65536, "largest microbatch (sequences)", 0},
        {"seq", FLAG_INT, &seq, 1, 65536, "largest sequence (default: the context)", 0},
        {"seed", FLAG_U64, &seed, 0, 0, "the job's seed (initial weights)", 0},
        {"help", FLAG_BOOL, &help, 0, 0, "show this help", 0},
    };
    cirrus_error err = {0};
    if (flags_parse(flags, NFLAGS(flags), argc, argv, &err)) return cli_fail_input("stage", &err);
    if (help) {
        fprintf(stderr, "usage: cirrus-trainer stage --serve L0:L1 [flags]\n");
        flags_usage(flags, NFLAGS(flags));
        return 0;
    }
    stage_peer_options o = {.job_id = job, .max_B = batch, .seed = seed};
    if (cli_model_from_flags(&mf, &o.model, &err)) return cli_fail_input("stage", &err);
    if (!layers || parse_layers(layers, &o.l0, &o.l1) || o.l1 > o.model.n_layer) {
        cirrus_fail(&err, CIRRUS_EINVAL, "--serve must be L0:L1 with 0 <= L0 < L1 <= %d",
                    o.model.n_layer);
        return cli_fail_input("stage", &err);
    }
    o.max_T = seq ? seq : o.model.seq_len;
    if (o.max_T > o.model.seq_len) {
        cirrus_fail(&err, CIRRUS_EINVAL, "--seq %d exceeds the context %d", o.max_T,
                    o.model.seq_len);
        return cli_fail_input("stage", &err);
    }
    o.adam = adamw_defaults(0.0f, 1);
    char role[64];
    snprintf(role, sizeof role, "stage %d:%d", o.l0, o.l1);
    log_set_role(role);
    if (listen_fd >= 0) {
        o.listen_fd = listen_fd;
    } else {
        char host[256];
        const char *colon = strrchr(listen_addr, ':');
        int port = colon ? atoi(colon + 1) : -1;
        if (!colon || (size_t)(colon - listen_addr) >= sizeof host || port < 0 || port > 65535) {
            cirrus_fail(&err, CIRRUS_EINVAL, "--listen must be HOST:PORT, got '%s'",
                        listen_addr);
            return cli_fail_input("stage", &err);
        }
        memcpy(host, listen_addr, (size_t)(colon - listen_addr));
        host[colon - listen_addr] = '\0';
        int bound;
        if (net_listen(host, port, &o.listen_fd, &bound, &err)) return cli_fail_input("stage", &err);
        log_info("listening on %s:%d", host, bound);
    }
    signal(SIGTERM, on_signal);
    signal(SIGINT, on_signal);
    signal(SIGPIPE, SIG_IGN);
    int rc = stage_peer_run(&o, &stop_requested, &err);
    close(o.listen_fd);
    if (rc) {
        fprintf(stderr, "cirrus-trainer stage: %s\n", err.msg);
        return 1;
    }
    return 0;
}

/* ---- the client: the training loop of train.c, with the model on the stage peers ---- */

static int pipe_step(void *ctx, uint64_t id, int B, int T, const int32_t *x, const int32_t *y,
                     float lr, uint64_t step, float *loss, cirrus_error *err)
{
    int rc = pipeline_microbatch(ctx, id, B, T, x, y, loss, err);
    return rc ? rc : pipeline_step(ctx, lr, 1.0f, step, err);
}

static int pipe_eval(void *ctx, int B, int T, const int32_t *x, const int32_t *y, float *loss,
                     cirrus_error *err)
{
    return pipeline_eval(ctx, B, T, x, y, loss, err);
}

static int parse_codec(const char *name, int *codec, cirrus_error *err)
{
    if (strcmp(name, "none") == 0)
        *codec = STAGE_CODEC_NONE;
    else if (strcmp(name, "q8") == 0)
        *codec = STAGE_CODEC_Q8;
    else
        return cirrus_fail(err, CIRRUS_EINVAL, "--act-compress must be none or q8, got '%s'",
                           name);
    return 0;
}

/* Train through stage peers at addrs[0..n). */
static int run_client(const char *cmd, train_options *o, const char *job, int n,
                      const char *const *addrs, int codec)
{
    cirrus_error err = {0};
    pipeline *p = NULL;
    const int T = o->seq ? o->seq : o->model.seq_len;
    if (pipeline_connect(&p, job, n, addrs, &o->model, o->batch, T, codec, PIPE_TIMEOUT_MS,
                         &err)) {
        fprintf(stderr, "cirrus-trainer %s: %s\n", cmd, err.msg);
        return 1;
    }
    train_executor ex = {p, pipe_step, pipe_eval};
    o->executor = &ex;
    int rc = cli_run_training(cmd, o);
    pipeline_close(p);
    return rc;
}

/* Split "a,b,c" in place into at most max pieces. */
static int split_list(char *s, const char **out, int max)
{
    int n = 0;
    for (char *tok = strtok(s, ","); tok; tok = strtok(NULL, ",")) {
        if (n == max) return -1;
        out[n++] = tok;
    }
    return n;
}

int roles_cmd_client(int argc, char **argv)
{
    train_options o;
    train_options_defaults(&o);
    o.data = cli_default_data();
    model_flags mf = {.preset = "tiny"};
    const char *job = "cirrus", *stages = NULL, *act = "none";
    int help = 0;
    flag_spec flags[] = {
        MODEL_FLAGS(mf),
        TRAIN_FLAGS(o),
        {"job", FLAG_STR, &job, 0, 0, "job id", 0},
        {"stages", FLAG_STR, &stages, 0, 0, "stage peers in order: HOST:PORT,... (required)", 0},
        {"act-compress", FLAG_STR, &act, 0, 0, "activation codec: none or q8", 0},
        {"help", FLAG_BOOL, &help, 0, 0, "show this help", 0},
    };
    cirrus_error err = {0};
    if (flags_parse(flags, NFLAGS(flags), argc, argv, &err)) return cli_fail_input("client", &err);
    if (help) {
        fprintf(stderr, "usage: cirrus-trainer client --stages HOST:PORT,... [flags]\n");
        flags_usage(flags, NFLAGS(flags));
        return 0;
    }
    int codec = STAGE_CODEC_NONE;
    if (cli_model_from_flags(&mf, &o.model, &err) || parse_codec(act, &codec, &err))
        return cli_fail_input("client", &err);
    if (!stages) {
        cirrus_fail(&err, CIRRUS_EINVAL, "--stages HOST:PORT,... is required");
        return cli_fail_input("client", &err);
    }
    char *list = strdup(stages);
    const char *addrs[64];
    int n = list ? split_list(list, addrs, 64) : -1;
    int rc;
    if (n < 1) {
        cirrus_fail(&err, CIRRUS_EINVAL, "--stages must list 1 to 64 HOST:PORT addresses");
        rc = cli_fail_input("client", &err);
    } else {
        rc = run_client("client", &o, job, n, addrs, codec);
    }
    free(list);
    return rc;
}

/* ---- local: a region on loopback ---- */

/* Start a stage peer process serving [l0, l1) on an inherited listening socket. */
static pid_t spawn_stage(int listen_fd, int l0, int l1, const gpt_config *cfg,
                         const train_options *o, const char *job)
{
    pid_t pid = fork();
    if (pid != 0) return pid;
    int fd = dup(listen_fd); /* dup clears close-on-exec: the exec'd peer inherits it */
    char a_fd[16], a_layers[32], a_nl[16], a_w[16], a_h[16], a_ctx[16], a_b[16], a_seq[16],
        a_seed[32];
    snprintf(a_fd, sizeof a_fd, "%d", fd);
    snprintf(a_layers, sizeof a_layers, "%d:%d", l0, l1);
    snprintf(a_nl, sizeof a_nl, "%d", cfg->n_layer);
    snprintf(a_w, sizeof a_w, "%d", cfg->n_embd);
    snprintf(a_h, sizeof a_h, "%d", cfg->n_head);
    snprintf(a_ctx, sizeof a_ctx, "%d", cfg->seq_len);
    snprintf(a_b, sizeof a_b, "%d", o->batch);
    snprintf(a_seq, sizeof a_seq, "%d", o->seq ? o->seq : cfg->seq_len);
    snprintf(a_seed, sizeof a_seed, "%llu", (unsigned long long)o->seed);
    /* Several processes share the cores: one compute thread each, sleeping when idle. */
    setenv("OMP_NUM_THREADS", "1", 0);
    setenv("OMP_WAIT_POLICY", "passive", 0);
    char *args[] = {"cirrus-trainer", "stage", "--listen-fd", a_fd, "--serve", a_layers,
                    "--layers", a_nl, "--width", a_w, "--heads", a_h, "--context", a_ctx,
                    "--batch", a_b, "--seq", a_seq, "--seed", a_seed, "--job", (char *)job,
                    NULL};
    execv("/proc/self/exe", args);
    _exit(127);
}

int roles_cmd_local(int argc, char **argv)
{
    train_options o;
    train_options_defaults(&o);
    o.data = cli_default_data();
    model_flags mf = {.preset = "tiny"};
    const char *act = "none";
    int n_stages = 2, help = 0;
    flag_spec flags[] = {
        MODEL_FLAGS(mf),
        TRAIN_FLAGS(o),
        {"stages", FLAG_INT, &n_stages, 1, 64, "pipeline stages (default 2)", 0},
        {"act-compress", FLAG_STR, &act, 0, 0, "activation codec: none or q8", 0},
        {"help", FLAG_BOOL, &help, 0, 0, "show this help", 0},
    };
    cirrus_error err = {0};
    if (flags_parse(flags, NFLAGS(flags), argc, argv, &err)) return cli_fail_input("local", &err);
    if (help) {
        fprintf(stderr, "usage: cirrus-trainer local --stages S [flags]\n");
        flags_usage(flags, NFLAGS(flags));
        return 0;
    }
    int codec = STAGE_CODEC_NONE;
    if (cli_model_from_flags(&mf, &o.model, &err) || parse_codec(act, &codec, &err))
        return cli_fail_input("local", &err);
    if (n_stages > o.model.n_layer) {
        cirrus_fail(&err, CIRRUS_EINVAL, "--stages %d exceeds the model's %d layers", n_stages,
                    o.model.n_layer);
        return cli_fail_input("local", &err);
    }
    const char *job = "cirrus-local";
    pid_t pids[64];
    char addr_buf[64][32];
    const char *addrs[64];
    int started = 0, rc = 0;
    for (int s = 0; s < n_stages; s++) {
        int fd, port;
        if (net_listen("127.0.0.1", 0, &fd, &port, &err)) {
            rc = cli_fail_input("local", &err);
            break;
        }
        int l0 = s * o.model.n_layer / n_stages, l1 = (s + 1) * o.model.n_layer / n_stages;
        fflush(stdout);
        pids[s] = spawn_stage(fd, l0, l1, &o.model, &o, job);
        close(fd);
        if (pids[s] < 0) {
            rc = 1;
            break;
        }
        started++;
        snprintf(addr_buf[s], sizeof addr_buf[s], "127.0.0.1:%d", port);
        addrs[s] = addr_buf[s];
        if (!o.json) printf("cirrus: stage %d serves layers [%d, %d) at %s (pid %d)\n", s, l0,
                            l1, addrs[s], (int)pids[s]);
    }
    if (!rc) rc = run_client("local", &o, job, n_stages, addrs, codec);
    for (int s = 0; s < started; s++) kill(pids[s], SIGTERM);
    for (int s = 0; s < started; s++) waitpid(pids[s], NULL, 0);
    return rc;
}
