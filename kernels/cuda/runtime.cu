/*
 * runtime.cu — libloopserve_cuda.so's runtime (weights on the device),
 * sessions (fp16 K/V cache per unit on the device) and the forward pass,
 * behind the ABI of kernels/loopserve.h. The session logic (positions per
 * loop, the windowed ring, rollback rules, argument checks and error codes)
 * is the CPU library's own, from kernels/session_rules.h; only where the
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

// ---- runtime ----

static int upload(void **dst, const void *src, size_t bytes, const char *what, char *err, int32_t err_len) {
    cudaError_t e = cudaMalloc(dst, bytes);
    if (e != cudaSuccess) {
        *dst = NULL;
        ls_set_error(err, err_len, "cannot allocate %zu bytes of GPU memory for %s: %s", bytes, what,
                     cudaGetErrorString(e));
        return -1;
    }
    e = cudaMemcpy(*dst, src, bytes, cudaMemcpyHostToDevice);
    if (e != cudaSuccess) {
        ls_set_error(err, err_len, "cannot copy %s (%zu bytes) to the GPU: %s", what, bytes, cudaGetErrorString(e));
        return -1;
    }
    return 0;
}

static int upload_f16(__half **dst, const uint16_t *src, size_t n, const char *what, char *err, int32_t err_len) {
    return upload((void **)dst, src, n * sizeof(uint16_t), what, err, err_len);
}

/* wq, wk and wv stacked in one allocation, so one matmul computes a row's
 * q, k and v. */
static int upload_qkv(__half **dst, const ls_layer_weights *w, size_t dim, size_t kv_dim, char *err, int32_t err_len) {
    size_t n[3] = {dim * dim, kv_dim * dim, kv_dim * dim};
    const uint16_t *parts[3] = {w->wq, w->wk, w->wv};
    const char *names[3] = {"block.wq.weight", "block.wk.weight", "block.wv.weight"};
    cudaError_t e = cudaMalloc((void **)dst, (n[0] + n[1] + n[2]) * sizeof(uint16_t));
    if (e != cudaSuccess) {
        *dst = NULL;
        ls_set_error(err, err_len, "cannot allocate GPU memory for the attention projections: %s",
                     cudaGetErrorString(e));
        return -1;
    }
    for (size_t i = 0, at = 0; i < 3; at += n[i], i++) {
        e = cudaMemcpy(*dst + at, parts[i], n[i] * sizeof(uint16_t), cudaMemcpyHostToDevice);
        if (e != cudaSuccess) {
            ls_set_error(err, err_len, "cannot copy %s to the GPU: %s", names[i], cudaGetErrorString(e));
            return -1;
        }
    }
    return 0;
}

/* Norm weights as fp32, converted on the host with util.c's exact conversion. */
static int upload_norm(float **dst, const uint16_t *src, int32_t n, const char *what, char *err, int32_t err_len) {
    float *tmp = (float *)malloc((size_t)n * sizeof(float));
    if (!tmp) {
        ls_set_error(err, err_len, "out of memory converting %s", what);
        return -1;
    }
    for (int32_t i = 0; i < n; i++) tmp[i] = ls_f16_to_f32(src[i]);
    int rc = upload((void **)dst, tmp, (size_t)n * sizeof(float), what, err, err_len);
    free(tmp);
    return rc;
}

extern "C" int32_t ls_runtime_init(ls_model *m, int32_t n_threads, int32_t simd, char *err, int32_t err_len) {
    (void)n_threads; // one host thread drives the GPU
    (void)simd;      // a CPU notion; model.c has already checked its range
    ls_model_info *mi = &m->info;
    if (mi->quant != LS_QUANT_FP16) {
        ls_set_error(err, err_len, "quant %d is not supported by the CUDA kernels (fp16 only)", mi->quant);
        return LS_ERR_ARG;
    }
    if (mi->head_bits != 0) {
        ls_set_error(err, err_len, "a quantized output head (int%d) is not supported by the CUDA kernels (F16 only)",
                     mi->head_bits);
        return LS_ERR_ARG;
    }
    if (mi->n_layers != 1 || mi->sandwich_norm || mi->step_norm || mi->exit_gate) {
        ls_set_error(err, err_len,
                     "a stacked model (%d layers%s%s%s) is not supported by the CUDA kernels yet: serve it with the "
                     "CPU library",
                     mi->n_layers, mi->sandwich_norm ? ", sandwich norms" : "", mi->step_norm ? ", a norm per step" : "",
                     mi->exit_gate ? ", an exit gate" : "");
        return LS_ERR_ARG;
    }
    if (mi->n_prelude || mi->n_coda || mi->injection || mi->mid_norm || mi->rope_interleaved || mi->qk_bias ||
        mi->embed_scale != 1.0f || mi->n_heads * mi->head_dim != mi->dim) {
        ls_set_error(err, err_len,
                     "a recurrent-depth model (Huginn's prelude, coda and input injection; q/k biases, interleaved "
                     "RoPE, an embedding scale or head_dim %d x %d heads other than dim %d: Nanbeige4.2's) is not "
                     "supported by the CUDA kernels yet: serve it with the CPU library",
                     mi->head_dim, mi->n_heads, mi->dim);
        return LS_ERR_ARG;
    }
    if (ls_check_model_shape(mi, err, err_len) != LS_OK) return LS_ERR_ARG;
    if (mi->head_dim > LS_CUDA_MAX_HEAD_DIM) {
        ls_set_error(err, err_len, "head_dim %d is larger than the CUDA attention kernel supports (%d)",
                     mi->head_dim, LS_CUDA_MAX_HEAD_DIM);
        return LS_ERR_ARG;
    }
    int n_dev = 0;
    cudaError_t e = cudaGetDeviceCount(&n_dev);
    if (e != cudaSuccess || n_dev < 1) {
        ls_set_error(err, err_len, "no usable CUDA device: %s",
                     e != cudaSuccess ? cudaGetErrorString(e) : "the driver reports 0 devices");
        cudaGetLastError();
        return LS_ERR_STATE;
    }
    e = cudaSetDevice(0);
    if (e != cudaSuccess) {
        ls_set_error(err, err_len, "cannot select CUDA device 0: %s", cudaGetErrorString(e));
        return LS_ERR_STATE;
    }

    ls_runtime *rt = (ls_runtime *)calloc(1, sizeof *rt);
    if (!rt) {
        ls_set_error(err, err_len, "out of memory allocating the runtime");
        return LS_ERR_NOMEM;
    }
    m->rt = rt;
    rt->device = 0;
    size_t dim = (size_t)mi->dim, kv_dim = (size_t)mi->n_kv_heads * mi->head_dim;
    size_t ffn = (size_t)mi->ffn_dim, vocab = (size_t)mi->vocab_size;
    const ls_weights *w = &m->w;
    const ls_layer_weights *lw = &w->layers[0];
    int bad = upload_f16(&rt->tok_embeddings, w->tok_embeddings, vocab * dim, "tok_embeddings.weight", err, err_len) ||
              upload_qkv(&rt->wqkv, lw, dim, kv_dim, err, err_len) ||
              upload_f16(&rt->wo, lw->wo, dim * dim, "block.wo.weight", err, err_len) ||
              upload_f16(&rt->w1, lw->w1, ffn * dim, "block.w1.weight", err, err_len) ||
              upload_f16(&rt->w2, lw->w2, dim * ffn, "block.w2.weight", err, err_len) ||
              upload_f16(&rt->w3, lw->w3, ffn * dim, "block.w3.weight", err, err_len) ||
              upload_norm(&rt->attn_norm, lw->attn_norm, mi->dim, "block.attn_norm.weight", err, err_len) ||
              upload_norm(&rt->ffn_norm, lw->ffn_norm, mi->dim, "block.ffn_norm.weight", err, err_len) ||
              upload_norm(&rt->norm, w->norm, mi->dim, "norm.weight", err, err_len);
    if (!bad) {
        if (mi->tied_output || w->output == w->tok_embeddings)
            rt->output = rt->tok_embeddings;
        else
            bad = upload_f16(&rt->output, w->output, vocab * dim, "output.weight", err, err_len);
    }
    if (bad) {
        ls_runtime_free(m);
        return LS_ERR_NOMEM;
    }
    mi->simd = LS_SIMD_CUDA;
    mi->n_threads = 1;
    return LS_OK;
}

extern "C" void ls_runtime_free(ls_model *m) {
    if (!m || !m->rt) return;
    ls_runtime *rt = m->rt;
    lsc_batch_free(rt->batch);
    if (rt->output && rt->output != rt->tok_embeddings) cudaFree(rt->output);
    void *bufs[] = {rt->tok_embeddings, rt->wqkv, rt->wo, rt->w1, rt->w2,
                    rt->w3, rt->attn_norm, rt->ffn_norm, rt->norm};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]) cudaFree(bufs[i]);
    free(rt);
    m->rt = NULL;
}

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
    return lsc_dev_alloc((void **)&b->h, rows * dim * f) && lsc_dev_alloc((void **)&b->xb, rows * dim * f) &&
           lsc_dev_alloc((void **)&b->qkv, rows * (dim + 2 * kv_dim) * f) &&
           lsc_dev_alloc((void **)&b->att, rows * dim * f) && lsc_dev_alloc((void **)&b->g, rows * ffn * f) &&
           lsc_dev_alloc((void **)&b->rope, rows * (size_t)mi->head_dim * f) &&
           lsc_dev_alloc((void **)&b->rows, rows * sizeof(lsc_row_cache));
}

void lsc_block_free(lsc_block *b) {
    void *bufs[] = {b->h, b->xb, b->qkv, b->att, b->g, b->rope, b->rows};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]) cudaFree(bufs[i]);
    memset(b, 0, sizeof *b);
}

extern "C" int64_t ls_session_cache_bytes(const ls_model *m, const ls_session_params *params) {
    if (!params || ls_check_session_args(m, params->max_seq, params->loops, params->cache_window, NULL, 0) != LS_OK ||
        params->kv_mode != LS_KV_FP16 || params->cache_steps != 0)
        return LS_ERR_ARG;
    int32_t cap = ls_ring_rows(params->max_seq, params->cache_window, LS_CHUNK);
    size_t half = ls_bytes_of((size_t)params->loops, (size_t)m->info.n_kv_heads, (size_t)cap, (size_t)m->info.head_dim,
                              sizeof(__half));
    return half > 0 ? 2 * (int64_t)half : LS_ERR_NOMEM;
}

/* The device cache is allocated whole when the session is made (growing it
 * would need a device-side copy per step boundary): it holds what
 * ls_session_cache_bytes says from the start. */
extern "C" int64_t ls_session_cache_bytes_held(const ls_session *s) {
    if (!s) return LS_ERR_ARG;
    size_t half = ls_bytes_of((size_t)s->units, (size_t)s->m->info.n_kv_heads, (size_t)s->cap,
                              (size_t)s->m->info.head_dim, sizeof(__half));
    return 2 * (int64_t)half;
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
    size_t cache_bytes = ls_bytes_of((size_t)loops, (size_t)mi->n_kv_heads, (size_t)s->cap, hd, sizeof(__half));

    s->tokens = (int32_t *)calloc((size_t)max_seq, sizeof(int32_t));
    s->unit_len = (int32_t *)calloc((size_t)loops, sizeof(int32_t));
    s->unit_lo = (int32_t *)calloc((size_t)loops, sizeof(int32_t));
    s->rope_host = (float *)calloc(C * hd, sizeof(float));
    s->logits_host = (float *)calloc(vocab, sizeof(float));
    bool host_ok = s->tokens && s->unit_len && s->unit_lo && s->rope_host && s->logits_host;
    bool dev_ok = host_ok && lsc_dev_alloc((void **)&s->kc, cache_bytes) &&
                  lsc_dev_alloc((void **)&s->vc, cache_bytes) &&
                  lsc_dev_alloc((void **)&s->d_tokens, (size_t)max_seq * sizeof(int32_t)) &&
                  lsc_block_alloc(&s->act, mi, C) && lsc_dev_alloc((void **)&s->logits, C * vocab * sizeof(float)) &&
                  lsc_dev_alloc((void **)&s->penalized, vocab * sizeof(float)) &&
                  lsc_dev_alloc((void **)&s->result, sizeof(int32_t));
    if (!dev_ok) {
        if (!host_ok)
            ls_set_error(err, err_len, "out of memory allocating a session (max_seq %d, loops %d)", max_seq, loops);
        else
            ls_set_error(err, err_len,
                         "out of GPU memory allocating a session (max_seq %d, loops %d, window %d: %zu bytes of "
                         "K/V cache): %s",
                         max_seq, loops, cache_window, 2 * cache_bytes, cudaGetErrorString(cudaGetLastError()));
        ls_session_free(s);
        return NULL;
    }
    return s;
}

extern "C" void ls_session_free(ls_session *s) {
    if (!s) return;
    void *dev[] = {s->kc, s->vc, s->d_tokens, s->logits, s->penalized, s->result};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
        if (dev[i]) cudaFree(dev[i]);
    lsc_block_free(&s->act);
    void *host[] = {s->tokens, s->unit_len, s->unit_lo, s->rope_host, s->logits_host, s};
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
 * then the rows copied on the device. */
extern "C" int32_t ls_session_copy_prefix(ls_session *dst, const ls_session *src, int32_t n) {
    if (!dst || !src || dst == src) return LS_ERR_ARG;
    int32_t rc = ls_check_copy_prefix(ls_session_view(dst), ls_session_view(src), n);
    if (rc != LS_OK) return rc;
    if (dst->failed || src->failed) return LS_ERR_STATE;
    const ls_model_info *mi = &dst->m->info;
    int32_t hd = mi->head_dim, n_kv = mi->n_kv_heads;
    ls_session *s = dst; /* TRY marks the destination failed */
    size_t src_loop = (size_t)n_kv * src->cap * hd, dst_loop = (size_t)n_kv * dst->cap * hd;
    for (int32_t l = 0; l < dst->units; l++) {
        int32_t lo = ls_prefix_lo(src->unit_lo[l], n, dst->cap);
        TRY("copying keys", lsc_copy_rows(dst->kc + l * dst_loop, dst->cap, src->kc + l * src_loop, src->cap, n_kv,
                                          hd, lo, n));
        TRY("copying values", lsc_copy_rows(dst->vc + l * dst_loop, dst->cap, src->vc + l * src_loop, src->cap,
                                            n_kv, hd, lo, n));
        dst->unit_len[l] = n;
        dst->unit_lo[l] = lo;
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

cudaError_t lsc_block_unit(const ls_model *m, const lsc_block *b, int32_t T, int32_t unit, const char **what) {
    const ls_model_info *mi = &m->info;
    const ls_runtime *rt = m->rt;
    int32_t dim = mi->dim, hd = mi->head_dim, n_heads = mi->n_heads, n_kv = mi->n_kv_heads;
    int32_t kv_dim = n_kv * hd, ffn = mi->ffn_dim;
    float eps = mi->norm_eps;
    int32_t ld = dim + 2 * kv_dim; // a row of qkv
    // attention sub-block
    STEP("rmsnorm", lsc_rmsnorm(b->xb, b->h, rt->attn_norm, T, dim, eps));
    STEP("wqkv", lsc_matmul(b->qkv, ld, b->xb, dim, rt->wqkv, dim, ld, T, 0));
    STEP("rope and kv store", lsc_rope_store(b->qkv, ld, n_heads, n_kv, hd, b->rope, b->rows, unit, T));
    STEP("attention", lsc_attention(b->att, b->qkv, ld, b->rows, unit, n_heads, n_kv, hd, T));
    STEP("wo", lsc_matmul(b->h, dim, b->att, dim, rt->wo, dim, dim, T, 1));
    // feed-forward sub-block
    STEP("rmsnorm", lsc_rmsnorm(b->xb, b->h, rt->ffn_norm, T, dim, eps));
    STEP("w1 w3 swiglu", lsc_matmul_swiglu(b->g, ffn, b->xb, dim, rt->w1, rt->w3, dim, ffn, T));
    STEP("w2", lsc_matmul(b->h, dim, b->g, ffn, rt->w2, ffn, dim, T, 1));
    return cudaSuccess;
}

void lsc_session_rows(lsc_row_cache *rows, const ls_session *s, int32_t pos0, int32_t n) {
    const ls_model_info *mi = &s->m->info;
    int64_t loop_stride = (int64_t)mi->n_kv_heads * s->cap * mi->head_dim;
    for (int32_t t = 0; t < n; t++) rows[t] = lsc_row_cache{s->kc, s->vc, loop_stride, s->cap, s->window, pos0 + t, 0};
}

/* One chunk (T <= LS_CHUNK) at positions pos0.. through units [0, loops):
 * s->act.h holds the embeddings on entry and the last loop's output on return. */
static int32_t forward_chunk(ls_session *s, int32_t T, int32_t pos0, int32_t loops) {
    const ls_model_info *mi = &s->m->info;
    lsc_row_cache rows[LS_CHUNK];
    lsc_session_rows(rows, s, pos0, T);
    ls_rope_table(s->rope_host, T, pos0, mi->head_dim, mi->rope_theta);
    TRY("copying the RoPE table", cudaMemcpy(s->act.rope, s->rope_host, (size_t)T * mi->head_dim * sizeof(float),
                                             cudaMemcpyHostToDevice));
    TRY("copying the row caches", cudaMemcpy(s->act.rows, rows, (size_t)T * sizeof *rows, cudaMemcpyHostToDevice));
    for (int32_t l = 0; l < loops; l++) {
        const char *what = "";
        cudaError_t e = lsc_block_unit(s->m, &s->act, T, l, &what);
        if (e != cudaSuccess) return fail(s, what, e);
        ls_seq_advance(s->unit_len, s->unit_lo, l, pos0 + T, s->cap);
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
    TRY("copying the tokens", cudaMemcpy(s->d_tokens + s->pos, tokens, (size_t)n * sizeof(int32_t),
                                         cudaMemcpyHostToDevice));
    int32_t first_logit = n - n_logits;
    for (int32_t c0 = 0; c0 < n; c0 += LS_CHUNK) {
        int32_t T = n - c0 < LS_CHUNK ? n - c0 : LS_CHUNK;
        TRY("embedding", lsc_embed(s->act.h, rt->tok_embeddings, s->d_tokens + s->pos, T, dim));
        int32_t rc = forward_chunk(s, T, s->pos, loops);
        if (rc != LS_OK) return rc;
        memcpy(s->tokens + s->pos, tokens + c0, (size_t)T * sizeof *tokens);
        s->pos += T;
        int32_t lo = first_logit > c0 ? first_logit : c0;
        if (lo < c0 + T) {
            int32_t rows = c0 + T - lo;
            TRY("rmsnorm", lsc_rmsnorm(s->act.xb, s->act.h + (size_t)(lo - c0) * dim, rt->norm, rows, dim, mi->norm_eps));
            TRY("output", lsc_matmul(s->logits, vocab, s->act.xb, dim, rt->output, dim, vocab, rows, 0));
            if (host)
                TRY("copying the logits", cudaMemcpy(host + (size_t)(lo - first_logit) * vocab, s->logits,
                                                     (size_t)rows * vocab * sizeof(float), cudaMemcpyDeviceToHost));
        }
    }
    // Surfaces an asynchronous kernel failure before the caller trusts the state.
    TRY("synchronising", cudaDeviceSynchronize());
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
    if (!s || !p || p->exit_threshold != 0.0f) return LS_ERR_ARG; /* no exit gate: stacks are CPU-only */
    /* Check the sampling arguments before the forward pass mutates the
     * session, as session.c does. */
    if (!ls_sampling_ok(&p->sampling)) return LS_ERR_ARG;
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
