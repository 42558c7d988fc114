/*
 * quant_avx2.c — quantized matmul with AVX2 (vpmaddubsw + vpmaddwd). Built
 * with -mavx2 -mfma -mf16c; also the kernels of AVX-512 CPUs without VNNI.
 *
 * The weights are read from the narrow copy of quant_pack.h (pack): row
 * pairs at the stored width, every int32 lane one group, the activations
 * signed q in the window order. A chunk of a pair unpacks (unpack_pair) to
 * 32 unsigned bytes u = c + B per row, each 4-byte word one group's four
 * codes, against the activation chunk:
 *
 *   vpmaddubsw  u * q, pairs added into int16: int4 (u <= 15) and int2
 *               (u <= 3) stay below 8 * 2 * 15 * 127 < 32767 for the sums
 *               of 8 chunks, int6 (u <= 63) for 2, so that many chunks add
 *               up in int16 (CHUNKS_PER_I16) before
 *   vpmaddwd    by ones: the word's sum into its group's lane.
 *
 * int8 codes are signed and take the whole byte, so the sign moves onto the
 * activation instead (|c| * sign(q, c), at most 2 * 128 * 127 a pair), one
 * chunk at a time. The offset B is taken back per group: sum q c = sum q u
 * - B sum q.
 *
 * No lane ever needs a horizontal sum: after a window the 8 lanes are its
 * groups' exact sums, and the fp32 steps are quant.h's, the same operations
 * in the same order as the other paths (ls_hsum256 at the end).
 */
#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "cpu/quant_pack.h"
#include "cpu/simd_vec.h"

// ---- activations ----

/* The rule of quant.h (ls_quant_rows is the scalar definition): the same
 * max, the same fp32 multiply, cvtps2dq rounding to nearest even, NaN to 0,
 * so the codes are identical; then the window order of quant_pack.h. */
static void quantize_avx2(ls_qact *a, const float *x, int32_t ldx, int32_t T, int32_t t0, int32_t t1,
                          const ls_qmat *w) {
    (void)T; /* one form whatever the call's size */
    const int32_t in = w->in, group = w->group;
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
        ls_quant_window_order(qr, in, group);
    }
}


// ---- the tiles ----

/* Tokens per tile. A tile is one row pair: more pairs a tile made decode
 * slower (docs/kernels.md#tuning-figures). */
#define TILE_MAX_T 4
_Static_assert(TILE_MAX_T <= QTILE_MAX_T, "lanes holds a tile's tokens");
/* How far ahead (in row pairs) the one-token tiles prefetch: the head
 * streams from memory in decode, more misses in flight than the hardware
 * prefetcher keeps. */
#define PREFETCH_PAIRS 8

/* Chunks whose vpmaddubsw sums add up in int16 without overflow (above). */
static inline int chunks_per_i16(const int BITS) { return BITS == 8 ? 1 : BITS == 6 ? 2 : 8; }

static int32_t pack_avx2(ls_qmat *w) { return ls_quant_pack(w, 0); }

/* A chunk of a pair at its stored width (narrow_chunk: lo, and int6's hi)
 * back to a byte per code: u[0] the first row's, u[1] the second's (int8:
 * the signed codes c). */
static inline __attribute__((always_inline)) void unpack_pair(__m256i u[2], const uint8_t *lo,
                                                               const uint8_t *hi, const int BITS) {
    if (BITS == 8) {
        const __m256i flip = _mm256_set1_epi8((char)0x80);
        u[0] = _mm256_xor_si256(_mm256_load_si256((const __m256i *)lo), flip);
        u[1] = _mm256_xor_si256(_mm256_load_si256((const __m256i *)(lo + 32)), flip);
        return;
    }
    if (BITS == 2) { /* byte j, bits 2k: u[16 k + j]; each 64-bit quarter shifted by its k */
        const __m256i B = _mm256_broadcastsi128_si256(_mm_load_si128((const __m128i *)lo)), m = _mm256_set1_epi8(3);
        u[0] = _mm256_and_si256(_mm256_srlv_epi64(B, _mm256_setr_epi64x(0, 0, 2, 2)), m);
        u[1] = _mm256_and_si256(_mm256_srlv_epi64(B, _mm256_setr_epi64x(4, 4, 6, 6)), m);
        return;
    }
    const __m256i W = _mm256_load_si256((const __m256i *)lo), m = _mm256_set1_epi8(0x0f);
    u[0] = _mm256_and_si256(W, m);
    u[1] = _mm256_and_si256(_mm256_srli_epi16(W, 4), m);
    if (BITS == 6) {
        // High byte j, bits 2k: the high bits of u[16 k + j]. In each half
        // of the broadcast, the row's k moved to bits 4-5 (a byte's bits
        // stay within the byte where the mask keeps them).
        const __m256i H = _mm256_broadcastsi128_si256(_mm_load_si128((const __m128i *)hi)), m6 = _mm256_set1_epi8(0x30);
        u[0] = _mm256_or_si256(u[0], _mm256_and_si256(_mm256_sllv_epi32(H, _mm256_setr_epi32(4, 4, 4, 4, 2, 2, 2, 2)), m6));
        u[1] = _mm256_or_si256(u[1], _mm256_and_si256(_mm256_srlv_epi32(H, _mm256_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2)), m6));
    }
}

/* Lanes j, j + n, j + 2n, ... (one group of an n-group window) added into
 * lane j, then lane j moved to lane off + j (the group's lane in its
 * 8-group slot). */
static inline __m256i fold_to(__m256i s, int32_t n, int32_t off) {
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), seven = _mm256_set1_epi32(7);
    for (int32_t k = 4; k >= n; k /= 2)
        s = _mm256_add_epi32(s, _mm256_permutevar8x32_epi32(s, _mm256_and_si256(_mm256_add_epi32(lane, _mm256_set1_epi32(k)), seven)));
    return _mm256_permutevar8x32_epi32(s, _mm256_and_si256(_mm256_sub_epi32(lane, _mm256_set1_epi32(off)), seven));
}

/* acc + m in int16 lanes (vpaddw). As asm, because GCC put each sum of the
 * chunk loop in a new register and copied it back, a move per add
 * (docs/kernels.md#tuning-figures). */
static inline __m256i add_i16(__m256i acc, __m256i m) {
    __asm__("vpaddw %1, %0, %0" : "+x"(acc) : "x"(m));
    return acc;
}

/* ps[h][t] += chunk c of the pair's row h (codes at wp, int6's high bits
 * at hp) times token t, in int16. */
static inline __attribute__((always_inline)) void chunk_products(__m256i ps[2][TILE_MAX_T], const lanes *L,
                                                                 const uint8_t *wp, const uint8_t *hp,
                                                                 size_t xo, int32_t c, const int TT,
                                                                 const int BITS) {
    const int CB = BITS == 8 ? 64 : BITS == 2 ? 16 : 32; /* chunk_bytes */
    const int PF = TT == 1; /* decode: the head streams from memory */
    __m256i U[2], A[2];
    unpack_pair(U, wp + (size_t)CB * c, hp + 16 * (size_t)c, BITS);
    // A prefetch a line, never faulting; the address is formed as an
    // integer to keep the arithmetic defined past the last pair.
    if (PF && (CB * c) % 64 == 0)
        _mm_prefetch((const char *)((uintptr_t)wp + PREFETCH_PAIRS * L->v.pair_bytes + (size_t)CB * c), _MM_HINT_T0);
    if (PF && BITS == 6 && c % 4 == 0)
        _mm_prefetch((const char *)((uintptr_t)hp + PREFETCH_PAIRS * L->v.pair_bytes + 16 * (size_t)c), _MM_HINT_T0);
    if (BITS == 8) A[0] = _mm256_abs_epi8(U[0]), A[1] = _mm256_abs_epi8(U[1]);
#pragma GCC unroll 4
    for (int t = 0; t < TT; t++) {
        const __m256i X = _mm256_load_si256((const __m256i *)(L->x[t] + xo + 32 * (size_t)c));
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            const __m256i m = BITS == 8 ? _mm256_maddubs_epi16(A[h], _mm256_sign_epi8(X, U[h]))
                                        : _mm256_maddubs_epi16(U[h], X);
            ps[h][t] = add_i16(ps[h][t], m);
        }
    }
}

/* gs[h][t] += chunks [c, c + K) of the pair's row h times token t: K
 * chunks' products added in int16, then into the int32 group lanes. */
static inline __attribute__((always_inline)) void chunk_sums(__m256i gs[2][TILE_MAX_T], const lanes *L,
                                                             const uint8_t *wp, const uint8_t *hp, size_t xo,
                                                             int32_t c, const int K, const int TT,
                                                             const int BITS) {
    __m256i ps[2][TILE_MAX_T];
#pragma GCC unroll 4
    for (int t = 0; t < TT; t++) ps[0][t] = ps[1][t] = _mm256_setzero_si256();
    // With several tokens the chunk loop stays a loop: unrolled, GCC
    // spilled the int16 sums. One token's two fit.
    if (TT == 1) {
#pragma GCC unroll 8
        for (int k = 0; k < K; k++) chunk_products(ps, L, wp, hp, xo, c + k, TT, BITS);
    } else {
#pragma GCC unroll 1
        for (int k = 0; k < K; k++) chunk_products(ps, L, wp, hp, xo, c + k, TT, BITS);
    }
    const __m256i ones = _mm256_set1_epi16(1);
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++)
#pragma GCC unroll 4
        for (int t = 0; t < TT; t++) gs[h][t] = _mm256_add_epi32(gs[h][t], _mm256_madd_epi16(ps[h][t], ones));
}

/* One window of n groups at group g0 for pair q x the TT tokens: exact
 * group sums, then quant.h's fp32 step into acc (which the first window
 * starts). n is a constant for the 8-group windows. */
static inline __attribute__((always_inline)) void pair_window(__m256 acc[2][TILE_MAX_T], const lanes *L,
                                                              int32_t q, int32_t g0, const int32_t n,
                                                              const int first, const int TT, const int BITS) {
    const int32_t chunks = (n << L->v.lg) / 32, slot = g0 >> 3, off = g0 & 7;
    const int CB = BITS == 8 ? 64 : BITS == 2 ? 16 : 32, K = chunks_per_i16(BITS);
    const size_t xo = (size_t)g0 << L->v.lg;
    const uint8_t *wp = L->codes + (size_t)q * L->v.pair_bytes + xo / 32 * CB;
    const uint8_t *hp = L->codes + (size_t)q * L->v.pair_bytes + L->v.hi_offset + xo / 2;
    const uint8_t *mp = L->meta + (size_t)q * L->v.meta_bytes + (size_t)slot * (size_t)L->v.slot_bytes;
    // chunks and K are powers of two: K at a time, or one at a time in a
    // window shorter than K chunks.
    __m256i gs[2][TILE_MAX_T];
#pragma GCC unroll 4
    for (int t = 0; t < TT; t++) gs[0][t] = gs[1][t] = _mm256_setzero_si256();
    if (chunks >= K)
        for (int32_t c = 0; c < chunks; c += K) chunk_sums(gs, L, wp, hp, xo, c, K, TT, BITS);
    else
        for (int32_t c = 0; c < chunks; c++) chunk_sums(gs, L, wp, hp, xo, c, 1, TT, BITS);
    // Lane l is now group 8 slot + l % n of this window (8 groups) or, once
    // folded and moved, lanes off .. off + n - 1.
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256 km = _mm256_castsi256_ps(_mm256_and_si256(_mm256_cmpgt_epi32(lane, _mm256_set1_epi32(off - 1)),
                                                           _mm256_cmpgt_epi32(_mm256_set1_epi32(off + n), lane)));
    __m256i corr[TILE_MAX_T]; /* int4, int6: B times the activation sums */
    __m256 qf[TILE_MAX_T];    /* int2: the activation sums, as floats */
#pragma GCC unroll 4
    for (int t = 0; t < TT; t++) {
        const __m256i qs = _mm256_loadu_si256((const __m256i *)(L->qs[t] + 8 * slot));
        if (BITS == 4 || BITS == 6) corr[t] = _mm256_slli_epi32(qs, BITS - 1);
        if (BITS == 2) qf[t] = _mm256_cvtepi32_ps(qs);
    }
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        const uint8_t *m = mp + 16 * h; /* the row's 8 lanes of the slot */
        const __m256 s = _mm256_cvtph_ps(_mm_load_si128((const __m128i *)m));
        const __m256 z = BITS == 2 ? _mm256_cvtph_ps(_mm_load_si128((const __m128i *)(m + zeros_at(1)))) : s;
#pragma GCC unroll 4
        for (int t = 0; t < TT; t++) {
            __m256i g = gs[h][t];
            if (n < 8) g = fold_to(g, n, off);
            if (BITS == 4 || BITS == 6) g = _mm256_sub_epi32(g, corr[t]);
            const __m256 prev = first ? _mm256_setzero_ps() : acc[h][t];
            __m256 v = prev;
            if (BITS == 2) v = _mm256_fmadd_ps(qf[t], z, v);
            v = _mm256_fmadd_ps(_mm256_cvtepi32_ps(g), s, v);
            acc[h][t] = n == 8 ? v : _mm256_blendv_ps(prev, v, km);
        }
    }
}

/* Pair q x tokens [t0, t0 + TT): y (+)= the rows that fall in [o0, o1). */
static inline __attribute__((always_inline)) void pair_tile(float *y, int32_t ldy, const lanes *L, int32_t q,
                                                            int32_t t0, int32_t o0, int32_t o1, const int TT,
                                                            const int BITS, int32_t add) {
    const int32_t ng = L->v.ng;
    __m256 acc[2][TILE_MAX_T];
    int32_t g0 = 0;
    if (ng >= 8) {
        pair_window(acc, L, q, 0, 8, 1, TT, BITS);
        for (g0 = 8; g0 + 8 <= ng; g0 += 8) pair_window(acc, L, q, g0, 8, 0, TT, BITS);
    } else {
        pair_window(acc, L, q, 0, window_groups(ng), 1, TT, BITS);
        g0 = window_groups(ng);
    }
    while (g0 < ng) {
        const int32_t n = window_groups(ng - g0);
        pair_window(acc, L, q, g0, n, 0, TT, BITS);
        g0 += n;
    }
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        const int32_t o = 2 * q + h;
        if (o < o0 || o >= o1) continue;
#pragma GCC unroll 4
        for (int t = 0; t < TT; t++) {
            const float s = ls_hsum256(acc[h][t]) * L->d[t];
            float *yo = y + (size_t)(t0 + t) * (size_t)ldy + o;
            *yo = add ? *yo + s : s;
        }
    }
}

/* Pairs [q0, q1) x tokens [t0, t0 + TT), rows clipped to [o0, o1). */
static inline __attribute__((always_inline)) void pair_tiles(float *y, int32_t ldy, const ls_qact *a,
                                                             const ls_qmat *w, int32_t q0, int32_t q1,
                                                             int32_t t0, int32_t o0, int32_t o1, const int TT,
                                                             const int BITS, int32_t add) {
    const lanes L = lanes_of(a, w, 1, t0, TT);
    for (int32_t q = q0; q < q1; q++) pair_tile(y, ldy, &L, q, t0, o0, o1, TT, BITS, add);
}

// ---- the row / token loops ----

typedef void (*tiles_fn)(float *, int32_t, const ls_qact *, const ls_qmat *, int32_t, int32_t, int32_t, int32_t,
                         int32_t, int32_t);

#define TILES(TT, B)                                                                                         \
    static void tiles_t##TT##_b##B(float *y, int32_t ldy, const ls_qact *a, const ls_qmat *w, int32_t q0,    \
                                   int32_t q1, int32_t t0, int32_t o0, int32_t o1, int32_t add) {            \
        pair_tiles(y, ldy, a, w, q0, q1, t0, o0, o1, TT, B, add);                                            \
    }
#define TILES_BITS(B) TILES(1, B) TILES(2, B) TILES(3, B) TILES(4, B)
TILES_BITS(8)
TILES_BITS(6)
TILES_BITS(4)
TILES_BITS(2)

/* [k]: the tiles for k + 1 tokens. */
#define KERNELS(B) {tiles_t1_b##B, tiles_t2_b##B, tiles_t3_b##B, tiles_t4_b##B}
static const tiles_fn K8[TILE_MAX_T] = KERNELS(8), K6[TILE_MAX_T] = KERNELS(6), K4[TILE_MAX_T] = KERNELS(4),
                      K2[TILE_MAX_T] = KERNELS(2);

static void matmul_avx2(float *y, int32_t ldy, const ls_qact *a, const ls_qmat *w, int32_t o0, int32_t o1,
                        int32_t add) {
    const tiles_fn *k = w->bits == 8 ? K8 : w->bits == 6 ? K6 : w->bits == 4 ? K4 : K2;
    const layout v = layout_of(w, 1);
    const int32_t T = a->T, q0 = o0 / 2, q1 = (o1 + 1) / 2;
    int32_t pb = (int32_t)(LS_L2_BLOCK_BYTES / (v.pair_bytes + v.meta_bytes));
    pb = pb < 1 ? 1 : pb;
    for (int32_t qb = q0; qb < q1; qb += pb) {
        const int32_t qe = q1 - qb < pb ? q1 : qb + pb;
        for (int32_t t = 0; t < T; t += TILE_MAX_T) k[(T - t < TILE_MAX_T ? T - t : TILE_MAX_T) - 1](y, ldy, a, w, qb, qe, t, o0, o1, add);
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

/* quantize writes one form, the window order of quant_pack.h. */
static int32_t act_form_avx2(const ls_qmat *w, int32_t T) {
    (void)w;
    (void)T;
    return 0;
}

LS_QOPS_TABLE(avx2, LS_SIMD_AVX2, act_form_avx2, pack_avx2);
