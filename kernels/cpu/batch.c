/*
 * batch.c — ls_batch_step (loopserve.h): many sessions advanced by one call.
 *
 * The rows of every session go through the shared block together: each
 * matmul reads the weights once for all of them, attention runs per session
 * over its own cache, and every row's arithmetic is what ls_session_step
 * would do for it alone (the kernels are batch-invariant: a row's results
 * never depend on the other rows of a call, docs/kernels.md).
 *
 * Rows are ordered by loop depth, shallowest first, so at unit l the rows
 * still running are a suffix of the block and the matmuls shrink as
 * shallow rows leave (a depth-ragged batch). In a row's last loop only its
 * sampled row needs the attention output, FFN and residual; the others
 * just store their K/V. ls_forward_unit skips a prefix of its rows,
 * so among rows of one depth those that sample nothing come first and
 * sampling rows follow, longest first (a prompt's final chunk before
 * decode rows). The ordered rows are cut into blocks of at most LS_CHUNK
 * rows (batch_rules.h), each run through all its loops before the next, as
 * ls_session_forward cuts a long prompt; a windowed ring holds window +
 * LS_CHUNK rows, so a block never overwrites a row it still attends to.
 * The output head then runs once over every sampling row.
 *
 * A row that exits early (ls_step_params.exit_threshold, a model with an
 * exit gate) has its sampled token as a piece of its own; after each step
 * its gate decides, and an exiting piece moves (with its hidden state and
 * RoPE rows) to the front of the rows still running, which the next loop
 * then drops like any piece whose loops are done. Its deeper cache units
 * are filled once the block has run (loopserve.h, learned early exit).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "attention.h"
#include "forward.h"
#include "kvcache.h"
#include "sampling.h"
#include "batch_rules.h" /* after forward.h (session.h): it reads sessions through ls_session_view */

/* The runtime's batch scratch (its LS_RUNTIME_EXT_BATCH slot), allocated on
 * first use: one block's rows, and the final hidden state and logits of the
 * sampling rows, which grow with the largest call seen. */
typedef struct {
    float *h, *xb, *q, *k, *v, *att, *g, *u, *rope; /* (LS_CHUNK, ...) as ls_session's chunk scratch */
    float *last;   /* (rows_cap, dim) */
    float *logits; /* (rows_cap, vocab) */
    int32_t rows_cap;
} batch_scratch;

static void scratch_free(void *state) {
    batch_scratch *b = state;
    void *bufs[] = {b->h, b->xb, b->q, b->k, b->v, b->att, b->g, b->u, b->rope, b->last, b->logits, b};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
}

static batch_scratch *scratch_for(ls_model *m, int32_t rows) {
    ls_ext *slot = &m->rt->ext[LS_RUNTIME_EXT_BATCH];
    const ls_model_info *mi = &m->info;
    size_t C = LS_CHUNK, dim = (size_t)mi->dim, kv_dim = (size_t)mi->n_kv_heads * mi->head_dim;
    batch_scratch *b = slot->state;
    if (!b) {
        b = calloc(1, sizeof *b);
        if (!b) return NULL;
        b->h = calloc(C * dim, sizeof(float));
        b->xb = calloc(C * dim, sizeof(float));
        b->q = calloc(C * dim, sizeof(float));
        b->k = calloc(C * kv_dim, sizeof(float));
        b->v = calloc(C * kv_dim, sizeof(float));
        b->att = calloc(C * dim, sizeof(float));
        b->g = calloc(C * (size_t)mi->ffn_dim, sizeof(float));
        b->u = calloc(C * (size_t)mi->ffn_dim, sizeof(float));
        b->rope = calloc(C * (size_t)mi->head_dim, sizeof(float));
        if (!b->h || !b->xb || !b->q || !b->k || !b->v || !b->att || !b->g || !b->u || !b->rope) {
            scratch_free(b);
            return NULL;
        }
        slot->state = b;
        slot->free = scratch_free;
    }
    if (rows > b->rows_cap) {
        float *last = realloc(b->last, (size_t)rows * dim * sizeof(float));
        if (last) b->last = last;
        float *logits = realloc(b->logits, (size_t)rows * (size_t)mi->vocab_size * sizeof(float));
        if (logits) b->logits = logits;
        if (!last || !logits) return NULL;
        b->rows_cap = rows;
    }
    return b;
}

/* A piece of deferred rows (first < 0): earlier positions of a session
 * whose units the session's pieces in the block need, computed beside them
 * from their kept states (exact early exit). */
static int deferred(const ls_batch_piece *p) { return p->first < 0; }

/* The attention of a block at unit l: the pieces still running, [lo,
 * n_pieces), each over its own session, their rows from the start of view. */
typedef struct {
    ls_session *const *sessions;
    const ls_batch_piece *pieces;
    int32_t lo, n_pieces;
    const ls_block *view;
    int32_t dim, kv_dim;
} block_attention;

static void attend_block(void *ctx, int32_t unit, int32_t T, int32_t skip, int32_t stored) {
    (void)stored; /* 0: a block of pieces has no store callback, its runs store here */
    const block_attention *a = ctx;
    ls_att_rows runs[LS_ATT_MAX_RUNS];
    int32_t n = 0;
    for (int32_t i = a->lo, r0 = 0; i < a->n_pieces && r0 < T; r0 += a->pieces[i].n, i++) {
        const ls_batch_piece *p = &a->pieces[i];
        size_t q0 = (size_t)r0 * a->dim, k0 = (size_t)r0 * a->kv_dim;
        int32_t cut = skip - r0 < 0 ? 0 : skip - r0 > p->n ? p->n : skip - r0;
        float *k = a->view->k + k0, *v = a->view->v + k0;
        if (deferred(p)) { /* its session's other rows read them: in before any attends */
            ls_attention_store(a->sessions[p->row], unit, p->pos0, 0, p->n, k, v, 0);
            k = v = NULL;
        }
        runs[n++] = (ls_att_rows){a->sessions[p->row], p->n, p->pos0, a->view->q + q0, k, v, a->view->att + q0, cut};
    }
    ls_attention_runs(runs, n, unit);
}

/* The exit gate's probability for a hidden state h (dim): fp32, in a fixed order. */
static float exit_lambda(const ls_model *m, const float *h) {
    const int32_t dim = m->info.dim;
    const float *w = m->rt->exit_gate;
    float z = w[dim];
    for (int32_t i = 0; i < dim; i++) z += h[i] * w[i];
    return 1.0f / (1.0f + expf(-z));
}

/* A piece's exit rule and its running exit distribution. */
typedef struct {
    int32_t policy;  /* LS_EXIT_*: NONE for a piece that runs its units */
    float threshold;
    float remaining; /* probability of not having exited yet */
    float cdf;       /* of exiting by now */
    int32_t units;   /* the units it was given, before any exit */
} exit_state;

/* True when a piece's final row is read after its last unit: the row's
 * sampled token comes from it. */
static int needs_output(const ls_batch_piece *p, const int32_t *slot) { return p->last && slot[p->row] >= 0; }

/* Puts the running pieces [lo, n) (rows from `start`) in order of the unit
 * they end at, stable, moving their rows of h and rope along (through xb
 * and q, free between units): the next units then drop them from the
 * front. */
static void order_running(const ls_model *m, ls_batch_piece *pc, exit_state *ex, int32_t lo, int32_t n, int32_t start,
                          batch_scratch *b) {
    int sorted = 1;
    for (int32_t k = lo + 1; k < n && sorted; k++) sorted = pc[k - 1].units <= pc[k].units;
    if (sorted) return;
    const int32_t dim = m->info.dim, hd = m->info.head_dim;
    ls_batch_piece tmp_pc[LS_CHUNK];
    exit_state tmp_ex[LS_CHUNK];
    int32_t first_row[LS_CHUNK], out = 0, row = 0, taken[LS_CHUNK] = {0};
    for (int32_t k = lo, r = start; k < n; r += pc[k].n, k++) first_row[k] = r;
    while (out < n - lo) {
        int32_t best = -1;
        for (int32_t k = lo; k < n; k++)
            if (!taken[k - lo] && (best < 0 || pc[k].units < pc[best].units)) best = k;
        taken[best - lo] = 1;
        memcpy(b->xb + (size_t)row * dim, b->h + (size_t)first_row[best] * dim, (size_t)pc[best].n * dim * sizeof(float));
        memcpy(b->q + (size_t)row * hd, b->rope + (size_t)first_row[best] * hd, (size_t)pc[best].n * hd * sizeof(float));
        tmp_pc[out] = pc[best];
        tmp_ex[out++] = ex[best];
        row += pc[best].n;
    }
    memcpy(b->h + (size_t)start * dim, b->xb, (size_t)row * dim * sizeof(float));
    memcpy(b->rope + (size_t)start * hd, b->q, (size_t)row * hd * sizeof(float));
    memcpy(pc + lo, tmp_pc, (size_t)out * sizeof *pc);
    memcpy(ex + lo, tmp_ex, (size_t)out * sizeof *ex);
}

/* The unit the block's pieces of row r run to (their deepest), and their
 * first position (the session's position when the block began). */
static int32_t row_end(const ls_batch_piece *pc, int32_t n, int32_t r, int32_t *first_pos) {
    int32_t end = 0, pos = INT32_MAX;
    for (int32_t k = 0; k < n; k++)
        if (pc[k].row == r) {
            if (!deferred(&pc[k]) && pc[k].units > end) end = pc[k].units;
            if (pc[k].pos0 < pos) pos = pc[k].pos0;
        }
    *first_pos = pos;
    return end;
}

/* After a step's last unit `done` (units run so far): each early-exiting
 * piece of [lo, n) not at its last step asks its gate, and one that exits
 * gets units = done; the deferred rows of each session then end with the
 * session's deepest piece. */
static void decide_exits(const ls_model *m, ls_batch_piece *pc, exit_state *ex, int32_t lo, int32_t n, int32_t start,
                         int32_t done, batch_scratch *b) {
    const int32_t dim = m->info.dim;
    int moved = 0;
    for (int32_t k = lo, r = start; k < n; r += pc[k].n, k++) {
        exit_state *e = &ex[k];
        if (e->policy == LS_EXIT_NONE || pc[k].units <= done) continue;
        const float lambda = exit_lambda(m, b->h + (size_t)r * dim);
        const float p = lambda * e->remaining;
        e->remaining = e->remaining * (1.0f - lambda);
        e->cdf = e->cdf + p;
        if (e->cdf >= e->threshold) {
            pc[k].units = done;
            moved = 1;
        }
    }
    if (!moved) return;
    for (int32_t k = lo; k < n; k++) {
        int32_t first_pos;
        if (deferred(&pc[k])) pc[k].units = row_end(pc, n, pc[k].row, &first_pos);
    }
    order_running(m, pc, ex, lo, n, start, b);
}

/* Before step `l / L` (unit l a step's first): the positions of each
 * session going on into this step that lack the step's units join the
 * block as a piece of deferred rows, in the room the block has (the plan
 * reserved it), or else are computed through the step on their own first.
 * Returns the block's rows; *n_pieces grows. */
static int32_t join_deferred(ls_model *m, ls_session *const *sessions, ls_batch_piece *pc, exit_state *ex,
                             int32_t *n_pieces, int32_t lo, int32_t start, int32_t T, int32_t l, batch_scratch *b) {
    const ls_model_info *mi = &m->info;
    const int32_t dim = mi->dim, hd = mi->head_dim, n = *n_pieces;
    int32_t added = 0;
    for (int32_t k = lo; k < n; k++) {
        const int32_t r = pc[k].row;
        if (deferred(&pc[k]) || pc[k].units <= l) continue;
        int seen = 0;
        for (int32_t j = lo; j < k && !seen; j++) seen = pc[j].row == r && !deferred(&pc[j]) && pc[j].units > l;
        ls_session *s = sessions[r];
        if (seen || !s->def_units) continue;
        int32_t first_pos, end = row_end(pc, *n_pieces, r, &first_pos);
        int32_t a = s->unit_len[l], cnt = first_pos - a; /* positions [a, first_pos) lack unit l */
        if (cnt <= 0) continue;
        if (T + cnt > LS_CHUNK || *n_pieces == LS_CHUNK) {
            ls_forward_settle_step(s, a, first_pos, l);
            continue;
        }
        ls_batch_piece d = {r, -1, cnt, a, end, 0};
        for (int32_t t = 0; t < cnt; t++) memcpy(b->h + (size_t)(T + t) * dim, s->def_h + (size_t)(a + t) * dim, (size_t)dim * sizeof(float));
        ls_rope_table(b->rope + (size_t)T * hd, cnt, a, hd, mi->rope_theta);
        pc[*n_pieces] = d;
        ex[*n_pieces] = (exit_state){LS_EXIT_NONE, 0.0f, 1.0f, 0.0f, end};
        (*n_pieces)++;
        T += cnt;
        added = 1;
    }
    if (added) order_running(m, pc, ex, lo, *n_pieces, start, b);
    return T;
}

/* A piece that exited after `pc->units` of its `units` (LS_EXIT_COPY):
 * every deeper unit of its session gets, at its position, the keys/values
 * of the same layer in its exit step. */
static void fill_exited(ls_session *s, const ls_batch_piece *pc, int32_t units) {
    const int32_t L = s->m->info.n_layers, last_step = pc->units - L, pos = pc->pos0, slot = pos % s->cap;
    for (int32_t u = pc->units; u < units; u++) {
        ls_kv_copy_row(s, u, slot, s, last_step + u % L, slot);
        ls_seq_advance(s->unit_len, s->unit_lo, u, pos + 1, s->cap);
    }
}

/* Runs one block of pieces through their units; keeps each sampling row's
 * final hidden state in b->last[slot[row]] and the steps it ran in its
 * session. */
static void run_block(ls_model *m, ls_session *const *sessions, const ls_batch_row *rows, const int32_t *exits,
                      const ls_batch_piece *pieces, int32_t n_pieces, const int32_t *tokens, batch_scratch *b,
                      const int32_t *slot) {
    const ls_model_info *mi = &m->info;
    int32_t dim = mi->dim, hd = mi->head_dim, L = mi->n_layers;
    ls_batch_piece pc[LS_CHUNK];
    exit_state ex[LS_CHUNK];
    int any_exit = 0;
    int32_t T = 0;
    for (int32_t i = 0; i < n_pieces; i++) {
        const ls_batch_piece *p = &pieces[i];
        const ls_step_params *sp = &rows[p->row].step;
        pc[i] = *p;
        const int exit_piece = p->last && exits[p->row]; /* the plan split its token off */
        ex[i] = (exit_state){exit_piece ? sp->exit_policy : LS_EXIT_NONE, sp->exit_threshold, 1.0f, 0.0f, p->units};
        any_exit |= exit_piece;
        ls_forward_embed(sessions[p->row], tokens + p->first, p->n, b->h + (size_t)T * dim);
        ls_rope_table(b->rope + (size_t)T * hd, p->n, p->pos0, hd, mi->rope_theta);
        T += p->n;
    }
    block_attention att = {sessions, pc, 0, n_pieces, NULL, dim, mi->n_kv_heads * hd};
    for (int32_t l = 0, lo = 0, start = 0; ; l++) {
        if (l % L == 0) T = join_deferred(m, sessions, pc, ex, &n_pieces, lo, start, T, l, b);
        /* pieces are ordered by the unit they end at: drop the ones done */
        while (lo < n_pieces && pc[lo].units <= l) start += pc[lo++].n;
        if (lo == n_pieces) break;
        /* the pieces ending at this unit lead; their rows up to the first
         * one a sampled token or a later unit reads only store K/V */
        int32_t skip = 0;
        for (int32_t k = lo; k < n_pieces && pc[k].units == l + 1 && !deferred(&pc[k]); k++) {
            if (needs_output(&pc[k], slot)) {
                skip += pc[k].n - 1;
                break;
            }
            skip += pc[k].n;
        }
        size_t kv_dim = (size_t)att.kv_dim;
        ls_block view = {b->h + (size_t)start * dim, b->xb, b->q + (size_t)start * dim, b->k + start * kv_dim,
                         b->v + start * kv_dim, b->att + (size_t)start * dim, b->g, b->u, b->rope + (size_t)start * hd};
        att.lo = lo;
        att.n_pieces = n_pieces;
        att.view = &view;
        ls_forward_unit(m, &view, T - start, skip, l, attend_block, NULL, &att);
        ls_batch_unit_done(sessions, pc, lo, n_pieces, l);
        if (any_exit && (l + 1) % L == 0) decide_exits(m, pc, ex, lo, n_pieces, start, l + 1, b);
    }
    ls_batch_block_done(sessions, pc, n_pieces, tokens);
    for (int32_t i = 0, r0 = 0; i < n_pieces; r0 += pc[i].n, i++) {
        const ls_batch_piece *p = &pc[i];
        ls_session *s = sessions[p->row];
        /* deferred rows, and an exact exit's token, keep the state their next unit starts from */
        if (deferred(p) || (ex[i].policy == LS_EXIT_EXACT && p->units < ex[i].units))
            for (int32_t t = 0; t < p->n; t++) ls_session_defer(s, p->pos0 + t, p->units, b->h + (size_t)(r0 + t) * dim);
        if (ex[i].policy == LS_EXIT_COPY) fill_exited(s, p, ex[i].units);
        if (!needs_output(p, slot)) continue;
        memcpy(b->last + (size_t)slot[p->row] * dim, b->h + (size_t)(r0 + p->n - 1) * dim, (size_t)dim * sizeof(float));
        s->last_steps = p->units / L;
    }
}

/* run_block's arguments, as ls_batch_blocks hands blocks over. */
typedef struct {
    ls_model *m;
    ls_session *const *sessions;
    const ls_batch_row *rows;
    const int32_t *exits;
    const int32_t *tokens;
    batch_scratch *b;
    const int32_t *slot;
} block_call;

static int run_block_call(void *ctx, const ls_batch_piece *pieces, int32_t n) {
    const block_call *c = ctx;
    run_block(c->m, c->sessions, c->rows, c->exits, pieces, n, c->tokens, c->b, c->slot);
    return 0;
}

/* The draws of ls_batch_step's sampling rows (slot >= 0), one task a row. */
typedef struct {
    ls_session *const *sessions;
    const ls_batch_row *rows;
    const int32_t *slot;
    float *logits;          /* the head's rows, by slot (a masked row's is masked in place) */
    const uint32_t *masks;  /* or NULL: no row is masked */
    float *logits_out;      /* or NULL */
    int32_t vocab;
    int32_t *out;
} draw_job;

static void draw_task(void *ctx, int32_t i, int32_t thread) {
    (void)thread;
    const draw_job *j = ctx;
    j->out[i] = LS_OK;
    if (j->slot[i] < 0) return;
    float *lg = j->logits + (size_t)j->slot[i] * (size_t)j->vocab;
    if (j->rows[i].step.masked) ls_mask_logits(lg, j->vocab, j->masks + (size_t)i * ls_mask_words(j->vocab));
    if (j->logits_out) memcpy(j->logits_out + (size_t)i * (size_t)j->vocab, lg, (size_t)j->vocab * sizeof(float));
    j->out[i] = ls_step_sample(j->sessions[i], lg, &j->rows[i].step);
}

/* Run order: shallowest first; at one depth, rows that sample nothing,
 * then sampling rows, longest first (batch.c's header says why). */
static int row_before(const ls_batch_row *a, const ls_batch_row *b) {
    if (a->step.loops != b->step.loops) return a->step.loops < b->step.loops;
    if (!a->sample != !b->sample) return !a->sample;
    return a->sample && a->n_tokens > b->n_tokens;
}

int32_t ls_batch_step(ls_model *m, ls_session *const *sessions, const ls_batch_row *rows, int32_t n_rows,
                      const int32_t *tokens, const uint32_t *masks, float *logits_out, int32_t *out) {
    return ls_batch_step_gated(m, sessions, rows, n_rows, tokens, masks, logits_out, out, NULL, NULL);
}

int32_t ls_batch_step_gated(ls_model *m, ls_session *const *sessions, const ls_batch_row *rows, int32_t n_rows,
                            const int32_t *tokens, const uint32_t *masks, float *logits_out, int32_t *out,
                            void (*gate)(void *), void *gate_ctx) {
    if (!m || !m->rt) return LS_ERR_ARG;
    int32_t rc = ls_check_batch(m, sessions, rows, n_rows, tokens, masks, out);
    if (rc != LS_OK) return rc;
    /* cache room for every row before any runs (a grown cache holds the same positions) */
    for (int32_t i = 0; i < n_rows; i++) {
        int32_t end = sessions[i]->pos + rows[i].n_tokens;
        out[i] = ls_session_reserve(sessions[i], end);
        if (out[i] == LS_OK && rows[i].step.exit_policy == LS_EXIT_EXACT && ls_step_exits(m, &rows[i].step, rows[i].sample))
            out[i] = ls_session_defer_reserve(sessions[i], end); /* the exiting token may keep its state */
        if (out[i] != LS_OK) rc = out[i];
    }
    if (rc != LS_OK) return rc;

    ls_batch_plan plan;
    ls_batch_plan_rows(&plan, sessions, rows, n_rows, row_before);
    batch_scratch *b = scratch_for(m, plan.n_sample > 0 ? plan.n_sample : 1);
    if (!b) return LS_ERR_NOMEM;
    block_call call = {m, sessions, rows, plan.exits, tokens, b, plan.slot};
    ls_batch_piece pieces[LS_CHUNK];
    ls_batch_blocks(&plan, rows, LS_CHUNK, pieces, run_block_call, &call);

    /* the head over every sampling row at once, then the rows' draws, one
     * pool task each (a draw reads only its own row and session) */
    if (plan.n_sample > 0) ls_forward_head(m, b->last, plan.n_sample, b->xb, b->logits);
    if (gate) gate(gate_ctx);
    draw_job job = {sessions, rows, plan.slot, b->logits, masks, logits_out, m->info.vocab_size, out};
    double t0 = ls_prof_now(m->rt);
    ls_pool_run(m->rt->pool, draw_task, &job, n_rows);
    ls_prof_add(m->rt, LS_PROF_SAMPLE, &t0);
    for (int32_t i = 0; i < n_rows; i++)
        if (out[i] < 0 && rc == LS_OK) rc = out[i];
    return rc;
}
