/*
 * runtime.cu — libloopserve_cuda.so's sessions (fp16 K/V cache per unit on
 * the device, the kept states of exact early exit) and the forward pass
 * (the weights on the device: weights.cu), behind the ABI of
 * kernels/loopserve.h. The session logic (positions per unit, the windowed
 * ring, deferred units, rollback rules, argument checks and error codes) is
 * the CPU library's own, from kernels/session_rules.h; only where the
 * numbers are computed differs.
 *
 * CUDA failures after a session exists (a launch or copy failing mid-step)
 * leave its caches in an unknown state: the session is marked failed, the
 * error is printed to stderr (the ABI has no err buffer there) and every
 * later call on it returns LS_ERR_STATE.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_internal.h"

extern "C" {
#include "batch_rules.h"
}

// ---- device discovery and names ----

/* Number of usable CUDA devices; 0 when there is no driver, no device or
 * any error (cudaGetDeviceCount leaves the count unwritten on failure). */
extern "C" int32_t ls_cuda_device_count(void) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        cudaGetLastError(); // clear the sticky-free error so later calls start clean
        return 0;
    }
    return n > 0 ? n : 0;
}

extern "C" int32_t ls_model_device_memory(const ls_model *m, uint64_t *free_bytes, uint64_t *total_bytes) {
    if (m == NULL || m->rt == NULL || free_bytes == NULL || total_bytes == NULL) return LS_ERR_ARG;
    size_t free_b = 0, total_b = 0;
    if (cudaSetDevice(m->rt->device) != cudaSuccess || cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) {
        cudaGetLastError();
        return LS_ERR_STATE;
    }
    *free_bytes = free_b;
    *total_bytes = total_b;
    return LS_OK;
}

/* util.c's ls_simd_name, renamed at compile time by build.ts. */
extern "C" const char *ls_cpu_simd_name(int32_t simd);

extern "C" const char *ls_simd_name(int32_t simd) { return simd == LS_SIMD_CUDA ? "cuda" : ls_cpu_simd_name(simd); }

// ---- sessions ----

/* Zero filled as the CPU library callocs: no buffer ever holds undefined bytes. */
bool lsc_dev_alloc(void **p, size_t bytes) {
    *p = NULL;
    if (bytes == 0) return false;
    if (cudaMalloc(p, bytes) != cudaSuccess) {
        *p = NULL;
        return false;
    }
    return cudaMemset(*p, 0, bytes) == cudaSuccess;
}

bool lsc_block_alloc(lsc_block *b, const ls_model_info *mi, size_t rows) {
    size_t dim = (size_t)mi->dim, kv_dim = (size_t)mi->n_kv_heads * mi->head_dim, ffn = (size_t)mi->ffn_dim;
    size_t f = sizeof(float);
    bool quantized = mi->quant != LS_QUANT_FP16 || mi->head_bits != 0;
    if (!lsc_dev_alloc(&b->stage, LSC_STAGE_BYTES(mi->head_dim))) return false;
    b->rows = (lsc_row_cache *)b->stage;
    b->tokens = (int32_t *)((char *)b->stage + LSC_STAGE_ROWS);
    b->rope = (float *)((char *)b->stage + LSC_STAGE_ROWS + LSC_STAGE_TOKENS);
    return lsc_dev_alloc((void **)&b->h, rows * dim * f) && lsc_dev_alloc((void **)&b->xb, rows * dim * f) &&
           lsc_dev_alloc((void **)&b->qkv, rows * (dim + 2 * kv_dim) * f) &&
           lsc_dev_alloc((void **)&b->att, rows * dim * f) && lsc_dev_alloc((void **)&b->g, rows * ffn * f) &&
           (!quantized || (lsc_dev_alloc((void **)&b->q, rows * (dim > ffn ? dim : ffn)) &&
                           lsc_dev_alloc((void **)&b->qd, rows * f)));
}

void lsc_block_free(lsc_block *b) {
    void *bufs[] = {b->h, b->xb, b->qkv, b->att, b->g, b->stage, b->q, b->qd};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]) cudaFree(bufs[i]);
    memset(b, 0, sizeof *b);
}

/* Bytes a position's kept state takes (its hidden state and unit count), as
 * the CPU library counts them (session.c). */
static size_t deferred_bytes(const ls_model_info *mi) { return (size_t)mi->dim * sizeof(float) + sizeof(int32_t); }

/* Bytes of one session's keys (or values): units x kv heads x rows x head_dim, 0 on overflow. */
static size_t half_cache_bytes(const ls_model *m, int32_t units, int32_t cap) {
    return ls_bytes_of((size_t)units, (size_t)m->info.n_kv_heads, (size_t)cap, (size_t)m->info.head_dim, sizeof(__half));
}

extern "C" int64_t ls_session_cache_bytes(const ls_model *m, const ls_session_params *params) {
    if (!params || ls_check_session_args(m, params->max_seq, params->loops, params->cache_window, NULL, 0) != LS_OK ||
        params->kv_mode != LS_KV_FP16 || params->cache_steps != 0)
        return LS_ERR_ARG;
    int32_t cap = ls_ring_rows(params->max_seq, params->cache_window, LS_CHUNK);
    size_t half = half_cache_bytes(m, params->loops * m->info.n_layers, cap);
    if (half == 0) return LS_ERR_NOMEM;
    int64_t total = 2 * (int64_t)half;
    /* a model with an exit gate may keep a hidden state per position (exact early exit) */
    if (m->info.exit_gate) total += (int64_t)params->max_seq * (int64_t)deferred_bytes(&m->info);
    return total;
}

/* The device cache is allocated whole when the session is made (growing it
 * would need a device-side copy per step boundary): it holds what
 * ls_session_cache_bytes says from the start, the kept states once the
 * session first keeps one. */
extern "C" int64_t ls_session_cache_bytes_held(const ls_session *s) {
    if (!s) return LS_ERR_ARG;
    return 2 * (int64_t)half_cache_bytes(s->m, s->units, s->cap) + (int64_t)s->def_cap * (int64_t)deferred_bytes(&s->m->info);
}

int32_t lsc_defer_reserve(ls_session *s) {
    if (s->def_cap > 0) return LS_OK;
    const size_t n = (size_t)s->max_seq;
    s->def_units = (int32_t *)calloc(n, sizeof(int32_t));
    if (!s->def_units || !lsc_dev_alloc((void **)&s->def_h, n * (size_t)s->m->info.dim * sizeof(float))) {
        free(s->def_units);
        s->def_units = NULL;
        cudaGetLastError(); // a failed allocation leaves no sticky error
        return LS_ERR_NOMEM;
    }
    s->def_cap = s->max_seq;
    return LS_OK;
}

extern "C" ls_session *ls_session_new(ls_model *m, const ls_session_params *params, char *err, int32_t err_len) {
    if (!params) {
        ls_set_error(err, err_len, "no session parameters given");
        return NULL;
    }
    const int32_t max_seq = params->max_seq, loops = params->loops, cache_window = params->cache_window;
    if (ls_check_session_args(m, max_seq, loops, cache_window, err, err_len) != LS_OK) return NULL;
    if (params->cache_steps != 0) { /* shared steps' caches (LS_FEATURE_RECURRENT) are the CPU library's */
        ls_set_error(err, err_len, "cache_steps %d is not supported by the CUDA kernels", params->cache_steps);
        return NULL;
    }
    /* The CUDA kernels keep the fp16 cache only: a compressed mode is refused
     * with a message (the server then runs that mode on the CPU library). */
    if (params->kv_mode != LS_KV_FP16) {
        ls_set_error(err, err_len,
                     "the CUDA library implements only the fp16 key/value cache (kv_mode 0x%x requested); "
                     "use the CPU library for int8 / int4 / Hadamard cache modes",
                     (unsigned)params->kv_mode);
        return NULL;
    }
    const ls_model_info *mi = &m->info;
    ls_session *s = (ls_session *)ls_session_calloc(sizeof *s, err, err_len);
    if (!s) return NULL;
    LS_SESSION_SHAPE(s, m, max_seq, loops, cache_window, LS_CHUNK);

    size_t C = LS_CHUNK, hd = (size_t)mi->head_dim, vocab = (size_t)mi->vocab_size;
    size_t cache_bytes = half_cache_bytes(m, s->units, s->cap);

    s->tokens = (int32_t *)calloc((size_t)max_seq, sizeof(int32_t));
    s->unit_len = (int32_t *)calloc((size_t)s->units, sizeof(int32_t));
    s->unit_lo = (int32_t *)calloc((size_t)s->units, sizeof(int32_t));
    s->rope_host = (float *)calloc(C * hd, sizeof(float));
    s->logits_host = (float *)calloc(vocab, sizeof(float));
    bool host_ok = s->tokens && s->unit_len && s->unit_lo && s->rope_host && s->logits_host;
    bool dev_ok = host_ok && cache_bytes > 0 && lsc_dev_alloc((void **)&s->kc, cache_bytes) &&
                  lsc_dev_alloc((void **)&s->vc, cache_bytes) &&
                  lsc_dev_alloc((void **)&s->d_tokens, (size_t)max_seq * sizeof(int32_t)) &&
                  lsc_block_alloc(&s->act, mi, C) && lsc_dev_alloc((void **)&s->logits, C * vocab * sizeof(float)) &&
                  lsc_dev_alloc((void **)&s->penalized, vocab * sizeof(float)) &&
                  lsc_dev_alloc((void **)&s->result, sizeof(int32_t)) &&
                  (!m->rt->resident || (s->up = lsc_uploader_new(mi->head_dim)) != NULL);
    if (!dev_ok) {
        if (!host_ok)
            ls_set_error(err, err_len, "out of memory allocating a session (max_seq %d, loops %d)", max_seq, loops);
        else
            ls_set_error(err, err_len,
                         "out of GPU memory allocating a session (max_seq %d, loops %d x %d layers, window %d: %zu "
                         "bytes of K/V cache): %s",
                         max_seq, loops, mi->n_layers, cache_window, 2 * cache_bytes,
                         cudaGetErrorString(cudaGetLastError()));
        ls_session_free(s);
        return NULL;
    }
    return s;
}

extern "C" void ls_session_free(ls_session *s) {
    if (!s) return;
    void *dev[] = {s->kc, s->vc, s->def_h, s->d_tokens, s->logits, s->penalized, s->result};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
        if (dev[i]) cudaFree(dev[i]);
    lsc_block_free(&s->act);
    lsc_uploader_free(s->up);
    void *host[] = {s->tokens, s->unit_len, s->unit_lo, s->def_units, s->rope_host, s->logits_host, s};
    for (size_t i = 0; i < sizeof host / sizeof host[0]; i++) free(host[i]);
}

extern "C" int32_t ls_session_pos(const ls_session *s) { return s ? s->pos : LS_ERR_ARG; }

extern "C" int32_t ls_session_rollback(ls_session *s, int32_t pos) {
    if (!s || pos < 0 || pos > s->pos) return LS_ERR_ARG;
    if (s->failed) return LS_ERR_STATE;
    int32_t rc = ls_rollback_units(s->unit_len, s->unit_lo, s->units, s->window, s->pos, pos);
    if (rc == LS_OK) s->pos = pos;
    return rc;
}

static int32_t fail(ls_session *s, const char *what, cudaError_t e) {
    s->failed = 1;
    fprintf(stderr, "loopserve cuda: %s failed: %s\n", what, cudaGetErrorString(e));
    return LS_ERR_STATE;
}

#define TRY(what, call)                                  \
    do {                                                 \
        cudaError_t e_ = (call);                         \
        if (e_ != cudaSuccess) return fail(s, what, e_); \
    } while (0)

/* session.c's ls_session_copy_prefix: the same checks (session_rules.h),
 * then the rows copied on the device, the kept states of the positions
 * whose deeper units are deferred with them. */
extern "C" int32_t ls_session_copy_prefix(ls_session *dst, const ls_session *src, int32_t n) {
    if (!dst || !src || dst == src) return LS_ERR_ARG;
    int32_t rc = ls_check_copy_prefix(ls_session_view(dst), ls_session_view(src), n);
    if (rc != LS_OK) return rc;
    if (dst->failed || src->failed) return LS_ERR_STATE;
    /* positions lacking dst's deepest unit keep their deferred states */
    const int32_t held = src->unit_len[dst->units - 1] < n ? src->unit_len[dst->units - 1] : n;
    if (held < n && lsc_defer_reserve(dst) != LS_OK) return LS_ERR_NOMEM;
    const ls_model_info *mi = &dst->m->info;
    int32_t hd = mi->head_dim, n_kv = mi->n_kv_heads, dim = mi->dim;
    ls_session *s = dst; /* TRY marks the destination failed */
    size_t src_loop = (size_t)n_kv * src->cap * hd, dst_loop = (size_t)n_kv * dst->cap * hd;
    for (int32_t l = 0; l < dst->units; l++) {
        int32_t lo = ls_prefix_lo(src->unit_lo[l], n, dst->cap), len = src->unit_len[l] < n ? src->unit_len[l] : n;
        TRY("copying keys", lsc_copy_rows(dst->kc + l * dst_loop, dst->cap, src->kc + l * src_loop, src->cap, n_kv,
                                          hd, lo, len));
        TRY("copying values", lsc_copy_rows(dst->vc + l * dst_loop, dst->cap, src->vc + l * src_loop, src->cap,
                                            n_kv, hd, lo, len));
        dst->unit_len[l] = len;
        dst->unit_lo[l] = lo;
    }
    if (held < n) {
        TRY("copying the kept states", cudaMemcpy(dst->def_h + (size_t)held * dim, src->def_h + (size_t)held * dim,
                                                  (size_t)(n - held) * dim * sizeof(float), cudaMemcpyDeviceToDevice));
        memcpy(dst->def_units + held, src->def_units + held, (size_t)(n - held) * sizeof *dst->def_units);
    }
    if (n > 0)
        TRY("copying the token history", cudaMemcpy(dst->d_tokens, src->d_tokens, (size_t)n * sizeof(int32_t),
                                                    cudaMemcpyDeviceToDevice));
    TRY("synchronising", cudaDeviceSynchronize());
    memcpy(dst->tokens, src->tokens, (size_t)n * sizeof *dst->tokens);
    dst->pos = n;
    return LS_OK;
}

// ---- forward ----

#define STEP(name, call)          \
    do {                          \
        cudaError_t e_ = (call);  \
        if (e_ != cudaSuccess) {  \
            *what = name;         \
            return e_;            \
        }                         \
    } while (0)

/* A sublayer's output projection onto the residual h: added by the matmul
 * itself, or, with sandwich norms, into xb, then normed and added. */
template <typename Project>
static cudaError_t sublayer_out(const ls_model *m, const lsc_block *b, int32_t T, const float *out_norm,
                                Project project, const char *name, const char **what) {
    if (!out_norm) {
        STEP(name, project(b->h, 1));
        return cudaSuccess;
    }
    STEP(name, project(b->xb, 0));
    STEP("sandwich norm", lsc_rmsnorm_add(b->h, b->xb, out_norm, T, m->info.dim, m->info.norm_eps));
    return cudaSuccess;
}

cudaError_t lsc_block_unit(const ls_model *m, const lsc_block *b, int32_t T, int32_t unit, const char **what) {
    const ls_model_info *mi = &m->info;
    const ls_runtime *rt = m->rt;
    const int32_t layer = LS_UNIT_LAYER(m, unit);
    const lsc_layer *w = &rt->layers[layer];
    const bool quant = rt->quantized; /* each matmul input quantized once: q, k and v share theirs */
    int32_t dim = mi->dim, hd = mi->head_dim, n_heads = mi->n_heads, n_kv = mi->n_kv_heads;
    int32_t kv_dim = n_kv * hd, ffn = mi->ffn_dim;
    float eps = mi->norm_eps;
    int32_t ld = dim + 2 * kv_dim; // a row of qkv
    lsc_resident_use(m, layer);
    // attention sub-block
    STEP("rmsnorm", lsc_rmsnorm(b->xb, b->h, w->attn_norm, T, dim, eps));
    if (quant) {
        STEP("quantizing the attention input", lsc_quantize(b->q, b->qd, b->xb, dim, dim, T));
        STEP("wq", lsc_qmatmul(b->qkv, ld, b->q, b->qd, &w->q.wq, T, 0));
        STEP("wk", lsc_qmatmul(b->qkv + dim, ld, b->q, b->qd, &w->q.wk, T, 0));
        STEP("wv", lsc_qmatmul(b->qkv + dim + kv_dim, ld, b->q, b->qd, &w->q.wv, T, 0));
    } else {
        STEP("wqkv", lsc_matmul(b->qkv, ld, b->xb, dim, w->wqkv, dim, ld, T, 0));
    }
    STEP("rope and kv store", lsc_rope_store(b->qkv, ld, n_heads, n_kv, hd, b->rope, b->rows, unit, T));
    STEP("attention", lsc_attention(b->att, b->qkv, ld, b->rows, unit, n_heads, n_kv, hd, T));
    if (quant) STEP("quantizing the attention output", lsc_quantize(b->q, b->qd, b->att, dim, dim, T));
    auto wo = [&](float *y, int add) {
        return quant ? lsc_qmatmul(y, dim, b->q, b->qd, &w->q.wo, T, add)
                     : lsc_matmul(y, dim, b->att, dim, w->wo, dim, dim, T, add);
    };
    cudaError_t e = sublayer_out(m, b, T, w->attn_out_norm, wo, "wo", what);
    if (e != cudaSuccess) return e;
    // feed-forward sub-block
    STEP("rmsnorm", lsc_rmsnorm(b->xb, b->h, w->ffn_norm, T, dim, eps));
    if (quant) {
        STEP("quantizing the feed-forward input", lsc_quantize(b->q, b->qd, b->xb, dim, dim, T));
        STEP("w1 w3 swiglu", lsc_qmatmul_swiglu(b->g, ffn, b->q, b->qd, &w->q.w1, &w->q.w3, T));
        STEP("quantizing the feed-forward hidden state", lsc_quantize(b->q, b->qd, b->g, ffn, ffn, T));
    } else {
        STEP("w1 w3 swiglu", lsc_matmul_swiglu(b->g, ffn, b->xb, dim, w->w1, w->w3, dim, ffn, T));
    }
    auto w2 = [&](float *y, int add) {
        return quant ? lsc_qmatmul(y, dim, b->q, b->qd, &w->q.w2, T, add)
                     : lsc_matmul(y, dim, b->g, ffn, w->w2, ffn, dim, T, add);
    };
    e = sublayer_out(m, b, T, w->ffn_out_norm, w2, "w2", what);
    if (e != cudaSuccess) return e;
    /* after a step's last layer, the step norm: its output goes on to the next step and to the head */
    if (mi->step_norm && layer == mi->n_layers - 1) STEP("step norm", lsc_rmsnorm(b->h, b->h, rt->norm, T, dim, eps));
    return cudaSuccess;
}

cudaError_t lsc_embed_tokens(const ls_model *m, float *h, const int32_t *tokens, int32_t T) {
    const ls_runtime *rt = m->rt;
    return rt->tok_embeddings ? lsc_embed(h, rt->tok_embeddings, tokens, T, m->info.dim)
                              : lsc_embed_quantized(h, rt->qhead, tokens, T);
}

cudaError_t lsc_head(const ls_model *m, float *logits, float *normed, const float *x, int32_t T, int8_t *q, float *qd,
                     const char **what) {
    const ls_model_info *mi = &m->info;
    const ls_runtime *rt = m->rt;
    int32_t dim = mi->dim, vocab = mi->vocab_size;
    lsc_resident_use(m, LSC_HEAD);
    if (mi->step_norm) normed = (float *)x; /* normed at the end of its step; read only below */
    else STEP("rmsnorm", lsc_rmsnorm(normed, x, rt->norm, T, dim, mi->norm_eps));
    if (!rt->qhead) {
        STEP("output", lsc_matmul(logits, vocab, normed, dim, rt->output, dim, vocab, T, 0));
        return cudaSuccess;
    }
    STEP("quantizing the output head's input", lsc_quantize(q, qd, normed, dim, dim, T));
    STEP("output", lsc_qmatmul(logits, vocab, q, qd, rt->qhead, T, 0));
    return cudaSuccess;
}

void lsc_session_rows(lsc_row_cache *rows, const ls_session *s, int32_t pos0, int32_t n) {
    const ls_model_info *mi = &s->m->info;
    int64_t loop_stride = (int64_t)mi->n_kv_heads * s->cap * mi->head_dim;
    for (int32_t t = 0; t < n; t++) rows[t] = lsc_row_cache{s->kc, s->vc, loop_stride, s->cap, s->window, pos0 + t, 0};
}

/* The row caches and RoPE rows of a chunk (T <= LS_CHUNK) at positions
 * pos0.. to s->act; with the session's pinned stage (a resident model)
 * its tokens too, in one copy, then appended to the device history. */
static int32_t upload_chunk(ls_session *s, int32_t T, int32_t pos0, const int32_t *tokens) {
    const ls_model_info *mi = &s->m->info;
    const int32_t hd = mi->head_dim;
    if (s->up) {
        lsc_row_cache *rows;
        int32_t *staged;
        float *rope;
        TRY("waiting for the last upload", lsc_uploader_ready(s->up, &rows, &staged, &rope));
        lsc_session_rows(rows, s, pos0, T);
        ls_rope_table(rope, T, pos0, hd, mi->rope_theta);
        if (tokens) memcpy(staged, tokens, (size_t)T * sizeof *tokens);
        TRY("uploading the chunk's inputs", lsc_upload_staged(s->up, &s->act, T, hd));
        if (tokens)
            TRY("copying the token history", cudaMemcpyAsync(s->d_tokens + pos0, s->act.tokens, (size_t)T * sizeof(int32_t),
                                                              cudaMemcpyDeviceToDevice, cudaStreamPerThread));
        return LS_OK;
    }
    lsc_row_cache rows[LS_CHUNK];
    lsc_session_rows(rows, s, pos0, T);
    ls_rope_table(s->rope_host, T, pos0, hd, mi->rope_theta);
    TRY("copying the RoPE table", cudaMemcpy(s->act.rope, s->rope_host, (size_t)T * hd * sizeof(float),
                                             cudaMemcpyHostToDevice));
    TRY("copying the row caches", cudaMemcpy(s->act.rows, rows, (size_t)T * sizeof *rows, cudaMemcpyHostToDevice));
    return LS_OK;
}

/* Units [la, lb) over the uploaded chunk of T rows at pos0..: s->act.h
 * holds their unit-la input on entry and their unit-lb output on return. */
static int32_t run_units(ls_session *s, int32_t T, int32_t pos0, int32_t la, int32_t lb) {
    for (int32_t l = la; l < lb; l++) {
        const char *what = "";
        cudaError_t e = lsc_block_unit(s->m, &s->act, T, l, &what);
        if (e != cudaSuccess) return fail(s, what, e);
        ls_seq_advance(s->unit_len, s->unit_lo, l, pos0 + T, s->cap);
    }
    return LS_OK;
}

int32_t lsc_settle_step(ls_session *s, int32_t a, int32_t b, int32_t u) {
    const int32_t L = s->m->info.n_layers, dim = s->m->info.dim;
    /* in chunks, each through the whole step: a chunk attends to the chunks before it, done */
    for (int32_t c0 = a; c0 < b; c0 += LS_CHUNK) {
        int32_t T = b - c0 < LS_CHUNK ? b - c0 : LS_CHUNK;
        TRY("reading kept states", cudaMemcpyAsync(s->act.h, s->def_h + (size_t)c0 * dim, (size_t)T * dim * sizeof(float),
                                                   cudaMemcpyDeviceToDevice, cudaStreamPerThread));
        int32_t rc = upload_chunk(s, T, c0, NULL);
        if (rc == LS_OK) rc = run_units(s, T, c0, u, u + L);
        if (rc != LS_OK) return rc;
        TRY("keeping states", cudaMemcpyAsync(s->def_h + (size_t)c0 * dim, s->act.h, (size_t)T * dim * sizeof(float),
                                              cudaMemcpyDeviceToDevice, cudaStreamPerThread));
        for (int32_t t = 0; t < T; t++) s->def_units[c0 + t] = u + L;
    }
    return LS_OK;
}

/* forward.c's ls_forward_settle: the units [0, need) that earlier exact
 * exits deferred, step by step, for every position lacking them. */
static int32_t settle(ls_session *s, int32_t need) {
    for (int32_t u = 0; u < need; u += s->m->info.n_layers) {
        int32_t rc = lsc_settle_step(s, s->unit_len[u], s->pos, u);
        if (rc != LS_OK) return rc;
    }
    return LS_OK;
}

/* forward.c's ls_session_forward; logits of the last n_logits tokens (0 =
 * none) are left in s->logits chunk by chunk and, when host is not NULL,
 * copied there. After the call s->logits row 0.. holds the last chunk's. */
static int32_t forward(ls_session *s, const int32_t *tokens, int32_t n, int32_t loops, float *host, int32_t n_logits) {
    const ls_model_info *mi = &s->m->info;
    const ls_runtime *rt = s->m->rt;
    int32_t dim = mi->dim, vocab = mi->vocab_size;
    TRY("selecting the device", cudaSetDevice(rt->device));
    if (!s->up) /* else each chunk's go up with its other inputs */
        TRY("copying the tokens", cudaMemcpy(s->d_tokens + s->pos, tokens, (size_t)n * sizeof(int32_t),
                                             cudaMemcpyHostToDevice));
    const int32_t units = loops * mi->n_layers;
    int32_t rc = settle(s, units); /* the deferred units these tokens read */
    if (rc != LS_OK) return rc;
    int32_t first_logit = n - n_logits;
    for (int32_t c0 = 0; c0 < n; c0 += LS_CHUNK) {
        int32_t T = n - c0 < LS_CHUNK ? n - c0 : LS_CHUNK;
        rc = upload_chunk(s, T, s->pos, s->up ? tokens + c0 : NULL);
        if (rc != LS_OK) return rc;
        TRY("embedding", lsc_embed_tokens(s->m, s->act.h, s->up ? s->act.tokens : s->d_tokens + s->pos, T));
        rc = run_units(s, T, s->pos, 0, units);
        if (rc != LS_OK) return rc;
        memcpy(s->tokens + s->pos, tokens + c0, (size_t)T * sizeof *tokens);
        s->pos += T;
        int32_t lo = first_logit > c0 ? first_logit : c0;
        if (lo < c0 + T) {
            int32_t rows = c0 + T - lo;
            const char *what = "";
            cudaError_t e = lsc_head(s->m, s->logits, s->act.xb, s->act.h + (size_t)(lo - c0) * dim, rows, s->act.q,
                                     s->act.qd, &what);
            if (e != cudaSuccess) return fail(s, what, e);
            if (host)
                TRY("copying the logits", cudaMemcpy(host + (size_t)(lo - first_logit) * vocab, s->logits,
                                                     (size_t)rows * vocab * sizeof(float), cudaMemcpyDeviceToHost));
        }
    }
    // Surfaces an asynchronous kernel failure before the caller trusts the state
    // (a resident model waits for its own stream only).
    TRY("synchronising", s->up ? cudaStreamSynchronize(cudaStreamPerThread) : cudaDeviceSynchronize());
    return LS_OK;
}

/* forward.c's argument and state checks (session_rules.h), then whether
 * an earlier CUDA failure left the caches unknown. */
static int32_t check_forward(const ls_session *s, const int32_t *tokens, int32_t n, int32_t loops) {
    int32_t rc = ls_check_feed(ls_session_view(s), tokens, n, loops);
    if (rc == LS_OK && s->failed) rc = LS_ERR_STATE;
    return rc;
}

extern "C" int32_t ls_session_forward(ls_session *s, const int32_t *tokens, int32_t n, int32_t loops,
                                      float *logits_out, int32_t n_logits) {
    if (!s) return LS_ERR_ARG;
    if (logits_out && (n_logits < 1 || n_logits > n)) return LS_ERR_ARG;
    int32_t rc = check_forward(s, tokens, n, loops);
    if (rc != LS_OK) return rc;
    return forward(s, tokens, n, loops, logits_out, logits_out ? n_logits : 0);
}

extern "C" int32_t ls_session_last_steps(const ls_session *s) { return s ? s->last_steps : LS_ERR_ARG; }

extern "C" int32_t ls_session_step(ls_session *s, const int32_t *tokens, int32_t n, const ls_step_params *p,
                                   float *logits_out) {
    /* The sampling arguments are checked before the forward pass mutates the
     * session, as step.c does. */
    /* a masked step goes through ls_batch_step */
    if (!s || !p || p->masked || !ls_step_params_ok(p, 1)) return LS_ERR_ARG;
    if (ls_exit_rule_of(p) != 0) return LS_ERR_UNSUPPORTED; /* the zero-shot exit rules are the CPU library's */
    if (ls_step_exits(s->m, p, 1, n)) {
        /* a step that may exit early is a batch of one (batch.cu decides the exits) */
        ls_batch_row row = {n, 1, *p};
        int32_t out = 0;
        int32_t rc = ls_batch_step(s->m, &s, &row, 1, tokens, NULL, logits_out, &out);
        return rc != LS_OK ? rc : out;
    }
    if (p->exit_policy != LS_EXIT_NONE) return LS_ERR_ARG; /* the model has no exit gate */
    int32_t rc = check_forward(s, tokens, n, p->loops);
    if (rc != LS_OK) return rc;
    rc = forward(s, tokens, n, p->loops, logits_out, 1);
    if (rc != LS_OK) return rc;
    s->last_steps = p->loops;
    int32_t vocab = s->m->info.vocab_size;
    if (p->sampling.temperature == 0.0f) {
        int32_t id = LS_ERR_ARG;
        TRY("argmax", lsc_argmax(s->result, s->penalized, s->logits, vocab, s->d_tokens, s->pos, p->sampling.repetition_penalty));
        TRY("copying the sampled id", cudaMemcpy(&id, s->result, sizeof id, cudaMemcpyDeviceToHost));
        return id;
    }
    float *logits = logits_out;
    if (!logits) {
        logits = s->logits_host;
        TRY("copying the logits", cudaMemcpy(logits, s->logits, (size_t)vocab * sizeof(float), cudaMemcpyDeviceToHost));
    }
    return ls_sample(logits, vocab, s->tokens, s->pos, &p->sampling, (uint64_t)s->pos);
}
