/*
 * sample.c — ls_sample (loopserve.h): repetition penalty, temperature,
 * top-k, top-p and a counter-based RNG.
 *
 * The procedure, exactly, so that another implementation can reproduce a draw:
 *   1. v[i] = logits[i], NaN read as -inf. Each distinct id h of history with
 *      0 <= h < vocab gets v[h] = logits[h] / penalty if logits[h] > 0, else
 *      logits[h] * penalty (once, however often h repeats).
 *   2. Rank: i before j iff v[i] > v[j], or v[i] == v[j] and i < j.
 *   3. The first-ranked id is returned when temperature == 0 or its value
 *      vmax is +inf; if vmax is -inf (no usable logit) the call fails.
 *   4. w[i] = expf((v[i] - vmax) / temperature) in fp32, and the integer
 *      weight q[i] = floor(w[i] * 2^32 + 0.5). Integer weights make every
 *      sum below exact, so no result depends on summation order.
 *   5. Kept set: the first top_k ids in rank order (all when top_k == 0 or
 *      >= vocab); then, if top_p < 1, the shortest rank-order prefix of
 *      those whose sum of q reaches top_p * (sum of q over them), the
 *      product taken in double.
 *   6. u = uniform(seed, counter); Z = sum of q over the kept ids;
 *      t = min(floor(u * Z) (double product), Z - 1); the result is the
 *      first kept id, in ascending id order, at which the running sum of q
 *      exceeds t.
 *   uniform(seed, counter): with mix = splitmix64's finaliser,
 *      x = mix(mix(seed) + (counter + 1) * 0x9e3779b97f4a7c15) (wrapping),
 *      u = (x >> 11) * 2^-53, so u is in [0, 1).
 * Weights below 2^-33 of the top token's round to 0: such tokens are never
 * drawn, a bias under 1e-5 in total even over 50k tokens.
 *
 * Cost: one O(vocab) pass when nothing is cut; top-k by a size-k heap (small
 * k) or quickselect, top-p by a weighted quickselect, so no full sort of the
 * vocabulary ever happens.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "sampling.h"
#include "session_rules.h"

// ---- ranking ----

static inline void swap_ids(int32_t *a, size_t i, size_t j) {
    int32_t t = a[i];
    a[i] = a[j];
    a[j] = t;
}

// Sift-down for a heap whose top is the worst-ranked element.
static void sift_worst(int32_t *h, size_t n, size_t i, const float *v) {
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, top = i;
        if (l < n && ls_ranks_before(v, h[top], h[l])) top = l;
        if (r < n && ls_ranks_before(v, h[top], h[r])) top = r;
        if (top == i) return;
        swap_ids(h, i, top);
        i = top;
    }
}

// Sorts a[0..n) into rank order (heap sort: no recursion, no worst case).
static void rank_sort(int32_t *a, size_t n, const float *v) {
    for (size_t i = n / 2; i-- > 0;) sift_worst(a, n, i, v);
    for (size_t m = n; m > 1; m--) {
        swap_ids(a, 0, m - 1);
        sift_worst(a, m - 1, 0, v);
    }
}

// Rearranges a[0..n) so that a[0..m) are the m first-ranked ids (in no
// particular order) for the smallest m whose weight reaches `target`, and
// returns m. Weight is q[id], or 1 per id when q is NULL (plain top-k).
// Quickselect with median-of-three pivots; a long run of bad pivots falls
// back to a sort of what is left, so the worst case stays O(n log n).
static size_t select_prefix(int32_t *a, size_t n, const float *v, const uint64_t *q,
                            double target) {
    size_t lo = 0, hi = n;
    uint64_t above = 0; // weight of a[0..lo), all ranked before a[lo..hi)
    int budget = 2 * 64;
    while (hi - lo > 16 && budget-- > 0) {
        size_t mid = lo + (hi - lo) / 2, last = hi - 1;
        // Median of three to a[last] as the pivot.
        if (ls_ranks_before(v, a[mid], a[lo])) swap_ids(a, mid, lo);
        if (ls_ranks_before(v, a[last], a[lo])) swap_ids(a, last, lo);
        if (ls_ranks_before(v, a[mid], a[last])) swap_ids(a, mid, last);
        int32_t pivot = a[last];
        size_t i = lo;
        uint64_t s = 0;
        for (size_t j = lo; j < last; j++) {
            if (ls_ranks_before(v, a[j], pivot)) {
                s += q ? q[a[j]] : 1;
                swap_ids(a, i++, j);
            }
        }
        swap_ids(a, i, last); // pivot now at i, the ids before it in a[lo..i)
        uint64_t wp = q ? q[pivot] : 1;
        if (i > lo && (double)(above + s) >= target) {
            hi = i;
        } else if ((double)(above + s + wp) >= target) {
            return i + 1;
        } else {
            above += s + wp;
            lo = i + 1;
        }
    }
    rank_sort(a + lo, hi - lo, v);
    for (size_t i = lo; i < hi; i++) {
        above += q ? q[a[i]] : 1;
        if ((double)above >= target) return i + 1;
    }
    return hi; // only when target exceeds the total, which callers rule out
}

static int cmp_id(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

// Step 6's threshold: min(floor(u * z), z - 1), the product in double.
static inline uint64_t threshold(double u, uint64_t z) {
    uint64_t t = (uint64_t)(u * (double)z);
    return t > z - 1 ? z - 1 : t;
}

int32_t ls_draw(const uint64_t *w, int32_t vocab, uint64_t z, double u) {
    uint64_t t = threshold(u, z), cum = 0;
    for (int32_t i = 0; i < vocab; i++) {
        cum += w[i];
        if (cum > t) return i;
    }
    return vocab - 1; // unreachable: cum reaches z > t
}

// Step 6 over ids 0..V-1 in order, q zero for every id not kept.
static int32_t draw_all(const uint64_t *q, size_t V, uint64_t seed, uint64_t counter) {
    uint64_t z = 0;
    for (size_t i = 0; i < V; i++) z += q[i];
    return ls_draw(q, (int32_t)V, z, ls_uniform(seed, counter));
}

// Step 6 over a short list of kept ids.
static int32_t draw_list(int32_t *ids, size_t n, const uint64_t *q, uint64_t seed,
                         uint64_t counter) {
    qsort(ids, n, sizeof *ids, cmp_id);
    uint64_t z = 0;
    for (size_t i = 0; i < n; i++) z += q[ids[i]];
    uint64_t t = threshold(ls_uniform(seed, counter), z), cum = 0;
    for (size_t i = 0; i < n; i++) {
        cum += q[ids[i]];
        if (cum > t) return ids[i];
    }
    return ids[n - 1]; // unreachable
}

// exp(x) * 2^32 < 0.5 for x < -23: such weights are 0 without calling expf.
static inline uint64_t weight(float vi, float vmax, float temperature) {
    float x = (vi - vmax) / temperature;
    if (!(x >= -23.0f)) return 0;
    return (uint64_t)((double)expf(x) * 4294967296.0 + 0.5);
}

// ---- steps 1-5 ----

/* Above this many kept ids, draw by a pass over the vocabulary instead of
 * sorting the kept list. */
#define LIST_MAX 1024
/* Up to this top_k, a size-k heap beats quickselect. */
#define HEAP_K_MAX 128

void ls_mask_logits(float *logits, int32_t vocab, const uint32_t *mask) {
    for (int32_t w = 0; w < (int32_t)ls_mask_words(vocab); w++) {
        uint32_t bits = mask[w];
        if (bits == UINT32_MAX) continue; /* a whole word allowed: the common case inside a string */
        int32_t base = w * 32, n = vocab - base < 32 ? vocab - base : 32;
        for (int32_t b = 0; b < n; b++)
            if (!((bits >> b) & 1u)) logits[base + b] = -INFINITY;
    }
}

void ls_penalise(float *v, const float *logits, int32_t vocab, const int32_t *history, int32_t n_history,
                 float penalty) {
    for (int32_t i = 0; i < vocab; i++) v[i] = logits[i] != logits[i] ? -INFINITY : logits[i];
    if (penalty == 1.0f) return;
    // Reads the untouched input, so a repeated id is penalised once.
    for (int32_t j = 0; j < n_history; j++) {
        int32_t h = history[j];
        if (h >= 0 && h < vocab) v[h] = ls_penalised(logits[h], penalty);
    }
}

/* The largest non-NaN value of v (-inf when there is none), in LANES
 * interleaved running maxima. */
static float greedy_max(const float *v, size_t V) {
    enum { LANES = 16 };
    float m[LANES];
    for (int l = 0; l < LANES; l++) m[l] = -INFINITY;
    size_t i = 0;
    for (; i + LANES <= V; i += LANES)
        for (int l = 0; l < LANES; l++) m[l] = v[i + l] > m[l] ? v[i + l] : m[l];
    float vmax = -INFINITY;
    for (; i < V; i++) vmax = v[i] > vmax ? v[i] : vmax;
    for (int l = 0; l < LANES; l++) vmax = m[l] > vmax ? m[l] : vmax;
    return vmax;
}

/* The first index of x in v, which holds it: whole blocks while none
 * matches, then the matching block's elements. */
static size_t first_equal(const float *v, size_t V, float x) {
    enum { LANES = 16 };
    size_t i = 0;
    for (; i + LANES <= V; i += LANES) {
        int hit = 0;
        for (int l = 0; l < LANES; l++) hit |= v[i + l] == x;
        if (hit) break;
    }
    while (v[i] != x) i++;
    return i;
}

/* The first-ranked id of v (greater value first, lower id on ties, NaN
 * skipped), or LS_ERR_ARG when no value is above -inf. */
static int32_t first_ranked(const float *v, size_t V) {
    const float vmax = greedy_max(v, V);
    return vmax == -INFINITY ? LS_ERR_ARG : (int32_t)first_equal(v, V, vmax);
}

// Steps 1-3: v, and the first-ranked id (LS_ERR_ARG when its value is -inf).
static int32_t penalised_best(float *v, const float *logits, int32_t vocab, const int32_t *history,
                              int32_t n_history, float penalty) {
    ls_penalise(v, logits, vocab, history, n_history, penalty);
    return first_ranked(v, (size_t)vocab);
}

// Step 5 for temperature > 0 and a finite vmax: the kept set, either as a
// list (returns 1: ids[0, *n) in no particular order, their weights at
// q[id]; only when the cut leaves at most LIST_MAX ids and dense is 0) or
// dense (returns 0: q[id] is the weight of every id, 0 outside the set).
static int keep(const float *v, size_t V, float vmax, float temperature, size_t k, float top_p, int dense,
                uint64_t *q, int32_t *ids, size_t *n) {
    if (k == V && !(top_p < 1.0f)) { // nothing is cut
        for (size_t i = 0; i < V; i++) q[i] = weight(v[i], vmax, temperature);
        return 0;
    }
    // ids[0..k) := the top-k ids, unordered.
    if (k == V) {
        for (size_t i = 0; i < V; i++) ids[i] = (int32_t)i;
    } else if (k <= HEAP_K_MAX) {
        // Size-k heap, worst on top: most ids lose to it in one compare.
        for (size_t i = 0; i < k; i++) ids[i] = (int32_t)i;
        for (size_t i = k / 2; i-- > 0;) sift_worst(ids, k, i, v);
        for (size_t i = k; i < V; i++) {
            if (ls_ranks_before(v, (int32_t)i, ids[0])) {
                ids[0] = (int32_t)i;
                sift_worst(ids, k, 0, v);
            }
        }
    } else {
        for (size_t i = 0; i < V; i++) ids[i] = (int32_t)i;
        select_prefix(ids, V, v, NULL, (double)k);
    }
    if ((dense || k > LIST_MAX) && k < V) memset(q, 0, V * sizeof *q); // ids outside the top-k weigh 0
    uint64_t zk = 0;
    for (size_t i = 0; i < k; i++) {
        q[ids[i]] = weight(v[ids[i]], vmax, temperature);
        zk += q[ids[i]];
    }
    *n = top_p < 1.0f ? select_prefix(ids, k, v, q, (double)top_p * (double)zk) : k;
    if (!dense && *n <= LIST_MAX) return 1;
    for (size_t i = *n; i < k; i++) q[ids[i]] = 0;
    return 0;
}

int32_t ls_sample_weights(const float *logits, int32_t vocab, const int32_t *history, int32_t n_history,
                          const ls_sampling *sp, float *v, int32_t *ids, uint64_t *w, uint64_t *z) {
    const float temperature = sp->temperature, top_p = sp->top_p, penalty = sp->repetition_penalty;
    const int32_t top_k = sp->top_k;
    int32_t best = penalised_best(v, logits, vocab, history, n_history, penalty);
    if (best < 0) return best;
    const size_t V = (size_t)vocab, k = (top_k == 0 || top_k >= vocab) ? V : (size_t)top_k;
    size_t n;
    if (v[best] == INFINITY) { // step 3: the first-ranked id outright
        memset(w, 0, V * sizeof *w);
        w[best] = 1;
    } else {
        keep(v, V, v[best], temperature, k, top_p, 1, w, ids, &n);
    }
    *z = 0;
    for (size_t i = 0; i < V; i++) *z += w[i];
    return LS_OK;
}

// ---- ls_sample ----

int32_t ls_sample(const float *logits, int32_t vocab, const int32_t *history, int32_t n_history,
                  const ls_sampling *sp, uint64_t counter) {
    if (logits == NULL || vocab <= 0 || sp == NULL) return LS_ERR_ARG;
    const float temperature = sp->temperature, top_p = sp->top_p, repetition_penalty = sp->repetition_penalty;
    const int32_t top_k = sp->top_k;
    const uint64_t seed = sp->seed;
    if (n_history < 0 || (n_history > 0 && history == NULL)) return LS_ERR_ARG;
    if (!ls_sampling_ok(sp)) return LS_ERR_ARG;

    const size_t V = (size_t)vocab;
    const int penalize = repetition_penalty != 1.0f && n_history > 0;

    if (temperature == 0.0f && !penalize) {
        // Greedy without penalty needs no copy: two branch-free passes the
        // compiler vectorizes (the maximum, then its first index), faster
        // than one pass keeping indices (docs/kernels.md#tuning-figures).
        // NaN never compares greater or equal, so it is skipped like -inf;
        // the lowest index wins a tie.
        return first_ranked(logits, V);
    }

    const size_t k = (top_k == 0 || top_k >= vocab) ? V : (size_t)top_k;
    // One block: v[V] floats | q[V] weights (8-byte aligned) | ids[V]; q and
    // ids only when sampling.
    const int sampling = temperature != 0.0f;
    const size_t q_off = (V * sizeof(float) + 7) & ~(size_t)7;
    size_t bytes = sampling ? q_off + V * (sizeof(uint64_t) + sizeof(int32_t)) : V * sizeof(float);
    char *block = malloc(bytes);
    if (block == NULL) return LS_ERR_NOMEM;
    float *v = (float *)(void *)block;
    uint64_t *q = sampling ? (uint64_t *)(void *)(block + q_off) : NULL;
    int32_t *ids = sampling ? (int32_t *)(void *)(block + q_off + V * sizeof(uint64_t)) : NULL;

    int32_t result = penalised_best(v, logits, vocab, history, n_history, repetition_penalty);
    if (result >= 0 && sampling && v[result] != INFINITY) {
        size_t n;
        if (keep(v, V, v[result], temperature, k, top_p, 0, q, ids, &n))
            result = draw_list(ids, n, q, seed, counter);
        else
            result = draw_all(q, V, seed, counter);
    }
    free(block);
    return result;
}
