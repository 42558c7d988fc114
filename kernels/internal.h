/*
 * internal.h — shared between the library's own translation units; not ABI.
 *
 * model.c (loader) fills struct ls_model from the caller's model descriptor
 * checked against the mmapped file, then calls ls_runtime_init (runtime.c
 * side), which starts the pool, selects the SIMD kernels and prepares
 * anything derived from the weights.
 */
#ifndef LOOPSERVE_INTERNAL_H
#define LOOPSERVE_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "loopserve.h"

typedef struct ls_runtime ls_runtime; /* owned by runtime.c: pool, kernels, packed weights */

typedef struct ls_qact ls_qact; /* quant.h: quantized activations, one per model */

/* A quantized weight matrix, pointing into the mapping like the fp16 ones.
 * The packing of each format is written down in loopserve.h. */
typedef struct {
    const uint8_t *qweight; /* (rows, in * bits / 8) packed codes (int8: signed bytes) */
    const uint16_t *scales; /* (rows, in / group) fp16 */
    const uint16_t *zeros;  /* (rows, in / group) fp16 offsets; int2 only, else NULL */
    int32_t rows, in;
    int32_t group;          /* inputs per scale: 32, 64, 128 or 256 */
    int32_t bits;           /* block: 4 (int4) or 2 (int2); head: 8, 6 or 4 */
    int32_t head;           /* 1: the output head. Its codes are the unsigned operand (c + 2^(bits-1)),
                               and paths with their own layout keep it at its stored width: it
                               streams from memory once per step, where bytes are the cost */
    ls_qact *act;           /* the model's activation scratch (see quant.h) */
    uint8_t *packed;        /* qweight in the layout of act's kernels, or NULL (quant_pack.h) */
    int32_t packed_wide;    /* packed holds the wide copy before the narrow one (quant_pack.h) */
} ls_qmat;

/* One layer's weights, pointing straight into the read-only mapping (fp16,
 * row-major). In a quantized model (quant int4/int2) the seven matrices are
 * ls_qmat instead: their q* pointer is set and their fp16 pointer is NULL;
 * in an fp16 model they are NULL. */
typedef struct {
    const uint16_t *attn_norm;      /* (dim) */
    const uint16_t *ffn_norm;       /* (dim) */
    const uint16_t *attn_out_norm;  /* (dim) sandwich norms, or NULL */
    const uint16_t *ffn_out_norm;   /* (dim) */
    const uint16_t *wq;             /* (n_heads * head_dim, dim) */
    const uint16_t *wk;             /* (n_kv_heads * head_dim, dim) */
    const uint16_t *wv;             /* (n_kv_heads * head_dim, dim) */
    const uint16_t *wo;             /* (dim, n_heads * head_dim) */
    const uint16_t *w1;             /* (ffn_dim, dim) gate */
    const uint16_t *w2;             /* (dim, ffn_dim) down */
    const uint16_t *w3;             /* (ffn_dim, dim) up */
    const uint16_t *wq_bias;        /* (n_heads * head_dim) with qk_bias, else NULL */
    const uint16_t *wk_bias;        /* (n_kv_heads * head_dim) with qk_bias, else NULL */
    const ls_qmat *qwq, *qwk, *qwv, *qwo; /* as wq..wo, quantized */
    const ls_qmat *qw1, *qw2, *qw3;       /* as w1..w3, quantized */
} ls_layer_weights;

/* The model's weights: its layers (n_layers of them) and the model-wide
 * tensors. The output head, in a model of either kind, is ls_qmat qoutput
 * when head_bits > 0, else the fp16 output. */
typedef struct {
    const uint16_t *tok_embeddings; /* (vocab_size, dim), or NULL: rows of qoutput dequantized */
    const uint16_t *norm;           /* (dim) */
    const uint16_t *output;         /* (vocab_size, dim); == tok_embeddings when tied */
    const ls_qmat *qoutput;         /* (vocab_size, dim) int8 / int6 / int4 head, or NULL */
    const uint16_t *exit_w;         /* (dim) exit gate, or NULL */
    const uint16_t *exit_b;         /* (1) */
    const uint16_t *adapter;        /* (dim, 2 dim) the input injection's matrix (LS_INJECT_ADAPTER), or NULL */
    ls_layer_weights *layers;       /* (n_layers + n_prelude + n_coda): the core's, the prelude's, the coda's */
} ls_weights;

/* The layer a unit runs. A core unit u >= 0 is step u / n_layers of layer
 * u % n_layers; the prelude's and the coda's layers run once per position,
 * as the fixed units -1 - j (j < n_prelude: prelude layer j; then the coda's
 * layers), layer n_layers + j. Each unit has its own key/value cache
 * (docs/kernels.md). */
#define LS_UNIT_LAYER(m, u) ((u) >= 0 ? (u) % (m)->info.n_layers : (m)->info.n_layers - 1 - (u))
/* The fixed unit of prelude layer j, and of coda layer j. */
#define LS_PRELUDE_UNIT(j) (-1 - (j))
#define LS_CODA_UNIT(m, j) (-1 - (m)->info.n_prelude - (j))
/* Fixed units a session holds besides its core's. */
#define LS_FIXED_UNITS(m) ((m)->info.n_prelude + (m)->info.n_coda)

struct ls_model {
    ls_model_info info;
    ls_weights w;
    void *map;        /* mmap base */
    size_t map_len;
    ls_runtime *rt;
    ls_qmat *qmats;   /* (7 n_layers + 1) storage behind the q* pointers: layer i's at 7 i.., the head last */
    int32_t n_qmats;
    ls_qact *qact;    /* activation scratch shared by the quantized matrices; NULL when none is */
    struct ls_pipeline *pipeline; /* pipeline.c: the thread of ls_pipeline_begin; NULL until the first */
};

/* pipeline.c: ends the model's pipeline thread (after a step it runs). */
void ls_pipeline_free(ls_model *m);

/* ls_batch_step with a gate, which each backend's batch step provides:
 * gate(gate_ctx), when gate is set, is called once after the forward pass
 * and before the draws (pipeline.c waits there for the caller's masks). */
int32_t ls_batch_step_gated(ls_model *m, ls_session *const *sessions, const ls_batch_row *rows, int32_t n_rows,
                            const int32_t *tokens, const uint32_t *masks, float *logits_out, int32_t *out,
                            void (*gate)(void *), void *gate_ctx);

/* Provided by runtime.c. Called once by ls_model_load after the descriptor is
 * checked; on failure writes err and returns a negative LS_ERR_*. */
int32_t ls_runtime_init(ls_model *m, int32_t n_threads, int32_t simd, char *err, int32_t err_len);
void ls_runtime_free(ls_model *m);

/* Formats an error message into err (always NUL-terminated, truncated). */
void ls_set_error(char *err, int32_t err_len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* fp16 <-> fp32, exact IEEE conversions usable from every path. */
float ls_f16_to_f32(uint16_t h);
uint16_t ls_f32_to_f16(float f); /* round to nearest even, overflow -> inf */

#endif
