/*
 * ops_portable.c — plain C kernels: the reference path in tests, and the path
 * used on CPUs without AVX2/F16C.
 *
 * Dot product order (every (token, row) element, whatever T or row range):
 * eight lane accumulators, element i goes to lane i % 8 in increasing i, then
 * ((l0 + l4) + (l1 + l5)) + ((l2 + l6) + (l3 + l7)). The compiler may
 * vectorise the lanes; that cannot change the result (no -ffast-math, and
 * ISO C mode keeps a*b+c unfused).
 */
#include <math.h>
#include <string.h>

#include "cpu/kvcache.h"
#include "cpu/ops.h"
#include "internal.h"

#define LANES 8
#define KBLOCK 256 /* weights converted to fp32 this many at a time (multiple of LANES) */
#define TGROUP 4   /* tokens sharing one converted weight block */

/* Exact binary16 -> binary32 without a call per element: place exponent and
 * mantissa in the float's fields and rescale by 2^112 (exact for normals and
 * subnormals); inf/NaN keep their payload. Branch-free so that the block
 * loop below vectorises with baseline SSE2. */
typedef union {
    uint32_t u;
    float f;
} f32_bits; /* union punning: defined in C, unlike pointer casts */

static inline uint32_t h2f_bits(uint16_t h) {
    f32_bits v;
    uint32_t em = h & 0x7fffu;
    v.u = em << 13;
    v.f *= 0x1p112f;
    uint32_t special = (em << 13) | 0x7f800000u;
    uint32_t is_special = 0u - (uint32_t)(em >= 0x7c00u);
    return (v.u & ~is_special) | (special & is_special) | ((uint32_t)(h & 0x8000u) << 16);
}

static inline float h2f(uint16_t h) {
    f32_bits v = {h2f_bits(h)};
    return v.f;
}

/* n fp16 -> fp32; the constant-length body lets -O2 vectorise it */
static inline void h2f_block(f32_bits *dst, const uint16_t *src, int32_t n) {
    int32_t i = 0;
    for (; i + KBLOCK <= n; i += KBLOCK)
        for (int32_t j = 0; j < KBLOCK; j++) dst[i + j].u = h2f_bits(src[i + j]);
    for (; i < n; i++) dst[i].u = h2f_bits(src[i]);
}

static inline float lane_sum(const float *a) {
    return ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7]));
}

static void matmul_f16_portable(float *y, int32_t ldy, const float *x, int32_t ldx,
                                const uint16_t *w, int32_t in, int32_t T, int32_t o0, int32_t o1,
                                int32_t add) {
    f32_bits wf[KBLOCK];
    for (int32_t t0 = 0; t0 < T; t0 += TGROUP) {
        int32_t tn = T - t0 < TGROUP ? T - t0 : TGROUP;
        for (int32_t o = o0; o < o1; o++) {
            float acc[TGROUP][LANES];
            memset(acc, 0, sizeof acc);
            const uint16_t *wr = w + (size_t)o * (size_t)in;
            for (int32_t i0 = 0; i0 < in; i0 += KBLOCK) {
                int32_t len = in - i0 < KBLOCK ? in - i0 : KBLOCK;
                h2f_block(wf, wr + i0, len);
                for (int32_t t = 0; t < tn; t++) {
                    const float *xr = x + (size_t)(t0 + t) * (size_t)ldx + i0;
                    float *a = acc[t];
                    int32_t i = 0;
                    for (; i + LANES <= len; i += LANES)
                        for (int32_t j = 0; j < LANES; j++) a[j] += wf[i + j].f * xr[i + j];
                    for (int32_t j = 0; i + j < len; j++) a[j] += wf[i + j].f * xr[i + j];
                }
            }
            for (int32_t t = 0; t < tn; t++) {
                float s = lane_sum(acc[t]);
                float *yo = y + (size_t)(t0 + t) * (size_t)ldy + o;
                *yo = add ? *yo + s : s;
            }
        }
    }
}

static void attn_scores_portable(float *scores, const float *q, const uint16_t *kt, int32_t ldk,
                                 int32_t hd, int32_t n) {
    for (int32_t j = 0; j < n; j++) scores[j] = 0.0f;
    for (int32_t d = 0; d < hd; d++) {
        const uint16_t *row = kt + (size_t)d * (size_t)ldk;
        float qd = q[d];
        for (int32_t j = 0; j < n; j++) scores[j] += qd * h2f(row[j]);
    }
}

static void attn_values_portable(float *out, const float *p, const uint16_t *v, int32_t hd, int32_t n) {
    for (int32_t j = 0; j < n; j++) {
        const uint16_t *row = v + (size_t)j * (size_t)hd;
        float pj = p[j];
        for (int32_t d = 0; d < hd; d++) out[d] += pj * h2f(row[d]);
    }
}

// ---- quantized cache (ops.h attn_*_i8 / _i4; layouts in kvcache.h) ----

static void attn_scores_i8_portable(float *scores, const float *q, const int8_t *kt, int32_t ldq,
                                    const uint16_t *ks, int32_t hd, int32_t n) {
    for (int32_t j = 0; j < n; j++) scores[j] = 0.0f;
    for (int32_t d = 0; d < hd; d++) {
        const int8_t *row = kt + (size_t)d * (size_t)ldq;
        float qd = q[d];
        for (int32_t j = 0; j < n; j++) scores[j] += qd * (float)row[j];
    }
    for (int32_t j = 0; j < n; j++) scores[j] *= h2f(ks[j]);
}

static void attn_values_i8_portable(float *out, const float *p, const int8_t *v, const uint16_t *vs, int32_t hd,
                                    int32_t n) {
    for (int32_t j = 0; j < n; j++) {
        const int8_t *row = v + (size_t)j * (size_t)hd;
        float w = p[j] * h2f(vs[j]);
        for (int32_t d = 0; d < hd; d++) out[d] += w * (float)row[d];
    }
}

static void attn_scores_i4_portable(float *scores, const float *q, const uint8_t *kt, int32_t ldq,
                                    const uint16_t *kp, int32_t ldp, int32_t hd, int32_t n) {
    for (int32_t j = 0; j < n; j++) {
        float a = 0.0f;
        for (int32_t g0 = 0, g = 0; g0 < hd; g0 += LS_KV_GROUP, g++) {
            int32_t half = ((g0 + LS_KV_GROUP < hd ? g0 + LS_KV_GROUP : hd) - g0) / 2;
            float sg = h2f(kp[(size_t)(2 * g) * (size_t)ldp + j]), zg = h2f(kp[(size_t)(2 * g + 1) * (size_t)ldp + j]);
            const uint8_t *col = kt + (size_t)(g0 / 2) * (size_t)ldq + j;
            for (int32_t i = 0; i < half; i++, col += ldq) {
                uint8_t c = *col;
                a += q[g0 + i] * ((float)(c & 15) * sg + zg);
                a += q[g0 + half + i] * ((float)(c >> 4) * sg + zg);
            }
        }
        scores[j] = a;
    }
}

static void attn_values_i4_portable(float *out, const float *p, const uint8_t *v, const uint16_t *vp, int32_t hd,
                                    int32_t n) {
    int32_t nb = hd / 2, np = 2 * ((hd + LS_KV_GROUP - 1) / LS_KV_GROUP);
    for (int32_t j = 0; j < n; j++) {
        const uint8_t *row = v + (size_t)j * (size_t)nb;
        const uint16_t *par = vp + (size_t)j * (size_t)np;
        float w = p[j];
        for (int32_t g0 = 0, g = 0; g0 < hd; g0 += LS_KV_GROUP, g++) {
            int32_t half = ((g0 + LS_KV_GROUP < hd ? g0 + LS_KV_GROUP : hd) - g0) / 2;
            float sg = h2f(par[2 * g]), zg = h2f(par[2 * g + 1]);
            for (int32_t i = 0; i < half; i++) {
                uint8_t c = row[g0 / 2 + i];
                out[g0 + i] += w * ((float)(c & 15) * sg + zg);
                out[g0 + half + i] += w * ((float)(c >> 4) * sg + zg);
            }
        }
    }
}

static void rope_portable(float *x, int32_t n_heads, int32_t head_dim, const float *cs) {
    int32_t half = head_dim / 2;
    for (int32_t h = 0; h < n_heads; h++) {
        float *v = x + (size_t)h * head_dim;
        for (int32_t i = 0; i < half; i++) {
            float c = cs[2 * i], s = cs[2 * i + 1];
            float x0 = v[i], x1 = v[i + half];
            v[i] = x0 * c - x1 * s;
            v[i + half] = x1 * c + x0 * s;
        }
    }
}

static void rmsnorm_portable(float *out, const float *x, const float *w, int32_t n, float eps) {
    float acc[LANES] = {0};
    int32_t i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int32_t j = 0; j < LANES; j++) acc[j] += x[i + j] * x[i + j];
    for (int32_t j = 0; i + j < n; j++) acc[j] += x[i + j] * x[i + j];
    float scale = 1.0f / sqrtf(lane_sum(acc) / (float)n + eps);
    for (i = 0; i < n; i++) out[i] = x[i] * scale * w[i];
}

static void f16_to_f32_portable(float *dst, const uint16_t *src, int32_t n) {
    for (int32_t i = 0; i < n; i++) dst[i] = h2f(src[i]);
}

static void f32_to_f16_portable(uint16_t *dst, const float *src, int32_t n) {
    for (int32_t i = 0; i < n; i++) dst[i] = ls_f32_to_f16(src[i]);
}

const ls_ops ls_ops_portable = {
    .simd = LS_SIMD_PORTABLE,
    LS_OPS_ENTRIES(portable),
};
