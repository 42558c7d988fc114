/*
 * exits.c — the CPU half of the proof that the CUDA library's learned early
 * exit is the CPU library's:
 *   gate-exp       the device's exp (its double exp rounded to fp32,
 *                  kernels/cuda/exit_math.h) equals libm's expf, which the
 *                  CPU library's gate uses, on every argument sampled;
 *   exit-schedule  kernels/cuda/block_steps.h, the schedule the CUDA library
 *                  runs blocks of exiting and deferred rows on, run with the
 *                  CPU library's own kernels as its operations and
 *                  exit_math.h's gate, in the CUDA library's row order, held
 *                  to the CPU library's ls_batch_step over sequences of
 *                  batched steps on models with an exit gate: every row's
 *                  token, logits and exit step, and each session's
 *                  key/value caches, kept states and bookkeeping, bit for
 *                  bit; and the CPU library's histories hold the tokens fed.
 * The device kernels themselves are held to the CPU library by the
 * validation driver on a GPU.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/exit_math.h"
#include "driver.h"
#include "forward.h"
#include "harness.h"
#include "kvcache.h"
#include "batch_rules.h" /* after forward.h (session.h): it reads sessions through ls_session_view */
#include "cuda/block_steps.h"

// ---- gate-exp ----

/* Whether a is at least as near as b to exp(x) (long double: 11 more bits). */
static int nearer(float a, float b, float x) {
    const long double e = expl((long double)x);
    return fabsl((long double)a - e) <= fabsl((long double)b - e);
}

/* The device's exp (lsx_exp) against libm's expf over the arguments a gate
 * gives: where they differ, by one ulp, the device's is the nearer to
 * exp(x). The CPU library's gate differs from the device's there. */
static void check_gate_exp(void) {
    char detail[240] = "";
    int64_t cases = 0, differ = 0;
    int ok = 1;
    for (int64_t i = 0; i < 12000000 && ok; i++, cases++) {
        /* a sweep of [-40, 40], then random arguments over the range where expf is finite and not 0 */
        const float x = i <= 8000000 ? (float)(i - 4000000) * 1e-5f : ((float)harness_rand() / 4294967296.0f * 2.0f - 1.0f) * 87.0f;
        const float dev = lsx_exp(x), lib = expf(x);
        if (same_float(dev, lib)) continue;
        differ++;
        if (nextafterf(dev, lib) != lib || !nearer(dev, lib, x)) {
            snprintf(detail, sizeof detail, "x = %.9g: the device's exp %.9g, expf %.9g", x, dev, lib);
            ok = 0;
        }
    }
    if (ok)
        snprintf(detail, sizeof detail,
                 "%lld arguments in [-87, 87]: equal but for %lld (%.4f%%), where libm's expf is one ulp off and the "
                 "device's exp is the nearer",
                 (long long)cases, (long long)differ, 100.0 * (double)differ / (double)cases);
    report_bar("gate-exp", ok, "equal, or one ulp nearer than libm's expf", detail);
}

// ---- block_steps.h's operations on the CPU library ----

/* The emulated device: one block's rows (the CPU library's chunk scratch),
 * the sampling rows' final states, and each call row's exit distribution. */
typedef struct {
    ls_model *m;
    ls_session *const *sessions;
    const int32_t *tokens;
    float *h, *xb, *q, *k, *v, *att, *g, *u, *rope; /* (LS_CHUNK, ...) */
    float *last;                                    /* (LS_BATCH_MAX_ROWS, dim) */
    float *logits;                                  /* (LS_BATCH_MAX_ROWS, vocab) */
    lsx_exit_state states[LS_BATCH_MAX_ROWS];
} emu;

static int32_t dim_of(const emu *e) { return e->m->info.dim; }
static int32_t kv_dim_of(const emu *e) { return e->m->info.n_kv_heads * e->m->info.head_dim; }

static int32_t emu_embed(void *ctx, int32_t row, const ls_batch_piece *p) {
    emu *e = ctx;
    ls_forward_embed(e->sessions[p->row], e->tokens + p->first, p->n, e->h + (size_t)row * dim_of(e));
    return 0;
}

static int32_t emu_load(void *ctx, int32_t row, ls_session *s, int32_t pos0, int32_t n) {
    emu *e = ctx;
    memcpy(e->h + (size_t)row * dim_of(e), s->def_h + (size_t)pos0 * dim_of(e), (size_t)n * dim_of(e) * sizeof(float));
    return 0;
}

static int32_t emu_keep(void *ctx, int32_t row, ls_session *s, int32_t pos0, int32_t n) {
    emu *e = ctx;
    memcpy(s->def_h + (size_t)pos0 * dim_of(e), e->h + (size_t)row * dim_of(e), (size_t)n * dim_of(e) * sizeof(float));
    return 0;
}

static int32_t emu_rows(void *ctx, const ls_batch_piece *pc, int32_t n_pieces) {
    emu *e = ctx;
    const ls_model_info *mi = &e->m->info;
    for (int32_t i = 0, T = 0; i < n_pieces; T += pc[i].n, i++)
        ls_rope_table(e->rope + (size_t)T * mi->head_dim, pc[i].n, pc[i].pos0, mi->head_dim, mi->rope_theta);
    return 0;
}

/* The attention of a unit: every running row's keys and values stored
 * first, then every row attends (as the device's store and attention
 * launches do). */
typedef struct {
    emu *e;
    const ls_batch_piece *pc;
    int32_t lo, n;
    const ls_block *view;
} emu_attention;

static void emu_attend(void *ctx, int32_t unit, int32_t T, int32_t skip, int32_t stored) {
    (void)T;
    (void)skip; /* 0: every row goes on, as on the device */
    (void)stored;
    const emu_attention *a = ctx;
    const int32_t dim = dim_of(a->e), kv_dim = kv_dim_of(a->e);
    ls_att_rows runs[LS_ATT_MAX_RUNS];
    int32_t n = 0;
    for (int32_t i = a->lo, r0 = 0; i < a->n; r0 += a->pc[i].n, i++) {
        const ls_batch_piece *p = &a->pc[i];
        ls_session *s = a->e->sessions[p->row];
        ls_attention_store(s, unit, p->pos0, 0, p->n, a->view->k + (size_t)r0 * kv_dim, a->view->v + (size_t)r0 * kv_dim, 0);
        runs[n++] = (ls_att_rows){s, p->n, p->pos0, a->view->q + (size_t)r0 * dim, NULL, NULL,
                                  a->view->att + (size_t)r0 * dim, 0};
    }
    ls_attention_runs(runs, n, unit);
}

static int32_t emu_unit(void *ctx, const ls_batch_piece *pc, int32_t lo, int32_t n_pieces, int32_t start, int32_t T,
                        int32_t l) {
    emu *e = ctx;
    const int32_t dim = dim_of(e), kv_dim = kv_dim_of(e), hd = e->m->info.head_dim;
    ls_block view = {e->h + (size_t)start * dim, e->xb, e->q + (size_t)start * dim, e->k + (size_t)start * kv_dim,
                     e->v + (size_t)start * kv_dim, e->att + (size_t)start * dim, e->g, e->u, e->rope + (size_t)start * hd,
                     NULL /* no input injection: the CUDA library serves no recurrent-depth model */};
    emu_attention a = {e, pc, lo, n_pieces, &view};
    ls_forward_unit(e->m, &view, T - start, 0, l, emu_attend, NULL, &a);
    return 0;
}

static int32_t emu_exit_begin(void *ctx, int32_t call_row, float threshold) {
    emu *e = ctx;
    e->states[call_row] = (lsx_exit_state){threshold, 1.0f, 0.0f};
    return 0;
}

static int32_t emu_decide(void *ctx, const lsb_ask *asks, int32_t n, int32_t *exited) {
    emu *e = ctx;
    for (int32_t i = 0; i < n; i++) {
        const float z = lsx_gate_logit(e->h + (size_t)asks[i].block_row * dim_of(e), e->m->rt->exit_gate, dim_of(e));
        exited[i] = lsx_exit_step(&e->states[asks[i].call_row], lsx_gate_lambda(z));
    }
    return 0;
}

static int32_t emu_permute(void *ctx, int32_t start, const int32_t *from, int32_t n) {
    emu *e = ctx;
    const size_t row = (size_t)dim_of(e);
    float *h = e->h + (size_t)start * row;
    for (int32_t i = 0; i < n; i++) memcpy(e->xb + (size_t)i * row, h + (size_t)from[i] * row, row * sizeof(float));
    memcpy(h, e->xb, (size_t)n * row * sizeof(float));
    return 0;
}

static int32_t emu_settle_step(void *ctx, ls_session *s, int32_t a, int32_t b, int32_t u) {
    (void)ctx;
    ls_forward_settle_step(s, a, b, u);
    return 0;
}

static int32_t emu_copy_units(void *ctx, ls_session *s, int32_t pos, int32_t from, int32_t to) {
    emu *e = ctx;
    const int32_t L = e->m->info.n_layers, slot = pos % s->cap;
    for (int32_t u = from; u < to; u++) ls_kv_copy_row(s, u, slot, s, from - L + u % L, slot);
    return 0;
}

static int32_t emu_last(void *ctx, int32_t row, int32_t slot) {
    emu *e = ctx;
    memcpy(e->last + (size_t)slot * dim_of(e), e->h + (size_t)row * dim_of(e), (size_t)dim_of(e) * sizeof(float));
    return 0;
}

static const lsb_ops EMU_OPS = {NULL,        emu_embed,       emu_load,       emu_keep,   emu_rows,
                                emu_unit,    emu_exit_begin,  emu_decide,     emu_permute, emu_settle_step,
                                emu_copy_units, emu_last};

typedef struct {
    const lsb_call *call;
} emu_blocks;

static int run_emu_block(void *ctx, const ls_batch_piece *pieces, int32_t n) {
    return lsb_run(((const emu_blocks *)ctx)->call, pieces, n) != 0;
}

/* ls_batch_step as the CUDA library runs a call with exiting or deferred
 * rows (batch.cu): the CPU library's checks and room, the CUDA library's
 * plan, every block through block_steps.h, the head, the draws. */
static int32_t emu_batch_step(emu *e, ls_session *const *sessions, const ls_batch_row *rows, int32_t n_rows,
                              const int32_t *tokens, float *logits_out, int32_t *out) {
    ls_model *m = e->m;
    int32_t rc = ls_check_batch(m, sessions, rows, n_rows, tokens, NULL, out);
    if (rc != LS_OK) return rc;
    for (int32_t i = 0; i < n_rows; i++) {
        int32_t end = sessions[i]->pos + rows[i].n_tokens;
        out[i] = ls_session_reserve(sessions[i], end);
        if (out[i] == LS_OK && rows[i].step.exit_policy == LS_EXIT_EXACT &&
            ls_step_exits(m, &rows[i].step, rows[i].sample, rows[i].n_tokens))
            out[i] = ls_session_defer_reserve(sessions[i], end);
        if (out[i] != LS_OK) rc = out[i];
    }
    if (rc != LS_OK) return rc;
    ls_batch_plan plan;
    ls_batch_plan_rows(&plan, sessions, rows, n_rows, lsb_row_before);
    e->sessions = sessions;
    e->tokens = tokens;
    lsb_ops ops = EMU_OPS;
    ops.ctx = e;
    const lsb_call call = {&ops, sessions, rows, plan.exits, plan.slot, tokens, m->info.n_layers};
    emu_blocks blocks = {&call};
    ls_batch_piece pieces[LS_CHUNK];
    ls_batch_blocks(&plan, rows, LS_CHUNK, pieces, run_emu_block, &blocks);
    const int32_t vocab = m->info.vocab_size;
    if (plan.n_sample > 0) ls_forward_head(m, e->last, plan.n_sample, e->xb, e->logits);
    for (int32_t i = 0; i < n_rows; i++) {
        out[i] = LS_OK;
        if (plan.slot[i] < 0) continue;
        const float *lg = e->logits + (size_t)plan.slot[i] * vocab;
        if (logits_out) memcpy(logits_out + (size_t)i * vocab, lg, (size_t)vocab * sizeof(float));
        out[i] = ls_step_sample(sessions[i], lg, &rows[i].step);
        if (out[i] < 0 && rc == LS_OK) rc = out[i];
    }
    return rc;
}

static int emu_init(emu *e, ls_model *m) {
    const ls_model_info *mi = &m->info;
    size_t C = LS_CHUNK, dim = (size_t)mi->dim, kv = (size_t)mi->n_kv_heads * mi->head_dim, ffn = (size_t)mi->ffn_dim;
    memset(e, 0, sizeof *e);
    e->m = m;
    float **bufs[] = {&e->h, &e->xb, &e->q, &e->k, &e->v, &e->att, &e->g, &e->u, &e->rope, &e->last, &e->logits};
    size_t sizes[] = {C * dim, C * dim, C * dim, C * kv, C * kv, C * dim, C * ffn, C * ffn, C * (size_t)mi->head_dim,
                      LS_BATCH_MAX_ROWS * dim, LS_BATCH_MAX_ROWS * (size_t)mi->vocab_size};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (!(*bufs[i] = calloc(sizes[i], sizeof(float)))) return -1;
    return 0;
}

static void emu_free(emu *e) {
    float *bufs[] = {e->h, e->xb, e->q, e->k, e->v, e->att, e->g, e->u, e->rope, e->last, e->logits};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
}

// ---- exit-schedule ----

/* The first difference between two sessions' state, into why; 0 when none. */
static int session_differs(const ls_session *a, const ls_session *b, char *why, size_t len) {
    const ls_model_info *mi = &a->m->info;
    if (a->pos != b->pos || a->last_steps != b->last_steps || a->def_cap != b->def_cap || a->rows != b->rows) {
        snprintf(why, len, "pos %d/%d, last_steps %d/%d, kept states %d/%d, cache rows %d/%d", a->pos, b->pos,
                 a->last_steps, b->last_steps, a->def_cap, b->def_cap, a->rows, b->rows);
        return 1;
    }
    if (memcmp(a->tokens, b->tokens, (size_t)a->pos * sizeof *a->tokens) != 0) {
        snprintf(why, len, "the token histories differ");
        return 1;
    }
    for (int32_t u = 0; u < a->units; u++)
        if (a->unit_len[u] != b->unit_len[u] || a->unit_lo[u] != b->unit_lo[u]) {
            snprintf(why, len, "unit %d holds [%d, %d), the CPU library's [%d, %d)", u, b->unit_lo[u], b->unit_len[u],
                     a->unit_lo[u], a->unit_len[u]);
            return 1;
        }
    if (a->def_cap > 0) {
        for (int32_t p = 0; p < a->pos; p++)
            if (a->def_units[p] != b->def_units[p]) {
                snprintf(why, len, "position %d's deferred units from %d, the CPU library's from %d", p, b->def_units[p],
                         a->def_units[p]);
                return 1;
            }
        if (memcmp(a->def_h, b->def_h, (size_t)a->pos * (size_t)mi->dim * sizeof(float)) != 0) {
            snprintf(why, len, "the kept states differ");
            return 1;
        }
    }
    const size_t heads = (size_t)a->units * (size_t)mi->n_kv_heads, hd = (size_t)mi->head_dim;
    if (memcmp(a->kc, b->kc, heads * hd * (size_t)a->ldk * sizeof *a->kc) != 0 ||
        memcmp(a->vc, b->vc, heads * (size_t)a->rows * hd * sizeof *a->vc) != 0) {
        snprintf(why, len, "the key/value caches differ");
        return 1;
    }
    return 0;
}

#define SESSIONS 12
#define CALLS 90
#define MAX_SEQ 320

/* What a session's rows ask for: its depth, exit rule and sampling; a
 * switcher changes its exit rule as it goes, so that deferred units pile
 * up and are then read by deeper rows. */
typedef struct {
    int32_t loops, policy, window, switcher;
    float threshold;
    ls_sampling sampling;
    int32_t pending;  /* the token it feeds next (-1: its prompt) */
    int32_t prompt_left; /* prompt tokens not yet fed */
} plan_of;

static ls_step_params step_of(const plan_of *p, int32_t call, int32_t loops_max) {
    ls_step_params sp = {.loops = p->loops, .exit_policy = p->policy, .exit_threshold = p->threshold,
                         .sampling = p->sampling};
    if (p->switcher) { /* 70 tokens that leave after one step (more deferred rows than a block holds), then
                          * full depth, then the gate */
        sp.loops = loops_max;
        sp.exit_policy = call < 70 ? LS_EXIT_EXACT : call < 73 ? LS_EXIT_NONE : LS_EXIT_EXACT;
        sp.exit_threshold = call < 70 ? 0.0f : 0.5f;
    }
    return sp;
}

/* One model's run: CALLS batched steps over SESSIONS sessions, the CPU
 * library's and the emulation's fed alike. 0 when every call matched. */
static int schedule_run(ls_model *m, int32_t seed, char *detail, size_t len, int64_t *rows_run, int64_t *exits_seen) {
    const ls_model_info *mi = &m->info;
    const int32_t loops_max = mi->default_loops < 4 ? mi->default_loops : 4, vocab = mi->vocab_size;
    ls_session *ref[SESSIONS] = {0}, *emu_s[SESSIONS] = {0};
    plan_of plans[SESSIONS];
    emu e;
    int bad = emu_init(&e, m) != 0;
    if (bad) snprintf(detail, len, "out of memory");
    const float thresholds[] = {0.0f, 0.3f, 0.5f, 0.7f, 0.9f, 1.0f};
    for (int32_t i = 0; i < SESSIONS && !bad; i++) {
        plan_of *p = &plans[i];
        memset(p, 0, sizeof *p);
        p->loops = 1 + (int32_t)(harness_rand() % (uint32_t)loops_max);
        p->window = i % 5 == 4 ? 24 : 0;
        p->policy = (int32_t)(harness_rand() % 3);
        if (p->window && p->policy == LS_EXIT_EXACT) p->policy = LS_EXIT_COPY; /* a window takes the copy policy only */
        p->threshold = thresholds[harness_rand() % 6];
        p->switcher = i == seed % SESSIONS;
        if (p->switcher) p->window = 0;
        p->sampling = i % 3 == 1 ? (ls_sampling){0.8f, 40, 1.0f, 1.0f, (uint64_t)(seed * 100 + i)}
                                 : (ls_sampling){0.0f, 0, 1.0f, 1.1f, 0};
        p->pending = -1;
        p->prompt_left = 1 + (int32_t)(harness_rand() % 100);
        ls_session_params sp = {.max_seq = MAX_SEQ, .loops = loops_max, .cache_window = p->window, .kv_mode = LS_KV_FP16};
        char err[200];
        ref[i] = ls_session_new(m, &sp, err, sizeof err);
        emu_s[i] = ls_session_new(m, &sp, err, sizeof err);
        if (!ref[i] || !emu_s[i]) {
            snprintf(detail, len, "session: %s", err);
            bad = 1;
        }
    }
    int32_t *tokens = malloc((size_t)SESSIONS * 128 * sizeof *tokens);
    float *la = malloc((size_t)SESSIONS * vocab * sizeof *la), *lb = malloc((size_t)SESSIONS * vocab * sizeof *lb);
    if (!tokens || !la || !lb) {
        snprintf(detail, len, "out of memory");
        bad = 1;
    }
    for (int32_t call = 0; call < CALLS && !bad; call++) {
        ls_session *sa[SESSIONS], *sb[SESSIONS];
        ls_batch_row rows[SESSIONS];
        int32_t who[SESSIONS], n_rows = 0, at = 0, out_a[SESSIONS], out_b[SESSIONS];
        for (int32_t i = 0; i < SESSIONS; i++) {
            plan_of *p = &plans[i];
            if ((!p->switcher && harness_rand() % 4 == 0) || ref[i]->pos + 100 > MAX_SEQ) continue; /* this call leaves it out */
            ls_batch_row r = {.n_tokens = 1, .sample = 1, .step = step_of(p, call, loops_max)};
            if (p->prompt_left > 0) { /* its prompt, sometimes in two calls */
                r.n_tokens = p->prompt_left > 8 && harness_rand() % 3 == 0 ? p->prompt_left / 2 : p->prompt_left;
                r.sample = r.n_tokens == p->prompt_left;
                for (int32_t t = 0; t < r.n_tokens; t++) tokens[at + t] = (int32_t)(harness_rand() % (uint32_t)vocab);
                p->prompt_left -= r.n_tokens;
            } else {
                tokens[at] = p->pending;
            }
            at += r.n_tokens;
            who[n_rows] = i;
            sa[n_rows] = ref[i];
            sb[n_rows] = emu_s[i];
            rows[n_rows++] = r;
        }
        if (n_rows == 0) continue;
        int32_t pos_before[SESSIONS];
        for (int32_t k = 0; k < n_rows; k++) pos_before[k] = sa[k]->pos;
        int32_t pos0[SESSIONS];
        for (int32_t k = 0; k < n_rows; k++) pos0[k] = sa[k]->pos;
        int32_t rc_a = ls_batch_step(m, sa, rows, n_rows, tokens, NULL, la, out_a);
        for (int32_t k = 0, off = 0; k < n_rows; off += rows[k].n_tokens, k++)
            for (int32_t t = 0; t < rows[k].n_tokens; t++)
                if (sa[k]->tokens[pos_before[k] + t] != tokens[off + t])
                    fprintf(stderr, "CPU library: call %d row %d (n %d, exits %d) position %d holds %d, fed %d\n", call, k, rows[k].n_tokens, rows[k].step.exit_policy, pos_before[k] + t, sa[k]->tokens[pos_before[k] + t], tokens[off + t]);
        int32_t rc_b = emu_batch_step(&e, sb, rows, n_rows, tokens, lb, out_b);
        *rows_run += n_rows;
        if (rc_a != rc_b) {
            snprintf(detail, len, "seed %d call %d: ls_batch_step returned %d, the schedule %d", seed, call, rc_a, rc_b);
            bad = 1;
            break;
        }
        for (int32_t k = 0, fed = 0; k < n_rows && !bad; fed += rows[k].n_tokens, k++) {
            const int32_t i = who[k];
            char why[160];
            if (memcmp(ref[i]->tokens + pos0[k], tokens + fed, (size_t)rows[k].n_tokens * sizeof *tokens) != 0) {
                snprintf(detail, len, "seed %d call %d session %d: the CPU library's history is not the tokens fed", seed,
                         call, i);
                bad = 1;
            } else if (out_a[k] != out_b[k]) {
                snprintf(detail, len, "seed %d call %d session %d: token %d, the CPU library's %d", seed, call, i, out_b[k],
                         out_a[k]);
                bad = 1;
            } else if (rows[k].sample && memcmp(la + (size_t)k * vocab, lb + (size_t)k * vocab, (size_t)vocab * sizeof(float))) {
                snprintf(detail, len, "seed %d call %d session %d: the logits differ from the CPU library's", seed, call, i);
                bad = 1;
            } else if (session_differs(ref[i], emu_s[i], why, sizeof why)) {
                snprintf(detail, len, "seed %d call %d session %d: %s", seed, call, i, why);
                bad = 1;
            }
            if (rows[k].sample) {
                plans[i].pending = out_a[k];
                *exits_seen += ref[i]->last_steps < rows[k].step.loops;
            }
        }
    }
    for (int32_t i = 0; i < SESSIONS; i++) {
        ls_session_free(ref[i]);
        ls_session_free(emu_s[i]);
    }
    free(tokens);
    free(la);
    free(lb);
    emu_free(&e);
    return bad;
}

/* The schedule on each model, over a few seeds. */
static void check_schedule_on(char *const *models, int32_t n_models) {
    char detail[400] = "", err[256];
    int ok = 1;
    int64_t rows_run = 0, exits_seen = 0;
    for (int32_t k = 0; k < n_models && ok; k++) {
        ls_model_desc desc;
        ls_model *m = NULL;
        if (model_file_desc(models[k], &desc, err, sizeof err) == 0)
            m = ls_model_load(models[k], &desc, 0, LS_SIMD_AUTO, err, sizeof err);
        if (!m || !m->info.exit_gate) {
            snprintf(detail, sizeof detail, "%s: %s", models[k], m ? "the model has no exit gate" : err);
            ok = 0;
        }
        for (int32_t seed = 1; seed <= 3 && ok; seed++)
            ok = !schedule_run(m, seed, detail, sizeof detail, &rows_run, &exits_seen);
        if (m) ls_model_free(m);
    }
    if (n_models == 0) {
        snprintf(detail, sizeof detail, "no model with an exit gate was given (validate.sh gives the driver's stack)");
        ok = 0;
    }
    if (ok)
        snprintf(detail, sizeof detail,
                 "%d model(s), %lld rows over %d batched steps a run (%lld sampled tokens exited early): every "
                 "token, logits, exit step, cache unit and kept state the CPU library's",
                 n_models, (long long)rows_run, CALLS, (long long)exits_seen);
    report("exit-schedule", ok, detail);
}

void check_early_exit(char *const *models, int32_t n_models) {
    check_gate_exp();
    check_schedule_on(models, n_models);
}
