/*
 * ops_avx512.c — AVX-512 kernels (F, BW, VL; F16C for fp16 -> fp32, FMA).
 * Built with -mavx512f -mavx512bw -mavx512vl -mavx512dq ... ; called only
 * after ls_runtime_init has checked the CPU.
 *
 * Dot product order (every (token, row) element, whatever T or row range):
 *   one 16-lane accumulator a; for each full 16-element block in order,
 *   a += w[i..i+16) * x[i..i+16) (FMA); then the last < 16 elements,
 *   masked (zeros elsewhere); result = _mm512_reduce_add_ps(a) (fixed
 *   shuffle sequence).
 * Tiles of R rows x TT tokens keep R*TT independent accumulators, each
 * following exactly that order; they exist only to reuse each converted
 * weight vector across TT tokens (prefill, 4 x 6) or to keep more FMAs in
 * flight (decode, R = 4).
 */
#include <immintrin.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "cpu/kvcache.h"
#include "cpu/ops.h"
#include "cpu/simd_vec.h"
#include "internal.h"

typedef __m512 vec;
#define VL 16
#define OPS_NAME(name) name##_avx512
#define EXP_NEG_MIN -104.0f /* scalef: the result underflows to 0 below about -104 */

static inline __mmask16 lanes(int32_t n) { return (__mmask16)((1u << n) - 1u); }

SIMD_VEC_OPS(_mm512)

static inline vec v_round(vec a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
static inline float v_hsum(vec a) { return _mm512_reduce_add_ps(a); }
static inline float v_hmax(vec a) { return _mm512_reduce_max_ps(a); }

static inline vec v_load_n(const float *p, int32_t n) { return _mm512_maskz_loadu_ps(lanes(n), p); }
static inline void v_store_n(float *p, vec a, int32_t n) { _mm512_mask_storeu_ps(p, lanes(n), a); }
static inline vec v_load_f16(const uint16_t *p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)); }
static inline vec v_load_f16_n(const uint16_t *p, int32_t n) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(lanes(n), p));
}
static inline void v_store_f16(uint16_t *p, vec a) {
    _mm256_storeu_si256((__m256i *)p, _mm512_cvtps_ph(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
static inline void v_store_f16_n(uint16_t *p, vec a, int32_t n) {
    _mm256_mask_storeu_epi16(p, lanes(n), _mm512_cvtps_ph(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
static inline vec v_load_i8(const int8_t *p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
}
static inline vec v_load_i8_n(const int8_t *p, int32_t n) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(lanes(n), p)));
}

/* 16 code bytes (n of them) -> low nibbles and high nibbles as floats */
static inline void v_load_u4(const uint8_t *p, int32_t n, vec *lo, vec *hi) {
    __m128i raw = n == VL ? _mm_loadu_si128((const __m128i *)p) : _mm_maskz_loadu_epi8(lanes(n), p);
    __m512i b = _mm512_cvtepu8_epi32(raw);
    *lo = _mm512_cvtepi32_ps(_mm512_and_si512(b, _mm512_set1_epi32(15)));
    *hi = _mm512_cvtepi32_ps(_mm512_srli_epi32(b, 4));
}

static inline vec v_neg_abs(vec x) { return _mm512_sub_ps(_mm512_setzero_ps(), _mm512_abs_ps(x)); }
static inline vec v_pick_nonneg(vec x, vec a, vec b) {
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_GE_OQ), b, a);
}
static inline vec v_pow2(vec p, vec n) { return _mm512_scalef_ps(p, n); }

/* matmul tiles: at most TILE_MAX_R rows x TILE_MAX_T tokens */
#define TILE_MAX_R 8
#define TILE_MAX_T 8 /* R * TT <= 24: R * TT accumulators + R weights + 1 x in 32 registers */
/* multi-query attention: 4 queries x 2 (scores) or 4 (values) vectors */
#define MQ_SCORES_NV 2
#define MQ_VALUES_E 4

#include "cpu/ops_simd.h"

// ---- fp16 matmul ----


/* Lane k: _mm512_reduce_add_ps(v[k]), the same additions with the same
 * operands in the same order, for sixteen vectors at once: the halves
 * (hi + lo), the quads of that (hi + lo), then (0 + 2) + (1 + 3). Each step
 * adds two vectors' worth of partial sums in one instruction, so a tile's
 * sums cost 15 additions and 31 shuffles instead of 16 times 4 and 4. */
static inline __m512 reduce16(const __m512 v[16]) {
    __m512 A[8], B[4], C[2];
#pragma GCC unroll 8
    for (int k = 0; k < 8; k++) /* quads: v[2k] (q0 + q2, q1 + q3), v[2k + 1] (the same) */
        A[k] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * k], v[2 * k + 1], _MM_SHUFFLE(3, 2, 3, 2)),
                             _mm512_shuffle_f32x4(v[2 * k], v[2 * k + 1], _MM_SHUFFLE(1, 0, 1, 0)));
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++) /* quad j: the four-lane sum of v[4k + j] */
        B[k] = _mm512_add_ps(_mm512_shuffle_f32x4(A[2 * k], A[2 * k + 1], _MM_SHUFFLE(3, 1, 3, 1)),
                             _mm512_shuffle_f32x4(A[2 * k], A[2 * k + 1], _MM_SHUFFLE(2, 0, 2, 0)));
#pragma GCC unroll 2
    for (int k = 0; k < 2; k++) /* quad j: (0 + 2, 1 + 3) of v[8k + j], then of v[8k + 4 + j] */
        C[k] = _mm512_add_ps(_mm512_shuffle_ps(B[2 * k], B[2 * k + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_ps(B[2 * k], B[2 * k + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    /* quad j, lane m: the sum of v[4m + j] */
    const __m512 D = _mm512_add_ps(_mm512_shuffle_ps(C[0], C[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                   _mm512_shuffle_ps(C[0], C[1], _MM_SHUFFLE(3, 1, 3, 1)));
    return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), D);
}

/* R rows x TT tokens; R and TT are compile-time constants at every call.
 * One accumulator per (row, token): a += w[i..i+16) * x[i..i+16) (FMA) for
 * each full 16-block in order, then the masked tail; result = reduce_add(a). */
static inline __attribute__((always_inline)) void tile(float *y, int32_t ldy, const float *x,
                                                       int32_t ldx, const uint16_t *w, int32_t in,
                                                       int32_t o, const int R, const int TT,
                                                       int32_t add, const int PF) {
    __m512 a[TILE_MAX_R][TILE_MAX_T];
    const uint16_t *wr[TILE_MAX_R];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) {
        wr[r] = w + (size_t)(o + r) * (size_t)in;
#pragma GCC unroll 8
        for (int t = 0; t < TT; t++) a[r][t] = _mm512_setzero_ps();
    }
    int32_t i = 0;
    for (; i + VL <= in; i += VL) tile_step(a, wr, x, ldx, i, PF ? (size_t)R * (size_t)in : 0, R, TT);
    if (i < in) tile_tail(a, wr, x, ldx, i, in - i, R, TT);
    if (R * TT >= 8) { /* sixteen sums at a time (reduce16) */
        float s[TILE_MAX_R * TILE_MAX_T + 15];
#pragma GCC unroll 2
        for (int k0 = 0; k0 < R * TT; k0 += 16) {
            __m512 v[16];
#pragma GCC unroll 16
            for (int k = 0; k < 16; k++) v[k] = k0 + k < R * TT ? a[(k0 + k) % R][(k0 + k) / R] : _mm512_setzero_ps();
            _mm512_storeu_ps(s + k0, reduce16(v));
        }
#pragma GCC unroll 8
        for (int t = 0; t < TT; t++) {
            float *yo = y + (size_t)t * (size_t)ldy + o;
#pragma GCC unroll 8
            for (int r = 0; r < R; r++) yo[r] = add ? yo[r] + s[t * R + r] : s[t * R + r];
        }
        return;
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) {
#pragma GCC unroll 8
        for (int t = 0; t < TT; t++) {
            float s = _mm512_reduce_add_ps(a[r][t]);
            float *yo = y + (size_t)t * (size_t)ldy + o + r;
            *yo = add ? *yo + s : s;
        }
    }
}

#ifndef PRE_R
#define PRE_R 4
#endif
#ifndef PRE_T
#define PRE_T 6
#endif
/* Decode (one token): 8 rows a tile, each prefetching the same offset in
 * the next tile's row: eight weight streams in flight keep more misses
 * outstanding than four (docs/kernels.md#tuning-figures). 8 sums reduce
 * through reduce16. */
#ifndef DEC_R
#define DEC_R 8
#endif

/* Prefill: PRE_R rows x PRE_T tokens, each converted weight vector used for
 * PRE_T tokens, each x vector for PRE_R rows. No software prefetch: the row
 * block is already in L2. */
static void tile_pre(float *y, int32_t ldy, const float *x, int32_t ldx, const uint16_t *w,
                     int32_t in, int32_t o, int32_t add) {
    tile(y, ldy, x, ldx, w, in, o, PRE_R, PRE_T, add, 0);
}
static void tile_r1_pt(float *y, int32_t ldy, const float *x, int32_t ldx, const uint16_t *w,
                       int32_t in, int32_t o, int32_t add) {
    tile(y, ldy, x, ldx, w, in, o, 1, PRE_T, add, 0);
}
typedef void (*tile_fn)(float *, int32_t, const float *, int32_t, const uint16_t *, int32_t, int32_t, int32_t);
_Static_assert(PRE_T == 6, "the remainder tiles below cover 2..5 tokens");

/* A tile function of R rows x TT tokens that prefetches the next rows. */
#define TILE_FN(R, TT)                                                                           \
    static void tile_r##R##_t##TT(float *y, int32_t ldy, const float *x, int32_t ldx,            \
                                  const uint16_t *w, int32_t in, int32_t o, int32_t add) {       \
        tile(y, ldy, x, ldx, w, in, o, R, TT, add, 1);                                           \
    }

/* The last T % PRE_T tokens of a call (2..5) in one pass over the row
 * block: a verify batch of 5 tokens costs one weight pass, not 4 + 1. */
#define TILES_T(TT) TILE_FN(4, TT) TILE_FN(1, TT)
TILES_T(2)
TILES_T(3)
TILES_T(4)
TILES_T(5)

/* A decode batch of 7 or 8 tokens in one pass over the rows: 3 rows x 8
 * tokens is what the registers hold. The output head streams from memory,
 * so a batch of 8 split 6 + 2 read it twice. */
#define TILES_R3(TT) TILE_FN(3, TT) TILE_FN(1, TT)
TILES_R3(7)
TILES_R3(8)
static void tile_dec(float *y, int32_t ldy, const float *x, int32_t ldx, const uint16_t *w,
                     int32_t in, int32_t o, int32_t add) {
    tile(y, ldy, x, ldx, w, in, o, DEC_R, 1, add, 1);
}
static void tile_r1_t1(float *y, int32_t ldy, const float *x, int32_t ldx, const uint16_t *w,
                       int32_t in, int32_t o, int32_t add) {
    tile(y, ldy, x, ldx, w, in, o, 1, 1, add, 0);
}

static void matmul_f16_avx512(float *y, int32_t ldy, const float *x, int32_t ldx,
                              const uint16_t *w, int32_t in, int32_t T, int32_t o0, int32_t o1,
                              int32_t add) {
    /* Rows in blocks small enough to stay in L2 while every group of
     * tokens passes over them (prefill); irrelevant to the result. */
    int32_t rb = LS_L2_BLOCK_BYTES / (in * 2);
    _Static_assert(DEC_R % PRE_R == 0, "row blocks are whole decode and prefill tiles");
    rb = rb < DEC_R ? DEC_R : rb - rb % DEC_R;
    for (int32_t ob = o0; ob < o1; ob += rb) {
        int32_t oe = o1 - ob < rb ? o1 : ob + rb;
        int32_t t = 0;
        /* decode batches: 8 tokens a pass while 7 or more are left */
        for (int32_t n; T <= 16 && T - t >= 7; t += n) {
            n = T - t >= 8 ? 8 : 7;
            const float *xt = x + (size_t)t * (size_t)ldx;
            float *yt = y + (size_t)t * (size_t)ldy;
            int32_t o = ob;
            for (; o + 3 <= oe; o += 3) (n == 8 ? tile_r3_t8 : tile_r3_t7)(yt, ldy, xt, ldx, w, in, o, add);
            for (; o < oe; o++) (n == 8 ? tile_r1_t8 : tile_r1_t7)(yt, ldy, xt, ldx, w, in, o, add);
        }
        for (; t + PRE_T <= T; t += PRE_T) {
            const float *xt = x + (size_t)t * (size_t)ldx;
            float *yt = y + (size_t)t * (size_t)ldy;
            int32_t o = ob;
            for (; o + PRE_R <= oe; o += PRE_R) tile_pre(yt, ldy, xt, ldx, w, in, o, add);
            for (; o < oe; o++) tile_r1_pt(yt, ldy, xt, ldx, w, in, o, add);
        }
        if (T - t >= 2) {
            static const tile_fn r4[PRE_T] = {NULL, NULL, tile_r4_t2, tile_r4_t3, tile_r4_t4, tile_r4_t5};
            static const tile_fn r1[PRE_T] = {NULL, NULL, tile_r1_t2, tile_r1_t3, tile_r1_t4, tile_r1_t5};
            const float *xt = x + (size_t)t * (size_t)ldx;
            float *yt = y + (size_t)t * (size_t)ldy;
            int32_t o = ob, n = T - t;
            for (; o + 4 <= oe; o += 4) r4[n](yt, ldy, xt, ldx, w, in, o, add);
            for (; o < oe; o++) r1[n](yt, ldy, xt, ldx, w, in, o, add);
            t = T;
        }
        for (; t < T; t++) {
            const float *xt = x + (size_t)t * (size_t)ldx;
            float *yt = y + (size_t)t * (size_t)ldy;
            int32_t o = ob;
            for (; o + DEC_R <= oe; o += DEC_R) tile_dec(yt, ldy, xt, ldx, w, in, o, add);
            for (; o < oe; o++) tile_r1_t1(yt, ldy, xt, ldx, w, in, o, add);
        }
    }
}

const ls_ops ls_ops_avx512 = {
    .simd = LS_SIMD_AVX512,
    LS_OPS_ENTRIES(avx512),
    .swiglu = swiglu_avx512,
    .softmax_exp = softmax_exp_avx512,
    .attn_scores_mq = attn_scores_mq_avx512,
    .attn_values_mq = attn_values_mq_avx512,
};
