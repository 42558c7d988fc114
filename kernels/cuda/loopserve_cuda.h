/*
 * loopserve_cuda.h — what libloopserve_cuda.so exports beside the ABI of
 * kernels/loopserve.h (which it implements whole): finding a device, the
 * selector of kernels that have not yet passed a validation run on a GPU,
 * and the self-test the validation driver runs (bench/gpu/, docs/gpu.md).
 * The CPU library has none of these; a caller finds them with dlsym.
 */
#ifndef LOOPSERVE_CUDA_H
#define LOOPSERVE_CUDA_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Number of usable CUDA devices; 0 when there is no driver, no device or
 * any error. Never fails: a host without a GPU loads the library all the same. */
int32_t ls_cuda_device_count(void);

/* ---- kernel families, and how an unverified one lands ----
 *
 * Kernels are written and compiled where there is no GPU; each family of
 * them is off until a validation run on a GPU has passed with it
 * (bench/gpu/validate.sh), and is switched on by default in the change that
 * commits that run's JSON. Until then the library refuses, by name, what
 * the family would serve (ls_model_load of an int4 model, say), unless the
 * caller enables it here: the validation driver does; a server never does. */
#define LS_CUDA_KERNELS_QUANT 1  /* int4 / int2 block matrices and int8 / int6 / int4 output heads */
#define LS_CUDA_KERNELS_STACKS 2 /* stacks of layers, sandwich and step norms, the exit gate and its policies */
#define LS_CUDA_KERNELS_ALL 3    /* every family this build has */

/* Enables the families of `families` (LS_CUDA_KERNELS_* bits; the others
 * off) for the models loaded after the call; -1 changes nothing. Returns the
 * families in use from now on: those a validation run verified, which are
 * always on, and those enabled. */
int32_t ls_cuda_kernels(int32_t families);

/* The families that have passed a validation run (on by default). */
int32_t ls_cuda_kernels_verified(void);

/* Runs the device kernels of the enabled families on generated inputs
 * against the host execution of the same arithmetic (kernels/cuda/
 * quant_math.h, exit_math.h), bit for bit: activation codes and scales,
 * every quantized matrix format, group and row length, 1 to 64 tokens per
 * launch, the embedding read from a quantized head; the exit gate's
 * decisions over several steps. Writes a one-line summary (or the first
 * difference) to report. Returns the number of failed cases, or a negative
 * LS_ERR_* when the device cannot run it (LS_ERR_STATE: no device). */
int32_t ls_cuda_selftest(char *report, int32_t report_len);

#ifdef __cplusplus
}
#endif

#endif
