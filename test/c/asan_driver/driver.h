/*
 * asan_driver/ — drives the kernels directly under AddressSanitizer and
 * UndefinedBehaviorSanitizer (test/kernels/asan.test.ts builds and runs it),
 * one file per concern: main.c (the subcommands), args.c (parsing),
 * forward.c (load, logits, invariance), batch.c, fuzz.c, sample.c (sample,
 * sample-check), numerics.c (f16-check, rope-check); driver.h what they
 * share.
 *
 * Build (what the test does):
 *   gcc -std=c11 -O1 -g -fsanitize=address,undefined -fno-omit-frame-pointer \
 *       -DLS_LOAD_TO_HEAP -Ikernels test/c/asan_driver/<every .c> kernels/<every .c> \
 *       kernels/cpu/<every .c, in every folder> (+ per-file SIMD flags) -lm -pthread \
 *       -o build/asan_driver
 * LS_LOAD_TO_HEAP (model.c) reads the model into an exactly-sized heap buffer
 * instead of mapping it, so ASan sees any read past the end of the file.
 *
 * Subcommands (exit 0 on success, 2 when the library reports an error, 1 on
 * bad usage; library errors print "error: <message>" on stdout so that
 * stderr carries only sanitizer reports). A model FILE is loaded with the
 * descriptor FILE.desc beside it (model_desc.h):
 *   load FILE [SIMD]                   ok dim=.. vocab=.. ...
 *   logits FILE LOOPS SIMD TOKEN...    one line of logits per token (%.9g)
 *   invariance FILE LOOPS SIMD TOKEN...  prefill vs one-token steps, bit-exact
 *   batch FILE SIMD TOKEN...           ls_batch_step of mixed sessions vs each stepped alone, bit-exact
 *   fuzz FILE ITERATIONS SEED [-v]     loads ITERATIONS mutated copies of FILE
 *                                      and its descriptor (-v: print each rejection)
 *   sample TEMP TOP_K TOP_P PENALTY SEED COUNTER LOGITS [HISTORY]
 *                                      LOGITS, HISTORY: comma-separated
 *   sample-check                       ls_sample against a naive reference
 *   f16-check                          fp16 conversions at every rounding boundary
 *   rope-check                         every SIMD path's RoPE against the portable one, bit for bit
 * SIMD is a LS_SIMD_* code (0..3) or auto/portable/avx2/avx512.
 */
#ifndef LS_ASAN_DRIVER_H
#define LS_ASAN_DRIVER_H

#include <stdint.h>
#include <stdio.h>

#include "loopserve.h"

/* Prints the usage on stderr; returns 1 (bad usage). */
int usage(void);

// ---- argument parsing (args.c): 0, or -1 for text that is not one ----

int parse_i64(const char *s, long long lo, long long hi, long long *out);
/* A LS_SIMD_* code (0..3) or its name. */
int parse_simd(const char *s, int32_t *out);
/* "nan" included. */
int parse_float(const char *s, float *out);
/* Comma-separated floats ("nan", "inf", "-inf" allowed); returns the count or -1. */
int parse_float_list(const char *s, float **out);
/* Comma-separated int32 values; returns the count or -1. */
int parse_int_list(const char *s, int32_t **out);

// ---- a model and tokens from FILE LOOPS SIMD TOKEN... (forward.c) ----

typedef struct {
    ls_model *m;
    ls_model_info info;
    int32_t loops;
    int32_t n;
    int32_t *tokens;
} fwd_args;

/* 0, the usage's 1, or 2 with the library's error printed. */
int open_forward(int argc, char **argv, fwd_args *a);
void close_forward(fwd_args *a);

/* splitmix64: the fuzzer's mutations and the sampler check's random logits. */
static inline uint64_t rng_next(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// ---- the checks' failure count (sample-check, f16-check, rope-check) ----

extern int g_fail;
#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            printf("error: check at line %d: ", __LINE__);                                         \
            printf(__VA_ARGS__);                                                                   \
            printf("\n");                                                                          \
            g_fail++;                                                                              \
        }                                                                                          \
    } while (0)

// ---- subcommands: exit codes as above ----

int cmd_load(int argc, char **argv);
int cmd_logits(int argc, char **argv);
int cmd_invariance(int argc, char **argv);
int cmd_batch(int argc, char **argv);
int cmd_fuzz(int argc, char **argv);
int cmd_sample(int argc, char **argv);
int cmd_sample_check(void);
int cmd_f16_check(void);
int cmd_rope_check(void);

#endif
