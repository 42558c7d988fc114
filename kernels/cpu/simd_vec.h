/*
 * simd_vec.h — vector helpers the x86 kernel files (*_avx2.c, *_avx512.c,
 * built with their ISA's flags) share: the fixed 8-lane sum, and the
 * primitives of ops_simd.h that are one intrinsic on every path, generated
 * from the intrinsics' prefix so that ops_avx2.c and ops_avx512.c define
 * only what differs (each defines `vec`, __m256 or __m512, then invokes
 * SIMD_VEC_OPS(_mm256) or SIMD_VEC_OPS(_mm512)).
 */
#ifndef LS_SIMD_VEC_H
#define LS_SIMD_VEC_H

#include <immintrin.h>

/* Bytes of weight rows a tiled matmul keeps in L2 while every group of
 * tokens passes over them (ops_simd.h, quant_avx2.c, quant_avx512.c). */
#define LS_L2_BLOCK_BYTES (64 * 1024)

/* The 8 lanes of v summed as ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)):
 * the order the AVX2 dot products and every path's quantized matmul
 * (quant.h) end with. */
static inline float ls_hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* The primitives that are one intrinsic on either path, from the
 * intrinsics' prefix P (_mm256, _mm512). */
#define SIMD_VEC_OPS(P)                                                                     \
    static inline vec v_zero(void) { return P##_setzero_ps(); }                             \
    static inline vec v_set1(float x) { return P##_set1_ps(x); }                            \
    static inline vec v_add(vec a, vec b) { return P##_add_ps(a, b); }                      \
    static inline vec v_sub(vec a, vec b) { return P##_sub_ps(a, b); }                      \
    static inline vec v_mul(vec a, vec b) { return P##_mul_ps(a, b); }                      \
    static inline vec v_div(vec a, vec b) { return P##_div_ps(a, b); }                      \
    static inline vec v_max(vec a, vec b) { return P##_max_ps(a, b); }                      \
    static inline vec v_fma(vec a, vec b, vec c) { return P##_fmadd_ps(a, b, c); }          \
    static inline vec v_fnma(vec a, vec b, vec c) { return P##_fnmadd_ps(a, b, c); }        \
    static inline vec v_load(const float *p) { return P##_loadu_ps(p); }                    \
    static inline void v_store(float *p, vec a) { P##_storeu_ps(p, a); }

#endif
