/*
 * quantize_avx2.c — the weight quantizer's search (quantize_simd.h) on
 * four groups at a time, with AVX2; fp16 rounding up and down lane by lane
 * (AVX2's conversions round only as MXCSR says).
 */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

typedef __m256d vd;
typedef __m256d vm;
#define VL 4
#define QZ_NAME(name) name##_avx2

static inline vd vd_set1(double x) { return _mm256_set1_pd(x); }
static inline vd vd_load(const double *p) { return _mm256_load_pd(p); }
static inline void vd_store(double *p, vd a) { _mm256_store_pd(p, a); }
static inline vd vd_add(vd a, vd b) { return _mm256_add_pd(a, b); }
static inline vd vd_sub(vd a, vd b) { return _mm256_sub_pd(a, b); }
static inline vd vd_mul(vd a, vd b) { return _mm256_mul_pd(a, b); }
static inline vd vd_div(vd a, vd b) { return _mm256_div_pd(a, b); }
static inline vd vd_min(vd a, vd b) { return _mm256_min_pd(a, b); }
static inline vd vd_max(vd a, vd b) { return _mm256_max_pd(a, b); }
static inline vd vd_abs(vd a) { return _mm256_andnot_pd(_mm256_set1_pd(-0.0), a); }
static inline vd vd_rint(vd a) { return _mm256_round_pd(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
static inline vm vm_lt(vd a, vd b) { return _mm256_cmp_pd(a, b, _CMP_LT_OQ); }
static inline vm vm_le(vd a, vd b) { return _mm256_cmp_pd(a, b, _CMP_LE_OQ); }
static inline vm vm_gt(vd a, vd b) { return _mm256_cmp_pd(a, b, _CMP_GT_OQ); }
static inline vm vm_and(vm a, vm b) { return _mm256_and_pd(a, b); }
static inline vm vm_andnot(vm a, vm b) { return _mm256_andnot_pd(a, b); }
static inline unsigned vm_bits(vm m) { return (unsigned)_mm256_movemask_pd(m); }
static inline vd vd_select(vm m, vd a, vd b) { return _mm256_blendv_pd(a, b, m); }

#include "cpu/quantize_search.h"

#define F16_DIRECTED(name, round)                                          \
    static inline vd name(vd x, vd *bits) {                                \
        double lane[VL] __attribute__((aligned(32))), b[VL] __attribute__((aligned(32))); \
        _mm256_store_pd(lane, x);                                          \
        for (int j = 0; j < VL; j++) {                                     \
            const uint16_t h = round(lane[j]);                             \
            b[j] = h;                                                      \
            lane[j] = ls_qz_f16_value(h);                                  \
        }                                                                  \
        *bits = _mm256_load_pd(b);                                         \
        return _mm256_load_pd(lane);                                       \
    }
F16_DIRECTED(vd_f16_up, ls_qz_f16_up)
F16_DIRECTED(vd_f16_down, ls_qz_f16_down)

#include "cpu/quantize_simd.h"

static void to_f32_avx2(float *out, const void *src, int32_t input, int64_t n) {
    if (input == LS_QUANTIZE_F32) {
        memcpy(out, src, (size_t)n * sizeof *out);
        return;
    }
    const uint16_t *h = src;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m128i x = _mm_loadu_si128((const __m128i *)(h + i));
        _mm256_storeu_ps(out + i, input == LS_QUANTIZE_F16 ? _mm256_cvtph_ps(x)
                                                           : _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(x), 16)));
    }
    ls_qz_ops_portable.to_f32(out + i, h + i, input, n - i);
}

const ls_qz_ops ls_qz_ops_avx2 = {
    .simd = LS_SIMD_AVX2, .symmetric = symmetric_avx2, .offset = offset_avx2, .to_f32 = to_f32_avx2,
};
