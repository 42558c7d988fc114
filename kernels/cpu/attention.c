/*
 * attention.c — causal attention over one loop's K/V cache.
 *
 * Every (token, head) pair is computed on its own, by one thread, reading
 * the cache in position order: its result depends only on its position and
 * the cached rows, never on how many tokens share the call (batch
 * invariance). Scores are fp32 dot products summed over the head dimension
 * in order, softmax subtracts the max and sums in a fixed order per row
 * length (ops.h softmax_exp), and the
 * output accumulates V rows in position order (ops.h attn_*).
 *
 * Cache layout per unit and kv head: keys (head_dim, ldk), dimension-major,
 * so scores for 16 consecutive positions are one vector of FMAs with no
 * horizontal sum (ldk >= rows, padded off powers of two so the head_dim rows
 * read together do not all fall in one L1 set); values (rows, head_dim),
 * rows being what the session has allocated so far (session_state.h).
 * Position p lives in ring slot p % cap. With a window W the ring holds W + LS_CHUNK rows, so writing
 * a chunk never overwrites a row a token of that chunk still attends to.
 *
 * Cache modes (kvcache.h): rows are written by ls_kv_store (rotated and/or
 * quantized as the session's mode says). A quantized cache is read by the
 * ops kernels for its format (attn_*_i8 / attn_*_i4), which dequantize in
 * registers and keep the fp16 kernels' contract, laid out the same way
 * (keys transposed, values by position). In the H modes each head's q is
 * rotated before its scores and its output rotated back, inside its own
 * task.
 */
#include <math.h>
#include <stddef.h>

#include "attention.h"
#include "kvcache.h"
#include "runtime.h"

// ---- attention ----

/* Scales the scores, replaces them with exp(score - max), returns the sum:
 * the path's kernel (ops.h softmax_exp), else expf summed in index order.
 * Every attention path calls this one function on the same row. */
static float softmax_exp(const ls_ops *ops, float *c, int32_t cnt, float scale) {
    if (ops->softmax_exp) return ops->softmax_exp(c, cnt, scale);
    float mx = -INFINITY;
    for (int32_t i = 0; i < cnt; i++) {
        c[i] *= scale;
        if (c[i] > mx) mx = c[i];
    }
    float sum = 0.0f;
    for (int32_t i = 0; i < cnt; i++) {
        c[i] = expf(c[i] - mx);
        sum += c[i];
    }
    return sum;
}

/* A run of visible positions held in consecutive ring slots. */
typedef struct {
    int32_t slot, n;
} slot_run;

/* Attention of query head h (q, rotated here in the H modes) over the cnt
 * visible positions of loop `unit`, given in position order as runs of ring
 * slots; writes the head's output to out. Scores, softmax and value sums
 * run in position order with the ops kernels, whatever the runs. */
static void attend(ls_session *s, int32_t unit, int32_t h, float *q, float *out, const slot_run *run,
                   int32_t nr, int32_t cnt, int32_t thread) {
    const ls_model_info *mi = &s->m->info;
    const ls_ops *ops = s->m->rt->ops;
    int32_t n_heads = mi->n_heads, n_kv = mi->n_kv_heads, hd = mi->head_dim, cap = s->cap;
    int32_t kvh = h / (n_heads / n_kv);
    size_t head = (size_t)ls_unit_slot(s, unit) * n_kv + kvh;
    float *sc = s->scores + (size_t)thread * LS_ATT_GROUP * cap; /* the thread's first row of scratch (attend_group) */
    int32_t fmt = s->kv_fmt;
    if (s->kv_mode & LS_KV_HADAMARD) {
        if (s->kv_mode & LS_KV_FP16_QKV)
            for (int32_t d = 0; d < hd; d++) q[d] = ls_f16_to_f32(ls_f32_to_f16(q[d]));
        ls_kv_wht(q, hd);
    }
    /* this head's cache, from ring slot 0 (kvcache.h layouts) */
    size_t nb = (size_t)s->kv_nb, np = (size_t)s->kv_np, ldq = (size_t)s->ldq;
    const uint16_t *Kt = fmt == LS_KV_FP16 ? s->kc + head * hd * (size_t)s->ldk : NULL; /* (hd, ldk) */
    size_t rows = (size_t)s->rows;
    const uint16_t *V = fmt == LS_KV_FP16 ? s->vc + head * rows * hd : NULL;  /* (rows, hd) */
    const uint8_t *Kq = fmt != LS_KV_FP16 ? s->kq + head * nb * ldq : NULL;   /* (nb, ldq) */
    const uint16_t *Kp = fmt != LS_KV_FP16 ? s->kp + head * np * rows : NULL; /* (np, rows) */
    const uint8_t *Vq = fmt != LS_KV_FP16 ? s->vq + head * rows * nb : NULL;  /* (rows, nb) */
    const uint16_t *Vp = fmt != LS_KV_FP16 ? s->vp + head * rows * np : NULL; /* (rows, np) */

    for (int32_t r = 0, off = 0; r < nr; off += run[r].n, r++) {
        size_t sl = (size_t)run[r].slot;
        if (fmt == LS_KV_FP16)
            ops->attn_scores(sc + off, q, Kt + sl, s->ldk, hd, run[r].n);
        else if (fmt == LS_KV_INT8)
            ops->attn_scores_i8(sc + off, q, (const int8_t *)Kq + sl, s->ldq, Kp + sl, hd, run[r].n);
        else
            ops->attn_scores_i4(sc + off, q, Kq + sl, s->ldq, Kp + sl, s->rows, hd, run[r].n);
    }

    float sum = softmax_exp(ops, sc, cnt, 1.0f / sqrtf((float)hd));
    for (int32_t d = 0; d < hd; d++) out[d] = 0.0f;
    for (int32_t r = 0, off = 0; r < nr; off += run[r].n, r++) {
        size_t sl = (size_t)run[r].slot;
        if (fmt == LS_KV_FP16)
            ops->attn_values(out, sc + off, V + sl * hd, hd, run[r].n);
        else if (fmt == LS_KV_INT8)
            ops->attn_values_i8(out, sc + off, (const int8_t *)Vq + sl * nb, Vp + sl * np, hd, run[r].n);
        else
            ops->attn_values_i4(out, sc + off, Vq + sl * nb, Vp + sl * np, hd, run[r].n);
    }
    float inv = 1.0f / sum;
    for (int32_t d = 0; d < hd; d++) out[d] *= inv;
    if (s->kv_mode & LS_KV_HADAMARD) ls_kv_wht(out, hd);
}

typedef struct {
    const ls_att_rows *r;
    int32_t unit;
} att_job;

/* Ring slot runs (at most two) holding positions [a, b], in position order. */
static int32_t runs_of(int32_t a, int32_t b, int32_t cap, slot_run *run) {
    int32_t cnt = b - a + 1;
    if (cnt <= 0) return 0;
    int32_t r0 = a % cap;
    int32_t n1 = cnt < cap - r0 ? cnt : cap - r0;
    run[0] = (slot_run){r0, n1};
    if (cnt > n1) {
        run[1] = (slot_run){0, cnt - n1};
        return 2;
    }
    return 1;
}

/* Token t, head h of one run of rows (the one-query kernels). */
static void att_one(const ls_att_rows *r, int32_t unit, int32_t t, int32_t h, int32_t thread) {
    ls_session *s = r->s;
    int32_t n_heads = s->m->info.n_heads, hd = s->m->info.head_dim;
    int32_t p = r->pos0 + t, lo = ls_window_lo(p, s->window);
    slot_run run[2];
    int32_t nr = runs_of(lo, p, s->cap, run);
    float *q = r->q + (size_t)t * n_heads * hd + (size_t)h * hd;
    float *out = r->att + (size_t)t * n_heads * hd + (size_t)h * hd;
    attend(s, unit, h, q, out, run, nr, p - lo + 1, thread);
}

typedef struct {
    ls_session *s;
    int32_t unit, pos0;
    const int32_t *slot;
    int32_t T;
    float *k, *v; /* (T, n_kv_heads * head_dim), used as scratch by ls_kv_store */
} store_job;

/* Token t's ring slot: slot[t], or (pos0 + t) % cap when slot is NULL. */
static int32_t slot_of(const store_job *j, int32_t t) {
    return j->slot ? j->slot[t] : (j->pos0 + t) % j->s->cap;
}

/* Tokens per store task: keys are stored transposed (one column per
 * position), so neighbouring positions of one head share cache lines; a task
 * owns a run of LS_KV_STORE_ROWS positions of one kv head so two threads do
 * not keep stealing the same lines from each other. */
static void store_task(void *ctx, int32_t task, int32_t thread) {
    const store_job *j = ctx;
    ls_session *s = j->s;
    int32_t n_kv = s->m->info.n_kv_heads, hd = s->m->info.head_dim;
    int32_t nb = (j->T + LS_KV_STORE_ROWS - 1) / LS_KV_STORE_ROWS;
    int32_t kvh = task / nb, t0 = task % nb * LS_KV_STORE_ROWS;
    int32_t t1 = t0 + LS_KV_STORE_ROWS < j->T ? t0 + LS_KV_STORE_ROWS : j->T;
    size_t ld = (size_t)n_kv * hd;
    /* one ls_kv_store per run of consecutive ring slots. Each row's bytes
     * depend on the row alone, so who stores it, and with which others,
     * does not matter. */
    for (int32_t t = t0; t < t1;) {
        int32_t row = slot_of(j, t), n = 1;
        while (t + n < t1 && slot_of(j, t + n) == row + n) n++;
        size_t off = (size_t)t * ld + (size_t)kvh * hd;
        ls_kv_store(s, j->unit, kvh, row, n, j->k + off, j->v + off, ld, thread);
        t += n;
    }
}

static int32_t store_tasks(const store_job *j) {
    return (j->T + LS_KV_STORE_ROWS - 1) / LS_KV_STORE_ROWS * j->s->m->info.n_kv_heads;
}

void ls_attention_store(ls_session *s, int32_t unit, int32_t pos0, int32_t t0, int32_t t1, float *k, float *v,
                        int32_t thread) {
    size_t off = (size_t)t0 * s->m->info.n_kv_heads * s->m->info.head_dim;
    store_job j = {s, unit, pos0 + t0, NULL, t1 - t0, k + off, v + off};
    for (int32_t task = 0; task < store_tasks(&j); task++) store_task(&j, task, thread);
}

/* Writes the T rows' K/V into the cache before any token attends: a token
 * reads its own row back from the cache like every later token will. A
 * run of several rows is encoded on the pool, a single tree row inline (a
 * decode token stores its own, att_token_kv). */
static void store_rows(ls_session *s, int32_t unit, int32_t T, int32_t pos0, const int32_t *slot, float *k,
                       float *v) {
    store_job j = {s, unit, pos0, slot, T, k, v};
    int32_t tasks = store_tasks(&j);
    if (T > 1)
        ls_pool_run(s->m->rt->pool, store_task, &j, tasks);
    else
        for (int32_t task = 0; task < tasks; task++) store_task(&j, task, 0);
}

/* G (<= LS_ATT_GROUP) queries of one session and loop that read the same kv
 * head kvh: query g (q[g], at position p[g], output out[g]), positions
 * non-decreasing in g. Query g sees [lo_g, p_g]; the positions every query
 * sees, [lo_last, p_first], go through the multi-query kernels (each cache
 * row loaded once for the group), the rest through the one-query kernels,
 * in position order. Scores are per position and the value sums per
 * dimension run in position order in both kernels (ops.h), so each result
 * is bit-identical to attend()'s. Groups are consecutive tokens of one head
 * (prefill) or the query heads of one kv head at one token (decode). */
static void attend_group(ls_session *s, int32_t unit, int32_t kvh, int32_t G, float *const *q, float *const *out,
                         const int32_t *p, int32_t thread) {
    const ls_model_info *mi = &s->m->info;
    const ls_ops *ops = s->m->rt->ops;
    int32_t n_kv = mi->n_kv_heads, hd = mi->head_dim, cap = s->cap;
    size_t head = (size_t)ls_unit_slot(s, unit) * n_kv + kvh;
    const uint16_t *Kt = s->kc + head * hd * (size_t)s->ldk;
    const uint16_t *V = s->vc + head * (size_t)s->rows * hd;

    float *sc[LS_ATT_GROUP];
    int32_t lo[LS_ATT_GROUP] = {0};
    for (int32_t g = 0; g < G; g++) {
        lo[g] = ls_window_lo(p[g], s->window);
        sc[g] = s->scores + ((size_t)thread * LS_ATT_GROUP + g) * cap;
        if (s->kv_mode & LS_KV_HADAMARD) {
            if (s->kv_mode & LS_KV_FP16_QKV)
                for (int32_t d = 0; d < hd; d++) q[g][d] = ls_f16_to_f32(ls_f32_to_f16(q[g][d]));
            ls_kv_wht(q[g], hd);
        }
    }
    int32_t sa = lo[G - 1], sb = p[0]; /* shared positions [sa, sb] (lo, p never decrease with g) */
    /* Where every query starts at sa and a scratch row holds [sa, p_last],
     * the multi-query scores run on to p_last: a query's scores past its own
     * position are computed and never read (its softmax covers [lo_g, p_g]),
     * and a score depends on its position alone, so no score read changes.
     * The last queries' few positions then take no one-query calls (each a
     * chain of head_dim dependent FMAs on one vector). */
    const int32_t se = lo[0] == sa && p[G - 1] - sa < cap ? p[G - 1] : sb;
    slot_run run[2];
    int32_t nr;

    /* scores */
    for (int32_t g = 0; g < G; g++) {
        int32_t a = lo[g], b = (sa <= sb ? sa : p[g] + 1) - 1; /* before the shared range */
        nr = runs_of(a, b, cap, run);
        for (int32_t r = 0, off = 0; r < nr; off += run[r].n, r++)
            ops->attn_scores(sc[g] + off, q[g], Kt + run[r].slot, s->ldk, hd, run[r].n);
        if (sa <= sb) {
            nr = runs_of(se + 1, p[g], cap, run); /* after it */
            for (int32_t r = 0, off = se + 1 - lo[g]; r < nr; off += run[r].n, r++)
                ops->attn_scores(sc[g] + off, q[g], Kt + run[r].slot, s->ldk, hd, run[r].n);
        }
    }
    nr = runs_of(sa, se, cap, run);
    for (int32_t r = 0, off = 0; r < nr; off += run[r].n, r++) {
        float *scg[LS_ATT_GROUP];
        for (int32_t g = 0; g < G; g++) scg[g] = sc[g] + (sa - lo[g]) + off;
        ops->attn_scores_mq(scg, (const float *const *)q, Kt + run[r].slot, s->ldk, hd, run[r].n, G);
    }

    /* softmax, per query exactly as attend() */
    float scale = 1.0f / sqrtf((float)hd);
    float inv[LS_ATT_GROUP];
    for (int32_t g = 0; g < G; g++) {
        inv[g] = 1.0f / softmax_exp(ops, sc[g], p[g] - lo[g] + 1, scale);
        for (int32_t d = 0; d < hd; d++) out[g][d] = 0.0f;
    }

    /* values, position order: before, shared, after */
    for (int32_t g = 0; g < G; g++) {
        int32_t a = lo[g], b = (sa <= sb ? sa : p[g] + 1) - 1;
        nr = runs_of(a, b, cap, run);
        for (int32_t r = 0, off = 0; r < nr; off += run[r].n, r++)
            ops->attn_values(out[g], sc[g] + off, V + (size_t)run[r].slot * hd, hd, run[r].n);
    }
    nr = runs_of(sa, sb, cap, run);
    for (int32_t r = 0, off = 0; r < nr; off += run[r].n, r++) {
        const float *scg[LS_ATT_GROUP];
        for (int32_t g = 0; g < G; g++) scg[g] = sc[g] + (sa - lo[g]) + off;
        ops->attn_values_mq(out, scg, V + (size_t)run[r].slot * hd, hd, run[r].n, G);
    }
    if (sa <= sb)
        for (int32_t g = 0; g < G; g++) {
            nr = runs_of(sb + 1, p[g], cap, run);
            for (int32_t r = 0, off = sb + 1 - lo[g]; r < nr; off += run[r].n, r++)
                ops->attn_values(out[g], sc[g] + off, V + (size_t)run[r].slot * hd, hd, run[r].n);
        }
    for (int32_t g = 0; g < G; g++) {
        for (int32_t d = 0; d < hd; d++) out[g][d] *= inv[g];
        if (s->kv_mode & LS_KV_HADAMARD) ls_kv_wht(out[g], hd);
    }
}

/* Prefill with an fp16 cache: one task per (head, group of up to
 * LS_ATT_GROUP consecutive tokens), through attend_group. */
static void att_group_task(void *ctx, int32_t task, int32_t thread) {
    const att_job *j = ctx;
    const ls_att_rows *r = j->r;
    int32_t n_heads = r->s->m->info.n_heads, n_kv = r->s->m->info.n_kv_heads, hd = r->s->m->info.head_dim;
    /* token groups in the order last, first, second last, second, ...: a
     * group's work grows with its position, so any run of consecutive pairs
     * holds about the same work (the pool deals each thread a contiguous
     * range), and the shortest come last, where idle threads steal */
    int32_t n_groups = (r->T + LS_ATT_GROUP - 1) / LS_ATT_GROUP, k = task / n_heads;
    int32_t h = task % n_heads, t0 = (k % 2 ? k / 2 : n_groups - 1 - k / 2) * LS_ATT_GROUP;
    int32_t G = r->T - t0 < LS_ATT_GROUP ? r->T - t0 : LS_ATT_GROUP;
    float *q[LS_ATT_GROUP], *out[LS_ATT_GROUP];
    int32_t p[LS_ATT_GROUP];
    for (int32_t g = 0; g < G; g++) {
        int32_t t = t0 + g;
        p[g] = r->pos0 + t;
        q[g] = r->q + (size_t)t * n_heads * hd + (size_t)h * hd;
        out[g] = r->att + (size_t)t * n_heads * hd + (size_t)h * hd;
    }
    attend_group(r->s, j->unit, h / (n_heads / n_kv), G, q, out, p, thread);
}

/* Whether the multi-query kernels serve this session's cache. */
static int multi_query(const ls_session *s) { return s->kv_fmt == LS_KV_FP16 && s->m->rt->ops->attn_scores_mq; }

/* Whether a run of rows goes through the grouped prefill kernels. */
static int grouped(const ls_att_rows *r) { return r->T > 1 && multi_query(r->s); }

/* One token's work for kv head kvh: its K/V row into the cache, then (unless
 * the row is skipped) the attention of every query head that reads kvh, up
 * to LS_ATT_GROUP of them a pass through the multi-query kernels. No other
 * task of the call touches this part of the cache, so no store has to wait
 * for the others (a decode step's rows). */
static void att_token_kv(const ls_att_rows *r, int32_t unit, int32_t kvh, int32_t thread) {
    ls_session *s = r->s;
    const ls_model_info *mi = &s->m->info;
    int32_t hd = mi->head_dim, per = mi->n_heads / mi->n_kv_heads, h0 = kvh * per;
    store_job sj = {s, unit, r->pos0, NULL, 1, r->k, r->v};
    if (r->k) store_task(&sj, kvh, thread); /* one token: task kvh is kv head kvh; k NULL: stored already */
    if (r->skip >= 1) return;
    for (int32_t g0 = 0; g0 < per; g0 += LS_ATT_GROUP) {
        int32_t G = per - g0 < LS_ATT_GROUP ? per - g0 : LS_ATT_GROUP;
        if (G == 1 || !multi_query(s)) {
            for (int32_t g = 0; g < G; g++) att_one(r, unit, 0, h0 + g0 + g, thread);
            continue;
        }
        float *q[LS_ATT_GROUP], *out[LS_ATT_GROUP];
        int32_t p[LS_ATT_GROUP];
        for (int32_t g = 0; g < G; g++) {
            q[g] = r->q + (size_t)(h0 + g0 + g) * hd;
            out[g] = r->att + (size_t)(h0 + g0 + g) * hd;
            p[g] = r->pos0;
        }
        attend_group(s, unit, kvh, G, q, out, p, thread);
    }
}

/* The one-query work of several runs of rows in one pool run: task i
 * belongs to the run whose [first[k], first[k+1]) holds it. A run of one
 * token has a task per kv head (att_token_kv: it stores its own K/V); what
 * is left of a longer run, whose rows were stored before (k NULL), a task
 * per (token, head). */
typedef struct {
    const ls_att_rows *runs;
    const int32_t *first; /* (n + 1) first task of each run */
    int32_t n, unit;
} att_runs_job;

/* A one-query job reading fewer cached values than this (keys and values
 * each) runs on the calling thread: its q/k/v and outputs would cross
 * between the cores' caches, which costs more than half of it saves
 * (docs/kernels.md#tuning-figures). */
#define ATT_SERIAL_READS (1 << 15)

/* Cached values the one-query (token, head) pairs of r read: heads x
 * head_dim x each token's visible positions. */
static int64_t att_reads(const ls_att_rows *r) {
    const ls_model_info *mi = &r->s->m->info;
    int64_t visible = 0;
    for (int32_t t = 0; t < r->T; t++) {
        int32_t p = r->pos0 + t;
        visible += p - ls_window_lo(p, r->s->window) + 1;
    }
    return visible * mi->n_heads * mi->head_dim;
}

static void att_runs_task(void *ctx, int32_t task, int32_t thread) {
    const att_runs_job *j = ctx;
    int32_t k = 0;
    while (task >= j->first[k + 1]) k++;
    const ls_att_rows *r = &j->runs[k];
    int32_t n_heads = r->s->m->info.n_heads, i = task - j->first[k];
    if (r->k) /* a one-token run (longer runs' rows come cut, without k) */
        att_token_kv(r, j->unit, i, thread);
    else
        att_one(r, j->unit, i / n_heads, i % n_heads, thread);
}

void ls_attention_runs(const ls_att_rows *runs, int32_t n, int32_t unit) {
    if (n < 1) return;
    ls_pool *pool = runs[0].s->m->rt->pool;
    int32_t n_heads = runs[0].s->m->info.n_heads, n_kv = runs[0].s->m->info.n_kv_heads;
    /* a longer run's rows all go in before any of its tokens attends
     * (unless the caller stored them: k NULL) */
    for (int32_t k = 0; k < n; k++)
        if (runs[k].T > 1 && runs[k].k)
            store_rows(runs[k].s, unit, runs[k].T, runs[k].pos0, NULL, runs[k].k, runs[k].v);
    /* prefill runs: grouped, one pool run each; every other run shares one.
     * A longer run's skipped rows are cut off its front (their K/V is in). */
    int32_t first[LS_ATT_MAX_RUNS + 1];
    ls_att_rows single[LS_ATT_MAX_RUNS];
    int32_t ns = 0;
    first[0] = 0;
    for (int32_t k = 0; k < n; k++) {
        const ls_att_rows *r = &runs[k];
        if (r->T == 1 && r->k) { /* stores its own K/V, skipped or not */
            single[ns] = *r;
            first[ns + 1] = first[ns] + n_kv;
            ns++;
            continue;
        }
        if (r->skip >= r->T) continue;
        size_t q0 = (size_t)r->skip * (size_t)n_heads * (size_t)r->s->m->info.head_dim;
        ls_att_rows out = {r->s, r->T - r->skip, r->pos0 + r->skip, r->q + q0, NULL, NULL, r->att + q0, 0};
        if (grouped(&out)) {
            att_job j = {&out, unit}; /* ls_pool_run returns when every task is done */
            ls_pool_run(pool, att_group_task, &j, (out.T + LS_ATT_GROUP - 1) / LS_ATT_GROUP * n_heads);
        } else {
            single[ns] = out;
            first[ns + 1] = first[ns] + out.T * n_heads;
            ns++;
        }
    }
    if (ns > 0) {
        int64_t reads = 0;
        for (int32_t k = 0; k < ns; k++) reads += att_reads(&single[k]);
        att_runs_job j = {single, first, ns, unit};
        ls_pool_run(reads < ATT_SERIAL_READS ? NULL : pool, att_runs_task, &j, first[ns]);
    }
}

void ls_attention(ls_session *s, int32_t unit, int32_t T, int32_t pos0, int32_t skip, int32_t stored) {
    ls_att_rows r = {s, T, pos0, s->q, stored ? NULL : s->k, stored ? NULL : s->v, s->att, skip};
    ls_attention_runs(&r, 1, unit);
}

// ---- tree attention (speculative verification) ----

/* Most runs one row can need: the committed part (two when the ring wraps)
 * plus one per tree depth. */
#define TREE_MAX_RUNS (2 + LS_TREE_MAX_DEPTH + 1)

typedef struct {
    ls_session *s;
    int32_t unit;
    const ls_tree_rows *rows;
} tree_att_job;

/* Same arithmetic as att_one, over the row's visible positions in position
 * order: attn_scores and attn_values give the same per-position results
 * however positions are split into calls (ops.h), so a row whose path is
 * scattered over the ring computes what one contiguous call would. */
static void tree_att_task(void *ctx, int32_t task, int32_t thread) {
    const tree_att_job *j = ctx;
    ls_session *s = j->s;
    const ls_tree_rows *rows = j->rows;
    int32_t n_heads = s->m->info.n_heads, hd = s->m->info.head_dim;
    int32_t t = task / n_heads, h = task % n_heads;
    int32_t p = rows->pos[t], base = rows->base, cap = s->cap;
    int32_t lo = ls_window_lo(p, s->window);
    int32_t cnt = p - lo + 1;

    slot_run run[TREE_MAX_RUNS];
    int32_t nr = runs_of(lo, base - 1, cap, run); /* committed positions [lo, base), if any */
    const int32_t *chain = rows->chain + (size_t)t * rows->chain_ld;
    for (int32_t q = lo > base ? lo : base; q <= p; q++) {
        int32_t sl = chain[q - base];
        if (nr > 0 && run[nr - 1].slot + run[nr - 1].n == sl && q > base)
            run[nr - 1].n++;
        else
            run[nr++] = (slot_run){sl, 1};
    }

    float *q = s->q + (size_t)t * n_heads * hd + (size_t)h * hd;
    float *out = s->att + (size_t)t * n_heads * hd + (size_t)h * hd;
    attend(s, j->unit, h, q, out, run, nr, cnt, thread);
}

void ls_attention_tree(ls_session *s, int32_t unit, int32_t T, const ls_tree_rows *rows) {
    /* As in ls_attention: every row's K/V goes in first (a row's ancestors in
     * this chunk precede it), then each row reads only its own path. */
    store_rows(s, unit, T, 0, rows->slot, s->k, s->v);
    tree_att_job j = {s, unit, rows};
    ls_pool_run(s->m->rt->pool, tree_att_task, &j, T * s->m->info.n_heads);
}
