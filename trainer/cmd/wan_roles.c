/* wan_roles: see wan_roles.h. */
#include "wan_roles.h"

#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../../common/certs.h"
#include "../../common/log.h"
#include "../net/conn.h"
#include "../gateway/adapt.h"
#include "../gateway/sync_params.h"
#include "../net/tls.h"

#define WAN_LOCAL_CERT_DAYS 1 /* `local`'s certificates live as long as the run */

int wan_start_outer(const wan_flags *w, const char *job, int region, int n_regions,
                    const char *const *names, const char *const *addrs, int listen_fd,
                    const gpt_config *cfg, net_tls_ctx *tls, outer_sync **out,
                    cirrus_error *err)
{
    sync_params sp;
    int rc = sync_params_parse(w->sync_params, cfg, &sp, err);
    if (rc) return rc;
    const uint64_t n_params = sp.count; /* only these cross the WAN */
    sync_params_free(&sp);
    outer_sync_options o = {.job = job, .region_index = region, .n_regions = n_regions,
                            .region_names = names, .wan_addrs = addrs, .listen_fd = listen_fd,
                            .n_params = n_params,
                            .opt = {.lr = w->outer_lr, .momentum = w->outer_momentum},
                            .tls = tls, .round_timeout_ms = w->sync_timeout_s * 1000,
                            .sync_every = w->sync_every, .fragments = w->fragments,
                            .wan_max_Bps = (double)w->wan_mbit * 1e6 / 8};
    if (!strcmp(w->codec, "auto")) {
        o.codec_auto = 1;
        adapt_rung(ADAPT_START_RUNG, &o.codec);
    } else {
        rc = wan_codec_parse(w->codec, &o.codec, err);
    }
    return rc ? rc : outer_sync_start(&o, out, err);
}

/* The job's CA and region r's leaf, as the operator makes them for the job's Secret. */
static int local_identity(const char *job, const char *region, const certs_pair *ca,
                          net_tls_ctx **tls, cirrus_error *err)
{
    certs_pair leaf = {0};
    int rc = certs_make_leaf(ca, job, region, region, NULL, 0, WAN_LOCAL_CERT_DAYS, &leaf, err);
    if (!rc) rc = net_tls_ctx_new(tls, ca->cert_pem, leaf.cert_pem, leaf.key_pem, job, err);
    certs_pair_free(&leaf);
    return rc;
}

int wan_local_regions(const wan_flags *w, int n_regions, const char *job, int *region,
                      int *listen_fd, net_tls_ctx **tls, char names[][WAN_REGION_MAX + 1],
                      char addrs[][WAN_LOCAL_ADDR_MAX], pid_t *children, wan_local_end *end,
                      cirrus_error *err)
{
    int fds[WAN_MAX_REGIONS], pair[WAN_MAX_REGIONS][2];
    *region = 0;
    *tls = NULL;
    for (int r = 0; r < WAN_MAX_REGIONS; r++) end->fd[r] = pair[r][0] = pair[r][1] = -1;
    if (n_regions < 1 || n_regions > WAN_MAX_REGIONS)
        return cirrus_fail(err, CIRRUS_EINVAL, "--regions %d: 1 to %d", n_regions,
                           WAN_MAX_REGIONS);
    for (int r = 0; r < n_regions; r++) {
        int port;
        snprintf(names[r], WAN_REGION_MAX + 1, "r%d", r);
        int rc = net_listen("127.0.0.1", 0, &fds[r], &port, err);
        if (rc) {
            while (r-- > 0) close(fds[r]);
            return rc;
        }
        snprintf(addrs[r], WAN_LOCAL_ADDR_MAX, "127.0.0.1:%d", port);
    }
    certs_pair ca = {0};
    int rc = w->insecure ? 0 : certs_make_ca(job, WAN_LOCAL_CERT_DAYS, &ca, err);
    for (int r = 1; r < n_regions && !rc; r++)
        if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair[r]))
            rc = cirrus_fail(err, CIRRUS_EIO, "cannot make region %d's socket pair", r);
    const pid_t parent = getpid();
    for (int r = 1; r < n_regions && !rc; r++) {
        fflush(stdout);
        fflush(stderr);
        pid_t pid = fork();
        if (pid < 0) {
            rc = cirrus_fail(err, CIRRUS_EIO, "cannot start region %d", r);
            break;
        }
        if (pid == 0) { /* region r: its own socket, and it dies with `local` */
            prctl(PR_SET_PDEATHSIG, SIGTERM);
            if (getppid() != parent) _exit(1);
            *region = r;
            break;
        }
        children[r] = pid;
    }
    for (int r = 0; r < n_regions; r++)
        if (r != *region) close(fds[r]);
    *listen_fd = fds[*region];
    /* Each process keeps its own ends: region r pair[r][1], the parent every pair[r][0]
     * (another region's end held here would keep the parent's close from being seen). */
    for (int r = 1; r < WAN_MAX_REGIONS; r++) {
        int keep = -1;
        if (*region == r) end->fd[0] = keep = pair[r][1];
        else if (*region == 0 && children[r] > 0 && !rc) end->fd[r] = keep = pair[r][0];
        for (int k = 0; k < 2; k++)
            if (pair[r][k] >= 0 && pair[r][k] != keep) close(pair[r][k]);
    }
    if (!rc && !w->insecure) rc = local_identity(job, names[*region], &ca, tls, err);
    certs_pair_free(&ca);
    return rc;
}

void wan_local_finished(wan_local_end *end, int region, int n_regions, int abandon,
                        const volatile sig_atomic_t *stop)
{
    char c = 1;
    if (region > 0) {
        struct pollfd pfd = {.fd = end->fd[0], .events = POLLIN};
        if (end->fd[0] >= 0 && send(end->fd[0], &c, 1, MSG_NOSIGNAL) == 1)
            while (!*stop && poll(&pfd, 1, 200) == 0) continue; /* the parent's close */
        return;
    }
    for (int r = 1; r < n_regions; r++) {
        struct pollfd pfd = {.fd = end->fd[r], .events = POLLIN};
        if (end->fd[r] >= 0) /* its byte, or its end closed (the region died) */
            while (!abandon && !*stop && poll(&pfd, 1, 200) == 0) continue;
    }
    for (int r = 1; r < n_regions; r++)
        if (end->fd[r] >= 0) close(end->fd[r]), end->fd[r] = -1;
}

/* Write text to path (mode 0600 for keys, 0644 otherwise), whole or not at all. */
static int write_file(const char *path, const char *text, int secret, cirrus_error *err)
{
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "wx");
    if (!f) return cirrus_fail(err, CIRRUS_EIO, "cannot create %s", tmp);
    if (secret) fchmod(fileno(f), 0600);
    const size_t n = strlen(text);
    int ok = fwrite(text, 1, n, f) == n;
    ok = fclose(f) == 0 && ok;
    if (!ok || rename(tmp, path) != 0) {
        unlink(tmp);
        return cirrus_fail(err, CIRRUS_EIO, "cannot write %s", path);
    }
    return 0;
}

int roles_cmd_certs(int argc, char **argv)
{
    const char *job = NULL, *out = NULL;
    flag_str_list regions = {0};
    int days = 30, help = 0;
    flag_spec flags[] = {
        {"job", FLAG_STR, &job, 0, 0, "the job id the gateways run with (--job)", 0},
        {"region", FLAG_STR_LIST, &regions, 0, 0, "a region (repeat for each)", 0},
        {"out", FLAG_STR, &out, 0, 0, "directory to create: ca.crt, and per region "
         "REGION/ca.crt, REGION/tls.crt, REGION/tls.key (a gateway's --tls-dir)", 0},
        {"days", FLAG_INT, &days, 1, CERTS_MAX_DAYS, "validity in days (default 30)", 0},
        {"help", FLAG_BOOL, &help, 0, 0, "show this help", 0},
    };
    cirrus_error err = {0};
    if (flags_parse(flags, NFLAGS(flags), argc, argv, &err)) return cli_fail_input("certs", &err);
    if (help) {
        fprintf(stderr, "usage: cirrus-trainer certs --job ID --region R1 --region R2 --out DIR\n"
                        "The job's CA and a certificate per region's gateway, as the operator "
                        "makes them for a SwarmJob's Secret.\n");
        flags_usage(flags, NFLAGS(flags));
        return 0;
    }
    if (!job || !out || regions.n == 0) {
        cirrus_fail(&err, CIRRUS_EINVAL, "--job, --out and at least one --region are needed");
        return cli_fail_input("certs", &err);
    }
    if (mkdir(out, 0755) != 0) {
        cirrus_fail(&err, CIRRUS_EIO, "cannot create %s (it must not exist)", out);
        return cli_fail_input("certs", &err);
    }
    certs_pair ca = {0};
    char path[4096];
    int rc = certs_make_ca(job, days, &ca, &err);
    if (!rc) {
        snprintf(path, sizeof path, "%s/ca.crt", out);
        rc = write_file(path, ca.cert_pem, 0, &err);
    }
    for (int i = 0; i < regions.n && !rc; i++) {
        certs_pair leaf = {0};
        const char *r = regions.items[i];
        rc = certs_make_leaf(&ca, job, r, r, NULL, 0, days, &leaf, &err);
        snprintf(path, sizeof path, "%s/%s", out, r);
        if (!rc && mkdir(path, 0755) != 0) rc = cirrus_fail(&err, CIRRUS_EIO, "cannot create %s", path);
        const char *files[3][2] = {{"ca.crt", ca.cert_pem}, {"tls.crt", leaf.cert_pem},
                                   {"tls.key", leaf.key_pem}};
        for (int f = 0; f < 3 && !rc; f++) {
            snprintf(path, sizeof path, "%s/%s/%s", out, r, files[f][0]);
            rc = write_file(path, files[f][1], f == 2, &err);
        }
        certs_pair_free(&leaf);
    }
    certs_pair_free(&ca);
    if (rc) {
        fprintf(stderr, "cirrus-trainer certs: %s\n", err.msg);
        return rc == CIRRUS_EINVAL ? EXIT_BAD_INPUT : 1;
    }
    return 0;
}
