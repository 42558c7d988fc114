/*
 * ops_avx2.c — AVX2 + FMA + F16C kernels. Built with -mavx2 -mfma -mf16c;
 * called only after ls_runtime_init has checked the CPU.
 *
 * Dot product order (every (token, row) element, whatever T or row range):
 *   two 8-lane accumulators a0, a1; for each full 16-element block,
 *   a0 += w[i..i+8) * x[i..i+8), a1 += w[i+8..i+16) * x[i+8..i+16) (FMA);
 *   then one more full 8-block into a0 if present; then the last < 8
 *   elements, zero-padded, into a1; result = hsum(a0 + a1) with the fixed
 *   shuffle sequence of hsum256 below.
 * Tiles of R rows x TT tokens only reuse loaded registers (see ops_avx512.c).
 */
#include <immintrin.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "internal.h"
#include "ops.h"

#define VL 8
#define L2_BLOCK_BYTES (64 * 1024)

static inline __m256 load_w(const uint16_t *p) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}

/* n in [1, 8): zero-padded copies (there is no 16-bit masked load in AVX2) */
static inline __m256 load_w_tail(const uint16_t *p, int32_t n) {
    uint16_t tmp[VL] = {0};
    memcpy(tmp, p, (size_t)n * sizeof *p);
    return load_w(tmp);
}

static inline __m256 load_x_tail(const float *p, int32_t n) {
    float tmp[VL] = {0};
    memcpy(tmp, p, (size_t)n * sizeof *p);
    return _mm256_loadu_ps(tmp);
}

static inline float hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
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

#define TILE_MAX_R 4
#define TILE_MAX_T 4

static inline __attribute__((always_inline)) void tile(float *y, int32_t ldy, const float *x,
                                                       int32_t ldx, const uint16_t *w, int32_t in,
                                                       int32_t o, const int R, const int TT,
                                                       int32_t add, const int PF) {
    __m256 a0[TILE_MAX_R][TILE_MAX_T], a1[TILE_MAX_R][TILE_MAX_T];
    const uint16_t *wr[TILE_MAX_R];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
        wr[r] = w + (size_t)(o + r) * (size_t)in;
#pragma GCC unroll 4
        for (int t = 0; t < TT; t++) {
            a0[r][t] = _mm256_setzero_ps();
            a1[r][t] = _mm256_setzero_ps();
        }
    }
    int32_t i = 0;
    for (; i + 2 * VL <= in; i += 2 * VL) {
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            if (PF) prefetch_ahead(wr[r] + i, (size_t)R * (size_t)in);
            __m256 w0 = load_w(wr[r] + i);
            __m256 w1 = load_w(wr[r] + i + VL);
#pragma GCC unroll 4
            for (int t = 0; t < TT; t++) {
                const float *xt = x + (size_t)t * (size_t)ldx + i;
                a0[r][t] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(xt), a0[r][t]);
                a1[r][t] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xt + VL), a1[r][t]);
            }
        }
    }
    if (i + VL <= in) {
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            __m256 w0 = load_w(wr[r] + i);
#pragma GCC unroll 4
            for (int t = 0; t < TT; t++)
                a0[r][t] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + (size_t)t * (size_t)ldx + i),
                                           a0[r][t]);
        }
        i += VL;
    }
    if (i < in) {
        int32_t n = in - i;
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            __m256 w1 = load_w_tail(wr[r] + i, n);
#pragma GCC unroll 4
            for (int t = 0; t < TT; t++)
                a1[r][t] = _mm256_fmadd_ps(w1, load_x_tail(x + (size_t)t * (size_t)ldx + i, n),
                                           a1[r][t]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
#pragma GCC unroll 4
        for (int t = 0; t < TT; t++) {
            float s = hsum256(_mm256_add_ps(a0[r][t], a1[r][t]));
            float *yo = y + (size_t)t * (size_t)ldy + o + r;
            *yo = add ? *yo + s : s;
        }
    }
}

static void tile_r1_t4(float *y, int32_t ldy, const float *x, int32_t ldx, const uint16_t *w,
                       int32_t in, int32_t o, int32_t add) {
    tile(y, ldy, x, ldx, w, in, o, 1, 4, add, 1);
}
static void tile_r4_t1(float *y, int32_t ldy, const float *x, int32_t ldx, const uint16_t *w,
                       int32_t in, int32_t o, int32_t add) {
    tile(y, ldy, x, ldx, w, in, o, 4, 1, add, 1);
}
static void tile_r1_t1(float *y, int32_t ldy, const float *x, int32_t ldx, const uint16_t *w,
                       int32_t in, int32_t o, int32_t add) {
    tile(y, ldy, x, ldx, w, in, o, 1, 1, add, 0);
}

static void matmul_f16_avx2(float *y, int32_t ldy, const float *x, int32_t ldx, const uint16_t *w,
                            int32_t in, int32_t T, int32_t o0, int32_t o1, int32_t add) {
    int32_t rb = L2_BLOCK_BYTES / (in * 2);
    rb = rb < 4 ? 4 : rb & ~3;
    for (int32_t ob = o0; ob < o1; ob += rb) {
        int32_t oe = o1 - ob < rb ? o1 : ob + rb;
        int32_t t = 0;
        for (; t + 4 <= T; t += 4) {
            const float *xt = x + (size_t)t * (size_t)ldx;
            float *yt = y + (size_t)t * (size_t)ldy;
            for (int32_t o = ob; o < oe; o++) tile_r1_t4(yt, ldy, xt, ldx, w, in, o, add);
        }
        for (; t < T; t++) {
            const float *xt = x + (size_t)t * (size_t)ldx;
            float *yt = y + (size_t)t * (size_t)ldy;
            int32_t o = ob;
            for (; o + 4 <= oe; o += 4) tile_r4_t1(yt, ldy, xt, ldx, w, in, o, add);
            for (; o < oe; o++) tile_r1_t1(yt, ldy, xt, ldx, w, in, o, add);
        }
    }
}

/* Each lane is one position: its sum runs over d in order, so how
 * positions are grouped into vectors cannot change a score. */
static void attn_scores_avx2(float *scores, const float *q, const uint16_t *kt, int32_t ldk,
                             int32_t hd, int32_t n) {
    int32_t j = 0;
    for (; j + 4 * VL <= n; j += 4 * VL) {
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        const uint16_t *row = kt + j;
        for (int32_t d = 0; d < hd; d++, row += ldk) {
            __m256 qd = _mm256_set1_ps(q[d]);
            a0 = _mm256_fmadd_ps(qd, load_w(row), a0);
            a1 = _mm256_fmadd_ps(qd, load_w(row + VL), a1);
            a2 = _mm256_fmadd_ps(qd, load_w(row + 2 * VL), a2);
            a3 = _mm256_fmadd_ps(qd, load_w(row + 3 * VL), a3);
        }
        _mm256_storeu_ps(scores + j, a0);
        _mm256_storeu_ps(scores + j + VL, a1);
        _mm256_storeu_ps(scores + j + 2 * VL, a2);
        _mm256_storeu_ps(scores + j + 3 * VL, a3);
    }
    for (; j + VL <= n; j += VL) {
        __m256 a = _mm256_setzero_ps();
        const uint16_t *row = kt + j;
        for (int32_t d = 0; d < hd; d++, row += ldk) a = _mm256_fmadd_ps(_mm256_set1_ps(q[d]), load_w(row), a);
        _mm256_storeu_ps(scores + j, a);
    }
    if (j < n) {
        int32_t m = n - j;
        __m256 a = _mm256_setzero_ps();
        const uint16_t *row = kt + j;
        for (int32_t d = 0; d < hd; d++, row += ldk)
            a = _mm256_fmadd_ps(_mm256_set1_ps(q[d]), load_w_tail(row, m), a);
        float tmp[VL];
        _mm256_storeu_ps(tmp, a);
        memcpy(scores + j, tmp, (size_t)m * sizeof *scores);
    }
}

/* Running sums for up to 4 vectors of dims stay in registers across j. */
static void attn_values_avx2(float *out, const float *p, const uint16_t *v, int32_t hd, int32_t n) {
    for (int32_t d0 = 0; d0 < hd; d0 += 4 * VL) {
        int32_t nd = hd - d0 < 4 * VL ? hd - d0 : 4 * VL;
        if (nd == 4 * VL) {
            __m256 a0 = _mm256_loadu_ps(out + d0), a1 = _mm256_loadu_ps(out + d0 + VL);
            __m256 a2 = _mm256_loadu_ps(out + d0 + 2 * VL), a3 = _mm256_loadu_ps(out + d0 + 3 * VL);
            const uint16_t *row = v + d0;
            for (int32_t j = 0; j < n; j++, row += hd) {
                __m256 pj = _mm256_set1_ps(p[j]);
                a0 = _mm256_fmadd_ps(pj, load_w(row), a0);
                a1 = _mm256_fmadd_ps(pj, load_w(row + VL), a1);
                a2 = _mm256_fmadd_ps(pj, load_w(row + 2 * VL), a2);
                a3 = _mm256_fmadd_ps(pj, load_w(row + 3 * VL), a3);
            }
            _mm256_storeu_ps(out + d0, a0);
            _mm256_storeu_ps(out + d0 + VL, a1);
            _mm256_storeu_ps(out + d0 + 2 * VL, a2);
            _mm256_storeu_ps(out + d0 + 3 * VL, a3);
        } else {
            for (int32_t e = 0; e < nd; e += VL) {
                int32_t m = nd - e < VL ? nd - e : VL;
                __m256 a = load_x_tail(out + d0 + e, m);
                const uint16_t *row = v + d0 + e;
                for (int32_t j = 0; j < n; j++, row += hd)
                    a = _mm256_fmadd_ps(_mm256_set1_ps(p[j]), m == VL ? load_w(row) : load_w_tail(row, m), a);
                float tmp[VL];
                _mm256_storeu_ps(tmp, a);
                memcpy(out + d0 + e, tmp, (size_t)m * sizeof *out);
            }
        }
    }
}

// ---- quantized cache (ops.h attn_*_i8 / _i4; layouts in kvcache.h) ----
//
// Lane = position for scores, lane = dimension for values, as above. The
// last < 8 positions (or dimensions) run the same per-lane arithmetic in
// scalar code: fmaf with -mfma is the vector FMA's single rounding, and
// _cvtsh_ss the vector conversion, so a value does not depend on whether
// it fell in a vector or in the tail.

#define KV_GROUP 32 /* LS_KV_GROUP */

static inline __m256 load_i8(const int8_t *p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}

/* 8 code bytes -> low nibbles and high nibbles as floats */
static inline void load_u4(const uint8_t *p, __m256 *lo, __m256 *hi) {
    __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
    *lo = _mm256_cvtepi32_ps(_mm256_and_si256(b, _mm256_set1_epi32(15)));
    *hi = _mm256_cvtepi32_ps(_mm256_srli_epi32(b, 4));
}

static inline int32_t group_half(int32_t g0, int32_t hd) {
    return ((g0 + KV_GROUP < hd ? g0 + KV_GROUP : hd) - g0) / 2;
}

static void attn_scores_i8_avx2(float *scores, const float *q, const int8_t *kt, int32_t ldq, const uint16_t *ks,
                                int32_t hd, int32_t n) {
    int32_t j = 0;
    for (; j + 4 * VL <= n; j += 4 * VL) {
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        const int8_t *row = kt + j;
        for (int32_t d = 0; d < hd; d++, row += ldq) {
            __m256 qd = _mm256_set1_ps(q[d]);
            a0 = _mm256_fmadd_ps(qd, load_i8(row), a0);
            a1 = _mm256_fmadd_ps(qd, load_i8(row + VL), a1);
            a2 = _mm256_fmadd_ps(qd, load_i8(row + 2 * VL), a2);
            a3 = _mm256_fmadd_ps(qd, load_i8(row + 3 * VL), a3);
        }
        _mm256_storeu_ps(scores + j, _mm256_mul_ps(a0, load_w(ks + j)));
        _mm256_storeu_ps(scores + j + VL, _mm256_mul_ps(a1, load_w(ks + j + VL)));
        _mm256_storeu_ps(scores + j + 2 * VL, _mm256_mul_ps(a2, load_w(ks + j + 2 * VL)));
        _mm256_storeu_ps(scores + j + 3 * VL, _mm256_mul_ps(a3, load_w(ks + j + 3 * VL)));
    }
    for (; j + VL <= n; j += VL) {
        __m256 a = _mm256_setzero_ps();
        const int8_t *row = kt + j;
        for (int32_t d = 0; d < hd; d++, row += ldq) a = _mm256_fmadd_ps(_mm256_set1_ps(q[d]), load_i8(row), a);
        _mm256_storeu_ps(scores + j, _mm256_mul_ps(a, load_w(ks + j)));
    }
    for (; j < n; j++) {
        float a = 0.0f;
        for (int32_t d = 0; d < hd; d++) a = fmaf(q[d], (float)kt[(size_t)d * ldq + j], a);
        scores[j] = a * _cvtsh_ss(ks[j]);
    }
}

static void attn_values_i8_avx2(float *out, const float *p, const int8_t *v, const uint16_t *vs, int32_t hd,
                                int32_t n) {
    int32_t d0 = 0;
    for (; d0 + 4 * VL <= hd; d0 += 4 * VL) {
        __m256 a0 = _mm256_loadu_ps(out + d0), a1 = _mm256_loadu_ps(out + d0 + VL);
        __m256 a2 = _mm256_loadu_ps(out + d0 + 2 * VL), a3 = _mm256_loadu_ps(out + d0 + 3 * VL);
        const int8_t *row = v + d0;
        for (int32_t j = 0; j < n; j++, row += hd) {
            __m256 w = _mm256_set1_ps(p[j] * _cvtsh_ss(vs[j]));
            a0 = _mm256_fmadd_ps(w, load_i8(row), a0);
            a1 = _mm256_fmadd_ps(w, load_i8(row + VL), a1);
            a2 = _mm256_fmadd_ps(w, load_i8(row + 2 * VL), a2);
            a3 = _mm256_fmadd_ps(w, load_i8(row + 3 * VL), a3);
        }
        _mm256_storeu_ps(out + d0, a0);
        _mm256_storeu_ps(out + d0 + VL, a1);
        _mm256_storeu_ps(out + d0 + 2 * VL, a2);
        _mm256_storeu_ps(out + d0 + 3 * VL, a3);
    }
    for (; d0 + VL <= hd; d0 += VL) {
        __m256 a = _mm256_loadu_ps(out + d0);
        const int8_t *row = v + d0;
        for (int32_t j = 0; j < n; j++, row += hd) a = _mm256_fmadd_ps(_mm256_set1_ps(p[j] * _cvtsh_ss(vs[j])), load_i8(row), a);
        _mm256_storeu_ps(out + d0, a);
    }
    for (; d0 < hd; d0++) {
        float a = out[d0];
        for (int32_t j = 0; j < n; j++) a = fmaf(p[j] * _cvtsh_ss(vs[j]), (float)v[(size_t)j * hd + d0], a);
        out[d0] = a;
    }
}

/* NV vectors of positions (NV * 8 from j); NV is a constant at every call. */
static inline __attribute__((always_inline)) void scores_i4_tile(float *scores, const float *q, const uint8_t *kt,
                                                                 int32_t ldq, const uint16_t *kp, int32_t ldp,
                                                                 int32_t hd, int32_t j, const int NV) {
    __m256 a[4];
    for (int v = 0; v < NV; v++) a[v] = _mm256_setzero_ps();
    for (int32_t g0 = 0, g = 0; g0 < hd; g0 += KV_GROUP, g++) {
        int32_t half = group_half(g0, hd);
        __m256 sg[4], zg[4];
        for (int v = 0; v < NV; v++) {
            sg[v] = load_w(kp + (size_t)(2 * g) * ldp + j + v * VL);
            zg[v] = load_w(kp + (size_t)(2 * g + 1) * ldp + j + v * VL);
        }
        const uint8_t *row = kt + (size_t)(g0 / 2) * ldq + j;
        for (int32_t i = 0; i < half; i++, row += ldq) {
            __m256 qlo = _mm256_set1_ps(q[g0 + i]), qhi = _mm256_set1_ps(q[g0 + half + i]);
            for (int v = 0; v < NV; v++) {
                __m256 lo, hi;
                load_u4(row + v * VL, &lo, &hi);
                a[v] = _mm256_fmadd_ps(qlo, _mm256_fmadd_ps(lo, sg[v], zg[v]), a[v]);
                a[v] = _mm256_fmadd_ps(qhi, _mm256_fmadd_ps(hi, sg[v], zg[v]), a[v]);
            }
        }
    }
    for (int v = 0; v < NV; v++) _mm256_storeu_ps(scores + j + v * VL, a[v]);
}

static void attn_scores_i4_avx2(float *scores, const float *q, const uint8_t *kt, int32_t ldq, const uint16_t *kp,
                                int32_t ldp, int32_t hd, int32_t n) {
    int32_t j = 0;
    for (; j + 4 * VL <= n; j += 4 * VL) scores_i4_tile(scores, q, kt, ldq, kp, ldp, hd, j, 4);
    for (; j + VL <= n; j += VL) scores_i4_tile(scores, q, kt, ldq, kp, ldp, hd, j, 1);
    for (; j < n; j++) {
        float a = 0.0f;
        for (int32_t g0 = 0, g = 0; g0 < hd; g0 += KV_GROUP, g++) {
            int32_t half = group_half(g0, hd);
            float sg = _cvtsh_ss(kp[(size_t)(2 * g) * ldp + j]), zg = _cvtsh_ss(kp[(size_t)(2 * g + 1) * ldp + j]);
            const uint8_t *col = kt + (size_t)(g0 / 2) * ldq + j;
            for (int32_t i = 0; i < half; i++, col += ldq) {
                a = fmaf(q[g0 + i], fmaf((float)(*col & 15), sg, zg), a);
                a = fmaf(q[g0 + half + i], fmaf((float)(*col >> 4), sg, zg), a);
            }
        }
        scores[j] = a;
    }
}

static void attn_values_i4_avx2(float *out, const float *p, const uint8_t *v, const uint16_t *vp, int32_t hd,
                                int32_t n) {
    int32_t nb = hd / 2, np = 2 * ((hd + KV_GROUP - 1) / KV_GROUP);
    for (int32_t g0 = 0, g = 0; g0 < hd; g0 += KV_GROUP, g++) {
        int32_t half = group_half(g0, hd);
        const uint8_t *row = v + g0 / 2;
        const uint16_t *par = vp + 2 * g;
        if (half == KV_GROUP / 2) {
            /* a whole group: dims g0.. g0+7, +8..15 (low nibbles), +16..23, +24..31 (high) */
            __m256 a0 = _mm256_loadu_ps(out + g0), a1 = _mm256_loadu_ps(out + g0 + VL);
            __m256 a2 = _mm256_loadu_ps(out + g0 + 2 * VL), a3 = _mm256_loadu_ps(out + g0 + 3 * VL);
            for (int32_t j = 0; j < n; j++, row += nb, par += np) {
                __m256 w = _mm256_set1_ps(p[j]);
                __m256 sg = _mm256_set1_ps(_cvtsh_ss(par[0])), zg = _mm256_set1_ps(_cvtsh_ss(par[1]));
                __m256 lo0, hi0, lo1, hi1;
                load_u4(row, &lo0, &hi0);
                load_u4(row + VL, &lo1, &hi1);
                a0 = _mm256_fmadd_ps(w, _mm256_fmadd_ps(lo0, sg, zg), a0);
                a1 = _mm256_fmadd_ps(w, _mm256_fmadd_ps(lo1, sg, zg), a1);
                a2 = _mm256_fmadd_ps(w, _mm256_fmadd_ps(hi0, sg, zg), a2);
                a3 = _mm256_fmadd_ps(w, _mm256_fmadd_ps(hi1, sg, zg), a3);
            }
            _mm256_storeu_ps(out + g0, a0);
            _mm256_storeu_ps(out + g0 + VL, a1);
            _mm256_storeu_ps(out + g0 + 2 * VL, a2);
            _mm256_storeu_ps(out + g0 + 3 * VL, a3);
            continue;
        }
        for (int32_t j = 0; j < n; j++, row += nb, par += np) { /* a short last group */
            float sg = _cvtsh_ss(par[0]), zg = _cvtsh_ss(par[1]);
            for (int32_t i = 0; i < half; i++) {
                out[g0 + i] = fmaf(p[j], fmaf((float)(row[i] & 15), sg, zg), out[g0 + i]);
                out[g0 + half + i] = fmaf(p[j], fmaf((float)(row[i] >> 4), sg, zg), out[g0 + half + i]);
            }
        }
    }
}

/* exp(x) for x <= 0 (clamped at -87: below that the result is 0 to fp32
 * precision that matters here): Cody-Waite range reduction and a degree-6
 * polynomial, 2^n built in the exponent bits. */
static inline __m256 exp_neg_avx2(__m256 x) {
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.0f / 720.0f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

/* As swiglu_avx512: the sigmoid from e = exp(-|g|). The tail goes through
 * the same vector arithmetic (masked), so a row's value does not depend on
 * where a row range ends. */
static void swiglu_avx2(float *g, const float *u, int32_t n) {
    const __m256 one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f);
    for (int32_t i = 0; i < n; i += VL) {
        __m256i m = _mm256_cmpgt_epi32(_mm256_set1_epi32(n - i), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        __m256 x = _mm256_maskload_ps(g + i, m);
        __m256 e = exp_neg_avx2(_mm256_or_ps(x, sign)); /* -|x| */
        __m256 num = _mm256_blendv_ps(e, one, _mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_GE_OQ));
        __m256 sig = _mm256_div_ps(num, _mm256_add_ps(one, e));
        _mm256_maskstore_ps(g + i, m, _mm256_mul_ps(_mm256_mul_ps(x, sig), _mm256_maskload_ps(u + i, m)));
    }
}

static void rmsnorm_avx2(float *out, const float *x, const float *w, int32_t n, float eps) {
    __m256 acc = _mm256_setzero_ps();
    int32_t i = 0;
    for (; i + VL <= n; i += VL) {
        __m256 v = _mm256_loadu_ps(x + i);
        acc = _mm256_fmadd_ps(v, v, acc);
    }
    if (i < n) {
        __m256 v = load_x_tail(x + i, n - i);
        acc = _mm256_fmadd_ps(v, v, acc);
    }
    float scale = 1.0f / sqrtf(hsum256(acc) / (float)n + eps);
    __m256 sv = _mm256_set1_ps(scale);
    for (i = 0; i + VL <= n; i += VL)
        _mm256_storeu_ps(out + i,
                         _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), sv), _mm256_loadu_ps(w + i)));
    for (; i < n; i++) out[i] = x[i] * scale * w[i];
}

static void f16_to_f32_avx2(float *dst, const uint16_t *src, int32_t n) {
    int32_t i = 0;
    for (; i + VL <= n; i += VL) _mm256_storeu_ps(dst + i, load_w(src + i));
    if (i < n) {
        float tmp[VL];
        _mm256_storeu_ps(tmp, load_w_tail(src + i, n - i));
        memcpy(dst + i, tmp, (size_t)(n - i) * sizeof *dst);
    }
}

static void f32_to_f16_avx2(uint16_t *dst, const float *src, int32_t n) {
    int32_t i = 0;
    for (; i + VL <= n; i += VL)
        _mm_storeu_si128((__m128i *)(dst + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + i),
                                         _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    if (i < n) {
        uint16_t tmp[VL];
        _mm_storeu_si128((__m128i *)tmp,
                         _mm256_cvtps_ph(load_x_tail(src + i, n - i),
                                         _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        memcpy(dst + i, tmp, (size_t)(n - i) * sizeof *dst);
    }
}

const ls_ops ls_ops_avx2 = {
    .simd = LS_SIMD_AVX2,
    .matmul_f16 = matmul_f16_avx2,
    .attn_scores = attn_scores_avx2,
    .attn_values = attn_values_avx2,
    .attn_scores_i8 = attn_scores_i8_avx2,
    .attn_values_i8 = attn_values_i8_avx2,
    .attn_scores_i4 = attn_scores_i4_avx2,
    .attn_values_i4 = attn_values_i4_avx2,
    .swiglu = swiglu_avx2,
    .rmsnorm = rmsnorm_avx2,
    .f16_to_f32 = f16_to_f32_avx2,
    .f32_to_f16 = f32_to_f16_avx2,
};
