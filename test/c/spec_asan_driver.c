/* Speculative cycles of many shapes against plain stepping, built with
 * ASan/UBSan by test/kernels/spec.test.ts. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "loopserve.h"
#include "model_desc.h"
/* usage: drv MODEL -- runs speculative cycles of many shapes against plain
 * stepping; exit 1 on a mismatch */
static ls_session *session(ls_model *m, int32_t max_seq, int32_t loops, int32_t window) {
    char err[256];
    ls_session_params sp = {.max_seq = max_seq, .loops = loops, .cache_window = window};
    return ls_session_new(m, &sp, err, 256);
}
static ls_step_params step_params(int V, float temp, float pen, uint64_t seed) {
    return (ls_step_params){.loops = V, .sampling = {.temperature = temp, .top_p = 1.0f, .repetition_penalty = pen, .seed = seed}};
}
static int plain(ls_model *m, const int32_t *prompt, int np, int V, int W, int n, float temp, float pen, uint64_t seed, int32_t *out) {
    ls_session *s = session(m, np + n + 1, V, W);
    ls_step_params sp = step_params(V, temp, pen, seed);
    int32_t t = ls_session_step(s, prompt, np, &sp, NULL);
    out[0] = t;
    for (int i = 1; i < n; i++) { t = ls_session_step(s, &t, 1, &sp, NULL); out[i] = t; }
    ls_session_free(s);
    return 0;
}
int main(int argc, char **argv) {
    char err[256];
    int simd = argc > 2 ? atoi(argv[2]) : 0;
    ls_model *m = load_model(argv[1], 2, simd, err, 256);
    if (!m) { fprintf(stderr, "%s\n", err); return 2; }
    ls_model_info mi; ls_model_info_get(m, &mi);
    int32_t prompt[40];
    for (int i = 0; i < 40; i++) prompt[i] = (i * 7919 + 13) % mi.vocab_size;
    /* D, V, k, K, window, penalty?, sampled?; the last three draft deeper than they verify */
    int shapes[][7] = {{1,4,4,1,0,0,0},{2,4,16,1,3,0,0},{4,4,4,1,0,0,0},{1,3,8,8,0,1,0},{2,5,16,4,1,1,0},{1,4,4,16,5,0,0},{1,2,4,16,64,1,0},{2,4,6,1,0,0,1},{1,3,16,1,2,1,1},
                       {6,4,4,1,0,0,0},{5,2,8,4,3,1,0},{8,3,6,1,0,0,1}};
    int bad = 0;
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        int D = shapes[si][0], V = shapes[si][1], k = shapes[si][2], K = shapes[si][3], W = shapes[si][4];
        float pen = shapes[si][5] ? 1.3f : 1.0f; float temp = shapes[si][6] ? 0.9f : 0.0f;
        int np = si % 2 ? 40 : 5, n = 100;
        int32_t ref[128], got[128 + 17];
        plain(m, prompt, np, V, W, n, temp, pen, 3, ref);
        ls_session *s = session(m, np + n + 65, D > V ? D : V, W);
        ls_step_params sp = step_params(V, temp, pen, 3);
        int32_t t = ls_session_step(s, prompt, np, &sp, NULL);
        int have = 1; got[0] = t;
        ls_spec_params p = {.draft_loops = D, .verify_loops = V, .draft_ahead = k, .k_branches = K,
                            .leaf_min_prob = si % 3 == 2 ? 0.05f : 0.0f,
                            .sampling = {.temperature = temp, .top_p = 1.0f, .repetition_penalty = pen, .seed = 3}};
        int32_t stats[2];
        /* every other shape also takes the verifier's logits, into a buffer
         * of exactly draft_ahead + 1 rows (ASan catches a row too many) */
        float *rows = si % 2 ? malloc((size_t)(k + 1) * mi.vocab_size * sizeof(float)) : NULL;
        while (have < n) {
            p.max_new = n - have;
            int r = rows ? ls_spec_cycle_logits(s, t, &p, got + have, stats, rows) : ls_spec_cycle(s, t, &p, got + have, stats);
            if (r < 1) { fprintf(stderr, "shape %zu: error %d\n", si, r); return 1; }
            have += r; t = got[have - 1];
        }
        ls_session_free(s);
        free(rows);
        if (temp == 0.0f && memcmp(ref, got, n * sizeof(int32_t)) != 0) { fprintf(stderr, "shape %zu: MISMATCH\n", si); bad++; }
    }
    /* error paths: nothing committed */
    ls_session *s = session(m, 10, 4, 0);
    ls_step_params sp = step_params(4, 0, 1, 0);
    int32_t t = ls_session_step(s, prompt, 5, &sp, NULL);
    ls_spec_params p = {.draft_loops = 1, .verify_loops = 4, .draft_ahead = 4, .k_branches = 4, .max_new = 8,
                        .sampling = {.top_p = 1, .repetition_penalty = 1}};
    int32_t o[17];
    if (ls_spec_cycle(s, t, &p, o, NULL) != LS_ERR_FULL || ls_session_pos(s) != 5) bad++;
    ls_session_free(s);
    ls_model_free(m);
    printf("%s\n", bad ? "FAIL" : "ok");
    return bad ? 1 : 0;
}
