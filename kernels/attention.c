/*
 * attention.c — RoPE and causal attention over one loop's fp16 K/V cache.
 *
 * Every (token, head) pair is computed on its own, by one thread, reading
 * the cache in position order: its result depends only on its position and
 * the cached rows, never on how many tokens share the call (batch
 * invariance). Scores are fp32 dot products summed over the head dimension
 * in order, softmax subtracts the max and sums in position order, and the
 * output accumulates V rows in position order (ops.h attn_*).
 *
 * Cache layout per loop and kv head: keys (head_dim, ldk), dimension-major,
 * so scores for 16 consecutive positions are one vector of FMAs with no
 * horizontal sum (ldk >= cap, padded off powers of two so the head_dim rows
 * read together do not all fall in one L1 set); values (cap, head_dim). Position p lives in ring slot
 * p % cap. With a window W the ring holds W + LS_CHUNK rows, so writing
 * a chunk never overwrites a row a token of that chunk still attends to.
 */
#include <math.h>
#include <stddef.h>

#include "session.h"

// ---- rope ----

void ls_rope_table(float *cs, int32_t T, int32_t pos0, int32_t head_dim, float theta) {
    int32_t half = head_dim / 2;
    for (int32_t i = 0; i < half; i++) {
        double inv_freq = pow((double)theta, -2.0 * (double)i / (double)head_dim);
        for (int32_t t = 0; t < T; t++) {
            double ang = (double)(pos0 + t) * inv_freq;
            cs[((size_t)t * half + i) * 2] = (float)cos(ang);
            cs[((size_t)t * half + i) * 2 + 1] = (float)sin(ang);
        }
    }
}

void ls_rope_apply(float *x, int32_t n_heads, int32_t head_dim, const float *cs) {
    int32_t half = head_dim / 2;
    for (int32_t h = 0; h < n_heads; h++) {
        float *v = x + (size_t)h * head_dim;
        for (int32_t i = 0; i < half; i++) {
            float c = cs[2 * i], s = cs[2 * i + 1];
            float x0 = v[i], x1 = v[i + half];
            v[i] = x0 * c - x1 * s;
            v[i + half] = x1 * c + x0 * s;
        }
    }
}

// ---- attention ----

typedef struct {
    ls_session *s;
    int32_t loop, T, pos0;
} att_job;

static void att_task(void *ctx, int32_t task, int32_t thread) {
    const att_job *j = ctx;
    ls_session *s = j->s;
    const ls_model_info *mi = &s->m->info;
    const ls_ops *ops = s->m->rt->ops;
    int32_t n_heads = mi->n_heads, n_kv = mi->n_kv_heads, hd = mi->head_dim;
    int32_t t = task / n_heads, h = task % n_heads;
    int32_t p = j->pos0 + t;
    int32_t lo = (s->window > 0 && p - s->window + 1 > 0) ? p - s->window + 1 : 0;
    int32_t cnt = p - lo + 1;
    int32_t cap = s->cap;
    int32_t kvh = h / (n_heads / n_kv);
    size_t head = (size_t)j->loop * n_kv + kvh;
    const uint16_t *Kt = s->kc + head * hd * (size_t)s->ldk; /* (hd, ldk) */
    const uint16_t *V = s->vc + head * (size_t)cap * hd;      /* (cap, hd) */
    const float *q = s->q + (size_t)t * n_heads * hd + (size_t)h * hd;
    float *sc = s->scores + (size_t)thread * cap;
    float *out = s->att + (size_t)t * n_heads * hd + (size_t)h * hd;

    /* positions lo..p occupy ring rows r0..cap-1 then 0.. (at most one wrap) */
    int32_t r0 = lo % cap;
    int32_t n1 = cnt < cap - r0 ? cnt : cap - r0;
    ops->attn_scores(sc, q, Kt + r0, s->ldk, hd, n1);
    if (cnt > n1) ops->attn_scores(sc + n1, q, Kt, s->ldk, hd, cnt - n1);

    float scale = 1.0f / sqrtf((float)hd);
    float mx = -INFINITY;
    for (int32_t i = 0; i < cnt; i++) {
        sc[i] *= scale;
        if (sc[i] > mx) mx = sc[i];
    }
    float sum = 0.0f;
    for (int32_t i = 0; i < cnt; i++) {
        sc[i] = expf(sc[i] - mx);
        sum += sc[i];
    }
    for (int32_t d = 0; d < hd; d++) out[d] = 0.0f;
    ops->attn_values(out, sc, V + (size_t)r0 * hd, hd, n1);
    if (cnt > n1) ops->attn_values(out, sc + n1, V, hd, cnt - n1);
    float inv = 1.0f / sum;
    for (int32_t d = 0; d < hd; d++) out[d] *= inv;
}

void ls_attention(ls_session *s, int32_t loop, int32_t T, int32_t pos0) {
    const ls_model_info *mi = &s->m->info;
    const ls_runtime *rt = s->m->rt;
    int32_t n_kv = mi->n_kv_heads, hd = mi->head_dim, cap = s->cap;
    size_t kv_dim = (size_t)n_kv * hd;

    /* K and V are rounded to fp16 once, here; the token then reads its own
     * row back from the cache like every later token will. Keys are stored
     * transposed, (hd, cap) per head: one column per position. */
    for (int32_t t = 0; t < T; t++) {
        int32_t row = (pos0 + t) % cap;
        for (int32_t kvh = 0; kvh < n_kv; kvh++) {
            size_t head = (size_t)loop * n_kv + kvh;
            rt->ops->f32_to_f16(s->k16, s->k + t * kv_dim + (size_t)kvh * hd, hd);
            uint16_t *kt = s->kc + head * hd * (size_t)s->ldk + row;
            for (int32_t d = 0; d < hd; d++) kt[(size_t)d * s->ldk] = s->k16[d];
            rt->ops->f32_to_f16(s->vc + (head * cap + row) * hd, s->v + t * kv_dim + (size_t)kvh * hd, hd);
        }
    }
    att_job j = {s, loop, T, pos0};
    ls_pool_run(rt->pool, att_task, &j, T * mi->n_heads);
}

// ---- tree attention (speculative verification) ----

/* A run of visible positions held in consecutive ring slots. */
typedef struct {
    int32_t slot, n;
} slot_run;

/* Most runs one row can need: the committed part (two when the ring wraps)
 * plus one per tree depth. */
#define TREE_MAX_RUNS (2 + LS_TREE_MAX_DEPTH + 1)

typedef struct {
    ls_session *s;
    int32_t loop;
    const ls_tree_rows *rows;
} tree_att_job;

/* Same arithmetic as att_task, over the row's visible positions in position
 * order: attn_scores and attn_values give the same per-position results
 * however positions are split into calls (ops.h), so a row whose path is
 * scattered over the ring computes what one contiguous call would. */
static void tree_att_task(void *ctx, int32_t task, int32_t thread) {
    const tree_att_job *j = ctx;
    ls_session *s = j->s;
    const ls_tree_rows *rows = j->rows;
    const ls_model_info *mi = &s->m->info;
    const ls_ops *ops = s->m->rt->ops;
    int32_t n_heads = mi->n_heads, n_kv = mi->n_kv_heads, hd = mi->head_dim;
    int32_t t = task / n_heads, h = task % n_heads;
    int32_t p = rows->pos[t], base = rows->base, cap = s->cap;
    int32_t lo = (s->window > 0 && p - s->window + 1 > 0) ? p - s->window + 1 : 0;
    int32_t cnt = p - lo + 1;

    slot_run run[TREE_MAX_RUNS];
    int32_t nr = 0;
    if (lo < base) { /* committed positions [lo, base): at most one ring wrap */
        int32_t n = base - lo, r0 = lo % cap;
        int32_t n1 = n < cap - r0 ? n : cap - r0;
        run[nr++] = (slot_run){r0, n1};
        if (n > n1) run[nr++] = (slot_run){0, n - n1};
    }
    const int32_t *chain = rows->chain + (size_t)t * rows->chain_ld;
    for (int32_t q = lo > base ? lo : base; q <= p; q++) {
        int32_t sl = chain[q - base];
        if (nr > 0 && run[nr - 1].slot + run[nr - 1].n == sl && q > base)
            run[nr - 1].n++;
        else
            run[nr++] = (slot_run){sl, 1};
    }

    int32_t kvh = h / (n_heads / n_kv);
    size_t head = (size_t)j->loop * n_kv + kvh;
    const uint16_t *Kt = s->kc + head * hd * (size_t)s->ldk;
    const uint16_t *V = s->vc + head * (size_t)cap * hd;
    const float *q = s->q + (size_t)t * n_heads * hd + (size_t)h * hd;
    float *sc = s->scores + (size_t)thread * cap;
    float *out = s->att + (size_t)t * n_heads * hd + (size_t)h * hd;

    int32_t off = 0;
    for (int32_t r = 0; r < nr; r++) {
        ops->attn_scores(sc + off, q, Kt + run[r].slot, s->ldk, hd, run[r].n);
        off += run[r].n;
    }
    float scale = 1.0f / sqrtf((float)hd);
    float mx = -INFINITY;
    for (int32_t i = 0; i < cnt; i++) {
        sc[i] *= scale;
        if (sc[i] > mx) mx = sc[i];
    }
    float sum = 0.0f;
    for (int32_t i = 0; i < cnt; i++) {
        sc[i] = expf(sc[i] - mx);
        sum += sc[i];
    }
    for (int32_t d = 0; d < hd; d++) out[d] = 0.0f;
    off = 0;
    for (int32_t r = 0; r < nr; r++) {
        ops->attn_values(out, sc + off, V + (size_t)run[r].slot * hd, hd, run[r].n);
        off += run[r].n;
    }
    float inv = 1.0f / sum;
    for (int32_t d = 0; d < hd; d++) out[d] *= inv;
}

void ls_attention_tree(ls_session *s, int32_t loop, int32_t T, const ls_tree_rows *rows) {
    const ls_model_info *mi = &s->m->info;
    const ls_runtime *rt = s->m->rt;
    int32_t n_kv = mi->n_kv_heads, hd = mi->head_dim, cap = s->cap;
    size_t kv_dim = (size_t)n_kv * hd;

    /* As in ls_attention: every row's K/V goes in first (a row's ancestors in
     * this chunk precede it), then each row reads only its own path. */
    for (int32_t t = 0; t < T; t++) {
        int32_t row = rows->slot[t];
        for (int32_t kvh = 0; kvh < n_kv; kvh++) {
            size_t head = (size_t)loop * n_kv + kvh;
            rt->ops->f32_to_f16(s->k16, s->k + t * kv_dim + (size_t)kvh * hd, hd);
            uint16_t *kt = s->kc + head * hd * (size_t)s->ldk + row;
            for (int32_t d = 0; d < hd; d++) kt[(size_t)d * s->ldk] = s->k16[d];
            rt->ops->f32_to_f16(s->vc + (head * cap + row) * hd, s->v + t * kv_dim + (size_t)kvh * hd, hd);
        }
    }
    tree_att_job j = {s, loop, rows};
    ls_pool_run(rt->pool, tree_att_task, &j, T * mi->n_heads);
}
