/*
 * session_rules.h — the session rules every library applies the same way,
 * written once: the model shape they run, which arguments a session and a
 * sampling step accept, how far back a window reaches, how many cache rows
 * a ring keeps, and which positions the units must hold before a call may
 * go on. session.c, forward.c and spec.c use them, and so does the CUDA
 * library (kernels/cuda/runtime.cu), whose session keeps the same
 * bookkeeping on the host next to its device cache. Header-only so the
 * CUDA library, which links none of the CPU session code, compiles it too
 * (as C++). Not ABI.
 */
#ifndef LS_SESSION_RULES_H
#define LS_SESSION_RULES_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "internal.h"
#include "sizes.h"

/* A session's position bookkeeping as the rules read it. Each library fills
 * one from its own session struct (ls_session_view). */
typedef struct {
    const ls_model *m;
    int32_t max_seq;          /* most positions ever held */
    int32_t units;            /* cache units the session holds: its loops (steps) x the model's layers */
    int32_t layers;           /* the model's n_layers: units per step */
    int32_t window;           /* 0 = full attention, else W */
    int32_t cap;              /* cache rows per unit (ls_ring_rows) */
    int32_t kv_mode;          /* LS_KV_* */
    int32_t pos;              /* positions held */
    const int32_t *unit_len;  /* (units) positions [0, unit_len) written in unit l's cache */
    const int32_t *unit_lo;   /* (units) oldest position the ring still holds for unit l */
    const int32_t *def_units; /* (pos) exact early exit: the units position p had computed when its hidden
                               * state was kept, its later units deferred; NULL in a session without them */
    int32_t fixed;            /* the prelude's and coda's units (LS_FIXED_UNITS), after the core's in unit_len
                               * and unit_lo: fixed unit -1 - j at index units + j (ls_unit_index) */
    int32_t cache_steps;      /* ls_session_params.cache_steps: 0, or the steps of caches the core's units share */
} ls_seq_view;

/* Whether a model's sessions keep each position's prelude output: it feeds
 * the input injection, or is the core's input that a deeper pass over held
 * positions starts from. */
static inline int ls_keeps_prelude(const ls_model *m) {
    return m->info.injection != LS_INJECT_NONE || m->info.n_prelude > 0;
}

/* Whether a model's sessions budget a hidden state per position
 * (ls_session_cache_bytes), which the exact exit policy keeps: a model with
 * an exit gate or that keeps prelude outputs. */
static inline int ls_keeps_states(const ls_model *m) { return m->info.exit_gate || ls_keeps_prelude(m); }

/* Where unit u's positions are kept in unit_len / unit_lo: a core unit at
 * its own index, fixed unit -1 - j after the core's `units`. */
static inline int32_t ls_unit_index(int32_t units, int32_t u) { return u >= 0 ? u : units - 1 - u; }

/* The model shape the forward pass relies on (ls_runtime_init checks it
 * before any session exists): head_dim even and n_heads * head_dim at most
 * LS_MAX_DIM, whole query-head groups per kv head, positive sizes. On
 * failure writes the shape into err and returns LS_ERR_ARG. */
static inline int32_t ls_check_model_shape(const ls_model_info *mi, char *err, int32_t err_len) {
    if (mi->dim <= 0 || mi->n_heads <= 0 || mi->n_kv_heads <= 0 || mi->head_dim <= 0 || mi->head_dim % 2 != 0 ||
        (int64_t)mi->n_heads * mi->head_dim > LS_MAX_DIM || mi->n_heads % mi->n_kv_heads != 0 || mi->ffn_dim <= 0 ||
        mi->vocab_size <= 0) {
        ls_set_error(err, err_len,
                     "inconsistent model shape: dim %d, n_heads %d, n_kv_heads %d, head_dim %d, "
                     "ffn_dim %d, vocab_size %d",
                     mi->dim, mi->n_heads, mi->n_kv_heads, mi->head_dim, mi->ffn_dim, mi->vocab_size);
        return LS_ERR_ARG;
    }
    return LS_OK;
}

/* ls_sample's parameter ranges: temperature finite and >= 0, top_k >= 0,
 * top_p in [0, 1], penalty finite and > 0. Every entry point that samples
 * checks with this (a step before its forward pass touches the session). */
static inline int ls_sampling_ok(const ls_sampling *sp) {
    return sp->temperature >= 0.0f && !isinf(sp->temperature) && sp->top_k >= 0 && sp->top_p >= 0.0f &&
           sp->top_p <= 1.0f && sp->repetition_penalty > 0.0f && !isinf(sp->repetition_penalty);
}

/* ls_session_new's checks of its arguments; on failure writes why into err
 * and returns LS_ERR_ARG. */
static inline int32_t ls_check_session_args(const ls_model *m, int32_t max_seq, int32_t loops, int32_t cache_window,
                                            char *err, int32_t err_len) {
    if (!m || !m->rt) {
        ls_set_error(err, err_len, "no model loaded");
        return LS_ERR_ARG;
    }
    if (max_seq < 1) {
        ls_set_error(err, err_len, "max_seq must be at least 1, got %d", max_seq);
        return LS_ERR_ARG;
    }
    if (loops < 1) {
        ls_set_error(err, err_len, "loops must be at least 1, got %d", loops);
        return LS_ERR_ARG;
    }
    if ((int64_t)loops * m->info.n_layers + LS_FIXED_UNITS(m) > LS_MAX_UNITS) {
        ls_set_error(err, err_len, "loops %d x %d layers (and %d once) is more than the %d cache units a session may hold",
                     loops, m->info.n_layers, LS_FIXED_UNITS(m), LS_MAX_UNITS);
        return LS_ERR_ARG;
    }
    if (cache_window < 0) {
        ls_set_error(err, err_len, "cache_window must be 0 (full) or positive, got %d", cache_window);
        return LS_ERR_ARG;
    }
    return LS_OK;
}

/* a * b * c * d elements of `size` bytes, or 0 on overflow: the sizes of
 * a session's buffers. */
static inline size_t ls_bytes_of(size_t a, size_t b, size_t c, size_t d, size_t size) {
    size_t r;
    if (__builtin_mul_overflow(a, b, &r) || __builtin_mul_overflow(r, c, &r) || __builtin_mul_overflow(r, d, &r) ||
        __builtin_mul_overflow(r, size, &r))
        return 0;
    return r;
}

/* A zeroed session struct of `size` bytes, or NULL with the reason in err. */
static inline void *ls_session_calloc(size_t size, char *err, int32_t err_len) {
    void *s = calloc(1, size);
    if (!s) ls_set_error(err, err_len, "out of memory allocating a session");
    return s;
}

/* Stores the bookkeeping every library's session starts from: its model,
 * capacity, cache units (loops x the model's layers), window and ring rows
 * (ls_ring_rows with the library's chunk). A macro: each library has its
 * own session struct, with these field names. */
#define LS_SESSION_SHAPE(s, model, max_seq_, loops_, window_, chunk)                                       \
    do {                                                                                                 \
        (s)->m = (model);                                                                                \
        (s)->max_seq = (max_seq_);                                                                       \
        (s)->units = (loops_) * (model)->info.n_layers;                                                  \
        (s)->window = (window_);                                                                         \
        (s)->cap = ls_ring_rows((max_seq_), (window_), (chunk));                                         \
    } while (0)

/* Cache rows per unit: every position, or with a window W the W positions
 * a query sees plus the chunk being written (chunk: the library's most
 * tokens per internal step), so writing a chunk never overwrites a row one
 * of its tokens still attends to. */
static inline int32_t ls_ring_rows(int32_t max_seq, int32_t window, int32_t chunk) {
    return window > 0 && (int64_t)window + chunk < max_seq ? window + chunk : max_seq;
}

/* Oldest position a query at pos attends to: pos - W + 1 with a window W. */
static inline int32_t ls_window_lo(int32_t pos, int32_t window) {
    return window > 0 && pos - window + 1 > 0 ? pos - window + 1 : 0;
}

/* Loops [la, lb) each hold exactly pos positions, and their rings still the
 * rows a query at pos attends to: the state a call that appends at pos
 * needs. */
static inline int ls_units_hold(const int32_t *unit_len, const int32_t *unit_lo, int32_t la, int32_t lb, int32_t pos,
                                int32_t window) {
    int32_t need_lo = ls_window_lo(pos, window);
    for (int32_t l = la; l < lb; l++)
        if (unit_len[l] != pos || unit_lo[l] > need_lo) return 0;
    return 1;
}

/* Unit l now holds positions [0, len): a ring of cap rows keeps only the
 * last cap of them. */
static inline void ls_seq_advance(int32_t *unit_len, int32_t *unit_lo, int32_t l, int32_t len, int32_t cap) {
    if (len <= unit_len[l]) return; /* a call that wrote only positions below it (deferred units) */
    unit_len[l] = len;
    if (len - cap > unit_lo[l]) unit_lo[l] = len - cap;
}

/* Positions [0, pos) of units [0, need) are each held, or deferred (exact
 * early exit, loopserve.h): a position lacking a unit lacks every unit
 * after it, whole steps at a time, and its kept state is the input of its
 * first missing unit, so a call can compute them first. Deferred units
 * never exist with a window. */
static inline int ls_units_complete(ls_seq_view s, int32_t pos, int32_t need) {
    int32_t prev = pos;
    for (int32_t u = 0; u < need; u++) {
        int32_t len = s.unit_len[u] < pos ? s.unit_len[u] : pos;
        if (u % s.layers != 0) {
            if (len != prev) return 0; /* a step's units hold the same positions */
            continue;
        }
        if (len > prev) return 0; /* a deeper step holds a position a shallower one lacks */
        if (len < prev && (!s.def_units || s.window > 0)) return 0;
        for (int32_t p = len; p < prev; p++)
            if (s.def_units[p] != u) return 0;
        prev = len;
    }
    return 1;
}

/* Units [0, need) are ready for a call appending at the session's position:
 * complete (above), and each ring still holds the rows a query there
 * attends to; so are the fixed units, which hold every position. */
static inline int ls_units_ready(ls_seq_view s, int32_t need) {
    int32_t need_lo = ls_window_lo(s.pos, s.window);
    for (int32_t u = 0; u < need; u++)
        if (s.unit_len[u] > s.pos || s.unit_lo[u] > need_lo) return 0;
    if (!ls_units_hold(s.unit_len, s.unit_lo, s.units, s.units + s.fixed, s.pos, s.window)) return 0;
    return ls_units_complete(s, s.pos, need);
}

/* Positions whose units a call at depth `need` (units) computes first: those
 * lacking unit need - 1. */
static inline int32_t ls_units_deferred(ls_seq_view s, int32_t need) {
    return s.def_units && need > 0 ? s.pos - s.unit_len[need - 1] : 0;
}

/* The checks of appending n tokens through `loops` loops (steps; ls_session_forward
 * and ls_session_step), in order: LS_ERR_ARG for a bad argument or token
 * id, LS_ERR_FULL without room, LS_ERR_STATE when the units do not all
 * hold the session's positions. */
static inline int32_t ls_check_feed(ls_seq_view s, const int32_t *tokens, int32_t n, int32_t loops) {
    if (!tokens || n < 1 || loops < 1 || (int64_t)loops * s.layers > s.units) return LS_ERR_ARG;
    int32_t vocab = s.m->info.vocab_size;
    for (int32_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= vocab) return LS_ERR_ARG;
    if (s.pos > s.max_seq - n) return LS_ERR_FULL;
    return ls_units_ready(s, loops * s.layers) ? LS_OK : LS_ERR_STATE;
}

/* ls_session_rollback on the bookkeeping: forgets positions >= pos in
 * every unit (unit_len[l] capped at pos); the caller then sets its pos.
 * A windowed ring keeps only the last cap positions: rolling back further
 * than its oldest row allows would need rows that were overwritten, so
 * that is refused (LS_ERR_STATE) rather than attending to the wrong rows. */
static inline int32_t ls_rollback_units(int32_t *unit_len, const int32_t *unit_lo, int32_t loops, int32_t window,
                                        int32_t held, int32_t pos) {
    if (pos < 0 || pos > held) return LS_ERR_ARG;
    int32_t need_lo = ls_window_lo(pos, window);
    for (int32_t l = 0; l < loops; l++)
        if (unit_len[l] >= pos && unit_lo[l] > need_lo) return LS_ERR_STATE;
    for (int32_t l = 0; l < loops; l++)
        if (unit_len[l] > pos) unit_len[l] = pos;
    return LS_OK;
}

/* First position of positions [0, n) that a copy into a ring of dst_cap
 * rows takes from a unit whose oldest held row is src_lo. A future
 * position attends back window - 1 rows (all rows without a window); the
 * copy takes every row the destination ring can hold, so it can itself
 * serve shorter prefixes later. */
static inline int32_t ls_prefix_lo(int32_t src_lo, int32_t n, int32_t dst_cap) {
    int32_t ring_lo = n > dst_cap ? n - dst_cap : 0;
    return src_lo > ring_lo ? src_lo : ring_lo;
}

/* ls_session_copy_prefix's checks, in order (loopserve.h): LS_ERR_ARG,
 * LS_ERR_STATE, or LS_OK when every unit of dst can take positions [0, n)
 * from src, checked before anything is written. */
static inline int32_t ls_check_copy_prefix(ls_seq_view dst, ls_seq_view src, int32_t n) {
    if (dst.m != src.m || n < 0) return LS_ERR_ARG;
    if (dst.pos != 0 || dst.window != src.window || dst.kv_mode != src.kv_mode || dst.units > src.units ||
        dst.cache_steps != 0 || src.cache_steps != 0)
        return LS_ERR_STATE;
    if (n > src.pos || n > dst.max_seq) return LS_ERR_ARG;
    int32_t need_lo = ls_window_lo(n, dst.window);
    for (int32_t l = 0; l < dst.units; l++)
        if (ls_prefix_lo(src.unit_lo[l], n, dst.cap) > need_lo) return LS_ERR_STATE;
    for (int32_t j = 0; j < src.fixed; j++)
        if (src.unit_len[src.units + j] < n || ls_prefix_lo(src.unit_lo[src.units + j], n, dst.cap) > need_lo)
            return LS_ERR_STATE;
    return ls_units_complete(src, n, dst.units) ? LS_OK : LS_ERR_STATE;
}

#endif
