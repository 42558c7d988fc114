/*
 * simd_vec.h — the vector primitives of ops_simd.h that are one intrinsic
 * on every x86 path, generated from the intrinsics' prefix, so that
 * ops_avx2.c and ops_avx512.c define only what differs. Each includes it
 * after defining `vec` (__m256, __m512) and invokes SIMD_VEC_OPS(_mm256) or
 * SIMD_VEC_OPS(_mm512).
 */
#ifndef LS_SIMD_VEC_H
#define LS_SIMD_VEC_H

/* The primitives that are one intrinsic on either path, from the
 * intrinsics' prefix P (_mm256, _mm512). */
#define SIMD_VEC_OPS(P)                                                                     \
    static inline vec v_zero(void) { return P##_setzero_ps(); }                             \
    static inline vec v_set1(float x) { return P##_set1_ps(x); }                            \
    static inline vec v_add(vec a, vec b) { return P##_add_ps(a, b); }                      \
    static inline vec v_mul(vec a, vec b) { return P##_mul_ps(a, b); }                      \
    static inline vec v_div(vec a, vec b) { return P##_div_ps(a, b); }                      \
    static inline vec v_max(vec a, vec b) { return P##_max_ps(a, b); }                      \
    static inline vec v_fma(vec a, vec b, vec c) { return P##_fmadd_ps(a, b, c); }          \
    static inline vec v_fnma(vec a, vec b, vec c) { return P##_fnmadd_ps(a, b, c); }        \
    static inline vec v_load(const float *p) { return P##_loadu_ps(p); }                    \
    static inline void v_store(float *p, vec a) { P##_storeu_ps(p, a); }

#endif
