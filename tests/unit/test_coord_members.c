/* Tests of the region coordinator's membership (trainer/swarm/coord/members.c) over real
 * sockets on 127.0.0.1: registration and listing, heartbeats, a replaced peer that had
 * moved, expiry, and a coordinator restart. */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "../../trainer/net/conn.h"
#include "../../trainer/swarm/coord/coordinator.h"
#include "coord_test_util.h"
#include "test.h"

/* ---- membership ---- */

TEST_T(coordinator_register_and_list, 10)
{
    coordinator *co = start(2);
    coord_registered a, b, d;
    coord_client *pa = join(co, stage_reg("peer-a", 0, 0, 4, 7001, 10.5), &a);
    coord_client *pb = join(co, stage_reg("peer-b", 0, 0, 4, 7002, 20.25), &b);
    coord_client *pd = join(co, stage_reg("peer-d", 1, 4, 8, 7003, 7), &d);
    ASSERT(a.peer_id != b.peer_id && b.peer_id != d.peer_id && a.peer_id != d.peer_id);
    ASSERT_EQ(a.epoch, coordinator_epoch(co));
    ASSERT_EQ(d.epoch, coordinator_epoch(co));
    ASSERT_EQ(a.heartbeat_ms, 1000);
    ASSERT_EQ(a.expire_ms, 3000); /* the default: three intervals */

    /* Any member (or a plain client that never registered) may list. */
    coord_client *q = client_at(coordinator_port(co));
    coord_peer_info *p;
    uint32_t n_stages = 0;
    size_t n = 0;
    cirrus_error err = {0};
    ASSERT_OK(coord_client_peers(q, COORD_ALL_STAGES, T_MS, &p, &n, &n_stages, &err));
    ASSERT_EQ(n, 3);
    ASSERT_EQ(n_stages, 2);
    const coord_peer_info *e = by_id(p, n, b.peer_id);
    ASSERT(e != NULL);
    ASSERT_EQ(e->stage, 0);
    ASSERT_EQ(e->l0, 0);
    ASSERT_EQ(e->l1, 4);
    ASSERT_EQ(e->port, 7002);
    ASSERT(!strcmp(e->host, "127.0.0.1"));
    ASSERT(!strcmp(e->name, "peer-b"));
    ASSERT_NEAR(e->throughput, 20.25, 0);
    free(p);

    ASSERT_EQ(list_peers(q, 0, &p), 2);
    ASSERT(by_id(p, 2, a.peer_id) && by_id(p, 2, b.peer_id));
    free(p);
    ASSERT_EQ(list_peers(q, 1, &p), 1);
    ASSERT_EQ(p[0].id, d.peer_id);
    ASSERT_EQ(p[0].l0, 4);
    ASSERT_EQ(p[0].l1, 8);
    ASSERT_NEAR(p[0].throughput, 7, 0);
    free(p);

    /* Re-registering under the same name keeps the id and updates the entry. */
    coord_registered a2;
    coord_registration ra = stage_reg("peer-a", 1, 4, 8, 7011, 9);
    ASSERT_OK(coord_client_register(pa, &ra, T_MS, &a2, &err));
    ASSERT_EQ(a2.peer_id, a.peer_id);
    ASSERT_EQ(list_peers(q, 1, NULL), 2);
    ASSERT_EQ(list_peers(q, 0, NULL), 1);

    /* Clients are members but not peers: they are not listed. */
    coord_client *cl = join(co, client_reg("client-0"), NULL);
    ASSERT_EQ(list_peers(q, COORD_ALL_STAGES, NULL), 3);

    coord_client_close(cl);
    coord_client_close(q);
    coord_client_close(pa);
    coord_client_close(pb);
    coord_client_close(pd);
    coordinator_stop(co);
}

TEST_T(coordinator_heartbeat_updates_stats, 10)
{
    coordinator *co = start(2);
    coord_registered a;
    coord_client *pa = join(co, stage_reg("peer-a", 0, 0, 4, 7001, 10), &a);
    coord_stats s = {.samples = 640, .step = 12, .loss = 3.25f, .tokens_per_s = 4096,
                     .fwd_throughput = 55.5, .bwd_throughput = 20};
    uint32_t ins = 0;
    int rereg = -1;
    heartbeat(pa, &s, &ins, &rereg);
    ASSERT_EQ(ins, COORD_NO_INSTRUCTION);
    ASSERT_EQ(rereg, 0);

    /* The listed throughput is now the measured forward rate. */
    coord_peer_info *p;
    ASSERT_EQ(list_peers(pa, 0, &p), 1);
    ASSERT_NEAR(p[0].throughput, 55.5, 0);
    free(p);

    coord_snapshot snap;
    ASSERT_OK(coordinator_snapshot(co, &snap));
    ASSERT_EQ(snap.n_members, 1);
    const coord_member_view *m = &snap.members[0];
    ASSERT_EQ(m->info.id, a.peer_id);
    ASSERT_EQ(m->stats.samples, 640);
    ASSERT_EQ(m->stats.step, 12);
    ASSERT_NEAR(m->stats.loss, 3.25, 0);
    ASSERT_NEAR(m->stats.tokens_per_s, 4096, 0);
    ASSERT_NEAR(m->stats.bwd_throughput, 20, 0);
    ASSERT_EQ(snap.step, 12);
    ASSERT_NEAR(snap.loss, 3.25, 0); /* no client reported: a heartbeat's loss */
    ASSERT_NEAR(snap.stage_throughput[0], 55.5, 0);
    coord_snapshot_free(&snap);

    /* A later heartbeat replaces the stats. */
    s.samples = 1280, s.step = 13, s.fwd_throughput = 60;
    heartbeat(pa, &s, &ins, &rereg);
    ASSERT_OK(coordinator_snapshot(co, &snap));
    ASSERT_EQ(snap.members[0].stats.samples, 1280);
    ASSERT_EQ(snap.step, 13);
    ASSERT_NEAR(snap.stage_throughput[0], 60, 0);
    coord_snapshot_free(&snap);

    /* The rebalancing instruction rides on HEARTBEAT_OK until the peer moves. */
    ASSERT_EQ(coordinator_set_instruction(co, a.peer_id, 2), CIRRUS_EINVAL);
    ASSERT_EQ(coordinator_set_instruction(co, 999, 1), CIRRUS_ENOENT);
    ASSERT_OK(coordinator_set_instruction(co, a.peer_id, 1));
    heartbeat(pa, &s, &ins, &rereg);
    ASSERT_EQ(ins, 1);
    heartbeat(pa, &s, &ins, &rereg);
    ASSERT_EQ(ins, 1);
    coord_registration moved = stage_reg("peer-a", 1, 4, 8, 7001, 10);
    cirrus_error err = {0};
    ASSERT_OK(coord_client_register(pa, &moved, T_MS, NULL, &err));
    heartbeat(pa, &s, &ins, &rereg);
    ASSERT_EQ(ins, COORD_NO_INSTRUCTION);

    /* Leaving is not expiring. */
    ASSERT_OK(coord_client_leave(pa, T_MS, &err));
    ASSERT_EQ(coord_client_peer_id(pa), 0);
    ASSERT_EQ(list_peers(pa, COORD_ALL_STAGES, NULL), 0);
    ASSERT_OK(coordinator_snapshot(co, &snap));
    ASSERT_EQ(snap.expirations, 0);
    coord_snapshot_free(&snap);
    ASSERT_EQ(coord_client_heartbeat(pa, &s, T_MS, NULL, NULL, &err), CIRRUS_EINVAL);

    coord_client_close(pa);
    coordinator_stop(co);
}

/* A peer moved by rebalancing and then replaced under the same name (the operator names a
 * peer after its Pod, which a replacement keeps) comes back at its original stage: the
 * coordinator tells it at once to move where its predecessor had been moved, both when it
 * registers fresh and when it registers while its predecessor's entry is still there. A
 * name that never moved gets no instruction. */
TEST_T(coordinator_replaced_moved_peer_moves_again, 10)
{
    coordinator *co = start(3);
    coord_registered a;
    coord_stats s = {.loss = NAN, .fwd_throughput = 5};
    uint32_t ins = 0;
    int rereg = 0;
    cirrus_error err = {0};
    coord_client *pa = join(co, stage_reg("job-r1-stage0-0", 0, 0, 3, 7001, 10), &a);
    ASSERT_OK(coordinator_set_instruction(co, a.peer_id, 2));
    coord_registration moved = stage_reg("job-r1-stage0-0", 2, 6, 8, 7001, 10);
    ASSERT_OK(coord_client_register(pa, &moved, T_MS, NULL, &err));
    heartbeat(pa, &s, &ins, &rereg);
    ASSERT_EQ(ins, COORD_NO_INSTRUCTION);

    /* Replaced before its predecessor expired: same name, original stage. */
    coord_client *pb = join(co, stage_reg("job-r1-stage0-0", 0, 0, 3, 7002, 10), NULL);
    heartbeat(pb, &s, &ins, &rereg);
    ASSERT_EQ(ins, 2);
    /* It moves: the instruction is done. */
    moved.port = 7002;
    ASSERT_OK(coord_client_register(pb, &moved, T_MS, NULL, &err));
    heartbeat(pb, &s, &ins, &rereg);
    ASSERT_EQ(ins, COORD_NO_INSTRUCTION);
    ASSERT_OK(coord_client_leave(pb, T_MS, &err));

    /* Replaced after its predecessor left: a fresh registration, told the same. */
    coord_client *pc = join(co, stage_reg("job-r1-stage0-0", 0, 0, 3, 7003, 10), NULL);
    heartbeat(pc, &s, &ins, &rereg);
    ASSERT_EQ(ins, 2);

    /* Another peer of stage 0 never moved: nothing for it. */
    coord_client *pd = join(co, stage_reg("job-r1-stage0-1", 0, 0, 3, 7004, 10), NULL);
    heartbeat(pd, &s, &ins, &rereg);
    ASSERT_EQ(ins, COORD_NO_INSTRUCTION);

    coord_client_close(pa);
    coord_client_close(pb);
    coord_client_close(pc);
    coord_client_close(pd);
    coordinator_stop(co);
}

TEST_T(coordinator_peer_expires, 10)
{
    const uint32_t hb = 50, expire = 250;
    coordinator *co = start_at(2, hb, expire, 0, 0);
    coord_registered live, dead;
    coord_client *pl = join(co, stage_reg("live", 0, 0, 4, 7001, 5), &live);
    double t_reg = now_ms();
    coord_client *pd = join(co, stage_reg("dead", 1, 4, 8, 7002, 9), &dead);
    ASSERT_EQ(live.heartbeat_ms, hb);
    ASSERT_EQ(live.expire_ms, expire);
    beater b;
    beater_start(&b, pl, (int)hb);

    /* Still there before its time... */
    ASSERT_EQ(list_peers(pl, 1, NULL), 1);
    /* ...gone after it, and only it. */
    double gone = 0;
    while (!gone) {
        if (list_peers(pl, 1, NULL) == 0) gone = now_ms();
        else if (now_ms() - t_reg > 3000) TEST_FAIL("the silent peer never expired");
        else sleep_ms(10);
    }
    ASSERT(gone - t_reg >= expire);
    ASSERT_EQ(list_peers(pl, 0, NULL), 1);

    json_t *j = get_status(co);
    ASSERT_EQ(jint(j, "peer_expirations"), 1);
    json_t *stages = json_object_get(j, "stages");
    ASSERT_EQ(jint(json_array_get(stages, 0), "peers"), 1);
    ASSERT_EQ(jint(json_array_get(stages, 1), "peers"), 0);
    ASSERT_NEAR(jnum(json_array_get(stages, 1), "throughput"), 0, 0);
    json_t *members = json_object_get(j, "members");
    ASSERT_EQ(json_array_size(members), 1);
    ASSERT_EQ(jint(json_array_get(members, 0), "id"), live.peer_id);
    json_decref(j);
    char *m = get_metrics(co);
    has_line(m, "cirrus_peer_expirations_total 1");
    has_line(m, "cirrus_peers{stage=\"1\"} 0");
    free(m);

    /* The expired peer learns it at its next heartbeat and comes back under a new id. */
    int rereg = 0;
    coord_stats s = {.loss = NAN};
    heartbeat(pd, &s, NULL, &rereg);
    ASSERT_EQ(rereg, 1);
    ASSERT(coord_client_peer_id(pd) != dead.peer_id);
    ASSERT_EQ(list_peers(pl, 1, NULL), 1);

    beater_stop(&b);
    coord_client_close(pl);
    coord_client_close(pd);
    coordinator_stop(co);
}

TEST_T(coordinator_restart_recovers_membership, 15)
{
    int fds = count_fds();
    coordinator *co = start_at(2, 100, 0, 0, 0);
    int port = coordinator_port(co);
    uint64_t epoch1 = coordinator_epoch(co);
    ASSERT(epoch1 != 0 && epoch1 < (1ull << 53));
    coord_client *m[3];
    coord_registered id[3];
    m[0] = join(co, stage_reg("p0", 0, 0, 4, 7001, 1), &id[0]);
    m[1] = join(co, stage_reg("p1", 0, 0, 4, 7002, 2), &id[1]);
    m[2] = join(co, stage_reg("p2", 1, 4, 8, 7003, 3), &id[2]);
    coord_client *cl = join(co, client_reg("trainer"), NULL);
    coord_stats s = {.loss = NAN};
    for (int i = 0; i < 3; i++) heartbeat(m[i], &s, NULL, NULL);

    coordinator_stop(co);
    /* While it is down, heartbeats fail promptly with an error, not a hang. */
    cirrus_error err = {0};
    double t0 = now_ms();
    ASSERT(coord_client_heartbeat(m[0], &s, 500, NULL, NULL, &err) != 0);
    ASSERT_LT(now_ms() - t0, 1000);

    /* A new coordinator on the same port: nothing of the old membership... */
    co = start_at(2, 100, 0, port, 0);
    ASSERT_EQ(coordinator_port(co), port);
    uint64_t epoch2 = coordinator_epoch(co);
    ASSERT(epoch2 != epoch1);
    ASSERT_EQ(list_peers(m[0], COORD_ALL_STAGES, NULL), 0);

    /* ...until each member's next heartbeat: unknown peer -> re-register. */
    for (int i = 0; i < 3; i++) {
        int rereg = 0;
        heartbeat(m[i], &s, NULL, &rereg);
        ASSERT_EQ(rereg, 1);
        ASSERT_EQ(coord_client_epoch(m[i]), epoch2);
        /* The next one is plain again. */
        heartbeat(m[i], &s, NULL, &rereg);
        ASSERT_EQ(rereg, 0);
    }
    coord_report rep = {.step = 5, .loss = 2.0f, .tokens_per_s = 10, .mb_retried = 1};
    int rereg = 0;
    ASSERT_OK(coord_client_report(cl, &rep, T_MS, &rereg, &err));
    ASSERT_EQ(rereg, 1);

    coord_peer_info *p;
    size_t n = list_peers(m[0], COORD_ALL_STAGES, &p);
    ASSERT_EQ(n, 3);
    const char *names[3] = {"p0", "p1", "p2"};
    for (int i = 0; i < 3; i++) {
        const coord_peer_info *e = by_id(p, n, coord_client_peer_id(m[i]));
        ASSERT(e != NULL);
        ASSERT(!strcmp(e->name, names[i]));
        ASSERT_EQ(e->stage, i < 2 ? 0 : 1);
        ASSERT_EQ(e->port, 7001 + i);
    }
    free(p);
    json_t *j = get_status(co);
    ASSERT_EQ(jint(j, "epoch"), (json_int_t)epoch2);
    ASSERT_EQ(jint(j, "clients"), 1);
    ASSERT_EQ(jint(j, "step"), 5);
    json_decref(j);

    for (int i = 0; i < 3; i++) coord_client_close(m[i]);
    coord_client_close(cl);
    coordinator_stop(co);
    ASSERT_EQ(count_fds(), fds);
}

