// The table of models the checks run on, and the table of timings. The
// GPU issues extend these: a model case per format or feature (with the
// kernel family it needs, or the refusal that names it until then), a
// figure per measurement their targets read.
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "driver.h"
#include "cuda/loopserve_cuda.h"

/* The dim-64 test shapes (test/helpers/models.ts's TINY, a smaller vocabulary), dim 256 for the larger
 * groups, the dim-2048 GQA model of the GPU figures, and a random stack of Ouro-1.4B's shape (its
 * published config: 24 layers, hidden 2048, 16 query and 16 key/value heads, ffn 5632, vocabulary 49152,
 * 4 steps, RoPE theta 1e6, norm eps 1e-6), whose gate leans to early exits. */
#define TINY "dim=64,heads=4,kv=2,ffn=128,vocab=4096,loops=4,seed=1"
#define D256 "dim=256,heads=4,kv=2,ffn=512,vocab=4096,loops=3,seed=2"
#define D2048 "dim=2048,heads=16,kv=4,ffn=5632,vocab=50257,loops=8,seed=7,seq=4096"
#define OURO_1_4B                                                                                                  \
    "dim=2048,heads=16,kv=16,ffn=5632,vocab=49152,loops=4,layers=24,sandwich=1,stepnorm=1,gate=1,gatebias=1,"    \
    "theta=1000000,eps=1e-06,seq=4096,seed=11"
#define OURO_STACK "sandwich=1,stepnorm=1,gate=1"
#define TRAINED "kjv-looped-256.safetensors"
#define TRAINED_OURO "kjv-ouro-2x4-256.safetensors"
#define Q LS_CUDA_KERNELS_QUANT
#define S LS_CUDA_KERNELS_STACKS
#define FP16_TOL 1e-3f
/* 96 layer applications of random weights (24 layers, 4 steps): the CPU library's own best and portable
 * paths differ by more than FP16_TOL on this shape (docs/gpu.md), so the bar is theirs with room */
#define DEEP_STACK_TOL 5e-3f
#define QUANT_TOL 5e-2f

static const model_case CASES[] = {
    {.name = "fp16", .spec = TINY, .tol = FP16_TOL},
    {.name = "fp16-tied", .spec = TINY ",head=tied", .tol = FP16_TOL},
    {.name = "fp16-head-int8", .spec = TINY ",head=int8,hgroup=32", .families = Q, .refusal = "an int8 output head",
     .tol = QUANT_TOL},
    {.name = "int4-g32", .spec = TINY ",quant=int4,group=32", .families = Q, .refusal = "int4 weights", .tol = QUANT_TOL},
    {.name = "int4-g64-head-int8", .spec = TINY ",quant=int4,group=64,head=int8", .families = Q,
     .refusal = "int4 weights", .tol = QUANT_TOL},
    {.name = "int4-g32-head-int4-embedded", .spec = TINY ",quant=int4,group=32,head=int4,embed=0", .families = Q,
     .refusal = "int4 weights", .tol = QUANT_TOL},
    {.name = "int2-g32-mix-head-int6", .spec = TINY ",quant=int2,group=32,mix=wv:int4+wo:int4+w2:int4,head=int6,hgroup=64",
     .families = Q, .refusal = "int2 weights", .tol = QUANT_TOL},
    {.name = "int2-g64", .spec = TINY ",quant=int2,group=64", .families = Q, .refusal = "int2 weights", .tol = QUANT_TOL},
    {.name = "int4-g256-head-int8-g128", .spec = D256 ",quant=int4,group=256,head=int8,hgroup=128", .families = Q,
     .refusal = "int4 weights", .tol = QUANT_TOL},
    {.name = "int2-g128-head-int4-g256", .spec = D256 ",quant=int2,group=128,head=int4,hgroup=256", .families = Q,
     .refusal = "int2 weights", .tol = QUANT_TOL},
    /* stacks: sandwich and step norms, the gate, a pre-norm stack with a tied head, one that norms at the head */
    {.name = "stack-2-layers", .spec = TINY ",layers=2," OURO_STACK, .families = S, .refusal = "stacked model",
     .tol = FP16_TOL},
    {.name = "stack-3-layers-tied", .spec = TINY ",layers=3,head=tied,stepnorm=1,gate=1,gatebias=0", .families = S,
     .refusal = "stacked model", .tol = FP16_TOL},
    {.name = "stack-2-layers-mha-sandwich", .spec = TINY ",kv=4,layers=2,sandwich=1", .families = S,
     .refusal = "stacked model", .tol = FP16_TOL},
    {.name = "stack-int4", .spec = TINY ",layers=2," OURO_STACK ",quant=int4,group=32,head=int8", .families = S | Q,
     .refusal = "stacked model", .tol = QUANT_TOL},
    {.name = "stack-int2-mix-head-int6",
     .spec = TINY ",layers=2," OURO_STACK ",quant=int2,group=32,mix=wv:int4+wo:int4+w2:int4,head=int6,hgroup=64",
     .families = S | Q, .refusal = "stacked model", .tol = QUANT_TOL},
    /* recurrent depth (a prelude, a coda, input injection, summed sandwich norms): a stack the stacks family
     * must not take for its own; refused by name on the GPU, the CPU library against itself elsewhere */
    {.name = "recurrent-prelude-coda", .spec = TINY ",layers=2,sandwich=2,prelude=1,coda=1,inject=1",
     .refusal = "recurrent-depth model", .tol = FP16_TOL, .checks = "logits,prefill-vs-steps,rows"},
    {.name = "trained", .file = TRAINED, .trained = 1, .tol = FP16_TOL},
    {.name = "trained-int4", .spec = "from={models}/" TRAINED ",quant=int4,group=64,head=int8,hgroup=64", .families = Q,
     .refusal = "int4 weights", .trained = 1, .tol = QUANT_TOL},
    {.name = "trained-int2-mix",
     .spec = "from={models}/" TRAINED ",quant=int2,group=32,mix=wv:int4+wo:int4+w2:int4,head=int6,hgroup=64",
     .families = Q, .refusal = "int2 weights", .trained = 1, .tol = QUANT_TOL},
    /* the shipped Ouro-class stack, the same weights in the Ouro import's layout, and an int4 copy */
    {.name = "trained-ouro", .file = TRAINED_OURO, .families = S, .refusal = "stacked model", .trained = 1,
     .tol = FP16_TOL, .exits = 1},
    {.name = "trained-ouro-import", .spec = "from={models}/" TRAINED_OURO ",ouro=1", .families = S,
     .refusal = "stacked model", .trained = 1, .tol = FP16_TOL, .exits = 1, .source = "trained-ouro",
     .checks = "logits,greedy,exits,import,deferred"},
    {.name = "trained-ouro-int4", .spec = "from={models}/" TRAINED_OURO ",quant=int4,group=64,head=int8,hgroup=64",
     .families = S | Q, .refusal = "stacked model", .trained = 1, .tol = QUANT_TOL,
     .checks = "logits,greedy,prefill-vs-steps,rows,deferred"},
    {.name = "dim2048-fp16", .spec = D2048, .big = 1, .tol = FP16_TOL},
    {.name = "dim2048-int4", .spec = D2048 ",quant=int4,group=128,head=int8,hgroup=128", .families = Q,
     .refusal = "int4 weights", .big = 1, .tol = QUANT_TOL},
    {.name = "ouro-1.4b", .spec = OURO_1_4B, .families = S, .refusal = "stacked model", .big = 1, .tol = DEEP_STACK_TOL,
     .checks = "logits,prefill-vs-steps,rows,deferred,device-memory"},
};
#define N_CASES (sizeof CASES / sizeof CASES[0])

const model_case *case_named(const char *name) {
    for (size_t i = 0; i < N_CASES; i++)
        if (strcmp(CASES[i].name, name) == 0) return &CASES[i];
    return NULL;
}

static int exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* The shipped model a case is or is made from (its spec's "{models}/FILE"), into name; 0 when none. */
static int shipped_file(const model_case *mc, char *name, size_t len) {
    const char *at = mc->spec ? strstr(mc->spec, "{models}/") : NULL;
    if (mc->file) snprintf(name, len, "%s", mc->file);
    else if (at) snprintf(name, len, "%.*s", (int)strcspn(at + 9, ","), at + 9);
    return mc->file || at;
}

int shipped_absent(const run_ctx *ctx, const model_case *mc, char *why, size_t why_len) {
    char path[2048], file[256];
    if (!shipped_file(mc, file, sizeof file)) return 0;
    snprintf(path, sizeof path, "%s/%s", ctx->models_dir, file);
    if (exists(path)) return 0;
    snprintf(why, why_len, "%s is absent (the shipped models are not needed: this case runs where they are)", path);
    return 1;
}

const char *case_model_path(const run_ctx *ctx, const model_case *mc, char *path, size_t path_len, char *why,
                            size_t why_len) {
    if (shipped_absent(ctx, mc, why, why_len)) return NULL;
    if (mc->file) {
        snprintf(path, path_len, "%s/%s", ctx->models_dir, mc->file);
        return path;
    }
    char spec[2048];
    const char *at = strstr(mc->spec, "{models}");
    if (at) snprintf(spec, sizeof spec, "%.*s%s%s", (int)(at - mc->spec), mc->spec, ctx->models_dir, at + 8);
    else snprintf(spec, sizeof spec, "%s", mc->spec);
    snprintf(path, path_len, "%s/%s.safetensors", ctx->tmp, mc->name);
    if (exists(path)) return path; /* written earlier in this run's folder */
    if (mkdir(ctx->tmp, 0755) != 0 && errno != EEXIST) {
        snprintf(why, why_len, "cannot create the folder %s", ctx->tmp);
        return NULL;
    }
    if (synth_write(spec, path, why, why_len) != 0) return NULL;
    return path;
}

/* Whether the candidate refuses this case: the CUDA library, with a family
 * the case needs off, or a feature no family of this build serves yet. */
static int expect_refusal(const run_ctx *ctx, const model_case *mc) {
    if (!ctx->cand.cuda_kernels || !mc->refusal) return 0;
    int32_t on = ctx->cand.cuda_kernels(-1);
    return mc->families == 0 || (mc->families & ~on) != 0;
}

static void run_case(run_ctx *ctx, const model_case *mc) {
    char path[2048], why[512] = "", name[128], err[1024] = "";
    double t0 = now_seconds();
    snprintf(name, sizeof name, "%s/load", mc->name);
    if (mc->big && !ctx->gpu) {
        report_check(name, ST_SKIP, NAN, "loads", "a dim-2048 model runs on a GPU host only (CPU against CPU proves nothing the small shapes do not)", 0);
        return;
    }
    if (shipped_absent(ctx, mc, why, sizeof why)) {
        report_check(name, ST_SKIP, NAN, "loads", why, 0);
        return;
    }
    if (!case_model_path(ctx, mc, path, sizeof path, why, sizeof why)) {
        report_check(name, ST_FAIL, NAN, "loads", why, now_seconds() - t0);
        return;
    }
    ls_model *cand = api_load(&ctx->cand, path, err, sizeof err);
    if (expect_refusal(ctx, mc)) {
        snprintf(name, sizeof name, "%s/refused", mc->name);
        check_status st = !cand && strstr(err, mc->refusal) ? ST_PASS : ST_FAIL;
        report_check(name, st, NAN, mc->refusal, cand ? "loaded, though no kernel family in use serves it" : err, now_seconds() - t0);
        if (cand) ctx->cand.model_free(cand);
        return;
    }
    if (!cand) {
        report_check(name, ST_FAIL, NAN, "loads", err, now_seconds() - t0);
        return;
    }
    ls_model *ref = api_load(&ctx->ref, path, err, sizeof err);
    if (!ref) {
        report_check(name, ST_FAIL, NAN, "loads", err, now_seconds() - t0);
        ctx->cand.model_free(cand);
        return;
    }
    model_env e = {ctx, mc, ref, cand, {0}};
    ls_model_info ri;
    ctx->cand.model_info_get(cand, &e.info);
    ctx->ref.model_info_get(ref, &ri);
    ri.simd = e.info.simd;
    ri.n_threads = e.info.n_threads;
    int same = memcmp(&ri, &e.info, sizeof ri) == 0;
    snprintf(why, sizeof why, "%s: %s", ctx->cand.path,
             same ? "the reference's model info (the SIMD path and threads aside)" : "the model info differs from the reference's");
    report_check(name, same ? ST_PASS : ST_FAIL, NAN, "loads", why, now_seconds() - t0);
    if (same) run_model_checks(&e);
    ctx->cand.model_free(cand);
    ctx->ref.model_free(ref);
}

/* The short run's cases (compute-sanitizer's): between them every kernel
 * path, fp16 and each quantized format, head and group path, stacks and
 * the exit gate's, on small models. */
static const char *const QUICK[] = {"fp16", "int4-g32-head-int4-embedded", "int2-g32-mix-head-int6",
                                    "int4-g256-head-int8-g128", "stack-2-layers", "stack-int4"};

static int in_quick_run(const model_case *mc) {
    for (size_t i = 0; i < sizeof QUICK / sizeof QUICK[0]; i++)
        if (strcmp(mc->name, QUICK[i]) == 0) return 1;
    return 0;
}

void run_cases(run_ctx *ctx) {
    for (size_t i = 0; i < N_CASES; i++)
        if ((!ctx->only || strstr(CASES[i].name, ctx->only)) && (!ctx->quick || in_quick_run(&CASES[i])))
            run_case(ctx, &CASES[i]);
}

// ---- timings ----

typedef struct {
    const char *model; /* a case */
    const char *weights;
    int32_t loops, rows;
    int32_t exit_policy; /* LS_EXIT_* */
    float exit_threshold;
    int resident; /* with LS_CUDA_KERNELS_RESIDENT (engine "loopserve resident"); the other cells without */
} figure;

/* bench:gpu's cells: one stream at loops 1, 8 and 16 (an extra loop's cost), 64 rows at loops 8; the
 * Ouro-1.4B-shaped stack's one stream at 4 steps and exiting by its gate at 0.7 under either policy;
 * after each model's, its one-stream cells that issue 56's targets read again with the resident family
 * (the model loaded once more with it), so one run measures the family off and on side by side. */
#define FIXED LS_EXIT_NONE, 0.0f, 0
#define RESIDENT LS_EXIT_NONE, 0.0f, 1
static const figure FIGURES[] = {
    {"trained", "fp16", 1, 1, FIXED},       {"trained", "fp16", 8, 1, FIXED},
    {"trained", "fp16", 16, 1, FIXED},      {"trained", "fp16", 8, 64, FIXED},
    {"trained", "fp16", 8, 1, RESIDENT},
    {"dim2048-fp16", "fp16", 1, 1, FIXED},  {"dim2048-fp16", "fp16", 8, 1, FIXED},
    {"dim2048-fp16", "fp16", 16, 1, FIXED}, {"dim2048-fp16", "fp16", 8, 64, FIXED},
    {"dim2048-fp16", "fp16", 8, 1, RESIDENT}, {"dim2048-fp16", "fp16", 16, 1, RESIDENT},
    {"dim2048-int4", "int4", 8, 1, FIXED},  {"dim2048-int4", "int4", 16, 1, FIXED},
    {"dim2048-int4", "int4", 8, 64, FIXED}, {"dim2048-int4", "int4", 8, 1, RESIDENT},
    {"dim2048-int4", "int4", 16, 1, RESIDENT},
    {"ouro-1.4b", "fp16", 4, 1, FIXED},
    {"ouro-1.4b", "fp16", 4, 1, LS_EXIT_EXACT, 0.7f, 0},
    {"ouro-1.4b", "fp16", 4, 1, LS_EXIT_COPY, 0.7f, 0},
    {"ouro-1.4b", "fp16", 4, 1, RESIDENT},
};

void exit_name(char *out, size_t len, int32_t policy, float threshold) {
    if (policy == LS_EXIT_NONE) snprintf(out, len, "%s", "");
    else snprintf(out, len, "%s %g", policy == LS_EXIT_EXACT ? "exact" : "copy", threshold);
}

/* What the resident family did for a model the figures ran (ls_cuda_resident_report), as a check:
 * it passes when some of the block's bytes were pinned. */
static void resident_report(const run_ctx *ctx, const char *model, ls_model *m) {
    char detail[512] = "", name[96];
    int64_t pinned = ctx->cand.cuda_resident_report(m, detail, sizeof detail);
    snprintf(name, sizeof name, "figures/resident-%s", model);
    report_check(name, pinned > 0 ? ST_PASS : ST_FAIL, pinned > 0 ? (double)pinned / 1048576.0 : NAN, "MB pinned > 0",
                 detail, 0.0);
}

void run_figures(run_ctx *ctx) {
    const char *engine = ctx->gpu ? "loopserve" : "loopserve (cpu smoke run)";
    char path[2048], why[512], err[512];
    const char *loaded_name = NULL;
    int loaded_resident = 0;
    ls_model *m = NULL;
    for (size_t i = 0; i <= sizeof FIGURES / sizeof FIGURES[0]; i++) {
        const figure *f = i < sizeof FIGURES / sizeof FIGURES[0] ? &FIGURES[i] : NULL;
        /* without a GPU: one small decode, so that CI runs this code too */
        const model_case *mc = f ? case_named(ctx->gpu ? f->model : "fp16") : NULL;
        if (!ctx->gpu && i > 0) f = NULL;
        if (!f || !loaded_name || strcmp(loaded_name, mc->name) != 0 || loaded_resident != f->resident) {
            if (m && loaded_resident) resident_report(ctx, loaded_name, m);
            if (m) ctx->cand.model_free(m);
            m = NULL;
            if (!f) break;
            loaded_name = mc->name;
            loaded_resident = f->resident;
            /* the family in use for the models loaded from here on */
            if (ctx->cand.cuda_kernels)
                ctx->cand.cuda_kernels(f->resident ? LS_CUDA_KERNELS_ALL : LS_CUDA_KERNELS_ALL & ~LS_CUDA_KERNELS_RESIDENT);
            if (case_model_path(ctx, mc, path, sizeof path, why, sizeof why)) m = api_load(&ctx->cand, path, why, sizeof why);
            if (!m) fprintf(stderr, "figures: %s: %s\n", mc->name, why);
        }
        if (!m) continue;
        const decode_plan d = {ctx->gpu ? f->loops : 2, ctx->gpu ? f->rows : 2, ctx->gpu ? 64 : 4, ctx->gpu ? 3 : 1,
                               f->exit_policy, f->exit_threshold};
        char exit[32];
        exit_name(exit, sizeof exit, d.exit_policy, d.exit_threshold);
        double mean_steps = NAN, tok_s = decode_tok_s(&ctx->cand, m, &d, &mean_steps, err, sizeof err);
        if (tok_s < 0) fprintf(stderr, "figures: %s loops %d rows %d %s: %s\n", mc->name, d.loops, d.rows, exit, err);
        else report_figure(f->resident ? "loopserve resident" : engine, mc->name, f->weights, d.loops, d.rows, exit, tok_s, mean_steps);
    }
}
