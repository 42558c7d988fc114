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
    float *layer_norms; /* (n_layers, LS_NORMS_PER_LAYER, dim) fp32 copies of each layer's fp16 norm weights
                         * (ls_layer_norm); a norm the model lacks stays zero and is never read */
    float *norm;        /* (dim) */
    float *exit_gate;   /* (dim + 1) the exit gate's weights, then its bias; NULL without a gate */
    float *qk_bias;     /* (layers, q_dim + kv_dim) each layer's q bias then k bias (ls_layer_qk_bias); NULL
                         * without qk_bias */

    ls_ext ext[LS_RUNTIME_EXT_N]; /* e.g. the draft head (draft_head.c), built on first use */
    ls_bufpool bufs;              /* freed session buffers, for the next sessions (session.c) */

    int32_t profile;          /* ls_model_set_profile */
    double prof[LS_PROF_N];   /* seconds per LS_PROF_* op */
};

/* A layer's norms in rt->layer_norms, in this order. */
enum { LS_NORM_ATTN, LS_NORM_FFN, LS_NORM_ATTN_OUT, LS_NORM_FFN_OUT, LS_NORMS_PER_LAYER };

static inline const float *ls_layer_norm(const ls_runtime *rt, int32_t dim, int32_t layer, int32_t which) {
    return rt->layer_norms + ((size_t)layer * LS_NORMS_PER_LAYER + (size_t)which) * (size_t)dim;
}

/* Layer `layer`'s q bias (q_dim floats), its k bias (kv_dim) right after it; NULL without qk_bias. */
static inline const float *ls_layer_qk_bias(const ls_runtime *rt, const ls_model_info *mi, int32_t layer) {
    if (!rt->qk_bias) return NULL;
    return rt->qk_bias + (size_t)layer * (size_t)(mi->n_heads + mi->n_kv_heads) * (size_t)mi->head_dim;
}

/* The first feature the CPU lacks for SIMD path simd (LS_SIMD_AVX2 /
 * LS_SIMD_AVX512), or NULL when it has them all (and for the portable
 * path). */
const char *ls_simd_missing(int32_t simd);

/* Profile clock: 0 (and no clock read) when profiling is off. */
double ls_prof_now(const ls_runtime *rt);
/* Adds now - *t0 to op's counter and sets *t0 = now (no-op when off). */
void ls_prof_add(ls_runtime *rt, int32_t op, double *t0);

#endif
