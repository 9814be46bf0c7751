/* fuzz_swarm_msg: the bodies of the messages inside a region, as their receivers meet them:
 * every stage-peer message (trainer/swarm/proto/stage_msg.c: FORWARD/BACKWARD, the loss,
 * activations, the tied-embedding gradient, SUMSQ_OK, STEP, INFO_OK, AVERAGE, AVERAGE_OK,
 * STATE_GET, STATE_GET_OK, PARAMS_SET, STATE_SET, SYNC, empty bodies) and every coordinator
 * message (trainer/swarm/proto/coord_msg.c: REGISTER, HEARTBEAT, CLIENT_REPORT, STEP_SYNC,
 * STEP_SYNC_OK, a PEERS_OK entry).
 *
 * Input: byte 0 selects the decoder, bytes 1-8 are the little-endian u64 its caller
 * supplies (a parameter count, a float count, or, for FORWARD/BACKWARD, the receiving
 * peer's shape: max_B, max_T, C, first, last packed in its low bits), the rest is the
 * frame's payload. Invariants, beyond no crash, leak or undefined behaviour:
 *   every decoder returns 0 or CIRRUS_ECORRUPT (CIRRUS_ENOMEM only for a SUMSQ_OK count it
 *   could not allocate) and never reads past the payload;
 *   accepted: the payload is consumed exactly, the documented caps hold (B and T within
 *   the peer's, slices within their state and STAGE_STATE_SLICE, members within
 *   STAGE_AVERAGE_MAX_MEMBERS, notices within COORD_MAX_NOTICES, a state slice's moments
 *   origins by increasing segment with from in [1, steps], strings NUL-terminated
 *   within their arrays), put(get(x)) is accepted again and put(get(put(get(x)))) equals
 *   put(get(x)) byte for byte; and where the format is canonical (every body but q8
 *   activations, an AVERAGE without ring_ms, an empty STATE_GET and a STEP_SYNC without
 *   wait_ms, whose missing fields take their defaults) put(get(x)) is x itself.
 */
#include "fuzz.h"

#include <math.h>

#include "../../common/cerr.h"
#include "../../common/le.h"
#include "../../trainer/swarm/proto/coord_msg.h"
#include "../../trainer/swarm/proto/stage_msg.h"

enum {
    M_FORWARD, M_BACKWARD, M_LOSS, M_ACTS, M_TIED, M_SUMSQ, M_STEP, M_INFO, M_AVERAGE,
    M_AVERAGE_OK, M_STATE_GET, M_STATE_SLICE, M_PARAMS_SET, M_STATE_SET, M_SYNC, M_EMPTY,
    M_REGISTER, M_HEARTBEAT, M_REPORT, M_STEP_SYNC, M_STEP_STATE, M_PEER_INFO, M_COUNT
};

/* The receiving stage peer of FORWARD/BACKWARD, from the caller's u64. */
typedef struct shape {
    stage_mb_dest d;
    int32_t tokens[8 * 16], targets[8 * 16];
    float hidden[8 * 16 * 8], grad_out[8 * 16 * 8];
} shape;

static void shape_of(uint64_t arg, shape *s)
{
    memset(s, 0, sizeof *s);
    s->d = (stage_mb_dest){.max_B = 1 + (uint32_t)(arg & 7), .max_T = 1 + (uint32_t)((arg >> 3) & 15),
                           .C = 1 + (size_t)((arg >> 7) & 7), .first = (int)((arg >> 10) & 1),
                           .last = (int)((arg >> 11) & 1), .tokens = s->tokens,
                           .targets = s->targets, .hidden = s->hidden, .grad_out = s->grad_out};
}

/* Float counts a decoder is asked for, kept small enough to allocate. */
static size_t small_count(uint64_t arg) { return (size_t)(arg % 4097); }

/* Decode payload b[0..len) with decoder sel, then append what put writes for it to *out.
 * 0 when accepted (and *out holds the re-encoding); else the decoder's code. */
static int decode_put(int sel, uint64_t arg, const uint8_t *b, size_t len, wire_writer *out,
                      int *canonical)
{
    wire_reader r;
    wire_reader_init(&r, b, len);
    cirrus_error err = {0};
    int rc = 0;
    *canonical = 1;
    switch (sel) {
    case M_FORWARD:
    case M_BACKWARD: {
        shape *s = malloc(sizeof *s);
        FUZZ_CHECK(s, "out of memory");
        shape_of(arg, s);
        stage_microbatch m;
        rc = stage_msg_get_microbatch(&r, sel == M_FORWARD ? STAGE_FORWARD : STAGE_BACKWARD, &s->d, &m);
        if (!rc) {
            FUZZ_CHECK(m.B >= 1 && m.B <= s->d.max_B && m.T >= 1 && m.T <= s->d.max_T,
                       "microbatch %ux%u accepted by a peer of %ux%u", m.B, m.T, s->d.max_B, s->d.max_T);
            FUZZ_CHECK(!m.has_targets || s->d.last, "targets accepted by a stage before the last");
            FUZZ_CHECK(!!m.tokens == !!s->d.first && !!m.hidden == !s->d.first, "input part wrong for the stage");
            *canonical = m.codec == STAGE_CODEC_NONE;
            stage_msg_put_microbatch(out, &m, s->d.C);
        }
        free(s);
        break;
    }
    case M_LOSS: {
        float loss;
        if (!(rc = stage_msg_get_loss(&r, &loss))) stage_msg_put_loss(out, loss);
        break;
    }
    case M_ACTS: {
        const size_t n = small_count(arg >> 1);
        const int codec = (arg & 1) ? STAGE_CODEC_Q8 : STAGE_CODEC_NONE;
        float *x = malloc((n ? n : 1) * sizeof(float));
        FUZZ_CHECK(x, "out of memory");
        if (!(rc = stage_msg_get_acts(&r, x, n, codec))) {
            *canonical = codec == STAGE_CODEC_NONE;
            for (size_t i = 0; i < n && codec == STAGE_CODEC_Q8; i++)
                FUZZ_CHECK(isfinite(x[i]), "q8 activation %zu decoded to %g", i, x[i]);
            stage_msg_put_acts(out, x, n, codec);
        }
        free(x);
        break;
    }
    case M_TIED: {
        const size_t n = small_count(arg);
        const float *g;
        if (!(rc = stage_msg_get_tied(&r, n, &g))) {
            FUZZ_CHECK((n == 0 || (const uint8_t *)g == b) && len == n * sizeof(float), "tied gradient not the payload");
            stage_msg_put_tied(out, g, n);
        }
        break;
    }
    case M_SUMSQ: {
        stage_sumsq_part *parts = NULL;
        uint32_t n = 0;
        rc = stage_msg_get_sumsq(&r, &parts, &n);
        if (!rc) stage_msg_put_sumsq(out, parts, n);
        FUZZ_CHECK(rc == 0 || rc == CIRRUS_ENOMEM || !parts, "a refused SUMSQ_OK left its parts allocated");
        if (rc == CIRRUS_ENOMEM) rc = CIRRUS_ECORRUPT;
        free(parts);
        break;
    }
    case M_STEP: {
        stage_step s;
        if (!(rc = stage_msg_get_step(&r, &s))) {
            FUZZ_CHECK(s.step >= 1 && s.lr >= 0 && s.grad_scale > 0 && s.sumsq >= 0,
                       "STEP %llu lr %g scale %g sumsq %g accepted", (unsigned long long)s.step, s.lr,
                       s.grad_scale, s.sumsq);
            stage_msg_put_step(out, &s);
        }
        break;
    }
    case M_INFO: {
        stage_info in;
        if (!(rc = stage_msg_get_info(&r, &in))) {
            FUZZ_CHECK(memchr(in.ring, 0, sizeof in.ring), "ring address not terminated");
            stage_msg_put_info(out, &in);
        }
        break;
    }
    case M_AVERAGE: {
        stage_average *a = malloc(sizeof *a);
        FUZZ_CHECK(a, "out of memory");
        if (!(rc = stage_msg_get_average(&r, a))) {
            FUZZ_CHECK(a->round >= 1 && a->n >= 1 && a->n <= STAGE_AVERAGE_MAX_MEMBERS &&
                           a->ring_ms >= 1 && a->ring_ms <= STAGE_RING_MS_MAX,
                       "AVERAGE round %llu n %u ring_ms %u accepted", (unsigned long long)a->round, a->n,
                       a->ring_ms);
            for (uint32_t i = 0; i < a->n; i++)
                FUZZ_CHECK(memchr(a->addrs[i], 0, STAGE_ADDR_MAX), "member %u not terminated", i);
            stage_msg_put_average(out, a);
            *canonical = out->len == len; /* without ring_ms: it takes the default */
        }
        free(a);
        break;
    }
    case M_AVERAGE_OK: {
        uint32_t mb;
        if (!(rc = stage_msg_get_average_ok(&r, &mb))) stage_msg_put_average_ok(out, mb);
        break;
    }
    case M_STATE_GET: {
        stage_state_get q;
        if (!(rc = stage_msg_get_state_get(&r, arg, &q))) {
            FUZZ_CHECK(q.offset <= arg && q.count <= arg - q.offset && q.count <= STAGE_STATE_SLICE,
                       "STATE_GET [%llu, +%llu) of %llu accepted", (unsigned long long)q.offset,
                       (unsigned long long)q.count, (unsigned long long)arg);
            *canonical = len != 0; /* empty: the whole state */
            stage_msg_put_state_get(out, &q);
        }
        break;
    }
    case M_STATE_SLICE: {
        const uint64_t count = small_count(arg);
        stage_state_slice s;
        if (!(rc = stage_msg_get_state_slice(&r, count, &s))) {
            FUZZ_CHECK(s.n_origins <= STAGE_MAX_ORIGINS && s.origins == b + 20 &&
                           s.floats == b + 20 + 12 * (size_t)s.n_origins &&
                           len == 20 + 12 * (size_t)s.n_origins + 4 * count,
                       "STATE_GET_OK origins or floats not where the head says");
            stage_origin *o = malloc(((size_t)s.n_origins + 1) * sizeof *o);
            FUZZ_CHECK(o, "out of memory");
            for (uint32_t i = 0; i < s.n_origins; i++) {
                o[i] = stage_msg_origin_at(&s, i);
                FUZZ_CHECK(o[i].from >= 1 && o[i].from <= s.steps && (i == 0 || o[i].segment > o[i - 1].segment),
                           "origin %u (segment %u from %llu) accepted at step %llu", i, o[i].segment,
                           (unsigned long long)o[i].from, (unsigned long long)s.steps);
            }
            stage_msg_put_state_head(out, s.steps, s.n, o, s.n_origins);
            free(o);
            wire_put_bytes(out, s.floats, count * sizeof(float));
        }
        break;
    }
    case M_PARAMS_SET:
    case M_STATE_SET: {
        stage_params_set q;
        rc = sel == M_PARAMS_SET ? stage_msg_get_params_set(&r, arg, &q) : stage_msg_get_state_set(&r, arg, &q);
        if (!rc) {
            const uint64_t whole = sel == M_PARAMS_SET ? arg : 3 * arg;
            FUZZ_CHECK(q.n == arg && q.offset <= whole && q.count <= whole - q.offset &&
                           q.count <= STAGE_STATE_SLICE && (sel == M_PARAMS_SET || arg <= UINT64_MAX / 3),
                       "slice [%llu, +%llu) of %llu accepted", (unsigned long long)q.offset,
                       (unsigned long long)q.count, (unsigned long long)whole);
            stage_params_set h = q;
            stage_msg_put_params_set(out, &h, NULL);
            wire_put_bytes(out, q.floats, q.count * sizeof(float));
        }
        break;
    }
    case M_SYNC: {
        char donor[STAGE_ADDR_MAX];
        if (!(rc = stage_msg_get_sync(&r, donor))) {
            FUZZ_CHECK(memchr(donor, 0, sizeof donor), "donor not terminated");
            stage_msg_put_sync(out, donor);
        }
        break;
    }
    case M_EMPTY:
        rc = stage_msg_get_empty(&r);
        FUZZ_CHECK(!rc == !len, "an empty body of %zu bytes %s", len, rc ? "refused" : "accepted");
        break;
    case M_REGISTER: {
        coord_registration g;
        if (!(rc = coord_get_registration(b, len, &g, &err))) {
            FUZZ_CHECK(memchr(g.name, 0, sizeof g.name) && memchr(g.host, 0, sizeof g.host),
                       "REGISTER strings not terminated");
            coord_put_registration(out, &g);
        }
        break;
    }
    case M_HEARTBEAT: {
        uint64_t epoch;
        uint32_t id;
        coord_stats s;
        if (!(rc = coord_get_heartbeat(b, len, &epoch, &id, &s, &err))) coord_put_heartbeat(out, epoch, id, &s);
        break;
    }
    case M_REPORT: {
        uint64_t epoch;
        uint32_t id;
        coord_report rep;
        if (!(rc = coord_get_report(b, len, &epoch, &id, &rep, &err))) coord_put_report(out, epoch, id, &rep);
        break;
    }
    case M_STEP_SYNC: {
        coord_step_sync s;
        if (!(rc = coord_get_step_sync(b, len, &s, &err))) {
            FUZZ_CHECK(memchr(s.addr, 0, sizeof s.addr), "STEP_SYNC addr not terminated");
            coord_put_step_sync(out, &s);
            *canonical = out->len == len; /* without wait_ms: 0 */
        }
        break;
    }
    case M_STEP_STATE: {
        coord_step_state *st = malloc(sizeof *st);
        FUZZ_CHECK(st, "out of memory");
        if (!(rc = coord_get_step_state(b, len, st, &err))) {
            FUZZ_CHECK(st->n_notices <= COORD_MAX_NOTICES, "%u notices accepted", st->n_notices);
            for (uint32_t i = 0; i < st->n_notices; i++)
                FUZZ_CHECK(memchr(st->notices[i].addr, 0, sizeof st->notices[i].addr), "notice %u not terminated", i);
            coord_put_step_state(out, st);
        }
        free(st);
        break;
    }
    default: { /* M_PEER_INFO */
        coord_peer_info pi;
        rc = coord_get_peer_info(&r, &pi);
        if (!rc && r.pos != r.len) rc = -101; /* one entry of a PEERS_OK list: the rest follows */
        if (!rc) {
            FUZZ_CHECK(memchr(pi.name, 0, sizeof pi.name) && memchr(pi.host, 0, sizeof pi.host),
                       "peer strings not terminated");
            coord_put_peer_info(out, &pi);
        }
        break;
    }
    }
    FUZZ_CHECK(r.pos <= r.len, "reader at %zu past the end %zu", r.pos, r.len);
    if (rc == 0 && sel != M_REGISTER && sel != M_HEARTBEAT && sel != M_REPORT && sel != M_STEP_SYNC &&
        sel != M_STEP_STATE)
        FUZZ_CHECK(r.pos == r.len, "decoder %d accepted with %zu bytes left", sel, r.len - r.pos);
    FUZZ_CHECK(rc == 0 || rc == CIRRUS_ECORRUPT || rc == -101, "decoder %d returned %d", sel, rc);
    FUZZ_CHECK(rc == 0 || rc == -101 || sel < M_REGISTER || sel == M_PEER_INFO || err.msg[0],
               "coordinator decoder %d refused without saying why", sel);
    return rc;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 9) return 0;
    const int sel = data[0] % M_COUNT;
    const uint64_t arg = le_get(data + 1, 8);
    const uint8_t *b = data + 9;
    const size_t len = size - 9;

    wire_writer e1, e2;
    wire_writer_init(&e1, len + 64);
    int canonical;
    if (decode_put(sel, arg, b, len, &e1, &canonical)) {
        wire_writer_free(&e1);
        return 0;
    }
    FUZZ_CHECK(!e1.failed, "decoder %d: the writer refused the re-encoding", sel);
    if (canonical)
        FUZZ_CHECK(e1.len == len && (len == 0 || memcmp(e1.data, b, len) == 0),
                   "decoder %d: put(get(x)) is %zu bytes, not the %zu of x", sel, e1.len, len);
    wire_writer_init(&e2, e1.len + 64);
    int again;
    FUZZ_CHECK(decode_put(sel, arg, e1.data, e1.len, &e2, &again) == 0, "decoder %d refuses its own encoding", sel);
    /* q8 activations are lossy: re-quantising what was decoded need not give the same bytes */
    if (!(sel == M_ACTS && (arg & 1)) && !(sel <= M_BACKWARD && !canonical))
        FUZZ_CHECK(e2.len == e1.len && (e1.len == 0 || memcmp(e2.data, e1.data, e1.len) == 0),
                   "decoder %d: put(get(put(get(x)))) differs from put(get(x))", sel);
    wire_writer_free(&e1);
    wire_writer_free(&e2);
    return 0;
}
