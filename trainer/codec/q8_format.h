/* q8_format: the constants of the q8 block format and arithmetic (see q8.c's top comment),
 * shared by the CPU codec (q8.c) and the CUDA one (model/cuda/optim_codec.cu), which must
 * produce the same bytes. Plain macros: this header is read by C and by CUDA C++.
 */
#ifndef CIRRUS_CODEC_Q8_FORMAT_H
#define CIRRUS_CODEC_Q8_FORMAT_H

#include "q8.h"

#define Q8_SCALE_BYTES 4
#define Q8_BLOCK_BYTES (Q8_SCALE_BYTES + CODEC_Q8_BLOCK)

#define Q8_TINY 0x1p-96f              /* absmax below this: prescale by Q8_PRE */
#define Q8_PRE 0x1p64f
#define Q8_SCALE_MAX 0x1.020406p+121f /* 127 * this = 0x1.fffffcp+127 <= FLT_MAX */

#endif
