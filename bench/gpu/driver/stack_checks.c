// The checks a stacked model with an exit gate adds (checks.c runs them):
//   exits     greedy tokens and each token's exit step equal the reference's
//             at fixed depths 1-4 and at thresholds 0.5 and 0.7 under both
//             exit policies, on several prompts (trained models);
//   deferred  the candidate's own exact early exit: many tokens leave after
//             one step, more than a block has room for, and every entry point
//             then computes their deferred units first (a forward pass, a
//             batched step, a prefix copy, a rollback), each giving the logits
//             of computing every step for every token, bit for bit;
//   import    a model in the Ouro import's layout computes its source's
//             function: the reference's logits are the source's, bit for bit.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "driver.h"

// ---- exits ----

#define EXIT_TOKENS 16
#define EXIT_PROMPTS 3 /* on a GPU host; one where the run holds the CPU library to itself */

typedef struct {
    const char *name;
    int32_t loops, policy;
    float threshold;
} exit_setting;

static const exit_setting EXIT_SETTINGS[] = {
    {"fixed 1", 1, LS_EXIT_NONE, 0.0f},     {"fixed 2", 2, LS_EXIT_NONE, 0.0f},     {"fixed 3", 3, LS_EXIT_NONE, 0.0f},
    {"fixed 4", 4, LS_EXIT_NONE, 0.0f},     {"exact 0.5", 4, LS_EXIT_EXACT, 0.5f}, {"copy 0.5", 4, LS_EXIT_COPY, 0.5f},
    {"exact 0.7", 4, LS_EXIT_EXACT, 0.7f}, {"copy 0.7", 4, LS_EXIT_COPY, 0.7f},
};
#define N_EXIT_SETTINGS (int32_t)(sizeof EXIT_SETTINGS / sizeof EXIT_SETTINGS[0])

check_status check_exits(model_env *e, char *detail, size_t len, double *value) {
    int32_t early = 0, runs = 0;
    const int32_t prompts = e->ctx->gpu ? EXIT_PROMPTS : 1;
    *value = 0;
    for (int32_t k = 0; k < N_EXIT_SETTINGS; k++) {
        const exit_setting *x = &EXIT_SETTINGS[k];
        const ls_step_params p = {.loops = x->loops, .exit_policy = x->policy, .exit_threshold = x->threshold,
                                  .sampling = {.top_p = 1.0f, .repetition_penalty = 1.1f}};
        for (int32_t salt = 0; salt < prompts; salt++) {
            int32_t prompt[PROMPT_LEN], a[EXIT_TOKENS], b[EXIT_TOKENS], sa[EXIT_TOKENS], sb[EXIT_TOKENS];
            prompt_of(prompt, PROMPT_LEN, e->info.vocab_size, 5 * salt);
            int32_t rc = greedy_run(&e->ctx->ref, e->ref, prompt, &p, a, sa, EXIT_TOKENS);
            if (rc == LS_OK) rc = greedy_run(&e->ctx->cand, e->cand, prompt, &p, b, sb, EXIT_TOKENS);
            if (rc != LS_OK) return lib_error(&e->ctx->cand, rc, x->name, detail, len);
            for (int32_t i = 0; i < EXIT_TOKENS; i++) {
                if (a[i] == b[i] && sa[i] == sb[i]) {
                    early += sa[i] < x->loops;
                    continue;
                }
                snprintf(detail, len, "%s, prompt %d, token %d: %d after %d steps, the reference's %d after %d", x->name,
                         salt, i, b[i], sb[i], a[i], sa[i]);
                return ST_FAIL;
            }
            *value = ++runs;
        }
    }
    snprintf(detail, len,
             "%d settings (fixed 1-4; exact and copy at 0.5 and 0.7) x %d prompt(s), %d greedy tokens each (%d of them "
             "exited early)",
             N_EXIT_SETTINGS, prompts, EXIT_TOKENS, early);
    return ST_PASS;
}

// ---- deferred ----

/* The logits of `tokens` fed one way after another, into a: the way's status. */
typedef int32_t (*entry_way)(const ls_api *api, ls_model *m, ls_session *src, const int32_t *tokens, int32_t n,
                             int32_t loops, float *out);

/* A prefix copy of src, then the next token through ls_session_forward. */
static int32_t by_copy(const ls_api *api, ls_model *m, ls_session *src, const int32_t *tokens, int32_t n, int32_t loops,
                       float *out) {
    ls_session *s = api_session(api, m, n + 1, loops, 0);
    int32_t rc = s ? api->session_copy_prefix(s, src, n - 1) : LS_ERR_NOMEM;
    if (rc == LS_OK) rc = api->session_forward(s, tokens + n - 1, 1, loops, out, 1);
    if (s) api->session_free(s);
    return rc;
}

/* A prefix copy, then the next token as a batched row at fixed depth. */
static int32_t by_batch(const ls_api *api, ls_model *m, ls_session *src, const int32_t *tokens, int32_t n,
                        int32_t loops, float *out) {
    ls_session *s = api_session(api, m, n + 1, loops, 0);
    int32_t rc = s ? api->session_copy_prefix(s, src, n - 1) : LS_ERR_NOMEM, id = 0;
    const ls_batch_row row = {.n_tokens = 1, .sample = 1,
                              .step = {.loops = loops, .sampling = {.top_p = 1.0f, .repetition_penalty = 1.0f}}};
    if (rc == LS_OK) rc = api->batch_step(m, &s, &row, 1, tokens + n - 1, NULL, out, &id);
    if (s) api->session_free(s);
    return rc;
}

/* A prefix copy rolled back by 5 positions, then the last 6 tokens in one forward pass. */
static int32_t by_rollback(const ls_api *api, ls_model *m, ls_session *src, const int32_t *tokens, int32_t n,
                           int32_t loops, float *out) {
    ls_session *s = api_session(api, m, n + 1, loops, 0);
    int32_t rc = s ? api->session_copy_prefix(s, src, n - 1) : LS_ERR_NOMEM;
    if (rc == LS_OK) rc = api->session_rollback(s, n - 6);
    if (rc == LS_OK) rc = api->session_forward(s, tokens + n - 6, 6, loops, out, 1);
    if (s) api->session_free(s);
    return rc;
}

/* The session itself: the next token through ls_session_forward. */
static int32_t by_forward(const ls_api *api, ls_model *m, ls_session *src, const int32_t *tokens, int32_t n,
                          int32_t loops, float *out) {
    (void)m;
    return api->session_forward(src, tokens + n - 1, 1, loops, out, 1);
}

check_status check_deferred(model_env *e, char *detail, size_t len, double *value) {
    const ls_api *api = &e->ctx->cand;
    const int32_t vocab = e->info.vocab_size, loops = check_depth(e);
    /* more positions leave early than a block keeps room for (LS_CHUNK), outside the short run */
    const int32_t exits = e->ctx->quick ? 20 : 70, n = PROMPT_LEN + exits + 1;
    int32_t *tokens = malloc((size_t)n * sizeof *tokens);
    float *want = malloc((size_t)vocab * sizeof *want), *got = malloc((size_t)vocab * sizeof *got);
    ls_session *s = tokens && want && got ? api_session(api, e->cand, n + 1, loops, 0) : NULL;
    int32_t rc = s ? LS_OK : LS_ERR_NOMEM;
    /* threshold 0: every token leaves after its first step, its deeper units deferred */
    const ls_step_params leave = {.loops = loops, .exit_policy = LS_EXIT_EXACT, .exit_threshold = 0.0f,
                                  .sampling = {.top_p = 1.0f, .repetition_penalty = 1.1f}};
    if (rc == LS_OK) prompt_of(tokens, PROMPT_LEN, vocab, 7);
    for (int32_t i = 0, fed = PROMPT_LEN; rc == LS_OK && i <= exits; i++) {
        int32_t t = api->session_step(s, tokens + PROMPT_LEN + i - fed, fed, &leave, NULL);
        if (t < 0) rc = t;
        else if (api->session_last_steps(s) != 1) rc = LS_ERR_STATE;
        tokens[PROMPT_LEN + i] = t;
        fed = 1;
    }
    /* every step computed for every token: the tokens through a fresh session at full depth */
    if (rc == LS_OK) rc = last_logits(api, e->cand, tokens, n, loops, 0, want);
    const entry_way ways[] = {by_copy, by_batch, by_rollback, by_forward};
    const char *names[] = {"a prefix copy and a forward pass", "a prefix copy and a batched step",
                           "a prefix copy rolled back and fed again", "a forward pass"};
    check_status st = rc != LS_OK ? lib_error(api, rc, "leaving early", detail, len) : ST_PASS;
    for (int32_t w = 0; w < 4 && st == ST_PASS; w++) {
        rc = ways[w](api, e->cand, s, tokens, n, loops, got);
        char covered[200];
        snprintf(covered, sizeof covered,
                 "%d tokens left after one step (exact policy); then a prefix copy and a forward pass, a batched step, "
                 "a rollback, a forward pass: each the logits of every step computed",
                 exits);
        st = bit_verdict(api, rc, names[w], want, "every step computed", got, names[w], vocab, covered, detail, len);
    }
    if (s) api->session_free(s);
    *value = NAN;
    free(tokens);
    free(want);
    free(got);
    return st;
}

// ---- import ----

check_status check_import(model_env *e, char *detail, size_t len, double *value) {
    char path[2048], why[512] = "";
    const model_case *src = case_named(e->mc->source);
    ls_model *m = src && case_model_path(e->ctx, src, path, sizeof path, why, sizeof why)
                      ? api_load(&e->ctx->ref, path, why, sizeof why)
                      : NULL;
    *value = NAN;
    if (!m) {
        snprintf(detail, len, "the source model: %s", src ? why : "no such case");
        return ST_FAIL;
    }
    const int32_t vocab = e->info.vocab_size, depths[2] = {1, check_depth(e)};
    int32_t prompt[PROMPT_LEN];
    prompt_of(prompt, PROMPT_LEN, vocab, 0);
    float *a = malloc((size_t)vocab * sizeof *a), *b = malloc((size_t)vocab * sizeof *b);
    check_status st = ST_PASS;
    for (int d = 0; d < 2 && st == ST_PASS; d++) {
        int32_t rc = last_logits(&e->ctx->ref, m, prompt, PROMPT_LEN, depths[d], 0, a);
        if (rc == LS_OK) rc = last_logits(&e->ctx->ref, e->ref, prompt, PROMPT_LEN, depths[d], 0, b);
        char covered[160];
        snprintf(covered, sizeof covered, "the reference's last logits at loops 1 and %d: the source model's (%s)",
                 depths[1], src->name);
        st = bit_verdict(&e->ctx->ref, rc, "forward", a, "the source's", b, "this layout's", vocab, covered, detail, len);
    }
    e->ctx->ref.model_free(m);
    free(a);
    free(b);
    return st;
}
