/*
 * harness/ — the CPU harness of the CUDA library (bench/gpu/validate.sh
 * runs it; CI does on every host): the parts of the CUDA library that are
 * arithmetic or schedule rather than device code, run on the host and held
 * to the CPU library bit for bit. One file per concern:
 *   quant_checks.c the quantized matmuls' arithmetic (kernels/cuda/quant_math.h)
 *   exits.c   the exit gate's arithmetic (exit_math.h) and the schedule of
 *             blocks where rows exit early (block_steps.h)
 *   records.c the reproducible stream and the records
 *   main.c    the command line
 * Prints one JSON line per check (the validation driver's records) and
 * exits 0 when every check passes, 1 otherwise.
 *
 *   harness [STACK_MODEL...]   models with an exit gate for exits.c's schedule check
 */
#ifndef LS_GPU_HARNESS_H
#define LS_GPU_HARNESS_H

#include <stdint.h>
#include <string.h>

/* A reproducible 32-bit stream (xorshift). */
uint32_t harness_rand(void);

/* One check's record (the driver's, bench/gpu/driver/report.c); detail
 * says what was covered or the first difference, and holds no quotes. */
void report(const char *check, int ok, const char *detail);
/* report with another bar than bit-identity. */
void report_bar(const char *check, int ok, const char *bar, const char *detail);

static inline int same_float(float a, float b) { return memcmp(&a, &b, sizeof a) == 0; }

/* quant_checks.c */
void check_quant(void);

/* exits.c: models: paths of models with an exit gate. */
void check_early_exit(char *const *models, int32_t n_models);

/* Checks failed so far (records.c). */
extern int failures;

#endif
