/*
 * quant_portable.c — quantized matmul in plain C (the reference path in
 * tests), the activation quantizer every path shares, and the dispatch
 * (ls_quant_prepare / ls_quant_matmul) forward.c calls.
 *
 * The arithmetic is spelled out at the top of quant.h; this file is its
 * most literal implementation: codes unpacked one by one, natural order.
 */
#include <math.h>
#include <stdio.h>

#include "quant.h"
#include "sizes.h" /* LS_CHUNK: the most rows a matmul call carries */

_Static_assert(LS_CHUNK <= 64, "model.c sizes the activation scratch for LS_CHUNK rows");

// ---- activations ----

/* Round to nearest, ties to even, for |v| < 2^22: adding 1.5 * 2^23 leaves
 * no fraction bits, so the fp32 addition itself rounds (default rounding
 * mode, as cvtps2dq uses); the subtraction is exact. Same result as
 * nearbyintf, but a loop of it vectorises. */
static inline float round_even(float v) { return (v + 12582912.0f) - 12582912.0f; }

void ls_quant_rows(ls_qact *a, const float *x, int32_t ldx, int32_t t0, int32_t t1, int32_t in, int32_t group) {
    int32_t ng = in / group;
    int32_t padded = (in + LS_QACT_PAD - 1) / LS_QACT_PAD * LS_QACT_PAD;
    for (int32_t t = t0; t < t1; t++) {
        const float *xr = x + (size_t)t * (size_t)ldx;
        int8_t *qr = a->q + (size_t)t * (size_t)a->ld;
        int32_t *qs = a->qsum + (size_t)t * (size_t)a->gld;
        float amax = 0.0f;
        for (int32_t i = 0; i < in; i++) {
            float v = fabsf(xr[i]);
            amax = v > amax ? v : amax; /* a NaN is skipped, as maxps skips it */
        }
        float id = amax > 0.0f ? 127.0f / amax : 0.0f;
        a->d[t] = amax / 127.0f;
        // |x * id| <= 127 up to rounding.
        for (int32_t i = 0; i < in; i++) {
            float r = round_even(xr[i] * id);
            r = r > 127.0f ? 127.0f : r < -127.0f ? -127.0f : r == r ? r : 0.0f; /* NaN -> 0 */
            qr[i] = (int8_t)r;
        }
        memset(qr + in, 0, (size_t)(padded - in));
        for (int32_t g = 0; g < ng; g++) {
            int32_t sum = 0;
            for (int32_t i = g * group; i < (g + 1) * group; i++) sum += qr[i];
            qs[g] = sum;
        }
        for (int32_t g = ng; g < a->gld; g++) qs[g] = 0;
    }
}

static void quantize_portable(ls_qact *a, const float *x, int32_t ldx, int32_t T, int32_t t0, int32_t t1,
                              const ls_qmat *w) {
    (void)T; /* one form whatever the call's size */
    ls_quant_rows(a, x, ldx, t0, t1, w->in, w->group);
}

// ---- matmul ----

/* The canonical final sum of the eight group lanes (quant.h). */
static inline float lane_sum(const float *a) {
    return ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]));
}

static void matmul_portable(float *y, int32_t ldy, const ls_qact *a, const ls_qmat *w, int32_t o0,
                            int32_t o1, int32_t add) {
    const int32_t in = w->in, G = w->group, ng = in / G, bits = w->bits, T = a->T;
    const size_t row_bytes = (size_t)in * (size_t)bits / 8;
    int32_t c[LS_QUANT_GROUP_MAX];
    float acc[64][8]; /* (T, lanes); T <= LS_CHUNK */
    for (int32_t o = o0; o < o1; o++) {
        const uint8_t *row = w->qweight + (size_t)o * row_bytes;
        const uint16_t *sr = w->scales + (size_t)o * (size_t)ng;
        const uint16_t *zr = w->zeros ? w->zeros + (size_t)o * (size_t)ng : NULL;
        memset(acc, 0, (size_t)T * sizeof acc[0]);
        for (int32_t g = 0; g < ng; g++) {
            for (int32_t i = 0; i < G; i++) c[i] = ls_quant_code(row, in, g * G + i, bits);
            float s = ls_f16_to_f32(sr[g]);
            float z = zr ? ls_f16_to_f32(zr[g]) : 0.0f;
            for (int32_t t = 0; t < T; t++) {
                const int8_t *q = a->q + (size_t)t * (size_t)a->ld + (size_t)g * (size_t)G;
                int32_t isum = 0;
                for (int32_t i = 0; i < G; i++) isum += c[i] * q[i];
                float *lane = &acc[t][g & 7];
                if (bits == 2) *lane = fmaf((float)a->qsum[(size_t)t * (size_t)a->gld + (size_t)g], z, *lane);
                *lane = fmaf((float)isum, s, *lane);
            }
        }
        for (int32_t t = 0; t < T; t++) {
            float r = lane_sum(acc[t]) * a->d[t];
            float *yo = y + (size_t)t * (size_t)ldy + o;
            *yo = add ? *yo + r : r;
        }
    }
}

static void dot_u2_portable(int32_t *isum, const uint8_t *codes, int32_t ldb, const int8_t *x, int32_t r0,
                            int32_t r1) {
    for (int32_t r = r0; r < r1; r++) {
        const uint8_t *w = codes + (size_t)r * ldb;
        int32_t acc = 0;
        for (int32_t b = 0; b < ldb; b += 64)
            for (int32_t f = 0; f < 4; f++)
                for (int32_t j = 0; j < 64; j++) acc += (int32_t)((w[b + j] >> (2 * f)) & 3) * x[4 * b + 64 * f + j];
        isum[r] = acc;
    }
}

/* quantize writes natural order for every matrix. */
static int32_t act_form_portable(const ls_qmat *w, int32_t T) {
    (void)w;
    (void)T;
    return 0;
}

LS_QOPS_TABLE(portable, LS_SIMD_PORTABLE, act_form_portable, NULL);

// ---- dispatch ----

const ls_qops *ls_quant_ops_select(int32_t simd) {
    __builtin_cpu_init();
    switch (simd) {
    case LS_SIMD_AVX512:
        // vpdpbusd is what makes the AVX-512 path worth having; without VNNI
        // the AVX2 kernels (same bits) are as good.
        return __builtin_cpu_supports("avx512vnni") ? &ls_qops_avx512 : &ls_qops_avx2;
    case LS_SIMD_AVX2: return &ls_qops_avx2;
    default: return &ls_qops_portable;
    }
}

void ls_quant_setup(ls_qact *a) {
    // Without memory for its packed copies a path gives way to one with
    // smaller copies (AVX-512 keeps wide and narrow ones, AVX2 narrow ones
    // only), and AVX2 to the portable kernels on the weights as stored: the
    // same bits on every path.
    const ls_qops *ops = ls_quant_ops_select(a->simd);
    for (int32_t i = 0; ops->pack && i < a->n_mats; i++) {
        if (ops->pack(&a->mats[i]) == 0) continue;
        ls_qact_unpack(a, i);
        ops = ops == &ls_qops_avx512 ? &ls_qops_avx2 : &ls_qops_portable;
        i = -1; /* every matrix again, for the next path */
    }
    a->ops = ops;
}

/* Records a call of T rows of w's inputs in a. */
static void begin_in(ls_qact *a, const ls_qmat *w, int32_t T) {
    if (T > a->max_T || w->in > a->max_in) {
        // model.c sizes the scratch for LS_CHUNK rows of the widest input.
        fprintf(stderr, "loopserve: quantized matmul of %d rows x %d inputs exceeds the scratch (%d x %d)\n",
                T, w->in, a->max_T, a->max_in);
        abort();
    }
    ls_quant_shape(a, T, w->in, w->group, w->bits);
}

void ls_quant_begin(const ls_qmat *w, int32_t T) { begin_in(w->act, w, T); }

void ls_quant_prepare_rows(const ls_qmat *w, const float *x, int32_t ldx, int32_t t0, int32_t t1) {
    ls_qact *a = w->act;
    a->ops->quantize(a, x, ldx, a->T, t0, t1, w);
}

void ls_quant_prepare_in(ls_qact *a, const ls_qmat *w, const float *x, int32_t ldx, int32_t T) {
    begin_in(a, w, T);
    a->ops->quantize(a, x, ldx, T, 0, T, w);
}

void ls_quant_prepare(const ls_qmat *w, const float *x, int32_t ldx, int32_t T) {
    ls_quant_prepare_in(w->act, w, x, ldx, T);
}

void ls_quant_matmul_in(const ls_qact *a, const ls_qmat *w, float *y, int32_t ldy, int32_t o0, int32_t o1,
                        int32_t add) {
    if (o0 < o1) a->ops->matmul(y, ldy, a, w, o0, o1, add);
}

void ls_quant_matmul(const ls_qmat *w, float *y, int32_t ldy, int32_t o0, int32_t o1, int32_t add) {
    ls_quant_matmul_in(w->act, w, y, ldy, o0, o1, add);
}
