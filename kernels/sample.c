/*
 * sample.c — ls_sample (loopserve.h): repetition penalty, temperature,
 * top-k, top-p and a counter-based RNG.
 *
 * The procedure, exactly, so another implementation can reproduce a draw:
 *   1. v[i] = logits[i], NaN read as -inf. Each distinct id h of history with
 *      0 <= h < vocab gets v[h] = logits[h] / penalty if logits[h] > 0, else
 *      logits[h] * penalty (once, however often h repeats).
 *   2. Rank: i before j iff v[i] > v[j], or v[i] == v[j] and i < j.
 *   3. The first-ranked id is returned when temperature == 0 or its value is
 *      +inf; if its value is -inf (no usable logit) the call fails.
 *   4. w[i] = expf((v[i] - vmax) / temperature), in fp32.
 *   5. Kept set: the first top_k ids in rank order (all when top_k == 0 or
 *      >= vocab); then, if top_p < 1, the shortest rank-order prefix of those
 *      whose running sum of w (double) reaches top_p * (their total).
 *   6. u = uniform(seed, counter); Z = sum of w over the kept ids in
 *      ascending id order (double); the result is the first kept id, in
 *      ascending id order, at which the running sum exceeds u * Z (or, if
 *      rounding leaves none, the last kept id with w > 0).
 *   uniform(seed, counter): with mix = splitmix64's finaliser,
 *      x = mix(mix(seed) + (counter + 1) * 0x9e3779b97f4a7c15) (wrapping),
 *      u = (x >> 11) * 2^-53, so u is in [0, 1).
 * Walking in id order rather than rank order lets the common case (nothing
 * cut) run in one O(vocab) pass with no sort; top-k uses a size-k heap and
 * top-p pops a rank heap only as far as the nucleus reaches.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

// ---- rng ----

static uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double uniform(uint64_t seed, uint64_t counter) {
    uint64_t x = mix64(mix64(seed) + (counter + 1) * 0x9e3779b97f4a7c15ull);
    return (double)(x >> 11) * 0x1.0p-53;
}

// ---- ranking ----

static inline float num(float x) { return x != x ? -INFINITY : x; }

// Does id a rank before id b? A strict total order: ties go to the lower id.
static inline int before(const float *v, int32_t a, int32_t b) {
    return v[a] > v[b] || (v[a] == v[b] && a < b);
}

// Sift-down for a heap whose top outranks (best_top) or is outranked by
// (!best_top) every other element.
static void sift(int32_t *h, size_t n, size_t i, const float *v, int best_top) {
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, top = i;
        if (l < n && (best_top ? before(v, h[l], h[top]) : before(v, h[top], h[l]))) top = l;
        if (r < n && (best_top ? before(v, h[r], h[top]) : before(v, h[top], h[r]))) top = r;
        if (top == i) return;
        int32_t t = h[i];
        h[i] = h[top];
        h[top] = t;
        i = top;
    }
}

static void heapify(int32_t *h, size_t n, const float *v, int best_top) {
    for (size_t i = n / 2; i-- > 0;) sift(h, n, i, v, best_top);
}

static int cmp_id(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

// Draws from the kept ids (ascending) with weights w_of(id); see step 6.
static int32_t draw(const int32_t *ids, size_t n, const float *w, uint64_t seed, uint64_t counter) {
    double z = 0.0;
    for (size_t i = 0; i < n; i++) z += w[ids[i]];
    double t = uniform(seed, counter) * z, cum = 0.0;
    int32_t last = ids[0];
    for (size_t i = 0; i < n; i++) {
        float wi = w[ids[i]];
        if (wi <= 0.0f) continue;
        cum += wi;
        last = ids[i];
        if (cum > t) return ids[i];
    }
    return last;
}

// ---- ls_sample ----

int32_t ls_sample(const float *logits, int32_t vocab, const int32_t *history, int32_t n_history,
                  float temperature, int32_t top_k, float top_p, float repetition_penalty,
                  uint64_t seed, uint64_t counter) {
    if (logits == NULL || vocab <= 0) return LS_ERR_ARG;
    if (n_history < 0 || (n_history > 0 && history == NULL)) return LS_ERR_ARG;
    if (!(temperature >= 0.0f) || isinf(temperature)) return LS_ERR_ARG;
    if (top_k < 0) return LS_ERR_ARG;
    if (!(top_p >= 0.0f && top_p <= 1.0f)) return LS_ERR_ARG;
    if (!(repetition_penalty > 0.0f) || isinf(repetition_penalty)) return LS_ERR_ARG;

    const size_t V = (size_t)vocab;
    const int penalize = repetition_penalty != 1.0f && n_history > 0;

    if (temperature == 0.0f && !penalize) {
        // Greedy without penalty needs no copy of the logits.
        int32_t best = 0;
        float bv = num(logits[0]);
        for (size_t i = 1; i < V; i++) {
            float x = num(logits[i]);
            if (x > bv) {
                bv = x;
                best = (int32_t)i;
            }
        }
        return bv == -INFINITY ? LS_ERR_ARG : best;
    }

    const size_t k = (top_k == 0 || top_k >= vocab) ? V : (size_t)top_k;
    const int keep_all = k == V && !(top_p < 1.0f);
    // One block: v[V] | w[V] | ids[V]; w and ids only when sampling.
    size_t n_floats = temperature == 0.0f ? V : 2 * V;
    size_t n_ids = temperature == 0.0f || keep_all ? 0 : (k < V ? k : V);
    char *block = malloc(n_floats * sizeof(float) + n_ids * sizeof(int32_t));
    if (block == NULL) return LS_ERR_NOMEM;
    float *v = (float *)(void *)block;
    float *w = v + V;
    int32_t *ids = (int32_t *)(void *)(block + n_floats * sizeof(float));

    for (size_t i = 0; i < V; i++) v[i] = num(logits[i]);
    if (penalize) {
        // Reads the untouched input, so a repeated id is penalised once.
        for (int32_t j = 0; j < n_history; j++) {
            int32_t h = history[j];
            if (h < 0 || h >= vocab) continue;
            float l = num(logits[h]);
            v[h] = l > 0.0f ? l / repetition_penalty : l * repetition_penalty;
        }
    }
    int32_t best = 0;
    for (size_t i = 1; i < V; i++)
        if (v[i] > v[best]) best = (int32_t)i;
    const float vmax = v[best];
    int32_t result;
    if (vmax == -INFINITY) {
        result = LS_ERR_ARG;
        goto done;
    }
    if (temperature == 0.0f || vmax == INFINITY) {
        result = best;
        goto done;
    }
    // Step 4 for every id that can be kept; top-k leaves the rest unset.
    if (k == V)
        for (size_t i = 0; i < V; i++) w[i] = expf((v[i] - vmax) / temperature);

    if (keep_all) {
        double z = 0.0;
        for (size_t i = 0; i < V; i++) z += w[i];
        double t = uniform(seed, counter) * z, cum = 0.0;
        result = best;
        for (size_t i = 0; i < V; i++) {
            if (w[i] <= 0.0f) continue;
            cum += w[i];
            result = (int32_t)i;
            if (cum > t) break;
        }
        goto done;
    }

    size_t n_keep;
    int32_t *kept;
    if (k < V) {
        // Size-k heap with the worst on top: most ids lose to it in one compare.
        for (size_t i = 0; i < k; i++) ids[i] = (int32_t)i;
        heapify(ids, k, v, 0);
        for (size_t i = k; i < V; i++) {
            if (before(v, (int32_t)i, ids[0])) {
                ids[0] = (int32_t)i;
                sift(ids, k, 0, v, 0);
            }
        }
        // Heap-sort in place: popping the worst to the back leaves rank order.
        for (size_t n = k; n > 1; n--) {
            int32_t t = ids[0];
            ids[0] = ids[n - 1];
            ids[n - 1] = t;
            sift(ids, n - 1, 0, v, 0);
        }
        for (size_t i = 0; i < k; i++) w[ids[i]] = expf((v[ids[i]] - vmax) / temperature);
        n_keep = k;
        if (top_p < 1.0f) {
            double z = 0.0, cum = 0.0;
            for (size_t i = 0; i < k; i++) z += w[ids[i]];
            double target = (double)top_p * z;
            for (n_keep = 0; n_keep < k;) {
                cum += w[ids[n_keep++]];
                if (cum >= target) break;
            }
        }
        kept = ids;
    } else {
        // All ranks, top_p < 1: pop a best-on-top heap only until the nucleus
        // is complete; popped ids collect at the back in rank order.
        for (size_t i = 0; i < V; i++) ids[i] = (int32_t)i;
        heapify(ids, V, v, 1);
        double z = 0.0, cum = 0.0;
        for (size_t i = 0; i < V; i++) z += w[i];
        double target = (double)top_p * z;
        size_t n = V;
        while (n > 0) {
            int32_t t = ids[0];
            ids[0] = ids[n - 1];
            ids[n - 1] = t;
            n--;
            sift(ids, n, 0, v, 1);
            cum += w[t];
            if (cum >= target) break;
        }
        n_keep = V - n;
        kept = ids + n;
    }
    qsort(kept, n_keep, sizeof *kept, cmp_id);
    result = draw(kept, n_keep, w, seed, counter);

done:
    free(block);
    return result;
}
