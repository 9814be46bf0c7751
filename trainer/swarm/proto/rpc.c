/* rpc: request -> reply and WIRE_ERROR. See rpc.h. */
#include "rpc.h"

#include <stdio.h>
#include <string.h>

int rpc_is_fault(int rc)
{
    return rc == CIRRUS_ECLOSED || rc == CIRRUS_ETIMEDOUT || rc == CIRRUS_EIO ||
           rc == CIRRUS_ETRUNC || rc == CIRRUS_ECORRUPT;
}

int rpc_error_code(int32_t wire_code)
{
    switch (wire_code) {
    case CIRRUS_EINVAL:
    case CIRRUS_ENOMEM:
    case CIRRUS_EMISMATCH:
    case CIRRUS_ENOENT:
    case CIRRUS_ECONFLICT:
    case CIRRUS_EGONE:
        return wire_code;
    default:
        return CIRRUS_EINVAL;
    }
}

void rpc_put_error(wire_writer *w, int code, const char *msg)
{
    wire_put_u32(w, (uint32_t)code);
    wire_put_str(w, msg ? msg : "");
}

int rpc_get_error(wire_reader *r, int *code, char *msg, size_t msg_size)
{
    *code = rpc_error_code((int32_t)wire_get_u32(r));
    const size_t n = wire_get_u16(r);
    const uint8_t *text = wire_get_bytes(r, n);
    if (msg_size == 0) return r->failed ? CIRRUS_ECORRUPT : 0;
    if (!text || wire_reader_done(r)) {
        snprintf(msg, msg_size, "(unreadable message)");
        return CIRRUS_ECORRUPT;
    }
    /* Untrusted text for a log line: cut, and non-printable bytes shown as '?'. */
    size_t i = 0, keep = n < RPC_ERROR_MSG_MAX ? n : RPC_ERROR_MSG_MAX;
    for (; i < keep && i + 1 < msg_size; i++)
        msg[i] = text[i] >= 0x20 && text[i] < 0x7f ? (char)text[i] : '?';
    msg[i] = '\0';
    return 0;
}

int rpc_refuse(net_conn *c, uint64_t id, int code, const char *msg, int timeout_ms)
{
    wire_writer w;
    wire_writer_init(&w, 1024);
    rpc_put_error(&w, code, msg);
    if (!w.failed) net_send_frame(c, WIRE_ERROR, id, w.data, (uint32_t)w.len, timeout_ms);
    wire_writer_free(&w);
    return code;
}

int rpc_send(net_conn *c, uint16_t type, uint64_t id, const wire_writer *req, int timeout_ms,
             const char *who, cirrus_error *err)
{
    if (req->failed) return cirrus_fail(err, CIRRUS_ENOMEM, "request to %s too large", who);
    int rc = net_send_frame(c, type, id, req->data, (uint32_t)req->len, timeout_ms);
    return rc ? cirrus_fail(err, rc, "%s: send: %s", who, cirrus_strerror(rc)) : 0;
}

int rpc_await(net_conn *c, uint16_t type, uint64_t id, int timeout_ms, const char *who,
              wire_reader *reply, cirrus_error *err)
{
    wire_header h;
    const uint8_t *payload;
    int rc = net_recv_frame(c, &h, &payload, timeout_ms, err);
    if (rc) return rc;
    if (h.request_id != id)
        return cirrus_fail(err, CIRRUS_ECORRUPT, "%s answered request %llu with %llu", who,
                           (unsigned long long)id, (unsigned long long)h.request_id);
    if (h.type == WIRE_ERROR) {
        wire_reader r;
        int code;
        char msg[RPC_ERROR_MSG_MAX + 1];
        wire_reader_init(&r, payload, h.payload_len);
        rpc_get_error(&r, &code, msg, sizeof msg);
        return cirrus_fail(err, code, "%s refused: %s", who, msg);
    }
    if (h.type != type + 1)
        return cirrus_fail(err, CIRRUS_ECORRUPT, "%s answered type %u with type %u", who, type,
                           h.type);
    wire_reader_init(reply, payload, h.payload_len);
    return 0;
}

int rpc_call(net_conn *c, uint16_t type, uint64_t id, const wire_writer *req, int timeout_ms,
             const char *who, wire_reader *reply, cirrus_error *err)
{
    int rc = rpc_send(c, type, id, req, timeout_ms, who, err);
    return rc ? rc : rpc_await(c, type, id, timeout_ms, who, reply, err);
}
