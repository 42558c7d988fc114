/*
 * quantize.c — the weight quantizer of loopserve.h (ls_quantizer_new,
 * ls_quantize): a call's rows are split into tasks of a few rows on the
 * quantizer's own pool; a task converts its rows to fp32, searches every
 * group of them with its path's kernels (quantize_search.h) and packs the codes
 * into the rows of qweight. Groups are independent, so neither the path,
 * the split nor the thread count changes a byte.
 */
#include <stdatomic.h>
#include <stdlib.h>

#include "cpu/quantize_search.h"
#include "cpu/runtime.h" /* ls_simd_missing */
#include "cpu/threadpool.h"

/* Weights per task: enough to amortise a task's claim, few enough that the
 * tasks of one call balance across the threads. */
#define TASK_WEIGHTS (64 * 1024)

struct ls_quantizer {
    ls_pool *pool;
    int32_t n_threads;
    const ls_qz_ops *ops;
    size_t capacity; /* weights each thread's scratch holds */
    float **rows;    /* per thread: a task's rows as fp32 */
    int8_t **codes;  /* per thread: their codes */
};

static const ls_qz_ops *ops_for(int32_t simd) {
    switch (simd) {
    case LS_SIMD_AVX512: return &ls_qz_ops_avx512;
    case LS_SIMD_AVX2: return &ls_qz_ops_avx2;
    default: return &ls_qz_ops_portable;
    }
}

static void free_scratch(ls_quantizer *q) {
    for (int32_t t = 0; t < q->n_threads && q->rows; t++) {
        free(q->rows[t]);
        free(q->codes[t]);
    }
    free(q->rows);
    free(q->codes);
    q->rows = NULL;
    q->codes = NULL;
    q->capacity = 0;
}

void ls_quantizer_free(ls_quantizer *q) {
    if (!q) return;
    free_scratch(q);
    ls_pool_free(q->pool);
    free(q);
}

ls_quantizer *ls_quantizer_new(int32_t n_threads, int32_t simd, char *err, int32_t err_len) {
    int32_t chosen = simd;
    if (simd == LS_SIMD_AUTO) {
        chosen = !ls_simd_missing(LS_SIMD_AVX512) ? LS_SIMD_AVX512
                 : !ls_simd_missing(LS_SIMD_AVX2) ? LS_SIMD_AVX2
                                                  : LS_SIMD_PORTABLE;
    } else if (simd != LS_SIMD_PORTABLE && simd != LS_SIMD_AVX2 && simd != LS_SIMD_AVX512) {
        ls_set_error(err, err_len, "unknown simd path %d (expected 0 auto, 1 portable, 2 avx2, 3 avx512)", simd);
        return NULL;
    } else if (ls_simd_missing(simd)) {
        ls_set_error(err, err_len, "simd path %s requested but the CPU lacks %s", ls_simd_name(simd),
                     ls_simd_missing(simd));
        return NULL;
    }
    ls_quantizer *q = calloc(1, sizeof *q);
    if (q) q->pool = ls_pool_new(n_threads);
    if (!q || !q->pool) {
        free(q);
        ls_set_error(err, err_len, "could not start the quantizer's thread pool (%d threads requested)", n_threads);
        return NULL;
    }
    q->n_threads = ls_pool_threads(q->pool);
    q->ops = ops_for(chosen);
    return q;
}

int32_t ls_quantizer_simd(const ls_quantizer *q) { return q ? q->ops->simd : LS_ERR_ARG; }

/* Per-thread scratch for tasks of `weights` weights; 0 when out of memory. */
static int reserve(ls_quantizer *q, size_t weights) {
    if (weights <= q->capacity) return 1;
    free_scratch(q);
    q->rows = calloc((size_t)q->n_threads, sizeof *q->rows);
    q->codes = calloc((size_t)q->n_threads, sizeof *q->codes);
    if (!q->rows || !q->codes) return 0;
    for (int32_t t = 0; t < q->n_threads; t++) {
        q->rows[t] = malloc(weights * sizeof(float));
        q->codes[t] = malloc(weights);
        if (!q->rows[t] || !q->codes[t]) return 0;
    }
    q->capacity = weights;
    return 1;
}

static size_t input_size(int32_t input) { return input == LS_QUANTIZE_F32 ? 4 : 2; }

/* One row's codes (cols of them) into its bytes of qweight. */
static void pack_row(uint8_t *out, const int8_t *c, int32_t cols, int32_t bits) {
    switch (bits) {
    case 8: memcpy(out, c, (size_t)cols); break;
    case 4:
        for (int32_t j = 0; j < cols / 2; j++) out[j] = (uint8_t)((c[2 * j] + 8) | ((c[2 * j + 1] + 8) << 4));
        break;
    case 2:
        for (int32_t j = 0; j < cols / 4; j++)
            out[j] = (uint8_t)(c[4 * j] | (c[4 * j + 1] << 2) | (c[4 * j + 2] << 4) | (c[4 * j + 3] << 6));
        break;
    default: /* 6: u = c + 32; its low nibbles as int4's, then its high two bits (loopserve.h) */
        for (int32_t j = 0; j < cols / 2; j++) out[j] = (uint8_t)(((c[2 * j] + 32) & 15) | (((c[2 * j + 1] + 32) & 15) << 4));
        for (int32_t b = 0; b < cols / 64; b++)
            for (int32_t j = 0; j < 16; j++) {
                uint8_t v = 0;
                for (int32_t half = 0; half < 2; half++)
                    for (int32_t e = 0; e < 2; e++)
                        v |= (uint8_t)(((c[64 * b + 2 * (16 * half + j) + e] + 32) >> 4) << (4 * half + 2 * e));
                out[cols / 2 + 16 * b + j] = v;
            }
        break;
    }
}

/* L of the symmetric formats: codes in [-L - 1, L]. */
static int32_t symmetric_max(int32_t bits) { return bits == 6 ? 31 : 7; }

typedef struct {
    ls_quantizer *q;
    const ls_quantize_params *p;
    const uint8_t *src;
    int32_t rows, rows_per_task;
    uint8_t *qweight;
    uint16_t *scales, *zeros;
    _Atomic int64_t first_bad_row; /* rows when none */
} job;

static void run_task(void *ctx, int32_t task, int32_t thread) {
    job *jb = ctx;
    const ls_quantize_params *p = jb->p;
    const ls_qz_ops *ops = jb->q->ops;
    const int32_t r0 = task * jb->rows_per_task;
    const int32_t r1 = r0 + jb->rows_per_task < jb->rows ? r0 + jb->rows_per_task : jb->rows;
    const int32_t ng = p->cols / p->group;
    const int64_t n = (int64_t)(r1 - r0) * ng;
    float *w = jb->q->rows[thread];
    int8_t *codes = jb->q->codes[thread];
    ops->to_f32(w, jb->src + (size_t)r0 * (size_t)p->cols * input_size(p->input), p->input, (int64_t)(r1 - r0) * p->cols);
    uint16_t *scales = jb->scales + (size_t)r0 * (size_t)ng;
    ls_qz_fault fault;
    const int64_t bad = p->bits == 2   ? ops->offset(w, n, p->group, scales, jb->zeros + (size_t)r0 * (size_t)ng, codes)
                        : p->bits == 8 ? ls_qz_int8(w, n, p->group, scales, codes, &fault)
                                       : ops->symmetric(w, n, p->group, symmetric_max(p->bits), scales, codes);
    if (bad >= 0) {
        const int64_t row = r0 + bad / ng;
        int64_t seen = atomic_load(&jb->first_bad_row);
        while (row < seen && !atomic_compare_exchange_weak(&jb->first_bad_row, &seen, row)) {
        }
        return;
    }
    const size_t row_bytes = (size_t)p->cols * (size_t)p->bits / 8;
    for (int32_t r = r0; r < r1; r++)
        pack_row(jb->qweight + (size_t)r * row_bytes, codes + (size_t)(r - r0) * (size_t)p->cols, p->cols, p->bits);
}

/* Whether one group cannot be quantized, by the portable path: then why in *fault. */
static int group_fails(const ls_quantize_params *p, const float *w, int8_t *codes, ls_qz_fault *fault) {
    uint16_t s, z;
    switch (p->bits) {
    case 2: return ls_qz_offset_group(w, p->group, &s, &z, codes, fault) < 0;
    case 8: return ls_qz_int8(w, 1, p->group, &s, codes, fault) >= 0;
    default: return ls_qz_symmetric_group(w, p->group, symmetric_max(p->bits), &s, codes, fault) < 0;
    }
}

/* The reason row `row` cannot be quantized, into err. */
static void explain(const ls_quantize_params *p, const uint8_t *src, int64_t row, char *err, int32_t err_len) {
    float *w = malloc((size_t)p->cols * sizeof *w);
    int8_t *codes = malloc((size_t)p->cols);
    ls_set_error(err, err_len, "row %lld: a group's scale does not fit in fp16", (long long)row);
    for (int32_t g = 0; w && codes && g < p->cols / p->group; g++) {
        if (g == 0) ls_qz_ops_portable.to_f32(w, src + (size_t)row * (size_t)p->cols * input_size(p->input), p->input, p->cols);
        ls_qz_fault fault = {0, 0, 0};
        if (!group_fails(p, w + (size_t)g * (size_t)p->group, codes, &fault)) continue;
        if (p->bits == 2)
            ls_set_error(err, err_len, "row %lld, group %d: weights [%.9g, %.9g] do not fit in fp16 offsets",
                         (long long)row, g, fault.lo, fault.hi);
        else
            ls_set_error(err, err_len,
                         "row %lld, group %d: a group's scale %.9g does not fit in fp16 (weights too large or not finite)",
                         (long long)row, g, fault.scale);
        break;
    }
    free(w);
    free(codes);
}

static int check_params(const ls_quantize_params *p, const void *src, int32_t rows, const uint8_t *qweight,
                        const uint16_t *scales, const uint16_t *zeros, char *err, int32_t err_len) {
    if (!p || (rows > 0 && (!src || !qweight || !scales))) {
        ls_set_error(err, err_len, "params, src, qweight and scales must not be NULL");
        return 0;
    }
    if (p->bits != 2 && p->bits != 4 && p->bits != 6 && p->bits != 8) {
        ls_set_error(err, err_len, "bits must be 2, 4, 6 or 8, got %d", p->bits);
        return 0;
    }
    if (p->group < LS_QUANT_GROUP_MIN || p->group > LS_QUANT_GROUP_MAX || (p->group & (p->group - 1))) {
        ls_set_error(err, err_len, "group must be a power of two in [%d, %d], got %d", LS_QUANT_GROUP_MIN,
                     LS_QUANT_GROUP_MAX, p->group);
        return 0;
    }
    if (p->cols < 1 || p->cols > LS_MAX_FFN_DIM || p->cols % p->group || (p->bits == 6 && p->cols % 64)) {
        ls_set_error(err, err_len, "cols %d must be in 1..%d and a multiple of the group %d%s", p->cols,
                     LS_MAX_FFN_DIM, p->group, p->bits == 6 ? " and of 64 (int6)" : "");
        return 0;
    }
    if (p->input != LS_QUANTIZE_F32 && p->input != LS_QUANTIZE_F16 && p->input != LS_QUANTIZE_BF16) {
        ls_set_error(err, err_len, "input must be LS_QUANTIZE_F32, F16 or BF16, got %d", p->input);
        return 0;
    }
    if (rows < 0 || (p->bits == 2) != (zeros != NULL)) {
        ls_set_error(err, err_len, rows < 0 ? "rows must not be negative" : "zeros must be given for bits 2 and only then");
        return 0;
    }
    return 1;
}

int32_t ls_quantize(ls_quantizer *q, const ls_quantize_params *p, const void *src, int32_t rows, uint8_t *qweight,
                    uint16_t *scales, uint16_t *zeros, char *err, int32_t err_len) {
    if (!q) {
        ls_set_error(err, err_len, "no quantizer");
        return LS_ERR_ARG;
    }
    if (!check_params(p, src, rows, qweight, scales, zeros, err, err_len)) return LS_ERR_ARG;
    if (rows == 0) return LS_OK;
    const int32_t rows_per_task = p->cols >= TASK_WEIGHTS ? 1 : TASK_WEIGHTS / p->cols;
    if (!reserve(q, (size_t)rows_per_task * (size_t)p->cols)) {
        free_scratch(q);
        ls_set_error(err, err_len, "out of memory for the quantizer's scratch");
        return LS_ERR_NOMEM;
    }
    job jb = {.q = q, .p = p, .src = src, .rows = rows, .rows_per_task = rows_per_task, .qweight = qweight,
              .scales = scales, .zeros = zeros, .first_bad_row = rows};
    ls_pool_run(q->pool, run_task, &jb, (rows + rows_per_task - 1) / rows_per_task);
    const int64_t bad = atomic_load(&jb.first_bad_row);
    if (bad < rows) {
        explain(p, src, bad, err, err_len);
        return LS_ERR_ARG;
    }
    return LS_OK;
}
