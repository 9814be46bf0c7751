/* rpc: one request -> reply exchange over a net_conn, and the one reading of WIRE_ERROR.
 *
 * Every Cirrus request is answered by its type + 1 with the same request id, or by
 * WIRE_ERROR (i32 code, str message). The pipeline client, the coordinator's member client
 * and a stage peer fetching a donor's state all go through here, so an answer is checked
 * (id, type) and an error answer is mapped to a cirrus_error the same way everywhere.
 * Sending and awaiting are apart too, for callers that keep several requests in flight on
 * several connections and poll (the pipeline's engine). What to do about a failure
 * (reconnect, drop the peer, retry elsewhere) stays with the caller.
 */
#ifndef CIRRUS_RPC_H
#define CIRRUS_RPC_H

#include <stddef.h>
#include <stdint.h>

#include "../../../common/cerr.h"
#include "../../net/conn.h"
#include "../../net/wire.h"

#define RPC_ERROR_MSG_MAX 200 /* bytes of a WIRE_ERROR message kept (longer: cut) */

/* The one mapping of a WIRE_ERROR code to the status its receiver returns. An error answer
 * is a refusal by a working peer, never a failure of this end's connection: the codes
 * that describe the request or the other end's state (CIRRUS_EINVAL, ENOMEM, EMISMATCH,
 * ENOENT, ECONFLICT, EGONE) pass through; a code that would read as a connection failure
 * (ECLOSED, ETIMEDOUT, EIO, ETRUNC), CIRRUS_ECORRUPT (the other end found the request
 * malformed) and any code Cirrus does not define become CIRRUS_EINVAL. So rpc_is_fault()
 * tells a refusal from a broken connection by the code alone. (This was the pipeline
 * client's mapping; the coordinator client passed ECORRUPT through, and a stage peer read
 * any refusal by a donor as CIRRUS_EMISMATCH.) */
int rpc_error_code(int32_t wire_code);

/* Whether rc says the connection failed or the other end spoke garbage (closed, timed
 * out, I/O, truncated, corrupt): never the status of a refusal. */
int rpc_is_fault(int rc);

/* WIRE_ERROR's body. Get decodes it into the mapped code and a printable message (at most
 * RPC_ERROR_MSG_MAX bytes, other bytes shown as '?'), NUL-terminated in msg[msg_size];
 * a body that is not (i32, str) is CIRRUS_ECORRUPT with "(unreadable message)". */
void rpc_put_error(wire_writer *w, int code, const char *msg);
int rpc_get_error(wire_reader *r, int *code, char *msg, size_t msg_size);

/* Answer request id with WIRE_ERROR(code, msg), best effort within timeout_ms; returns
 * code. */
int rpc_refuse(net_conn *c, uint64_t id, int code, const char *msg, int timeout_ms);

/* Send request `type` with id and req's payload. A writer that failed (over its cap, out
 * of memory) is CIRRUS_ENOMEM, unsent. who names the other end in messages ("coordinator",
 * "stage 1 peer 10.0.0.2:7000"). */
int rpc_send(net_conn *c, uint16_t type, uint64_t id, const wire_writer *req, int timeout_ms,
             const char *who, cirrus_error *err);

/* Receive the answer to request id of `type`: on type + 1 with that id, 0 and *reply over
 * its payload (valid until the next receive on c). WIRE_ERROR with that id: the mapped
 * code, and "WHO refused: MESSAGE" in err. Any other frame (another id or type) is
 * CIRRUS_ECORRUPT; transport failures are net_recv_frame's. */
int rpc_await(net_conn *c, uint16_t type, uint64_t id, int timeout_ms, const char *who,
              wire_reader *reply, cirrus_error *err);

/* rpc_send then rpc_await, each within timeout_ms. */
int rpc_call(net_conn *c, uint16_t type, uint64_t id, const wire_writer *req, int timeout_ms,
             const char *who, wire_reader *reply, cirrus_error *err);

#endif
