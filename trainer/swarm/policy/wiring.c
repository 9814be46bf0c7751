/* wiring: see wiring.h. A stage holds tens of peers, so a linear scan for the minimum is
 * cheaper and simpler than the reference's heap, and lets bans, removals and exclusions
 * act in place instead of leaving stale heap entries to skip. */
#include "wiring.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../../../common/rng.h"

/* Clocks only grow; past this, every clock of the stage is shifted down so that adding a
 * small cost to a huge clock never rounds to nothing. */
#define WIRING_REBASE 1e9
/* A measurement faster than 1 ns per sample is a clock artefact; it would make the peer
 * free forever. */
#define WIRING_MIN_SPP 1e-9
/* Cost per sample charged to a stage with no measured peer yet. All peers are equal until
 * measured, so any positive constant works, provided the clocks it advanced are converted
 * to real seconds at the stage's first measurement (stage_first_measure). */
#define WIRING_DEFAULT_SPP 1.0

typedef struct wiring_peer {
    uint32_t id;
    int banned;
    int fresh;         /* added and not chosen since: wins ties, so it is tried at once */
    uint32_t n_measured;
    double spp;        /* bias-corrected EMA of seconds per (forward) sample */
    double corr;       /* 1 - (1 - alpha)^n: the bias-correction denominator */
    double vclock;
    uint64_t chosen, completed, timeouts, errors;
} wiring_peer;

typedef struct wiring_stage {
    wiring_peer *peers;
    int n, cap;
    int rr_next;       /* round robin: index to try first */
    double vmin;       /* clock of the last chosen peer: where a peer joins an empty stage */
    double known_spp;  /* mean of the last measured peers; 0 until the first measurement */
    rng_state rng;     /* tie-breaks */
} wiring_stage;

struct wiring {
    enum wiring_policy policy;
    int n_stages;
    wiring_stage *stages;
};

wiring *wiring_new(int n_stages, enum wiring_policy policy, uint64_t seed)
{
    if (n_stages < 1 || (policy != WIRING_LEAST_LOADED && policy != WIRING_ROUND_ROBIN))
        return NULL;
    wiring *w = calloc(1, sizeof *w);
    if (!w) return NULL;
    w->stages = calloc((size_t)n_stages, sizeof *w->stages);
    if (!w->stages) {
        free(w);
        return NULL;
    }
    w->policy = policy;
    w->n_stages = n_stages;
    for (int s = 0; s < n_stages; s++) rng_seed(&w->stages[s].rng, rng_derive(seed, (uint64_t)s));
    return w;
}

void wiring_free(wiring *w)
{
    if (!w) return;
    for (int s = 0; s < w->n_stages; s++) free(w->stages[s].peers);
    free(w->stages);
    free(w);
}

static wiring_stage *stage_at(const wiring *w, int stage)
{
    if (!w || stage < 0 || stage >= w->n_stages) return NULL;
    return &w->stages[stage];
}

static int peer_index(const wiring_stage *st, uint32_t id)
{
    for (int i = 0; i < st->n; i++)
        if (st->peers[i].id == id) return i;
    return -1;
}

/* Seconds per sample assumed for a peer not measured yet: the mean over the measured
 * eligible peers, i.e. "as fast as a typical peer here". Since the bias-corrected EMA
 * replaces the prior entirely at the first measurement, the prior only prices one task. */
static double stage_prior_spp(const wiring_stage *st)
{
    double sum = 0;
    int n = 0;
    for (int i = 0; i < st->n; i++) {
        const wiring_peer *p = &st->peers[i];
        if (!p->banned && p->n_measured > 0) sum += p->spp, n++;
    }
    if (n) return sum / n;
    /* Every measured peer left: newcomers are priced as the last ones were, not at the
     * constant, which would be out of scale with the clocks. */
    return st->known_spp > 0 ? st->known_spp : WIRING_DEFAULT_SPP;
}

static double peer_spp(const wiring_stage *st, const wiring_peer *p)
{
    return p->n_measured > 0 ? p->spp : stage_prior_spp(st);
}

/* The smallest clock among eligible peers: "now" for a newcomer. */
static double stage_min_clock(const wiring_stage *st)
{
    double m = INFINITY;
    for (int i = 0; i < st->n; i++)
        if (!st->peers[i].banned && st->peers[i].vclock < m) m = st->peers[i].vclock;
    return isinf(m) ? st->vmin : m;
}

static void peer_reset(wiring_peer *p, uint32_t id, double clock)
{
    memset(p, 0, sizeof *p);
    p->id = id;
    p->fresh = 1;
    p->vclock = clock;
}

int wiring_peer_add(wiring *w, int stage, uint32_t peer_id)
{
    wiring_stage *st = stage_at(w, stage);
    if (!st || peer_id == WIRING_NONE) return CIRRUS_EINVAL;
    int i = peer_index(st, peer_id);
    if (i >= 0) {
        /* A refresh of a healthy peer must not move its clock (it would jump the queue);
         * a banned peer re-registering is a new process, perhaps on other hardware. */
        if (st->peers[i].banned) peer_reset(&st->peers[i], peer_id, stage_min_clock(st));
        return CIRRUS_OK;
    }
    if (st->n == st->cap) {
        int cap = st->cap ? 2 * st->cap : 8;
        wiring_peer *np = realloc(st->peers, (size_t)cap * sizeof *np);
        if (!np) return CIRRUS_ENOMEM;
        st->peers = np;
        st->cap = cap;
    }
    double clock = stage_min_clock(st);
    peer_reset(&st->peers[st->n++], peer_id, clock);
    return CIRRUS_OK;
}

int wiring_peer_remove(wiring *w, int stage, uint32_t peer_id)
{
    wiring_stage *st = stage_at(w, stage);
    if (!st) return CIRRUS_EINVAL;
    int i = peer_index(st, peer_id);
    if (i < 0) return CIRRUS_ENOENT;
    /* Keep the order (round robin cycles in registration order). */
    memmove(&st->peers[i], &st->peers[i + 1], (size_t)(st->n - i - 1) * sizeof *st->peers);
    st->n--;
    if (i < st->rr_next) st->rr_next--;
    if (st->rr_next >= st->n) st->rr_next = 0;
    return CIRRUS_OK;
}

static int eligible(const wiring_peer *p, uint32_t exclude_id)
{
    return !p->banned && p->id != exclude_id;
}

static int choose_round_robin(wiring_stage *st, uint32_t exclude_id)
{
    for (int k = 0; k < st->n; k++) {
        int i = (st->rr_next + k) % st->n;
        if (eligible(&st->peers[i], exclude_id)) {
            st->rr_next = (i + 1) % st->n;
            return i;
        }
    }
    return -1;
}

/* Least loaded: minimum (clock, not fresh, random). Ties among equal keys are broken
 * uniformly by reservoir sampling, so the rng is drawn only when there is a tie. */
static int choose_least_loaded(wiring_stage *st, uint32_t exclude_id)
{
    int best = -1;
    uint64_t ties = 0;
    for (int i = 0; i < st->n; i++) {
        const wiring_peer *p = &st->peers[i];
        if (!eligible(p, exclude_id)) continue;
        if (best < 0) {
            best = i, ties = 1;
            continue;
        }
        const wiring_peer *b = &st->peers[best];
        if (p->vclock < b->vclock || (p->vclock == b->vclock && p->fresh > b->fresh)) {
            best = i, ties = 1;
        } else if (p->vclock == b->vclock && p->fresh == b->fresh) {
            ties++;
            if (rng_below(&st->rng, ties) == 0) best = i;
        }
    }
    return best;
}

static void stage_rebase(wiring_stage *st)
{
    double m = stage_min_clock(st);
    for (int i = 0; i < st->n; i++) st->peers[i].vclock -= m;
    st->vmin -= m;
}

int wiring_choose(wiring *w, int stage, enum wiring_kind kind, double task_size,
                  uint32_t exclude_id, uint32_t *peer_id)
{
    wiring_stage *st = stage_at(w, stage);
    if (!st || !peer_id || !(task_size > 0) || isinf(task_size) ||
        (kind != WIRING_FORWARD && kind != WIRING_BACKWARD))
        return CIRRUS_EINVAL;
    int i = w->policy == WIRING_ROUND_ROBIN ? choose_round_robin(st, exclude_id)
                                             : choose_least_loaded(st, exclude_id);
    if (i < 0) return CIRRUS_ENOENT;
    wiring_peer *p = &st->peers[i];
    double units = kind == WIRING_BACKWARD ? WIRING_BACKWARD_COST * task_size : task_size;
    st->vmin = p->vclock;
    p->vclock += units * peer_spp(st, p);
    p->fresh = 0;
    p->chosen++;
    if (p->vclock > WIRING_REBASE) stage_rebase(st);
    *peer_id = p->id;
    return CIRRUS_OK;
}

/* EMA of seconds per sample with bias correction kept as a recursion:
 *   corr_n = (1 - a) corr_{n-1} + a   (= 1 - (1 - a)^n),   spp += (a / corr_n)(x - spp).
 * This equals Adam's ema_n / (1 - (1 - a)^n), but the first step has gain a / a = 1
 * exactly, so after one measurement the estimate IS that measurement (10 samples/s reads
 * back as 10, not the 1 an uncorrected EMA from zero would give). Seconds per sample, not
 * samples per second, is averaged, as in the reference: it is what the clock charges. */
static void peer_measure(wiring_peer *p, double spp)
{
    if (spp < WIRING_MIN_SPP) spp = WIRING_MIN_SPP;
    p->corr = (1.0 - WIRING_EMA_ALPHA) * p->corr + WIRING_EMA_ALPHA;
    p->spp += (WIRING_EMA_ALPHA / p->corr) * (spp - p->spp);
    p->n_measured++;
}

/* The stage's first measurement: until now every charge was priced at WIRING_DEFAULT_SPP
 * seconds per sample, so every clock is rescaled to the measured price. Without this, the
 * peer picked first carries a clock of seconds per sample while the others advance by
 * milliseconds, and it is not picked again for a thousand tasks. */
static void stage_first_measure(wiring_stage *st, double spp)
{
    const double scale = spp / WIRING_DEFAULT_SPP;
    for (int i = 0; i < st->n; i++) st->peers[i].vclock *= scale;
    st->vmin *= scale;
}

int wiring_report(wiring *w, int stage, uint32_t peer_id, enum wiring_kind kind,
                  double task_size, double seconds, enum wiring_outcome outcome)
{
    wiring_stage *st = stage_at(w, stage);
    if (!st || !(task_size > 0) || isinf(task_size) || !(seconds >= 0) || isinf(seconds) ||
        (kind != WIRING_FORWARD && kind != WIRING_BACKWARD))
        return CIRRUS_EINVAL;
    int i = peer_index(st, peer_id);
    if (i < 0) return CIRRUS_ENOENT;
    wiring_peer *p = &st->peers[i];
    double units = kind == WIRING_BACKWARD ? WIRING_BACKWARD_COST * task_size : task_size;
    switch (outcome) {
    case WIRING_OK:
    case WIRING_TIMEOUT:
        /* A timeout is not banned (the reference retries elsewhere and keeps the peer), but
         * the time it took without answering is a lower bound on its cost: folding it in
         * sends a struggling peer less work instead of all-or-nothing. */
        if (outcome == WIRING_OK)
            p->completed++;
        else
            p->timeouts++;
        peer_measure(p, seconds / units);
        if (st->known_spp == 0) stage_first_measure(st, p->spp);
        st->known_spp = stage_prior_spp(st);
        return CIRRUS_OK;
    case WIRING_ERROR:
        p->errors++;
        p->banned = 1;
        return CIRRUS_OK;
    }
    return CIRRUS_EINVAL;
}

double wiring_throughput(const wiring *w, int stage, uint32_t peer_id)
{
    const wiring_stage *st = stage_at(w, stage);
    if (!st) return 0;
    int i = peer_index(st, peer_id);
    if (i < 0 || st->peers[i].n_measured == 0) return 0;
    return 1.0 / st->peers[i].spp;
}

int wiring_peer_stats_get(const wiring *w, int stage, uint32_t peer_id, wiring_peer_stats *out)
{
    const wiring_stage *st = stage_at(w, stage);
    if (!st || !out) return CIRRUS_EINVAL;
    int i = peer_index(st, peer_id);
    if (i < 0) return CIRRUS_ENOENT;
    const wiring_peer *p = &st->peers[i];
    out->throughput = p->n_measured ? 1.0 / p->spp : 0;
    out->vclock = p->vclock;
    out->n_measured = p->n_measured;
    out->banned = p->banned;
    out->chosen = p->chosen;
    out->completed = p->completed;
    out->timeouts = p->timeouts;
    out->errors = p->errors;
    return CIRRUS_OK;
}

int wiring_stage_stats_get(const wiring *w, int stage, wiring_stage_stats *out)
{
    const wiring_stage *st = stage_at(w, stage);
    if (!st || !out) return CIRRUS_EINVAL;
    memset(out, 0, sizeof *out);
    double prior = stage_prior_spp(st);
    for (int i = 0; i < st->n; i++) {
        const wiring_peer *p = &st->peers[i];
        out->n_peers++;
        out->chosen += p->chosen;
        out->completed += p->completed;
        out->timeouts += p->timeouts;
        out->errors += p->errors;
        if (p->banned) continue;
        out->n_eligible++;
        out->n_measured += p->n_measured > 0;
        out->throughput += 1.0 / (p->n_measured ? p->spp : prior);
    }
    return CIRRUS_OK;
}
