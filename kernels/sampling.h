/*
 * sampling.h — the rules of ls_sample's procedure (written out at the top
 * of sample.c) that speculative sampling (spec.c) and the draft head
 * (draft_head.c) apply too, so that each exists once: the counter-based
 * generator, the rank order, the repetition penalty, the kept set's integer
 * weights and the draw. Not ABI.
 */
#ifndef LS_SAMPLING_H
#define LS_SAMPLING_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "loopserve.h"

/* splitmix64's finaliser. */
static inline uint64_t ls_mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* The uniform in [0, 1) of (seed, counter): the same on every machine. */
static inline double ls_uniform(uint64_t seed, uint64_t counter) {
    uint64_t x = ls_mix64(ls_mix64(seed) + (counter + 1) * 0x9e3779b97f4a7c15ull);
    return (double)(x >> 11) * 0x1.0p-53;
}

/* Token a ranks before b in v: higher value, ties to the lower id. A strict
 * total order. */
static inline int ls_ranks_before(const float *v, int32_t a, int32_t b) {
    return v[a] > v[b] || (v[a] == v[b] && a < b);
}

/* Inserts id into best[0, *have), kept ranked (best first), at most n long. */
static inline void ls_rank_insert(const float *v, int32_t id, int32_t *best, int32_t *have, int32_t n) {
    if (*have == n && !ls_ranks_before(v, id, best[n - 1])) return;
    int32_t at = *have < n ? (*have)++ : n - 1;
    while (at > 0 && ls_ranks_before(v, id, best[at - 1])) {
        best[at] = best[at - 1];
        at--;
    }
    best[at] = id;
}

/* A logit of a token in the history under the repetition penalty (NaN read
 * as -inf). */
static inline float ls_penalised(float l, float penalty) {
    if (l != l) return -INFINITY;
    return l > 0.0f ? l / penalty : l * penalty;
}

/* Words of a token mask over vocab entries (loopserve.h, token masks). */
static inline size_t ls_mask_words(int32_t vocab) { return ((size_t)vocab + 31) / 32; }

/* Sets logits[i] to -inf for every token i < vocab the mask does not allow. */
void ls_mask_logits(float *logits, int32_t vocab, const uint32_t *mask);

/* v[i] = logits[i] with NaN read as -inf, and ls_penalised once per
 * distinct history id in [0, vocab). */
void ls_penalise(float *v, const float *logits, int32_t vocab, const int32_t *history, int32_t n_history,
                 float penalty);

/* The distribution a sampling step (temperature > 0) draws from: w[i] = the
 * integer weight of token i in the kept set, 0 outside it, and *z their sum.
 * v and ids are scratch of vocab entries. LS_ERR_ARG when no logit is
 * usable (the arguments are ls_sample's and already valid). */
int32_t ls_sample_weights(const float *logits, int32_t vocab, const int32_t *history, int32_t n_history,
                          const ls_sampling *sp, float *v, int32_t *ids, uint64_t *w, uint64_t *z);

/* The draw over ids 0..vocab-1 with weights w (0 for ids not kept) summing
 * to z > 0: the first id whose running weight exceeds min(floor(u * z),
 * z - 1). */
int32_t ls_draw(const uint64_t *w, int32_t vocab, uint64_t z, double u);

#endif
