/*
 * attention.h — attention over a session's cache (attention.c): runs of
 * consecutive positions, as a step and a batch use them (forward.c,
 * batch.c), and tree-shaped rows, as speculative verification does
 * (spec.c). Not ABI.
 */
#ifndef LS_ATTENTION_H
#define LS_ATTENTION_H

#include <stdint.h>

#include "session_state.h"

/* ---- runs of consecutive positions ---- */

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

/* Stores each run's k, v (where not NULL) into unit's cache of its
 * session in the session's kv mode (kvcache.c), then computes att for
 * every (token, head) from q (rotated, and the output rotated back, in the
 * H modes). A session's runs cover distinct positions, and a run whose
 * rows another run of its session reads has its K/V stored before the
 * call (k NULL): a batch's deferred rows (batch.c). Every (token, head)
 * result is the same whatever else shares the call. */
void ls_attention_runs(const ls_att_rows *runs, int32_t n, int32_t unit);

/* ls_attention_runs of the session's own chunk scratch (s->q, s->k, s->v,
 * s->att); `stored`: the rows' K/V are in already (ls_attention_store). */
void ls_attention(ls_session *s, int32_t unit, int32_t T, int32_t pos0, int32_t skip, int32_t stored);

/* Stores the K/V of rows [t0, t1) of a run at positions pos0.. (k, v as in
 * ls_att_rows, row 0 at pos0) into unit's cache, on the calling thread
 * (thread: its index in the pool, for the store's scratch): a token part's
 * own rows, before the attention that reads them. */
void ls_attention_store(ls_session *s, int32_t unit, int32_t pos0, int32_t t0, int32_t t1, float *k, float *v,
                        int32_t thread);

/* ---- tree rows (speculative verification) ----
 * A batch of rows that are not consecutive positions: row t sits at position
 * pos[t] >= base, writes its K/V into ring slot slot[t] of each unit, and
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
    float *e;             /* (n, dim) the rows' prelude outputs (models that keep them: rows of one position
                           * may differ, so they are the rows' own, not the session's), or NULL */
} ls_tree_rows;

/* ls_attention for tree rows (rows already offset to this chunk). */
void ls_attention_tree(ls_session *s, int32_t unit, int32_t T, const ls_tree_rows *rows);

#endif
