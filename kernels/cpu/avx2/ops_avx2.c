/*
 * ops_avx2.c — AVX2 + FMA + F16C kernels. Built with -mavx2 -mfma -mf16c;
 * called only after ls_runtime_init has checked the CPU.
 *
 * Dot product order (every (token, row) element, whatever T or row range):
 *   one 8-lane accumulator a; for each full 8-element block in order,
 *   a += w[i..i+8) * x[i..i+8) (FMA); then the last < 8 elements,
 *   zero-padded; result = hsum(a) with the fixed shuffle sequence of v_hsum
 *   below.
 * Tiles of R rows x TT tokens only reuse loaded registers (see ops_avx512.c).
 */
#include <immintrin.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "cpu/kvcache.h"
#include "cpu/ops.h"
#include "cpu/simd_vec.h"
#include "internal.h"

typedef __m256 vec;
#define VL 8
#define OPS_NAME(name) name##_avx2
#define EXP_NEG_MIN -87.0f /* 2^n is built in the exponent bits: n stays in the normal range */

SIMD_VEC_OPS(_mm256)

static inline vec v_round(vec a) { return _mm256_round_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }

static inline float v_hsum(vec v) { return ls_hsum256(v); }
static inline float v_hmax(vec v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}

static inline vec v_load_f16(const uint16_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }
static inline void v_store_f16(uint16_t *p, vec a) {
    _mm_storeu_si128((__m128i *)p, _mm256_cvtps_ph(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
static inline vec v_load_i8(const int8_t *p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}

/* AVX2 has no masked load or store for 16- and 8-bit elements: partial
 * vectors go through zero-padded copies, or (bytes) are put together from
 * byte loads (below). */
#define PARTIAL_LOAD(name, T, full)                    \
    static inline vec name(const T *p, int32_t n) {    \
        T tmp[VL] = {0};                               \
        memcpy(tmp, p, (size_t)n * sizeof *p);         \
        return full(tmp);                              \
    }
#define PARTIAL_STORE(name, T, full)                   \
    static inline void name(T *p, vec a, int32_t n) {  \
        T tmp[VL];                                     \
        full(tmp, a);                                  \
        memcpy(p, tmp, (size_t)n * sizeof *p);         \
    }
PARTIAL_LOAD(v_load_n, float, v_load)
PARTIAL_LOAD(v_load_f16_n, uint16_t, v_load_f16)
PARTIAL_STORE(v_store_n, float, v_store)
PARTIAL_STORE(v_store_f16_n, uint16_t, v_store_f16)

/* The first n of 8 bytes in the low bytes of a register, the rest zero:
 * byte loads, cheaper than a copy for the handful a tail holds. */
static inline __m128i bytes_n(const uint8_t *p, int32_t n) {
    uint64_t b = 0;
    for (int32_t i = 0; i < n; i++) b |= (uint64_t)p[i] << (8 * i);
    return _mm_cvtsi64_si128((long long)b);
}

static inline vec v_load_i8_n(const int8_t *p, int32_t n) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes_n((const uint8_t *)p, n)));
}

/* n code bytes -> low nibbles and high nibbles as floats */
static inline void v_load_u4(const uint8_t *p, int32_t n, vec *lo, vec *hi) {
    __m128i raw = n == VL ? _mm_loadl_epi64((const __m128i *)p) : bytes_n(p, n);
    __m256i b = _mm256_cvtepu8_epi32(raw);
    *lo = _mm256_cvtepi32_ps(_mm256_and_si256(b, _mm256_set1_epi32(15)));
    *hi = _mm256_cvtepi32_ps(_mm256_srli_epi32(b, 4));
}

static inline vec v_neg_abs(vec x) { return _mm256_or_ps(x, _mm256_set1_ps(-0.0f)); }
static inline vec v_pick_nonneg(vec x, vec a, vec b) {
    return _mm256_blendv_ps(b, a, _mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_GE_OQ));
}
static inline vec v_pow2(vec p, vec n) {
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

/* matmul tiles: at most TILE_MAX_R rows x TILE_MAX_T tokens */
#define TILE_MAX_R 8
#define TILE_MAX_T 4
/* multi-query attention: 4 queries x 2 vectors = 8 chains, 11 of 16 registers */
#define MQ_SCORES_NV 2
#define MQ_VALUES_E 2

#include "cpu/ops_simd.h"

// ---- fp16 matmul ----


static inline __attribute__((always_inline)) void tile(float *y, int32_t ldy, const float *x,
                                                       int32_t ldx, const uint16_t *w, int32_t in,
                                                       int32_t o, const int R, const int TT,
                                                       int32_t add, const int PF) {
    __m256 a[TILE_MAX_R][TILE_MAX_T];
    const uint16_t *wr[TILE_MAX_R];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) {
        wr[r] = w + (size_t)(o + r) * (size_t)in;
#pragma GCC unroll 8
        for (int t = 0; t < TT; t++) a[r][t] = _mm256_setzero_ps();
    }
    int32_t i = 0;
    for (; i + VL <= in; i += VL) {
        /* decode: the tile's rows are one contiguous span; ask for the
         * next tile's in address order, as fast as this one is read */
        if (PF && (i & (2 * VL - 1)) == 0) {
#pragma GCC unroll 8
            for (int r = 0; r < R / 2; r++) prefetch_ahead(wr[0], (size_t)R * (size_t)(in + i) + (size_t)r * 32);
        }
        tile_step(a, wr, x, ldx, i, 0, R, TT);
    }
    if (i < in) tile_tail(a, wr, x, ldx, i, in - i, R, TT);
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) {
#pragma GCC unroll 8
        for (int t = 0; t < TT; t++) {
            float s = v_hsum(a[r][t]);
            float *yo = y + (size_t)t * (size_t)ldy + o + r;
            *yo = add ? *yo + s : s;
        }
    }
}

/* One tile shape as a function of its own: R rows x TT tokens, PF
 * prefetching the next tile. */
#define TILE_FN(R, TT, PF)                                                                                 \
    static void tile_r##R##_t##TT(float *y, int32_t ldy, const float *x, int32_t ldx, const uint16_t *w, \
                                  int32_t in, int32_t o, int32_t add) {                                    \
        tile(y, ldy, x, ldx, w, in, o, R, TT, add, PF);                                                    \
    }

/* Prefill: 3 rows x 4 tokens (12 accumulators, 3 weight and 1 x
 * registers), over a row block in L2: 7 loads per 12 FMAs; 4 x 3 spills
 * (docs/kernels.md#tuning-figures). No prefetch: the block is in L2. */
TILE_FN(3, 4, 0)
TILE_FN(1, 4, 0)
/* Decode: 8 rows a tile, 8 weight streams in flight; the next tile is
 * prefetched in address order, 4 lines every two steps, not a prefetch per
 * row per step (docs/kernels.md#tuning-figures). */
TILE_FN(8, 1, 1)
TILE_FN(1, 1, 0)

static void matmul_f16_avx2(float *y, int32_t ldy, const float *x, int32_t ldx, const uint16_t *w,
                            int32_t in, int32_t T, int32_t o0, int32_t o1, int32_t add) {
    int32_t rb = LS_L2_BLOCK_BYTES / (in * 2);
    rb = rb < 8 ? 8 : rb & ~7; /* whole decode tiles */
    for (int32_t ob = o0; ob < o1; ob += rb) {
        int32_t oe = o1 - ob < rb ? o1 : ob + rb;
        int32_t t = 0;
        for (; t + 4 <= T; t += 4) {
            const float *xt = x + (size_t)t * (size_t)ldx;
            float *yt = y + (size_t)t * (size_t)ldy;
            int32_t o = ob;
            for (; o + 3 <= oe; o += 3) tile_r3_t4(yt, ldy, xt, ldx, w, in, o, add);
            for (; o < oe; o++) tile_r1_t4(yt, ldy, xt, ldx, w, in, o, add);
        }
        for (; t < T; t++) {
            const float *xt = x + (size_t)t * (size_t)ldx;
            float *yt = y + (size_t)t * (size_t)ldy;
            int32_t o = ob;
            for (; o + 8 <= oe; o += 8) tile_r8_t1(yt, ldy, xt, ldx, w, in, o, add);
            for (; o < oe; o++) tile_r1_t1(yt, ldy, xt, ldx, w, in, o, add);
        }
    }
}

const ls_ops ls_ops_avx2 = {
    .simd = LS_SIMD_AVX2,
    LS_OPS_ENTRIES(avx2),
    .swiglu = swiglu_avx2,
    .softmax_exp = softmax_exp_avx2,
    .attn_scores_mq = attn_scores_mq_avx2,
    .attn_values_mq = attn_values_mq_avx2,
};
