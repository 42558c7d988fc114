/*
 * forward.h — the forward pass over a session (forward.c), as a step
 * (step.c), a batch (batch.c) and the speculative cycle (spec.c) use it:
 * ranges of loops, tree-shaped batches of rows (attention.h), the output
 * head on its own. Not ABI.
 */
#ifndef LS_FORWARD_H
#define LS_FORWARD_H

#include <stdint.h>

#include "attention.h"
#include "rope.h"
#include "session.h"

/* ---- forward.c ---- */

/* The rows one pass of the shared block runs over: T rows of the residual
 * stream and their scratch, laid out as the session's chunk scratch
 * (session_state.h), and each row's RoPE table (cos, sin for its position). */
typedef struct {
    float *h; /* (T, dim) in and out */
    float *xb, *q, *k, *v, *att, *g, *u;
    const float *rope; /* (T, head_dim) */
    const float *e;    /* (T, dim) the rows' prelude outputs, which the input injection reads at each step's
                        * first unit (LS_INJECT_ADAPTER); NULL otherwise */
} ls_block;

/* Stores the rows' K/V for `unit` (unless `stored`: the block's store
 * callback has) and fills b->att from b->q for rows [skip, T): the rows'
 * attention, however they map to sessions and positions. */
typedef void (*ls_block_attention)(void *ctx, int32_t unit, int32_t T, int32_t skip, int32_t stored);

/* Stores the K/V of rows [t0, t1) for `unit` on the calling thread (pool
 * index `thread`): a token part's own rows, right after their RoPE. */
typedef void (*ls_block_store)(void *ctx, int32_t unit, int32_t t0, int32_t t1, int32_t thread);

/* The T rows of b (T <= LS_CHUNK) through unit l (a core unit, or a fixed
 * one of the prelude or coda: internal.h LS_UNIT_LAYER): at a step's first
 * core unit of a model with input injection, first h = adapter .
 * concat[h, e] (b->e); then norms, matmuls and RoPE on the pool (by output
 * rows, or in token parts for a quantized model's long passes, each part
 * then storing its rows' K/V through `store` where that is not NULL),
 * attention by the callback. Rows [0, skip) only store their K/V: their
 * output is not needed (a prompt's last unit, where only the logit rows go
 * on), so their h is left as it was. Every row's arithmetic is independent
 * of the other rows (batch invariance), so skipping rows changes no other
 * row's bits. */
void ls_forward_unit(const ls_model *m, const ls_block *b, int32_t T, int32_t skip, int32_t l,
                           ls_block_attention attention, ls_block_store store, void *ctx);

/* h[t] = E[tokens[t]] * embed_scale (fp16 -> fp32), h (n, dim). */
void ls_forward_embed(ls_session *s, const int32_t *tokens, int32_t n, float *h);

/* The first step's state of a model with input injection at position pos
 * (loopserve.h ls_model_config.state_std), h (dim). */
void ls_state0(const ls_model *m, int32_t pos, float *h);

/* The norm between the core and the coda (mid_norm), in place on n rows. */
void ls_forward_mid_norm(const ls_model *m, float *h, int32_t n);

/* Tokens at positions [pos0, pos0 + n) (or tree rows: rows, then pos0 is
 * unused) through the embedding and the prelude's units, which must hold
 * exactly their first position: h (n, dim) receives each one's first step's
 * input (the prelude output, or the injection's first state), and the
 * session keeps the prelude outputs (ls_keeps_prelude). */
void ls_forward_start(ls_session *s, const int32_t *tokens, int32_t n, int32_t pos0, const ls_tree_rows *rows,
                      float *h);

/* The core's output h (n, dim) of positions [pos0, pos0 + n) (or tree rows)
 * through the mid norm and the coda's units: h then holds the head's input
 * before its norm (ls_head_input). Rows [0, keep) only store their K/V in
 * the coda's last unit. Without a coda, the mid norm only. */
void ls_forward_finish(ls_session *s, float *h, int32_t n, int32_t pos0, const ls_tree_rows *rows, int32_t keep);

/* The first step's input of held position pos: the injection's first state,
 * or the prelude output (kept, or with no prelude the scaled embedding), h (dim). */
void ls_core_input(ls_session *s, int32_t pos, float *h);

/* Runs the n tokens at positions [pos0, pos0 + n) through units [la, lb) of
 * the shared block: h (n, dim) holds their unit-la input and receives their
 * unit-lb output. Appends their K/V to the caches of units la..lb-1, which
 * must each hold exactly pos0 positions (unit_len[l] == pos0); lower units
 * are not read. This is the entry point a speculative verify pass uses to
 * resume drafted tokens at loop D. Does not touch the token history.
 * Returns LS_OK or LS_ERR_STATE / LS_ERR_ARG / LS_ERR_FULL. */
int32_t ls_forward_units(ls_session *s, float *h, int32_t n, int32_t pos0, int32_t la, int32_t lb);

/* Brings units [la, lb), which all hold the same q <= s->pos positions, up
 * to s->pos. The positions' unit-la inputs are recomputed by running their
 * tokens through units [0, la) again, which rewrites those units' rows with
 * the values they already hold (every kernel is batch-invariant). For a
 * speculative draft deeper than its verifier (spec.c): plain decoding at the
 * verify depth never writes the units beyond it. Units [0, la) must hold
 * s->pos positions. When a windowed ring no longer holds the rows position q
 * attends to, every position is recomputed from 0. Returns LS_OK or
 * LS_ERR_ARG / LS_ERR_STATE. */
int32_t ls_forward_deepen(ls_session *s, int32_t la, int32_t lb);

/* Computes the units [0, need) that earlier exact early exits deferred
 * (loopserve.h) for every position lacking them, step by step, each from
 * its kept state; afterwards units [0, need) hold every position. Returns
 * LS_OK (also when none are deferred), or LS_ERR_ARG / LS_ERR_STATE. */
int32_t ls_forward_settle(ls_session *s, int32_t need);

/* One step of ls_forward_settle: positions [a, b), which lack the step
 * beginning at unit u and hold every unit before it, through that step from
 * their kept states, which then hold the next step's input. */
void ls_forward_settle_step(ls_session *s, int32_t a, int32_t b, int32_t u);

/* Tree variant of ls_forward_units: n rows described by `rows` through units
 * [la, lb). Rows must be ordered so that every ancestor precedes its
 * descendants (chunks of LS_CHUNK then see their ancestors' rows). Touches
 * neither unit_len / unit_lo nor the history: the caller (spec.c) checked
 * the slots and commits the accepted path itself. */
void ls_forward_tree(ls_session *s, float *h, int32_t n, const ls_tree_rows *rows, int32_t la, int32_t lb);

/* The head's input for a final hidden state h (dim; after the coda where
 * there is one): rmsnorm(h, norm), or h itself in a model without a coda
 * that norms after every step (its step norm did). */
void ls_head_input(const ls_model *m, float *out, const float *h);

/* logits[t] = head_input(h[t]) · Wout for t in [0, n), logits (n, vocab);
 * xb: (LS_CHUNK, dim) scratch. */
void ls_forward_head(const ls_model *m, const float *h, int32_t n, float *xb, float *logits);

/* ls_forward_head with the session's scratch. */
void ls_forward_logits(ls_session *s, const float *h, int32_t n, float *logits);

#endif
