/*
 * step.c — one generation step in one call (ls_session_step): the forward
 * pass of the fed tokens, then the draw from the last row's logits. Above
 * both the forward pass (forward.c) and the session (session.c); a step
 * that may exit early runs as a batch of one (batch.c).
 */
#include "forward.h"
#include "runtime.h"
#include "session.h"
#include "batch_rules.h" /* after session.h: it reads sessions through ls_session_view */

int32_t ls_session_step(ls_session *s, const int32_t *tokens, int32_t n, const ls_step_params *params,
                        float *logits_out) {
    /* The sampling arguments are checked before the forward pass mutates the
     * session (ls_sample checks them again). */
    if (!s || !params || !ls_step_params_ok(params, 1) || params->masked ||
        !ls_step_exit_ok(ls_session_view(s), params))
        return LS_ERR_ARG;
    if (ls_step_exits(s->m, params, 1, n)) {
        /* a step that may exit early is a batch of one (batch.c decides the exits) */
        ls_batch_row row = {n, 1, *params};
        int32_t out = 0;
        int32_t rc = ls_batch_step(s->m, &s, &row, 1, tokens, NULL, logits_out, &out);
        return rc != LS_OK ? rc : out;
    }
    float *logits = logits_out ? logits_out : s->logits;
    int32_t rc = ls_session_forward(s, tokens, n, params->loops, logits, 1);
    if (rc != LS_OK) return rc;
    s->last_steps = params->loops;
    double t0 = ls_prof_now(s->m->rt);
    rc = ls_step_sample(s, logits, params);
    ls_prof_add(s->m->rt, LS_PROF_SAMPLE, &t0);
    return rc;
}
