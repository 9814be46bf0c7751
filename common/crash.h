/* crash: what a crashing Cirrus process leaves behind. A pod that dies of SIGSEGV shows
 * only "exit 139" to Kubernetes; with this handler its log (and so, under
 * terminationMessagePolicy FallbackToLogsOnError, its termination message) ends with the
 * signal and a backtrace, which `addr2line -e BINARY` turns into lines of the build the
 * image holds. */
#ifndef CIRRUS_CRASH_H
#define CIRRUS_CRASH_H

/* Install the handler for SIGSEGV, SIGBUS, SIGFPE, SIGILL and SIGABRT, on an alternate
 * stack (a stack overflow still gets its backtrace). `what` names the process in the
 * report ("cirrus-trainer client"); it must outlive the process's main. The handler
 * writes the report, then re-raises the signal with its default action: the exit status,
 * a core dump where the system keeps them, are what they would have been. */
void crash_handler_install(const char *what);

#endif
