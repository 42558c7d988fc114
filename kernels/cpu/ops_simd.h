/*
 * ops_simd.h — the ops.h kernels the AVX2 and AVX-512 paths share, written
 * once over a vector of VL floats. Included only by ops_avx2.c and
 * ops_avx512.c (built with their ISA's flags), after each defines:
 *
 *   vec, VL              the vector type and its lanes
 *   OPS_NAME(name)       name with the path's suffix (name##_avx2)
 *   EXP_NEG_MIN          exp_neg's clamp (the smallest argument it keeps)
 *   TILE_MAX_R, TILE_MAX_T  the largest matmul tile (rows x tokens)
 *   MQ_SCORES_NV, MQ_VALUES_E  multi-query attention's vectors of positions
 *                        (scores) and the most of dimensions (values, 2 or
 *                        4) per query at a time
 *   SIMD_VEC_OPS(P)      (simd_vec.h) with its intrinsics' prefix: v_zero, v_set1,
 *                        v_add, v_sub, v_mul, v_div, v_max, v_load(p), v_store(p, a)
 *                        (VL floats), v_fma(a, b, c) = a * b + c and
 *                        v_fnma(a, b, c) = c - a * b (one rounding each)
 *   v_round(a)           to the nearest integer
 *   v_hsum(a)            the path's fixed horizontal sum
 *   v_hmax(a)            the largest lane (exact in any order)
 *   v_load_n(p, n), v_store_n(p, a, n)   the first n <= VL lanes (zeros
 *                                        elsewhere on a load)
 *   v_load_f16(p), v_load_f16_n(p, n)    fp16 -> fp32
 *   v_store_f16(p, a), v_store_f16_n(p, a, n)  fp32 -> fp16 (nearest even)
 *   v_load_i8(p), v_load_i8_n(p, n)      int8 codes -> fp32
 *   v_load_u4(p, n, lo, hi)              n <= VL code bytes -> their low and
 *                                        high nibbles as fp32
 *   v_neg_abs(x)         -|x|
 *   v_pick_nonneg(x, a, b)  per lane: x >= 0 ? a : b (b for NaN)
 *   v_pow2(p, n)         p * 2^n for integral n in exp_neg's range
 *
 * Every kernel keeps ops.h's contract on each path: a lane's result is one
 * fixed chain of fp32 operations (FMA where written), the same whether the
 * lane falls in a full vector or in the tail of a row, so where a call
 * starts or ends never changes a value. The paths differ only in VL and in
 * their horizontal sum.
 */

/* Decode streams weight rows from memory once per token; asking for the
 * next tile's rows while this tile computes keeps more misses in flight
 * than the hardware prefetcher does on a tile's parallel row streams
 * (docs/kernels.md#tuning-figures). A prefetch
 * never faults, so running past the matrix end is harmless; the address is
 * formed as an integer to keep the pointer arithmetic defined. */
static inline void prefetch_ahead(const uint16_t *p, size_t elems) {
    __builtin_prefetch((const void *)((uintptr_t)p + elems * sizeof *p), 0, 3);
}

#define ALWAYS_INLINE inline __attribute__((always_inline))

/* The first n < VL lanes when `part`, else all VL: floats, fp16 values or
 * int8 codes. part is a constant wherever speed matters, so the test folds
 * away. */
static ALWAYS_INLINE vec load_f32(const float *p, int part, int32_t n) {
    return part ? v_load_n(p, n) : v_load(p);
}
static ALWAYS_INLINE void store_f32(float *p, vec a, int part, int32_t n) {
    if (part) v_store_n(p, a, n);
    else v_store(p, a);
}
static ALWAYS_INLINE vec load_f16(const uint16_t *p, int part, int32_t n) {
    return part ? v_load_f16_n(p, n) : v_load_f16(p);
}
static ALWAYS_INLINE vec load_i8(const int8_t *p, int part, int32_t n) {
    return part ? v_load_i8_n(p, n) : v_load_i8(p);
}

/* Element off of a cache read as fp16 values or (I8) int8 codes. */
static ALWAYS_INLINE vec load_cache(const void *c, const int I8, size_t off, int part, int32_t n) {
    return I8 ? load_i8((const int8_t *)c + off, part, n) : load_f16((const uint16_t *)c + off, part, n);
}

// ---- fp16 matmul ----

/* A matmul tile's last n < VL inputs (the paths' tile functions), zero
 * padded, into acc[r][t] for R rows x TT tokens: one FMA per accumulator.
 * R and TT are constants at every call; TILE_MAX_R / TILE_MAX_T are the
 * path's. */
static ALWAYS_INLINE void tile_tail(vec acc[TILE_MAX_R][TILE_MAX_T], const uint16_t *const *wr, const float *x,
                                    int32_t ldx, int32_t i, int32_t n, const int R, const int TT) {
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) {
        vec w1 = v_load_f16_n(wr[r] + i, n);
#pragma GCC unroll 8
        for (int t = 0; t < TT; t++) acc[r][t] = v_fma(w1, v_load_n(x + (size_t)t * (size_t)ldx + i, n), acc[r][t]);
    }
}

/* One VL-input step of a matmul tile (the paths' tile functions):
 * acc[r][t] += w[r][i..i+VL) * x[t][i..i+VL) (FMA) for R rows x TT tokens.
 * Each converted weight vector serves every token and each x vector every
 * row: x is held in a register, since left to itself GCC folds its load
 * into every FMA and the load ports, not the FMA units, become the limit.
 * pf != 0: each row first prefetches the same inputs pf elements on. */
static ALWAYS_INLINE void tile_step(vec acc[TILE_MAX_R][TILE_MAX_T], const uint16_t *const *wr, const float *x,
                                    int32_t ldx, int32_t i, size_t pf, const int R, const int TT) {
    vec w[TILE_MAX_R];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) {
        if (pf) prefetch_ahead(wr[r] + i, pf);
        w[r] = v_load_f16(wr[r] + i);
    }
#pragma GCC unroll 8
    for (int t = 0; t < TT; t++) {
        vec xv = v_load(x + (size_t)t * (size_t)ldx + i);
        if (R > 1) __asm__("" : "+v"(xv));
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) acc[r][t] = v_fma(w[r], xv, acc[r][t]);
    }
}

// ---- attention over the cache (ops.h attn_scores / attn_values, _i8, _i4) ----
//
// Lane = position for scores (keys are cached dimension-major, so no
// horizontal sum is needed), lane = dimension for values. Each lane's sum
// runs over d (scores) or j (values) in order, so how positions or
// dimensions are grouped into vectors cannot change a result.

/* Scores of NV vectors of positions from j (with TAIL, the last holds only
 * m < VL of them): sum_d q[d] * K[d][j..] over fp16 keys, or (I8) over int8
 * codes, each position's sum then times its fp16 scale ks[j]. */
static ALWAYS_INLINE void scores_tile(float *scores, const float *q, const void *kt, int32_t ldk, const uint16_t *ks,
                                      int32_t hd, int32_t j, int32_t m, const int NV, const int TAIL, const int I8) {
    const size_t es = I8 ? 1 : 2; /* bytes per cached element */
    vec a[8];
#pragma GCC unroll 8
    for (int v = 0; v < NV; v++) a[v] = v_zero();
    for (size_t d = 0, row = (size_t)j; d < (size_t)hd; d++, row += (size_t)ldk) {
        // A full tile reads hd rows of keys, each from its own place: more
        // streams than the hardware prefetcher follows, so a decode step's
        // keys (back from memory after the output head passed through the
        // caches) came late. Each row asks for its part of the next tile,
        // the address formed as an integer (a prefetch never faults;
        // docs/kernels.md#tuning-figures).
        if (NV == 8 && !TAIL)
            for (size_t b = 0; b < 8 * VL * es; b += 64)
                _mm_prefetch((const char *)((uintptr_t)kt + (row + 8 * VL) * es + b), _MM_HINT_T0);
#pragma GCC unroll 8
        for (int v = 0; v < NV; v++) {
            vec k = load_cache(kt, I8, row + v * VL, TAIL && v == NV - 1, m); /* before q[d]: a copy is a call */
            a[v] = v_fma(v_set1(q[d]), k, a[v]);
        }
    }
#pragma GCC unroll 8
    for (int v = 0; v < NV; v++) {
        int part = TAIL && v == NV - 1;
        store_f32(scores + j + v * VL, I8 ? v_mul(a[v], load_f16(ks + j + v * VL, part, m)) : a[v], part, m);
    }
}

/* The rest of a row after its tiles of 8 vectors, `left` < 8 VL elements,
 * as one tile: TILE(NV, TAIL) with m (declared here) the last vector's
 * lanes. Its chains then run side by side, not one after another: a score
 * is a chain of head_dim dependent FMAs and a value sum one of n, so a
 * decode step's few positions (scores) or a head's few dimensions (values)
 * need every chain they can get at once (8 keep two FMA units of four
 * cycles' latency busy). */
#define REST_TILE(left, m, TILE)                                  \
    do {                                                          \
        int32_t m = (left) % VL;                                  \
        const int32_t nv_ = (left) / VL + (m > 0);                \
        if (m == 0) m = VL;                                       \
        switch (nv_ * 2 + (m < VL)) {                             \
        case 2: TILE(1, 0); break;                                \
        case 3: TILE(1, 1); break;                                \
        case 4: TILE(2, 0); break;                                \
        case 5: TILE(2, 1); break;                                \
        case 6: TILE(3, 0); break;                                \
        case 7: TILE(3, 1); break;                                \
        case 8: TILE(4, 0); break;                                \
        case 9: TILE(4, 1); break;                                \
        case 10: TILE(5, 0); break;                               \
        case 11: TILE(5, 1); break;                               \
        case 12: TILE(6, 0); break;                               \
        case 13: TILE(6, 1); break;                               \
        case 14: TILE(7, 0); break;                               \
        case 15: TILE(7, 1); break;                               \
        case 17: TILE(8, 1); break;                               \
        default: break; /* nothing left */                        \
        }                                                         \
    } while (0)

static ALWAYS_INLINE void scores_rows(float *scores, const float *q, const void *kt, int32_t ldk, const uint16_t *ks,
                                      int32_t hd, int32_t n, const int I8) {
    int32_t j = 0;
    for (; j + 8 * VL <= n; j += 8 * VL) scores_tile(scores, q, kt, ldk, ks, hd, j, VL, 8, 0, I8);
#define SCORES_REST(NV, TAIL) scores_tile(scores, q, kt, ldk, ks, hd, j, m, NV, TAIL, I8)
    REST_TILE(n - j, m, SCORES_REST);
#undef SCORES_REST
}

/* Values into NV vectors of dimensions from d0 (with TAIL, the last holds
 * only m < VL of them): out[d] += p[j] * V[j][d], j increasing, over fp16
 * values or (I8) int8 codes, whose weight is then p[j] times the row's fp16
 * scale vs[j]. */
static ALWAYS_INLINE void values_tile(float *out, const float *p, const void *v, const uint16_t *vs, int32_t hd,
                                      int32_t n, int32_t d0, int32_t m, const int NV, const int TAIL, const int I8) {
    vec a[8];
#pragma GCC unroll 8
    for (int e = 0; e < NV; e++) a[e] = load_f32(out + d0 + e * VL, TAIL && e == NV - 1, m);
    for (int32_t j = 0; j < n; j++) {
        vec w = v_set1(I8 ? p[j] * _cvtsh_ss(vs[j]) : p[j]);
#pragma GCC unroll 8
        for (int e = 0; e < NV; e++)
            a[e] = v_fma(w, load_cache(v, I8, (size_t)j * hd + d0 + e * VL, TAIL && e == NV - 1, m), a[e]);
    }
#pragma GCC unroll 8
    for (int e = 0; e < NV; e++) store_f32(out + d0 + e * VL, a[e], TAIL && e == NV - 1, m);
}

/* Tiles of 8 vectors of dimensions, then the rest as one tile: a head of
 * 32 dimensions is one pass of two chains on AVX-512, not two of one. */
static ALWAYS_INLINE void values_rows(float *out, const float *p, const void *v, const uint16_t *vs, int32_t hd,
                                      int32_t n, const int I8) {
    int32_t d0 = 0;
    for (; d0 + 8 * VL <= hd; d0 += 8 * VL) values_tile(out, p, v, vs, hd, n, d0, VL, 8, 0, I8);
#define VALUES_REST(NV, TAIL) values_tile(out, p, v, vs, hd, n, d0, m, NV, TAIL, I8)
    REST_TILE(hd - d0, m, VALUES_REST);
#undef VALUES_REST
}

static void OPS_NAME(attn_scores)(float *scores, const float *q, const uint16_t *kt, int32_t ldk, int32_t hd,
                                  int32_t n) {
    scores_rows(scores, q, kt, ldk, NULL, hd, n, 0);
}

static void OPS_NAME(attn_values)(float *out, const float *p, const uint16_t *v, int32_t hd, int32_t n) {
    values_rows(out, p, v, NULL, hd, n, 0);
}

#define MQ_VEC_MAX 4 /* the most vectors a query keeps in the multi-query kernels */
_Static_assert(MQ_SCORES_NV <= MQ_VEC_MAX && MQ_VALUES_E <= MQ_VEC_MAX, "multi-query vectors per query");

/* a[g][v] += s[g][at] * x[v] (FMA) for G queries and N shared vectors: one
 * step of the multi-query kernels below, each loaded cache vector used by
 * every query. */
static ALWAYS_INLINE void mq_fma(vec a[LS_ATT_GROUP][MQ_VEC_MAX], const vec *x, const float *const *s, size_t at,
                                 const int G, const int N) {
#pragma GCC unroll 4
    for (int g = 0; g < G; g++) {
        vec c = v_set1(s[g][at]);
#pragma GCC unroll 4
        for (int v = 0; v < N; v++) a[g][v] = v_fma(c, x[v], a[g][v]);
    }
}

/* G (<= LS_ATT_GROUP) queries of one head over the same positions (ops.h
 * attn_scores_mq, prefill): each key vector is loaded once and used for
 * every query. NV vectors of positions from j (with TAIL, the last holds
 * only m < VL of them). Per query and lane the chain is scores_tile's (d
 * increasing from zero), so each score is bit-identical to a one-query
 * call. */
static ALWAYS_INLINE void scores_mq_tile(float *const *scores, const float *const *q, const uint16_t *kt,
                                         int32_t ldk, int32_t hd, int32_t j, int32_t m, const int G, const int NV,
                                         const int TAIL) {
    vec a[LS_ATT_GROUP][MQ_VEC_MAX];
#pragma GCC unroll 4
    for (int g = 0; g < G; g++)
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) a[g][v] = v_zero();
    for (size_t d = 0, row = (size_t)j; d < (size_t)hd; d++, row += (size_t)ldk) {
        vec k[MQ_VEC_MAX];
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) k[v] = load_f16(kt + row + v * VL, TAIL && v == NV - 1, m);
        mq_fma(a, k, q, d, G, NV);
    }
#pragma GCC unroll 4
    for (int g = 0; g < G; g++)
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) store_f32(scores[g] + j + v * VL, a[g][v], TAIL && v == NV - 1, m);
}

static ALWAYS_INLINE void scores_mq(float *const *scores, const float *const *q, const uint16_t *kt, int32_t ldk,
                                    int32_t hd, int32_t n, const int G) {
    int32_t j = 0;
    for (; j + MQ_SCORES_NV * VL <= n; j += MQ_SCORES_NV * VL)
        scores_mq_tile(scores, q, kt, ldk, hd, j, VL, G, MQ_SCORES_NV, 0);
    for (; j + VL <= n; j += VL) scores_mq_tile(scores, q, kt, ldk, hd, j, VL, G, 1, 0);
    if (j < n) scores_mq_tile(scores, q, kt, ldk, hd, j, n - j, G, 1, 1);
}

static void OPS_NAME(attn_scores_mq)(float *const *scores, const float *const *q, const uint16_t *kt, int32_t ldk,
                                     int32_t hd, int32_t n, int32_t G) {
    switch (G) {
    case 4: scores_mq(scores, q, kt, ldk, hd, n, 4); break;
    case 3: scores_mq(scores, q, kt, ldk, hd, n, 3); break;
    case 2: scores_mq(scores, q, kt, ldk, hd, n, 2); break;
    default:
        for (int32_t g = 0; g < G; g++) OPS_NAME(attn_scores)(scores[g], q[g], kt, ldk, hd, n);
    }
}

/* Values for G queries (ops.h attn_values_mq): each converted value row
 * feeds every query's running sums, E vectors of dimensions a pass; per
 * query and dimension the chain is values_tile's (j increasing, starting
 * from out), for head dims that are a multiple of VL (else one-query
 * calls). */
static ALWAYS_INLINE void values_mq(float *const *out, const float *const *p, const uint16_t *v, int32_t hd,
                                    int32_t n, const int G, const int E) {
    for (int32_t d0 = 0; d0 < hd; d0 += E * VL) {
        vec a[LS_ATT_GROUP][MQ_VEC_MAX];
#pragma GCC unroll 4
        for (int g = 0; g < G; g++)
#pragma GCC unroll 4
            for (int e = 0; e < E; e++) a[g][e] = v_load(out[g] + d0 + e * VL);
        const uint16_t *row = v + d0;
        for (int32_t j = 0; j < n; j++, row += hd) {
            vec w[MQ_VEC_MAX];
#pragma GCC unroll 4
            for (int e = 0; e < E; e++) w[e] = v_load_f16(row + e * VL);
            mq_fma(a, w, p, (size_t)j, G, E);
        }
#pragma GCC unroll 4
        for (int g = 0; g < G; g++)
#pragma GCC unroll 4
            for (int e = 0; e < E; e++) v_store(out[g] + d0 + e * VL, a[g][e]);
    }
}

#define VALUES_MQ(E)                                   \
    switch (G) {                                       \
    case 4: values_mq(out, p, v, hd, n, 4, E); return; \
    case 3: values_mq(out, p, v, hd, n, 3, E); return; \
    case 2: values_mq(out, p, v, hd, n, 2, E); return; \
    default: break;                                    \
    }

/* Dimensions per pass: MQ_VALUES_E vectors when the head holds a multiple
 * of that many, else 2 or 1. */
static void OPS_NAME(attn_values_mq)(float *const *out, const float *const *p, const uint16_t *v, int32_t hd,
                                     int32_t n, int32_t G) {
    if (MQ_VALUES_E == 4 && hd % (4 * VL) == 0) {
        VALUES_MQ(MQ_VALUES_E)
    } else if (hd % (2 * VL) == 0) {
        VALUES_MQ(2)
    } else if (hd % VL == 0) {
        VALUES_MQ(1)
    }
    for (int32_t g = 0; g < G; g++) OPS_NAME(attn_values)(out[g], p[g], v, hd, n);
}
#undef VALUES_MQ

static void OPS_NAME(attn_scores_i8)(float *scores, const float *q, const int8_t *kt, int32_t ldq,
                                     const uint16_t *ks, int32_t hd, int32_t n) {
    scores_rows(scores, q, kt, ldq, ks, hd, n, 1);
}

static void OPS_NAME(attn_values_i8)(float *out, const float *p, const int8_t *v, const uint16_t *vs, int32_t hd,
                                     int32_t n) {
    values_rows(out, p, v, vs, hd, n, 1);
}

/* Dims of the low (or high) nibbles of int4 group g0: half of the group. */
static inline int32_t group_half(int32_t g0, int32_t hd) {
    return ((g0 + LS_KV_GROUP < hd ? g0 + LS_KV_GROUP : hd) - g0) / 2;
}

/* int4 key scores of NV vectors of positions from j (with TAIL, the last
 * holds only m < VL of them). */
static ALWAYS_INLINE void scores_i4_tile(float *scores, const float *q, const uint8_t *kt, int32_t ldq,
                                         const uint16_t *kp, int32_t ldp, int32_t hd, int32_t j, int32_t m,
                                         const int NV, const int TAIL) {
    vec a[4];
#pragma GCC unroll 4
    for (int v = 0; v < NV; v++) a[v] = v_zero();
    for (int32_t g0 = 0, g = 0; g0 < hd; g0 += LS_KV_GROUP, g++) {
        int32_t half = group_half(g0, hd);
        vec sg[4], zg[4];
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) {
            sg[v] = load_f16(kp + (size_t)(2 * g) * ldp + j + v * VL, TAIL && v == NV - 1, m);
            zg[v] = load_f16(kp + (size_t)(2 * g + 1) * ldp + j + v * VL, TAIL && v == NV - 1, m);
        }
        const uint8_t *row = kt + (size_t)(g0 / 2) * ldq + j;
        for (int32_t i = 0; i < half; i++, row += ldq) {
            vec qlo = v_set1(q[g0 + i]), qhi = v_set1(q[g0 + half + i]);
#pragma GCC unroll 4
            for (int v = 0; v < NV; v++) {
                vec lo, hi;
                v_load_u4(row + v * VL, TAIL && v == NV - 1 ? m : VL, &lo, &hi);
                a[v] = v_fma(qlo, v_fma(lo, sg[v], zg[v]), a[v]);
                a[v] = v_fma(qhi, v_fma(hi, sg[v], zg[v]), a[v]);
            }
        }
    }
#pragma GCC unroll 4
    for (int v = 0; v < NV; v++) store_f32(scores + j + v * VL, a[v], TAIL && v == NV - 1, m);
}

static void OPS_NAME(attn_scores_i4)(float *scores, const float *q, const uint8_t *kt, int32_t ldq,
                                     const uint16_t *kp, int32_t ldp, int32_t hd, int32_t n) {
    int32_t j = 0;
    for (; j + 4 * VL <= n; j += 4 * VL) scores_i4_tile(scores, q, kt, ldq, kp, ldp, hd, j, VL, 4, 0);
    for (; j + VL <= n; j += VL) scores_i4_tile(scores, q, kt, ldq, kp, ldp, hd, j, VL, 1, 0);
    if (j < n) scores_i4_tile(scores, q, kt, ldq, kp, ldp, hd, j, n - j, 1, 1);
}

/* int4 values of group g (dims g0.. : half low-nibble dims, then half
 * high-nibble dims), in vectors of VL dims. */
static ALWAYS_INLINE void values_i4_group(float *out, const float *p, const uint8_t *v, const uint16_t *vp,
                                          int32_t hd, int32_t n, int32_t g0, int32_t g, int32_t half) {
    enum { NV_MAX = (LS_KV_GROUP / 2 + VL - 1) / VL };
    int32_t nb = hd / 2, np = 2 * ((hd + LS_KV_GROUP - 1) / LS_KV_GROUP), nv = (half + VL - 1) / VL;
    vec lo[NV_MAX], hi[NV_MAX];
    for (int32_t e = 0; e < NV_MAX; e++) lo[e] = hi[e] = v_zero(); /* (only [0, nv) are used) */
    for (int32_t e = 0; e < nv; e++) {
        int32_t m = half - e * VL < VL ? half - e * VL : VL;
        lo[e] = load_f32(out + g0 + e * VL, m < VL, m);
        hi[e] = load_f32(out + g0 + half + e * VL, m < VL, m);
    }
    const uint8_t *row = v + g0 / 2;
    const uint16_t *par = vp + 2 * g;
    for (int32_t j = 0; j < n; j++, row += nb, par += np) {
        vec w = v_set1(p[j]);
        vec sg = v_set1(_cvtsh_ss(par[0])), zg = v_set1(_cvtsh_ss(par[1]));
        for (int32_t e = 0; e < nv; e++) {
            vec cl, ch;
            v_load_u4(row + e * VL, half - e * VL < VL ? half - e * VL : VL, &cl, &ch);
            lo[e] = v_fma(w, v_fma(cl, sg, zg), lo[e]);
            hi[e] = v_fma(w, v_fma(ch, sg, zg), hi[e]);
        }
    }
    for (int32_t e = 0; e < nv; e++) {
        int32_t m = half - e * VL < VL ? half - e * VL : VL;
        store_f32(out + g0 + e * VL, lo[e], m < VL, m);
        store_f32(out + g0 + half + e * VL, hi[e], m < VL, m);
    }
}

static void OPS_NAME(attn_values_i4)(float *out, const float *p, const uint8_t *v, const uint16_t *vp, int32_t hd,
                                     int32_t n) {
    for (int32_t g0 = 0, g = 0; g0 < hd; g0 += LS_KV_GROUP, g++) {
        int32_t half = group_half(g0, hd);
        if (half == LS_KV_GROUP / 2) values_i4_group(out, p, v, vp, hd, n, g0, g, LS_KV_GROUP / 2); /* a whole group */
        else values_i4_group(out, p, v, vp, hd, n, g0, g, half);
    }
}

// ---- elementwise ----

/* exp(x) for x <= 0 (softmax and sigmoid arguments), clamped at
 * EXP_NEG_MIN: x = n ln2 + r, |r| <= ln2 / 2 (Cody-Waite, two constants),
 * exp(r) by a degree-6 polynomial (Horner, FMA), times 2^n. Within ~2 ulp
 * of expf. */
static inline vec exp_neg(vec x) {
    x = v_max(x, v_set1(EXP_NEG_MIN));
    vec n = v_round(v_mul(x, v_set1(1.44269504088896341f)));
    vec r = v_fnma(n, v_set1(0.693359375f), x);
    r = v_fnma(n, v_set1(-2.12194440e-4f), r);
    vec p = v_set1(1.0f / 720.0f);
    p = v_fma(p, r, v_set1(1.0f / 120.0f));
    p = v_fma(p, r, v_set1(1.0f / 24.0f));
    p = v_fma(p, r, v_set1(1.0f / 6.0f));
    p = v_fma(p, r, v_set1(0.5f));
    p = v_fma(p, r, v_set1(1.0f));
    p = v_fma(p, r, v_set1(1.0f));
    return v_pow2(p, n);
}

/* ops.h softmax_exp: the scaled scores' max (exact in any order), then
 * exp(c - max) a vector at a time, summed lane-wise over VL-element blocks
 * (the last one partial, its missing lanes zero) and then by the path's
 * fixed horizontal sum: one order for a given n. */
static float OPS_NAME(softmax_exp)(float *c, int32_t n, float scale) {
    const vec sc = v_set1(scale);
    vec mx = v_set1(-INFINITY);
    int32_t i = 0, m = n % VL;
    for (; i + VL <= n; i += VL) {
        vec v = v_mul(v_load(c + i), sc);
        v_store(c + i, v);
        mx = v_max(mx, v);
    }
    if (m) v_store_n(c + i, v_mul(v_load_n(c + i, m), sc), m);
    float top = v_hmax(mx);
    for (int32_t k = i; k < n; k++) top = c[k] > top ? c[k] : top;
    const vec top_v = v_set1(top);
    vec sum = v_zero();
    for (i = 0; i + VL <= n; i += VL) {
        vec e = exp_neg(v_sub(v_load(c + i), top_v));
        v_store(c + i, e);
        sum = v_add(sum, e);
    }
    if (m) {
        v_store_n(c + i, exp_neg(v_sub(v_load_n(c + i, m), top_v)), m);
        sum = v_add(sum, v_load_n(c + i, m));
    }
    return v_hsum(sum);
}

/* silu(g) * u for m lanes: silu(g) = g * sigmoid(g), the sigmoid from
 * e = exp(-|g|) <= 1 (no overflow): 1 / (1 + e) for g >= 0, e / (1 + e)
 * below. */
static ALWAYS_INLINE void swiglu_vec(float *g, const float *u, int32_t m) {
    const vec one = v_set1(1.0f);
    vec x = load_f32(g, m < VL, m);
    vec e = exp_neg(v_neg_abs(x));
    vec sig = v_div(v_pick_nonneg(x, one, e), v_add(one, e));
    store_f32(g, v_mul(v_mul(x, sig), load_f32(u, m < VL, m)), m < VL, m);
}

static void OPS_NAME(swiglu)(float *g, const float *u, int32_t n) {
    int32_t i = 0;
    for (; i + VL <= n; i += VL) swiglu_vec(g + i, u + i, VL);
    if (i < n) swiglu_vec(g + i, u + i, n - i);
}

/* One vector of a head's halves (the first n lanes when part). */
static ALWAYS_INLINE void rope_vec(float *lo, float *hi, const float *c, const float *s, int part, int32_t n) {
    vec x0 = load_f32(lo, part, n), x1 = load_f32(hi, part, n);
    vec vc = load_f32(c, part, n), vs = load_f32(s, part, n);
    store_f32(lo, v_sub(v_mul(x0, vc), v_mul(x1, vs)), part, n);
    store_f32(hi, v_add(v_mul(x1, vc), v_mul(x0, vs)), part, n);
}

/* ops.h rope: the table's pairs are split into cos and sin runs once per
 * block of 64, then every head's halves go a vector at a time; products and
 * sums stay separate (v_mul, v_sub, v_add), as on the portable path. Whole
 * vectors load as such: AVX2's partial loads copy through the stack
 * (docs/kernels.md#tuning-figures). */
static void OPS_NAME(rope)(float *x, int32_t n_heads, int32_t hd, const float *cs) {
    enum { B = 64 };
    float c[B], s[B];
    int32_t half = hd / 2;
    for (int32_t i0 = 0; i0 < half; i0 += B) {
        int32_t m = half - i0 < B ? half - i0 : B;
        for (int32_t i = 0; i < m; i++) {
            c[i] = cs[2 * (i0 + i)];
            s[i] = cs[2 * (i0 + i) + 1];
        }
        for (int32_t h = 0; h < n_heads; h++) {
            float *lo = x + (size_t)h * hd + i0, *hi = lo + half;
            int32_t i = 0;
            for (; i + VL <= m; i += VL) rope_vec(lo + i, hi + i, c + i, s + i, 0, VL);
            if (i < m) rope_vec(lo + i, hi + i, c + i, s + i, 1, m - i);
        }
    }
}

static void OPS_NAME(rmsnorm)(float *out, const float *x, const float *w, int32_t n, float eps) {
    vec acc = v_zero();
    int32_t i = 0;
    for (; i + VL <= n; i += VL) {
        vec v = v_load(x + i);
        acc = v_fma(v, v, acc);
    }
    if (i < n) {
        vec v = v_load_n(x + i, n - i);
        acc = v_fma(v, v, acc);
    }
    float scale = 1.0f / sqrtf(v_hsum(acc) / (float)n + eps);
    vec sv = v_set1(scale);
    for (i = 0; i + VL <= n; i += VL) v_store(out + i, v_mul(v_mul(v_load(x + i), sv), v_load(w + i)));
    for (; i < n; i++) out[i] = x[i] * scale * w[i];
}

static void OPS_NAME(f16_to_f32)(float *dst, const uint16_t *src, int32_t n) {
    int32_t i = 0;
    for (; i + VL <= n; i += VL) v_store(dst + i, v_load_f16(src + i));
    if (i < n) v_store_n(dst + i, v_load_f16_n(src + i, n - i), n - i);
}

static void OPS_NAME(f32_to_f16)(uint16_t *dst, const float *src, int32_t n) {
    int32_t i = 0;
    for (; i + VL <= n; i += VL) v_store_f16(dst + i, v_load(src + i));
    if (i < n) v_store_f16_n(dst + i, v_load_n(src + i, n - i), n - i);
}
