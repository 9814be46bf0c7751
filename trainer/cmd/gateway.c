/* gateway: `cirrus-trainer gateway`, the region's gateway. For now it is the region's
 * coordinator (swarm/coord/coordinator.c: membership, the step barrier, rebalancing,
 * /status and /metrics), served until SIGTERM or SIGINT.
 */
#include "roles.h"

#include <stdio.h>

#include "../../common/log.h"
#include "../net/conn.h"
#include "../swarm/coord/coordinator.h"
#include "roles_common.h"

int roles_cmd_gateway(int argc, char **argv)
{
    const char *job = "cirrus", *listen_addr = "0.0.0.0:7400";
    int stages = 1, layers = 0, http_port = 7480, heartbeat_ms = 0, help = 0, rebalance_s = 30;
    int exit_after_redo = 0;
    flag_spec flags[] = {
        {ROLE_FLAG_JOB, FLAG_STR, &job, 0, 0, "job id; members of other jobs are refused", 0},
        {ROLE_FLAG_LISTEN, FLAG_STR, &listen_addr, 0, 0, "HOST:PORT for peers and clients", 0},
        {ROLE_FLAG_HTTP_PORT, FLAG_INT, &http_port, -1, 65535, "/status and /metrics port (-1: none)",
         0},
        {ROLE_FLAG_STAGES, FLAG_INT, &stages, 1, PIPE_MAX_STAGES, "pipeline stages of the job", 0},
        {ROLE_FLAG_LAYERS, FLAG_INT, &layers, 0, 1024, "the model's layers (checks registrations)", 0},
        {ROLE_FLAG_HEARTBEAT_MS, FLAG_INT, &heartbeat_ms, 0, 600000, "members' heartbeat interval", 0},
        {ROLE_FLAG_REBALANCE_PERIOD_S, FLAG_INT, &rebalance_s, 0, 86400,
         "seconds between rebalancing decisions: a peer of an over-provisioned stage moves to "
         "the bottleneck when that clearly raises the slowest stage's capacity (0: never; "
         "default 30)",
         0},
        {"test-exit-after-redo", FLAG_BOOL, &exit_after_redo, 0, 0,
         "tests only: exit on the first step-barrier call after a REDO notice was posted", 0},
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
    if (net_split_hostport(listen_addr, host, sizeof host, &port, 1, &err))
        return cli_fail_input("gateway", &err);
    log_set_role("gateway");
    coordinator_options o = {.job_id = job, .host = host, .port = port, .http_port = http_port,
                             .n_stages = (uint32_t)stages, .n_layer = (uint32_t)layers,
                             .heartbeat_ms = (uint32_t)heartbeat_ms,
                             .rebalance_period_ms = (uint32_t)rebalance_s * 1000u,
                             .test_exit_after_redo = exit_after_redo};
    roles_catch_signals();
    if (coordinator_run(&o, &roles_stop_requested, &err)) {
        fprintf(stderr, "cirrus-trainer gateway: %s\n", err.msg);
        return err.code == CIRRUS_EINVAL ? EXIT_BAD_INPUT : 1;
    }
    return 0;
}
