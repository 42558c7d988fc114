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
 * q, k and v; prefix names the layer in messages ("layers.3."). */
static int upload_qkv(__half **dst, const ls_layer_weights *w, size_t dim, size_t kv_dim, const char *prefix, char *err,
                      int32_t err_len) {
    size_t n[3] = {dim * dim, kv_dim * dim, kv_dim * dim};
    const uint16_t *parts[3] = {w->wq, w->wk, w->wv};
    const char *names[3] = {"wq", "wk", "wv"};
    cudaError_t e = cudaMalloc((void **)dst, (n[0] + n[1] + n[2]) * sizeof(uint16_t));
    if (e != cudaSuccess) {
        *dst = NULL;
        ls_set_error(err, err_len, "cannot allocate GPU memory for the attention projections of %s: %s", prefix,
                     cudaGetErrorString(e));
        return -1;
    }
    for (size_t i = 0, at = 0; i < 3; at += n[i], i++) {
        e = cudaMemcpy(*dst + at, parts[i], n[i] * sizeof(uint16_t), cudaMemcpyHostToDevice);
        if (e != cudaSuccess) {
            ls_set_error(err, err_len, "cannot copy %s%s.weight to the GPU: %s", prefix, names[i], cudaGetErrorString(e));
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
 * is the file's ("layers.3.wq", "output"). */
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

/* A layer's seven quantized matrices (their formats may differ: an int2
 * model's int4 wv, say); prefix names the layer ("layers.3."). */
static int upload_qblock(lsc_qblock *dst, const ls_layer_weights *lw, const char *prefix, char *err, int32_t err_len) {
    lsq_matrix *to[7] = {&dst->wq, &dst->wk, &dst->wv, &dst->wo, &dst->w1, &dst->w2, &dst->w3};
    const ls_qmat *from[7] = {lw->qwq, lw->qwk, lw->qwv, lw->qwo, lw->qw1, lw->qw2, lw->qw3};
    const char *names[7] = {"wq", "wk", "wv", "wo", "w1", "w2", "w3"};
    char name[48];
    for (int i = 0; i < 7; i++) {
        snprintf(name, sizeof name, "%s%s", prefix, names[i]);
        if (upload_quantized(to[i], from[i], name, err, err_len) != 0) return -1;
    }
    return 0;
}

/* One layer's weights: its norms, and its matrices as stored. */
static int upload_layer(lsc_layer *dst, const ls_layer_weights *lw, const ls_model_info *mi, int32_t i, char *err,
                        int32_t err_len) {
    char prefix[32], what[64];
    if (mi->n_layers == 1) snprintf(prefix, sizeof prefix, "block.");
    else snprintf(prefix, sizeof prefix, "layers.%d.", i);
    const uint16_t *norms[4] = {lw->attn_norm, lw->ffn_norm, lw->attn_out_norm, lw->ffn_out_norm};
    float **to[4] = {&dst->attn_norm, &dst->ffn_norm, &dst->attn_out_norm, &dst->ffn_out_norm};
    const char *names[4] = {"attn_norm", "ffn_norm", "attn_out_norm", "ffn_out_norm"};
    for (int k = 0; k < 4; k++) {
        if (!norms[k]) continue; /* the sandwich norms of a model without them */
        snprintf(what, sizeof what, "%s%s.weight", prefix, names[k]);
        if (upload_norm(to[k], norms[k], mi->dim, what, err, err_len) != 0) return -1;
    }
    if (mi->quant != LS_QUANT_FP16) return upload_qblock(&dst->q, lw, prefix, err, err_len);
    size_t dim = (size_t)mi->dim, kv_dim = (size_t)mi->n_kv_heads * mi->head_dim, ffn = (size_t)mi->ffn_dim;
    if (upload_qkv(&dst->wqkv, lw, dim, kv_dim, prefix, err, err_len) != 0) return -1;
    const uint16_t *mats[4] = {lw->wo, lw->w1, lw->w2, lw->w3};
    __half **mto[4] = {&dst->wo, &dst->w1, &dst->w2, &dst->w3};
    const char *mnames[4] = {"wo", "w1", "w2", "w3"};
    const size_t sizes[4] = {dim * dim, ffn * dim, dim * ffn, ffn * dim};
    for (int k = 0; k < 4; k++) {
        snprintf(what, sizeof what, "%s%s.weight", prefix, mnames[k]);
        if (upload_f16(mto[k], mats[k], sizes[k], what, err, err_len) != 0) return -1;
    }
    return 0;
}

int lsc_layer_buffers(lsc_layer *l, const ls_model_info *mi, void **slots[LSC_LAYER_BUFFERS],
                      size_t bytes[LSC_LAYER_BUFFERS]) {
    const size_t dim = (size_t)mi->dim, kv_dim = (size_t)mi->n_kv_heads * mi->head_dim, ffn = (size_t)mi->ffn_dim;
    int n = 0;
    auto add = [&](void **slot, size_t b) {
        if (!*slot) return;
        slots[n] = slot;
        bytes[n++] = b;
    };
    float **norms[4] = {&l->attn_norm, &l->ffn_norm, &l->attn_out_norm, &l->ffn_out_norm};
    for (float **p : norms) add((void **)p, dim * sizeof(float));
    const size_t h = sizeof(__half);
    add((void **)&l->wqkv, (dim + 2 * kv_dim) * dim * h);
    add((void **)&l->wo, dim * dim * h);
    add((void **)&l->w1, ffn * dim * h);
    add((void **)&l->w2, dim * ffn * h);
    add((void **)&l->w3, ffn * dim * h);
    lsq_matrix *mats[7] = {&l->q.wq, &l->q.wk, &l->q.wv, &l->q.wo, &l->q.w1, &l->q.w2, &l->q.w3};
    for (lsq_matrix *q : mats) {
        const size_t groups = (size_t)q->rows * (size_t)(q->group ? q->in / q->group : 0) * sizeof(uint16_t);
        add((void **)&q->qweight, (size_t)q->rows * (size_t)(q->qweight ? lsq_row_bytes(q->in, q->bits) : 0));
        add((void **)&q->scales, groups);
        add((void **)&q->zeros, groups);
    }
    return n;
}

/* A layer's buffers: its arena, or each of its own. */
static void free_layer(lsc_layer *l, const ls_model_info *mi) {
    if (l->arena) {
        cudaFree(l->arena);
        return;
    }
    void **slots[LSC_LAYER_BUFFERS];
    size_t bytes[LSC_LAYER_BUFFERS];
    for (int i = 0, n = lsc_layer_buffers(l, mi, slots, bytes); i < n; i++) cudaFree(*slots[i]);
}

/* The exit gate's weights then its bias, fp32 (the CPU library's layout). */
static int upload_gate(float **dst, const ls_weights *w, int32_t dim, char *err, int32_t err_len) {
    float *tmp = (float *)malloc(((size_t)dim + 1) * sizeof(float));
    if (!tmp) {
        ls_set_error(err, err_len, "out of memory converting the exit gate");
        return -1;
    }
    for (int32_t i = 0; i < dim; i++) tmp[i] = ls_f16_to_f32(w->exit_w[i]);
    tmp[dim] = ls_f16_to_f32(w->exit_b[0]);
    int rc = upload((void **)dst, tmp, ((size_t)dim + 1) * sizeof(float), "exit_gate", err, err_len);
    free(tmp);
    return rc;
}

/* What the model needs that the kernels in use cannot serve, named, or
 * NULL: the reason for a refusal at load. */
static const char *unserved(const ls_model_info *mi, int32_t kernels, char *buf, size_t len) {
    static const char *const AWAIT = "not served by the CUDA kernels by default yet (their kernels await a passing "
                                     "validation run on a GPU, bench/gpu/validate.sh)";
    /* Recurrent depth first: its stacks pass the stacks family's check below,
     * yet none of its parts has a CUDA kernel. */
    if (mi->n_prelude || mi->n_coda || mi->injection || mi->mid_norm || mi->rope_interleaved || mi->qk_bias ||
        mi->sandwich_norm == LS_NORM_SANDWICH_SUM || mi->embed_scale != 1.0f || mi->n_heads * mi->head_dim != mi->dim) {
        snprintf(buf, len,
                 "a recurrent-depth model (Huginn's prelude, coda, input injection and summed sandwich norms; q/k "
                 "biases, interleaved RoPE, an embedding scale, a norm between loops or head_dim %d x %d heads other "
                 "than dim %d: Nanbeige4.2's) is not supported by the CUDA kernels yet: serve it with the CPU library",
                 mi->head_dim, mi->n_heads, mi->dim);
        return buf;
    }
    const int stacked = mi->n_layers != 1 || mi->sandwich_norm || mi->step_norm || mi->exit_gate;
    if (stacked && !(kernels & LS_CUDA_KERNELS_STACKS)) {
        snprintf(buf, len, "a stacked model (%d layers%s%s%s): %s: serve it with the CPU library", mi->n_layers,
                 mi->sandwich_norm ? ", sandwich norms" : "", mi->step_norm ? ", a norm per step" : "",
                 mi->exit_gate ? ", an exit gate" : "", AWAIT);
        return buf;
    }
    if ((mi->quant != LS_QUANT_FP16 || mi->head_bits != 0) && !(kernels & LS_CUDA_KERNELS_QUANT)) {
        char head[40] = "";
        if (mi->head_bits) snprintf(head, sizeof head, "%san int%d output head", mi->quant ? " with " : "", mi->head_bits);
        snprintf(buf, len, "%s%s: %s: serve this model with the CPU library",
                 mi->quant == LS_QUANT_INT4 ? "int4 weights" : mi->quant == LS_QUANT_INT2 ? "int2 weights" : "", head,
                 AWAIT);
        return buf;
    }
    return NULL;
}

extern "C" int32_t ls_runtime_init(ls_model *m, int32_t n_threads, int32_t simd, char *err, int32_t err_len) {
    (void)n_threads; // one host thread drives the GPU
    (void)simd;      // a CPU notion; model.c has already checked its range
    ls_model_info *mi = &m->info;
    char why[400];
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
    if (rt) rt->layers = (lsc_layer *)calloc((size_t)mi->n_layers, sizeof *rt->layers);
    if (!rt || !rt->layers) {
        free(rt);
        ls_set_error(err, err_len, "out of memory allocating the runtime");
        return LS_ERR_NOMEM;
    }
    m->rt = rt;
    rt->device = 0;
    rt->quantized = mi->quant != LS_QUANT_FP16;
    size_t dim = (size_t)mi->dim, vocab = (size_t)mi->vocab_size;
    const ls_weights *w = &m->w;
    int bad = upload_norm(&rt->norm, w->norm, mi->dim, "norm.weight", err, err_len);
    if (!bad && w->exit_w) bad = upload_gate(&rt->exit_gate, w, mi->dim, err, err_len);
    if (!bad && w->tok_embeddings) /* else the quantized head's rows are the embedding */
        bad = upload_f16(&rt->tok_embeddings, w->tok_embeddings, vocab * dim, "tok_embeddings.weight", err, err_len);
    for (int32_t i = 0; i < mi->n_layers && !bad; i++) bad = upload_layer(&rt->layers[i], &w->layers[i], mi, i, err, err_len);
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
    if (lsc_kernels_on() & LS_CUDA_KERNELS_RESIDENT) lsc_resident_init(m);
    mi->simd = LS_SIMD_CUDA;
    mi->n_threads = 1;
    return LS_OK;
}

extern "C" void ls_runtime_free(ls_model *m) {
    if (!m || !m->rt) return;
    ls_runtime *rt = m->rt;
    lsc_batch_free(rt->batch);
    if (rt->output && rt->output != rt->tok_embeddings) cudaFree(rt->output);
    void *bufs[] = {rt->tok_embeddings, rt->norm, rt->exit_gate};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]) cudaFree(bufs[i]);
    lsc_resident_free(rt);
    for (int32_t i = 0; i < m->info.n_layers; i++) free_layer(&rt->layers[i], &m->info);
    free(rt->layers);
    if (rt->qhead) {
        free_quantized(rt->qhead);
        free(rt->qhead);
    }
    free(rt);
    m->rt = NULL;
}
