/*
 * gemm.c — times the quantized matmul kernels (kernels/cpu/*/quant_*.c) alone, one
 * thread, on one shape, for bench/gemm.ts.
 *
 *   gemm BITS GROUP ROWS IN T SIMD SECONDS
 *
 * Prints one JSON line: the path that ran, the time of one matmul over
 * prepared activations and its integer operations per second (2 per
 * multiply-add, the unit of the VNNI peak probe). Weights and activations
 * are random; the kernels' speed does not depend on the values.
 */
#define _POSIX_C_SOURCE 199309L
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "quant.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint32_t rng = 0x9e3779b9u;
static uint32_t next(void) {
    rng ^= rng << 13;
    rng ^= rng >> 17;
    rng ^= rng << 5;
    return rng;
}

/* Seconds per run of stmt, timed over at least `seconds` after a warm-up. */
#define TIME_PER_CALL(seconds, stmt)                                        \
    ({                                                                      \
        for (int w_ = 0; w_ < 3; w_++) { stmt; }                            \
        long n_ = 0;                                                        \
        double t0_ = now(), t_;                                             \
        do {                                                                \
            for (int k_ = 0; k_ < 16; k_++) { stmt; }                       \
            n_ += 16;                                                       \
        } while ((t_ = now() - t0_) < (seconds));                           \
        t_ / (double)n_;                                                    \
    })

int main(int argc, char **argv) {
    if (argc != 9) {
        fprintf(stderr, "usage: gemm BITS HEAD GROUP ROWS IN T SIMD SECONDS\n");
        return 2;
    }
    const int32_t bits = atoi(argv[1]), head = atoi(argv[2]), group = atoi(argv[3]), rows = atoi(argv[4]);
    const int32_t in = atoi(argv[5]), T = atoi(argv[6]), simd = atoi(argv[7]);
    const double seconds = atof(argv[8]);
    if ((head != 0 && head != 1) || !ls_quant_format_ok(bits, head, in) || !ls_quant_group_ok(group) || rows < 1 ||
        in < group || in % group != 0 || T < 1 || T > 64 || !(seconds > 0)) {
        fprintf(stderr, "gemm: bad arguments\n");
        return 2;
    }
    const int32_t ng = in / group;
    const size_t wbytes = (size_t)rows * (size_t)in * (size_t)bits / 8, sn = (size_t)rows * (size_t)ng;
    uint8_t *qw = malloc(wbytes);
    uint16_t *sc = malloc(sn * 2), *zr = malloc(sn * 2);
    float *x = malloc((size_t)T * (size_t)in * sizeof *x), *y = malloc((size_t)T * (size_t)rows * sizeof *y);
    ls_qact *act = ls_qact_new(64, in);
    if (!qw || !sc || !zr || !x || !y || !act) {
        fprintf(stderr, "gemm: out of memory\n");
        return 1;
    }
    for (size_t i = 0; i < wbytes; i++) qw[i] = (uint8_t)next();
    for (size_t i = 0; i < sn; i++) {
        sc[i] = (uint16_t)(0x2000 + next() % 0x0800); /* small positive fp16 */
        zr[i] = (uint16_t)(0xA000 + next() % 0x0800);
    }
    for (size_t i = 0; i < (size_t)T * (size_t)in; i++) x[i] = (float)(int32_t)(next() % 2001 - 1000) / 1000.0f;
    ls_qmat w = {.qweight = qw, .scales = sc, .zeros = bits == 2 ? zr : NULL, .rows = rows, .in = in,
                 .group = group, .bits = bits, .head = head};
    ls_qact_attach(act, &w, 1);
    act->simd = simd;
    ls_quant_setup(act);

    ls_quant_prepare(&w, x, in, T);
    const double t_mm = TIME_PER_CALL(seconds, ls_quant_matmul(&w, y, rows, 0, rows, 0));
    const double ops = 2.0 * (double)rows * (double)in * (double)T;
    printf("{\"path\":\"%s\",\"bits\":%d,\"group\":%d,\"rows\":%d,\"in\":%d,\"T\":%d,"
           "\"matmul_us\":%.3f,\"matmul_Gops\":%.2f,\"sink\":%g}\n",
           act->ops == &ls_qops_avx512 ? "avx512-vnni" : act->ops == &ls_qops_avx2 ? "avx2" : "portable", bits,
           group, rows, in, T, 1e6 * t_mm, ops / t_mm / 1e9, (double)y[0]);
    ls_qact_free(act);
    free(qw);
    free(sc);
    free(zr);
    free(x);
    free(y);
    return 0;
}
