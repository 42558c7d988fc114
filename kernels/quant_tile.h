/*
 * quant_tile.h — the fp32 part of the matmul tile over natural-order
 * windows of 8 blocks: every format in quant_avx2.c, the int8 head in
 * quant_avx512.c (included into each, compiled with that file's flags).
 * Both paths turn exact per-group integer sums into the same fp32
 * accumulation, in the same order, so their results are bit-identical.
 *
 * The including file defines first:
 *   TILE_MAX_R, TILE_MAX_T       largest tile
 *   window_sums(...)             per-group integer sums of one window of groups
 *   load_f16x8(p, n)             n <= 8 fp16 values to a __m256 (zeros past n)
 *   QUANT_INT8_UNSIGNED          1 when int8 codes enter the dot product as c + 128
 */
#ifndef LS_QUANT_TILE_H
#define LS_QUANT_TILE_H

/* ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)) */
static inline float lane_sum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Rows [o, o + R) x tokens [t0, t0 + TT). */
static inline __attribute__((always_inline)) void tile(float *y, int32_t ldy, const ls_qact *a,
                                                       const ls_qmat *w, int32_t o, int32_t t0,
                                                       const int R, const int TT, const int BITS,
                                                       int32_t add) {
    const int32_t in = w->in, G = w->group, ng = in / G, m = G / 32;
    const size_t row_bytes = (size_t)in * BITS / 8;
    const uint8_t *wr[TILE_MAX_R];
    const int8_t *xr[TILE_MAX_T];
    __m256 acc[TILE_MAX_R][TILE_MAX_T];
    __m256i gs[TILE_MAX_R][TILE_MAX_T];
    for (int r = 0; r < R; r++) wr[r] = w->qweight + (size_t)(o + r) * row_bytes;
    for (int t = 0; t < TT; t++) xr[t] = a->q + (size_t)(t0 + t) * (size_t)a->ld;
    for (int r = 0; r < R; r++)
        for (int t = 0; t < TT; t++) acc[r][t] = _mm256_setzero_ps();

    for (int32_t g0 = 0; g0 < ng; g0 += 8) {
        const int32_t ngc = ng - g0 < 8 ? ng - g0 : 8;
        if (TT == 1 && BITS == 8) {
            /* Decode streams the int8 head from memory: ask for this window of
             * the rows two tiles ahead, more misses in flight than the
             * hardware prefetcher keeps. A prefetch never faults; the address
             * is formed as an integer to keep the arithmetic defined. */
            for (int r = 0; r < R; r++)
                for (int32_t b = 0; b < ngc * G; b += 64)
                    _mm_prefetch((const char *)((uintptr_t)wr[r] + 2 * (size_t)R * row_bytes + (size_t)g0 * G + b),
                                 _MM_HINT_T0);
        }
        if (m == 1) {
            window_sums(gs, wr, xr, g0 * 32, ngc * 32, R, TT, BITS);
        } else {
            // Groups of m blocks: block sums window by window, then added up.
            int32_t bs[TILE_MAX_R][TILE_MAX_T][64] __attribute__((aligned(32)));
            const int32_t nblk = ngc * m;
            __m256i ws[TILE_MAX_R][TILE_MAX_T];
            for (int32_t k0 = 0; k0 < nblk; k0 += 8) {
                const int32_t nk = nblk - k0 < 8 ? nblk - k0 : 8;
                window_sums(ws, wr, xr, g0 * G + k0 * 32, nk * 32, R, TT, BITS);
                for (int r = 0; r < R; r++)
                    for (int t = 0; t < TT; t++) _mm256_store_si256((__m256i *)&bs[r][t][k0], ws[r][t]);
            }
            for (int r = 0; r < R; r++)
                for (int t = 0; t < TT; t++) {
                    int32_t g8[8] __attribute__((aligned(32))) = {0};
                    for (int32_t g = 0; g < ngc; g++)
                        for (int32_t b = 0; b < m; b++) g8[g] += bs[r][t][g * m + b];
                    gs[r][t] = _mm256_load_si256((const __m256i *)g8);
                }
        }
        for (int r = 0; r < R; r++) {
            const size_t so = (size_t)(o + r) * (size_t)ng + (size_t)g0;
            const __m256 s8 = load_f16x8(w->scales + so, ngc);
            __m256 z8 = _mm256_setzero_ps();
            if (BITS == 2) z8 = load_f16x8(w->zeros + so, ngc);
            for (int t = 0; t < TT; t++) {
                const __m256i qs = _mm256_loadu_si256((const __m256i *)(a->qsum + (size_t)(t0 + t) * (size_t)a->gld + g0));
                __m256 v;
                if (BITS == 2) {
                    v = _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(gs[r][t]), s8),
                                      _mm256_mul_ps(_mm256_cvtepi32_ps(qs), z8));
                } else {
                    // Codes that entered the integer dot product offset to unsigned
                    // (int4 always, int8 where QUANT_INT8_UNSIGNED) carry offset * sum(x).
                    __m256i isum = gs[r][t];
                    if (BITS == 4) isum = _mm256_sub_epi32(isum, _mm256_slli_epi32(qs, 3));
                    else if (QUANT_INT8_UNSIGNED) isum = _mm256_sub_epi32(isum, _mm256_slli_epi32(qs, 7));
                    v = _mm256_mul_ps(_mm256_cvtepi32_ps(isum), s8);
                }
                acc[r][t] = _mm256_add_ps(acc[r][t], v);
            }
        }
    }
    for (int r = 0; r < R; r++)
        for (int t = 0; t < TT; t++) {
            float s = lane_sum(acc[r][t]) * a->d[t0 + t];
            float *yo = y + (size_t)(t0 + t) * (size_t)ldy + o + r;
            *yo = add ? *yo + s : s;
        }
}

#endif
