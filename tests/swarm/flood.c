/* flood: abuse one listening port of a running Cirrus process and check that it holds.
 *
 *   flood --target wire|http|raw --addr 127.0.0.1:PORT --pid PID [--job JOB]
 *         [--idle N] [--phase-s S] [--max-threads T] [--max-rss-growth-mib M]
 *         [--max-probe-ms L]
 *
 * Four phases of --phase-s seconds each, from source addresses 127.0.0.2.. (Linux routes
 * all of 127/8 to lo), while a legitimate client on 127.0.0.1 keeps asking (wire: PING on
 * its connection and, every second, on a new one after HELLO; http: GET /status on a new
 * connection; raw: nothing, the port speaks TLS):
 *   idle      N connections opened and left silent (rotating over 32 source addresses);
 *   slowloris 64 connections sending one byte a second of a plausible first frame/request;
 *   wrong-job HELLOs naming another job, in a loop (wire; other targets: garbage);
 *   oversize  64 connections announcing the largest frame (WIRE_MAX_PAYLOAD) and sending
 *             nothing more, before and (wire, with --job) after a valid HELLO.
 * The target's thread count and RSS are sampled every 50 ms (/proc/PID/status). Exits 1,
 * naming the broken bound, if the process died, its threads went over --max-threads, its
 * RSS grew more than --max-rss-growth-mib, a probe failed, or a probe took longer than
 * --max-probe-ms; prints one JSON line of figures either way.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>

#include "../../common/clock.h"
#include "../../common/log.h"
#include "../../trainer/net/conn.h"
#include "../../trainer/net/wire.h"

#define SOURCES 32
#define MAX_SAMPLES 100000

enum target { WIRE, HTTP, RAW };

static struct {
    enum target target;
    char host[64];
    int port;
    pid_t pid;
    const char *job;
    int idle, phase_s, max_threads, max_rss_growth_mib, max_probe_ms;
} opt = {.idle = 5000, .phase_s = 5, .max_threads = 1 << 20, .max_rss_growth_mib = 1 << 20,
         .max_probe_ms = 1 << 30};

static atomic_int done;

/* ---- the target's process ---- */

static int proc_status(int *threads, long *rss_kib)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)opt.pid);
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    while (fgets(line, sizeof line, f)) {
        sscanf(line, "Threads: %d", threads);
        sscanf(line, "VmRSS: %ld", rss_kib);
    }
    fclose(f);
    return 0;
}

static struct {
    int threads_base, threads_max;
    long rss_base, rss_max;
    int died;
} seen;

static void *sampler_main(void *arg)
{
    (void)arg;
    while (!atomic_load(&done)) {
        int t = 0;
        long r = 0;
        if (kill(opt.pid, 0) != 0 || proc_status(&t, &r) != 0) {
            seen.died = 1;
            break;
        }
        if (t > seen.threads_max) seen.threads_max = t;
        if (r > seen.rss_max) seen.rss_max = r;
        usleep(50 * 1000);
    }
    return NULL;
}

/* ---- the legitimate client ---- */

static double samples[MAX_SAMPLES];
static int n_samples, probe_failures;
static char probe_error[256];

static int wire_probe(net_conn **c, int fresh, cirrus_error *err)
{
    static uint64_t id;
    if (fresh || !*c) {
        if (*c) net_close(*c);
        *c = NULL;
        int rc = net_connect(opt.host, opt.port, 5000, c, err);
        if (!rc) rc = net_hello_client(*c, opt.job, 1, 1, 5000, err);
        if (rc) return rc;
    }
    wire_header h;
    const uint8_t *p;
    int rc = net_send_frame(*c, WIRE_PING, ++id, NULL, 0, 5000);
    if (!rc) rc = net_recv_frame(*c, &h, &p, 5000, err);
    if (!rc && (h.type != WIRE_PONG || h.request_id != id))
        rc = cirrus_fail(err, CIRRUS_ECORRUPT, "answer %u to PING", h.type);
    return rc ? cirrus_fail(err, rc, "PING: %s", err->msg) : 0;
}

static int http_probe(cirrus_error *err)
{
    net_conn *c = NULL;
    int rc = net_connect(opt.host, opt.port, 5000, &c, err);
    if (rc) return rc;
    const char req[] = "GET /status HTTP/1.0\r\n\r\n";
    int fd = net_fd(c);
    int flags = fcntl(fd, F_GETFL);
    fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
    struct timeval tv = {5, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    char buf[512];
    ssize_t n = -1;
    if (send(fd, req, sizeof req - 1, MSG_NOSIGNAL) == (ssize_t)(sizeof req - 1))
        n = recv(fd, buf, sizeof buf - 1, 0);
    net_close(c);
    if (n < 12) return cirrus_fail(err, CIRRUS_EIO, "GET /status: no answer");
    buf[n] = '\0';
    if (strncmp(buf + 9, "200", 3) != 0)
        return cirrus_fail(err, CIRRUS_EIO, "GET /status: %.12s", buf);
    return 0;
}

static void *prober_main(void *arg)
{
    (void)arg;
    net_conn *c = NULL;
    int64_t last_fresh = 0;
    while (!atomic_load(&done)) {
        cirrus_error err = {0};
        double t0 = clock_now_s();
        int rc = 0;
        if (opt.target == WIRE) {
            int fresh = clock_now_ms() - last_fresh >= 1000;
            if (fresh) last_fresh = clock_now_ms();
            rc = wire_probe(&c, fresh, &err);
        } else if (opt.target == HTTP) {
            rc = http_probe(&err);
        }
        if (rc) {
            if (!probe_failures++) snprintf(probe_error, sizeof probe_error, "%s", err.msg);
            if (c) net_close(c);
            c = NULL;
        } else if (opt.target != RAW && n_samples < MAX_SAMPLES) {
            samples[n_samples++] = (clock_now_s() - t0) * 1000.0;
        }
        usleep(50 * 1000);
    }
    if (c) net_close(c);
    return NULL;
}

/* ---- the abuse ---- */

/* A non-blocking connection to the target from 127.0.0.(2 + k % SOURCES); -1 when the
 * machine or the target refuses one more. */
static int connect_from(int k)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    if (fd < 0) return -1;
    struct sockaddr_in src = {.sin_family = AF_INET}, dst = {.sin_family = AF_INET};
    src.sin_addr.s_addr = htonl(0x7f000002u + (uint32_t)(k % SOURCES));
    dst.sin_port = htons((uint16_t)opt.port);
    inet_pton(AF_INET, opt.host, &dst.sin_addr);
    if (bind(fd, (struct sockaddr *)&src, sizeof src) != 0 ||
        (connect(fd, (struct sockaddr *)&dst, sizeof dst) != 0 && errno != EINPROGRESS)) {
        close(fd);
        return -1;
    }
    return fd;
}

static void close_all(int *fds, int n)
{
    for (int i = 0; i < n; i++)
        if (fds[i] >= 0) close(fds[i]);
}

/* Of n connections, how many the target has closed (a read finds the end, or a reset). */
static int closed_by_target(const int *fds, int n)
{
    int closed = 0;
    for (int i = 0; i < n; i++) {
        char b[64];
        if (fds[i] < 0) continue;
        ssize_t r = recv(fds[i], b, sizeof b, MSG_DONTWAIT);
        closed += r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
    }
    return closed;
}

/* A frame header announcing len bytes of payload that will never come (the payload length
 * sits at byte 16 of the header, little-endian; trainer/net/wire.c). */
static void announce_frame(uint8_t out[WIRE_HEADER_SIZE], uint16_t type, uint32_t len)
{
    wire_header_encode(out, type, 1, NULL, 0);
    for (int i = 0; i < 4; i++) out[16 + i] = (uint8_t)(len >> (8 * i));
}

/* The first bytes a real client would send: a HELLO frame, an HTTP request, a TLS hello. */
static size_t opening_bytes(uint8_t *out, size_t size, const char *job, uint32_t announce)
{
    if (opt.target == HTTP)
        return (size_t)snprintf((char *)out, size, "GET /status HTTP/1.1\r\nHost: x\r\n");
    if (opt.target == RAW) { /* a TLS record header announcing a handshake */
        const uint8_t tls[] = {0x16, 0x03, 0x01, 0x40, 0x00, 0x01, 0x00, 0x3f, 0xfc};
        memcpy(out, tls, sizeof tls);
        return sizeof tls;
    }
    wire_writer w;
    wire_writer_init(&w, 256);
    wire_put_u16(&w, 1);
    wire_put_u32(&w, 9);
    wire_put_str(&w, job);
    size_t n = 0;
    if (announce) {
        announce_frame(out, WIRE_HELLO, announce);
        n = WIRE_HEADER_SIZE;
    } else if (!w.failed && WIRE_HEADER_SIZE + w.len <= size) {
        wire_header_encode(out, WIRE_HELLO, 1, w.data, (uint32_t)w.len);
        memcpy(out + WIRE_HEADER_SIZE, w.data, w.len);
        n = WIRE_HEADER_SIZE + w.len;
    }
    wire_writer_free(&w);
    return n;
}

static void phase_end(int64_t until)
{
    while (clock_now_ms() < until && !atomic_load(&done)) usleep(20 * 1000);
}

static int idle_phase(int *opened, int *closed)
{
    int *fds = malloc(sizeof(int) * (size_t)opt.idle);
    if (!fds) return -1;
    for (int i = 0; i < opt.idle; i++) fds[i] = -1;
    int64_t until = clock_now_ms() + opt.phase_s * 1000;
    int n = 0;
    for (; n < opt.idle; n++)
        if ((fds[n] = connect_from(n)) < 0) break;
    phase_end(until);
    *opened = n;
    *closed = closed_by_target(fds, n);
    close_all(fds, n);
    free(fds);
    return 0;
}

static void slowloris_phase(int *closed)
{
    enum { N = 64 };
    int fds[N];
    uint8_t first[512];
    size_t len = opening_bytes(first, sizeof first, "flood-slow", 0);
    for (int i = 0; i < N; i++) fds[i] = connect_from(i);
    for (int s = 0; s < opt.phase_s && !atomic_load(&done); s++) {
        for (int i = 0; i < N; i++)
            if (fds[i] >= 0 && (size_t)s < len) send(fds[i], first + s, 1, MSG_NOSIGNAL);
        sleep(1);
    }
    /* A target accepts the last of them late when the earlier phase left it busy: give
     * their deadline up to 3 s more to pass. */
    for (int t = 0; t < 30 && closed_by_target(fds, N) < N; t++) usleep(100 * 1000);
    *closed = closed_by_target(fds, N);
    close_all(fds, N);
}

static void wrong_job_phase(int *tries, int *refused)
{
    int64_t until = clock_now_ms() + opt.phase_s * 1000;
    uint8_t first[512];
    size_t len = opening_bytes(first, sizeof first, "not-this-job", 0);
    if (opt.target == HTTP) /* a whole request the server refuses (405) */
        len = (size_t)snprintf((char *)first, sizeof first, "POST /status HTTP/1.0\r\n\r\n");
    for (int k = 0; clock_now_ms() < until && !atomic_load(&done); k++) {
        int fd = connect_from(k);
        if (fd < 0) {
            usleep(10 * 1000);
            continue;
        }
        int flags = fcntl(fd, F_GETFL);
        fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
        struct timeval tv = {2, 0};
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        char b[256];
        ++*tries;
        /* Refused: the target answers (an error, an HTTP status) or closes, then closes. */
        if (send(fd, first, len, MSG_NOSIGNAL) == (ssize_t)len && recv(fd, b, sizeof b, 0) >= 0)
            ++*refused;
        close(fd);
    }
}

static void oversize_phase(int *closed)
{
    enum { N = 64 };
    int fds[N];
    uint8_t hdr[512];
    int64_t until = clock_now_ms() + opt.phase_s * 1000;
    for (int i = 0; i < N; i++) {
        fds[i] = connect_from(i);
        if (fds[i] < 0) continue;
        /* Half after a valid HELLO (an insider who knows the job id), half before. */
        size_t len;
        if (opt.target == WIRE && opt.job && i % 2) {
            len = opening_bytes(hdr, sizeof hdr, opt.job, 0);
            send(fds[i], hdr, len, MSG_NOSIGNAL);
            announce_frame(hdr, 64, WIRE_MAX_PAYLOAD);
            len = WIRE_HEADER_SIZE;
        } else {
            len = opening_bytes(hdr, sizeof hdr, "flood-big", WIRE_MAX_PAYLOAD);
        }
        send(fds[i], hdr, len, MSG_NOSIGNAL);
    }
    phase_end(until);
    *closed = closed_by_target(fds, N);
    close_all(fds, N);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static int usage(const char *why)
{
    fprintf(stderr, "flood: %s\n", why);
    return 2;
}

int main(int argc, char **argv)
{
    const char *addr = NULL;
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *k = argv[i], *v = argv[i + 1];
        if (!strcmp(k, "--target"))
            opt.target = !strcmp(v, "wire") ? WIRE : !strcmp(v, "http") ? HTTP : RAW;
        else if (!strcmp(k, "--addr")) addr = v;
        else if (!strcmp(k, "--pid")) opt.pid = (pid_t)atoi(v);
        else if (!strcmp(k, "--job")) opt.job = v;
        else if (!strcmp(k, "--idle")) opt.idle = atoi(v);
        else if (!strcmp(k, "--phase-s")) opt.phase_s = atoi(v);
        else if (!strcmp(k, "--max-threads")) opt.max_threads = atoi(v);
        else if (!strcmp(k, "--max-rss-growth-mib")) opt.max_rss_growth_mib = atoi(v);
        else if (!strcmp(k, "--max-probe-ms")) opt.max_probe_ms = atoi(v);
        else return usage("unknown flag");
    }
    if (!addr || opt.pid <= 0 || opt.idle < 1 || opt.phase_s < 1)
        return usage("--addr HOST:PORT and --pid PID are required");
    if (opt.target == WIRE && !opt.job) return usage("--target wire needs --job");
    if (net_split_hostport(addr, opt.host, sizeof opt.host, &opt.port, 0, NULL))
        return usage("--addr is not HOST:PORT");
    signal(SIGPIPE, SIG_IGN);
    if (proc_status(&seen.threads_base, &seen.rss_base)) return usage("no such --pid");
    seen.threads_max = seen.threads_base;
    seen.rss_max = seen.rss_base;
    pthread_t sampler, prober;
    pthread_create(&sampler, NULL, sampler_main, NULL);
    pthread_create(&prober, NULL, prober_main, NULL);
    int opened = 0, idle_closed = 0, slow_closed = 0, tries = 0, refused = 0, big_closed = 0;
    if (idle_phase(&opened, &idle_closed)) return usage("out of memory");
    slowloris_phase(&slow_closed);
    wrong_job_phase(&tries, &refused);
    oversize_phase(&big_closed);
    atomic_store(&done, 1);
    pthread_join(prober, NULL);
    pthread_join(sampler, NULL);
    qsort(samples, (size_t)n_samples, sizeof *samples, cmp_double);
    double p50 = n_samples ? samples[n_samples / 2] : 0;
    double p99 = n_samples ? samples[(n_samples * 99) / 100] : 0;
    double max = n_samples ? samples[n_samples - 1] : 0;
    const long growth_mib = (seen.rss_max - seen.rss_base) / 1024;
    printf("{\"target\":\"%s\",\"idle_opened\":%d,\"idle_closed_by_target\":%d,"
           "\"slowloris_closed\":%d,\"wrong_job_tries\":%d,\"wrong_job_refused\":%d,"
           "\"oversize_closed\":%d,\"threads_base\":%d,\"threads_max\":%d,"
           "\"rss_base_mib\":%.1f,\"rss_max_mib\":%.1f,\"probes\":%d,\"probe_failures\":%d,"
           "\"probe_p50_ms\":%.2f,\"probe_p99_ms\":%.2f,\"probe_max_ms\":%.2f}\n",
           opt.target == WIRE ? "wire" : opt.target == HTTP ? "http" : "raw", opened,
           idle_closed, slow_closed, tries, refused, big_closed, seen.threads_base,
           seen.threads_max, seen.rss_base / 1024.0, seen.rss_max / 1024.0, n_samples,
           probe_failures, p50, p99, max);
    int bad = 0;
    if (seen.died) bad = fprintf(stderr, "flood: the target (pid %d) exited\n", (int)opt.pid);
    if (seen.threads_max > opt.max_threads)
        bad = fprintf(stderr, "flood: the target reached %d threads (bound %d)\n",
                      seen.threads_max, opt.max_threads);
    if (growth_mib > opt.max_rss_growth_mib)
        bad = fprintf(stderr, "flood: the target's RSS grew %ld MiB (bound %d)\n", growth_mib,
                      opt.max_rss_growth_mib);
    if (probe_failures)
        bad = fprintf(stderr, "flood: %d of the legitimate client's requests failed: %s\n",
                      probe_failures, probe_error);
    if (opt.target != RAW && (n_samples < 10 || max > opt.max_probe_ms))
        bad = fprintf(stderr, "flood: %d probes, the slowest %.0f ms (bound %d ms)\n",
                      n_samples, max, opt.max_probe_ms);
    if (opened < opt.idle)
        bad = fprintf(stderr, "flood: opened only %d of %d idle connections\n", opened,
                      opt.idle);
    return bad ? 1 : 0;
}
