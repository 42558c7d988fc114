// sample, sample-check: ls_sample on given logits, and against a naive
// implementation of its documented procedure.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "driver.h"

/* ls_sample with its sampling fields spelled out, as the checks below list them. */
static int32_t sample_with(const float *logits, int32_t vocab, const int32_t *history, int32_t n_history, float temperature,
                           int32_t top_k, float top_p, float penalty, uint64_t seed, uint64_t counter) {
    ls_sampling sp = {.temperature = temperature, .top_k = top_k, .top_p = top_p, .repetition_penalty = penalty, .seed = seed};
    return ls_sample(logits, vocab, history, n_history, &sp, counter);
}

int cmd_sample(int argc, char **argv) {
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

int cmd_sample_check(void) {
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
