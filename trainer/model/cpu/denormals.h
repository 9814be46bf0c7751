/* denormals: the CPU path computes with subnormal floats flushed to zero.
 *
 * As a model trains, its softmaxes sharpen (attention, the output head), and exp() of
 * logits far below the row's maximum lands in the subnormal range (below 1.2e-38). On Intel
 * cores every multiply with such an operand takes a microcode assist of ~100 cycles, so the
 * same GEMMs slow down as training goes on: on an Intel Xeon (family 6 model 167) two
 * regions syncing every 50 steps saw their steps grow from 11 to 20 ms in 400 steps, all of
 * it gone with flushing; AMD cores pay little, which is why it hid there. Values that small
 * change no loss or gradient that matters (they are 1e-30 of the entries beside them).
 * Flushing is what TensorFlow does on CPUs by default and what PyTorch offers as
 * set_flush_denormal. The processes that run the model (train, stage, bench, sample) flush;
 * every stage of every region does, so results stay identical across processes and
 * machines. The gateway and the client do not: their codecs are specified bit for bit in
 * IEEE binary32, subnormal edge cases included. The stage's q8 activation codec does run
 * flushed: a block whose largest value is under ~127 x 2^-126 gets a zero scale and
 * decodes to zeros (never NaN or Inf), where IEEE arithmetic would keep a few codes.
 */
#ifndef CIRRUS_DENORMALS_H
#define CIRRUS_DENORMALS_H

/* Flush subnormal results to zero and read subnormal operands as zero in this thread and in
 * the threads it starts afterwards (a new thread copies its creator's floating-point
 * control state; the OpenMP team the kernels run in is made at their first parallel region,
 * and the model's GEMMs run single-threaded OpenBLAS inside it): call first thing in main(),
 * before any thread exists. No-op on CPUs it does not know. */
void cpu_flush_denormals(void);

#endif
