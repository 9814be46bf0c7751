/* client: `cirrus-trainer client`, the training loop of train.c with the model on stage
 * peers: listed with --stages, or found through the region's coordinator. Several clients
 * can share each step (--clients, --client-index). The client itself is roles_run_client()
 * over the pipeline executor (swarm/client/executor.c); this file parses its flags.
 */
#include "roles.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../swarm/proto/coord_msg.h"
#include "../swarm/proto/stage_msg.h"
#include "roles_common.h"

/* Split "a,b,c" in place at sep into at most max pieces; -1 if there are more. */
static int split_list(char *s, const char **out, int max, char sep)
{
    int n = 0;
    const char seps[2] = {sep, 0};
    char *save = NULL;
    for (char *tok = strtok_r(s, seps, &save); tok; tok = strtok_r(NULL, seps, &save)) {
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
    const char *job = "cirrus", *stages = NULL, *act = "none", *coordinator = NULL;
    routing_flags routing = {"wiring", WIRING_LEAST_LOADED, 0};
    int help = 0, micro = 0, wait_s = 600;
    client_share share = {1, 0, 0, 0, 600, 0, "all", NULL, NULL};
    flag_spec flags[] = {
        MODEL_FLAGS(mf),
        TRAIN_FLAGS(o),
        CKPT_FLAGS(o),
        {ROLE_FLAG_JOB, FLAG_STR, &job, 0, 0, "job id", 0},
        {ROLE_FLAG_STAGES, FLAG_STR, &stages, 0, 0,
         "stage peers, stages in order separated by '/', a stage's peers by ',' "
         "(default: ask --coordinator)",
         0},
        {ROLE_FLAG_MICROBATCH, FLAG_INT, &micro, 1, 65536,
         "sequences per microbatch (default: batch, or with --clients C the largest divisor of "
         "batch giving C microbatches or more: each client runs its share)",
         0},
        {ROLE_FLAG_COORDINATOR, FLAG_STR, &coordinator, 0, 0,
         "the region's coordinator, HOST:PORT: finds the stage peers when --stages is not "
         "given, admits new peers between steps, receives progress",
         0},
        {ROLE_FLAG_CLIENTS, FLAG_INT, &share.n_clients, 1, COORD_MAX_CLIENTS,
         "clients sharing each step's batch (default 1); they meet at --coordinator", 0},
        {ROLE_FLAG_CLIENT_INDEX, FLAG_INT, &share.index, 0, COORD_MAX_CLIENTS - 1,
         "which of them this is (0, the default, runs the optimizer step)", 0},
        {ROLE_FLAG_SYNC_EVERY, FLAG_INT, &share.sync_every, 0, 1000000,
         "an outer step across regions every this many inner steps, through the gateway at "
         "--coordinator (0: none; default 0)",
         0},
        {"sync-delay", FLAG_INT, &share.sync_delay, 0, 999999,
         "inner steps trained on at least while an outer step crosses the WAN, then its "
         "result merged once in (waited for only when the next is due; below --sync-every; "
         "0, the default: wait for it)",
         0},
        {"sync-params", FLAG_STR, &share.sync_params, 0, 0,
         "which parameters the outer steps synchronise: all, no-embed or every:K (the "
         "gateway's --sync-params; default all)",
         0},
        {"sync-timeout-s", FLAG_INT, &share.sync_timeout_s, 1, 86400,
         "seconds an outer step may take (default 600)", 0},
        {ROLE_FLAG_REGION, FLAG_STR, &share.region, 0, 0, "the region's name on progress lines", 0},
        {"exit-mid-step", FLAG_INT, &share.exit_mid_step, 1, 1e9,
         "tests only: exit (137) after one microbatch of this step, as a preempted pod", 0},
        {ROLE_FLAG_SUMMARY_FILE, FLAG_STR, &share.summary_file, 0, 0,
         "when training finished, write how it ended to this file: one line of JSON, step, "
         "loss, val_loss, tokens (a Pod's termination message)",
         0},
        {"wait-peers-s", FLAG_INT, &wait_s, 0, 86400,
         "seconds to wait until every stage has a peer: without --stages at the start, and "
         "whenever a stage has lost every peer (with --coordinator; then the model is "
         "restored: from the other regions, a checkpoint, or the seed; default 600)",
         0},
        {ROLE_FLAG_ACT_COMPRESS, FLAG_STR, &act, 0, 0, "activation codec: none or q8", 0},
        ROUTING_FLAGS(routing),
        {"help", FLAG_BOOL, &help, 0, 0, "show this help", 0},
    };
    cirrus_error err = {0};
    if (flags_parse(flags, NFLAGS(flags), argc, argv, &err)) return cli_fail_input("client", &err);
    if (help) {
        fprintf(stderr, "usage: cirrus-trainer client --stages HOST:PORT,... [flags]\n"
                        "       cirrus-trainer client --coordinator HOST:PORT [flags]\n");
        flags_usage(flags, NFLAGS(flags));
        return 0;
    }
    int codec = STAGE_CODEC_NONE;
    if (cli_model_from_flags(&mf, &o.model, &err) || roles_parse_codec(act, &codec, &err) ||
        roles_parse_routing(routing.name, &routing.policy, &err))
        return cli_fail_input("client", &err);
    if (!stages && !coordinator) {
        cirrus_fail(&err, CIRRUS_EINVAL,
                    "--stages HOST:PORT,... or --coordinator HOST:PORT is required");
        return cli_fail_input("client", &err);
    }
    micro = micro ? micro : roles_default_microbatch(o.batch, share.n_clients);
    if (!stages) {
        peer_source src = {.n = 0, .wait_s = wait_s};
        return roles_run_client("client", &o, job, &src, codec, micro, coordinator, &routing,
                                &share);
    }
    char *list = strdup(stages);
    const char *stage_lists[PIPE_MAX_STAGES], *addrs[PIPE_MAX_STAGES * PIPE_MAX_PEERS];
    int peers[PIPE_MAX_STAGES], n_addrs = 0;
    int n = list ? split_list(list, stage_lists, PIPE_MAX_STAGES, '/') : -1;
    for (int s = 0; s < n; s++) {
        peers[s] = split_list((char *)stage_lists[s], addrs + n_addrs, PIPE_MAX_PEERS, ',');
        if (peers[s] < 1) n = -1;
        if (n < 0) break;
        n_addrs += peers[s];
    }
    int rc;
    if (n < 1) {
        cirrus_fail(&err, CIRRUS_EINVAL,
                    "--stages must list 1 to %d stages of 1 to %d HOST:PORT peers",
                    PIPE_MAX_STAGES, PIPE_MAX_PEERS);
        rc = cli_fail_input("client", &err);
    } else {
        peer_source src = {.n = n, .peers = peers, .addrs = addrs, .wait_s = wait_s};
        rc = roles_run_client("client", &o, job, &src, codec, micro, coordinator, &routing,
                              &share);
    }
    free(list);
    return rc;
}
