/* Set-up of the trainer's unit-test binary: run OpenBLAS's proper kernel (see
 * trainer/model/cpu/blas_kernel.h), as cirrus-trainer itself does. */
#include "../../trainer/model/cpu/blas_kernel.h"

void test_setup(char **argv);

void test_setup(char **argv)
{
    blas_kernel_ensure(argv);
}
