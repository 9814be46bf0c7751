/* pipeline: the pipeline client as an object: connecting to the stages, the routing, the
 * read-outs, closing. The work is done in the modules pipeline_internal.h lists. See
 * pipeline.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../../common/log.h"
#include "pipeline_internal.h"

int pipeline_connect(pipeline **out, const char *job_id, int n, const int *peers,
                     const char *const *addrs, const gpt_config *cfg, int max_B, int max_T,
                     int codec, int timeout_ms, cirrus_error *err)
{
    *out = NULL;
    if (n < 1 || n > PIPE_MAX_STAGES)
        return cirrus_fail(err, CIRRUS_EINVAL, "stages must be in [1, %d], got %d",
                           PIPE_MAX_STAGES, n);
    for (int s = 0; s < n; s++)
        if (peers[s] < 1 || peers[s] > PIPE_MAX_PEERS)
            return cirrus_fail(err, CIRRUS_EINVAL, "stage %d: peers must be in [1, %d], got %d",
                               s, PIPE_MAX_PEERS, peers[s]);
    pipeline *p = calloc(1, sizeof *p);
    if (!p) return cirrus_fail(err, CIRRUS_ENOMEM, "out of memory");
    p->n = n;
    p->cfg = *cfg;
    p->codec = codec;
    p->timeout_ms = timeout_ms;
    p->max_B = max_B;
    p->max_T = max_T;
    snprintf(p->job_id, sizeof p->job_id, "%s", job_id);
    deadline_config dc = deadline_config_default();
    /* Until a stage has answered a few times, wait as long as the caller's timeout. */
    dc.initial_s = timeout_ms / 1000.0;
    /* Dropping a healthy peer costs a state copy when it rejoins: with several peers
     * sharing a few cores, scheduling alone can triple a latency, so a request is given
     * up only past 3x the median and never before 1 s (a hung peer still goes in ~1 s). */
    dc.min_ratio = PIPE_PEER_DEADLINE_RATIO;
    dc.floor_s = 1.0;
    /* An averaging round is given up past 3x the median round and never before 2 s (a
     * member's first rounds also connect the ring). */
    deadline_config ac = dc;
    ac.floor_s = 2.0;
    for (int s = 0; s < n; s++)
        for (int kind = 0; kind < 3; kind++)
            if (deadline_estimator_new(kind < 2 ? &p->deadline[s][kind] : &p->avg_deadline[s],
                                          kind < 2 ? &dc : &ac) != 0) {
                pipeline_close(p);
                return cirrus_fail(err, CIRRUS_ENOMEM, "out of memory");
            }
    p->policy = WIRING_LEAST_LOADED;
    if (!(p->wiring = wiring_new(n, p->policy, 0))) {
        pipeline_close(p);
        return cirrus_fail(err, CIRRUS_ENOMEM, "out of memory");
    }
    const size_t N = (size_t)max_B * max_T, C = (size_t)cfg->n_embd;
    int rc = 0;
    for (int s = 0; s <= n && !rc; s++)
        if (!(p->acts[s] = malloc(sizeof(float) * N * C))) rc = CIRRUS_ENOMEM;
    p->tied = malloc(sizeof(float) * (size_t)cfg->vocab * C);
    if (rc || !p->tied) {
        rc = cirrus_fail(err, CIRRUS_ENOMEM, "out of memory");
        goto fail;
    }
    int a = 0;
    for (int s = 0; s < n; s++) {
        int l1 = -1; /* every peer of a stage must serve the same layers */
        for (int k = 0; k < peers[s]; k++) {
            uint64_t steps;
            p->link[s].n = k + 1;
            if ((rc = pipe_connect_peer(p, s, k, addrs[a++], &l1, &steps, err))) goto fail;
            if (steps > p->steps_done && steps != STAGE_STEPS_UNKNOWN) p->steps_done = steps;
            if (pipe_track_peer(p, s, k)) {
                rc = cirrus_fail(err, CIRRUS_ENOMEM, "out of memory");
                goto fail;
            }
        }
        p->link[s].l0 = s ? p->link[s - 1].l1 : 0;
        p->link[s].l1 = l1;
    }
    if (p->link[n - 1].l1 != cfg->n_layer) {
        rc = cirrus_fail(err, CIRRUS_EMISMATCH, "the stages end at layer %d of %d",
                         p->link[n - 1].l1, cfg->n_layer);
        goto fail;
    }
    *out = p;
    return 0;
fail:
    pipeline_close(p);
    return rc;
}

void pipeline_log_routing(const pipeline *p)
{
    for (int s = 0; s < p->n; s++) {
        char line[1024];
        size_t used = 0;
        line[0] = '\0';
        for (int k = 0; k < p->link[s].n && used < sizeof line; k++) {
            const peer_link *pl = &p->link[s].peer[k];
            wiring_peer_stats ps = {0};
            if (!pl->c || wiring_peer_stats_get(p->wiring, s, pl->wid, &ps)) continue;
            used += (size_t)snprintf(line + used, sizeof line - used,
                                     "%s%s %u requests, %.0f samples/s", used ? "; " : "",
                                     pl->addr, pl->served, ps.throughput);
        }
        log_info("stage %d routing (%s): %s", s,
                 p->policy == WIRING_ROUND_ROBIN ? "round robin" : "wiring", line);
    }
}

uint64_t pipeline_steps_done(const pipeline *p)
{
    return p->steps_done;
}

int pipeline_empty_stage(const pipeline *p)
{
    for (int s = 0; s < p->n; s++)
        if (pipe_alive_count(p, s) == 0) return s;
    return -1;
}

void pipeline_stage_load(const pipeline *p, int s, int *peers, double *samples_per_s)
{
    *peers = 0;
    *samples_per_s = 0.0;
    for (int k = 0; s >= 0 && s < p->n && k < p->link[s].n; k++) {
        const peer_link *pl = &p->link[s].peer[k];
        if (!pl->c) continue;
        (*peers)++;
        const double rate = wiring_throughput(p->wiring, s, pl->wid);
        if (rate > 0) *samples_per_s += rate;
    }
}

const pipeline_counters *pipeline_get_counters(const pipeline *p)
{
    return &p->counters;
}

int pipeline_stages(const pipeline *p)
{
    return p->n;
}

const gpt_config *pipeline_config(const pipeline *p)
{
    return &p->cfg;
}

int pipeline_set_routing(pipeline *p, enum wiring_policy policy, int inflight, uint64_t seed,
                         cirrus_error *err)
{
    if (p->n_mb) return cirrus_fail(err, CIRRUS_EINVAL, "routing changes between steps only");
    if (inflight < 0 || inflight > PIPE_MAX_MICRO)
        return cirrus_fail(err, CIRRUS_EINVAL, "microbatches in flight must be in [0, %d], got %d",
                           PIPE_MAX_MICRO, inflight);
    p->inflight = inflight;
    wiring *w = wiring_new(p->n, policy, seed);
    if (!w) return cirrus_fail(err, CIRRUS_EINVAL, "bad routing policy %d", (int)policy);
    for (int s = 0; s < p->n; s++)
        for (int k = 0; k < p->link[s].n; k++)
            if (pipe_peer_alive(p, s, k) && wiring_peer_add(w, s, p->link[s].peer[k].wid)) {
                wiring_free(w);
                return cirrus_fail(err, CIRRUS_ENOMEM, "out of memory");
            }
    wiring_free(p->wiring);
    p->wiring = w;
    p->policy = policy;
    return 0;
}

void pipeline_close(pipeline *p)
{
    if (!p) return;
    wiring_free(p->wiring);
    for (int s = 0; s < p->n; s++) {
        for (int kind = 0; kind < 2; kind++) deadline_estimator_free(p->deadline[s][kind]);
        deadline_estimator_free(p->avg_deadline[s]);
    }
    for (int s = 0; s < p->n; s++)
        for (int k = 0; k < p->link[s].n; k++) net_close(p->link[s].peer[k].c);
    for (int s = 0; s <= p->n; s++) free(p->acts[s]);
    for (int m = 0; m < PIPE_MAX_MICRO; m++) {
        mb_record *mb = &p->mb[m];
        if (!mb->x) continue;
        for (int s = 0; s < p->n; s++) {
            if (mb->in) free(mb->in[s]);
            if (mb->gout) free(mb->gout[s]);
        }
        free(mb->x);
        free(mb->y);
        free(mb->in);
        free(mb->gout);
        free(mb->bw_peer);
        free(mb->fw_peer);
    }
    free(p->tasks);
    free(p->tied);
    free(p);
}
