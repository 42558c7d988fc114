/*
 * cuda_internal.h — shared by the .cu files of libloopserve_cuda.so; not ABI.
 *
 * libloopserve_cuda.so implements kernels/loopserve.h exactly like
 * libloopserve.so, plus loopserve_cuda.h's exports. Loading and validation are
 * the CPU library's own code (model.c, util.c, sample.c are linked
 * in, see build.ts); this directory provides what internal.h leaves to the
 * runtime: ls_runtime_init/free, the sessions and the forward pass.
 *
 * Design, kept deliberately plain (it is compiled in CI but can only run on
 * a GPU host):
 *   - weights are copied to the device once, as stored (fp16, or the
 *     quantized codes and fp16 scales); norms as fp32;
 *   - every kernel runs on the legacy default stream, so launches are
 *     ordered and each cudaMemcpy to the host is the synchronisation point;
 *   - each output element is one fixed-order reduction by one warp or block,
 *     whatever the number of tokens in the call: like the CPU kernels, the
 *     GPU path is batch-invariant on its own (GPU and CPU logits agree to
 *     rounding, not bit for bit);
 *   - greedy sampling (argmax, repetition penalty) runs on the device; a
 *     temperature draw copies the logits to the host and runs sample.c's
 *     ls_sample, so the RNG contract is not re-implemented but shared: the
 *     same logits, seed and counter give the same token on both libraries;
 *   - quantized matmuls (quant.cu) compute quant.h's integer group sums and
 *     fp32 fold through kernels/cuda/quant_math.h: for the same inputs,
 *     bit for bit the CPU library's;
 *   - a stack keeps each layer's weights (lsc_layer) and a cache unit per
 *     layer and step; a batched step whose rows may exit early runs its
 *     blocks on the CPU library's schedule (block_steps.h), each gate
 *     decided on the device between steps (exits.cu, exit_math.h);
 *   - a kernel family that has not passed a validation run on a GPU is off
 *     by default (loopserve_cuda.h, ls_cuda_kernels; features.cu).
 */
#ifndef LS_CUDA_INTERNAL_H
#define LS_CUDA_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_fp16.h>
#include <cuda_runtime.h>

extern "C" {
#include "internal.h"
#include "rope.h"
#include "session_rules.h"
#include "sizes.h"
}
#include "loopserve_cuda.h"
#include "exit_math.h"
#include "quant_math.h"

/* Threads per block of the row-wise kernels; attention keeps one output
 * dimension per thread, so head_dim may not exceed it. */
#define LS_CUDA_BLOCK 256
#define LS_CUDA_MAX_HEAD_DIM LS_CUDA_BLOCK

/* batch.cu: ls_batch_step's device scratch, made on its first call. */
struct lsc_batch;
void lsc_batch_free(struct lsc_batch *b);

/* features.cu: the LS_CUDA_KERNELS_* families models loaded now may use. */
int32_t lsc_kernels_on(void);

/* A layer's seven matrices in a quantized model, on the device. */
typedef struct {
    lsq_matrix wq, wk, wv, wo, w1, w2, w3;
} lsc_qblock;

/* One layer's weights on the device: fp16 matrices (same layouts as
 * ls_layer_weights), or, in a quantized model, the quantized ones (q); the
 * norms as fp32. */
typedef struct {
    __half *wqkv;           /* (n_heads * head_dim + 2 * kv_dim, dim): wq, wk, wv stacked, one matmul */
    __half *wo;             /* (dim, n_heads * head_dim) */
    __half *w1;             /* (ffn_dim, dim) gate */
    __half *w2;             /* (dim, ffn_dim) down */
    __half *w3;             /* (ffn_dim, dim) up */
    lsc_qblock q;           /* a quantized model's (its fp16 matrices are NULL) */
    float *attn_norm;       /* (dim) */
    float *ffn_norm;        /* (dim) */
    float *attn_out_norm;   /* (dim) sandwich norms, or NULL */
    float *ffn_out_norm;    /* (dim) */
} lsc_layer;

struct ls_runtime {
    int device;
    /* the model-wide weights on the device: tok_embeddings is NULL when the
     * quantized head serves as the embedding, output when the head is
     * quantized (qhead) */
    __half *tok_embeddings; /* (vocab_size, dim) */
    __half *output;         /* (vocab_size, dim); == tok_embeddings when tied */
    float *norm;            /* (dim) the final norm, or in a model that norms every step the step norm */
    float *exit_gate;       /* (dim + 1) the exit gate's weights, then its bias (fp32); NULL without a gate */
    lsc_layer *layers;      /* (n_layers) */
    int quantized;          /* the layers' matrices are quantized (lsc_layer.q) */
    lsq_matrix *qhead;      /* quantized output head (head_bits > 0), or NULL */
    struct lsc_batch *batch; /* NULL until ls_batch_step first runs */
};

/* Where one token row's K/V go and which positions it attends to: its
 * session's caches (unit l starts loop_stride elements after unit l - 1),
 * ring rows, window and the token's position. One per row of a block, so
 * one launch stores and attends for rows of many sessions. */
typedef struct {
    __half *kc, *vc;
    int64_t loop_stride;
    int32_t cap, window, pos, unused;
} lsc_row_cache;

/* One block's activations on the device, (LS_CHUNK, ...) rows: a
 * session's own scratch, or the batch step's rows of many sessions. */
typedef struct {
    float *h;    /* (T, dim) residual stream */
    float *xb;   /* (T, dim) normed sub-block input */
    float *qkv;  /* (T, dim + 2 * kv_dim) each row's q, k, v side by side */
    float *att;  /* (T, n_heads * head_dim) */
    float *g;    /* (T, ffn_dim) silu(gate) * up */
    float *rope; /* (T, head_dim / 2, 2) each row's cos, sin */
    lsc_row_cache *rows; /* (T) each row's cache */
    int8_t *q;   /* (T, max(dim, ffn_dim)) a matmul's activation codes (quantized models) */
    float *qd;   /* (T) their scales */
} lsc_block;

struct ls_session {
    ls_model *m;
    int32_t max_seq;   /* most positions ever held */
    int32_t units;     /* cache units (steps x layers) the caches exist for */
    int32_t window;    /* 0 = full attention, else W */
    int32_t cap;       /* cache rows per unit: max_seq, or W + LS_CHUNK */
    int32_t pos;       /* tokens fed (history length) */
    int32_t last_steps; /* steps the last sampled token ran (ls_session_last_steps) */
    int32_t failed;    /* a CUDA call failed mid-step: the caches are unknown */

    /* host */
    int32_t *tokens;   /* (max_seq) token history, for ls_sample's penalty */
    int32_t *unit_len; /* (units) positions [0, unit_len) written in unit l */
    int32_t *unit_lo;  /* (units) oldest position the ring still holds for unit l */
    int32_t *def_units; /* (def_cap) exact early exit: the units position p had computed when its state was
                         * kept (its later units deferred, loopserve.h); NULL until the session first keeps one */
    int32_t def_cap;   /* positions def_units and def_h have room for: 0, or max_seq */
    float *rope_host;  /* (LS_CHUNK, head_dim / 2, 2) cos, sin */
    float *logits_host; /* (vocab_size) for a host-side draw */

    /* device */
    int32_t *d_tokens; /* (max_seq) the same history, for the device penalty */
    __half *kc;        /* (units, n_kv_heads, cap, head_dim) keys, RoPE applied */
    __half *vc;        /* (units, n_kv_heads, cap, head_dim) values */
    float *def_h;      /* (def_cap, dim) position p's hidden state entering unit def_units[p] */
    lsc_block act;     /* (LS_CHUNK, ...) this session's activations */
    float *logits;     /* (LS_CHUNK, vocab_size) */
    float *penalized;  /* (vocab_size) logits after the repetition penalty */
    int32_t *result;   /* (1) sampled id */
};

/* The session's bookkeeping as session_rules.h reads it (fp16 cache only). */
static inline ls_seq_view ls_session_view(const ls_session *s) {
    ls_seq_view v = {s->m, s->max_seq, s->units, s->m->info.n_layers, s->window, s->cap, LS_KV_FP16, s->pos,
                     s->unit_len, s->unit_lo, s->def_units};
    return v;
}

/* ---- runtime.cu ---- */

/* cudaMalloc + zero fill; false on failure or a 0-byte request. */
bool lsc_dev_alloc(void **p, size_t bytes);

/* Allocates the block scratch for `rows` rows of model info mi; false on
 * failure (what is allocated is freed by lsc_block_free). */
bool lsc_block_alloc(lsc_block *b, const ls_model_info *mi, size_t rows);
void lsc_block_free(lsc_block *b);

/* Unit `unit` (layer unit % n_layers of its step) over the view's T rows,
 * each launch for all of them: norms, matmuls (each weight row read once
 * per tile of tokens), the K/V store and attention of each row in its own
 * session's cache (view->rows), the sandwich norms, and after a step's last
 * layer the step norm. On failure *what names the launch. */
cudaError_t lsc_block_unit(const ls_model *m, const lsc_block *view, int32_t T, int32_t unit, const char **what);

/* Makes room for the session's kept states (exact early exit): every
 * position's, allocated once. LS_OK or LS_ERR_NOMEM, the session unchanged. */
int32_t lsc_defer_reserve(ls_session *s);

/* forward.c's ls_forward_settle_step on the device: positions [a, b) of s,
 * which lack the step beginning at unit u and hold every unit before it,
 * through that step from their kept states, in chunks; LS_OK, or
 * LS_ERR_STATE after a CUDA failure (the session then failed). */
int32_t lsc_settle_step(ls_session *s, int32_t a, int32_t b, int32_t u);

/* Fills n row descriptors of session s for positions pos0.. */
void lsc_session_rows(lsc_row_cache *rows, const ls_session *s, int32_t pos0, int32_t n);

/* h[t] = the embedding of tokens[t], t < T (tok_embeddings, or the
 * quantized head's row dequantized). */
cudaError_t lsc_embed_tokens(const ls_model *m, float *h, const int32_t *tokens, int32_t T);

/* The output head over T rows: normed = rmsnorm(x) (T, dim), or x itself
 * in a model that norms after every step, then logits (T, vocab) =
 * head(normed); q, qd: activation scratch for T rows of dim codes (a
 * quantized head). On failure *what names the launch. */
cudaError_t lsc_head(const ls_model *m, float *logits, float *normed, const float *x, int32_t T, int8_t *q, float *qd,
                     const char **what);

/* ---- ops.cu: each launcher returns the launch's error (cudaGetLastError) ---- */

/* h[t] = E[tokens[t]] as fp32; tokens already checked against the vocabulary. */
cudaError_t lsc_embed(float *h, const __half *E, const int32_t *tokens, int32_t T, int32_t dim);

/* out[t] = x[t] / sqrt(mean(x[t]^2) + eps) * w, rows of n. */
cudaError_t lsc_rmsnorm(float *out, const float *x, const float *w, int32_t T, int32_t n, float eps);

/* h[t] += rmsnorm(y[t]) * w, rows of n: a sublayer's output through its
 * sandwich norm onto the residual (the norm rounded, then the add). */
cudaError_t lsc_rmsnorm_add(float *h, const float *y, const float *w, int32_t T, int32_t n, float eps);

/* y[t*ldy + o] (+)= sum_i w[o*in + i] * x[t*ldx + i], o < rows, t < T. */
cudaError_t lsc_matmul(float *y, int32_t ldy, const float *x, int32_t ldx, const __half *w, int32_t in,
                       int32_t rows, int32_t T, int add);

/* g[t*ldg + o] = silu(a) * b with a = w1[o] . x[t], b = w3[o] . x[t]: the
 * feed-forward's gate, up and SwiGLU in one pass over x. */
cudaError_t lsc_matmul_swiglu(float *g, int32_t ldg, const float *x, int32_t ldx, const __half *w1, const __half *w3,
                              int32_t in, int32_t rows, int32_t T);

/* Rotates the query and key heads of T rows of qkv ((T, ld): q, k, v) in
 * place (cs (T, hd/2, 2)), then stores the keys and values as fp16 into
 * loop `unit` of each row's cache (n_kv, cap, hd), at ring row
 * rows[t].pos % cap. */
cudaError_t lsc_rope_store(float *qkv, int32_t ld, int32_t n_heads, int32_t n_kv, int32_t hd, const float *cs,
                           const lsc_row_cache *rows, int32_t unit, int32_t T);

/* att[t, h] = softmax(q[t, h] · K / sqrt(hd)) · V over the positions token t
 * sees (causal up to rows[t].pos, its last `window` when window > 0) in
 * loop `unit` of its cache; q rows ldq apart, att rows packed. */
cudaError_t lsc_attention(float *att, const float *q, int32_t ldq, const lsc_row_cache *rows, int32_t unit,
                          int32_t n_heads, int32_t n_kv, int32_t hd, int32_t T);

/* Copies positions [lo, n) of one unit's cache (n_kv, cap, hd) from a ring
 * of scap rows to one of dcap rows (position p lives in row p % cap). */
cudaError_t lsc_copy_rows(__half *dst, int32_t dcap, const __half *src, int32_t scap, int32_t n_kv, int32_t hd,
                          int32_t lo, int32_t n);

/* ---- exits.cu: the exit gate and the rows of a block that moves (block_steps.h) ---- */

/* The gate of n rows, after a step: asks[i] (device) names row block_row
 * of h (rows of dim) and the call's row whose distribution states[call_row]
 * it folds into (exit_math.h); exited[i] = 1 when that row exits. gate:
 * (dim + 1) weights then bias. */
cudaError_t lsc_exit_decide(int32_t *exited, const int32_t *asks, int32_t n, const float *h, const float *gate,
                            int32_t dim, lsx_exit_state *states);

/* dst row i = src row from[i] (from on the device), n rows of dim. */
cudaError_t lsc_gather_rows(float *dst, const float *src, const int32_t *from, int32_t n, int32_t dim);

/* Units [from, to) of a cache (unit u at kc + u * loop_stride, (n_kv, cap,
 * hd)) receive, at ring row `row`, the keys and values of unit
 * from - layers + u % layers (the same layer in the step before `from`). */
cudaError_t lsc_copy_units(__half *kc, __half *vc, int64_t loop_stride, int32_t cap, int32_t row, int32_t from,
                           int32_t to, int32_t layers, int32_t n_kv, int32_t hd);

/* ---- quant.cu: the quantized matmuls (quant_math.h's arithmetic) ---- */

/* q (T, in) int8 codes and d (T) scales of the T rows of x (rows ldx apart),
 * as ls_quant_rows makes them. */
cudaError_t lsc_quantize(int8_t *q, float *d, const float *x, int32_t ldx, int32_t in, int32_t T);

/* y[t*ldy + o] (+)= row o of w times activation row t (q, d from
 * lsc_quantize over w->in inputs), o < w->rows, t < T. */
cudaError_t lsc_qmatmul(float *y, int32_t ldy, const int8_t *q, const float *d, const lsq_matrix *w, int32_t T,
                        int add);

/* g[t*ldg + o] = silu(w1[o] . x[t]) * (w3[o] . x[t]), each product as lsc_qmatmul's. */
cudaError_t lsc_qmatmul_swiglu(float *g, int32_t ldg, const int8_t *q, const float *d, const lsq_matrix *w1,
                               const lsq_matrix *w3, int32_t T);

/* h[t] = row tokens[t] of the quantized head, dequantized (s * c, exact), t < T. */
cudaError_t lsc_embed_quantized(float *h, const lsq_matrix *head, const int32_t *tokens, int32_t T);

/* ---- sample.cu ---- */

/* Greedy pick with ls_sample's rules (NaN as -inf, repetition penalty once
 * per distinct history id, lowest id on ties): *out = the id, or LS_ERR_ARG
 * when no logit is usable. penalized: (vocab) scratch, used when
 * penalty != 1 and n_history > 0. */
cudaError_t lsc_argmax(int32_t *out, float *penalized, const float *logits, int32_t vocab,
                       const int32_t *history, int32_t n_history, float penalty);

#endif
