/* pipeline: see pipeline.h. */
#include "pipeline.h"

#include <stdlib.h>
#include <string.h>

#include "../net/conn.h"
#include "stage_proto.h"

#define PIPE_REPLY_LIMIT (256u << 20)

/* The peers serving one stage. */
typedef struct stage_link {
    int n;                       /* peers */
    net_conn *c[PIPE_MAX_PEERS];
    int next;                    /* round-robin cursor */
} stage_link;

struct pipeline {
    int n, codec, timeout_ms;
    gpt_config cfg;
    stage_link link[PIPE_MAX_STAGES];
    int route[PIPE_MAX_STAGES];       /* the peer of each stage serving this microbatch */
    float *acts[PIPE_MAX_STAGES + 1]; /* acts[s]: input of stage s (s >= 1), max_B*max_T*C */
    float *grad[2];                   /* ping-pong gradient buffers */
    float *tied;                      /* V*C */
    uint8_t *bytes_x, *bytes_y;       /* tokens and targets as bytes */
    uint64_t next_id;                 /* request ids */
};

static int send_to(pipeline *p, int s, int k, uint16_t type, uint64_t id, const wire_writer *w,
                   cirrus_error *err)
{
    if (w->failed) return cirrus_fail(err, CIRRUS_ENOMEM, "request to stage %d too large", s);
    int rc = net_send_frame(p->link[s].c[k], type, id, w->data, (uint32_t)w->len,
                            p->timeout_ms);
    return rc ? cirrus_fail(err, rc, "stage %d peer %d: send: %s", s, k, cirrus_strerror(rc))
              : 0;
}

/* Wait for peer k of stage s to answer request id of `type` (with type + 1). */
static int await_reply(pipeline *p, int s, int k, uint16_t type, uint64_t id, wire_reader *r,
                       cirrus_error *err)
{
    wire_header h;
    const uint8_t *payload;
    int rc = net_recv_frame(p->link[s].c[k], &h, &payload, p->timeout_ms, err);
    if (rc) return rc;
    if (h.type == WIRE_ERROR) {
        wire_reader e;
        wire_reader_init(&e, payload, h.payload_len);
        int code = (int)wire_get_u32(&e);
        char msg[200] = "?";
        wire_get_str(&e, msg, sizeof msg);
        return cirrus_fail(err, code < 0 ? code : CIRRUS_EIO, "stage %d peer %d refused: %s", s,
                           k, msg);
    }
    if (h.type != type + 1 || h.request_id != id)
        return cirrus_fail(err, CIRRUS_ECORRUPT, "stage %d peer %d: unexpected reply type %u",
                           s, k, h.type);
    wire_reader_init(r, payload, h.payload_len);
    return 0;
}

/* Send a request to peer k of stage s and wait for its reply. */
static int call_peer(pipeline *p, int s, int k, uint16_t type, const wire_writer *w,
                     wire_reader *r, cirrus_error *err)
{
    uint64_t id = ++p->next_id;
    int rc = send_to(p, s, k, type, id, w, err);
    return rc ? rc : await_reply(p, s, k, type, id, r, err);
}

/* The request to the peer of stage s routed for the current microbatch. */
static int call(pipeline *p, int s, uint16_t type, const wire_writer *w, wire_reader *r,
                cirrus_error *err)
{
    return call_peer(p, s, p->route[s], type, w, r, err);
}

/* The same request to every peer of stage s at once, then every reply (AVERAGE needs all
 * peers inside the all-reduce together). r receives peer 0's reply. */
static int call_all(pipeline *p, int s, uint16_t type, const wire_writer *w, wire_reader *r,
                    cirrus_error *err)
{
    uint64_t id = ++p->next_id;
    int rc = 0;
    for (int k = 0; k < p->link[s].n && !rc; k++) rc = send_to(p, s, k, type, id, w, err);
    for (int k = p->link[s].n - 1; k >= 0 && !rc; k--) rc = await_reply(p, s, k, type, id, r, err);
    return rc;
}

static void put_bytes_of(wire_writer *w, uint8_t *tmp, const int32_t *t, size_t n)
{
    for (size_t i = 0; i < n; i++) tmp[i] = (uint8_t)t[i];
    wire_put_bytes(w, tmp, n);
}

/* The FORWARD/BACKWARD head and input for stage s. */
static void put_microbatch(pipeline *p, wire_writer *w, int s, uint64_t id, int B, int T,
                           int keep, const int32_t *x, const int32_t *y)
{
    const size_t n = (size_t)B * T;
    const int last = s == p->n - 1;
    wire_put_u64(w, id);
    wire_put_u32(w, (uint32_t)B);
    wire_put_u32(w, (uint32_t)T);
    const uint8_t flags[4] = {(uint8_t)keep, (uint8_t)p->codec, (uint8_t)(last && y), 0};
    wire_put_bytes(w, flags, 4);
    if (s == 0)
        put_bytes_of(w, p->bytes_x, x, n);
    else
        stage_put_floats(w, p->acts[s], n * p->cfg.n_embd, p->codec);
    if (last && y) put_bytes_of(w, p->bytes_y, y, n);
}

static int forward_all(pipeline *p, uint64_t id, int B, int T, int keep, const int32_t *x,
                       const int32_t *y, float *loss, cirrus_error *err)
{
    const size_t n = (size_t)B * T * p->cfg.n_embd;
    for (int s = 0; s < p->n; s++) {
        wire_writer w;
        wire_reader r;
        wire_writer_init(&w, PIPE_REPLY_LIMIT);
        put_microbatch(p, &w, s, id, B, T, keep, x, y);
        int rc = call(p, s, STAGE_FORWARD, &w, &r, err);
        wire_writer_free(&w);
        if (rc) return rc;
        if (s == p->n - 1)
            *loss = wire_get_f32(&r);
        else if (stage_get_floats(&r, p->acts[s + 1], n, p->codec))
            return cirrus_fail(err, CIRRUS_ECORRUPT, "stage %d: bad forward reply", s);
        if (wire_reader_done(&r))
            return cirrus_fail(err, CIRRUS_ECORRUPT, "stage %d: bad forward reply", s);
    }
    return 0;
}

int pipeline_microbatch(pipeline *p, uint64_t id, int B, int T, const int32_t *x,
                        const int32_t *y, float *loss, cirrus_error *err)
{
    /* Round-robin over each stage's peers; forward and backward of a microbatch go to the
     * same peers, which still hold its activations. */
    for (int s = 0; s < p->n; s++) {
        p->route[s] = p->link[s].next;
        p->link[s].next = (p->link[s].next + 1) % p->link[s].n;
    }
    int rc = forward_all(p, id, B, T, 1, x, y, loss, err);
    if (rc) return rc;
    const size_t n = (size_t)B * T * p->cfg.n_embd;
    int cur = 0;
    for (int s = p->n - 1; s >= 0; s--) {
        wire_writer w;
        wire_reader r;
        wire_writer_init(&w, PIPE_REPLY_LIMIT);
        put_microbatch(p, &w, s, id, B, T, 0, x, y);
        if (s != p->n - 1) stage_put_floats(&w, p->grad[cur], n, p->codec);
        rc = call(p, s, STAGE_BACKWARD, &w, &r, err);
        wire_writer_free(&w);
        if (rc) return rc;
        if (s > 0 && stage_get_floats(&r, p->grad[cur ^ 1], n, p->codec))
            return cirrus_fail(err, CIRRUS_ECORRUPT, "stage %d: bad backward reply", s);
        if (wire_reader_done(&r))
            return cirrus_fail(err, CIRRUS_ECORRUPT, "stage %d: bad backward reply", s);
        cur ^= 1;
    }
    return 0;
}

int pipeline_eval(pipeline *p, int B, int T, const int32_t *x, const int32_t *y, float *loss,
                  cirrus_error *err)
{
    return forward_all(p, 0, B, T, 0, x, y, loss, err);
}

/* Move the head's share of d(wte) from the last stage to the first, fold it there and give
 * the folded gradient back to the last stage, whose wte copy takes the same update. */
static int exchange_tied(pipeline *p, cirrus_error *err)
{
    const size_t bytes = (size_t)p->cfg.vocab * p->cfg.n_embd * sizeof(float);
    const int first = 0, last = p->n - 1;
    wire_writer w;
    wire_reader r;
    wire_writer_init(&w, 0);
    int rc = call_peer(p, last, 0, STAGE_HEAD_GRAD, &w, &r, err);
    const void *g = rc ? NULL : wire_get_bytes(&r, bytes);
    if (!rc && (!g || wire_reader_done(&r)))
        rc = cirrus_fail(err, CIRRUS_ECORRUPT, "bad HEAD_GRAD reply");
    if (rc) return rc;
    memcpy(p->tied, g, bytes);
    wire_writer_init(&w, PIPE_REPLY_LIMIT);
    wire_put_bytes(&w, p->tied, bytes);
    rc = call_all(p, first, STAGE_FOLD_TIED, &w, &r, err);
    wire_writer_free(&w);
    g = rc ? NULL : wire_get_bytes(&r, bytes);
    if (!rc && (!g || wire_reader_done(&r)))
        rc = cirrus_fail(err, CIRRUS_ECORRUPT, "bad FOLD_TIED reply");
    if (rc || first == last) return rc;
    wire_writer_init(&w, PIPE_REPLY_LIMIT);
    wire_put_bytes(&w, g, bytes);
    rc = call_all(p, last, STAGE_SET_TIED, &w, &r, err);
    wire_writer_free(&w);
    return rc;
}

typedef struct part {
    uint64_t offset;
    double sumsq;
} part;

static int part_cmp(const void *a, const void *b)
{
    uint64_t x = ((const part *)a)->offset, y = ((const part *)b)->offset;
    return x < y ? -1 : x > y;
}

/* The global sum of squares: every stage's per-tensor sums, each tensor once (wte is held
 * by the first and last stages), added in buffer order like adamw_total_sumsq(). */
static int global_sumsq(pipeline *p, double *total, cirrus_error *err)
{
    size_t cap = 1024, n = 0;
    part *parts = malloc(sizeof *parts * cap);
    int rc = parts ? 0 : cirrus_fail(err, CIRRUS_ENOMEM, "out of memory");
    for (int s = 0; !rc && s < p->n; s++) {
        wire_writer w;
        wire_reader r;
        wire_writer_init(&w, 0);
        if ((rc = call_peer(p, s, 0, STAGE_SUMSQ, &w, &r, err))) break;
        uint32_t k = wire_get_u32(&r);
        for (uint32_t i = 0; i < k && !r.failed; i++) {
            if (n == cap) {
                part *grown = realloc(parts, sizeof *parts * (cap *= 2));
                if (!grown) {
                    rc = cirrus_fail(err, CIRRUS_ENOMEM, "out of memory");
                    break;
                }
                parts = grown;
            }
            parts[n].offset = wire_get_u64(&r);
            parts[n].sumsq = wire_get_f64(&r);
            n++;
        }
        if (!rc && wire_reader_done(&r))
            rc = cirrus_fail(err, CIRRUS_ECORRUPT, "stage %d: bad SUMSQ reply", s);
    }
    if (!rc) {
        qsort(parts, n, sizeof *parts, part_cmp);
        *total = 0.0;
        for (size_t i = 0; i < n; i++)
            if (i == 0 || parts[i].offset != parts[i - 1].offset) *total += parts[i].sumsq;
    }
    free(parts);
    return rc;
}

/* Sum each stage's gradients over its peers (stages with one peer have nothing to do). */
static int average_stages(pipeline *p, cirrus_error *err)
{
    int rc = 0;
    for (int s = 0; s < p->n && !rc; s++) {
        if (p->link[s].n < 2) continue;
        wire_writer w;
        wire_reader r;
        wire_writer_init(&w, 0);
        rc = call_all(p, s, STAGE_AVERAGE, &w, &r, err);
    }
    return rc;
}

int pipeline_step(pipeline *p, float lr, float grad_scale, uint64_t step, cirrus_error *err)
{
    double total = 0.0;
    int rc = average_stages(p, err);
    if (!rc) rc = exchange_tied(p, err);
    if (!rc) rc = global_sumsq(p, &total, err);
    for (int s = 0; !rc && s < p->n; s++) {
        wire_writer w;
        wire_reader r;
        wire_writer_init(&w, 64);
        wire_put_f32(&w, lr);
        wire_put_f32(&w, grad_scale);
        wire_put_u64(&w, step);
        wire_put_f64(&w, total);
        rc = call_all(p, s, STAGE_STEP, &w, &r, err);
        wire_writer_free(&w);
    }
    return rc;
}

/* Connect to one peer and check what it serves. */
static int connect_peer(pipeline *p, int s, int k, const char *addr, const char *job_id,
                        int expect_l0, int *l1, cirrus_error *err)
{
    const gpt_config *cfg = &p->cfg;
    char host[256];
    int port, rc;
    if ((rc = net_split_hostport(addr, host, sizeof host, &port, 0, err))) return rc;
    if ((rc = net_connect(host, port, p->timeout_ms, &p->link[s].c[k], err))) return rc;
    net_set_max_payload(p->link[s].c[k], PIPE_REPLY_LIMIT);
    if ((rc = net_hello_client(p->link[s].c[k], job_id, STAGE_ROLE_CLIENT, 0, p->timeout_ms,
                               err)))
        return rc;
    wire_writer w;
    wire_reader r;
    wire_writer_init(&w, 0);
    if ((rc = call_peer(p, s, k, STAGE_INFO, &w, &r, err))) return rc;
    uint32_t v[6];
    for (int i = 0; i < 6; i++) v[i] = wire_get_u32(&r);
    (void)wire_get_u64(&r);
    if (wire_reader_done(&r) || (int)v[0] != expect_l0 || v[1] <= v[0] ||
        (*l1 >= 0 && (int)v[1] != *l1) || (int)v[2] != cfg->n_layer ||
        (int)v[3] != cfg->n_embd || (int)v[4] != cfg->n_head || (int)v[5] != cfg->seq_len)
        return cirrus_fail(err, CIRRUS_EMISMATCH,
                           "stage %d at %s serves layers [%u, %u) of a model of %u layers x "
                           "%u (%u heads, context %u); expected layers from %d of %d x %d "
                           "(%d heads, context %d)",
                           s, addr, v[0], v[1], v[2], v[3], v[4], v[5], expect_l0,
                           cfg->n_layer, cfg->n_embd, cfg->n_head, cfg->seq_len);
    *l1 = (int)v[1];
    return 0;
}

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
    const size_t N = (size_t)max_B * max_T, C = (size_t)cfg->n_embd;
    int rc = 0;
    for (int s = 1; s < n && !rc; s++)
        if (!(p->acts[s] = malloc(sizeof(float) * N * C))) rc = CIRRUS_ENOMEM;
    p->grad[0] = malloc(sizeof(float) * N * C);
    p->grad[1] = malloc(sizeof(float) * N * C);
    p->tied = malloc(sizeof(float) * (size_t)cfg->vocab * C);
    p->bytes_x = malloc(N);
    p->bytes_y = malloc(N);
    if (rc || !p->grad[0] || !p->grad[1] || !p->tied || !p->bytes_x || !p->bytes_y) {
        rc = cirrus_fail(err, CIRRUS_ENOMEM, "out of memory");
        goto fail;
    }
    int l0 = 0, a = 0;
    for (int s = 0; s < n; s++) {
        int l1 = -1; /* every peer of a stage must serve the same layers */
        for (int k = 0; k < peers[s]; k++) {
            if ((rc = connect_peer(p, s, k, addrs[a++], job_id, l0, &l1, err))) goto fail;
            p->link[s].n = k + 1;
        }
        l0 = l1;
    }
    if (l0 != cfg->n_layer) {
        rc = cirrus_fail(err, CIRRUS_EMISMATCH, "the stages end at layer %d of %d", l0,
                         cfg->n_layer);
        goto fail;
    }
    *out = p;
    return 0;
fail:
    pipeline_close(p);
    return rc;
}

void pipeline_close(pipeline *p)
{
    if (!p) return;
    for (int s = 0; s < p->n; s++) {
        for (int k = 0; k < p->link[s].n; k++) net_close(p->link[s].c[k]);
        free(p->acts[s + 1]);
    }
    free(p->grad[0]);
    free(p->grad[1]);
    free(p->tied);
    free(p->bytes_x);
    free(p->bytes_y);
    free(p);
}
