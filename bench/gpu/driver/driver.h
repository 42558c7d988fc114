/*
 * driver/ — the GPU validation driver (bench/gpu/validate.sh runs it; the
 * command lines are in main.c). It loads two kernel libraries side by side
 * through the public ABI (kernels/loopserve.h) — the reference (the CPU
 * library) and the candidate (the CUDA library on a GPU host; without a
 * GPU, the CPU library on its best SIMD path against its portable one, so
 * that CI runs every check) — and holds the candidate to the reference on
 * models it writes itself or finds in models/. One file per concern:
 *   api.c           a library opened with dlopen, its ABI as function pointers
 *   model_file.c    safetensors: a file's descriptor, and the writer
 *   synth.c         the models it generates (every weight format), or quantizes
 *   cases.c         the table of model cases and the checks run on each
 *   checks.c        the checks of one model (logits, rows, rollback, ...)
 *   stack_checks.c  those a stacked model with an exit gate adds
 *   library.c       the checks of a library (refusals, features, self-test)
 *   decode.c        the timings
 *   report.c        the JSON records it prints, one a line
 */
#ifndef LS_GPU_DRIVER_H
#define LS_GPU_DRIVER_H

#include <stddef.h>
#include <stdint.h>

#include "loopserve.h"

// ---- api.c ----

/* A kernel library's ABI; the cuda_* entries are NULL in the CPU library. */
typedef struct {
    const char *path;
    void *handle;
    int32_t simd;    /* the LS_SIMD_* models are loaded with */
    int32_t threads; /* 0: every core */
    /* each entry typed by the header's own prototype, so the driver cannot drift from the ABI */
    __typeof__(&ls_abi_version) abi_version;
    __typeof__(&ls_features) features;
    __typeof__(&ls_status_str) status_str;
    __typeof__(&ls_model_load) model_load;
    __typeof__(&ls_model_free) model_free;
    __typeof__(&ls_model_info_get) model_info_get;
    __typeof__(&ls_model_device_memory) model_device_memory;
    __typeof__(&ls_session_new) session_new;
    __typeof__(&ls_session_free) session_free;
    __typeof__(&ls_session_pos) session_pos;
    __typeof__(&ls_session_rollback) session_rollback;
    __typeof__(&ls_session_copy_prefix) session_copy_prefix;
    __typeof__(&ls_session_forward) session_forward;
    __typeof__(&ls_session_step) session_step;
    __typeof__(&ls_session_last_steps) session_last_steps;
    __typeof__(&ls_batch_step) batch_step;
    __typeof__(&ls_sample) sample;
    __typeof__(&ls_spec_cycle) spec_cycle;
    int32_t (*cuda_device_count)(void);
    int32_t (*cuda_kernels)(int32_t);
    int32_t (*cuda_kernels_verified)(void);
    int32_t (*cuda_selftest)(char *, int32_t);
} ls_api;

/* Opens the library at path; 0, or -1 with the reason in err. */
int api_open(ls_api *api, const char *path, int32_t simd, int32_t threads, char *err, size_t err_len);
void api_close(ls_api *api);
/* The model at path (its descriptor read from the file: model_file.c); NULL with the reason in err. */
ls_model *api_load(const ls_api *api, const char *path, char *err, size_t err_len);
/* A session of max_seq positions and loops caches (fp16, full attention unless window). */
ls_session *api_session(const ls_api *api, ls_model *m, int32_t max_seq, int32_t loops, int32_t window);
/* Frees the sessions of the array s (n slots, NULL ones skipped) and the array. */
void api_free_sessions(const ls_api *api, ls_session **s, int32_t n);

// ---- model_file.c ----

/* The descriptor of the loopserve model file at path, from its safetensors
 * header and metadata as src/engine/model_descriptor.ts makes it (the
 * library checks it against the file). 0, or -1 with the reason in err. */
int model_file_desc(const char *path, ls_model_desc *desc, char *err, size_t err_len);

/* One tensor to write: name, dtype ("F16", "U8", "I8"), shape, bytes. */
typedef struct {
    char name[64];
    const char *dtype;
    int64_t shape[2];
    int32_t rank;
    void *data; /* owned by the writer's caller */
    size_t bytes;
} st_tensor;

/* Writes a safetensors file (src/model/safetensors.ts's layout: header
 * padded with spaces, each tensor 8-byte aligned); metadata is n_meta
 * key/value pairs. 0, or -1 with the reason in err. */
int st_write(const char *path, const char *const *meta, int32_t n_meta, const st_tensor *tensors, int32_t n,
             char *err, size_t err_len);

/* The fp16 tensor `name` of a model file, read whole into a new buffer of
 * *count values; NULL when absent or not F16. */
uint16_t *st_read_f16(const char *path, const char *name, int64_t *count, char *err, size_t err_len);

// ---- synth.c ----

/* Writes the model a spec describes to path (spec syntax at the top of
 * synth.c: a synthetic shape and weight format, or a shipped fp16 model
 * quantized). 0, or -1 with the reason in err. */
int synth_write(const char *spec, const char *path, char *err, size_t err_len);

/* fp16 <-> fp32 (round to nearest even), as the library converts. */
uint16_t f32_to_f16(float f);
float f16_to_f32(uint16_t h);

// ---- report.c: one JSON object a line on stdout ----

typedef enum { ST_PASS, ST_FAIL, ST_SKIP } check_status;

/* A check's record: name ("int4-g32/logits"), status, its measured value
 * (NAN: none), the bar it is held to, a detail (why it failed or was
 * skipped, or what it covered) and its seconds. */
void report_check(const char *name, check_status st, double value, const char *bar, const char *detail,
                  double seconds);
/* A timing: engine, model, loops, rows, the exit rule ("" for fixed depth,
 * "exact 0.7"), tokens per second and the mean steps a token ran (NAN:
 * not measured). */
void report_figure(const char *engine, const char *model, const char *weights, int32_t loops, int32_t rows,
                   const char *exit, double tok_s, double mean_steps);
/* Checks failed so far (the exit status). */
int32_t report_failures(void);
double now_seconds(void);

// ---- the run: cases.c, checks.c, library.c ----

typedef struct {
    ls_api ref, cand;
    ls_api *cuda;           /* the CUDA library (cand on a GPU host), or NULL where it is not built */
    int gpu;                /* cand is the CUDA library on a GPU */
    const char *tmp;        /* where generated models go */
    const char *models_dir; /* the shipped models (may be absent) */
    int quick;              /* the sanitizer's short run: small models, one depth, few rows */
    const char *only;       /* run only the cases whose name contains this (NULL: all) */
} run_ctx;

/* A model the checks run on (cases.c's table). */
typedef struct {
    const char *name;
    const char *spec;    /* synth.c's spec ("{models}/FILE" names a shipped model), or NULL */
    const char *file;    /* a shipped model under the models folder, or NULL */
    int32_t families;    /* the LS_CUDA_KERNELS_* the CUDA library needs for it */
    const char *refusal; /* what the CUDA library's refusal names while those families are off (or, with
                            families 0, not yet written): the case is then a refusal check */
    int trained;         /* greedy tokens must equal the reference's */
    int big;             /* dim 2048: on a GPU host only */
    float tol;           /* logits: largest difference relative to their scale */
    int exits;           /* greedy tokens and exit steps must equal the reference's at every exit setting */
    const char *source;  /* the case whose function this model computes too (the reference's logits equal
                            its, bit for bit), or NULL */
    const char *checks;  /* the checks to run, comma-separated, or NULL: every check that applies */
} model_case;

/* Whether the case needs a shipped model that ctx->models_dir lacks (the
 * reason in why): such a case is skipped, not failed. */
int shipped_absent(const run_ctx *ctx, const model_case *mc, char *why, size_t why_len);
/* The model of a case, generated into ctx->tmp (made if need be) when it is
 * not a shipped file; NULL with the reason in why. */
const char *case_model_path(const run_ctx *ctx, const model_case *mc, char *path, size_t path_len, char *why,
                            size_t why_len);
/* The case named name, or NULL. */
const model_case *case_named(const char *name);

/* One model's checks (checks.c), on the loaded reference and candidate. */
typedef struct {
    const run_ctx *ctx;
    const model_case *mc;
    ls_model *ref, *cand;
    ls_model_info info;
} model_env;
void run_model_checks(model_env *e);

/* A check of one model: its status, the detail of what it covered (or of
 * the first difference) and its measured value. */
typedef check_status (*model_check_fn)(model_env *e, char *detail, size_t len, double *value);

// ---- checks.c's helpers, which stack_checks.c shares ----

#define PROMPT_LEN 11

/* n token ids spread over the vocabulary; salt picks another sequence. */
void prompt_of(int32_t *t, int32_t n, int32_t vocab, int32_t salt);
/* The index of the first float whose bits differ, or -1. */
int64_t first_diff(const float *a, const float *b, int64_t n);
/* The last token's logits after feeding tokens to a fresh session; 0 or an LS_ERR_*. */
int32_t last_logits(const ls_api *api, ls_model *m, const int32_t *tokens, int32_t n, int32_t loops, int32_t window,
                    float *out);
/* A failed library call's verdict: what failed and the status. */
check_status lib_error(const ls_api *api, int32_t rc, const char *what, char *detail, size_t len);
/* A bit-identity check's verdict: the calls' status rc, then the first
 * logit at which the two ways (named) differ; covered is the pass's detail. */
check_status bit_verdict(const ls_api *api, int32_t rc, const char *what, const float *a, const char *a_way,
                         const float *b, const char *b_way, int32_t n, const char *covered, char *detail, size_t len);
/* The depth the checks run at: the model's (2 in the short run). */
int32_t check_depth(const model_env *e);
/* n tokens after the prompt (PROMPT_LEN tokens), each drawn by
 * ls_session_step with p; steps[i] (NULL: not wanted): the steps token i
 * ran. 0 or an LS_ERR_*. */
int32_t greedy_run(const ls_api *api, ls_model *m, const int32_t *prompt, const ls_step_params *p, int32_t *out,
                   int32_t *steps, int32_t n);

// ---- stack_checks.c: what a stacked model with an exit gate adds ----

check_status check_exits(model_env *e, char *detail, size_t len, double *value);
check_status check_deferred(model_env *e, char *detail, size_t len, double *value);
check_status check_import(model_env *e, char *detail, size_t len, double *value);

/* Every model case's checks (cases.c). */
void run_cases(run_ctx *ctx);
/* The timings table (cases.c): loopserve's decode on the candidate. */
void run_figures(run_ctx *ctx);
/* A figure's exit rule as reports name it: "" (fixed depth), "exact 0.7". */
void exit_name(char *out, size_t len, int32_t policy, float threshold);
/* The library-level checks (library.c). */
void run_library_checks(run_ctx *ctx);

// ---- decode.c ----

/* How a timed decode steps: its depth and exit rule (exit_policy LS_EXIT_*). */
typedef struct {
    int32_t loops, rows, steps, rounds;
    int32_t exit_policy;
    float exit_threshold;
} decode_plan;

/* Tokens per second of `rows` greedy streams through ls_batch_step, each
 * after its own 64-token prompt: the median of `rounds` runs of `steps`
 * steps (after one to warm up); *mean_steps: the steps a token ran, on
 * average (NULL: not wanted). Negative on a library error. */
double decode_tok_s(const ls_api *api, ls_model *m, const decode_plan *plan, double *mean_steps, char *err,
                    size_t err_len);

#endif
