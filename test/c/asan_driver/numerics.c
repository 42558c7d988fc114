// f16-check, rope-check: the fp16 conversions and every SIMD path's RoPE.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/ops.h"     /* each path's kernel table */
#include "cpu/runtime.h" /* ls_simd_missing */
#include "driver.h"
#include "internal.h"    /* ls_f16_to_f32, ls_f32_to_f16 */
#include "rope.h"

// ---- f16-check ----

static uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

// Every half round-trips; every midpoint between neighbouring halves rounds
// to the even one, and one fp32 ulp either side rounds to the nearer.
int cmd_f16_check(void) {
    long checked = 0;
    for (uint32_t h = 0; h < 0x10000; h++) {
        float f = ls_f16_to_f32((uint16_t)h);
        int is_nan = (h & 0x7c00) == 0x7c00 && (h & 0x3ff);
        if (is_nan) {
            CHECK(isnan(f) && (f32_bits(f) & 0x400000), "half %04x: not a quiet NaN", h);
            CHECK((ls_f32_to_f16(f) & 0x7e00) == 0x7e00, "NaN %04x: not a NaN back", h);
            continue;
        }
        CHECK(ls_f32_to_f16(f) == h, "half %04x -> %a -> %04x", h, (double)f, ls_f32_to_f16(f));
        checked++;
        uint32_t mag = h & 0x7fff, sign = h & 0x8000;
        if (mag >= 0x7c00) continue; // inf has no upper neighbour
        // The next magnitude up; above 65504 it is 65536, which rounds to inf.
        double lo = fabs((double)f);
        double hi = mag == 0x7bff ? 65536.0 : fabs((double)ls_f16_to_f32((uint16_t)(mag + 1)));
        uint16_t h_lo = (uint16_t)(sign | mag), h_hi = (uint16_t)(sign | (mag + 1));
        float mid = (float)((lo + hi) / 2); // exact: 12 significant bits
        if (sign) mid = -mid;
        uint16_t even = (mag & 1) ? h_hi : h_lo;
        CHECK(ls_f32_to_f16(mid) == even, "midpoint %a -> %04x, want %04x", (double)mid,
              ls_f32_to_f16(mid), even);
        float below = bits_f32(f32_bits(mid) - 1), above = bits_f32(f32_bits(mid) + 1);
        CHECK(ls_f32_to_f16(below) == h_lo, "%a -> %04x, want %04x", (double)below,
              ls_f32_to_f16(below), h_lo);
        CHECK(ls_f32_to_f16(above) == h_hi, "%a -> %04x, want %04x", (double)above,
              ls_f32_to_f16(above), h_hi);
        checked += 3;
    }
    CHECK(ls_f32_to_f16(INFINITY) == 0x7c00 && ls_f32_to_f16(-INFINITY) == 0xfc00, "inf");
    CHECK(ls_f32_to_f16(1e30f) == 0x7c00 && ls_f32_to_f16(-1e30f) == 0xfc00, "overflow");
    CHECK(ls_f32_to_f16(1e-30f) == 0 && ls_f32_to_f16(-1e-30f) == 0x8000, "underflow keeps sign");
    CHECK(ls_f32_to_f16(0x1p-25f) == 0 && ls_f32_to_f16(0x1.000002p-25f) == 1, "half the least subnormal");
    if (g_fail == 0) printf("ok %ld conversions\n", checked);
    return g_fail ? 2 : 0;
}

// ---- rope-check ----

// ops.h promises the same bits on every path: each head dimension from 2 up
// (masked tails, more than one 64-pair block), one and three heads, three
// positions, inputs spanning many magnitudes. Buffers are allocated to
// their exact size, so a lane past the row is an ASan report.
int cmd_rope_check(void) {
    const ls_ops *paths[2];
    const char *names[2];
    int np = 0;
    if (!ls_simd_missing(LS_SIMD_AVX2)) paths[np] = &ls_ops_avx2, names[np++] = "avx2";
    if (!ls_simd_missing(LS_SIMD_AVX512)) paths[np] = &ls_ops_avx512, names[np++] = "avx512";
    static const int32_t hds[] = {2, 4, 6, 8, 14, 16, 18, 30, 32, 34, 48, 62, 64, 96, 126, 128, 130, 256, 258};
    static const int32_t positions[] = {0, 7, 4095};
    uint32_t rng = 12345;
    long compared = 0;
    for (size_t a = 0; a < sizeof hds / sizeof hds[0]; a++)
        for (int32_t heads = 1; heads <= 3; heads += 2)
            for (size_t b = 0; b < sizeof positions / sizeof positions[0]; b++) {
                int32_t hd = hds[a], n = heads * hd;
                float *cs = malloc((size_t)hd * sizeof *cs), *x = malloc((size_t)n * sizeof *x);
                float *want = malloc((size_t)n * sizeof *want), *got = malloc((size_t)n * sizeof *got);
                ls_rope_table(cs, 1, positions[b], hd, 10000.0f);
                for (int32_t i = 0; i < n; i++) {
                    rng ^= rng << 13, rng ^= rng >> 17, rng ^= rng << 5;
                    x[i] = ldexpf((float)(rng & 0xffff) / 32768.0f - 1.0f, (int)(rng >> 16) % 41 - 20);
                }
                memcpy(want, x, (size_t)n * sizeof *x);
                ls_ops_portable.rope(want, heads, hd, cs);
                for (int k = 0; k < np; k++) {
                    memcpy(got, x, (size_t)n * sizeof *x);
                    paths[k]->rope(got, heads, hd, cs);
                    CHECK(memcmp(got, want, (size_t)n * sizeof *got) == 0, "%s rope differs: head_dim %d, %d heads, position %d",
                          names[k], hd, heads, positions[b]);
                    compared++;
                }
                free(cs), free(x), free(want), free(got);
            }
    if (g_fail == 0) printf("ok %ld rows match the portable path on %d SIMD paths\n", compared, np);
    return g_fail ? 2 : 0;
}
