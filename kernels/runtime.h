/*
 * runtime.h — what a loaded model runs with (runtime.c sets it up in
 * ls_runtime_init): the thread pool, the SIMD kernels, the fp32 norms, the
 * profile counters, the modules' extension slots and the freed session
 * buffers kept for reuse. Not ABI.
 */
#ifndef LS_RUNTIME_H
#define LS_RUNTIME_H

#include <stdint.h>

#include "bufpool.h"
#include "ext.h"
#include "internal.h"
#include "ops.h"
#include "threadpool.h"

/* Most token parts a prefill-sized pass splits into (forward.c). */
#define LS_TOKEN_PARTS_MAX 4

struct ls_runtime {
    ls_pool *pool;
    const ls_ops *ops;
    int32_t n_threads;
    int32_t n_parts;  /* token parts a long pass splits into (forward.c parts_for) */
    ls_qact *part_act[LS_TOKEN_PARTS_MAX]; /* each part's quantized activations (quantized models) */
    float *attn_norm; /* (dim) fp32 copies of the fp16 norm weights */
    float *ffn_norm;  /* (dim) */
    float *norm;      /* (dim) */

    ls_ext ext[LS_RUNTIME_EXT_N]; /* e.g. the draft head (draft_head.c), built on first use */
    ls_bufpool bufs;              /* freed session buffers, for the next sessions (session.c) */

    int32_t profile;          /* ls_model_set_profile */
    double prof[LS_PROF_N];   /* seconds per LS_PROF_* op */
};

/* The first feature the CPU lacks for SIMD path simd (LS_SIMD_AVX2 /
 * LS_SIMD_AVX512), or NULL when it has them all (and for the portable
 * path). */
const char *ls_simd_missing(int32_t simd);

/* Profile clock: 0 (and no clock read) when profiling is off. */
double ls_prof_now(const ls_runtime *rt);
/* Adds now - *t0 to op's counter and sets *t0 = now (no-op when off). */
void ls_prof_add(ls_runtime *rt, int32_t op, double *t0);

#endif
