/*
 * quantize_search.h — the weight quantizer's per-path kernels (quantize.c runs
 * them on its pool). Not ABI: loopserve.h has ls_quantize.
 *
 * The procedure is the reference quantizer's (src/model/quantize.ts), and
 * every path must give its bytes, so the arithmetic is the reference's own:
 * IEEE double operations (+ - * /, comparisons, round half to even) in the
 * same order, no FMA (build.ts: -ffp-contract=off), each group's error a
 * sum in the order of its weights. A SIMD path evaluates one group per
 * lane, each lane the reference's chain of operations, so vectorising
 * changes no bit.
 *
 * Per group of G weights w:
 *   symmetric (int4: L = 7, int6: L = 31): code c = clamp(rne(w / s), -L - 1, L)
 *     for the scale s picked among |s| = fp16_up(max|w| / (L + 1 - k / 4)),
 *     k = 0..20, either sign (the larger side's sign first), by the least
 *     sum of (w - c s)^2, the earlier candidate on a tie; s = 0 (codes 0)
 *     when max|w| is 0 or no candidate's error is a number (a NaN weight).
 *   offset (int2): c = clamp(rne((w - z) / s), 0, 3) (0 when s = 0) for
 *     z = fp16_down(min + 0.04 m (max - min)), m = 0..5, and s =
 *     fp16_up((max - z) (1 - 0.03 k) / 3), k = 0..10, by the least sum of
 *     |w| (w - (c s + z))^2.
 *   int8 (the head's): s = fp16_up(max|w| / 127), c = clamp(rne(w / s), -127, 127).
 * fp16_up / fp16_down: the nearest fp16 at or above / at or below.
 */
#ifndef LS_QUANTIZE_SEARCH_H
#define LS_QUANTIZE_SEARCH_H

#include <stdint.h>
#include <string.h>

#include "internal.h"

#define LS_QZ_F16_MAX 65504.0
#define LS_QZ_SCALE_CANDIDATES 21  /* symmetric: k = 0..20 */
#define LS_QZ_SCALE_STEP 0.25
#define LS_QZ_OFFSET_CANDIDATES 6  /* offset: m = 0..5 */
#define LS_QZ_OFFSET_STEP 0.04
#define LS_QZ_SPAN_CANDIDATES 11   /* offset: k = 0..10 */
#define LS_QZ_SPAN_STEP 0.03

/* The fp16 nearest x (ties to even; from 65520 on infinity; NaN 0x7e00),
 * as bits: one rounding from the double, done on its bits. */
static inline uint16_t ls_qz_f16_bits(double x) {
    uint64_t u;
    memcpy(&u, &x, sizeof u);
    const uint16_t sign = (uint16_t)((u >> 48) & 0x8000);
    const uint64_t a = u & 0x7fffffffffffffffull;
    if (a > 0x7ff0000000000000ull) return 0x7e00;
    if (a >= 0x40effe0000000000ull) return sign | 0x7c00; /* 65520 */
    if (a < 0x3f10000000000000ull) {                        /* below 2^-14: a multiple of 2^-24 */
        double d;
        memcpy(&d, &a, sizeof d);
        return sign | (uint16_t)((d * 0x1p24 + 0x1p52) - 0x1p52); /* the addition rounds to an integer */
    }
    /* Keep 10 of the 52 fraction bits, to nearest even; a carry moves into the exponent. */
    const uint64_t r = (a + ((1ull << 41) - 1) + ((a >> 42) & 1)) >> 42;
    return sign | (uint16_t)(r - ((uint64_t)(1023 - 15) << 10));
}

/* The value of fp16 bits h, exactly. */
static inline double ls_qz_f16_value(uint16_t h) {
    const uint32_t e = (h >> 10) & 31, m = h & 1023;
    uint64_t b;
    if (e == 0) {
        const double d = (double)m * 0x1p-24;
        memcpy(&b, &d, sizeof b);
    } else if (e == 31) {
        b = m ? 0x7ff8000000000000ull : 0x7ff0000000000000ull;
    } else {
        b = ((uint64_t)(e - 15 + 1023) << 52) | ((uint64_t)m << 42);
    }
    b |= (uint64_t)(h & 0x8000) << 48;
    double v;
    memcpy(&v, &b, sizeof v);
    return v;
}

/* The bits of the smallest fp16 >= x (x finite, |x| <= 65504). */
static inline uint16_t ls_qz_f16_up(double x) {
    uint16_t b = ls_qz_f16_bits(x);
    if (ls_qz_f16_value(b) < x) b = (b & 0x8000) ? (b == 0x8000 ? 0x0001 : (uint16_t)(b - 1)) : (uint16_t)(b + 1);
    return b;
}

/* The bits of the largest fp16 <= x (x finite, |x| <= 65504). */
static inline uint16_t ls_qz_f16_down(double x) {
    uint16_t b = ls_qz_f16_bits(x);
    if (ls_qz_f16_value(b) > x) b = (b & 0x8000) ? (uint16_t)(b + 1) : (b == 0 ? 0x8001 : (uint16_t)(b - 1));
    return b;
}

/* What made a group unquantizable, for the message: the first scale beyond
 * fp16 (symmetric, int8), or the group's range (offset). */
typedef struct {
    double scale;
    double lo, hi;
} ls_qz_fault;

/* A path's kernels. Each takes n groups of `group` weights, one after
 * another in w, and writes each group's scale bits (offset: and offset
 * bits) and its codes (one per weight, in w's order); it returns the index
 * of the first group whose scale (or range) cannot be fp16, after which the
 * outputs are undefined, or -1. */
typedef struct {
    int32_t simd;
    int64_t (*symmetric)(const float *w, int64_t n, int32_t group, int32_t L, uint16_t *scales, int8_t *codes);
    int64_t (*offset)(const float *w, int64_t n, int32_t group, uint16_t *scales, uint16_t *zeros, int8_t *codes);
    /* n elements of src (LS_QUANTIZE_*) as fp32, exactly */
    void (*to_f32)(float *out, const void *src, int32_t input, int64_t n);
} ls_qz_ops;

extern const ls_qz_ops ls_qz_ops_portable;
extern const ls_qz_ops ls_qz_ops_avx2;
extern const ls_qz_ops ls_qz_ops_avx512;

/* The portable path's per-group procedures (quantize_portable.c), which the
 * SIMD paths' results equal and quantize.c's messages come from: 0, or -1
 * with *fault set. */
int ls_qz_symmetric_group(const float *w, int32_t group, int32_t L, uint16_t *scale, int8_t *codes, ls_qz_fault *fault);
int ls_qz_offset_group(const float *w, int32_t group, uint16_t *scale, uint16_t *zero, int8_t *codes,
                       ls_qz_fault *fault);

/* int8 (one candidate: the same on every path, so shared), n groups as above. */
int64_t ls_qz_int8(const float *w, int64_t n, int32_t group, uint16_t *scales, int8_t *codes, ls_qz_fault *fault);

#endif
