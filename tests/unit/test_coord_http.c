/* Tests of the region coordinator's HTTP face (trainer/swarm/coord/http_status.c, served by
 * common/http_server.c): /status parsed with jansson field by field, /metrics line by line,
 * and HTTP errors. */
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

/* ---- HTTP ---- */

/* Two stages: peers a (10.5 -> measured 12.5) and b (20.25) on stage 0, d (7) on stage 1,
 * and one client that reported twice (its totals reset in between: it restarted). */
static coordinator *populated(coord_client *m[4])
{
    coordinator *co = start_at(2, 1000, 0, 0, 12345);
    m[0] = join(co, stage_reg("peer-a", 0, 0, 4, 7001, 10.5), NULL);
    m[1] = join(co, stage_reg("peer-b", 0, 0, 4, 7002, 20.25), NULL);
    m[2] = join(co, stage_reg("peer-d", 1, 4, 8, 7003, 7), NULL);
    m[3] = join(co, client_reg("trainer-0"), NULL);
    coord_stats s = {.samples = 64, .step = 41, .loss = NAN, .tokens_per_s = 800,
                     .fwd_throughput = 12.5, .bwd_throughput = 5};
    heartbeat(m[0], &s, NULL, NULL);
    cirrus_error err = {0};
    coord_report r1 = {.step = 40, .loss = 3.0f, .tokens_per_s = 900, .mb_retried = 3,
                       .mb_lost = 1};
    ASSERT_OK(coord_client_report(m[3], &r1, T_MS, NULL, &err));
    coord_report r2 = {.step = 42, .loss = 2.5f, .tokens_per_s = 1000, .mb_retried = 2,
                       .mb_lost = 0};
    ASSERT_OK(coord_client_report(m[3], &r2, T_MS, NULL, &err));
    return co;
}

static void depopulate(coordinator *co, coord_client *m[4])
{
    for (int i = 0; i < 4; i++) coord_client_close(m[i]);
    coordinator_stop(co);
}

TEST_T(coordinator_status_json, 10)
{
    coord_client *m[4];
    coordinator *co = populated(m);
    json_t *j = get_status(co);
    ASSERT(json_is_object(j));
    ASSERT(!strcmp(json_string_value(json_object_get(j, "job_id")), JOB));
    ASSERT_EQ(jint(j, "epoch"), 12345);
    double up = jnum(j, "uptime_s");
    ASSERT(up >= 0 && up < 60);
    ASSERT_EQ(jint(j, "step"), 42);
    ASSERT_NEAR(jnum(j, "loss"), 2.5, 0);
    ASSERT_NEAR(jnum(j, "tokens_per_s"), 1000, 0);
    ASSERT_EQ(jint(j, "n_stages"), 2);
    json_t *st = json_object_get(j, "stages");
    ASSERT_EQ(json_array_size(st), 2);
    ASSERT_EQ(jint(json_array_get(st, 0), "stage"), 0);
    ASSERT_EQ(jint(json_array_get(st, 0), "peers"), 2);
    ASSERT_NEAR(jnum(json_array_get(st, 0), "throughput"), 12.5 + 20.25, 0);
    ASSERT_EQ(jint(json_array_get(st, 1), "stage"), 1);
    ASSERT_EQ(jint(json_array_get(st, 1), "peers"), 1);
    ASSERT_NEAR(jnum(json_array_get(st, 1), "throughput"), 7, 0);
    ASSERT_EQ(jint(j, "clients"), 1);
    ASSERT_EQ(jint(j, "microbatches_retried"), 3 + 2); /* the restart kept the first 3 */
    ASSERT_EQ(jint(j, "microbatches_lost"), 1 + 0);
    ASSERT_EQ(jint(j, "peer_expirations"), 0);
    ASSERT_EQ(jint(j, "registrations"), 4);
    json_t *ms = json_object_get(j, "members");
    ASSERT_EQ(json_array_size(ms), 4);
    json_t *a = json_array_get(ms, 0);
    ASSERT(!strcmp(json_string_value(json_object_get(a, "name")), "peer-a"));
    ASSERT(!strcmp(json_string_value(json_object_get(a, "role")), "stage"));
    ASSERT(!strcmp(json_string_value(json_object_get(a, "addr")), "127.0.0.1:7001"));
    ASSERT_EQ(jint(a, "stage"), 0);
    json_t *layers = json_object_get(a, "layers");
    ASSERT_EQ(json_array_size(layers), 2);
    ASSERT_EQ(json_integer_value(json_array_get(layers, 0)), 0);
    ASSERT_EQ(json_integer_value(json_array_get(layers, 1)), 4);
    ASSERT_NEAR(jnum(a, "throughput"), 12.5, 0);
    ASSERT_EQ(jint(a, "samples"), 64);
    ASSERT_EQ(jint(a, "step"), 41);
    ASSERT(json_is_null(json_object_get(a, "loss"))); /* NaN is not JSON */
    json_t *c = json_array_get(ms, 3);
    ASSERT(!strcmp(json_string_value(json_object_get(c, "role")), "client"));
    ASSERT(json_object_get(c, "stage") == NULL);
    json_decref(j);
    depopulate(co, m);
}

TEST_T(coordinator_metrics_text, 10)
{
    coord_client *m[4];
    coordinator *co = populated(m);
    char *t = get_metrics(co);
    static const char *lines[] = {
        "# HELP cirrus_peers Live stage peers per stage.",
        "# TYPE cirrus_peers gauge",
        "cirrus_peers{stage=\"0\"} 2",
        "cirrus_peers{stage=\"1\"} 1",
        "# TYPE cirrus_stage_throughput_samples_per_second gauge",
        "cirrus_stage_throughput_samples_per_second{stage=\"0\"} 32.75",
        "cirrus_stage_throughput_samples_per_second{stage=\"1\"} 7",
        "# TYPE cirrus_step gauge",
        "cirrus_step 42",
        "# TYPE cirrus_loss gauge",
        "cirrus_loss 2.5",
        "cirrus_tokens_per_second 1000",
        "cirrus_clients 1",
        "# TYPE cirrus_microbatches_retried_total counter",
        "cirrus_microbatches_retried_total 5",
        "cirrus_microbatches_lost_total 1",
        "# TYPE cirrus_peer_expirations_total counter",
        "cirrus_peer_expirations_total 0",
        "cirrus_registrations_total 4",
        "cirrus_coordinator_epoch 12345",
        "cirrus_stages 2",
    };
    for (size_t i = 0; i < sizeof lines / sizeof *lines; i++) has_line(t, lines[i]);
    /* Every sample belongs to a family announced by HELP and TYPE lines before it. */
    char *save = NULL, *copy = strdup(t);
    ASSERT(copy != NULL);
    for (char *line = strtok_r(copy, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        if (line[0] == '#') continue;
        char name[128], help[160], type[160];
        ASSERT_EQ(sscanf(line, "%127[a-z_]", name), 1);
        snprintf(help, sizeof help, "# HELP %s ", name);
        snprintf(type, sizeof type, "# TYPE %s ", name);
        const char *at = strstr(t, line), *h = strstr(t, help), *ty = strstr(t, type);
        if (!h || !ty || h > at || ty > at) TEST_FAIL("'%s' has no HELP/TYPE before it", line);
    }
    free(copy);
    ASSERT(t[strlen(t) - 1] == '\n');
    free(t);
    depopulate(co, m);
}

TEST_T(coordinator_http_errors, 10)
{
    coordinator *co = start(1);
    int port = coordinator_http_port(co);
    http_reply r;
    http_req(port, "GET", "/nope", &r);
    ASSERT_EQ(r.status, 404);
    free(r.body);
    http_req(port, "GET", "/", &r);
    ASSERT_EQ(r.status, 404);
    free(r.body);
    http_req(port, "GET", "/status/extra", &r);
    ASSERT_EQ(r.status, 404);
    free(r.body);
    http_req(port, "POST", "/status", &r);
    ASSERT_EQ(r.status, 405);
    ASSERT(has_header(&r, "\r\nAllow: GET, HEAD"));
    free(r.body);
    http_req(port, "DELETE", "/metrics", &r);
    ASSERT_EQ(r.status, 405);
    free(r.body);
    http_req(port, "PUT", "/nope", &r);
    ASSERT_EQ(r.status, 405);
    free(r.body);
    /* HEAD is GET without the body; a query string does not change the path. */
    http_req(port, "HEAD", "/metrics", &r);
    ASSERT_EQ(r.status, 200);
    ASSERT_EQ(r.body_len, 0);
    free(r.body);
    http_req(port, "GET", "/status?pretty=1", &r);
    ASSERT_EQ(r.status, 200);
    free(r.body);
    /* The peer protocol is unaffected. */
    coord_client *c = join(co, stage_reg("p", 0, 0, 8, 7001, 1), NULL);
    coord_client_close(c);
    coordinator_stop(co);
}

