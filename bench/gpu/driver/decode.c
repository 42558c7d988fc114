// The timings: greedy decode through ls_batch_step, the server's path (as
// bench/batch.ts measures it: each session holds its own 64-token prompt,
// one token per row per step), at a fixed depth or exiting by the gate.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "driver.h"

#define PROMPT 64

static int by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Seconds for the plan's steps of its rows in fresh sessions (prefill
 * untimed); *steps_run: the steps the timed tokens ran in all. Negative on
 * an error. */
static double one_round(const ls_api *api, ls_model *m, int32_t vocab, const decode_plan *d, int64_t *steps_run,
                        char *err, size_t err_len) {
    const int32_t rows = d->rows;
    ls_session **s = calloc((size_t)rows, sizeof *s);
    ls_batch_row *row = calloc((size_t)rows, sizeof *row);
    int32_t *next = calloc((size_t)rows, sizeof *next), *out = calloc((size_t)rows, sizeof *out);
    int32_t prompt[PROMPT + LS_BATCH_MAX_ROWS];
    double seconds = -1.0;
    int ok = s && row && next && out;
    for (int32_t i = 0; i < PROMPT + LS_BATCH_MAX_ROWS; i++) prompt[i] = (i * 7919 + 13) % vocab;
    const ls_step_params greedy = {.loops = d->loops, .exit_policy = d->exit_policy, .exit_threshold = d->exit_threshold,
                                   .sampling = {.top_p = 1.0f, .repetition_penalty = 1.0f}};
    for (int32_t i = 0; ok && i < rows; i++) {
        ok = (s[i] = api_session(api, m, PROMPT + d->steps + 1, d->loops, 0)) != NULL;
        if (ok) next[i] = api->session_step(s[i], prompt + i, PROMPT, &greedy, NULL);
        if (ok && next[i] < 0) {
            snprintf(err, err_len, "prefill: %s", api->status_str(next[i]));
            ok = 0;
        }
        row[i] = (ls_batch_row){.n_tokens = 1, .sample = 1, .step = greedy};
    }
    if (ok) {
        double t0 = now_seconds();
        for (int32_t k = 0; ok && k < d->steps; k++) {
            int32_t rc = api->batch_step(m, s, row, rows, next, NULL, NULL, out);
            if (rc != LS_OK) {
                snprintf(err, err_len, "ls_batch_step: %s", api->status_str(rc));
                ok = 0;
            }
            memcpy(next, out, (size_t)rows * sizeof *next);
            for (int32_t i = 0; ok && i < rows; i++) *steps_run += api->session_last_steps(s[i]);
        }
        if (ok) seconds = now_seconds() - t0;
    } else if (!err[0]) {
        snprintf(err, err_len, "cannot make %d sessions", rows);
    }
    api_free_sessions(api, s, rows);
    free(row);
    free(next);
    free(out);
    return seconds;
}

double decode_tok_s(const ls_api *api, ls_model *m, const decode_plan *d, double *mean_steps, char *err,
                    size_t err_len) {
    ls_model_info info;
    api->model_info_get(m, &info);
    err[0] = 0;
    if (d->rows < 1 || d->rows > LS_BATCH_MAX_ROWS || d->rounds < 1 || d->rounds > 16) {
        snprintf(err, err_len, "rows 1..%d and rounds 1..16", LS_BATCH_MAX_ROWS);
        return -1.0;
    }
    double times[16];
    int64_t steps_run = 0;
    if (one_round(api, m, info.vocab_size, d, &steps_run, err, err_len) < 0) return -1.0; /* warm-up */
    steps_run = 0;
    for (int32_t r = 0; r < d->rounds; r++)
        if ((times[r] = one_round(api, m, info.vocab_size, d, &steps_run, err, err_len)) < 0) return -1.0;
    qsort(times, (size_t)d->rounds, sizeof times[0], by_value);
    if (mean_steps) *mean_steps = (double)steps_run / ((double)d->rounds * d->rows * d->steps);
    return (double)d->rows * d->steps / times[d->rounds / 2];
}
