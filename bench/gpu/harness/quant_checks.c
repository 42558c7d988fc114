/*
 * quant.c — the CPU half of the proof that the CUDA library's quantized
 * matmuls are bit-identical to the CPU library's (kernels/cuda/quant_math.h
 * says how the proof is split). Runs the functions the device kernels call
 * on the host, against the CPU library's quantized kernels (kernels/quant.h,
 * every SIMD path this CPU has), and emulates the device's warp schedule
 * lane by lane:
 *   codes     lsq_code and the unit words equal ls_quant_code for every
 *             format (int2, int4, int6, int8), input and row length;
 *   act       activation codes and scales equal ls_quant_rows', NaN, Inf,
 *             subnormal and all-zero rows included;
 *   matmul    lsq_row_ref equals ls_quant_matmul bit for bit: every format,
 *             group, a row length that ends mid-round, 1 to 64 tokens,
 *             store and add;
 *   schedule  the warp emulation visits each accumulator's groups in
 *             increasing order, every group once, and gives lsq_row_ref's bits;
 *   amax      the device's tree of lsq_amax_step gives the serial scan's amax.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/quant_math.h"
#include "harness.h"
#include "quant.h"

typedef struct {
    int32_t bits, head;
} format;

static const format FORMATS[] = {{4, 0}, {2, 0}, {8, 1}, {6, 1}, {4, 1}};
#define N_FORMATS (int32_t)(sizeof FORMATS / sizeof FORMATS[0])
static const int32_t GROUPS[] = {32, 64, 128, 256};

/* A random matrix of a format: codes, fp16 scales of either sign, int2 offsets. */
typedef struct {
    lsq_matrix m;
    uint8_t *qweight;
    uint16_t *scales, *zeros;
} matrix;

static matrix random_matrix(format f, int32_t rows, int32_t in, int32_t group) {
    matrix w;
    size_t bytes = (size_t)rows * (size_t)lsq_row_bytes(in, f.bits), ns = (size_t)rows * (size_t)(in / group);
    w.qweight = malloc(bytes);
    w.scales = malloc(ns * 2);
    w.zeros = f.bits == 2 ? malloc(ns * 2) : NULL;
    for (size_t i = 0; i < bytes; i++) w.qweight[i] = (uint8_t)harness_rand();
    if (f.bits == 8)
        for (size_t i = 0; i < bytes; i++)
            if (w.qweight[i] == 0x80) w.qweight[i] = 0x81; /* int8 codes are in [-127, 127] */
    for (size_t i = 0; i < ns; i++) {
        w.scales[i] = (uint16_t)(0x1c00 + harness_rand() % 0x1000) | (harness_rand() & 1 ? 0x8000 : 0);
        if (w.zeros) w.zeros[i] = (uint16_t)(0x1c00 + harness_rand() % 0x1000) | (harness_rand() & 1 ? 0x8000 : 0);
    }
    w.m = (lsq_matrix){w.qweight, w.scales, w.zeros, rows, in, group, f.bits};
    return w;
}

static void free_matrix(matrix *w) {
    free(w->qweight);
    free(w->scales);
    free(w->zeros);
}

// ---- codes ----

static void check_codes(void) {
    char detail[256] = "";
    int ok = 1;
    int32_t cases = 0;
    for (int32_t f = 0; f < N_FORMATS && ok; f++) {
        const int32_t bits = FORMATS[f].bits;
        for (int32_t in = 64; in <= 1280 && ok; in += 64) {
            matrix w = random_matrix(FORMATS[f], 3, in, 32);
            for (int32_t r = 0; r < 3 && ok; r++) {
                const uint8_t *row = w.qweight + (size_t)r * (size_t)lsq_row_bytes(in, bits);
                for (int32_t i = 0; i < in && ok; i++) {
                    int32_t want = ls_quant_code(row, in, i, bits), got = lsq_code(row, in, i, bits);
                    if (want != got) {
                        snprintf(detail, sizeof detail, "int%d in %d input %d: lsq_code %d, ls_quant_code %d", bits, in, i, got, want);
                        ok = 0;
                    }
                }
                for (int32_t u = 0; u < in / LSQ_UNIT && ok; u++) {
                    uint32_t cw[LSQ_WORDS];
                    lsq_unit_codes(cw, row, in, u, bits);
                    for (int32_t i = 0; i < LSQ_UNIT && ok; i++) {
                        int32_t byte = (int32_t)((cw[i / 4] >> (8 * (i % 4))) & 0xff);
                        int32_t c = bits == 8 ? (int8_t)byte : byte - lsq_code_offset(bits);
                        if (c != ls_quant_code(row, in, LSQ_UNIT * u + i, bits)) {
                            snprintf(detail, sizeof detail, "int%d in %d unit %d input %d: word byte gives %d", bits, in, u, i, c);
                            ok = 0;
                        }
                    }
                    cases++;
                }
            }
            free_matrix(&w);
        }
    }
    if (ok) snprintf(detail, sizeof detail, "int2/4/6/8 rows of 64..1280 inputs, %d units", cases);
    report("codes", ok, detail);
}

// ---- activations ----

/* A row with the values that test the rule: NaN, infinities, subnormals,
 * huge and tiny ones, exact halves after scaling; kind picks the mix. */
static void special_row(float *x, int32_t in, int32_t kind) {
    const float specials[] = {NAN, INFINITY, -INFINITY, 1e-45f, -1e-45f, 1e-38f, 3e38f, -3e38f, 0.0f, -0.0f, 0.5f, -0.5f};
    for (int32_t i = 0; i < in; i++) {
        float v = (float)((int32_t)(harness_rand() % 20001) - 10000) / 1000.0f;
        switch (kind) {
        case 0: x[i] = v; break;                                       /* plain */
        case 1: x[i] = 0.0f; break;                                    /* all zero: q = 0, d = 0 */
        case 2: x[i] = i % 7 == 0 ? specials[harness_rand() % 12] : v; break;  /* specials among plain values */
        case 3: x[i] = i % 3 == 0 ? 1e-45f : 0.0f; break;              /* amax subnormal: 127 / amax is inf */
        case 4: x[i] = (float)(i % 255 - 127) / 127.0f * 2.5f; break;  /* codes land on every value, ties included */
        default: x[i] = v * 1e30f; break;                              /* near the top of fp32 */
        }
    }
}

static void check_activations(void) {
    const int32_t in = 512;
    ls_qact *a = ls_qact_new(1, in);
    float *x = malloc(in * sizeof *x);
    int8_t *q = malloc(in);
    char detail[256] = "";
    int ok = a && x && q;
    int32_t rows = 0;
    for (int32_t kind = 0; kind < 6 && ok; kind++)
        for (int32_t rep = 0; rep < 50 && ok; rep++, rows++) {
            special_row(x, in, kind);
            ls_quant_rows(a, x, in, 0, 1, in, 32);
            float d;
            lsq_quantize_row_ref(q, &d, x, in);
            if (!same_float(d, a->d[0])) {
                snprintf(detail, sizeof detail, "row kind %d: d %.9g, ls_quant_rows %.9g", kind, d, a->d[0]);
                ok = 0;
            }
            for (int32_t i = 0; i < in && ok; i++)
                if (q[i] != a->q[i]) {
                    snprintf(detail, sizeof detail, "row kind %d input %d (x %.9g): code %d, ls_quant_rows %d", kind, i, x[i], q[i], a->q[i]);
                    ok = 0;
                }
        }
    if (ok) snprintf(detail, sizeof detail, "%d rows of %d inputs: plain, zero, NaN/Inf/subnormal, subnormal amax, ties, huge", rows, in);
    report("act", ok, detail);
    ls_qact_free(a);
    free(x);
    free(q);
}

static void check_amax_order(void) {
    const int32_t in = 1000;
    float x[1000], tree[1024];
    char detail[160] = "";
    int ok = 1;
    for (int32_t rep = 0; rep < 200 && ok; rep++) {
        special_row(x, in, rep % 6);
        float serial = 0.0f;
        for (int32_t i = 0; i < in; i++) serial = lsq_amax_step(serial, x[i]);
        /* quant.cu: each thread's strided scan, then a halving tree of the partial maxima */
        const int32_t threads = 256;
        for (int32_t t = 0; t < 1024; t++) tree[t] = 0.0f;
        for (int32_t t = 0; t < threads; t++)
            for (int32_t i = t; i < in; i += threads) tree[t] = lsq_amax_step(tree[t], x[i]);
        for (int32_t half = threads / 2; half > 0; half /= 2)
            for (int32_t t = 0; t < half; t++) tree[t] = lsq_amax_step(tree[t], tree[t + half]);
        if (!same_float(serial, tree[0])) {
            snprintf(detail, sizeof detail, "row %d: tree %.9g, serial %.9g", rep, tree[0], serial);
            ok = 0;
        }
    }
    if (ok) snprintf(detail, sizeof detail, "200 rows, 256-thread tree against the serial scan");
    report("amax", ok, detail);
}

// ---- matmul against the CPU library ----

static const char *path_name(const ls_qact *a) {
    return a->ops == &ls_qops_avx512 ? "avx512" : a->ops == &ls_qops_avx2 ? "avx2" : "portable";
}

static int path_available(int32_t simd) {
    __builtin_cpu_init();
    if (simd == LS_SIMD_AVX2) return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    if (simd == LS_SIMD_AVX512) return __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
    return 1;
}

/* The CPU library's y for T rows of x against w (store, or add onto y0), on one SIMD path. */
static int cpu_matmul(const matrix *w, format f, int32_t simd, const float *x, int32_t T, float *y, const float *y0,
                      int add, char *path, size_t path_len) {
    ls_qact *a = ls_qact_new(64, w->m.in);
    if (!a) return -1;
    ls_qmat q = {.qweight = w->qweight, .scales = w->scales, .zeros = w->zeros, .rows = w->m.rows, .in = w->m.in,
                 .group = w->m.group, .bits = f.bits, .head = f.head};
    ls_qact_attach(a, &q, 1);
    a->simd = simd;
    ls_quant_setup(a);
    snprintf(path, path_len, "%s", path_name(a));
    if (add) memcpy(y, y0, (size_t)T * (size_t)w->m.rows * sizeof *y);
    ls_quant_prepare(&q, x, w->m.in, T);
    ls_quant_matmul(&q, y, w->m.rows, 0, w->m.rows, add);
    ls_qact_free(a);
    return 0;
}

static void check_matmul(void) {
    const int32_t rows = 37, max_T = 64, ins[] = {256, 1280};
    const int32_t Ts[] = {1, 5, 64};
    char detail[320] = "", path[16];
    int ok = 1;
    int32_t cases = 0;
    float *x = malloc((size_t)max_T * 1280 * sizeof *x), *y = malloc((size_t)max_T * rows * sizeof *y);
    float *y0 = malloc((size_t)max_T * rows * sizeof *y0);
    int8_t *q = malloc((size_t)max_T * 1280);
    float d[64];
    for (int32_t f = 0; f < N_FORMATS && ok; f++)
        for (int32_t gi = 0; gi < 4 && ok; gi++)
            for (int32_t ii = 0; ii < 2 && ok; ii++) {
                const int32_t G = GROUPS[gi], in = ins[ii];
                matrix w = random_matrix(FORMATS[f], rows, in, G);
                for (int32_t ti = 0; ti < 3 && ok; ti++) {
                    const int32_t T = Ts[ti];
                    for (int32_t t = 0; t < T; t++) special_row(x + (size_t)t * in, in, t % 5 == 1 ? 4 : t % 5 == 2 ? 2 : 0);
                    for (int32_t i = 0; i < T * rows; i++) y0[i] = (float)((int32_t)(harness_rand() % 2001) - 1000) / 100.0f;
                    for (int32_t t = 0; t < T; t++) lsq_quantize_row_ref(q + (size_t)t * in, &d[t], x + (size_t)t * in, in);
                    for (int32_t simd = LS_SIMD_PORTABLE; simd <= LS_SIMD_AVX512 && ok; simd++) {
                        if (!path_available(simd)) continue;
                        for (int add = 0; add <= 1 && ok; add++) {
                            if (cpu_matmul(&w, FORMATS[f], simd, x, T, y, y0, add, path, sizeof path) != 0) {
                                snprintf(detail, sizeof detail, "out of memory");
                                ok = 0;
                                break;
                            }
                            for (int32_t t = 0; t < T && ok; t++)
                                for (int32_t o = 0; o < rows && ok; o++) {
                                    float want = y[(size_t)t * rows + o];
                                    float got = lsq_row_ref(&w.m, o, q + (size_t)t * in, d[t], y0[(size_t)t * rows + o], add);
                                    if (!same_float(want, got)) {
                                        snprintf(detail, sizeof detail,
                                                 "int%d%s G %d in %d T %d %s%s: row %d token %d: %.9g, CPU %.9g",
                                                 FORMATS[f].bits, FORMATS[f].head ? " head" : "", G, in, T, path,
                                                 add ? " add" : "", o, t, got, want);
                                        ok = 0;
                                    }
                                }
                            cases++;
                        }
                    }
                }
                free_matrix(&w);
            }
    if (ok)
        snprintf(detail, sizeof detail,
                 "%d cases: int4/int2 blocks, int8/int6/int4 heads, groups 32-256, 256 and 1280 inputs, 1/5/64 tokens, "
                 "store and add, every SIMD path here",
                 cases);
    report("matmul", ok, detail);
    free(x);
    free(y);
    free(y0);
    free(q);
}

// ---- the warp schedule ----

/* quant.cu's warp over one row, lane by lane: unit sums, the group sums
 * its shuffles form, the chains; also checks the chain's visiting order. */
static float warp_row(const lsq_matrix *w, int32_t o, const int8_t *q, float d, char *why, size_t why_len) {
    const int32_t in = w->in, G = w->group, units = in / LSQ_UNIT, ng = in / G, gl = lsq_group_lanes(G);
    const uint8_t *row = w->qweight + (size_t)o * (size_t)lsq_row_bytes(in, w->bits);
    float acc[LSQ_ACCS] = {0};
    int32_t expect[LSQ_ACCS];
    for (int32_t k = 0; k < LSQ_ACCS; k++) expect[k] = k;
    for (int32_t r = 0; r < lsq_rounds(in); r++) {
        int32_t isum[LSQ_WARP], qsum[LSQ_WARP], gis[LSQ_WARP], gqs[LSQ_WARP];
        for (int32_t lane = 0; lane < LSQ_WARP; lane++) {
            int32_t u = LSQ_WARP * r + lane;
            isum[lane] = qsum[lane] = 0;
            if (u >= units) continue;
            uint32_t cw[LSQ_WORDS], qw[LSQ_WORDS];
            lsq_unit_codes(cw, row, in, u, w->bits);
            memcpy(qw, q + (size_t)LSQ_UNIT * u, sizeof qw);
            isum[lane] = lsq_unit_isum(cw, qw, w->bits, &qsum[lane]);
        }
        for (int32_t lane = 0; lane < LSQ_WARP; lane++) { /* the xor butterfly over gl lanes: every lane gets the sum */
            gis[lane] = gqs[lane] = 0;
            for (int32_t l = lane & ~(gl - 1); l < (lane & ~(gl - 1)) + gl; l++) {
                gis[lane] += isum[l];
                gqs[lane] += qsum[l];
            }
        }
        for (int32_t s = 0; s < lsq_chain_steps(G); s++)
            for (int32_t k = 0; k < LSQ_ACCS; k++) {
                int32_t g = lsq_chain_group(r, s, k, G, ng);
                if (g < 0) continue;
                if (g != expect[k]) {
                    snprintf(why, why_len, "round %d step %d: accumulator %d takes group %d, expected %d", r, s, k, g, expect[k]);
                    return NAN;
                }
                expect[k] += LSQ_ACCS;
                int32_t src = lsq_chain_lane(g, G);
                if (src < 0 || src >= LSQ_WARP || (LSQ_WARP * r + src) * LSQ_UNIT != g * G) {
                    snprintf(why, why_len, "group %d read from lane %d of round %d", g, src, r);
                    return NAN;
                }
                float sc = lsq_f16(w->scales[(size_t)o * ng + g]);
                float z = w->zeros ? lsq_f16(w->zeros[(size_t)o * ng + g]) : 0.0f;
                acc[k] = lsq_group_step(acc[k], gis[src], gqs[src], sc, z, w->bits);
            }
    }
    for (int32_t k = 0; k < LSQ_ACCS; k++)
        if (expect[k] < ng) {
            snprintf(why, why_len, "accumulator %d never took group %d", k, expect[k]);
            return NAN;
        }
    return lsq_finish(acc, d, 0.0f, 0);
}

static void check_schedule(void) {
    char detail[320] = "", why[200] = "";
    int ok = 1;
    int32_t cases = 0;
    int8_t *q = malloc(4096);
    float *x = malloc(4096 * sizeof *x);
    for (int32_t f = 0; f < N_FORMATS && ok; f++)
        for (int32_t gi = 0; gi < 4 && ok; gi++) {
            const int32_t G = GROUPS[gi];
            for (int32_t in = G; in <= 3 * LSQ_ROUND_INPUTS + 256 && ok; in += G) {
                if (FORMATS[f].bits == 6 && in % 64 != 0) continue;
                matrix w = random_matrix(FORMATS[f], 2, in, G);
                special_row(x, in, 0);
                float d;
                lsq_quantize_row_ref(q, &d, x, in);
                for (int32_t o = 0; o < 2 && ok; o++) {
                    why[0] = 0;
                    float got = warp_row(&w.m, o, q, d, why, sizeof why);
                    float want = lsq_row_ref(&w.m, o, q, d, 0.0f, 0);
                    if (why[0] || !same_float(got, want)) {
                        snprintf(detail, sizeof detail, "int%d G %d in %d row %d: %s%.9g vs %.9g", FORMATS[f].bits, G, in, o,
                                 why[0] ? why : "", got, want);
                        ok = 0;
                    }
                    cases++;
                }
                free_matrix(&w);
            }
        }
    if (ok) snprintf(detail, sizeof detail, "%d rows: every format and group, rows of one group to 3 rounds + 256 inputs", cases);
    report("schedule", ok, detail);
    free(q);
    free(x);
}

void check_quant(void) {
    check_codes();
    check_activations();
    check_amax_order();
    check_matmul();
    check_schedule();
}
