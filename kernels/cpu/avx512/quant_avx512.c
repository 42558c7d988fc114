/*
 * quant_avx512.c — quantized matmul with AVX-512 VNNI (vpdpbusd). Built
 * with the AVX-512 flags of build.ts; selected by ls_quant_ops_select only
 * when the CPU has avx512vnni (else the AVX2 kernels run: same results).
 *
 * vpdpbusd multiplies unsigned bytes by signed bytes, four to a 32-bit
 * lane. The weights are read from the packed copies of quant_pack.h: block
 * matrices keep the wide scheme (a byte per code, so the inner loop is
 * loads and vpdpbusd and nothing else) for prefill-sized calls, and every
 * matrix the narrow one (head int8 / int6 / int4, block int4 / int2 in
 * decode steps), at its stored width: int6, int4 and int2 are unpacked to
 * bytes in registers (unpack_head) after each load. The head streams from
 * memory once per step, and in decode a loop's block comes from the
 * last-level cache once per loop, where its bytes are the cost too
 * (NARROW_BLOCK_MAX_T).
 *
 * A 64-byte load holds a chunk of a row pair, the first row in lanes 0-7,
 * the second in lanes 8-15, and is multiplied by the activation chunk
 * broadcast to both halves. So one 16-lane accumulator holds 8 groups of
 * two rows and the fp32 step (quant.h: the groups into acc[g % 8] in
 * increasing g) is two instructions per window for two rows (int2: three).
 */
#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "cpu/quant_pack.h"
#include "cpu/simd_vec.h"

#define TILE_MAX_P 4 /* row pairs per tile */
#define TILE_MAX_T 8 /* tokens per tile: 4 for the wide scheme, 8 for the narrow one (kernels) */
_Static_assert(TILE_MAX_T <= QTILE_MAX_T, "lanes holds a tile's tokens");
/* Pairs in blocks of twice the shared L2 block: the AVX-512 tiles go through
 * a block faster, so a larger one pays (docs/kernels.md#quantized-weights). */
#define PAIR_BLOCK_BYTES (2 * LS_L2_BLOCK_BYTES)
/* How far ahead (in row pairs) the int8 tiles prefetch the head, which
 * streams from memory in decode: more misses in flight than the hardware
 * prefetcher keeps. */
#define PREFETCH_PAIRS 8

// ---- schemes ----

/* Block matrices keep both copies and take the narrow one for calls of at
 * most this many tokens (a decode step of up to 8 rows; the narrow tiles
 * take 8 tokens in one pass): decode reads fewer bytes from the narrow
 * copy, prefill runs nearer the peak on the wide one
 * (docs/kernels.md#tuning-figures). */
#define NARROW_BLOCK_MAX_T 8

/* Whether a call of T tokens runs w in the narrow scheme (above): the head
 * always, block matrices in decode-sized calls. */
static inline int narrow(const ls_qmat *w, int32_t T) { return w->head || T <= NARROW_BLOCK_MAX_T; }

/* The activations' form: signed for the narrow scheme, q + 128 for the wide one. */
static int32_t act_form_avx512(const ls_qmat *w, int32_t T) { return narrow(w, T); }

// ---- activations ----

/* The rule of quant.h (ls_quant_rows is the scalar definition): the same
 * max, the same fp32 multiply, cvtps2dq rounding to nearest even (what the
 * scalar code's rounding does), NaN to 0, so the codes are identical. */
static inline __m512i codes16(const float *p, __m512 id) {
    __m512 v = _mm512_mul_ps(_mm512_loadu_ps(p), id);
    __m512i r = _mm512_maskz_mov_epi32(_mm512_cmp_ps_mask(v, v, _CMP_ORD_Q), _mm512_cvtps_epi32(v));
    return _mm512_min_epi32(_mm512_max_epi32(r, _mm512_set1_epi32(-127)), _mm512_set1_epi32(127));
}

static void quantize_avx512(ls_qact *a, const float *x, int32_t ldx, int32_t T, int32_t t0, int32_t t1,
                            const ls_qmat *w) {
    const int32_t in = w->in, G = w->group, ng = in / G;
    // The wide scheme (chosen by the call's size) reads the activations as
    // the unsigned operand: q + 128.
    const __m128i flip = _mm_set1_epi8(narrow(w, T) ? 0 : (char)0x80);
    for (int32_t t = t0; t < t1; t++) {
        const float *xr = x + (size_t)t * (size_t)ldx;
        int8_t *qr = a->q + (size_t)t * (size_t)a->ld;
        int32_t *qs = a->qsum + (size_t)t * (size_t)a->gld;
        __m512 m = _mm512_setzero_ps();
        for (int32_t i = 0; i < in; i += 16) m = _mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(xr + i)), m);
        float amax = _mm512_reduce_max_ps(m);
        float idf = amax > 0.0f ? 127.0f / amax : 0.0f;
        a->d[t] = amax / 127.0f;
        const __m512 id = _mm512_set1_ps(idf);
        for (int32_t g = ng; g < a->gld; g++) qs[g] = 0;
        // Window by window, each group's codes straight to their words: the
        // 4 units of 16 codes are n words apart (four 32-bit stores; GCC
        // makes a loop of them a vpscatterdd, which is slow).
        for (int32_t g0 = 0; g0 < ng;) {
            const int32_t n = window_groups(ng - g0);
            int8_t *qw = qr + (size_t)g0 * G;
            for (int32_t j = 0; j < n; j++) {
                const float *xg = xr + (size_t)(g0 + j) * G;
                int8_t *qj = qw + 4 * j;
                __m512i sum = _mm512_setzero_si512();
                for (int32_t i = 0; i < G; i += 16, qj += 16 * n) {
                    __m512i r = codes16(xg + i, id);
                    sum = _mm512_add_epi32(sum, r);
                    const __m128i b = _mm_xor_si128(_mm512_cvtepi32_epi8(r), flip);
                    _mm_storeu_si32(qj, b);
                    _mm_storeu_si32(qj + 4 * n, _mm_bsrli_si128(b, 4));
                    _mm_storeu_si32(qj + 8 * n, _mm_bsrli_si128(b, 8));
                    _mm_storeu_si32(qj + 12 * n, _mm_bsrli_si128(b, 12));
                }
                qs[g0 + j] = _mm512_reduce_add_epi32(sum);
            }
            g0 += n;
        }
    }
}

/* Every block matrix has the wide copy too (quant_pack.h). */
static int32_t pack_avx512(ls_qmat *w) { return ls_quant_pack(w, 1); }

// ---- the tiles ----

/* acc + the dot products of u (unsigned) and x (signed) in each lane
 * (vpdpbusd). As asm, because GCC 12 copies the intrinsic's accumulators
 * from register to register in the tile's loop, about one move per
 * vpdpbusd. */
static inline __m512i dpbusd(__m512i acc, __m512i u, __m512i x) {
    __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(u), "vm"(x));
    return acc;
}

/* dpbusd with x in a register. Given the choice, GCC keeps the one-token
 * tiles' shared activation vector on the stack and reads it there for
 * every vpdpbusd; the wide tiles read their codes best as a memory operand
 * (docs/kernels.md#tuning-figures). */
static inline __m512i dpbusd_reg(__m512i acc, __m512i u, __m512i x) {
    __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(u), "v"(x));
    return acc;
}

/* Lanes j, j + n, j + 2n, ... of each 8-lane half (one group of an n-group
 * window) added into lane j, then lane j moved to lane off + j (the group's
 * lane in its 8-group slot). */
static inline __m512i fold_to(__m512i s, int32_t n, int32_t off) {
    const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i seven = _mm512_set1_epi32(7);
    const __m512i base = _mm512_andnot_si512(seven, lane);
    for (int32_t k = 4; k >= n; k /= 2)
        s = _mm512_add_epi32(s, _mm512_permutexvar_epi32(
                                    _mm512_or_si512(base, _mm512_and_si512(_mm512_add_epi32(lane, _mm512_set1_epi32(k)), seven)), s));
    const __m512i rot = _mm512_or_si512(base, _mm512_and_si512(_mm512_sub_epi32(lane, _mm512_set1_epi32(off)), seven));
    return _mm512_permutexvar_epi32(rot, s);
}

/* A head chunk at its stored width (narrow_chunk: lo, and int6's hi) back
 * to a byte per code. */
static inline __m512i unpack_head(const uint8_t *lo, const uint8_t *hi_bits, const int BITS) {
    if (BITS == 8) return _mm512_load_si512((const void *)lo);
    if (BITS == 2) /* lane k: bits 2k, 2k + 1 of every byte */
        return _mm512_and_si512(_mm512_srlv_epi64(_mm512_broadcast_i32x4(_mm_load_si128((const __m128i *)lo)),
                                                  _mm512_setr_epi64(0, 0, 2, 2, 4, 4, 6, 6)),
                                _mm512_set1_epi8(0x03));
    // The nibbles: bytes 0-31 low, 32-63 high.
    const __m512i nib = _mm512_and_si512(
        _mm512_srlv_epi64(_mm512_broadcast_i64x4(_mm256_load_si256((const __m256i *)lo)),
                          _mm512_setr_epi64(0, 0, 0, 0, 4, 4, 4, 4)),
        _mm512_set1_epi8(0x0f));
    if (BITS == 4) return nib;
    // int6: byte j of lane k takes bits 2k, 2k + 1 of high byte j, rotated
    // to bits 4, 5 (left by 4, 2, 0 and right by 2: one rotate per dword).
    const __m512i hi = _mm512_rolv_epi32(_mm512_broadcast_i32x4(_mm_load_si128((const __m128i *)hi_bits)),
                                         _mm512_setr_epi32(4, 4, 4, 4, 2, 2, 2, 2, 0, 0, 0, 0, 30, 30, 30, 30));
    return _mm512_ternarylogic_epi32(nib, hi, _mm512_set1_epi8(0x30), 0xF8); /* nib | (hi & 0x30) */
}

/* A narrow int4 chunk with the high nibbles left in place: the first row's
 * codes in the low half, the second row's times 16 in the high half, one
 * instruction instead of unpack_head's two. The high half's sums are then
 * 16 times the true ones, exact, and taken back by a shift (pair_window). */
static inline __m512i unpack_int4_x16(const uint8_t *lo) {
    const __m512i keep = _mm512_inserti64x4(_mm512_set1_epi8(0x0f), _mm256_set1_epi8((char)0xf0), 1);
    return _mm512_and_si512(_mm512_broadcast_i64x4(_mm256_load_si256((const __m256i *)lo)), keep);
}

/* One window of n groups at group g0 for pairs [q, q + P) x the TT tokens:
 * exact group sums, then quant.h's fp32 step into acc (which the first
 * window starts, so a row of one window keeps acc in registers). n is a
 * constant for the 8-group windows. NARROW: the narrow scheme at BITS (8,
 * 6, 4); else the wide scheme's byte per code (int2). */
static inline __attribute__((always_inline)) void pair_window(__m512 acc[TILE_MAX_P][TILE_MAX_T],
                                                              const lanes *L, int32_t q, int32_t g0,
                                                              const int32_t n, const int first, const int P,
                                                              const int TT, const int BITS, const int NARROW) {
    const int32_t chunks = (n << L->v.lg) / 32, slot = g0 >> 3, off = g0 & 7;
    const int CB = !NARROW || BITS == 8 ? 64 : BITS == 2 ? 16 : 32; /* chunk_bytes */
    const int INT2 = BITS == 2, ZAT = NARROW ? 32 : 64;           /* int2: offsets; zeros_at */
    const int CORR = !NARROW || BITS != 2;                         /* an offset B to take back */
    /* Narrow int4 with few tokens, where the unpack is most of the work per
     * code: the second row's sums at 16 times (unpack_int4_x16), shifted
     * back once per window. With 5-8 tokens the shifts cost more than the
     * unpacks they save. */
    const int X16 = NARROW && BITS == 4 && TT <= 4;
    const __mmask16 HI = 0xFF00;
    const size_t xo = (size_t)g0 << L->v.lg;
    const uint8_t *wp[TILE_MAX_P], *hp[TILE_MAX_P], *mp[TILE_MAX_P];
#pragma GCC unroll 8
    for (int p = 0; p < P; p++) {
        wp[p] = L->codes + (size_t)(q + p) * L->v.pair_bytes + xo / 32 * CB;
        hp[p] = L->codes + (size_t)(q + p) * L->v.pair_bytes + L->v.hi_offset + xo / 2;
        mp[p] = L->meta + (size_t)(q + p) * L->v.meta_bytes + (size_t)slot * (size_t)L->v.slot_bytes;
    }
    // The offset correction (-128 times the code sums, or in the narrow
    // scheme -B times the activation sums), a whole window's worth at once:
    // as the accumulators' start value in 8-group windows, after the fold
    // in smaller ones.
    __m512i corr_t[TILE_MAX_T], corr_p[TILE_MAX_P];
    if (NARROW && CORR) {
#pragma GCC unroll 8
        for (int t = 0; t < TT; t++)
            corr_t[t] = _mm512_slli_epi32(_mm512_broadcast_i32x8(_mm256_loadu_si256((const __m256i *)(L->qs[t] + 8 * slot))), BITS - 1);
    }
#pragma GCC unroll 8
    for (int p = 0; p < P && !NARROW; p++)
        corr_p[p] = _mm512_slli_epi32(_mm512_cvtepi16_epi32(_mm256_load_si256((const __m256i *)(mp[p] + 32))), 7);
    if (X16 && n == 8) { /* the start value of the second row's sums at 16 times too */
#pragma GCC unroll 8
        for (int t = 0; t < TT; t++) corr_t[t] = _mm512_mask_slli_epi32(corr_t[t], HI, corr_t[t], 4);
    }
    __m512i gs[TILE_MAX_P][TILE_MAX_T];
#pragma GCC unroll 8
    for (int p = 0; p < P; p++)
#pragma GCC unroll 8
        for (int t = 0; t < TT; t++)
            gs[p][t] = n == 8 && CORR ? _mm512_sub_epi32(_mm512_setzero_si512(), NARROW ? corr_t[t] : corr_p[p])
                                      : _mm512_setzero_si512();
    for (int32_t c = 0; c < chunks; c++) {
        __m512i W[TILE_MAX_P], X[TILE_MAX_T];
#pragma GCC unroll 8
        for (int p = 0; p < P; p++) {
            W[p] = X16      ? unpack_int4_x16(wp[p] + CB * (size_t)c)
                   : NARROW ? unpack_head(wp[p] + CB * (size_t)c, hp[p] + 16 * (size_t)c, BITS)
                            : _mm512_load_si512((const void *)(wp[p] + 64 * (size_t)c));
            // A prefetch never faults; the address is formed as an integer
            // to keep the arithmetic defined past the last pair.
            if (NARROW)
                _mm_prefetch((const char *)((uintptr_t)wp[p] + PREFETCH_PAIRS * L->v.pair_bytes + CB * (size_t)c), _MM_HINT_T0);
            if (NARROW && BITS == 6 && (c & 3) == 0) /* a line of high bits serves 4 chunks */
                _mm_prefetch((const char *)((uintptr_t)hp[p] + PREFETCH_PAIRS * L->v.pair_bytes + 16 * (size_t)c), _MM_HINT_T0);
        }
#pragma GCC unroll 8
        for (int t = 0; t < TT; t++)
            X[t] = _mm512_broadcast_i64x4(_mm256_load_si256((const __m256i *)(L->x[t] + xo + 32 * (size_t)c)));
#pragma GCC unroll 8
        for (int p = 0; p < P; p++)
#pragma GCC unroll 8
            for (int t = 0; t < TT; t++)
                gs[p][t] = NARROW ? dpbusd(gs[p][t], W[p], X[t]) : dpbusd(gs[p][t], X[t], W[p]);
    }
#pragma GCC unroll 8
    for (int p = 0; p < P && X16; p++)
#pragma GCC unroll 8
        for (int t = 0; t < TT; t++) /* exact: 16 times a sum */
            gs[p][t] = _mm512_mask_srai_epi32(gs[p][t], HI, gs[p][t], 4);
    // Lane l of each half is now group 8 slot + l % 8 of this window (8
    // groups) or, once folded and moved, lanes off .. off + n - 1.
    const __mmask16 km = (__mmask16)(((1u << n) - 1u) << off) * 0x0101u;
    __m512 qf[TILE_MAX_T]; /* int2: the group sums of x, as floats */
#pragma GCC unroll 8
    for (int t = 0; t < TT && INT2; t++)
        qf[t] = _mm512_cvtepi32_ps(_mm512_broadcast_i32x8(_mm256_loadu_si256((const __m256i *)(L->qs[t] + 8 * slot))));
#pragma GCC unroll 8
    for (int p = 0; p < P; p++) {
        const __m512 s = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)mp[p]));
        __m512 z = _mm512_setzero_ps();
        if (INT2) z = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(mp[p] + ZAT)));
#pragma GCC unroll 8
        for (int t = 0; t < TT; t++) {
            __m512i g = gs[p][t];
            if (n < 8) g = fold_to(g, n, off);
            if (n < 8 && CORR) g = _mm512_sub_epi32(g, NARROW ? corr_t[t] : corr_p[p]);
            __m512 prev = first ? _mm512_setzero_ps() : acc[p][t];
            if (INT2) prev = n == 8 ? _mm512_fmadd_ps(qf[t], z, prev) : _mm512_mask3_fmadd_ps(qf[t], z, prev, km);
            const __m512 gf = _mm512_cvtepi32_ps(g);
            acc[p][t] = n == 8 ? _mm512_fmadd_ps(gf, s, prev) : _mm512_mask3_fmadd_ps(gf, s, prev, km);
        }
    }
}

/* ls_hsum256 of both halves of V[0] .. V[7] at once, the same additions in
 * the same order: lane 2j + h of the result is half h of V[j]. */
static inline __m512 hsum_halves8(const __m512 V[8]) {
    __m512 A[4], B[2];
#pragma GCC unroll 8
    for (int k = 0; k < 4; k++) /* quads: V[2k] half 0, half 1, V[2k+1] half 0, half 1; lane i: a_i + a_{i+4} */
        A[k] = _mm512_add_ps(_mm512_shuffle_f32x4(V[2 * k], V[2 * k + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                             _mm512_shuffle_f32x4(V[2 * k], V[2 * k + 1], _MM_SHUFFLE(3, 1, 3, 1)));
#pragma GCC unroll 2
    for (int k = 0; k < 2; k++) /* per quad: A[2k] (p0 + p2, p1 + p3), A[2k+1] (the same) */
        B[k] = _mm512_add_ps(_mm512_shuffle_ps(A[2 * k], A[2 * k + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_ps(A[2 * k], A[2 * k + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    /* quad i, lane k: (p0 + p2) + (p1 + p3) of quad i of A[k] */
    const __m512 C = _mm512_add_ps(_mm512_shuffle_ps(B[0], B[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                   _mm512_shuffle_ps(B[0], B[1], _MM_SHUFFLE(3, 1, 3, 1)));
    return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), C);
}

/* Bit r: row 2q + r of a tile of P pairs from pair q, if it falls in [o0, o1). */
static inline uint32_t tile_rows(int32_t q, int32_t o0, int32_t o1, int P) {
    const int32_t lo = o0 - 2 * q > 0 ? o0 - 2 * q : 0, hi = o1 - 2 * q < 2 * P ? o1 - 2 * q : 2 * P;
    return ((1u << hi) - 1u) & ~((1u << lo) - 1u);
}

/* The lanes of v in m to yt: added to what is there, or stored. */
static inline void store_rows(float *yt, __mmask16 m, __m512 v, int32_t add) {
    _mm512_mask_storeu_ps(yt, m, add ? _mm512_add_ps(_mm512_maskz_loadu_ps(m, yt), v) : v);
}

/* Pairs [q, q + P) x tokens [t0, t0 + TT): y (+)= the rows in rowmask (bit
 * r: row 2q + r). */
static inline __attribute__((always_inline)) void pair_tile(float *y, int32_t ldy, const lanes *L, int32_t q,
                                                            int32_t t0, uint32_t rowmask, const int P,
                                                            const int TT, const int BITS, const int NARROW,
                                                            int32_t add) {
    const int32_t ng = L->v.ng;
    __m512 acc[TILE_MAX_P][TILE_MAX_T];
    int32_t g0 = 0;
    if (ng >= 8) {
        pair_window(acc, L, q, 0, 8, 1, P, TT, BITS, NARROW);
        for (g0 = 8; g0 + 8 <= ng; g0 += 8) pair_window(acc, L, q, g0, 8, 0, P, TT, BITS, NARROW);
    } else {
        pair_window(acc, L, q, 0, window_groups(ng), 1, P, TT, BITS, NARROW);
        g0 = window_groups(ng);
    }
    while (g0 < ng) {
        const int32_t n = window_groups(ng - g0);
        pair_window(acc, L, q, g0, n, 0, P, TT, BITS, NARROW);
        g0 += n;
    }
    // Token t's 2P rows are lanes [2P t, 2P (t + 1)) of the sums, 16 to a
    // vector.
    const int NV = (2 * P * TT + 15) / 16;
    const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512 d8 = _mm512_zextps256_ps512(_mm256_maskz_loadu_ps((__mmask8)((1u << TT) - 1u), L->d));
    __m512 out[2];
#pragma GCC unroll 2
    for (int b = 0; b < NV; b++) {
        __m512 V[8];
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) {
            const int k = 8 * b + j;
            V[j] = k < P * TT ? acc[k % P][k / P] : acc[0][0];
        }
        const __m512i tok = _mm512_srli_epi32(_mm512_add_epi32(lane, _mm512_set1_epi32(16 * b)), __builtin_ctz(2 * P));
        out[b] = _mm512_mul_ps(hsum_halves8(V), _mm512_permutexvar_ps(tok, d8));
    }
    float *yr = y + (size_t)t0 * (size_t)ldy + 2 * (size_t)q;
    const __mmask16 m = (__mmask16)rowmask;
#pragma GCC unroll 8
    for (int t = 0; t < TT; t++) {
        const int at = 2 * P * t;
        const __m512 v = at % 16 ? _mm512_permutexvar_ps(_mm512_add_epi32(lane, _mm512_set1_epi32(at % 16)), out[at / 16])
                                 : out[at / 16];
        store_rows(yr + (size_t)t * (size_t)ldy, m, v, add);
    }
}

/* Tiles of P pairs from pair q while they fit below q1, tokens [t0, t0 +
 * TT), rows clipped to [o0, o1); the first pair not done. */
static inline __attribute__((always_inline)) int32_t pair_tiles(float *y, int32_t ldy, const ls_qact *a,
                                                                const ls_qmat *w, int32_t q, int32_t q1,
                                                                int32_t t0, int32_t o0, int32_t o1, const int P,
                                                                const int TT, const int BITS, const int NARROW,
                                                                int32_t add) {
    const lanes L = lanes_of(a, w, NARROW, t0, TT);
    for (; q + P <= q1; q += P) pair_tile(y, ldy, &L, q, t0, tile_rows(q, o0, o1, P), P, TT, BITS, NARROW, add);
    return q;
}

/* One token through a narrow int4 copy of whole 8-group windows, 8 pairs a
 * tile. Each 64-byte load is two chunks of one pair, summed twice: the low
 * nibbles (the first row) and the whole bytes (the first row plus 16 times
 * the second), so a chunk costs half a load and half a mask instead of a
 * broadcast and a mask, and a pair has two chains of half the length. The
 * group sums are pair_window's and every fp32 step is pair_tile's, so the
 * bits are the same; a block in L2 decodes faster than in 4-pair tiles
 * (docs/kernels.md#tuning-figures). Returns the first pair not done. */
#define T1_PAIRS 8
static int32_t tiles_t1_int4(float *y, int32_t ldy, const ls_qact *a, const ls_qmat *w, int32_t q, int32_t q1,
                             int32_t t0, int32_t o0, int32_t o1, int32_t add) {
    const layout v = layout_of(w, 1);
    if (v.ng % 8) return q;
    const uint8_t *codes = copy_of(w, 1), *meta = codes + v.meta_offset;
    const int8_t *x = a->q + (size_t)t0 * (size_t)a->ld;
    const int32_t *qs = a->qsum + (size_t)t0 * (size_t)a->gld;
    const __m512 d = _mm512_set1_ps(a->d[t0]);
    const int32_t chunks = (8 << v.lg) / 32; /* per window: 8 groups of G codes, 32 a chunk (even) */
    const size_t pb = v.pair_bytes, mb = v.meta_bytes;
    const __m512i nib = _mm512_set1_epi8(0x0f);
    const __mmask16 HI = 0xFF00;
    for (; q + T1_PAIRS <= q1; q += T1_PAIRS) {
        const uint8_t *wq = codes + (size_t)q * pb, *mq = meta + (size_t)q * mb;
        __m512 acc[T1_PAIRS];
#pragma GCC unroll 8
        for (int p = 0; p < T1_PAIRS; p++) acc[p] = _mm512_setzero_ps();
        for (int32_t g0 = 0; g0 < v.ng; g0 += 8) {
            const size_t off = (size_t)g0 << v.lg; /* the window's first byte in x and in each pair's codes */
            __m512i lo[T1_PAIRS], full[T1_PAIRS];
#pragma GCC unroll 8
            for (int p = 0; p < T1_PAIRS; p++) lo[p] = full[p] = _mm512_setzero_si512();
            for (int32_t c = 0; c < chunks; c += 2) {
                const __m512i X = _mm512_load_si512((const void *)(x + off + 32 * (size_t)c));
#pragma GCC unroll 8
                for (int p = 0; p < T1_PAIRS; p++) {
                    const uint8_t *at = wq + (size_t)p * pb + off + 32 * (size_t)c;
                    const __m512i W = _mm512_load_si512((const void *)at);
                    _mm_prefetch((const char *)((uintptr_t)at + PREFETCH_PAIRS * pb), _MM_HINT_T0);
                    lo[p] = dpbusd_reg(lo[p], _mm512_and_si512(W, nib), X);
                    full[p] = dpbusd_reg(full[p], W, X);
                }
            }
            // The offset correction, as pair_window's: 8 times the
            // activation sums, 16 times that in the second row's lanes.
            __m512i corr = _mm512_slli_epi32(_mm512_broadcast_i32x8(_mm256_loadu_si256((const __m256i *)(qs + g0))), 3);
            corr = _mm512_mask_slli_epi32(corr, HI, corr, 4);
#pragma GCC unroll 8
            for (int p = 0; p < T1_PAIRS; p++) {
                // Lanes 8-15 of lo and full hold the odd chunks' sums:
                // [lo.even + lo.odd | full.even + full.odd - lo.even - lo.odd].
                const __m512i u = _mm512_mask_sub_epi32(lo[p], HI, full[p], lo[p]);
                const __m512i z = _mm512_mask_sub_epi32(lo[p], (__mmask16)~HI, full[p], lo[p]);
                __m512i g = _mm512_sub_epi32(_mm512_add_epi32(u, _mm512_shuffle_i64x2(z, z, _MM_SHUFFLE(1, 0, 3, 2))), corr);
                g = _mm512_mask_srai_epi32(g, HI, g, 4); /* exact: 16 times a sum */
                const __m512 s = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(mq + (size_t)p * mb + (size_t)(g0 >> 3) * (size_t)v.slot_bytes)));
                acc[p] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(g), s, acc[p]);
            }
        }
        // Lanes 2p and 2p + 1: pair p's rows, as pair_tile leaves them.
        store_rows(y + (size_t)t0 * (size_t)ldy + 2 * (size_t)q, (__mmask16)tile_rows(q, o0, o1, T1_PAIRS),
                   _mm512_mul_ps(hsum_halves8(acc), d), add);
    }
    return q;
}

// ---- the row / token loops ----

typedef int32_t (*tiles_fn)(float *, int32_t, const ls_qact *, const ls_qmat *, int32_t, int32_t, int32_t,
                            int32_t, int32_t, int32_t);

#define TILES(P, TT, B, H)                                                                                \
    static int32_t tiles_p##P##_t##TT##_b##B##_h##H(float *y, int32_t ldy, const ls_qact *a, const ls_qmat *w,   \
                                                    int32_t q, int32_t q1, int32_t t0, int32_t o0, int32_t o1,   \
                                                    int32_t add) {                                               \
        return pair_tiles(y, ldy, a, w, q, q1, t0, o0, o1, P, TT, B, H, add);                                    \
    }
/* Per token count 4, 3, 2, 1: the wide tile, then single pairs. */
#define TILES_BITS(B, H)                                                                          \
    TILES(4, 4, B, H) TILES(1, 4, B, H) TILES(2, 3, B, H) TILES(1, 3, B, H) TILES(4, 2, B, H)     \
    TILES(1, 2, B, H) TILES(4, 1, B, H) TILES(1, 1, B, H)
/* The narrow scheme also takes 5 to 8 tokens (a decode batch) in one pass:
 * the head streams from memory, and a batch of 8 split 4 + 4 read it twice. */
#define TILES_WIDE(B, H)                                                                          \
    TILES(2, 5, B, H) TILES(1, 5, B, H) TILES(2, 6, B, H) TILES(1, 6, B, H) TILES(2, 7, B, H)     \
    TILES(1, 7, B, H) TILES(2, 8, B, H) TILES(1, 8, B, H)
TILES_BITS(4, 0)
TILES_BITS(2, 0)
TILES_BITS(8, 1)
TILES_BITS(6, 1)
TILES_BITS(4, 1)
TILES_BITS(2, 1)
TILES_WIDE(8, 1)
TILES_WIDE(6, 1)
TILES_WIDE(4, 1)
TILES_WIDE(2, 1)

/* wide[k], one[k]: the tiles for k + 1 tokens, up to max_t. */
typedef struct {
    int32_t max_t;
    tiles_fn wide[TILE_MAX_T], one[TILE_MAX_T];
} kernels;

#define KERNELS(B, H)                                                                                  \
    {4,                                                                                                \
     {tiles_p4_t1_b##B##_h##H, tiles_p4_t2_b##B##_h##H, tiles_p2_t3_b##B##_h##H, tiles_p4_t4_b##B##_h##H}, \
     {tiles_p1_t1_b##B##_h##H, tiles_p1_t2_b##B##_h##H, tiles_p1_t3_b##B##_h##H, tiles_p1_t4_b##B##_h##H}}
#define KERNELS_WIDE(B, H)                                                                             \
    {8,                                                                                                \
     {tiles_p4_t1_b##B##_h##H, tiles_p4_t2_b##B##_h##H, tiles_p2_t3_b##B##_h##H, tiles_p4_t4_b##B##_h##H, \
      tiles_p2_t5_b##B##_h##H, tiles_p2_t6_b##B##_h##H, tiles_p2_t7_b##B##_h##H, tiles_p2_t8_b##B##_h##H}, \
     {tiles_p1_t1_b##B##_h##H, tiles_p1_t2_b##B##_h##H, tiles_p1_t3_b##B##_h##H, tiles_p1_t4_b##B##_h##H, \
      tiles_p1_t5_b##B##_h##H, tiles_p1_t6_b##B##_h##H, tiles_p1_t7_b##B##_h##H, tiles_p1_t8_b##B##_h##H}}
static const kernels WIDE4 = KERNELS(4, 0), WIDE2 = KERNELS(2, 0), NARROW8 = KERNELS_WIDE(8, 1),
                     NARROW6 = KERNELS_WIDE(6, 1), NARROW4 = KERNELS_WIDE(4, 1), NARROW2 = KERNELS_WIDE(2, 1);

static void matmul_avx512(float *y, int32_t ldy, const ls_qact *a, const ls_qmat *w, int32_t o0,
                          int32_t o1, int32_t add) {
    const int nar = narrow(w, a->T);
    const kernels *k = nar ? (w->bits == 8 ? &NARROW8 : w->bits == 6 ? &NARROW6 : w->bits == 4 ? &NARROW4 : &NARROW2)
                           : (w->bits == 4 ? &WIDE4 : &WIDE2);
    const layout v = layout_of(w, nar);
    const int32_t T = a->T, q0 = o0 / 2, q1 = (o1 + 1) / 2;
    // Pairs in blocks that stay in L2 while every group of tokens passes.
    int32_t pb = (int32_t)(PAIR_BLOCK_BYTES / (v.pair_bytes + v.meta_bytes));
    pb = pb < 4 ? 4 : pb & ~3;
    for (int32_t qb = q0; qb < q1; qb += pb) {
        const int32_t qe = q1 - qb < pb ? q1 : qb + pb;
        for (int32_t t = 0; t < T;) {
            const int32_t n = T - t < k->max_t ? T - t : k->max_t;
            // One token of narrow int4: 8-pair tiles first, the rest as any call.
            const int32_t q = n == 1 && nar && w->bits == 4 ? tiles_t1_int4(y, ldy, a, w, qb, qe, t, o0, o1, add) : qb;
            k->one[n - 1](y, ldy, a, w, k->wide[n - 1](y, ldy, a, w, q, qe, t, o0, o1, add), qe, t, o0, o1, add);
            t += n;
        }
    }
}

// ---- the draft head's 2-bit scores (quant.h dot_u2) ----

/* Four accumulators to their four sums (r0, r1, r2, r3). */
static inline __m128i reduce4(__m512i a0, __m512i a1, __m512i a2, __m512i a3) {
    __m256i s0 = _mm256_add_epi32(_mm512_castsi512_si256(a0), _mm512_extracti64x4_epi64(a0, 1));
    __m256i s1 = _mm256_add_epi32(_mm512_castsi512_si256(a1), _mm512_extracti64x4_epi64(a1, 1));
    __m256i s2 = _mm256_add_epi32(_mm512_castsi512_si256(a2), _mm512_extracti64x4_epi64(a2, 1));
    __m256i s3 = _mm256_add_epi32(_mm512_castsi512_si256(a3), _mm512_extracti64x4_epi64(a3, 1));
    __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(s0, s1), _mm256_hadd_epi32(s2, s3));
    return _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
}

#define HEAD_PREFETCH_ROWS 32

/* Field f of every byte of W: 64 codes of inputs 64f + j. */
#define FIELD(W, f) _mm512_and_si512(_mm512_srli_epi16((W), 2 * (f)), m)

static void dot_u2_avx512(int32_t *isum, const uint8_t *codes, int32_t ldb, const int8_t *xq, int32_t r0,
                          int32_t r1) {
    const __m512i m = _mm512_set1_epi8(0x03);
    int32_t r = r0;
    for (; r + 4 <= r1; r += 4) {
        const uint8_t *w = codes + (size_t)r * ldb;
        __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
        for (int32_t b = 0; b < ldb; b += 64) {
            /* The head is read from memory on most drafts (the verifier's head
             * evicts it): ask for rows HEAD_PREFETCH_ROWS ahead, more misses in
             * flight than the hardware prefetcher keeps. A prefetch never
             * faults; the address is formed as an integer to stay defined. */
            for (int32_t k = 0; k < 4; k++)
                _mm_prefetch((const char *)((uintptr_t)w + (size_t)(HEAD_PREFETCH_ROWS + k) * ldb + b), _MM_HINT_T0);
            __m512i W0 = _mm512_loadu_si512((const void *)(w + b));
            __m512i W1 = _mm512_loadu_si512((const void *)(w + ldb + b));
            __m512i W2 = _mm512_loadu_si512((const void *)(w + 2 * (size_t)ldb + b));
            __m512i W3 = _mm512_loadu_si512((const void *)(w + 3 * (size_t)ldb + b));
#pragma GCC unroll 4
            for (int f = 0; f < 4; f++) {
                __m512i x = _mm512_loadu_si512((const void *)(xq + 4 * b + 64 * f));
                a0 = _mm512_dpbusd_epi32(a0, FIELD(W0, f), x);
                a1 = _mm512_dpbusd_epi32(a1, FIELD(W1, f), x);
                a2 = _mm512_dpbusd_epi32(a2, FIELD(W2, f), x);
                a3 = _mm512_dpbusd_epi32(a3, FIELD(W3, f), x);
            }
        }
        _mm_storeu_si128((__m128i *)(isum + r), reduce4(a0, a1, a2, a3));
    }
    for (; r < r1; r++) {
        const uint8_t *w = codes + (size_t)r * ldb;
        __m512i a = _mm512_setzero_si512();
        for (int32_t b = 0; b < ldb; b += 64) {
            __m512i W = _mm512_loadu_si512((const void *)(w + b));
#pragma GCC unroll 4
            for (int f = 0; f < 4; f++)
                a = _mm512_dpbusd_epi32(a, FIELD(W, f), _mm512_loadu_si512((const void *)(xq + 4 * b + 64 * f)));
        }
        isum[r] = _mm512_reduce_add_epi32(a);
    }
}

LS_QOPS_TABLE(avx512, LS_SIMD_AVX512, act_form_avx512, pack_avx512);
