/* averaging: the stage's gradients between steps. AVERAGE sums them with the stage's
 * other peers (a TCP ring among the members the client names each round, and NCCL over the
 * same members when every one of them runs the CUDA backend); a round that fails is
 * repeated from each peer's own gradients (kept in `backup`); a new state or a new stage
 * drops them. All under the peer's lock. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "../../../common/failpoint.h"
#include "../../../common/log.h"
#include "../../model/ops.h"
#include "../../net/ring.h"
#include "peer_internal.h"

/* Pack (or unpack) every optimizer segment's gradient, and the LM head's share on the last
 * stage, into one buffer for one all-reduce. */
static void pack_gradients(peer *p, float *buf, int unpack)
{
    float *g = buf;
    for (int s = 0; s < p->adam.n_seg; s++) {
        float *t = p->model.grads + p->adam.seg[s].offset;
        size_t n = sizeof(float) * p->adam.seg[s].count;
        if (unpack)
            memcpy(t, g, n);
        else
            memcpy(g, t, n);
        g += p->adam.seg[s].count;
    }
    if (p->l1 == p->opt->model.n_layer) {
        if (unpack)
            memcpy(p->model.grad_head, g, sizeof(float) * p->V * p->C);
        else
            memcpy(g, p->model.grad_head, sizeof(float) * p->V * p->C);
    }
}

/* Undo a completed round: back to this peer's own gradients (kept in `backup`). Needed
 * before a round is repeated, and before a backward is re-run here on behalf of a lost
 * peer (its microbatch must land in one peer's own share, not in a sum). */
void peer_unsum_gradients(peer *p)
{
    if (!p->summed) return;
    pack_gradients(p, p->backup, 1);
    p->summed = 0;
}

void peer_drop_rings(peer *p)
{
    collective_free(p->device_ring);
    collective_free(p->ring);
    p->device_ring = p->ring = NULL;
    p->ring_members[0] = '\0';
}

/* Over a new ring: if every member's backend has a device collective (NCCL) and it has not
 * failed for these members before, rank 0 makes its id, the ring carries it to the others (a
 * sum where only rank 0 adds non-zeros: the bytes as exact small floats), each joins, and
 * the ring tells whether all did; otherwise, or if any failed, all keep the ring. Each
 * decision is a sum over the ring, so the members agree. The build gets half the round's
 * timeout, so that a member whose build failed at once still hears, within the ring's
 * timeout, from one that waited the build out. Fails (EIO) only when the ring does. */
static int try_device_ring(peer *p, const char *members, int rank, int n, int timeout_ms)
{
    const ops_backend *b = p->model.ops;
    cirrus_error err = {0};
    float capable = b->device_collective_new && strcmp(members, p->device_failed_members) != 0
                        ? 1.0f : 0.0f;
    if (collective_allreduce_sum(p->ring, &capable, 1, &err)) goto ring_failed;
    if (capable != (float)n) {
        if (b->device_collective_new)
            log_info("averaging: %d of %d peers can build a device collective for these "
                     "members; the TCP ring averages", (int)capable, n);
        return 0;
    }
    float idf[DEVICE_COLLECTIVE_ID_BYTES] = {0};
    uint8_t id[DEVICE_COLLECTIVE_ID_BYTES];
    if (rank == 0) {
        if (b->device_collective_id(id, &err)) {
            log_warn("averaging: %s", err.msg);
            idf[0] = 1000.0f; /* not a byte: tells the others to stay on the ring */
        } else {
            for (int i = 0; i < DEVICE_COLLECTIVE_ID_BYTES; i++) idf[i] = id[i];
        }
    }
    if (collective_allreduce_sum(p->ring, idf, DEVICE_COLLECTIVE_ID_BYTES, &err)) goto ring_failed;
    int have_id = 1;
    for (int i = 0; i < DEVICE_COLLECTIVE_ID_BYTES; i++) {
        if (!(idf[i] >= 0.0f && idf[i] <= 255.0f)) have_id = 0;
        id[i] = (uint8_t)(have_id ? idf[i] : 0);
    }
    collective *dev = NULL;
    float joined = 0.0f;
    cirrus_error why = {0};
    if (have_id && b->device_collective_new(&dev, rank, n, id, timeout_ms / 2, &why) == 0)
        joined = 1.0f;
    if (dev) collective_set_timeout(dev, timeout_ms);
    if (collective_allreduce_sum(p->ring, &joined, 1, &err)) {
        collective_free(dev);
        goto ring_failed;
    }
    if (joined != (float)n) {
        collective_free(dev);
        snprintf(p->device_failed_members, sizeof p->device_failed_members, "%s", members);
        log_info("averaging: the device collective did not start on every peer (%s); the TCP "
                 "ring averages", why.msg[0] ? why.msg : "another peer failed");
        return 0;
    }
    p->device_ring = dev;
    log_info("averaging: %s among the stage's %d peers", dev->ops->name, n);
    return 0;
ring_failed:
    log_warn("averaging: %s", err.msg);
    return CIRRUS_EIO;
}

/* attempt (the request id, shared by all members of one attempt) names the ring's
 * handshake, so a connection left over from a failed attempt can never join the next one. */
int peer_average(peer *p, wire_reader *r, uint64_t attempt, wire_writer *reply,
                             const char **why)
{
    const stage_peer_options *o = p->opt;
    stage_average *a = &p->avg;
    char(*addrs)[STAGE_ADDR_MAX] = a->addrs, (*hosts)[STAGE_ADDR_MAX] = p->avg_hosts;
    char *members = p->avg_members;
    const char *host_ptr[PEER_MAX_MEMBERS];
    int ports[PEER_MAX_MEMBERS];
    members[0] = '\0';
    *why = "malformed AVERAGE";
    /* ring_ms: how long the ring may go without progress before it gives up (the client
     * learns it from the rounds it has seen). */
    if (stage_msg_get_average(r, a)) return CIRRUS_ECORRUPT;
    const uint64_t round = a->round;
    const uint32_t n = a->n, ring_ms = a->ring_ms;
    int rank = -1;
    for (uint32_t i = 0; i < n; i++) {
        for (uint32_t j = 0; j < i; j++)
            if (strcmp(addrs[i], addrs[j]) == 0) { /* one rank each */
                *why = "AVERAGE lists one ring address twice (do two peers share a --ring-addr?)";
                return CIRRUS_ECORRUPT;
            }
        if (o->ring_addr && strcmp(addrs[i], o->ring_addr) == 0) rank = (int)i;
        strcat(members, addrs[i]); /* fits: n * STAGE_ADDR_MAX */
        strcat(members, ",");
    }
    *why = "AVERAGE names members without this peer, or an address that is not HOST:PORT";
    if (rank < 0 && n > 1) return CIRRUS_EINVAL;
    for (uint32_t i = 0; n > 1 && i < n; i++) {
        if (net_split_hostport(addrs[i], hosts[i], sizeof hosts[i], &ports[i], 0, NULL))
            return CIRRUS_EINVAL;
        host_ptr[i] = hosts[i];
    }
    stage_msg_put_average_ok(reply, p->mb_since_step);
    /* A repeated round (a member failed): start again from this peer's own gradients, and
     * build a new ring, as every member of the repeat does. */
    peer_unsum_gradients(p);
    if (round == p->last_round && p->ring) peer_drop_rings(p);
    p->last_round = round;
    if (n == 1) return 0; /* a lone member's gradients are the sum */
    pack_gradients(p, p->pack, 0);
    memcpy(p->backup, p->pack, sizeof(float) * p->pack_count);
    if (p->ring && strcmp(members, p->ring_members) != 0) peer_drop_rings(p);
    cirrus_error err = {0};
    *why = "gradient averaging failed";
    if (!p->ring) {
        char ring_job[WIRE_JOB_ID_MAX + 1];
        snprintf(ring_job, sizeof ring_job, "%.30s#%llu", o->job_id,
                 (unsigned long long)attempt);
        ring_options ro = {.job_id = ring_job, .timeout_ms = (int)ring_ms,
                           .chunk_bytes = 1 << 20};
        int rc = ring_new(&p->ring, rank, (int)n, o->ring_listen_fd, host_ptr, ports, &ro,
                             &err);
        if (rc) {
            log_warn("averaging: %s", err.msg);
            return CIRRUS_EIO; /* the request was fine; the ring was not */
        }
        if (try_device_ring(p, members, rank, (int)n, (int)ring_ms)) {
            peer_drop_rings(p);
            return CIRRUS_EIO;
        }
        snprintf(p->ring_members, sizeof p->ring_members, "%s", members);
    }
    /* A test's peer stuck mid-averaging, once. */
    uint64_t stall_at = 0, stall_ms = 0;
    if (!p->stalled && failpoint_on("stall-average-at", &stall_at) && p->steps + 1 == stall_at) {
        p->stalled = 1;
        failpoint_on("stall-average-ms", &stall_ms);
        log_warn("averaging: stalling %llu ms in step %llu (failpoint stall-average-at)",
                 (unsigned long long)stall_ms, (unsigned long long)stall_at);
        usleep((useconds_t)(stall_ms * 1000));
    }
    collective *c = p->device_ring ? p->device_ring : p->ring;
    collective_set_timeout(c, (int)ring_ms);
    int rc = collective_allreduce_sum(c, p->pack, p->pack_count, &err);
    if (rc) {
        /* A member left: drop the ring (the gradients are untouched); the client repeats
         * the round with the survivors. */
        log_warn("averaging: %s", err.msg);
        peer_drop_rings(p);
        return CIRRUS_EIO;
    }
    pack_gradients(p, p->pack, 1);
    p->summed = 1;
    return 0;
}

void peer_drop_gradients(peer *p)
{
    memset(p->model.grads, 0, sizeof(float) * p->model.n_params);
    memset(p->model.grad_head, 0, sizeof(float) * p->V * p->C);
    p->mb_since_step = 0;
    p->summed = 0;
}
