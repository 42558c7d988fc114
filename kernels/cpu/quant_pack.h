/*
 * quant_pack.h — the packed weight layout the SIMD quantized kernels read
 * (quant_avx2.c, quant_avx512.c), and the activation order that goes with
 * it. Not ABI: the copies are made at load (ls_quant_setup) from the
 * stored layout of loopserve.h.
 *
 * Every int32 lane of the kernels adds up one group. A row is cut into
 * windows of 8 groups while 8 are left, then 4, 2, 1 (window_groups). In a
 * window of n groups the 4 inputs 4u .. 4u + 3 of group j (unit u) are word
 * u n + j: read as 32-byte chunks of 8 words, lane l of every chunk belongs
 * to group l % n. The activations are written in that layout (quantize),
 * the weights go in row pairs: a chunk of a pair holds the same 32 codes
 * of both rows, the first row's in bytes 0-31, the second's in 32-63.
 *
 * Two schemes of a chunk:
 *   wide    one byte per code, the signed code c (int4 -8..7, int2 0..3):
 *           the pair as laid out. The activations go in as q + 128
 *           (unsigned), and the offset is taken back per group with the code
 *           sums the metadata keeps: sum q c = sum (q + 128) c - 128 sum c.
 *           Block matrices on AVX-512 VNNI, in prefill-sized calls.
 *   narrow  the code as u = c + B (B = 2^(bits-1); int2's 0..3 code is its
 *           own, B = 0), the activations signed q: sum q c = sum q u - B sum
 *           q. The chunk keeps the stored width (narrow_chunk): int8 64
 *           bytes, int4 32, int2 16, int6 32 of nibbles plus 16 of high bits
 *           in the pair's second stream. Every matrix has it.
 *
 * Beside the codes, each pair keeps its fp16 scales, (wide) int16 code
 * sums and (int2) fp16 offsets per 8 groups, in the same lane order: a
 * 16-lane slot, the first row in lanes 0-7, the second in 8-15.
 */
#ifndef LS_QUANT_PACK_H
#define LS_QUANT_PACK_H

#include <stddef.h>
#include <stdint.h>

#include "quant.h"

/* Groups in the window that starts with `left` groups to go: 8, else the
 * largest power of two that fits. Every window starts at a multiple of its
 * size, and 8-group windows at a multiple of 8. */
static inline int32_t window_groups(int32_t left) {
    int32_t n = 8;
    while (n > left) n /= 2;
    return n;
}

/* The narrow scheme's offset B: the signed codes' 2^(bits-1); int2's codes
 * are 0..3 already, its own unsigned operand. */
static inline int32_t narrow_offset(int32_t bits) { return bits == 2 ? 0 : 1 << (bits - 1); }

/* Bytes of one 8-group slot of a pair's metadata, 16 lanes each: fp16
 * scales, then (wide scheme) int16 code sums, then (int2) fp16 offsets. */
static inline int32_t slot_bytes(const ls_qmat *w, int nar) { return 32 * (1 + !nar + (w->bits == 2)); }

/* Where a slot's int2 offsets start. */
static inline int32_t zeros_at(int nar) { return nar ? 32 : 64; }

/* Bytes of one pair's 64-code chunk: a byte per code, or the narrow
 * scheme's width (int4 32, int2 16; int6: 32 bytes of nibbles here, 16 of
 * high bits in the pair's second stream). */
static inline int32_t chunk_bytes(const ls_qmat *w, int nar) {
    return !nar || w->bits == 8 ? 64 : w->bits == 2 ? 16 : 32;
}

/* A packed copy in one scheme: every pair's codes (chunks of chunk_bytes),
 * then every pair's metadata (slots of slot_bytes). A matrix with both
 * copies holds the wide one first. */
typedef struct {
    int32_t lg;           /* log2 G */
    int32_t ng;           /* groups per row */
    size_t pair_bytes;    /* codes of one row pair */
    size_t meta_bytes;    /* metadata of one row pair */
    int32_t slot_bytes;   /* metadata per 8 groups */
    size_t meta_offset;   /* where the metadata starts */
    size_t hi_offset;     /* int6: where a pair's high-bit chunks start, after its nibbles */
} layout;

static inline layout layout_of(const ls_qmat *w, int nar) {
    layout v;
    v.lg = __builtin_ctz((unsigned)w->group);
    v.ng = w->in >> v.lg;
    /* in is a multiple of 32 (int6: 64): pairs of a multiple of 16 bytes (narrow int2), 32 (narrow int4, int6) or 64 */
    v.hi_offset = (size_t)w->in / 32 * (size_t)chunk_bytes(w, nar);
    v.pair_bytes = v.hi_offset + (nar && w->bits == 6 ? (size_t)w->in / 2 : 0);
    v.slot_bytes = slot_bytes(w, nar);
    v.meta_bytes = (size_t)((v.ng + 7) / 8) * (size_t)v.slot_bytes;
    /* aligned for the slots' 32-byte loads (narrow int2 pairs are in / 2 bytes) */
    v.meta_offset = ((size_t)((w->rows + 1) / 2) * v.pair_bytes + 63) & ~(size_t)63;
    return v;
}

/* Bytes of one copy, a multiple of 64 so the next starts aligned. */
static inline size_t copy_bytes(const ls_qmat *w, int nar) {
    const layout v = layout_of(w, nar);
    return (v.meta_offset + (size_t)((w->rows + 1) / 2) * v.meta_bytes + 63) & ~(size_t)63;
}

/* Where the copy in scheme nar starts (w->packed_wide: the wide one is first). */
static inline const uint8_t *copy_of(const ls_qmat *w, int nar) {
    return w->packed + (nar && w->packed_wide ? copy_bytes(w, 0) : 0);
}

/* The most tokens a tile of the SIMD kernels takes in one pass. */
#define QTILE_MAX_T 8

/* What the tiles over tokens [t0, t0 + TT) of one copy read, worked out
 * once per run of tiles: the compiler cannot keep it in registers across
 * the stores to y (intrinsic stores may alias anything). */
typedef struct {
    layout v;
    const uint8_t *codes, *meta;     /* the copy */
    const int8_t *x[QTILE_MAX_T];    /* activation rows */
    const int32_t *qs[QTILE_MAX_T];  /* their group sums */
    const float *d;                  /* their scales */
} lanes;

/* The lanes of w's copy in scheme nar for tokens [t0, t0 + TT) of a. */
static inline __attribute__((always_inline)) lanes lanes_of(const ls_qact *a, const ls_qmat *w, int nar,
                                                            int32_t t0, const int TT) {
    lanes L = {layout_of(w, nar), copy_of(w, nar), NULL, {0}, {0}, a->d + t0};
    L.meta = L.codes + L.v.meta_offset;
#pragma GCC unroll 8
    for (int t = 0; t < TT; t++) {
        L.x[t] = a->q + (size_t)(t0 + t) * (size_t)a->ld;
        L.qs[t] = a->qsum + (size_t)(t0 + t) * (size_t)a->gld;
    }
    return L;
}

/* Sets w->packed to the narrow copy of w->qweight, and the wide one before
 * it when `wide` and w is a block matrix (not the head); 0, or -1 when out
 * of memory (w unchanged). */
int32_t ls_quant_pack(ls_qmat *w, int wide);

/* Rearranges one zero-padded row of natural-order activation codes of `in`
 * inputs into the window order above, for groups of `group`. */
void ls_quant_window_order(int8_t *qr, int32_t in, int32_t group);

#endif
