/* The unit-test runner: see test.h. */
#include "test.h"

/* Optional per-binary set-up before any test runs (tests/unit/setup.c defines it for the
 * trainer's tests; the operator's test binary has none). */
void test_setup(char **argv) __attribute__((weak));

#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_TESTS 256

static struct {
    const char *name;
    test_fn fn;
    int timeout_s;
} tests[MAX_TESTS];
static int n_tests;
static char tmpdir[320];

void test_register(const char *name, test_fn fn, int timeout_s)
{
    if (n_tests == MAX_TESTS) {
        fprintf(stderr, "too many tests (max %d)\n", MAX_TESTS);
        exit(2);
    }
    tests[n_tests].name = name;
    tests[n_tests].fn = fn;
    tests[n_tests].timeout_s = timeout_s;
    n_tests++;
}

const char *test_tmpdir(void)
{
    return tmpdir;
}

static int selected(const char *name, int argc, char **argv)
{
    if (argc < 2) return 1;
    for (int i = 1; i < argc; i++)
        if (strstr(name, argv[i])) return 1;
    return 0;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

enum { RESULT_FAIL, RESULT_PASS, RESULT_SKIP };

/* Run one test in a child; returns a RESULT_*. */
static int run_one(int i)
{
    snprintf(tmpdir, sizeof tmpdir, "/tmp/cirrus-test-%d-%s", (int)getpid(), tests[i].name);
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s'", tmpdir, tmpdir);
    if (system(cmd) != 0) return 0;
    double t0 = now_s();
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) return 0;
    if (pid == 0) {
        alarm((unsigned)tests[i].timeout_s);
        tests[i].fn();
        exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    double dt = now_s() - t0;
    int ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    int skip = WIFEXITED(status) && WEXITSTATUS(status) == 77;
    if (skip)
        printf("skip %-40s\n", tests[i].name);
    else if (ok)
        printf("ok   %-40s %.2fs\n", tests[i].name, dt);
    else if (WIFSIGNALED(status) && WTERMSIG(status) == SIGALRM)
        printf("FAIL %-40s timed out after %ds\n", tests[i].name, tests[i].timeout_s);
    else if (WIFSIGNALED(status))
        printf("FAIL %-40s killed by signal %d\n", tests[i].name, WTERMSIG(status));
    else
        printf("FAIL %-40s exit %d\n", tests[i].name, WEXITSTATUS(status));
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
    return skip ? RESULT_SKIP : ok ? RESULT_PASS : RESULT_FAIL;
}

int main(int argc, char **argv)
{
    if (test_setup) test_setup(argv);
    setvbuf(stdout, NULL, _IOLBF, 0);
    int passed = 0, failed = 0, skipped = 0;
    for (int i = 0; i < n_tests; i++) {
        if (!selected(tests[i].name, argc, argv)) continue;
        switch (run_one(i)) {
        case RESULT_PASS: passed++; break;
        case RESULT_SKIP: skipped++; break;
        default: failed++;
        }
    }
    printf("%d passed, %d failed, %d skipped\n", passed, failed, skipped);
    return failed || passed == 0 ? 1 : 0;
}
