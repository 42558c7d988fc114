/*
 * weights.cu — libloopserve_cuda.so's runtime: the model's weights copied
 * to the device once, as stored (ls_runtime_init / ls_runtime_free, which
 * the shared loader model.c calls), after refusing by name what these
 * kernels cannot serve, or serve only with a kernel family that has not
 * yet passed a validation run on a GPU (loopserve_cuda.h).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_internal.h"

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

/* A quantized matrix's codes, scales and (int2) offsets on the device; name
 * is the file's ("block.wq", "output"). */
static int upload_quantized(lsq_matrix *dst, const ls_qmat *src, const char *name, char *err, int32_t err_len) {
    char what[64];
    const size_t groups = (size_t)src->rows * (size_t)(src->in / src->group) * sizeof(uint16_t);
    void *q = NULL, *s = NULL, *z = NULL;
    snprintf(what, sizeof what, "%s.qweight", name);
    int bad = upload(&q, src->qweight, (size_t)src->rows * (size_t)lsq_row_bytes(src->in, src->bits), what, err, err_len);
    snprintf(what, sizeof what, "%s.scales", name);
    bad = bad || upload(&s, src->scales, groups, what, err, err_len);
    snprintf(what, sizeof what, "%s.zeros", name);
    bad = bad || (src->zeros && upload(&z, src->zeros, groups, what, err, err_len));
    *dst = lsq_matrix{(const uint8_t *)q, (const uint16_t *)s, (const uint16_t *)z, src->rows, src->in, src->group, src->bits};
    return bad ? -1 : 0;
}

static void free_quantized(lsq_matrix *w) {
    const void *bufs[] = {w->qweight, w->scales, w->zeros};
    for (const void *p : bufs)
        if (p) cudaFree(const_cast<void *>(p));
}

/* The block's seven quantized matrices (their formats may differ: an int2 model's int4 wv, say). */
static int upload_qblock(lsc_qblock *dst, const ls_layer_weights *lw, char *err, int32_t err_len) {
    lsq_matrix *to[7] = {&dst->wq, &dst->wk, &dst->wv, &dst->wo, &dst->w1, &dst->w2, &dst->w3};
    const ls_qmat *from[7] = {lw->qwq, lw->qwk, lw->qwv, lw->qwo, lw->qw1, lw->qw2, lw->qw3};
    const char *names[7] = {"block.wq", "block.wk", "block.wv", "block.wo", "block.w1", "block.w2", "block.w3"};
    for (int i = 0; i < 7; i++)
        if (upload_quantized(to[i], from[i], names[i], err, err_len) != 0) return -1;
    return 0;
}

/* What the model needs that the kernels in use cannot serve, named, or
 * NULL: the reason for a refusal at load. */
static const char *unserved(const ls_model_info *mi, int32_t kernels, char *buf, size_t len) {
    if (mi->n_layers != 1 || mi->sandwich_norm || mi->step_norm || mi->exit_gate) {
        snprintf(buf, len,
                 "a stacked model (%d layers%s%s%s) is not supported by the CUDA kernels yet: serve it with the CPU "
                 "library",
                 mi->n_layers, mi->sandwich_norm ? ", sandwich norms" : "", mi->step_norm ? ", a norm per step" : "",
                 mi->exit_gate ? ", an exit gate" : "");
        return buf;
    }
    if (mi->n_prelude || mi->n_coda || mi->injection || mi->mid_norm || mi->rope_interleaved || mi->qk_bias ||
        mi->embed_scale != 1.0f || mi->n_heads * mi->head_dim != mi->dim) {
        snprintf(buf, len,
                 "a recurrent-depth model (Huginn's prelude, coda and input injection; q/k biases, interleaved RoPE, "
                 "an embedding scale or head_dim %d x %d heads other than dim %d: Nanbeige4.2's) is not supported by "
                 "the CUDA kernels yet: serve it with the CPU library",
                 mi->head_dim, mi->n_heads, mi->dim);
        return buf;
    }
    if ((mi->quant != LS_QUANT_FP16 || mi->head_bits != 0) && !(kernels & LS_CUDA_KERNELS_QUANT)) {
        char head[40] = "";
        if (mi->head_bits) snprintf(head, sizeof head, "%san int%d output head", mi->quant ? " with " : "", mi->head_bits);
        snprintf(buf, len,
                 "%s%s: not served by the CUDA kernels by default yet (their kernels await a passing validation run "
                 "on a GPU, bench/gpu/validate.sh): serve this model with the CPU library",
                 mi->quant == LS_QUANT_INT4 ? "int4 weights" : mi->quant == LS_QUANT_INT2 ? "int2 weights" : "", head);
        return buf;
    }
    return NULL;
}

extern "C" int32_t ls_runtime_init(ls_model *m, int32_t n_threads, int32_t simd, char *err, int32_t err_len) {
    (void)n_threads; // one host thread drives the GPU
    (void)simd;      // a CPU notion; model.c has already checked its range
    ls_model_info *mi = &m->info;
    char why[320];
    if (unserved(mi, lsc_kernels_on(), why, sizeof why)) {
        ls_set_error(err, err_len, "%s", why);
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
    int bad = upload_norm(&rt->attn_norm, lw->attn_norm, mi->dim, "block.attn_norm.weight", err, err_len) ||
              upload_norm(&rt->ffn_norm, lw->ffn_norm, mi->dim, "block.ffn_norm.weight", err, err_len) ||
              upload_norm(&rt->norm, w->norm, mi->dim, "norm.weight", err, err_len);
    if (!bad && w->tok_embeddings) /* else the quantized head's rows are the embedding */
        bad = upload_f16(&rt->tok_embeddings, w->tok_embeddings, vocab * dim, "tok_embeddings.weight", err, err_len);
    if (!bad && mi->quant != LS_QUANT_FP16) {
        rt->qblock = (lsc_qblock *)calloc(1, sizeof *rt->qblock);
        bad = !rt->qblock || upload_qblock(rt->qblock, lw, err, err_len);
        if (!rt->qblock) ls_set_error(err, err_len, "out of memory allocating the runtime");
    } else if (!bad) {
        bad = upload_qkv(&rt->wqkv, lw, dim, kv_dim, err, err_len) ||
              upload_f16(&rt->wo, lw->wo, dim * dim, "block.wo.weight", err, err_len) ||
              upload_f16(&rt->w1, lw->w1, ffn * dim, "block.w1.weight", err, err_len) ||
              upload_f16(&rt->w2, lw->w2, dim * ffn, "block.w2.weight", err, err_len) ||
              upload_f16(&rt->w3, lw->w3, ffn * dim, "block.w3.weight", err, err_len);
    }
    if (!bad && w->qoutput) {
        rt->qhead = (lsq_matrix *)calloc(1, sizeof *rt->qhead);
        bad = !rt->qhead || upload_quantized(rt->qhead, w->qoutput, "output", err, err_len);
        if (!rt->qhead) ls_set_error(err, err_len, "out of memory allocating the runtime");
    } else if (!bad) {
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
    if (rt->qblock) {
        lsq_matrix *mats[7] = {&rt->qblock->wq, &rt->qblock->wk, &rt->qblock->wv, &rt->qblock->wo,
                               &rt->qblock->w1, &rt->qblock->w2, &rt->qblock->w3};
        for (lsq_matrix *q : mats) free_quantized(q);
        free(rt->qblock);
    }
    if (rt->qhead) {
        free_quantized(rt->qhead);
        free(rt->qhead);
    }
    free(rt);
    m->rt = NULL;
}
