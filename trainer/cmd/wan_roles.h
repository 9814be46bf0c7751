/* wan_roles: the command line of the outer sync across regions, shared by `gateway` (one
 * region's gateway, as the operator runs it) and `local --regions R` (R regions on this
 * machine): the flags, the TLS identity, and starting the gateway's outer sync.
 */
#ifndef CIRRUS_WAN_ROLES_H
#define CIRRUS_WAN_ROLES_H

#include <sys/types.h>

#include "../gateway/outer_sync.h"
#include "cli.h"

typedef struct wan_flags {
    int sync_every;         /* inner steps per outer step; 0: no outer steps */
    const char *codec;      /* wan_codec_parse spec */
    float outer_lr, outer_momentum;
    int insecure;           /* --wan-insecure: plaintext between gateways */
    int sync_timeout_s;     /* how long an outer round may wait for the other regions */
    int sync_delay;         /* local: inner steps the regions train on while a round runs */
    const char *sync_params; /* gateway/sync_params.h */
    float wan_mbit;         /* what the gateway may send on the WAN, Mbit/s; 0: no limit */
    int fragments;          /* the synchronised parameters cut into this many (fragments.h) */
} wan_flags;

#define WAN_FLAGS_DEFAULTS {0, "q8", OUTER_DEFAULT_LR, OUTER_DEFAULT_MOMENTUM, 0, 600, 0, "all", 0, 1}

/* The flag table's entries (shared by local, gateway and client). */
#define WAN_FLAGS(w)                                                                          \
    {ROLE_FLAG_SYNC_EVERY, FLAG_INT, &(w).sync_every, 0, 1000000,                                     \
     "inner steps between outer steps across regions (0: none; default 0)", 0},              \
        {ROLE_FLAG_CODEC, FLAG_STR, &(w).codec, 0, 0,                                                 \
         "how pseudo-gradients cross the WAN: none, fp16, q8, topk:DENSITY, lowbit:BITS, "    \
         "each optionally +zstd, or auto: chosen each outer step from the links' measured "    \
         "rate and the time between syncs (default q8)",                                      \
         0},                                                                                  \
        {ROLE_FLAG_OUTER_LR, FLAG_FLOAT, &(w).outer_lr, 0, 10, "outer learning rate (default 0.7)", 0}, \
        {ROLE_FLAG_OUTER_MOMENTUM, FLAG_FLOAT, &(w).outer_momentum, 0, 0.999f,                        \
         "outer Nesterov momentum (default 0.9; 0: plain averaging when --outer-lr 1)", 0},   \
        {"wan-insecure", FLAG_BOOL, &(w).insecure, 0, 0,                                      \
         "plaintext between gateways (default: TLS 1.3, both ends authenticated)", 0},        \
        {"sync-timeout-s", FLAG_INT, &(w).sync_timeout_s, 1, 86400,                           \
         "seconds an outer step may wait for the other regions (default 600)", 0},            \
        {"sync-params", FLAG_STR, &(w).sync_params, 0, 0,                                     \
         "which parameters the outer steps synchronise, the rest staying regional: all, "     \
         "no-embed (all but the embeddings) or every:K (blocks 0, K, 2K.. and the final "     \
         "LayerNorm) (default all)",                                                          \
         0},                                                                                  \
        {"wan-mbit", FLAG_FLOAT, &(w).wan_mbit, 0, 1000000,                                   \
         "cap what each gateway sends on the WAN, in Mbit/s, TLS included (a link's rate "    \
         "for --codec auto to adapt to; 0: no cap; default 0)",                               \
         0},                                                                                  \
        {ROLE_FLAG_FRAGMENTS, FLAG_INT, &(w).fragments, 1, OUTER_MAX_FRAGMENTS,                       \
         "cut the synchronised parameters into this many groups of layers, each synchronised " \
         "on its own at staggered times within the --sync-every window, spreading the WAN "   \
         "traffic over it (Streaming DiLoCo; every region's gateway alike; default 1)",       \
         0}

/* The gateway's outer sync over its WAN listening socket listen_fd (or the address of its
 * region when -1), with TLS from tls (NULL with --wan-insecure), for the parameters of cfg
 * that --sync-params selects. */
int wan_start_outer(const wan_flags *w, const char *job, int region, int n_regions,
                    const char *const *names, const char *const *addrs, int listen_fd,
                    const gpt_config *cfg, net_tls_ctx *tls, outer_sync **out,
                    cirrus_error *err);

/* `local --regions R`: make the job's throwaway CA and each region's certificate (the
 * operator's code, common/certs.h) unless insecure, bind each region's WAN socket on
 * loopback, and fork one process per region after the first. Returns in every process:
 * *region is its index (0 in the parent), *listen_fd its WAN socket, *tls its identity
 * (NULL if insecure); children[] (parent only) the regions' pids. names and addrs receive
 * every region's name and WAN address. */
#define WAN_LOCAL_ADDR_MAX 32
/* How `local`'s regions end together: each region's gateway serves until every region's
 * client has finished, as a job's gateways do (they run until the job ends), so a region
 * behind at the end takes the last rounds' result from one that finished first. A socket
 * pair (close-on-exec) per region after the first: the region sends one byte when its
 * client has finished and ends at the parent's close. fd[r] in the parent is region r's
 * end; in region r, fd[0] is its own; -1: none. */
typedef struct wan_local_end {
    int fd[WAN_MAX_REGIONS];
} wan_local_end;
int wan_local_regions(const wan_flags *w, int n_regions, const char *job, int *region,
                      int *listen_fd, net_tls_ctx **tls, char names[][WAN_REGION_MAX + 1],
                      char addrs[][WAN_LOCAL_ADDR_MAX], pid_t *children, wan_local_end *end,
                      cirrus_error *err);
/* Region `region`'s client has finished: a region after the first says so and waits until
 * the parent lets it end (or is gone); the parent waits for every region's word (a region
 * that died says so by closing its pipe) unless `abandon` (it failed or is asked to stop:
 * the regions are stopped anyway) or stop is set, then lets them all end. */
void wan_local_finished(wan_local_end *end, int region, int n_regions, int abandon,
                        const volatile sig_atomic_t *stop);

/* `cirrus-trainer certs`: a job's CA and its regions' gateway certificates into files. */
int roles_cmd_certs(int argc, char **argv);

#endif
