/* denormals: see denormals.h. */
#include "denormals.h"

/* x87 float arithmetic (i386 without -mfpmath=sse) ignores MXCSR: nothing to set there. */
#if defined(__x86_64__) || (defined(__i386__) && defined(__SSE_MATH__))
#define CIRRUS_MXCSR 1
#include <xmmintrin.h>
/* MXCSR bits: FTZ (flush to zero, bit 15) and DAZ (denormals are zero, bit 6). */
#define MXCSR_FTZ 0x8000u
#define MXCSR_DAZ 0x0040u
#endif

void cpu_flush_denormals(void)
{
#if defined(CIRRUS_MXCSR)
    _mm_setcsr(_mm_getcsr() | MXCSR_FTZ | MXCSR_DAZ);
#elif defined(__aarch64__)
    /* FPCR.FZ (bit 24): subnormal inputs and results are zero. */
    unsigned long fpcr;
    __asm__ volatile("mrs %0, fpcr" : "=r"(fpcr));
    __asm__ volatile("msr fpcr, %0" : : "r"(fpcr | (1ul << 24)));
#endif
}
