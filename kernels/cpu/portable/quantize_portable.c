/*
 * quantize_portable.c — the weight quantizer's search in plain C, one group
 * at a time: the reference quantizer (src/model/quantize.ts) line for line,
 * so the path every other is tested against, the one the messages of
 * quantize.c come from, and the one a CPU without AVX2 runs.
 */
#include <math.h>
#include <string.h>

#include "cpu/quantize_search.h"

/* clamp(rne(x), lo, hi), NaN kept (the reference's Math.min / Math.max). */
static inline double code_of(double x, double lo, double hi) {
    const double r = rint(x);
    return r < lo ? lo : r > hi ? hi : r;
}

static double symmetric_error(const float *w, int32_t n, double s, int32_t L) {
    double e = 0.0;
    for (int32_t i = 0; i < n; i++) {
        const double v = w[i];
        const double c = s != 0.0 ? code_of(v / s, -L - 1, L) : 0.0;
        const double d = v - c * s;
        e += d * d;
    }
    return e;
}

int ls_qz_symmetric_group(const float *w, int32_t group, int32_t L, uint16_t *scale, int8_t *codes, ls_qz_fault *fault) {
    double max_pos = 0.0, max_neg = 0.0;
    for (int32_t i = 0; i < group; i++) {
        const double v = w[i];
        if (v > max_pos) max_pos = v;
        else if (-v > max_neg) max_neg = -v;
    }
    const double amax = max_pos > max_neg ? max_pos : max_neg;
    /* The larger side's sign first: on a tie of errors it keeps the largest weight at -L - 1. */
    const uint16_t signs[2] = {max_neg >= max_pos ? 0 : 0x8000, max_neg >= max_pos ? 0x8000 : 0};
    uint16_t sb = 0;
    double best = INFINITY;
    for (int32_t k = 0; k < LS_QZ_SCALE_CANDIDATES && amax > 0.0; k++) {
        const double x = amax / ((double)(L + 1) - LS_QZ_SCALE_STEP * k);
        if (!(x <= LS_QZ_F16_MAX)) {
            fault->scale = x;
            return -1;
        }
        const uint16_t up = ls_qz_f16_up(x);
        for (int j = 0; j < 2; j++) {
            const uint16_t cand = up | signs[j];
            const double e = symmetric_error(w, group, ls_qz_f16_value(cand), L);
            if (e < best) {
                best = e;
                sb = cand;
            }
        }
    }
    *scale = sb;
    const double s = ls_qz_f16_value(sb);
    for (int32_t i = 0; i < group; i++) codes[i] = (int8_t)(s != 0.0 ? code_of(w[i] / s, -L - 1, L) : 0.0);
    return 0;
}

static inline double offset_code(double v, double s, double z) { return s > 0.0 ? code_of((v - z) / s, 0, 3) : 0.0; }

static double offset_error(const float *w, int32_t n, double s, double z) {
    double e = 0.0;
    for (int32_t i = 0; i < n; i++) {
        const double v = w[i];
        const double d = v - (offset_code(v, s, z) * s + z);
        e += fabs(v) * (d * d);
    }
    return e;
}

int ls_qz_offset_group(const float *w, int32_t group, uint16_t *scale, uint16_t *zero, int8_t *codes,
                       ls_qz_fault *fault) {
    double lo = INFINITY, hi = -INFINITY;
    for (int32_t i = 0; i < group; i++) {
        const double v = w[i];
        if (v < lo) lo = v;
        if (v > hi) hi = v;
    }
    if (!(fabs(lo) <= LS_QZ_F16_MAX && fabs(hi) <= LS_QZ_F16_MAX)) {
        fault->lo = lo;
        fault->hi = hi;
        return -1;
    }
    uint16_t sb = 0, zb = 0;
    double best = INFINITY;
    for (int32_t m = 0; m < LS_QZ_OFFSET_CANDIDATES; m++) {
        const uint16_t zc = ls_qz_f16_down(lo + LS_QZ_OFFSET_STEP * m * (hi - lo));
        const double z = ls_qz_f16_value(zc);
        for (int32_t k = 0; k < LS_QZ_SPAN_CANDIDATES; k++) {
            const double x = ((hi - z) * (1 - LS_QZ_SPAN_STEP * k)) / 3;
            if (!(x <= LS_QZ_F16_MAX)) { /* cannot happen for a range within fp16; the reference checks it */
                fault->scale = x;
                return -1;
            }
            const uint16_t sc = ls_qz_f16_up(x);
            const double e = offset_error(w, group, ls_qz_f16_value(sc), z);
            if (e < best) {
                best = e;
                sb = sc;
                zb = zc;
            }
        }
    }
    *scale = sb;
    *zero = zb;
    const double s = ls_qz_f16_value(sb), z = ls_qz_f16_value(zb);
    for (int32_t i = 0; i < group; i++) codes[i] = (int8_t)offset_code(w[i], s, z);
    return 0;
}

int64_t ls_qz_int8(const float *w, int64_t n, int32_t group, uint16_t *scales, int8_t *codes, ls_qz_fault *fault) {
    for (int64_t g = 0; g < n; g++) {
        const float *wg = w + g * group;
        double amax = 0.0;
        for (int32_t i = 0; i < group && amax == amax; i++) {
            const double v = fabs((double)wg[i]);
            amax = v != v ? v : v > amax ? v : amax; /* Math.max: a NaN wins */
        }
        const double x = amax / 127;
        if (!(x <= LS_QZ_F16_MAX)) {
            fault->scale = x;
            return g;
        }
        scales[g] = ls_qz_f16_up(x);
        const double s = ls_qz_f16_value(scales[g]);
        int8_t *c = codes + g * group;
        for (int32_t i = 0; i < group; i++) c[i] = (int8_t)(s > 0.0 ? code_of(wg[i] / s, -127, 127) : 0.0);
    }
    return -1;
}

static int64_t symmetric_portable(const float *w, int64_t n, int32_t group, int32_t L, uint16_t *scales, int8_t *codes) {
    ls_qz_fault fault;
    for (int64_t g = 0; g < n; g++)
        if (ls_qz_symmetric_group(w + g * group, group, L, scales + g, codes + g * group, &fault) < 0) return g;
    return -1;
}

static int64_t offset_portable(const float *w, int64_t n, int32_t group, uint16_t *scales, uint16_t *zeros,
                               int8_t *codes) {
    ls_qz_fault fault;
    for (int64_t g = 0; g < n; g++)
        if (ls_qz_offset_group(w + g * group, group, scales + g, zeros + g, codes + g * group, &fault) < 0) return g;
    return -1;
}

static void to_f32_portable(float *out, const void *src, int32_t input, int64_t n) {
    if (input == LS_QUANTIZE_F32) {
        memcpy(out, src, (size_t)n * sizeof *out);
    } else if (input == LS_QUANTIZE_F16) {
        const uint16_t *h = src;
        for (int64_t i = 0; i < n; i++) out[i] = ls_f16_to_f32(h[i]);
    } else {
        const uint16_t *b = src;
        for (int64_t i = 0; i < n; i++) {
            const uint32_t bits = (uint32_t)b[i] << 16;
            memcpy(out + i, &bits, sizeof bits);
        }
    }
}

const ls_qz_ops ls_qz_ops_portable = {
    .simd = LS_SIMD_PORTABLE, .symmetric = symmetric_portable, .offset = offset_portable, .to_f32 = to_f32_portable,
};
