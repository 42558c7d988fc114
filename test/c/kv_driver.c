/*
 * kv_driver.c — every key/value cache mode (loopserve.h LS_KV_*) under
 * AddressSanitizer + UndefinedBehaviorSanitizer, for one SIMD path
 * (test/kernels/kv_asan.test.ts runs it, linked with the sanitized kernels
 * of test/helpers/sanitized.ts).
 *
 *   kv_driver FILE SIMD
 *
 * For each mode the model can run, with and without a window: a prompt fed
 * in uneven calls must give the logits of one-token steps bit for bit (the
 * ring wraps several times, so runs end at every slot); a prefix copied into
 * a fresh session must continue bit-identically; greedy speculative cycles
 * (chain) must give plain decoding's tokens. Exit 0 ok (one "ok MODE WINDOW"
 * line each), 2 a library error, 3 the path is not on this CPU, 4 a
 * mismatch; sanitizer reports go to stderr.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loopserve.h"
#include "model_desc.h"

#define N 90      /* prompt tokens: several trips round a window's ring */
#define GEN 24    /* greedy tokens compared with speculative decoding */
#define LOOPS 3

static ls_model *model;
static int32_t vocab;

static ls_session *session(int32_t max_seq, int32_t window, int32_t mode) {
    char err[512];
    ls_session_params sp = {.max_seq = max_seq, .loops = LOOPS, .cache_window = window, .kv_mode = mode};
    ls_session *s = ls_session_new(model, &sp, err, sizeof err);
    if (!s) printf("error: %s\n", err);
    return s;
}

/* Logits of tokens[0..n) fed in calls of the sizes in `split` (cycled). */
static int feed(ls_session *s, const int32_t *tokens, int32_t n, const int32_t *split, int32_t n_split, float *logits) {
    for (int32_t i = 0, k = 0; i < n; k++) {
        int32_t m = split[k % n_split] < n - i ? split[k % n_split] : n - i;
        int32_t rc = ls_session_forward(s, tokens + i, m, LOOPS, logits + (size_t)i * vocab, m);
        if (rc != LS_OK) {
            printf("error: ls_session_forward returned %d\n", rc);
            return 0;
        }
        i += m;
    }
    return 1;
}

static int check_mode(int32_t mode, int32_t window) {
    int32_t tokens[N];
    for (int32_t i = 0; i < N; i++) tokens[i] = (i * 37 + 5) % vocab;
    size_t bytes = (size_t)N * vocab * sizeof(float);
    float *a = malloc(bytes), *b = malloc(bytes);
    ls_session *s1 = session(N, window, mode), *s2 = session(N, window, mode), *s3 = session(N, window, mode);
    int ok = a && b && s1 && s2 && s3;
    static const int32_t whole[] = {N}, uneven[] = {1, 33, 7, 2, 64};
    ok = ok && feed(s1, tokens, N, uneven, 5, a) && feed(s2, tokens, N, whole, 1, b);
    if (ok && memcmp(a, b, bytes) != 0) {
        printf("mismatch: mode 0x%x window %d: prefill split changes logits\n", (unsigned)mode, window);
        ok = 0;
    }
    /* prefix copy: positions [0, 50) of s1, then the rest */
    if (ok) {
        int32_t rc = ls_session_copy_prefix(s3, s1, 50);
        if (rc != LS_OK) {
            /* a windowed ring may no longer hold what a copy needs; the full cache must */
            if (!(window > 0 && rc == LS_ERR_STATE)) {
                printf("error: ls_session_copy_prefix returned %d\n", rc);
                ok = 0;
            }
        } else {
            static const int32_t ones[] = {1};
            ok = feed(s3, tokens + 50, N - 50, ones, 1, b + (size_t)50 * vocab);
            if (ok && memcmp(a + (size_t)50 * vocab, b + (size_t)50 * vocab, (size_t)(N - 50) * vocab * sizeof(float)) != 0) {
                printf("mismatch: mode 0x%x window %d: copied prefix continues differently\n", (unsigned)mode, window);
                ok = 0;
            }
        }
    }
    ls_session_free(s1);
    ls_session_free(s2);
    ls_session_free(s3);

    /* greedy speculative chain against plain decoding */
    int32_t plain[GEN], spec[GEN + 17];
    ls_session *p = ok ? session(20 + GEN + 1, window, mode) : NULL;
    ls_session *q = ok ? session(20 + GEN + 65, window, mode) : NULL;
    ok = ok && p && q;
    if (ok) {
        const ls_step_params greedy = {.loops = LOOPS, .sampling = {.top_p = 1, .repetition_penalty = 1}};
        int32_t t = ls_session_step(p, tokens, 20, &greedy, NULL);
        for (int32_t i = 0; t >= 0 && i < GEN; i++) {
            plain[i] = t;
            if (i + 1 < GEN) t = ls_session_step(p, &plain[i], 1, &greedy, NULL);
        }
        int32_t got = 0;
        spec[got++] = ls_session_step(q, tokens, 20, &greedy, NULL);
        while (ok && got < GEN) {
            ls_spec_params prm = {.draft_loops = 1, .verify_loops = LOOPS, .draft_ahead = 5, .k_branches = 1,
                                  .max_new = GEN - got, .sampling = {.top_p = 1, .repetition_penalty = 1}};
            int32_t n = ls_spec_cycle(q, spec[got - 1], &prm, spec + got, NULL);
            if (n < 1) {
                printf("error: ls_spec_cycle returned %d\n", n);
                ok = 0;
            }
            got += n > 0 ? n : 0;
        }
        if (ok && (t < 0 || memcmp(plain, spec, sizeof plain) != 0)) {
            printf("mismatch: mode 0x%x window %d: speculative tokens differ from plain decoding\n", (unsigned)mode, window);
            ok = 0;
        }
    }
    ls_session_free(p);
    ls_session_free(q);
    free(a);
    free(b);
    return ok;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: kv_driver FILE SIMD\n");
        return 1;
    }
    char err[512];
    model = load_model(argv[1], 2, atoi(argv[2]), err, sizeof err);
    if (!model) {
        printf("error: %s\n", err);
        return strstr(err, "lacks") ? 3 : 2;
    }
    ls_model_info info;
    ls_model_info_get(model, &info);
    vocab = info.vocab_size;
    int pow2 = (info.head_dim & (info.head_dim - 1)) == 0;
    static const int32_t modes[] = {LS_KV_FP16, LS_KV_INT8, LS_KV_INT4,
                                    LS_KV_FP16 | LS_KV_HADAMARD, LS_KV_INT8 | LS_KV_HADAMARD,
                                    LS_KV_INT4 | LS_KV_HADAMARD | LS_KV_FP16_QKV};
    int rc = 0;
    for (size_t i = 0; i < sizeof modes / sizeof modes[0] && rc == 0; i++) {
        if ((modes[i] & LS_KV_HADAMARD) && !pow2) continue;
        for (int32_t window = 0; window <= 5 && rc == 0; window += 5) {
            if (check_mode(modes[i], window)) printf("ok 0x%x %d\n", (unsigned)modes[i], window);
            else rc = 4;
        }
    }
    ls_model_free(model);
    return rc;
}
