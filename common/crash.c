/* crash: see crash.h. Only async-signal-safe calls run in the handler (write, raise,
 * backtrace_symbols_fd); backtrace() itself may allocate the first time it is called (it
 * loads the unwinder), so it is called once at install time. */
#include "crash.h"

#include <execinfo.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CRASH_FRAMES 48

static const char *crash_what = "cirrus";
static char crash_stack[64 * 1024];

static void put(const char *s)
{
    size_t n = strlen(s);
    while (n > 0) {
        ssize_t w = write(STDERR_FILENO, s, n);
        if (w <= 0) return;
        s += w;
        n -= (size_t)w;
    }
}

static void on_crash(int sig)
{
    void *frames[CRASH_FRAMES];
    const char *name = sig == SIGSEGV ? "SIGSEGV"
                       : sig == SIGBUS ? "SIGBUS"
                       : sig == SIGFPE ? "SIGFPE"
                       : sig == SIGILL ? "SIGILL"
                                       : "SIGABRT";
    put("\n");
    put(crash_what);
    put(": crashed with ");
    put(name);
    put("; backtrace (addr2line -e the binary resolves the offsets):\n");
    const int n = backtrace(frames, CRASH_FRAMES);
    /* Frames 0 and 1 are this handler and the kernel's signal trampoline in libc. */
    if (n > 2) backtrace_symbols_fd(frames + 2, n - 2, STDERR_FILENO);
    /* SA_RESETHAND restored the default action: the re-raised signal ends the process as
     * it would have without this handler. */
    raise(sig);
}

void crash_handler_install(const char *what)
{
    void *warm[1];
    crash_what = what;
    backtrace(warm, 1);
    stack_t ss = {.ss_sp = crash_stack, .ss_size = sizeof crash_stack};
    sigaltstack(&ss, NULL);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_crash;
    sa.sa_flags = SA_ONSTACK | SA_RESETHAND | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    const int sigs[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) sigaction(sigs[i], &sa, NULL);
}
