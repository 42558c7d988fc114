/*
 * forward.h — the forward pass over a session (forward.c) and attention
 * over its cache (attention.c), as the session calls (session.c) and the
 * speculative cycle (spec.c) use them: ranges of loops, tree-shaped batches
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

/* Rotates pairs (i, i + head_dim/2) of each of n_heads vectors in x. */
void ls_rope_apply(float *x, int32_t n_heads, int32_t head_dim, const float *cs);

/* Stores k, v (T tokens at pos0.., RoPE applied) into loop's cache in the
 * session's kv mode (kvcache.c) and computes s->att for every (token, head)
 * from s->q (rotated, and the output rotated back, in the H modes). */
void ls_attention(ls_session *s, int32_t loop, int32_t T, int32_t pos0);

/* ls_attention for tree rows (rows already offset to this chunk). */
void ls_attention_tree(ls_session *s, int32_t loop, int32_t T, const ls_tree_rows *rows);

#endif
