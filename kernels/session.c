/*
 * session.c — a request's state: one K/V cache per loop (fp16, or int8 /
 * int4 codes with their scales: kvcache.h), the token history, and scratch
 * for one chunk (all allocated once, in ls_session_new). Positions per loop are tracked separately (loop_len) so a
 * speculative pass can fill loops [0, D) ahead of loops [D, V); rollback
 * truncates every loop.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "session.h"

/* a * b * c * d elements of `size` bytes, or 0 on overflow */
static size_t bytes_of(size_t a, size_t b, size_t c, size_t d, size_t size) {
    size_t r;
    if (__builtin_mul_overflow(a, b, &r) || __builtin_mul_overflow(r, c, &r) ||
        __builtin_mul_overflow(r, d, &r) || __builtin_mul_overflow(r, size, &r))
        return 0;
    return r;
}

/* calloc so every buffer is defined memory (valgrind/ASan see no
 * uninitialised reads even in padding rows). */
static void *alloc0(size_t bytes) { return bytes ? calloc(1, bytes) : NULL; }

ls_session *ls_session_new(ls_model *m, const ls_session_params *params, char *err, int32_t err_len) {
    if (!m || !m->rt) {
        ls_set_error(err, err_len, "no model loaded");
        return NULL;
    }
    if (!params) {
        ls_set_error(err, err_len, "no session parameters given");
        return NULL;
    }
    const int32_t max_seq = params->max_seq, loops = params->loops, cache_window = params->cache_window,
                  kv_mode = params->kv_mode;
    if (max_seq < 1) {
        ls_set_error(err, err_len, "max_seq must be at least 1, got %d", max_seq);
        return NULL;
    }
    if (loops < 1) {
        ls_set_error(err, err_len, "loops must be at least 1, got %d", loops);
        return NULL;
    }
    if (cache_window < 0) {
        ls_set_error(err, err_len, "cache_window must be 0 (full) or positive, got %d", cache_window);
        return NULL;
    }
    const ls_model_info *mi = &m->info;
    if (ls_kv_check_mode(kv_mode, mi->head_dim, err, err_len) != LS_OK) return NULL;
    ls_session *s = calloc(1, sizeof *s);
    if (!s) {
        ls_set_error(err, err_len, "out of memory allocating a session");
        return NULL;
    }
    s->m = m;
    s->max_seq = max_seq;
    s->loops = loops;
    s->window = cache_window;
    s->kv_mode = kv_mode;
    s->kv_fmt = kv_mode & LS_KV_FORMAT_MASK;
    s->cap = max_seq;
    if (cache_window > 0 && (int64_t)cache_window + LS_CHUNK < max_seq) s->cap = cache_window + LS_CHUNK;

    size_t C = LS_CHUNK, dim = (size_t)mi->dim, hd = (size_t)mi->head_dim;
    size_t kv_dim = (size_t)mi->n_kv_heads * hd;
    /* keys are stored transposed; a row stride that is a multiple of 256
     * elements plus 32 keeps head_dim rows out of one cache set */
    s->ldk = (int32_t)(((int64_t)s->cap + 255) / 256 * 256 + 32);
    size_t nkv = (size_t)mi->n_kv_heads, cap = (size_t)s->cap, nth = (size_t)m->rt->n_threads;
    size_t kcache_bytes, cache_bytes;
    int quantized = s->kv_fmt != LS_KV_FP16;
    if (!quantized) {
        cache_bytes = bytes_of((size_t)loops, nkv, cap, hd, sizeof(uint16_t));
        kcache_bytes = bytes_of((size_t)loops, nkv, (size_t)s->ldk, hd, sizeof(uint16_t));
        s->kc = alloc0(kcache_bytes);
        s->vc = alloc0(cache_bytes);
    } else {
        /* codes are bytes: a stride off multiples of 64 keeps the rows of one
         * head out of one cache set, as ldk does for the fp16 keys */
        s->ldq = (int32_t)(((int64_t)s->cap + 63) / 64 * 64 + 32);
        s->kv_nb = ls_kv_code_bytes(s->kv_fmt, mi->head_dim);
        s->kv_np = ls_kv_param_count(s->kv_fmt, mi->head_dim);
        size_t nb = (size_t)s->kv_nb, np = (size_t)s->kv_np;
        size_t kq = bytes_of((size_t)loops, nkv, nb, (size_t)s->ldq, 1);
        size_t kp = bytes_of((size_t)loops, nkv, np, cap, sizeof(uint16_t));
        size_t vq = bytes_of((size_t)loops, nkv, cap, nb, 1);
        size_t vp = bytes_of((size_t)loops, nkv, cap, np, sizeof(uint16_t));
        kcache_bytes = kq && kp ? kq + kp : 0;
        cache_bytes = vq && vp ? vq + vp : 0;
        s->kq = alloc0(kq);
        s->kp = alloc0(kp);
        s->vq = alloc0(vq);
        s->vp = alloc0(vp);
        s->kv_codes = alloc0(bytes_of(nth, hd, 1, 1, 1));
        s->kv_params = alloc0(bytes_of(nth, np, 1, 1, sizeof(uint16_t)));
    }
    s->tokens = alloc0((size_t)max_seq * sizeof *s->tokens);
    s->loop_len = alloc0((size_t)loops * sizeof *s->loop_len);
    s->loop_lo = alloc0((size_t)loops * sizeof *s->loop_lo);
    s->h = alloc0(C * dim * sizeof(float));
    s->xb = alloc0(C * dim * sizeof(float));
    s->q = alloc0(C * dim * sizeof(float));
    s->k = alloc0(C * kv_dim * sizeof(float));
    s->v = alloc0(C * kv_dim * sizeof(float));
    s->k16 = alloc0(bytes_of(nth, hd, 1, 1, sizeof(uint16_t)));
    s->att = alloc0(C * dim * sizeof(float));
    s->g = alloc0(C * (size_t)mi->ffn_dim * sizeof(float));
    s->u = alloc0(C * (size_t)mi->ffn_dim * sizeof(float));
    s->rope = alloc0(C * hd * sizeof(float));
    s->scores = alloc0(bytes_of((size_t)m->rt->n_threads * 4, (size_t)s->cap, 1, 1, sizeof(float))); /* 4: attention.c ATT_GROUP */
    s->logits = alloc0((size_t)mi->vocab_size * sizeof(float));
    int cache_ok = quantized ? s->kq && s->kp && s->vq && s->vp && s->kv_codes && s->kv_params : s->kc && s->vc;
    if (!cache_ok || !s->tokens || !s->loop_len || !s->loop_lo || !s->h || !s->xb || !s->q || !s->k ||
        !s->v || !s->k16 || !s->att || !s->g || !s->u || !s->rope || !s->scores || !s->logits) {
        ls_set_error(err, err_len,
                     "out of memory allocating a session (max_seq %d, loops %d, window %d: %zu bytes "
                     "of K/V cache)",
                     max_seq, loops, cache_window, kcache_bytes + cache_bytes);
        ls_session_free(s);
        return NULL;
    }
    return s;
}

void ls_session_free(ls_session *s) {
    if (!s) return;
    ls_spec_scratch_free(s);
    free(s->tokens);
    free(s->loop_len);
    free(s->loop_lo);
    free(s->kc);
    free(s->vc);
    free(s->kq);
    free(s->kp);
    free(s->vq);
    free(s->vp);
    free(s->kv_codes);
    free(s->kv_params);
    free(s->h);
    free(s->xb);
    free(s->q);
    free(s->k);
    free(s->v);
    free(s->k16);
    free(s->att);
    free(s->g);
    free(s->u);
    free(s->rope);
    free(s->scores);
    free(s->logits);
    free(s);
}

int32_t ls_session_pos(const ls_session *s) { return s ? s->pos : LS_ERR_ARG; }

int32_t ls_session_rollback(ls_session *s, int32_t pos) {
    if (!s || pos < 0 || pos > s->pos) return LS_ERR_ARG;
    /* A windowed ring keeps only the last cap positions: rolling back further
     * than LS_CHUNK positions past the newest write may need rows that were
     * overwritten. Refuse rather than attend to the wrong rows. */
    int32_t need_lo = s->window > 0 && pos - s->window + 1 > 0 ? pos - s->window + 1 : 0;
    for (int32_t l = 0; l < s->loops; l++)
        if (s->loop_len[l] >= pos && s->loop_lo[l] > need_lo) return LS_ERR_STATE;
    for (int32_t l = 0; l < s->loops; l++)
        if (s->loop_len[l] > pos) s->loop_len[l] = pos;
    s->pos = pos;
    return LS_OK;
}

int32_t ls_session_copy_prefix(ls_session *dst, const ls_session *src, int32_t n) {
    if (!dst || !src || dst == src || dst->m != src->m || n < 0) return LS_ERR_ARG;
    if (dst->pos != 0 || dst->window != src->window || dst->kv_mode != src->kv_mode || dst->loops > src->loops)
        return LS_ERR_STATE;
    if (n > src->pos || n > dst->max_seq) return LS_ERR_ARG;
    /* A future position attends back window - 1 rows (all rows without a
     * window); copy every row dst's ring can hold so the copy can itself
     * serve shorter prefixes later. */
    int32_t need_lo = dst->window > 0 && n - dst->window + 1 > 0 ? n - dst->window + 1 : 0;
    int32_t ring_lo = n > dst->cap ? n - dst->cap : 0;
    for (int32_t l = 0; l < dst->loops; l++) /* check everything before writing anything */
        if (src->loop_len[l] < n || (src->loop_lo[l] > ring_lo ? src->loop_lo[l] : ring_lo) > need_lo)
            return LS_ERR_STATE;
    for (int32_t l = 0; l < dst->loops; l++) {
        int32_t lo = src->loop_lo[l] > ring_lo ? src->loop_lo[l] : ring_lo;
        for (int32_t p = lo; p < n; p++) ls_kv_copy_slot(dst, p % dst->cap, src, p % src->cap, l);
        dst->loop_len[l] = n;
        dst->loop_lo[l] = lo;
    }
    memcpy(dst->tokens, src->tokens, (size_t)n * sizeof *dst->tokens);
    dst->pos = n;
    return LS_OK;
}

int32_t ls_session_step(ls_session *s, const int32_t *tokens, int32_t n, const ls_step_params *params,
                        float *logits_out) {
    if (!s || !params || params->reserved != 0) return LS_ERR_ARG;
    const int32_t loops = params->loops, top_k = params->top_k;
    const float temperature = params->temperature, top_p = params->top_p,
                repetition_penalty = params->repetition_penalty;
    const uint64_t seed = params->seed;
    /* Check the sampling arguments before the forward pass mutates the
     * session (ls_sample validates them again). */
    if (!(temperature >= 0.0f) || isinf(temperature) || top_k < 0 || !(top_p >= 0.0f && top_p <= 1.0f) ||
        !(repetition_penalty > 0.0f) || isinf(repetition_penalty))
        return LS_ERR_ARG;
    float *logits = logits_out ? logits_out : s->logits;
    int32_t rc = ls_session_forward(s, tokens, n, loops, logits, 1);
    if (rc != LS_OK) return rc;
    double t0 = ls_prof_now(s->m->rt);
    rc = ls_sample(logits, s->m->info.vocab_size, s->tokens, s->pos, temperature, top_k, top_p,
                   repetition_penalty, seed, (uint64_t)s->pos);
    ls_prof_add(s->m->rt, LS_PROF_SAMPLE, &t0);
    return rc;
}
