/*
 * batch_rules.h — ls_batch_step's checks of its arguments, its plan (run
 * order, blocks) and its session bookkeeping, shared by the CPU library
 * (batch.c) and the CUDA one. Include after the library's session
 * definition: ls_session_view, and the fields both libraries' sessions
 * name alike (pos, tokens, unit_len, unit_lo, cap). Not ABI.
 */
#ifndef LS_BATCH_RULES_H
#define LS_BATCH_RULES_H

#include <string.h>

#include "session_rules.h"

/* A step's exit policy (LS_EXIT_NONE / EXACT / COPY) and its rule bits. */
static inline int32_t ls_exit_policy_of(const ls_step_params *p) { return p->exit_policy & LS_EXIT_POLICY_MASK; }
static inline int32_t ls_exit_rule_of(const ls_step_params *p) { return p->exit_policy & ~LS_EXIT_POLICY_MASK; }

/* A step's settings as ls_batch_step accepts them (sampling checked only
 * when the row samples, which a masked row must): a policy, at most one
 * zero-shot rule, and a threshold in the rule's range (the gate's [0, 1], a
 * zero-shot rule's finite >= 0). */
static inline int ls_step_params_ok(const ls_step_params *p, int32_t sample) {
    const int32_t policy = ls_exit_policy_of(p), rule = ls_exit_rule_of(p);
    const float t = p->exit_threshold;
    const int rule_ok = rule == 0 ? policy == LS_EXIT_NONE || (t >= 0.0f && t <= 1.0f)
                        : rule == LS_EXIT_RULE_KL || rule == LS_EXIT_RULE_ENTROPY
                            ? policy != LS_EXIT_NONE && t >= 0.0f && !isinf(t)
                            : 0;
    return policy >= LS_EXIT_NONE && policy <= LS_EXIT_COPY && rule_ok && (p->masked == 0 || (p->masked == 1 && sample)) &&
           (!sample || ls_sampling_ok(&p->sampling));
}

/* An exit policy the session can run: the gate's rule needs a model with a
 * gate; the exact policy a session without a window or shared steps, of a
 * model that budgets the states it keeps (loopserve.h). */
static inline int ls_step_exit_ok(ls_seq_view s, const ls_step_params *p) {
    const int32_t policy = ls_exit_policy_of(p);
    const int exact_ok = s.window == 0 && s.cache_steps == 0 && ls_keeps_states(s.m);
    return policy == LS_EXIT_NONE ||
           ((s.m->info.exit_gate || ls_exit_rule_of(p) != 0) && (policy != LS_EXIT_EXACT || exact_ok));
}

/* The row exits early: it samples under an exit policy the model allows; a
 * zero-shot rule only on a row of one token (loopserve.h). */
static inline int ls_step_exits(const ls_model *m, const ls_step_params *p, int32_t sample, int32_t n_tokens) {
    if (!sample || ls_exit_policy_of(p) == LS_EXIT_NONE) return 0;
    return ls_exit_rule_of(p) != 0 ? n_tokens == 1 : m->info.exit_gate;
}

/* Checks every row before anything runs: distinct sessions of model m, each
 * row's tokens, depth and room as ls_session_step checks them, and a mask
 * for each masked row. Writes each row's status to out; returns the first
 * error, or LS_OK. */
static inline int32_t ls_check_batch(const ls_model *m, ls_session *const *sessions, const ls_batch_row *rows,
                                     int32_t n_rows, const int32_t *tokens, const uint32_t *masks, int32_t *out) {
    if (!m || !sessions || !rows || !tokens || !out || n_rows < 1 || n_rows > LS_BATCH_MAX_ROWS) return LS_ERR_ARG;
    int32_t first = LS_OK;
    int64_t off = 0;
    for (int32_t i = 0; i < n_rows; i++) {
        const ls_batch_row *r = &rows[i];
        int32_t rc = LS_OK;
        if (!sessions[i] || ls_session_view(sessions[i]).m != m || r->n_tokens < 1 || (r->sample != 0 && r->sample != 1) ||
            !ls_step_params_ok(&r->step, r->sample) || !ls_step_exit_ok(ls_session_view(sessions[i]), &r->step) ||
            (r->step.masked && !masks))
            rc = LS_ERR_ARG;
        for (int32_t j = 0; j < i && rc == LS_OK; j++)
            if (sessions[j] == sessions[i]) rc = LS_ERR_ARG;
        if (rc == LS_OK) rc = ls_check_feed(ls_session_view(sessions[i]), tokens + off, r->n_tokens, r->step.loops);
        if (r->n_tokens > 0) off += r->n_tokens;
        out[i] = rc;
        if (rc != LS_OK && first == LS_OK) first = rc;
    }
    return first;
}

/* One block's share of a row: n of its tokens at pos0.. of its session. */
typedef struct {
    int32_t row;   /* index into the call's rows */
    int32_t first; /* first token, offset into the call's token array */
    int32_t n, pos0, units; /* units: the cache units (steps x layers) the piece runs */
    int32_t last; /* the row's final piece */
} ls_batch_piece;

/* A checked call's rows in run order (stable under `before`), each with its
 * first token and its session's position before the call; sampling rows
 * numbered in call order for the head (slot -1: samples nothing). */
typedef struct {
    int32_t order[LS_BATCH_MAX_ROWS], first[LS_BATCH_MAX_ROWS], pos0[LS_BATCH_MAX_ROWS], slot[LS_BATCH_MAX_ROWS];
    int32_t n_rows, n_sample, n_tokens;
    int32_t layers; /* the model's: a row's loops run loops x layers units */
    int32_t exits[LS_BATCH_MAX_ROWS]; /* 1: the row exits early (ls_step_exits); its last token is a piece of its own */
    int32_t deferred[LS_BATCH_MAX_ROWS]; /* rows its block keeps for the session's deferred positions */
    int32_t whole[LS_BATCH_MAX_ROWS]; /* 1: the row's session shares steps' caches (cache_steps): its tokens are cut
                                       * into blocks at LS_CHUNK from its first only, whatever else the call runs */
} ls_batch_plan;

/* Most rows a block keeps for one session's deferred positions: more are
 * computed before the block reaches them, in chunks of their own. */
#define LS_BATCH_DEFERRED_ROWS 16

typedef int (*ls_batch_before)(const ls_batch_row *a, const ls_batch_row *b);

static inline void ls_batch_plan_rows(ls_batch_plan *p, ls_session *const *sessions, const ls_batch_row *rows,
                                      int32_t n_rows, ls_batch_before before) {
    p->n_rows = n_rows;
    p->n_sample = p->n_tokens = 0;
    p->layers = ls_session_view(sessions[0]).layers;
    for (int32_t i = 0; i < n_rows; p->n_tokens += rows[i].n_tokens, i++) {
        p->first[i] = p->n_tokens;
        p->pos0[i] = ls_session_view(sessions[i]).pos;
        p->slot[i] = rows[i].sample ? p->n_sample++ : -1;
        p->exits[i] = ls_step_exits(ls_session_view(sessions[i]).m, &rows[i].step, rows[i].sample, rows[i].n_tokens);
        p->whole[i] = ls_session_view(sessions[i]).cache_steps > 0;
        int32_t d = ls_units_deferred(ls_session_view(sessions[i]), rows[i].step.loops * p->layers);
        p->deferred[i] = d < LS_BATCH_DEFERRED_ROWS ? d : 0;
        int32_t j = i;
        while (j > 0 && before(&rows[i], &rows[p->order[j - 1]])) {
            p->order[j] = p->order[j - 1];
            j--;
        }
        p->order[j] = i;
    }
}

/* Cuts the planned rows into blocks of at most `block` rows (a long row
 * spans several), in run order, and hands each to run(ctx, pieces, n);
 * stops at the first nonzero result and returns it. pieces holds `block`. */
static inline int ls_batch_blocks(const ls_batch_plan *p, const ls_batch_row *rows, int32_t block,
                                  ls_batch_piece *pieces, int (*run)(void *ctx, const ls_batch_piece *pieces, int32_t n),
                                  void *ctx) {
    int32_t n_pieces = 0, block_rows = 0;
    for (int32_t k = 0; k < p->n_rows; k++) {
        int32_t i = p->order[k];
        /* room for the row's deferred positions in the block of its first piece */
        if (p->deferred[i] > 0 && block_rows > 0 && block_rows + p->deferred[i] >= block) {
            int rc = run(ctx, pieces, n_pieces);
            if (rc) return rc;
            n_pieces = block_rows = 0;
        }
        block_rows += p->deferred[i];
        const int32_t whole = rows[i].n_tokens < block ? rows[i].n_tokens : block;
        if (p->whole[i] && block_rows > 0 && block_rows + whole > block) {
            int rc = run(ctx, pieces, n_pieces);
            if (rc) return rc;
            n_pieces = block_rows = 0;
        }
        for (int32_t done = 0; done < rows[i].n_tokens;) {
            int32_t n = rows[i].n_tokens - done;
            if (p->exits[i] && n > 1) n--; /* the exiting token on its own */
            if (n > block - block_rows) n = block - block_rows;
            ls_batch_piece piece = {i, p->first[i] + done, n, p->pos0[i] + done,
                                    rows[i].step.loops * p->layers, done + n == rows[i].n_tokens};
            pieces[n_pieces++] = piece;
            block_rows += n;
            done += n;
            if (block_rows == block) {
                int rc = run(ctx, pieces, n_pieces);
                if (rc) return rc;
                n_pieces = block_rows = 0;
            }
        }
    }
    return n_pieces > 0 ? run(ctx, pieces, n_pieces) : 0;
}

/* Unit l (a core unit, or a fixed one) has run for pieces [lo, n): their
 * sessions' unit l holds their positions. */
static inline void ls_batch_unit_done(ls_session *const *sessions, const ls_batch_piece *pieces, int32_t lo,
                                      int32_t n, int32_t l) {
    for (int32_t i = lo; i < n; i++) {
        ls_session *s = sessions[pieces[i].row];
        ls_seq_advance(s->unit_len, s->unit_lo, ls_unit_index(s->units, l), pieces[i].pos0 + pieces[i].n, s->cap);
    }
}

/* A block has run every unit: its pieces' tokens join their sessions'
 * histories, each at its own positions (an exiting token's piece may have
 * moved ahead of the rest of its row). */
static inline void ls_batch_block_done(ls_session *const *sessions, const ls_batch_piece *pieces, int32_t n,
                                       const int32_t *tokens) {
    for (int32_t i = 0; i < n; i++) {
        const ls_batch_piece *p = &pieces[i];
        ls_session *s = sessions[p->row];
        if (p->first < 0) continue; /* deferred rows: positions it holds already */
        memcpy(s->tokens + p->pos0, tokens + p->first, (size_t)p->n * sizeof *tokens);
        if (p->pos0 + p->n > s->pos) s->pos = p->pos0 + p->n;
    }
}

#endif
