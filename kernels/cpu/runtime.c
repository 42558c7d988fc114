/*
 * runtime.c — what a loaded model runs with (runtime.h): the SIMD path
 * chosen for this CPU, the thread pool, the fp32 copies of the norms, and
 * the profile counters. Set up once by ls_model_load, below the forward
 * pass and the sessions that use it.
 */
#include <cpuid.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "quant.h"
#include "runtime.h"
#include "session_rules.h"

// ---- runtime: SIMD selection, pool, fp32 norms ----

typedef struct {
    const char *name;
    int supported;
} cpu_feature;

/* CPUID leaf 1, ECX bit 29: clang before 15 (the fuzz build) has no "f16c"
 * in __builtin_cpu_supports. */
static int cpu_has_f16c(void) {
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C) != 0;
}

const char *ls_simd_missing(int32_t simd) {
    __builtin_cpu_init();
    if (simd == LS_SIMD_AVX2) {
        cpu_feature f[] = {{"avx2", __builtin_cpu_supports("avx2")},
                           {"fma", __builtin_cpu_supports("fma")},
                           {"f16c", cpu_has_f16c()}};
        for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
            if (!f[i].supported) return f[i].name;
    } else if (simd == LS_SIMD_AVX512) {
        cpu_feature f[] = {{"avx512f", __builtin_cpu_supports("avx512f")},
                           {"avx512bw", __builtin_cpu_supports("avx512bw")},
                           {"avx512vl", __builtin_cpu_supports("avx512vl")},
                           {"avx512dq", __builtin_cpu_supports("avx512dq")},
                           {"fma", __builtin_cpu_supports("fma")},
                           {"f16c", cpu_has_f16c()}};
        for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
            if (!f[i].supported) return f[i].name;
    }
    return NULL;
}

static const ls_ops *ops_for(int32_t simd) {
    switch (simd) {
    case LS_SIMD_AVX512: return &ls_ops_avx512;
    case LS_SIMD_AVX2: return &ls_ops_avx2;
    default: return &ls_ops_portable;
    }
}

static void f16_to_f32(float *out, const uint16_t *w, int32_t n) {
    if (w)
        for (int32_t i = 0; i < n; i++) out[i] = ls_f16_to_f32(w[i]);
}

/* The fp32 copies of every norm, of the q/k biases and of the exit gate; 0 on failure. */
static int norms_to_f32(ls_runtime *rt, const ls_model *m) {
    const ls_model_info *mi = &m->info;
    const int32_t dim = mi->dim, L = mi->n_layers + LS_FIXED_UNITS(m);
    const size_t q_dim = (size_t)mi->n_heads * mi->head_dim, kv_dim = (size_t)mi->n_kv_heads * mi->head_dim;
    rt->layer_norms = calloc((size_t)L * LS_NORMS_PER_LAYER * (size_t)dim, sizeof(float));
    rt->norm = malloc((size_t)dim * sizeof(float));
    if (m->w.exit_w) rt->exit_gate = malloc(((size_t)dim + 1) * sizeof(float));
    if (mi->qk_bias) rt->qk_bias = malloc((size_t)L * (q_dim + kv_dim) * sizeof(float));
    if (!rt->layer_norms || !rt->norm || (m->w.exit_w && !rt->exit_gate) || (mi->qk_bias && !rt->qk_bias)) return 0;
    for (int32_t i = 0; i < L; i++) {
        const ls_layer_weights *lw = &m->w.layers[i];
        const uint16_t *w[LS_NORMS_PER_LAYER] = {lw->attn_norm, lw->ffn_norm, lw->attn_out_norm, lw->ffn_out_norm};
        for (int32_t k = 0; k < LS_NORMS_PER_LAYER; k++) f16_to_f32((float *)ls_layer_norm(rt, dim, i, k), w[k], dim);
        if (!rt->qk_bias) continue;
        f16_to_f32(rt->qk_bias + (size_t)i * (q_dim + kv_dim), lw->wq_bias, (int32_t)q_dim);
        f16_to_f32(rt->qk_bias + (size_t)i * (q_dim + kv_dim) + q_dim, lw->wk_bias, (int32_t)kv_dim);
    }
    f16_to_f32(rt->norm, m->w.norm, dim);
    if (rt->exit_gate) {
        f16_to_f32(rt->exit_gate, m->w.exit_w, dim);
        f16_to_f32(rt->exit_gate + dim, m->w.exit_b, 1);
    }
    return 1;
}

int32_t ls_runtime_init(ls_model *m, int32_t n_threads, int32_t simd, char *err, int32_t err_len) {
    ls_model_info *mi = &m->info;
    if (ls_check_model_shape(mi, err, err_len) != LS_OK) return LS_ERR_ARG;
    int32_t chosen;
    if (simd == LS_SIMD_AUTO) {
        chosen = !ls_simd_missing(LS_SIMD_AVX512) ? LS_SIMD_AVX512
                 : !ls_simd_missing(LS_SIMD_AVX2) ? LS_SIMD_AVX2
                                                  : LS_SIMD_PORTABLE;
    } else if (simd == LS_SIMD_PORTABLE || simd == LS_SIMD_AVX2 || simd == LS_SIMD_AVX512) {
        const char *lack = ls_simd_missing(simd);
        if (lack) {
            ls_set_error(err, err_len, "simd path %s requested but the CPU lacks %s", ls_simd_name(simd),
                         lack);
            return LS_ERR_ARG;
        }
        chosen = simd;
    } else {
        ls_set_error(err, err_len, "unknown simd path %d (expected 0 auto, 1 portable, 2 avx2, 3 avx512)",
                     simd);
        return LS_ERR_ARG;
    }

    ls_runtime *rt = calloc(1, sizeof *rt);
    if (!rt || !ls_bufpool_init(&rt->bufs)) {
        free(rt);
        ls_set_error(err, err_len, "out of memory allocating the runtime");
        return LS_ERR_NOMEM;
    }
    rt->ops = ops_for(chosen);
    if (!norms_to_f32(rt, m)) {
        m->rt = rt;
        ls_runtime_free(m);
        ls_set_error(err, err_len, "out of memory converting the norm weights");
        return LS_ERR_NOMEM;
    }
    rt->pool = ls_pool_new(n_threads);
    if (!rt->pool) {
        m->rt = rt;
        ls_runtime_free(m);
        ls_set_error(err, err_len, "could not start the thread pool (%d threads requested)", n_threads);
        return LS_ERR_NOMEM;
    }
    rt->n_threads = ls_pool_threads(rt->pool);
    rt->n_parts = mi->quant != LS_QUANT_FP16 && rt->n_threads <= LS_TOKEN_PARTS_MAX ? rt->n_threads : 1;
    if (m->qact) {
        m->qact->simd = chosen; /* the quantized kernels follow the fp16 choice */
        ls_quant_setup(m->qact);
        for (int32_t p = 0; p < rt->n_parts && rt->n_parts > 1; p++) /* a part's quantized activations */
            if (!(rt->part_act[p] = ls_qact_private(m->qact))) {
                m->rt = rt;
                ls_runtime_free(m);
                ls_set_error(err, err_len, "out of memory allocating the quantized-activation scratch");
                return LS_ERR_NOMEM;
            }
    }
    mi->simd = chosen;
    mi->n_threads = rt->n_threads;
    m->rt = rt;
    return LS_OK;
}

void ls_runtime_free(ls_model *m) {
    if (!m || !m->rt) return;
    ls_runtime *rt = m->rt;
    ls_ext_free_all(rt->ext, LS_RUNTIME_EXT_N);
    ls_bufpool_drain(&rt->bufs);
    ls_pool_free(rt->pool);
    for (int32_t p = 0; p < LS_TOKEN_PARTS_MAX; p++) ls_qact_free(rt->part_act[p]);
    free(rt->layer_norms);
    free(rt->norm);
    free(rt->exit_gate);
    free(rt->qk_bias);
    free(rt);
    m->rt = NULL;
}

// ---- profile (loopserve.h LS_PROF_*) ----

double ls_prof_now(const ls_runtime *rt) {
    if (!rt->profile) return 0.0;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void ls_prof_add(ls_runtime *rt, int32_t op, double *t0) {
    if (!rt->profile) return;
    double t = ls_prof_now(rt);
    rt->prof[op] += t - *t0;
    *t0 = t;
}

void ls_model_set_profile(ls_model *m, int32_t on) {
    if (m && m->rt) m->rt->profile = on != 0;
}

int32_t ls_model_profile_read(ls_model *m, double *out, int32_t n, int32_t reset) {
    if (!m || !m->rt) return LS_ERR_ARG;
    for (int32_t i = 0; i < n && i < LS_PROF_N; i++) out[i] = m->rt->prof[i];
    if (reset) memset(m->rt->prof, 0, sizeof m->rt->prof);
    return LS_PROF_N;
}

int32_t ls_model_device_memory(const ls_model *m, uint64_t *free_bytes, uint64_t *total_bytes) {
    (void)m, (void)free_bytes, (void)total_bytes;
    return LS_ERR_UNSUPPORTED; /* the weights and caches are in host memory */
}
