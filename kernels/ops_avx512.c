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

#include "internal.h"
#include "ops.h"

#define VL 16
#define L2_BLOCK_BYTES (64 * 1024) /* weight rows revisited by every token group */

static inline __m512 load_w(const uint16_t *p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
}

static inline __m512 load_w_tail(const uint16_t *p, int32_t n) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16((__mmask16)((1u << n) - 1u), p));
}

static inline __m512 load_x_tail(const float *p, int32_t n) {
    return _mm512_maskz_loadu_ps((__mmask16)((1u << n) - 1u), p);
}

/* Decode streams weight rows from memory once per token; asking for the
 * same columns of the next tile's rows (R rows ahead) while this tile
 * computes keeps more misses in flight than the hardware prefetcher does on
 * 4 parallel row streams (1-thread decode 155 -> 220 tok/s, dim 768). A prefetch
 * never faults, so running past the matrix end is harmless; the address is
 * formed as an integer to keep the pointer arithmetic defined. */
static inline void prefetch_ahead(const uint16_t *p, size_t elems) {
    __builtin_prefetch((const void *)((uintptr_t)p + elems * sizeof *p), 0, 3);
}

#define TILE_MAX_R 8
#define TILE_MAX_T 6 /* R * TT <= 24: R * TT accumulators + R weights + 1 x in 32 registers */

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
#pragma GCC unroll 6
        for (int t = 0; t < TT; t++) a[r][t] = _mm512_setzero_ps();
    }
    int32_t i = 0;
    for (; i + VL <= in; i += VL) {
        __m512 w0[TILE_MAX_R];
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            if (PF) prefetch_ahead(wr[r] + i, (size_t)R * (size_t)in);
            w0[r] = load_w(wr[r] + i);
        }
#pragma GCC unroll 6
        for (int t = 0; t < TT; t++) {
            __m512 x0 = _mm512_loadu_ps(x + (size_t)t * (size_t)ldx + i);
            /* Keep x in a register for all R rows: left to itself GCC folds
             * the load into every FMA, and the load ports, not the FMA
             * units, become the limit. Changes no arithmetic. */
            if (R > 1) __asm__("" : "+v"(x0));
#pragma GCC unroll 8
            for (int r = 0; r < R; r++) a[r][t] = _mm512_fmadd_ps(w0[r], x0, a[r][t]);
        }
    }
    if (i < in) {
        int32_t n = in - i;
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            __m512 w1 = load_w_tail(wr[r] + i, n);
#pragma GCC unroll 6
            for (int t = 0; t < TT; t++)
                a[r][t] = _mm512_fmadd_ps(w1, load_x_tail(x + (size_t)t * (size_t)ldx + i, n), a[r][t]);
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) {
#pragma GCC unroll 6
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
#ifndef DEC_R
#define DEC_R 4
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

/* The last T % PRE_T tokens of a call (2..5) in one pass over the row
 * block: a verify batch of 5 tokens costs one weight pass, not 4 + 1. */
#define TILES_T(TT)                                                                              \
    static void tile_r4_t##TT(float *y, int32_t ldy, const float *x, int32_t ldx,                \
                              const uint16_t *w, int32_t in, int32_t o, int32_t add) {           \
        tile(y, ldy, x, ldx, w, in, o, 4, TT, add, 1);                                           \
    }                                                                                            \
    static void tile_r1_t##TT(float *y, int32_t ldy, const float *x, int32_t ldx,                \
                              const uint16_t *w, int32_t in, int32_t o, int32_t add) {           \
        tile(y, ldy, x, ldx, w, in, o, 1, TT, add, 1);                                           \
    }
TILES_T(2)
TILES_T(3)
TILES_T(4)
TILES_T(5)
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
    int32_t rb = L2_BLOCK_BYTES / (in * 2);
    rb = rb < PRE_R ? PRE_R : rb - rb % PRE_R;
    for (int32_t ob = o0; ob < o1; ob += rb) {
        int32_t oe = o1 - ob < rb ? o1 : ob + rb;
        int32_t t = 0;
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

/* Each lane is one position: its sum runs over d in order, so how
 * positions are grouped into vectors cannot change a score. */
static void attn_scores_avx512(float *scores, const float *q, const uint16_t *kt, int32_t ldk,
                               int32_t hd, int32_t n) {
    int32_t j = 0;
    for (; j + 4 * VL <= n; j += 4 * VL) {
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        const uint16_t *row = kt + j;
        for (int32_t d = 0; d < hd; d++, row += ldk) {
            __m512 qd = _mm512_set1_ps(q[d]);
            a0 = _mm512_fmadd_ps(qd, load_w(row), a0);
            a1 = _mm512_fmadd_ps(qd, load_w(row + VL), a1);
            a2 = _mm512_fmadd_ps(qd, load_w(row + 2 * VL), a2);
            a3 = _mm512_fmadd_ps(qd, load_w(row + 3 * VL), a3);
        }
        _mm512_storeu_ps(scores + j, a0);
        _mm512_storeu_ps(scores + j + VL, a1);
        _mm512_storeu_ps(scores + j + 2 * VL, a2);
        _mm512_storeu_ps(scores + j + 3 * VL, a3);
    }
    for (; j < n; j += VL) {
        int32_t m = n - j < VL ? n - j : VL;
        __m512 a = _mm512_setzero_ps();
        const uint16_t *row = kt + j;
        for (int32_t d = 0; d < hd; d++, row += ldk)
            a = _mm512_fmadd_ps(_mm512_set1_ps(q[d]), load_w_tail(row, m), a);
        _mm512_mask_storeu_ps(scores + j, (__mmask16)((1u << m) - 1u), a);
    }
}

/* Running sums for up to 4 vectors of dims stay in registers across j. */
static void attn_values_avx512(float *out, const float *p, const uint16_t *v, int32_t hd, int32_t n) {
    for (int32_t d0 = 0; d0 < hd; d0 += 4 * VL) {
        int32_t nd = hd - d0 < 4 * VL ? hd - d0 : 4 * VL;
        if (nd == 4 * VL) {
            __m512 a0 = _mm512_loadu_ps(out + d0), a1 = _mm512_loadu_ps(out + d0 + VL);
            __m512 a2 = _mm512_loadu_ps(out + d0 + 2 * VL), a3 = _mm512_loadu_ps(out + d0 + 3 * VL);
            const uint16_t *row = v + d0;
            for (int32_t j = 0; j < n; j++, row += hd) {
                __m512 pj = _mm512_set1_ps(p[j]);
                a0 = _mm512_fmadd_ps(pj, load_w(row), a0);
                a1 = _mm512_fmadd_ps(pj, load_w(row + VL), a1);
                a2 = _mm512_fmadd_ps(pj, load_w(row + 2 * VL), a2);
                a3 = _mm512_fmadd_ps(pj, load_w(row + 3 * VL), a3);
            }
            _mm512_storeu_ps(out + d0, a0);
            _mm512_storeu_ps(out + d0 + VL, a1);
            _mm512_storeu_ps(out + d0 + 2 * VL, a2);
            _mm512_storeu_ps(out + d0 + 3 * VL, a3);
        } else {
            for (int32_t e = 0; e < nd; e += VL) {
                int32_t m = nd - e < VL ? nd - e : VL;
                __mmask16 mk = (__mmask16)((1u << m) - 1u);
                __m512 a = _mm512_maskz_loadu_ps(mk, out + d0 + e);
                const uint16_t *row = v + d0 + e;
                for (int32_t j = 0; j < n; j++, row += hd)
                    a = _mm512_fmadd_ps(_mm512_set1_ps(p[j]), load_w_tail(row, m), a);
                _mm512_mask_storeu_ps(out + d0 + e, mk, a);
            }
        }
    }
}

/* G (<= ATTN_MQ) queries of one head over the same positions: each loaded
 * key vector is converted once and used for every query. Per query and
 * lane the FMA chain is attn_scores_avx512's (d increasing from zero), so
 * each score is bit-identical to a one-query call. */
#define ATTN_MQ 4
static inline __attribute__((always_inline)) void scores_mq(float *const *scores, const float *const *q,
                                                            const uint16_t *kt, int32_t ldk, int32_t hd,
                                                            int32_t n, const int G) {
    int32_t j = 0;
    for (; j + 2 * VL <= n; j += 2 * VL) {
        __m512 a0[ATTN_MQ], a1[ATTN_MQ];
#pragma GCC unroll 4
        for (int g = 0; g < G; g++) a0[g] = a1[g] = _mm512_setzero_ps();
        const uint16_t *row = kt + j;
        for (int32_t d = 0; d < hd; d++, row += ldk) {
            __m512 k0 = load_w(row), k1 = load_w(row + VL);
#pragma GCC unroll 4
            for (int g = 0; g < G; g++) {
                __m512 qd = _mm512_set1_ps(q[g][d]);
                a0[g] = _mm512_fmadd_ps(qd, k0, a0[g]);
                a1[g] = _mm512_fmadd_ps(qd, k1, a1[g]);
            }
        }
#pragma GCC unroll 4
        for (int g = 0; g < G; g++) {
            _mm512_storeu_ps(scores[g] + j, a0[g]);
            _mm512_storeu_ps(scores[g] + j + VL, a1[g]);
        }
    }
    for (; j < n; j += VL) {
        int32_t m = n - j < VL ? n - j : VL;
        __m512 a[ATTN_MQ];
#pragma GCC unroll 4
        for (int g = 0; g < G; g++) a[g] = _mm512_setzero_ps();
        const uint16_t *row = kt + j;
        for (int32_t d = 0; d < hd; d++, row += ldk) {
            __m512 k = load_w_tail(row, m);
#pragma GCC unroll 4
            for (int g = 0; g < G; g++) a[g] = _mm512_fmadd_ps(_mm512_set1_ps(q[g][d]), k, a[g]);
        }
#pragma GCC unroll 4
        for (int g = 0; g < G; g++) _mm512_mask_storeu_ps(scores[g] + j, (__mmask16)((1u << m) - 1u), a[g]);
    }
}

static void attn_scores_mq_avx512(float *const *scores, const float *const *q, const uint16_t *kt, int32_t ldk,
                                  int32_t hd, int32_t n, int32_t G) {
    switch (G) {
    case 4: scores_mq(scores, q, kt, ldk, hd, n, 4); break;
    case 3: scores_mq(scores, q, kt, ldk, hd, n, 3); break;
    case 2: scores_mq(scores, q, kt, ldk, hd, n, 2); break;
    default:
        for (int32_t g = 0; g < G; g++) attn_scores_avx512(scores[g], q[g], kt, ldk, hd, n);
    }
}

/* Values for G queries: each converted value row feeds every query's running
 * sums; per query and dimension the chain is attn_values_avx512's (j
 * increasing, starting from out), for head dims that are a multiple of 64
 * (else one-query calls). */
static inline __attribute__((always_inline)) void values_mq(float *const *out, const float *const *p,
                                                            const uint16_t *v, int32_t hd, int32_t n,
                                                            const int G) {
    for (int32_t d0 = 0; d0 < hd; d0 += 4 * VL) {
        __m512 a[ATTN_MQ][4];
#pragma GCC unroll 4
        for (int g = 0; g < G; g++)
#pragma GCC unroll 4
            for (int e = 0; e < 4; e++) a[g][e] = _mm512_loadu_ps(out[g] + d0 + e * VL);
        const uint16_t *row = v + d0;
        for (int32_t j = 0; j < n; j++, row += hd) {
            __m512 w[4];
#pragma GCC unroll 4
            for (int e = 0; e < 4; e++) w[e] = load_w(row + e * VL);
#pragma GCC unroll 4
            for (int g = 0; g < G; g++) {
                __m512 pj = _mm512_set1_ps(p[g][j]);
#pragma GCC unroll 4
                for (int e = 0; e < 4; e++) a[g][e] = _mm512_fmadd_ps(pj, w[e], a[g][e]);
            }
        }
#pragma GCC unroll 4
        for (int g = 0; g < G; g++)
#pragma GCC unroll 4
            for (int e = 0; e < 4; e++) _mm512_storeu_ps(out[g] + d0 + e * VL, a[g][e]);
    }
}

static void attn_values_mq_avx512(float *const *out, const float *const *p, const uint16_t *v, int32_t hd,
                                  int32_t n, int32_t G) {
    if (hd % (4 * VL) == 0) {
        switch (G) {
        case 4: values_mq(out, p, v, hd, n, 4); return;
        case 3: values_mq(out, p, v, hd, n, 3); return;
        case 2: values_mq(out, p, v, hd, n, 2); return;
        default: break;
        }
    }
    for (int32_t g = 0; g < G; g++) attn_values_avx512(out[g], p[g], v, hd, n);
}

/* exp(x) for x <= 0 (softmax arguments): x = n ln2 + r, |r| <= ln2 / 2,
 * exp(r) by a degree-6 polynomial (Horner, FMA), times 2^n by scalef
 * (underflows to 0 below about -104). Within ~2 ulp of expf. */
static inline __m512 exp_neg_avx512(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-104.0f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.0f / 720.0f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

/* ops.h softmax_exp: lane-wise max and sum over 16-element blocks (the last
 * one masked), then the fixed reduce_add shuffle sequence. */
static float softmax_exp_avx512(float *c, int32_t n, float scale) {
    __m512 sc = _mm512_set1_ps(scale), mx = _mm512_set1_ps(-INFINITY);
    int32_t i = 0;
    for (; i + VL <= n; i += VL) {
        __m512 v = _mm512_mul_ps(_mm512_loadu_ps(c + i), sc);
        _mm512_storeu_ps(c + i, v);
        mx = _mm512_max_ps(mx, v);
    }
    __mmask16 mk = (__mmask16)((1u << (n - i)) - 1u);
    if (i < n) {
        __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(mk, c + i), sc);
        _mm512_mask_storeu_ps(c + i, mk, v);
        mx = _mm512_mask_max_ps(mx, mk, mx, v);
    }
    __m512 m = _mm512_set1_ps(_mm512_reduce_max_ps(mx));
    __m512 sum = _mm512_setzero_ps();
    for (i = 0; i + VL <= n; i += VL) {
        __m512 e = exp_neg_avx512(_mm512_sub_ps(_mm512_loadu_ps(c + i), m));
        _mm512_storeu_ps(c + i, e);
        sum = _mm512_add_ps(sum, e);
    }
    if (i < n) {
        __m512 e = exp_neg_avx512(_mm512_sub_ps(_mm512_maskz_loadu_ps(mk, c + i), m));
        _mm512_mask_storeu_ps(c + i, mk, e);
        sum = _mm512_mask_add_ps(sum, mk, sum, e);
    }
    return _mm512_reduce_add_ps(sum);
}

// ---- quantized cache (ops.h attn_*_i8 / _i4; layouts in kvcache.h) ----
//
// Lane = position for scores, lane = dimension for values, as above; the
// last < 16 positions (dimensions) are masked lanes of the same vectors.

#define KV_GROUP 32 /* LS_KV_GROUP */

static inline __mmask16 lanes(int32_t n) { return (__mmask16)((1u << n) - 1u); }

static inline __m512 load_i8(const int8_t *p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
}

static inline __m512 load_i8_tail(const int8_t *p, int32_t n) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(lanes(n), p)));
}

/* 16 code bytes (n of them) -> low nibbles and high nibbles as floats */
static inline void load_u4(const uint8_t *p, int32_t n, __m512 *lo, __m512 *hi) {
    __m128i raw = n == VL ? _mm_loadu_si128((const __m128i *)p) : _mm_maskz_loadu_epi8(lanes(n), p);
    __m512i b = _mm512_cvtepu8_epi32(raw);
    *lo = _mm512_cvtepi32_ps(_mm512_and_si512(b, _mm512_set1_epi32(15)));
    *hi = _mm512_cvtepi32_ps(_mm512_srli_epi32(b, 4));
}

static inline int32_t group_half(int32_t g0, int32_t hd) {
    return ((g0 + KV_GROUP < hd ? g0 + KV_GROUP : hd) - g0) / 2;
}

static void attn_scores_i8_avx512(float *scores, const float *q, const int8_t *kt, int32_t ldq,
                                  const uint16_t *ks, int32_t hd, int32_t n) {
    int32_t j = 0;
    for (; j + 4 * VL <= n; j += 4 * VL) {
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        const int8_t *row = kt + j;
        for (int32_t d = 0; d < hd; d++, row += ldq) {
            __m512 qd = _mm512_set1_ps(q[d]);
            a0 = _mm512_fmadd_ps(qd, load_i8(row), a0);
            a1 = _mm512_fmadd_ps(qd, load_i8(row + VL), a1);
            a2 = _mm512_fmadd_ps(qd, load_i8(row + 2 * VL), a2);
            a3 = _mm512_fmadd_ps(qd, load_i8(row + 3 * VL), a3);
        }
        _mm512_storeu_ps(scores + j, _mm512_mul_ps(a0, load_w(ks + j)));
        _mm512_storeu_ps(scores + j + VL, _mm512_mul_ps(a1, load_w(ks + j + VL)));
        _mm512_storeu_ps(scores + j + 2 * VL, _mm512_mul_ps(a2, load_w(ks + j + 2 * VL)));
        _mm512_storeu_ps(scores + j + 3 * VL, _mm512_mul_ps(a3, load_w(ks + j + 3 * VL)));
    }
    for (; j < n; j += VL) {
        int32_t m = n - j < VL ? n - j : VL;
        __m512 a = _mm512_setzero_ps();
        const int8_t *row = kt + j;
        for (int32_t d = 0; d < hd; d++, row += ldq)
            a = _mm512_fmadd_ps(_mm512_set1_ps(q[d]), m == VL ? load_i8(row) : load_i8_tail(row, m), a);
        _mm512_mask_storeu_ps(scores + j, lanes(m), _mm512_mul_ps(a, load_w_tail(ks + j, m)));
    }
}

static void attn_values_i8_avx512(float *out, const float *p, const int8_t *v, const uint16_t *vs, int32_t hd,
                                  int32_t n) {
    int32_t d0 = 0;
    for (; d0 + 4 * VL <= hd; d0 += 4 * VL) {
        __m512 a0 = _mm512_loadu_ps(out + d0), a1 = _mm512_loadu_ps(out + d0 + VL);
        __m512 a2 = _mm512_loadu_ps(out + d0 + 2 * VL), a3 = _mm512_loadu_ps(out + d0 + 3 * VL);
        const int8_t *row = v + d0;
        for (int32_t j = 0; j < n; j++, row += hd) {
            __m512 w = _mm512_set1_ps(p[j] * _cvtsh_ss(vs[j]));
            a0 = _mm512_fmadd_ps(w, load_i8(row), a0);
            a1 = _mm512_fmadd_ps(w, load_i8(row + VL), a1);
            a2 = _mm512_fmadd_ps(w, load_i8(row + 2 * VL), a2);
            a3 = _mm512_fmadd_ps(w, load_i8(row + 3 * VL), a3);
        }
        _mm512_storeu_ps(out + d0, a0);
        _mm512_storeu_ps(out + d0 + VL, a1);
        _mm512_storeu_ps(out + d0 + 2 * VL, a2);
        _mm512_storeu_ps(out + d0 + 3 * VL, a3);
    }
    for (; d0 < hd; d0 += VL) {
        int32_t m = hd - d0 < VL ? hd - d0 : VL;
        __m512 a = load_x_tail(out + d0, m);
        const int8_t *row = v + d0;
        for (int32_t j = 0; j < n; j++, row += hd)
            a = _mm512_fmadd_ps(_mm512_set1_ps(p[j] * _cvtsh_ss(vs[j])), m == VL ? load_i8(row) : load_i8_tail(row, m), a);
        _mm512_mask_storeu_ps(out + d0, lanes(m), a);
    }
}

/* NV vectors of positions from j, the last holding m (<= 16) of them; NV is
 * a constant at every call. */
static inline __attribute__((always_inline)) void scores_i4_tile(float *scores, const float *q, const uint8_t *kt,
                                                                 int32_t ldq, const uint16_t *kp, int32_t ldp,
                                                                 int32_t hd, int32_t j, int32_t m, const int NV) {
    __m512 a[4];
    for (int v = 0; v < NV; v++) a[v] = _mm512_setzero_ps();
    for (int32_t g0 = 0, g = 0; g0 < hd; g0 += KV_GROUP, g++) {
        int32_t half = group_half(g0, hd);
        __m512 sg[4], zg[4];
        for (int v = 0; v < NV; v++) {
            int32_t mv = v == NV - 1 ? m : VL;
            sg[v] = load_w_tail(kp + (size_t)(2 * g) * ldp + j + v * VL, mv);
            zg[v] = load_w_tail(kp + (size_t)(2 * g + 1) * ldp + j + v * VL, mv);
        }
        const uint8_t *row = kt + (size_t)(g0 / 2) * ldq + j;
        for (int32_t i = 0; i < half; i++, row += ldq) {
            __m512 qlo = _mm512_set1_ps(q[g0 + i]), qhi = _mm512_set1_ps(q[g0 + half + i]);
            for (int v = 0; v < NV; v++) {
                __m512 lo, hi;
                load_u4(row + v * VL, v == NV - 1 ? m : VL, &lo, &hi);
                a[v] = _mm512_fmadd_ps(qlo, _mm512_fmadd_ps(lo, sg[v], zg[v]), a[v]);
                a[v] = _mm512_fmadd_ps(qhi, _mm512_fmadd_ps(hi, sg[v], zg[v]), a[v]);
            }
        }
    }
    for (int v = 0; v < NV; v++) _mm512_mask_storeu_ps(scores + j + v * VL, lanes(v == NV - 1 ? m : VL), a[v]);
}

static void attn_scores_i4_avx512(float *scores, const float *q, const uint8_t *kt, int32_t ldq,
                                  const uint16_t *kp, int32_t ldp, int32_t hd, int32_t n) {
    int32_t j = 0;
    for (; j + 4 * VL <= n; j += 4 * VL) scores_i4_tile(scores, q, kt, ldq, kp, ldp, hd, j, VL, 4);
    for (; j < n; j += VL) scores_i4_tile(scores, q, kt, ldq, kp, ldp, hd, j, n - j < VL ? n - j : VL, 1);
}

static void attn_values_i4_avx512(float *out, const float *p, const uint8_t *v, const uint16_t *vp, int32_t hd,
                                  int32_t n) {
    int32_t nb = hd / 2, np = 2 * ((hd + KV_GROUP - 1) / KV_GROUP);
    for (int32_t g0 = 0, g = 0; g0 < hd; g0 += KV_GROUP, g++) {
        /* dims g0 .. g0 + half - 1 (low nibbles), g0 + half .. (high): one masked vector each */
        int32_t half = group_half(g0, hd);
        __mmask16 mk = lanes(half);
        __m512 alo = _mm512_maskz_loadu_ps(mk, out + g0), ahi = _mm512_maskz_loadu_ps(mk, out + g0 + half);
        const uint8_t *row = v + g0 / 2;
        const uint16_t *par = vp + 2 * g;
        for (int32_t j = 0; j < n; j++, row += nb, par += np) {
            __m512 w = _mm512_set1_ps(p[j]);
            __m512 sg = _mm512_set1_ps(_cvtsh_ss(par[0])), zg = _mm512_set1_ps(_cvtsh_ss(par[1]));
            __m512 lo, hi;
            load_u4(row, half, &lo, &hi);
            alo = _mm512_fmadd_ps(w, _mm512_fmadd_ps(lo, sg, zg), alo);
            ahi = _mm512_fmadd_ps(w, _mm512_fmadd_ps(hi, sg, zg), ahi);
        }
        _mm512_mask_storeu_ps(out + g0, mk, alo);
        _mm512_mask_storeu_ps(out + g0 + half, mk, ahi);
    }
}

/* silu(g) = g * sigmoid(g), the sigmoid from e = exp(-|g|) <= 1 (no
 * overflow): 1 / (1 + e) for g >= 0, e / (1 + e) below. */
static void swiglu_avx512(float *g, const float *u, int32_t n) {
    const __m512 one = _mm512_set1_ps(1.0f);
    for (int32_t i = 0; i < n; i += VL) {
        __mmask16 m = n - i >= VL ? (__mmask16)0xffff : lanes(n - i);
        __m512 x = _mm512_maskz_loadu_ps(m, g + i);
        __m512 e = exp_neg_avx512(_mm512_sub_ps(_mm512_setzero_ps(), _mm512_abs_ps(x)));
        __m512 num = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_GE_OQ), e, one);
        __m512 sig = _mm512_div_ps(num, _mm512_add_ps(one, e));
        _mm512_mask_storeu_ps(g + i, m, _mm512_mul_ps(_mm512_mul_ps(x, sig), _mm512_maskz_loadu_ps(m, u + i)));
    }
}

static void rmsnorm_avx512(float *out, const float *x, const float *w, int32_t n, float eps) {
    __m512 acc = _mm512_setzero_ps();
    int32_t i = 0;
    for (; i + VL <= n; i += VL) {
        __m512 v = _mm512_loadu_ps(x + i);
        acc = _mm512_fmadd_ps(v, v, acc);
    }
    if (i < n) {
        __m512 v = load_x_tail(x + i, n - i);
        acc = _mm512_fmadd_ps(v, v, acc);
    }
    float scale = 1.0f / sqrtf(_mm512_reduce_add_ps(acc) / (float)n + eps);
    __m512 sv = _mm512_set1_ps(scale);
    for (i = 0; i + VL <= n; i += VL)
        _mm512_storeu_ps(out + i,
                         _mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(x + i), sv), _mm512_loadu_ps(w + i)));
    for (; i < n; i++) out[i] = x[i] * scale * w[i];
}

static void f16_to_f32_avx512(float *dst, const uint16_t *src, int32_t n) {
    int32_t i = 0;
    for (; i + VL <= n; i += VL) _mm512_storeu_ps(dst + i, load_w(src + i));
    if (i < n)
        _mm512_mask_storeu_ps(dst + i, (__mmask16)((1u << (n - i)) - 1u), load_w_tail(src + i, n - i));
}

static void f32_to_f16_avx512(uint16_t *dst, const float *src, int32_t n) {
    int32_t i = 0;
    for (; i + VL <= n; i += VL)
        _mm256_storeu_si256((__m256i *)(dst + i),
                            _mm512_cvtps_ph(_mm512_loadu_ps(src + i),
                                            _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1u);
        __m256i h = _mm512_cvtps_ph(_mm512_maskz_loadu_ps(m, src + i),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        _mm256_mask_storeu_epi16(dst + i, m, h);
    }
}

const ls_ops ls_ops_avx512 = {
    .simd = LS_SIMD_AVX512,
    .matmul_f16 = matmul_f16_avx512,
    .attn_scores = attn_scores_avx512,
    .attn_values = attn_values_avx512,
    .softmax_exp = softmax_exp_avx512,
    .swiglu = swiglu_avx512,
    .attn_scores_mq = attn_scores_mq_avx512,
    .attn_values_mq = attn_values_mq_avx512,
    .attn_scores_i8 = attn_scores_i8_avx512,
    .attn_values_i8 = attn_values_i8_avx512,
    .attn_scores_i4 = attn_scores_i4_avx512,
    .attn_values_i4 = attn_values_i4_avx512,
    .rmsnorm = rmsnorm_avx512,
    .f16_to_f32 = f16_to_f32_avx512,
    .f32_to_f16 = f32_to_f16_avx512,
};
