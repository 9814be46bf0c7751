/* Tests of the region coordinator's request handling (trainer/swarm/coord/server.c) and of
 * its messages (proto/coord_msg): malformed requests must drop only their own connection;
 * the decoders on their own. */
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

/* ---- abuse: malformed requests drop their own connection only ---- */

static void put_register(wire_writer *w, uint16_t role, uint32_t stage, const char *name)
{
    wire_put_u16(w, role);
    wire_put_u32(w, stage);
    wire_put_u32(w, 0);
    wire_put_u32(w, 4);
    wire_put_str(w, name);
    wire_put_str(w, "127.0.0.1");
    wire_put_u16(w, 7009);
    wire_put_f64(w, 1.0);
}

TEST_T(coordinator_malformed_requests_drop_one_connection, 15)
{
    coordinator *co = start_at(2, 50, 500, 0, 0);
    int port = coordinator_port(co);
    coord_registered good;
    coord_client *g = join(co, stage_reg("good", 0, 0, 4, 7001, 3), &good);
    beater b;
    beater_start(&b, g, 50);

    wire_writer w;
    /* Stage index out of range. */
    wire_writer_init(&w, 1024);
    put_register(&w, COORD_ROLE_STAGE, 7, "bad-stage");
    expect_refused(port, COORD_REGISTER, w.data, w.len, "stage index 7 is outside 0..1");
    /* Truncated: the same message cut anywhere. */
    for (size_t cut = 0; cut < w.len; cut += 5)
        expect_refused(port, COORD_REGISTER, w.data, cut, "truncated REGISTER");
    /* Trailing bytes. */
    wire_put_u32(&w, 0);
    expect_refused(port, COORD_REGISTER, w.data, w.len, "trailing bytes");
    wire_writer_free(&w);

    /* Overlong name. */
    char longname[101];
    memset(longname, 'n', 100);
    longname[100] = '\0';
    wire_writer_init(&w, 1024);
    put_register(&w, COORD_ROLE_STAGE, 0, longname);
    expect_refused(port, COORD_REGISTER, w.data, w.len, "name is 100 bytes, longer than the 63");
    wire_writer_free(&w);

    /* A name with characters outside the set, a bad role, an empty layer range. */
    wire_writer_init(&w, 1024);
    put_register(&w, COORD_ROLE_STAGE, 0, "a\"b");
    expect_refused(port, COORD_REGISTER, w.data, w.len, "name");
    wire_writer_free(&w);
    wire_writer_init(&w, 1024);
    put_register(&w, 9, 0, "x");
    expect_refused(port, COORD_REGISTER, w.data, w.len, "role 9");
    wire_writer_free(&w);
    wire_writer_init(&w, 1024);
    wire_put_u16(&w, COORD_ROLE_STAGE);
    wire_put_u32(&w, 0);
    wire_put_u32(&w, 4);
    wire_put_u32(&w, 4);
    wire_put_str(&w, "x");
    wire_put_str(&w, "127.0.0.1");
    wire_put_u16(&w, 7009);
    wire_put_f64(&w, 1.0);
    expect_refused(port, COORD_REGISTER, w.data, w.len, "layer range [4, 4)");
    wire_writer_free(&w);
    /* Layers beyond the model's 8. */
    wire_writer_init(&w, 1024);
    wire_put_u16(&w, COORD_ROLE_STAGE);
    wire_put_u32(&w, 1);
    wire_put_u32(&w, 4);
    wire_put_u32(&w, 9);
    wire_put_str(&w, "x");
    wire_put_str(&w, "127.0.0.1");
    wire_put_u16(&w, 7009);
    wire_put_f64(&w, 1.0);
    expect_refused(port, COORD_REGISTER, w.data, w.len, "exceeds the 8 layers");
    wire_writer_free(&w);
    /* A throughput that is not a rate. */
    wire_writer_init(&w, 1024);
    wire_put_u16(&w, COORD_ROLE_STAGE);
    wire_put_u32(&w, 1);
    wire_put_u32(&w, 4);
    wire_put_u32(&w, 8);
    wire_put_str(&w, "x");
    wire_put_str(&w, "127.0.0.1");
    wire_put_u16(&w, 7009);
    wire_put_f64(&w, NAN);
    expect_refused(port, COORD_REGISTER, w.data, w.len, "throughput");
    wire_writer_free(&w);

    /* Other messages: a short heartbeat, a PEERS stage out of range, an unknown type. */
    uint8_t junk[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    expect_refused(port, COORD_HEARTBEAT, junk, sizeof junk, "truncated HEARTBEAT");
    wire_writer_init(&w, 64);
    wire_put_u32(&w, 2);
    expect_refused(port, COORD_PEERS, w.data, w.len, "PEERS stage index 2");
    wire_writer_free(&w);
    expect_refused(port, 40, NULL, 0, "unknown request type 40");
    /* A request above the coordinator's 4 KiB limit is a framing error: dropped unanswered. */
    {
        net_conn *c = raw_connect(port);
        uint8_t *big = calloc(1, 8192);
        ASSERT(big != NULL);
        ASSERT_OK(net_send_frame(c, COORD_REGISTER, 1, big, 8192, T_MS));
        free(big);
        assert_dropped(c);
        net_close(c);
    }
    /* Garbage instead of a frame: dropped unanswered. */
    {
        net_conn *c = raw_connect(port);
        int fd = net_fd(c);
        uint8_t garbage[32];
        memset(garbage, 0xAB, sizeof garbage);
        ASSERT_EQ(send(fd, garbage, sizeof garbage, MSG_NOSIGNAL), (ssize_t)sizeof garbage);
        assert_dropped(c);
        net_close(c);
    }

    /* An unknown peer is not malformed: answered ENOENT, and the connection stays. */
    {
        net_conn *c = raw_connect(port);
        wire_writer_init(&w, 128);
        coord_stats s = {.loss = NAN};
        coord_put_heartbeat(&w, coordinator_epoch(co), 4242, &s);
        int code = 0;
        char msg[256];
        ASSERT_EQ(raw_call(c, COORD_HEARTBEAT, w.data, w.len, &code, msg), WIRE_ERROR);
        ASSERT_EQ(code, CIRRUS_ENOENT);
        ASSERT(strstr(msg, "unknown peer 4242") != NULL);
        wire_writer_free(&w);
        wire_writer_init(&w, 128);
        coord_put_heartbeat(&w, coordinator_epoch(co) + 1, good.peer_id, &s);
        ASSERT_EQ(raw_call(c, COORD_HEARTBEAT, w.data, w.len, &code, msg), WIRE_ERROR);
        ASSERT_EQ(code, CIRRUS_ENOENT);
        ASSERT(strstr(msg, "epoch") != NULL);
        wire_writer_free(&w);
        ASSERT_EQ(raw_call(c, WIRE_PING, NULL, 0, &code, msg), WIRE_PONG);
        net_close(c);
    }

    /* The client API refuses what the coordinator would refuse, without sending it. */
    coord_client *x = client_at(port);
    coord_registration bad = stage_reg("x", 0, 0, 4, 0, 1);
    cirrus_error err = {0};
    ASSERT_EQ(coord_client_register(x, &bad, T_MS, NULL, &err), CIRRUS_EINVAL);
    coord_client_close(x);
    /* A wrong job id is refused at the handshake. */
    coord_client *wrong = NULL;
    ASSERT_OK(coord_client_open("127.0.0.1", port, "other-job", &wrong, &err));
    coord_registration ok = stage_reg("y", 0, 0, 4, 7005, 1);
    ASSERT_EQ(coord_client_register(wrong, &ok, T_MS, NULL, &err), CIRRUS_EMISMATCH);
    coord_client_close(wrong);

    /* Through all of it the good peer kept heartbeating on its connection, and nobody
     * else got in. */
    sleep_ms(120);
    beater_stop(&b);
    coord_peer_info *p;
    ASSERT_EQ(list_peers(g, COORD_ALL_STAGES, &p), 1);
    ASSERT_EQ(p[0].id, good.peer_id);
    free(p);
    coord_snapshot snap;
    ASSERT_OK(coordinator_snapshot(co, &snap));
    ASSERT_EQ(snap.registrations, 1);
    ASSERT_EQ(snap.expirations, 0);
    coord_snapshot_free(&snap);
    coord_client_close(g);
    coordinator_stop(co);
}

/* ---- the decoders on their own ---- */

TEST_T(coordinator_proto_round_trip, 5)
{
    coord_registration r = stage_reg("peer-7", 3, 2, 6, 65535, 123.5), back;
    wire_writer w;
    wire_writer_init(&w, 1024);
    coord_put_registration(&w, &r);
    cirrus_error err = {0};
    ASSERT_OK(coord_get_registration(w.data, w.len, &back, &err));
    ASSERT_EQ(back.role, COORD_ROLE_STAGE);
    ASSERT_EQ(back.stage, 3);
    ASSERT_EQ(back.l0, 2);
    ASSERT_EQ(back.l1, 6);
    ASSERT_EQ(back.port, 65535);
    ASSERT(!strcmp(back.name, "peer-7"));
    ASSERT(!strcmp(back.host, "127.0.0.1"));
    ASSERT_NEAR(back.throughput, 123.5, 0);
    /* Every truncation fails. */
    for (size_t cut = 0; cut < w.len; cut++)
        ASSERT_EQ(coord_get_registration(w.data, cut, &back, &err), CIRRUS_ECORRUPT);
    wire_writer_free(&w);

    coord_stats s = {.samples = 1, .step = 2, .loss = NAN, .tokens_per_s = 3,
                     .fwd_throughput = 4, .bwd_throughput = 5}, s2;
    uint64_t epoch;
    uint32_t id;
    wire_writer_init(&w, 1024);
    coord_put_heartbeat(&w, 77, 9, &s);
    ASSERT_OK(coord_get_heartbeat(w.data, w.len, &epoch, &id, &s2, &err));
    ASSERT_EQ(epoch, 77);
    ASSERT_EQ(id, 9);
    ASSERT(isnan(s2.loss));
    ASSERT_NEAR(s2.bwd_throughput, 5, 0);
    wire_writer_free(&w);
    s.fwd_throughput = -1;
    wire_writer_init(&w, 1024);
    coord_put_heartbeat(&w, 77, 9, &s);
    ASSERT_EQ(coord_get_heartbeat(w.data, w.len, &epoch, &id, &s2, &err), CIRRUS_ECORRUPT);
    wire_writer_free(&w);

    ASSERT(coord_name_ok(""));
    ASSERT(!coord_host_ok(""));
    ASSERT(coord_host_ok("fe80::1"));
    ASSERT(!coord_name_ok("a b"));
    ASSERT(!coord_name_ok("a\nb"));
}

