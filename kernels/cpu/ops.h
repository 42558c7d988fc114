/*
 * ops.h — the per-SIMD-path kernel table.
 *
 * One table per path (portable, AVX2, AVX-512), picked once in
 * ls_runtime_init. Only ops_avx2.c / ops_avx512.c contain those
 * instructions; nothing else may call into them before the CPU check.
 *
 * Batch invariance (docs/kernels.md) is a property of every kernel here: the
 * value of one output element is computed by the same sequence of operations
 * whatever T, the row range [o0, o1) it is part of, or the thread running it.
 * In matmul_f16 each (token, row) dot product walks the inputs in the same
 * blocks, into the same accumulators, and ends with the same horizontal sum;
 * tiles of several rows x several tokens only reuse loaded registers.
 * Paths differ from each other (FMA vs separate multiply-add) but each is
 * invariant on its own.
 */
#ifndef LS_OPS_H
#define LS_OPS_H

#include <stdint.h>

/* Prefill queries attended together, one head at a time (attention.c): the
 * multi-query kernels below load each cache row once for all of them. */
#define LS_ATT_GROUP 4

typedef struct ls_ops {
    int32_t simd; /* LS_SIMD_* */

    /* y[t*ldy + o] (+)= sum_i w[o*in + i] * x[t*ldx + i]
     * for t in [0, T), o in [o0, o1). w fp16 row-major (rows, in); x, y fp32.
     * add != 0: the dot product is computed first, then added to y (used for
     * the residual stream, h += attn·Wo). */
    void (*matmul_f16)(float *y, int32_t ldy, const float *x, int32_t ldx, const uint16_t *w,
                       int32_t in, int32_t T, int32_t o0, int32_t o1, int32_t add);

    /* Attention for one (token, head) over n cached positions.
     * scores[j] = sum_d q[d] * kt[d*ldk + j], d increasing, for j in [0, n):
     * keys are cached dimension-major (head_dim, cap) so that a vector of
     * lanes holds consecutive positions and no horizontal sum is needed. */
    void (*attn_scores)(float *scores, const float *q, const uint16_t *kt, int32_t ldk, int32_t hd,
                        int32_t n);
    /* out[d] += sum_j p[j] * v[j*hd + d], one running sum per d, j increasing
     * (values cached position-major (cap, head_dim)). Calling it on two
     * consecutive ranges equals one call on their union. */
    void (*attn_values)(float *out, const float *p, const uint16_t *v, int32_t hd, int32_t n);

    /* Several queries (G <= LS_ATT_GROUP) of one head over the same n positions, for
     * prefill: bit-identical to G calls of attn_scores / attn_values (each
     * query's arithmetic unchanged, loaded cache rows shared). NULL: the
     * caller makes the G one-query calls. */
    void (*attn_scores_mq)(float *const *scores, const float *const *q, const uint16_t *kt, int32_t ldk,
                           int32_t hd, int32_t n, int32_t G);
    void (*attn_values_mq)(float *const *out, const float *const *p, const uint16_t *v, int32_t hd, int32_t n,
                           int32_t G);

    /* Softmax numerators of one attention row, in place: c[i] = exp(c[i] *
     * scale - max), max over the scaled row; returns their sum. Fixed order
     * for a given n (whoever calls it), so every caller of one path agrees.
     * NULL: attention.c's scalar loop (expf, sum in index order). */
    float (*softmax_exp)(float *c, int32_t n, float scale);

    /* SwiGLU epilogue, in place: g[i] = silu(g[i]) * u[i]. Elementwise, so
     * the same for any split of the rows. NULL: forward.c's scalar loop
     * (g / (1 + expf(-g)) * u). */
    void (*swiglu)(float *g, const float *u, int32_t n);

    /* Attention over a quantized cache (kvcache.h layouts, loopserve.h
     * LS_KV_* formats). Values are dequantized in registers exactly as
     * ls_kv_decode_row does (c * s, or c * s + z: the product is exact in
     * fp32, so one rounding, FMA or not); s, z are fp16 parameters. Same
     * contract as attn_scores / attn_values: each score is its position's
     * alone, and values over two consecutive ranges equal one call over their
     * union. AVX paths fuse multiply-adds, as in the fp16 kernels.
     *
     * int8 keys, codes kt (hd, ldq), scales ks (n):
     *   scores[j] = (sum_d q[d] * kt[d*ldq + j], d increasing) * s(ks[j]).
     * int8 values, codes v (n, hd), scales vs (n):
     *   out[d] += (p[j] * s(vs[j])) * v[j*hd + d], j increasing. */
    void (*attn_scores_i8)(float *scores, const float *q, const int8_t *kt, int32_t ldq, const uint16_t *ks,
                           int32_t hd, int32_t n);
    void (*attn_values_i8)(float *out, const float *p, const int8_t *v, const uint16_t *vs, int32_t hd, int32_t n);
    /* int4 keys, codes kt (hd / 2, ldq), parameters kp (2 * groups, ldp): rows
     * 2g and 2g + 1 hold group g's scale and offset per position:
     *   scores[j] = sum of q[dim] * (c * s + z) over the groups in order, the
     *   code bytes of a group in order, low nibble then high (kvcache.h:
     *   byte i of group g holds dims g0 + i and g0 + L/2 + i).
     * int4 values, codes v (n, hd / 2), parameters vp (n, 2 * groups):
     *   out[dim] += p[j] * (c * s + z), j increasing. */
    void (*attn_scores_i4)(float *scores, const float *q, const uint8_t *kt, int32_t ldq, const uint16_t *kp,
                           int32_t ldp, int32_t hd, int32_t n);
    void (*attn_values_i4)(float *out, const float *p, const uint8_t *v, const uint16_t *vp, int32_t hd, int32_t n);

    /* RoPE of n_heads heads of head_dim values in place, with one token's
     * table cs = (head_dim / 2) (cos, sin) pairs (rope.h): for i < half,
     *   x[i]        = x[i] * c_i - x[i + half] * s_i
     *   x[i + half] = x[i + half] * c_i + x[i] * s_i
     * each product rounded, then the difference or sum (never fused), so
     * every path gives the same bits. */
    void (*rope)(float *x, int32_t n_heads, int32_t head_dim, const float *cs);

    /* out = x / sqrt(mean(x^2) + eps) * w (out may alias x). */
    void (*rmsnorm)(float *out, const float *x, const float *w, int32_t n, float eps);

    /* Exact conversions; f32 -> f16 rounds to nearest even. */
    void (*f16_to_f32)(float *dst, const uint16_t *src, int32_t n);
    void (*f32_to_f16)(uint16_t *dst, const float *src, int32_t n);
} ls_ops;

/* The entries every path has, from its functions <kernel>_<sfx>; a path
 * adds the optional ones (swiglu, softmax_exp, attn_*_mq) itself. */
#define LS_OPS_ENTRIES(sfx)                                                                            \
    .matmul_f16 = matmul_f16_##sfx, .attn_scores = attn_scores_##sfx, .attn_values = attn_values_##sfx, \
    .attn_scores_i8 = attn_scores_i8_##sfx, .attn_values_i8 = attn_values_i8_##sfx,                     \
    .attn_scores_i4 = attn_scores_i4_##sfx, .attn_values_i4 = attn_values_i4_##sfx,                     \
    .rope = rope_##sfx, .rmsnorm = rmsnorm_##sfx, .f16_to_f32 = f16_to_f32_##sfx, .f32_to_f16 = f32_to_f16_##sfx

extern const ls_ops ls_ops_portable;
extern const ls_ops ls_ops_avx2;
extern const ls_ops ls_ops_avx512;

#endif
