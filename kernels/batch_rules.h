/*
 * batch_rules.h — ls_batch_step's checks of its arguments, shared by the
 * CPU library (batch.c) and the CUDA one. Include after the library's
 * session definition (ls_session_view). Not ABI.
 */
#ifndef LS_BATCH_RULES_H
#define LS_BATCH_RULES_H

#include "session_rules.h"

/* A step's settings as ls_session_step accepts them (sampling checked only
 * when the row samples). */
static inline int ls_step_params_ok(const ls_step_params *p, int32_t sample) {
    return p->reserved == 0 &&
           (!sample || ls_sampling_ok(&p->sampling));
}

/* Checks every row before anything runs: distinct sessions of model m, each
 * row's tokens, depth and room as ls_session_step checks them. Writes each
 * row's status to out; returns the first error, or LS_OK. */
static inline int32_t ls_check_batch(const ls_model *m, ls_session *const *sessions, const ls_batch_row *rows,
                                     int32_t n_rows, const int32_t *tokens, int32_t *out) {
    if (!m || !sessions || !rows || !tokens || !out || n_rows < 1 || n_rows > LS_BATCH_MAX_ROWS) return LS_ERR_ARG;
    int32_t first = LS_OK;
    int64_t off = 0;
    for (int32_t i = 0; i < n_rows; i++) {
        const ls_batch_row *r = &rows[i];
        int32_t rc = LS_OK;
        if (!sessions[i] || ls_session_view(sessions[i]).m != m || r->n_tokens < 1 || (r->sample != 0 && r->sample != 1) ||
            !ls_step_params_ok(&r->step, r->sample))
            rc = LS_ERR_ARG;
        for (int32_t j = 0; j < i && rc == LS_OK; j++)
            if (sessions[j] == sessions[i]) rc = LS_ERR_ARG;
        if (rc == LS_OK) rc = ls_check_feed(ls_session_view(sessions[i]), tokens + off, r->n_tokens, r->step.loops);
        if (r->n_tokens > 0) off += r->n_tokens;
        out[i] = rc;
        if (rc != LS_OK && first == LS_OK) first = rc;
    }
    return first;
}

#endif
