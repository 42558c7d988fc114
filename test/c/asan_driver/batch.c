// batch: ls_batch_step of mixed sessions against each stepped alone.
#include <stdlib.h>
#include <string.h>

#include "driver.h"

#define BATCH_SESSIONS 6
#define BATCH_NEW 5 /* tokens each session samples */

// Session k's shape: depth, window, cache mode, sampling; its prompt is the
// first 1 + (k * 29) % n of the tokens, fed in chunks of chunk[k].
static ls_session *batch_session(const fwd_args *a, int32_t k, ls_step_params *p, int32_t *prompt_len, int32_t *chunk) {
    static const int32_t windows[] = {0, 0, 5, 0, 3, 0};
    static const int32_t chunks[] = {1, 64, 3, 200, 2, 7};
    int32_t pow2 = (a->info.head_dim & (a->info.head_dim - 1)) == 0;
    int32_t modes[] = {LS_KV_FP16, LS_KV_INT8, LS_KV_INT4, pow2 ? LS_KV_INT4 | LS_KV_HADAMARD : LS_KV_INT8, LS_KV_FP16,
                       pow2 ? LS_KV_FP16 | LS_KV_HADAMARD : LS_KV_FP16};
    *prompt_len = 1 + (k * 29) % a->n;
    *chunk = chunks[k];
    *p = (ls_step_params){.loops = 1 + k % a->loops, .sampling = {.top_p = 1.0f, .repetition_penalty = k == 4 ? 1.3f : 1.0f}};
    if (k % 3 == 1) p->sampling = (ls_sampling){.temperature = 0.8f, .top_k = 20, .top_p = 0.9f, .repetition_penalty = 1.0f, .seed = 77u + (uint64_t)k};
    /* a model with an exit gate: both exit policies, the exact one where there is no window, and deferred
     * units of many positions (threshold 0: every token after one step) */
    static const int32_t policies[] = {LS_EXIT_EXACT, LS_EXIT_EXACT, LS_EXIT_COPY, LS_EXIT_NONE, LS_EXIT_COPY, LS_EXIT_EXACT};
    static const float thresholds[] = {0.0f, 0.5f, 0.6f, 0.0f, 0.3f, 0.8f};
    if (a->info.exit_gate) {
        p->exit_policy = policies[k];
        p->exit_threshold = thresholds[k];
    } else if (a->info.n_coda > 0) {
        /* a recurrent-depth model: the zero-shot rules (probes of the coda and head), at thresholds where a
         * random model's tokens exit at varied steps */
        static const int32_t rules[] = {LS_EXIT_RULE_ENTROPY, LS_EXIT_RULE_KL, LS_EXIT_RULE_ENTROPY, 0, LS_EXIT_RULE_KL, LS_EXIT_RULE_KL};
        static const float limits[] = {0.3f, 1.0f, 0.05f, 0.0f, 3.0f, 0.5f};
        p->exit_policy = policies[k] == LS_EXIT_NONE ? LS_EXIT_NONE : policies[k] | rules[k];
        p->exit_threshold = limits[k];
    }
    char err[256];
    ls_session_params sp = {.max_seq = *prompt_len + BATCH_NEW, .loops = a->loops, .cache_window = windows[k], .kv_mode = modes[k]};
    ls_session *s = ls_session_new(a->m, &sp, err, sizeof err);
    if (!s) printf("error: %s\n", err);
    return s;
}

int cmd_batch(int argc, char **argv) {
    if (argc < 3) return usage();
    /* open_forward's LOOPS: the model's default, read once loaded */
    char *args[argc + 1];
    args[0] = argv[0];
    args[1] = "64";
    for (int i = 1; i < argc; i++) args[i + 1] = argv[i];
    fwd_args a;
    int rc = open_forward(argc + 1, args, &a);
    if (rc != 0) return rc;
    a.loops = a.info.default_loops;
    size_t V = (size_t)a.info.vocab_size;
    int32_t solo_tok[BATCH_SESSIONS][BATCH_NEW], got_tok[BATCH_SESSIONS][BATCH_NEW];
    float *solo_lg = malloc((size_t)BATCH_SESSIONS * BATCH_NEW * V * sizeof(float));
    float *got_lg = malloc((size_t)BATCH_SESSIONS * BATCH_NEW * V * sizeof(float));
    float *row_lg = malloc((size_t)BATCH_SESSIONS * V * sizeof(float));
    ls_session *ss[BATCH_SESSIONS] = {0};
    ls_step_params sp[BATCH_SESSIONS];
    int32_t plen[BATCH_SESSIONS], chunk[BATCH_SESSIONS];
    if (!solo_lg || !got_lg || !row_lg) rc = 2;

    /* each session alone: the prompt in one step, then one token per step */
    for (int32_t k = 0; rc == 0 && k < BATCH_SESSIONS; k++) {
        ls_session *s = batch_session(&a, k, &sp[k], &plen[k], &chunk[k]);
        if (!s) rc = 2;
        int32_t feed = 0;
        for (int32_t j = 0; rc == 0 && j < BATCH_NEW; j++) {
            int32_t t = j == 0 ? ls_session_step(s, a.tokens, plen[k], &sp[k], solo_lg + ((size_t)k * BATCH_NEW + j) * V)
                               : ls_session_step(s, &feed, 1, &sp[k], solo_lg + ((size_t)k * BATCH_NEW + j) * V);
            if (t < 0) {
                printf("error: ls_session_step returned %d (session %d)\n", t, k);
                rc = 2;
            }
            solo_tok[k][j] = feed = t;
        }
        ls_session_free(s);
    }

    /* all together: session k joins at call k, feeds its prompt in chunks, then steps */
    for (int32_t k = 0; rc == 0 && k < BATCH_SESSIONS; k++) {
        ss[k] = batch_session(&a, k, &sp[k], &plen[k], &chunk[k]);
        if (!ss[k]) rc = 2;
    }
    int32_t fed[BATCH_SESSIONS] = {0}, made[BATCH_SESSIONS] = {0};
    for (int32_t call = 0; rc == 0; call++) {
        ls_session *rs[BATCH_SESSIONS];
        ls_batch_row rows[BATCH_SESSIONS];
        int32_t toks[BATCH_SESSIONS * 256], who[BATCH_SESSIONS], out[BATCH_SESSIONS], n_rows = 0, n_tok = 0;
        for (int32_t k = 0; k < BATCH_SESSIONS && k <= call; k++) {
            if (made[k] == BATCH_NEW) continue;
            int32_t n = 1;
            if (fed[k] < plen[k]) {
                n = plen[k] - fed[k] < chunk[k] ? plen[k] - fed[k] : chunk[k];
                memcpy(toks + n_tok, a.tokens + fed[k], (size_t)n * sizeof *toks);
                fed[k] += n;
            } else {
                toks[n_tok] = got_tok[k][made[k] - 1];
            }
            rows[n_rows] = (ls_batch_row){.n_tokens = n, .sample = fed[k] == plen[k], .step = sp[k]};
            rs[n_rows] = ss[k];
            who[n_rows++] = k;
            n_tok += n;
        }
        if (n_rows == 0) break;
        int32_t r = ls_batch_step(a.m, rs, rows, n_rows, toks, NULL, row_lg, out);
        if (r < 0) {
            printf("error: ls_batch_step returned %d at call %d\n", r, call);
            rc = 2;
        }
        for (int32_t i = 0; rc == 0 && i < n_rows; i++) {
            if (!rows[i].sample) continue;
            int32_t k = who[i];
            got_tok[k][made[k]] = out[i];
            memcpy(got_lg + ((size_t)k * BATCH_NEW + made[k]) * V, row_lg + (size_t)i * V, V * sizeof(float));
            made[k]++;
        }
    }
    for (int32_t k = 0; rc == 0 && k < BATCH_SESSIONS; k++)
        for (int32_t j = 0; rc == 0 && j < BATCH_NEW; j++) {
            size_t at = ((size_t)k * BATCH_NEW + j) * V;
            if (got_tok[k][j] != solo_tok[k][j] || memcmp(got_lg + at, solo_lg + at, V * sizeof(float)) != 0) {
                printf("error: session %d token %d differs batched (%d) and alone (%d)\n", k, j, got_tok[k][j], solo_tok[k][j]);
                rc = 2;
            }
        }
    if (rc == 0) printf("ok %d sessions bit-identical batched and alone\n", BATCH_SESSIONS);
    for (int32_t k = 0; k < BATCH_SESSIONS; k++) ls_session_free(ss[k]);
    free(solo_lg);
    free(got_lg);
    free(row_lg);
    close_forward(&a);
    return rc;
}
