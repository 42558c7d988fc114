// The checks of the libraries as a whole: what the CUDA library reports
// and refuses (on any host where it is built: the gating of unverified
// kernel families is checked without a GPU too), and on a GPU its
// self-test of the device kernels against their host arithmetic.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/loopserve_cuda.h"
#include "driver.h"

static void check(const char *name, int ok, const char *bar, const char *detail, double t0) {
    report_check(name, ok ? ST_PASS : ST_FAIL, NAN, bar, detail, now_seconds() - t0);
}

/* ls_features of each library: the CPU library every feature, the CUDA
 * library those of its kernel families in use. */
static void features(const run_ctx *ctx) {
    double t0 = now_seconds();
    char detail[256];
    const int32_t all = LS_FEATURE_SPECULATIVE | LS_FEATURE_PROFILE | LS_FEATURE_KV_COMPRESSED | LS_FEATURE_STACKS |
                        LS_FEATURE_QUANTIZED | LS_FEATURE_TOKEN_MASK | LS_FEATURE_QUANTIZE | LS_FEATURE_RECURRENT;
    int32_t cpu = ctx->ref.features();
    snprintf(detail, sizeof detail, "features 0x%x", cpu);
    check("library/cpu-features", cpu == all, "every LS_FEATURE_*", detail, t0);
    if (!ctx->cuda) return;
    const ls_api *cuda = ctx->cuda;
    int32_t on = cuda->cuda_kernels(-1);
    int32_t want = (on & LS_CUDA_KERNELS_QUANT ? LS_FEATURE_QUANTIZED : 0) | (on & LS_CUDA_KERNELS_STACKS ? LS_FEATURE_STACKS : 0);
    snprintf(detail, sizeof detail, "features 0x%x with kernel families 0x%x in use (0x%x verified)", cuda->features(),
             on, cuda->cuda_kernels_verified());
    /* the value: the verified families, which the report's target reads */
    report_check("library/cuda-features", cuda->features() == want ? ST_PASS : ST_FAIL, cuda->cuda_kernels_verified(),
                 "the families in use", detail, now_seconds() - t0);
}

/* A kernel family, a model case that needs it, and what its refusal names
 * (NULL: a family that serves the same models faster, which nothing needs). */
typedef struct {
    int32_t family, feature;
    const char *name, *model, *refusal;
} family_case;

static const family_case FAMILIES[] = {
    {LS_CUDA_KERNELS_QUANT, LS_FEATURE_QUANTIZED, "gating", "int4-g32", "int4 weights"},
    {LS_CUDA_KERNELS_STACKS, LS_FEATURE_STACKS, "stacks-gating", "stack-2-layers", "stacked model"},
    {LS_CUDA_KERNELS_RESIDENT, 0, "resident-gating", "fp16", NULL},
};

/* An unverified family is off by default and its model refused by name (a
 * speed family's model served all the same, the family not in use);
 * enabled, the model gets past the refusal (to the device check without a
 * GPU). The selector is left as found. */
static void gating(const run_ctx *ctx, const family_case *f) {
    if (!ctx->cuda) return;
    const ls_api *cuda = ctx->cuda;
    char path[2048], why[512] = "", err[1024] = "", detail[1400], name[64];
    double t0 = now_seconds();
    const model_case *mc = case_named(f->model);
    snprintf(name, sizeof name, "library/cuda-%s", f->name);
    if (!case_model_path(ctx, mc, path, sizeof path, why, sizeof why)) {
        check(name, 0, "refused by name while off", why, t0);
        return;
    }
    int32_t was = cuda->cuda_kernels(-1), verified = cuda->cuda_kernels_verified();
    int32_t off = cuda->cuda_kernels(0);
    ls_model *m = api_load(cuda, path, err, sizeof err);
    int loads = m || (!ctx->gpu && strstr(err, "no usable CUDA device"));
    int refused = f->refusal ? !m && strstr(err, f->refusal) && strstr(err, "validation run")
                             : loads && !(off & f->family);
    int features_off = (cuda->features() & f->feature) == ((verified & f->family) ? f->feature : 0);
    if (m) cuda->model_free(m);
    snprintf(detail, sizeof detail, "off: %s", m ? "loaded" : err);
    if (verified & f->family) {
        snprintf(detail, sizeof detail, "the family is verified: on by default");
        refused = 1;
    }
    snprintf(name, sizeof name, "library/cuda-%s-off", f->name);
    check(name, refused && features_off, f->refusal ? "refused by name while off" : "served while off, the family not in use",
          detail, t0);
    t0 = now_seconds();
    cuda->cuda_kernels(f->family);
    m = api_load(cuda, path, err, sizeof err);
    int passed = m || (!ctx->gpu && strstr(err, "no usable CUDA device"));
    int features_on = (cuda->features() & f->feature) == f->feature;
    snprintf(detail, sizeof detail, "enabled: %s", m ? "loaded" : err);
    if (m) cuda->model_free(m);
    snprintf(name, sizeof name, "library/cuda-%s-on", f->name);
    check(name, passed && features_on, ctx->gpu ? "loads" : "gets to the device check", detail, t0);
    cuda->cuda_kernels(was);
}

/* A recurrent-depth model is refused by name with every kernel family on
 * (its stacks would otherwise pass the stacks family's check); the refusal
 * comes before the device's, so it holds without a GPU too. */
static void recurrent_refused(const run_ctx *ctx) {
    if (!ctx->cuda) return;
    const ls_api *cuda = ctx->cuda;
    char path[2048], why[512] = "", err[1024] = "", detail[1100];
    double t0 = now_seconds();
    const model_case *mc = case_named("recurrent-prelude-coda");
    if (!case_model_path(ctx, mc, path, sizeof path, why, sizeof why)) {
        check("library/cuda-recurrent-refused", 0, "refused by name", why, t0);
        return;
    }
    int32_t was = cuda->cuda_kernels(-1);
    cuda->cuda_kernels(LS_CUDA_KERNELS_QUANT | LS_CUDA_KERNELS_STACKS);
    ls_model *m = api_load(cuda, path, err, sizeof err);
    cuda->cuda_kernels(was);
    snprintf(detail, sizeof detail, "every family on: %s", m ? "loaded" : err);
    if (m) cuda->model_free(m);
    check("library/cuda-recurrent-refused", !m && strstr(err, mc->refusal), "refused by name", detail, t0);
}

/* What the CUDA library still refuses, on a GPU: compressed caches, speculative cycles. */
static void refusals(const run_ctx *ctx) {
    if (!ctx->gpu) return;
    char path[2048], why[512] = "", err[1024] = "", detail[1100];
    double t0 = now_seconds();
    const model_case *mc = case_named("fp16");
    ls_model *m = case_model_path(ctx, mc, path, sizeof path, why, sizeof why) ? api_load(&ctx->cand, path, err, sizeof err) : NULL;
    if (!m) {
        check("library/cuda-kv-refused", 0, "refused by name", why[0] ? why : err, t0);
        return;
    }
    ls_session_params p = {.max_seq = 32, .loops = 2, .kv_mode = LS_KV_INT8};
    ls_session *s = ctx->cand.session_new(m, &p, err, sizeof err);
    snprintf(detail, sizeof detail, "kv_mode int8: %s", s ? "a session was made" : err);
    check("library/cuda-kv-refused", !s && strstr(err, "fp16 key/value cache"), "refused by name", detail, t0);
    if (s) ctx->cand.session_free(s);
    t0 = now_seconds();
    s = api_session(&ctx->cand, m, 32, 2, 0);
    ls_spec_params sp = {.draft_loops = 1, .verify_loops = 2, .draft_ahead = 2, .k_branches = 1, .max_new = 4,
                         .sampling = {.top_p = 1.0f, .repetition_penalty = 1.0f}};
    int32_t out[LS_SPEC_MAX_AHEAD + 1], rc = s ? ctx->cand.spec_cycle(s, 0, &sp, out, NULL) : LS_ERR_NOMEM;
    snprintf(detail, sizeof detail, "ls_spec_cycle: %s", ctx->cand.status_str(rc));
    check("library/cuda-speculative-unsupported", rc == LS_ERR_UNSUPPORTED, "LS_ERR_UNSUPPORTED", detail, t0);
    if (s) ctx->cand.session_free(s);
    ctx->cand.model_free(m);
}

/* The bits of a model under a speed family: the last logits of a prompt fed
 * in one call (ls_session_forward), then ROWS streams decoding STEPS
 * greedy steps together (ls_batch_step: from the second step on, a
 * captured graph), their logits. 0 or an LS_ERR_*. */
#define SAME_BITS_ROWS 3
#define SAME_BITS_STEPS 4
static int32_t same_bits_run(const ls_api *api, ls_model *m, int32_t vocab, float *out) {
    int32_t prompt[PROMPT_LEN], next[SAME_BITS_ROWS], ids[SAME_BITS_ROWS];
    prompt_of(prompt, PROMPT_LEN, vocab, 5);
    int32_t rc = last_logits(api, m, prompt, PROMPT_LEN, 2, 0, out);
    ls_session **s = calloc(SAME_BITS_ROWS, sizeof *s);
    ls_batch_row rows[SAME_BITS_ROWS];
    const ls_step_params greedy = {.loops = 2, .sampling = {.top_p = 1.0f, .repetition_penalty = 1.0f}};
    for (int32_t i = 0; rc == LS_OK && i < SAME_BITS_ROWS; i++) {
        s[i] = api_session(api, m, PROMPT_LEN + SAME_BITS_STEPS + 1, 2, 0);
        rc = s[i] ? api->session_forward(s[i], prompt + i, PROMPT_LEN - i, 2, NULL, 0) : LS_ERR_NOMEM;
        next[i] = prompt[i];
        rows[i] = (ls_batch_row){.n_tokens = 1, .sample = 1, .step = greedy};
    }
    for (int32_t k = 0; rc == LS_OK && k < SAME_BITS_STEPS; k++) {
        rc = api->batch_step(m, s, rows, SAME_BITS_ROWS, next, NULL, out + (size_t)(1 + k * SAME_BITS_ROWS) * vocab, ids);
        memcpy(next, ids, sizeof next);
    }
    api_free_sessions(api, s, SAME_BITS_ROWS);
    return rc;
}

/* On a GPU: a speed family leaves every bit as it was, on small models of
 * every kernel path (fp16, a quantized head serving as the embedding, a
 * stack with an exit gate), eager and replayed. */
static void resident_same_bits(const run_ctx *ctx) {
    if (!ctx->gpu || ctx->quick) return;
    static const char *const MODELS[] = {"fp16", "int4-g32-head-int4-embedded", "stack-2-layers"};
    const ls_api *cuda = ctx->cuda;
    const int32_t was = cuda->cuda_kernels(-1);
    double t0 = now_seconds();
    char path[2048], why[512] = "", err[512] = "", detail[1024] = "";
    check_status st = ST_PASS;
    for (size_t i = 0; i < sizeof MODELS / sizeof MODELS[0] && st == ST_PASS; i++) {
        const model_case *mc = case_named(MODELS[i]);
        float *runs[2] = {NULL, NULL};
        int32_t vocab = 0, rc = LS_OK;
        for (int on = 0; on < 2 && rc == LS_OK; on++) {
            cuda->cuda_kernels(on ? LS_CUDA_KERNELS_ALL : LS_CUDA_KERNELS_ALL & ~LS_CUDA_KERNELS_RESIDENT);
            ls_model *m = case_model_path(ctx, mc, path, sizeof path, why, sizeof why) ? api_load(cuda, path, err, sizeof err) : NULL;
            if (!m) {
                snprintf(detail, sizeof detail, "%s: %s", mc->name, why[0] ? why : err);
                rc = LS_ERR_STATE;
                break;
            }
            ls_model_info info;
            cuda->model_info_get(m, &info);
            vocab = info.vocab_size;
            runs[on] = malloc((size_t)(1 + SAME_BITS_STEPS * SAME_BITS_ROWS) * vocab * sizeof(float));
            rc = runs[on] ? same_bits_run(cuda, m, vocab, runs[on]) : LS_ERR_NOMEM;
            if (rc != LS_OK) snprintf(detail, sizeof detail, "%s: %s", mc->name, cuda->status_str(rc));
            cuda->model_free(m);
        }
        int64_t at = rc == LS_OK ? first_diff(runs[0], runs[1], (int64_t)(1 + SAME_BITS_STEPS * SAME_BITS_ROWS) * vocab) : -1;
        if (rc != LS_OK) st = ST_FAIL;
        else if (at >= 0) {
            snprintf(detail, sizeof detail, "%s: logit %lld of %s: %.9g off, %.9g on", mc->name, (long long)(at % vocab),
                     at < vocab ? "the forward pass" : "the batched steps", runs[0][at], runs[1][at]);
            st = ST_FAIL;
        }
        free(runs[0]);
        free(runs[1]);
    }
    if (st == ST_PASS)
        snprintf(detail, sizeof detail, "fp16, an int4 head as the embedding, a 2-layer stack with a gate: a prompt's logits "
                 "and %d streams' %d batched steps (replayed graphs) the same with LS_CUDA_KERNELS_RESIDENT off and on",
                 SAME_BITS_ROWS, SAME_BITS_STEPS);
    report_check("library/cuda-resident-same-bits", st, NAN, "bit-identical", detail, now_seconds() - t0);
    cuda->cuda_kernels(was);
}

static void selftest(const run_ctx *ctx) {
    if (!ctx->gpu || ctx->quick) return; /* the short run's cases take every kernel path already */
    char detail[512];
    double t0 = now_seconds();
    int32_t failed = ctx->cand.cuda_selftest(detail, sizeof detail);
    report_check("library/cuda-selftest", failed == 0 ? ST_PASS : ST_FAIL, failed, "bit-identical to the host", detail,
                 now_seconds() - t0);
}

void run_library_checks(run_ctx *ctx) {
    double t0 = now_seconds();
    char detail[160];
    if (ctx->cuda) {
        int32_t n = ctx->cuda->cuda_device_count();
        snprintf(detail, sizeof detail, "%d device(s)", n);
        check("library/cuda-device-count", ctx->gpu ? n > 0 : n == 0, ctx->gpu ? ">= 1" : "0 without a GPU", detail, t0);
    }
    features(ctx);
    for (size_t i = 0; i < sizeof FAMILIES / sizeof FAMILIES[0]; i++) gating(ctx, &FAMILIES[i]);
    recurrent_refused(ctx);
    refusals(ctx);
    resident_same_bits(ctx);
    selftest(ctx);
}
