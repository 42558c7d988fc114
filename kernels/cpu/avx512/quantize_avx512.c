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

static inline vd vd_set1(double x) { return _mm512_set1_pd(x); }
static inline vd vd_load(const double *p) { return _mm512_load_pd(p); }
static inline void vd_store(double *p, vd a) { _mm512_store_pd(p, a); }
static inline vd vd_add(vd a, vd b) { return _mm512_add_pd(a, b); }
static inline vd vd_sub(vd a, vd b) { return _mm512_sub_pd(a, b); }
static inline vd vd_mul(vd a, vd b) { return _mm512_mul_pd(a, b); }
static inline vd vd_div(vd a, vd b) { return _mm512_div_pd(a, b); }
static inline vd vd_min(vd a, vd b) { return _mm512_min_pd(a, b); }
static inline vd vd_max(vd a, vd b) { return _mm512_max_pd(a, b); }
static inline vd vd_abs(vd a) { return _mm512_abs_pd(a); }
static inline vd vd_rint(vd a) { return _mm512_roundscale_pd(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
static inline vm vm_lt(vd a, vd b) { return _mm512_cmp_pd_mask(a, b, _CMP_LT_OQ); }
static inline vm vm_le(vd a, vd b) { return _mm512_cmp_pd_mask(a, b, _CMP_LE_OQ); }
static inline vm vm_gt(vd a, vd b) { return _mm512_cmp_pd_mask(a, b, _CMP_GT_OQ); }
static inline vm vm_and(vm a, vm b) { return a & b; }
static inline vm vm_andnot(vm a, vm b) { return (vm)(~a & b); }
static inline unsigned vm_bits(vm m) { return m; }
static inline vd vd_select(vm m, vd a, vd b) { return _mm512_mask_blend_pd(m, a, b); }

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

#include "cpu/quantize_simd.h"

static void to_f32_avx512(float *out, const void *src, int32_t input, int64_t n) {
    if (input == LS_QUANTIZE_F32) {
        memcpy(out, src, (size_t)n * sizeof *out);
        return;
    }
    const uint16_t *h = src;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m256i x = _mm256_loadu_si256((const __m256i *)(h + i));
        _mm512_storeu_ps(out + i, input == LS_QUANTIZE_F16 ? _mm512_cvtph_ps(x)
                                                           : _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(x), 16)));
    }
    ls_qz_ops_portable.to_f32(out + i, h + i, input, n - i);
}

const ls_qz_ops ls_qz_ops_avx512 = {
    .simd = LS_SIMD_AVX512, .symmetric = symmetric_avx512, .offset = offset_avx512, .to_f32 = to_f32_avx512,
};
