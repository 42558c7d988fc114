/*
 * asan_driver.c — drives the kernels directly under AddressSanitizer and
 * UndefinedBehaviorSanitizer (test/kernels/asan.test.ts builds and runs it).
 *
 * Build (what the test does):
 *   gcc -std=c11 -O1 -g -fsanitize=address,undefined -fno-omit-frame-pointer \
 *       -DLS_LOAD_TO_HEAP -Ikernels test/c/asan_driver.c kernels/<every .c> \
 *       (+ per-file SIMD flags) -lm -pthread -o build/asan_driver
 * LS_LOAD_TO_HEAP (model.c) reads the model into an exactly-sized heap buffer
 * instead of mapping it, so ASan sees any read past the end of the file.
 *
 * Subcommands (exit 0 on success, 2 when the library reports an error, 1 on
 * bad usage; library errors print "error: <message>" on stdout so that
 * stderr carries only sanitizer reports). A model FILE is loaded with the
 * descriptor FILE.desc beside it (model_desc.h):
 *   load FILE [SIMD]                   ok dim=.. vocab=.. ...
 *   logits FILE LOOPS SIMD TOKEN...    one line of logits per token (%.9g)
 *   invariance FILE LOOPS SIMD TOKEN...  prefill vs one-token steps, bit-exact
 *   batch FILE SIMD TOKEN...           ls_batch_step of mixed sessions vs each stepped alone, bit-exact
 *   fuzz FILE ITERATIONS SEED [-v]     loads ITERATIONS mutated copies of FILE
 *                                      and its descriptor (-v: print each rejection)
 *   sample TEMP TOP_K TOP_P PENALTY SEED COUNTER LOGITS [HISTORY]
 *                                      LOGITS, HISTORY: comma-separated
 *   sample-check                       ls_sample against a naive reference
 *   f16-check                          fp16 conversions at every rounding boundary
 *   rope-check                         every SIMD path's RoPE against the portable one, bit for bit
 * SIMD is a LS_SIMD_* code (0..3) or auto/portable/avx2/avx512.
 */
#define _GNU_SOURCE /* memfd_create, mkstemp */

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "internal.h" /* ls_f16_to_f32, ls_f32_to_f16 */
#include "runtime.h"  /* ls_simd_missing */
#include "ops.h"      /* each path's kernel table */
#include "rope.h"
#include "loopserve.h"
#include "model_desc.h"

static int usage(void) {
    fprintf(stderr,
            "usage: asan_driver load FILE [SIMD]\n"
            "       asan_driver logits FILE LOOPS SIMD TOKEN...\n"
            "       asan_driver invariance FILE LOOPS SIMD TOKEN...\n"
            "       asan_driver batch FILE SIMD TOKEN...\n"
            "       asan_driver fuzz FILE ITERATIONS SEED [-v]\n"
            "       asan_driver sample TEMP TOP_K TOP_P PENALTY SEED COUNTER LOGITS [HISTORY]\n"
            "       asan_driver sample-check\n"
            "       asan_driver f16-check\n"
            "       asan_driver rope-check\n");
    return 1;
}

/* ls_sample with its sampling fields spelled out, as the checks below list them. */
static int32_t sample_with(const float *logits, int32_t vocab, const int32_t *history, int32_t n_history, float temperature,
                           int32_t top_k, float top_p, float penalty, uint64_t seed, uint64_t counter) {
    ls_sampling sp = {.temperature = temperature, .top_k = top_k, .top_p = top_p, .repetition_penalty = penalty, .seed = seed};
    return ls_sample(logits, vocab, history, n_history, &sp, counter);
}

// ---- argument parsing ----

static int parse_i64(const char *s, long long lo, long long hi, long long *out) {
    char *end;
    if (*s == '\0') return -1;
    long long v = strtoll(s, &end, 10);
    if (*end != '\0' || v < lo || v > hi) return -1;
    *out = v;
    return 0;
}

static int parse_simd(const char *s, int32_t *out) {
    static const char *names[] = {"auto", "portable", "avx2", "avx512"};
    for (int32_t i = 0; i < 4; i++)
        if (strcmp(s, names[i]) == 0) {
            *out = i;
            return 0;
        }
    long long v;
    if (parse_i64(s, 0, 3, &v) != 0) return -1;
    *out = (int32_t)v;
    return 0;
}

static int parse_float(const char *s, float *out) {
    char *end;
    if (*s == '\0') return -1;
    if (strcmp(s, "nan") == 0) {
        *out = NAN;
        return 0;
    }
    double d = strtod(s, &end);
    if (*end != '\0') return -1;
    *out = (float)d;
    return 0;
}

// Comma-separated floats ("nan", "inf", "-inf" allowed); returns the count or -1.
static int parse_float_list(const char *s, float **out) {
    int n = 1;
    for (const char *p = s; *p; p++) n += *p == ',';
    float *v = malloc((size_t)n * sizeof *v);
    if (!v) return -1;
    char *copy = strdup(s), *save = NULL;
    int i = 0;
    for (char *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (i >= n || parse_float(tok, &v[i]) != 0) {
            free(copy);
            free(v);
            return -1;
        }
        i++;
    }
    free(copy);
    *out = v;
    return i;
}

static int parse_int_list(const char *s, int32_t **out) {
    int n = 1;
    for (const char *p = s; *p; p++) n += *p == ',';
    int32_t *v = malloc((size_t)n * sizeof *v);
    if (!v) return -1;
    char *copy = strdup(s), *save = NULL;
    int i = 0;
    for (char *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        long long x;
        if (i >= n || parse_i64(tok, INT32_MIN, INT32_MAX, &x) != 0) {
            free(copy);
            free(v);
            return -1;
        }
        v[i++] = (int32_t)x;
    }
    free(copy);
    *out = v;
    return i;
}

// ---- load ----

static int cmd_load(int argc, char **argv) {
    if (argc < 1 || argc > 2) return usage();
    int32_t simd = LS_SIMD_PORTABLE;
    if (argc == 2 && parse_simd(argv[1], &simd) != 0) return usage();
    char err[512];
    ls_model *m = load_model(argv[0], 1, simd, err, sizeof err);
    if (!m) {
        printf("error: %s\n", err);
        return 2;
    }
    ls_model_info i;
    ls_model_info_get(m, &i);
    printf("ok dim=%d n_heads=%d n_kv_heads=%d head_dim=%d ffn_dim=%d vocab=%d loops=%d "
           "max_seq_len=%d rope_theta=%g norm_eps=%g quant=%d group_size=%d tied=%d simd=%s "
           "threads=%d\n",
           i.dim, i.n_heads, i.n_kv_heads, i.head_dim, i.ffn_dim, i.vocab_size, i.default_loops,
           i.max_seq_len, i.rope_theta, i.norm_eps, i.quant, i.group_size, i.tied_output,
           ls_simd_name(i.simd), i.n_threads);
    ls_model_free(m);
    return 0;
}

// ---- forward ----

typedef struct {
    ls_model *m;
    ls_model_info info;
    int32_t loops;
    int32_t n;
    int32_t *tokens;
} fwd_args;

static int open_forward(int argc, char **argv, fwd_args *a) {
    long long loops;
    int32_t simd;
    if (argc < 4 || parse_i64(argv[1], 1, 64, &loops) != 0 || parse_simd(argv[2], &simd) != 0)
        return usage();
    a->loops = (int32_t)loops;
    a->n = argc - 3;
    a->tokens = malloc((size_t)a->n * sizeof *a->tokens);
    if (!a->tokens) return 2;
    for (int32_t i = 0; i < a->n; i++) {
        long long t;
        if (parse_i64(argv[3 + i], INT32_MIN, INT32_MAX, &t) != 0) {
            free(a->tokens);
            return usage();
        }
        a->tokens[i] = (int32_t)t;
    }
    char err[512];
    a->m = load_model(argv[0], 1, simd, err, sizeof err);
    if (!a->m) {
        printf("error: %s\n", err);
        free(a->tokens);
        return 2;
    }
    ls_model_info_get(a->m, &a->info);
    return 0;
}

static void close_forward(fwd_args *a) {
    ls_model_free(a->m);
    free(a->tokens);
}

// Runs the tokens through a fresh session in calls of `step` tokens, keeping
// every token's logits; returns 0 or prints the error.
static int run_session(fwd_args *a, int32_t step, float *logits) {
    char err[512];
    ls_session_params sp = {.max_seq = a->n, .loops = a->loops};
    ls_session *s = ls_session_new(a->m, &sp, err, sizeof err);
    if (!s) {
        printf("error: %s\n", err);
        return 2;
    }
    size_t V = (size_t)a->info.vocab_size;
    for (int32_t at = 0; at < a->n; at += step) {
        int32_t n = a->n - at < step ? a->n - at : step;
        int32_t rc = ls_session_forward(s, a->tokens + at, n, a->loops, logits + (size_t)at * V, n);
        if (rc < 0) {
            printf("error: ls_session_forward returned %d at token %d\n", rc, at);
            ls_session_free(s);
            return 2;
        }
    }
    if (ls_session_pos(s) != a->n) {
        printf("error: session position %d after %d tokens\n", ls_session_pos(s), a->n);
        ls_session_free(s);
        return 2;
    }
    ls_session_free(s);
    return 0;
}

static int cmd_logits(int argc, char **argv) {
    fwd_args a;
    int rc = open_forward(argc, argv, &a);
    if (rc != 0) return rc;
    size_t V = (size_t)a.info.vocab_size;
    float *logits = malloc((size_t)a.n * V * sizeof *logits);
    if (!logits) {
        close_forward(&a);
        return 2;
    }
    rc = run_session(&a, a.n, logits);
    for (int32_t t = 0; rc == 0 && t < a.n; t++) {
        for (size_t i = 0; i < V; i++) printf(i ? " %.9g" : "%.9g", logits[(size_t)t * V + i]);
        printf("\n");
    }
    free(logits);
    close_forward(&a);
    return rc;
}

// Batch invariance (docs/kernels.md): one call for the whole prompt, one token
// per call, and uneven chunks must give bit-identical logits.
static int cmd_invariance(int argc, char **argv) {
    fwd_args a;
    int rc = open_forward(argc, argv, &a);
    if (rc != 0) return rc;
    size_t V = (size_t)a.info.vocab_size, total = (size_t)a.n * V;
    float *ref = malloc(total * sizeof *ref), *got = malloc(total * sizeof *got);
    if (!ref || !got) rc = 2;
    if (rc == 0) rc = run_session(&a, a.n, ref);
    int32_t steps[] = {1, 3};
    for (int k = 0; rc == 0 && k < 2; k++) {
        rc = run_session(&a, steps[k], got);
        for (size_t i = 0; rc == 0 && i < total; i++) {
            if (memcmp(&ref[i], &got[i], sizeof(float)) != 0) {
                printf("error: token %zu logit %zu differs with %d-token calls: %.9g vs %.9g\n",
                       i / V, i % V, steps[k], got[i], ref[i]);
                rc = 2;
            }
        }
    }
    if (rc == 0) printf("ok %d tokens bit-identical across call splits\n", a.n);
    free(ref);
    free(got);
    close_forward(&a);
    return rc;
}

// ---- batched step ----

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
    char err[256];
    ls_session_params sp = {.max_seq = *prompt_len + BATCH_NEW, .loops = a->loops, .cache_window = windows[k], .kv_mode = modes[k]};
    ls_session *s = ls_session_new(a->m, &sp, err, sizeof err);
    if (!s) printf("error: %s\n", err);
    return s;
}

static int cmd_batch(int argc, char **argv) {
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
        int32_t r = ls_batch_step(a.m, rs, rows, n_rows, toks, row_lg, out);
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

// ---- fuzz ----

static uint64_t rng_next(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// A value that sits at a boundary of the checks, or anywhere.
static uint64_t edge_value(uint64_t old, uint64_t *st) {
    static const uint64_t edges[] = {0, 1, 2, 3, 7, 8, 31, 32, 64, 256, 4096, 65536, 65537, 1048577,
                                     0x7fffffffull, 0x80000000ull, 0xffffffffull, 0x8000000000000000ull,
                                     0xffffffffffffffffull};
    uint64_t r = rng_next(st);
    switch (r % 4) {
    case 0: return edges[rng_next(st) % (sizeof edges / sizeof edges[0])];
    case 1: return old + 1 + rng_next(st) % 4;
    case 2: return old - 1 - rng_next(st) % 4;
    default: return rng_next(st);
    }
}

// One mutation of the descriptor: a dimension, a tensor's range or dtype,
// a reserved field, or one tensor's span copied over another's.
static void mutate_desc(ls_model_desc *d, uint64_t *st) {
    uint64_t r = rng_next(st);
    ls_tensor_span *t = &d->tensors[rng_next(st) % LS_TENSOR_N];
    switch (r % 6) {
    case 0: { // a config field, as its 32 bits
        uint32_t w[sizeof d->config / 4];
        memcpy(w, &d->config, sizeof w);
        size_t k = rng_next(st) % (sizeof w / sizeof w[0]);
        w[k] = (uint32_t)edge_value(w[k], st);
        memcpy(&d->config, w, sizeof w);
        break;
    }
    case 1: t->offset = edge_value(t->offset, st); break;
    case 2: t->length = edge_value(t->length, st); break;
    case 3: t->dtype = (int32_t)(rng_next(st) % 5) - (rng_next(st) % 8 == 0 ? 7 : 0); break;
    case 4: t->reserved = (int32_t)(rng_next(st) % 3); break;
    default: *t = d->tensors[rng_next(st) % LS_TENSOR_N]; break;
    }
}

// Mutations of what the library still checks: the descriptor's fields
// against the file, and the file's bytes (cuts, non-finite weights); the
// loader must reject or accept each pair without a sanitizer report.
static int cmd_fuzz(int argc, char **argv) {
    long long iters, seed;
    if (argc < 3 || argc > 4 || parse_i64(argv[1], 1, 10000000, &iters) != 0 ||
        parse_i64(argv[2], 0, INT64_MAX, &seed) != 0)
        return usage();
    int verbose = argc == 4 && strcmp(argv[3], "-v") == 0, rc = 0;
    char err[512];
    ls_model_desc orig_desc;
    if (read_model_desc(argv[0], &orig_desc, err, sizeof err) != 0) {
        printf("error: %s\n", err);
        return 2;
    }
    FILE *f = fopen(argv[0], "rb");
    if (!f) {
        printf("error: cannot open %s\n", argv[0]);
        return 2;
    }
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    if (size < 16) {
        fclose(f);
        printf("error: %s is too small to fuzz\n", argv[0]);
        return 2;
    }
    unsigned char *orig = malloc((size_t)size), *buf = malloc((size_t)size);
    if (!orig || !buf || fread(orig, 1, (size_t)size, f) != (size_t)size) {
        fclose(f);
        printf("error: cannot read %s\n", argv[0]);
        return 2;
    }
    fclose(f);
    // An in-memory file reopened by path: thousands of rewrites of a file on
    // disk cost seconds (truncation frees blocks), and the loader only needs
    // a path. Beside the input when memfd is unavailable.
    char path[4096];
    int fd = memfd_create("asan_fuzz", MFD_CLOEXEC);
    int on_disk = fd < 0;
    if (on_disk) {
        snprintf(path, sizeof path, "%s.fuzz-XXXXXX", argv[0]);
        fd = mkstemp(path);
    } else {
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    }
    if (fd < 0) {
        printf("error: cannot create a scratch file\n");
        return 2;
    }

    uint64_t st = (uint64_t)seed;
    long loaded = 0, rejected = 0;
    for (long long it = 0; it < iters; it++) {
        size_t n = (size_t)size;
        memcpy(buf, orig, n);
        ls_model_desc desc = orig_desc;
        int muts = 1 + (int)(rng_next(&st) % 3);
        for (int k = 0; k < muts; k++) {
            uint64_t r = rng_next(&st);
            if (r % 8 == 0) { // cut the file
                n = (size_t)(rng_next(&st) % n);
            } else if (r % 8 == 1) { // a non-finite fp16 value somewhere
                size_t at = (size_t)(rng_next(&st) % (n / 2)) * 2;
                buf[at] = 0x00;
                buf[at + 1] = rng_next(&st) % 2 ? 0x7c : 0xfe;
            } else {
                mutate_desc(&desc, &st);
            }
        }
        if (ftruncate(fd, (off_t)n) != 0 || pwrite(fd, buf, n, 0) != (ssize_t)n) {
            printf("error: cannot write %s\n", path);
            rc = 2;
            break;
        }
        err[0] = 'x';
        ls_model *m = ls_model_load(path, &desc, 1, LS_SIMD_PORTABLE, err, sizeof err);
        if (m) {
            loaded++;
            ls_model_free(m);
        } else {
            if (err[0] == '\0' || err[0] == 'x') {
                printf("error: load failed without a message (iteration %lld)\n", it);
                rc = 2;
                break;
            }
            if (verbose) printf("%s\n", err);
            rejected++;
        }
    }
    close(fd);
    if (on_disk) unlink(path);
    free(orig);
    free(buf);
    if (rc == 0) printf("ok %ld loaded %ld rejected\n", loaded, rejected);
    return rc;
}

// ---- sample ----

static int cmd_sample(int argc, char **argv) {
    if (argc < 7 || argc > 8) return usage();
    float temp, top_p, pen;
    long long top_k, seed, counter;
    if (parse_float(argv[0], &temp) != 0 || parse_i64(argv[1], INT32_MIN, INT32_MAX, &top_k) != 0 ||
        parse_float(argv[2], &top_p) != 0 || parse_float(argv[3], &pen) != 0 ||
        parse_i64(argv[4], 0, INT64_MAX, &seed) != 0 || parse_i64(argv[5], 0, INT64_MAX, &counter) != 0)
        return usage();
    float *logits;
    int vocab = parse_float_list(argv[6], &logits);
    if (vocab < 0) return usage();
    int32_t *hist = NULL;
    int n_hist = 0;
    if (argc == 8 && (n_hist = parse_int_list(argv[7], &hist)) < 0) {
        free(logits);
        return usage();
    }
    int32_t id = sample_with(logits, vocab, hist, n_hist, temp, (int32_t)top_k, top_p, pen,
                           (uint64_t)seed, (uint64_t)counter);
    free(logits);
    free(hist);
    if (id < 0) {
        printf("error: ls_sample returned %d\n", id);
        return 2;
    }
    printf("%d\n", id);
    return 0;
}

// ---- sample-check: a naive ls_sample straight from the documented procedure ----

static uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double naive_uniform(uint64_t seed, uint64_t counter) {
    return (double)(mix64(mix64(seed) + (counter + 1) * 0x9e3779b97f4a7c15ull) >> 11) * 0x1.0p-53;
}

static const float *g_rank_v; /* qsort has no context argument; single-threaded test code */

static int rank_cmp(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    float vx = g_rank_v[x], vy = g_rank_v[y];
    if (vx != vy) return vx > vy ? -1 : 1;
    return (x > y) - (x < y);
}

// Steps 1-2 of the procedure, shared by every configuration of one logits row.
typedef struct {
    int32_t V;
    float *v;       /* penalised logits, NaN as -inf */
    int32_t *order; /* ids in rank order, by a full sort */
    uint64_t *q;
    unsigned char *kept;
} naive_ranked;

static void naive_rank(naive_ranked *r, const float *logits, int32_t V, const int32_t *hist,
                       int32_t nh, float pen) {
    r->V = V;
    r->v = malloc((size_t)V * sizeof *r->v);
    r->order = malloc((size_t)V * sizeof *r->order);
    r->q = malloc((size_t)V * sizeof *r->q);
    r->kept = malloc((size_t)V);
    for (int32_t i = 0; i < V; i++) r->v[i] = isnan(logits[i]) ? -INFINITY : logits[i];
    for (int32_t j = 0; j < nh; j++) {
        int32_t h = hist[j];
        if (h < 0 || h >= V) continue;
        float l = isnan(logits[h]) ? -INFINITY : logits[h];
        r->v[h] = l > 0 ? l / pen : l * pen;
    }
    for (int32_t i = 0; i < V; i++) r->order[i] = i;
    g_rank_v = r->v;
    qsort(r->order, (size_t)V, sizeof *r->order, rank_cmp);
}

static void naive_free(naive_ranked *r) {
    free(r->v);
    free(r->order);
    free(r->q);
    free(r->kept);
}

// Steps 3-6, sequentially in rank order, as written in sample.c's header.
static int32_t naive_sample(naive_ranked *r, float temp, int32_t top_k, float top_p, uint64_t seed,
                            uint64_t counter) {
    const int32_t V = r->V;
    float vmax = r->v[r->order[0]];
    if (vmax == -INFINITY) return LS_ERR_ARG;
    if (temp == 0 || vmax == INFINITY) return r->order[0];
    int32_t k = (top_k == 0 || top_k >= V) ? V : top_k;
    uint64_t zk = 0;
    for (int32_t i = 0; i < k; i++) {
        int32_t id = r->order[i];
        float x = (r->v[id] - vmax) / temp;
        r->q[id] = x >= -23.0f ? (uint64_t)((double)expf(x) * 4294967296.0 + 0.5) : 0;
        zk += r->q[id];
    }
    int32_t keep = k;
    if (top_p < 1.0f) {
        uint64_t cum = 0;
        for (keep = 0; keep < k;) {
            cum += r->q[r->order[keep++]];
            if ((double)cum >= (double)top_p * (double)zk) break;
        }
    }
    memset(r->kept, 0, (size_t)V);
    uint64_t z = 0;
    for (int32_t i = 0; i < keep; i++) {
        r->kept[r->order[i]] = 1;
        z += r->q[r->order[i]];
    }
    uint64_t t = (uint64_t)(naive_uniform(seed, counter) * (double)z);
    if (t > z - 1) t = z - 1;
    uint64_t cum = 0;
    for (int32_t id = 0; id < V; id++) {
        if (!r->kept[id]) continue;
        cum += r->q[id];
        if (cum > t) return id;
    }
    return LS_ERR_STATE; // unreachable
}

static int g_fail;
#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            printf("error: check at line %d: ", __LINE__);                                         \
            printf(__VA_ARGS__);                                                                   \
            printf("\n");                                                                          \
            g_fail++;                                                                              \
        }                                                                                          \
    } while (0)

static int cmd_sample_check(void) {
    const float two[2] = {1.0f, 2.0f};
    const int32_t h1[1] = {0};
    // Arguments out of range.
    CHECK(sample_with(NULL, 2, NULL, 0, 1, 0, 1, 1, 0, 0) == LS_ERR_ARG, "NULL logits");
    CHECK(ls_sample(two, 2, NULL, 0, NULL, 0) == LS_ERR_ARG, "NULL sampling");
    CHECK(sample_with(two, 0, NULL, 0, 1, 0, 1, 1, 0, 0) == LS_ERR_ARG, "vocab 0");
    CHECK(sample_with(two, -1, NULL, 0, 1, 0, 1, 1, 0, 0) == LS_ERR_ARG, "vocab -1");
    CHECK(sample_with(two, 2, NULL, 1, 1, 0, 1, 1, 0, 0) == LS_ERR_ARG, "history NULL");
    CHECK(sample_with(two, 2, h1, -1, 1, 0, 1, 1, 0, 0) == LS_ERR_ARG, "n_history -1");
    CHECK(sample_with(two, 2, NULL, 0, NAN, 0, 1, 1, 0, 0) == LS_ERR_ARG, "temperature NaN");
    CHECK(sample_with(two, 2, NULL, 0, -0.5f, 0, 1, 1, 0, 0) == LS_ERR_ARG, "temperature < 0");
    CHECK(sample_with(two, 2, NULL, 0, INFINITY, 0, 1, 1, 0, 0) == LS_ERR_ARG, "temperature inf");
    CHECK(sample_with(two, 2, NULL, 0, 1, -1, 1, 1, 0, 0) == LS_ERR_ARG, "top_k < 0");
    CHECK(sample_with(two, 2, NULL, 0, 1, 0, NAN, 1, 0, 0) == LS_ERR_ARG, "top_p NaN");
    CHECK(sample_with(two, 2, NULL, 0, 1, 0, 1.5f, 1, 0, 0) == LS_ERR_ARG, "top_p > 1");
    CHECK(sample_with(two, 2, NULL, 0, 1, 0, -0.1f, 1, 0, 0) == LS_ERR_ARG, "top_p < 0");
    CHECK(sample_with(two, 2, NULL, 0, 1, 0, 1, 0, 0, 0) == LS_ERR_ARG, "penalty 0");
    CHECK(sample_with(two, 2, NULL, 0, 1, 0, 1, -1, 0, 0) == LS_ERR_ARG, "penalty < 0");
    CHECK(sample_with(two, 2, NULL, 0, 1, 0, 1, NAN, 0, 0) == LS_ERR_ARG, "penalty NaN");
    CHECK(sample_with(two, 2, NULL, 0, 0, 0, 1, INFINITY, 0, 0) == LS_ERR_ARG, "penalty inf");

    // Greedy: lowest id on ties, NaN never wins, all-NaN is an error.
    const float ties[5] = {1, 3, 2, 3, 3};
    CHECK(sample_with(ties, 5, NULL, 0, 0, 0, 1, 1, 0, 0) == 1, "greedy tie -> lowest id");
    CHECK(sample_with(ties, 5, NULL, 0, 0, 2, 0.1f, 1, 0, 0) == 1, "greedy ignores top_k/top_p");
    const float nans[4] = {NAN, 0.5f, NAN, 0.25f};
    CHECK(sample_with(nans, 4, NULL, 0, 0, 0, 1, 1, 0, 0) == 1, "NaN skipped by argmax");
    for (uint64_t c = 0; c < 50; c++) {
        int32_t id = sample_with(nans, 4, NULL, 0, 1, 0, 1, 1, 3, c);
        CHECK(id == 1 || id == 3, "NaN drawn: %d", id);
    }
    // Vocabularies past one block of the argmax's interleaved maxima: ties
    // across its lanes and the tail, NaN and infinities, against the first
    // index of the maximum found one by one.
    {
        float v[67];
        uint64_t z = 12345;
        for (int trial = 0; trial < 2000; trial++) {
            int32_t n = 1 + trial % 67, want = -1;
            for (int32_t i = 0; i < n; i++) {
                z = z * 6364136223846793005ULL + 1442695040888963407ULL;
                uint32_t r = (uint32_t)(z >> 33) % 9;
                v[i] = r == 0 ? NAN : r == 1 ? -INFINITY : r == 2 && trial % 5 == 0 ? INFINITY : (float)(r % 4);
            }
            for (int32_t i = 0; i < n; i++)
                if (v[i] == v[i] && v[i] != -INFINITY && (want < 0 || v[i] > v[want])) want = i;
            int32_t got = sample_with(v, n, NULL, 0, 0, 0, 1, 1, 0, 0);
            CHECK(got == (want < 0 ? LS_ERR_ARG : want), "greedy over %d: %d, expected %d", n, got, want);
        }
    }
    const float allnan[3] = {NAN, NAN, NAN};
    CHECK(sample_with(allnan, 3, NULL, 0, 0, 0, 1, 1, 0, 0) == LS_ERR_ARG, "all NaN greedy");
    CHECK(sample_with(allnan, 3, NULL, 0, 1, 0, 1, 1, 0, 0) == LS_ERR_ARG, "all NaN sampled");
    const float infs[4] = {1, INFINITY, -INFINITY, INFINITY};
    CHECK(sample_with(infs, 4, NULL, 0, 0.7f, 0, 1, 1, 9, 9) == 1, "+inf wins, lowest id");
    const float one[1] = {-3};
    CHECK(sample_with(one, 1, NULL, 0, 1, 0, 0.5f, 1.3f, 1, 2) == 0, "vocab 1");

    // Repetition penalty: once per distinct id, divides positives, multiplies
    // negatives, ignores ids outside the vocabulary.
    const float pl[2] = {2.0f, 0.9f};
    const int32_t rep[3] = {0, 0, 0};
    CHECK(sample_with(pl, 2, rep, 3, 0, 0, 1, 2.0f, 0, 0) == 0, "penalty applied more than once");
    const float neg[2] = {-1.0f, -1.5f};
    CHECK(sample_with(neg, 2, h1, 1, 0, 0, 1, 2.0f, 0, 0) == 1, "negative logit multiplied");
    const int32_t wild[5] = {-1, 2, INT32_MAX, INT32_MIN, 1000000};
    CHECK(sample_with(pl, 2, wild, 5, 0, 0, 1, 100.0f, 0, 0) == 0, "out-of-range history ids");
    const float pl2[2] = {2.0f, 1.5f};
    CHECK(sample_with(pl2, 2, h1, 1, 0, 0, 1, 2.0f, 0, 0) == 1, "penalty changes argmax");
    CHECK(sample_with(pl2, 2, h1, 1, 0, 0, 1, 0.5f, 0, 0) == 0, "penalty < 1 boosts");

    // Determinism and distribution on a small vocabulary.
    const float p4[4] = {logf(0.1f), logf(0.2f), logf(0.3f), logf(0.4f)};
    enum { N = 200000 };
    struct {
        float temp;
        int32_t k;
        float p;
        double want[4];
    } cases[] = {
        {1.0f, 0, 1.0f, {0.1, 0.2, 0.3, 0.4}},
        {1.0f, 2, 1.0f, {0, 0, 3.0 / 7, 4.0 / 7}},
        {1.0f, 0, 0.5f, {0, 0, 3.0 / 7, 4.0 / 7}},
        {1.0f, 0, 0.35f, {0, 0, 0, 1}},
        {1.0f, 3, 0.8f, {0, 0.2 / 0.9, 0.3 / 0.9, 0.4 / 0.9}},
        {2.0f, 0, 1.0f, {0.1, 0.2, 0.3, 0.4}}, // squared below
    };
    {
        double s = 0;
        for (int i = 0; i < 4; i++) s += sqrt((i + 1) * 0.1);
        for (int i = 0; i < 4; i++) cases[5].want[i] = sqrt((i + 1) * 0.1) / s;
    }
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        long counts[4] = {0};
        for (uint64_t i = 0; i < N; i++) {
            int32_t id = sample_with(p4, 4, NULL, 0, cases[c].temp, cases[c].k, cases[c].p, 1, 42, i);
            if (id < 0 || id >= 4) {
                CHECK(0, "case %zu: bad id %d", c, id);
                break;
            }
            counts[id]++;
        }
        for (int i = 0; i < 4; i++) {
            double f = (double)counts[i] / N;
            CHECK(fabs(f - cases[c].want[i]) < 0.006, "case %zu: id %d frequency %.4f want %.4f", c,
                  i, f, cases[c].want[i]);
        }
    }
    for (uint64_t c = 0; c < 100; c++) {
        int32_t a = sample_with(p4, 4, NULL, 0, 1, 0, 1, 1, 7, c);
        CHECK(a == sample_with(p4, 4, NULL, 0, 1, 0, 1, 1, 7, c), "same (seed, counter), other id");
    }

    // Large vocabulary against the naive reference: every path (heap top-k,
    // quickselect top-k, nucleus select, keep-all, list and full-pass draws)
    // must pick exactly the documented token.
    const int32_t V = 50257;
    float *lg = malloc((size_t)V * sizeof *lg);
    int32_t hist[64];
    uint64_t st = 12345;
    const int32_t ks[] = {0, 1, 2, 5, 40, 128, 129, 1000, 1025, 30000, V - 1, V, V + 5};
    const float ps[] = {1.0f, 0.95f, 0.5f, 0.1f, 0.0f};
    const float temps[] = {0.0f, 0.3f, 1.0f, 1.7f};
    long compared = 0;
    for (int trial = 0; trial < 6; trial++) {
        // Trials differ in shape: peaked, flat, and many exact ties.
        for (int32_t i = 0; i < V; i++) {
            double u = (double)(rng_next(&st) >> 11) * 0x1.0p-53;
            switch (trial % 3) {
            case 0: lg[i] = (float)(8.0 * u * u * u); break;
            case 1: lg[i] = (float)(0.5 * u); break;
            default: lg[i] = (float)floor(u * 6.0); break;
            }
        }
        if (trial == 4) lg[17] = NAN;
        if (trial == 5) lg[99] = -INFINITY;
        for (int j = 0; j < 64; j++) hist[j] = (int32_t)(rng_next(&st) % (uint64_t)(V + 40)) - 20;
        for (int pv = 0; pv < 2; pv++) {
            float pen = pv ? 1.3f : 1.0f;
            int32_t nh = pv ? 64 : 0;
            naive_ranked r;
            naive_rank(&r, lg, V, hist, nh, pen);
            for (size_t a = 0; a < sizeof ks / sizeof *ks; a++)
                for (size_t b = 0; b < sizeof ps / sizeof *ps; b++)
                    for (size_t c = 0; c < sizeof temps / sizeof *temps; c++) {
                        uint64_t seed = (uint64_t)trial * 1000 + a, ctr = b * 10 + c;
                        int32_t got = sample_with(lg, V, hist, nh, temps[c], ks[a], ps[b], pen, seed, ctr);
                        int32_t want = naive_sample(&r, temps[c], ks[a], ps[b], seed, ctr);
                        CHECK(got == want, "trial %d pen %g k %d p %g t %g: got %d want %d", trial,
                              pen, ks[a], ps[b], temps[c], got, want);
                        compared++;
                    }
            naive_free(&r);
        }
    }
    free(lg);
    if (g_fail == 0) printf("ok %ld configurations match the naive sampler\n", compared);
    return g_fail ? 2 : 0;
}

// ---- f16-check ----

static uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

// Every half round-trips; every midpoint between neighbouring halves rounds
// to the even one, and one fp32 ulp either side rounds to the nearer.
static int cmd_f16_check(void) {
    long checked = 0;
    for (uint32_t h = 0; h < 0x10000; h++) {
        float f = ls_f16_to_f32((uint16_t)h);
        int is_nan = (h & 0x7c00) == 0x7c00 && (h & 0x3ff);
        if (is_nan) {
            CHECK(isnan(f) && (f32_bits(f) & 0x400000), "half %04x: not a quiet NaN", h);
            CHECK((ls_f32_to_f16(f) & 0x7e00) == 0x7e00, "NaN %04x: not a NaN back", h);
            continue;
        }
        CHECK(ls_f32_to_f16(f) == h, "half %04x -> %a -> %04x", h, (double)f, ls_f32_to_f16(f));
        checked++;
        uint32_t mag = h & 0x7fff, sign = h & 0x8000;
        if (mag >= 0x7c00) continue; // inf has no upper neighbour
        // The next magnitude up; above 65504 it is 65536, which rounds to inf.
        double lo = fabs((double)f);
        double hi = mag == 0x7bff ? 65536.0 : fabs((double)ls_f16_to_f32((uint16_t)(mag + 1)));
        uint16_t h_lo = (uint16_t)(sign | mag), h_hi = (uint16_t)(sign | (mag + 1));
        float mid = (float)((lo + hi) / 2); // exact: 12 significant bits
        if (sign) mid = -mid;
        uint16_t even = (mag & 1) ? h_hi : h_lo;
        CHECK(ls_f32_to_f16(mid) == even, "midpoint %a -> %04x, want %04x", (double)mid,
              ls_f32_to_f16(mid), even);
        float below = bits_f32(f32_bits(mid) - 1), above = bits_f32(f32_bits(mid) + 1);
        CHECK(ls_f32_to_f16(below) == h_lo, "%a -> %04x, want %04x", (double)below,
              ls_f32_to_f16(below), h_lo);
        CHECK(ls_f32_to_f16(above) == h_hi, "%a -> %04x, want %04x", (double)above,
              ls_f32_to_f16(above), h_hi);
        checked += 3;
    }
    CHECK(ls_f32_to_f16(INFINITY) == 0x7c00 && ls_f32_to_f16(-INFINITY) == 0xfc00, "inf");
    CHECK(ls_f32_to_f16(1e30f) == 0x7c00 && ls_f32_to_f16(-1e30f) == 0xfc00, "overflow");
    CHECK(ls_f32_to_f16(1e-30f) == 0 && ls_f32_to_f16(-1e-30f) == 0x8000, "underflow keeps sign");
    CHECK(ls_f32_to_f16(0x1p-25f) == 0 && ls_f32_to_f16(0x1.000002p-25f) == 1, "half the least subnormal");
    if (g_fail == 0) printf("ok %ld conversions\n", checked);
    return g_fail ? 2 : 0;
}

// ---- rope-check ----

// ops.h promises the same bits on every path: each head dimension from 2 up
// (masked tails, more than one 64-pair block), one and three heads, three
// positions, inputs spanning many magnitudes. Buffers are allocated to
// their exact size, so a lane past the row is an ASan report.
static int cmd_rope_check(void) {
    const ls_ops *paths[2];
    const char *names[2];
    int np = 0;
    if (!ls_simd_missing(LS_SIMD_AVX2)) paths[np] = &ls_ops_avx2, names[np++] = "avx2";
    if (!ls_simd_missing(LS_SIMD_AVX512)) paths[np] = &ls_ops_avx512, names[np++] = "avx512";
    static const int32_t hds[] = {2, 4, 6, 8, 14, 16, 18, 30, 32, 34, 48, 62, 64, 96, 126, 128, 130, 256, 258};
    static const int32_t positions[] = {0, 7, 4095};
    uint32_t rng = 12345;
    long compared = 0;
    for (size_t a = 0; a < sizeof hds / sizeof hds[0]; a++)
        for (int32_t heads = 1; heads <= 3; heads += 2)
            for (size_t b = 0; b < sizeof positions / sizeof positions[0]; b++) {
                int32_t hd = hds[a], n = heads * hd;
                float *cs = malloc((size_t)hd * sizeof *cs), *x = malloc((size_t)n * sizeof *x);
                float *want = malloc((size_t)n * sizeof *want), *got = malloc((size_t)n * sizeof *got);
                ls_rope_table(cs, 1, positions[b], hd, 10000.0f);
                for (int32_t i = 0; i < n; i++) {
                    rng ^= rng << 13, rng ^= rng >> 17, rng ^= rng << 5;
                    x[i] = ldexpf((float)(rng & 0xffff) / 32768.0f - 1.0f, (int)(rng >> 16) % 41 - 20);
                }
                memcpy(want, x, (size_t)n * sizeof *x);
                ls_ops_portable.rope(want, heads, hd, cs);
                for (int k = 0; k < np; k++) {
                    memcpy(got, x, (size_t)n * sizeof *x);
                    paths[k]->rope(got, heads, hd, cs);
                    CHECK(memcmp(got, want, (size_t)n * sizeof *got) == 0, "%s rope differs: head_dim %d, %d heads, position %d",
                          names[k], hd, heads, positions[b]);
                    compared++;
                }
                free(cs), free(x), free(want), free(got);
            }
    if (g_fail == 0) printf("ok %ld rows match the portable path on %d SIMD paths\n", compared, np);
    return g_fail ? 2 : 0;
}

int main(int argc, char **argv) {
    if (argc < 2) return usage();
    const char *cmd = argv[1];
    argc -= 2;
    argv += 2;
    if (strcmp(cmd, "load") == 0) return cmd_load(argc, argv);
    if (strcmp(cmd, "logits") == 0) return cmd_logits(argc, argv);
    if (strcmp(cmd, "invariance") == 0) return cmd_invariance(argc, argv);
    if (strcmp(cmd, "batch") == 0) return cmd_batch(argc, argv);
    if (strcmp(cmd, "fuzz") == 0) return cmd_fuzz(argc, argv);
    if (strcmp(cmd, "sample") == 0) return cmd_sample(argc, argv);
    if (strcmp(cmd, "f16-check") == 0) {
        if (argc != 0) return usage();
        return cmd_f16_check();
    }
    if (strcmp(cmd, "rope-check") == 0) {
        if (argc != 0) return usage();
        return cmd_rope_check();
    }
    if (strcmp(cmd, "sample-check") == 0) {
        if (argc != 0) return usage();
        return cmd_sample_check();
    }
    return usage();
}
