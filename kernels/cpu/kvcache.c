/*
 * kvcache.c — key/value cache modes (loopserve.h LS_KV_*, layouts in
 * kvcache.h): row encoding, the Walsh-Hadamard rotation, and storing /
 * loading rows of a session's cache.
 *
 * Attention reads the codes directly (ops.h attn_*_i8 / attn_*_i4: each
 * value dequantized in registers, c * s (+ z) exactly as ls_kv_decode_row
 * computes it), so a quantized cache is never expanded anywhere.
 *
 * Every loop below has a fixed order and ISO C mode keeps a*b+c unfused, so
 * a row's codes and decoded values are a function of the row alone, the
 * same in every build of this file (test/reference/kvcache.ts is bit-exact).
 */
#include <math.h>
#include <string.h>

#include "kvcache.h"
#include "runtime.h"
#include "session_state.h"

// ---- rows ----

int32_t ls_kv_code_bytes(int32_t fmt, int32_t hd) {
    return fmt == LS_KV_INT8 ? hd : fmt == LS_KV_INT4 ? hd / 2 : 0;
}

int32_t ls_kv_param_count(int32_t fmt, int32_t hd) {
    return fmt == LS_KV_INT8 ? 1 : fmt == LS_KV_INT4 ? 2 * ((hd + LS_KV_GROUP - 1) / LS_KV_GROUP) : 0;
}

/* fp16 bits of a non-negative scale: finite, and not zero when f > 0 (a
 * row of tiny values keeps its codes instead of collapsing to 0). */
static uint16_t scale_bits(float f) {
    uint16_t b = ls_f32_to_f16(f);
    if (b >= 0x7c00u) b = 0x7bffu; /* overflow (or NaN): the largest finite scale */
    if (b == 0 && f > 0.0f) b = 1;
    return b;
}

/* roundf(y) (half away from zero) of y clamped to [lo, hi], NaN giving lo.
 * No libm call and no branch (a rounding branch mispredicts half the time):
 * y - trunc(y) is exact for |y| <= 127. */
static inline int32_t code_of(float y, float lo, float hi) {
    y = y >= lo ? y : lo;
    y = y <= hi ? y : hi;
    int32_t r = (int32_t)y;
    float frac = y - (float)r;
    return r + (frac >= 0.5f) - (frac <= -0.5f);
}

static void encode_int8(const float *x, int32_t n, int8_t *c, uint16_t *params) {
    float amax = 0.0f;
    for (int32_t i = 0; i < n; i++) {
        float a = fabsf(x[i]);
        if (a > amax) amax = a;
    }
    uint16_t sb = scale_bits(amax / 127.0f);
    float s = ls_f16_to_f32(sb);
    for (int32_t i = 0; i < n; i++) c[i] = (int8_t)(s > 0.0f ? code_of(x[i] / s, -127.0f, 127.0f) : 0);
    params[0] = sb;
}

static void encode_int4(const float *x, int32_t n, uint8_t *codes, uint16_t *params) {
    memset(codes, 0, (size_t)n / 2);
    for (int32_t g0 = 0, g = 0; g0 < n; g0 += LS_KV_GROUP, g++) {
        int32_t g1 = g0 + LS_KV_GROUP < n ? g0 + LS_KV_GROUP : n;
        float mn = INFINITY, mx = -INFINITY;
        for (int32_t i = g0; i < g1; i++) {
            if (x[i] < mn) mn = x[i];
            if (x[i] > mx) mx = x[i];
        }
        if (!(mn <= mx)) mn = mx = 0.0f; /* only NaNs */
        uint16_t zb = ls_f32_to_f16(mn);
        if ((zb & 0x7fffu) >= 0x7c00u) zb = (uint16_t)((zb & 0x8000u) | 0x7bffu);
        float z = ls_f16_to_f32(zb);
        float d = mx - z;
        if (!(d > 0.0f)) d = 0.0f;
        uint16_t sb = scale_bits(d / 15.0f);
        float s = ls_f16_to_f32(sb);
        int32_t half = (g1 - g0) / 2;
        for (int32_t i = g0; i < g1; i++) {
            int32_t c = s > 0.0f ? code_of((x[i] - z) / s, 0.0f, 15.0f) : 0;
            int32_t k = i - g0 < half ? i - g0 : i - g0 - half;
            codes[g0 / 2 + k] |= (uint8_t)(i - g0 < half ? c : c << 4);
        }
        params[2 * g] = sb;
        params[2 * g + 1] = zb;
    }
}

void ls_kv_encode_row(int32_t fmt, const float *x, int32_t hd, uint8_t *codes, uint16_t *params) {
    if (fmt == LS_KV_INT8) encode_int8(x, hd, (int8_t *)codes, params);
    else if (fmt == LS_KV_INT4) encode_int4(x, hd, codes, params);
}

void ls_kv_decode_row(int32_t fmt, const uint8_t *codes, const uint16_t *params, int32_t hd, float *out) {
    if (fmt == LS_KV_INT8) {
        float s = ls_f16_to_f32(params[0]);
        for (int32_t i = 0; i < hd; i++) out[i] = (float)(int8_t)codes[i] * s;
    } else if (fmt == LS_KV_INT4) {
        for (int32_t g0 = 0, g = 0; g0 < hd; g0 += LS_KV_GROUP, g++) {
            int32_t half = ((g0 + LS_KV_GROUP < hd ? g0 + LS_KV_GROUP : hd) - g0) / 2;
            float s = ls_f16_to_f32(params[2 * g]), z = ls_f16_to_f32(params[2 * g + 1]);
            for (int32_t i = 0; i < half; i++) {
                uint8_t b = codes[g0 / 2 + i];
                out[g0 + i] = (float)(b & 15) * s + z;
                out[g0 + half + i] = (float)(b >> 4) * s + z;
            }
        }
    }
}

void ls_kv_wht(float *x, int32_t n) {
    for (int32_t len = 1; len < n; len <<= 1)
        for (int32_t i = 0; i < n; i += 2 * len)
            for (int32_t j = i; j < i + len; j++) {
                float a = x[j], b = x[j + len];
                x[j] = a + b;
                x[j + len] = a - b;
            }
    float scale = (float)(1.0 / sqrt((double)n));
    for (int32_t i = 0; i < n; i++) x[i] *= scale;
}

// ---- session ----

static const char *format_name(int32_t fmt) {
    return fmt == LS_KV_INT8 ? "int8" : fmt == LS_KV_INT4 ? "int4" : "fp16";
}

int32_t ls_kv_check_mode(int32_t kv_mode, int32_t hd, char *err, int32_t err_len) {
    int32_t fmt = kv_mode & LS_KV_FORMAT_MASK;
    if ((kv_mode & ~(LS_KV_FORMAT_MASK | LS_KV_HADAMARD | LS_KV_FP16_QKV)) != 0 ||
        (fmt != LS_KV_FP16 && fmt != LS_KV_INT8 && fmt != LS_KV_INT4)) {
        ls_set_error(err, err_len,
                     "unknown kv_mode 0x%x (expected LS_KV_FP16, LS_KV_INT8 or LS_KV_INT4, optionally with "
                     "LS_KV_HADAMARD and LS_KV_FP16_QKV)",
                     (unsigned)kv_mode);
        return LS_ERR_ARG;
    }
    if ((kv_mode & LS_KV_FP16_QKV) && !(kv_mode & LS_KV_HADAMARD)) {
        ls_set_error(err, err_len,
                     "LS_KV_FP16_QKV (SERVICE_H_MODE_FP16_ATTN_QKV) only applies with LS_KV_HADAMARD "
                     "(SERVICE_KV_H_MODE)");
        return LS_ERR_ARG;
    }
    if ((kv_mode & LS_KV_HADAMARD) && (hd < 1 || (hd & (hd - 1)) != 0)) {
        ls_set_error(err, err_len,
                     "kv_cache_mode %s-h rotates each head by a Walsh-Hadamard transform, which needs a "
                     "power-of-two head_dim; this model's head_dim is %d (use kv_cache_mode %s)",
                     format_name(fmt), hd, format_name(fmt));
        return LS_ERR_ARG;
    }
    return LS_OK;
}

static void round_to_f16(float *x, int32_t n) {
    for (int32_t i = 0; i < n; i++) x[i] = ls_f16_to_f32(ls_f32_to_f16(x[i]));
}

void ls_kv_store(ls_session *s, int32_t unit, int32_t kvh, int32_t slot, int32_t n, float *k, float *v, size_t ld,
                 int32_t thread) {
    const ls_model_info *mi = &s->m->info;
    const ls_ops *ops = s->m->rt->ops;
    int32_t hd = mi->head_dim, rows = s->rows;
    size_t head = (size_t)ls_unit_slot(s, unit) * mi->n_kv_heads + kvh;
    if (s->kv_mode & LS_KV_HADAMARD)
        for (int32_t t = 0; t < n; t++) {
            float *kr = k + (size_t)t * ld, *vr = v + (size_t)t * ld;
            if (s->kv_mode & LS_KV_FP16_QKV) {
                round_to_f16(kr, hd);
                round_to_f16(vr, hd);
            }
            ls_kv_wht(kr, hd);
            ls_kv_wht(vr, hd);
        }
    if (s->kv_fmt == LS_KV_FP16) {
        /* keys transposed, (hd, ldk) per head: the run's keys go to fp16 rows
         * of a staging tile, then each dimension's n positions are written
         * side by side, so every cache line is filled by one pass instead of
         * one element per row */
        uint16_t *tile = s->k16 + (size_t)thread * LS_KV_STORE_ROWS * hd;
        for (int32_t t = 0; t < n; t++) {
            ops->f32_to_f16(tile + (size_t)t * hd, k + (size_t)t * ld, hd);
            ops->f32_to_f16(s->vc + (head * rows + slot + t) * hd, v + (size_t)t * ld, hd);
        }
        uint16_t *kt = s->kc + head * hd * (size_t)s->ldk + slot;
        for (int32_t d = 0; d < hd; d++) {
            uint16_t *col = kt + (size_t)d * s->ldk;
            for (int32_t t = 0; t < n; t++) col[t] = tile[(size_t)t * hd + d];
        }
        return;
    }
    int32_t nb = s->kv_nb, np = s->kv_np;
    uint8_t *codes = s->kv_codes + (size_t)thread * hd;
    uint16_t *params = s->kv_params + (size_t)thread * np;
    for (int32_t t = 0; t < n; t++) {
        int32_t row = slot + t;
        ls_kv_encode_row(s->kv_fmt, k + (size_t)t * ld, hd, codes, params);
        uint8_t *kq = s->kq + head * nb * (size_t)s->ldq + row;
        for (int32_t b = 0; b < nb; b++) kq[(size_t)b * s->ldq] = codes[b];
        uint16_t *kp = s->kp + head * np * (size_t)rows + row;
        for (int32_t r = 0; r < np; r++) kp[(size_t)r * rows] = params[r];
        ls_kv_encode_row(s->kv_fmt, v + (size_t)t * ld, hd, s->vq + (head * rows + row) * nb,
                         s->vp + (head * rows + row) * np);
    }
}

void ls_kv_copy_row(ls_session *dst, int32_t lt, int32_t to, const ls_session *src, int32_t lf, int32_t from) {
    const ls_model_info *mi = &dst->m->info;
    size_t hd = (size_t)mi->head_dim, nkv = (size_t)mi->n_kv_heads;
    size_t ds = (size_t)to, ss = (size_t)from;
    for (size_t h = 0; h < nkv; h++) {
        size_t head = (size_t)ls_unit_slot(dst, lt) * nkv + h, shead = (size_t)ls_unit_slot(src, lf) * nkv + h;
        if (dst->kv_fmt == LS_KV_FP16) {
            const uint16_t *sk = src->kc + shead * hd * (size_t)src->ldk;
            uint16_t *dk = dst->kc + head * hd * (size_t)dst->ldk;
            for (size_t d = 0; d < hd; d++) dk[d * (size_t)dst->ldk + ds] = sk[d * (size_t)src->ldk + ss];
            memcpy(dst->vc + (head * dst->rows + ds) * hd, src->vc + (shead * src->rows + ss) * hd, hd * sizeof *dst->vc);
            continue;
        }
        size_t nb = (size_t)dst->kv_nb, np = (size_t)dst->kv_np;
        const uint8_t *sq = src->kq + shead * nb * (size_t)src->ldq;
        uint8_t *dq = dst->kq + head * nb * (size_t)dst->ldq;
        for (size_t b = 0; b < nb; b++) dq[b * (size_t)dst->ldq + ds] = sq[b * (size_t)src->ldq + ss];
        const uint16_t *sp = src->kp + shead * np * (size_t)src->rows;
        uint16_t *dp = dst->kp + head * np * (size_t)dst->rows;
        for (size_t r = 0; r < np; r++) dp[r * (size_t)dst->rows + ds] = sp[r * (size_t)src->rows + ss];
        memcpy(dst->vq + (head * dst->rows + ds) * nb, src->vq + (shead * src->rows + ss) * nb, nb);
        memcpy(dst->vp + (head * dst->rows + ds) * np, src->vp + (shead * src->rows + ss) * np, np * sizeof *dst->vp);
    }
}
