/*
 * block_steps.h — one block of ls_batch_step whose rows may exit early or
 * whose sessions hold deferred units (learned early exit, loopserve.h):
 * its rows run unit by unit; after each step the gate of every row that
 * may exit is asked, and a row that exits leaves the block at that step;
 * before each step the positions of a session going on that lack the
 * step's units join the block as rows of their own, from their kept
 * states, or, with no room left, are computed through the step first; at
 * the end exiting rows keep their states (exact) or give their keys and
 * values to the units they skipped (copy). The schedule of the CPU
 * library's batch.c, step for step.
 *
 * Host code, written once against operations on the block's rows
 * (lsb_ops): the CUDA library's (batch.cu: kernels, each gate and exit
 * decided on the device, exit_math.h) and the harness's
 * (bench/gpu/harness/exits.c: the CPU library's own kernels), which holds
 * this schedule to the CPU library's ls_batch_step bit for bit: tokens,
 * logits, exit steps, cache units and the sessions' bookkeeping.
 *
 * Include after the library's session definition and batch_rules.h; it
 * reads and writes the fields both libraries' sessions name alike (pos,
 * tokens, unit_len, unit_lo, cap, def_units, last_steps). Not ABI.
 */
#ifndef LS_CUDA_BLOCK_STEPS_H
#define LS_CUDA_BLOCK_STEPS_H

#include <stdint.h>

/* A row the gate is asked about after a step: where its hidden state is in
 * the block, and the call's row (whose exit state the operations keep). */
typedef struct {
    int32_t block_row, call_row;
} lsb_ask;

/* What a block's rows are run with. Each returns 0, or nonzero on a
 * failure (which ends the block: lsb_run returns it). Rows are the block
 * scratch's, numbered from 0. */
typedef struct {
    void *ctx;
    /* rows [row, row + p->n) receive the embeddings of the piece's tokens */
    int32_t (*embed)(void *ctx, int32_t row, const ls_batch_piece *p);
    /* rows [row, row + n) receive session s's kept states of positions pos0.. */
    int32_t (*load)(void *ctx, int32_t row, ls_session *s, int32_t pos0, int32_t n);
    /* session s keeps rows [row, row + n) as the states of positions pos0.. */
    int32_t (*keep)(void *ctx, int32_t row, ls_session *s, int32_t pos0, int32_t n);
    /* the block's rows are now the pieces' in order, piece k's n rows at
     * positions pc[k].pos0.. of its session */
    int32_t (*rows)(void *ctx, const ls_batch_piece *pc, int32_t n_pieces);
    /* unit l over rows [start, T), which are those of pieces [lo, n_pieces) */
    int32_t (*unit)(void *ctx, const ls_batch_piece *pc, int32_t lo, int32_t n_pieces, int32_t start, int32_t T,
                    int32_t l);
    /* the call's row call_row may exit from now on (its distribution starts: lsx_exit_state) */
    int32_t (*exit_begin)(void *ctx, int32_t call_row, float threshold);
    /* each asked row's gate on its hidden state, folded into its distribution;
     * exited[i] = 1 when row asks[i] exits after this step */
    int32_t (*decide)(void *ctx, const lsb_ask *asks, int32_t n, int32_t *exited);
    /* rows [start, start + n): the new row start + i is the old row start + from[i] */
    int32_t (*permute)(void *ctx, int32_t start, const int32_t *from, int32_t n);
    /* positions [a, b) of s, which lack the step beginning at unit u and hold
     * every unit before it, through that step from their kept states, which
     * then hold the next step's input (ls_forward_settle_step) */
    int32_t (*settle_step)(void *ctx, ls_session *s, int32_t a, int32_t b, int32_t u);
    /* s's units [from, to) at position pos receive the keys and values its
     * unit of the same layer in the step before `from` holds there */
    int32_t (*copy_units)(void *ctx, ls_session *s, int32_t pos, int32_t from, int32_t to);
    /* row `row` holds sampling slot `slot`'s final hidden state */
    int32_t (*last)(void *ctx, int32_t row, int32_t slot);
} lsb_ops;

/* A call's shared inputs: its sessions, rows and plan (ls_batch_plan). */
typedef struct {
    const lsb_ops *ops;
    ls_session *const *sessions;
    const ls_batch_row *rows;
    const int32_t *exits; /* plan.exits: the row exits early */
    const int32_t *slot;  /* plan.slot: its sampling slot, or -1 */
    const int32_t *tokens;
    int32_t layers;       /* the model's n_layers */
} lsb_call;

/* A piece's exit rule: policy NONE for a piece that runs all its units. */
typedef struct {
    int32_t policy;
    float threshold;
    int32_t units; /* the units it was given, before any exit */
} lsb_exit;

/* One block in flight: its pieces (deferred rows join as pieces of their
 * own, first < 0) and their exit rules, in the order of their rows. */
typedef struct {
    const lsb_call *c;
    ls_batch_piece pc[LS_CHUNK];
    lsb_exit ex[LS_CHUNK];
    int32_t n_pieces;
} lsb_block;

/* Run order of a call's rows: shallowest first, stable (the CUDA library's
 * plan: its kernels skip no rows, so nothing else orders them). */
static inline int lsb_row_before(const ls_batch_row *a, const ls_batch_row *b) {
    return a->step.loops < b->step.loops;
}

static inline int lsb_deferred(const ls_batch_piece *p) { return p->first < 0; }

/* The unit the block's pieces of row r run to (their deepest, deferred rows
 * aside), and their first position. */
static inline int32_t lsb_row_end(const lsb_block *b, int32_t r, int32_t *first_pos) {
    int32_t end = 0, pos = INT32_MAX;
    for (int32_t k = 0; k < b->n_pieces; k++) {
        const ls_batch_piece *p = &b->pc[k];
        if (p->row != r) continue;
        if (!lsb_deferred(p) && p->units > end) end = p->units;
        if (p->pos0 < pos) pos = p->pos0;
    }
    *first_pos = pos;
    return end;
}

/* Puts the running pieces [lo, n) (rows from `start`) in order of the unit
 * they end at, stable, their rows moving along, so that the next units
 * drop them from the front. Tells the operations of the new rows when they
 * moved or `changed` (rows joined). */
static inline int32_t lsb_order(lsb_block *b, int32_t lo, int32_t start, int changed) {
    const lsb_ops *ops = b->c->ops;
    const int32_t n = b->n_pieces;
    int sorted = 1;
    for (int32_t k = lo + 1; k < n && sorted; k++) sorted = b->pc[k - 1].units <= b->pc[k].units;
    if (sorted) return changed ? ops->rows(ops->ctx, b->pc, n) : 0;
    ls_batch_piece pc[LS_CHUNK];
    lsb_exit ex[LS_CHUNK];
    int32_t first_row[LS_CHUNK], from[LS_CHUNK], taken[LS_CHUNK] = {0}, out = 0, rows = 0;
    for (int32_t k = lo, r = start; k < n; r += b->pc[k].n, k++) first_row[k] = r;
    while (out < n - lo) {
        int32_t best = -1;
        for (int32_t k = lo; k < n; k++)
            if (!taken[k - lo] && (best < 0 || b->pc[k].units < b->pc[best].units)) best = k;
        taken[best - lo] = 1;
        for (int32_t t = 0; t < b->pc[best].n; t++) from[rows++] = first_row[best] - start + t;
        pc[out] = b->pc[best];
        ex[out++] = b->ex[best];
    }
    for (int32_t k = 0; k < out; k++) {
        b->pc[lo + k] = pc[k];
        b->ex[lo + k] = ex[k];
    }
    int32_t rc = ops->permute(ops->ctx, start, from, rows);
    return rc ? rc : ops->rows(ops->ctx, b->pc, n);
}

/* After a step's last unit (`done` units run): the gate of each piece of
 * [lo, n) that may exit and goes on; one that exits ends at `done`, and
 * the deferred rows of each session end with its deepest piece. */
static inline int32_t lsb_decide(lsb_block *b, int32_t lo, int32_t start, int32_t done) {
    const lsb_ops *ops = b->c->ops;
    lsb_ask asks[LS_CHUNK];
    int32_t which[LS_CHUNK], exited[LS_CHUNK], n_asks = 0;
    for (int32_t k = lo, r = start; k < b->n_pieces; r += b->pc[k].n, k++) {
        if (b->ex[k].policy == LS_EXIT_NONE || b->pc[k].units <= done) continue;
        asks[n_asks].block_row = r;
        asks[n_asks].call_row = b->pc[k].row;
        which[n_asks++] = k;
    }
    if (n_asks == 0) return 0;
    int32_t rc = ops->decide(ops->ctx, asks, n_asks, exited);
    if (rc) return rc;
    int moved = 0;
    for (int32_t i = 0; i < n_asks; i++)
        if (exited[i]) {
            b->pc[which[i]].units = done;
            moved = 1;
        }
    if (!moved) return 0;
    for (int32_t k = lo; k < b->n_pieces; k++) {
        int32_t first_pos;
        if (lsb_deferred(&b->pc[k])) b->pc[k].units = lsb_row_end(b, b->pc[k].row, &first_pos);
    }
    return lsb_order(b, lo, start, 0);
}

/* Before the step beginning at unit l: the positions of each session going
 * on into it that lack its units join the block as a piece of deferred
 * rows, where the block has room (the plan kept it), or else are computed
 * through the step first. *T: the block's rows. */
static inline int32_t lsb_join(lsb_block *b, int32_t lo, int32_t start, int32_t *T, int32_t l) {
    const lsb_ops *ops = b->c->ops;
    const int32_t n = b->n_pieces;
    int added = 0;
    for (int32_t k = lo; k < n; k++) {
        const int32_t r = b->pc[k].row;
        if (lsb_deferred(&b->pc[k]) || b->pc[k].units <= l) continue;
        int seen = 0;
        for (int32_t j = lo; j < k && !seen; j++)
            seen = b->pc[j].row == r && !lsb_deferred(&b->pc[j]) && b->pc[j].units > l;
        ls_session *s = b->c->sessions[r];
        if (seen || !s->def_units) continue;
        int32_t first_pos, end = lsb_row_end(b, r, &first_pos);
        const int32_t a = s->unit_len[l], cnt = first_pos - a; /* positions [a, first_pos) lack unit l */
        if (cnt <= 0) continue;
        int32_t rc;
        if (*T + cnt > LS_CHUNK || b->n_pieces == LS_CHUNK) {
            if ((rc = ops->settle_step(ops->ctx, s, a, first_pos, l)) != 0) return rc;
            continue;
        }
        if ((rc = ops->load(ops->ctx, *T, s, a, cnt)) != 0) return rc;
        ls_batch_piece d = {r, -1, cnt, a, end, 0};
        lsb_exit none = {LS_EXIT_NONE, 0.0f, end};
        b->pc[b->n_pieces] = d;
        b->ex[b->n_pieces++] = none;
        *T += cnt;
        added = 1;
    }
    return added ? lsb_order(b, lo, start, 1) : 0;
}

/* A piece that exited after p->units of its `units` under the copy policy:
 * its session's deeper units get, at its position, the keys and values of
 * the same layer in its exit step. */
static inline int32_t lsb_fill(const lsb_call *c, const ls_batch_piece *p, int32_t units) {
    if (p->units >= units) return 0;
    ls_session *s = c->sessions[p->row];
    int32_t rc = c->ops->copy_units(c->ops->ctx, s, p->pos0, p->units, units);
    for (int32_t u = p->units; u < units && rc == 0; u++) ls_seq_advance(s->unit_len, s->unit_lo, u, p->pos0 + 1, s->cap);
    return rc;
}

/* Runs one block of pieces (ls_batch_blocks's) through their units; each
 * sampling row's final state goes to its slot and the steps it ran to its
 * session. 0, or the first operation's failure. */
static inline int32_t lsb_run(const lsb_call *c, const ls_batch_piece *pieces, int32_t n_pieces) {
    const lsb_ops *ops = c->ops;
    const int32_t L = c->layers;
    lsb_block blk;
    lsb_block *b = &blk;
    b->c = c;
    b->n_pieces = n_pieces;
    int any_exit = 0;
    int32_t T = 0, rc = 0;
    for (int32_t i = 0; i < n_pieces && rc == 0; T += pieces[i].n, i++) {
        const ls_batch_piece *p = &pieces[i];
        const ls_step_params *sp = &c->rows[p->row].step;
        const int exit_piece = p->last && c->exits[p->row]; /* the plan split its token off */
        lsb_exit e = {exit_piece ? sp->exit_policy : LS_EXIT_NONE, sp->exit_threshold, p->units};
        b->pc[i] = *p;
        b->ex[i] = e;
        any_exit |= exit_piece;
        rc = ops->embed(ops->ctx, T, p);
        if (rc == 0 && exit_piece) rc = ops->exit_begin(ops->ctx, p->row, sp->exit_threshold);
    }
    if (rc == 0) rc = ops->rows(ops->ctx, b->pc, b->n_pieces);
    for (int32_t l = 0, lo = 0, start = 0; rc == 0; l++) {
        if (l % L == 0 && (rc = lsb_join(b, lo, start, &T, l)) != 0) break;
        /* pieces are ordered by the unit they end at: drop the ones done */
        while (lo < b->n_pieces && b->pc[lo].units <= l) start += b->pc[lo++].n;
        if (lo == b->n_pieces) break;
        if ((rc = ops->unit(ops->ctx, b->pc, lo, b->n_pieces, start, T, l)) != 0) break;
        ls_batch_unit_done(c->sessions, b->pc, lo, b->n_pieces, l);
        if (any_exit && (l + 1) % L == 0) rc = lsb_decide(b, lo, start, l + 1);
    }
    if (rc) return rc;
    ls_batch_block_done(c->sessions, b->pc, b->n_pieces, c->tokens);
    for (int32_t i = 0, r0 = 0; i < b->n_pieces && rc == 0; r0 += b->pc[i].n, i++) {
        const ls_batch_piece *p = &b->pc[i];
        const lsb_exit *e = &b->ex[i];
        ls_session *s = c->sessions[p->row];
        /* deferred rows, and an exact exit's token, keep the state their next unit starts from */
        if (lsb_deferred(p) || (e->policy == LS_EXIT_EXACT && p->units < e->units)) {
            rc = ops->keep(ops->ctx, r0, s, p->pos0, p->n);
            for (int32_t t = 0; t < p->n; t++) s->def_units[p->pos0 + t] = p->units;
        }
        if (rc == 0 && e->policy == LS_EXIT_COPY) rc = lsb_fill(c, p, e->units);
        if (rc == 0 && p->last && c->slot[p->row] >= 0) {
            rc = ops->last(ops->ctx, r0 + p->n - 1, c->slot[p->row]);
            s->last_steps = p->units / L;
        }
    }
    return rc;
}

#endif
