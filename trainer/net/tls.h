/* tls: TLS 1.3 with mutual authentication as a transport under net_conn.
 *
 * The gateways of one job talk across the WAN over connections that are first plain TCP
 * (net_connect / net_accept) and then turned into TLS here; from then on net_send_frame,
 * net_recv_frame and net_recv_frame_into go through TLS unchanged, and net_close sends
 * close_notify. Trust is the job's own PKI (common/certs.h): the job's CA is the only trust
 * anchor, both ends must present a leaf it issued directly, and the leaf must name this job
 * and, where the caller asks, the expected region (its URI subjectAltName
 * cirrus://<job>/<region>). Host names are not checked: the per-job CA issues only to the
 * job's gateways, so the identity that matters is the job and region the leaf names, not the
 * address it was reached at (which the coordinator, not DNS, provides).
 *
 * Settings: TLS 1.3 only; SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT both ways;
 * X509_V_FLAG_X509_STRICT; no intermediate CAs (verify depth 0); no session tickets or
 * resumption (every connection authenticates in full); OpenSSL's default TLS 1.3 cipher
 * suites (two Cirrus ends agree on TLS_AES_256_GCM_SHA384). Every call leaves OpenSSL's
 * error queue empty.
 *
 * One thread at a time per connection: an SSL object is not safe for a read in one thread
 * and a write in another, which plain TCP connections allow. A TLS connection holds about
 * 0.6 MB of buffers (records are read and sent up to 16 at a time, see tls.c).
 */
#ifndef CIRRUS_TLS_H
#define CIRRUS_TLS_H

#include <stddef.h>

#include "../../common/certs.h"
#include "../../common/cerr.h"
#include "conn.h"

/* Room for a region name and its NUL (a DNS label, common/certs.h). */
#define NET_TLS_REGION_MAX (CERTS_MAX_LABEL + 1)

typedef struct net_tls_ctx net_tls_ctx;

/* A context for one gateway: the job's CA, this gateway's leaf and its key (PEM strings, as
 * in the job Secret) and the job every peer must name. The leaf must have been issued by
 * the CA (its signature is checked here; its dates are the peer's to check, so a context
 * with an expired leaf can be made and is refused by every peer), name job, and match the
 * key. CIRRUS_EINVAL with a one-line message otherwise. Shared by any number of
 * connections and threads; connections keep what they need, so it may be freed while they
 * live. */
int net_tls_ctx_new(net_tls_ctx **out, const char *ca_pem, const char *cert_pem,
                    const char *key_pem, const char *job, cirrus_error *err);
/* The same from the files the operator mounts from the job Secret (ca.crt, tls.crt,
 * tls.key), each at most 64 KiB. */
int net_tls_ctx_load(net_tls_ctx **out, const char *ca_file, const char *cert_file,
                     const char *key_file, const char *job, cirrus_error *err);
void net_tls_ctx_free(net_tls_ctx *ctx);
/* The region this gateway's own leaf names. */
const char *net_tls_ctx_region(const net_tls_ctx *ctx);

/* Turn an established TCP connection (fresh from net_connect / net_accept, nothing sent on
 * it yet) into a TLS one within timeout_ms (-1: no limit), as the client or the server. The
 * peer's leaf must verify against the job's CA, name this job and, if expect_region is not
 * NULL, that region; the region it names is copied to peer_region (if not NULL; size at
 * least NET_TLS_REGION_MAX). Failures, each with a one-line message naming why:
 *   CIRRUS_EINVAL    a certificate refused: "unknown CA", "expired", "not yet valid",
 *                    "for job 'x', not 'y'", "for region 'a', not 'b'", "no certificate",
 *                    by us or (an alert) by the peer; or a bad argument
 *   CIRRUS_ECORRUPT  the peer does not speak TLS 1.3 (a plaintext Cirrus HELLO, say)
 *   CIRRUS_ETIMEDOUT no handshake within timeout_ms
 *   CIRRUS_ECLOSED   the peer closed or reset the connection during the handshake
 *   CIRRUS_EIO / CIRRUS_ENOMEM
 * Nothing of the application is read before the peer's certificate is accepted. After a
 * failure the connection is dead (every send and receive fails; it never falls back to
 * plaintext): net_close it.
 * In TLS 1.3 the client's handshake ends before the server has checked the client's
 * certificate, so a server's refusal reaches the client as an alert on its first receive
 * (net_recv_frame then fails with CIRRUS_EIO naming the alert, e.g. "unknown ca"). */
int net_tls_connect(net_conn *c, net_tls_ctx *ctx, const char *expect_region, char *peer_region,
                    size_t peer_region_size, int timeout_ms, cirrus_error *err);
int net_tls_accept(net_conn *c, net_tls_ctx *ctx, const char *expect_region, char *peer_region,
                   size_t peer_region_size, int timeout_ms, cirrus_error *err);

/* Whether c runs over TLS (a handshake succeeded on it), and the cipher suite it
 * negotiated ("TLS_AES_256_GCM_SHA384"), or NULL for a plain or failed one. */
const char *net_tls_cipher(const net_conn *c);

/* Byte counters: net_conn_bytes (conn.h) counts what moved on the socket, TLS records and
 * handshake included, for TLS and plain connections alike. */

#endif
