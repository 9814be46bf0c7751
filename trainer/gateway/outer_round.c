/* outer_round: the outer sync's rounds (see outer_sync.h), on one thread.
 *
 * A round: the region pushed its parameters; the delta is encoded (with error feedback)
 * and sent to every other region while theirs arrive; once all are in — or the round's
 * deadline passes, learned from the rounds before — the present regions' deltas are
 * averaged and the outer step taken.
 *
 * Staying one model. Every region's message carries the digest of the global state it
 * started the round from. If they differ, the digest most regions carry wins (a tie goes
 * to the lowest region index): a gateway holding a losing digest does not take the outer
 * step itself but fetches the round's result from a gateway holding the winning one. A
 * gateway without state (new, restarted) or two or more rounds behind another (it was
 * cut off while the others went on) fetches the latest state from that gateway likewise;
 * its region's client then finds its next push refused as stale and takes the global
 * parameters. So a difference is never trained on for more than one round. A round
 * completed is final: a region whose message of it came too late is refused (WAN_LEFT_OUT)
 * and takes the result of a region that completed it, instead of finishing the round with
 * its own and the others' messages — a model no other region has, which at the job's last
 * round no later round would repair.
 *
 * A region lost. A region whose message has not arrived by the deadline, and of which no
 * bytes arrived for as long (a message still on the wire on a link that became slow is
 * waited for, up to --sync-timeout-s), is left out of the round (the weights are the
 * present regions' tokens) and marked absent: later rounds do not wait for it beyond a
 * short grace, until it JOINs or sends again. Gateways that disagree on who was present
 * end with different digests, which the next round repairs as above.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../../common/failpoint.h"
#include "../../common/log.h"
#include "adapt.h"
#include "outer_internal.h"

#define ROUND_DEADLINE_MIN_MS 3000   /* never less, whatever the rounds before took */
#define ROUND_ABSENT_GRACE_MS 1000   /* how long a round waits for an absent region */
#define ROUND_PROBE_MS 3000          /* the first look for other regions' state */
#define ROUND_RESEED_MS 10000        /* how long a gateway behind its client looks for a
                                      * later global state before it takes the region's */

/* Sleep on the condition for up to 100 ms. Under mu. */
static void wait_a_while(outer_lane *os)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += 100 * 1000000L;
    if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
    pthread_cond_timedwait(&os->changed, &os->mu, &ts);
}

/* How long a round may wait for the other regions: 4x the longest of the last rounds'
 * waits plus 2 s, at least ROUND_DEADLINE_MIN_MS, at most --sync-timeout-s; the timeout
 * itself before any round was seen. Under mu. */
static int64_t round_deadline_ms(const outer_lane *os)
{
    if (os->n_waits == 0) return os->o.round_timeout_ms;
    double worst = 0;
    const int n = os->n_waits < 8 ? os->n_waits : 8;
    for (int i = 0; i < n; i++) worst = os->waits[i] > worst ? os->waits[i] : worst;
    int64_t ms = (int64_t)(4000.0 * worst) + 2000;
    if (ms < ROUND_DEADLINE_MIN_MS) ms = ROUND_DEADLINE_MIN_MS;
    return ms < os->o.round_timeout_ms ? ms : os->o.round_timeout_ms;
}

typedef struct send_job {
    outer_lane *os;
    int j;
    uint64_t round, len;
    wan_send_meta meta;
    const uint8_t *msg;
    int64_t deadline;
    int rc; /* wan_link_send's */
} send_job;

static void *send_main(void *arg)
{
    send_job *sj = arg;
    cirrus_error err = {0};
    int rc = sj->rc = wan_link_send(sj->os, sj->j, sj->round, sj->msg, sj->len, &sj->meta,
                                    sj->deadline, &err);
    if (rc && !atomic_load(&sj->os->stopping))
        log_warn("outer round %llu: region %s did not take our delta: %s",
                 (unsigned long long)sj->round, sj->os->names[sj->j], err.msg);
    if (rc == WAN_LEFT_OUT) { /* it finished this round without us: its result is the job's */
        pthread_mutex_lock(&sj->os->mu);
        sj->os->peer[sj->j].left_us_out = (int64_t)sj->round;
        pthread_mutex_unlock(&sj->os->mu);
    }
    return NULL;
}

/* Round k is done here with region j's message, but j never took ours: our sends gave up
 * (it was catching up, refusing them as too far ahead, until just before our deadline) and
 * its message came in after. It waits for ours to its own deadline (the whole
 * --sync-timeout-s on a restarted gateway), and no one sends it again: send it now, from
 * this thread, the one that sends to j, for at most another span_ms. Under mu (released
 * while sending). */
static void deliver_late(outer_lane *os, uint64_t k, const send_job *jobs, int64_t span_ms)
{
    const round_slot *own = &os->slot[k & 1][os->o.region_index];
    for (int j = 0; j < os->o.n_regions && !atomic_load(&os->stopping); j++) {
        const round_slot *sl = &os->slot[k & 1][j];
        if (j == os->o.region_index || !jobs[j].rc || jobs[j].rc == WAN_LEFT_OUT ||
            sl->round != k || !sl->complete)
            continue;
        log_warn("outer round %llu: region %s's delta is in but it never took ours: sending "
                 "it again", (unsigned long long)k, os->names[j]);
        /* own stays: only this thread replaces it, at the next round. */
        const uint8_t *msg = own->bytes;
        const uint64_t len = own->total;
        const wan_send_meta meta = {own->tokens, own->prev_digest, own->at, own->wish};
        pthread_mutex_unlock(&os->mu);
        cirrus_error err = {0};
        int rc = wan_link_send(os, j, k, msg, len, &meta, net_now_ms() + span_ms, &err);
        if (rc && !atomic_load(&os->stopping))
            log_warn("outer round %llu: region %s still did not take our delta: %s",
                     (unsigned long long)k, os->names[j], err.msg);
        pthread_mutex_lock(&os->mu);
    }
}

/* Whether a missing message of round k is still arriving: bytes of it came in the last
 * span_ms. A region whose message is on the wire is not lost, however slow its link has
 * become; the round waits for it (up to --sync-timeout-s) rather than going on without it
 * and leaving two regions with different global states to repair. Under mu. */
static int still_arriving(const outer_lane *os, uint64_t k, int64_t span_ms)
{
    const int64_t now = net_now_ms();
    for (int r = 0; r < os->o.n_regions; r++) {
        const round_slot *sl = &os->slot[k & 1][r];
        if (sl->round == k && !sl->complete && sl->got > 0 && now - sl->progress_ms < span_ms)
            return 1;
    }
    return 0;
}

/* Whether the round can be finished: every region's message is in, or every present
 * (not absent) region's is and absent ones had their grace. Under mu. */
static int round_ready(const outer_lane *os, uint64_t k, int64_t started_ms)
{
    const int graced = net_now_ms() - started_ms > ROUND_ABSENT_GRACE_MS;
    for (int r = 0; r < os->o.n_regions; r++) {
        const round_slot *sl = &os->slot[k & 1][r];
        if (sl->round == k && sl->complete) continue;
        if (!(os->peer[r].absent && graced)) return 0;
    }
    return 1;
}

/* The digest most of round k's messages carry (ties: the lowest region's), and in
 * *winner_region a region that carries it. Under mu. */
static uint64_t winning_digest(const outer_lane *os, uint64_t k, int *winner_region)
{
    uint64_t best = os->digest;
    int best_votes = -1;
    *winner_region = os->o.region_index;
    for (int r = 0; r < os->o.n_regions; r++) {
        const round_slot *a = &os->slot[k & 1][r];
        if (a->round != k || !a->complete) continue;
        int votes = 0;
        for (int q = 0; q < os->o.n_regions; q++) {
            const round_slot *b = &os->slot[k & 1][q];
            votes += b->round == k && b->complete && b->prev_digest == a->prev_digest;
        }
        if (votes > best_votes) { /* regions in order: a tie keeps the lower one */
            best_votes = votes;
            best = a->prev_digest;
            *winner_region = r;
        }
    }
    return best;
}

/* Average the present regions' deltas of round k (decoded from their bytes, in region
 * order, weighted by tokens) and take the outer step. Called and returns under mu, which it
 * releases while decoding and averaging (a PULL or /status need not wait for that): round
 * k's complete messages stay as they are meanwhile, since receivers leave a complete slot
 * alone and take no message of a round past round + 2, and only this thread moves the
 * round on. The outer step itself changes theta and mom, which PULLs and STATE fetches
 * read under mu: it runs under mu. */
static int take_step(outer_lane *os, uint64_t k, float *avg, float *dec, int *present,
                     cirrus_error *err)
{
    struct { const uint8_t *bytes; uint64_t total, tokens; } in[WAN_MAX_REGIONS];
    uint64_t at[WAN_MAX_REGIONS];
    uint32_t wish[WAN_MAX_REGIONS];
    double tokens = 0.0;
    *present = 0;
    for (int r = 0; r < os->o.n_regions; r++) {
        const round_slot *sl = &os->slot[k & 1][r];
        if (sl->round != k || !sl->complete) continue;
        in[*present].bytes = sl->bytes;
        in[*present].total = sl->total;
        in[*present].tokens = sl->tokens;
        at[*present] = sl->at;
        wish[*present] = sl->wish;
        tokens += (double)sl->tokens;
        (*present)++;
    }
    pthread_mutex_unlock(&os->mu);
    memset(avg, 0, os->n * sizeof(float));
    int rc = 0;
    for (int i = 0; i < *present && !rc; i++) {
        rc = wan_decode(in[i].bytes, in[i].total, dec, os->n, err);
        /* Equal weights when no tokens were reported (every region alike). */
        const float w = tokens > 0 ? (float)((double)in[i].tokens / tokens) : 1.0f / (float)*present;
        for (uint64_t j = 0; !rc && j < os->n; j++) avg[j] += w * dec[j];
    }
    pthread_mutex_lock(&os->mu);
    if (rc) return rc;
    outer_step(&os->o.opt, os->theta, os->mom, avg, os->n);
    const outer_schedule was = os->sched;
    outer_schedule_advance(&os->sched, at, wish, *present);
    os->digest = outer_state_digest(os->theta, os->mom, os->n, &os->sched);
    os->round = (int64_t)k;
    if (os->sched.next_stride != was.next_stride)
        log_info("outer round %llu: the round after next is pushed %u x %d inner steps after "
                 "the next (was %u x %d)%s", (unsigned long long)k, os->sched.next_stride,
                 os->o.sync_every, was.next_stride, os->o.sync_every, os->lane_name);
    return 0;
}

/* Take region j's global state (of a round >= min_round) as ours. Not under mu. */
static int adopt_from(outer_lane *os, int j, int64_t min_round, int64_t deadline,
                      const char *why)
{
    float *theta = malloc(os->n * sizeof(float)), *mom = malloc(os->n * sizeof(float));
    cirrus_error err = {0};
    int64_t round = -1;
    outer_schedule sched = OUTER_SCHEDULE_START;
    uint64_t digest = 0;
    int rc = theta && mom ? wan_link_fetch_state(os, j, min_round, deadline, theta, mom, &round,
                                                 &sched, &digest, &err)
                          : cirrus_fail(&err, CIRRUS_ENOMEM, "out of memory");
    pthread_mutex_lock(&os->mu);
    if (!rc && round > os->round) {
        memcpy(os->theta, theta, os->n * sizeof(float));
        memcpy(os->mom, mom, os->n * sizeof(float));
        os->round = round;
        os->sched = sched;
        os->digest = digest;
        /* A push of a round this state is past is answered by it (the round thread drops
         * it): the region's next push must not find it in progress. */
        if (os->push_ready && (int64_t)os->push_round <= round) os->push_ready = 0;
        log_warn("outer: took the global state of outer step %lld from region %s (%s): "
                 "digest %016llx", (long long)round, os->names[j], why,
                 (unsigned long long)digest);
        pthread_cond_broadcast(&os->changed);
    } else if (rc) {
        log_warn("outer: could not take region %s's global state (%s): %s", os->names[j], why,
                 err.msg);
    }
    pthread_mutex_unlock(&os->mu);
    free(theta);
    free(mom);
    return rc;
}

/* A region two or more rounds ahead of us (or with state when we have none): we missed
 * rounds; take its state. */
static void catch_up(outer_lane *os, int startup)
{
    pthread_mutex_lock(&os->mu);
    int best = -1;
    for (int r = 0; r < os->o.n_regions; r++) {
        if (r == os->o.region_index || os->peer[r].round_seen < 0) continue;
        /* Round 0 is every region's initial state, which a region's client provides
         * itself (and the next round's digests check): only later rounds are fetched. */
        const int64_t gap = os->peer[r].round_seen - os->round;
        /* The region's client pushed round client_ahead: the job completed the one before. */
        const int told = os->client_ahead > 0 &&
                         os->peer[r].round_seen >= (int64_t)os->client_ahead - 1;
        if (os->peer[r].round_seen >= 1 &&
            (gap >= 2 || (gap >= 1 && (startup || told || os->round < 0))) &&
            (best < 0 || os->peer[r].round_seen > os->peer[best].round_seen))
            best = r;
    }
    const int64_t want = best >= 0 ? os->peer[best].round_seen : -1;
    pthread_mutex_unlock(&os->mu);
    if (best >= 0)
        adopt_from(os, best, want, net_now_ms() + os->o.round_timeout_ms,
                   startup ? "joining" : "this gateway fell behind");
}

/* --codec auto: the rung for this round from the slowest present link's rate and the
 * region's compute time between syncs: the time since its last push, less the time it then
 * waited for that round (a blocking sync, or one longer than --sync-delay). Counting that
 * wait would let a slow sync make its own window longer. That time is for the stride of H
 * steps the pushes were apart; this round's message has until the round after it, its own
 * stride (schedule.h). Returns the stride this gateway wishes for after the round: above 1
 * when even the sparsest rung does not fit (adapt_stride). Under mu. */
static uint32_t choose_codec(outer_lane *os)
{
    const double now = outer_wall_s();
    if (os->last_push_s > 0) {
        /* The client's own measure where it gave one: the gateway sees the waits only
         * from its side (a round the region took from another's state, or finished late
         * without it, ends no wait here) and a window counting them would widen itself. */
        double w = now - os->last_push_s;
        if (os->push_compute_ms > 0)
            w = os->push_compute_ms / 1000.0;
        else if (os->wait_round == (uint64_t)os->round && os->last_sync_s > os->wait_since &&
                 os->wait_since > os->last_push_s)
            w -= os->last_sync_s - os->wait_since;
        if (w < 0.01) w = 0.01;
        w /= os->sched.stride;
        os->base_window_s = os->base_window_s > 0 ? 0.5 * os->base_window_s + 0.5 * w : w;
        os->window_s = os->base_window_s * os->sched.next_stride;
    }
    os->last_push_s = now;
    double slowest = 0;
    for (int r = 0; r < os->o.n_regions; r++) {
        const wan_peer *pe = &os->peer[r];
        if (r == os->o.region_index || pe->absent || pe->rate.Bps <= 0) continue;
        if (slowest == 0 || pe->rate.Bps < slowest) slowest = pe->rate.Bps;
    }
    const int was = os->rung;
    /* The lanes' messages share the link, each in its own slot of the window: a lane's
     * must cross in its share of it. */
    const int lanes = os->group->n_lanes;
    os->rung = adapt_choose(os->rung, os->n, slowest, os->window_s / lanes, os->codec_why,
                            sizeof os->codec_why);
    adapt_rung(os->rung, &os->o.codec);
    uint64_t cap; /* tests: a test run's steps bound how far apart its rounds may go */
    if (!failpoint_on("max-sync-stride", &cap) || cap > OUTER_MAX_STRIDE) cap = OUTER_MAX_STRIDE;
    const uint32_t wish = adapt_stride(os->sched.next_stride, os->n, slowest,
                                       os->base_window_s / lanes, (uint32_t)cap);
    if (wish > 1 || os->sched.next_stride > 1) {
        const size_t used = strlen(os->codec_why);
        snprintf(os->codec_why + used, sizeof os->codec_why - used,
                 "; synced every %u x %d steps, %u wished after", os->sched.next_stride,
                 os->o.sync_every, wish);
    }
    if (os->rung != was || wish != os->sched.next_stride)
        log_info("outer round %lld: codec %s", (long long)os->round + 1, os->codec_why);
    return wish;
}

/* Whether some region has completed round k + 1 or later: it is past round k for good, and
 * will not send its message of k (a region one round ahead may still be: it sent it before
 * completing k). Under mu. */
static int others_past(const outer_lane *os, uint64_t k)
{
    for (int r = 0; r < os->o.n_regions; r++)
        if (r != os->o.region_index && os->peer[r].round_seen >= (int64_t)k + 1) return 1;
    return 0;
}

/* Whether some region completed round k without this one and refused our message of it
 * (send_main: WAN_LEFT_OUT): its result is the job's, and no other region's message of k
 * is worth waiting for. Under mu. */
static int left_out_of(const outer_lane *os, uint64_t k)
{
    for (int r = 0; r < os->o.n_regions; r++)
        if (r != os->o.region_index && os->peer[r].left_us_out >= (int64_t)k) return 1;
    return 0;
}

/* One round, from the region's push to the new global state. Called and returns under mu. */
static void run_round(outer_lane *os, float *delta, float *residual, float *avg, float *dec)
{
    const size_t n = os->n;
    const uint64_t k = (uint64_t)os->round + 1;
    const int64_t t0 = net_now_ms();
    for (size_t i = 0; i < n; i++) delta[i] = os->theta[i] - os->region[i];
    const uint64_t tokens = os->push_tokens, prev_digest = os->digest, at = os->push_at;
    const int64_t deadline = t0 + round_deadline_ms(os);
    const uint32_t wish = os->o.codec_auto ? choose_codec(os) : 1;
    const wan_codec_params codec = os->o.codec;
    int absent[WAN_MAX_REGIONS];
    for (int j = 0; j < os->o.n_regions; j++) absent[j] = os->peer[j].absent;
    pthread_mutex_unlock(&os->mu);

    /* Encode with error feedback; the message goes into our own slot, decoded later like
     * every other region's. */
    cirrus_error err = {0};
    const size_t cap = wan_encode_bound(n, &codec);
    uint8_t *msg = malloc(cap);
    size_t len = 0;
    int rc = msg ? wan_encode(&codec, delta, residual, n, msg, cap, &len, &err)
                 : cirrus_fail(&err, CIRRUS_ENOMEM, "out of memory for the message");
    if (rc) {
        log_error("outer round %llu: %s", (unsigned long long)k, err.msg);
        free(msg);
        pthread_mutex_lock(&os->mu);
        os->push_ready = 0; /* the client sees no progress and times out */
        return;
    }
    send_job jobs[WAN_MAX_REGIONS];
    pthread_t th[WAN_MAX_REGIONS];
    int started[WAN_MAX_REGIONS] = {0};
    for (int j = 0; j < os->o.n_regions; j++) {
        if (j == os->o.region_index) continue;
        const int64_t until = absent[j] ? t0 + ROUND_ABSENT_GRACE_MS : deadline;
        jobs[j] = (send_job){os, j, k, len, {tokens, prev_digest, at, wish}, msg, until, 0};
        started[j] = pthread_create(&th[j], NULL, send_main, &jobs[j]) == 0;
        if (!started[j]) send_main(&jobs[j]);
    }
    pthread_mutex_lock(&os->mu);
    round_slot *own = &os->slot[k & 1][os->o.region_index];
    free(own->bytes);
    *own = (round_slot){.round = k, .bytes = msg, .total = len, .got = len, .tokens = tokens,
                        .prev_digest = prev_digest, .at = at, .wish = wish, .complete = 1};
    pthread_cond_broadcast(&os->changed);
    pthread_mutex_unlock(&os->mu);
    for (int j = 0; j < os->o.n_regions; j++)
        if (started[j]) pthread_join(th[j], NULL);

    pthread_mutex_lock(&os->mu);
    const int64_t span = deadline - t0, hard = t0 + os->o.round_timeout_ms;
    while (!atomic_load(&os->stopping) && !round_ready(os, k, t0) &&
           (net_now_ms() <= deadline || (net_now_ms() <= hard && still_arriving(os, k, span))) &&
           os->round < (int64_t)k && !others_past(os, k) && !left_out_of(os, k))
        wait_a_while(os);
    if (!atomic_load(&os->stopping) && os->round < (int64_t)k && others_past(os, k)) {
        /* This gateway is behind the job (it restarted and its region pushed before it
         * caught up): the others will not send this round; take their state. */
        log_warn("outer round %llu: the other regions are past it; taking the job's state",
                 (unsigned long long)k);
        pthread_mutex_unlock(&os->mu);
        catch_up(os, 0);
        pthread_mutex_lock(&os->mu);
    }
    if (atomic_load(&os->stopping) || os->round >= (int64_t)k) {
        os->push_ready = 0; /* stopping, or the round's result was taken from another region */
        return;
    }
    /* A region completed round k without this one (it went on while this region's client
     * was stopped or behind, e.g. at the job's end) and refused our message of it: its
     * result is the job's. One computed here with its message would differ from every
     * other region's, with perhaps no later round to repair it; take its result instead. */
    for (int r = 0; r < os->o.n_regions && os->round < (int64_t)k; r++) {
        if (r == os->o.region_index || os->peer[r].left_us_out < (int64_t)k ||
            atomic_load(&os->stopping))
            continue;
        pthread_mutex_unlock(&os->mu);
        adopt_from(os, r, (int64_t)k, net_now_ms() + os->o.round_timeout_ms,
                   "it completed this round without this region");
        pthread_mutex_lock(&os->mu);
    }
    if (atomic_load(&os->stopping) || os->round >= (int64_t)k) {
        os->push_ready = 0;
        return;
    }
    /* Who is in: the others are absent from now on, until a message of theirs arrives. */
    char missing[WAN_MAX_REGIONS * (WAN_REGION_MAX + 2)] = "";
    for (int r = 0; r < os->o.n_regions; r++) {
        const round_slot *sl = &os->slot[k & 1][r];
        const int in = sl->round == k && sl->complete;
        os->peer[r].absent = !in;
        if (!in) strcat(strcat(missing, " "), os->names[r]);
    }
    if (*missing)
        log_warn("outer round %llu: going on without region(s)%s (no delta after %lld ms)",
                 (unsigned long long)k, missing, (long long)(net_now_ms() - t0));
    else
        os->waits[os->n_waits++ % 8] = (net_now_ms() - t0) / 1000.0;
    int winner;
    const uint64_t win = winning_digest(os, k, &winner);
    if (win != prev_digest) {
        /* Most regions started this round from another state than ours: theirs is the
         * job's; take the round's result from one of them. */
        os->mismatches++;
        log_error("outer round %llu: our global state (digest %016llx) differs from the "
                  "regions' (%016llx): repairing from region %s", (unsigned long long)k,
                  (unsigned long long)prev_digest, (unsigned long long)win, os->names[winner]);
        pthread_mutex_unlock(&os->mu);
        adopt_from(os, winner, (int64_t)k, net_now_ms() + os->o.round_timeout_ms,
                   "digest repair");
        pthread_mutex_lock(&os->mu);
    } else {
        int present = 0;
        for (int r = 0; r < os->o.n_regions; r++) {
            const round_slot *sl = &os->slot[k & 1][r];
            if (sl->round == k && sl->complete && sl->prev_digest != prev_digest) {
                os->mismatches++; /* they are repairing from us */
                log_warn("outer round %llu: region %s started from another state (digest "
                         "%016llx); it takes ours", (unsigned long long)k, os->names[r],
                         (unsigned long long)sl->prev_digest);
            }
        }
        if ((rc = take_step(os, k, avg, dec, &present, &err))) {
            log_error("outer round %llu: %s", (unsigned long long)k, err.msg);
            return;
        }
        /* A test's silent divergence, which the next round's digests must catch. */
        uint64_t corrupt_after = 0;
        if (failpoint_on("corrupt-after", &corrupt_after) && corrupt_after == k) {
            os->theta[0] += 1e-3f;
            os->digest = outer_state_digest(os->theta, os->mom, os->n, &os->sched);
            log_warn("outer round %llu: global parameter 0 changed (failpoint corrupt-after)",
                     (unsigned long long)k);
        }
    }
    if (os->round < (int64_t)k) return; /* the repair failed: the client waits, times out */
    os->push_ready = 0;
    os->last_sync_s = outer_wall_s();
    os->last_duration_s = os->last_sync_s - os->push_time;
    char codec_name[48];
    wan_codec_format(&codec, codec_name, sizeof codec_name);
    log_info("outer round %llu done in %.2f s (%lld ms on the WAN): digest %016llx, "
             "%zu-byte delta, WAN bytes %llu sent, %llu received; codec %s, window %.2f s%s",
             (unsigned long long)k, os->last_duration_s, (long long)(net_now_ms() - t0),
             (unsigned long long)os->digest, len, (unsigned long long)os->wan_sent,
             (unsigned long long)os->wan_received, codec_name, os->window_s, os->lane_name);
    pthread_cond_broadcast(&os->changed);
    deliver_late(os, k, jobs, deadline - t0);
}

/* The region's client pushed outer step client_ahead, past round + 1, and no other region
 * is known to hold a global state later than this gateway's: the whole job restarted (a
 * suspended job resumed from its checkpoints; every gateway starts empty), or the others
 * stayed unreachable for ROUND_RESEED_MS. The job's global state is then nowhere: this
 * gateway's (the region's parameters adopted at its client's start, round 0, or the one it
 * held) becomes that of outer step client_ahead - 1, so the region's push is the next
 * round's, and training goes on. Regions that reseed differently are made one model by
 * the next round's digests (outer_sync.h). Under mu; 1 if it reseeded. */
static int reseed_if_alone(outer_lane *os, int64_t behind_since_ms)
{
    if (os->round < 0) return 0; /* the client pushes round 0 first */
    for (int r = 0; r < os->o.n_regions; r++)
        if (r != os->o.region_index && os->peer[r].round_seen > os->round) return 0;
    if (os->o.n_regions > 1 && net_now_ms() - behind_since_ms < ROUND_RESEED_MS) return 0;
    const int64_t was = os->round;
    os->round = (int64_t)os->client_ahead - 1;
    /* As if outer step client_ahead - 1 had been pushed a stride before the client's push
     * (whose round is the next): a region fetching this state pushes with it. */
    const uint64_t span = os->o.sync_every > 0 ? (uint64_t)os->sched.stride * os->o.sync_every : 0;
    os->sched.at = os->client_ahead_at > span ? os->client_ahead_at - span : 0;
    os->digest = outer_state_digest(os->theta, os->mom, os->n, &os->sched);
    log_warn("outer: the region's client is at outer step %llu and no region holds a global "
             "state past outer step %lld: this gateway's becomes outer step %lld's (digest "
             "%016llx)", (unsigned long long)os->client_ahead, (long long)was,
             (long long)os->round, (unsigned long long)os->digest);
    pthread_cond_broadcast(&os->changed);
    return 1;
}

void *outer_round_main(void *arg)
{
    outer_lane *os = arg;
    const size_t n = os->n;
    float *delta = malloc(n * sizeof(float)), *residual = calloc(n, sizeof(float));
    float *avg = malloc(n * sizeof(float)), *dec = malloc(n * sizeof(float));
    if (!delta || !residual || !avg || !dec) {
        log_error("outer: out of memory for %zu parameters", n);
        goto out;
    }
    /* Joining: a region that already has the job's global state gives it to us. */
    if (os->o.n_regions > 1) {
        wan_link_probe(os, net_now_ms() + ROUND_PROBE_MS);
        catch_up(os, 1);
    }
    int64_t next_probe = net_now_ms() + ROUND_PROBE_MS, behind_since = -1;
    pthread_mutex_lock(&os->mu);
    while (!atomic_load(&os->stopping)) {
        if (os->push_ready) {
            run_round(os, delta, residual, avg, dec);
            continue;
        }
        const int behind = os->client_ahead > (uint64_t)(os->round + 1);
        if (!behind) behind_since = -1;
        else if (behind_since < 0) behind_since = net_now_ms();
        if (behind && reseed_if_alone(os, behind_since)) continue;
        if (os->o.n_regions > 1 && (net_now_ms() > next_probe || behind)) {
            pthread_mutex_unlock(&os->mu);
            if (behind) wan_link_probe(os, net_now_ms() + ROUND_PROBE_MS); /* fresh JOINs */
            catch_up(os, 0);
            next_probe = net_now_ms() + ROUND_PROBE_MS;
            pthread_mutex_lock(&os->mu);
            if (behind && os->client_ahead > (uint64_t)(os->round + 1)) wait_a_while(os);
            continue;
        }
        wait_a_while(os);
    }
    pthread_mutex_unlock(&os->mu);
out:
    free(delta);
    free(residual);
    free(avg);
    free(dec);
    return NULL;
}
