/* moves: rebalancing — every period the policy (policy/rebalance.h) is fed every live
 * stage peer, the moves it accepts are told to their peers, instructions not carried out in
 * time are withdrawn, and where each named peer moved is remembered. See coord_internal.h. */
#include <stdio.h>
#include <string.h>

#include "../../../common/log.h"
#include "coord_internal.h"

/* ---- moved peers, by name (callers hold co->mu) ---- */

moved_peer *coord_moves_find(coordinator *co, const char *name)
{
    size_t kept = co->n_moved < co->o.max_peers ? co->n_moved : co->o.max_peers;
    for (size_t i = 0; i < kept; i++)
        if (!strcmp(co->moved[i].name, name)) return &co->moved[i];
    return NULL;
}

/* Remember where a named stage peer moved (the oldest entry goes when the table is full). */
void coord_moves_remember(coordinator *co, const char *name, uint32_t stage)
{
    moved_peer *mv = coord_moves_find(co, name);
    if (!mv) mv = &co->moved[co->n_moved++ % co->o.max_peers];
    snprintf(mv->name, sizeof mv->name, "%s", name);
    mv->stage = stage;
}

/* ---- rebalancing (callers hold co->mu) ---- */

static int is_stage_peer(const member *m)
{
    return m->reg.role == COORD_ROLE_STAGE;
}

int coord_moves_stage_full(const coordinator *co, uint32_t stage, const member *self)
{
    if (!co->o.max_stage_peers) return 0;
    uint32_t n = 0;
    for (size_t i = 0; i < co->n_members; i++) {
        const member *m = &co->members[i];
        if (m == self || !is_stage_peer(m)) continue;
        n += (m->instruction != COORD_NO_INSTRUCTION ? m->instruction : m->reg.stage) == stage;
    }
    return n >= co->o.max_stage_peers;
}

/* The policy forgets the peers that are no longer members. */
static void rebalance_forget_gone(coordinator *co)
{
    for (size_t i = 0; i < co->n_rb_ids; i++) {
        const member *m = coord_members_find(co, co->rb_ids[i]);
        if (!m || !is_stage_peer(m)) rebalance_peer_remove(co->rb, co->rb_ids[i]);
    }
    co->n_rb_ids = 0;
}

/* An instruction not carried out in time is withdrawn (the peer cannot move: no donor, an
 * old binary); the policy then sees the peer where it registered. */
static void withdraw_stale(coordinator *co, member *m, int64_t now)
{
    const int64_t limit = (int64_t)co->o.rebalance_period_ms * COORD_MOVE_WITHDRAW;
    const int64_t after = limit > COORD_MOVE_WITHDRAW_MIN_MS ? limit : COORD_MOVE_WITHDRAW_MIN_MS;
    if (m->instruction == COORD_NO_INSTRUCTION || now - m->instructed_ms <= after) return;
    log_warn("rebalance: peer %u '%s' did not move to stage %u within %lld s; instruction "
             "withdrawn", m->id, m->reg.name, m->instruction, (long long)(after / 1000));
    m->instruction = COORD_NO_INSTRUCTION;
    co->withdrawn++;
}

/* Every live stage peer, at its stage (or the one it is moving to: its capacity there is
 * not known yet) with its capacity, and each stage's work from its layer count. */
static int rebalance_feed(coordinator *co, int64_t now)
{
    for (size_t i = 0; i < co->n_members; i++) /* first: forgotten next period whatever fails */
        if (is_stage_peer(&co->members[i])) co->rb_ids[co->n_rb_ids++] = co->members[i].id;
    for (size_t i = 0; i < co->n_members; i++) {
        member *m = &co->members[i];
        if (!is_stage_peer(m)) continue;
        withdraw_stale(co, m, now);
        const int moving = m->instruction != COORD_NO_INSTRUCTION;
        const uint32_t stage = moving ? m->instruction : m->reg.stage;
        const double cap = moving || !m->has_stats ? 0.0 : coord_stats_capacity(&m->stats);
        rebalance_stage_work(co->rb, (int)m->reg.stage, (double)(m->reg.l1 - m->reg.l0));
        int rc = rebalance_peer_set(co->rb, m->id, (int)stage, cap);
        if (rc) return rc;
    }
    return 0;
}

static void record_move(coordinator *co, const rebalance_move *mv, int64_t now)
{
    coord_move *r = &co->recent[co->moves % COORD_RECENT_MOVES];
    *r = (coord_move){.peer_id = mv->peer_id, .from_stage = (uint32_t)mv->from_stage,
                      .to_stage = (uint32_t)mv->to_stage, .min_before = mv->min_before,
                      .min_after = mv->min_after, .period = rebalance_period(co->rb),
                      .at_s = (now - co->start_ms) / 1000.0};
    co->moves++;
}

/* The moves the policy accepts this period (each lowers its estimate of what is left to
 * gain, so a few at most), each told to its peer. */
static void rebalance_moves(coordinator *co, int64_t now)
{
    for (uint32_t i = 0; i < co->o.n_stages; i++) {
        rebalance_move mv;
        int rc = rebalance_decide(co->rb, &mv);
        if (rc < 0) log_warn("rebalance: no decision this period: %s", cirrus_strerror(rc));
        if (rc != 1) return;
        member *m = coord_members_find(co, mv.peer_id);
        if (!m || rebalance_apply(co->rb, &mv)) return; /* not reached: fed just now */
        m->instruction = (uint32_t)mv.to_stage;
        m->instructed_ms = now;
        record_move(co, &mv, now);
        log_info("rebalance: peer %u '%s' moves from stage %d to stage %d: minimum stage "
                 "capacity %.1f -> %.1f (estimated, forward units/s)", mv.peer_id,
                 m->reg.name, mv.from_stage, mv.to_stage, mv.min_before, mv.min_after);
    }
}

/* While the job has taken no step, how often the rebalancer looks whether it has. */
#define REBALANCE_START_POLL_MS 250

/* One period of the rebalancer, when it is due. The first period starts with the job's
 * first step, not with the coordinator: until then the peers start, load and wait for a
 * client, and a period spent mostly so measures startup, not the stages' capacity (on a
 * loaded machine the first decision then came after a step or two of training). */
void coord_moves_rebalance(coordinator *co, int64_t now)
{
    if (!co->rb || now < co->next_rebalance_ms) return;
    if (!co->rebalance_started) {
        co->rebalance_started = co->step > 0;
        co->next_rebalance_ms = now + (co->rebalance_started ? (int64_t)co->o.rebalance_period_ms
                                                             : REBALANCE_START_POLL_MS);
        return;
    }
    co->next_rebalance_ms = now + co->o.rebalance_period_ms;
    rebalance_forget_gone(co);
    int rc = rebalance_feed(co, now);
    if (rc) log_warn("rebalance: no decision this period: %s", cirrus_strerror(rc));
    else rebalance_moves(co, now);
    rebalance_next_period(co->rb);
}
