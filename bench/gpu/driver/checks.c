// The checks of one model: the candidate library against the reference
// (logits within the case's tolerance, the trained models' greedy tokens,
// temperature draws), and the candidate's own guarantees, bit for bit (a row
// alone and among 1 to 256 rows, with mixed depths and exit rules, a prompt
// in one call or token by token, rollback, prefix copies). A stacked
// model's own checks are stack_checks.c's. A new check is a function and a
// line of CHECKS.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "driver.h"

void prompt_of(int32_t *t, int32_t n, int32_t vocab, int32_t salt) {
    for (int32_t i = 0; i < n; i++) t[i] = (int32_t)(((int64_t)i * 7919 + 13 + (int64_t)salt * 104729) % vocab);
}

static double max_rel_diff(const float *a, const float *b, int32_t n) {
    double scale = 0.0, diff = 0.0;
    for (int32_t i = 0; i < n; i++) {
        scale = fmax(scale, fabs(a[i]));
        diff = fmax(diff, fabs((double)a[i] - b[i]));
    }
    return diff / fmax(scale, 1e-6);
}

int64_t first_diff(const float *a, const float *b, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof a[i]) != 0) return i;
    return -1;
}

int32_t last_logits(const ls_api *api, ls_model *m, const int32_t *tokens, int32_t n, int32_t loops,
                           int32_t window, float *out) {
    ls_session *s = api_session(api, m, n + 8, loops, window);
    if (!s) return LS_ERR_NOMEM;
    int32_t rc = api->session_forward(s, tokens, n, loops, out, 1);
    api->session_free(s);
    return rc;
}

check_status lib_error(const ls_api *api, int32_t rc, const char *what, char *detail, size_t len) {
    snprintf(detail, len, "%s: %s", what, api->status_str(rc));
    return ST_FAIL;
}

int32_t check_depth(const model_env *e) { return e->ctx->quick ? 2 : e->info.default_loops; }

// ---- against the reference ----

static check_status check_logits(model_env *e, char *detail, size_t len, double *value) {
    const int32_t vocab = e->info.vocab_size;
    int32_t prompt[PROMPT_LEN];
    prompt_of(prompt, PROMPT_LEN, vocab, 0);
    float *a = malloc((size_t)vocab * sizeof *a), *b = malloc((size_t)vocab * sizeof *b);
    check_status st = ST_PASS;
    *value = 0.0;
    const int32_t depths[2] = {1, check_depth(e)};
    for (int d = 0; d < 2 && st == ST_PASS; d++) {
        int32_t rc = last_logits(&e->ctx->ref, e->ref, prompt, PROMPT_LEN, depths[d], 0, a);
        if (rc == LS_OK) rc = last_logits(&e->ctx->cand, e->cand, prompt, PROMPT_LEN, depths[d], 0, b);
        if (rc != LS_OK) st = lib_error(&e->ctx->cand, rc, "forward", detail, len);
        else *value = fmax(*value, max_rel_diff(a, b, vocab));
    }
    if (st == ST_PASS) {
        snprintf(detail, len, "last logits of an %d-token prompt at loops 1 and %d", PROMPT_LEN, depths[1]);
        if (*value > e->mc->tol) st = ST_FAIL;
    }
    free(a);
    free(b);
    return st;
}

static check_status check_window(model_env *e, char *detail, size_t len, double *value) {
    const int32_t vocab = e->info.vocab_size, n = 150, window = 16;
    int32_t tokens[150];
    prompt_of(tokens, n, vocab, 3);
    float *a = malloc((size_t)vocab * sizeof *a), *b = malloc((size_t)vocab * sizeof *b);
    int32_t rc = last_logits(&e->ctx->ref, e->ref, tokens, n, 2, window, a);
    if (rc == LS_OK) rc = last_logits(&e->ctx->cand, e->cand, tokens, n, 2, window, b);
    check_status st = ST_PASS;
    if (rc != LS_OK) {
        st = lib_error(&e->ctx->cand, rc, "windowed forward", detail, len);
    } else {
        *value = max_rel_diff(a, b, vocab);
        snprintf(detail, len, "%d tokens through a %d-position window, loops 2", n, window);
        if (*value > e->mc->tol) st = ST_FAIL;
    }
    free(a);
    free(b);
    return st;
}

int32_t greedy_run(const ls_api *api, ls_model *m, const int32_t *prompt, const ls_step_params *p, int32_t *out,
                   int32_t *steps, int32_t n) {
    ls_session *s = api_session(api, m, PROMPT_LEN + n + 1, p->loops, 0);
    if (!s) return LS_ERR_NOMEM;
    int32_t rc = LS_OK, fed = PROMPT_LEN;
    const int32_t *input = prompt;
    for (int32_t i = 0; i < n && rc == LS_OK; i++) {
        int32_t t = api->session_step(s, input, fed, p, NULL);
        if (t < 0) rc = t;
        out[i] = t;
        if (steps) steps[i] = api->session_last_steps(s);
        input = &out[i];
        fed = 1;
    }
    api->session_free(s);
    return rc;
}

static check_status check_greedy(model_env *e, char *detail, size_t len, double *value) {
    int32_t prompt[PROMPT_LEN], a[16], b[16];
    prompt_of(prompt, PROMPT_LEN, e->info.vocab_size, 0);
    const int32_t loops = check_depth(e);
    const ls_step_params p = {.loops = loops, .sampling = {.top_p = 1.0f, .repetition_penalty = 1.1f}};
    int32_t rc = greedy_run(&e->ctx->ref, e->ref, prompt, &p, a, NULL, 16);
    if (rc == LS_OK) rc = greedy_run(&e->ctx->cand, e->cand, prompt, &p, b, NULL, 16);
    if (rc != LS_OK) return lib_error(&e->ctx->cand, rc, "greedy step", detail, len);
    int32_t same = 0;
    while (same < 16 && a[same] == b[same]) same++;
    *value = same;
    if (same == 16) {
        snprintf(detail, len, "16 tokens at loops %d, repetition penalty 1.1", loops);
        return ST_PASS;
    }
    snprintf(detail, len, "token %d: %d, reference %d", same, b[same], a[same]);
    return ST_FAIL;
}

static check_status check_sample(model_env *e, char *detail, size_t len, double *value) {
    /* temperature, top_k, top_p (repetition penalty 1) */
    const float settings[][3] = {{0.8f, 0, 1.0f}, {1.0f, 40, 1.0f}, {0.7f, 0, 0.9f}, {1.2f, 50, 0.8f}, {0.9f, 0, 0.0f}};
    const int32_t vocab = e->info.vocab_size;
    int32_t prompt[PROMPT_LEN];
    prompt_of(prompt, PROMPT_LEN, vocab, 1);
    float *logits = malloc((size_t)vocab * sizeof *logits);
    check_status st = ST_PASS;
    int32_t draws = 0;
    for (size_t k = 0; k < sizeof settings / sizeof settings[0] && st == ST_PASS; k++)
        for (uint64_t seed = 1; seed <= 3 && st == ST_PASS; seed++) {
            const ls_step_params p = {.loops = 2,
                                      .sampling = {.temperature = settings[k][0], .top_k = (int32_t)settings[k][1],
                                                   .top_p = settings[k][2], .repetition_penalty = 1.0f, .seed = seed}};
            ls_session *s = api_session(&e->ctx->cand, e->cand, PROMPT_LEN + 1, 2, 0);
            int32_t got = s ? e->ctx->cand.session_step(s, prompt, PROMPT_LEN, &p, logits) : LS_ERR_NOMEM;
            if (s) e->ctx->cand.session_free(s);
            if (got < 0) {
                st = lib_error(&e->ctx->cand, got, "sampling step", detail, len);
                break;
            }
            int32_t want = e->ctx->ref.sample(logits, vocab, prompt, PROMPT_LEN, &p.sampling, PROMPT_LEN);
            draws++;
            if (got != want) {
                snprintf(detail, len, "temperature %g top_k %d top_p %g seed %d: %d, ls_sample %d", p.sampling.temperature,
                         p.sampling.top_k, p.sampling.top_p, (int)seed, got, want);
                st = ST_FAIL;
            }
        }
    if (st == ST_PASS) snprintf(detail, len, "%d draws: the candidate's token equals the reference's ls_sample on its logits", draws);
    *value = draws;
    free(logits);
    return st;
}

// ---- the candidate's own guarantees ----

check_status bit_verdict(const ls_api *api, int32_t rc, const char *what, const float *a, const char *a_way,
                                const float *b, const char *b_way, int32_t n, const char *covered, char *detail,
                                size_t len) {
    if (rc != LS_OK) return lib_error(api, rc, what, detail, len);
    int64_t at = first_diff(a, b, n);
    if (at < 0) {
        snprintf(detail, len, "%s", covered);
        return ST_PASS;
    }
    snprintf(detail, len, "logit %lld: %.9g %s, %.9g %s", (long long)at, a[at], a_way, b[at], b_way);
    return ST_FAIL;
}

/* A check of the candidate against itself: a prompt, and the logits of the
 * two ways that must agree bit for bit. */
typedef struct {
    const ls_api *api;
    int32_t vocab;
    int32_t prompt[PROMPT_LEN];
    float *a, *b;
} self_check;

/* Its prompt (of `salt`) and logits rows: LS_OK, or LS_ERR_NOMEM. */
static int32_t self_check_begin(self_check *c, const model_env *e, int32_t salt) {
    c->api = &e->ctx->cand;
    c->vocab = e->info.vocab_size;
    prompt_of(c->prompt, PROMPT_LEN, c->vocab, salt);
    c->a = malloc((size_t)c->vocab * sizeof *c->a);
    c->b = malloc((size_t)c->vocab * sizeof *c->b);
    return c->a && c->b ? LS_OK : LS_ERR_NOMEM;
}

/* Its verdict (a bit check measures no value); the rows freed. */
static check_status self_check_end(self_check *c, int32_t rc, const char *what, const char *a_way, const char *b_way,
                                   const char *covered, char *detail, size_t len, double *value) {
    check_status st = bit_verdict(c->api, rc, what, c->a, a_way, c->b, b_way, c->vocab, covered, detail, len);
    *value = NAN;
    free(c->a);
    free(c->b);
    return st;
}

static check_status check_prefill(model_env *e, char *detail, size_t len, double *value) {
    self_check c;
    int32_t rc = self_check_begin(&c, e, 0);
    const ls_api *api = c.api;
    const int32_t loops = check_depth(e);
    if (rc == LS_OK) rc = last_logits(api, e->cand, c.prompt, PROMPT_LEN, loops, 0, c.a);
    ls_session *s = rc == LS_OK ? api_session(api, e->cand, PROMPT_LEN, loops, 0) : NULL;
    for (int32_t i = 0; s && rc == LS_OK && i < PROMPT_LEN; i++) rc = api->session_forward(s, c.prompt + i, 1, loops, c.b, 1);
    if (s) api->session_free(s);
    else if (rc == LS_OK) rc = LS_ERR_NOMEM;
    char covered[64];
    snprintf(covered, sizeof covered, "an %d-token prompt at loops %d", PROMPT_LEN, loops);
    return self_check_end(&c, rc, "forward", "in one call", "token by token", covered, detail, len, value);
}

static check_status check_rollback(model_env *e, char *detail, size_t len, double *value) {
    self_check c;
    int32_t rc = self_check_begin(&c, e, 2);
    const ls_api *api = c.api;
    ls_session *s = rc == LS_OK ? api_session(api, e->cand, PROMPT_LEN + 4, 2, 0) : NULL;
    rc = s ? api->session_forward(s, c.prompt, PROMPT_LEN, 2, c.a, 1) : LS_ERR_NOMEM;
    if (rc == LS_OK) rc = api->session_rollback(s, PROMPT_LEN - 3);
    if (rc == LS_OK && api->session_pos(s) != PROMPT_LEN - 3) rc = LS_ERR_STATE;
    if (rc == LS_OK) rc = api->session_forward(s, c.prompt + PROMPT_LEN - 3, 3, 2, c.b, 1);
    if (s) api->session_free(s);
    return self_check_end(&c, rc, "rollback", "before", "re-fed after the rollback",
                          "three positions rolled back and fed again", detail, len, value);
}

static check_status check_prefix(model_env *e, char *detail, size_t len, double *value) {
    self_check c;
    int32_t rc = self_check_begin(&c, e, 4);
    const ls_api *api = c.api;
    const int32_t loops = check_depth(e);
    ls_session *src = rc == LS_OK ? api_session(api, e->cand, PROMPT_LEN + 2, loops, 0) : NULL;
    ls_session *dst = rc == LS_OK ? api_session(api, e->cand, PROMPT_LEN + 2, loops, 0) : NULL;
    rc = src && dst ? api->session_forward(src, c.prompt, PROMPT_LEN, loops, NULL, 0) : LS_ERR_NOMEM;
    if (rc == LS_OK) rc = api->session_copy_prefix(dst, src, PROMPT_LEN - 2);
    if (rc == LS_OK && api->session_pos(dst) != PROMPT_LEN - 2) rc = LS_ERR_STATE;
    if (rc == LS_OK) rc = api->session_forward(dst, c.prompt + PROMPT_LEN - 2, 2, loops, c.a, 1);
    if (rc == LS_OK) rc = last_logits(api, e->cand, c.prompt, PROMPT_LEN, loops, 0, c.b);
    if (src) api->session_free(src);
    if (dst) api->session_free(dst);
    char covered[80];
    snprintf(covered, sizeof covered, "%d positions copied, 2 fed after them, loops %d", PROMPT_LEN - 2, loops);
    return self_check_end(&c, rc, "prefix copy", "after the copy", "in one session", covered, detail, len, value);
}

// ---- one row alone and among others ----

#define ROW_STEPS 4
#define TARGET_PROMPT 7

/* Row i of a batch of n whose target is row t: its prompt and step
 * settings. In a model with an exit gate the rows mix exit rules too: the
 * target exits by its gate (exact, 0.5), the others by no gate, or by the
 * gate at other thresholds under either policy. */
static void row_plan(int32_t i, int32_t t, int32_t vocab, int32_t loops, int gate, int32_t *prompt, int32_t *plen,
                     ls_step_params *p) {
    *plen = i == t ? TARGET_PROMPT : 1 + (i * 5) % 11;
    prompt_of(prompt, *plen, vocab, i == t ? 0 : i + 1);
    const ls_sampling greedy = {.top_p = 1.0f, .repetition_penalty = 1.1f},
                      warm = {.temperature = 0.8f, .top_k = 40, .top_p = 1.0f, .repetition_penalty = 1.0f, .seed = (uint64_t)i};
    *p = (ls_step_params){.loops = i == t ? loops : 1 + i % loops, .sampling = i != t && i % 3 == 1 ? warm : greedy};
    if (!gate) return;
    const int32_t policies[4] = {LS_EXIT_NONE, LS_EXIT_EXACT, LS_EXIT_COPY, LS_EXIT_EXACT};
    const float thresholds[4] = {0.0f, 0.7f, 0.5f, 0.0f};
    p->exit_policy = i == t ? LS_EXIT_EXACT : policies[i % 4];
    p->exit_threshold = i == t ? 0.5f : thresholds[i % 4];
}

/* The target row's logits, tokens and steps over ROW_STEPS steps in batches
 * of n rows (n == 0: alone, through ls_session_step). 0 or an LS_ERR_*. */
static int32_t row_run(const ls_api *api, ls_model *m, int32_t n, int32_t loops, const ls_model_info *info,
                       float *logits, int32_t *tokens, int32_t *steps) {
    const int32_t rows = n > 0 ? n : 1, t = rows / 2, vocab = info->vocab_size;
    ls_session **s = calloc((size_t)rows, sizeof *s);
    ls_batch_row *row = calloc((size_t)rows, sizeof *row);
    int32_t *feed = malloc((size_t)rows * 16 * sizeof *feed), *out = calloc((size_t)rows, sizeof *out);
    float *all = n > 0 ? malloc((size_t)rows * vocab * sizeof *all) : NULL;
    int32_t rc = s && row && feed && out && (n == 0 || all) ? LS_OK : LS_ERR_NOMEM;
    int32_t plen[LS_BATCH_MAX_ROWS];
    ls_step_params p[LS_BATCH_MAX_ROWS];
    for (int32_t i = 0; i < rows && rc == LS_OK; i++) {
        int32_t prompt[16];
        row_plan(i, t, vocab, loops, info->exit_gate, prompt, &plen[i], &p[i]);
        if (!(s[i] = api_session(api, m, 32, loops, 0))) rc = LS_ERR_NOMEM;
    }
    for (int32_t k = 0; k < ROW_STEPS && rc == LS_OK; k++) {
        int32_t at = 0;
        for (int32_t i = 0; i < rows; i++) {
            int32_t prompt[16], ignored;
            ls_step_params same;
            row_plan(i, t, vocab, loops, info->exit_gate, prompt, &ignored, &same);
            int32_t nt = k == 0 ? plen[i] : 1;
            if (k == 0) memcpy(feed + at, prompt, (size_t)nt * sizeof *feed);
            else feed[at] = out[i];
            row[i] = (ls_batch_row){.n_tokens = nt, .sample = 1, .step = p[i]};
            at += nt;
        }
        if (n == 0) {
            int32_t id = api->session_step(s[0], feed, row[0].n_tokens, &p[0], logits + (size_t)k * vocab);
            rc = id < 0 ? id : LS_OK;
            out[0] = id;
        } else {
            rc = api->batch_step(m, s, row, rows, feed, NULL, all, out);
            if (rc == LS_OK) memcpy(logits + (size_t)k * vocab, all + (size_t)t * vocab, (size_t)vocab * sizeof *all);
        }
        tokens[k] = out[t];
        steps[k] = api->session_last_steps(s[t]);
    }
    api_free_sessions(api, s, rows);
    free(row);
    free(feed);
    free(out);
    free(all);
    return rc;
}

static check_status check_rows(model_env *e, char *detail, size_t len, double *value) {
    const ls_api *api = &e->ctx->cand;
    const int32_t vocab = e->info.vocab_size, loops = check_depth(e);
    const int32_t full[] = {1, 9, 64, 65, 256}, quick[] = {1, 9, 65};
    const int32_t *counts = e->ctx->quick ? quick : full, n_counts = e->ctx->quick ? 3 : 5;
    float *alone = malloc((size_t)ROW_STEPS * vocab * sizeof *alone), *among = malloc((size_t)ROW_STEPS * vocab * sizeof *among);
    int32_t alone_tokens[ROW_STEPS], among_tokens[ROW_STEPS], alone_steps[ROW_STEPS], among_steps[ROW_STEPS];
    int32_t rc = alone && among ? row_run(api, e->cand, 0, loops, &e->info, alone, alone_tokens, alone_steps) : LS_ERR_NOMEM;
    check_status st = rc != LS_OK ? lib_error(api, rc, "stepping the row alone", detail, len) : ST_PASS;
    for (int32_t c = 0; c < n_counts && st == ST_PASS; c++) {
        rc = row_run(api, e->cand, counts[c], loops, &e->info, among, among_tokens, among_steps);
        if (rc != LS_OK) {
            char what[64];
            snprintf(what, sizeof what, "a batch of %d rows", counts[c]);
            st = lib_error(api, rc, what, detail, len);
            break;
        }
        int64_t at = first_diff(alone, among, (int64_t)ROW_STEPS * vocab);
        int tok = memcmp(alone_tokens, among_tokens, sizeof alone_tokens);
        int stp = memcmp(alone_steps, among_steps, sizeof alone_steps);
        if (at >= 0 || tok != 0 || stp != 0) {
            snprintf(detail, len, "among %d rows, step %lld: %s", counts[c], (long long)(at >= 0 ? at / vocab : 0),
                     at >= 0 ? "the logits differ from the row's alone"
                     : tok   ? "the token differs from the row's alone"
                             : "the steps it ran differ from the row's alone");
            st = ST_FAIL;
        }
    }
    if (st == ST_PASS)
        snprintf(detail, len, "%d steps of a row alone (ls_session_step) and among %s rows (ls_batch_step), mixed depths%s "
                 "and sampling",
                 ROW_STEPS, e->ctx->quick ? "1, 9, 65" : "1, 9, 64, 65, 256",
                 e->info.exit_gate ? ", exit thresholds and policies" : "");
    *value = NAN;
    free(alone);
    free(among);
    return st;
}

static check_status check_memory(model_env *e, char *detail, size_t len, double *value) {
    uint64_t free_b = 0, total_b = 0;
    int32_t rc = e->ctx->cand.model_device_memory(e->cand, &free_b, &total_b);
    *value = NAN;
    if (!e->ctx->cand.cuda_device_count) { /* a library whose models live in host memory */
        snprintf(detail, len, "a CPU library reports no device memory: %s", e->ctx->cand.status_str(rc));
        return rc == LS_ERR_UNSUPPORTED ? ST_PASS : ST_FAIL;
    }
    if (rc != LS_OK) return lib_error(&e->ctx->cand, rc, "ls_model_device_memory", detail, len);
    *value = (double)free_b / 1e9;
    snprintf(detail, len, "%.1f GB free of %.1f GB, the weights loaded", (double)free_b / 1e9, (double)total_b / 1e9);
    return free_b > 0 && free_b <= total_b ? ST_PASS : ST_FAIL;
}

/* Which models a check applies to. */
enum { ALL, TRAINED, GATE, EXITS, SOURCE };

typedef struct {
    const char *name;
    model_check_fn run;
    const char *bar; /* NULL: the case's tolerance */
    int applies;     /* greedy tokens: trained models only (a random model's near-ties make no bar) */
} model_check;

static const model_check CHECKS[] = {
    {"logits", check_logits, NULL, ALL},
    {"window", check_window, NULL, ALL},
    {"greedy", check_greedy, "the reference's 16 tokens", TRAINED},
    {"exits", check_exits, "the reference's tokens and exit steps", EXITS},
    {"import", check_import, "bit-identical", SOURCE},
    {"sample", check_sample, "ls_sample's token", ALL},
    {"prefill-vs-steps", check_prefill, "bit-identical", ALL},
    {"rollback", check_rollback, "bit-identical", ALL},
    {"prefix-copy", check_prefix, "bit-identical", ALL},
    {"rows", check_rows, "bit-identical", ALL},
    {"deferred", check_deferred, "bit-identical", GATE},
    {"device-memory", check_memory, "0 < free <= total", ALL},
};

/* Whether the case runs check c: it applies to the model, and the case's list (if any) names it. */
static int runs_check(const model_env *e, const model_check *c) {
    const model_case *mc = e->mc;
    const int applies = c->applies == ALL || (c->applies == TRAINED && mc->trained) ||
                        (c->applies == GATE && e->info.exit_gate) || (c->applies == EXITS && mc->exits) ||
                        (c->applies == SOURCE && mc->source);
    if (!applies || !mc->checks) return applies;
    const size_t n = strlen(c->name);
    for (const char *p = mc->checks; (p = strstr(p, c->name)) != NULL; p += n)
        if ((p == mc->checks || p[-1] == ',') && (p[n] == ',' || p[n] == 0)) return 1;
    return 0;
}

void run_model_checks(model_env *e) {
    for (size_t i = 0; i < sizeof CHECKS / sizeof CHECKS[0]; i++) {
        const model_check *c = &CHECKS[i];
        if (!runs_check(e, c)) continue;
        char name[128], detail[512] = "", bar[32];
        snprintf(name, sizeof name, "%s/%s", e->mc->name, c->name);
        snprintf(bar, sizeof bar, "<= %g", e->mc->tol);
        double value = NAN, t0 = now_seconds();
        check_status st = c->run(e, detail, sizeof detail, &value);
        report_check(name, st, value, c->bar ? c->bar : bar, detail, now_seconds() - t0);
    }
}
