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
 * groups, and the dim-2048 GQA model of the GPU figures. */
#define TINY "dim=64,heads=4,kv=2,ffn=128,vocab=4096,loops=4,seed=1"
#define D256 "dim=256,heads=4,kv=2,ffn=512,vocab=4096,loops=3,seed=2"
#define D2048 "dim=2048,heads=16,kv=4,ffn=5632,vocab=50257,loops=8,seed=7,seq=4096"
#define TRAINED "kjv-looped-256.safetensors"
#define Q LS_CUDA_KERNELS_QUANT
#define FP16_TOL 1e-3f
#define QUANT_TOL 5e-2f

static const model_case CASES[] = {
    {"fp16", TINY, NULL, 0, NULL, 0, 0, FP16_TOL},
    {"fp16-tied", TINY ",head=tied", NULL, 0, NULL, 0, 0, FP16_TOL},
    {"fp16-head-int8", TINY ",head=int8,hgroup=32", NULL, Q, "an int8 output head", 0, 0, QUANT_TOL},
    {"int4-g32", TINY ",quant=int4,group=32", NULL, Q, "int4 weights", 0, 0, QUANT_TOL},
    {"int4-g64-head-int8", TINY ",quant=int4,group=64,head=int8", NULL, Q, "int4 weights", 0, 0, QUANT_TOL},
    {"int4-g32-head-int4-embedded", TINY ",quant=int4,group=32,head=int4,embed=0", NULL, Q, "int4 weights", 0, 0, QUANT_TOL},
    {"int2-g32-mix-head-int6", TINY ",quant=int2,group=32,mix=wv:int4+wo:int4+w2:int4,head=int6,hgroup=64", NULL, Q,
     "int2 weights", 0, 0, QUANT_TOL},
    {"int2-g64", TINY ",quant=int2,group=64", NULL, Q, "int2 weights", 0, 0, QUANT_TOL},
    {"int4-g256-head-int8-g128", D256 ",quant=int4,group=256,head=int8,hgroup=128", NULL, Q, "int4 weights", 0, 0, QUANT_TOL},
    {"int2-g128-head-int4-g256", D256 ",quant=int2,group=128,head=int4,hgroup=256", NULL, Q, "int2 weights", 0, 0, QUANT_TOL},
    {"stack-2-layers", TINY ",layers=2,sandwich=1,stepnorm=1,gate=1", NULL, 0, "stacked model", 0, 0, FP16_TOL},
    {"trained", NULL, TRAINED, 0, NULL, 1, 0, FP16_TOL},
    {"trained-int4", "from={models}/" TRAINED ",quant=int4,group=64,head=int8,hgroup=64", NULL, Q, "int4 weights", 1, 0, QUANT_TOL},
    {"trained-int2-mix", "from={models}/" TRAINED ",quant=int2,group=32,mix=wv:int4+wo:int4+w2:int4,head=int6,hgroup=64",
     NULL, Q, "int2 weights", 1, 0, QUANT_TOL},
    {"trained-ouro", NULL, "kjv-ouro-2x4-256.safetensors", 0, "stacked model", 1, 0, FP16_TOL},
    {"dim2048-fp16", D2048, NULL, 0, NULL, 0, 1, FP16_TOL},
    {"dim2048-int4", D2048 ",quant=int4,group=128,head=int8,hgroup=128", NULL, Q, "int4 weights", 0, 1, QUANT_TOL},
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

/* The shipped model a case is or is made from, or NULL. */
static const char *shipped_file(const model_case *mc) {
    return mc->file ? mc->file : strstr(mc->spec, "{models}") ? TRAINED : NULL;
}

int shipped_absent(const run_ctx *ctx, const model_case *mc, char *why, size_t why_len) {
    char path[2048];
    if (!shipped_file(mc)) return 0;
    snprintf(path, sizeof path, "%s/%s", ctx->models_dir, shipped_file(mc));
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
 * path, fp16 and each quantized format, head and group path, on small models. */
static const char *const QUICK[] = {"fp16", "int4-g32-head-int4-embedded", "int2-g32-mix-head-int6", "int4-g256-head-int8-g128"};

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
} figure;

/* bench:gpu's cells: one stream at loops 1, 8 and 16 (an extra loop's cost), 64 rows at loops 8. */
static const figure FIGURES[] = {
    {"trained", "fp16", 1, 1},       {"trained", "fp16", 8, 1},       {"trained", "fp16", 16, 1},
    {"trained", "fp16", 8, 64},      {"dim2048-fp16", "fp16", 1, 1},  {"dim2048-fp16", "fp16", 8, 1},
    {"dim2048-fp16", "fp16", 16, 1}, {"dim2048-fp16", "fp16", 8, 64}, {"dim2048-int4", "int4", 8, 1},
    {"dim2048-int4", "int4", 16, 1}, {"dim2048-int4", "int4", 8, 64},
};

void run_figures(run_ctx *ctx) {
    const char *engine = ctx->gpu ? "loopserve" : "loopserve (cpu smoke run)";
    char path[2048], why[512], err[512];
    const char *loaded_name = NULL;
    ls_model *m = NULL;
    for (size_t i = 0; i < sizeof FIGURES / sizeof FIGURES[0]; i++) {
        const figure *f = &FIGURES[i];
        /* without a GPU: one small decode, so that CI runs this code too */
        const model_case *mc = case_named(ctx->gpu ? f->model : "fp16");
        if (!ctx->gpu && i > 0) break;
        if (!loaded_name || strcmp(loaded_name, mc->name) != 0) {
            if (m) ctx->cand.model_free(m);
            m = NULL;
            loaded_name = mc->name;
            if (case_model_path(ctx, mc, path, sizeof path, why, sizeof why)) m = api_load(&ctx->cand, path, why, sizeof why);
            if (!m) fprintf(stderr, "figures: %s: %s\n", mc->name, why);
        }
        if (!m) continue;
        int32_t loops = ctx->gpu ? f->loops : 2, rows = ctx->gpu ? f->rows : 2;
        double tok_s = decode_tok_s(&ctx->cand, m, loops, rows, ctx->gpu ? 64 : 4, ctx->gpu ? 3 : 1, err, sizeof err);
        if (tok_s < 0) fprintf(stderr, "figures: %s loops %d rows %d: %s\n", mc->name, loops, rows, err);
        else report_figure(engine, mc->name, f->weights, loops, rows, tok_s);
    }
    if (m) ctx->cand.model_free(m);
}
