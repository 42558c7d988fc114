/*
 * forward.h — the forward pass over a session (forward.c) and attention
 * over its cache (attention.c), as a step (step.c), a batch (batch.c) and
 * the speculative cycle (spec.c) use them: ranges of loops, tree-shaped batches
 * of rows, the output head on its own. Not ABI.
 */
#ifndef LS_FORWARD_H
#define LS_FORWARD_H

#include <stdint.h>

#include "rope.h"
#include "session.h"

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

/* The rows one pass of the shared block runs over: T rows of the residual
 * stream and their scratch, laid out as the session's chunk scratch
 * (session.h), and each row's RoPE table (cos, sin for its position). */
typedef struct {
    float *h; /* (T, dim) in and out */
    float *xb, *q, *k, *v, *att, *g, *u;
    const float *rope; /* (T, head_dim) */
} ls_block;

/* Stores the rows' K/V for `loop` (unless `stored`: the block's store
 * callback has) and fills b->att from b->q for rows [skip, T): the rows'
 * attention, however they map to sessions and positions. */
typedef void (*ls_block_attention)(void *ctx, int32_t loop, int32_t T, int32_t skip, int32_t stored);

/* Stores the K/V of rows [t0, t1) for `loop` on the calling thread (pool
 * index `thread`): a token part's own rows, right after their RoPE. */
typedef void (*ls_block_store)(void *ctx, int32_t loop, int32_t t0, int32_t t1, int32_t thread);

/* The T rows of b (T <= LS_CHUNK) through loop l of the shared block:
 * norms, matmuls and RoPE on the pool (by output rows, or in token parts
 * for a quantized model's long passes, each part then storing its rows'
 * K/V through `store` where that is not NULL), attention by the callback.
 * Rows [0, skip) only store their K/V: their output is not needed (a
 * prompt's last loop, where only the logit rows go on), so their h is left
 * as it was. Every row's arithmetic is independent of the other rows
 * (batch invariance), so skipping rows changes no other row's bits. */
void ls_forward_block_loop(const ls_model *m, const ls_block *b, int32_t T, int32_t skip, int32_t l,
                           ls_block_attention attention, ls_block_store store, void *ctx);

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

/* The head's input for a final hidden state h (dim): rmsnorm(h, norm), or h
 * itself in a model that norms after every step (its step norm did). */
void ls_head_input(const ls_model *m, float *out, const float *h);

/* logits[t] = head_input(h[t]) · Wout for t in [0, n), logits (n, vocab);
 * xb: (LS_CHUNK, dim) scratch. */
void ls_forward_head(const ls_model *m, const float *h, int32_t n, float *xb, float *logits);

/* ls_forward_head with the session's scratch. */
void ls_forward_logits(ls_session *s, const float *h, int32_t n, float *logits);

/* ---- attention.c ---- */

/* A run of T consecutive positions pos0.. of one session, with their rows
 * in caller-owned buffers: q (T, n_heads * head_dim), RoPE applied; k, v
 * (T, n_kv_heads * head_dim), RoPE applied to k (both used as scratch: the
 * H modes rotate them in place), or NULL where the caller has stored them
 * (ls_attention_store); att receives the output of rows [skip, T) (every
 * row's K/V is stored). */
typedef struct {
    ls_session *s;
    int32_t T, pos0;
    float *q;
    float *k, *v;
    float *att;
    int32_t skip;
} ls_att_rows;

/* Most runs one ls_attention_runs call takes (a batched step's block of
 * rows holds at most LS_CHUNK of them). */
#define LS_ATT_MAX_RUNS LS_CHUNK

/* Stores each run's k, v (where not NULL) into loop's cache of its
 * session in the session's kv mode (kvcache.c), then computes att for
 * every (token, head) from q (rotated, and the output rotated back, in the
 * H modes). Runs belong to distinct sessions. Every (token, head) result
 * is the same whatever else shares the call. */
void ls_attention_runs(const ls_att_rows *runs, int32_t n, int32_t loop);

/* ls_attention_runs of the session's own chunk scratch (s->q, s->k, s->v,
 * s->att); `stored`: the rows' K/V are in already (ls_attention_store). */
void ls_attention(ls_session *s, int32_t loop, int32_t T, int32_t pos0, int32_t skip, int32_t stored);

/* Stores the K/V of rows [t0, t1) of a run at positions pos0.. (k, v as in
 * ls_att_rows, row 0 at pos0) into loop's cache, on the calling thread
 * (thread: its index in the pool, for the store's scratch): a token part's
 * own rows, before the attention that reads them. */
void ls_attention_store(ls_session *s, int32_t loop, int32_t pos0, int32_t t0, int32_t t1, float *k, float *v,
                        int32_t thread);

/* ls_attention for tree rows (rows already offset to this chunk). */
void ls_attention_tree(ls_session *s, int32_t loop, int32_t T, const ls_tree_rows *rows);

#endif
