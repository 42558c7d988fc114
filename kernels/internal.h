/*
 * internal.h — shared between the library's own translation units; not ABI.
 *
 * model.c (loader) fills struct ls_model from the mmapped file and then calls
 * ls_runtime_init (forward.c side), which starts the pool, selects the SIMD
 * kernels and prepares anything derived from the weights.
 */
#ifndef LOOPSERVE_INTERNAL_H
#define LOOPSERVE_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "loopserve.h"

typedef struct ls_runtime ls_runtime; /* owned by forward.c: pool, kernels, packed weights */

/* Weights point straight into the read-only mapping (fp16, row-major). */
typedef struct {
    const uint16_t *tok_embeddings; /* (vocab_size, dim) */
    const uint16_t *attn_norm;      /* (dim) */
    const uint16_t *wq;             /* (n_heads * head_dim, dim) */
    const uint16_t *wk;             /* (n_kv_heads * head_dim, dim) */
    const uint16_t *wv;             /* (n_kv_heads * head_dim, dim) */
    const uint16_t *wo;             /* (dim, n_heads * head_dim) */
    const uint16_t *ffn_norm;       /* (dim) */
    const uint16_t *w1;             /* (ffn_dim, dim) gate */
    const uint16_t *w2;             /* (dim, ffn_dim) down */
    const uint16_t *w3;             /* (ffn_dim, dim) up */
    const uint16_t *norm;           /* (dim) */
    const uint16_t *output;         /* (vocab_size, dim); == tok_embeddings when tied */
} ls_weights;

struct ls_model {
    ls_model_info info;
    ls_weights w;
    void *map;        /* mmap base */
    size_t map_len;
    ls_runtime *rt;
};

/* Provided by forward.c. Called once by ls_model_load after the weights are
 * validated; on failure writes err and returns a negative LS_ERR_*. */
int32_t ls_runtime_init(ls_model *m, int32_t n_threads, int32_t simd, char *err, int32_t err_len);
void ls_runtime_free(ls_model *m);

/* Formats an error message into err (always NUL-terminated, truncated). */
void ls_set_error(char *err, int32_t err_len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* fp16 <-> fp32, exact IEEE conversions usable from every path. */
float ls_f16_to_f32(uint16_t h);
uint16_t ls_f32_to_f16(float f); /* round to nearest even, overflow -> inf */

#endif
