// load, logits, invariance: a model through sessions, as the loader and the
// forward pass see it.
#include <stdlib.h>
#include <string.h>

#include "../model_desc.h"
#include "driver.h"

// ---- load ----

int cmd_load(int argc, char **argv) {
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

int open_forward(int argc, char **argv, fwd_args *a) {
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

void close_forward(fwd_args *a) {
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

int cmd_logits(int argc, char **argv) {
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
int cmd_invariance(int argc, char **argv) {
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
