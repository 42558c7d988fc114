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
#define QZ_P(name) _mm256_##name

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

#define F32_VL 8
static inline void f32_from_halves(float *out, const uint16_t *h, int32_t input) {
    const __m128i x = _mm_loadu_si128((const __m128i *)h);
    _mm256_storeu_ps(out, input == LS_QUANTIZE_F16 ? _mm256_cvtph_ps(x)
                                                   : _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(x), 16)));
}

#include "cpu/quantize_simd.h"

QZ_OPS_TABLE(avx2, LS_SIMD_AVX2);
