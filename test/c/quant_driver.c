/*
 * quant_driver.c — runs the quantized matmul kernels (quant_<path>.c in each
 * SIMD folder of kernels/cpu/) on one case written by
 * test/kernels/quant.test.ts, for one SIMD path.
 *
 *   quant_driver CASE OUT
 *
 * CASE (little-endian): int32 magic 0x3151534c ("LSQ1"), bits, group, rows,
 * in, T, simd, head (1: the matrix is an output head); then qweight (rows *
 * in * bits / 8 bytes), scales (rows *
 * in / group fp16), zeros (same, bits == 2 only), x (T * in fp32).
 * OUT receives y (T * rows fp32) from one call over all tokens and rows.
 *
 * Each weight array lives in its own exactly-sized heap block so that
 * AddressSanitizer (the test builds with it) reports any read past a row.
 * Before writing OUT the driver checks the batch-invariance contract on its
 * own: one token per call, rows split into uneven ranges, and the add mode
 * must give the same bits. Exit 0 ok, 2 bad input, 3 path not on this CPU,
 * 4 invariance broken.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quant.h"

static void *read_exact(FILE *f, size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p || fread(p, 1, n, f) != n) {
        free(p);
        return NULL;
    }
    return p;
}

/* y = w x in consecutive ranges of min to min + spread - 1 rows. */
static void split_rows(const ls_qmat *w, float *y, int32_t rows, int32_t min, int32_t spread) {
    for (int32_t o = 0; o < rows;) {
        int32_t n = min + (o * 7 + 3) % spread;
        int32_t e = o + n < rows ? o + n : rows;
        ls_quant_matmul(w, y, rows, o, e, 0);
        o = e;
    }
}

static int same_bits(const float *a, const float *b, size_t n, const char *what) {
    if (memcmp(a, b, n * sizeof *a) == 0) return 1;
    for (size_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof *a) != 0) {
            printf("mismatch: %s at %zu: %.9g vs %.9g\n", what, i, a[i], b[i]);
            break;
        }
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: quant_driver CASE OUT\n");
        return 2;
    }
    FILE *f = fopen(argv[1], "rb");
    if (!f) {
        printf("error: cannot open %s\n", argv[1]);
        return 2;
    }
    int32_t h[8];
    if (fread(h, sizeof h[0], 8, f) != 8 || h[0] != 0x3151534c) {
        printf("error: bad case header\n");
        return 2;
    }
    int32_t bits = h[1], group = h[2], rows = h[3], in = h[4], T = h[5], simd = h[6], head = h[7];
    if ((head != 0 && head != 1) || !ls_quant_format_ok(bits, head, in) || !ls_quant_group_ok(group) || rows < 1 ||
        in < group || in % group != 0 || T < 1 || T > 64) {
        printf("error: bad case dimensions\n");
        return 2;
    }
    __builtin_cpu_init();
    if ((simd == LS_SIMD_AVX2 && !__builtin_cpu_supports("avx2")) ||
        (simd == LS_SIMD_AVX512 && !(__builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl")))) {
        printf("unsupported: simd %d\n", simd);
        return 3;
    }
    int32_t ng = in / group;
    size_t wbytes = (size_t)rows * (size_t)in * (size_t)bits / 8, sn = (size_t)rows * (size_t)ng;
    uint8_t *qw = read_exact(f, wbytes);
    uint16_t *sc = read_exact(f, sn * 2);
    uint16_t *zr = bits == 2 ? read_exact(f, sn * 2) : NULL;
    float *x = read_exact(f, (size_t)T * (size_t)in * sizeof(float));
    fclose(f);
    if (!qw || !sc || (bits == 2 && !zr) || !x) {
        printf("error: case file too short\n");
        return 2;
    }

    ls_qact *act = ls_qact_new(64, in);
    ls_qmat w = {.qweight = qw, .scales = sc, .zeros = zr, .rows = rows, .in = in, .group = group, .bits = bits, .head = head};
    if (act) {
        ls_qact_attach(act, &w, 1);
        act->simd = simd;
        ls_quant_setup(act);
    }
    size_t ny = (size_t)T * (size_t)rows;
    float *y = malloc(ny * sizeof *y), *y1 = malloc(ny * sizeof *y), *y2 = malloc(ny * sizeof *y);
    float *ya = malloc(ny * sizeof *y), *yb = malloc(ny * sizeof *y);
    if (!act || !y || !y1 || !y2 || !ya || !yb) {
        printf("error: out of memory\n");
        return 2;
    }
    int ok = 1;

    // All tokens, all rows, one call.
    ls_quant_prepare(&w, x, in, T);
    ls_quant_matmul(&w, y, rows, 0, rows, 0);

    // One token per call.
    for (int32_t t = 0; t < T; t++) {
        ls_quant_prepare(&w, x + (size_t)t * (size_t)in, in, 1);
        ls_quant_matmul(&w, y1 + (size_t)t * (size_t)rows, rows, 0, rows, 0);
    }
    ok &= same_bits(y, y1, ny, "one token per call vs all tokens");

    // Uneven row ranges (as thread-pool tasks would take them): of 1 to 6
    // rows, and of 15 to 24 (whole 8-pair tiles, cut at odd rows).
    ls_quant_prepare(&w, x, in, T);
    split_rows(&w, y2, rows, 1, 6);
    ok &= same_bits(y, y2, ny, "split rows vs one range");
    split_rows(&w, y2, rows, 15, 10);
    ok &= same_bits(y, y2, ny, "split into longer ranges vs one range");

    // add != 0: the dot product is formed first, then added.
    for (size_t i = 0; i < ny; i++) {
        ya[i] = 0.375f * (float)(i % 11) - 1.0f;
        yb[i] = ya[i] + y[i];
    }
    ls_quant_matmul(&w, ya, rows, 0, rows, 1);
    ok &= same_bits(ya, yb, ny, "add mode");

    FILE *o = fopen(argv[2], "wb");
    if (!o || fwrite(y, sizeof *y, ny, o) != ny || fclose(o) != 0) {
        printf("error: cannot write %s\n", argv[2]);
        return 2;
    }
    printf("%s %s\n", ok ? "ok" : "FAIL", act->ops == &ls_qops_avx512 ? "avx512-vnni"
                                         : act->ops == &ls_qops_avx2 ? "avx2"
                                                                     : "portable");
    free(qw);
    free(sc);
    free(zr);
    free(x);
    free(y);
    free(y1);
    free(y2);
    free(ya);
    free(yb);
    ls_qact_free(act);
    return ok ? 0 : 4;
}
