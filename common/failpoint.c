/* failpoint: see failpoint.h. A handful of entries, set before the threads that ask start,
 * read under a lock: failpoints are asked about at most once per outer step or barrier
 * call, never on a hot path. */
#include "failpoint.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"

#define FAILPOINTS_MAX 8
#define FAILPOINT_NAME_MAX 31

static struct {
    char name[FAILPOINT_NAME_MAX + 1];
    uint64_t value;
} points[FAILPOINTS_MAX];
static int n_points, read_env;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

static void set_locked(const char *name, size_t len, uint64_t value)
{
    if (len == 0 || len > FAILPOINT_NAME_MAX) return;
    for (int i = 0; i < n_points; i++)
        if (strlen(points[i].name) == len && !memcmp(points[i].name, name, len)) {
            points[i].value = value;
            return;
        }
    if (n_points == FAILPOINTS_MAX) return;
    memcpy(points[n_points].name, name, len);
    points[n_points].name[len] = '\0';
    points[n_points++].value = value;
}

/* CIRRUS_FAILPOINTS, once; a malformed entry is said and skipped (a test's typo must show). */
static void read_env_locked(void)
{
    if (read_env) return;
    read_env = 1;
    const char *env = getenv("CIRRUS_FAILPOINTS");
    for (const char *p = env; p && *p;) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        const char *eq = memchr(p, '=', len);
        uint64_t value = 0;
        char *stop = NULL;
        if (eq) value = strtoull(eq + 1, &stop, 10);
        if (eq && stop != p + len)
            log_warn("CIRRUS_FAILPOINTS: '%.*s' is not NAME or NAME=NUMBER", (int)len, p);
        else
            set_locked(p, eq ? (size_t)(eq - p) : len, value);
        p = end ? end + 1 : p + len;
    }
    for (int i = 0; i < n_points; i++)
        log_warn("failpoint %s is on (CIRRUS_FAILPOINTS): a test's fault", points[i].name);
}

int failpoint_on(const char *name, uint64_t *value)
{
    pthread_mutex_lock(&mu);
    read_env_locked();
    int on = 0;
    for (int i = 0; i < FAILPOINTS_MAX && i < n_points && !on; i++)
        if (!strcmp(points[i].name, name)) {
            on = 1;
            if (value) *value = points[i].value;
        }
    pthread_mutex_unlock(&mu);
    return on;
}

void failpoint_set(const char *name, uint64_t value)
{
    pthread_mutex_lock(&mu);
    read_env_locked();
    set_locked(name, strlen(name), value);
    pthread_mutex_unlock(&mu);
}
