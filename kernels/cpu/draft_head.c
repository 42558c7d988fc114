/*
 * draft_head.c — the output head speculative drafts use (spec.c).
 *
 * A draft runs the head once per drafted token, unbatched: vocab x dim
 * weights streamed for one row of activations, the largest cost of a
 * cycle. A proposal only has to be likely, not exact, so drafts score every
 * token with a 2-bit copy of the head (four levels per row: 9.6 MB for the
 * GPT-2 vocabulary at dim 768, an eighth of the fp16 head, small enough to
 * stay in L3 next to the block between the drafts of a cycle; int4 at twice
 * the bytes does not, and reads from memory each time), then score the best
 * few of those again with the model's own head. The greedy proposal is the
 * exact head's choice whenever that choice is among the coarse head's best
 * few, which costs a handful of rows.
 *
 * The coarse scores are integer dot products (exact on every path) followed
 * by the same fp32 steps, so the proposal does not depend on the SIMD path
 * or the thread count:
 *   x8 = rne(xn * 127 / max|xn|), clamped to [-127, 127], NaN -> 0
 *        (quant.h's activation rule: ls_quant_rows, the whole row one group)
 *   w ~= (u - 1.5) * s, u in 0..3, s fitted per row by least squares
 *   score(row) = ((float)(2 * sum u * x8 - 3 * sum x8) * (s / 2)) * xs
 *
 * Code layout, per row of ld / 4 bytes (ld = dim rounded up to 256, code
 * 1 past dim: any code works there, the activations are zero): 64-byte
 * block b holds input 256b + 64f + j in bits 2f, 2f + 1 of its byte j, so
 * one load and a shift and mask per field give four 64-input vectors in
 * natural order.
 *
 * The integer dot products are the quantized kernels' (quant.h dot_u2, one
 * per SIMD path, picked as the model's quantized matmuls are). The head
 * lives in the runtime's LS_RUNTIME_EXT_DRAFT_HEAD slot.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "draft_head.h"
#include "forward.h"
#include "quant.h"
#include "runtime.h"
#include "sampling.h"

#define MAX_TASKS 64 /* score tasks per call: ~8 per thread, capped */

struct ls_draft_head {
    uint8_t *codes;   /* (vocab, ldb) 2-bit codes, layout above */
    float *scale;     /* (vocab) s / 2 of each row */
    int32_t ld, ldb;  /* inputs per row (dim rounded up to 256), bytes per row */
    const ls_qops *qops; /* dot_u2 for this CPU and SIMD choice */
    /* the last ls_draft_head_coarse call's activations */
    float *xn;        /* (dim) rmsnorm(h) */
    ls_qact *act;     /* its int8 codes q (zero padded to ld), scale d[0], sum qsum[0] */
    int32_t *isum;    /* (vocab) integer dot products */
    int32_t best[MAX_TASKS * LS_DRAFT_BEST], have[MAX_TASKS]; /* score tasks' best ids */
};

typedef struct {
    const ls_draft_head *d;
    int32_t rows, rows_per_task, n_best;
    float *logits;
    int32_t *best, *have; /* (tasks, n_best) each task's best ids, ranked; (tasks) how many */
} score_job;

static void score_task(void *ctx, int32_t task, int32_t thread) {
    (void)thread;
    const score_job *j = ctx;
    const ls_draft_head *d = j->d;
    int32_t r0 = task * j->rows_per_task, r1 = r0 + j->rows_per_task < j->rows ? r0 + j->rows_per_task : j->rows;
    d->qops->dot_u2(d->isum, d->codes, d->ldb, d->act->q, r0, r1);
    const int32_t offset = 3 * d->act->qsum[0];
    const float xs = d->act->d[0];
    int32_t *best = j->best + (size_t)task * j->n_best, have = 0;
    for (int32_t r = r0; r < r1; r++) {
        float v = ((float)(2 * d->isum[r] - offset) * d->scale[r]) * xs;
        j->logits[r] = v == v ? v : -INFINITY;
        ls_rank_insert(j->logits, r, best, &have, j->n_best);
    }
    j->have[task] = have;
}

// ---- building ----

typedef struct {
    const ls_model *m;
    ls_draft_head *d;
    float *buf; /* (n_threads, dim) */
    int32_t rows_per_task;
} build_job;

/* Row r of the model's head as fp32: the fp16 head, or the stored quantized one dequantized. */
static void head_row(const ls_model *m, int32_t r, float *f) {
    int32_t dim = m->info.dim;
    if (m->w.output) {
        m->rt->ops->f16_to_f32(f, m->w.output + (size_t)r * dim, dim);
        return;
    }
    ls_quant_row_f32(m->w.qoutput, r, f);
}

/* The code u in 0..3 whose level u - 1.5 is nearest to t = w / s (NaN ->
 * 0). Branch-free: the codes of random weights defeat a branch predictor,
 * and this runs for every weight of the head. */
static inline int32_t code_of(float t) {
    float c = t + 2.0f;
    c = c > 0.0f ? c : 0.0f;
    c = c < 3.5f ? c : 3.5f;
    return (int32_t)c;
}

static void build_task(void *ctx, int32_t task, int32_t thread) {
    const build_job *j = ctx;
    ls_draft_head *d = j->d;
    int32_t dim = j->m->info.dim, V = j->m->info.vocab_size;
    float *f = j->buf + (size_t)thread * dim;
    int32_t r0 = task * j->rows_per_task, r1 = r0 + j->rows_per_task < V ? r0 + j->rows_per_task : V;
    for (int32_t r = r0; r < r1; r++) {
        head_row(j->m, r, f);
        /* Lloyd's iteration for the step s of levels (u - 1.5) * s, from
         * the Gaussian optimum s ~= rms; two rounds settle it */
        float ss = 0.0f;
        for (int32_t i = 0; i < dim; i++) ss += f[i] * f[i];
        float s = sqrtf(ss / (float)dim);
        for (int it = 0; it < 2 && s > 0.0f; it++) {
            float inv = 1.0f / s, num = 0.0f, den = 0.0f;
            for (int32_t i = 0; i < dim; i++) {
                float l = (float)code_of(f[i] * inv) - 1.5f;
                num += l * f[i];
                den += l * l;
            }
            s = den > 0.0f ? num / den : 0.0f;
        }
        float inv = s > 0.0f ? 1.0f / s : 0.0f;
        uint8_t *row = d->codes + (size_t)r * d->ldb;
        for (int32_t i = 0; i < d->ld; i++) {
            int32_t u = i < dim && s > 0.0f ? code_of(f[i] * inv) : 1;
            row[i / 256 * 64 + i % 64] |= (uint8_t)(u << (2 * (i % 256 / 64)));
        }
        s *= 0.5f;
        d->scale[r] = s;
    }
}

static void head_free(void *state) {
    ls_draft_head *d = state;
    ls_qact_free(d->act);
    void *bufs[] = {d->codes, d->scale, d->xn, d->isum, d};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
}

static ls_draft_head *head_of(const ls_runtime *rt) { return rt->ext[LS_RUNTIME_EXT_DRAFT_HEAD].state; }

int32_t ls_draft_head_build(ls_model *m) {
    ls_runtime *rt = m->rt;
    if (head_of(rt)) return LS_OK;
    int32_t dim = m->info.dim, V = m->info.vocab_size;
    ls_draft_head *d = calloc(1, sizeof *d);
    if (!d) return LS_ERR_NOMEM;
    /* the codes' rows are as long as the activations' (dim rounded up to
     * LS_QACT_PAD), which the 256-input blocks of the layout need */
    _Static_assert(LS_QACT_PAD % 256 == 0, "2-bit code blocks span 256 inputs");
    d->act = ls_qact_new(1, dim);
    d->ld = d->act ? d->act->ld : 0;
    d->ldb = d->ld / 4;
    d->codes = calloc((size_t)V * (size_t)d->ldb, 1); /* fields are OR-ed in */
    d->scale = malloc((size_t)V * sizeof(float));
    d->xn = malloc((size_t)dim * sizeof(float));
    d->isum = malloc((size_t)V * sizeof(int32_t));
    float *buf = malloc((size_t)rt->n_threads * (size_t)dim * sizeof(float));
    if (!d->act || !d->codes || !d->scale || !d->xn || !d->isum || !buf) {
        free(buf);
        head_free(d);
        return LS_ERR_NOMEM;
    }
    build_job j = {m, d, buf, 256};
    ls_pool_run(rt->pool, build_task, &j, (V + 255) / 256);
    free(buf);
    d->qops = ls_quant_ops_select(rt->ops->simd);
    rt->ext[LS_RUNTIME_EXT_DRAFT_HEAD] = (ls_ext){d, head_free};
    return LS_OK;
}

// ---- scoring ----

int32_t ls_draft_head_coarse(ls_model *m, const float *h, float *logits, int32_t *best, int32_t n) {
    ls_runtime *rt = m->rt;
    ls_draft_head *d = head_of(rt);
    int32_t dim = m->info.dim, V = m->info.vocab_size;
    if (n > LS_DRAFT_BEST) n = LS_DRAFT_BEST;
    ls_head_input(m, d->xn, h);
    ls_quant_shape(d->act, 1, dim, dim, 8);
    ls_quant_rows(d->act, d->xn, dim, 0, 1, dim, dim);
    int32_t tasks = rt->n_threads * 8 < MAX_TASKS ? rt->n_threads * 8 : MAX_TASKS;
    int32_t rpt = (V + tasks - 1) / tasks;
    rpt = rpt < 64 ? 64 : (rpt + 3) & ~3;
    tasks = (V + rpt - 1) / rpt;
    score_job j = {d, V, rpt, n, logits, d->best, d->have};
    ls_pool_run(rt->pool, score_task, &j, tasks);
    int32_t have = 0;
    for (int32_t t = 0; t < tasks; t++)
        for (int32_t i = 0; i < d->have[t]; i++) ls_rank_insert(logits, d->best[(size_t)t * n + i], best, &have, n);
    return have;
}

void ls_draft_head_exact(ls_model *m, const int32_t *ids, int32_t n, float *logits) {
    ls_runtime *rt = m->rt;
    const ls_draft_head *d = head_of(rt);
    int32_t dim = m->info.dim;
    const ls_qmat *q = m->w.qoutput;
    if (q) ls_quant_prepare(q, d->xn, dim, 1);
    for (int32_t i = 0; i < n; i++) {
        int32_t r = ids[i];
        if (q) ls_quant_matmul(q, logits, 0, r, r + 1, 0);
        else rt->ops->matmul_f16(logits, 0, d->xn, dim, m->w.output, dim, 1, r, r + 1, 0);
    }
}
