/*
 * session_state.h — a session's state as the CPU files read it: positions
 * per unit, the token history, the K/V cache in the session's mode
 * (layouts in kvcache.h), scratch for one chunk, and the modules'
 * extension slots. session.c allocates and grows it (session.h); the
 * forward pass (forward.h), attention (attention.h) and the K/V store
 * (kvcache.h) work on it. Not ABI.
 */
#ifndef LS_SESSION_STATE_H
#define LS_SESSION_STATE_H

#include <stdint.h>

#include "ext.h"
#include "internal.h"
#include "session_rules.h"
#include "sizes.h"

struct ls_session {
    ls_model *m;
    int32_t max_seq;  /* most positions ever held */
    int32_t units;    /* the core's cache units: the session's loops (steps) x the model's n_layers; unit u
                       * is layer u % n_layers of step u / n_layers, with its own K/V cache */
    int32_t fixed;    /* the prelude's and coda's units (fixed units -1 - j, internal.h), after the core's */
    int32_t cache_steps; /* ls_session_params.cache_steps */
    int32_t core_slots;  /* K/V caches the core's units are kept in: units, or cache_steps x n_layers;
                          * the fixed units' follow (ls_unit_slot) */
    int32_t window;   /* 0 = full attention, else W */
    int32_t cap;      /* ring rows per unit: max_seq, or min(max_seq, W + LS_CHUNK); position p is slot p % cap */
    int32_t rows;     /* cache rows allocated per unit and kv head: at most cap usable plus
                       * LS_KV_ROW_PAD, grown in blocks by ls_session_reserve; the strides
                       * below are rows' */
    int32_t ldk;      /* row stride of the transposed key cache (>= rows) */
    int32_t pos;      /* tokens fed (history length) */
    int32_t last_steps; /* steps the last sampled token ran (ls_session_last_steps) */
    int32_t *tokens;  /* (max_seq) token history */
    int32_t *unit_len; /* (units + fixed) positions [0, unit_len) written in unit l's cache (ls_unit_index) */
    int32_t *unit_lo;  /* (units + fixed) oldest position the ring still holds for unit l */
    float *e;          /* (e_cap, dim) each position's prelude output, the input injection's (models with
                        * a prelude or injection; ls_keeps_prelude), else NULL */
    int32_t e_cap;     /* positions e has room for */
    float *def_h;       /* (def_cap, dim) exact early exit: position p's hidden state entering unit def_units[p] */
    int32_t *def_units; /* (def_cap) the units position p had computed when its state was kept (its later
                         * units deferred, loopserve.h); NULL until the session first keeps one */
    int32_t def_cap;    /* positions def_h and def_units have room for */
    uint16_t *kc;     /* (slots, n_kv_heads, head_dim, ldk) fp16 keys (RoPE applied), transposed;
                       * NULL in a quantized mode; slots = core_slots + fixed (ls_unit_slot) */
    uint16_t *vc;     /* (slots, n_kv_heads, rows, head_dim) fp16 values; NULL in a quantized mode */

    /* key/value cache mode (loopserve.h LS_KV_*, layouts in kvcache.h) */
    int32_t kv_mode;  /* ls_session_params.kv_mode */
    int32_t kv_fmt;   /* kv_mode & LS_KV_FORMAT_MASK */
    int32_t kv_nb;    /* quantized: code bytes per row */
    int32_t kv_np;    /* quantized: fp16 parameters per row */
    int32_t ldq;      /* quantized: row stride (bytes) of the transposed key codes (>= rows) */
    uint8_t *kq;      /* (slots, n_kv_heads, kv_nb, ldq) key codes, transposed; NULL in fp16 modes */
    uint16_t *kp;     /* (slots, n_kv_heads, kv_np, rows) key scales / offsets, transposed */
    uint8_t *vq;      /* (slots, n_kv_heads, rows, kv_nb) value codes */
    uint16_t *vp;     /* (slots, n_kv_heads, rows, kv_np) value scales / offsets */
    uint8_t *kv_codes;  /* (n_threads, head_dim) per thread: one key row on its way into the cache */
    uint16_t *kv_params; /* (n_threads, kv_np) */

    /* scratch for one chunk of LS_CHUNK tokens, allocated once */
    float *h;      /* (LS_CHUNK, dim) residual stream */
    float *xb;     /* (LS_CHUNK, dim) normed input of a sub-block */
    float *q;      /* (LS_CHUNK, n_heads * head_dim) */
    float *k;      /* (LS_CHUNK, n_kv_heads * head_dim) */
    float *v;      /* (LS_CHUNK, n_kv_heads * head_dim) */
    uint16_t *k16; /* (n_threads, LS_KV_STORE_ROWS, head_dim): keys in fp16 on their way into the transposed cache */
    float *att;    /* (LS_CHUNK, n_heads * head_dim) attention output */
    float *g;      /* (LS_CHUNK, ls_wide_scratch) gate, then silu(gate) * up; at a step's start the
                    * adapter's input concat[h, e] */
    float *u;      /* (LS_CHUNK, ffn_dim) up */
    float *rope;   /* (LS_CHUNK, head_dim / 2, 2) cos, sin per position */
    float *scores; /* (n_threads, 4, cap) attention scores, up to 4 rows per thread (a prefill token group) */
    float *logits; /* (vocab_size) for ls_session_step without logits_out */

    ls_ext ext[LS_SESSION_EXT_N]; /* e.g. the speculative buffers (spec.c), allocated on first use */
};

/* The session's bookkeeping as session_rules.h reads it. */
static inline ls_seq_view ls_session_view(const ls_session *s) {
    ls_seq_view v = {s->m, s->max_seq, s->units, s->m->info.n_layers, s->window, s->cap, s->kv_mode, s->pos,
                     s->unit_len, s->unit_lo, s->def_units, s->fixed, s->cache_steps};
    return v;
}

/* The K/V cache a unit is kept in (session_state.h kc): a core unit's own,
 * or with shared steps its slot u mod core_slots; fixed unit -1 - j after
 * the core's. */
static inline int32_t ls_unit_slot(const ls_session *s, int32_t u) {
    return u >= 0 ? u % s->core_slots : s->core_slots - 1 - u;
}

/* Widest row of the FFN scratch (g, u): ffn_dim, or the adapter's input
 * concat[h, e] when wider. */
static inline int32_t ls_wide_scratch(const ls_model_info *mi) {
    return mi->injection != LS_INJECT_NONE && 2 * mi->dim > mi->ffn_dim ? 2 * mi->dim : mi->ffn_dim;
}

#endif
