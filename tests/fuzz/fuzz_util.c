/* fuzz_util: the scratch directory and file helpers of fuzz.h (no fuzz target of its own). */
#include "fuzz.h"

#include <dirent.h>
#include <unistd.h>

static char scratch[4096];

static void scratch_remove(void)
{
    DIR *d = opendir(scratch);
    if (d) {
        struct dirent *e;
        char path[8192];
        while ((e = readdir(d))) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
            snprintf(path, sizeof path, "%s/%s", scratch, e->d_name);
            if (unlink(path) != 0) {
                /* a directory a harness made: one level deep at most */
                DIR *s = opendir(path);
                struct dirent *f;
                char inner[12288];
                while (s && (f = readdir(s))) {
                    if (!strcmp(f->d_name, ".") || !strcmp(f->d_name, "..")) continue;
                    snprintf(inner, sizeof inner, "%s/%s", path, f->d_name);
                    unlink(inner);
                }
                if (s) closedir(s);
                rmdir(path);
            }
        }
        closedir(d);
    }
    rmdir(scratch);
}

const char *fuzz_scratch_dir(void)
{
    if (scratch[0]) return scratch;
    /* $TMPDIR, else shared memory when there is some: a file written per input costs
     * milliseconds on a disk and microseconds in memory. */
    const char *tmp = getenv("TMPDIR");
    if (!tmp || !*tmp) tmp = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    snprintf(scratch, sizeof scratch, "%s/cirrus-fuzz-XXXXXX", tmp);
    if (!mkdtemp(scratch)) {
        perror("fuzz: mkdtemp");
        abort();
    }
    atexit(scratch_remove);
    return scratch;
}

void fuzz_write_file(const char *dir, const char *name, const void *data, size_t len)
{
    char path[8192];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || (len && fwrite(data, 1, len, f) != len) || fclose(f) != 0) {
        perror("fuzz: writing a scratch file");
        abort();
    }
}

unsigned char *fuzz_read_file(const char *dir, const char *name, size_t *len)
{
    char path[8192];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 4096, n = 0;
    unsigned char *buf = malloc(cap + 1);
    for (size_t got; buf && (got = fread(buf + n, 1, cap - n, f)) > 0;) {
        n += got;
        if (n == cap) {
            unsigned char *nb = realloc(buf, 2 * cap + 1);
            if (!nb) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
            cap *= 2;
        }
    }
    fclose(f);
    if (buf) buf[n] = '\0';
    *len = n;
    return buf;
}
