/*
 * session.h — runtime and session internals shared by forward.c, session.c
 * and attention.c. Not ABI.
 */
#ifndef LS_SESSION_H
#define LS_SESSION_H

#include <stdint.h>

#include "internal.h"
#include "kvcache.h"
#include "ops.h"
#include "threadpool.h"

/* Largest number of tokens pushed through the block in one internal step.
 * Longer calls are split; batch invariance makes the split invisible. It
 * also bounds the ring: a windowed cache holds window + LS_CHUNK positions. */
#define LS_CHUNK 64

struct ls_runtime {
    ls_pool *pool;
    const ls_ops *ops;
    int32_t n_threads;
    float *attn_norm; /* (dim) fp32 copies of the fp16 norm weights */
    float *ffn_norm;  /* (dim) */
    float *norm;      /* (dim) */

    struct ls_draft_head *draft; /* draft_head.c: built on the first cycle that drafts with it */

    int32_t profile;          /* ls_model_set_profile */
    double prof[LS_PROF_N];   /* seconds per LS_PROF_* op */
};

/* Profile clock: 0 (and no clock read) when profiling is off. */
double ls_prof_now(const ls_runtime *rt);
/* Adds now - *t0 to op's counter and sets *t0 = now (no-op when off). */
void ls_prof_add(ls_runtime *rt, int32_t op, double *t0);

struct ls_session {
    ls_model *m;
    int32_t max_seq;  /* most positions ever held */
    int32_t loops;    /* loops the caches exist for */
    int32_t window;   /* 0 = full attention, else W */
    int32_t cap;      /* cache rows per loop: max_seq, or min(max_seq, W + LS_CHUNK) */
    int32_t ldk;      /* row stride of the transposed key cache (>= cap) */
    int32_t pos;      /* tokens fed (history length) */
    int32_t *tokens;  /* (max_seq) token history */
    int32_t *loop_len; /* (loops) positions [0, loop_len) written in loop l's cache */
    int32_t *loop_lo;  /* (loops) oldest position the ring still holds for loop l */
    uint16_t *kc;     /* (loops, n_kv_heads, head_dim, ldk) fp16 keys (RoPE applied), transposed;
                       * NULL in a quantized mode */
    uint16_t *vc;     /* (loops, n_kv_heads, cap, head_dim) fp16 values; NULL in a quantized mode */

    /* key/value cache mode (loopserve.h LS_KV_*, layouts in kvcache.h) */
    int32_t kv_mode;  /* ls_session_params.kv_mode */
    int32_t kv_fmt;   /* kv_mode & LS_KV_FORMAT_MASK */
    int32_t kv_nb;    /* quantized: code bytes per row */
    int32_t kv_np;    /* quantized: fp16 parameters per row */
    int32_t ldq;      /* quantized: row stride (bytes) of the transposed key codes (>= cap) */
    uint8_t *kq;      /* (loops, n_kv_heads, kv_nb, ldq) key codes, transposed; NULL in fp16 modes */
    uint16_t *kp;     /* (loops, n_kv_heads, kv_np, cap) key scales / offsets, transposed */
    uint8_t *vq;      /* (loops, n_kv_heads, cap, kv_nb) value codes */
    uint16_t *vp;     /* (loops, n_kv_heads, cap, kv_np) value scales / offsets */
    uint8_t *kv_codes;  /* (n_threads, head_dim) per thread: one key row on its way into the cache */
    uint16_t *kv_params; /* (n_threads, kv_np) */

    /* scratch for one chunk of LS_CHUNK tokens, allocated once */
    float *h;      /* (LS_CHUNK, dim) residual stream */
    float *xb;     /* (LS_CHUNK, dim) normed input of a sub-block */
    float *q;      /* (LS_CHUNK, n_heads * head_dim) */
    float *k;      /* (LS_CHUNK, n_kv_heads * head_dim) */
    float *v;      /* (LS_CHUNK, n_kv_heads * head_dim) */
    uint16_t *k16; /* (n_threads, head_dim) per thread: one key in fp16 on its way into the transposed cache */
    float *att;    /* (LS_CHUNK, n_heads * head_dim) attention output */
    float *g;      /* (LS_CHUNK, ffn_dim) gate, then silu(gate) * up */
    float *u;      /* (LS_CHUNK, ffn_dim) up */
    float *rope;   /* (LS_CHUNK, head_dim / 2, 2) cos, sin per position */
    float *scores; /* (n_threads, 4, cap) attention scores, up to 4 rows per thread (a prefill token group) */
    float *logits; /* (vocab_size) for ls_session_step without logits_out */

    struct ls_spec_scratch *spec; /* speculative-cycle buffers (spec.c), allocated on first use */
};

/* ---- tree rows (speculative verification) ----
 * A batch of rows that are not consecutive positions: row t sits at position
 * pos[t] >= base, writes its K/V into ring slot slot[t] of each loop, and
 * attends to the committed positions [.., base) (ring slots q % cap) plus its
 * ancestors: chain[t * chain_ld + (q - base)] is the slot holding position q
 * of row t's path for q in [base, pos[t]] (the row's own slot last). Scores,
 * softmax and value sums run in position order over exactly the positions a
 * plain decode of that path would see, with the same kernels, so a row's
 * values are bit-identical to plain decoding of its path. */
#define LS_TREE_MAX_ROWS 65  /* root + K_branches * draft_ahead (<= 64) */
#define LS_TREE_MAX_DEPTH 16 /* draft_ahead */

typedef struct {
    const int32_t *pos;   /* (n) positions */
    const int32_t *slot;  /* (n) ring slots written */
    const int32_t *chain; /* (n, chain_ld) slots of each row's path from base */
    int32_t chain_ld;
    int32_t base;         /* first position of the tree (the committed length) */
} ls_tree_rows;

/* ---- forward.c ---- */

/* h[t] = E[tokens[t]] (fp16 -> fp32), h (n, dim). */
void ls_forward_embed(ls_session *s, const int32_t *tokens, int32_t n, float *h);

/* Runs the n tokens at positions [pos0, pos0 + n) through loops [la, lb) of
 * the shared block: h (n, dim) holds their loop-la input and receives their
 * loop-lb output. Appends their K/V to the caches of loops la..lb-1, which
 * must each hold exactly pos0 positions (loop_len[l] == pos0); lower loops
 * are not read. This is the entry point a speculative verify pass uses to
 * resume drafted tokens at loop D. Does not touch the token history.
 * Returns LS_OK or LS_ERR_STATE / LS_ERR_ARG / LS_ERR_FULL. */
int32_t ls_forward_loops(ls_session *s, float *h, int32_t n, int32_t pos0, int32_t la, int32_t lb);

/* Brings loops [la, lb), which all hold the same q <= s->pos positions, up
 * to s->pos. The positions' loop-la inputs are recomputed by running their
 * tokens through loops [0, la) again, which rewrites those loops' rows with
 * the values they already hold (every kernel is batch-invariant). For a
 * speculative draft deeper than its verifier (spec.c): plain decoding at the
 * verify depth never writes the loops beyond it. Loops [0, la) must hold
 * s->pos positions. When a windowed ring no longer holds the rows position q
 * attends to, every position is recomputed from 0. Returns LS_OK or
 * LS_ERR_ARG / LS_ERR_STATE. */
int32_t ls_forward_deepen(ls_session *s, int32_t la, int32_t lb);

/* Tree variant of ls_forward_loops: n rows described by `rows` through loops
 * [la, lb). Rows must be ordered so that every ancestor precedes its
 * descendants (chunks of LS_CHUNK then see their ancestors' rows). Touches
 * neither loop_len / loop_lo nor the history: the caller (spec.c) checked
 * the slots and commits the accepted path itself. */
void ls_forward_tree(ls_session *s, float *h, int32_t n, const ls_tree_rows *rows, int32_t la, int32_t lb);

/* logits[t] = rmsnorm(h[t], norm) · Wout for t in [0, n), logits (n, vocab). */
void ls_forward_logits(ls_session *s, const float *h, int32_t n, float *logits);

/* ---- attention.c ---- */

/* cs[t][i] = (cos, sin)(pos(t) * theta^(-2i/head_dim)), computed in double. */
void ls_rope_table(float *cs, int32_t T, int32_t pos0, int32_t head_dim, float theta);

/* Rotates pairs (i, i + head_dim/2) of each of n_heads vectors in x. */
void ls_rope_apply(float *x, int32_t n_heads, int32_t head_dim, const float *cs);

/* Stores k, v (T tokens at pos0.., RoPE applied) into loop's cache in the
 * session's kv mode (kvcache.c) and computes s->att for every (token, head)
 * from s->q (rotated, and the output rotated back, in the H modes). */
void ls_attention(ls_session *s, int32_t loop, int32_t T, int32_t pos0);

/* ls_attention for tree rows (rows already offset to this chunk). */
void ls_attention_tree(ls_session *s, int32_t loop, int32_t T, const ls_tree_rows *rows);

/* ---- spec.c ---- */

/* Frees s->spec (called by ls_session_free). */
void ls_spec_scratch_free(ls_session *s);

/* ---- ranking (spec.c, draft_head.c) ---- */

/* Token a ranks before b in v: higher value, ties to the lower id. */
static inline int ls_ranks_before(const float *v, int32_t a, int32_t b) {
    return v[a] > v[b] || (v[a] == v[b] && a < b);
}

/* Inserts id into best[0, *have), kept ranked (best first), at most n long. */
static inline void ls_rank_insert(const float *v, int32_t id, int32_t *best, int32_t *have, int32_t n) {
    if (*have == n && !ls_ranks_before(v, id, best[n - 1])) return;
    int32_t at = *have < n ? (*have)++ : n - 1;
    while (at > 0 && ls_ranks_before(v, id, best[at - 1])) {
        best[at] = best[at - 1];
        at--;
    }
    best[at] = id;
}

/* ---- draft_head.c ---- */

typedef struct ls_draft_head ls_draft_head;

/* Builds the 2-bit draft head from the model's output head on first use
 * (about 0.15 s for the GPT-2 vocabulary at dim 768, 2 threads);
 * LS_ERR_NOMEM on failure. */
int32_t ls_draft_head_build(ls_model *m);
/* Frees it (called by ls_runtime_free). */
void ls_draft_head_free(ls_runtime *rt);
/* logits (vocab) of rmsnorm(h): the 2-bit head's score of every token
 * (NaN read as -inf); best gets the n best-scored ids (n <= LS_DRAFT_BEST),
 * ranked. Returns how many (min(n, vocab)). */
#define LS_DRAFT_BEST 16
int32_t ls_draft_head_coarse(ls_model *m, const float *h, float *logits, int32_t *best, int32_t n);
/* logits[ids[i]] = the model's own head on the hidden state of the last
 * ls_draft_head_coarse call, for i in [0, n). */
void ls_draft_head_exact(ls_model *m, const int32_t *ids, int32_t n, float *logits);

#endif
