/*
 * quant.h — quantized-weight matmul (int4 / int2 blocks, int8 / int6 / int4 output head).
 * Not ABI. The weight packing is written down in loopserve.h.
 *
 * Scheme (docs/kernels.md): each activation row (one token) is quantized to
 * int8 with one fp32 scale, then every group of `group` inputs is an exact
 * integer dot product with the stored codes. One matmul call is
 *
 *   ls_quant_prepare(w, x, ldx, T)        quantize the T input rows once
 *   ls_quant_matmul(w, y, ldy, o0, o1, add) rows [o0, o1), any thread
 *
 * (forward.c's mm_run prepares, a long call's rows on the pool through
 * ls_quant_begin and ls_quant_prepare_rows, then the pool runs matmul on
 * row ranges). Every matrix of a model shares one ls_qact scratch.
 * ls_quant_setup (at runtime init) picks the kernels and, where the path
 * has its own weight layout (AVX2, AVX-512: quant_pack.h), copies every
 * matrix of the model into it once (ls_qops.pack); the copies go with the
 * scratch.
 *
 * The computation, identical on every path (portable, AVX2, AVX-512):
 *   amax = max_i |x[i]|;  d = amax / 127;
 *   q[i] = clamp(rne(x[i] * (127 / amax)), -127, 127), NaN -> 0
 *   (q = 0, d = 0 when amax == 0). For group g of row o:
 *     isum  = sum_i q[i] * c[i]        exact int32 (c the signed code for
 *             int4/int6/int8, the 0..3 code for int2; the SIMD paths feed
 *             the unsigned c + 2^(bits-1) to vpdpbusd / vpmaddubsw and
 *             subtract 2^(bits-1) times qsum, or move c's sign onto q)
 *     qsum  = sum_i q[i]               exact int32
 *     a = acc[g % 8], groups in increasing g, fp32 fused multiply-adds:
 *     a = fma((float)qsum, z_g, a)                     int2 only
 *     a = fma((float)isum, s_g, a)
 *   y = (((acc0 + acc4) + (acc2 + acc6)) + ((acc1 + acc5) + (acc3 + acc7))) * d
 * Integer sums are exact whatever order a path forms them in, and the fp32
 * steps are the same operations in the same order, so every path gives the
 * same bits, for any T, row range or thread: batch-invariant and
 * path-invariant. (The fp16 paths differ from each other; these do not.)
 */
#ifndef LS_QUANT_H
#define LS_QUANT_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* A group size the kernels handle: loopserve.h's LS_QUANT_GROUP_MIN..MAX,
 * a power of two (the loader and the quantizer enforce it). */
static inline int ls_quant_group_ok(int32_t g) {
    return g >= LS_QUANT_GROUP_MIN && g <= LS_QUANT_GROUP_MAX && (g & (g - 1)) == 0;
}

/* The code of input i of a stored row of `in` inputs (loopserve.h): the
 * signed c for int8, int6 and int4, the 0..3 code for int2. */
static inline int32_t ls_quant_code(const uint8_t *row, int32_t in, int32_t i, int32_t bits) {
    switch (bits) {
    case 8: return (int8_t)row[i];
    case 4: return (int32_t)((row[i >> 1] >> (4 * (i & 1))) & 15) - 8;
    case 2: return (row[i >> 2] >> (2 * (i & 3))) & 3;
    default: { /* 6: the int4 nibble, then the high two bits in the 16-byte blocks of 64 inputs */
        const int32_t j = (i & 63) >> 1, hi = (row[in / 2 + 16 * (i >> 6) + (j & 15)] >> (4 * (j >> 4) + 2 * (i & 1))) & 3;
        return (int32_t)(((row[i >> 1] >> (4 * (i & 1))) & 15) | (hi << 4)) - 32;
    }
    }
}

/* Row r of w dequantized into out (w->in floats): s * c, exact in fp32 (an
 * fp16 scale times a code of at most 8 bits), so the same on every path. */
static inline void ls_quant_row_f32(const ls_qmat *w, int32_t r, float *out) {
    const int32_t in = w->in;
    const uint8_t *row = w->qweight + (size_t)r * in * w->bits / 8;
    const uint16_t *s = w->scales + (size_t)r * (in / w->group);
    for (int32_t i = 0; i < in; i++) out[i] = (float)ls_quant_code(row, in, i, w->bits) * ls_f16_to_f32(s[i / w->group]);
}

/* A quantized matrix format the kernels implement (loopserve.h): block int4
 * or int2; head int8, int6 (rows of a multiple of 64 inputs) or int4. */
static inline int ls_quant_format_ok(int32_t bits, int32_t head, int32_t in) {
    if (!head) return bits == 4 || bits == 2;
    return bits == 8 || bits == 4 || (bits == 6 && in % 64 == 0);
}

/* Activation rows are padded with zero codes to a multiple of this many
 * inputs, so SIMD loads of activations never need a mask. */
#define LS_QACT_PAD 256

/* The quantized matmuls of one model: the kernels, the matrices sharing
 * this scratch, and the activations of one matmul call (the last
 * ls_quant_prepare). */
struct ls_qact {
    int32_t simd;         /* LS_SIMD_* of the model (set after runtime init) */
    const struct ls_qops *ops; /* kernels for simd, picked by ls_quant_setup */
    ls_qmat *mats;        /* the matrices (ls_qact_attach); packed for ops by ls_quant_setup */
    int32_t n_mats;
    int32_t max_T, max_in; /* capacity */
    int32_t T, in, group, bits; /* what q holds now */
    int32_t ld;           /* bytes per row of q: max_in rounded up to LS_QACT_PAD */
    int32_t gld;          /* int32s per row of qsum: max_in / 32 rounded up to 8 */
    int8_t *q;            /* (max_T, ld) codes in the layout of ops (see quant_*.c); 64-byte aligned */
    float *d;             /* (max_T) row scale: x ~= d * q */
    int32_t *qsum;        /* (max_T, gld) per-group sums of q, zero past the last group */
};

/* Per-path kernels. quantize writes a->q in the path's layout (portable:
 * natural order; AVX2 and AVX-512: quant_pack.h). pack, where the path has
 * its own weight layout (else NULL), sets w->packed to a copy of w->qweight
 * in it, once; -1 when out of memory. */
typedef struct ls_qops {
    int32_t simd;
    /* The form quantize writes a matrix's activations in for a call of T
     * tokens (VNNI: signed or offset by 128, per weight scheme); two
     * matrices with the same form share one prepared activation. */
    int32_t (*act_form)(const ls_qmat *w, int32_t T);
    int32_t (*pack)(ls_qmat *w);
    /* Activation rows [t0, t1) of a call of T rows (whose form act_form
     * gives), x pointing at row 0. Rows are independent: disjoint ranges
     * may run on different threads. */
    void (*quantize)(ls_qact *a, const float *x, int32_t ldx, int32_t T, int32_t t0, int32_t t1,
                     const ls_qmat *w);
    /* y[t*ldy + o] (+)= row o of w times activation row t, t in [0, a->T), o in [o0, o1) */
    void (*matmul)(float *y, int32_t ldy, const ls_qact *a, const ls_qmat *w, int32_t o0, int32_t o1,
                   int32_t add);
    /* The draft head's integer scores (draft_head.c): isum[r] = sum_i u * x[i]
     * over the 2-bit codes u (0..3) of row r, for rows [r0, r1); exact, so
     * the same on every path. A row is ldb bytes (a multiple of 64) of
     * 64-byte blocks: block b holds input 256b + 64f + j in bits 2f, 2f + 1
     * of its byte j. x: 4 * ldb int8 activations in natural order (one
     * ls_quant_rows row, zero padded). */
    void (*dot_u2)(int32_t *isum, const uint8_t *codes, int32_t ldb, const int8_t *x, int32_t r0, int32_t r1);
} ls_qops;

/* A path's table, from its functions quantize_<sfx>, matmul_<sfx> and
 * dot_u2_<sfx>, its act_form and its pack (or NULL). */
#define LS_QOPS_TABLE(sfx, simd_, act_form_, pack_)                                                     \
    const ls_qops ls_qops_##sfx = {                                                                     \
        .simd = (simd_), .act_form = (act_form_), .pack = (pack_), .quantize = quantize_##sfx,          \
        .matmul = matmul_##sfx, .dot_u2 = dot_u2_##sfx,                                                 \
    }

extern const ls_qops ls_qops_portable;
extern const ls_qops ls_qops_avx2;
extern const ls_qops ls_qops_avx512;

/* The kernels for an LS_SIMD_* path the CPU has (ls_runtime_init checked).
 * AVX-512 without VNNI uses the AVX2 kernels (same results). */
const ls_qops *ls_quant_ops_select(int32_t simd);

/* Picks the kernels for a->simd and packs every attached matrix for them
 * (once, on the loading thread). Without memory for the packed copies it
 * falls back to smaller ones, then to the portable kernels, which read the
 * weights as stored: the same bits. */
void ls_quant_setup(ls_qact *a);
/* Quantizes rows [0, T) of x into w->act (on the calling thread; after
 * ls_quant_setup). */
void ls_quant_prepare(const ls_qmat *w, const float *x, int32_t ldx, int32_t T);
/* The same in parts: ls_quant_begin records a call of T rows (on the
 * calling thread), then ls_quant_prepare_rows quantizes rows [t0, t1), x
 * pointing at row 0; disjoint ranges may run on different threads. */
void ls_quant_begin(const ls_qmat *w, int32_t T);
void ls_quant_prepare_rows(const ls_qmat *w, const float *x, int32_t ldx, int32_t t0, int32_t t1);
/* Whether activations prepared for a in a call of T tokens serve b too
 * (one ls_quant_prepare for a job of several matrices): the same inputs and
 * group, and the same form on this path (an int2 model's int4 wv has
 * another on AVX2, and in decode on VNNI). */
static inline int ls_quant_act_shared(const ls_qmat *a, const ls_qmat *b, int32_t T) {
    return a->act == b->act && a->in == b->in && a->group == b->group && a->head == b->head &&
           a->act->ops->act_form(a, T) == a->act->ops->act_form(b, T);
}
/* Rows [o0, o1) of w against the prepared activations; safe on any thread. */
void ls_quant_matmul(const ls_qmat *w, float *y, int32_t ldy, int32_t o0, int32_t o1, int32_t add);
/* ls_quant_prepare and ls_quant_matmul on a scratch of the caller's own
 * (ls_qact_private) instead of the model's: calls on different threads,
 * each over its own rows, side by side. */
void ls_quant_prepare_in(ls_qact *a, const ls_qmat *w, const float *x, int32_t ldx, int32_t T);
void ls_quant_matmul_in(const ls_qact *a, const ls_qmat *w, float *y, int32_t ldy, int32_t o0, int32_t o1,
                        int32_t add);

/* The activation rule above in plain C for rows [t0, t1) (x pointing at row
 * 0), in natural order: the portable path's quantize, and the definition the
 * SIMD quantizers must equal bit for bit (they round with cvtps2dq in the
 * default rounding mode, which is what the portable rounding does too). */
void ls_quant_rows(ls_qact *a, const float *x, int32_t ldx, int32_t t0, int32_t t1, int32_t in, int32_t group);
/* Records the shape of the rows a holds: T rows of `in` inputs, for
 * matrices of this group and code width. */
static inline void ls_quant_shape(ls_qact *a, int32_t T, int32_t in, int32_t group, int32_t bits) {
    a->T = T;
    a->in = in;
    a->group = group;
    a->bits = bits;
}

/* ---- scratch allocation (static inline: model.c, also linked into the
 * CUDA library, must not reference the kernels' symbols) ---- */

/* Frees the packed copies of the scratch's first n matrices. */
static inline void ls_qact_unpack(ls_qact *a, int32_t n) {
    for (int32_t i = 0; i < n; i++) {
        free(a->mats[i].packed);
        a->mats[i].packed = NULL;
        a->mats[i].packed_wide = 0;
    }
}

/* Frees the scratch and the packed copies of its matrices. */
static inline void ls_qact_free(ls_qact *a) {
    if (!a) return;
    ls_qact_unpack(a, a->n_mats);
    free(a->q);
    free(a->d);
    free(a->qsum);
    free(a);
}

static inline ls_qact *ls_qact_new(int32_t max_T, int32_t max_in) {
    ls_qact *a = calloc(1, sizeof *a);
    if (!a) return NULL;
    a->max_T = max_T;
    a->max_in = max_in;
    a->ld = (max_in + LS_QACT_PAD - 1) / LS_QACT_PAD * LS_QACT_PAD;
    a->gld = ((max_in / LS_QUANT_GROUP_MIN) + 7) / 8 * 8;
    size_t qbytes = (size_t)max_T * (size_t)a->ld;
    a->q = aligned_alloc(64, qbytes); /* qbytes is a multiple of 256 */
    a->d = calloc((size_t)max_T, sizeof *a->d);
    a->qsum = calloc((size_t)max_T * (size_t)a->gld, sizeof *a->qsum);
    if (!a->q || !a->d || !a->qsum) {
        ls_qact_free(a);
        return NULL;
    }
    memset(a->q, 0, qbytes);
    return a;
}

/* A scratch of the same capacity and kernels as the model's `shared` (after
 * ls_quant_setup), holding no matrices: for ls_quant_prepare_in. */
static inline ls_qact *ls_qact_private(const ls_qact *shared) {
    ls_qact *a = ls_qact_new(shared->max_T, shared->max_in);
    if (a) {
        a->simd = shared->simd;
        a->ops = shared->ops;
    }
    return a;
}

/* The n matrices mats[] share the scratch a (which packs and frees their
 * packed copies). */
static inline void ls_qact_attach(ls_qact *a, ls_qmat *mats, int32_t n) {
    a->mats = mats;
    a->n_mats = n;
    for (int32_t i = 0; i < n; i++) mats[i].act = a;
}

#endif
