#!/usr/bin/env python3
"""A misbehaving API server: a TLS proxy in front of the real kube-apiserver that injects
faults, at random but reproducibly (--seed), for the operator's fault test (faults_test.sh).

The operator's kubeconfig names this proxy as its server and trusts --cert (a self-signed
certificate for 127.0.0.1); the proxy re-originates every request over TLS to --upstream,
verifying it with --upstream-ca and passing the client's Authorization header through (the
test's operator authenticates with its ServiceAccount's token; --upstream-cert/--upstream-key
add a client certificate for a kubeconfig that uses one). Only HTTP/1.1 is offered (ALPN):
the standard library speaks no HTTP/2, and libcurl falls back to a connection per
concurrent request, which the operator must handle anyway behind any HTTP/1.1 proxy.

Faults, each counted by kind (the keys of FAULTS):
  too_many_requests  429 with Retry-After (1-3 s), the request not forwarded
  server_error       500 InternalError, not forwarded
  conflict           409 Conflict on a write (POST, PUT, PATCH), not forwarded
  delayed            the request is forwarded and acted on, but its answer is held for
                     --delay-s (past the client's 30 s timeout): the client gives up on a
                     write that happened; at most --max-delays of them (each parks the
                     operator's event loop for its whole timeout)
  truncated          forwarded and acted on; the answer's JSON cut in half (status kept)
  watch_cut          a watch closed in the middle of an event's JSON line (no last chunk)
  watch_gone         a watch ended by an in-stream ERROR event, code 410 (Expired), as the
                     API server does when the watch cache no longer holds the client's
                     resourceVersion
Besides, not at random: with --refuse-watches-of PART --refuse-while FILE, every watch whose
path contains PART is answered 500 while FILE exists (a watch that stays down; LISTs pass).
Besides, with --delay-first REGEX, the first request whose "METHOD PATH" matches REGEX is
held like a delayed one, whatever the rates and --calm (a focused test's one late answer).
A request takes at most one fault. Watches (GET with watch=1) may take 429 or 500 at their
start, then are planned to be cut or ended by 410 after 0-3 relayed events.

SIGUSR1: behave (no new faults; a held answer already in its delay still lapses). SIGUSR2:
misbehave again. SIGTERM/SIGINT: print the counts as one JSON line and exit. The counts are
also written to --report (replaced atomically after every fault) and the chosen port to
--port-file once listening.
"""
import argparse
import http.client
import http.server
import json
import os
import random
import re
import signal
import socket
import ssl
import sys
import threading
import time
import urllib.parse

FAULTS = ("too_many_requests", "server_error", "conflict", "delayed", "truncated",
          "watch_cut", "watch_gone")
WRITES = ("POST", "PUT", "PATCH")
# Request headers passed upstream. Accept-Encoding is not: answers must arrive as plain
# JSON so that a truncated one is cut JSON, not a cut gzip stream.
PASS_HEADERS = ("authorization", "content-type", "accept", "user-agent")


class State:
    def __init__(self, args):
        self.args = args
        self.rng = random.Random(args.seed)
        self.lock = threading.Lock()
        self.counts = {k: 0 for k in FAULTS}
        self.requests = 0
        self.watches = 0
        self.calm = False
        self.delay_first_done = False

    def delay_first(self, what):
        """Whether this request ("METHOD PATH") is the one --delay-first names."""
        if not self.args.delay_first:
            return False
        with self.lock:
            if self.delay_first_done or not re.search(self.args.delay_first, what):
                return False
            self.delay_first_done = True
            return True

    def draw(self):
        with self.lock:
            return self.rng.random()

    def randint(self, a, b):
        with self.lock:
            return self.rng.randint(a, b)

    def count(self, kind, what):
        with self.lock:
            self.counts[kind] += 1
            snapshot = self.snapshot_locked()
        log("fault %s: %s" % (kind, what))
        self.write_report(snapshot)

    def snapshot_locked(self):
        return {"seed": self.args.seed, "calm": self.calm, "requests": self.requests,
                "watches": self.watches, "faults": dict(self.counts)}

    def snapshot(self):
        with self.lock:
            return self.snapshot_locked()

    def write_report(self, snapshot=None):
        if not self.args.report:
            return
        tmp = self.args.report + ".tmp.%d" % threading.get_ident()
        with open(tmp, "w") as f:
            json.dump(snapshot or self.snapshot(), f)
        os.replace(tmp, self.args.report)

    def pick(self, method, watch):
        """The fault for one request (None: none), by the cumulative rates."""
        a = self.args
        with self.lock:
            self.requests += 1
            if watch:
                self.watches += 1
            if self.calm:
                return None
            r = self.rng.random()
            # Watches are few (a reconnect each) and the watch faults rarer: once a few have
            # passed, a watch fault not seen yet is the next watch's, so that every kind of
            # fault is met in a run of a minute (the test waits for every kind).
            if watch and self.watches > 3:
                for kind in ("watch_cut", "watch_gone"):
                    if self.counts[kind] == 0:
                        return kind
            table = [("too_many_requests", a.rate_429), ("server_error", a.rate_500)]
            if watch:
                table += [("watch_cut", a.rate_cut), ("watch_gone", a.rate_gone)]
            else:
                if method in WRITES:
                    table.append(("conflict", a.rate_409))
                if self.counts["delayed"] < a.max_delays:
                    table.append(("delayed", a.rate_delay))
                table.append(("truncated", a.rate_truncate))
            for kind, rate in table:
                if r < rate:
                    return kind
                r -= rate
            return None


STATE = None


def log(msg):
    sys.stderr.write("%.3f faultproxy: %s\n" % (time.time(), msg))
    sys.stderr.flush()


def status_body(code, reason, message):
    return json.dumps({"kind": "Status", "apiVersion": "v1", "metadata": {},
                       "status": "Failure", "message": message, "reason": reason,
                       "code": code}).encode()


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):  # the faults are logged, not every request
        pass

    def do_GET(self):
        self.relay()

    do_POST = do_PUT = do_PATCH = do_DELETE = do_GET

    def answer(self, code, body, ctype="application/json", extra=()):
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in extra:
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def upstream(self, method, body, watch):
        a = STATE.args
        u = urllib.parse.urlsplit(a.upstream)
        ctx = ssl.create_default_context(cafile=a.upstream_ca)
        if a.upstream_cert:
            ctx.load_cert_chain(a.upstream_cert, a.upstream_key)
        conn = http.client.HTTPSConnection(u.hostname, u.port or 443, context=ctx,
                                           timeout=None if watch else 60)
        headers = {k: v for k, v in self.headers.items() if k.lower() in PASS_HEADERS}
        conn.request(method, self.path, body=body, headers=headers)
        return conn, conn.getresponse()

    def relay(self):
        method = self.command
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n) if n else None
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)
        watch = query.get("watch", [""])[0] in ("1", "true")
        what = "%s %s" % (method, self.path[:160])
        a = STATE.args
        if (watch and a.refuse_watches_of and a.refuse_while and os.path.exists(a.refuse_while)
                and a.refuse_watches_of in urllib.parse.urlsplit(self.path).path):
            log("refused watch (while %s exists): %s" % (a.refuse_while, what))
            return self.answer(500, status_body(500, "InternalError", "watch refused by the test"))
        fault = STATE.pick(method, watch)
        if not watch and STATE.delay_first("%s %s" % (method, self.path)):
            fault = "delayed"
        if fault == "too_many_requests":
            wait = STATE.randint(1, 3)
            STATE.count(fault, "%s (Retry-After %d)" % (what, wait))
            return self.answer(429, status_body(429, "TooManyRequests",
                                                "Too many requests, please try again later."),
                               extra=[("Retry-After", str(wait))])
        if fault == "server_error":
            STATE.count(fault, what)
            return self.answer(500, status_body(500, "InternalError",
                                                "Internal error occurred: injected"))
        if fault == "conflict":
            STATE.count(fault, what)
            return self.answer(409, status_body(
                409, "Conflict", "Operation cannot be fulfilled: the object has been "
                "modified; please apply your changes to the latest version and try again"))
        try:
            conn, resp = self.upstream(method, body, watch)
        except OSError as e:
            log("upstream %s: %s" % (what, e))
            return self.answer(503, status_body(503, "ServiceUnavailable", "proxy: %s" % e))
        try:
            if watch and resp.status == 200:
                return self.relay_watch(resp, fault, what)
            data = resp.read()
            extra = [(k, v) for k, v in resp.getheaders() if k.lower() == "retry-after"]
            ctype = resp.getheader("Content-Type", "application/json")
            if fault == "delayed":
                STATE.count(fault, "%s (HTTP %d held %.0f s)" % (what, resp.status, STATE.args.delay_s))
                time.sleep(STATE.args.delay_s)
            elif fault == "truncated" and len(data) > 1:
                STATE.count(fault, "%s (HTTP %d, %d of %d bytes)" % (what, resp.status, len(data) // 2, len(data)))
                data = data[:len(data) // 2]
            self.answer(resp.status, data, ctype, extra)
        finally:
            conn.close()

    def relay_watch(self, resp, fault, what):
        """Relay a watch's events as chunks; the planned fault ends it after 0-3 events."""
        after = STATE.randint(0, 3) if fault else -1
        self.send_response(200)
        self.send_header("Content-Type", resp.getheader("Content-Type", "application/json"))
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

        def chunk(b):
            self.wfile.write(b"%x\r\n%s\r\n" % (len(b), b))

        events = 0
        try:
            while True:
                line = resp.readline()
                if not line:
                    self.wfile.write(b"0\r\n\r\n")
                    return
                if events == after and not STATE.calm:
                    if fault == "watch_cut":
                        STATE.count(fault, "%s after %d events" % (what, events))
                        chunk(line[:max(1, len(line) // 2)])
                        self.close_connection = True
                        self.connection.shutdown(socket.SHUT_RDWR)
                        return
                    STATE.count(fault, "%s after %d events" % (what, events))
                    gone = {"type": "ERROR", "object": json.loads(status_body(
                        410, "Expired", "too old resource version: injected"))}
                    chunk(json.dumps(gone).encode() + b"\n")
                    self.wfile.write(b"0\r\n\r\n")
                    return
                chunk(line)
                events += 1
        except OSError:
            self.close_connection = True  # the client went away


class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def handle_error(self, request, client_address):
        # A client that went away (a watch the operator dropped, an answer held past its
        # timeout, a failed handshake) is routine here, not worth a traceback.
        log("connection from %s:%d ended: %s" % (client_address + (sys.exc_info()[1],)))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--listen", default="127.0.0.1:0")
    p.add_argument("--upstream", required=True, help="https://HOST:PORT of kube-apiserver")
    p.add_argument("--upstream-ca", required=True)
    p.add_argument("--upstream-cert")
    p.add_argument("--upstream-key")
    p.add_argument("--cert", required=True, help="this proxy's certificate (PEM)")
    p.add_argument("--key", required=True)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--report")
    p.add_argument("--port-file")
    p.add_argument("--calm", action="store_true", help="start without faults (SIGUSR2 starts them)")
    p.add_argument("--refuse-watches-of", metavar="PATH_PART",
                   help="answer 500 to watches whose path contains this (e.g. /pods) ...")
    p.add_argument("--refuse-while", metavar="FILE", help="... while FILE exists")
    p.add_argument("--rate-429", type=float, default=0.04)
    p.add_argument("--rate-500", type=float, default=0.04)
    p.add_argument("--rate-409", type=float, default=0.06, help="of writes")
    p.add_argument("--rate-delay", type=float, default=0.01)
    p.add_argument("--max-delays", type=int, default=2)
    p.add_argument("--delay-s", type=float, default=35.0)
    p.add_argument("--delay-first", metavar="REGEX",
                   help='hold the answer of the first request whose "METHOD PATH" matches')
    p.add_argument("--rate-truncate", type=float, default=0.04)
    p.add_argument("--rate-cut", type=float, default=0.25, help="of watches")
    p.add_argument("--rate-gone", type=float, default=0.15, help="of watches")
    args = p.parse_args()
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(1 << 31)
    global STATE
    STATE = State(args)
    STATE.calm = args.calm
    host, port = args.listen.rsplit(":", 1)
    srv = Server((host, int(port)), Handler)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(args.cert, args.key)
    ctx.set_alpn_protocols(["http/1.1"])
    # The handshake happens in the request's thread, not in accept().
    srv.socket = ctx.wrap_socket(srv.socket, server_side=True, do_handshake_on_connect=False)

    def set_calm(calm):
        def h(sig, frame):
            STATE.calm = calm
            log("now %s" % ("behaving (no faults)" if calm else "misbehaving"))
            STATE.write_report()
        return h

    def stop(sig, frame):
        print(json.dumps(STATE.snapshot()), flush=True)
        STATE.write_report()
        os._exit(0)

    signal.signal(signal.SIGUSR1, set_calm(True))
    signal.signal(signal.SIGUSR2, set_calm(False))
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    log("seed %d, listening on %s:%d, upstream %s%s" % (args.seed, host, srv.server_address[1],
                                                       args.upstream, " (calm)" if args.calm else ""))
    STATE.write_report()
    if args.port_file:
        with open(args.port_file + ".tmp", "w") as f:
            f.write("%d\n" % srv.server_address[1])
        os.replace(args.port_file + ".tmp", args.port_file)
    srv.serve_forever()


if __name__ == "__main__":
    main()
