/* seeds: writes the fuzz harnesses' seed corpus, tests/fuzz/corpus/<harness>/seed-*.
 *
 * Binary seeds come from the code's own encoders: frames from wire_header_encode and
 * wire_writer (HELLO, ERROR, PING), q8 buffers from codec_q8_encode, checkpoints from
 * ckpt_save of the smallest model (whole and a stage's span). The SwarmJob seed is
 * manifests/samples/swarmjob.yaml converted to JSON by the operator's own YAML reader, as
 * the API server would return it (uid, namespace, a status). The other text seeds are what
 * the API server, a gateway and the command line produce, in their exact formats.
 * Cross-region seeds: messages from wan_encode with every codec (plain and +zstd, where zstd
 * shrinks them), and every gateway message body from its put function (wan_msg, outer_msg).
 * Usage: seeds CORPUS_DIR (run from the repository root).
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "../../operator/kube/yamljson.h"
#include "../../trainer/ckpt/checkpoint.h"
#include "../../trainer/codec/q8.h"
#include "../../trainer/gateway/outer_msg.h"
#include "../../trainer/gateway/wan_codec.h"
#include "../../trainer/gateway/wan_msg.h"
#include "../../trainer/net/wire.h"
#include "../../trainer/swarm/proto/coord_msg.h"
#include "../../trainer/swarm/proto/stage_msg.h"

static const char *root;

static void put(const char *harness, const char *name, const void *data, size_t len)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", root, harness);
    if (mkdir(path, 0777) != 0 && errno != EEXIST) {
        perror(path);
        exit(1);
    }
    snprintf(path, sizeof path, "%s/%s/seed-%s", root, harness, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, len, f) != len || fclose(f) != 0) {
        perror(path);
        exit(1);
    }
}

static void put_str(const char *harness, const char *name, const char *s) { put(harness, name, s, strlen(s)); }

/* fuzz_wire's layout: header, n, n reader ops, payload. */
static void frame(const char *name, uint16_t type, const wire_writer *w, const uint8_t *ops, size_t n_ops)
{
    uint8_t buf[4096];
    wire_header_encode(buf, type, 0x0102030405060708ull, w->data, (uint32_t)w->len);
    buf[WIRE_HEADER_SIZE] = (uint8_t)n_ops;
    memcpy(buf + WIRE_HEADER_SIZE + 1, ops, n_ops);
    memcpy(buf + WIRE_HEADER_SIZE + 1 + n_ops, w->data, w->len);
    put("wire", name, buf, WIRE_HEADER_SIZE + 1 + n_ops + w->len);
}

static void wire_seeds(void)
{
    wire_writer w;
    /* HELLO: u16 role, u32 peer_id, str job_id (ops: u16, u32, str into 64 bytes) */
    wire_writer_init(&w, 1024);
    wire_put_u16(&w, 2);
    wire_put_u32(&w, 7);
    wire_put_str(&w, "tiny-bible-0d4a7f3e");
    frame("hello", WIRE_HELLO, &w, (const uint8_t[]){0, 1, 6 + 7 * 8}, 3);
    wire_writer_free(&w);
    /* ERROR: i32 code, str message */
    wire_writer_init(&w, 1024);
    wire_put_u32(&w, (uint32_t)-4);
    wire_put_str(&w, "job id mismatch");
    frame("error", WIRE_ERROR, &w, (const uint8_t[]){1, 6 + 7 * 4}, 2);
    wire_writer_free(&w);
    /* PING: empty; and a payload of floats and bytes */
    wire_writer_init(&w, 1024);
    frame("ping", WIRE_PING, &w, NULL, 0);
    wire_put_u64(&w, 42);
    wire_put_f32(&w, 1.5f);
    wire_put_f64(&w, -0.25);
    wire_put_bytes(&w, "activations", 12);
    frame("mixed", 64, &w, (const uint8_t[]){2, 3, 4, 5 + 7 * 4}, 4);
    wire_writer_free(&w);
}

static void q8_seeds(void)
{
    const size_t counts[3] = {64, 100, 300};
    for (int k = 0; k < 3; k++) {
        size_t n = counts[k];
        float x[300];
        for (size_t i = 0; i < n; i++) x[i] = (float)(sin(0.37 * (double)i) * (k == 2 ? 1e-40 : 3.0 + (double)k));
        size_t len = codec_q8_encoded_size(n);
        uint8_t buf[3 + 1500];
        buf[0] = 3; /* n from the length; encode too */
        buf[1] = (uint8_t)n;
        buf[2] = (uint8_t)(n >> 8);
        if (codec_q8_encode(buf + 3, x, n)) abort();
        char name[32];
        snprintf(name, sizeof name, "acts-%zu", n);
        put("q8", name, buf, 3 + len);
    }
}

static void ckpt_seed(const char *name, const gpt_span *span, const char *tmp)
{
    ckpt_meta m = {{1, 4, 1, 4, GPT_VOCAB}, 12, {1, 345}, 0x9e3779b97f4a7c15ull, 1337, *span,
                   "cirrus-seed-job"};
    float *p = malloc(span->count * sizeof(float) * 3);
    if (!p) abort();
    for (size_t i = 0; i < 3 * span->count; i++) p[i] = (float)cos((double)i) * 0.02f;
    cirrus_error err;
    if (ckpt_save(tmp, &m, p, p + span->count, p + 2 * span->count, &err)) {
        fprintf(stderr, "seeds: %s\n", err.msg);
        exit(1);
    }
    free(p);
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", tmp, CKPT_FILE);
    FILE *f = fopen(path, "rb");
    static uint8_t buf[1 << 16];
    size_t len = f ? fread(buf, 1, sizeof buf, f) : 0;
    if (f) fclose(f);
    unlink(path);
    put("ckpt", name, buf, len);
}

static void ckpt_seeds(void)
{
    char tmp[] = "/tmp/cirrus-seeds-XXXXXX";
    if (!mkdtemp(tmp)) abort();
    gpt_config cfg = {1, 4, 1, 4, GPT_VOCAB};
    gpt_span whole = {0, gpt_num_params(&cfg)}, stage = {1024, 40};
    ckpt_seed("model", &whole, tmp);
    ckpt_seed("stage", &stage, tmp);
    rmdir(tmp);
}

static void flags_seeds(void)
{
    static const char a[] = "--steps\0" "3000\0" "--seed=1337\0" "--lr\0" "0.0006\0" "--job\0" "tiny-bible\0"
                            "--verbose\0" "--peer\0" "10.0.0.7:7000\0" "--peer=10.0.0.8:7000";
    put("flags", "train", a, sizeof a - 1);
    static const char b[] = "--verbose=false\0" "--seed\0" "18446744073709551615\0" "--steps=-5";
    put("flags", "edges", b, sizeof b - 1);
}

static void text_seeds(void)
{
    /* A watch response body as kube-apiserver streams it. */
    put_str("watch", "stream",
            "{\"type\":\"ADDED\",\"object\":{\"kind\":\"Pod\",\"apiVersion\":\"v1\",\"metadata\":{\"name\":\"a\","
            "\"namespace\":\"default\",\"uid\":\"5c1f\",\"resourceVersion\":\"43\"},\"spec\":{},\"status\":"
            "{\"phase\":\"Pending\"}}}\n"
            "{\"type\":\"BOOKMARK\",\"object\":{\"kind\":\"Pod\",\"apiVersion\":\"v1\",\"metadata\":"
            "{\"resourceVersion\":\"50\",\"annotations\":{\"k8s.io/initial-events-end\":\"true\"}}}}\n"
            "{\"type\":\"MODIFIED\",\"object\":{\"metadata\":{\"name\":\"a\",\"resourceVersion\":\"51\"}}}\r\n"
            "{\"type\":\"DELETED\",\"object\":{\"metadata\":{\"name\":\"a\",\"resourceVersion\":\"52\"}}}\n");
    put_str("watch", "gone",
            "{\"type\":\"ERROR\",\"object\":{\"kind\":\"Status\",\"apiVersion\":\"v1\",\"metadata\":{},"
            "\"status\":\"Failure\",\"message\":\"too old resource version: 1 (2)\",\"reason\":\"Expired\","
            "\"code\":410}}\n");
    /* kubeconfigs as kubeadm / kind write them, and the token-file form. */
    put_str("kubeconfig", "certs",
            "apiVersion: v1\nclusters:\n- cluster:\n    certificate-authority-data: "
            "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCk1JSUJzekNDQVZtZ0F3SUJBZ0lVWGp4MAotLS0tLUVORCBDRVJUSUZJQ0FURS0tLS0tCg==\n"
            "    server: https://127.0.0.1:6443\n  name: kind-cirrus\ncontexts:\n- context:\n    cluster: kind-cirrus\n"
            "    user: kind-cirrus\n  name: kind-cirrus\ncurrent-context: kind-cirrus\nkind: Config\npreferences: {}\n"
            "users:\n- name: kind-cirrus\n  user:\n    client-certificate: client.crt\n    client-key: client.key\n");
    put_str("kubeconfig", "token",
            "apiVersion: v1\nkind: Config\ncurrent-context: sa\nclusters:\n"
            "- name: c\n  cluster:\n    server: \"https://10.96.0.1:443/\"\n    certificate-authority: ca.crt\n"
            "    insecure-skip-tls-verify: false\n"
            "users:\n- name: reader\n  user:\n    token: abc.def\n"
            "contexts:\n- name: sa\n  context: {cluster: c, user: reader, namespace: team-a}\n");
    put_str("kubeconfig", "tokenfile",
            "apiVersion: v1\nkind: Config\ncurrent-context: sa\nclusters:\n"
            "- name: c\n  cluster:\n    server: http://localhost:8080\n"
            "users:\n- name: reader\n  user:\n    tokenFile: token\n"
            "contexts:\n- name: sa\n  context:\n    cluster: c\n    user: reader\n");
    /* Pods as the API server returns them. */
    put_str("pod", "evicted",
            "{\"metadata\":{\"name\":\"j-r1-s0-0\",\"uid\":\"1\"},\"status\":{\"phase\":\"Failed\",\"reason\":\"Evicted\","
            "\"message\":\"The node was low on resource: memory.\"}}");
    put_str("pod", "oom",
            "{\"metadata\":{\"name\":\"j-r1-c0\"},\"status\":{\"phase\":\"Failed\",\"containerStatuses\":[{\"name\":"
            "\"trainer\",\"state\":{\"terminated\":{\"exitCode\":137,\"reason\":\"OOMKilled\"}}}]}}");
    put_str("pod", "exit",
            "{\"metadata\":{\"name\":\"j-r1-c0\"},\"status\":{\"phase\":\"Failed\",\"conditions\":[{\"type\":"
            "\"DisruptionTarget\",\"status\":\"False\"}],\"containerStatuses\":[{\"name\":\"trainer\",\"lastState\":"
            "{\"terminated\":{\"exitCode\":2,\"reason\":\"Error\"}},\"state\":{}}]}}");
    put_str("pod", "preempted",
            "{\"metadata\":{\"name\":\"p\"},\"status\":{\"phase\":\"Failed\",\"conditions\":[{\"type\":"
            "\"DisruptionTarget\",\"status\":\"True\",\"reason\":\"PreemptionByScheduler\"}]}}");
    put_str("pod", "ready",
            "{\"metadata\":{\"name\":\"p\"},\"status\":{\"phase\":\"Running\",\"conditions\":[{\"type\":\"Ready\","
            "\"status\":\"True\"}]}}");
    put_str("pod", "unschedulable",
            "{\"metadata\":{\"name\":\"p\"},\"status\":{\"phase\":\"Pending\",\"conditions\":[{\"type\":"
            "\"PodScheduled\",\"status\":\"False\",\"reason\":\"Unschedulable\"}]}}");
    put_str("pod", "summary",
            "{\"metadata\":{\"name\":\"j-r1-c0\"},\"status\":{\"phase\":\"Succeeded\",\"containerStatuses\":[{\"name\":"
            "\"trainer\",\"state\":{\"terminated\":{\"exitCode\":0,\"reason\":\"Completed\",\"message\":"
            "\"{\\\"step\\\":300,\\\"loss\\\":1.875,\\\"val_loss\\\":2.25,\\\"tokens\\\":76800}\\n\"}}}]}}");
    put_str("pod", "deleting",
            "{\"metadata\":{\"name\":\"p\",\"deletionTimestamp\":\"2026-11-22T01:02:03Z\"},\"status\":{\"phase\":\"Running\"}}");
    /* Leases as the API server returns them: ours, another's, released. */
    put_str("lease", "ours",
            "{\"apiVersion\":\"coordination.k8s.io/v1\",\"kind\":\"Lease\",\"metadata\":{\"name\":\"cirrus-operator\","
            "\"namespace\":\"cirrus-system\",\"resourceVersion\":\"812\",\"uid\":\"7f\"},\"spec\":{\"holderIdentity\":"
            "\"cirrus-operator-0\",\"leaseDurationSeconds\":15,\"acquireTime\":\"2026-11-22T01:02:03.000000Z\","
            "\"renewTime\":\"2026-11-22T01:02:09.123456Z\",\"leaseTransitions\":3}}");
    put_str("lease", "other",
            "{\"metadata\":{\"name\":\"cirrus-operator\",\"resourceVersion\":\"900\"},\"spec\":{\"holderIdentity\":"
            "\"cirrus-operator-1\",\"leaseDurationSeconds\":60,\"leaseTransitions\":2147483647}}");
    put_str("lease", "released",
            "{\"metadata\":{\"name\":\"cirrus-operator\"},\"spec\":{\"holderIdentity\":\"\",\"leaseDurationSeconds\":1}}");
    /* A gateway's /status (trainer/swarm/coord/http_status.c's fields). */
    put_str("progress", "status",
            "{\"job_id\":\"0d4a7f3e-5b1c-4e2a-9f6d-2c8b1a3e4f50\",\"epoch\":3,\"uptime_s\":120.5,\"step\":812,"
            "\"loss\":2.4871,\"tokens_per_s\":10234.5,\"n_stages\":2,\"stages\":[],\"clients\":1,"
            "\"microbatches_retried\":0}");
    put_str("progress", "fresh",
            "{\"job_id\":\"0d4a7f3e-5b1c-4e2a-9f6d-2c8b1a3e4f50\",\"step\":0,\"loss\":null,\"tokens_per_s\":null}");
    put_str("progress", "resolve", "gw.ns.svc:8080:10.0.0.7,gw2.ns.svc:80:[::1]");
    /* A gateway taking outer steps across regions: its "outer" object, and one before the
     * gateway has the global parameters (step -1). */
    put_str("progress", "outer",
            "{\"job_id\":\"0d4a7f3e-5b1c-4e2a-9f6d-2c8b1a3e4f50\",\"step\":812,\"loss\":2.4871,"
            "\"tokens_per_s\":10234.5,\"outer\":{\"step\":8,\"digest\":\"00112233aabbccdd\","
            "\"wan_bytes_sent\":1048576,\"wan_bytes_received\":2097152,\"payload_bytes_sent\":1000000,"
            "\"digest_mismatches\":0,\"last_sync_unix_s\":1795309200.5,\"last_sync_duration_s\":0.25,"
            "\"codec\":\"q8\",\"sync_every\":100,\"links\":[{\"region\":\"r2\",\"up\":true,"
            "\"last_error\":\"\"}]}}");
    put_str("progress", "outer-none",
            "{\"job_id\":\"0d4a7f3e-5b1c-4e2a-9f6d-2c8b1a3e4f50\",\"step\":0,\"loss\":null,"
            "\"tokens_per_s\":null,\"outer\":{\"step\":-1,\"digest\":\"0000000000000000\","
            "\"wan_bytes_sent\":0,\"wan_bytes_received\":0,\"payload_bytes_sent\":0,"
            "\"digest_mismatches\":0,\"last_sync_unix_s\":null,\"last_sync_duration_s\":null,"
            "\"codec\":\"topk:0.01+zstd\",\"sync_every\":50,\"links\":[]}}");
}

/* fuzz_wan_codec's input is one message. A pseudo-gradient-like vector: smooth, a few
 * large entries, many near zero; and (for zstd) a periodic one, 7 zeros of every 8. */
static void wan_codec_seed(const char *spec, size_t n, int sparse)
{
    wan_codec_params p;
    cirrus_error err;
    if (wan_codec_parse(spec, &p, &err)) {
        fprintf(stderr, "seeds: %s\n", err.msg);
        exit(1);
    }
    float *x = malloc((n ? n : 1) * sizeof(float));
    size_t cap = wan_encode_bound(n, &p), len;
    uint8_t *m = malloc(cap);
    if (!x || !m) abort();
    for (size_t i = 0; i < n; i++) {
        size_t t = sparse ? i % 64 : i;
        double v = sin(0.37 * (double)t) * 1e-3 * (t % 17 == 3 ? 40.0 : 1.0);
        x[i] = (float)(sparse && i % 8 ? 0.0 : v);
    }
    if (wan_encode(&p, x, NULL, n, m, cap, &len, &err)) {
        fprintf(stderr, "seeds: %s: %s\n", spec, err.msg);
        exit(1);
    }
    if (p.zstd && !(m[6] & WAN_FLAG_ZSTD)) {
        fprintf(stderr, "seeds: %s: zstd does not shrink this body; pick another vector\n", spec);
        exit(1);
    }
    char name[64];
    snprintf(name, sizeof name, "%s-%zu", spec, n);
    for (char *c = name; *c; c++)
        if (*c == ':' || *c == '+') *c = '-';
    put("wan_codec", name, m, len);
    free(x);
    free(m);
}

static void wan_codec_seeds(void)
{
    static const char *const specs[] = {"none", "fp16", "q8", "lowbit:4", "lowbit:2",
                                        "topk:0.05", "topk:0.1:8"};
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
        char z[32];
        wan_codec_seed(specs[i], 100, 0);
        snprintf(z, sizeof z, "%s+zstd", specs[i]);
        wan_codec_seed(z, 400, 1);
    }
    wan_codec_seed("none", 0, 0);            /* an empty vector */
    wan_codec_seed("topk:1", 70, 0);         /* every entry, a short q8/fp16 tail */
    wan_codec_seed("lowbit:2+zstd", 5000, 1); /* past one WAN_CODEC_CHUNK */
}

/* fuzz_wan_msg's and fuzz_swarm_msg's layout: selector, u64 n or count (little-endian),
 * the payload. */
static void msg_seed(const char *harness, const char *name, int sel, uint64_t arg,
                     const wire_writer *w)
{
    uint8_t buf[4096];
    buf[0] = (uint8_t)sel;
    for (int i = 0; i < 8; i++) buf[1 + i] = (uint8_t)(arg >> (8 * i));
    memcpy(buf + 9, w->data, w->len);
    put(harness, name, buf, 9 + w->len);
}

static void wan_msg_seed(const char *name, int sel, uint64_t arg, const wire_writer *w)
{
    msg_seed("wan_msg", name, sel, arg, w);
}

static void wan_msg_seeds(void)
{
    /* the selectors of fuzz_wan_msg.c */
    enum { JOIN, PART, DONE, DONE_OK, STATE, STATE_OK, PUSH, PULL, PULL_OK, HAVE, HAVE_OK };
    const uint64_t n = 1000; /* the model's parameters */
    const float x[6] = {0.5f, -1.25f, 3e-5f, 0.0f, 1e20f, -7.0f};
    static const uint8_t message[40] = "CWAN\001\002\000\010 a q8 message's first bytes";
    wire_writer w;
    wire_writer_init(&w, 4096);
    wan_join j = {"eu-west-1.b_2", 1, 3, n, 8, 0x00112233aabbccddull, 1, 2};
    wan_msg_put_join(&w, &j);
    wan_msg_seed("join", JOIN, 0, &w);
    w.len = 0;
    wan_part part = {8, 1100, 1064, message, sizeof message - 4};
    wan_msg_put_part(&w, &part);
    wan_msg_seed("part", PART, n, &w);
    w.len = 0;
    wan_done d = {8, 65536, 0x0123456789abcdefull, 1100, 0xfeedfacecafebeefull, 800, 4};
    wan_msg_put_done(&w, &d);
    wan_msg_seed("done", DONE, n, &w);
    w.len = 0;
    wan_msg_put_done_ok(&w, 8, 1250);
    wan_msg_seed("done-ok", DONE_OK, 0, &w);
    w.len = 0;
    wan_msg_put_state(&w, 998, 4); /* spans the parameters and the momentum */
    wan_msg_seed("state", STATE, n, &w);
    w.len = 0;
    const outer_schedule sched = {.at = 800, .stride = 2, .next_stride = 4};
    wan_msg_put_state_ok(&w, 8, 0x00112233aabbccddull, &sched, x, 4);
    wan_msg_seed("state-ok", STATE_OK, 4, &w);
    w.len = 0;
    outer_push q = {.fragment = 1, .round = 3, .inner_step = 300, .at = 305, .tokens = 65536,
                    .compute_ms = 1234, .n_params = n, .offset = 994, .count = 6};
    outer_msg_put_push(&w, &q, x);
    wan_msg_seed("push", PUSH, n, &w);
    w.len = 0;
    outer_pull pl = {1, 3, 994, 6};
    outer_msg_put_pull(&w, &pl);
    wan_msg_seed("pull", PULL, n, &w);
    w.len = 0;
    outer_pull_ok a = {.done = 3, .digest = 0x00112233aabbccddull, .wan_bytes = 123456789,
                       .ready = 1, .pushed = 1, .region = 1, .regions = 2, .fragments = 2,
                       .sched = sched};
    outer_msg_put_pull_ok(&w, &a, x, 6);
    wan_msg_seed("pull-ok", PULL_OK, 6, &w);
    w.len = 0;
    a.done = 2, a.ready = 0, a.pushed = 0;
    outer_msg_put_pull_ok(&w, &a, NULL, 6);
    wan_msg_seed("pull-ok-waiting", PULL_OK, 6, &w);
    w.len = 0;
    wan_msg_put_have(&w, 3, 3800000);
    wan_msg_seed("have", HAVE, 1000000, &w);
    w.len = 0;
    wan_msg_put_have_ok(&w, 1048576, 0x00112233aabbccddull);
    wan_msg_seed("have-ok", HAVE_OK, 3800000, &w);
    wire_writer_free(&w);
}

/* fuzz_swarm_msg: one body of each message a stage peer or a coordinator receives. */
static void swarm_msg_seeds(void)
{
    /* the selectors of fuzz_swarm_msg.c */
    enum { FORWARD, BACKWARD, LOSS, ACTS, TIED, SUMSQ, STEP, INFO, AVERAGE, AVERAGE_OK,
           STATE_GET, STATE_SLICE, PARAMS_SET, STATE_SET, SYNC, EMPTY, REGISTER, HEARTBEAT,
           REPORT, STEP_SYNC, STEP_STATE, PEER_INFO };
    /* a peer of at most 2 x 4 sequences of width 3: first stage, middle, last */
    const uint64_t shape = 1 | 3 << 3 | 2 << 7, first = shape | 1 << 10, last = shape | 1 << 11;
    const int32_t tokens[8] = {'I', 'n', ' ', 't', 'h', 'e', ' ', 'b'};
    float h[24];
    for (int i = 0; i < 24; i++) h[i] = 0.25f * (float)(i - 12);
    wire_writer w;
    wire_writer_init(&w, 4096);
#define SEED(name, sel, arg) (msg_seed("swarm_msg", name, sel, arg, &w), w.len = 0)
    stage_microbatch m = {.id = 42, .B = 2, .T = 4, .keep = 1, .tokens = tokens};
    stage_msg_put_microbatch(&w, &m, 3);
    SEED("forward-first", FORWARD, first);
    m = (stage_microbatch){.id = 43, .B = 2, .T = 4, .keep = 1, .codec = STAGE_CODEC_Q8, .hidden = h};
    stage_msg_put_microbatch(&w, &m, 3);
    SEED("forward-middle-q8", FORWARD, shape);
    m = (stage_microbatch){.id = 44, .B = 2, .T = 4, .has_targets = 1, .hidden = h, .targets = tokens};
    stage_msg_put_microbatch(&w, &m, 3);
    SEED("backward-last", BACKWARD, last);
    m = (stage_microbatch){.id = 45, .B = 1, .T = 4, .hidden = h, .grad_out = h + 12};
    stage_msg_put_microbatch(&w, &m, 3);
    SEED("backward-middle", BACKWARD, shape);
    stage_msg_put_loss(&w, 2.75f);
    SEED("loss", LOSS, 0);
    stage_msg_put_acts(&w, h, 24, STAGE_CODEC_NONE);
    SEED("acts", ACTS, 24 << 1);
    stage_msg_put_acts(&w, h, 24, STAGE_CODEC_Q8);
    SEED("acts-q8", ACTS, 24 << 1 | 1);
    stage_msg_put_tied(&w, h, 12);
    SEED("tied", TIED, 12);
    const stage_sumsq_part parts[2] = {{0, 1.5}, {768, 0.25}};
    stage_msg_put_sumsq(&w, parts, 2);
    SEED("sumsq", SUMSQ, 0);
    stage_msg_put_step(&w, &(stage_step){.lr = 3e-4f, .grad_scale = 0.125f, .step = 7, .sumsq = 4.5});
    SEED("step", STEP, 0);
    stage_info in = {.l0 = 1, .l1 = 3, .n_layer = 4, .n_embd = 64, .n_head = 4, .seq_len = 32,
                     .n_params = 99968, .steps = 7, .ring = "10.0.0.7:7500"};
    stage_msg_put_info(&w, &in);
    SEED("info", INFO, 0);
    static stage_average a = {.round = 3, .n = 2, .ring_ms = 10000,
                              .addrs = {"10.0.0.7:7500", "10.0.0.8:7500"}};
    stage_msg_put_average(&w, &a);
    SEED("average", AVERAGE, 0);
    stage_msg_put_average_ok(&w, 16);
    SEED("average-ok", AVERAGE_OK, 0);
    stage_msg_put_state_get(&w, &(stage_state_get){.offset = 96, .count = 32});
    SEED("state-get", STATE_GET, 300);
    const stage_origin origins[2] = {{2, 5}, {9, 7}};
    stage_msg_put_state_head(&w, 7, 100, origins, 2);
    stage_msg_put_state_floats(&w, h, 6);
    SEED("state-slice", STATE_SLICE, 6);
    stage_msg_put_params_set(&w, &(stage_params_set){.steps = 7, .n = 100, .offset = 90, .count = 6}, h);
    SEED("params-set", PARAMS_SET, 100);
    stage_msg_put_params_set(&w, &(stage_params_set){.steps = 7, .n = 100, .offset = 290, .count = 6}, h);
    SEED("state-set", STATE_SET, 100);
    stage_msg_put_sync(&w, "10.0.0.8:7500");
    SEED("sync", SYNC, 0);
    SEED("empty", EMPTY, 0);
    coord_registration reg = {.role = COORD_ROLE_STAGE, .stage = 1, .l0 = 1, .l1 = 3,
                              .name = "job-r1-s1-0", .host = "10.0.0.7", .port = 7500,
                              .throughput = 812.5};
    coord_put_registration(&w, &reg);
    SEED("register", REGISTER, 0);
    const coord_stats st = {.samples = 4096, .step = 7, .loss = 2.5f, .tokens_per_s = 9000,
                            .fwd_throughput = 900, .bwd_throughput = 450};
    coord_put_heartbeat(&w, 3, 5, &st);
    SEED("heartbeat", HEARTBEAT, 0);
    coord_put_report(&w, 3, 6, &(coord_report){.step = 7, .loss = 2.5f, .tokens_per_s = 9000,
                                              .mb_retried = 2, .mb_lost = 1});
    SEED("report", REPORT, 0);
    coord_put_step_sync(&w, &(coord_step_sync){.op = COORD_STEP_ARRIVE, .step = 7, .n_clients = 2,
                                               .microbatches = 4, .loss_sum = 10.5, .wait_ms = 500});
    SEED("step-sync-arrive", STEP_SYNC, 0);
    coord_put_step_sync(&w, &(coord_step_sync){.op = COORD_STEP_REDO, .step = 7, .client_index = 1,
                                               .n_clients = 2, .stage = 1, .addr = "10.0.0.7:7500"});
    SEED("step-sync-redo", STEP_SYNC, 0);
    static coord_step_state ss = {.applied_step = 6, .arrived = 1, .microbatches = 4,
                                  .loss_sum = 10.5, .latest_notice = 2, .n_notices = 1,
                                  .notices = {{2, 1, "10.0.0.7:7500"}}};
    coord_put_step_state(&w, &ss);
    SEED("step-state", STEP_STATE, 0);
    coord_put_peer_info(&w, &(coord_peer_info){.id = 5, .stage = 1, .l0 = 1, .l1 = 3,
                                               .name = "job-r1-s1-0", .host = "10.0.0.7",
                                               .port = 7500, .throughput = 812.5});
    SEED("peer-info", PEER_INFO, 0);
#undef SEED
    wire_writer_free(&w);
}

static void swarmjob_seed(void)
{
    FILE *f = fopen("manifests/samples/swarmjob.yaml", "rb");
    static char text[1 << 16];
    size_t len = f ? fread(text, 1, sizeof text - 1, f) : 0;
    if (f) fclose(f);
    json_t *job;
    cirrus_error err;
    if (!len || kube_yaml_parse(text, len, "swarmjob.yaml", &job, &err)) {
        fprintf(stderr, "seeds: the sample SwarmJob: %s\n", len ? err.msg : "cannot read");
        exit(1);
    }
    json_t *meta = json_object_get(job, "metadata");
    json_object_set_new(meta, "namespace", json_string("team-a"));
    json_object_set_new(meta, "uid", json_string("0d4a7f3e-5b1c-4e2a-9f6d-2c8b1a3e4f50"));
    json_object_set_new(meta, "resourceVersion", json_string("4711"));
    json_object_set_new(meta, "generation", json_integer(2));
    char *s = json_dumps(job, JSON_COMPACT);
    put_str("swarmjob", "sample", s);
    free(s);
    json_t *st = json_loads(
        "{\"phase\":\"Running\",\"observedGeneration\":2,\"startTime\":\"2026-11-22T00:00:00Z\","
        "\"conditions\":[{\"type\":\"Ready\",\"status\":\"True\",\"reason\":\"AllRegionsReady\",\"message\":\"\","
        "\"lastTransitionTime\":\"2026-11-22T00:01:00Z\",\"observedGeneration\":2}],"
        "\"regions\":[{\"name\":\"r1\",\"readyPeersPerStage\":[2,2],\"pendingPods\":0,\"preemptions\":1,"
        "\"failures\":0,\"gatewayReady\":true,\"step\":800,\"loss\":2.5,\"tokensPerSecond\":5000,"
        "\"progressTime\":\"2026-11-22T01:01:50Z\"}],\"readyRegions\":\"1/2\",\"readyPeers\":\"4/8\"}",
        0, NULL);
    json_object_set_new(job, "status", st);
    s = json_dumps(job, JSON_COMPACT);
    put_str("swarmjob", "with-status", s);
    free(s);
    json_decref(job);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: seeds CORPUS_DIR\n");
        return 2;
    }
    root = argv[1];
    mkdir(root, 0777);
    wire_seeds();
    q8_seeds();
    ckpt_seeds();
    flags_seeds();
    text_seeds();
    swarmjob_seed();
    wan_codec_seeds();
    wan_msg_seeds();
    swarm_msg_seeds();
    return 0;
}
