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
 * The zero-shot rules decide the same way from a probe of each step (the
 * mid norm, the coda and the head over the piece's rows: a side pass).
 *
 * Recurrent depth: every piece of a block runs the prelude's units first
 * (run_prelude: its session keeps the outputs e, and with injection its
 * rows start from the first state), the core's steps take adapter .
 * concat[h, e] at each step's start, and the sampling rows run the coda's
 * units once their core is done (run_coda), before the head.
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
 * first use: one block's rows, the side rows of the fixed units' passes
 * (the coda, and the zero-shot exit rules' probes), and the final hidden
 * state and logits of the sampling rows, which grow with the largest call
 * seen, as do the probes' previous distributions. */
typedef struct {
    float *h, *xb, *q, *k, *v, *att, *g, *u, *rope; /* (LS_CHUNK, ...) as ls_session's chunk scratch */
    float *e;      /* (LS_CHUNK, dim) the rows' prelude outputs (input injection), or NULL */
    float *side_h, *side_rope; /* (LS_CHUNK, dim), (LS_CHUNK, head_dim): rows of a pass over part of a block */
    float *last;   /* (rows_cap, dim) */
    float *logits; /* (rows_cap, vocab) */
    float *prev;   /* (prev_cap, vocab) a probed row's previous logits (KL rule), by its sampling slot */
    double *prev_lse, *prev_entropy; /* (rows_cap) their log-sum-exp; a probed row's previous entropy */
    int32_t rows_cap, prev_cap;
} batch_scratch;

static void scratch_free(void *state) {
    batch_scratch *b = state;
    void *bufs[] = {b->h, b->xb, b->q, b->k, b->v, b->att, b->g, b->u, b->rope, b->e, b->side_h, b->side_rope,
                    b->last, b->logits, b->prev, b->prev_lse, b->prev_entropy, b};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
}

/* p grown to n elements of `size` (realloc), or NULL with p kept (freed by scratch_free). */
static int grow(void **p, size_t n, size_t size) {
    void *q = realloc(*p, n * size);
    if (q) *p = q;
    return q != NULL;
}

/* The scratch for a call of `rows` sampling rows, `kl` of them probed by the KL rule. */
static batch_scratch *scratch_for(ls_model *m, int32_t rows, int32_t kl) {
    ls_ext *slot = &m->rt->ext[LS_RUNTIME_EXT_BATCH];
    const ls_model_info *mi = &m->info;
    size_t C = LS_CHUNK, dim = (size_t)mi->dim, hd = (size_t)mi->head_dim, kv_dim = (size_t)mi->n_kv_heads * hd;
    size_t q_dim = (size_t)mi->n_heads * hd, wide = (size_t)ls_wide_scratch(mi), V = (size_t)mi->vocab_size;
    batch_scratch *b = slot->state;
    if (!b) {
        b = calloc(1, sizeof *b);
        if (!b) return NULL;
        b->h = calloc(C * dim, sizeof(float));
        b->xb = calloc(C * dim, sizeof(float));
        b->q = calloc(C * q_dim, sizeof(float));
        b->k = calloc(C * kv_dim, sizeof(float));
        b->v = calloc(C * kv_dim, sizeof(float));
        b->att = calloc(C * q_dim, sizeof(float));
        b->g = calloc(C * wide, sizeof(float));
        b->u = calloc(C * wide, sizeof(float));
        b->rope = calloc(C * hd, sizeof(float));
        if (mi->injection != LS_INJECT_NONE) b->e = calloc(C * dim, sizeof(float));
        b->side_h = calloc(C * dim, sizeof(float));
        b->side_rope = calloc(C * hd, sizeof(float));
        if (!b->h || !b->xb || !b->q || !b->k || !b->v || !b->att || !b->g || !b->u || !b->rope ||
            (mi->injection != LS_INJECT_NONE && !b->e) || !b->side_h || !b->side_rope) {
            scratch_free(b);
            return NULL;
        }
        slot->state = b;
        slot->free = scratch_free;
    }
    if (rows > b->rows_cap) {
        const size_t n = (size_t)rows;
        if (!grow((void **)&b->last, n * dim, sizeof(float)) || !grow((void **)&b->logits, n * V, sizeof(float)) ||
            !grow((void **)&b->prev_lse, n, sizeof(double)) || !grow((void **)&b->prev_entropy, n, sizeof(double)))
            return NULL;
        b->rows_cap = rows;
    }
    if (kl > 0 && rows > b->prev_cap) { /* a KL row's slot may be any of the call's */
        if (!grow((void **)&b->prev, (size_t)rows * V, sizeof(float))) return NULL;
        b->prev_cap = rows;
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
    int32_t q_dim, kv_dim;
} block_attention;

static void attend_block(void *ctx, int32_t unit, int32_t T, int32_t skip, int32_t stored) {
    (void)stored; /* 0: a block of pieces has no store callback, its runs store here */
    const block_attention *a = ctx;
    ls_att_rows runs[LS_ATT_MAX_RUNS];
    int32_t n = 0;
    for (int32_t i = a->lo, r0 = 0; i < a->n_pieces && r0 < T; r0 += a->pieces[i].n, i++) {
        const ls_batch_piece *p = &a->pieces[i];
        size_t q0 = (size_t)r0 * a->q_dim, k0 = (size_t)r0 * a->kv_dim;
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

/* The rows of pieces [lo, n) (their rows from the start of view) through
 * unit l: the block's pass (core units) and the side passes' (fixed units). */
static void pieces_unit(ls_model *m, ls_session *const *sessions, const ls_batch_piece *pc, int32_t lo, int32_t n,
                        const ls_block *view, int32_t T, int32_t skip, int32_t l) {
    const ls_model_info *mi = &m->info;
    block_attention att = {sessions, pc, lo, n, view, mi->n_heads * mi->head_dim, mi->n_kv_heads * mi->head_dim};
    ls_forward_unit(m, view, T, skip, l, attend_block, NULL, &att);
    ls_batch_unit_done(sessions, pc, lo, n, l);
}

/* The block's scratch as a block of rows from `start`: its own rows (h, rope, e), or the side rows. */
static ls_block block_view(const ls_model *m, batch_scratch *b, int32_t start, int side) {
    const ls_model_info *mi = &m->info;
    size_t dim = (size_t)mi->dim, hd = (size_t)mi->head_dim, q_dim = (size_t)mi->n_heads * hd,
           kv_dim = (size_t)mi->n_kv_heads * hd, r = (size_t)start;
    return (ls_block){(side ? b->side_h : b->h) + r * dim, b->xb, b->q + r * q_dim, b->k + r * kv_dim, b->v + r * kv_dim,
                      b->att + r * q_dim, b->g, b->u, (side ? b->side_rope : b->rope) + r * hd,
                      side || !b->e ? NULL : b->e + r * dim};
}

/* Side pass: the pieces sel[0, n) (their rows gathered from the block's rows
 * at src[i]) through the fixed units u0, u0 - 1, ... (count of them), the
 * mid norm first where `mid`; rows [0, skip) only store their K/V in the
 * last unit. The rows' outputs stay in the side rows, in sel's order. */
static void side_pass(ls_model *m, ls_session *const *sessions, const ls_batch_piece *sel, const int32_t *src,
                      int32_t n, int32_t skip, int mid, int32_t u0, int32_t count, batch_scratch *b) {
    const int32_t dim = m->info.dim, hd = m->info.head_dim;
    int32_t T = 0;
    for (int32_t i = 0; i < n; T += sel[i].n, i++) {
        memcpy(b->side_h + (size_t)T * dim, b->h + (size_t)src[i] * dim, (size_t)sel[i].n * dim * sizeof(float));
        memcpy(b->side_rope + (size_t)T * hd, b->rope + (size_t)src[i] * hd, (size_t)sel[i].n * hd * sizeof(float));
    }
    if (T == 0) return;
    if (mid) ls_forward_mid_norm(m, b->side_h, T);
    const ls_block view = block_view(m, b, 0, 1);
    for (int32_t j = 0; j < count; j++) pieces_unit(m, sessions, sel, 0, n, &view, T, j == count - 1 ? skip : 0, u0 - j);
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
    int32_t rule;    /* 0: the gate's; LS_EXIT_RULE_KL / _ENTROPY: a zero-shot rule's (probes) */
    float threshold;
    float remaining; /* probability of not having exited yet */
    float cdf;       /* of exiting by now */
    int32_t units;   /* the units it was given, before any exit */
    int32_t probed;  /* 1: it exited at a probe, whose coda ran and whose head input is in b->last */
} exit_state;

/* True when a piece's final row is read after its last unit: the row's
 * sampled token comes from it. */
static int needs_output(const ls_batch_piece *p, const int32_t *slot) { return p->last && slot[p->row] >= 0; }

/* Puts the running pieces [lo, n) (rows from `start`) in order of the unit
 * they end at, stable, moving their rows of h, rope and e along (through
 * xb, q and g, free between units): the next units then drop them from the
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
        const size_t rows = (size_t)pc[best].n;
        memcpy(b->xb + (size_t)row * dim, b->h + (size_t)first_row[best] * dim, rows * dim * sizeof(float));
        memcpy(b->q + (size_t)row * hd, b->rope + (size_t)first_row[best] * hd, rows * hd * sizeof(float));
        if (b->e) memcpy(b->g + (size_t)row * dim, b->e + (size_t)first_row[best] * dim, rows * dim * sizeof(float));
        tmp_pc[out] = pc[best];
        tmp_ex[out++] = ex[best];
        row += pc[best].n;
    }
    memcpy(b->h + (size_t)start * dim, b->xb, (size_t)row * dim * sizeof(float));
    memcpy(b->rope + (size_t)start * hd, b->q, (size_t)row * hd * sizeof(float));
    if (b->e) memcpy(b->e + (size_t)start * dim, b->g, (size_t)row * dim * sizeof(float));
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

/* log(sum exp(l)) of a row of logits, in double, in index order. */
static double log_sum_exp(const float *l, int32_t n) {
    double mx = -INFINITY, sum = 0.0;
    for (int32_t i = 0; i < n; i++) mx = (double)l[i] > mx ? (double)l[i] : mx;
    for (int32_t i = 0; i < n; i++) sum += exp((double)l[i] - mx);
    return mx + log(sum);
}

/* A zero-shot rule's value of one probe (loopserve.h), its logits at this
 * step l; `first`: the token's first step (the previous distribution is
 * the uniform one, or entropy 100). Keeps what the next probe compares with. */
static double probe_value(int32_t rule, const float *l, int32_t vocab, int first, float *prev, double *prev_lse,
                          double *prev_entropy) {
    const double lse = log_sum_exp(l, vocab);
    double v = 0.0;
    if (rule == LS_EXIT_RULE_KL) {
        if (first) {
            const double lu = -log((double)vocab);
            for (int32_t i = 0; i < vocab; i++) v += exp(lu) * (lu - ((double)l[i] - lse));
        } else {
            for (int32_t i = 0; i < vocab; i++) {
                const double lp = (double)prev[i] - *prev_lse;
                v += exp(lp) * (lp - ((double)l[i] - lse));
            }
        }
        memcpy(prev, l, (size_t)vocab * sizeof *prev);
        *prev_lse = lse;
        return v;
    }
    double H = 0.0;
    for (int32_t i = 0; i < vocab; i++) {
        const double p = exp((double)l[i] - lse);
        H -= p * log(p + 1e-10);
    }
    v = fabs(H - (first ? 100.0 : *prev_entropy));
    *prev_entropy = H;
    return v;
}

/* After step `done / L` (units run so far): the running pieces [lo, n) of
 * a zero-shot rule not at their last step are probed (their row through the
 * mid norm, the coda and the head, batched as side rows); each whose value
 * is below its threshold gets units = done and its head input in b->last.
 * Returns whether one did. */
static int probe_exits(ls_model *m, ls_session *const *sessions, ls_batch_piece *pc, exit_state *ex, int32_t lo,
                       int32_t n, int32_t start, int32_t done, batch_scratch *b, const int32_t *slot) {
    const ls_model_info *mi = &m->info;
    const int32_t dim = mi->dim, vocab = mi->vocab_size;
    ls_batch_piece sel[LS_CHUNK];
    int32_t src[LS_CHUNK], which[LS_CHUNK], np = 0;
    for (int32_t k = lo, r = start; k < n; r += pc[k].n, k++) {
        if (ex[k].policy == LS_EXIT_NONE || ex[k].rule == 0 || pc[k].units <= done) continue;
        sel[np] = pc[k];
        src[np] = r;
        which[np++] = k;
    }
    if (np == 0) return 0;
    side_pass(m, sessions, sel, src, np, 0, 1, LS_CODA_UNIT(m, 0), mi->n_coda, b);
    ls_forward_head(m, b->side_h, np, b->xb, b->logits);
    int moved = 0;
    for (int32_t j = 0; j < np; j++) {
        const int32_t k = which[j], sl = slot[pc[k].row];
        const double v = probe_value(ex[k].rule, b->logits + (size_t)j * vocab, vocab, done == mi->n_layers,
                                     b->prev ? b->prev + (size_t)sl * vocab : NULL, &b->prev_lse[sl], &b->prev_entropy[sl]);
        if (!(v < (double)ex[k].threshold)) continue;
        pc[k].units = done;
        ex[k].probed = 1;
        memcpy(b->last + (size_t)sl * dim, b->side_h + (size_t)j * dim, (size_t)dim * sizeof(float));
        moved = 1;
    }
    return moved;
}

/* After a step's last unit `done` (units run so far): each early-exiting
 * piece of [lo, n) not at its last step asks its rule (the gate, or a
 * probe), and one that exits gets units = done; the deferred rows of each
 * session then end with the session's deepest piece. */
static void decide_exits(ls_model *m, ls_session *const *sessions, ls_batch_piece *pc, exit_state *ex, int32_t lo,
                         int32_t n, int32_t start, int32_t done, batch_scratch *b, const int32_t *slot) {
    const int32_t dim = m->info.dim;
    int moved = probe_exits(m, sessions, pc, ex, lo, n, start, done, b, slot);
    for (int32_t k = lo, r = start; k < n; r += pc[k].n, k++) {
        exit_state *e = &ex[k];
        if (e->policy == LS_EXIT_NONE || e->rule != 0 || pc[k].units <= done) continue;
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
        memcpy(b->h + (size_t)T * dim, s->def_h + (size_t)a * dim, (size_t)cnt * dim * sizeof(float));
        if (b->e) memcpy(b->e + (size_t)T * dim, s->e + (size_t)a * dim, (size_t)cnt * dim * sizeof(float));
        ls_rope_table(b->rope + (size_t)T * hd, cnt, a, hd, mi->rope_theta);
        pc[*n_pieces] = d;
        ex[*n_pieces] = (exit_state){LS_EXIT_NONE, 0, 0.0f, 1.0f, 0.0f, end, 0};
        (*n_pieces)++;
        T += cnt;
        added = 1;
    }
    if (added) order_running(m, pc, ex, lo, *n_pieces, start, b);
    return T;
}

/* A piece that exited after `pc->units` of its `units` (LS_EXIT_COPY):
 * every deeper unit of its session gets, at its position, the keys/values
 * of the same layer in its exit step. With shared steps (cache_steps) only
 * the slots its steps did not reach: one it wrote keeps its latest write,
 * as the published compress-s cache with its latest lookup reads it. */
static void fill_exited(ls_session *s, const ls_batch_piece *pc, int32_t units) {
    const int32_t L = s->m->info.n_layers, last_step = pc->units - L, pos = pc->pos0, slot = pos % s->cap;
    for (int32_t u = pc->units; u < units; u++) {
        if (u < s->core_slots) ls_kv_copy_row(s, u, slot, s, last_step + u % L, slot);
        ls_seq_advance(s->unit_len, s->unit_lo, u, pos + 1, s->cap);
    }
}

/* The block's pieces through the prelude's units (all of them begin
 * there); their sessions keep the prelude outputs, which the block's e rows
 * hold too, and with input injection each row then holds its first state. */
static void run_prelude(ls_model *m, ls_session *const *sessions, const ls_batch_piece *pc, int32_t n, int32_t T,
                        batch_scratch *b) {
    const ls_model_info *mi = &m->info;
    const int32_t dim = mi->dim;
    const ls_block view = block_view(m, b, 0, 0);
    for (int32_t j = 0; j < mi->n_prelude; j++) pieces_unit(m, sessions, pc, 0, n, &view, T, 0, LS_PRELUDE_UNIT(j));
    for (int32_t i = 0, r0 = 0; i < n; r0 += pc[i].n, i++) {
        ls_session *s = sessions[pc[i].row];
        const size_t rows = (size_t)pc[i].n * dim;
        memcpy(s->e + (size_t)pc[i].pos0 * dim, b->h + (size_t)r0 * dim, rows * sizeof(float));
        if (!b->e) continue;
        memcpy(b->e + (size_t)r0 * dim, b->h + (size_t)r0 * dim, rows * sizeof(float));
        for (int32_t t = 0; t < pc[i].n; t++) ls_state0(m, pc[i].pos0 + t, b->h + (size_t)(r0 + t) * dim);
    }
}

/* The block's pieces that run the coda at its end (each but the deferred
 * ones and those whose probe ran it), through the mid norm and the coda:
 * those whose output is not read first, so that the last unit skips them;
 * each sampling row's output goes to b->last. */
static void run_coda(ls_model *m, ls_session *const *sessions, const ls_batch_piece *pc, const exit_state *ex,
                     int32_t n, batch_scratch *b, const int32_t *slot) {
    const int32_t dim = m->info.dim;
    ls_batch_piece sel[LS_CHUNK];
    int32_t src[LS_CHUNK], first_row[LS_CHUNK], ns = 0, skip = 0, first_read = 1;
    for (int32_t i = 0, r0 = 0; i < n; r0 += pc[i].n, i++) first_row[i] = r0;
    for (int out = 0; out < 2; out++) /* those not read, then those read */
        for (int32_t i = 0; i < n; i++) {
            if (deferred(&pc[i]) || ex[i].probed || needs_output(&pc[i], slot) != out) continue;
            if (!out) skip += pc[i].n;
            else if (first_read) skip += pc[i].n - 1, first_read = 0; /* the first read piece's leading rows */
            sel[ns] = pc[i];
            src[ns++] = first_row[i];
        }
    side_pass(m, sessions, sel, src, ns, skip, 1, LS_CODA_UNIT(m, 0), m->info.n_coda, b);
    for (int32_t i = 0, r0 = 0; i < ns; r0 += sel[i].n, i++)
        if (needs_output(&sel[i], slot))
            memcpy(b->last + (size_t)slot[sel[i].row] * dim, b->side_h + (size_t)(r0 + sel[i].n - 1) * dim,
                   (size_t)dim * sizeof(float));
}

/* Runs one block of pieces through their units; keeps each sampling row's
 * final hidden state in b->last[slot[row]] and the steps it ran in its
 * session. */
static void run_block(ls_model *m, ls_session *const *sessions, const ls_batch_row *rows, const int32_t *exits,
                      const ls_batch_piece *pieces, int32_t n_pieces, const int32_t *tokens, batch_scratch *b,
                      const int32_t *slot) {
    const ls_model_info *mi = &m->info;
    int32_t dim = mi->dim, hd = mi->head_dim, L = mi->n_layers;
    const int coda = mi->n_coda > 0;
    ls_batch_piece pc[LS_CHUNK];
    exit_state ex[LS_CHUNK];
    int any_exit = 0;
    int32_t T = 0;
    for (int32_t i = 0; i < n_pieces; i++) {
        const ls_batch_piece *p = &pieces[i];
        const ls_step_params *sp = &rows[p->row].step;
        pc[i] = *p;
        const int exit_piece = p->last && exits[p->row]; /* the plan split its token off */
        ex[i] = (exit_state){exit_piece ? ls_exit_policy_of(sp) : LS_EXIT_NONE, ls_exit_rule_of(sp), sp->exit_threshold,
                             1.0f, 0.0f, p->units, 0};
        any_exit |= exit_piece;
        ls_forward_embed(sessions[p->row], tokens + p->first, p->n, b->h + (size_t)T * dim);
        ls_rope_table(b->rope + (size_t)T * hd, p->n, p->pos0, hd, mi->rope_theta);
        T += p->n;
    }
    if (ls_keeps_prelude(m)) run_prelude(m, sessions, pc, n_pieces, T, b);
    for (int32_t l = 0, lo = 0, start = 0; ; l++) {
        if (l % L == 0) T = join_deferred(m, sessions, pc, ex, &n_pieces, lo, start, T, l, b);
        /* pieces are ordered by the unit they end at: drop the ones done */
        while (lo < n_pieces && pc[lo].units <= l) start += pc[lo++].n;
        if (lo == n_pieces) break;
        /* the pieces ending at this unit lead; their rows up to the first
         * one a sampled token or a later unit reads only store K/V (with a
         * coda, every row's output goes on to it) */
        int32_t skip = 0;
        for (int32_t k = lo; k < n_pieces && pc[k].units == l + 1 && !deferred(&pc[k]) && !coda; k++) {
            if (needs_output(&pc[k], slot)) {
                skip += pc[k].n - 1;
                break;
            }
            skip += pc[k].n;
        }
        ls_block view = block_view(m, b, start, 0);
        pieces_unit(m, sessions, pc, lo, n_pieces, &view, T - start, skip, l);
        if (any_exit && (l + 1) % L == 0) decide_exits(m, sessions, pc, ex, lo, n_pieces, start, l + 1, b, slot);
    }
    if (coda) run_coda(m, sessions, pc, ex, n_pieces, b, slot);
    ls_batch_block_done(sessions, pc, n_pieces, tokens);
    for (int32_t i = 0, r0 = 0; i < n_pieces; r0 += pc[i].n, i++) {
        const ls_batch_piece *p = &pc[i];
        ls_session *s = sessions[p->row];
        /* deferred rows, and an exact exit's token, keep the state their next unit starts from */
        if (deferred(p) || (ex[i].policy == LS_EXIT_EXACT && p->units < ex[i].units))
            for (int32_t t = 0; t < p->n; t++) ls_session_defer(s, p->pos0 + t, p->units, b->h + (size_t)(r0 + t) * dim);
        if (ex[i].policy == LS_EXIT_COPY) fill_exited(s, p, ex[i].units);
        if (!needs_output(p, slot)) continue;
        if (!coda) memcpy(b->last + (size_t)slot[p->row] * dim, b->h + (size_t)(r0 + p->n - 1) * dim, (size_t)dim * sizeof(float));
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
    int32_t kl = 0;
    for (int32_t i = 0; i < n_rows; i++) {
        int32_t end = sessions[i]->pos + rows[i].n_tokens;
        const ls_step_params *sp = &rows[i].step;
        const int exits = ls_step_exits(m, sp, rows[i].sample, rows[i].n_tokens);
        out[i] = ls_session_reserve(sessions[i], end);
        if (out[i] == LS_OK && ls_exit_policy_of(sp) == LS_EXIT_EXACT && exits)
            out[i] = ls_session_defer_reserve(sessions[i], end); /* the exiting token may keep its state */
        if (out[i] != LS_OK) rc = out[i];
        kl += exits && ls_exit_rule_of(sp) == LS_EXIT_RULE_KL;
    }
    if (rc != LS_OK) return rc;

    ls_batch_plan plan;
    ls_batch_plan_rows(&plan, sessions, rows, n_rows, row_before);
    batch_scratch *b = scratch_for(m, plan.n_sample > 0 ? plan.n_sample : 1, kl);
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
