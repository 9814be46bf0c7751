/* blas_kernel: make sure OpenBLAS runs the matrix kernel this CPU deserves.
 *
 * Debian's OpenBLAS (DYNAMIC_ARCH) picks its kernel from the CPU model number when the
 * library loads. On CPUs it does not recognise — common on cloud VMs that report a generic
 * "Intel Xeon Processor" — it falls back to its SSE3 "Prescott" kernel, which we measured
 * at 63 GFLOP/s against 300 GFLOP/s for the AVX-512 kernel on the same 2 cores. The choice
 * happens before main() and cannot be changed afterwards, so when the user has not chosen
 * (OPENBLAS_CORETYPE unset) and the fallback was taken on a CPU with AVX-512 or AVX2, the
 * process re-executes itself once with OPENBLAS_CORETYPE set.
 */
#ifndef CIRRUS_BLAS_KERNEL_H
#define CIRRUS_BLAS_KERNEL_H

/* Call first thing in main(). Returns only if no re-execution was needed or possible. */
void blas_kernel_ensure(char **argv);

/* The kernel OpenBLAS is running (e.g. "SkylakeX"). */
const char *blas_kernel_name(void);

#endif
