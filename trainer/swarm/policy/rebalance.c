/* rebalance: see rebalance.h. Swarms hold tens to hundreds of peers and tens of stages, and
 * a decision is taken once a period (minutes), so every candidate move is simply evaluated
 * in full: O(stages^2 * peers) per decision, no incremental bookkeeping to get wrong. */
#include "rebalance.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define NEVER INT64_MIN
/* Relative difference below which two estimated minima count as equal, so tie-breaks do
 * not depend on the order floating-point sums were taken in. */
#define TIE_EPS 1e-9

typedef struct rb_stage {
    double work;
    int64_t last_give, last_recv; /* periods of its last donation / reception, or NEVER */
} rb_stage;

typedef struct rb_peer {
    uint32_t id;
    int stage;
    double tput;       /* samples/s at its stage; <= 0 unknown */
    int64_t last_move; /* period of its last move, or NEVER */
} rb_peer;

struct rebalance_state {
    rebalance_config cfg;
    int64_t period;
    int n_stages;
    rb_stage *stages;
    int64_t *flow; /* flow[a * n_stages + b]: last period a peer moved a -> b, or NEVER */
    rb_peer *peers;
    int n_peers, cap;
};

/* Per-stage totals computed for one decision. */
typedef struct rb_total {
    double tput;        /* sum of effective throughputs */
    double known_sum;   /* sum over measured peers */
    int n, n_known;
} rb_total;

rebalance_config rebalance_config_default(void)
{
    rebalance_config c = {.min_gain = 0.10, .reverse_gain = 0.25, .min_peers = 1,
                          .hold_periods = 3, .reverse_memory = 50};
    return c;
}

rebalance_state *rebalance_new(int n_stages, const rebalance_config *cfg)
{
    rebalance_config c = cfg ? *cfg : rebalance_config_default();
    if (n_stages < 1 || !(c.min_gain >= 0) || isinf(c.min_gain) || !(c.reverse_gain >= 0) ||
        isinf(c.reverse_gain) || c.min_peers < 0 || c.max_peers < 0 || c.hold_periods < 0 ||
        c.reverse_memory < 0 || n_stages > 4096)
        return NULL;
    rebalance_state *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->stages = calloc((size_t)n_stages, sizeof *s->stages);
    s->flow = malloc((size_t)n_stages * (size_t)n_stages * sizeof *s->flow);
    if (!s->stages || !s->flow) {
        rebalance_free(s);
        return NULL;
    }
    s->cfg = c;
    s->n_stages = n_stages;
    for (int i = 0; i < n_stages; i++) {
        s->stages[i].work = 1.0;
        s->stages[i].last_give = s->stages[i].last_recv = NEVER;
    }
    for (int i = 0; i < n_stages * n_stages; i++) s->flow[i] = NEVER;
    return s;
}

void rebalance_free(rebalance_state *s)
{
    if (!s) return;
    free(s->stages);
    free(s->flow);
    free(s->peers);
    free(s);
}

int rebalance_stage_work(rebalance_state *s, int stage, double work)
{
    if (!s || stage < 0 || stage >= s->n_stages || !(work > 0) || isinf(work))
        return CIRRUS_EINVAL;
    s->stages[stage].work = work;
    return CIRRUS_OK;
}

static rb_peer *find_peer(const rebalance_state *s, uint32_t id)
{
    for (int i = 0; i < s->n_peers; i++)
        if (s->peers[i].id == id) return &s->peers[i];
    return NULL;
}

int rebalance_peer_set(rebalance_state *s, uint32_t peer_id, int stage, double throughput)
{
    if (!s || stage < 0 || stage >= s->n_stages || isnan(throughput) || isinf(throughput))
        return CIRRUS_EINVAL;
    rb_peer *p = find_peer(s, peer_id);
    if (!p) {
        if (s->n_peers == s->cap) {
            int cap = s->cap ? 2 * s->cap : 16;
            rb_peer *np = realloc(s->peers, (size_t)cap * sizeof *np);
            if (!np) return CIRRUS_ENOMEM;
            s->peers = np;
            s->cap = cap;
        }
        p = &s->peers[s->n_peers++];
        p->id = peer_id;
        p->last_move = NEVER;
    }
    p->stage = stage;
    p->tput = throughput;
    return CIRRUS_OK;
}

int rebalance_peer_remove(rebalance_state *s, uint32_t peer_id)
{
    if (!s) return CIRRUS_EINVAL;
    rb_peer *p = find_peer(s, peer_id);
    if (!p) return CIRRUS_ENOENT;
    *p = s->peers[--s->n_peers];
    return CIRRUS_OK;
}

/* Whether something that happened at period `last` is still within `hold` periods. */
static int within(const rebalance_state *s, int64_t last, int hold)
{
    return last != NEVER && s->period - last < hold;
}

/* A peer's throughput for the decision: measured, else the mean of its stage's measured
 * peers, else of all measured peers, else 1 (all alike, only counts matter). */
static double peer_tput(const rb_total *t, double global_mean, const rb_peer *p)
{
    if (p->tput > 0) return p->tput;
    const rb_total *st = &t[p->stage];
    return st->n_known ? st->known_sum / st->n_known : global_mean;
}

static void totals(const rebalance_state *s, rb_total *t, double *global_mean)
{
    double known = 0;
    int n_known = 0;
    memset(t, 0, (size_t)s->n_stages * sizeof *t);
    for (int i = 0; i < s->n_peers; i++) {
        const rb_peer *p = &s->peers[i];
        t[p->stage].n++;
        if (p->tput > 0) {
            t[p->stage].known_sum += p->tput, t[p->stage].n_known++;
            known += p->tput, n_known++;
        }
    }
    *global_mean = n_known ? known / n_known : 1.0;
    for (int i = 0; i < s->n_peers; i++)
        t[s->peers[i].stage].tput += peer_tput(t, *global_mean, &s->peers[i]);
}

static int near(double a, double b)
{
    return fabs(a - b) <= TIE_EPS * fmax(fabs(a), fabs(b));
}

static int cmp_double(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

/* Leximin order of two ascending throughput vectors: a higher minimum wins, then a higher
 * second smallest, and so on. It generalises "raise the minimum" to the steps that only
 * prepare a gain (fill one of two empty stages with the fastest spare peer, not the
 * slowest). 1: a better, -1: b better, 0: equal within TIE_EPS. */
static int leximin(const double *a, const double *b, int n)
{
    for (int i = 0; i < n; i++)
        if (!near(a[i], b[i])) return a[i] > b[i] ? 1 : -1;
    return 0;
}

int rebalance_decide(const rebalance_state *s, rebalance_move *out)
{
    if (!s || !out) return CIRRUS_EINVAL;
    const rebalance_config *c = &s->cfg;
    int S = s->n_stages;
    rb_total *t = malloc((size_t)S * sizeof *t);
    double *cand = malloc(2 * (size_t)S * sizeof *cand), *best = cand + S;
    if (!t || !cand) {
        free(t);
        free(cand);
        return CIRRUS_ENOMEM;
    }
    double gmean;
    totals(s, t, &gmean);
    double m = INFINITY;
    for (int i = 0; i < S; i++) m = fmin(m, t[i].tput);
    /* The bottleneck "band": stages within min_gain of the minimum. Raising one of them is
     * all a single move can do for the minimum. */
    double band = m * (1 + c->min_gain);
    int n_band = 0;
    for (int i = 0; i < S; i++) n_band += t[i].tput <= band;
    int peer_hold = c->hold_periods > 1 ? c->hold_periods : 1; /* never twice a period */
    int found = 0;
    double best_donor = 0;
    for (int b = 0; b < S; b++) {
        if (t[b].tput > band) continue;
        if (c->max_peers > 0 && t[b].n >= c->max_peers) continue; /* full */
        int urgent = t[b].n < c->min_peers || t[b].tput <= 0;
        if (!urgent && within(s, s->stages[b].last_give, c->hold_periods)) continue;
        for (int i = 0; i < s->n_peers; i++) {
            const rb_peer *p = &s->peers[i];
            int a = p->stage;
            if (a == b || t[a].n - 1 < c->min_peers) continue;
            if (within(s, p->last_move, peer_hold)) continue;
            if (!urgent && within(s, s->stages[a].last_recv, c->hold_periods)) continue;
            double tp = peer_tput(t, gmean, p);
            double ta = t[a].tput - tp;
            double tb = t[b].tput + tp * s->stages[a].work / s->stages[b].work;
            int nb = 0;
            for (int k = 0; k < S; k++) {
                cand[k] = k == a ? ta : k == b ? tb : t[k].tput;
                nb += cand[k] <= band;
            }
            qsort(cand, (size_t)S, sizeof *cand, cmp_double);
            double mn = cand[0];
            /* Peers went b -> a lately: sending one back needs a stronger reason. */
            int reverse = within(s, s->flow[b * S + a], c->reverse_memory);
            double need = reverse ? c->reverse_gain : c->min_gain;
            /* A clear gain of the minimum; or, among tied bottleneck stages, one fewer
             * (not against a recent flow: that must be a clear gain). */
            int ok = m > 0 ? mn >= m * (1 + need) : mn > 0;
            if (!ok && !reverse) ok = mn >= m && nb < n_band;
            if (!ok) continue;
            /* Rank: leximin; then the donor left best provided (the slower mover: less
             * capacity idles while it downloads its new stage); then the lower id. */
            int cmp = found ? leximin(cand, best, S) : 1;
            if (cmp == 0 && !near(ta, best_donor)) cmp = ta > best_donor ? 1 : -1;
            if (cmp == 0) cmp = p->id < out->peer_id ? 1 : -1;
            if (cmp <= 0) continue;
            memcpy(best, cand, (size_t)S * sizeof *best);
            best_donor = ta;
            out->peer_id = p->id;
            out->from_stage = a;
            out->to_stage = b;
            out->min_before = m;
            out->min_after = mn;
            found = 1;
        }
    }
    free(t);
    free(cand);
    return found;
}

int rebalance_apply(rebalance_state *s, const rebalance_move *m)
{
    if (!s || !m || m->to_stage < 0 || m->to_stage >= s->n_stages) return CIRRUS_EINVAL;
    rb_peer *p = find_peer(s, m->peer_id);
    if (!p) return CIRRUS_ENOENT;
    if (p->stage != m->from_stage || m->from_stage == m->to_stage) return CIRRUS_EINVAL;
    if (p->tput > 0) p->tput *= s->stages[m->from_stage].work / s->stages[m->to_stage].work;
    s->flow[m->from_stage * s->n_stages + m->to_stage] = s->period;
    p->last_move = s->period;
    p->stage = m->to_stage;
    s->stages[m->from_stage].last_give = s->period;
    s->stages[m->to_stage].last_recv = s->period;
    return CIRRUS_OK;
}

void rebalance_next_period(rebalance_state *s)
{
    if (s) s->period++;
}

int rebalance_stage_info(const rebalance_state *s, int stage, int *n_peers, double *throughput)
{
    if (!s || stage < 0 || stage >= s->n_stages) return CIRRUS_EINVAL;
    rb_total *t = malloc((size_t)s->n_stages * sizeof *t);
    if (!t) return CIRRUS_ENOMEM;
    double gmean;
    totals(s, t, &gmean);
    if (n_peers) *n_peers = t[stage].n;
    if (throughput) *throughput = t[stage].tput;
    free(t);
    return CIRRUS_OK;
}

int64_t rebalance_period(const rebalance_state *s)
{
    return s ? s->period : 0;
}
