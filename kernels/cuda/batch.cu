/*
 * batch.cu — ls_batch_step for the GPU: the same checks as the CPU library
 * (batch_rules.h), then each row in call order through this library's
 * ls_session_forward / ls_session_step. Every row's result is what it
 * would be alone (the GPU kernels are batch-invariant on their own), so the
 * contract holds; the rows do not yet share one pass over the weights.
 */
#include "cuda_internal.h"

extern "C" {
#include "batch_rules.h"
}

extern "C" int32_t ls_batch_step(ls_model *m, ls_session *const *sessions, const ls_batch_row *rows, int32_t n_rows,
                                 const int32_t *tokens, float *logits_out, int32_t *out) {
    int32_t rc = ls_check_batch(m, sessions, rows, n_rows, tokens, out);
    if (rc != LS_OK) return rc;
    int32_t vocab = m->info.vocab_size;
    for (int32_t i = 0, off = 0; i < n_rows; off += rows[i].n_tokens, i++) {
        const ls_batch_row *r = &rows[i];
        int32_t got = r->sample
                          ? ls_session_step(sessions[i], tokens + off, r->n_tokens, &r->step,
                                            logits_out ? logits_out + (size_t)i * vocab : NULL)
                          : ls_session_forward(sessions[i], tokens + off, r->n_tokens, r->step.loops, NULL, 0);
        out[i] = r->sample || got < 0 ? got : LS_OK;
        if (got < 0 && rc == LS_OK) rc = got;
    }
    return rc;
}
