/* gateway: `cirrus-trainer gateway`, the region's gateway: its coordinator
 * (swarm/coord/coordinator.c: membership, the step barrier, rebalancing, /status and
 * /metrics) and, with --sync-every, its end of the WAN (gateway/outer_sync.c: outer steps
 * with the other regions' gateways, TLS 1.3 with the job's certificates), served until
 * SIGTERM or SIGINT.
 */
#include "roles.h"

#include <stdio.h>
#include <string.h>

#include "../../common/log.h"
#include "../gateway/outer_msg.h"
#include "../net/conn.h"
#include "../net/tls.h"
#include "../swarm/coord/coordinator.h"
#include "roles_common.h"
#include "wan_roles.h"

/* --regions NAME=HOST:PORT,...: every region's gateway WAN endpoint, in the job's order
 * (the same list, in the same order, for every gateway of the job). */
static int parse_regions(char *text, const char *self, const char **names, const char **addrs,
                         int *n, int *index, cirrus_error *err)
{
    *n = 0;
    *index = -1;
    char *save = NULL;
    for (char *tok = strtok_r(text, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(tok, '=');
        if (!eq || eq == tok || !eq[1] || *n == WAN_MAX_REGIONS)
            return cirrus_fail(err, CIRRUS_EINVAL, "--regions must list NAME=HOST:PORT, at most "
                               "%d, separated by ','; got '%s'", WAN_MAX_REGIONS, tok);
        *eq = '\0';
        for (int i = 0; i < *n; i++)
            if (!strcmp(names[i], tok))
                return cirrus_fail(err, CIRRUS_EINVAL, "--regions names '%s' twice", tok);
        if (!strcmp(tok, self)) *index = *n;
        names[*n] = tok;
        addrs[(*n)++] = eq + 1;
    }
    if (*index < 0)
        return cirrus_fail(err, CIRRUS_EINVAL, "--regions does not list this gateway's "
                           "--region '%s'", self);
    return 0;
}

int roles_cmd_gateway(int argc, char **argv)
{
    const char *job = "cirrus", *listen_addr = "0.0.0.0:7400", *region = NULL;
    const char *regions_text = NULL, *wan_listen = NULL, *tls_dir = NULL;
    int stages = 1, http_port = 7480, heartbeat_ms = 0, help = 0, rebalance_s = 30;
    int max_stage_peers = 0, max_conns = COORD_DEFAULT_MAX_CONNS;
    model_flags mf = {.preset = "tiny"};
    wan_flags wan = WAN_FLAGS_DEFAULTS;
    flag_spec flags[] = {
        {ROLE_FLAG_JOB, FLAG_STR, &job, 0, 0, "job id; members of other jobs are refused", 0},
        {ROLE_FLAG_LISTEN, FLAG_STR, &listen_addr, 0, 0, "HOST:PORT for peers and clients", 0},
        {ROLE_FLAG_HTTP_PORT, FLAG_INT, &http_port, -1, 65535, "/status and /metrics port (-1: none)",
         0},
        {ROLE_FLAG_STAGES, FLAG_INT, &stages, 1, PIPE_MAX_STAGES, "pipeline stages of the job", 0},
        MODEL_FLAGS(mf),
        {ROLE_FLAG_HEARTBEAT_MS, FLAG_INT, &heartbeat_ms, 0, 600000, "members' heartbeat interval", 0},
        {ROLE_FLAG_REBALANCE_PERIOD_S, FLAG_INT, &rebalance_s, 0, 86400,
         "seconds between rebalancing decisions: a peer of an over-provisioned stage moves to "
         "the bottleneck when that clearly raises the slowest stage's capacity (0: never; "
         "default 30)",
         0},
        {ROLE_FLAG_MAX_STAGE_PEERS, FLAG_INT, &max_stage_peers, 0, COORD_MAX_PEERS,
         "rebalancing moves no peer into a stage that has this many (0: no bound, the "
         "default; the operator passes the region's peers.max)",
         0},
        {ROLE_FLAG_MAX_CONNECTIONS, FLAG_INT, &max_conns, 1, COORD_MAX_CONNS,
         "connections the coordinator serves at once, a thread each: the region's peers and "
         "clients hold one each; more are closed on accept (the operator passes the region's "
         "most members plus room)",
         0},
        {ROLE_FLAG_REGION, FLAG_STR, &region, 0, 0, "this gateway's region (with --sync-every)", 0},
        {ROLE_FLAG_REGIONS, FLAG_STR, &regions_text, 0, 0,
         "every region's gateway WAN endpoint, NAME=HOST:PORT,... in the job's order", 0},
        {ROLE_FLAG_WAN_LISTEN, FLAG_STR, &wan_listen, 0, 0,
         "HOST:PORT the WAN endpoint listens on (default: this region's in --regions)", 0},
        {ROLE_FLAG_TLS_DIR, FLAG_STR, &tls_dir, 0, 0,
         "directory with the job's ca.crt and this gateway's tls.crt and tls.key", 0},
        WAN_FLAGS(wan),
        {"help", FLAG_BOOL, &help, 0, 0, "show this help", 0},
    };
    cirrus_error err = {0};
    if (flags_parse(flags, NFLAGS(flags), argc, argv, &err))
        return cli_fail_input("gateway", &err);
    if (help) {
        fprintf(stderr, "usage: cirrus-trainer gateway --job ID --stages S [flags]\n");
        flags_usage(flags, NFLAGS(flags));
        return 0;
    }
    char host[256];
    int port;
    gpt_config cfg;
    if (net_split_hostport(listen_addr, host, sizeof host, &port, 1, &err) ||
        cli_model_from_flags(&mf, &cfg, &err))
        return cli_fail_input("gateway", &err);
    /* The WAN end: every region listed, this one among them, certificates unless insecure. */
    const char *names[WAN_MAX_REGIONS], *addrs[WAN_MAX_REGIONS];
    char regions_buf[4096];
    int n_regions = 0, index = 0;
    wan_codec_params codec;
    if (wan.sync_every) {
        if (!region || !regions_text || strlen(regions_text) >= sizeof regions_buf)
            cirrus_fail(&err, CIRRUS_EINVAL, "--sync-every needs --region and --regions");
        else if (!wan.insecure && !tls_dir)
            cirrus_fail(&err, CIRRUS_EINVAL, "--sync-every needs --tls-dir (the job's "
                        "certificates) or --wan-insecure");
        else {
            strcpy(regions_buf, regions_text);
            parse_regions(regions_buf, region, names, addrs, &n_regions, &index, &err);
            if (!err.code && strcmp(wan.codec, "auto")) wan_codec_parse(wan.codec, &codec, &err);
        }
        if (err.code) return cli_fail_input("gateway", &err);
    }
    log_set_role("gateway");
    net_tls_ctx *tls = NULL;
    outer_sync *os = NULL;
    if (wan.sync_every) {
        char ca[4096], crt[4096], key[4096];
        int rc = 0;
        if (!wan.insecure) {
            snprintf(ca, sizeof ca, "%s/ca.crt", tls_dir);
            snprintf(crt, sizeof crt, "%s/tls.crt", tls_dir);
            snprintf(key, sizeof key, "%s/tls.key", tls_dir);
            rc = net_tls_ctx_load(&tls, ca, crt, key, job, &err);
        }
        int wan_fd = -1, bound;
        if (!rc && wan_listen) {
            char whost[256];
            int wport;
            rc = net_split_hostport(wan_listen, whost, sizeof whost, &wport, 1, &err);
            if (!rc) rc = net_listen(whost, wport, &wan_fd, &bound, &err);
        }
        if (!rc)
            rc = wan_start_outer(&wan, job, index, n_regions, names, addrs, wan_fd,
                                 &cfg, tls, &os, &err);
        if (rc) {
            fprintf(stderr, "cirrus-trainer gateway: %s\n", err.msg);
            net_tls_ctx_free(tls);
            return err.code == CIRRUS_EINVAL ? EXIT_BAD_INPUT : 1;
        }
    }
    coordinator_options o = {.job_id = job, .host = host, .port = port, .http_port = http_port,
                             .n_stages = (uint32_t)stages, .n_layer = (uint32_t)mf.layers,
                             .heartbeat_ms = (uint32_t)heartbeat_ms,
                             .rebalance_period_ms = (uint32_t)rebalance_s * 1000u,
                             .max_stage_peers = (uint32_t)max_stage_peers,
                             .max_conns = (uint32_t)max_conns,
                             .ext_handler = os ? outer_sync_serve : NULL, .ext_ctx = os,
                                  .ext_status = os ? outer_sync_view : NULL,
                             .ext_request_limit = OUTER_REQUEST_LIMIT};
    roles_catch_signals();
    int rc = coordinator_run(&o, &roles_stop_requested, &err);
    outer_sync_stop(os);
    net_tls_ctx_free(tls);
    if (rc) {
        fprintf(stderr, "cirrus-trainer gateway: %s\n", err.msg);
        return err.code == CIRRUS_EINVAL ? EXIT_BAD_INPUT : 1;
    }
    return 0;
}
