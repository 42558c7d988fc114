/*
 * session.c — a request's state: one K/V cache per unit (fp16, or int8 /
 * int4 codes with their scales: kvcache.h), the token history, and scratch
 * for one chunk. The scratch is allocated once, in ls_session_new; the
 * caches start with room for LS_KV_FIRST_ROWS positions and grow as
 * positions arrive (ls_session_reserve). Every buffer comes from the
 * runtime's bufpool.c, and goes back there when freed or outgrown, so a
 * new session reuses mapped pages. Positions per unit are tracked separately
 * (unit_len) so a speculative pass can fill loops [0, D) ahead of loops
 * [D, V); rollback truncates every unit.
 */
#include <stdlib.h>
#include <string.h>

#include "kvcache.h"
#include "runtime.h"
#include "session.h"
#include "batch_rules.h" /* after session.h: it reads sessions through ls_session_view */

/* Zeroed, so every buffer is defined memory (valgrind/ASan see no
 * uninitialised reads even in padding rows); NULL for 0 bytes. */
static void *alloc0(const ls_model *m, size_t bytes) { return ls_bufpool_alloc0(&m->rt->bufs, bytes); }
static void release(const ls_model *m, void *p) { ls_bufpool_free(&m->rt->bufs, p); }

/* Where a session's K/V cache lives and how large each part is (kvcache.h
 * layouts); a size is 0 where ls_bytes_of overflowed. */
typedef struct {
    int32_t ldk, ldq, nb, np;
    size_t kc, vc;         /* fp16 modes */
    size_t kq, kp, vq, vp; /* quantized modes */
} cache_layout;

/* n_rows counts the LS_KV_ROW_PAD rows; the transposed keys' strides are
 * padded their own way, from the usable rows. */
static cache_layout layout_of(const ls_model_info *mi, int32_t loops, int32_t n_rows, int32_t kv_mode) {
    cache_layout c = {0};
    size_t L = (size_t)loops, nkv = (size_t)mi->n_kv_heads, hd = (size_t)mi->head_dim, rows = (size_t)n_rows;
    int64_t usable = (int64_t)n_rows - LS_KV_ROW_PAD;
    int32_t fmt = kv_mode & LS_KV_FORMAT_MASK;
    if (fmt == LS_KV_FP16) {
        /* keys are stored transposed; a row stride that is a multiple of 256
         * elements plus 32 keeps head_dim rows out of one cache set */
        c.ldk = (int32_t)((usable + 255) / 256 * 256 + 32);
        c.kc = ls_bytes_of(L, nkv, (size_t)c.ldk, hd, sizeof(uint16_t));
        c.vc = ls_bytes_of(L, nkv, rows, hd, sizeof(uint16_t));
    } else {
        /* codes are bytes: a stride off multiples of 64 keeps the rows of one
         * head out of one cache set, as ldk does for the fp16 keys */
        c.ldq = (int32_t)((usable + 63) / 64 * 64 + 32);
        c.nb = ls_kv_code_bytes(fmt, mi->head_dim);
        c.np = ls_kv_param_count(fmt, mi->head_dim);
        c.kq = ls_bytes_of(L, nkv, (size_t)c.nb, (size_t)c.ldq, 1);
        c.kp = ls_bytes_of(L, nkv, (size_t)c.np, rows, sizeof(uint16_t));
        c.vq = ls_bytes_of(L, nkv, rows, (size_t)c.nb, 1);
        c.vp = ls_bytes_of(L, nkv, rows, (size_t)c.np, sizeof(uint16_t));
    }
    return c;
}

/* Total bytes, or 0 when a part overflowed. */
static size_t layout_bytes(const cache_layout *c) {
    size_t parts[] = {c->kc, c->vc, c->kq, c->kp, c->vq, c->vp}, total = 0;
    int fp16 = c->kc || c->vc;
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) {
        if ((fp16 ? i < 2 : i >= 2) && parts[i] == 0) return 0;
        total += parts[i];
    }
    return total;
}

/* Bytes a position's deferred units keep: its hidden state and its unit count. */
static size_t deferred_bytes(const ls_model_info *mi) { return (size_t)mi->dim * sizeof(float) + sizeof(int32_t); }

/* Bytes a position's prelude output keeps (ls_keeps_prelude). */
static size_t prelude_bytes(const ls_model *m) { return ls_keeps_prelude(m) ? (size_t)m->info.dim * sizeof(float) : 0; }

/* cache_steps as loopserve.h allows it: 0, or in [1, loops) without a
 * window; LS_ERR_ARG with the reason in err otherwise. */
static int32_t check_cache_steps(const ls_session_params *p, char *err, int32_t err_len) {
    if (p->cache_steps == 0) return LS_OK;
    if (p->cache_steps < 0 || p->cache_steps >= p->loops) {
        ls_set_error(err, err_len, "cache_steps must be 0 (every step its own cache) or in [1, loops %d), got %d",
                     p->loops, p->cache_steps);
        return LS_ERR_ARG;
    }
    if (p->cache_window != 0) {
        ls_set_error(err, err_len, "cache_steps cannot be combined with a cache window");
        return LS_ERR_ARG;
    }
    return LS_OK;
}

/* K/V caches a session keeps: its core's units (or their shared slots), then the fixed units. */
static int32_t cache_slots(const ls_model *m, const ls_session_params *p) {
    return (p->cache_steps > 0 ? p->cache_steps : p->loops) * m->info.n_layers + LS_FIXED_UNITS(m);
}

int64_t ls_session_cache_bytes(const ls_model *m, const ls_session_params *params) {
    if (!params || ls_check_session_args(m, params->max_seq, params->loops, params->cache_window, NULL, 0) != LS_OK ||
        check_cache_steps(params, NULL, 0) != LS_OK || ls_kv_check_mode(params->kv_mode, m->info.head_dim, NULL, 0) != LS_OK)
        return LS_ERR_ARG;
    int32_t cap = ls_ring_rows(params->max_seq, params->cache_window, LS_CHUNK);
    cache_layout c = layout_of(&m->info, cache_slots(m, params), cap + LS_KV_ROW_PAD, params->kv_mode);
    size_t total = layout_bytes(&c);
    /* every position's prelude output where the model keeps it, and a hidden state per position where the
     * exact exit policy may keep one */
    if (total > 0)
        total += (size_t)params->max_seq * (prelude_bytes(m) + (ls_keeps_states(m) ? deferred_bytes(&m->info) : 0));
    return total > 0 && total <= INT64_MAX ? (int64_t)total : LS_ERR_NOMEM;
}

int64_t ls_session_cache_bytes_held(const ls_session *s) {
    if (!s) return LS_ERR_ARG;
    cache_layout c = layout_of(&s->m->info, s->core_slots + s->fixed, s->rows, s->kv_mode);
    return (int64_t)(layout_bytes(&c) + (size_t)s->def_cap * deferred_bytes(&s->m->info) +
                     (size_t)s->e_cap * prelude_bytes(s->m));
}

/* One allocation of a session's K/V cache, for n_rows rows. */
typedef struct {
    cache_layout c;
    uint16_t *kc, *vc, *kp, *vp;
    uint8_t *kq, *vq;
} cache_bufs;

static void free_cache(const ls_model *m, cache_bufs *b) {
    void *bufs[] = {b->kc, b->vc, b->kp, b->vp, b->kq, b->vq};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) release(m, bufs[i]);
}

/* 1 when every buffer of the mode was allocated; else nothing is held. */
static int alloc_cache(cache_bufs *b, const ls_model *m, int32_t loops, int32_t n_rows, int32_t kv_mode) {
    *b = (cache_bufs){.c = layout_of(&m->info, loops, n_rows, kv_mode)};
    int ok;
    if (layout_bytes(&b->c) == 0) ok = 0;
    else if ((kv_mode & LS_KV_FORMAT_MASK) == LS_KV_FP16) {
        b->kc = alloc0(m, b->c.kc);
        b->vc = alloc0(m, b->c.vc);
        ok = b->kc && b->vc;
    } else {
        b->kq = alloc0(m, b->c.kq);
        b->kp = alloc0(m, b->c.kp);
        b->vq = alloc0(m, b->c.vq);
        b->vp = alloc0(m, b->c.vp);
        ok = b->kq && b->kp && b->vq && b->vp;
    }
    if (!ok) free_cache(m, b);
    return ok;
}

/* Copies the session's rows [0, s->rows) of every unit and head into b
 * (which has at least as many rows), each part at b's strides. */
static void copy_cache(const ls_session *s, const cache_bufs *b, int32_t n_rows) {
    const ls_model_info *mi = &s->m->info;
    size_t heads = (size_t)(s->core_slots + s->fixed) * (size_t)mi->n_kv_heads, hd = (size_t)mi->head_dim;
    size_t old = (size_t)s->rows, rows = (size_t)n_rows, nb = (size_t)s->kv_nb, np = (size_t)s->kv_np;
    for (size_t head = 0; head < heads; head++) {
        if (s->kv_fmt == LS_KV_FP16) {
            for (size_t d = 0; d < hd; d++)
                memcpy(b->kc + (head * hd + d) * (size_t)b->c.ldk, s->kc + (head * hd + d) * (size_t)s->ldk,
                       old * sizeof *s->kc);
            memcpy(b->vc + head * rows * hd, s->vc + head * old * hd, old * hd * sizeof *s->vc);
            continue;
        }
        for (size_t k = 0; k < nb; k++)
            memcpy(b->kq + (head * nb + k) * (size_t)b->c.ldq, s->kq + (head * nb + k) * (size_t)s->ldq, old);
        for (size_t r = 0; r < np; r++)
            memcpy(b->kp + (head * np + r) * rows, s->kp + (head * np + r) * old, old * sizeof *s->kp);
        memcpy(b->vq + head * rows * nb, s->vq + head * old * nb, old * nb);
        memcpy(b->vp + head * rows * np, s->vp + head * old * np, old * np * sizeof *s->vp);
    }
}

/* The session takes b as its cache of n_rows rows. */
static void adopt_cache(ls_session *s, const cache_bufs *b, int32_t n_rows) {
    s->rows = n_rows;
    s->ldk = b->c.ldk;
    s->ldq = b->c.ldq;
    s->kc = b->kc;
    s->vc = b->vc;
    s->kq = b->kq;
    s->kp = b->kp;
    s->vq = b->vq;
    s->vp = b->vp;
}

/* Room for per-position rows: at least LS_KV_BLOCK, doubled until end fits, at most max_seq. */
static int32_t grown_positions(const ls_session *s, int32_t have, int32_t end) {
    int32_t cap = have < LS_KV_BLOCK ? LS_KV_BLOCK : have;
    while (cap < end) cap = cap > s->max_seq / 2 ? s->max_seq : 2 * cap;
    return cap > s->max_seq ? s->max_seq : cap;
}

/* Room for the prelude outputs of positions [0, end) (ls_keeps_prelude). */
static int32_t prelude_reserve(ls_session *s, int32_t end) {
    if (!ls_keeps_prelude(s->m) || end <= s->e_cap) return LS_OK;
    int32_t cap = grown_positions(s, s->e_cap, end);
    size_t dim = (size_t)s->m->info.dim;
    float *e = alloc0(s->m, (size_t)cap * dim * sizeof *e);
    if (!e) return LS_ERR_NOMEM;
    if (s->e_cap > 0) memcpy(e, s->e, (size_t)s->e_cap * dim * sizeof *e);
    release(s->m, s->e);
    s->e = e;
    s->e_cap = cap;
    return LS_OK;
}

int32_t ls_session_reserve(ls_session *s, int32_t end) {
    if (end > s->max_seq) end = s->max_seq;
    if (prelude_reserve(s, end) != LS_OK) return LS_ERR_NOMEM;
    int32_t need = end < s->cap ? end : s->cap, usable = s->rows - LS_KV_ROW_PAD;
    if (need <= usable) return LS_OK;
    int64_t grown = 2 * (int64_t)usable, want = need > grown ? need : grown;
    want = (want + LS_KV_BLOCK - 1) / LS_KV_BLOCK * LS_KV_BLOCK;
    int32_t n_rows = (want < s->cap ? (int32_t)want : s->cap) + LS_KV_ROW_PAD;
    cache_bufs b;
    if (!alloc_cache(&b, s->m, s->core_slots + s->fixed, n_rows, s->kv_mode)) return LS_ERR_NOMEM;
    copy_cache(s, &b, n_rows);
    cache_bufs old = {.kc = s->kc, .vc = s->vc, .kp = s->kp, .vp = s->vp, .kq = s->kq, .vq = s->vq};
    free_cache(s->m, &old);
    adopt_cache(s, &b, n_rows);
    return LS_OK;
}

int32_t ls_session_defer_reserve(ls_session *s, int32_t end) {
    if (end <= s->def_cap) return LS_OK;
    if (end > s->max_seq) return LS_ERR_ARG;
    int32_t cap = grown_positions(s, s->def_cap, end);
    size_t dim = (size_t)s->m->info.dim;
    float *h = alloc0(s->m, (size_t)cap * dim * sizeof *h);
    int32_t *units = alloc0(s->m, (size_t)cap * sizeof *units);
    if (!h || !units) {
        release(s->m, h);
        release(s->m, units);
        return LS_ERR_NOMEM;
    }
    if (s->def_cap > 0) {
        memcpy(h, s->def_h, (size_t)s->def_cap * dim * sizeof *h);
        memcpy(units, s->def_units, (size_t)s->def_cap * sizeof *units);
    }
    release(s->m, s->def_h);
    release(s->m, s->def_units);
    s->def_h = h;
    s->def_units = units;
    s->def_cap = cap;
    return LS_OK;
}

void ls_session_defer(ls_session *s, int32_t pos, int32_t units, const float *h) {
    const size_t dim = (size_t)s->m->info.dim;
    memcpy(s->def_h + (size_t)pos * dim, h, dim * sizeof *h);
    s->def_units[pos] = units;
}

ls_session *ls_session_new(ls_model *m, const ls_session_params *params, char *err, int32_t err_len) {
    if (!params) {
        ls_set_error(err, err_len, "no session parameters given");
        return NULL;
    }
    const int32_t max_seq = params->max_seq, loops = params->loops, cache_window = params->cache_window,
                  kv_mode = params->kv_mode;
    if (ls_check_session_args(m, max_seq, loops, cache_window, err, err_len) != LS_OK ||
        check_cache_steps(params, err, err_len) != LS_OK)
        return NULL;
    const ls_model_info *mi = &m->info;
    if (ls_kv_check_mode(kv_mode, mi->head_dim, err, err_len) != LS_OK) return NULL;
    ls_session *s = ls_session_calloc(sizeof *s, err, err_len);
    if (!s) return NULL;
    LS_SESSION_SHAPE(s, m, max_seq, loops, cache_window, LS_CHUNK);
    s->fixed = LS_FIXED_UNITS(m);
    s->cache_steps = params->cache_steps;
    s->core_slots = cache_slots(m, params) - s->fixed;
    s->kv_mode = kv_mode;
    s->kv_fmt = kv_mode & LS_KV_FORMAT_MASK;

    size_t C = LS_CHUNK, dim = (size_t)mi->dim, hd = (size_t)mi->head_dim, q_dim = (size_t)mi->n_heads * hd;
    size_t kv_dim = (size_t)mi->n_kv_heads * hd, nth = (size_t)m->rt->n_threads, wide = (size_t)ls_wide_scratch(mi);
    int32_t first_rows = (s->cap < LS_KV_FIRST_ROWS ? s->cap : LS_KV_FIRST_ROWS) + LS_KV_ROW_PAD;
    cache_bufs cache;
    int cache_ok = alloc_cache(&cache, m, s->core_slots + s->fixed, first_rows, kv_mode);
    if (cache_ok) adopt_cache(s, &cache, first_rows);
    s->kv_nb = cache.c.nb;
    s->kv_np = cache.c.np;
    int quantized = s->kv_fmt != LS_KV_FP16;
    if (quantized) {
        s->kv_codes = alloc0(m, ls_bytes_of(nth, hd, 1, 1, 1));
        s->kv_params = alloc0(m, ls_bytes_of(nth, (size_t)cache.c.np, 1, 1, sizeof(uint16_t)));
        cache_ok = cache_ok && s->kv_codes && s->kv_params;
    }
    s->tokens = alloc0(m, (size_t)max_seq * sizeof *s->tokens);
    s->unit_len = alloc0(m, (size_t)(s->units + s->fixed) * sizeof *s->unit_len);
    s->unit_lo = alloc0(m, (size_t)(s->units + s->fixed) * sizeof *s->unit_lo);
    s->h = alloc0(m, C * dim * sizeof(float));
    s->xb = alloc0(m, C * dim * sizeof(float));
    s->q = alloc0(m, C * q_dim * sizeof(float));
    s->k = alloc0(m, C * kv_dim * sizeof(float));
    s->v = alloc0(m, C * kv_dim * sizeof(float));
    s->k16 = alloc0(m, ls_bytes_of(nth, LS_KV_STORE_ROWS, hd, 1, sizeof(uint16_t)));
    s->att = alloc0(m, C * q_dim * sizeof(float));
    s->g = alloc0(m, C * wide * sizeof(float));
    s->u = alloc0(m, C * wide * sizeof(float));
    s->rope = alloc0(m, C * hd * sizeof(float));
    s->scores = alloc0(m, ls_bytes_of((size_t)m->rt->n_threads * LS_ATT_GROUP, (size_t)s->cap, 1, 1, sizeof(float)));
    s->logits = alloc0(m, (size_t)mi->vocab_size * sizeof(float));
    if (!cache_ok || !s->tokens || !s->unit_len || !s->unit_lo || !s->h || !s->xb || !s->q || !s->k ||
        !s->v || !s->k16 || !s->att || !s->g || !s->u || !s->rope || !s->scores || !s->logits) {
        ls_set_error(err, err_len, "out of memory allocating a session (max_seq %d, loops %d, window %d)", max_seq,
                     loops, cache_window);
        ls_session_free(s);
        return NULL;
    }
    return s;
}

void ls_session_free(ls_session *s) {
    if (!s) return;
    ls_ext_free_all(s->ext, LS_SESSION_EXT_N);
    void *bufs[] = {s->tokens, s->unit_len, s->unit_lo, s->def_h, s->def_units, s->e, s->kc, s->vc, s->kq, s->kp, s->vq, s->vp,
                    s->kv_codes, s->kv_params, s->h, s->xb, s->q, s->k, s->v, s->k16, s->att, s->g, s->u,
                    s->rope, s->scores, s->logits};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) release(s->m, bufs[i]);
    free(s);
}

int32_t ls_step_sample(const ls_session *s, const float *logits, const ls_step_params *p) {
    return ls_sample(logits, s->m->info.vocab_size, s->tokens, s->pos, &p->sampling, (uint64_t)s->pos);
}

int32_t ls_session_pos(const ls_session *s) { return s ? s->pos : LS_ERR_ARG; }

int32_t ls_session_last_steps(const ls_session *s) { return s ? s->last_steps : LS_ERR_ARG; }

int32_t ls_session_rollback(ls_session *s, int32_t pos) {
    if (!s) return LS_ERR_ARG;
    int32_t rc = ls_rollback_units(s->unit_len, s->unit_lo, s->units + s->fixed, s->window, s->pos, pos);
    if (rc == LS_OK) s->pos = pos;
    return rc;
}

int32_t ls_session_copy_prefix(ls_session *dst, const ls_session *src, int32_t n) {
    if (!dst || !src || dst == src) return LS_ERR_ARG;
    int32_t rc = ls_check_copy_prefix(ls_session_view(dst), ls_session_view(src), n);
    if (rc != LS_OK) return rc;
    rc = ls_session_reserve(dst, n);
    /* positions lacking dst's deepest unit keep their deferred states */
    int32_t held = src->unit_len[dst->units - 1] < n ? src->unit_len[dst->units - 1] : n;
    if (rc == LS_OK && held < n) rc = ls_session_defer_reserve(dst, n);
    if (rc != LS_OK) return rc;
    /* the core's units [0, dst->units), then the fixed ones, each at its own index in either session */
    for (int32_t l = -dst->fixed; l < dst->units; l++) {
        const int32_t si = ls_unit_index(src->units, l), di = ls_unit_index(dst->units, l);
        int32_t lo = ls_prefix_lo(src->unit_lo[si], n, dst->cap), len = src->unit_len[si] < n ? src->unit_len[si] : n;
        for (int32_t p = lo; p < len; p++) ls_kv_copy_row(dst, l, p % dst->cap, src, l, p % src->cap);
        dst->unit_len[di] = len;
        dst->unit_lo[di] = lo;
    }
    const size_t dim = (size_t)dst->m->info.dim;
    if (dst->e) memcpy(dst->e, src->e, (size_t)n * dim * sizeof *dst->e);
    for (int32_t p = held; p < n; p++) ls_session_defer(dst, p, src->def_units[p], src->def_h + (size_t)p * dim);
    memcpy(dst->tokens, src->tokens, (size_t)n * sizeof *dst->tokens);
    dst->pos = n;
    return LS_OK;
}
