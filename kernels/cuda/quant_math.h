/*
 * quant_math.h — the arithmetic of the CUDA library's quantized matmuls
 * (int4 / int2 block matrices, int8 / int6 / int4 heads; packing in
 * loopserve.h, the computation in kernels/quant.h), written once for the
 * device and the host. Plain C11 as well as CUDA C++: the device kernels
 * (quant.cu) call these functions, and so do two host programs that hold
 * them to the CPU library in halves:
 *   - the CPU harness (bench/gpu/harness/quant.c, run in CI) runs them on the
 *     host against the CPU library's own kernels (quant.h), bit for bit,
 *     and checks the warp schedule's index math exhaustively;
 *   - the CUDA library's self-test (selftest.cu, run by the
 *     validation script on a GPU) runs the device kernels against the host
 *     execution of these functions, bit for bit.
 *
 * The computation (quant.h): an activation row is quantized to int8 codes
 * q with one fp32 scale d; each group of G inputs of a weight row gives an
 * exact integer sum isum = sum q * c (and qsum = sum q for int2); groups
 * are folded in increasing order into eight fp32 accumulators, group g into
 * acc[g % 8], by fused multiply-adds; the eight are summed in one fixed
 * tree and multiplied by d. Integer sums are exact in any order, so the
 * device forms them in its own (dp4a over 4-byte words); every fp32 step
 * is pinned to a correctly rounded operation (lsq_fma, lsq_mul, ...), so
 * that neither compiler may fuse or reorder differently.
 *
 * The warp schedule (a row of `in` inputs, one warp, quant.cu): the row is
 * cut into units of LSQ_UNIT inputs; in round r lane l takes unit
 * 32 r + l, so a group is G / 32 adjacent lanes, whose unit sums add up to
 * the group's (exact). Lane k < 8 owns acc[k] and, in each round, fetches
 * from the lanes holding them the groups g with g % 8 == k, in increasing g
 * (lsq_chain_*). The host reference (lsq_row_ref) runs the groups in plain
 * order; the harness proves the chain visits exactly that order.
 */
#ifndef LS_CUDA_QUANT_MATH_H
#define LS_CUDA_QUANT_MATH_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif
#include "internal.h" /* ls_f16_to_f32 on the host */
#ifdef __cplusplus
}
#endif

#if defined(__CUDACC__)
#include <cuda_fp16.h>
#define LSQ_FN static __host__ __device__ __forceinline__
#else
#define LSQ_FN static inline
#endif

#define LSQ_UNIT 32  /* inputs a lane takes per round: the smallest group */
#define LSQ_WARP 32  /* lanes per row */
#define LSQ_ACCS 8   /* fp32 accumulators per row (quant.h acc[g % 8]) */
#define LSQ_WORDS 8  /* 4-byte words of activation codes per unit */
#define LSQ_ROUND_INPUTS (LSQ_UNIT * LSQ_WARP)

// ---- correctly rounded fp32 steps, the same on both sides ----

LSQ_FN float lsq_fma(float a, float b, float c) {
#ifdef __CUDA_ARCH__
    return __fmaf_rn(a, b, c);
#else
    return fmaf(a, b, c);
#endif
}
LSQ_FN float lsq_mul(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fmul_rn(a, b);
#else
    return a * b;
#endif
}
LSQ_FN float lsq_add(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fadd_rn(a, b);
#else
    return a + b;
#endif
}
LSQ_FN float lsq_div(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fdiv_rn(a, b);
#else
    return a / b;
#endif
}
LSQ_FN float lsq_f16(uint16_t h) {
#ifdef __CUDA_ARCH__
    return __half2float(__ushort_as_half(h));
#else
    return ls_f16_to_f32(h);
#endif
}

// ---- integer steps: the device's instructions, spelled out for the host ----

/* acc + the dot product of the four signed bytes of a and of b. */
LSQ_FN int32_t lsq_dp4a(uint32_t a, uint32_t b, int32_t acc) {
#ifdef __CUDA_ARCH__
    return __dp4a((int)a, (int)b, acc);
#else
    for (int k = 0; k < 4; k++) acc += (int32_t)(int8_t)(a >> (8 * k)) * (int32_t)(int8_t)(b >> (8 * k));
    return acc;
#endif
}

/* Byte n of the result is byte (s >> 4n) & 7 of the eight bytes x, y. */
LSQ_FN uint32_t lsq_byte_perm(uint32_t x, uint32_t y, uint32_t s) {
#ifdef __CUDA_ARCH__
    return __byte_perm(x, y, s);
#else
    uint64_t xy = (uint64_t)x | ((uint64_t)y << 32);
    uint32_t r = 0;
    for (int n = 0; n < 4; n++) r |= (uint32_t)((xy >> (8 * ((s >> (4 * n)) & 7))) & 0xff) << (8 * n);
    return r;
#endif
}

/* n little-endian words from p (16-byte aligned when n is 4 or 8, 8-byte when 2). */
LSQ_FN void lsq_load_words(uint32_t *w, const uint8_t *p, int n) {
#ifdef __CUDA_ARCH__
    if (n == 2) {
        uint2 v = __ldg(reinterpret_cast<const uint2 *>(p));
        w[0] = v.x;
        w[1] = v.y;
        return;
    }
    for (int i = 0; i < n; i += 4) {
        uint4 v = __ldg(reinterpret_cast<const uint4 *>(p + 4 * i));
        w[i] = v.x;
        w[i + 1] = v.y;
        w[i + 2] = v.z;
        w[i + 3] = v.w;
    }
#else
    memcpy(w, p, 4 * (size_t)n);
#endif
}

/* A quantized matrix as the kernels read it (device or host memory). */
typedef struct {
    const uint8_t *qweight;
    const uint16_t *scales, *zeros; /* zeros: int2 only, else NULL */
    int32_t rows, in, group, bits;
} lsq_matrix;

// ---- activations (ls_quant_rows) ----

/* The running amax after x: |x| when larger, NaN skipped. Over non-NaN
 * values the result is their maximum, whatever the order of the steps. */
LSQ_FN float lsq_amax_step(float amax, float x) {
    float v = fabsf(x);
    return v > amax ? v : amax;
}

/* The row scale d (x ~ d q) and the multiplier that makes codes. */
LSQ_FN void lsq_row_scale(float amax, float *d, float *inv) {
    *inv = amax > 0.0f ? lsq_div(127.0f, amax) : 0.0f;
    *d = lsq_div(amax, 127.0f);
}

/* x's code: round to nearest even (the fp32 addition of 1.5 * 2^23 rounds),
 * clamped to [-127, 127], NaN to 0. */
LSQ_FN int32_t lsq_act_code(float x, float inv) {
    float r = lsq_add(lsq_add(lsq_mul(x, inv), 12582912.0f), -12582912.0f);
    r = r > 127.0f ? 127.0f : r < -127.0f ? -127.0f : r == r ? r : 0.0f;
    return (int32_t)r;
}

// ---- weights ----

/* Bytes per stored row of `in` inputs at `bits` per code. */
LSQ_FN int64_t lsq_row_bytes(int32_t in, int32_t bits) { return (int64_t)in * bits / 8; }

/* Code of input i of a stored row (quant.h ls_quant_code): the signed c
 * for int8, int6 and int4, the 0..3 code for int2. */
LSQ_FN int32_t lsq_code(const uint8_t *row, int32_t in, int32_t i, int32_t bits) {
    switch (bits) {
    case 8: return (int8_t)row[i];
    case 4: return (int32_t)((row[i >> 1] >> (4 * (i & 1))) & 15) - 8;
    case 2: return (row[i >> 2] >> (2 * (i & 3))) & 3;
    default: {
        const int32_t j = (i & 63) >> 1;
        const int32_t hi = (row[in / 2 + 16 * (i >> 6) + (j & 15)] >> (4 * (j >> 4) + 2 * (i & 1))) & 3;
        return (int32_t)(((row[i >> 1] >> (4 * (i & 1))) & 15) | (hi << 4)) - 32;
    }
    }
}

/* What the unsigned code u of a format is offset by: c = u - offset. */
LSQ_FN int32_t lsq_code_offset(int32_t bits) { return bits == 4 ? 8 : bits == 6 ? 32 : 0; }

/* Two words of nibble-pair bytes (lo holds inputs 0, 2, 4, 6 of eight,
 * hi inputs 1, 3, 5, 7) as the two words of those inputs in order. */
LSQ_FN void lsq_interleave(uint32_t lo, uint32_t hi, uint32_t *first, uint32_t *second) {
    *first = lsq_byte_perm(lo, hi, 0x5140);
    *second = lsq_byte_perm(lo, hi, 0x7362);
}

/* Unit u's codes of a stored row as LSQ_WORDS words of bytes in input
 * order: the unsigned codes u = c + lsq_code_offset(bits) (int8: c itself,
 * two's complement). */
LSQ_FN void lsq_unit_codes(uint32_t *cw, const uint8_t *row, int32_t in, int32_t u, int32_t bits) {
    switch (bits) {
    case 8: lsq_load_words(cw, row + (int64_t)LSQ_UNIT * u, 8); return;
    case 2: {
        uint32_t w[2];
        lsq_load_words(w, row + (int64_t)(LSQ_UNIT / 4) * u, 2);
        for (int m = 0; m < 2; m++) {
            /* f[k] byte i: bits 2k of byte i, the code of input 4 i + k */
            uint32_t f[4];
            for (int k = 0; k < 4; k++) f[k] = (w[m] >> (2 * k)) & 0x03030303u;
            uint32_t a01 = lsq_byte_perm(f[0], f[1], 0x5140), a23 = lsq_byte_perm(f[2], f[3], 0x5140);
            uint32_t b01 = lsq_byte_perm(f[0], f[1], 0x7362), b23 = lsq_byte_perm(f[2], f[3], 0x7362);
            cw[4 * m] = lsq_byte_perm(a01, a23, 0x5410);
            cw[4 * m + 1] = lsq_byte_perm(a01, a23, 0x7632);
            cw[4 * m + 2] = lsq_byte_perm(b01, b23, 0x5410);
            cw[4 * m + 3] = lsq_byte_perm(b01, b23, 0x7632);
        }
        return;
    }
    default: { /* 4, and 6: the nibbles, then (6) the high two bits of each code */
        uint32_t nib[4], hib[4] = {0, 0, 0, 0};
        lsq_load_words(nib, row + (int64_t)(LSQ_UNIT / 2) * u, 4);
        const int shift = 4 * (u & 1); /* a 16-byte block of high bits serves units 2b and 2b + 1 */
        if (bits == 6) lsq_load_words(hib, row + in / 2 + 16 * (int64_t)(u >> 1), 4);
        for (int m = 0; m < 4; m++) {
            uint32_t lo = nib[m] & 0x0f0f0f0fu, hi = (nib[m] >> 4) & 0x0f0f0f0fu;
            if (bits == 6) {
                uint32_t h = hib[m] >> shift;
                lo |= (h & 0x03030303u) << 4;
                hi |= ((h >> 2) & 0x03030303u) << 4;
            }
            lsq_interleave(lo, hi, &cw[2 * m], &cw[2 * m + 1]);
        }
        return;
    }
    }
}

/* The unit's exact sums against activation words qw: sum q * c (returned)
 * and sum q (*qsum). */
LSQ_FN int32_t lsq_unit_isum(const uint32_t *cw, const uint32_t *qw, int32_t bits, int32_t *qsum) {
    int32_t dot = 0, qs = 0;
    for (int k = 0; k < LSQ_WORDS; k++) {
        dot = lsq_dp4a(cw[k], qw[k], dot);
        qs = lsq_dp4a(0x01010101u, qw[k], qs);
    }
    *qsum = qs;
    return dot - lsq_code_offset(bits) * qs;
}

// ---- the fp32 fold (quant.h) ----

/* One group folded into its accumulator: the offset term (int2), then the scale term. */
LSQ_FN float lsq_group_step(float acc, int32_t isum, int32_t qsum, float s, float z, int32_t bits) {
    if (bits == 2) acc = lsq_fma((float)qsum, z, acc);
    return lsq_fma((float)isum, s, acc);
}

/* The row's output from its eight accumulators and its activation scale;
 * added to prev when add is set. */
LSQ_FN float lsq_finish(const float *a, float d, float prev, int add) {
    float sum = lsq_add(lsq_add(lsq_add(a[0], a[4]), lsq_add(a[2], a[6])), lsq_add(lsq_add(a[1], a[5]), lsq_add(a[3], a[7])));
    float r = lsq_mul(sum, d);
    return add ? lsq_add(prev, r) : r;
}

// ---- the warp schedule ----

/* Lanes per group. */
LSQ_FN int32_t lsq_group_lanes(int32_t group) { return group / LSQ_UNIT; }
/* Groups per round. */
LSQ_FN int32_t lsq_round_groups(int32_t group) { return LSQ_ROUND_INPUTS / group; }
/* Rounds of a row of in inputs. */
LSQ_FN int32_t lsq_rounds(int32_t in) { return (in + LSQ_ROUND_INPUTS - 1) / LSQ_ROUND_INPUTS; }
/* Steps of a round's chain: how many groups of one residue mod 8 a round can hold. */
LSQ_FN int32_t lsq_chain_steps(int32_t group) {
    int32_t n = lsq_round_groups(group) / LSQ_ACCS;
    return n > 0 ? n : 1;
}
/* The group accumulator k takes at step s of round r: the next one with
 * g % 8 == k among the round's groups; -1 when the round holds none there
 * (or the row has ended: ng groups). */
LSQ_FN int32_t lsq_chain_group(int32_t r, int32_t s, int32_t k, int32_t group, int32_t ng) {
    int32_t n = lsq_round_groups(group), base = r * n;
    int32_t g = base - base % LSQ_ACCS + LSQ_ACCS * s + k;
    return g >= base && g < base + n && g < ng ? g : -1;
}
/* The lane holding group g's sums in its round (the first of its lanes). */
LSQ_FN int32_t lsq_chain_lane(int32_t g, int32_t group) {
    return (g % lsq_round_groups(group)) * lsq_group_lanes(group);
}

// ---- host reference (host code only) ----

/* Activation row x (in inputs) quantized: codes q (in bytes) and scale d,
 * exactly as ls_quant_rows makes them. */
static inline void lsq_quantize_row_ref(int8_t *q, float *d, const float *x, int32_t in) {
    float amax = 0.0f, inv;
    for (int32_t i = 0; i < in; i++) amax = lsq_amax_step(amax, x[i]);
    lsq_row_scale(amax, d, &inv);
    for (int32_t i = 0; i < in; i++) q[i] = (int8_t)lsq_act_code(x[i], inv);
}

/* Row o of w times the activation row (q, d), through the unit functions
 * the device runs, groups folded in plain increasing order. */
static inline float lsq_row_ref(const lsq_matrix *w, int32_t o, const int8_t *q, float d, float prev, int add) {
    const int32_t G = w->group, ng = w->in / G, units_per_group = G / LSQ_UNIT;
    const uint8_t *row = w->qweight + (int64_t)o * lsq_row_bytes(w->in, w->bits);
    float acc[LSQ_ACCS] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int32_t g = 0; g < ng; g++) {
        int32_t isum = 0, qsum = 0;
        for (int32_t u = g * units_per_group; u < (g + 1) * units_per_group; u++) {
            uint32_t cw[LSQ_WORDS], qw[LSQ_WORDS];
            lsq_unit_codes(cw, row, w->in, u, w->bits);
            memcpy(qw, q + (int64_t)LSQ_UNIT * u, sizeof qw);
            int32_t qs;
            isum += lsq_unit_isum(cw, qw, w->bits, &qs);
            qsum += qs;
        }
        float s = lsq_f16(w->scales[(int64_t)o * ng + g]);
        float z = w->zeros ? lsq_f16(w->zeros[(int64_t)o * ng + g]) : 0.0f;
        acc[g % LSQ_ACCS] = lsq_group_step(acc[g % LSQ_ACCS], isum, qsum, s, z, w->bits);
    }
    return lsq_finish(acc, d, prev, add);
}

#endif
