/* wan_roles: see wan_roles.h. */
#include "wan_roles.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "../../common/certs.h"
#include "../../common/log.h"
#include "../net/conn.h"
#include "../net/tls.h"

#define WAN_LOCAL_CERT_DAYS 1 /* `local`'s certificates live as long as the run */

int wan_start_outer(const wan_flags *w, const char *job, int region, int n_regions,
                    const char *const *names, const char *const *addrs, int listen_fd,
                    uint64_t n_params, net_tls_ctx *tls, outer_sync **out, cirrus_error *err)
{
    outer_sync_options o = {.job = job, .region_index = region, .n_regions = n_regions,
                            .region_names = names, .wan_addrs = addrs, .listen_fd = listen_fd,
                            .n_params = n_params,
                            .opt = {.lr = w->outer_lr, .momentum = w->outer_momentum},
                            .tls = tls, .round_timeout_ms = w->sync_timeout_s * 1000,
                            .sync_every = w->sync_every};
    int rc = wan_codec_parse(w->codec, &o.codec, err);
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
                      char addrs[][WAN_LOCAL_ADDR_MAX], pid_t *children, cirrus_error *err)
{
    int fds[WAN_MAX_REGIONS];
    *region = 0;
    *tls = NULL;
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
    if (!rc && !w->insecure) rc = local_identity(job, names[*region], &ca, tls, err);
    certs_pair_free(&ca);
    return rc;
}
