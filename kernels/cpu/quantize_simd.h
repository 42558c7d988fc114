/*
 * quantize_simd.h — the weight quantizer's search (quantize_search.h) written once
 * over a vector of VL doubles, one group per lane. Included only by
 * quantize_avx2.c and quantize_avx512.c, after each defines:
 *
 *   vd, vm, VL           the vector of doubles, its lane mask, its lanes
 *   QZ_NAME(name)        name with the path's suffix (name##_avx2)
 *   QZ_P(name)           the intrinsic's name with the path's prefix
 *                        (_mm256_##name), for the ops below that are one
 *                        intrinsic on either path
 *   vd_abs, vd_rint (to nearest even),
 *   vm_lt, vm_le, vm_gt (ordered: false with a NaN), vm_and, vm_andnot(a, b)
 *   (b and not a), vm_bits(m) (lane i in bit i), vd_select(m, a, b) (m ? b : a),
 *   vd_f16_up(x, &bits), vd_f16_down(x, &bits)  the fp16 at or above / at or
 *                        below each lane (quantize_search.h), its value and its bits
 *                        (as doubles)
 *   F32_VL, f32_from_halves(out, h, input)  F32_VL fp16 (LS_QUANTIZE_F16) or
 *                        bf16 values as fp32
 * and then names its table with QZ_OPS_TABLE(suffix, LS_SIMD_*).
 *
 * A lane runs the portable path's chain of double operations for its group
 * (quantize_portable.c) with one change that gives the same bits: a
 * candidate's codes rne(v / s) are taken as rne(v * (1 / s)). The product
 * lies within a few units in the last place of the quotient, so the two
 * round alike unless the quotient is that close to a half:
 *   symmetric: v is an fp32 and s an fp16 value, so a quotient below 2^6
 *     that is not a half lies at least 2^-36 from one: only an exact half
 *     can round the other way, to the other code at the same distance s / 2
 *     (or past the same clamp), whose error term (v - c s)^2 is the same
 *     double. So the errors, all that the products decide, are exact.
 *   offset: v - z is rounded, and the error adds z to c s, so a candidate
 *     where any lane's product came within QZ_TIE_MARGIN of a half is
 *     evaluated again with the quotients.
 * The codes of the chosen candidate are quotients, as the reference takes
 * them. Negating the scale negates every quotient exactly, so both signs
 * of a symmetric candidate come from one product.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "cpu/quantize_search.h"

/* vd_min(a, b), vd_max(a, b): b where either is NaN (minpd / maxpd). */
static inline vd vd_set1(double x) { return QZ_P(set1_pd)(x); }
static inline vd vd_load(const double *p) { return QZ_P(load_pd)(p); }
static inline void vd_store(double *p, vd a) { QZ_P(store_pd)(p, a); }
static inline vd vd_add(vd a, vd b) { return QZ_P(add_pd)(a, b); }
static inline vd vd_sub(vd a, vd b) { return QZ_P(sub_pd)(a, b); }
static inline vd vd_mul(vd a, vd b) { return QZ_P(mul_pd)(a, b); }
static inline vd vd_div(vd a, vd b) { return QZ_P(div_pd)(a, b); }
static inline vd vd_min(vd a, vd b) { return QZ_P(min_pd)(a, b); }
static inline vd vd_max(vd a, vd b) { return QZ_P(max_pd)(a, b); }

/* An offset candidate's product this close to a half may round the other
 * way than its quotient (|quotient| < 2^6: a few units in its last place
 * are below 2^-40). */
#define QZ_TIE_MARGIN (0.5 - 0x1p-30)

/* tw[i * VL + j] = weight i of group g0 + j (j < lanes), zero in the lanes past the end. */
static inline void QZ_NAME(transpose)(double *tw, const float *w, int64_t g0, int32_t lanes, int32_t group) {
    for (int32_t i = 0; i < group; i++)
        for (int32_t j = 0; j < VL; j++) tw[i * VL + j] = j < lanes ? (double)w[(g0 + j) * group + i] : 0.0;
}

/* The codes of lanes [0, lanes), tc[i * VL + j], into codes in w's order. */
static inline void QZ_NAME(untranspose)(int8_t *codes, const double *tc, int64_t g0, int32_t lanes, int32_t group) {
    for (int32_t j = 0; j < lanes; j++)
        for (int32_t i = 0; i < group; i++) codes[(g0 + j) * group + i] = (int8_t)tc[i * VL + j];
}

static inline int32_t QZ_NAME(first_lane)(unsigned bits) { return __builtin_ctz(bits); }

/* ---- symmetric ---- */

/* The errors of scale s (> 0) and of -s, each lane's sum over its group. */
static inline void QZ_NAME(symmetric_errors)(const double *tw, int32_t group, int32_t L, vd s, vd *ep, vd *en) {
    const vd inv = vd_div(vd_set1(1.0), s), lo = vd_set1(-L - 1), hi = vd_set1(L), lo1 = vd_set1(-L),
             hi1 = vd_set1(L + 1);
    vd e_pos = vd_set1(0.0), e_neg = vd_set1(0.0);
    for (int32_t i = 0; i < group; i++) {
        const vd v = vd_load(tw + i * VL);
        const vd r = vd_rint(vd_mul(v, inv));
        /* scale s: c = clamp(r, -L - 1, L); scale -s: c = clamp(-r, -L - 1, L) = -clamp(r, -L, L + 1),
         * and v - c (-s) = v + c s = v - clamp(r, -L, L + 1) s */
        const vd dp = vd_sub(v, vd_mul(vd_min(vd_max(r, lo), hi), s));
        const vd dn = vd_sub(v, vd_mul(vd_min(vd_max(r, lo1), hi1), s));
        e_pos = vd_add(e_pos, vd_mul(dp, dp));
        e_neg = vd_add(e_neg, vd_mul(dn, dn));
    }
    *ep = e_pos;
    *en = e_neg;
}

static int64_t QZ_NAME(symmetric)(const float *w, int64_t n, int32_t group, int32_t L, uint16_t *scales,
                                  int8_t *codes) {
    double tw[LS_QUANT_GROUP_MAX * VL] __attribute__((aligned(64)));
    double out[VL] __attribute__((aligned(64)));
    for (int64_t g0 = 0; g0 < n; g0 += VL) {
        const int32_t lanes = n - g0 < VL ? (int32_t)(n - g0) : VL;
        QZ_NAME(transpose)(tw, w, g0, lanes, group);
        vd max_pos = vd_set1(0.0), max_neg = vd_set1(0.0);
        for (int32_t i = 0; i < group; i++) {
            const vd v = vd_load(tw + i * VL);
            max_pos = vd_max(v, max_pos); /* a NaN weight is skipped */
            max_neg = vd_max(vd_sub(vd_set1(0.0), v), max_neg);
        }
        const vd amax = vd_max(max_pos, max_neg);
        const vm active = vm_lt(vd_set1(0.0), amax);
        /* The candidates grow with k: the last one fits fp16 or the group fails. */
        const vd last = vd_div(amax, vd_set1((double)(L + 1) - LS_QZ_SCALE_STEP * (LS_QZ_SCALE_CANDIDATES - 1)));
        const unsigned fail = vm_bits(vm_andnot(vm_le(last, vd_set1(LS_QZ_F16_MAX)), active)) & ((1u << lanes) - 1);
        if (fail) return g0 + QZ_NAME(first_lane)(fail);
        /* The larger side's sign first (quantize_portable.c). */
        const vm neg_first = vm_lt(max_neg, max_pos);
        const vd sign_first = vd_select(neg_first, vd_set1(0.0), vd_set1(32768.0));
        const vd sign_second = vd_sub(vd_set1(32768.0), sign_first);
        vd best = vd_set1(INFINITY), best_bits = vd_set1(0.0);
        for (int32_t k = 0; k < LS_QZ_SCALE_CANDIDATES; k++) {
            vd up_bits;
            const vd s = vd_f16_up(vd_div(amax, vd_set1((double)(L + 1) - LS_QZ_SCALE_STEP * k)), &up_bits);
            vd ep, en;
            QZ_NAME(symmetric_errors)(tw, group, L, s, &ep, &en);
            const vd e1 = vd_select(neg_first, ep, en), e2 = vd_select(neg_first, en, ep);
            const vm m1 = vm_lt(e1, best);
            best = vd_select(m1, best, e1);
            best_bits = vd_select(m1, best_bits, vd_add(up_bits, sign_first));
            const vm m2 = vm_lt(e2, best);
            best = vd_select(m2, best, e2);
            best_bits = vd_select(m2, best_bits, vd_add(up_bits, sign_second));
        }
        /* The codes at the chosen scale, by division as the reference takes them. */
        vd_store(out, vd_select(active, vd_set1(0.0), best_bits));
        for (int32_t j = 0; j < VL; j++) {
            if (j < lanes) scales[g0 + j] = (uint16_t)out[j];
            out[j] = ls_qz_f16_value((uint16_t)out[j]);
        }
        const vd s = vd_load(out), lo = vd_set1(-L - 1), hi = vd_set1(L);
        const vm nonzero = vm_lt(vd_set1(0.0), vd_abs(s));
        for (int32_t i = 0; i < group; i++) {
            const vd c = vd_min(vd_max(vd_rint(vd_div(vd_load(tw + i * VL), s)), lo), hi);
            vd_store(tw + i * VL, vd_select(nonzero, vd_set1(0.0), c));
        }
        QZ_NAME(untranspose)(codes, tw, g0, lanes, group);
    }
    return -1;
}

/* ---- offset (int2) ---- */

/* The error of offset z and scale s (>= 0; inv = 1 / s, or 0 where s is 0,
 * whose codes are all 0), as symmetric_errors. */
static inline unsigned QZ_NAME(offset_error)(const double *tw, int32_t group, vd s, vd inv, vd z, vd *err, int exact) {
    const vm positive = vm_lt(vd_set1(0.0), s);
    const vd zero = vd_set1(0.0), three = vd_set1(3.0);
    vd e = vd_set1(0.0), near = vd_set1(0.0);
    for (int32_t i = 0; i < group; i++) {
        const vd v = vd_load(tw + i * VL);
        const vd u = vd_sub(v, z);
        vd r;
        if (exact) {
            r = vd_select(positive, zero, vd_rint(vd_div(u, s)));
        } else {
            const vd t = vd_mul(u, inv);
            r = vd_rint(t);
            near = vd_max(vd_abs(vd_sub(t, r)), near);
        }
        const vd c = vd_min(vd_max(r, zero), three);
        const vd d = vd_sub(v, vd_add(vd_mul(c, s), z));
        e = vd_add(e, vd_mul(vd_abs(v), vd_mul(d, d)));
    }
    *err = e;
    return exact ? 0 : vm_bits(vm_and(vm_gt(near, vd_set1(QZ_TIE_MARGIN)), positive));
}

static int64_t QZ_NAME(offset)(const float *w, int64_t n, int32_t group, uint16_t *scales, uint16_t *zeros,
                               int8_t *codes) {
    double tw[LS_QUANT_GROUP_MAX * VL] __attribute__((aligned(64)));
    double out_s[VL] __attribute__((aligned(64))), out_z[VL] __attribute__((aligned(64)));
    for (int64_t g0 = 0; g0 < n; g0 += VL) {
        const int32_t lanes = n - g0 < VL ? (int32_t)(n - g0) : VL;
        QZ_NAME(transpose)(tw, w, g0, lanes, group);
        vd lo = vd_set1(INFINITY), hi = vd_set1(-INFINITY);
        for (int32_t i = 0; i < group; i++) {
            const vd v = vd_load(tw + i * VL);
            lo = vd_min(v, lo); /* a NaN weight is skipped */
            hi = vd_max(v, hi);
        }
        const vd limit = vd_set1(LS_QZ_F16_MAX);
        const unsigned fits = vm_bits(vm_and(vm_le(vd_abs(lo), limit), vm_le(vd_abs(hi), limit)));
        const unsigned fail = ~fits & ((1u << lanes) - 1);
        if (fail) return g0 + QZ_NAME(first_lane)(fail);
        const vd range = vd_sub(hi, lo);
        vd best = vd_set1(INFINITY), best_s = vd_set1(0.0), best_z = vd_set1(0.0);
        for (int32_t m = 0; m < LS_QZ_OFFSET_CANDIDATES; m++) {
            vd z_bits;
            const vd z = vd_f16_down(vd_add(lo, vd_mul(vd_set1(LS_QZ_OFFSET_STEP * m), range)), &z_bits);
            const vd span = vd_sub(hi, z);
            for (int32_t k = 0; k < LS_QZ_SPAN_CANDIDATES; k++) {
                vd s_bits;
                const vd s = vd_f16_up(vd_div(vd_mul(span, vd_set1(1 - LS_QZ_SPAN_STEP * k)), vd_set1(3.0)), &s_bits);
                const vd inv = vd_select(vm_lt(vd_set1(0.0), s), vd_set1(0.0), vd_div(vd_set1(1.0), s));
                vd e;
                if (QZ_NAME(offset_error)(tw, group, s, inv, z, &e, 0)) QZ_NAME(offset_error)(tw, group, s, inv, z, &e, 1);
                const vm better = vm_lt(e, best);
                best = vd_select(better, best, e);
                best_s = vd_select(better, best_s, s_bits);
                best_z = vd_select(better, best_z, z_bits);
            }
        }
        vd_store(out_s, best_s);
        vd_store(out_z, best_z);
        for (int32_t j = 0; j < lanes; j++) {
            scales[g0 + j] = (uint16_t)out_s[j];
            zeros[g0 + j] = (uint16_t)out_z[j];
        }
        for (int32_t j = 0; j < VL; j++) {
            out_s[j] = ls_qz_f16_value((uint16_t)out_s[j]);
            out_z[j] = ls_qz_f16_value((uint16_t)out_z[j]);
        }
        const vd s = vd_load(out_s), z = vd_load(out_z);
        const vm positive = vm_lt(vd_set1(0.0), s);
        for (int32_t i = 0; i < group; i++) {
            const vd r = vd_rint(vd_div(vd_sub(vd_load(tw + i * VL), z), s));
            const vd c = vd_min(vd_max(r, vd_set1(0.0)), vd_set1(3.0));
            vd_store(tw + i * VL, vd_select(positive, vd_set1(0.0), c));
        }
        QZ_NAME(untranspose)(codes, tw, g0, lanes, group);
    }
    return -1;
}

/* ---- input ---- */

static void QZ_NAME(to_f32)(float *out, const void *src, int32_t input, int64_t n) {
    if (input == LS_QUANTIZE_F32) {
        memcpy(out, src, (size_t)n * sizeof *out);
        return;
    }
    const uint16_t *h = src;
    int64_t i = 0;
    for (; i + F32_VL <= n; i += F32_VL) f32_from_halves(out + i, h + i, input);
    ls_qz_ops_portable.to_f32(out + i, h + i, input, n - i);
}

#define QZ_OPS_TABLE(sfx, simd_)                                                                           \
    const ls_qz_ops ls_qz_ops_##sfx = {                                                                    \
        .simd = (simd_), .symmetric = symmetric_##sfx, .offset = offset_##sfx, .to_f32 = to_f32_##sfx,     \
    }
