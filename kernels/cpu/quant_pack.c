/*
 * quant_pack.c — the packed copies of quant_pack.h, made once at load, and
 * the activation window order. Plain C: both SIMD paths call it.
 */
#define _DEFAULT_SOURCE /* madvise under -std=c11 */
#include "quant_pack.h"

#include <sys/mman.h>

/* The bytes a kernel reads for the inputs of a stored row, in natural
 * order: the wide scheme's code c (signed), the narrow scheme's c + B
 * (unsigned). One loop per width, so each folds ls_quant_code's choice;
 * int6 takes its high bits once per pair of inputs. */
static void row_codes(const ls_qmat *w, const uint8_t *row, uint8_t *out, int nar) {
    const int32_t in = w->in, b = nar ? narrow_offset(w->bits) : 0;
#define ROW_CODES(BITS) \
    for (int32_t i = 0; i < in; i++) out[i] = (uint8_t)(ls_quant_code(row, in, i, BITS) + b)
    switch (w->bits) {
    case 8: ROW_CODES(8); break;
    case 4: ROW_CODES(4); break;
    case 2: ROW_CODES(2); break;
    default: /* 6, a 64-input block at a time: ls_quant_code's nibble and high bits per pair of inputs */
        for (int32_t i0 = 0; i0 < in; i0 += 64) {
            const uint8_t *nib = row + i0 / 2, *hb = row + in / 2 + i0 / 4;
            for (int32_t j = 0; j < 32; j++) {
                const int32_t hi = hb[j & 15] >> (4 * (j >> 4));
                out[i0 + 2 * j] = (uint8_t)(((nib[j] & 15) | (hi & 3) << 4) - 32 + b);
                out[i0 + 2 * j + 1] = (uint8_t)(((nib[j] >> 4) | (hi >> 2 & 3) << 4) - 32 + b);
            }
        }
        break;
    }
#undef ROW_CODES
}

/* One chunk of a narrow pair (64 bytes u, a byte per code) at its stored
 * width: int2 byte j of lo holds u[16 k + j] at bits 2k; int4 byte j holds
 * u[j] and u[32 + j] in its low and high nibble; int6 adds 16 bytes hi
 * whose byte j holds the high two bits of u[16 k + j] at bits 2k. */
static void narrow_chunk(uint8_t *lo, uint8_t *hi, const uint8_t *u, int32_t bits) {
    if (bits == 2) {
        for (int32_t j = 0; j < 16; j++) lo[j] = (uint8_t)(u[j] | u[16 + j] << 2 | u[32 + j] << 4 | u[48 + j] << 6);
        return;
    }
    for (int32_t j = 0; j < 32; j++) lo[j] = (uint8_t)((u[j] & 15) | (u[32 + j] & 15) << 4);
    for (int32_t j = 0; bits == 6 && j < 16; j++)
        hi[j] = (uint8_t)(((u[j] >> 4) & 3) | ((u[16 + j] >> 4) & 3) << 2 | ((u[32 + j] >> 4) & 3) << 4 |
                          ((u[48 + j] >> 4) & 3) << 6);
}

/* Writes w's copy in scheme nar at p (zeroed, copy_bytes long); full: 3 in
 * bytes of scratch (a pair a byte per code, then one row's codes). */
static void pack_copy(const ls_qmat *w, int nar, uint8_t *p, uint8_t *full) {
    const int32_t G = w->group, pairs = (w->rows + 1) / 2, cb = chunk_bytes(w, nar);
    const layout v = layout_of(w, nar);
    const size_t row_bytes = (size_t)w->in * (size_t)w->bits / 8;
    uint8_t *nat = full + 2 * (size_t)w->in;
    for (int32_t q = 0; q < pairs; q++) {
        // The missing second row of an odd count: code bytes 0 (zero
        // weights on every path, whatever the offset), scale 0.
        memset(full, 0, 2 * (size_t)w->in);
        uint8_t *meta = p + v.meta_offset + (size_t)q * v.meta_bytes;
        for (int32_t h = 0; h < 2 && 2 * q + h < w->rows; h++) {
            const int32_t o = 2 * q + h;
            row_codes(w, w->qweight + (size_t)o * row_bytes, nat, nar);
            uint8_t *codes = full + 32 * h; /* this row's half of each 64-byte chunk */
            for (int32_t g0 = 0; g0 < v.ng;) {
                const int32_t n = window_groups(v.ng - g0), chunks = (n * G) / 32, ln = __builtin_ctz((unsigned)n);
                uint8_t *wc = codes + 2 * ((size_t)g0 * G);
                for (int32_t c = 0; c < chunks; c++)
                    for (int32_t l = 0; l < 8; l++) {
                        const int32_t g = g0 + (l & (n - 1)), u = (8 * c + l) >> ln; /* l % n, (8 c + l) / n */
                        memcpy(wc + 64 * c + 4 * l, nat + (size_t)g * G + 4 * u, 4);
                    }
                g0 += n;
            }
            const uint16_t *sc = w->scales + (size_t)o * (size_t)v.ng;
            for (int32_t g = 0; g < v.ng; g++) {
                uint8_t *slot = meta + (size_t)(g / 8) * (size_t)v.slot_bytes;
                const int32_t lane = 8 * h + g % 8;
                memcpy(slot + 2 * lane, &sc[g], 2);
                if (w->bits == 2) memcpy(slot + zeros_at(nar) + 2 * lane, &w->zeros[(size_t)o * (size_t)v.ng + g], 2);
                if (nar) continue;
                int16_t csum = 0;
                for (int32_t i = 0; i < G; i++) csum = (int16_t)(csum + (int8_t)nat[(size_t)g * G + i]);
                memcpy(slot + 32 + 2 * lane, &csum, 2);
            }
        }
        uint8_t *out = p + (size_t)q * v.pair_bytes;
        if (cb == 64) memcpy(out, full, 2 * (size_t)w->in); /* a byte per code: the pair as laid out */
        else
            for (int32_t c = 0; c < w->in / 32; c++)
                narrow_chunk(out + (size_t)c * cb, out + v.hi_offset + 16 * (size_t)c, full + 64 * (size_t)c, w->bits);
    }
}

int32_t ls_quant_pack(ls_qmat *w, int wide) {
    if (!w->qweight) return 0; /* a slot the model leaves empty (an fp16 head) */
    wide = wide && !w->head;
    const size_t first = wide ? copy_bytes(w, 0) : 0, used = first + copy_bytes(w, 1);
    // A copy that fills huge pages asks for them (the kernel may decline):
    // the head streams from DRAM, where 4 KB pages slow decode
    // (docs/kernels.md#tuning-figures).
    const size_t huge = (size_t)2 << 20, bytes = used >= huge ? (used + huge - 1) & ~(huge - 1) : used;
    uint8_t *p = aligned_alloc(used >= huge ? huge : 64, bytes);
    uint8_t *full = malloc(3 * (size_t)w->in); /* pack_copy's scratch */
    if (!p || !full) {
        free(p);
        free(full);
        return -1;
    }
    if (used >= huge) madvise(p, bytes, MADV_HUGEPAGE); /* advice only: failure changes nothing */
    memset(p, 0, bytes); /* unused metadata lanes */
    if (wide) pack_copy(w, 0, p, full);
    pack_copy(w, 1, p + first, full);
    free(full);
    w->packed = p;
    w->packed_wide = wide;
    return 0;
}

void ls_quant_window_order(int8_t *qr, int32_t in, int32_t group) {
    uint32_t nat[8 * LS_QUANT_GROUP_MAX / 4]; /* one window in natural order, as words */
    const int32_t ng = in / group, units = group / 4;
    for (int32_t g0 = 0; g0 < ng;) {
        const int32_t n = window_groups(ng - g0);
        int8_t *win = qr + (size_t)g0 * (size_t)group;
        memcpy(nat, win, (size_t)n * (size_t)group);
        for (int32_t j = 0; j < n; j++)
            for (int32_t u = 0; u < units; u++) memcpy(win + 4 * ((size_t)u * n + j), &nat[j * units + u], 4);
        g0 += n;
    }
}
