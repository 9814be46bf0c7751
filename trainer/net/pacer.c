/* pacer: see pacer.h. */
#include "pacer.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <time.h>

#include "../../common/clock.h"

struct net_pacer {
    pthread_mutex_t mu;
    double rate;   /* bytes per second */
    double burst;  /* the bucket's size, bytes */
    double chunk;  /* the most one take grants */
    double tokens; /* may go negative: the debt the next sender sleeps off */
    int64_t last_ns;
};

static double clampd(double v, double lo, double hi) { return v < lo ? lo : v > hi ? hi : v; }

net_pacer *net_pacer_new(double bytes_per_s)
{
    if (!(bytes_per_s > 0)) return NULL;
    net_pacer *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    pthread_mutex_init(&p->mu, NULL);
    p->rate = bytes_per_s;
    p->chunk = clampd(bytes_per_s * 0.005, 1448, 65536);
    p->burst = clampd(bytes_per_s * 0.010, 16384, 1e12);
    p->tokens = p->burst;
    p->last_ns = clock_now_ns();
    return p;
}

void net_pacer_free(net_pacer *p)
{
    if (!p) return;
    pthread_mutex_destroy(&p->mu);
    free(p);
}

double net_pacer_rate(const net_pacer *p) { return p->rate; }

size_t net_pacer_take(net_pacer *p, size_t want)
{
    if (!want) return 0;
    const size_t grant = want < (size_t)p->chunk ? want : (size_t)p->chunk;
    pthread_mutex_lock(&p->mu);
    const int64_t now = clock_now_ns();
    p->tokens += (double)(now - p->last_ns) * 1e-9 * p->rate;
    if (p->tokens > p->burst) p->tokens = p->burst;
    p->last_ns = now;
    p->tokens -= (double)grant;
    const double debt = -p->tokens;
    pthread_mutex_unlock(&p->mu);
    if (debt > 0) {
        const double s = debt / p->rate;
        struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
        while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
        }
    }
    return grant;
}

void net_pacer_refund(net_pacer *p, size_t bytes)
{
    if (!bytes) return;
    pthread_mutex_lock(&p->mu);
    p->tokens += (double)bytes;
    if (p->tokens > p->burst) p->tokens = p->burst;
    pthread_mutex_unlock(&p->mu);
}
