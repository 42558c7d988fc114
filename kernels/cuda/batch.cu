/*
 * batch.cu — ls_batch_step for the GPU, on the plan of kernels/cpu/batch.c:
 * the same checks (batch_rules.h), rows ordered shallowest first so the
 * rows still running at unit l are a suffix of the block (a depth-ragged
 * batch), cut into blocks of at most LS_CHUNK rows that each run
 * through all their loops before the next, and one output-head pass over
 * every sampling row. Each launch covers every running row of the block,
 * whatever session it belongs to: a matmul reads a weight row once per
 * tile of tokens (ops.cu), and the K/V store and attention find each row's
 * own cache through its lsc_row_cache. The GPU kernels are batch-invariant
 * (ops.cu), so every row's logits and token are bit-identical to stepping
 * its session alone with this library.
 *
 * Greedy rows pick on the device (sample.cu), from their own session's
 * history; temperature rows copy their logits to the host for sample.c's
 * ls_sample, as ls_session_step does. This library has no token masks
 * (ls_features lacks LS_FEATURE_TOKEN_MASK): a masked row is
 * LS_ERR_UNSUPPORTED.
 *
 * A call where a row may exit early (a model with an exit gate) or a
 * session holds deferred units runs its blocks through block_steps.h, the
 * CPU library's schedule for them, with the operations below: each gate
 * and exit decided on the device between steps (exits.cu), the decisions
 * read back so that exiting rows leave the block at their own step and
 * deferred rows join the step that needs them. Such blocks run their
 * launches eagerly; every other call as before.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_internal.h"

extern "C" {
#include "batch_rules.h"
}
#include "block_steps.h"

/* What a single-block step's launches depend on, and nothing else: each
 * piece's token offset, token count, depth and final-state slot (-1: none),
 * and the number of sampling rows. Session state reaches the kernels only
 * through device buffers written before the launch (row caches, RoPE
 * table, tokens), so one captured graph serves every step of that shape. */
typedef struct {
    int32_t n_pieces, n_sample;
    int32_t piece[LS_CHUNK][4];
} lsc_step_shape;

/* Graphs kept per runtime: enough for a steady mix of decode shapes. */
#define LSC_STEP_GRAPHS 8

typedef struct {
    lsc_step_shape shape;
    cudaGraphExec_t exec; /* NULL: empty slot */
    uint64_t used;        /* last use, for eviction */
} lsc_step_graph;

/* ls_batch_step's device scratch: one block's activations, the call's
 * tokens, and the sampling rows' final states, logits and picks, which grow
 * with the largest call seen; the captured single-block steps, which
 * point into that scratch. */
struct lsc_batch {
    lsc_block act;        /* (LS_CHUNK, ...) */
    float *rope_host;     /* (LS_CHUNK, head_dim) */
    lsc_row_cache rows_host[LS_CHUNK];
    int32_t *tokens;      /* (tokens_cap) */
    int32_t tokens_cap;
    const int32_t *tok;   /* where this call's tokens are on the device: tokens, or act.tokens when staged */
    struct lsc_uploader *up; /* a resident model's pinned stage (stage.cu), or NULL */
    float *last;          /* (rows_cap, dim) sampling rows' final hidden states */
    float *normed;        /* (rows_cap, dim) */
    int8_t *head_q;       /* (rows_cap, dim) a quantized head's activation codes, else NULL */
    float *head_qd;       /* (rows_cap) their scales */
    float *logits;        /* (rows_cap, vocab) */
    int32_t *ids;         /* (rows_cap) greedy picks */
    float *logits_host;   /* (rows_cap, vocab) for host draws and logits_out */
    int32_t rows_cap;
    lsc_step_graph graphs[LSC_STEP_GRAPHS];
    lsc_step_shape previous; /* the last single-block step's shape */
    uint64_t clock;
    /* early exit (block_steps.h's operations) */
    lsx_exit_state *exit_states;                /* (LS_BATCH_MAX_ROWS) each call row's distribution, on the device */
    lsx_exit_state exit_host[LS_BATCH_MAX_ROWS]; /* rows begun since the last upload, [exit_lo, exit_hi) */
    int32_t exit_lo, exit_hi;
    int32_t *asks;    /* (LS_CHUNK, 2) the rows a gate is asked about */
    int32_t *exited;  /* (LS_CHUNK) its answers */
    int32_t *from;    /* (LS_CHUNK) a permutation of rows */
};

/* Graphs hold the scratch's addresses: dropped whenever a buffer moves. */
static void drop_graphs(lsc_batch *b) {
    for (int i = 0; i < LSC_STEP_GRAPHS; i++) {
        if (b->graphs[i].exec) cudaGraphExecDestroy(b->graphs[i].exec);
        b->graphs[i].exec = NULL;
    }
    b->previous.n_pieces = 0;
}

static void free_rows(lsc_batch *b) {
    void *dev[] = {b->last, b->normed, b->logits, b->ids, b->head_q, b->head_qd};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
        if (dev[i]) cudaFree(dev[i]);
    free(b->logits_host);
    b->last = b->normed = b->logits = b->logits_host = NULL;
    b->ids = NULL;
    b->head_q = NULL;
    b->head_qd = NULL;
    b->rows_cap = 0;
}

void lsc_batch_free(lsc_batch *b) {
    if (!b) return;
    drop_graphs(b);
    lsc_block_free(&b->act);
    free_rows(b);
    void *dev[] = {b->tokens, b->exit_states, b->asks, b->exited, b->from};
    for (void *p : dev)
        if (p) cudaFree(p);
    lsc_uploader_free(b->up);
    free(b->rope_host);
    free(b);
}

/* The runtime's scratch, with room for n_tokens tokens and n_sample
 * sampling rows; NULL when the GPU or host is out of memory. */
static lsc_batch *scratch_for(ls_model *m, int32_t n_tokens, int32_t n_sample) {
    ls_runtime *rt = m->rt;
    const ls_model_info *mi = &m->info;
    lsc_batch *b = rt->batch;
    if (!b) {
        b = (lsc_batch *)calloc(1, sizeof *b);
        if (!b) return NULL;
        b->rope_host = (float *)calloc((size_t)LS_CHUNK * mi->head_dim, sizeof(float));
        if (!b->rope_host || !lsc_block_alloc(&b->act, mi, LS_CHUNK) ||
            !lsc_dev_alloc((void **)&b->exit_states, LS_BATCH_MAX_ROWS * sizeof(lsx_exit_state)) ||
            !lsc_dev_alloc((void **)&b->asks, 2 * LS_CHUNK * sizeof(int32_t)) ||
            !lsc_dev_alloc((void **)&b->exited, LS_CHUNK * sizeof(int32_t)) ||
            !lsc_dev_alloc((void **)&b->from, LS_CHUNK * sizeof(int32_t)) ||
            (rt->resident && !(b->up = lsc_uploader_new(mi->head_dim)))) {
            lsc_batch_free(b);
            return NULL;
        }
        rt->batch = b;
    }
    if (n_tokens > b->tokens_cap) {
        drop_graphs(b);
        if (b->tokens) cudaFree(b->tokens);
        b->tokens_cap = 0;
        if (!lsc_dev_alloc((void **)&b->tokens, (size_t)n_tokens * sizeof(int32_t))) return NULL;
        b->tokens_cap = n_tokens;
    }
    if (n_sample > b->rows_cap) {
        drop_graphs(b);
        free_rows(b);
        size_t rows = (size_t)n_sample, dim = (size_t)mi->dim, vocab = (size_t)mi->vocab_size;
        b->logits_host = (float *)malloc(rows * vocab * sizeof(float));
        if (!b->logits_host || !lsc_dev_alloc((void **)&b->last, rows * dim * sizeof(float)) ||
            !lsc_dev_alloc((void **)&b->normed, rows * dim * sizeof(float)) ||
            !lsc_dev_alloc((void **)&b->logits, rows * vocab * sizeof(float)) ||
            !lsc_dev_alloc((void **)&b->ids, rows * sizeof(int32_t)) ||
            (rt->qhead && (!lsc_dev_alloc((void **)&b->head_q, rows * dim) ||
                           !lsc_dev_alloc((void **)&b->head_qd, rows * sizeof(float))))) {
            free_rows(b);
            return NULL;
        }
        b->rows_cap = n_sample;
    }
    return b;
}

/* A failure after sessions began to change: every session of the call is
 * left unknown, as ls_session_step leaves its own. */
static int32_t fail_all(ls_session *const *sessions, int32_t n_rows, int32_t *out, const char *what, cudaError_t e) {
    fprintf(stderr, "loopserve cuda: batch step: %s failed: %s\n", what, cudaGetErrorString(e));
    for (int32_t i = 0; i < n_rows; i++) {
        sessions[i]->failed = 1;
        out[i] = LS_ERR_STATE;
    }
    return LS_ERR_STATE;
}

/* The pieces' row caches and RoPE rows to b->act; with a resident model's
 * pinned stage, n_tokens of the call's tokens with them (to act.tokens),
 * all in one copy. */
static cudaError_t upload_rows(const ls_model *m, ls_session *const *sessions, const ls_batch_piece *pieces,
                               int32_t n_pieces, lsc_batch *b, const int32_t *tokens, int32_t n_tokens,
                               const char **what) {
    const ls_model_info *mi = &m->info;
    const int32_t hd = mi->head_dim;
    lsc_row_cache *rows = b->rows_host;
    float *rope = b->rope_host;
    int32_t *staged = NULL;
    cudaError_t e;
    *what = "waiting for the last upload";
    if (b->up && (e = lsc_uploader_ready(b->up, &rows, &staged, &rope)) != cudaSuccess) return e;
    int32_t T = 0;
    for (int32_t i = 0; i < n_pieces; T += pieces[i].n, i++) {
        const ls_batch_piece *p = &pieces[i];
        ls_rope_table(rope + (size_t)T * hd, p->n, p->pos0, hd, mi->rope_theta);
        lsc_session_rows(rows + T, sessions[p->row], p->pos0, p->n);
    }
    if (b->up) {
        if (n_tokens > 0) memcpy(staged, tokens, (size_t)n_tokens * sizeof *tokens);
        *what = "uploading the block's inputs";
        return lsc_upload_staged(b->up, &b->act, T, hd);
    }
    *what = "copying the RoPE table";
    e = cudaMemcpy(b->act.rope, rope, (size_t)T * hd * sizeof(float), cudaMemcpyHostToDevice);
    if (e != cudaSuccess) return e;
    *what = "copying the row caches";
    return cudaMemcpy(b->act.rows, rows, (size_t)T * sizeof(lsc_row_cache), cudaMemcpyHostToDevice);
}

/* A block's inputs on the device (upload_rows), and its tokens appended
 * to each piece's session's device history. */
static cudaError_t upload_block(ls_model *m, ls_session *const *sessions, const ls_batch_piece *pieces,
                                int32_t n_pieces, lsc_batch *b, const int32_t *tokens, int32_t n_tokens,
                                const char **what) {
    cudaError_t e = upload_rows(m, sessions, pieces, n_pieces, b, tokens, n_tokens, what);
    for (int32_t i = 0; i < n_pieces && e == cudaSuccess; i++) {
        const ls_batch_piece *p = &pieces[i];
        *what = "copying the token history";
        e = cudaMemcpyAsync(sessions[p->row]->d_tokens + p->pos0, b->tok + p->first, (size_t)p->n * sizeof(int32_t),
                            cudaMemcpyDeviceToDevice, cudaStreamPerThread);
    }
    return e;
}

/* The launches of one uploaded block: embeddings, every unit over the rows
 * still running, and each sampling row's final hidden state copied to
 * b->last[slot[row]]. Stream work only: it may be captured. */
static cudaError_t block_kernels(ls_model *m, const ls_batch_piece *pieces, int32_t n_pieces, lsc_batch *b,
                                 const int32_t *slot, const char **what) {
    const ls_model_info *mi = &m->info;
    int32_t dim = mi->dim, hd = mi->head_dim;
    cudaError_t e = cudaSuccess;
    int32_t T = 0;
    for (int32_t i = 0; i < n_pieces && e == cudaSuccess; T += pieces[i].n, i++) {
        *what = "embedding";
        e = lsc_embed_tokens(m, b->act.h + (size_t)T * dim, b->tok + pieces[i].first, pieces[i].n);
    }
    if (e != cudaSuccess) return e;
    for (int32_t l = 0, lo = 0, start = 0;; l++) {
        /* pieces are shallowest first: drop the ones whose loops are done */
        while (lo < n_pieces && pieces[lo].units <= l) start += pieces[lo++].n;
        if (lo == n_pieces) break;
        /* the running rows' own state moves with the suffix; the rest is scratch */
        lsc_block view = b->act;
        view.h += (size_t)start * dim;
        view.rope += (size_t)start * hd;
        view.rows += start;
        e = lsc_block_unit(m, &view, T - start, l, what);
        if (e != cudaSuccess) return e;
    }
    for (int32_t i = 0, r0 = 0; i < n_pieces; r0 += pieces[i].n, i++) {
        const ls_batch_piece *p = &pieces[i];
        if (p->last && slot[p->row] >= 0) {
            *what = "keeping a final state";
            e = cudaMemcpyAsync(b->last + (size_t)slot[p->row] * dim, b->act.h + (size_t)(r0 + p->n - 1) * dim,
                                (size_t)dim * sizeof(float), cudaMemcpyDeviceToDevice, cudaStreamPerThread);
            if (e != cudaSuccess) return e;
        }
    }
    return cudaSuccess;
}

/* The output head over the n_sample final states: b->logits. */
static cudaError_t head_kernels(ls_model *m, lsc_batch *b, int32_t n_sample, const char **what) {
    return lsc_head(m, b->logits, b->normed, b->last, n_sample, b->head_q, b->head_qd, what);
}

/* Every launch of a single-block step: the block, then the head when a row samples. */
static cudaError_t step_launches(ls_model *m, const ls_batch_piece *pieces, int32_t n_pieces, lsc_batch *b,
                                 const int32_t *slot, int32_t n_sample, const char **what) {
    cudaError_t e = block_kernels(m, pieces, n_pieces, b, slot, what);
    return e == cudaSuccess && n_sample > 0 ? head_kernels(m, b, n_sample, what) : e;
}

static void shape_of(lsc_step_shape *sh, const ls_batch_piece *pieces, int32_t n_pieces, const int32_t *slot,
                     int32_t n_sample) {
    memset(sh, 0, sizeof *sh);
    sh->n_pieces = n_pieces;
    sh->n_sample = n_sample;
    for (int32_t i = 0; i < n_pieces; i++) {
        const ls_batch_piece *p = &pieces[i];
        int32_t *e = sh->piece[i];
        e[0] = p->first;
        e[1] = p->n;
        e[2] = p->units;
        e[3] = p->last ? slot[p->row] : -1;
    }
}

static bool same_shape(const lsc_step_shape *a, const lsc_step_shape *b) {
    return a->n_pieces == b->n_pieces && a->n_sample == b->n_sample &&
           memcmp(a->piece, b->piece, (size_t)a->n_pieces * sizeof a->piece[0]) == 0;
}

/* The launches of a single-block step (block and head) as a graph: a
 * token's ~70 launches cost one. A shape seen on two steps in a row is
 * captured (a steady decode); one seen once runs eagerly (capturing costs
 * more than it saves once). The graph replays exactly the launches it
 * recorded, so a row's bits do not depend on which way its step ran. */
static cudaError_t step_kernels(ls_model *m, const ls_batch_piece *pieces, int32_t n_pieces, lsc_batch *b,
                                const int32_t *slot, int32_t n_sample, const char **what) {
    lsc_step_shape shape;
    shape_of(&shape, pieces, n_pieces, slot, n_sample);
    b->clock++;
    /* the graph of this shape, else the slot to capture into: an empty one, or the least recently used */
    lsc_step_graph *victim = &b->graphs[0];
    for (int i = 0; i < LSC_STEP_GRAPHS; i++) {
        lsc_step_graph *g = &b->graphs[i];
        if (g->exec && same_shape(&g->shape, &shape)) {
            g->used = b->clock;
            *what = "replaying a step";
            return cudaGraphLaunch(g->exec, cudaStreamPerThread);
        }
        if (victim->exec && (!g->exec || g->used < victim->used)) victim = g;
    }
    bool seen = same_shape(&b->previous, &shape);
    b->previous = shape;
    if (!seen) return step_launches(m, pieces, n_pieces, b, slot, n_sample, what);
    *what = "capturing a step";
    cudaError_t e = cudaStreamBeginCapture(cudaStreamPerThread, cudaStreamCaptureModeThreadLocal);
    if (e != cudaSuccess) return e;
    const char *inner = *what;
    lsc_resident_capture_begin(m);
    e = step_launches(m, pieces, n_pieces, b, slot, n_sample, &inner);
    cudaGraph_t graph = NULL;
    cudaError_t end = cudaStreamEndCapture(cudaStreamPerThread, &graph);
    /* each kernel node given the L2 window of its layer (or the head's) before the graph is made */
    lsc_resident_graph(m, e == cudaSuccess && end == cudaSuccess ? graph : NULL);
    if (e != cudaSuccess || end != cudaSuccess) {
        if (graph) cudaGraphDestroy(graph);
        if (e != cudaSuccess) *what = inner;
        return e != cudaSuccess ? e : end;
    }
    if (victim->exec) cudaGraphExecDestroy(victim->exec);
    victim->exec = NULL;
    e = cudaGraphInstantiate(&victim->exec, graph, 0);
    cudaGraphDestroy(graph);
    if (e != cudaSuccess) {
        victim->exec = NULL;
        return e;
    }
    victim->shape = shape;
    victim->used = b->clock;
    *what = "replaying a step";
    return cudaGraphLaunch(victim->exec, cudaStreamPerThread);
}

// ---- blocks where rows exit early or deferred rows join (block_steps.h) ----

/* The operations' state: the call, and the first failure. */
typedef struct {
    ls_model *m;
    ls_session *const *sessions;
    lsc_batch *b;
    cudaError_t e;
    const char *what;
} steps_ctx;

/* 0, or 1 with the failure recorded. */
static int32_t check(steps_ctx *c, cudaError_t e, const char *what) {
    if (e == cudaSuccess) return 0;
    c->e = e;
    c->what = what;
    return 1;
}

static float *row_of(steps_ctx *c, float *base, int32_t row) { return base + (size_t)row * c->m->info.dim; }

static int32_t op_embed(void *ctx, int32_t row, const ls_batch_piece *p) {
    steps_ctx *c = (steps_ctx *)ctx;
    ls_session *s = c->sessions[p->row];
    if (check(c, cudaMemcpyAsync(s->d_tokens + p->pos0, c->b->tok + p->first, (size_t)p->n * sizeof(int32_t),
                                 cudaMemcpyDeviceToDevice, cudaStreamPerThread),
              "copying the token history"))
        return 1;
    return check(c, lsc_embed_tokens(c->m, row_of(c, c->b->act.h, row), c->b->tok + p->first, p->n), "embedding");
}

static int32_t op_load(void *ctx, int32_t row, ls_session *s, int32_t pos0, int32_t n) {
    steps_ctx *c = (steps_ctx *)ctx;
    const size_t bytes = (size_t)n * c->m->info.dim * sizeof(float);
    return check(c, cudaMemcpyAsync(row_of(c, c->b->act.h, row), row_of(c, s->def_h, pos0), bytes,
                                    cudaMemcpyDeviceToDevice, cudaStreamPerThread),
                 "reading kept states");
}

static int32_t op_keep(void *ctx, int32_t row, ls_session *s, int32_t pos0, int32_t n) {
    steps_ctx *c = (steps_ctx *)ctx;
    const size_t bytes = (size_t)n * c->m->info.dim * sizeof(float);
    return check(c, cudaMemcpyAsync(row_of(c, s->def_h, pos0), row_of(c, c->b->act.h, row), bytes,
                                    cudaMemcpyDeviceToDevice, cudaStreamPerThread),
                 "keeping states");
}

static int32_t op_rows(void *ctx, const ls_batch_piece *pc, int32_t n_pieces) {
    steps_ctx *c = (steps_ctx *)ctx;
    const char *what = "";
    return check(c, upload_rows(c->m, c->sessions, pc, n_pieces, c->b, NULL, 0, &what), what);
}

static int32_t op_unit(void *ctx, const ls_batch_piece *pc, int32_t lo, int32_t n_pieces, int32_t start, int32_t T,
                       int32_t l) {
    (void)pc;
    (void)lo;
    (void)n_pieces;
    steps_ctx *c = (steps_ctx *)ctx;
    lsc_block view = c->b->act;
    view.h += (size_t)start * c->m->info.dim;
    view.rope += (size_t)start * c->m->info.head_dim;
    view.rows += start;
    const char *what = "";
    return check(c, lsc_block_unit(c->m, &view, T - start, l, &what), what);
}

static int32_t op_exit_begin(void *ctx, int32_t call_row, float threshold) {
    lsc_batch *b = ((steps_ctx *)ctx)->b;
    b->exit_host[call_row] = lsx_exit_state{threshold, 1.0f, 0.0f};
    if (b->exit_lo >= b->exit_hi) b->exit_lo = b->exit_hi = call_row;
    if (call_row < b->exit_lo) b->exit_lo = call_row;
    if (call_row + 1 > b->exit_hi) b->exit_hi = call_row + 1;
    return 0;
}

static int32_t op_decide(void *ctx, const lsb_ask *asks, int32_t n, int32_t *exited) {
    steps_ctx *c = (steps_ctx *)ctx;
    lsc_batch *b = c->b;
    if (b->exit_lo < b->exit_hi) { /* the rows begun in this block (the others in the range are done) */
        size_t count = (size_t)(b->exit_hi - b->exit_lo);
        if (check(c, cudaMemcpy(b->exit_states + b->exit_lo, b->exit_host + b->exit_lo, count * sizeof(lsx_exit_state),
                                cudaMemcpyHostToDevice),
                  "copying exit rules"))
            return 1;
        b->exit_lo = b->exit_hi = 0;
    }
    static_assert(sizeof(lsb_ask) == 2 * sizeof(int32_t), "an ask is two int32");
    return check(c, cudaMemcpy(b->asks, asks, (size_t)n * sizeof *asks, cudaMemcpyHostToDevice), "copying the gate's rows") ||
           check(c, lsc_exit_decide(b->exited, b->asks, n, b->act.h, c->m->rt->exit_gate, c->m->info.dim, b->exit_states),
                 "exit gate") ||
           check(c, cudaMemcpy(exited, b->exited, (size_t)n * sizeof *exited, cudaMemcpyDeviceToHost),
                 "reading the exit decisions");
}

static int32_t op_permute(void *ctx, int32_t start, const int32_t *from, int32_t n) {
    steps_ctx *c = (steps_ctx *)ctx;
    lsc_batch *b = c->b;
    float *h = row_of(c, b->act.h, start), *tmp = row_of(c, b->act.xb, start); /* xb: free between units */
    return check(c, cudaMemcpy(b->from, from, (size_t)n * sizeof *from, cudaMemcpyHostToDevice), "copying a row order") ||
           check(c, lsc_gather_rows(tmp, h, b->from, n, c->m->info.dim), "moving rows") ||
           check(c, cudaMemcpyAsync(h, tmp, (size_t)n * c->m->info.dim * sizeof(float), cudaMemcpyDeviceToDevice,
                                    cudaStreamPerThread),
                 "moving rows");
}

static int32_t op_settle_step(void *ctx, ls_session *s, int32_t a, int32_t b, int32_t u) {
    /* a failure is printed and the session marked by runtime.cu */
    return lsc_settle_step(s, a, b, u) == LS_OK ? 0 : check((steps_ctx *)ctx, cudaErrorUnknown, "computing deferred units");
}

static int32_t op_copy_units(void *ctx, ls_session *s, int32_t pos, int32_t from, int32_t to) {
    steps_ctx *c = (steps_ctx *)ctx;
    const ls_model_info *mi = &c->m->info;
    const int64_t loop_stride = (int64_t)mi->n_kv_heads * s->cap * mi->head_dim;
    return check(c, lsc_copy_units(s->kc, s->vc, loop_stride, s->cap, pos % s->cap, from, to, mi->n_layers,
                                   mi->n_kv_heads, mi->head_dim),
                 "copying an exit step's keys and values");
}

static int32_t op_last(void *ctx, int32_t row, int32_t slot) {
    steps_ctx *c = (steps_ctx *)ctx;
    return check(c, cudaMemcpyAsync(row_of(c, c->b->last, slot), row_of(c, c->b->act.h, row),
                                    (size_t)c->m->info.dim * sizeof(float), cudaMemcpyDeviceToDevice,
                                    cudaStreamPerThread),
                 "keeping a final state");
}

/* One call's blocks, as ls_batch_blocks hands them over, and the first
 * failure. A call of one block runs it with the head as one step
 * (step_kernels); longer calls run block by block, the head after; a call
 * where rows exit early or read deferred units through block_steps.h
 * (steps), the head after. */
typedef struct {
    ls_model *m;
    ls_session *const *sessions;
    const int32_t *tokens;
    lsc_batch *b;
    const int32_t *slot;
    int32_t n_sample;
    int single;
    int32_t staged_tokens; /* the call's tokens go up with its single block's inputs (a resident model), or 0 */
    const lsb_call *steps; /* or NULL */
    steps_ctx *steps_ctx;
    cudaError_t e;
    const char *what;
} block_call;

static int run_block_call(void *ctx, const ls_batch_piece *pieces, int32_t n) {
    block_call *c = (block_call *)ctx;
    if (c->steps) {
        if (lsb_run(c->steps, pieces, n) == 0) return 0;
        c->e = c->steps_ctx->e;
        c->what = c->steps_ctx->what;
        return 1;
    }
    c->e = upload_block(c->m, c->sessions, pieces, n, c->b, c->tokens, c->staged_tokens, &c->what);
    if (c->e == cudaSuccess)
        c->e = c->single ? step_kernels(c->m, pieces, n, c->b, c->slot, c->n_sample, &c->what)
                         : block_kernels(c->m, pieces, n, c->b, c->slot, &c->what);
    if (c->e != cudaSuccess) return 1;
    for (int32_t l = 0, lo = 0; lo < n; l++) {
        while (lo < n && pieces[lo].units <= l) lo++;
        if (lo < n) ls_batch_unit_done(c->sessions, pieces, lo, n, l);
    }
    ls_batch_block_done(c->sessions, pieces, n, c->tokens);
    for (int32_t i = 0; i < n; i++)
        if (pieces[i].last && c->slot[pieces[i].row] >= 0)
            c->sessions[pieces[i].row]->last_steps = pieces[i].units / c->m->info.n_layers;
    return 0;
}

/* Whether the call's rows run as they were planned: none exits early, and
 * no session holds deferred units a row would read. */
static int plain_call(const ls_batch_plan *plan, ls_session *const *sessions, const ls_batch_row *rows) {
    for (int32_t i = 0; i < plan->n_rows; i++)
        if (plan->exits[i] || ls_units_deferred(ls_session_view(sessions[i]), rows[i].step.loops * plan->layers) > 0)
            return 0;
    return 1;
}

/* The head over every sampling row, then each row's draw: greedy rows on
 * the device, temperature rows on the host from the copied logits. */
static cudaError_t draw(ls_model *m, ls_session *const *sessions, const ls_batch_row *rows, int32_t n_rows,
                        const int32_t *slot, int32_t n_sample, int head_done, lsc_batch *b, float *logits_out,
                        int32_t *out, const char **what) {
    int32_t vocab = m->info.vocab_size;
    cudaError_t e;
    if (!head_done && (e = head_kernels(m, b, n_sample, what)) != cudaSuccess) return e;
    int host = logits_out != NULL;
    *what = "argmax";
    for (int32_t i = 0; i < n_rows; i++) {
        if (slot[i] < 0) continue;
        const ls_sampling *sp = &rows[i].step.sampling;
        if (sp->temperature != 0.0f) {
            host = 1;
            continue;
        }
        ls_session *s = sessions[i];
        e = lsc_argmax(b->ids + slot[i], s->penalized, b->logits + (size_t)slot[i] * vocab, vocab, s->d_tokens, s->pos,
                       sp->repetition_penalty);
        if (e != cudaSuccess) return e;
    }
    int32_t ids[LS_BATCH_MAX_ROWS];
    *what = "copying the picks";
    if ((e = cudaMemcpy(ids, b->ids, (size_t)n_sample * sizeof(int32_t), cudaMemcpyDeviceToHost)) != cudaSuccess)
        return e;
    if (host) {
        *what = "copying the logits";
        e = cudaMemcpy(b->logits_host, b->logits, (size_t)n_sample * vocab * sizeof(float), cudaMemcpyDeviceToHost);
        if (e != cudaSuccess) return e;
    }
    for (int32_t i = 0; i < n_rows; i++) {
        out[i] = LS_OK;
        if (slot[i] < 0) continue;
        const float *lg = b->logits_host + (size_t)slot[i] * vocab;
        if (logits_out) memcpy(logits_out + (size_t)i * vocab, lg, (size_t)vocab * sizeof(float));
        const ls_session *s = sessions[i];
        const ls_sampling *sp = &rows[i].step.sampling;
        out[i] = sp->temperature == 0.0f ? ids[slot[i]] : ls_sample(lg, vocab, s->tokens, s->pos, sp, (uint64_t)s->pos);
    }
    return cudaSuccess;
}

extern "C" int32_t ls_batch_step(ls_model *m, ls_session *const *sessions, const ls_batch_row *rows, int32_t n_rows,
                                 const int32_t *tokens, const uint32_t *masks, float *logits_out, int32_t *out) {
    return ls_batch_step_gated(m, sessions, rows, n_rows, tokens, masks, logits_out, out, NULL, NULL);
}

extern "C" int32_t ls_batch_step_gated(ls_model *m, ls_session *const *sessions, const ls_batch_row *rows,
                                       int32_t n_rows, const int32_t *tokens, const uint32_t *masks,
                                       float *logits_out, int32_t *out, void (*gate)(void *), void *gate_ctx) {
    if (!m || !m->rt) return LS_ERR_ARG;
    int32_t rc = ls_check_batch(m, sessions, rows, n_rows, tokens, masks, out);
    if (rc != LS_OK) return rc;
    /* token masks and the zero-shot exit rules (LS_FEATURE_RECURRENT) are the CPU library's */
    for (int32_t i = 0; i < n_rows; i++)
        if (rows[i].step.masked || ls_exit_rule_of(&rows[i].step) != 0) rc = out[i] = LS_ERR_UNSUPPORTED;
    if (rc != LS_OK) return rc;
    /* a session an earlier CUDA failure left unknown takes no more steps */
    for (int32_t i = 0; i < n_rows; i++)
        if (sessions[i]->failed) rc = out[i] = LS_ERR_STATE;
    if (rc != LS_OK) return rc;

    /* room for the states an exact exit keeps, before any row runs */
    for (int32_t i = 0; i < n_rows; i++)
        if (rows[i].step.exit_policy == LS_EXIT_EXACT && ls_step_exits(m, &rows[i].step, rows[i].sample, rows[i].n_tokens) &&
            lsc_defer_reserve(sessions[i]) != LS_OK)
            rc = out[i] = LS_ERR_NOMEM;
    if (rc != LS_OK) return rc;

    ls_batch_plan plan;
    ls_batch_plan_rows(&plan, sessions, rows, n_rows, lsb_row_before);
    lsc_batch *b = scratch_for(m, plan.n_tokens, plan.n_sample > 0 ? plan.n_sample : 1);
    if (!b) {
        cudaGetLastError(); // a failed allocation leaves no sticky error
        for (int32_t i = 0; i < n_rows; i++) out[i] = LS_ERR_NOMEM;
        return LS_ERR_NOMEM;
    }
    const int plain = plain_call(&plan, sessions, rows);
    int single = plain && plan.n_tokens <= LS_CHUNK; // ls_batch_blocks makes one block of it
    steps_ctx sctx = {m, sessions, b, cudaSuccess, ""};
    const lsb_ops ops = {&sctx,   op_embed,  op_load,    op_keep,        op_rows,       op_unit,
                         op_exit_begin, op_decide, op_permute, op_settle_step, op_copy_units, op_last};
    const lsb_call steps = {&ops, sessions, rows, plan.exits, plan.slot, tokens, m->info.n_layers};
    /* a resident model's single block takes its tokens up with its other inputs */
    const int32_t staged = b->up && single ? plan.n_tokens : 0;
    b->tok = staged ? b->act.tokens : b->tokens;
    block_call call = {m,      sessions, tokens, b,      plan.slot, plan.n_sample, single,
                       staged, plain ? NULL : &steps, &sctx, cudaSuccess, "selecting the device"};
    call.e = cudaSetDevice(m->rt->device);
    /* Work another thread queued for these sessions (a new session's zero
     * fill, a prefix copy) finishes first: with per-thread default streams
     * nothing else orders it before this step when it runs on the model's
     * pipeline thread (ls_pipeline_begin). */
    if (call.e == cudaSuccess) {
        call.what = "waiting for the device";
        call.e = cudaDeviceSynchronize();
    }
    if (call.e == cudaSuccess && !staged) {
        call.what = "copying the tokens";
        call.e = cudaMemcpy(b->tokens, tokens, (size_t)plan.n_tokens * sizeof(int32_t), cudaMemcpyHostToDevice);
    }
    ls_batch_piece pieces[LS_CHUNK];
    if (call.e == cudaSuccess) ls_batch_blocks(&plan, rows, LS_CHUNK, pieces, run_block_call, &call);
    cudaError_t e = call.e;
    const char *what = call.what;
    if (gate) gate(gate_ctx);
    if (e == cudaSuccess && plan.n_sample > 0)
        e = draw(m, sessions, rows, n_rows, plan.slot, plan.n_sample, single, b, logits_out, out, &what);
    else if (e == cudaSuccess)
        for (int32_t i = 0; i < n_rows; i++) out[i] = LS_OK;
    /* surfaces an asynchronous kernel failure before the caller trusts the sessions */
    if (e == cudaSuccess) {
        what = "synchronising";
        e = b->up ? cudaStreamSynchronize(cudaStreamPerThread) : cudaDeviceSynchronize(); /* a resident model: its own stream */
    }
    if (e != cudaSuccess) return fail_all(sessions, n_rows, out, what, e);
    for (int32_t i = 0; i < n_rows; i++)
        if (out[i] < 0 && rc == LS_OK) rc = out[i];
    return rc;
}
