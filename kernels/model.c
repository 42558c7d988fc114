/*
 * model.c — maps a model file and checks the caller's descriptor of it
 * (loopserve.h, "model descriptor").
 *
 * The file's format (safetensors header, metadata, tensor names, dtypes and
 * shapes) is validated by the caller, src/model/format.ts; what arrives here
 * is the model's dimensions and one byte range per tensor. None of it is
 * trusted: the dimensions are range-checked, each range is checked against
 * the dimensions and the mapped file before a single weight is read, and
 * every fp16 value is scanned for NaN and Inf (a pass over the mapped bytes
 * that only the mapping's owner can do cheaply). Weights are never copied:
 * ls_weights points into the read-only mapping.
 */
#define _DEFAULT_SOURCE /* mmap, fstat under -std=c11 */

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "internal.h"
#include "quant.h"
#include "sizes.h" /* LS_CHUNK: rows per matmul call, for the activation scratch */

static const char *const tensor_names[LS_TENSOR_N] = {
#define LS_TENSOR_NAME_(id, name) name,
    LS_TENSORS(LS_TENSOR_NAME_)
#undef LS_TENSOR_NAME_
};

static const char *const layer_tensor_names[LS_LAYER_TENSOR_N] = {
#define LS_LAYER_TENSOR_NAME_(id, name) name,
    LS_LAYER_TENSORS(LS_LAYER_TENSOR_NAME_)
#undef LS_LAYER_TENSOR_NAME_
};

/* A descriptor slot: model-wide (layer -1) or one layer's; named in messages
 * as the file names it. */
typedef struct {
    int32_t layer, slot;
} slot_id;

static const char *slot_name(const ls_model_info *in, slot_id id, char *buf, size_t len) {
    if (id.layer < 0) return tensor_names[id.slot];
    const int32_t L = in->n_layers, P = in->n_prelude;
    if (id.layer >= L + P && id.layer < L + P + in->n_coda)
        snprintf(buf, len, "coda.%d.%s", id.layer - L - P, layer_tensor_names[id.slot]);
    else if (id.layer >= L && id.layer < L + P) snprintf(buf, len, "prelude.%d.%s", id.layer - L, layer_tensor_names[id.slot]);
    else if (L == 1 && id.layer == 0) snprintf(buf, len, "block.%s", layer_tensor_names[id.slot]);
    else snprintf(buf, len, "layers.%d.%s", id.layer, layer_tensor_names[id.slot]);
    return buf;
}

/* Layers the descriptor describes: the core's, the prelude's, the coda's. */
static int32_t total_layers(const ls_model_info *in) { return in->n_layers + in->n_prelude + in->n_coda; }

static const char *dtype_name(int32_t dtype) {
    switch (dtype) {
    case LS_DTYPE_F16: return "F16";
    case LS_DTYPE_U8: return "U8";
    case LS_DTYPE_I8: return "I8";
    default: return "unknown";
    }
}

static const char *quant_name(int32_t quant) {
    return quant == LS_QUANT_INT4 ? "int4" : quant == LS_QUANT_INT2 ? "int2" : "fp16";
}

// ---- dimensions ----

static int check_range(const char *field, int32_t v, int32_t lo, int32_t hi, char *err, int32_t err_len) {
    if (v >= lo && v <= hi) return 0;
    ls_set_error(err, err_len, "model descriptor: %s %d is outside %d..%d", field, v, lo, hi);
    return -1;
}

// The dimensions every kernel relies on: ranges that keep sizes far from
// overflow, and the divisibility the head and group layouts need.
/* The settings ls_model_info reports as the config gives them (head_dim,
 * n_layers and embed_scale are reported with their defaults applied). */
#define LS_CONFIG_AS_GIVEN(X)                                                                                       \
    X(dim) X(n_heads) X(n_kv_heads) X(ffn_dim) X(vocab_size) X(default_loops) X(max_seq_len) X(rope_theta)           \
    X(norm_eps) X(quant) X(group_size) X(head_bits) X(head_group) X(sandwich_norm) X(step_norm) X(n_prelude)         \
    X(n_coda) X(injection) X(state_std) X(mid_norm) X(rope_interleaved) X(qk_bias)

static int check_config(const ls_model_config *c, ls_model_info *info, char *err, int32_t err_len) {
    if (check_range("dim", c->dim, 1, LS_MAX_DIM, err, err_len) != 0 ||
        check_range("n_heads", c->n_heads, 1, LS_MAX_HEADS, err, err_len) != 0 ||
        check_range("n_kv_heads", c->n_kv_heads, 1, LS_MAX_HEADS, err, err_len) != 0 ||
        check_range("ffn_dim", c->ffn_dim, 1, LS_MAX_FFN_DIM, err, err_len) != 0 ||
        check_range("vocab_size", c->vocab_size, 1, LS_MAX_VOCAB, err, err_len) != 0 ||
        check_range("default_loops", c->default_loops, 1, LS_MAX_LOOPS, err, err_len) != 0 ||
        check_range("max_seq_len", c->max_seq_len, 1, LS_MAX_SEQ_LEN, err, err_len) != 0)
        return -1;
    // Written so that NaN fails too.
    if (!(c->rope_theta > 0.0f && c->rope_theta < LS_MAX_ROPE_THETA) ||
        !(c->norm_eps > 0.0f && c->norm_eps < LS_MAX_NORM_EPS)) {
        ls_set_error(err, err_len, "model descriptor: rope_theta %g or norm_eps %g out of range", (double)c->rope_theta,
                     (double)c->norm_eps);
        return -1;
    }
    if (c->quant != LS_QUANT_FP16 && c->quant != LS_QUANT_INT4 && c->quant != LS_QUANT_INT2) {
        ls_set_error(err, err_len, "model descriptor: quant %d is not one of LS_QUANT_FP16/INT4/INT2", c->quant);
        return -1;
    }
    if (c->quant == LS_QUANT_FP16 ? c->group_size != 0 : !ls_quant_group_ok(c->group_size)) {
        ls_set_error(err, err_len, "model descriptor: group_size %d does not suit quant %s", c->group_size,
                     quant_name(c->quant));
        return -1;
    }
    if (c->head_bits == 0 ? c->head_group != 0
                          : !ls_quant_format_ok(c->head_bits, 1, c->dim) || !ls_quant_group_ok(c->head_group) ||
                                c->dim % c->head_group != 0) {
        ls_set_error(err, err_len,
                     "model descriptor: head_bits %d with head_group %d (dim %d) is not a head format: bits 8, 6 "
                     "or 4 with a group dividing dim (int6: dim a multiple of 64), or 0 and 0",
                     c->head_bits, c->head_group, c->dim);
        return -1;
    }
    int bits_ok = c->block_bits[4] == c->block_bits[6]; /* w1 and w3 run as one job */
    for (int k = 0; k < 7; k++) {
        const int32_t b = c->block_bits[k];
        bits_ok &= c->quant == LS_QUANT_FP16 ? b == 0 : b == 4 || b == 2;
    }
    if (!bits_ok) {
        ls_set_error(err, err_len,
                     "model descriptor: block_bits %d %d %d %d %d %d %d do not suit quant %s: 4 or 2 each, w1 and "
                     "w3 alike, in an int4 or int2 model; 0 in an fp16 model",
                     c->block_bits[0], c->block_bits[1], c->block_bits[2], c->block_bits[3], c->block_bits[4],
                     c->block_bits[5], c->block_bits[6], quant_name(c->quant));
        return -1;
    }
    const int32_t n_layers = c->n_layers == 0 ? 1 : c->n_layers;
    if (check_range("n_layers", n_layers, 1, LS_MAX_LAYERS, err, err_len) != 0 ||
        check_range("sandwich_norm", c->sandwich_norm, LS_NORM_PRE, LS_NORM_SANDWICH_SUM, err, err_len) != 0 ||
        check_range("step_norm", c->step_norm, 0, 1, err, err_len) != 0 ||
        check_range("n_prelude", c->n_prelude, 0, LS_MAX_LAYERS, err, err_len) != 0 ||
        check_range("n_coda", c->n_coda, 0, LS_MAX_LAYERS, err, err_len) != 0 ||
        check_range("n_layers + n_prelude + n_coda", n_layers + c->n_prelude + c->n_coda, 1, LS_MAX_LAYERS, err,
                    err_len) != 0 ||
        check_range("injection", c->injection, LS_INJECT_NONE, LS_INJECT_ADAPTER, err, err_len) != 0 ||
        check_range("mid_norm", c->mid_norm, 0, 1, err, err_len) != 0 ||
        check_range("rope_interleaved", c->rope_interleaved, 0, 1, err, err_len) != 0 ||
        check_range("qk_bias", c->qk_bias, 0, 1, err, err_len) != 0 ||
        check_range("head_dim", c->head_dim, 0, LS_MAX_DIM, err, err_len) != 0)
        return -1;
    // Written so that NaN fails too; 0 reads as the default.
    const float embed_scale = c->embed_scale == 0.0f ? 1.0f : c->embed_scale;
    if (!(embed_scale > 0.0f && embed_scale < 3.0e38f) || !(c->state_std >= 0.0f && c->state_std < 3.0e38f) ||
        (c->state_std != 0.0f && c->injection != LS_INJECT_ADAPTER) || (c->mid_norm && c->n_coda == 0)) {
        ls_set_error(err, err_len,
                     "model descriptor: embed_scale %g must be finite and > 0, state_std %g finite and >= 0 (and "
                     "0 without LS_INJECT_ADAPTER), mid_norm %d only with a coda",
                     (double)c->embed_scale, (double)c->state_std, c->mid_norm);
        return -1;
    }
    int32_t G = c->group_size;
    const int32_t head_dim = c->head_dim == 0 && c->dim % c->n_heads == 0 ? c->dim / c->n_heads : c->head_dim;
    const int64_t q_dim = (int64_t)c->n_heads * head_dim;
    if (head_dim == 0 || head_dim % 2 != 0 || q_dim > LS_MAX_DIM || c->n_heads % c->n_kv_heads != 0 ||
        (G > 0 && (c->dim % G != 0 || c->ffn_dim % G != 0 || q_dim % G != 0))) {
        ls_set_error(err, err_len,
                     "model descriptor: inconsistent dimensions (dim %d, n_heads %d, n_kv_heads %d, head_dim %d, "
                     "ffn_dim %d, group_size %d)",
                     c->dim, c->n_heads, c->n_kv_heads, c->head_dim, c->ffn_dim, G);
        return -1;
    }
    memset(info, 0, sizeof *info);
#define LS_COPY_(field) info->field = c->field;
    LS_CONFIG_AS_GIVEN(LS_COPY_)
#undef LS_COPY_
    memcpy(info->block_bits, c->block_bits, sizeof info->block_bits);
    info->head_dim = head_dim;
    info->n_layers = n_layers;
    info->embed_scale = embed_scale;
    return 0;
}

// ---- tensors ----

typedef enum { ABSENT, REQUIRED, OPTIONAL } presence;

/* What one descriptor slot must hold for the model's dimensions and format. */
typedef struct {
    presence need;
    int32_t dtype;
    uint64_t bytes;
    int64_t cols; /* F16: the last dimension, for the row and column of a NaN */
} slot_rule;

// The block's matrices in slot order (wq wk wv wo w1 w2 w3): [rows, inputs].
static void matrix_shape(const ls_model_info *in, int m, int64_t *rows, int64_t *cols) {
    const int64_t dim = in->dim, ffn = in->ffn_dim, q = (int64_t)in->n_heads * in->head_dim,
                  kv = (int64_t)in->n_kv_heads * in->head_dim;
    const int64_t r[7] = {q, kv, kv, dim, ffn, dim, ffn}, c[7] = {dim, dim, dim, q, dim, ffn, dim};
    *rows = r[m];
    *cols = c[m];
}

static slot_rule f16_rule(presence need, int64_t rows, int64_t cols) {
    return (slot_rule){need, LS_DTYPE_F16, (uint64_t)(rows * cols) * 2u, cols};
}

// dims are capped by check_config (<= 2^20 * 2^18 elements), so no product overflows.
static slot_rule rule_of(const ls_model_info *in, slot_id id) {
    const int64_t dim = in->dim, vocab = in->vocab_size, G = in->group_size, hb = in->head_bits;
    const int quantized = in->quant != LS_QUANT_FP16;
    const slot_rule absent = {ABSENT, LS_DTYPE_NONE, 0, 0};
    if (id.layer < 0) {
        switch (id.slot) {
        case LS_TENSOR_TOK_EMBEDDINGS: return f16_rule(hb ? OPTIONAL : REQUIRED, vocab, dim); /* absent: the quantized head's rows */
        case LS_TENSOR_NORM: return f16_rule(REQUIRED, 1, dim);
        case LS_TENSOR_OUTPUT_WEIGHT: return hb ? absent : f16_rule(OPTIONAL, vocab, dim);
        case LS_TENSOR_OUTPUT_QWEIGHT:
            return hb ? (slot_rule){REQUIRED, hb == 8 ? LS_DTYPE_I8 : LS_DTYPE_U8, (uint64_t)(vocab * dim * hb / 8), 0}
                      : absent;
        case LS_TENSOR_OUTPUT_SCALES: return hb ? f16_rule(REQUIRED, vocab, dim / in->head_group) : absent;
        case LS_TENSOR_EXIT_GATE_WEIGHT: return f16_rule(OPTIONAL, 1, dim); /* the pair: check_tensors */
        case LS_TENSOR_ADAPTER_WEIGHT: return in->injection == LS_INJECT_ADAPTER ? f16_rule(REQUIRED, dim, 2 * dim) : absent;
        default: return f16_rule(OPTIONAL, 1, 1);                            /* EXIT_GATE_BIAS */
        }
    }
    if (id.layer >= total_layers(in)) return absent;
    switch (id.slot) {
    case LS_LAYER_TENSOR_ATTN_NORM:
    case LS_LAYER_TENSOR_FFN_NORM: return f16_rule(REQUIRED, 1, dim);
    case LS_LAYER_TENSOR_ATTN_OUT_NORM:
    case LS_LAYER_TENSOR_FFN_OUT_NORM: return in->sandwich_norm ? f16_rule(REQUIRED, 1, dim) : absent;
    case LS_LAYER_TENSOR_WQ_BIAS: return in->qk_bias ? f16_rule(REQUIRED, 1, (int64_t)in->n_heads * in->head_dim) : absent;
    case LS_LAYER_TENSOR_WK_BIAS: return in->qk_bias ? f16_rule(REQUIRED, 1, (int64_t)in->n_kv_heads * in->head_dim) : absent;
    default: break;
    }
    const int k = (id.slot - LS_LAYER_TENSOR_WQ_WEIGHT) / 4, bits = in->block_bits[k];
    int64_t rows, cols;
    matrix_shape(in, k, &rows, &cols);
    switch ((id.slot - LS_LAYER_TENSOR_WQ_WEIGHT) % 4) {
    case 0: return quantized ? absent : f16_rule(REQUIRED, rows, cols);
    case 1: return quantized ? (slot_rule){REQUIRED, LS_DTYPE_U8, (uint64_t)(rows * cols * bits / 8), 0} : absent;
    case 2: return quantized ? f16_rule(REQUIRED, rows, cols / G) : absent;
    default: return bits == 2 ? f16_rule(REQUIRED, rows, cols / G) : absent;
    }
}

/* The span of a slot in the descriptor. */
static const ls_tensor_span *span_of(const ls_model_desc *d, slot_id id) {
    return id.layer < 0 ? &d->tensors[id.slot] : &d->layers[id.layer].t[id.slot];
}

/* Runs the statements after `id` once for every slot of the descriptor
 * (model-wide first, then each of the LS_MAX_LAYERS layers' slots), with
 * `id` naming the slot. */
#define FOR_EACH_SLOT(id, ...)                                                          \
    do {                                                                                \
        for (int32_t l_ = -1; l_ < LS_MAX_LAYERS; l_++)                                 \
            for (int32_t s_ = 0; s_ < (l_ < 0 ? LS_TENSOR_N : LS_LAYER_TENSOR_N); s_++) { \
                slot_id id = {l_, s_};                                                   \
                __VA_ARGS__                                                              \
            }                                                                            \
    } while (0)

typedef struct {
    slot_id id;
    uint64_t begin, end;
} span;

static int span_cmp(const void *a, const void *b) {
    const span *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return (x->end > y->end) - (x->end < y->end);
}

// One slot against its rule and the file: given when needed (and only
// then), of the right dtype and length, inside the file, aligned.
static int check_slot(const ls_model_info *in, const ls_tensor_span *sp, slot_id id, uint64_t size, char *err,
                      int32_t err_len) {
    char buf[64];
    const char *name = slot_name(in, id, buf, sizeof buf);
    slot_rule r = rule_of(in, id);
    if (sp->reserved != 0) {
        ls_set_error(err, err_len, "tensor '%s': reserved descriptor field is %d, expected 0", name, sp->reserved);
        return -1;
    }
    if (sp->dtype == LS_DTYPE_NONE) {
        if (r.need == REQUIRED) {
            ls_set_error(err, err_len, "tensor '%s' missing from the model descriptor (an %s model needs it)", name,
                         quant_name(in->quant));
            return -1;
        }
        if (sp->offset != 0 || sp->length != 0) {
            ls_set_error(err, err_len, "tensor '%s' is absent but has a byte range", name);
            return -1;
        }
        return 0;
    }
    if (r.need == ABSENT) {
        const int k = (id.slot - LS_LAYER_TENSOR_WQ_WEIGHT) / 4;
        if (id.layer >= total_layers(in))
            ls_set_error(err, err_len, "tensor '%s' given for layer %d of a %d-layer model", name, id.layer,
                         total_layers(in));
        else if (id.layer >= 0 && (id.slot == LS_LAYER_TENSOR_WQ_BIAS || id.slot == LS_LAYER_TENSOR_WK_BIAS))
            ls_set_error(err, err_len, "tensor '%s' does not belong in a model without q/k biases", name);
        else if (id.layer < 0 && id.slot == LS_TENSOR_ADAPTER_WEIGHT)
            ls_set_error(err, err_len, "tensor '%s' does not belong in a model without input injection", name);
        else if (id.layer >= 0 && id.slot >= LS_LAYER_TENSOR_WQ_WEIGHT)
            ls_set_error(err, err_len, "tensor '%s' does not belong in an %s model whose matrix is %s", name,
                         quant_name(in->quant), in->block_bits[k] ? (in->block_bits[k] == 4 ? "int4" : "int2") : "fp16");
        else if (id.layer >= 0)
            ls_set_error(err, err_len, "tensor '%s' does not belong in a model without sandwich norms", name);
        else
            ls_set_error(err, err_len, "tensor '%s' does not belong in an %s model with %s", name,
                         quant_name(in->quant),
                         in->head_bits ? "a quantized output head (head_bits > 0)" : "an F16 or tied output head");
        return -1;
    }
    if (sp->dtype != r.dtype) {
        ls_set_error(err, err_len, "tensor '%s': dtype %s (%d), expected %s", name, dtype_name(sp->dtype), sp->dtype,
                     dtype_name(r.dtype));
        return -1;
    }
    if (sp->length != r.bytes) {
        ls_set_error(err, err_len, "tensor '%s': %llu bytes, expected %llu", name, (unsigned long long)sp->length,
                     (unsigned long long)r.bytes);
        return -1;
    }
    if (sp->offset > size || sp->length > size - sp->offset) {
        ls_set_error(err, err_len, "tensor '%s': bytes [%llu, %llu) run past the end of the file (%llu bytes)", name,
                     (unsigned long long)sp->offset, (unsigned long long)(sp->offset + sp->length),
                     (unsigned long long)size);
        return -1;
    }
    if (r.dtype == LS_DTYPE_F16 && sp->offset % 2 != 0) {
        ls_set_error(err, err_len, "tensor '%s': data at file offset %llu is not 2-byte aligned for F16", name,
                     (unsigned long long)sp->offset);
        return -1;
    }
    return 0;
}

// Every slot, then overlaps: two tensors sharing bytes point at a corrupt
// or hand-edited file, better refused than half-trusted.
static int check_tensors(const ls_model_info *in, const ls_model_desc *d, uint64_t size, char *err,
                         int32_t err_len) {
    enum { MAX_SPANS = LS_TENSOR_N + LS_MAX_LAYERS * LS_LAYER_TENSOR_N };
    span *spans = malloc(MAX_SPANS * sizeof *spans);
    if (!spans) {
        ls_set_error(err, err_len, "out of memory checking the model descriptor");
        return -1;
    }
    int n = 0, rc = 0;
    FOR_EACH_SLOT(id, {
        const ls_tensor_span *sp = span_of(d, id);
        if (rc == 0 && check_slot(in, sp, id, size, err, err_len) != 0) rc = -1;
        if (rc == 0 && sp->dtype != LS_DTYPE_NONE) spans[n++] = (span){id, sp->offset, sp->offset + sp->length};
    });
    if (rc == 0 && (d->tensors[LS_TENSOR_EXIT_GATE_WEIGHT].dtype == LS_DTYPE_NONE) !=
                       (d->tensors[LS_TENSOR_EXIT_GATE_BIAS].dtype == LS_DTYPE_NONE)) {
        ls_set_error(err, err_len, "tensors 'exit_gate.weight' and 'exit_gate.bias' come together: one is missing");
        rc = -1;
    }
    if (rc == 0) qsort(spans, (size_t)n, sizeof spans[0], span_cmp);
    for (int i = 1; i < n && rc == 0; i++) {
        const span *a = &spans[i - 1], *c = &spans[i];
        if (c->begin < a->end) {
            char ba[64], bc[64];
            ls_set_error(err, err_len, "tensors '%s' [%llu, %llu) and '%s' [%llu, %llu) overlap",
                         slot_name(in, a->id, ba, sizeof ba), (unsigned long long)a->begin, (unsigned long long)a->end,
                         slot_name(in, c->id, bc, sizeof bc), (unsigned long long)c->begin, (unsigned long long)c->end);
            rc = -1;
        }
    }
    free(spans);
    return rc;
}

// Index of the first Inf or NaN among n fp16 values, or -1. An fp16 value is
// not finite when its exponent bits are all ones: (h & 0x7c00) + 0x0400 then
// carries into bit 15, so blocks are OR-reduced without a branch (the
// compiler vectorizes the block loop) and only a block with a hit is searched.
static int64_t first_nonfinite_f16(const uint16_t *p, uint64_t n) {
    enum { BLOCK = 256 };
    uint64_t i = 0;
    for (; i + BLOCK <= n; i += BLOCK) {
        uint16_t acc = 0;
        for (int j = 0; j < BLOCK; j++) acc |= (uint16_t)((p[i + j] & 0x7c00) + 0x0400);
        if (acc & 0x8000) break;
    }
    for (; i < n; i++)
        if ((p[i] & 0x7c00) == 0x7c00) return (int64_t)i;
    return -1;
}

// Weights that are Inf or NaN make every logit NaN: the model would load,
// report healthy and fail every request. Every F16 tensor of the model
// (fp16 weights, norms, quantization scales and offsets) is scanned once;
// the message names the tensor and where in it.
static int check_finite(const ls_model_info *in, const ls_model_desc *d, const uint8_t *map, char *err,
                        int32_t err_len) {
    int rc = 0;
    FOR_EACH_SLOT(id, {
        const ls_tensor_span *sp = span_of(d, id);
        if (rc != 0 || sp->dtype != LS_DTYPE_F16) continue;
        const uint16_t *p = (const uint16_t *)(const void *)(map + sp->offset);
        int64_t at = first_nonfinite_f16(p, sp->length / 2);
        if (at < 0) continue;
        int64_t cols = rule_of(in, id).cols;
        uint16_t h = p[at];
        const char *what = (h & 0x03ff) ? "NaN" : (h & 0x8000) ? "-Inf" : "+Inf";
        char buf[64];
        ls_set_error(err, err_len,
                     "tensor '%s' holds a non-finite value (%s) at element %lld (row %lld, column %lld): "
                     "the weights are corrupt",
                     slot_name(in, id, buf, sizeof buf), what, (long long)at, (long long)(at / cols),
                     (long long)(at % cols));
        rc = -1;
    });
    return rc;
}

// ---- weights ----

static const void *tensor_at(const ls_tensor_span *sp, const uint8_t *map) {
    return sp->dtype == LS_DTYPE_NONE ? NULL : map + sp->offset;
}

// Points the model's weights into the map (every slot already checked);
// the layers and the quantized matrices' records are allocated here.
static int wire_weights(ls_model *m, const ls_model_desc *d, const uint8_t *map, char *err, int32_t err_len) {
    const ls_model_info *in = &m->info;
    const int32_t L = total_layers(in);
    ls_weights *w = &m->w;
    w->layers = calloc((size_t)L, sizeof *w->layers);
    m->n_qmats = 7 * L + 1;
    m->qmats = calloc((size_t)m->n_qmats, sizeof *m->qmats);
    if (!w->layers || !m->qmats) {
        ls_set_error(err, err_len, "out of memory wiring the weights of %d layers", L);
        return -1;
    }
    const ls_tensor_span *t = d->tensors;
    w->tok_embeddings = tensor_at(&t[LS_TENSOR_TOK_EMBEDDINGS], map);
    w->norm = tensor_at(&t[LS_TENSOR_NORM], map);
    w->exit_w = tensor_at(&t[LS_TENSOR_EXIT_GATE_WEIGHT], map);
    w->exit_b = tensor_at(&t[LS_TENSOR_EXIT_GATE_BIAS], map);
    w->adapter = tensor_at(&t[LS_TENSOR_ADAPTER_WEIGHT], map);
    for (int32_t i = 0; i < L; i++) {
        const ls_tensor_span *lt = d->layers[i].t;
        ls_layer_weights *lw = &w->layers[i];
        lw->wq_bias = tensor_at(&lt[LS_LAYER_TENSOR_WQ_BIAS], map);
        lw->wk_bias = tensor_at(&lt[LS_LAYER_TENSOR_WK_BIAS], map);
        lw->attn_norm = tensor_at(&lt[LS_LAYER_TENSOR_ATTN_NORM], map);
        lw->ffn_norm = tensor_at(&lt[LS_LAYER_TENSOR_FFN_NORM], map);
        lw->attn_out_norm = tensor_at(&lt[LS_LAYER_TENSOR_ATTN_OUT_NORM], map);
        lw->ffn_out_norm = tensor_at(&lt[LS_LAYER_TENSOR_FFN_OUT_NORM], map);
        const uint16_t **fp16[7] = {&lw->wq, &lw->wk, &lw->wv, &lw->wo, &lw->w1, &lw->w2, &lw->w3};
        const ls_qmat **quant[7] = {&lw->qwq, &lw->qwk, &lw->qwv, &lw->qwo, &lw->qw1, &lw->qw2, &lw->qw3};
        for (int k = 0; k < 7; k++) {
            const int base = LS_LAYER_TENSOR_WQ_WEIGHT + 4 * k;
            *fp16[k] = tensor_at(&lt[base], map);
            *quant[k] = NULL;
            if (in->quant == LS_QUANT_FP16) continue;
            int64_t rows, cols;
            matrix_shape(in, k, &rows, &cols);
            ls_qmat *q = &m->qmats[7 * i + k];
            *q = (ls_qmat){tensor_at(&lt[base + 1], map), tensor_at(&lt[base + 2], map), tensor_at(&lt[base + 3], map),
                           (int32_t)rows, (int32_t)cols, in->group_size, in->block_bits[k], 0, NULL, NULL, 0};
            *quant[k] = q;
        }
    }
    w->qoutput = NULL;
    w->output = tensor_at(&t[LS_TENSOR_OUTPUT_WEIGHT], map);
    if (t[LS_TENSOR_OUTPUT_QWEIGHT].dtype != LS_DTYPE_NONE) {
        ls_qmat *q = &m->qmats[7 * L];
        *q = (ls_qmat){tensor_at(&t[LS_TENSOR_OUTPUT_QWEIGHT], map), tensor_at(&t[LS_TENSOR_OUTPUT_SCALES], map),
                       NULL, in->vocab_size, in->dim, in->head_group, in->head_bits, 1, NULL, NULL, 0};
        w->qoutput = q;
    }
    m->info.embed_from_head = w->tok_embeddings == NULL;
    m->info.tied_output = w->output == NULL && w->qoutput == NULL;
    m->info.exit_gate = w->exit_w != NULL;
    if (m->info.tied_output) w->output = w->tok_embeddings;
    return 0;
}

static void unwire_weights(ls_model *m) {
    free(m->w.layers);
    free(m->qmats);
    m->w.layers = NULL;
    m->qmats = NULL;
}

#ifdef LS_LOAD_TO_HEAP
/* Sanitizer builds (test/kernels/asan.test.ts, fuzz/) read the file into a heap
 * buffer of exactly its size instead: AddressSanitizer does not track mapped
 * pages, so only this way does a read one byte past the file get reported. */
static void *map_file(int fd, size_t size) {
    unsigned char *p = malloc(size);
    if (p == NULL) {
        errno = ENOMEM;
        return NULL;
    }
    for (size_t done = 0; done < size;) {
        ssize_t r = pread(fd, p + done, size - done, (off_t)done);
        if (r <= 0) {
            if (r == 0) errno = EIO; // the file shrank under us
            free(p);
            return NULL;
        }
        done += (size_t)r;
    }
    return p;
}
static void unmap_file(void *p, size_t size) {
    (void)size;
    free(p);
}
#else
static void *map_file(int fd, size_t size) {
    void *p = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    return p == MAP_FAILED ? NULL : p;
}
static void unmap_file(void *p, size_t size) { munmap(p, size); }
#endif

// ---- load / free ----

// The descriptor against the mapped file, then the weights wired up.
static int validate(const ls_model_desc *desc, const uint8_t *map, uint64_t size, ls_model *m, char *err,
                    int32_t err_len) {
    if (desc == NULL) {
        ls_set_error(err, err_len, "no model descriptor given");
        return -1;
    }
    if (check_config(&desc->config, &m->info, err, err_len) != 0 ||
        check_tensors(&m->info, desc, size, err, err_len) != 0 ||
        check_finite(&m->info, desc, map, err, err_len) != 0)
        return -1;
    return wire_weights(m, desc, map, err, err_len);
}

// Opens and maps the file at path; NULL with err written on failure.
static void *open_and_map(const char *path, size_t *size_out, char *err, int32_t err_len) {
    if (path == NULL) {
        ls_set_error(err, err_len, "no model path given");
        return NULL;
    }
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        ls_set_error(err, err_len, "cannot open model file '%s': %s", path, strerror(errno));
        return NULL;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        ls_set_error(err, err_len, "cannot stat model file '%s': %s", path, strerror(errno));
        close(fd);
        return NULL;
    }
    if (!S_ISREG(st.st_mode)) {
        ls_set_error(err, err_len, "model path '%s' is not a regular file", path);
        close(fd);
        return NULL;
    }
    if (st.st_size == 0) {
        ls_set_error(err, err_len, "model file '%s' is empty", path);
        close(fd);
        return NULL;
    }
    if ((uint64_t)st.st_size > SIZE_MAX) {
        ls_set_error(err, err_len, "model file '%s' is too large to map", path);
        close(fd);
        return NULL;
    }
    size_t size = (size_t)st.st_size;
    void *map = map_file(fd, size);
    int map_errno = errno;
    close(fd); // the mapping keeps the file alive
    if (map == NULL) {
        ls_set_error(err, err_len, "cannot map model file '%s': %s", path, strerror(map_errno));
        return NULL;
    }
    *size_out = size;
    return map;
}

int32_t ls_model_check(const char *path, const ls_model_desc *desc, ls_model_info *info, char *err,
                       int32_t err_len) {
    ls_set_error(err, err_len, "%s", "");
    size_t size = 0;
    void *map = open_and_map(path, &size, err, err_len);
    if (map == NULL) return LS_ERR_ARG;
    ls_model m;
    memset(&m, 0, sizeof m);
    int rc = validate(desc, map, size, &m, err, err_len);
    unwire_weights(&m);
    unmap_file(map, size);
    if (rc != 0) return LS_ERR_ARG;
    if (info) *info = m.info;
    return LS_OK;
}

ls_model *ls_model_load(const char *path, const ls_model_desc *desc, int32_t n_threads, int32_t simd,
                        char *err, int32_t err_len) {
    ls_set_error(err, err_len, "%s", "");
    if (simd < LS_SIMD_AUTO || simd > LS_SIMD_AVX512) {
        ls_set_error(err, err_len, "simd %d is not one of LS_SIMD_AUTO/PORTABLE/AVX2/AVX512", simd);
        return NULL;
    }
    size_t size = 0;
    void *map = open_and_map(path, &size, err, err_len);
    if (map == NULL) return NULL;

    ls_model *m = calloc(1, sizeof *m);
    if (!m) {
        ls_set_error(err, err_len, "out of memory allocating the model");
        unmap_file(map, size);
        return NULL;
    }
    m->map = map;
    m->map_len = size;
    if (validate(desc, map, size, m, err, err_len) != 0) {
        unwire_weights(m);
        unmap_file(map, size);
        free(m);
        return NULL;
    }
    if (m->info.quant != LS_QUANT_FP16 || m->info.head_bits != 0) {
        // One activation scratch for every quantized matrix: a matmul call
        // carries at most LS_CHUNK rows of at most max(dim, ffn_dim, q) inputs.
        int32_t widest = m->info.dim > m->info.ffn_dim ? m->info.dim : m->info.ffn_dim;
        if (m->info.n_heads * m->info.head_dim > widest) widest = m->info.n_heads * m->info.head_dim;
        m->qact = ls_qact_new(LS_CHUNK, widest);
        if (!m->qact) {
            ls_set_error(err, err_len, "out of memory allocating the quantized-activation scratch");
            unwire_weights(m);
            unmap_file(map, size);
            free(m);
            return NULL;
        }
        ls_qact_attach(m->qact, m->qmats, m->n_qmats);
    }
    // ls_runtime_init overwrites these with what it actually starts.
    m->info.simd = simd;
    m->info.n_threads = n_threads;
    m->rt = NULL;
    if (ls_runtime_init(m, n_threads, simd, err, err_len) < 0) {
        if (err != NULL && err_len > 0 && err[0] == '\0')
            ls_set_error(err, err_len, "runtime initialisation failed");
        ls_qact_free(m->qact);
        unwire_weights(m);
        unmap_file(map, size);
        free(m);
        return NULL;
    }
    return m;
}

void ls_model_free(ls_model *m) {
    if (m == NULL) return;
    ls_pipeline_free(m);
    ls_runtime_free(m);
    ls_qact_free(m->qact);
    unwire_weights(m);
    if (m->map != NULL) unmap_file(m->map, m->map_len);
    free(m);
}

void ls_model_info_get(const ls_model *m, ls_model_info *out) {
    if (m == NULL || out == NULL) return;
    *out = m->info;
}
