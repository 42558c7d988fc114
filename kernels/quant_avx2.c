/*
 * quant_avx2.c — quantized matmul with AVX2 (vpmaddubsw + vpmaddwd). Built
 * with -mavx2 -mfma -mf16c; also the kernels of AVX-512 CPUs without VNNI.
 *
 * vpmaddubsw multiplies unsigned bytes by signed bytes and adds pairs into
 * saturating int16: int6 (u <= 63), int4 (u <= 15) and int2 (u <= 3) times
 * |q| <= 127 stay below 32767. int8 codes are signed, so the sign moves onto
 * the activation instead (|c| * sign(q, c), at most 2 * 128 * 127 per pair).
 * The offset of the unsigned int4 / int6 codes is taken back exactly per
 * group: sum q * c = sum q * u - 8 (32) * sum q.
 *
 * Activation layout (written by quantize): int4 and int6 in spans of 64
 * inputs, even inputs first then odd ones (one 32-byte load of packed
 * weights = 64 inputs, split into low and high nibbles; int6's 16 bytes of
 * high bits for them line up with the nibbles); int2 in spans of 128 inputs
 * as four planes (input 4j + p in plane p); int8 in natural order.
 *
 * Every fixed-count loop of the tiles is unrolled by pragma: left to GCC at
 * -O2 their codes, sums and accumulators lived in stack arrays, stored and
 * reloaded around every vpmaddubsw (the tiles ran 1.4-1.8x slower).
 *
 * After the 8 exact block sums of a window of 256 inputs, the fp32 steps
 * are those of quant.h, the same operations in the same order as quant_avx512.c
 * (below: ls_hsum256, simd_vec.h, and tile).
 */
#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "quant.h"
#include "simd_vec.h"

#define TILE_MAX_R 4
#define TILE_MAX_T 4
#define L2_BLOCK_BYTES (64 * 1024)

// ---- activations ----

/* The rule of quant.h (ls_quant_rows is the scalar definition): the same
 * max, the same fp32 multiply, cvtps2dq rounding to nearest even, NaN to 0,
 * so the codes are identical; the span layout is then made by
 * ls_quant_permute. */
static void quantize_avx2(ls_qact *a, const float *x, int32_t ldx, int32_t T, int32_t t0, int32_t t1,
                          const ls_qmat *w) {
    (void)T; /* the layout follows the code width, whatever the call's size */
    const int32_t in = w->in, group = w->group, bits = w->bits;
    const int32_t ng = in / group, padded = (in + LS_QACT_PAD - 1) / LS_QACT_PAD * LS_QACT_PAD;
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int32_t t = t0; t < t1; t++) {
        const float *xr = x + (size_t)t * (size_t)ldx;
        int8_t *qr = a->q + (size_t)t * (size_t)a->ld;
        int32_t *qs = a->qsum + (size_t)t * (size_t)a->gld;
        __m256 m = _mm256_setzero_ps();
        for (int32_t i = 0; i < in; i += 8) m = _mm256_max_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(xr + i)), m);
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        float amax = _mm_cvtss_f32(m4);
        float idf = amax > 0.0f ? 127.0f / amax : 0.0f;
        a->d[t] = amax / 127.0f;
        const __m256 id = _mm256_set1_ps(idf);
        const __m256i lo = _mm256_set1_epi32(-127), hi = _mm256_set1_epi32(127);
        for (int32_t g = 0; g < ng; g++) {
            __m256i sum = _mm256_setzero_si256();
            for (int32_t i = g * group; i < (g + 1) * group; i += 16) {
                __m256 v0 = _mm256_mul_ps(_mm256_loadu_ps(xr + i), id);
                __m256 v1 = _mm256_mul_ps(_mm256_loadu_ps(xr + i + 8), id);
                __m256i r0 = _mm256_and_si256(_mm256_cvtps_epi32(v0), _mm256_castps_si256(_mm256_cmp_ps(v0, v0, _CMP_ORD_Q)));
                __m256i r1 = _mm256_and_si256(_mm256_cvtps_epi32(v1), _mm256_castps_si256(_mm256_cmp_ps(v1, v1, _CMP_ORD_Q)));
                r0 = _mm256_min_epi32(_mm256_max_epi32(r0, lo), hi);
                r1 = _mm256_min_epi32(_mm256_max_epi32(r1, lo), hi);
                sum = _mm256_add_epi32(sum, _mm256_add_epi32(r0, r1));
                // 16 int32 -> 16 int8 in order (the packs work per 128-bit lane).
                __m256i p16 = _mm256_permute4x64_epi64(_mm256_packs_epi32(r0, r1), 0xD8);
                __m128i p8 = _mm_packs_epi16(_mm256_castsi256_si128(p16), _mm256_extracti128_si256(p16, 1));
                _mm_storeu_si128((__m128i *)(qr + i), p8);
            }
            __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
            s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
            s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xB1));
            qs[g] = _mm_cvtsi128_si32(s4);
        }
        memset(qr + in, 0, (size_t)(padded - in));
        for (int32_t g = ng; g < a->gld; g++) qs[g] = 0;
        if (bits == 4 || bits == 6) ls_quant_permute(qr, in, 64, 2);
        else if (bits == 2) ls_quant_permute(qr, in, 128, 4);
    }
}

// ---- integer part: 8 block sums per window ----

/* Per 128-bit half, (A0 + A2, B0 + B2, A1 + A3, B1 + B3): unpacks and
 * adds, not vphaddd, which issues once per 1.8 cycles on Zen 3 (an unpack
 * twice a cycle). */
static inline __m256i pair_sums(__m256i A, __m256i B) {
    return _mm256_add_epi32(_mm256_unpacklo_epi32(A, B), _mm256_unpackhi_epi32(A, B));
}
/* Per 128-bit half, the sums of V0 .. V3's four lanes in that half. */
static inline __m256i half_sums(__m256i V0, __m256i V1, __m256i V2, __m256i V3) {
    __m256i a = pair_sums(V0, V1), b = pair_sums(V2, V3);
    return _mm256_add_epi32(_mm256_unpacklo_epi64(a, b), _mm256_unpackhi_epi64(a, b));
}

/* Two blocks in V's 128-bit halves ... : V0 = (b0 x4 | b1 x4), V1 = (b2 | b3), ... -> (b0 .. b7) */
static inline __m256i reduce_4x2x4(__m256i V0, __m256i V1, __m256i V2, __m256i V3) {
    return _mm256_permutevar8x32_epi32(half_sums(V0, V1, V2, V3), _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

/* Block b of V_i = 4i + b/2 in lanes ... : V0 = (b0 b0 b1 b1 b2 b2 b3 b3), V1 likewise b4..b7 */
static inline __m256i reduce_2x4x2(__m256i V0, __m256i V1) {
    return _mm256_permute4x64_epi64(_mm256_hadd_epi32(V0, V1), 0xD8);
}

/* Eight vectors of one block each -> (b0 .. b7). */
static inline __m256i reduce_8x8(const __m256i V[8]) {
    __m256i h0 = half_sums(V[0], V[1], V[2], V[3]), h1 = half_sums(V[4], V[5], V[6], V[7]);
    return _mm256_add_epi32(_mm256_permute2x128_si256(h0, h1, 0x20), _mm256_permute2x128_si256(h0, h1, 0x31));
}

/* Where the bytes of inputs [e, e + n) of a row of `in` inputs start: the
 * codes (int6: the nibbles), and int6's high bits (loopserve.h). */
static inline size_t code_offset(int32_t e, const int BITS) { return (size_t)e * (BITS == 6 ? 4 : BITS) / 8; }
static inline size_t high_offset(int32_t in, int32_t e) { return (size_t)in / 2 + (size_t)e / 4; }

/* Bytes [at, at + n) of a row, or of a zero-padded copy in pad when n <
 * full: AVX2 has no byte-masked load, and the last row must not be read
 * past. */
static inline const uint8_t *window_bytes(const uint8_t *at, int32_t n, int32_t full, uint8_t *pad) {
    if (n >= full) return at;
    memset(pad, 0, (size_t)full);
    memcpy(pad, at, (size_t)n);
    return pad;
}

/* out[r][t] = the 8 block sums of codes x activations for the window of
 * 256 inputs at input e of rows of `in` inputs, of which nv (a multiple of
 * 32; int6: of 64) are real. */
static inline __attribute__((always_inline)) void window_sums(
    __m256i out[TILE_MAX_R][TILE_MAX_T], const uint8_t *const *wr, const int8_t *const *xr, int32_t in,
    int32_t e, int32_t nv, const int R, const int TT, const int BITS) {
    const int CB = BITS == 6 ? 4 : BITS; /* bits per input in the code bytes */
    const __m256i ones = _mm256_set1_epi16(1);
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
        uint8_t pad[256] __attribute__((aligned(32))), hpad[64] __attribute__((aligned(32)));
        const uint8_t *wp = window_bytes(wr[r] + code_offset(e, BITS), nv * CB / 8, 32 * CB, pad);
        if (BITS == 4 || BITS == 6) {
            const __m256i m = _mm256_set1_epi8(0x0f);
            __m256i lo[4], hi[4];
#pragma GCC unroll 8
            for (int i = 0; i < 4; i++) {
                __m256i W = _mm256_loadu_si256((const __m256i *)(wp + 32 * i));
                lo[i] = _mm256_and_si256(W, m);
                hi[i] = _mm256_and_si256(_mm256_srli_epi16(W, 4), m);
            }
            if (BITS == 6) {
                // Byte j of a span's 16 high-bit bytes: bits 0-3 for nibble
                // lane j, bits 4-7 for lane j + 16; each lane's even input in
                // its low two bits, the odd one above.
                // The low half shifted left by 4 puts, in both halves, a
                // lane's even input's bits at 4-5 and its odd one's at 6-7
                // (two shifts a span, not three).
                const __m256i m6 = _mm256_set1_epi8(0x30), half = _mm256_setr_epi32(4, 4, 4, 4, 0, 0, 0, 0);
                const uint8_t *hp = window_bytes(wr[r] + high_offset(in, e), nv / 4, 64, hpad);
#pragma GCC unroll 8
                for (int i = 0; i < 4; i++) {
                    __m256i S = _mm256_sllv_epi32(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(hp + 16 * i))), half);
                    lo[i] = _mm256_or_si256(lo[i], _mm256_and_si256(S, m6));
                    hi[i] = _mm256_or_si256(hi[i], _mm256_and_si256(_mm256_srli_epi16(S, 2), m6));
                }
            }
#pragma GCC unroll 4
            for (int t = 0; t < TT; t++) {
                const int8_t *xp = xr[t] + e;
                __m256i V[4];
#pragma GCC unroll 8
                for (int i = 0; i < 4; i++) {
                    __m256i p = _mm256_add_epi16(
                        _mm256_maddubs_epi16(lo[i], _mm256_load_si256((const __m256i *)(xp + 64 * i))),
                        _mm256_maddubs_epi16(hi[i], _mm256_load_si256((const __m256i *)(xp + 64 * i + 32))));
                    V[i] = _mm256_madd_epi16(p, ones);
                }
                out[r][t] = reduce_4x2x4(V[0], V[1], V[2], V[3]);
            }
        } else if (BITS == 2) {
            const __m256i m = _mm256_set1_epi8(0x03);
            __m256i pl[2][4];
#pragma GCC unroll 8
            for (int i = 0; i < 2; i++) {
                __m256i W = _mm256_loadu_si256((const __m256i *)(wp + 32 * i));
                pl[i][0] = _mm256_and_si256(W, m);
                pl[i][1] = _mm256_and_si256(_mm256_srli_epi16(W, 2), m);
                pl[i][2] = _mm256_and_si256(_mm256_srli_epi16(W, 4), m);
                pl[i][3] = _mm256_and_si256(_mm256_srli_epi16(W, 6), m);
            }
#pragma GCC unroll 4
            for (int t = 0; t < TT; t++) {
                const int8_t *xp = xr[t] + e;
                __m256i V[2];
#pragma GCC unroll 8
                for (int i = 0; i < 2; i++) {
                    const int8_t *xs = xp + 128 * i;
                    __m256i p = _mm256_maddubs_epi16(pl[i][0], _mm256_load_si256((const __m256i *)xs));
                    p = _mm256_add_epi16(p, _mm256_maddubs_epi16(pl[i][1], _mm256_load_si256((const __m256i *)(xs + 32))));
                    p = _mm256_add_epi16(p, _mm256_maddubs_epi16(pl[i][2], _mm256_load_si256((const __m256i *)(xs + 64))));
                    p = _mm256_add_epi16(p, _mm256_maddubs_epi16(pl[i][3], _mm256_load_si256((const __m256i *)(xs + 96))));
                    V[i] = _mm256_madd_epi16(p, ones);
                }
                out[r][t] = reduce_2x4x2(V[0], V[1]);
            }
        } else {
            __m256i W[8], A[8];
#pragma GCC unroll 8
            for (int i = 0; i < 8; i++) {
                W[i] = _mm256_loadu_si256((const __m256i *)(wp + 32 * i));
                A[i] = _mm256_abs_epi8(W[i]);
            }
#pragma GCC unroll 4
            for (int t = 0; t < TT; t++) {
                const int8_t *xp = xr[t] + e;
                __m256i V[8];
#pragma GCC unroll 8
                for (int i = 0; i < 8; i++) {
                    __m256i s = _mm256_sign_epi8(_mm256_load_si256((const __m256i *)(xp + 32 * i)), W[i]);
                    V[i] = _mm256_madd_epi16(_mm256_maddubs_epi16(A[i], s), ones);
                }
                out[r][t] = reduce_8x8(V);
            }
        }
    }
}

// ---- fp32 part: the same operations in the same order as quant_avx512.c ----

static inline __m256 load_f16x8(const uint16_t *p, int32_t n) {
    if (n >= 8) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
    uint16_t tmp[8] = {0};
    memcpy(tmp, p, (size_t)n * sizeof *p);
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)tmp));
}

/* Rows [o, o + R) x tokens [t0, t0 + TT). */
static inline __attribute__((always_inline)) void tile(float *y, int32_t ldy, const ls_qact *a,
                                                       const ls_qmat *w, int32_t o, int32_t t0,
                                                       const int R, const int TT, const int BITS,
                                                       int32_t add) {
    const int32_t in = w->in, G = w->group, ng = in / G, m = G / 32;
    const size_t row_bytes = (size_t)in * BITS / 8;
    const int CB = BITS == 6 ? 4 : BITS;
    const uint8_t *wr[TILE_MAX_R];
    const int8_t *xr[TILE_MAX_T];
    __m256 acc[TILE_MAX_R][TILE_MAX_T];
    __m256i gs[TILE_MAX_R][TILE_MAX_T];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) wr[r] = w->qweight + (size_t)(o + r) * row_bytes;
#pragma GCC unroll 4
    for (int t = 0; t < TT; t++) xr[t] = a->q + (size_t)(t0 + t) * (size_t)a->ld;
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < TT; t++) acc[r][t] = _mm256_setzero_ps();

    for (int32_t g0 = 0; g0 < ng; g0 += 8) {
        const int32_t ngc = ng - g0 < 8 ? ng - g0 : 8;
        if (TT == 1 && w->head) {
            /* Decode streams the head from memory: ask for this window of
             * the rows two tiles ahead, more misses in flight than the
             * hardware prefetcher keeps. A prefetch never faults; the address
             * is formed as an integer to keep the arithmetic defined. */
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                const uintptr_t ahead = (uintptr_t)wr[r] + 2 * (size_t)R * row_bytes;
                for (size_t b = 0; b < (size_t)ngc * G * CB / 8; b += 64)
                    _mm_prefetch((const char *)(ahead + code_offset(g0 * G, BITS) + b), _MM_HINT_T0);
                for (size_t b = 0; BITS == 6 && b < (size_t)ngc * G / 4; b += 64)
                    _mm_prefetch((const char *)(ahead + high_offset(in, g0 * G) + b), _MM_HINT_T0);
            }
        }
        if (m == 1) {
            window_sums(gs, wr, xr, in, g0 * 32, ngc * 32, R, TT, BITS);
        } else {
            // Groups of m blocks: block sums window by window, then added up.
            int32_t bs[TILE_MAX_R][TILE_MAX_T][64] __attribute__((aligned(32)));
            const int32_t nblk = ngc * m;
            __m256i ws[TILE_MAX_R][TILE_MAX_T];
            for (int32_t k0 = 0; k0 < nblk; k0 += 8) {
                const int32_t nk = nblk - k0 < 8 ? nblk - k0 : 8;
                window_sums(ws, wr, xr, in, g0 * G + k0 * 32, nk * 32, R, TT, BITS);
#pragma GCC unroll 4
                for (int r = 0; r < R; r++)
#pragma GCC unroll 4
                    for (int t = 0; t < TT; t++) _mm256_store_si256((__m256i *)&bs[r][t][k0], ws[r][t]);
            }
#pragma GCC unroll 4
            for (int r = 0; r < R; r++)
#pragma GCC unroll 4
                for (int t = 0; t < TT; t++) {
                    int32_t g8[8] __attribute__((aligned(32))) = {0};
                    for (int32_t g = 0; g < ngc; g++)
                        for (int32_t b = 0; b < m; b++) g8[g] += bs[r][t][g * m + b];
                    gs[r][t] = _mm256_load_si256((const __m256i *)g8);
                }
        }
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            const size_t so = (size_t)(o + r) * (size_t)ng + (size_t)g0;
            const __m256 s8 = load_f16x8(w->scales + so, ngc);
            __m256 z8 = _mm256_setzero_ps();
            if (BITS == 2) z8 = load_f16x8(w->zeros + so, ngc);
#pragma GCC unroll 4
            for (int t = 0; t < TT; t++) {
                const __m256i qs = _mm256_loadu_si256((const __m256i *)(a->qsum + (size_t)(t0 + t) * (size_t)a->gld + g0));
                __m256i isum = gs[r][t];
                if (BITS == 2) acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(qs), z8, acc[r][t]);
                // int4 / int6 codes entered the integer dot product as c + 8 / c + 32:
                // take 8 (32) * sum(x) back.
                if (BITS == 4 || BITS == 6) isum = _mm256_sub_epi32(isum, _mm256_slli_epi32(qs, BITS - 1));
                acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), s8, acc[r][t]);
            }
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < TT; t++) {
            float s = ls_hsum256(acc[r][t]) * a->d[t0 + t];
            float *yo = y + (size_t)(t0 + t) * (size_t)ldy + o + r;
            *yo = add ? *yo + s : s;
        }
}


#define TILES(B)                                                                                    \
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
TILES(6)
TILES(8)

typedef void (*tile_fn)(float *, int32_t, const ls_qact *, const ls_qmat *, int32_t, int32_t, int32_t);

static void matmul_avx2(float *y, int32_t ldy, const ls_qact *a, const ls_qmat *w, int32_t o0,
                        int32_t o1, int32_t add) {
    tile_fn r1t4, r4t1, r1t1;
    if (w->bits == 4) r1t4 = tile_r1_t4_b4, r4t1 = tile_r4_t1_b4, r1t1 = tile_r1_t1_b4;
    else if (w->bits == 2) r1t4 = tile_r1_t4_b2, r4t1 = tile_r4_t1_b2, r1t1 = tile_r1_t1_b2;
    else if (w->bits == 6) r1t4 = tile_r1_t4_b6, r4t1 = tile_r4_t1_b6, r1t1 = tile_r1_t1_b6;
    else r1t4 = tile_r1_t4_b8, r4t1 = tile_r4_t1_b8, r1t1 = tile_r1_t1_b8;
    const int32_t T = a->T;
    int32_t rb = (int32_t)(L2_BLOCK_BYTES / ((size_t)w->in * (size_t)w->bits / 8));
    rb = rb < 4 ? 4 : rb & ~3;
    for (int32_t ob = o0; ob < o1; ob += rb) {
        int32_t oe = o1 - ob < rb ? o1 : ob + rb;
        int32_t t = 0;
        for (; t + 4 <= T; t += 4)
            for (int32_t o = ob; o < oe; o++) r1t4(y, ldy, a, w, o, t, add);
        for (; t < T; t++) {
            int32_t o = ob;
            for (; o + 4 <= oe; o += 4) r4t1(y, ldy, a, w, o, t, add);
            for (; o < oe; o++) r1t1(y, ldy, a, w, o, t, add);
        }
    }
}

// ---- the draft head's 2-bit scores (quant.h dot_u2) ----

static void dot_u2_avx2(int32_t *isum, const uint8_t *codes, int32_t ldb, const int8_t *xq, int32_t r0, int32_t r1) {
    const __m256i m = _mm256_set1_epi8(0x03), ones = _mm256_set1_epi16(1);
    for (int32_t r = r0; r < r1; r++) {
        const uint8_t *w = codes + (size_t)r * ldb;
        __m256i acc = _mm256_setzero_si256();
        for (int32_t b = 0; b < ldb; b += 32) {
            /* bytes [b, b + 32) of the 64-byte block at b0: inputs 4*b0 + (b - b0) + 64f */
            const int8_t *x = xq + 4 * (b & ~63) + (b & 63);
            __m256i W = _mm256_loadu_si256((const __m256i *)(w + b));
            /* codes <= 3, |x8| <= 127: no pair sum saturates */
            __m256i p = _mm256_maddubs_epi16(_mm256_and_si256(W, m), _mm256_loadu_si256((const __m256i *)x));
            p = _mm256_add_epi16(p, _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(W, 2), m),
                                                         _mm256_loadu_si256((const __m256i *)(x + 64))));
            p = _mm256_add_epi16(p, _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(W, 4), m),
                                                         _mm256_loadu_si256((const __m256i *)(x + 128))));
            p = _mm256_add_epi16(p, _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(W, 6), m),
                                                         _mm256_loadu_si256((const __m256i *)(x + 192))));
            acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, ones));
        }
        __m128i s = _mm_add_epi32(_mm256_castsi256_si128(acc), _mm256_extracti128_si256(acc, 1));
        s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
        s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
        isum[r] = _mm_cvtsi128_si32(s);
    }
}

/* quantize's layout: spans of 64 (int4, int6), of 128 (int2), natural (int8). */
static int32_t act_form_avx2(const ls_qmat *w, int32_t T) {
    (void)T;
    return w->bits == 2 ? 2 : w->bits == 8 ? 0 : 1;
}

LS_QOPS_TABLE(avx2, LS_SIMD_AVX2, act_form_avx2, NULL);
