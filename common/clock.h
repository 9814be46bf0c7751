/* clock: the one clock for durations, deadlines and timeouts.
 *
 * CLOCK_MONOTONIC, because wall time can jump (NTP, an operator's date) and a deadline or
 * a measured duration must not. Not for timestamps shown to people or compared across
 * hosts: those want CLOCK_REALTIME.
 */
#ifndef CIRRUS_CLOCK_H
#define CIRRUS_CLOCK_H

#include <stdint.h>

/* Seconds since an arbitrary fixed point, with nanosecond resolution. */
double clock_now_s(void);
/* Whole milliseconds (truncated) since the same point. */
int64_t clock_now_ms(void);
/* Nanoseconds since the same point (e.g. to build a pthread_cond_timedwait deadline on a
 * condition variable set to CLOCK_MONOTONIC). */
int64_t clock_now_ns(void);

#endif
