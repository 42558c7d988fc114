/*
 * quant_avx512.c — quantized matmul with AVX-512 VNNI (vpdpbusd). Built
 * with the AVX-512 flags of build.ts; selected by ls_quant_ops_select only
 * when the CPU has avx512vnni (else the AVX2 kernels run: same results).
 *
 * vpdpbusd multiplies unsigned bytes by signed bytes. The weight codes are
 * packed unsigned (int4: c + 8, int2: c, int8: c + 128, flipped by pack so
 * the inner loop has no xor), the activations are the signed operand, and
 * the offset is taken back exactly per group with the activation sums:
 *   sum q * c = sum q * u - 8 * sum q   (int4; 128 for int8)
 *
 * Every format puts one group in each int32 lane. The weights are repacked
 * once (pack, by ls_quant_setup) and the activations written (quantize) in
 * the same layout, so vpdpbusd adds up whole groups and no horizontal sum
 * is needed until the fp32 step. A row is cut into windows of 16 groups
 * while 16 are left, then 8, 4, 2, 1 (window_groups). In a window of n
 * groups, the 4 inputs 4u .. 4u + 3 of group j (unit u) are 32-bit word
 * u n + j: the window's units transposed, read as 64-byte chunks of 16
 * words, so lane l of every chunk belongs to group l % n (16 / n lanes a
 * group; they are added once per window, nothing to do when n is 16).
 * Activation chunk c is the 64 bytes at the window's first input + 64 c; a
 * 64-byte load of packed weights holds the 8 / bits chunks from c on, chunk
 * c + f in bit field f of every byte (int4: the low, then the high nibble;
 * int8: one chunk, the whole byte). A window is at least one such load
 * (windows.nmin); the last is padded with zero codes and zero activations
 * past the last group.
 */
#define _DEFAULT_SOURCE /* madvise under -std=c11 */
#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>

#include "quant.h"
#include "simd_vec.h"

#define LANE_MAX_R 8
#define LANE_MAX_T 4
#define L2_BLOCK_BYTES (64 * 1024)
/* How far ahead the int8 tiles prefetch. On the 50257 x 768 head (one
 * thread) 12 to 16 rows beat 8 and 24, for 1 token and for 4 (where the
 * tile of 4 tokens then runs 3.5x faster than without prefetch). */
#define PREFETCH_ROWS 16

// ---- windows ----

/* Groups in the window that starts with `left` groups to go: 16, else the
 * largest of 8, 4, 2, 1 that fits, but at least nmin (the padded last
 * window). Every window starts at a multiple of its size. */
static inline int32_t window_groups(int32_t left, int32_t nmin) {
    int32_t n = 16;
    while (n > left && n > nmin) n /= 2;
    return n;
}

/* The windows of a row of `in` inputs in groups of G (a power of two, so
 * shifts instead of divisions). */
typedef struct {
    int32_t lg;   /* log2 G */
    int32_t ng;   /* groups */
    int32_t nmin; /* fewest groups in a window: one 64-byte load of packed weights */
    size_t rb;    /* bytes per packed row: the groups rounded up to a whole last window */
} windows;

static inline windows windows_of(int32_t in, int32_t G, int32_t bits) {
    windows v;
    v.lg = __builtin_ctz((unsigned)G);
    v.ng = in >> v.lg;
    v.nmin = (512 / bits) >> v.lg > 1 ? (512 / bits) >> v.lg : 1;
    v.rb = ((size_t)((v.ng + v.nmin - 1) & -v.nmin) << v.lg) * (size_t)bits / 8;
    return v;
}

// ---- activations ----

/* The rule of quant.h (ls_quant_rows is the scalar definition): the same
 * max, the same fp32 multiply, cvtps2dq rounding to nearest even (what the
 * scalar code's rounding does), NaN to 0, so the codes are identical. */
static inline __m512i codes16(const float *p, __m512 id) {
    __m512 v = _mm512_mul_ps(_mm512_loadu_ps(p), id);
    __m512i r = _mm512_maskz_mov_epi32(_mm512_cmp_ps_mask(v, v, _CMP_ORD_Q), _mm512_cvtps_epi32(v));
    return _mm512_min_epi32(_mm512_max_epi32(r, _mm512_set1_epi32(-127)), _mm512_set1_epi32(127));
}

_Static_assert(512 / 2 <= LS_QACT_PAD && LS_QUANT_GROUP_MAX <= LS_QACT_PAD,
               "the padded last window of a row (one 64-byte load of int2 codes, or one group) ends "
               "within the row's padding");

static void quantize_avx512(ls_qact *a, const float *x, int32_t ldx, int32_t T, int32_t in,
                            int32_t group, int32_t bits) {
    const int32_t G = group, ng = in / G;
    const int32_t nmin = windows_of(in, G, bits).nmin;
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
        for (int32_t g = ng; g < a->gld; g++) qs[g] = 0;
        // Window by window, each group's codes straight to their words: the
        // 4 units of 16 codes are n words apart (four 32-bit stores; GCC
        // makes a loop of them a vpscatterdd, which is slow).
        for (int32_t g0 = 0; g0 < ng;) {
            const int32_t n = window_groups(ng - g0, nmin), real = ng - g0 < n ? ng - g0 : n;
            int8_t *qw = qr + (size_t)g0 * G;
            if (real < n) memset(qw, 0, (size_t)(n * G)); /* the padding groups' words */
            for (int32_t j = 0; j < real; j++) {
                const float *xg = xr + (size_t)(g0 + j) * G;
                int8_t *qj = qw + 4 * j;
                __m512i sum = _mm512_setzero_si512();
                for (int32_t i = 0; i < G; i += 16, qj += 16 * n) {
                    __m512i r = codes16(xg + i, id);
                    sum = _mm512_add_epi32(sum, r);
                    const __m128i b = _mm512_cvtepi32_epi8(r);
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
    a->T = T;
    a->in = in;
    a->group = group;
    a->bits = bits;
}

// ---- weights ----

/* The unsigned codes (int4 c + 8, int2 c, int8 c + 128) of inputs 4u ..
 * 4u + 3 of group g of a row, one per byte. */
static inline uint32_t unit_codes(const uint8_t *row, int32_t G, int32_t g, int32_t u, int32_t bits) {
    const uint8_t *p = row + ((size_t)g * (size_t)G + 4 * (size_t)u) * (size_t)bits / 8;
    uint32_t v;
    if (bits == 8) {
        memcpy(&v, p, 4); /* stored signed: flip each byte's sign bit */
        return v ^ 0x80808080u;
    }
    if (bits == 4) {
        v = (uint32_t)p[0] | (uint32_t)p[1] << 8; /* 4 nibbles */
        v = (v | v << 8) & 0x00FF00FFu;
        return (v | v << 4) & 0x0F0F0F0Fu;
    }
    v = p[0]; /* 4 pairs of bits */
    v = (v | v << 12) & 0x000F000Fu;
    return (v | v << 6) & 0x03030303u;
}

static int32_t pack_avx512(ls_qmat *w) {
    if (!w->qweight) return 0; /* a slot the model leaves empty (an fp16 head) */
    const int32_t G = w->group, bits = w->bits, fields = 8 / bits;
    const windows v = windows_of(w->in, G, bits);
    const size_t row_bytes = (size_t)w->in * (size_t)bits / 8;
    // A copy that fills huge pages asks for them (the kernel may decline):
    // the int8 head streams from DRAM, and on 4 KB pages decode ran 5-10%
    // slower (the file mapping it is copied from sits in huge pages).
    const size_t bytes = (size_t)w->rows * v.rb, huge = (size_t)2 << 20;
    uint8_t *p = bytes >= huge ? aligned_alloc(huge, (bytes + huge - 1) & ~(huge - 1))
                               : aligned_alloc(64, bytes); /* rb is a multiple of 64 */
    if (!p) return -1;
    if (bytes >= huge) madvise(p, bytes, MADV_HUGEPAGE); /* advice only: failure changes nothing */
    for (int32_t o = 0; o < w->rows; o++) {
        const uint8_t *src = w->qweight + (size_t)o * row_bytes;
        uint32_t *dst = (uint32_t *)(p + (size_t)o * v.rb);
        for (int32_t g0 = 0; g0 < v.ng;) {
            // Field f of word l of load k: word 16 (k F + f) + l of the window.
            const int32_t n = window_groups(v.ng - g0, v.nmin), ln = __builtin_ctz((unsigned)n);
            const int32_t loads = n * G * bits / 512;
            for (int32_t k = 0; k < loads; k++)
                for (int32_t l = 0; l < 16; l++) {
                    const int32_t g = g0 + (l & (n - 1));
                    uint32_t word = 0; /* padding groups: zero codes */
                    for (int32_t f = 0; g < v.ng && f < fields; f++)
                        word |= unit_codes(src, G, g, (16 * (k * fields + f) + l) >> ln, bits) << (bits * f);
                    *dst++ = word;
                }
            g0 += n;
        }
    }
    w->packed = p;
    return 0;
}

// ---- the tiles ----

/* acc + the dot products of u (unsigned) and x (signed) in each lane
 * (vpdpbusd). As asm, because GCC 12 copies the intrinsic's accumulators
 * from register to register in the tile's loop, about one move per
 * vpdpbusd. */
static inline __m512i dpbusd(__m512i acc, __m512i u, __m512i x) {
    __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(u), "vm"(x));
    return acc;
}

/* Lanes j, j + n, j + 2n, ... (one group of an n-group window) added into
 * lane j, j < n. */
static inline __m512i fold(__m512i s, int32_t n) {
    if (n <= 8) s = _mm512_add_epi32(s, _mm512_alignr_epi32(s, s, 8));
    if (n <= 4) s = _mm512_add_epi32(s, _mm512_alignr_epi32(s, s, 4));
    if (n <= 2) s = _mm512_add_epi32(s, _mm512_alignr_epi32(s, s, 2));
    if (n <= 1) s = _mm512_add_epi32(s, _mm512_alignr_epi32(s, s, 1));
    return s;
}

/* What the tiles over tokens [t0, t0 + TT) read, worked out once per run
 * of tiles: the compiler cannot keep it in registers across the stores to
 * y (intrinsic stores may alias anything). */
typedef struct {
    windows v;
    const uint8_t *w;               /* packed rows */
    const uint16_t *scales, *zeros; /* (rows, ng) */
    const int8_t *x[LANE_MAX_T];    /* activation rows */
    const int32_t *qs[LANE_MAX_T];  /* their group sums */
    const float *d;                 /* their scales */
} lanes;

/* One window of n groups at group g0 (real of them not padding) for rows
 * [o, o + R) x the TT tokens: exact group sums, then quant.h's fp32 step
 * into acc. n is a constant for whole windows of 16 and 8. */
static inline __attribute__((always_inline)) void lane_window(__m256 acc[LANE_MAX_R][LANE_MAX_T],
                                                              const lanes *L, int32_t o, int32_t g0,
                                                              const int32_t n, int32_t real, const int R,
                                                              const int TT, const int BITS) {
    const int F = 8 / BITS; /* chunks per 64-byte weight load */
    const int32_t loads = (int32_t)(((uint32_t)n << L->v.lg) * BITS / 512);
    const size_t xo = (size_t)g0 << L->v.lg, wo = xo * BITS / 8;
    const __m512i mask = _mm512_set1_epi8(BITS == 4 ? 0x0f : 0x03);
    const __mmask16 km = (__mmask16)((1u << real) - 1u);
    const uint8_t *wr[LANE_MAX_R];
    __m512i gs[LANE_MAX_R][LANE_MAX_T];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) wr[r] = L->w + (size_t)(o + r) * L->v.rb + wo;
#pragma GCC unroll 4
    for (int t = 0; t < TT; t++) {
        // int4 / int8: the unsigned codes carry 8 (128) * sum(x); start from minus that.
        __m512i init = _mm512_setzero_si512();
        if (BITS != 2)
            init = _mm512_sub_epi32(
                init, _mm512_slli_epi32(_mm512_maskz_loadu_epi32(km, L->qs[t] + g0), BITS == 4 ? 3 : 7));
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) gs[r][t] = init;
    }
    for (int32_t p = 0; p < loads; p++) {
        __m512i W[LANE_MAX_R];
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) W[r] = _mm512_load_si512((const void *)(wr[r] + 64 * p));
        if (BITS == 8) {
            // The int8 head streams from memory (decode, and the first pass
            // of speculative verification): ask for the same line of the
            // rows PREFETCH_ROWS ahead, more misses in flight than the
            // hardware prefetcher keeps. A prefetch never faults; the
            // address is formed as an integer to keep the arithmetic defined
            // past the last row.
#pragma GCC unroll 8
            for (int r = 0; r < R; r++)
                _mm_prefetch((const char *)((uintptr_t)wr[r] + PREFETCH_ROWS * L->v.rb + 64 * (size_t)p), _MM_HINT_T0);
        }
#pragma GCC unroll 4
        for (int f = 0; f < F; f++) {
            __m512i X[LANE_MAX_T];
#pragma GCC unroll 4
            for (int t = 0; t < TT; t++) X[t] = _mm512_load_si512((const void *)(L->x[t] + xo + 64 * (p * F + f)));
#pragma GCC unroll 8
            for (int r = 0; r < R; r++) {
                const __m512i u =
                    BITS == 8 ? W[r] : _mm512_and_si512(f ? _mm512_srli_epi16(W[r], BITS * f) : W[r], mask);
#pragma GCC unroll 4
                for (int t = 0; t < TT; t++) gs[r][t] = dpbusd(gs[r][t], u, X[t]);
            }
        }
    }
    // Lane j is group g0 + j. Windows of 16 and 8 start at a multiple of 8
    // groups, so acc[g % 8] += v_g in increasing g is: the low 8 lanes, then
    // the high 8; or the 8 lanes; a smaller window goes to lanes off ..
    // off + real - 1.
    const int32_t off = g0 & 7;
    __m512 qf[LANE_MAX_T]; /* int2: the group sums of x, as floats */
#pragma GCC unroll 4
    for (int t = 0; t < TT && BITS == 2; t++)
        qf[t] = _mm512_cvtepi32_ps(_mm512_maskz_loadu_epi32(km, L->qs[t] + g0));
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) {
        const size_t so = (size_t)(o + r) * (size_t)L->v.ng + (size_t)g0;
        const __m512 s = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(km, L->scales + so));
        __m512 z = _mm512_setzero_ps();
        if (BITS == 2) z = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(km, L->zeros + so));
#pragma GCC unroll 4
        for (int t = 0; t < TT; t++) {
            if (n == 8) {
                // Lanes j and j + 8 hold group j.
                const __m256i g =
                    _mm256_add_epi32(_mm512_castsi512_si256(gs[r][t]), _mm512_extracti32x8_epi32(gs[r][t], 1));
                __m256 v = _mm256_mul_ps(_mm256_cvtepi32_ps(g), _mm512_castps512_ps256(s));
                if (BITS == 2)
                    v = _mm256_add_ps(v, _mm256_mul_ps(_mm512_castps512_ps256(qf[t]), _mm512_castps512_ps256(z)));
                acc[r][t] = _mm256_mask_add_ps(acc[r][t], (__mmask8)km, acc[r][t], v);
                continue;
            }
            __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(n < 16 ? fold(gs[r][t], n) : gs[r][t]), s);
            if (BITS == 2) v = _mm512_add_ps(v, _mm512_mul_ps(qf[t], z));
            if (n == 16) {
                acc[r][t] = _mm256_add_ps(acc[r][t], _mm512_castps512_ps256(v));
                acc[r][t] = _mm256_add_ps(acc[r][t], _mm512_extractf32x8_ps(v, 1));
            } else {
                const __m256i rot = _mm256_and_si256(
                    _mm256_sub_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(off)),
                    _mm256_set1_epi32(7));
                acc[r][t] = _mm256_mask_add_ps(acc[r][t], (__mmask8)(km << off), acc[r][t],
                                               _mm256_permutexvar_ps(rot, _mm512_castps512_ps256(v)));
            }
        }
    }
}

/* ls_hsum256 of A[0] .. A[7] at once, the same additions in the same order:
 * lanes 0-3 for A[0], A[2], A[4], A[6], lanes 4-7 for A[1], A[3], A[5], A[7]. */
static inline __m256 lane_sum8(const __m256 A[8]) {
    __m256 B[4];
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++)
        B[i] = _mm256_add_ps(_mm256_permute2f128_ps(A[2 * i], A[2 * i + 1], 0x20),
                             _mm256_permute2f128_ps(A[2 * i], A[2 * i + 1], 0x31));
    __m256 C01 = _mm256_add_ps(_mm256_shuffle_ps(B[0], B[1], 0x44), _mm256_shuffle_ps(B[0], B[1], 0xEE));
    __m256 C23 = _mm256_add_ps(_mm256_shuffle_ps(B[2], B[3], 0x44), _mm256_shuffle_ps(B[2], B[3], 0xEE));
    return _mm256_add_ps(_mm256_shuffle_ps(C01, C23, 0x88), _mm256_shuffle_ps(C01, C23, 0xDD));
}

/* y[o .. o + 3] (+)= v * d (the final step of quant.h on 4 rows). */
static inline void store4(float *y, __m128 v, float d, int32_t add) {
    v = _mm_mul_ps(v, _mm_set1_ps(d));
    _mm_storeu_ps(y, add ? _mm_add_ps(_mm_loadu_ps(y), v) : v);
}

/* Rows [o, o + R) x tokens [t0, t0 + TT) of the packed weights. */
static inline __attribute__((always_inline)) void lane_tile(float *y, int32_t ldy, const lanes *L, int32_t o,
                                                            int32_t t0, const int R, const int TT,
                                                            const int BITS, int32_t add) {
    const int32_t ng = L->v.ng;
    __m256 acc[LANE_MAX_R][LANE_MAX_T];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < TT; t++) acc[r][t] = _mm256_setzero_ps();
    int32_t g0 = 0;
    for (; g0 + 16 <= ng; g0 += 16) lane_window(acc, L, o, g0, 16, 16, R, TT, BITS);
    if (g0 + 8 <= ng) {
        lane_window(acc, L, o, g0, 8, 8, R, TT, BITS);
        g0 += 8;
    }
    while (g0 < ng) {
        const int32_t n = window_groups(ng - g0, L->v.nmin);
        lane_window(acc, L, o, g0, n, ng - g0 < n ? ng - g0 : n, R, TT, BITS);
        g0 += n;
    }
    float *yr = y + (size_t)t0 * (size_t)ldy + o;
    if (R == 4 && TT % 2 == 0) {
        // Two tokens' 4 rows per lane_sum8.
#pragma GCC unroll 2
        for (int t = 0; t < TT; t += 2) {
            const __m256 A[8] = {acc[0][t], acc[0][t + 1], acc[1][t], acc[1][t + 1],
                                 acc[2][t], acc[2][t + 1], acc[3][t], acc[3][t + 1]};
            const __m256 s = lane_sum8(A);
            store4(yr + (size_t)t * (size_t)ldy, _mm256_castps256_ps128(s), L->d[t], add);
            store4(yr + (size_t)(t + 1) * (size_t)ldy, _mm256_extractf128_ps(s, 1), L->d[t + 1], add);
        }
    } else if (R == 8 && TT == 1) {
        const __m256 A[8] = {acc[0][0], acc[4][0], acc[1][0], acc[5][0],
                             acc[2][0], acc[6][0], acc[3][0], acc[7][0]};
        const __m256 s = lane_sum8(A);
        store4(yr, _mm256_castps256_ps128(s), L->d[0], add);
        store4(yr + 4, _mm256_extractf128_ps(s, 1), L->d[0], add);
    } else {
        for (int r = 0; r < R; r++)
            for (int t = 0; t < TT; t++) {
                float v = ls_hsum256(acc[r][t]) * L->d[t];
                float *yo = yr + (size_t)t * (size_t)ldy + r;
                *yo = add ? *yo + v : v;
            }
    }
}

/* Tiles of R rows from row o while they fit below o1, tokens [t0, t0 +
 * TT); the first row not done. */
static inline __attribute__((always_inline)) int32_t lane_tiles(float *y, int32_t ldy, const ls_qact *a,
                                                                const ls_qmat *w, int32_t o, int32_t o1,
                                                                int32_t t0, const int R, const int TT,
                                                                const int BITS, int32_t add) {
    lanes L = {windows_of(w->in, w->group, BITS), w->packed, w->scales, w->zeros, {0}, {0}, a->d + t0};
#pragma GCC unroll 4
    for (int t = 0; t < TT; t++) {
        L.x[t] = a->q + (size_t)(t0 + t) * (size_t)a->ld;
        L.qs[t] = a->qsum + (size_t)(t0 + t) * (size_t)a->gld;
    }
    for (; o + R <= o1; o += R) lane_tile(y, ldy, &L, o, t0, R, TT, BITS, add);
    return o;
}

// ---- the row / token loops ----

typedef int32_t (*tiles_fn)(float *, int32_t, const ls_qact *, const ls_qmat *, int32_t, int32_t, int32_t,
                            int32_t);

#define TILES(KIND, R, TT, B)                                                                       \
    static int32_t KIND##_r##R##_t##TT##_b##B(float *y, int32_t ldy, const ls_qact *a,              \
                                              const ls_qmat *w, int32_t o, int32_t o1, int32_t t0,  \
                                              int32_t add) {                                        \
        return KIND(y, ldy, a, w, o, o1, t0, R, TT, B, add);                                        \
    }
/* The four shapes of one bit width: rows x 4 tokens, single rows x 4
 * tokens, R1 rows x 1 token, single rows x 1 token. */
#define TILES_BITS(B, R1) \
    TILES(lane_tiles, 4, 4, B) TILES(lane_tiles, 1, 4, B) TILES(lane_tiles, R1, 1, B) TILES(lane_tiles, 1, 1, B)
TILES_BITS(8, 4)
TILES_BITS(4, 8)
TILES_BITS(2, 8)

/* Tokens in groups of 4 (tiles of r4 rows, then single rows), then one by
 * one (tiles of r1 rows, then single rows). */
typedef struct {
    tiles_fn t4, r1t4, t1, r1t1;
} kernels;

/* int8 decode streams the head from memory in tiles of 4 rows: tiles of 8
 * took 20% longer on the 50257 x 768 head. */
static const kernels K8 = {lane_tiles_r4_t4_b8, lane_tiles_r1_t4_b8, lane_tiles_r4_t1_b8, lane_tiles_r1_t1_b8};
static const kernels K4 = {lane_tiles_r4_t4_b4, lane_tiles_r1_t4_b4, lane_tiles_r8_t1_b4, lane_tiles_r1_t1_b4};
static const kernels K2 = {lane_tiles_r4_t4_b2, lane_tiles_r1_t4_b2, lane_tiles_r8_t1_b2, lane_tiles_r1_t1_b2};

static void matmul_avx512(float *y, int32_t ldy, const ls_qact *a, const ls_qmat *w, int32_t o0,
                          int32_t o1, int32_t add) {
    const kernels *k = w->bits == 4 ? &K4 : w->bits == 2 ? &K2 : &K8;
    const size_t row_bytes = windows_of(w->in, w->group, w->bits).rb;
    const int32_t T = a->T;
    // Rows in blocks that stay in L2 while every group of 4 tokens passes.
    int32_t rb = (int32_t)(L2_BLOCK_BYTES / row_bytes);
    rb = rb < 8 ? 8 : rb & ~7;
    for (int32_t ob = o0; ob < o1; ob += rb) {
        const int32_t oe = o1 - ob < rb ? o1 : ob + rb;
        int32_t t = 0;
        for (; t + 4 <= T; t += 4) k->r1t4(y, ldy, a, w, k->t4(y, ldy, a, w, ob, oe, t, add), oe, t, add);
        for (; t < T; t++) k->r1t1(y, ldy, a, w, k->t1(y, ldy, a, w, ob, oe, t, add), oe, t, add);
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

LS_QOPS_TABLE(avx512, LS_SIMD_AVX512, pack_avx512);
