/*
 * quantize_avx512.c — the weight quantizer's search (quantize_simd.h) on
 * eight groups at a time, with AVX-512F; fp16 rounding up and down by the
 * conversions' own rounding modes.
 */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

typedef __m512d vd;
typedef __mmask8 vm;
#define VL 8
#define QZ_NAME(name) name##_avx512
#define QZ_P(name) _mm512_##name

static inline vd vd_abs(vd a) { return _mm512_abs_pd(a); }
static inline vd vd_rint(vd a) { return _mm512_roundscale_pd(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
static inline vm vm_lt(vd a, vd b) { return _mm512_cmp_pd_mask(a, b, _CMP_LT_OQ); }
static inline vm vm_le(vd a, vd b) { return _mm512_cmp_pd_mask(a, b, _CMP_LE_OQ); }
static inline vm vm_gt(vd a, vd b) { return _mm512_cmp_pd_mask(a, b, _CMP_GT_OQ); }
static inline vm vm_and(vm a, vm b) { return a & b; }
static inline vm vm_andnot(vm a, vm b) { return (vm)(~a & b); }
static inline unsigned vm_bits(vm m) { return m; }
static inline vd vd_select(vm m, vd a, vd b) { return _mm512_mask_blend_pd(m, a, b); }

#include "cpu/quantize_search.h"

/* Directed rounding to fp32, then to fp16, is the directed rounding to
 * fp16: each grid holds the next. */
#define F16_DIRECTED(name, mode)                                              \
    static inline vd name(vd x, vd *bits) {                                   \
        const __m256 f = _mm512_cvt_roundpd_ps(x, (mode) | _MM_FROUND_NO_EXC); \
        const __m128i h = _mm256_cvtps_ph(f, (mode) | _MM_FROUND_NO_EXC);     \
        *bits = _mm512_cvtepi32_pd(_mm256_cvtepu16_epi32(h));                 \
        return _mm512_cvtps_pd(_mm256_cvtph_ps(h));                           \
    }
F16_DIRECTED(vd_f16_up, _MM_FROUND_TO_POS_INF)
F16_DIRECTED(vd_f16_down, _MM_FROUND_TO_NEG_INF)

#define F32_VL 16
static inline void f32_from_halves(float *out, const uint16_t *h, int32_t input) {
    const __m256i x = _mm256_loadu_si256((const __m256i *)h);
    _mm512_storeu_ps(out, input == LS_QUANTIZE_F16 ? _mm512_cvtph_ps(x)
                                                   : _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(x), 16)));
}

#include "cpu/quantize_simd.h"

QZ_OPS_TABLE(avx512, LS_SIMD_AVX512);
