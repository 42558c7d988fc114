/*
 * quant_avx512.c — quantized matmul with AVX-512 VNNI (vpdpbusd). Built
 * with the AVX-512 flags of build.ts; selected by ls_quant_ops_select only
 * when the CPU has avx512vnni (else the AVX2 kernels run: same results).
 *
 * vpdpbusd multiplies unsigned bytes by signed bytes. The weight codes are
 * stored unsigned (int4: c + 8, int2: c; int8 is flipped to c + 128 with
 * one xor), the activations are the signed operand, and the offset is
 * taken back exactly per group with the activation sums:
 *   sum q * c = sum q * u - 8 * sum q   (int4; 128 for int8)
 *
 * Activation layout (written by quantize): int4 in spans of 128 inputs,
 * even inputs first then odd ones, so a 64-byte load of packed weights
 * split into low and high nibbles lines up with two 64-byte activation
 * loads; int2 in spans of 256 inputs as four planes (input 4j + p in plane
 * p), matching the four 2-bit fields of each byte; int8 in natural order.
 *
 * Integer work per window of 256 inputs (8 blocks of 32) ends in a vector
 * of the 8 exact block sums; everything after that (quant.h's fp32 steps)
 * is the same in every path.
 */
#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "quant.h"

#define TILE_MAX_R 4
#define TILE_MAX_T 4
#define L2_BLOCK_BYTES (64 * 1024)

// ---- activations ----

/* The rule of quant.h (ls_quant_rows is the scalar definition): the same
 * max, the same fp32 multiply, cvtps2dq rounding to nearest even (what the
 * scalar code's rounding does), NaN to 0, so the codes are identical. */
static inline __m512i codes16(const float *p, __m512 id) {
    __m512 v = _mm512_mul_ps(_mm512_loadu_ps(p), id);
    __m512i r = _mm512_maskz_mov_epi32(_mm512_cmp_ps_mask(v, v, _CMP_ORD_Q), _mm512_cvtps_epi32(v));
    return _mm512_min_epi32(_mm512_max_epi32(r, _mm512_set1_epi32(-127)), _mm512_set1_epi32(127));
}

/* Within each 16-byte lane: the even bytes, then the odd ones. */
static inline __m512i split_pairs(__m512i z) {
    const __m512i sh = _mm512_broadcast_i32x4(_mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15));
    return _mm512_shuffle_epi8(z, sh);
}

/* Within each 16-byte lane: bytes 4j + p for p = 0..3, four each. */
static inline __m512i split_quads(__m512i z) {
    const __m512i sh = _mm512_broadcast_i32x4(_mm_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15));
    return _mm512_shuffle_epi8(z, sh);
}

static void quantize_avx512(ls_qact *a, const float *x, int32_t ldx, int32_t T, int32_t in,
                            int32_t group, int32_t bits) {
    const int32_t ng = in / group, padded = (in + LS_QACT_PAD - 1) / LS_QACT_PAD * LS_QACT_PAD;
    for (int32_t t = 0; t < T; t++) {
        const float *xr = x + (size_t)t * (size_t)ldx;
        int8_t *qr = a->q + (size_t)t * (size_t)a->ld;
        int32_t *qs = a->qsum + (size_t)t * (size_t)a->gld;
        __m512 m = _mm512_setzero_ps();
        for (int32_t i = 0; i < in; i += 16) m = _mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(xr + i)), m);
        float amax = _mm512_reduce_max_ps(m);
        float idf = amax > 0.0f ? 127.0f / amax : 0.0f;
        a->d[t] = amax / 127.0f;
        const __m512 id = _mm512_set1_ps(idf);
        // Natural-order codes and group sums (in is a multiple of 32).
        for (int32_t g = 0; g < ng; g++) {
            __m512i sum = _mm512_setzero_si512();
            for (int32_t i = g * group; i < (g + 1) * group; i += 16) {
                __m512i r = codes16(xr + i, id);
                sum = _mm512_add_epi32(sum, r);
                _mm_storeu_si128((__m128i *)(qr + i), _mm512_cvtepi32_epi8(r));
            }
            qs[g] = _mm512_reduce_add_epi32(sum);
        }
        memset(qr + in, 0, (size_t)(padded - in));
        for (int32_t g = ng; g < a->gld; g++) qs[g] = 0;
        if (bits == 4) {
            // Spans of 128: the 64 even inputs, then the 64 odd ones.
            for (int32_t s0 = 0; s0 < in; s0 += 128) {
                const __m512i i64 = _mm512_setr_epi64(0, 2, 4, 6, 1, 3, 5, 7);
                __m512i A = _mm512_permutexvar_epi64(i64, split_pairs(_mm512_load_si512((const void *)(qr + s0))));
                __m512i B = _mm512_permutexvar_epi64(i64, split_pairs(_mm512_load_si512((const void *)(qr + s0 + 64))));
                // A = (the 32 even inputs of 0..63 | the 32 odd ones), B likewise for 64..127
                _mm512_store_si512((void *)(qr + s0), _mm512_shuffle_i64x2(A, B, _MM_SHUFFLE(1, 0, 1, 0)));
                _mm512_store_si512((void *)(qr + s0 + 64), _mm512_shuffle_i64x2(A, B, _MM_SHUFFLE(3, 2, 3, 2)));
            }
        } else if (bits == 2) {
            // Spans of 256: four planes of 64, plane p = inputs 4j + p.
            const __m512i i32 = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
            for (int32_t s0 = 0; s0 < in; s0 += 256) {
                __m512i Z[4];
                for (int k = 0; k < 4; k++)
                    Z[k] = _mm512_permutexvar_epi32(i32, split_quads(_mm512_load_si512((const void *)(qr + s0 + 64 * k))));
                // Z[k] = (plane 0 | plane 1 | plane 2 | plane 3) of inputs 64k..64k+63, 16 bytes each
                __m512i L01 = _mm512_shuffle_i64x2(Z[0], Z[1], _MM_SHUFFLE(1, 0, 1, 0));
                __m512i H01 = _mm512_shuffle_i64x2(Z[0], Z[1], _MM_SHUFFLE(3, 2, 3, 2));
                __m512i L23 = _mm512_shuffle_i64x2(Z[2], Z[3], _MM_SHUFFLE(1, 0, 1, 0));
                __m512i H23 = _mm512_shuffle_i64x2(Z[2], Z[3], _MM_SHUFFLE(3, 2, 3, 2));
                _mm512_store_si512((void *)(qr + s0), _mm512_shuffle_i64x2(L01, L23, _MM_SHUFFLE(2, 0, 2, 0)));
                _mm512_store_si512((void *)(qr + s0 + 64), _mm512_shuffle_i64x2(L01, L23, _MM_SHUFFLE(3, 1, 3, 1)));
                _mm512_store_si512((void *)(qr + s0 + 128), _mm512_shuffle_i64x2(H01, H23, _MM_SHUFFLE(2, 0, 2, 0)));
                _mm512_store_si512((void *)(qr + s0 + 192), _mm512_shuffle_i64x2(H01, H23, _MM_SHUFFLE(3, 1, 3, 1)));
            }
        }
    }
    a->T = T;
    a->in = in;
    a->group = group;
    a->bits = bits;
}

// ---- integer part: 8 block sums per window ----

/* nb valid bytes from p (<= 0: none); the rest zero. Never reads past them. */
static inline __m512i load_bytes(const uint8_t *p, int32_t nb) {
    if (nb >= 64) return _mm512_loadu_si512((const void *)p);
    if (nb <= 0) return _mm512_setzero_si512();
    return _mm512_maskz_loadu_epi8((__mmask64)((1ULL << nb) - 1ULL), p);
}

/* Blocks 0-3 in A's four 128-bit lanes and 4-7 in B's, four partial sums
 * each -> (b0 .. b7). */
static inline __m256i reduce_4x4(__m512i A, __m512i B) {
    __m512i s = _mm512_add_epi32(_mm512_unpacklo_epi32(A, B), _mm512_unpackhi_epi32(A, B));
    s = _mm512_add_epi32(s, _mm512_shuffle_epi32(s, (_MM_PERM_ENUM)0x4E));
    const __m512i idx = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 0, 0, 0, 0, 0, 0, 0, 0);
    return _mm512_castsi512_si256(_mm512_permutexvar_epi32(idx, s));
}

/* Block b in lanes 2b, 2b+1 -> (b0 .. b7). */
static inline __m256i reduce_8x2(__m512i A) {
    __m512i s = _mm512_add_epi32(A, _mm512_srli_epi64(A, 32));
    const __m512i idx = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 0, 0, 0, 0, 0, 0, 0, 0);
    return _mm512_castsi512_si256(_mm512_permutexvar_epi32(idx, s));
}

/* Blocks 2i, 2i+1 in the two 256-bit halves of V_i (8 partial sums each)
 * -> (b0 .. b7). */
static inline __m256i reduce_4x8(__m512i V0, __m512i V1, __m512i V2, __m512i V3) {
    const __m512i lo = _mm512_setr_epi32(0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27);
    const __m512i hi = _mm512_setr_epi32(4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
    __m512i A = _mm512_add_epi32(_mm512_permutex2var_epi32(V0, lo, V1), _mm512_permutex2var_epi32(V0, hi, V1));
    __m512i B = _mm512_add_epi32(_mm512_permutex2var_epi32(V2, lo, V3), _mm512_permutex2var_epi32(V2, hi, V3));
    return reduce_4x4(A, B);
}

/* out[r][t] = the 8 block sums of unsigned codes x activations for the
 * window of 256 inputs at input e, of which nv (a multiple of 32) are real. */
static inline __attribute__((always_inline)) void window_sums(
    __m256i out[TILE_MAX_R][TILE_MAX_T], const uint8_t *const *wr, const int8_t *const *xr, int32_t e,
    int32_t nv, const int R, const int TT, const int BITS) {
    const int32_t nb = nv * BITS / 8;
    const size_t wo = (size_t)e * BITS / 8;
    const __m512i zero = _mm512_setzero_si512();
    if (BITS == 4) {
        const __m512i m = _mm512_set1_epi8(0x0f);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            __m512i W0 = load_bytes(wr[r] + wo, nb), W1 = load_bytes(wr[r] + wo + 64, nb - 64);
            __m512i lo0 = _mm512_and_si512(W0, m), hi0 = _mm512_and_si512(_mm512_srli_epi16(W0, 4), m);
            __m512i lo1 = _mm512_and_si512(W1, m), hi1 = _mm512_and_si512(_mm512_srli_epi16(W1, 4), m);
#pragma GCC unroll 4
            for (int t = 0; t < TT; t++) {
                const int8_t *xp = xr[t] + e;
                __m512i A = _mm512_dpbusd_epi32(zero, lo0, _mm512_load_si512((const void *)xp));
                A = _mm512_dpbusd_epi32(A, hi0, _mm512_load_si512((const void *)(xp + 64)));
                __m512i B = _mm512_dpbusd_epi32(zero, lo1, _mm512_load_si512((const void *)(xp + 128)));
                B = _mm512_dpbusd_epi32(B, hi1, _mm512_load_si512((const void *)(xp + 192)));
                out[r][t] = reduce_4x4(A, B);
            }
        }
    } else if (BITS == 2) {
        const __m512i m = _mm512_set1_epi8(0x03);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            __m512i W = load_bytes(wr[r] + wo, nb);
            __m512i p0 = _mm512_and_si512(W, m), p1 = _mm512_and_si512(_mm512_srli_epi16(W, 2), m);
            __m512i p2 = _mm512_and_si512(_mm512_srli_epi16(W, 4), m), p3 = _mm512_and_si512(_mm512_srli_epi16(W, 6), m);
#pragma GCC unroll 4
            for (int t = 0; t < TT; t++) {
                const int8_t *xp = xr[t] + e;
                __m512i A = _mm512_dpbusd_epi32(zero, p0, _mm512_load_si512((const void *)xp));
                A = _mm512_dpbusd_epi32(A, p1, _mm512_load_si512((const void *)(xp + 64)));
                A = _mm512_dpbusd_epi32(A, p2, _mm512_load_si512((const void *)(xp + 128)));
                A = _mm512_dpbusd_epi32(A, p3, _mm512_load_si512((const void *)(xp + 192)));
                out[r][t] = reduce_8x2(A);
            }
        }
    } else {
        const __m512i flip = _mm512_set1_epi8((char)0x80);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            // Masked-off bytes become 128 after the flip; their activations are zero.
            __m512i U0 = _mm512_xor_si512(load_bytes(wr[r] + wo, nb), flip);
            __m512i U1 = _mm512_xor_si512(load_bytes(wr[r] + wo + 64, nb - 64), flip);
            __m512i U2 = _mm512_xor_si512(load_bytes(wr[r] + wo + 128, nb - 128), flip);
            __m512i U3 = _mm512_xor_si512(load_bytes(wr[r] + wo + 192, nb - 192), flip);
#pragma GCC unroll 4
            for (int t = 0; t < TT; t++) {
                const int8_t *xp = xr[t] + e;
                __m512i V0 = _mm512_dpbusd_epi32(zero, U0, _mm512_load_si512((const void *)xp));
                __m512i V1 = _mm512_dpbusd_epi32(zero, U1, _mm512_load_si512((const void *)(xp + 64)));
                __m512i V2 = _mm512_dpbusd_epi32(zero, U2, _mm512_load_si512((const void *)(xp + 128)));
                __m512i V3 = _mm512_dpbusd_epi32(zero, U3, _mm512_load_si512((const void *)(xp + 192)));
                out[r][t] = reduce_4x8(V0, V1, V2, V3);
            }
        }
    }
}

// ---- fp32 part: quant_tile.h, shared with quant_avx2.c ----

static inline __m256 load_f16x8(const uint16_t *p, int32_t n) {
    if (n >= 8) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
    return _mm256_cvtph_ps(_mm_maskz_loadu_epi16((__mmask8)((1u << n) - 1u), p));
}

#define QUANT_INT8_UNSIGNED 1 /* vpdpbusd takes unsigned x signed: int8 codes enter as c + 128 */
#include "quant_tile.h"

#define TILES(B)                                                                                    \
    static void tile_r2_t4_b##B(float *y, int32_t ldy, const ls_qact *a, const ls_qmat *w,           \
                                int32_t o, int32_t t0, int32_t add) {                               \
        tile(y, ldy, a, w, o, t0, 2, 4, B, add);                                                    \
    }                                                                                               \
    static void tile_r1_t4_b##B(float *y, int32_t ldy, const ls_qact *a, const ls_qmat *w,           \
                                int32_t o, int32_t t0, int32_t add) {                               \
        tile(y, ldy, a, w, o, t0, 1, 4, B, add);                                                    \
    }                                                                                               \
    static void tile_r4_t1_b##B(float *y, int32_t ldy, const ls_qact *a, const ls_qmat *w,           \
                                int32_t o, int32_t t0, int32_t add) {                               \
        tile(y, ldy, a, w, o, t0, 4, 1, B, add);                                                    \
    }                                                                                               \
    static void tile_r1_t1_b##B(float *y, int32_t ldy, const ls_qact *a, const ls_qmat *w,           \
                                int32_t o, int32_t t0, int32_t add) {                               \
        tile(y, ldy, a, w, o, t0, 1, 1, B, add);                                                    \
    }
TILES(2)
TILES(4)
TILES(8)

typedef void (*tile_fn)(float *, int32_t, const ls_qact *, const ls_qmat *, int32_t, int32_t, int32_t);

static void matmul_avx512(float *y, int32_t ldy, const ls_qact *a, const ls_qmat *w, int32_t o0,
                          int32_t o1, int32_t add) {
    tile_fn r2t4, r1t4, r4t1, r1t1;
    if (w->bits == 4) r2t4 = tile_r2_t4_b4, r1t4 = tile_r1_t4_b4, r4t1 = tile_r4_t1_b4, r1t1 = tile_r1_t1_b4;
    else if (w->bits == 2) r2t4 = tile_r2_t4_b2, r1t4 = tile_r1_t4_b2, r4t1 = tile_r4_t1_b2, r1t1 = tile_r1_t1_b2;
    else r2t4 = tile_r2_t4_b8, r1t4 = tile_r1_t4_b8, r4t1 = tile_r4_t1_b8, r1t1 = tile_r1_t1_b8;
    const int32_t T = a->T;
    // Rows in blocks that stay in L2 while every group of 4 tokens passes.
    int32_t rb = (int32_t)(L2_BLOCK_BYTES / ((size_t)w->in * (size_t)w->bits / 8));
    rb = rb < 4 ? 4 : rb & ~3;
    for (int32_t ob = o0; ob < o1; ob += rb) {
        int32_t oe = o1 - ob < rb ? o1 : ob + rb;
        int32_t t = 0;
        for (; t + 4 <= T; t += 4) {
            int32_t o = ob;
            for (; o + 2 <= oe; o += 2) r2t4(y, ldy, a, w, o, t, add);
            for (; o < oe; o++) r1t4(y, ldy, a, w, o, t, add);
        }
        for (; t < T; t++) {
            int32_t o = ob;
            for (; o + 4 <= oe; o += 4) r4t1(y, ldy, a, w, o, t, add);
            for (; o < oe; o++) r1t1(y, ldy, a, w, o, t, add);
        }
    }
}

const ls_qops ls_qops_avx512 = {
    .simd = LS_SIMD_AVX512,
    .quantize = quantize_avx512,
    .matmul = matmul_avx512,
};
