/*
 * forward.c — the forward pass of the weight-shared looped block
 * (docs/kernels.md), run with what runtime.c set up.
 *
 * A matmul's work is split across output rows (each task owns whole dot
 * products) or, in a quantized model's long passes (prefill), the pass's
 * tokens are split into parts, each running whole matmuls over its own rows
 * (token parts, below).
 * Every kernel's result for a row is independent of the rows beside it, so
 * results do not depend on the thread count or on either split. Norms and
 * RoPE run in blocks of tokens, each token's arithmetic the same whoever
 * runs it (attention.c does the same for cache writes).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "forward.h"
#include "quant.h"
#include "sampling.h" /* ls_uniform: the first state's generator */
#include "session.h"

// ---- parallel matmuls ----

/* Up to three matrices sharing the input x (q/k/v), or the gate/up pair
 * with the SwiGLU epilogue. Each task owns a row range of one segment. */
typedef struct {
    const uint16_t *w; /* (rows, in) */
    float *y;          /* (T, ldy) */
    int32_t ldy, rows;
    const ls_qmat *q;      /* quantized weights (w is NULL), or NULL */
    int32_t rows_per_task; /* mm_run sets it */
} mm_seg;

typedef struct {
    const ls_ops *ops;
    const float *x; /* (T, ldx) */
    int32_t ldx, in, T, add;
    int32_t n_seg;
    mm_seg seg[3];
    int32_t first_task[4]; /* task index where each segment starts */
    int32_t swiglu;        /* seg[0] = W1 -> gate, seg[1] = W3 -> up: one task does both */
    const ls_qact *act;    /* the prepared activations: the model's scratch (NULL) or a token part's */
} mm_job;

static void quant_matmul(const mm_job *j, const mm_seg *sg, int32_t o0, int32_t o1, int32_t add) {
    ls_quant_matmul_in(j->act ? j->act : sg->q->act, sg->q, sg->y, sg->ldy, o0, o1, add);
}

/* Rows [o0, o1) of segment si (and the up rows and SwiGLU of a gate/up job). */
static void mm_rows(const mm_job *j, int32_t si, int32_t o0, int32_t o1) {
    const mm_seg *sg = &j->seg[si];
    if (sg->q) quant_matmul(j, sg, o0, o1, j->add);
    else j->ops->matmul_f16(sg->y, sg->ldy, j->x, j->ldx, sg->w, j->in, j->T, o0, o1, j->add);
    if (j->swiglu) {
        const mm_seg *up = &j->seg[1];
        if (up->q) quant_matmul(j, up, o0, o1, 0);
        else j->ops->matmul_f16(up->y, up->ldy, j->x, j->ldx, up->w, j->in, j->T, o0, o1, 0);
        for (int32_t t = 0; t < j->T; t++) {
            float *g = sg->y + (size_t)t * sg->ldy + o0;
            const float *u = up->y + (size_t)t * up->ldy + o0;
            if (j->ops->swiglu) j->ops->swiglu(g, u, o1 - o0);
            else
                for (int32_t o = 0; o < o1 - o0; o++) g[o] = g[o] / (1.0f + expf(-g[o])) * u[o];
        }
    }
}

static void mm_task(void *ctx, int32_t task, int32_t thread) {
    (void)thread;
    const mm_job *j = ctx;
    int32_t si = 0;
    while (task >= j->first_task[si + 1]) si++;
    const int32_t rpt = j->seg[si].rows_per_task;
    int32_t o0 = (task - j->first_task[si]) * rpt;
    int32_t o1 = o0 + rpt < j->seg[si].rows ? o0 + rpt : j->seg[si].rows;
    mm_rows(j, si, o0, o1);
}

/* A job of fewer multiply-adds than this runs on the calling thread alone:
 * split, its inputs and outputs would cross between the cores' caches for
 * more than it saves; fp16 costs more per multiply-add, hence a quarter
 * (docs/kernels.md#tuning-figures). */
#define SERIAL_MACS_INT ((int64_t)1 << 20)
#define SERIAL_MACS_F16 (SERIAL_MACS_INT / 4)

/* Rows per task: about 8 tasks per thread (dynamic claiming evens out the
 * load), each worth at least ~32K multiply-adds, a multiple of 4 rows; 2
 * per thread for one token, whose matmuls are too short for claims to be
 * free. No task reads more than TASK_WEIGHTS weights, so a core slowed by
 * its neighbour leaves the other little to wait out
 * (docs/kernels.md#tuning-figures). macs_per_row: of all the job's
 * matrices (the gate/up pair's two) for T tokens. */
#define TASK_WEIGHTS ((int64_t)1 << 20)

static int32_t rows_per_task(int32_t rows, int32_t n_threads, int64_t macs_per_row, int32_t T) {
    int32_t target = n_threads * (T == 1 ? 2 : 8);
    int32_t rpt = (rows + target - 1) / target;
    int32_t max_rows = (int32_t)(TASK_WEIGHTS / (macs_per_row / T));
    if (rpt > max_rows) rpt = max_rows;
    int32_t min_rows = (int32_t)((32768 + macs_per_row - 1) / macs_per_row);
    if (rpt < min_rows) rpt = min_rows;
    rpt = (rpt + 3) & ~3;
    return rpt;
}

/* Inputs a call quantizes from before its rows are split over the pool
 * (blocks of QUANT_BLOCK rows); a decode step's few rows stay on the
 * calling thread, where a hand-off would cost about what it saves
 * (docs/kernels.md#tuning-figures). A quantized prefill at up to LS_TOKEN_PARTS_MAX threads runs in token
 * parts instead (below): this serves larger pools, fp16 blocks' quantized
 * heads and batched steps. */
#define QUANT_PARALLEL_INPUTS (1 << 15)
#define QUANT_BLOCK 8

typedef struct {
    const ls_qmat *q;
    const float *x;
    int32_t ldx, T;
} quant_job;

static void quant_task(void *ctx, int32_t task, int32_t thread) {
    (void)thread;
    const quant_job *j = ctx;
    int32_t t0 = task * QUANT_BLOCK, t1 = t0 + QUANT_BLOCK < j->T ? t0 + QUANT_BLOCK : j->T;
    ls_quant_prepare_rows(j->q, j->x, j->ldx, t0, t1);
}

/* The call's activations: each row's bytes are the same whoever quantizes it. */
static void quantize_rows(const ls_runtime *rt, const ls_qmat *q, const float *x, int32_t ldx, int32_t T,
                          int serial) {
    if (serial || (int64_t)T * q->in < QUANT_PARALLEL_INPUTS) {
        ls_quant_prepare(q, x, ldx, T);
        return;
    }
    ls_quant_begin(q, T);
    quant_job j = {q, x, ldx, T};
    ls_pool_run(rt->pool, quant_task, &j, (T + QUANT_BLOCK - 1) / QUANT_BLOCK);
}

/* Matrices that cannot share one prepared activation (a q/k/v job of an
 * int2 model keeping wv at int4, on a path where their activations' forms
 * differ) run as consecutive jobs: when some segment cannot use seg[0]'s,
 * j keeps the segments before it and *rest gets the others (returns 1).
 * The gate/up pair is one format (model.c). */
static int split_unshared(mm_job *j, mm_job *rest) {
    for (int32_t i = 1; i < j->n_seg && j->seg[0].q; i++) {
        if (ls_quant_act_shared(j->seg[0].q, j->seg[i].q, j->T)) continue;
        *rest = *j;
        rest->n_seg = j->n_seg - i;
        memmove(rest->seg, j->seg + i, (size_t)rest->n_seg * sizeof rest->seg[0]);
        j->n_seg = i;
        return 1;
    }
    return 0;
}

static void mm_run(const ls_runtime *rt, mm_job *j) {
    mm_job rest;
    if (split_unshared(j, &rest)) {
        mm_run(rt, j);
        mm_run(rt, &rest);
        return;
    }
    int32_t total_rows = 0;
    for (int32_t i = 0; i < j->n_seg; i++) total_rows += j->seg[i].rows;
    j->ops = rt->ops;
    const int64_t macs_per_row = (int64_t)j->in * j->T * (j->swiglu ? 2 : 1);
    const int64_t serial_macs = j->seg[0].q ? SERIAL_MACS_INT : SERIAL_MACS_F16;
    const int serial = rt->n_threads <= 1 || macs_per_row * total_rows < serial_macs;
    const int32_t rpt = serial ? total_rows : rows_per_task(total_rows, rt->n_threads, macs_per_row, j->T);
    j->first_task[0] = 0;
    for (int32_t i = 0; i < j->n_seg; i++) {
        /* A segment's tasks of one size, so the threads' contiguous ranges
         * of tasks (threadpool.c) hold equal rows (docs/kernels.md#tuning-figures). */
        mm_seg *sg = &j->seg[i];
        int32_t n = (sg->rows + rpt - 1) / rpt;
        sg->rows_per_task = ((sg->rows + n - 1) / n + 3) & ~3;
        j->first_task[i + 1] = j->first_task[i] + (sg->rows + sg->rows_per_task - 1) / sg->rows_per_task;
    }
    if (j->seg[0].q) quantize_rows(rt, j->seg[0].q, j->x, j->ldx, j->T, serial); /* activations, once per call */
    ls_pool_run(serial ? NULL : rt->pool, mm_task, j, j->first_task[j->n_seg]); /* NULL: in turn here */
}

/* The whole job on the calling thread, its activations prepared once in
 * act (a token part's scratch). */
static void mm_on_thread(const ls_runtime *rt, mm_job *j, ls_qact *act) {
    mm_job rest;
    if (split_unshared(j, &rest)) {
        mm_on_thread(rt, j, act);
        mm_on_thread(rt, &rest, act);
        return;
    }
    j->ops = rt->ops;
    j->act = act;
    if (j->seg[0].q) ls_quant_prepare_in(act, j->seg[0].q, j->x, j->ldx, j->T);
    for (int32_t i = 0; i < j->n_seg; i++) mm_rows(j, i, 0, j->seg[i].rows);
}

// ---- per-token work ----

/* rmsnorm of T rows, or RoPE of T tokens' q/k, in blocks of TOK_BLOCK
 * tokens on the pool: each token's arithmetic is the same whoever runs it. */
#define TOK_BLOCK 8

typedef struct {
    const ls_ops *ops;
    float *out;
    const float *x, *w;
    int32_t dim;
    float eps;
    /* rope: q and k rows of n_heads * hd and n_kv * hd, their biases added first (NULL: none) */
    float *q, *k;
    const float *rope;
    const float *q_bias, *k_bias;
    int32_t n_heads, n_kv, hd, T, interleaved;
} tok_job;

static void norm_range(const tok_job *j, int32_t t0, int32_t t1) {
    for (int32_t t = t0; t < t1; t++)
        j->ops->rmsnorm(j->out + (size_t)t * j->dim, j->x + (size_t)t * j->dim, j->w, j->dim, j->eps);
}

/* RoPE on adjacent pairs: (x[2i], x[2i + 1]) of each head rotated by cs[i]
 * (the GPT-J / Huginn layout). Plain C, the same on every path. */
static void rope_interleaved(float *x, int32_t n_heads, int32_t hd, const float *cs) {
    for (int32_t h = 0; h < n_heads; h++)
        for (int32_t i = 0; i < hd / 2; i++) {
            float *p = x + (size_t)h * hd + 2 * i, a = p[0], b = p[1], c = cs[2 * i], sn = cs[2 * i + 1];
            p[0] = a * c - b * sn;
            p[1] = b * c + a * sn;
        }
}

static void add_bias(float *x, const float *bias, int32_t n) {
    for (int32_t i = 0; i < n; i++) x[i] += bias[i];
}

static void rope_range(const tok_job *j, int32_t t0, int32_t t1) {
    const int32_t q_dim = j->n_heads * j->hd, kv_dim = j->n_kv * j->hd;
    for (int32_t t = t0; t < t1; t++) {
        const float *cs = j->rope + (size_t)t * j->hd;
        float *q = j->q + (size_t)t * q_dim, *k = j->k + (size_t)t * kv_dim;
        if (j->q_bias) {
            add_bias(q, j->q_bias, q_dim);
            add_bias(k, j->k_bias, kv_dim);
        }
        if (j->interleaved) {
            rope_interleaved(q, j->n_heads, j->hd, cs);
            rope_interleaved(k, j->n_kv, j->hd, cs);
            continue;
        }
        j->ops->rope(q, j->n_heads, j->hd, cs);
        j->ops->rope(k, j->n_kv, j->hd, cs);
    }
}

static void norm_task(void *ctx, int32_t task, int32_t thread) {
    (void)thread;
    const tok_job *j = ctx;
    norm_range(j, task * TOK_BLOCK, (task + 1) * TOK_BLOCK < j->T ? (task + 1) * TOK_BLOCK : j->T);
}

static void rope_task(void *ctx, int32_t task, int32_t thread) {
    (void)thread;
    const tok_job *j = ctx;
    rope_range(j, task * TOK_BLOCK, (task + 1) * TOK_BLOCK < j->T ? (task + 1) * TOK_BLOCK : j->T);
}

// ---- token parts ----

/* A quantized model's pass over at least this many rows per thread splits
 * its rows into one part per thread (up to LS_TOKEN_PARTS_MAX), each part
 * running the sub-block's norms, matmuls and RoPE over its own rows on one
 * thread, instead of every matmul splitting its output rows over the pool.
 * A matmul's arithmetic per row does not depend on the rows beside it
 * (batch invariance), so the bits are the same either way; what changes is
 * what crosses between the cores and how often they wait for each other.
 * Split by output rows, every matmul needs all of its input rows on every
 * core and leaves each core a slice of every output row, and a loop takes
 * about ten pool hand-offs; in parts, only the attention reads what another
 * part wrote, and a loop takes three: a part also stores its own rows' K/V
 * (the store callback), so the attention job needs no store job before it.
 * Each part reads all of the weights, which pays for the quantized copies
 * but not for fp16's twice-as-large ones: fp16 blocks stay split by rows
 * (docs/kernels.md#tuning-figures). */
#define PART_MIN_ROWS 16

/* Parts for a pass of T rows: rt->n_parts (one per thread; 1 for fp16
 * blocks, or where the pool has more threads than LS_TOKEN_PARTS_MAX, as a
 * chunk's 64 rows would leave threads idle), or 1 where that leaves a part
 * fewer than PART_MIN_ROWS rows. */
static int32_t parts_for(const ls_runtime *rt, int32_t T) {
    return rt->n_parts > 1 && T >= PART_MIN_ROWS * rt->n_parts ? rt->n_parts : 1;
}

/* One sub-block's stages over rows [t0, t1): all on the calling thread (a
 * token part, its quantized activations in act), or each stage over the
 * whole pool. */
typedef struct {
    const ls_model *m;
    const ls_block *b;
    int on_thread;
    ls_qact *act;         /* the part's scratch (quantized models) */
    double *prof;         /* profile clock (the calling thread's), or NULL */
    ls_block_store store; /* a part stores its rows' K/V after RoPE, or NULL */
    void *ctx;            /* store's */
    int32_t unit, thread;
} stage_ctx;

static void stage_prof(const stage_ctx *c, int32_t op) {
    if (c->prof) ls_prof_add(c->m->rt, op, c->prof);
}

static void stage_norm(const stage_ctx *c, float *out, const float *x, const float *w, int32_t T) {
    const ls_runtime *rt = c->m->rt;
    tok_job j = {.ops = rt->ops, .out = out, .x = x, .w = w, .dim = c->m->info.dim, .eps = c->m->info.norm_eps, .T = T};
    if (c->on_thread) norm_range(&j, 0, T);
    else ls_pool_run(rt->pool, norm_task, &j, (T + TOK_BLOCK - 1) / TOK_BLOCK);
}

static void stage_mm(const stage_ctx *c, mm_job *j) {
    if (c->on_thread) mm_on_thread(c->m->rt, j, c->act);
    else mm_run(c->m->rt, j);
}

/* The attention sub-block up to attention: norm, q/k/v, RoPE. */
static void stage_attention_in(const stage_ctx *c, int32_t t0, int32_t t1) {
    const ls_model *m = c->m;
    const ls_model_info *mi = &m->info;
    const ls_runtime *rt = m->rt;
    const ls_block *b = c->b;
    int32_t dim = mi->dim, hd = mi->head_dim, q_dim = mi->n_heads * hd, kv_dim = mi->n_kv_heads * hd, T = t1 - t0;
    const int32_t layer = LS_UNIT_LAYER(m, c->unit);
    const ls_layer_weights *w = &m->w.layers[layer];
    float *xb = b->xb + (size_t)t0 * dim, *q = b->q + (size_t)t0 * q_dim, *k = b->k + (size_t)t0 * kv_dim;
    stage_norm(c, xb, b->h + (size_t)t0 * dim, ls_layer_norm(rt, dim, layer, LS_NORM_ATTN), T);
    stage_prof(c, LS_PROF_RMSNORM);
    mm_job qkv = {.x = xb, .ldx = dim, .in = dim, .T = T, .add = 0, .n_seg = 3,
                  .seg = {{w->wq, q, q_dim, q_dim, w->qwq},
                          {w->wk, k, kv_dim, kv_dim, w->qwk},
                          {w->wv, b->v + (size_t)t0 * kv_dim, kv_dim, kv_dim, w->qwv}}};
    stage_mm(c, &qkv);
    stage_prof(c, LS_PROF_QKV);
    const float *bias = ls_layer_qk_bias(rt, mi, layer);
    tok_job rj = {.ops = rt->ops, .q = q, .k = k, .rope = b->rope + (size_t)t0 * hd, .q_bias = bias,
                  .k_bias = bias ? bias + q_dim : NULL, .n_heads = mi->n_heads, .n_kv = mi->n_kv_heads, .hd = hd,
                  .T = T, .interleaved = mi->rope_interleaved};
    if (c->on_thread) rope_range(&rj, 0, T);
    else ls_pool_run(rt->pool, rope_task, &rj, (T + TOK_BLOCK - 1) / TOK_BLOCK);
    if (c->on_thread && c->store) c->store(c->ctx, c->unit, t0, t1, c->thread);
}

/* h += x (T rows of dim). */
static void residual_add(float *h, const float *x, int32_t T, int32_t dim) {
    for (size_t i = 0; i < (size_t)T * (size_t)dim; i++) h[i] += x[i];
}

/* A sublayer's output y (T rows, in the block's xb) onto the residual h:
 * added by the matmul itself (then, in the sandwich_sum layout, the sum
 * normed), or, with sandwich norms, normed first. */
static void sublayer_out(const stage_ctx *c, mm_job *j, float *h, int32_t T, const float *out_norm) {
    const int32_t dim = c->m->info.dim;
    if (c->m->info.sandwich_norm != LS_NORM_SANDWICH) {
        j->seg[0].y = h;
        j->add = 1;
        stage_mm(c, j);
        if (c->m->info.sandwich_norm == LS_NORM_SANDWICH_SUM) stage_norm(c, h, h, out_norm, T);
        return;
    }
    float *y = j->seg[0].y;
    j->add = 0;
    stage_mm(c, j);
    stage_norm(c, y, y, out_norm, T);
    residual_add(h, y, T, dim);
}

/* From the attention output on: wo and the residual, norm, the feed-forward
 * and its residual; after a step's last layer, the step norm. */
static void stage_rest(const stage_ctx *c, int32_t t0, int32_t t1) {
    const ls_model *m = c->m;
    const ls_model_info *mi = &m->info;
    const ls_runtime *rt = m->rt;
    const ls_block *b = c->b;
    int32_t dim = mi->dim, ffn = mi->ffn_dim, q_dim = mi->n_heads * mi->head_dim, T = t1 - t0;
    const int32_t layer = LS_UNIT_LAYER(m, c->unit);
    const ls_layer_weights *w = &m->w.layers[layer];
    float *h = b->h + (size_t)t0 * dim, *xb = b->xb + (size_t)t0 * dim, *g = b->g + (size_t)t0 * ffn;
    mm_job wo = {.x = b->att + (size_t)t0 * q_dim, .ldx = q_dim, .in = q_dim, .T = T, .n_seg = 1,
                 .seg = {{w->wo, xb, dim, dim, w->qwo}}};
    sublayer_out(c, &wo, h, T, ls_layer_norm(rt, dim, layer, LS_NORM_ATTN_OUT));
    stage_prof(c, LS_PROF_WO);
    stage_norm(c, xb, h, ls_layer_norm(rt, dim, layer, LS_NORM_FFN), T);
    stage_prof(c, LS_PROF_RMSNORM);
    mm_job gate = {.x = xb, .ldx = dim, .in = dim, .T = T, .add = 0, .n_seg = 1, .swiglu = 1,
                   .seg = {{w->w1, g, ffn, ffn, w->qw1}, {w->w3, b->u + (size_t)t0 * ffn, ffn, ffn, w->qw3}}};
    stage_mm(c, &gate);
    stage_prof(c, LS_PROF_FFN_GATE_UP);
    mm_job down = {.x = g, .ldx = ffn, .in = ffn, .T = T, .n_seg = 1, .seg = {{w->w2, xb, dim, dim, w->qw2}}};
    sublayer_out(c, &down, h, T, ls_layer_norm(rt, dim, layer, LS_NORM_FFN_OUT));
    if (mi->step_norm && c->unit >= 0 && layer == mi->n_layers - 1) stage_norm(c, h, h, rt->norm, T);
}

/* A stage over rows [lo, T) in token parts on the pool, part p its task p.
 * The pool deals task t to thread t when there are as many tasks as
 * threads, and to the same thread on every call otherwise, so a part's
 * rows stay in one core's cache from stage to stage. */
typedef struct {
    stage_ctx c;
    void (*stage)(const stage_ctx *c, int32_t t0, int32_t t1);
    int32_t lo, T, parts;
} parts_job;

static void part_task(void *ctx, int32_t part, int32_t thread) {
    const parts_job *j = ctx;
    stage_ctx c = j->c;
    c.on_thread = 1;
    c.thread = thread;
    c.act = j->c.m->rt->part_act[part];
    if (thread != 0) c.prof = NULL; /* the profile is the calling thread's */
    // Parts start at lo plus a multiple of 4 rows, the quantized tiles' width.
    int32_t n = j->T - j->lo, t0 = j->lo + (int32_t)((int64_t)n * part / j->parts) / 4 * 4;
    int32_t t1 = part + 1 == j->parts ? j->T : j->lo + (int32_t)((int64_t)n * (part + 1) / j->parts) / 4 * 4;
    j->stage(&c, t0, t1);
}

/* stage over rows [lo, T): in token parts where there are enough rows
 * (returns 1), else each of its steps over the whole pool (0). */
static int run_stage(const ls_model *m, const ls_block *b, void (*stage)(const stage_ctx *, int32_t, int32_t),
                     int32_t lo, int32_t T, double *prof, ls_block_store store, void *ctx, int32_t unit) {
    stage_ctx c = {m, b, 0, NULL, m->rt->profile ? prof : NULL, store, ctx, unit, 0};
    int32_t parts = parts_for(m->rt, T - lo);
    if (parts > 1) {
        parts_job j = {c, stage, lo, T, parts};
        ls_pool_run(m->rt->pool, part_task, &j, parts);
        return 1;
    }
    stage(&c, lo, T);
    return 0;
}

// ---- forward ----

void ls_forward_embed(ls_session *s, const int32_t *tokens, int32_t n, float *h) {
    const ls_model *m = s->m;
    int32_t dim = m->info.dim;
    const float scale = m->info.embed_scale;
    double t0 = ls_prof_now(m->rt);
    for (int32_t t = 0; t < n; t++) {
        float *row = h + (size_t)t * dim;
        if (m->w.tok_embeddings) m->rt->ops->f16_to_f32(row, m->w.tok_embeddings + (size_t)tokens[t] * dim, dim);
        else ls_quant_row_f32(m->w.qoutput, tokens[t], row); /* tied to the quantized head */
        if (scale != 1.0f)
            for (int32_t i = 0; i < dim; i++) row[i] *= scale;
    }
    ls_prof_add(m->rt, LS_PROF_EMBED, &t0);
}

/* loopserve.h's generator of the first state: the seed of position pos. */
#define STATE_SEED 0x7374617465ull /* "state" */
#define STATE_ATTEMPTS 64

void ls_state0(const ls_model *m, int32_t pos, float *h) {
    const int32_t dim = m->info.dim;
    const double std = (double)m->info.state_std;
    const uint64_t seed = ls_mix64(STATE_SEED ^ (uint64_t)(uint32_t)pos);
    for (int32_t i = 0; i < dim; i++) {
        double z = 0.0;
        for (int32_t a = 0; a < STATE_ATTEMPTS; a++) {
            const uint64_t c = 2 * ((uint64_t)i * STATE_ATTEMPTS + (uint64_t)a);
            const double u1 = ls_uniform(seed, c), u2 = ls_uniform(seed, c + 1);
            const double v = sqrt(-2.0 * log(1.0 - u1)) * cos(6.283185307179586 * u2);
            if (fabs(v) <= 3.0) {
                z = v;
                break;
            }
        }
        h[i] = (float)(std * z);
    }
}

void ls_forward_mid_norm(const ls_model *m, float *h, int32_t n) {
    if (!m->info.mid_norm) return;
    const int32_t dim = m->info.dim;
    for (int32_t t = 0; t < n; t++) m->rt->ops->rmsnorm(h + (size_t)t * dim, h + (size_t)t * dim, m->rt->norm, dim, m->info.norm_eps);
}

/* A step's input at its first unit: h = adapter . concat[h, e] for every row
 * (LS_INJECT_ADAPTER), the concatenation staged in the block's g. */
static void inject(const ls_model *m, const ls_block *b, int32_t T) {
    const int32_t dim = m->info.dim;
    for (int32_t t = 0; t < T; t++) {
        memcpy(b->g + (size_t)t * 2 * dim, b->h + (size_t)t * dim, (size_t)dim * sizeof *b->g);
        memcpy(b->g + (size_t)t * 2 * dim + dim, b->e + (size_t)t * dim, (size_t)dim * sizeof *b->g);
    }
    mm_job adapter = {.x = b->g, .ldx = 2 * dim, .in = 2 * dim, .T = T, .add = 0, .n_seg = 1,
                      .seg = {{m->w.adapter, b->h, dim, dim, NULL}}};
    mm_run(m->rt, &adapter);
}

void ls_forward_unit(const ls_model *m, const ls_block *b, int32_t T, int32_t skip, int32_t l,
                           ls_block_attention attention, ls_block_store store, void *ctx) {
    ls_runtime *rt = m->rt;
    double t0 = ls_prof_now(rt);
    if (b->e && l >= 0 && l % m->info.n_layers == 0) {
        inject(m, b, T);
        ls_prof_add(rt, LS_PROF_INJECT, &t0);
    }
    const int parts = run_stage(m, b, stage_attention_in, 0, T, &t0, store, ctx, l);
    attention(ctx, l, T, skip, parts && store);
    ls_prof_add(rt, LS_PROF_ATTN, &t0);
    if (skip >= T) return;
    // The rows that go on: [skip, T).
    run_stage(m, b, stage_rest, skip, T, &t0, NULL, NULL, l);
    ls_prof_add(rt, LS_PROF_FFN_DOWN, &t0);
}

/* The attention of one chunk of a session: consecutive positions from
 * pos0, or tree rows. */
typedef struct {
    ls_session *s;
    int32_t pos0;
    const ls_tree_rows *tree;
} chunk_attention;

static void attend_chunk(void *ctx, int32_t unit, int32_t T, int32_t skip, int32_t stored) {
    const chunk_attention *c = ctx;
    if (c->tree)
        ls_attention_tree(c->s, unit, T, c->tree); /* forward_tree never skips; its rows have no store */
    else
        ls_attention(c->s, unit, T, c->pos0, skip, stored);
}

/* A token part's rows of consecutive positions (tree rows keep their
 * cache bookkeeping in ls_attention_tree). */
static void store_chunk(void *ctx, int32_t unit, int32_t t0, int32_t t1, int32_t thread) {
    const chunk_attention *c = ctx;
    ls_attention_store(c->s, unit, c->pos0, t0, t1, c->s->k, c->s->v, thread);
}

/* One chunk (T <= LS_CHUNK) through n units u0, u0 + dir, ...: core units
 * (dir 1) or fixed ones (dir -1); consecutive positions pos0.. when tree is
 * NULL, else the tree rows (offset to this chunk), whose cache bookkeeping is
 * the caller's. Rows [0, skip) of the last unit only store their K/V (their
 * output is not needed). */
static void run_units(ls_session *s, float *h, int32_t T, int32_t pos0, int32_t u0, int32_t n, int32_t dir,
                      const ls_tree_rows *tree, int32_t skip) {
    const ls_model_info *mi = &s->m->info;
    int32_t hd = mi->head_dim;
    if (n < 1) return;
    if (tree)
        for (int32_t t = 0; t < T; t++) ls_rope_table(s->rope + (size_t)t * hd, 1, tree->pos[t], hd, mi->rope_theta);
    else
        ls_rope_table(s->rope, T, pos0, hd, mi->rope_theta);

    const float *e = NULL;
    if (mi->injection != LS_INJECT_NONE) e = tree ? tree->e : s->e + (size_t)pos0 * mi->dim;
    ls_block b = {h, s->xb, s->q, s->k, s->v, s->att, s->g, s->u, s->rope, e};
    chunk_attention att = {s, pos0, tree};
    for (int32_t i = 0; i < n; i++) {
        const int32_t l = u0 + i * dir;
        ls_forward_unit(s->m, &b, T, i == n - 1 ? skip : 0, l, attend_chunk, tree ? NULL : store_chunk, &att);
        if (!tree) ls_seq_advance(s->unit_len, s->unit_lo, ls_unit_index(s->units, l), pos0 + T, s->cap);
    }
}

/* One chunk through core units [la, lb) (run_units). */
static void forward_chunk(ls_session *s, float *h, int32_t T, int32_t pos0, int32_t la, int32_t lb,
                          const ls_tree_rows *tree, int32_t skip) {
    run_units(s, h, T, pos0, la, lb - la, 1, tree, skip);
}

/* Tree rows [c0, c0 + T) of rows, as run_units takes them. */
static ls_tree_rows tree_chunk(const ls_tree_rows *rows, int32_t c0, int32_t dim) {
    return (ls_tree_rows){rows->pos + c0, rows->slot + c0, rows->chain + (size_t)c0 * rows->chain_ld, rows->chain_ld,
                          rows->base, rows->e ? rows->e + (size_t)c0 * dim : NULL};
}

void ls_forward_start(ls_session *s, const int32_t *tokens, int32_t n, int32_t pos0, const ls_tree_rows *rows,
                      float *h) {
    const ls_model *m = s->m;
    const int32_t dim = m->info.dim;
    ls_forward_embed(s, tokens, n, h);
    if (!ls_keeps_prelude(m)) return;
    for (int32_t c0 = 0; c0 < n; c0 += LS_CHUNK) {
        int32_t T = n - c0 < LS_CHUNK ? n - c0 : LS_CHUNK;
        ls_tree_rows chunk = rows ? tree_chunk(rows, c0, dim) : (ls_tree_rows){0};
        float *hc = h + (size_t)c0 * dim;
        run_units(s, hc, T, pos0 + c0, LS_PRELUDE_UNIT(0), m->info.n_prelude, -1, rows ? &chunk : NULL, 0);
        memcpy(rows ? chunk.e : s->e + (size_t)(pos0 + c0) * dim, hc, (size_t)T * dim * sizeof *hc);
        if (m->info.injection != LS_INJECT_NONE)
            for (int32_t t = 0; t < T; t++) ls_state0(m, rows ? chunk.pos[t] : pos0 + c0 + t, hc + (size_t)t * dim);
    }
}

void ls_forward_finish(ls_session *s, float *h, int32_t n, int32_t pos0, const ls_tree_rows *rows, int32_t keep) {
    const ls_model *m = s->m;
    const int32_t dim = m->info.dim;
    ls_forward_mid_norm(m, h, n);
    for (int32_t c0 = 0; c0 < n && m->info.n_coda > 0; c0 += LS_CHUNK) {
        int32_t T = n - c0 < LS_CHUNK ? n - c0 : LS_CHUNK;
        int32_t skip = keep - c0 < 0 ? 0 : keep - c0 > T ? T : keep - c0;
        ls_tree_rows chunk = rows ? tree_chunk(rows, c0, dim) : (ls_tree_rows){0};
        run_units(s, h + (size_t)c0 * dim, T, pos0 + c0, LS_CODA_UNIT(m, 0), m->info.n_coda, -1, rows ? &chunk : NULL, skip);
    }
}

void ls_core_input(ls_session *s, int32_t pos, float *h) {
    const ls_model *m = s->m;
    if (m->info.injection != LS_INJECT_NONE) ls_state0(m, pos, h);
    else if (s->e) memcpy(h, s->e + (size_t)pos * m->info.dim, (size_t)m->info.dim * sizeof *h);
    else ls_forward_embed(s, s->tokens + pos, 1, h);
}

/* ls_forward_units where only rows [keep, n) need their unit-lb output. */
static int32_t forward_units_from(ls_session *s, float *h, int32_t n, int32_t pos0, int32_t la, int32_t lb,
                                  int32_t keep) {
    if (!s || !h || n < 1 || la < 0 || lb > s->units || la >= lb || pos0 < 0) return LS_ERR_ARG;
    if (pos0 > s->max_seq - n) return LS_ERR_FULL;
    if (!ls_units_hold(s->unit_len, s->unit_lo, la, lb, pos0, s->window)) return LS_ERR_STATE;
    int32_t rc = ls_session_reserve(s, pos0 + n);
    if (rc != LS_OK) return rc;
    int32_t dim = s->m->info.dim;
    for (int32_t c0 = 0; c0 < n; c0 += LS_CHUNK) {
        int32_t T = n - c0 < LS_CHUNK ? n - c0 : LS_CHUNK;
        int32_t skip = keep - c0 < 0 ? 0 : keep - c0 > T ? T : keep - c0;
        forward_chunk(s, h + (size_t)c0 * dim, T, pos0 + c0, la, lb, NULL, skip);
    }
    return LS_OK;
}

int32_t ls_forward_units(ls_session *s, float *h, int32_t n, int32_t pos0, int32_t la, int32_t lb) {
    return forward_units_from(s, h, n, pos0, la, lb, 0);
}

int32_t ls_forward_deepen(ls_session *s, int32_t la, int32_t lb) {
    if (!s || la < 1 || lb > s->units || la >= lb) return LS_ERR_ARG;
    int32_t p = s->pos, q = s->unit_len[la];
    for (int32_t l = la; l < lb; l++)
        if (s->unit_len[l] != q) return LS_ERR_STATE;
    for (int32_t l = 0; l < la; l++)
        if (s->unit_len[l] != p) return LS_ERR_STATE;
    if (q > p) return LS_ERR_STATE;
    if (q == p) return LS_OK;
    /* position q attends back to q - window + 1 (rows from q on are rewritten
     * before they are read): when a windowed ring no longer holds those rows,
     * every position is recomputed from the start, which needs none */
    int32_t need_lo = ls_window_lo(q, s->window);
    for (int32_t l = 0; l < lb; l++)
        if (s->unit_lo[l] > need_lo) q = 0;
    for (int32_t c0 = q; c0 < p; c0 += LS_CHUNK) {
        int32_t T = p - c0 < LS_CHUNK ? p - c0 : LS_CHUNK;
        for (int32_t t = 0; t < T; t++) ls_core_input(s, c0 + t, s->h + (size_t)t * s->m->info.dim);
        forward_chunk(s, s->h, T, c0, 0, lb, NULL, 0);
    }
    /* forward_chunk moved units [0, la) back to each chunk's end; all now hold p */
    for (int32_t l = 0; l < la; l++) s->unit_len[l] = p;
    return LS_OK;
}

void ls_forward_settle_step(ls_session *s, int32_t a, int32_t b, int32_t u) {
    const int32_t L = s->m->info.n_layers, dim = s->m->info.dim;
    /* in chunks, each through the whole step: a chunk attends to the chunks before it, done */
    for (int32_t c0 = a; c0 < b; c0 += LS_CHUNK) {
        int32_t T = b - c0 < LS_CHUNK ? b - c0 : LS_CHUNK;
        memcpy(s->h, s->def_h + (size_t)c0 * dim, (size_t)T * dim * sizeof *s->h);
        forward_chunk(s, s->h, T, c0, u, u + L, NULL, 0);
        for (int32_t t = 0; t < T; t++) ls_session_defer(s, c0 + t, u + L, s->h + (size_t)t * dim);
    }
}

int32_t ls_forward_settle(ls_session *s, int32_t need) {
    if (!s || need < 1 || need > s->units) return LS_ERR_ARG;
    if (!ls_units_ready(ls_session_view(s), need)) return LS_ERR_STATE;
    for (int32_t u = 0; u < need; u += s->m->info.n_layers) ls_forward_settle_step(s, s->unit_len[u], s->pos, u);
    return LS_OK;
}

void ls_forward_tree(ls_session *s, float *h, int32_t n, const ls_tree_rows *rows, int32_t la, int32_t lb) {
    int32_t dim = s->m->info.dim;
    for (int32_t c0 = 0; c0 < n; c0 += LS_CHUNK) {
        int32_t T = n - c0 < LS_CHUNK ? n - c0 : LS_CHUNK;
        ls_tree_rows chunk = tree_chunk(rows, c0, dim);
        forward_chunk(s, h + (size_t)c0 * dim, T, 0, la, lb, &chunk, 0);
    }
}

void ls_head_input(const ls_model *m, float *out, const float *h) {
    const int32_t dim = m->info.dim;
    if (m->info.step_norm && m->info.n_coda == 0) memcpy(out, h, (size_t)dim * sizeof *out); /* normed at the end of its step */
    else m->rt->ops->rmsnorm(out, h, m->rt->norm, dim, m->info.norm_eps);
}

void ls_forward_head(const ls_model *m, const float *h, int32_t n, float *xb, float *logits) {
    ls_runtime *rt = m->rt;
    int32_t dim = m->info.dim, vocab = m->info.vocab_size;
    double t0 = ls_prof_now(rt);
    for (int32_t c0 = 0; c0 < n; c0 += LS_CHUNK) {
        int32_t T = n - c0 < LS_CHUNK ? n - c0 : LS_CHUNK;
        for (int32_t t = 0; t < T; t++) ls_head_input(m, xb + (size_t)t * dim, h + (size_t)(c0 + t) * dim);
        mm_job out = {.x = xb, .ldx = dim, .in = dim, .T = T, .add = 0, .n_seg = 1,
                      .seg = {{m->w.output, logits + (size_t)c0 * vocab, vocab, vocab, m->w.qoutput}}};
        mm_run(rt, &out);
    }
    ls_prof_add(rt, LS_PROF_HEAD, &t0);
}

void ls_forward_logits(ls_session *s, const float *h, int32_t n, float *logits) {
    ls_forward_head(s->m, h, n, s->xb, logits);
}

int32_t ls_session_forward(ls_session *s, const int32_t *tokens, int32_t n, int32_t loops,
                           float *logits_out, int32_t n_logits) {
    if (!s) return LS_ERR_ARG;
    if (logits_out && (n_logits < 1 || n_logits > n)) return LS_ERR_ARG;
    int32_t rc = ls_check_feed(ls_session_view(s), tokens, n, loops);
    if (rc == LS_OK) rc = ls_session_reserve(s, s->pos + n); /* all of it before the first chunk runs */
    if (rc == LS_OK) rc = ls_forward_settle(s, loops * s->m->info.n_layers); /* deferred units it reads */
    if (rc != LS_OK) return rc;

    int32_t dim = s->m->info.dim, vocab = s->m->info.vocab_size;
    int32_t first_logit = logits_out ? n - n_logits : n;
    const int coda = s->m->info.n_coda > 0;
    for (int32_t c0 = 0; c0 < n; c0 += LS_CHUNK) {
        int32_t T = n - c0 < LS_CHUNK ? n - c0 : LS_CHUNK;
        ls_forward_start(s, tokens + c0, T, s->pos, NULL, s->h);
        // Positions before the first logit row only feed the caches: their
        // last unit (the coda's, or the core's) stops after storing K/V.
        rc = forward_units_from(s, s->h, T, s->pos, 0, loops * s->m->info.n_layers, coda ? 0 : first_logit - c0);
        if (rc != LS_OK) return rc; /* unreachable after the checks and the reserve above */
        ls_forward_finish(s, s->h, T, s->pos, NULL, first_logit - c0);
        memcpy(s->tokens + s->pos, tokens + c0, (size_t)T * sizeof *tokens);
        s->pos += T;
        int32_t lo = first_logit > c0 ? first_logit : c0;
        if (lo < c0 + T)
            ls_forward_logits(s, s->h + (size_t)(lo - c0) * dim, c0 + T - lo,
                              logits_out + (size_t)(lo - first_logit) * vocab);
    }
    return LS_OK;
}
